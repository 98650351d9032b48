use super::*;

#[test]
fn empty_section_gives_defaults() {
    let parsed = parse("{}").unwrap();
    let c = &parsed.config;
    assert!(parsed.warnings.is_empty());
    assert_eq!((c.poll_interval, c.poll_timeout), (3, 180));
    assert_eq!(c.poll_attempts(), 60);
    assert_eq!(c.namespace_or_default(), "default");
    assert_eq!(c.dns_policy, None);
    assert_eq!(parse("").unwrap(), parsed);
    assert_eq!(parse("null").unwrap(), parsed);
}

#[test]
fn every_honoured_key_is_read() {
    let json = r#"{
        "host": "https://127.0.0.1:6443", "context": "ci", "cert_file": "/c.pem", "key_file": "/k.pem",
        "ca_file": "/ca.pem", "bearer_token": "tok", "bearer_token_overwrite_allowed": true,
        "namespace": "ci", "namespace_overwrite_allowed": "ci-.*", "image": "alpine:3",
        "helper_image": "registry.local/runway-helper:1", "pull_policy": ["if-not-present", "always"],
        "allowed_pull_policies": "if-not-present", "allowed_images": ["alpine:*"], "allowed_services": ["postgres:*"],
        "privileged": true, "allow_privilege_escalation": false, "cap_add": ["SYS_TIME"], "cap_drop": ["CHOWN"],
        "cpu_limit": "2", "cpu_request": "500m", "memory_limit": "1Gi", "memory_request": "512Mi",
        "ephemeral_storage_limit": "10Gi", "ephemeral_storage_request": "1Gi",
        "cpu_limit_overwrite_max_allowed": "4", "memory_request_overwrite_max_allowed": "2Gi",
        "helper_cpu_limit": "1", "helper_memory_limit_overwrite_max_allowed": "1Gi",
        "service_cpu_request": 1, "service_ephemeral_storage_limit": "1e9",
        "pod_cpu_limit": "4", "pod_memory_request_overwrite_max_allowed": "8Gi",
        "service_account": "ci", "service_account_overwrite_allowed": "^ci-", "automount_service_account_token": false,
        "node_selector": {"kubernetes.io/arch": "amd64"}, "node_selector_overwrite_allowed": ".*",
        "node_tolerations": {"dedicated=ci": "NoSchedule"}, "node_tolerations_overwrite_allowed": ".*",
        "affinity": {"node_affinity": {"required_during_scheduling_ignored_during_execution": {"node_selector_terms": [
            {"match_expressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
        "pod_labels": {"team": "a"}, "pod_labels_overwrite_allowed": ".*",
        "pod_annotations": {"note": "$CI_JOB_ID"}, "pod_annotations_overwrite_allowed": ".*",
        "image_pull_secrets": ["regcred"], "use_service_account_image_pull_secrets": false,
        "volumes": {"host_path": [{"name": "h", "mount_path": "/h"}], "empty_dir": [{"name": "e", "mount_path": "/e", "medium": "Memory", "size_limit": "1Gi"}]},
        "dns_policy": "none", "dns_config": {"nameservers": ["1.1.1.1"], "options": [{"name": "ndots", "value": "2"}], "searches": ["svc"]},
        "pod_security_context": {"run_as_user": 1000},
        "build_container_security_context": {"capabilities": {"add": ["NET_ADMIN"]}},
        "helper_container_security_context": {"run_as_non_root": true},
        "service_container_security_context": {"read_only_root_filesystem": true},
        "container_lifecycle": {"pre_stop": {"exec": {"command": ["sleep", "1"]}}},
        "services": ["redis:7", {"name": "postgres:15", "alias": "db, pg", "command": ["postgres", "-c", "fsync=off"],
                                 "entrypoint": ["docker-entrypoint.sh"], "environment": ["POSTGRES_PASSWORD=x"]}],
        "host_aliases": [{"ip": "10.0.0.1", "hostnames": ["a.local"]}],
        "poll_interval": 1, "poll_timeout": 30, "cleanup_grace_period_seconds": 5,
        "pod_termination_grace_period_seconds": 10, "scheduler_name": "sched",
        "runtime_class_name": "gvisor", "priority_class_name": "ci"
    }"#;
    let parsed = parse(json).unwrap();
    assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
    let c = &parsed.config;
    assert_eq!(c.host, "https://127.0.0.1:6443");
    assert!(c.bearer_token_overwrite_allowed);
    assert_eq!(c.pull_policy, vec![KubePullPolicy::IfNotPresent, KubePullPolicy::Always]);
    assert_eq!(c.allowed_pull_policies, vec![KubePullPolicy::IfNotPresent]);
    assert_eq!(c.privileged, Some(true));
    assert_eq!(c.allow_privilege_escalation, Some(false));
    assert_eq!(
        c.build.limits,
        ResourceValues { cpu: "2".into(), memory: "1Gi".into(), ephemeral_storage: "10Gi".into() }
    );
    assert_eq!(c.build.requests.cpu, "500m");
    assert_eq!(c.build.limits_max.cpu, "4");
    assert_eq!(c.build.requests_max.memory, "2Gi");
    assert_eq!(c.helper.limits.cpu, "1");
    assert_eq!(c.helper.limits_max.memory, "1Gi");
    assert_eq!(c.service.requests.cpu, "1");
    assert_eq!(c.service.limits.ephemeral_storage, "1e9");
    assert_eq!(c.pod.limits.cpu, "4");
    assert_eq!(c.pod.requests_max.memory, "8Gi");
    assert_eq!(c.automount_service_account_token, Some(false));
    assert_eq!(c.node_tolerations["dedicated=ci"], "NoSchedule");
    assert_eq!(c.dns_policy, Some("None"));
    assert_eq!(c.services.len(), 2);
    assert_eq!(c.services[1].aliases, vec!["db", "pg"]);
    assert_eq!(c.services[1].variables, vec![("POSTGRES_PASSWORD".to_string(), "x".to_string())]);
    assert_eq!(c.services[1].entrypoint, vec!["docker-entrypoint.sh"]);
    assert_eq!((c.poll_interval, c.poll_timeout, c.poll_attempts()), (1, 30, 30));
    assert_eq!(c.cleanup_grace_period_seconds, Some(5));
    assert_eq!(c.pod_termination_grace_period_seconds, Some(10));
    assert_eq!(c.volumes.empty_dir[0].size_limit, "1Gi");
    assert_eq!(c.host_aliases[0].hostnames, vec!["a.local"]);
    assert_eq!(c.runtime_class_name, "gvisor");
}

#[test]
fn deprecated_termination_grace_period_wins() {
    for key in ["termination_grace_period_seconds", "terminationGracePeriodSeconds"] {
        let c = parse(&format!(
            r#"{{"{key}": 7, "cleanup_grace_period_seconds": 1, "pod_termination_grace_period_seconds": 2}}"#
        ))
        .unwrap()
        .config;
        assert_eq!(
            (c.cleanup_grace_period_seconds, c.pod_termination_grace_period_seconds),
            (Some(7), Some(7)),
            "{key}"
        );
    }
}

#[test]
fn ignored_gitlab_keys_are_warned_by_name() {
    let parsed = parse(
        r#"{"namespace_per_job": true, "retry_limit": 0,
            "services": [{"name": "redis", "suspend_data_path": "/data"}], "allowed_users": []}"#,
    )
    .unwrap();
    assert_eq!(
        parsed.warnings,
        vec!["[runners.kubernetes]: unsupported keys ignored: namespace_per_job, services[0].suspend_data_path"]
    );
}

#[test]
fn every_gitlab_runner_key_is_known() {
    // gitlab-runner's KubernetesConfig keys (common/config.go), each either read or warned.
    let gitlab = "host context cert_file key_file ca_file bearer_token_overwrite_allowed bearer_token image namespace \
        namespace_overwrite_allowed namespace_per_job privileged runtime_class_name allow_privilege_escalation \
        allowed_images allowed_pull_policies allowed_services allowed_users allowed_groups pull_policy node_selector \
        node_selector_overwrite_allowed node_tolerations node_tolerations_overwrite_allowed affinity image_pull_secrets \
        use_service_account_image_pull_secrets helper_image helper_image_flavor helper_image_autoset_arch_and_os \
        pod_termination_grace_period_seconds cleanup_grace_period_seconds cleanup_resources_timeout poll_interval \
        poll_timeout resource_availability_check_max_attempts retry_limit retry_backoff_max retry_limits pod_labels \
        pod_labels_overwrite_allowed scheduler_name service_account service_account_overwrite_allowed \
        automount_service_account_token pod_annotations pod_annotations_overwrite_allowed pod_security_context \
        init_permissions_container_security_context build_container_security_context helper_container_security_context \
        service_container_security_context volumes host_aliases services cap_add cap_drop suspend_pvc_size \
        suspend_pvc_storage_class dns_policy dns_config container_lifecycle priority_class_name pod_spec logs_base_dir \
        scripts_base_dir print_pod_warning_events pod_disruption_budget autoscaler";
    for key in gitlab.split_whitespace() {
        assert!(
            SUPPORTED_KEYS.contains(&key) || UNSUPPORTED_GITLAB_KEYS.contains(&key),
            "{key} is neither read nor warned"
        );
    }
    for prefix in ["", "helper_", "service_", "pod_"] {
        for resource in ["cpu", "memory", "ephemeral_storage"] {
            for kind in ["limit", "request"] {
                for suffix in ["", "_overwrite_max_allowed"] {
                    let key = format!("{prefix}{resource}_{kind}{suffix}");
                    assert_eq!(is_resource_key(&key), !(prefix == "pod_" && resource == "ephemeral_storage"), "{key}");
                }
            }
        }
    }
    assert!(!is_resource_key("gpu_limit"));
}

#[test]
fn unknown_keys_are_errors_naming_them() {
    for (json, needle) in [
        (r#"{"frobnicate": 1}"#, "[runners.kubernetes] frobnicate: unknown key"),
        (r#"{"hostname": "x"}"#, "[runners.kubernetes] hostname: unknown key"),
        (r#"{"volumes": {"host_path": [{"name": "a", "mount_path": "/a", "bogus": 1}]}}"#, "bogus"),
        (r#"{"volumes": {"tmpfs": []}}"#, "tmpfs"),
        (r#"{"affinity": {"node_affinity": {"required": {}}}}"#, "required"),
        (r#"{"build_container_security_context": {"user": 1}}"#, "user"),
        (r#"{"services": [{"name": "x", "variables": {}}]}"#, "variables"),
    ] {
        let err = parse(json).unwrap_err();
        assert!(err.contains(needle), "{json}: {err}");
    }
}

#[test]
fn bad_values_name_the_key() {
    for (json, needle) in [
        (r#"{"cpu_limit": "abc"}"#, r#"[runners.kubernetes] cpu_limit: "abc" is not a Kubernetes quantity"#),
        (r#"{"helper_memory_request_overwrite_max_allowed": "1 Gi"}"#, "helper_memory_request_overwrite_max_allowed"),
        (r#"{"service_cpu_limit": "-1"}"#, "service_cpu_limit: \"-1\" is negative"),
        (r#"{"pod_memory_limit": true}"#, "pod_memory_limit"),
        (r#"{"privileged": "yes"}"#, "privileged"),
        (r#"{"pull_policy": "sometimes"}"#, "pull_policy: unsupported pull policy"),
        (r#"{"allowed_pull_policies": ["never", "later"]}"#, "allowed_pull_policies"),
        (r#"{"namespace_overwrite_allowed": "("}"#, "namespace_overwrite_allowed: \"(\" is not a regular expression"),
        (r#"{"dns_policy": "cluster-last"}"#, "dns_policy"),
        (r#"{"host": "ftp://x"}"#, "host"),
        (r#"{"poll_timeout": -1}"#, "poll_timeout"),
        (r#"{"cleanup_grace_period_seconds": -5}"#, "cleanup_grace_period_seconds"),
        (r#"{"services": [{"alias": "x"}]}"#, "services[0]"),
        (r#"{"services": [{"name": "x", "environment": ["NOEQUALS"]}]}"#, "services[0]: environment"),
        (
            r#"{"volumes": {"empty_dir": [{"name": "e", "mount_path": "/e", "size_limit": "big"}]}}"#,
            "volumes.empty_dir \"e\": size_limit",
        ),
        (
            r#"{"volumes": {"pvc": [{"name": "p", "mount_path": "/p", "mount_propagation": "Sideways"}]}}"#,
            "mount_propagation",
        ),
        (r#"{"volumes": {"csi": [{"name": "c", "mount_path": "/c", "driver": ""}]}}"#, "driver is empty"),
        (r#"{"volumes": {"host_path": [{"name": "h"}]}}"#, "mount_path"),
        (
            r#"{"pod_security_context": {"seccomp_profile": {"type": "Localhost"}}}"#,
            "pod_security_context.seccomp_profile",
        ),
        (
            r#"{"helper_container_security_context": {"app_armor_profile": {"type": "Odd"}}}"#,
            "helper_container_security_context.app_armor_profile.type",
        ),
        (
            r#"{"build_container_security_context": {"proc_mount": "half"}}"#,
            "build_container_security_context.proc_mount",
        ),
        (r#"{"host_aliases": [{"ip": "", "hostnames": ["a"]}]}"#, "host_aliases"),
        (r#"{"node_selector": ["a"]}"#, "node_selector"),
    ] {
        let err = parse(json).unwrap_err();
        assert!(err.contains(needle), "{json}: {err}");
    }
    assert!(parse("[1]").unwrap_err().contains("not a table"));
}

#[test]
fn zero_poll_values_mean_the_defaults() {
    let c = parse(r#"{"poll_interval": 0, "poll_timeout": 0}"#).unwrap().config;
    assert_eq!((c.poll_interval, c.poll_timeout), (3, 180));
}

#[test]
fn pod_spec_entries_are_read_and_checked() {
    let parsed = parse(
        r#"{"pod_spec": [{"name": "a", "patch": "hostname: x", "patch_type": "merge"}, {"name": "b", "patch_path": "/p.json"}]}"#,
    )
    .unwrap();
    assert!(parsed.warnings.is_empty());
    assert_eq!(parsed.config.pod_spec.len(), 2);
    assert_eq!(parsed.config.pod_spec[1].patch_path, "/p.json");
    let err = parse(r#"{"pod_spec": [{"name": "a", "patch": "{}", "patch_type": "yaml"}]}"#).unwrap_err();
    assert_eq!(err, "[runners.kubernetes] pod_spec \"a\": unsupported patch type \"yaml\" (strategic, json, merge)");
    let err = parse(r#"{"pod_spec": [{"name": "a", "patch": "{}", "path": "/x"}]}"#).unwrap_err();
    assert!(err.starts_with("[runners.kubernetes] pod_spec: unknown field `path`"), "{err}");
}
