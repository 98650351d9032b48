//! `projected` volumes as the kubelet writes them: `serviceAccountToken` (a token the API
//! server authenticates as the pod's service account, see `auth.rs`/`rbac.rs`), `configMap`
//! and `secret` keys, and `downwardAPI` `fieldRef`s — what the ServiceAccount admission puts in
//! every pod as `kube-api-access-*` (token, ca.crt, namespace). Also the API server's service
//! variables every container gets. Knows nothing of Docker.

use std::path::Path;

use serde_json::Value;

use super::Kubelet;
use crate::resources::{CONFIGMAPS, SECRETS};

/// Write the files of projected volume `volume` of `pod` into `dir`.
pub(super) fn write(kubelet: &Kubelet, pod: &Value, volume: &Value, dir: &Path) -> Result<(), String> {
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    let name = volume["name"].as_str().unwrap_or_default();
    let mode = volume["projected"]["defaultMode"].as_u64().unwrap_or(0o644);
    let failed = |e: String| format!("MountVolume.SetUp failed for volume \"{name}\" : {e}");
    for source in volume["projected"]["sources"].as_array().into_iter().flatten() {
        if let Some(token) = source.get("serviceAccountToken") {
            let account = pod["spec"]["serviceAccountName"].as_str().unwrap_or("default");
            let minted = kubelet.settings.tokens.mint_service_account(ns, account);
            let path = token["path"].as_str().unwrap_or("token");
            put(dir, path, minted.as_bytes(), mode).map_err(|e| failed(e.to_string()))?;
        } else if let Some(spec) = source.get("configMap").or_else(|| source.get("secret")) {
            let secret = source.get("secret").is_some();
            let object_name = spec["name"].as_str().unwrap_or_default();
            let resource = if secret { SECRETS } else { CONFIGMAPS };
            let Some(object) = kubelet.store.get(resource, ns, object_name) else {
                if spec["optional"].as_bool().unwrap_or(false) {
                    continue;
                }
                let kind = if secret { "secret" } else { "configmap" };
                return Err(failed(format!("{kind} \"{object_name}\" not found")));
            };
            let mut spec = spec.clone();
            spec["defaultMode"] = Value::from(mode);
            super::pod::write_files(dir, &object, &spec, secret).map_err(|e| failed(e.to_string()))?;
        } else if let Some(downward) = source.get("downwardAPI") {
            for item in downward["items"].as_array().into_iter().flatten() {
                let mut current = pod;
                for part in item["fieldRef"]["fieldPath"].as_str().unwrap_or_default().split('.') {
                    current = &current[part];
                }
                let text = current.as_str().unwrap_or_default();
                put(dir, item["path"].as_str().unwrap_or_default(), text.as_bytes(), mode)
                    .map_err(|e| failed(e.to_string()))?;
            }
        }
    }
    Ok(())
}

fn put(dir: &Path, path: &str, bytes: &[u8], mode: u64) -> std::io::Result<()> {
    if path.is_empty() || path.split('/').any(|p| p == "..") {
        return Ok(());
    }
    let file = dir.join(path);
    if let Some(parent) = file.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&file, bytes)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode as u32))
}

/// The variables of the `kubernetes` service in `default` every container gets (the API
/// server; with the flat pod network its node address).
pub(super) fn service_env(kubelet: &Kubelet) -> Vec<(String, String)> {
    let api = kubelet.settings.api;
    let (host, port) = (api.ip().to_string(), api.port().to_string());
    vec![
        ("KUBERNETES_SERVICE_HOST".into(), host.clone()),
        ("KUBERNETES_SERVICE_PORT".into(), port.clone()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".into(), port.clone()),
        ("KUBERNETES_PORT".into(), format!("tcp://{host}:{port}")),
    ]
}
