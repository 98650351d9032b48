//! Security contexts as gitlab-runner builds them: the pod's from `pod_security_context`, and
//! each container's from its `*_container_security_context` merged with the runner-wide
//! `privileged`, `allow_privilege_escalation`, `cap_add` and `cap_drop` (and the default drop
//! of `NET_RAW`). User and group fall back to the pod's, as gitlab-runner's do. Builds JSON
//! only.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::config::KubeConfig;
use crate::tables::{ContainerSecurityContext, PodSecurityContext, Profile};

/// Capabilities every Linux container drops unless `cap_add` adds them back (gitlab-runner's).
pub const DEFAULT_CAP_DROP: &[&str] = &["NET_RAW"];

fn profile(p: &Option<Profile>) -> Option<Value> {
    let p = p.as_ref().filter(|p| !p.kind.is_empty())?;
    let mut out = Map::new();
    out.insert("type".into(), json!(p.kind));
    if p.kind == "Localhost" {
        out.insert("localhostProfile".into(), json!(p.localhost_profile));
    }
    Some(Value::Object(out))
}

fn put<T: serde::Serialize>(map: &mut Map<String, Value>, key: &str, value: Option<T>) {
    if let Some(v) = value {
        map.insert(key.into(), json!(v));
    }
}

/// The pod's `securityContext`; `None` when `pod_security_context` sets nothing.
pub fn pod_security_context(c: &PodSecurityContext) -> Option<Value> {
    let mut out = Map::new();
    put(&mut out, "fsGroup", c.fs_group);
    put(&mut out, "runAsGroup", c.run_as_group);
    put(&mut out, "runAsNonRoot", c.run_as_non_root);
    put(&mut out, "runAsUser", c.run_as_user);
    if !c.supplemental_groups.is_empty() {
        out.insert("supplementalGroups".into(), json!(c.supplemental_groups));
    }
    if !c.selinux_type.is_empty() {
        out.insert("seLinuxOptions".into(), json!({ "type": c.selinux_type }));
    }
    put(&mut out, "seccompProfile", profile(&c.seccomp_profile));
    put(&mut out, "appArmorProfile", profile(&c.app_armor_profile));
    (!out.is_empty()).then_some(Value::Object(out))
}

/// The runner-wide capabilities: `NET_RAW` dropped, `cap_add` added, `cap_drop` dropped (later
/// wins), sorted.
fn runner_capabilities(config: &KubeConfig) -> (Vec<String>, Vec<String>) {
    let mut enabled: BTreeMap<&str, bool> = BTreeMap::new();
    for cap in DEFAULT_CAP_DROP {
        enabled.insert(cap, false);
    }
    for cap in &config.cap_add {
        enabled.insert(cap, true);
    }
    for cap in &config.cap_drop {
        enabled.insert(cap, false);
    }
    let pick = |want: bool| enabled.iter().filter(|(_, on)| **on == want).map(|(c, _)| c.to_string()).collect();
    (pick(true), pick(false))
}

