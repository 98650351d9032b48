//! The nested tables of `[runners.kubernetes]` (volumes, security contexts, affinity, DNS
//! config, container lifecycle, host aliases, services) as gitlab-runner's TOML spells them.
//! Unknown keys inside a table are errors naming the key. Tables that map one-to-one onto a
//! Kubernetes object serialize straight into the API's camelCase form; the rest are read by
//! `security` and `volumes`. Reads and validates only; builds no Pod.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::quantity::Quantity;

/// `[runners.kubernetes.volumes]`: every kind gitlab-runner mounts.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Volumes {
    /// `[[runners.kubernetes.volumes.host_path]]`.
    pub host_path: Vec<HostPathVolume>,
    /// `[[runners.kubernetes.volumes.pvc]]`.
    pub pvc: Vec<PvcVolume>,
    /// `[[runners.kubernetes.volumes.config_map]]`.
    pub config_map: Vec<ItemsVolume>,
    /// `[[runners.kubernetes.volumes.secret]]`.
    pub secret: Vec<ItemsVolume>,
    /// `[[runners.kubernetes.volumes.empty_dir]]`.
    pub empty_dir: Vec<EmptyDirVolume>,
    /// `[[runners.kubernetes.volumes.csi]]`.
    pub csi: Vec<CsiVolume>,
    /// `[[runners.kubernetes.volumes.nfs]]`.
    pub nfs: Vec<NfsVolume>,
}

/// A host directory.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostPathVolume {
    /// Volume name.
    pub name: String,
    /// Where the containers see it.
    pub mount_path: String,
    /// Sub-path of the volume to mount.
    #[serde(default)]
    pub sub_path: String,
    /// Mount read-only.
    #[serde(default)]
    pub read_only: bool,
    /// The directory on the node (empty: `mount_path`, gitlab-runner's 9.3 syntax).
    #[serde(default)]
    pub host_path: String,
    /// `None`, `HostToContainer` or `Bidirectional`.
    #[serde(default)]
    pub mount_propagation: Option<String>,
}

/// A persistent volume claim (the claim is named like the volume; `$VARS` expanded).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PvcVolume {
    /// Volume and claim name.
    pub name: String,
    /// Where the containers see it.
    pub mount_path: String,
    /// Sub-path of the volume to mount.
    #[serde(default)]
    pub sub_path: String,
    /// Mount read-only.
    #[serde(default)]
    pub read_only: bool,
    /// `None`, `HostToContainer` or `Bidirectional`.
    #[serde(default)]
    pub mount_propagation: Option<String>,
}

/// A ConfigMap or Secret (named like the volume), optionally only some keys.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ItemsVolume {
    /// Volume and object name.
    pub name: String,
    /// Where the containers see it.
    pub mount_path: String,
    /// Sub-path of the volume to mount.
    #[serde(default)]
    pub sub_path: String,
    /// Mount read-only.
    #[serde(default)]
    pub read_only: bool,
    /// Key → path of the keys to project (empty: every key).
    #[serde(default)]
    pub items: BTreeMap<String, String>,
}

/// An emptyDir.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmptyDirVolume {
    /// Volume name.
    pub name: String,
    /// Where the containers see it.
    pub mount_path: String,
    /// Sub-path of the volume to mount.
    #[serde(default)]
    pub sub_path: String,
    /// `Memory` for a tmpfs; empty: the node's disk.
    #[serde(default)]
    pub medium: String,
    /// Size limit (a quantity; empty: none).
    #[serde(default)]
    pub size_limit: String,
    /// `None`, `HostToContainer` or `Bidirectional`.
    #[serde(default)]
    pub mount_propagation: Option<String>,
}

/// A CSI inline volume.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CsiVolume {
    /// Volume name.
    pub name: String,
    /// Where the containers see it.
    pub mount_path: String,
    /// Sub-path of the volume to mount.
    #[serde(default)]
    pub sub_path: String,
    /// The CSI driver.
    pub driver: String,
    /// File system type (empty: the driver's default).
    #[serde(default)]
    pub fs_type: String,
    /// Mount read-only.
    #[serde(default)]
    pub read_only: bool,
    /// Driver-specific attributes.
    #[serde(default)]
    pub volume_attributes: BTreeMap<String, String>,
}

/// An NFS share.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NfsVolume {
    /// Volume name.
    pub name: String,
    /// Where the containers see it.
    pub mount_path: String,
    /// Sub-path of the volume to mount.
    #[serde(default)]
    pub sub_path: String,
    /// NFS server.
    pub server: String,
    /// Exported path.
    pub path: String,
    /// Mount read-only.
    #[serde(default)]
    pub read_only: bool,
}

