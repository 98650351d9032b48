use super::*;
use crate::config::parse;

fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn resolve_with(config: &str, pairs: &[(&str, &str)]) -> Result<Overwrites, String> {
    resolve(&parse(config).unwrap().config, &vars(pairs))
}

fn rv(cpu: &str, memory: &str, ephemeral: &str) -> ResourceValues {
    ResourceValues { cpu: cpu.into(), memory: memory.into(), ephemeral_storage: ephemeral.into() }
}

#[test]
fn nothing_set_keeps_the_config() {
    let o = resolve_with(
        r#"{"namespace": "ci", "service_account": "sa", "bearer_token": "t", "cpu_limit": "1",
            "node_selector": {"a": "b"}, "pod_labels": {"team": "x"}}"#,
        &[("CI_JOB_ID", "1")],
    )
    .unwrap();
    assert_eq!((o.namespace.as_str(), o.service_account.as_str(), o.bearer_token.as_str()), ("ci", "sa", "t"));
    assert_eq!(o.build.limits, rv("1", "", ""));
    assert_eq!(o.node_selector["a"], "b");
    assert_eq!(o.pod_labels["team"], "x");
    assert!(o.notes.is_empty());
    assert_eq!(resolve_with("{}", &[]).unwrap().namespace, "default");
}

#[test]
fn allowed_overwrites_apply() {
    let config = r#"{
        "namespace": "ci", "namespace_overwrite_allowed": "^ci-.*",
        "service_account_overwrite_allowed": "^sa-", "bearer_token_overwrite_allowed": true,
        "pod_labels": {"team": "x"}, "pod_labels_overwrite_allowed": ".*",
        "pod_annotations_overwrite_allowed": "^note=", "node_selector_overwrite_allowed": "^disk=",
        "node_tolerations": {"gpu": "NoSchedule"}, "node_tolerations_overwrite_allowed": ".*",
        "cpu_limit": "1", "cpu_limit_overwrite_max_allowed": "2", "memory_request_overwrite_max_allowed": "1Gi",
        "ephemeral_storage_limit_overwrite_max_allowed": "10Gi",
        "helper_cpu_request_overwrite_max_allowed": "500m",
        "service_memory_limit": "256Mi", "service_memory_limit_overwrite_max_allowed": "512Mi",
        "pod_cpu_limit_overwrite_max_allowed": "4"
    }"#;
    let o = resolve_with(
        config,
        &[
            ("BRANCH", "feature"),
            ("KUBERNETES_NAMESPACE_OVERWRITE", "ci-$BRANCH"),
            ("KUBERNETES_SERVICE_ACCOUNT_OVERWRITE", "sa-deploy"),
            ("KUBERNETES_BEARER_TOKEN", "secret-token"),
            ("KUBERNETES_POD_LABELS_1", "team=y"),
            ("KUBERNETES_POD_LABELS_2", "branch=${BRANCH}"),
            ("KUBERNETES_POD_ANNOTATIONS_1", "note=a=b"),
            ("KUBERNETES_NODE_SELECTOR_DISK", "disk=ssd"),
            ("KUBERNETES_NODE_TOLERATIONS_1", "dedicated=ci:NoExecute"),
            ("KUBERNETES_NODE_TOLERATIONS_2", ""),
            ("KUBERNETES_CPU_LIMIT", "1500m"),
            ("KUBERNETES_MEMORY_REQUEST", "1Gi"),
            ("KUBERNETES_EPHEMERAL_STORAGE_LIMIT", "2Gi"),
            ("KUBERNETES_HELPER_CPU_REQUEST", "0.5"),
            ("KUBERNETES_SERVICE_MEMORY_LIMIT", "300Mi"),
            ("KUBERNETES_POD_CPU_LIMIT", "3"),
        ],
    )
    .unwrap();
    assert_eq!(o.namespace, "ci-feature");
    assert_eq!(o.service_account, "sa-deploy");
    assert_eq!(o.bearer_token, "secret-token");
    assert_eq!(o.pod_labels, [("branch".into(), "feature".into()), ("team".into(), "y".into())].into());
    assert_eq!(o.pod_annotations["note"], "a=b");
    assert_eq!(o.node_selector["disk"], "ssd");
    assert_eq!(o.node_tolerations["gpu"], "NoSchedule");
    assert_eq!(o.node_tolerations["dedicated=ci"], "NoExecute");
    assert_eq!(o.node_tolerations[""], "");
    assert_eq!(o.build.limits, rv("1500m", "", "2Gi"));
    assert_eq!(o.build.requests, rv("", "1Gi", ""));
    assert_eq!(o.helper.requests.cpu, "0.5");
    assert_eq!(o.service.limits.memory, "300Mi");
    assert_eq!(o.pod.limits.cpu, "3");
    assert!(o.notes.contains(&"\"Namespace\" overwritten with \"ci-feature\"".to_string()), "{:?}", o.notes);
    assert!(o.notes.contains(&"\"BearerToken\" overwritten with \"XXXXXXXX...\"".to_string()));
    assert!(o.notes.contains(&"\"CPULimit\" overwritten with \"1500m\"".to_string()));
    assert!(o.notes.contains(&"\"PodLabels\" \"team\" overwritten with \"y\"".to_string()));
    assert!(!o.notes.iter().any(|n| n.contains("secret-token")));
}

