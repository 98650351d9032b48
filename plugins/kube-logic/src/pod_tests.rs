use serde_json::json;

use super::*;
use crate::config::parse;
use crate::overwrites::resolve;

fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn inputs() -> PodInputs {
    PodInputs {
        meta: JobMeta {
            job_id: 77,
            project_id: 12,
            project_path: "group/app".into(),
            short_token: "abcd1234".into(),
            runner_name: "kube".into(),
            concurrent: 0,
        },
        random: 0,
        image: ImageInput { name: "alpine:3.20".into(), ..Default::default() },
        helper_image: "runway-helper:1".into(),
        services: Vec::new(),
        builds_dir: "/builds".into(),
        cache_dir: "/cache".into(),
        stages_dir: "/runway".into(),
        shell: "bash".into(),
        variables: vars(&[("CI_JOB_ID", "77"), ("GREETING", "hi $USER")]),
        image_pull_secrets: Vec::new(),
        pull_attempt: 0,
    }
}

fn build_with(config: &str, inputs: &PodInputs) -> Result<Value, String> {
    let config = parse(config).unwrap().config;
    let overwrites = resolve(&config, &inputs.variables)?;
    build(&config, &overwrites, inputs)
}

fn keep_alive() -> Value {
    json!(["sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"])
}

fn mounts() -> Value {
    json!([
        {"name": "repo", "mountPath": "/builds"},
        {"name": "stages", "mountPath": "/runway"},
        {"name": "cache", "mountPath": "/cache"}
    ])
}

#[test]
fn plain_job_pod() {
    let pod = build_with("{}", &inputs()).unwrap();
    let net_raw = json!({"capabilities": {"drop": ["NET_RAW"]}});
    assert_eq!(
        pod,
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "runner-abcd1234-project-12-concurrent-0-aaaaaaaa",
                "namespace": "default",
                "labels": {
                    "pod": "runner-abcd1234-project-12-concurrent-0",
                    "job.runner.gitlab.com/pod": "runner-abcd1234-project-12-concurrent-0",
                    "manager.runner.gitlab.com/id-short": "abcd1234",
                    "manager.runner.gitlab.com/name": "kube",
                    "project.runner.gitlab.com/id": "12",
                    "project.runner.gitlab.com/name": "app",
                    "project.runner.gitlab.com/namespace": "group",
                    "project.runner.gitlab.com/namespace-id": "",
                    "project.runner.gitlab.com/root-namespace": "group",
                    "runway/job": "77",
                    "runway/managed": "true",
                    "runway/runner": "abcd1234"
                },
                "annotations": {
                    "job.runner.gitlab.com/before_sha": "",
                    "job.runner.gitlab.com/id": "77",
                    "job.runner.gitlab.com/name": "",
                    "job.runner.gitlab.com/ref": "",
                    "job.runner.gitlab.com/sha": "",
                    "job.runner.gitlab.com/timeout": "",
                    "job.runner.gitlab.com/url": "",
                    "project.runner.gitlab.com/id": "12"
                }
            },
            "spec": {
                "containers": [
                    {
                        "name": "build",
                        "image": "alpine:3.20",
                        "command": keep_alive(),
                        "env": [{"name": "CI_JOB_ID", "value": "77"}, {"name": "GREETING", "value": "hi $$USER"}],
                        "volumeMounts": mounts(),
                        "securityContext": net_raw
                    },
                    {
                        "name": "helper",
                        "image": "runway-helper:1",
                        "command": keep_alive(),
                        "volumeMounts": mounts(),
                        "securityContext": net_raw
                    }
                ],
                "restartPolicy": "Never",
                "dnsPolicy": "ClusterFirst",
                "volumes": [
                    {"name": "repo", "emptyDir": {}},
                    {"name": "stages", "emptyDir": {}},
                    {"name": "cache", "emptyDir": {}}
                ]
            }
        })
    );
}