/// `capabilities` of a container security context (`None`: keep the runner-wide list).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    /// Capabilities added (replaces `cap_add` when set).
    #[serde(default)]
    pub add: Option<Vec<String>>,
    /// Capabilities dropped (replaces `cap_drop` and the default `NET_RAW` drop when set).
    #[serde(default)]
    pub drop: Option<Vec<String>>,
}

/// A seccomp or AppArmor profile.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// `RuntimeDefault`, `Localhost` or `Unconfined`.
    #[serde(rename = "type", default)]
    pub kind: String,
    /// The profile on the node (required with `Localhost`).
    #[serde(default)]
    pub localhost_profile: String,
}

/// `build_container_security_context` and its helper, service and init-permissions twins.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ContainerSecurityContext {
    /// Capabilities to add and drop.
    pub capabilities: Option<Capabilities>,
    /// Privileged (`None`: `privileged`).
    pub privileged: Option<bool>,
    /// UID.
    pub run_as_user: Option<i64>,
    /// GID.
    pub run_as_group: Option<i64>,
    /// Refuse to start as root.
    pub run_as_non_root: Option<bool>,
    /// Read-only root file system.
    pub read_only_root_filesystem: Option<bool>,
    /// `allowPrivilegeEscalation` (`None`: `allow_privilege_escalation`).
    pub allow_privilege_escalation: Option<bool>,
    /// SELinux type label.
    pub selinux_type: String,
    /// `default` or `unmasked`.
    pub proc_mount: String,
    /// Seccomp profile.
    pub seccomp_profile: Option<Profile>,
    /// AppArmor profile.
    pub app_armor_profile: Option<Profile>,
}

/// `pod_security_context`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PodSecurityContext {
    /// Supplemental group owning the pod's volumes.
    pub fs_group: Option<i64>,
    /// GID of every container.
    pub run_as_group: Option<i64>,
    /// Refuse to start containers as root.
    pub run_as_non_root: Option<bool>,
    /// UID of every container.
    pub run_as_user: Option<i64>,
    /// Extra groups of every container's first process.
    pub supplemental_groups: Vec<i64>,
    /// SELinux type label.
    pub selinux_type: String,
    /// Seccomp profile.
    pub seccomp_profile: Option<Profile>,
    /// AppArmor profile.
    pub app_armor_profile: Option<Profile>,
}

fn is_empty<T>(v: &[T]) -> bool {
    v.is_empty()
}

/// `[runners.kubernetes.affinity]`; serializes as the Pod API's `affinity`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all(serialize = "camelCase"))]
pub struct Affinity {
    /// Node affinity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_affinity: Option<NodeAffinity>,
    /// Pod affinity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_affinity: Option<PodAffinity>,
    /// Pod anti-affinity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_anti_affinity: Option<PodAffinity>,
}

/// Node affinity.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all(serialize = "camelCase"))]
pub struct NodeAffinity {
    /// Hard rules.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub required_during_scheduling_ignored_during_execution: Option<NodeSelector>,
    /// Soft rules.
    #[serde(skip_serializing_if = "is_empty")]
    pub preferred_during_scheduling_ignored_during_execution: Vec<PreferredSchedulingTerm>,
}

/// Terms of which one must match.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all(serialize = "camelCase"))]
pub struct NodeSelector {
    /// The terms.
    pub node_selector_terms: Vec<NodeSelectorTerm>,
}

/// A weighted node selector term.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all(serialize = "camelCase"))]
pub struct PreferredSchedulingTerm {
    /// Weight (1–100).
    pub weight: i32,
    /// The term.
    pub preference: NodeSelectorTerm,
}

/// Requirements on node labels and fields.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all(serialize = "camelCase"))]
pub struct NodeSelectorTerm {
    /// On labels.
    #[serde(skip_serializing_if = "is_empty")]
    pub match_expressions: Vec<Requirement>,
    /// On fields.
    #[serde(skip_serializing_if = "is_empty")]
    pub match_fields: Vec<Requirement>,
}

/// `key operator values`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all(serialize = "camelCase"))]
pub struct Requirement {
    /// Label or field.
    #[serde(default)]
    pub key: String,
    /// `In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt`, `Lt`.
    #[serde(default)]
    pub operator: String,
    /// Values.
    #[serde(default, skip_serializing_if = "is_empty")]
    pub values: Vec<String>,
}

/// Pod affinity or anti-affinity.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all(serialize = "camelCase"))]
pub struct PodAffinity {
    /// Hard rules.
    #[serde(skip_serializing_if = "is_empty")]
    pub required_during_scheduling_ignored_during_execution: Vec<PodAffinityTerm>,
    /// Soft rules.
    #[serde(skip_serializing_if = "is_empty")]
    pub preferred_during_scheduling_ignored_during_execution: Vec<WeightedPodAffinityTerm>,
}

