//! `[runners.kubernetes]`: parsing and validating the section (JSON of the TOML table) into
//! [`KubeConfig`]. Owns key names, defaults, the check of every quantity and regex, and the list
//! of gitlab-runner keys Runway accepts but ignores (warned about by name). A key neither
//! Runway nor gitlab-runner knows is an error naming it. Does not touch the cluster or the job.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::patch::PodSpecPatch;
use crate::quantity::Quantity;
use crate::tables::{
    self, Affinity, ContainerSecurityContext, DnsConfig, HostAlias, Lifecycle, OneOrMany, PodSecurityContext,
    ServiceConfig, Volumes,
};

/// Seconds between two looks at a pod that is starting (gitlab-runner's default).
pub const DEFAULT_POLL_INTERVAL: u64 = 3;
/// Seconds a pod may take to start (gitlab-runner's default).
pub const DEFAULT_POLL_TIMEOUT: u64 = 180;
/// Namespace when `namespace` is empty.
pub const DEFAULT_NAMESPACE: &str = "default";

/// When the kubelet pulls an image (the Pod API's `imagePullPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum KubePullPolicy {
    /// `always`.
    Always,
    /// `if-not-present`.
    IfNotPresent,
    /// `never`.
    Never,
}

impl KubePullPolicy {
    /// Read GitLab's spelling (`always`, `if-not-present`, `never`).
    pub fn parse(text: &str) -> Result<KubePullPolicy, String> {
        match text.trim() {
            "always" => Ok(KubePullPolicy::Always),
            "if-not-present" => Ok(KubePullPolicy::IfNotPresent),
            "never" => Ok(KubePullPolicy::Never),
            other => Err(format!("unsupported pull policy: {other:?} (always, if-not-present, never)")),
        }
    }

    /// The Pod API's spelling.
    pub fn as_api(self) -> &'static str {
        match self {
            KubePullPolicy::Always => "Always",
            KubePullPolicy::IfNotPresent => "IfNotPresent",
            KubePullPolicy::Never => "Never",
        }
    }
}

/// CPU, memory and ephemeral storage quantities; empty: not set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceValues {
    /// CPU.
    pub cpu: String,
    /// Memory.
    pub memory: String,
    /// Ephemeral storage.
    pub ephemeral_storage: String,
}

/// The resource keys of one kind of container (or of the pod).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceConfig {
    /// `*_limit`.
    pub limits: ResourceValues,
    /// `*_request`.
    pub requests: ResourceValues,
    /// `*_limit_overwrite_max_allowed` (empty: the limit may not be overwritten).
    pub limits_max: ResourceValues,
    /// `*_request_overwrite_max_allowed`.
    pub requests_max: ResourceValues,
}

