//! The pod's volumes and the mounts of its containers: the configured ones (`host_path`,
//! `secret`, `pvc`, `config_map`, `empty_dir`, `csi`, `nfs`, in gitlab-runner's order, mount
//! and sub paths `$VAR`-expanded) and Runway's own emptyDirs for the builds directory (`repo`,
//! unless a configured volume is mounted there, as gitlab-runner decides), the stage scripts
//! (`stages`) and the cache directory (`cache`, unless a configured volume covers it). Builds
//! JSON only.

use serde_json::{json, Map, Value};

use crate::config::KubeConfig;

/// Runway's volume for the builds directory (gitlab-runner's name).
pub const REPO_VOLUME: &str = "repo";
/// Runway's volume for the stage scripts and their output.
pub const STAGES_VOLUME: &str = "stages";
/// Runway's volume for the cache directory.
pub const CACHE_VOLUME: &str = "cache";

/// The pod's `volumes` and the `volumeMounts` every container gets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VolumePlan {
    /// `spec.volumes`.
    pub volumes: Vec<Value>,
    /// `volumeMounts` of build, helper and service containers.
    pub mounts: Vec<Value>,
}

/// Where Runway's directories are in the containers.
#[derive(Debug, Clone, Copy)]
pub struct Dirs<'a> {
    /// The builds directory.
    pub builds_dir: &'a str,
    /// The cache directory (empty: none).
    pub cache_dir: &'a str,
    /// The stage scripts directory.
    pub stages_dir: &'a str,
}

fn mount(name: &str, path: String, sub_path: String, read_only: bool, propagation: &Option<String>) -> Value {
    let mut m = Map::new();
    m.insert("name".into(), json!(name));
    m.insert("mountPath".into(), json!(path));
    if !sub_path.is_empty() {
        m.insert("subPath".into(), json!(sub_path));
    }
    if read_only {
        m.insert("readOnly".into(), json!(true));
    }
    if let Some(p) = propagation {
        m.insert("mountPropagation".into(), json!(p));
    }
    Value::Object(m)
}

fn items(items: &std::collections::BTreeMap<String, String>) -> Option<Value> {
    (!items.is_empty()).then(|| Value::Array(items.iter().map(|(k, p)| json!({"key": k, "path": p})).collect()))
}

fn same_dir(a: &str, b: &str) -> bool {
    let trim = |s: &str| if s.len() > 1 { s.trim_end_matches('/').to_string() } else { s.to_string() };
    !a.is_empty() && trim(a) == trim(b)
}