/// A weighted pod affinity term.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all(serialize = "camelCase"))]
pub struct WeightedPodAffinityTerm {
    /// Weight (1–100).
    pub weight: i32,
    /// The term.
    pub pod_affinity_term: PodAffinityTerm,
}

/// Pods (by labels and namespaces) to be near or away from.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all(serialize = "camelCase"))]
pub struct PodAffinityTerm {
    /// Which pods.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
    /// In which namespaces.
    #[serde(skip_serializing_if = "is_empty")]
    pub namespaces: Vec<String>,
    /// The node label defining "near".
    pub topology_key: String,
    /// Namespaces by label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Label keys whose values must match the incoming pod's.
    #[serde(skip_serializing_if = "is_empty")]
    pub match_label_keys: Vec<String>,
    /// Label keys whose values must differ.
    #[serde(skip_serializing_if = "is_empty")]
    pub mismatch_label_keys: Vec<String>,
}

/// A label selector.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all(serialize = "camelCase"))]
pub struct LabelSelector {
    /// Exact labels.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Expressions.
    #[serde(skip_serializing_if = "is_empty")]
    pub match_expressions: Vec<Requirement>,
}

/// `[runners.kubernetes.dns_config]`; serializes as the Pod API's `dnsConfig`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DnsConfig {
    /// DNS servers.
    #[serde(skip_serializing_if = "is_empty")]
    pub nameservers: Vec<String>,
    /// resolv.conf options.
    #[serde(skip_serializing_if = "is_empty")]
    pub options: Vec<DnsOption>,
    /// Search domains.
    #[serde(skip_serializing_if = "is_empty")]
    pub searches: Vec<String>,
}

/// One resolv.conf option.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DnsOption {
    /// Option name.
    pub name: String,
    /// Option value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// `[runners.kubernetes.container_lifecycle]`; serializes as a container's `lifecycle`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all(serialize = "camelCase"))]
pub struct Lifecycle {
    /// Run after a container starts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub post_start: Option<LifecycleHandler>,
    /// Run before a container is stopped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pre_stop: Option<LifecycleHandler>,
}

/// One lifecycle action.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all(serialize = "camelCase"))]
pub struct LifecycleHandler {
    /// Run a command in the container.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecAction>,
    /// Send an HTTP GET.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_get: Option<HttpGetAction>,
    /// Open a TCP connection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_socket: Option<TcpSocketAction>,
}

/// A command.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExecAction {
    /// argv.
    pub command: Vec<String>,
}

/// An HTTP GET.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all(serialize = "camelCase"))]
pub struct HttpGetAction {
    /// Host (empty: the pod's IP).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub host: String,
    /// Headers.
    #[serde(skip_serializing_if = "is_empty")]
    pub http_headers: Vec<HttpHeader>,
    /// Path.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// Port.
    pub port: u16,
    /// `HTTP` or `HTTPS`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub scheme: String,
}

/// An HTTP header.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpHeader {
    /// Name.
    pub name: String,
    /// Value.
    pub value: String,
}

/// A TCP connection.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TcpSocketAction {
    /// Host (empty: the pod's IP).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub host: String,
    /// Port.
    pub port: u16,
}

/// One `[[runners.kubernetes.host_aliases]]`; serializes as a Pod `hostAliases` entry.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HostAlias {
    /// IP address.
    pub ip: String,
    /// Host names for it.
    #[serde(default)]
    pub hostnames: Vec<String>,
}

/// One `[[runners.kubernetes.services]]`: a service every job gets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServiceConfig {
    /// Image reference (`$VARS` expanded per job).
    pub name: String,
    /// Host names (`alias`, space or comma separated).
    pub aliases: Vec<String>,
    /// Command override (the container's `args`).
    pub command: Vec<String>,
    /// Entrypoint override (the container's `command`).
    pub entrypoint: Vec<String>,
    /// `KEY=value` variables.
    pub variables: Vec<(String, String)>,
}

/// A string or a list of strings.
#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub(crate) fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) if s.is_empty() => Vec::new(),
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceTable {
    name: String,
    #[serde(default)]
    alias: String,
    #[serde(default)]
    command: Option<OneOrMany>,
    #[serde(default)]
    entrypoint: Option<OneOrMany>,
    #[serde(default)]
    environment: Vec<String>,
    #[serde(default)]
    suspend_data_path: String,
}

