//! What the apiserver does to objects before it stores them: validation (422 Invalid with
//! the field paths kubectl prints) and defaulting, for pods (containers, restart policy,
//! image pull policy by tag, grace period, service account, tolerations…), secrets
//! (`stringData`, base64 `data`, `type`), namespaces (phase, finalizer, name label). Pure
//! functions over JSON.

use base64::Engine;
use serde_json::{json, Value};

use crate::resources::{Resource, NAMESPACES, PODS, SECRETS};
use crate::status::ApiError;

fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(is_dns_label)
}

const LABEL_MESSAGE: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

/// The default pull policy of an image: `Always` for `:latest` or no tag, else `IfNotPresent`.
pub(crate) fn default_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.rsplit_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

fn validate_containers(
    spec: &Value,
    key: &str,
    volumes: &[&str],
    causes: &mut Vec<(String, String)>,
    names: &mut Vec<String>,
) {
    for (i, c) in spec[key].as_array().into_iter().flatten().enumerate() {
        let field = format!("spec.{key}[{i}]");
        match c["name"].as_str() {
            None | Some("") => causes.push((format!("{field}.name"), "Required value".into())),
            Some(name) if !is_dns_label(name) => {
                causes.push((format!("{field}.name"), format!("Invalid value: \"{name}\": {LABEL_MESSAGE}")))
            }
            Some(name) if names.iter().any(|n| n == name) => {
                causes.push((format!("{field}.name"), format!("Duplicate value: \"{name}\"")))
            }
            Some(name) => names.push(name.to_string()),
        }
        if c["image"].as_str().is_none_or(|i| i.trim().is_empty()) {
            causes.push((format!("{field}.image"), "Required value".into()));
        }
        if let Some(policy) = c["imagePullPolicy"].as_str() {
            if !["Always", "IfNotPresent", "Never"].contains(&policy) {
                causes.push((
                    format!("{field}.imagePullPolicy"),
                    format!(
                        "Unsupported value: \"{policy}\": supported values: \"Always\", \"IfNotPresent\", \"Never\""
                    ),
                ));
            }
        }
        for (j, mount) in c["volumeMounts"].as_array().into_iter().flatten().enumerate() {
            let name = mount["name"].as_str().unwrap_or("");
            if name.is_empty() {
                causes.push((format!("{field}.volumeMounts[{j}].name"), "Required value".into()));
            } else if !volumes.contains(&name) {
                causes.push((format!("{field}.volumeMounts[{j}].name"), format!("Not found: \"{name}\"")));
            }
            if mount["mountPath"].as_str().is_none_or(str::is_empty) {
                causes.push((format!("{field}.volumeMounts[{j}].mountPath"), "Required value".into()));
            }
        }
    }
}

/// Validate and default a pod to be created.
fn prepare_pod(pod: &mut Value) -> Result<(), ApiError> {
    let name = pod["metadata"]["name"].as_str().or(pod["metadata"]["generateName"].as_str()).unwrap_or("").to_string();
    let spec = &pod["spec"];
    let mut causes = Vec::new();
    let volumes: Vec<&str> =
        spec["volumes"].as_array().into_iter().flatten().filter_map(|v| v["name"].as_str()).collect();
    for (i, v) in spec["volumes"].as_array().into_iter().flatten().enumerate() {
        let sources = v.as_object().map(|m| m.keys().filter(|k| *k != "name").count()).unwrap_or(0);
        if sources == 0 {
            causes.push((format!("spec.volumes[{i}]"), "Required value: must specify a volume type".into()));
        }
        if volumes.iter().filter(|n| Some(**n) == v["name"].as_str()).count() > 1 {
            causes.push((
                format!("spec.volumes[{i}].name"),
                format!("Duplicate value: \"{}\"", v["name"].as_str().unwrap_or("")),
            ));
        }
    }
    if spec["containers"].as_array().is_none_or(|a| a.is_empty()) {
        causes.push(("spec.containers".into(), "Required value".into()));
    }
    let mut names = Vec::new();
    validate_containers(spec, "initContainers", &volumes, &mut causes, &mut names);
    validate_containers(spec, "containers", &volumes, &mut causes, &mut names);
    if let Some(policy) = spec["restartPolicy"].as_str() {
        if !["Always", "OnFailure", "Never"].contains(&policy) {
            causes.push((
                "spec.restartPolicy".into(),
                format!("Unsupported value: \"{policy}\": supported values: \"Always\", \"OnFailure\", \"Never\""),
            ));
        }
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid("Pod", &name, &causes));
    }
    let spec = &mut pod["spec"];
    let defaults = [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("dnsPolicy", json!("ClusterFirst")),
        ("securityContext", json!({})),
        ("schedulerName", json!("default-scheduler")),
        ("enableServiceLinks", json!(true)),
        ("preemptionPolicy", json!("PreemptLowerPriority")),
        ("priority", json!(0)),
        (
            "tolerations",
            json!([
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            ]),
        ),
    ];
    for (key, value) in defaults {
        if spec[key].is_null() {
            spec[key] = value;
        }
    }
    let account =
        spec["serviceAccountName"].as_str().or(spec["serviceAccount"].as_str()).unwrap_or("default").to_string();
    spec["serviceAccountName"] = json!(account);
    spec["serviceAccount"] = json!(account);
    mount_service_account_token(spec);
    for key in ["initContainers", "containers"] {
        for c in spec[key].as_array_mut().into_iter().flatten() {
            if c["imagePullPolicy"].is_null() {
                c["imagePullPolicy"] = json!(default_pull_policy(c["image"].as_str().unwrap_or("")));
            }
            for (k, v) in [
                ("terminationMessagePath", json!("/dev/termination-log")),
                ("terminationMessagePolicy", json!("File")),
                ("resources", json!({})),
            ] {
                if c[k].is_null() {
                    c[k] = v;
                }
            }
        }
    }
    pod["status"] = json!({"phase": "Pending", "qosClass": crate::kubelet::spec::qos_class(pod)});
    Ok(())
}