/// The parsed `[runners.kubernetes]` section.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KubeConfig {
    /// API server URL (empty: in-cluster service account, then kubeconfig).
    pub host: String,
    /// kubeconfig context when `host` is empty (empty: the current one).
    pub context: String,
    /// Client certificate file.
    pub cert_file: String,
    /// Client key file.
    pub key_file: String,
    /// CA certificate file.
    pub ca_file: String,
    /// Bearer token.
    pub bearer_token: String,
    /// Jobs may set `KUBERNETES_BEARER_TOKEN`.
    pub bearer_token_overwrite_allowed: bool,
    /// Namespace of the job's objects ([`DEFAULT_NAMESPACE`] when empty).
    pub namespace: String,
    /// Regex for `KUBERNETES_NAMESPACE_OVERWRITE` (empty: no overwrite).
    pub namespace_overwrite_allowed: String,
    /// Default image for jobs without `image:`.
    pub image: String,
    /// Image of the helper container; empty: Runway's own.
    pub helper_image: String,
    /// Pull policies in fallback order; empty: the cluster's default.
    pub pull_policy: Vec<KubePullPolicy>,
    /// Pull policies jobs may ask for; empty: those of `pull_policy`.
    pub allowed_pull_policies: Vec<KubePullPolicy>,
    /// Images jobs may ask for (globs); empty: any.
    pub allowed_images: Vec<String>,
    /// Services jobs may ask for (globs); empty: any.
    pub allowed_services: Vec<String>,
    /// Privileged containers (`None`: not set in the security context).
    pub privileged: Option<bool>,
    /// `allowPrivilegeEscalation` of every container (`None`: not set).
    pub allow_privilege_escalation: Option<bool>,
    /// Capabilities added to every container.
    pub cap_add: Vec<String>,
    /// Capabilities dropped from every container (besides `NET_RAW`).
    pub cap_drop: Vec<String>,
    /// Build container resources.
    pub build: ResourceConfig,
    /// Helper container resources.
    pub helper: ResourceConfig,
    /// Service container resources.
    pub service: ResourceConfig,
    /// Pod-level resources (cpu and memory only).
    pub pod: ResourceConfig,
    /// Service account of the pod.
    pub service_account: String,
    /// Regex for `KUBERNETES_SERVICE_ACCOUNT_OVERWRITE`.
    pub service_account_overwrite_allowed: String,
    /// Mount the service account token (`None`: the cluster's default).
    pub automount_service_account_token: Option<bool>,
    /// Node labels the pod must run on.
    pub node_selector: BTreeMap<String, String>,
    /// Regex for `KUBERNETES_NODE_SELECTOR_*`.
    pub node_selector_overwrite_allowed: String,
    /// `"key[=value]" = "Effect"` tolerations.
    pub node_tolerations: BTreeMap<String, String>,
    /// Regex for `KUBERNETES_NODE_TOLERATIONS_*`.
    pub node_tolerations_overwrite_allowed: String,
    /// Affinity.
    pub affinity: Affinity,
    /// Pod labels (values `$VARS` expanded).
    pub pod_labels: BTreeMap<String, String>,
    /// Regex for `KUBERNETES_POD_LABELS_*`.
    pub pod_labels_overwrite_allowed: String,
    /// Pod annotations (values `$VARS` expanded).
    pub pod_annotations: BTreeMap<String, String>,
    /// Regex for `KUBERNETES_POD_ANNOTATIONS_*`.
    pub pod_annotations_overwrite_allowed: String,
    /// Secrets the kubelet pulls with.
    pub image_pull_secrets: Vec<String>,
    /// No `imagePullSecrets` at all: the service account's apply.
    pub use_service_account_image_pull_secrets: bool,
    /// Volumes.
    pub volumes: Volumes,
    /// The Pod API's `dnsPolicy` (`None`: `ClusterFirst`, gitlab-runner's default).
    pub dns_policy: Option<&'static str>,
    /// DNS config.
    pub dns_config: DnsConfig,
    /// Pod security context.
    pub pod_security_context: PodSecurityContext,
    /// Build container security context.
    pub build_container_security_context: ContainerSecurityContext,
    /// Helper container security context.
    pub helper_container_security_context: ContainerSecurityContext,
    /// Service containers' security context.
    pub service_container_security_context: ContainerSecurityContext,
    /// Lifecycle hooks of every container.
    pub container_lifecycle: Lifecycle,
    /// Services every job gets.
    pub services: Vec<ServiceConfig>,
    /// Extra `/etc/hosts` entries.
    pub host_aliases: Vec<HostAlias>,
    /// Seconds between two looks at a starting pod.
    pub poll_interval: u64,
    /// Seconds a pod may take to start.
    pub poll_timeout: u64,
    /// Grace period when the job's pod is deleted after the job (`None`: the cluster's).
    pub cleanup_grace_period_seconds: Option<i64>,
    /// The pod's `terminationGracePeriodSeconds` (`None`: the cluster's).
    pub pod_termination_grace_period_seconds: Option<i64>,
    /// Scheduler.
    pub scheduler_name: String,
    /// Runtime class.
    pub runtime_class_name: String,
    /// Priority class.
    pub priority_class_name: String,
    /// Patches of the pod's spec (with `FF_USE_ADVANCED_POD_SPEC_CONFIGURATION` on), in order.
    pub pod_spec: Vec<PodSpecPatch>,
    /// Seconds an object of this runner whose job no store holds lives before the manager
    /// deletes it (Runway's key; 0: never).
    pub orphan_cleanup_grace_period_seconds: u64,
}