#[test]
fn the_config_image_and_helper_image_apply() {
    let mut i = inputs();
    i.image.name = String::new();
    let pod = build_with(r#"{"image": "ruby:$RUBY", "helper_image": "reg.local/helper:$V"}"#, &{
        i.variables.extend(vars(&[("RUBY", "3.3"), ("V", "2")]));
        i.clone()
    })
    .unwrap();
    assert_eq!(pod["spec"]["containers"][0]["image"], "ruby:3.3");
    assert_eq!(pod["spec"]["containers"][1]["image"], "reg.local/helper:2");
    let err = build_with("{}", &i).unwrap_err();
    assert!(err.contains("no image"), "{err}");
}

#[test]
fn keep_alive_for_powershell() {
    assert_eq!(keep_alive_command("pwsh")[0], "pwsh");
    assert_eq!(keep_alive_command("bash"), keep_alive_command("sh"));
}

const FULL_CONFIG: &str = r#"{
    "namespace": "ci", "pull_policy": ["always", "if-not-present"],
    "allowed_pull_policies": ["always", "if-not-present"],
    "cpu_limit": "2", "cpu_request": "500m", "memory_limit": "1Gi", "memory_request": "512Mi",
    "ephemeral_storage_limit": "4Gi", "helper_cpu_limit": "250m", "helper_memory_request": "64Mi",
    "service_cpu_limit": "1", "service_memory_limit": "256Mi", "service_memory_limit_overwrite_max_allowed": "1Gi",
    "pod_cpu_limit": "4",
    "node_selector": {"kubernetes.io/os": "linux"}, "node_tolerations": {"dedicated=ci": "NoSchedule", "gpu": ""},
    "affinity": {"node_affinity": {"preferred_during_scheduling_ignored_during_execution": [
        {"weight": 10, "preference": {"match_expressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]}},
    "pod_labels": {"team": "platform $CI_JOB_ID", "runner.gitlab.com/x": "no", "runway/job": "no"},
    "pod_annotations": {"ci/job": "$CI_JOB_ID"},
    "service_account": "builder", "automount_service_account_token": false,
    "image_pull_secrets": ["regcred"],
    "volumes": {
        "host_path": [{"name": "docker", "mount_path": "/var/run/docker.sock", "host_path": "/var/run/docker.sock", "read_only": true}],
        "pvc": [{"name": "cache-$CI_PROJECT_ID", "mount_path": "/cache"}],
        "config_map": [{"name": "cfg", "mount_path": "/etc/cfg", "items": {"app.conf": "app.conf"}}],
        "secret": [{"name": "certs", "mount_path": "/certs", "read_only": true}],
        "empty_dir": [{"name": "scratch", "mount_path": "/scratch", "medium": "Memory", "size_limit": "1Gi"}],
        "csi": [{"name": "inline", "mount_path": "/csi", "driver": "csi.example.com", "volume_attributes": {"size": "1"}}]
    },
    "dns_policy": "cluster-first-with-host-net",
    "dns_config": {"nameservers": ["10.0.0.10"], "options": [{"name": "ndots", "value": "2"}]},
    "pod_security_context": {"run_as_user": 1000, "fs_group": 2000},
    "build_container_security_context": {"run_as_user": 1001, "capabilities": {"add": ["SYS_PTRACE"]}},
    "helper_container_security_context": {"read_only_root_filesystem": true},
    "service_container_security_context": {"privileged": false, "capabilities": {"drop": ["ALL"]}},
    "services": [{"name": "postgres:15", "alias": "db", "environment": ["POSTGRES_PASSWORD=pw"]}],
    "host_aliases": [{"ip": "10.1.1.1", "hostnames": ["registry.internal"]}],
    "pod_termination_grace_period_seconds": 15, "scheduler_name": "ci-scheduler",
    "runtime_class_name": "gvisor", "priority_class_name": "ci-low"
}"#;

#[test]
fn full_pod_with_two_services() {
    let mut i = inputs();
    i.random = 36 * 36 + 1;
    i.variables = vars(&[("CI_JOB_ID", "77"), ("CI_PROJECT_ID", "12")]);
    i.image.pull_policies = vec!["if-not-present".into()];
    i.services = vec![ImageInput {
        name: "tutum/wordpress:latest".into(),
        entrypoint: vec!["/entry.sh".into()],
        command: vec!["run".into(), "--port=80".into()],
        aliases: vec!["wp".into()],
        variables: vars(&[("WP_DB", "db:$CI_JOB_ID"), ("KUBERNETES_SERVICE_MEMORY_LIMIT", "512Mi")]),
        pull_policies: Vec::new(),
    }];
    i.image_pull_secrets = vec!["runner-abcd1234-project-12-concurrent-0-creds".into()];
    let pod = build_with(FULL_CONFIG, &i).unwrap();

    let mounts = json!([
        {"name": "docker", "mountPath": "/var/run/docker.sock", "readOnly": true},
        {"name": "certs", "mountPath": "/certs", "readOnly": true},
        {"name": "cache-12", "mountPath": "/cache"},
        {"name": "cfg", "mountPath": "/etc/cfg"},
        {"name": "scratch", "mountPath": "/scratch"},
        {"name": "inline", "mountPath": "/csi"},
        {"name": "repo", "mountPath": "/builds"},
        {"name": "stages", "mountPath": "/runway"}
    ]);
    let env = json!([{"name": "CI_JOB_ID", "value": "77"}, {"name": "CI_PROJECT_ID", "value": "12"}]);
    let expected_spec = json!({
        "containers": [
            {
                "name": "build", "image": "alpine:3.20", "imagePullPolicy": "IfNotPresent",
                "command": keep_alive(), "env": env,
                "resources": {"limits": {"cpu": "2", "memory": "1Gi", "ephemeral-storage": "4Gi"},
                              "requests": {"cpu": "500m", "memory": "512Mi"}},
                "volumeMounts": mounts,
                "securityContext": {"capabilities": {"add": ["SYS_PTRACE"], "drop": ["NET_RAW"]},
                                    "runAsUser": 1001}
            },
            {
                "name": "helper", "image": "runway-helper:1", "imagePullPolicy": "IfNotPresent",
                "command": keep_alive(),
                "resources": {"limits": {"cpu": "250m"}, "requests": {"memory": "64Mi"}},
                "volumeMounts": mounts,
                "securityContext": {"capabilities": {"drop": ["NET_RAW"]}, "runAsUser": 1000,
                                    "readOnlyRootFilesystem": true}
            },
            {
                "name": "svc-0", "image": "postgres:15", "imagePullPolicy": "Always",
                "env": [{"name": "CI_JOB_ID", "value": "77"}, {"name": "CI_PROJECT_ID", "value": "12"},
                        {"name": "POSTGRES_PASSWORD", "value": "pw"}],
                "resources": {"limits": {"cpu": "1", "memory": "256Mi"}},
                "volumeMounts": mounts,
                "securityContext": {"capabilities": {"drop": ["ALL"]}, "privileged": false, "runAsUser": 1000}
            },
            {
                "name": "svc-1", "image": "tutum/wordpress:latest", "imagePullPolicy": "Always",
                "command": ["/entry.sh"], "args": ["run", "--port=80"],
                "env": [{"name": "CI_JOB_ID", "value": "77"}, {"name": "CI_PROJECT_ID", "value": "12"},
                        {"name": "WP_DB", "value": "db:77"},
                        {"name": "KUBERNETES_SERVICE_MEMORY_LIMIT", "value": "512Mi"}],
                "resources": {"limits": {"cpu": "1", "memory": "512Mi"}},
                "volumeMounts": mounts,
                "securityContext": {"capabilities": {"drop": ["ALL"]}, "privileged": false, "runAsUser": 1000}
            }
        ],
        "restartPolicy": "Never",
        "volumes": [
            {"name": "docker", "hostPath": {"path": "/var/run/docker.sock"}},
            {"name": "certs", "secret": {"secretName": "certs"}},
            {"name": "cache-12", "persistentVolumeClaim": {"claimName": "cache-12"}},
            {"name": "cfg", "configMap": {"name": "cfg", "items": [{"key": "app.conf", "path": "app.conf"}]}},
            {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
            {"name": "inline", "csi": {"driver": "csi.example.com", "readOnly": false, "volumeAttributes": {"size": "1"}}},
            {"name": "repo", "emptyDir": {}},
            {"name": "stages", "emptyDir": {}}
        ],
        "hostAliases": [
            {"ip": "127.0.0.1", "hostnames": ["postgres", "db", "tutum-wordpress", "wp"]},
            {"ip": "10.1.1.1", "hostnames": ["registry.internal"]}
        ],
        "dnsPolicy": "ClusterFirstWithHostNet",
        "dnsConfig": {"nameservers": ["10.0.0.10"], "options": [{"name": "ndots", "value": "2"}]},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "ci", "effect": "NoSchedule"},
            {"key": "gpu", "operator": "Exists"}
        ],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]}},
        "securityContext": {"runAsUser": 1000, "fsGroup": 2000},
        "serviceAccountName": "builder",
        "automountServiceAccountToken": false,
        "schedulerName": "ci-scheduler",
        "runtimeClassName": "gvisor",
        "priorityClassName": "ci-low",
        "terminationGracePeriodSeconds": 15,
        "resources": {"limits": {"cpu": "4"}},
        "imagePullSecrets": [{"name": "regcred"}, {"name": "runner-abcd1234-project-12-concurrent-0-creds"}]
    });
    assert_eq!(pod["spec"], expected_spec);
    assert_eq!(pod["metadata"]["name"], "runner-abcd1234-project-12-concurrent-0-babaaaaa");
    assert_eq!(pod["metadata"]["namespace"], "ci");
    let labels = &pod["metadata"]["labels"];
    assert_eq!(labels["team"], "platform_77");
    assert_eq!(labels["runway/job"], "77");
    assert!(labels.get("runner.gitlab.com/x").is_none());
    assert_eq!(pod["metadata"]["annotations"]["ci/job"], "77");
}