/// Where the ServiceAccount admission mounts the API access volume.
const SERVICE_ACCOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The ServiceAccount admission: unless `automountServiceAccountToken` is false or a container
/// already mounts something there, a `kube-api-access-xxxxx` projected volume (token, ca.crt,
/// namespace) mounted read-only in every container at [`SERVICE_ACCOUNT_PATH`].
fn mount_service_account_token(spec: &mut Value) {
    if spec["automountServiceAccountToken"] == json!(false) {
        return;
    }
    let name = format!("kube-api-access-{}", &crate::store::random_suffix()[..5]);
    let volume = json!({"name": name, "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
    ]}});
    let mut used = false;
    for key in ["initContainers", "containers"] {
        for c in spec[key].as_array_mut().into_iter().flatten() {
            let mounted =
                c["volumeMounts"].as_array().into_iter().flatten().any(|m| m["mountPath"] == SERVICE_ACCOUNT_PATH);
            if mounted {
                continue;
            }
            if !c["volumeMounts"].is_array() {
                c["volumeMounts"] = json!([]);
            }
            if let Some(mounts) = c["volumeMounts"].as_array_mut() {
                mounts.push(json!({"name": name, "readOnly": true, "mountPath": SERVICE_ACCOUNT_PATH}));
                used = true;
            }
        }
    }
    if used {
        if !spec["volumes"].is_array() {
            spec["volumes"] = json!([]);
        }
        if let Some(volumes) = spec["volumes"].as_array_mut() {
            volumes.push(volume);
        }
    }
}

/// Validate and default an object of `resource` before it is created.
pub(crate) fn prepare(resource: Resource, object: &mut Value) -> Result<(), ApiError> {
    let meta = &object["metadata"];
    let name = meta["name"].as_str().unwrap_or("");
    let check = if resource == PODS || resource == NAMESPACES { is_dns_label(name) } else { is_dns_subdomain(name) };
    if !name.is_empty() && !check {
        let message = format!("Invalid value: \"{name}\": {LABEL_MESSAGE}");
        return Err(ApiError::invalid(resource.kind, name, &[("metadata.name".into(), message)]));
    }
    match resource {
        PODS => prepare_pod(object),
        crate::resources::DEPLOYMENTS => crate::controller::prepare_deployment(object),
        SECRETS => prepare_secret(object),
        NAMESPACES => {
            object["spec"] = json!({"finalizers": ["kubernetes"]});
            object["status"] = json!({"phase": "Active"});
            let name = object["metadata"]["name"].clone();
            if !object["metadata"]["labels"].is_object() {
                object["metadata"]["labels"] = json!({});
            }
            object["metadata"]["labels"]["kubernetes.io/metadata.name"] = name;
            Ok(())
        }
        _ => Ok(()),
    }
}

/// `stringData` into `data`; `data` must be base64; `type` defaults to Opaque.
pub(super) fn prepare_secret(secret: &mut Value) -> Result<(), ApiError> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let name = secret["metadata"]["name"].as_str().unwrap_or("").to_string();
    if let Some(strings) = secret.get("stringData").and_then(Value::as_object).cloned() {
        if !secret["data"].is_object() {
            secret["data"] = json!({});
        }
        for (k, v) in strings {
            secret["data"][&k] = json!(b64.encode(v.as_str().unwrap_or_default()));
        }
        if let Some(map) = secret.as_object_mut() {
            map.remove("stringData");
        }
    }
    for (k, v) in secret["data"].as_object().into_iter().flatten() {
        if v.as_str().is_none_or(|s| b64.decode(s).is_err()) {
            return Err(ApiError::invalid(
                "Secret",
                &name,
                &[(format!("data[{k}]"), "Invalid value: illegal base64 data".into())],
            ));
        }
    }
    if secret["type"].is_null() {
        secret["type"] = json!("Opaque");
    }
    if secret["type"] == "kubernetes.io/dockerconfigjson" && secret["data"][".dockerconfigjson"].is_null() {
        return Err(ApiError::invalid("Secret", &name, &[("data[.dockerconfigjson]".into(), "Required value".into())]));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_policy_defaults_by_tag() {
        assert_eq!(default_pull_policy("busybox"), "Always");
        assert_eq!(default_pull_policy("busybox:latest"), "Always");
        assert_eq!(default_pull_policy("127.0.0.1:5000/a:1"), "IfNotPresent");
        assert_eq!(default_pull_policy("127.0.0.1:5000/a"), "Always");
    }

    #[test]
    fn invalid_pods_name_their_fields() {
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}});
        let error = prepare(PODS, &mut pod).unwrap_err();
        assert_eq!(error.code, 422);
        assert_eq!(error.message, "Pod \"p\" is invalid: spec.containers[0].image: Required value");
    }
}
