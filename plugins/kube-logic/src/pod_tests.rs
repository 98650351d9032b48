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