#[test]
fn refused_overwrites_say_variable_value_and_limit() {
    for (config, pairs, want) in [
        (
            r#"{"namespace_overwrite_allowed": "not-a-match"}"#,
            vec![("KUBERNETES_NAMESPACE_OVERWRITE", "my_namespace")],
            r#"KUBERNETES_NAMESPACE_OVERWRITE: provided value "my_namespace" does not match "not-a-match" ([runners.kubernetes] namespace_overwrite_allowed)"#,
        ),
        (
            "{}",
            vec![("KUBERNETES_NAMESPACE_OVERWRITE", "other")],
            r#"KUBERNETES_NAMESPACE_OVERWRITE: overwrite to "other" is not allowed ([runners.kubernetes] namespace_overwrite_allowed is not set)"#,
        ),
        (
            r#"{"service_account_overwrite_allowed": "not-a-match"}"#,
            vec![("KUBERNETES_SERVICE_ACCOUNT_OVERWRITE", "my_service_account")],
            r#"KUBERNETES_SERVICE_ACCOUNT_OVERWRITE: provided value "my_service_account" does not match "not-a-match" ([runners.kubernetes] service_account_overwrite_allowed)"#,
        ),
        (
            "{}",
            vec![("KUBERNETES_BEARER_TOKEN", "t")],
            "KUBERNETES_BEARER_TOKEN is set but [runners.kubernetes] bearer_token_overwrite_allowed is not true",
        ),
        (
            r#"{"node_selector_overwrite_allowed": "not-a-match"}"#,
            vec![("KUBERNETES_NODE_SELECTOR_1", "test1=test1")],
            r#"KUBERNETES_NODE_SELECTOR_1: provided value "test1=test1" does not match "not-a-match" ([runners.kubernetes] node_selector_overwrite_allowed)"#,
        ),
        (
            r#"{"node_selector_overwrite_allowed": ".*"}"#,
            vec![("KUBERNETES_NODE_SELECTOR_1", "test1")],
            r#"KUBERNETES_NODE_SELECTOR_1: provided value "test1" does not match "k=v""#,
        ),
        (
            r#"{"pod_labels_overwrite_allowed": "not-a-match"}"#,
            vec![("KUBERNETES_POD_LABELS_1", "test1=test1")],
            r#"KUBERNETES_POD_LABELS_1: provided value "test1=test1" does not match "not-a-match" ([runners.kubernetes] pod_labels_overwrite_allowed)"#,
        ),
        (
            r#"{"pod_labels_overwrite_allowed": ".*"}"#,
            vec![("KUBERNETES_POD_LABELS_1", "test1")],
            r#"KUBERNETES_POD_LABELS_1: provided value "test1" does not match "k=v""#,
        ),
        (
            "{}",
            vec![("KUBERNETES_POD_ANNOTATIONS_1", "a=b")],
            r#"KUBERNETES_POD_ANNOTATIONS_1: overwrite to "a=b" is not allowed ([runners.kubernetes] pod_annotations_overwrite_allowed is not set)"#,
        ),
        (
            r#"{"pod_annotations_overwrite_allowed": ".*"}"#,
            vec![("KUBERNETES_POD_ANNOTATIONS_1", "test1")],
            r#"KUBERNETES_POD_ANNOTATIONS_1: provided value "test1" does not match "k=v""#,
        ),
        (
            r#"{"node_tolerations_overwrite_allowed": "^x"}"#,
            vec![("KUBERNETES_NODE_TOLERATIONS_1", "gpu:NoSchedule")],
            r#"KUBERNETES_NODE_TOLERATIONS_1: provided value "gpu:NoSchedule" does not match "^x" ([runners.kubernetes] node_tolerations_overwrite_allowed)"#,
        ),
        (
            r#"{"cpu_limit_overwrite_max_allowed": "10"}"#,
            vec![("KUBERNETES_CPU_LIMIT", "12")],
            r#"invalid build limits specified: the resource "CPULimit" requested "12" is higher than limit allowed "10" (KUBERNETES_CPU_LIMIT; [runners.kubernetes] cpu_limit_overwrite_max_allowed)"#,
        ),
        (
            r#"{"cpu_limit_overwrite_max_allowed": "10"}"#,
            vec![("KUBERNETES_CPU_LIMIT", "12000m")],
            r#"invalid build limits specified: the resource "CPULimit" requested "12000m" is higher than limit allowed "10" (KUBERNETES_CPU_LIMIT; [runners.kubernetes] cpu_limit_overwrite_max_allowed)"#,
        ),
        (
            r#"{"memory_limit_overwrite_max_allowed": "10Gi"}"#,
            vec![("KUBERNETES_MEMORY_LIMIT", "12Gi")],
            r#"invalid build limits specified: the resource "MemoryLimit" requested "12Gi" is higher than limit allowed "10Gi" (KUBERNETES_MEMORY_LIMIT; [runners.kubernetes] memory_limit_overwrite_max_allowed)"#,
        ),
        (
            r#"{"memory_request_overwrite_max_allowed": "1Gi"}"#,
            vec![("KUBERNETES_MEMORY_REQUEST", "1025Mi")],
            r#"invalid build requests specified: the resource "MemoryRequest" requested "1025Mi" is higher than limit allowed "1Gi" (KUBERNETES_MEMORY_REQUEST; [runners.kubernetes] memory_request_overwrite_max_allowed)"#,
        ),
        (
            r#"{"ephemeral_storage_request_overwrite_max_allowed": "1G"}"#,
            vec![("KUBERNETES_EPHEMERAL_STORAGE_REQUEST", "1Gi")],
            r#"invalid build requests specified: the resource "EphemeralStorageRequest" requested "1Gi" is higher than limit allowed "1G" (KUBERNETES_EPHEMERAL_STORAGE_REQUEST; [runners.kubernetes] ephemeral_storage_request_overwrite_max_allowed)"#,
        ),
        (
            r#"{"helper_cpu_request_overwrite_max_allowed": "100m"}"#,
            vec![("KUBERNETES_HELPER_CPU_REQUEST", "0.2")],
            r#"invalid helper requests specified: the resource "HelperCPURequest" requested "0.2" is higher than limit allowed "100m" (KUBERNETES_HELPER_CPU_REQUEST; [runners.kubernetes] helper_cpu_request_overwrite_max_allowed)"#,
        ),
        (
            r#"{"service_memory_limit_overwrite_max_allowed": "1Gi"}"#,
            vec![("KUBERNETES_SERVICE_MEMORY_LIMIT", "2Gi")],
            r#"invalid service limits specified: the resource "ServiceMemoryLimit" requested "2Gi" is higher than limit allowed "1Gi" (KUBERNETES_SERVICE_MEMORY_LIMIT; [runners.kubernetes] service_memory_limit_overwrite_max_allowed)"#,
        ),
        (
            r#"{"pod_memory_limit_overwrite_max_allowed": "1Gi"}"#,
            vec![("KUBERNETES_POD_MEMORY_LIMIT", "2Gi")],
            r#"invalid Pod limits specified: the resource "PodMemoryLimit" requested "2Gi" is higher than limit allowed "1Gi" (KUBERNETES_POD_MEMORY_LIMIT; [runners.kubernetes] pod_memory_limit_overwrite_max_allowed)"#,
        ),
        (
            "{}",
            vec![("KUBERNETES_CPU_REQUEST", "1")],
            r#"invalid build requests specified: KUBERNETES_CPU_REQUEST: overwrite to "1" is not allowed ([runners.kubernetes] cpu_request_overwrite_max_allowed is not set)"#,
        ),
        (
            r#"{"cpu_request_overwrite_max_allowed": "1"}"#,
            vec![("KUBERNETES_CPU_REQUEST", "lots")],
            r#"invalid build requests specified: KUBERNETES_CPU_REQUEST: parsing resource limit: "lots" is not a Kubernetes quantity"#,
        ),
    ] {
        let err = resolve_with(config, &pairs).unwrap_err();
        assert_eq!(err, want, "{config} {pairs:?}");
    }
}