/// Keys Runway reads (besides the resource keys, see [`is_resource_key`]).
pub const SUPPORTED_KEYS: &[&str] = &[
    "host",
    "context",
    "cert_file",
    "key_file",
    "ca_file",
    "bearer_token",
    "bearer_token_overwrite_allowed",
    "namespace",
    "namespace_overwrite_allowed",
    "image",
    "helper_image",
    "pull_policy",
    "allowed_pull_policies",
    "allowed_images",
    "allowed_services",
    "privileged",
    "allow_privilege_escalation",
    "cap_add",
    "cap_drop",
    "service_account",
    "service_account_overwrite_allowed",
    "automount_service_account_token",
    "node_selector",
    "node_selector_overwrite_allowed",
    "node_tolerations",
    "node_tolerations_overwrite_allowed",
    "affinity",
    "pod_labels",
    "pod_labels_overwrite_allowed",
    "pod_annotations",
    "pod_annotations_overwrite_allowed",
    "image_pull_secrets",
    "use_service_account_image_pull_secrets",
    "volumes",
    "dns_policy",
    "dns_config",
    "pod_security_context",
    "build_container_security_context",
    "helper_container_security_context",
    "service_container_security_context",
    "container_lifecycle",
    "services",
    "host_aliases",
    "poll_interval",
    "poll_timeout",
    "cleanup_grace_period_seconds",
    "pod_termination_grace_period_seconds",
    "termination_grace_period_seconds",
    "terminationGracePeriodSeconds",
    "scheduler_name",
    "runtime_class_name",
    "priority_class_name",
    "pod_spec",
    "orphan_cleanup_grace_period_seconds",
];

/// gitlab-runner's `[runners.kubernetes]` keys Runway accepts and ignores (warned about by name).
pub const UNSUPPORTED_GITLAB_KEYS: &[&str] = &[
    "namespace_per_job",
    "allowed_users",
    "allowed_groups",
    "helper_image_flavor",
    "helper_image_autoset_arch_and_os",
    "cleanup_resources_timeout",
    "resource_availability_check_max_attempts",
    "retry_limit",
    "retry_backoff_max",
    "retry_limits",
    "init_permissions_container_security_context",
    "suspend_pvc_size",
    "suspend_pvc_storage_class",
    "logs_base_dir",
    "scripts_base_dir",
    "print_pod_warning_events",
    "pod_disruption_budget",
    "autoscaler",
];

/// The kinds of resource keys: the prefix and whether it has ephemeral storage.
const RESOURCE_KINDS: &[(&str, bool)] = &[("", true), ("helper_", true), ("service_", true), ("pod_", false)];

/// Whether `key` is one of the `[helper_|service_|pod_](cpu|memory|ephemeral_storage)_(limit|request)[_overwrite_max_allowed]` keys.
pub fn is_resource_key(key: &str) -> bool {
    RESOURCE_KINDS.iter().any(|(prefix, ephemeral)| {
        let Some(rest) = key.strip_prefix(prefix) else { return false };
        let rest = rest.strip_suffix("_overwrite_max_allowed").unwrap_or(rest);
        let resources: &[&str] = if *ephemeral { &["cpu", "memory", "ephemeral_storage"] } else { &["cpu", "memory"] };
        resources.iter().any(|r| rest == format!("{r}_limit") || rest == format!("{r}_request"))
    })
}

/// The result of [`parse`]: the config and what it ignored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parsed {
    /// The config.
    pub config: KubeConfig,
    /// One line per kind of thing ignored, naming the keys (for the job log / runner log).
    pub warnings: Vec<String>,
}

