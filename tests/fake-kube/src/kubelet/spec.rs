//! How a pod's containers become Docker containers: `command`/`args` over the image's
//! entrypoint/cmd (with `$(VAR)` expansion), `env` (values, secret/configMap/field refs),
//! `workingDir`, stdin/tty, `securityContext`, resources as Docker limits, volume mounts
//! (`subPath`, `readOnly`), the pod's `/etc/hosts` (`hostAliases`), the network of the pause
//! container, and the labels every object fake-kube makes carries. Pure functions over the
//! pod JSON and what the kubelet resolved; no Docker calls.

use std::collections::BTreeMap;

use serde_json::{json, Value};

/// The label on every Docker object fake-kube creates.
pub(crate) const LABEL: &str = "io.runway.fake-kube";
/// The label naming the pod's uid.
pub(crate) const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";

/// Labels of a pod's Docker objects.
pub(crate) fn labels(pod: &Value, container: &str) -> Value {
    let meta = &pod["metadata"];
    json!({
        LABEL: "1",
        POD_UID_LABEL: meta["uid"],
        "io.kubernetes.pod.name": meta["name"],
        "io.kubernetes.pod.namespace": meta["namespace"],
        "io.kubernetes.container.name": container,
    })
}

/// A Kubernetes quantity (`500m`, `2`, `128Mi`, `1G`, `1e3`) as a number of units.
pub(crate) fn quantity(text: &str) -> Option<f64> {
    let text = text.trim();
    let suffixes: [(&str, f64); 13] = [
        ("Ki", 1024.0),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    for (suffix, factor) in suffixes {
        if let Some(number) = text.strip_suffix(suffix) {
            return number.parse::<f64>().ok().map(|n| n * factor);
        }
    }
    text.parse::<f64>().ok()
}

fn quantity_of(value: &Value) -> Option<f64> {
    match value {
        Value::String(s) => quantity(s),
        Value::Number(n) => n.as_f64(),
        _ => None,
    }
}

/// Expand `$(NAME)` from `env` (unknown references stay as written; `$$` is `$`).
pub(crate) fn expand(text: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match env.get(name) {
                        Some(value) => out.push_str(value),
                        None => out.push_str(&format!("$({name})")),
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    out.push('$');
                    rest = after;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The pod's `/etc/hosts`: localhost, the pod's own name, then `hostAliases`.
pub(crate) fn etc_hosts(pod: &Value, host_network: bool) -> String {
    let mut hosts = String::from("# Kubernetes-managed hosts file (fake-kube).\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    if !host_network {
        hosts.push_str(&format!("127.0.1.1\t{name}\n"));
    }
    if let Some(aliases) = pod["spec"]["hostAliases"].as_array() {
        hosts.push_str("\n# Entries added by HostAliases.\n");
        for alias in aliases {
            let names: Vec<&str> =
                alias["hostnames"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            if let Some(ip) = alias["ip"].as_str() {
                hosts.push_str(&format!("{ip}\t{}\n", names.join("\t")));
            }
        }
    }
    hosts
}

/// A volume of the pod, resolved by the kubelet to a host path or a Docker volume.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    /// A Docker volume's name and its mount point on the host.
    DockerVolume { name: String, mountpoint: String },
    /// A path on the host (hostPath, secret, configMap files).
    HostPath { path: String, read_only: bool },
}

/// What a container's creation needs besides the pod.
pub(crate) struct Context<'a> {
    pub pause_id: &'a str,
    pub hosts_file: &'a str,
    pub volumes: &'a BTreeMap<String, Source>,
    pub env: Vec<(String, String)>,
}

/// The Engine's create body for `container` of `pod`. Errors name the bad field.
pub(crate) fn container_config(pod: &Value, container: &Value, ctx: &Context<'_>) -> Result<Value, String> {
    let name = container["name"].as_str().unwrap_or_default();
    let env_map: BTreeMap<String, String> = ctx.env.iter().cloned().collect();
    let strings = |v: &Value| -> Option<Vec<String>> {
        v.as_array().map(|a| a.iter().filter_map(Value::as_str).map(|s| expand(s, &env_map)).collect())
    };
    let mut config = json!({
        "Image": container["image"],
        "Env": ctx.env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "Labels": labels(pod, name),
        "OpenStdin": container["stdin"].as_bool().unwrap_or(false),
        "StdinOnce": container["stdinOnce"].as_bool().unwrap_or(false),
        "AttachStdin": container["stdin"].as_bool().unwrap_or(false),
        "AttachStdout": true,
        "AttachStderr": true,
        "Tty": container["tty"].as_bool().unwrap_or(false),
    });
    if let Some(command) = strings(&container["command"]) {
        config["Entrypoint"] = json!(command);
        config["Cmd"] = json!(strings(&container["args"]).unwrap_or_default());
    } else if let Some(args) = strings(&container["args"]) {
        config["Cmd"] = json!(args);
    }
    if let Some(dir) = container["workingDir"].as_str() {
        config["WorkingDir"] = json!(dir);
    }
    let pod_sc = &pod["spec"]["securityContext"];
    let sc = &container["securityContext"];
    let user = sc["runAsUser"].as_i64().or(pod_sc["runAsUser"].as_i64());
    let group = sc["runAsGroup"].as_i64().or(pod_sc["runAsGroup"].as_i64());
    match (user, group) {
        (Some(u), Some(g)) => config["User"] = json!(format!("{u}:{g}")),
        (Some(u), None) => config["User"] = json!(u.to_string()),
        (None, Some(g)) => config["User"] = json!(format!("0:{g}")),
        (None, None) => {}
    }
    let mut host = json!({
        "NetworkMode": format!("container:{}", ctx.pause_id),
        "Privileged": sc["privileged"].as_bool().unwrap_or(false),
        "ReadonlyRootfs": sc["readOnlyRootFilesystem"].as_bool().unwrap_or(false),
    });
    if let Some(groups) = pod_sc["supplementalGroups"].as_array() {
        host["GroupAdd"] = json!(groups.iter().map(|g| g.to_string()).collect::<Vec<_>>());
    }
    if let Some(add) = sc["capabilities"]["add"].as_array() {
        host["CapAdd"] = json!(add);
    }
    if let Some(drop) = sc["capabilities"]["drop"].as_array() {
        host["CapDrop"] = json!(drop);
    }
    let resources = &container["resources"];
    if let Some(memory) = quantity_of(&resources["limits"]["memory"]) {
        host["Memory"] = json!(memory as i64);
    }
    if let Some(cpu) = quantity_of(&resources["limits"]["cpu"]) {
        host["NanoCpus"] = json!((cpu * 1e9) as i64);
    }
    if let Some(cpu) = quantity_of(&resources["requests"]["cpu"]) {
        // The kubelet's shares: 1024 per CPU, at least 2.
        host["CpuShares"] = json!(((cpu * 1024.0) as i64).max(2));
    }
    let mut binds = vec![json!(format!("{}:/etc/hosts", ctx.hosts_file))];
    for (i, mount) in container["volumeMounts"].as_array().into_iter().flatten().enumerate() {
        let field = format!("spec.containers[{name}].volumeMounts[{i}]");
        let volume = mount["name"].as_str().ok_or(format!("{field}.name: Required value"))?;
        let path = mount["mountPath"].as_str().ok_or(format!("{field}.mountPath: Required value"))?;
        let source = ctx.volumes.get(volume).ok_or(format!("{field}.name: Not found: \"{volume}\""))?;
        let sub = mount["subPath"].as_str().filter(|s| !s.is_empty());
        let (base, volume_ro) = match source {
            Source::DockerVolume { name, mountpoint } => {
                if sub.is_none() {
                    // The volume's directory bind-mounted, as the kubelet mounts an emptyDir:
                    // a named volume would take the image's directory (mode, owner, files)
                    // on first use, which Kubernetes never does.
                    let ro = if mount["readOnly"].as_bool().unwrap_or(false) { ":ro" } else { "" };
                    let source = if mountpoint.is_empty() { name } else { mountpoint };
                    binds.push(json!(format!("{source}:{path}{ro}")));
                    continue;
                }
                (mountpoint.clone(), false)
            }
            Source::HostPath { path, read_only } => (path.clone(), *read_only),
        };
        let host_path = match sub {
            Some(sub) => {
                if sub.split('/').any(|part| part == "..") || sub.starts_with('/') {
                    return Err(format!(
                        "{field}.subPath: Invalid value: \"{sub}\": must be a relative path without '..'"
                    ));
                }
                let full = format!("{base}/{sub}");
                if std::fs::metadata(&full).is_err() {
                    std::fs::create_dir_all(&full).map_err(|e| format!("{field}.subPath: {full}: {e}"))?;
                }
                full
            }
            None => base,
        };
        let ro = if volume_ro || mount["readOnly"].as_bool().unwrap_or(false) { ":ro" } else { "" };
        binds.push(json!(format!("{host_path}:{path}{ro}")));
    }
    host["Binds"] = json!(binds);
    config["HostConfig"] = host;
    Ok(config)
}

/// The pause container: `sleep infinity` in `image`, holding the pod's network namespace.
pub(crate) fn pause_config(pod: &Value, image: &str, host_network: bool) -> Value {
    let mut config = json!({
        "Image": image,
        "Entrypoint": ["sleep"],
        "Cmd": ["infinity"],
        "Labels": labels(pod, "POD"),
        "HostConfig": {"NetworkMode": if host_network { "host" } else { "none" }},
    });
    if !host_network {
        if let Some(name) = pod["metadata"]["name"].as_str() {
            config["Hostname"] = json!(name.chars().take(63).collect::<String>());
        }
    }
    config
}

/// The pod's QoS class from its containers' requests and limits.
pub(crate) fn qos_class(pod: &Value) -> &'static str {
    let containers: Vec<&Value> = pod["spec"]["containers"].as_array().into_iter().flatten().collect();
    let any = containers.iter().any(|c| {
        let r = &c["resources"];
        r["requests"].as_object().is_some_and(|m| !m.is_empty())
            || r["limits"].as_object().is_some_and(|m| !m.is_empty())
    });
    if !any {
        return "BestEffort";
    }
    let guaranteed = containers.iter().all(|c| {
        let r = &c["resources"];
        ["cpu", "memory"].iter().all(|k| {
            let limit = quantity_of(&r["limits"][k]);
            limit.is_some() && (r["requests"][k].is_null() || quantity_of(&r["requests"][k]) == limit)
        })
    });
    if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(quantity("500m"), Some(0.5));
        assert_eq!(quantity("128Mi"), Some(128.0 * 1024.0 * 1024.0));
        assert_eq!(quantity("2"), Some(2.0));
        assert_eq!(quantity("1G"), Some(1e9));
        assert_eq!(quantity("x"), None);
    }

    #[test]
    fn expansion() {
        let env: BTreeMap<String, String> = [("A".to_string(), "1".to_string())].into();
        assert_eq!(expand("$(A)-$(B)-$$(A)-$", &env), "1-$(B)-$(A)-$");
    }

    #[test]
    fn command_and_args_map_to_entrypoint_and_cmd() {
        let pod = json!({"metadata": {"name": "p", "namespace": "d", "uid": "u"}, "spec": {}});
        let volumes = BTreeMap::new();
        let ctx = Context { pause_id: "P", hosts_file: "/h", volumes: &volumes, env: vec![("X".into(), "y".into())] };
        let c = container_config(&pod, &json!({"name": "c", "image": "i", "command": ["sh", "$(X)"]}), &ctx).unwrap();
        assert_eq!(c["Entrypoint"], json!(["sh", "y"]));
        assert_eq!(c["Cmd"], json!([]));
        let c = container_config(&pod, &json!({"name": "c", "image": "i", "args": ["a"]}), &ctx).unwrap();
        assert!(c["Entrypoint"].is_null());
        assert_eq!(c["Cmd"], json!(["a"]));
        assert_eq!(c["HostConfig"]["NetworkMode"], "container:P");
    }
}
