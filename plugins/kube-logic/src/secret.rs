//! The Secret holding the job's registry credentials, as gitlab-runner creates one for the
//! kubelet's pulls: `type: kubernetes.io/dockerconfigjson`, `.dockerconfigjson` a Docker
//! `config.json` with `auths` keyed by registry (`username`, `password`, `auth` =
//! base64(`username:password`)), labelled like the job's pod so cleanup finds it. Builds JSON
//! only; never logs the credentials.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::{json, Map, Value};

/// Credentials for one registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryCredential {
    /// Registry address as the image references it (`registry.example.com:5000`, `docker.io`).
    pub registry: String,
    /// User name.
    pub username: String,
    /// Password or token.
    pub password: String,
}

/// The Secret's type.
pub const SECRET_TYPE: &str = "kubernetes.io/dockerconfigjson";
/// The key of the Docker config in the Secret's `data`.
pub const DOCKER_CONFIG_KEY: &str = ".dockerconfigjson";

/// The Docker `config.json` for the credentials (the first credential of a registry wins).
pub fn docker_config_json(credentials: &[RegistryCredential]) -> Value {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut auths = Map::new();
    for c in credentials {
        if auths.contains_key(&c.registry) {
            continue;
        }
        let auth = b64.encode(format!("{}:{}", c.username, c.password));
        auths.insert(c.registry.clone(), json!({ "username": c.username, "password": c.password, "auth": auth }));
    }
    json!({ "auths": auths })
}

/// The Secret object for `POST /api/v1/namespaces/{namespace}/secrets`; `None` without
/// credentials (then no Secret is created).
pub fn registry_secret(
    name: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    credentials: &[RegistryCredential],
) -> Option<Value> {
    if credentials.is_empty() {
        return None;
    }
    let config = docker_config_json(credentials).to_string();
    let data = base64::engine::general_purpose::STANDARD.encode(config);
    Some(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": { "name": name, "namespace": namespace, "labels": labels },
        "type": SECRET_TYPE,
        "data": { DOCKER_CONFIG_KEY: data },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cred(registry: &str, user: &str, password: &str) -> RegistryCredential {
        RegistryCredential { registry: registry.into(), username: user.into(), password: password.into() }
    }

    #[test]
    fn secret_carries_a_docker_config() {
        let labels: BTreeMap<String, String> = [("runway/job".to_string(), "7".to_string())].into();
        let secret = registry_secret(
            "runner-x-project-1-concurrent-0-abcdefgh",
            "ci",
            &labels,
            &[
                cred("registry.local:5000", "gitlab-ci-token", "s3cret"),
                cred("registry.local:5000", "other", "x"),
                cred("docker.io", "u", "p:w"),
            ],
        )
        .unwrap();
        assert_eq!(secret["type"], "kubernetes.io/dockerconfigjson");
        assert_eq!(secret["metadata"]["namespace"], "ci");
        assert_eq!(secret["metadata"]["labels"]["runway/job"], "7");
        let data = secret["data"][".dockerconfigjson"].as_str().unwrap();
        let decoded = base64::engine::general_purpose::STANDARD.decode(data).unwrap();
        let config: Value = serde_json::from_slice(&decoded).unwrap();
        assert_eq!(
            config,
            json!({"auths": {
                "registry.local:5000": {"username": "gitlab-ci-token", "password": "s3cret",
                                         "auth": "Z2l0bGFiLWNpLXRva2VuOnMzY3JldA=="},
                "docker.io": {"username": "u", "password": "p:w", "auth": "dTpwOnc="}
            }})
        );
    }

    #[test]
    fn no_credentials_no_secret() {
        assert_eq!(registry_secret("n", "ns", &BTreeMap::new(), &[]), None);
    }
}