/// Parse the `[runners.kubernetes]` section (JSON; empty or `{}` for none). Errors name the key.
pub fn parse(json: &str) -> Result<Parsed, String> {
    let json = json.trim();
    let map: Map<String, Value> = if json.is_empty() || json == "null" {
        Map::new()
    } else {
        serde_json::from_str(json).map_err(|e| format!("[runners.kubernetes] is not a table: {e}"))?
    };
    let mut ignored = Vec::new();
    for (key, value) in &map {
        if SUPPORTED_KEYS.contains(&key.as_str()) || is_resource_key(key) {
            continue;
        }
        if UNSUPPORTED_GITLAB_KEYS.contains(&key.as_str()) {
            if !is_zero(value) {
                ignored.push(key.clone());
            }
        } else {
            return Err(format!("[runners.kubernetes] {key}: unknown key (neither Runway nor gitlab-runner has it)"));
        }
    }
    let f = Fields(&map);
    let mut c = KubeConfig {
        host: f.string("host")?,
        context: f.string("context")?,
        cert_file: f.string("cert_file")?,
        key_file: f.string("key_file")?,
        ca_file: f.string("ca_file")?,
        bearer_token: f.string("bearer_token")?,
        bearer_token_overwrite_allowed: f.get("bearer_token_overwrite_allowed")?.unwrap_or_default(),
        namespace: f.string("namespace")?,
        namespace_overwrite_allowed: f.regex("namespace_overwrite_allowed")?,
        image: f.string("image")?,
        helper_image: f.string("helper_image")?,
        pull_policy: f.policies("pull_policy")?,
        allowed_pull_policies: f.policies("allowed_pull_policies")?,
        allowed_images: f.strings("allowed_images")?,
        allowed_services: f.strings("allowed_services")?,
        privileged: f.get("privileged")?,
        allow_privilege_escalation: f.get("allow_privilege_escalation")?,
        cap_add: f.strings("cap_add")?,
        cap_drop: f.strings("cap_drop")?,
        build: f.resources("")?,
        helper: f.resources("helper_")?,
        service: f.resources("service_")?,
        pod: f.resources("pod_")?,
        service_account: f.string("service_account")?,
        service_account_overwrite_allowed: f.regex("service_account_overwrite_allowed")?,
        automount_service_account_token: f.get("automount_service_account_token")?,
        node_selector: f.get("node_selector")?.unwrap_or_default(),
        node_selector_overwrite_allowed: f.regex("node_selector_overwrite_allowed")?,
        node_tolerations: f.get("node_tolerations")?.unwrap_or_default(),
        node_tolerations_overwrite_allowed: f.regex("node_tolerations_overwrite_allowed")?,
        affinity: f.get("affinity")?.unwrap_or_default(),
        pod_labels: f.get("pod_labels")?.unwrap_or_default(),
        pod_labels_overwrite_allowed: f.regex("pod_labels_overwrite_allowed")?,
        pod_annotations: f.get("pod_annotations")?.unwrap_or_default(),
        pod_annotations_overwrite_allowed: f.regex("pod_annotations_overwrite_allowed")?,
        image_pull_secrets: f.strings("image_pull_secrets")?,
        use_service_account_image_pull_secrets: f.get("use_service_account_image_pull_secrets")?.unwrap_or_default(),
        volumes: f.get("volumes")?.unwrap_or_default(),
        dns_policy: dns_policy(&f.string("dns_policy")?)?,
        dns_config: f.get("dns_config")?.unwrap_or_default(),
        pod_security_context: f.get("pod_security_context")?.unwrap_or_default(),
        build_container_security_context: f.container_context("build_container_security_context")?,
        helper_container_security_context: f.container_context("helper_container_security_context")?,
        service_container_security_context: f.container_context("service_container_security_context")?,
        container_lifecycle: f.get("container_lifecycle")?.unwrap_or_default(),
        services: Vec::new(),
        host_aliases: f.get("host_aliases")?.unwrap_or_default(),
        poll_interval: f.seconds("poll_interval")?.unwrap_or(DEFAULT_POLL_INTERVAL),
        poll_timeout: f.seconds("poll_timeout")?.unwrap_or(DEFAULT_POLL_TIMEOUT),
        cleanup_grace_period_seconds: f.grace("cleanup_grace_period_seconds")?,
        pod_termination_grace_period_seconds: f.grace("pod_termination_grace_period_seconds")?,
        scheduler_name: f.string("scheduler_name")?,
        runtime_class_name: f.string("runtime_class_name")?,
        priority_class_name: f.string("priority_class_name")?,
        pod_spec: f.get("pod_spec")?.unwrap_or_default(),
        orphan_cleanup_grace_period_seconds: f
            .get("orphan_cleanup_grace_period_seconds")?
            .unwrap_or(crate::orphans::DEFAULT_GRACE_SECONDS),
    };
    // The deprecated `terminationGracePeriodSeconds` wins over both newer keys, as documented.
    for key in ["termination_grace_period_seconds", "terminationGracePeriodSeconds"] {
        if let Some(seconds) = f.grace(key)? {
            c.cleanup_grace_period_seconds = Some(seconds);
            c.pod_termination_grace_period_seconds = Some(seconds);
        }
    }
    let mut nested_ignored = Vec::new();
    for (i, entry) in f.list("services").iter().enumerate() {
        let (service, warning) =
            tables::service(entry).map_err(|e| format!("[runners.kubernetes] services[{i}]: {e}"))?;
        if let Some(key) = warning {
            nested_ignored.push(format!("services[{i}].{key}"));
        }
        c.services.push(service);
    }
    for entry in &c.pod_spec {
        entry.validate().map_err(|e| format!("[runners.kubernetes] {e}"))?;
    }
    c.volumes.validate().map_err(|e| format!("[runners.kubernetes] volumes.{e}"))?;
    c.pod_security_context.validate().map_err(|e| format!("[runners.kubernetes] pod_security_context.{e}"))?;
    if let Some(bad) = c.host_aliases.iter().find(|a| a.ip.trim().is_empty()) {
        return Err(format!("[runners.kubernetes] host_aliases: an entry without ip (hostnames {:?})", bad.hostnames));
    }
    if c.poll_interval == 0 {
        c.poll_interval = DEFAULT_POLL_INTERVAL;
    }
    if c.poll_timeout == 0 {
        c.poll_timeout = DEFAULT_POLL_TIMEOUT;
    }
    if !c.host.is_empty() && !c.host.starts_with("https://") && !c.host.starts_with("http://") {
        return Err(format!("[runners.kubernetes] host: {:?} is not an API server URL (https://host:port)", c.host));
    }
    let mut warnings = Vec::new();
    ignored.extend(nested_ignored);
    if !ignored.is_empty() {
        warnings.push(format!("[runners.kubernetes]: unsupported keys ignored: {}", ignored.join(", ")));
    }
    Ok(Parsed { config: c, warnings })
}