/// A container's `securityContext` (always set: at least `NET_RAW` is dropped).
pub fn container_security_context(config: &KubeConfig, c: &ContainerSecurityContext) -> Value {
    let (mut add, mut drop) = runner_capabilities(config);
    if let Some(caps) = &c.capabilities {
        if let Some(a) = &caps.add {
            add = a.clone();
        }
        if let Some(d) = &caps.drop {
            drop = d.clone();
        }
    }
    let mut out = Map::new();
    let mut capabilities = Map::new();
    if !add.is_empty() {
        capabilities.insert("add".into(), json!(add));
    }
    if !drop.is_empty() {
        capabilities.insert("drop".into(), json!(drop));
    }
    if !capabilities.is_empty() {
        out.insert("capabilities".into(), Value::Object(capabilities));
    }
    put(&mut out, "privileged", c.privileged.or(config.privileged));
    put(&mut out, "allowPrivilegeEscalation", c.allow_privilege_escalation.or(config.allow_privilege_escalation));
    let pod = &config.pod_security_context;
    put(&mut out, "runAsUser", c.run_as_user.or(pod.run_as_user));
    put(&mut out, "runAsGroup", c.run_as_group.or(pod.run_as_group));
    put(&mut out, "runAsNonRoot", c.run_as_non_root);
    put(&mut out, "readOnlyRootFilesystem", c.read_only_root_filesystem);
    match c.proc_mount.trim().to_ascii_lowercase().as_str() {
        "default" => {
            out.insert("procMount".into(), json!("Default"));
        }
        "unmasked" => {
            out.insert("procMount".into(), json!("Unmasked"));
        }
        _ => {}
    }
    if !c.selinux_type.is_empty() {
        out.insert("seLinuxOptions".into(), json!({ "type": c.selinux_type }));
    }
    put(&mut out, "seccompProfile", profile(&c.seccomp_profile));
    put(&mut out, "appArmorProfile", profile(&c.app_armor_profile));
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

    fn config(json: &str) -> KubeConfig {
        parse(json).unwrap().config
    }

    #[test]
    fn default_container_context_drops_net_raw() {
        let c = config("{}");
        assert_eq!(
            container_security_context(&c, &c.build_container_security_context),
            json!({"capabilities": {"drop": ["NET_RAW"]}})
        );
        assert_eq!(pod_security_context(&c.pod_security_context), None);
    }

    #[test]
    fn runner_capabilities_and_flags_merge_with_the_container_table() {
        let c = config(
            r#"{"cap_add": ["NET_RAW", "SYS_TIME"], "cap_drop": ["CHOWN"], "privileged": true,
                "allow_privilege_escalation": false,
                "pod_security_context": {"run_as_user": 1000, "run_as_group": 3000},
                "build_container_security_context": {"privileged": false, "run_as_user": 65534,
                    "read_only_root_filesystem": true, "proc_mount": "unmasked", "selinux_type": "spc_t",
                    "seccomp_profile": {"type": "Localhost", "localhost_profile": "p.json"}},
                "helper_container_security_context": {"capabilities": {"drop": ["ALL"]}, "run_as_non_root": true}}"#,
        );
        assert_eq!(
            container_security_context(&c, &c.build_container_security_context),
            json!({
                "capabilities": {"add": ["NET_RAW", "SYS_TIME"], "drop": ["CHOWN"]},
                "privileged": false, "allowPrivilegeEscalation": false,
                "runAsUser": 65534, "runAsGroup": 3000, "readOnlyRootFilesystem": true,
                "procMount": "Unmasked", "seLinuxOptions": {"type": "spc_t"},
                "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}
            })
        );
        assert_eq!(
            container_security_context(&c, &c.helper_container_security_context),
            json!({
                "capabilities": {"add": ["NET_RAW", "SYS_TIME"], "drop": ["ALL"]},
                "privileged": true, "allowPrivilegeEscalation": false,
                "runAsUser": 1000, "runAsGroup": 3000, "runAsNonRoot": true
            })
        );
    }

    #[test]
    fn pod_context_fields() {
        let c = config(
            r#"{"pod_security_context": {"fs_group": 2000, "run_as_non_root": true, "supplemental_groups": [1, 2],
                "selinux_type": "t", "seccomp_profile": {"type": "RuntimeDefault"},
                "app_armor_profile": {"type": "Unconfined"}}}"#,
        );
        assert_eq!(
            pod_security_context(&c.pod_security_context).unwrap(),
            json!({"fsGroup": 2000, "runAsNonRoot": true, "supplementalGroups": [1, 2],
                   "seLinuxOptions": {"type": "t"}, "seccompProfile": {"type": "RuntimeDefault"},
                   "appArmorProfile": {"type": "Unconfined"}})
        );
    }
}