/// Plan the volumes; `expand` replaces `$VARS` with the job's values. An error when two
/// volumes share a name.
pub fn plan(config: &KubeConfig, dirs: Dirs<'_>, expand: &dyn Fn(&str) -> String) -> Result<VolumePlan, String> {
    let v = &config.volumes;
    let mut plan = VolumePlan::default();
    let add = |plan: &mut VolumePlan, name: &str, source: &str, body: Value| -> Result<(), String> {
        if plan.volumes.iter().any(|existing| existing["name"] == name) {
            return Err(format!("[runners.kubernetes] volumes: the volume name {name:?} is used twice"));
        }
        let mut volume = Map::new();
        volume.insert("name".into(), json!(name));
        volume.insert(source.into(), body);
        plan.volumes.push(Value::Object(volume));
        Ok(())
    };
    for h in &v.host_path {
        let path = if h.host_path.is_empty() { &h.mount_path } else { &h.host_path };
        add(&mut plan, &h.name, "hostPath", json!({ "path": path }))?;
        plan.mounts.push(mount(&h.name, expand(&h.mount_path), expand(&h.sub_path), h.read_only, &h.mount_propagation));
    }
    for s in &v.secret {
        let mut body = Map::new();
        body.insert("secretName".into(), json!(s.name));
        if let Some(items) = items(&s.items) {
            body.insert("items".into(), items);
        }
        add(&mut plan, &s.name, "secret", Value::Object(body))?;
        plan.mounts.push(mount(&s.name, expand(&s.mount_path), expand(&s.sub_path), s.read_only, &None));
    }
    let mut claims: Vec<&str> = Vec::new();
    for p in &v.pvc {
        let name = expand(&p.name);
        // gitlab-runner mounts one claim at several paths with one volume.
        if !claims.contains(&p.name.as_str()) {
            claims.push(&p.name);
            add(&mut plan, &name, "persistentVolumeClaim", json!({ "claimName": name }))?;
        }
        plan.mounts.push(mount(&name, expand(&p.mount_path), expand(&p.sub_path), p.read_only, &p.mount_propagation));
    }
    for c in &v.config_map {
        let mut body = Map::new();
        body.insert("name".into(), json!(c.name));
        if let Some(items) = items(&c.items) {
            body.insert("items".into(), items);
        }
        add(&mut plan, &c.name, "configMap", Value::Object(body))?;
        plan.mounts.push(mount(&c.name, expand(&c.mount_path), expand(&c.sub_path), c.read_only, &None));
    }
    for e in &v.empty_dir {
        let mut body = Map::new();
        if !e.medium.is_empty() {
            body.insert("medium".into(), json!(e.medium));
        }
        if !e.size_limit.trim().is_empty() {
            body.insert("sizeLimit".into(), json!(e.size_limit.trim()));
        }
        add(&mut plan, &e.name, "emptyDir", Value::Object(body))?;
        plan.mounts.push(mount(&e.name, expand(&e.mount_path), expand(&e.sub_path), false, &e.mount_propagation));
    }
    for c in &v.csi {
        let mut body = Map::new();
        body.insert("driver".into(), json!(c.driver));
        if !c.fs_type.is_empty() {
            body.insert("fsType".into(), json!(c.fs_type));
        }
        body.insert("readOnly".into(), json!(c.read_only));
        if !c.volume_attributes.is_empty() {
            body.insert("volumeAttributes".into(), json!(c.volume_attributes));
        }
        add(&mut plan, &c.name, "csi", Value::Object(body))?;
        plan.mounts.push(mount(&c.name, expand(&c.mount_path), expand(&c.sub_path), c.read_only, &None));
    }
    for n in &v.nfs {
        add(&mut plan, &n.name, "nfs", json!({ "server": n.server, "path": n.path, "readOnly": n.read_only }))?;
        plan.mounts.push(mount(&n.name, expand(&n.mount_path), expand(&n.sub_path), n.read_only, &None));
    }
    let covered = |plan: &VolumePlan, dir: &str| {
        plan.mounts
            .iter()
            .any(|m| m.get("subPath").is_none() && same_dir(m["mountPath"].as_str().unwrap_or_default(), dir))
    };
    let mut own = Vec::new();
    if !covered(&plan, dirs.builds_dir) {
        own.push((REPO_VOLUME, dirs.builds_dir));
    }
    own.push((STAGES_VOLUME, dirs.stages_dir));
    if !dirs.cache_dir.is_empty() && !covered(&plan, dirs.cache_dir) {
        own.push((CACHE_VOLUME, dirs.cache_dir));
    }
    for (name, dir) in own {
        add(&mut plan, name, "emptyDir", json!({}))?;
        plan.mounts.push(mount(name, dir.to_string(), String::new(), false, &None));
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

    const DIRS: Dirs<'static> = Dirs { builds_dir: "/builds", cache_dir: "/cache", stages_dir: "/runway/stages" };

    fn no_expand(s: &str) -> String {
        s.to_string()
    }

    #[test]
    fn without_config_only_runway_dirs() {
        let plan = plan(&parse("{}").unwrap().config, DIRS, &no_expand).unwrap();
        assert_eq!(
            plan.volumes,
            vec![
                json!({"name": "repo", "emptyDir": {}}),
                json!({"name": "stages", "emptyDir": {}}),
                json!({"name": "cache", "emptyDir": {}})
            ]
        );
        assert_eq!(
            plan.mounts,
            vec![
                json!({"name": "repo", "mountPath": "/builds"}),
                json!({"name": "stages", "mountPath": "/runway/stages"}),
                json!({"name": "cache", "mountPath": "/cache"})
            ]
        );
    }

    #[test]
    fn a_configured_volume_at_the_builds_or_cache_dir_replaces_runway_s() {
        let c = parse(
            r#"{"volumes": {"pvc": [{"name": "builds-$CI_PROJECT_ID", "mount_path": "/builds/"},
                                     {"name": "builds-$CI_PROJECT_ID", "mount_path": "/other", "sub_path": "x"}],
                             "host_path": [{"name": "c", "mount_path": "/cache", "host_path": "/srv/cache"}]}}"#,
        )
        .unwrap()
        .config;
        let expand = |s: &str| s.replace("$CI_PROJECT_ID", "12");
        let plan = plan(&c, DIRS, &expand).unwrap();
        let names: Vec<&str> = plan.volumes.iter().map(|v| v["name"].as_str().unwrap()).collect();
        assert_eq!(names, vec!["c", "builds-12", "stages"]);
        assert_eq!(plan.volumes[1], json!({"name": "builds-12", "persistentVolumeClaim": {"claimName": "builds-12"}}));
        assert_eq!(plan.mounts[2], json!({"name": "builds-12", "mountPath": "/other", "subPath": "x"}));
    }

    #[test]
    fn duplicate_names_are_errors() {
        let c = parse(r#"{"volumes": {"empty_dir": [{"name": "repo", "mount_path": "/x"}]}}"#).unwrap().config;
        let err = plan(&c, DIRS, &no_expand).unwrap_err();
        assert!(err.contains("\"repo\" is used twice"), "{err}");
    }
}