impl KubeConfig {
    /// The namespace jobs run in unless overwritten.
    pub fn namespace_or_default(&self) -> &str {
        if self.namespace.is_empty() {
            DEFAULT_NAMESPACE
        } else {
            &self.namespace
        }
    }

    /// How many times to look at a starting pod before giving up (gitlab-runner's poll attempts).
    pub fn poll_attempts(&self) -> u64 {
        (self.poll_timeout / self.poll_interval.max(1)).max(1)
    }
}

/// gitlab-runner's `dns_policy` names → the Pod API's.
fn dns_policy(text: &str) -> Result<Option<&'static str>, String> {
    match text {
        "" => Ok(None),
        "none" => Ok(Some("None")),
        "default" => Ok(Some("Default")),
        "cluster-first" => Ok(Some("ClusterFirst")),
        "cluster-first-with-host-net" => Ok(Some("ClusterFirstWithHostNet")),
        other => Err(format!(
            "[runners.kubernetes] dns_policy: unsupported kubernetes-dns-policy {other:?} (none, default, cluster-first, cluster-first-with-host-net)"
        )),
    }
}

/// Whether a value asks for nothing: null, false, 0, an empty string, list or table.
fn is_zero(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// Typed access to the section's keys, with errors naming the key.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, String> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => {
                serde_json::from_value(v.clone()).map(Some).map_err(|e| format!("[runners.kubernetes] {key}: {e}"))
            }
        }
    }

    fn string(&self, key: &str) -> Result<String, String> {
        Ok(self.get::<String>(key)?.unwrap_or_default())
    }

    fn strings(&self, key: &str) -> Result<Vec<String>, String> {
        Ok(self.get::<OneOrMany>(key)?.map(OneOrMany::into_vec).unwrap_or_default())
    }

    fn list(&self, key: &str) -> Vec<Value> {
        match self.0.get(key) {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(entries)) => entries.clone(),
            Some(other) => vec![other.clone()],
        }
    }

    fn regex(&self, key: &str) -> Result<String, String> {
        let text = self.string(key)?;
        if !text.is_empty() {
            regex::Regex::new(&text)
                .map_err(|e| format!("[runners.kubernetes] {key}: {text:?} is not a regular expression: {e}"))?;
        }
        Ok(text)
    }

    fn policies(&self, key: &str) -> Result<Vec<KubePullPolicy>, String> {
        self.strings(key)?
            .iter()
            .filter(|p| !p.trim().is_empty())
            .map(|p| KubePullPolicy::parse(p).map_err(|e| format!("[runners.kubernetes] {key}: {e}")))
            .collect()
    }

    fn quantity(&self, key: &str) -> Result<String, String> {
        let text = match self.0.get(key) {
            None | Some(Value::Null) => return Ok(String::new()),
            Some(Value::Number(n)) => n.to_string(),
            Some(Value::String(s)) => s.trim().to_string(),
            Some(other) => return Err(format!("[runners.kubernetes] {key}: {other} is not a Kubernetes quantity")),
        };
        if text.is_empty() {
            return Ok(text);
        }
        let q = Quantity::parse(&text).map_err(|e| format!("[runners.kubernetes] {key}: {e}"))?;
        if q.is_negative() {
            return Err(format!("[runners.kubernetes] {key}: {text:?} is negative"));
        }
        Ok(text)
    }

    fn values(&self, prefix: &str, kind: &str, suffix: &str) -> Result<ResourceValues, String> {
        let key = |r: &str| format!("{prefix}{r}_{kind}{suffix}");
        Ok(ResourceValues {
            cpu: self.quantity(&key("cpu"))?,
            memory: self.quantity(&key("memory"))?,
            ephemeral_storage: if prefix == "pod_" { String::new() } else { self.quantity(&key("ephemeral_storage"))? },
        })
    }

    fn resources(&self, prefix: &str) -> Result<ResourceConfig, String> {
        Ok(ResourceConfig {
            limits: self.values(prefix, "limit", "")?,
            requests: self.values(prefix, "request", "")?,
            limits_max: self.values(prefix, "limit", "_overwrite_max_allowed")?,
            requests_max: self.values(prefix, "request", "_overwrite_max_allowed")?,
        })
    }

    fn container_context(&self, key: &str) -> Result<ContainerSecurityContext, String> {
        let context: ContainerSecurityContext = self.get(key)?.unwrap_or_default();
        context.validate().map_err(|e| format!("[runners.kubernetes] {key}.{e}"))?;
        Ok(context)
    }

    fn seconds(&self, key: &str) -> Result<Option<u64>, String> {
        match self.get::<i64>(key)? {
            None => Ok(None),
            Some(n) if n < 0 => Err(format!("[runners.kubernetes] {key}: {n} is negative")),
            Some(n) => Ok(Some(n as u64)),
        }
    }

    fn grace(&self, key: &str) -> Result<Option<i64>, String> {
        match self.get::<i64>(key)? {
            Some(n) if n < 0 => Err(format!("[runners.kubernetes] {key}: {n} is negative")),
            other => Ok(other),
        }
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