/// Read one service (a table, or just an image name); the warning names `suspend_data_path`
/// when it is set (Runway does not suspend jobs).
pub(crate) fn service(entry: &serde_json::Value) -> Result<(ServiceConfig, Option<String>), String> {
    if let serde_json::Value::String(name) = entry {
        if name.trim().is_empty() {
            return Err("empty service name".into());
        }
        return Ok((ServiceConfig { name: name.clone(), ..Default::default() }, None));
    }
    let table: ServiceTable = serde_json::from_value(entry.clone()).map_err(|e| e.to_string())?;
    if table.name.trim().is_empty() {
        return Err("empty service name".into());
    }
    let variables = table
        .environment
        .iter()
        .map(|item| {
            item.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| format!("environment {item:?} is not KEY=value"))
        })
        .collect::<Result<_, _>>()?;
    let warning = (!table.suspend_data_path.is_empty()).then(|| "suspend_data_path".to_string());
    Ok((
        ServiceConfig {
            name: table.name,
            aliases: docker_logic::config::split_aliases(&table.alias),
            command: table.command.map(OneOrMany::into_vec).unwrap_or_default(),
            entrypoint: table.entrypoint.map(OneOrMany::into_vec).unwrap_or_default(),
            variables,
        },
        warning,
    ))
}

const PROFILE_TYPES: &[&str] = &["RuntimeDefault", "Localhost", "Unconfined"];
const MOUNT_PROPAGATIONS: &[&str] = &["None", "HostToContainer", "Bidirectional"];

fn check_profile(what: &str, profile: &Option<Profile>) -> Result<(), String> {
    let Some(p) = profile else { return Ok(()) };
    if p.kind.is_empty() {
        return Ok(());
    }
    if !PROFILE_TYPES.contains(&p.kind.as_str()) {
        return Err(format!("{what}.type: {:?} is not one of {}", p.kind, PROFILE_TYPES.join(", ")));
    }
    if p.kind == "Localhost" && p.localhost_profile.is_empty() {
        return Err(format!("{what}: type Localhost needs localhost_profile"));
    }
    Ok(())
}

impl ContainerSecurityContext {
    /// Check profile types and `proc_mount`.
    pub(crate) fn validate(&self) -> Result<(), String> {
        check_profile("seccomp_profile", &self.seccomp_profile)?;
        check_profile("app_armor_profile", &self.app_armor_profile)?;
        match self.proc_mount.trim().to_ascii_lowercase().as_str() {
            "" | "default" | "unmasked" => Ok(()),
            other => Err(format!("proc_mount: {other:?} is not default or unmasked")),
        }
    }
}

impl PodSecurityContext {
    /// Check profile types.
    pub(crate) fn validate(&self) -> Result<(), String> {
        check_profile("seccomp_profile", &self.seccomp_profile)?;
        check_profile("app_armor_profile", &self.app_armor_profile)
    }
}

impl Volumes {
    /// Check empty names, size limits and mount propagation modes.
    pub(crate) fn validate(&self) -> Result<(), String> {
        let mut mounts: Vec<(&str, &str, &str, &Option<String>)> = Vec::new();
        mounts.extend(
            self.host_path.iter().map(|v| ("host_path", v.name.as_str(), v.mount_path.as_str(), &v.mount_propagation)),
        );
        mounts.extend(self.pvc.iter().map(|v| ("pvc", v.name.as_str(), v.mount_path.as_str(), &v.mount_propagation)));
        mounts.extend(
            self.empty_dir.iter().map(|v| ("empty_dir", v.name.as_str(), v.mount_path.as_str(), &v.mount_propagation)),
        );
        const NONE: Option<String> = None;
        mounts.extend(self.config_map.iter().map(|v| ("config_map", v.name.as_str(), v.mount_path.as_str(), &NONE)));
        mounts.extend(self.secret.iter().map(|v| ("secret", v.name.as_str(), v.mount_path.as_str(), &NONE)));
        mounts.extend(self.csi.iter().map(|v| ("csi", v.name.as_str(), v.mount_path.as_str(), &NONE)));
        mounts.extend(self.nfs.iter().map(|v| ("nfs", v.name.as_str(), v.mount_path.as_str(), &NONE)));
        for (kind, name, mount_path, propagation) in mounts {
            if name.trim().is_empty() {
                return Err(format!("{kind}: a volume without a name"));
            }
            if mount_path.trim().is_empty() {
                return Err(format!("{kind} {name:?}: mount_path is empty"));
            }
            if let Some(p) = propagation {
                if !MOUNT_PROPAGATIONS.contains(&p.as_str()) {
                    return Err(format!(
                        "{kind} {name:?}: mount_propagation {p:?} is not one of {}",
                        MOUNT_PROPAGATIONS.join(", ")
                    ));
                }
            }
        }
        for v in &self.empty_dir {
            if !v.size_limit.trim().is_empty() {
                Quantity::parse(v.size_limit.trim()).map_err(|e| format!("empty_dir {:?}: size_limit: {e}", v.name))?;
            }
        }
        for v in &self.csi {
            if v.driver.trim().is_empty() {
                return Err(format!("csi {:?}: driver is empty", v.name));
            }
        }
        Ok(())
    }
}