#[test]
fn later_pull_attempts_use_the_next_policy() {
    let mut i = inputs();
    i.pull_attempt = 1;
    let pod = build_with(r#"{"pull_policy": ["always", "if-not-present"]}"#, &i).unwrap();
    assert_eq!(pod["spec"]["containers"][0]["imagePullPolicy"], "IfNotPresent");
    i.image.pull_policies = vec!["never".into()];
    let err = build_with(r#"{"pull_policy": ["always", "if-not-present"]}"#, &i).unwrap_err();
    assert_eq!(
        err,
        "invalid pull policy for container \"build\": pull_policy ([Never]) defined in GitLab pipeline config is not one of the allowed_pull_policies ([Always IfNotPresent])"
    );
}

#[test]
fn allow_lists_are_checked() {
    let mut i = inputs();
    i.image.name = "evil:1".into();
    let err = build_with(r#"{"allowed_images": ["alpine:*"]}"#, &i).unwrap_err();
    assert!(err.contains("\"evil:1\" image is not present on the list of allowed images"), "{err}");
    // The configured image and the helper image are always allowed.
    i.image.name = "ruby:3".into();
    assert!(build_with(r#"{"image": "ruby:3", "allowed_images": ["alpine:*"]}"#, &i).is_ok());
    i.image.name = "alpine:3".into();
    i.services = vec![ImageInput { name: "mysql:8".into(), ..Default::default() }];
    let err = build_with(r#"{"allowed_services": ["postgres:*"]}"#, &i).unwrap_err();
    assert!(err.contains("\"mysql:8\" image is not present on the list of allowed services"), "{err}");
    // Services from the config are the admin's own.
    i.services.clear();
    assert!(build_with(r#"{"allowed_services": ["postgres:*"], "services": ["redis:7"]}"#, &i).is_ok());
}

#[test]
fn service_aliases_become_host_aliases() {
    let mut i = inputs();
    i.services = vec![
        ImageInput { name: "registry.local:5000/group/redis:7".into(), ..Default::default() },
        ImageInput {
            name: "postgres@sha256:".to_string() + &"a".repeat(64),
            aliases: vec!["pg".into()],
            ..Default::default()
        },
    ];
    let pod = build_with("{}", &i).unwrap();
    assert_eq!(
        pod["spec"]["hostAliases"],
        json!([{"ip": "127.0.0.1", "hostnames": ["registry.local-group-redis", "postgres", "pg"]}])
    );
    i.services = vec![ImageInput { name: "redis".into(), aliases: vec!["Bad_Alias".into()], ..Default::default() }];
    let err = build_with("{}", &i).unwrap_err();
    assert!(err.starts_with("provided host alias Bad_Alias for service redis is invalid DNS."), "{err}");
}

#[test]
fn services_overwrite_beyond_the_limit_fails_the_pod() {
    let mut i = inputs();
    i.services = vec![ImageInput {
        name: "redis".into(),
        variables: vars(&[("KUBERNETES_SERVICE_MEMORY_LIMIT", "2Gi")]),
        ..Default::default()
    }];
    let err = build_with(r#"{"service_memory_limit_overwrite_max_allowed": "1Gi"}"#, &i).unwrap_err();
    assert!(err.contains("\"ServiceMemoryLimit\" requested \"2Gi\" is higher than limit allowed \"1Gi\""), "{err}");
}

#[test]
fn service_account_pull_secrets_and_overwritten_values() {
    let mut i = inputs();
    i.image_pull_secrets = vec!["job-creds".into()];
    let pod =
        build_with(r#"{"image_pull_secrets": ["a"], "use_service_account_image_pull_secrets": true}"#, &i).unwrap();
    assert!(pod["spec"].get("imagePullSecrets").is_none());
    i.variables.extend(vars(&[
        ("KUBERNETES_NAMESPACE_OVERWRITE", "ci-x"),
        ("KUBERNETES_NODE_SELECTOR_A", "disk=ssd"),
        ("KUBERNETES_CPU_LIMIT", "1"),
    ]));
    let pod = build_with(
        r#"{"namespace_overwrite_allowed": "^ci-", "node_selector_overwrite_allowed": ".*",
            "cpu_limit_overwrite_max_allowed": "2"}"#,
        &i,
    )
    .unwrap();
    assert_eq!(pod["metadata"]["namespace"], "ci-x");
    assert_eq!(pod["spec"]["nodeSelector"], json!({"disk": "ssd"}));
    assert_eq!(pod["spec"]["containers"][0]["resources"], json!({"limits": {"cpu": "1"}}));
}

#[test]
fn lifecycle_hooks_apply_to_every_container() {
    let mut i = inputs();
    i.services = vec![ImageInput { name: "redis".into(), ..Default::default() }];
    let pod = build_with(
        r#"{"container_lifecycle": {"post_start": {"http_get": {"port": 8080, "path": "/ready", "http_headers": [{"name": "X", "value": "1"}]}},
                                     "pre_stop": {"tcp_socket": {"port": 5432}}}}"#,
        &i,
    )
    .unwrap();
    for c in pod["spec"]["containers"].as_array().unwrap() {
        assert_eq!(
            c["lifecycle"],
            json!({"postStart": {"httpGet": {"port": 8080, "path": "/ready", "httpHeaders": [{"name": "X", "value": "1"}]}},
                   "preStop": {"tcpSocket": {"port": 5432}}})
        );
    }
}

#[test]
fn configured_services_expand_name_and_alias() {
    let mut i = inputs();
    i.variables.extend(vars(&[("PG", "16"), ("ALIAS", "db")]));
    let config = parse(r#"{"services": [{"name": "postgres:$PG", "alias": "$ALIAS"}]}"#).unwrap().config;
    let services = services(&config, &i);
    assert_eq!((services[0].name.as_str(), services[0].aliases.clone()), ("postgres:16", vec!["db".to_string()]));
}

#[test]
fn dns1123_subdomains() {
    for ok in ["a", "db", "tutum-wordpress", "a.b-c.d", "x1"] {
        assert!(is_dns1123_subdomain(ok), "{ok}");
    }
    for bad in ["", "tutum__wordpress", "-a", "a-", "A", "a..b", "a_b", &"a".repeat(254)] {
        assert!(!is_dns1123_subdomain(bad), "{bad}");
    }
}