#[test]
fn equal_to_the_maximum_is_allowed() {
    let o = resolve_with(
        r#"{"cpu_limit_overwrite_max_allowed": "2", "memory_limit_overwrite_max_allowed": "1Gi"}"#,
        &[("KUBERNETES_CPU_LIMIT", "2000m"), ("KUBERNETES_MEMORY_LIMIT", "1073741824")],
    )
    .unwrap();
    assert_eq!(o.build.limits, rv("2000m", "1073741824", ""));
}

#[test]
fn later_variables_win_and_values_are_expanded() {
    let o = resolve_with(
        r#"{"namespace_overwrite_allowed": ".*"}"#,
        &[("NS", "a"), ("KUBERNETES_NAMESPACE_OVERWRITE", "x"), ("KUBERNETES_NAMESPACE_OVERWRITE", "ns-$NS")],
    )
    .unwrap();
    assert_eq!(o.namespace, "ns-a");
}

#[test]
fn explicit_service_overwrites() {
    let config = parse(
        r#"{"service_cpu_limit": "1", "service_cpu_limit_overwrite_max_allowed": "2",
            "service_memory_request": "64Mi", "service_memory_request_overwrite_max_allowed": "1Gi"}"#,
    )
    .unwrap()
    .config;
    let o = resolve(&config, &vars(&[("KUBERNETES_SERVICE_CPU_LIMIT", "1500m")])).unwrap();
    // A service without its own variables gets the job-wide service resources.
    let plain = service_resources(&config, &o, "redis", &[]).unwrap();
    assert_eq!(plain, o.service);
    assert_eq!(plain.limits.cpu, "1500m");
    let own =
        service_resources(&config, &o, "postgres", &vars(&[("KUBERNETES_SERVICE_MEMORY_REQUEST", "128Mi")])).unwrap();
    assert_eq!(own.limits.cpu, "1500m");
    assert_eq!(own.requests.memory, "128Mi");
    let err = service_resources(&config, &o, "postgres", &vars(&[("KUBERNETES_SERVICE_CPU_LIMIT", "3")])).unwrap_err();
    assert_eq!(
        err,
        r#"service "postgres": invalid service limits specified: the resource "ServiceCPULimit" requested "3" is higher than limit allowed "2" (KUBERNETES_SERVICE_CPU_LIMIT; [runners.kubernetes] service_cpu_limit_overwrite_max_allowed)"#
    );
}
