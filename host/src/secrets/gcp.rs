//! `gcp_secret_manager`: gitlab-runner's Google Cloud Secret Manager resolver. Workload
//! identity federation: the job's JWT is exchanged at Google's Security Token Service
//! (`POST https://sts.googleapis.com/v1/token`, RFC 8693 token exchange, audience
//! `//iam.googleapis.com/projects/<number>/locations/global/workloadIdentityPools/<pool>/providers/<provider>`,
//! subject token type `id_token`) for an access token, then the secret version is read
//! (`GET https://secretmanager.googleapis.com/v1/projects/<number>/secrets/<name>/versions/<version>:access`),
//! its base64 payload decoded and its CRC32C checked.
//!
//! The endpoints are Google's unless the runner's environment names others
//! (`RUNWAY_GCP_STS_ENDPOINT`, `RUNWAY_GCP_SECRET_MANAGER_ENDPOINT`: private endpoints, tests).
//! Owns these two requests; must not write the job log or keep a value.

use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};

use crate::payload::secrets::{GcpSecretManagerSecret, Secret};
use crate::secrets::vault::error_chain;
use crate::secrets::{Resolved, Resolver, SecretError};

const TIMEOUT: Duration = Duration::from_secs(30);
const STS: &str = "https://sts.googleapis.com";
const SECRET_MANAGER: &str = "https://secretmanager.googleapis.com";

/// The resolver (endpoints are read from the runner's environment when a secret is read).
pub struct GcpSecretManager;

/// Where Google's STS and Secret Manager are reached.
#[derive(Debug, Clone)]
pub struct GcpEndpoints {
    /// STS's base URL.
    pub sts: String,
    /// Secret Manager's base URL.
    pub secret_manager: String,
}

impl GcpEndpoints {
    /// Google's endpoints, or the overrides `env` holds.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> GcpEndpoints {
        let var = |key: &str, default: &str| {
            env(key)
                .filter(|v| !v.trim().is_empty())
                .unwrap_or_else(|| default.to_string())
                .trim_end_matches('/')
                .to_string()
        };
        GcpEndpoints {
            sts: var("RUNWAY_GCP_STS_ENDPOINT", STS),
            secret_manager: var("RUNWAY_GCP_SECRET_MANAGER_ENDPOINT", SECRET_MANAGER),
        }
    }
}

impl Resolver for GcpSecretManager {
    fn name(&self) -> &'static str {
        "gcp_secret_manager"
    }

    fn supports(&self, secret: &Secret) -> bool {
        secret.gcp_secret_manager.is_some()
    }

    fn resolve<'a>(&'a self, secret: &'a Secret, http: &'a reqwest::Client) -> Resolved<'a> {
        Box::pin(async move {
            let endpoints = GcpEndpoints::from_env(&|key| std::env::var(key).ok());
            match &secret.gcp_secret_manager {
                Some(gcp) => read(gcp, http, &endpoints).await,
                None => Err(SecretError::Invalid("the secret has no gcp_secret_manager".into())),
            }
        })
    }
}

/// The STS audience of the secret's workload identity provider.
pub fn audience(secret: &GcpSecretManagerSecret) -> String {
    format!(
        "//iam.googleapis.com/projects/{}/locations/global/workloadIdentityPools/{}/providers/{}",
        secret.server.project_number,
        secret.server.workload_identity_federation_pool_id,
        secret.server.workload_identity_federation_provider_id
    )
}

/// The secret version's resource name: `name` as given when it is already
/// `projects/*/secrets/*`, else under the server's project.
fn version_name(secret: &GcpSecretManagerSecret) -> String {
    let version = if secret.version.is_empty() { "latest" } else { &secret.version };
    let parts: Vec<&str> = secret.name.split('/').collect();
    if parts.len() == 4 && parts[0] == "projects" && parts[2] == "secrets" && parts.iter().all(|p| !p.is_empty()) {
        return format!("{}/versions/{version}", secret.name);
    }
    format!("projects/{}/secrets/{}/versions/{version}", secret.server.project_number, secret.name)
}

fn unreachable(server: &str, e: reqwest::Error) -> SecretError {
    SecretError::Unreachable { server: server.to_string(), reason: error_chain(&e.without_url()) }
}

/// Read `secret` through `endpoints`.
pub async fn read(
    secret: &GcpSecretManagerSecret,
    http: &reqwest::Client,
    endpoints: &GcpEndpoints,
) -> Result<String, SecretError> {
    let token = exchange(http, &endpoints.sts, secret).await?;
    access(http, &endpoints.secret_manager, secret, &token).await
}

/// The STS token exchange: the job's JWT for a federated access token.
async fn exchange(
    http: &reqwest::Client,
    server: &str,
    secret: &GcpSecretManagerSecret,
) -> Result<String, SecretError> {
    let body = json!({
        "audience": audience(secret),
        "grantType": "urn:ietf:params:oauth:grant-type:token-exchange",
        "requestedTokenType": "urn:ietf:params:oauth:token-type:access_token",
        "scope": "https://www.googleapis.com/auth/cloud-platform",
        "subjectToken": secret.server.jwt,
        "subjectTokenType": "urn:ietf:params:oauth:token-type:id_token",
    });
    let response = http
        .post(format!("{server}/v1/token"))
        .json(&body)
        .timeout(TIMEOUT)
        .send()
        .await
        .map_err(|e| unreachable(server, e))?;
    let status = response.status().as_u16();
    let answer: Value = response.json().await.unwrap_or(Value::Null);
    if !(200..300).contains(&status) {
        let reason = match (answer["error"].as_str(), answer["error_description"].as_str()) {
            (Some(error), Some(description)) => format!("failed to exchange sts token: {error}: {description}"),
            (Some(error), None) => format!("failed to exchange sts token: {error}"),
            _ => "failed to exchange sts token".to_string(),
        };
        return Err(SecretError::Refused { server: server.to_string(), status, reason });
    }
    match answer["access_token"].as_str() {
        Some(token) if !token.is_empty() => Ok(token.to_string()),
        _ => Err(SecretError::Unreachable {
            server: server.to_string(),
            reason: "failed to exchange sts token: the answer has no access_token".into(),
        }),
    }
}

/// `AccessSecretVersion` over REST.
async fn access(
    http: &reqwest::Client,
    server: &str,
    secret: &GcpSecretManagerSecret,
    token: &str,
) -> Result<String, SecretError> {
    let name = version_name(secret);
    let response = http
        .get(format!("{server}/v1/{name}:access"))
        .bearer_auth(token)
        .timeout(TIMEOUT)
        .send()
        .await
        .map_err(|e| unreachable(server, e))?;
    let status = response.status().as_u16();
    let answer: Value = response.json().await.unwrap_or(Value::Null);
    if !(200..300).contains(&status) {
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        let code = answer["error"]["status"].as_str().unwrap_or_default();
        if status == 404 {
            return Err(SecretError::NotFound { server: server.to_string(), what: format!("{name} ({message})") });
        }
        return Err(SecretError::Refused {
            server: server.to_string(),
            status,
            reason: format!("failed to get secret {name}: {code}: {message}"),
        });
    }
    let Some(data) = answer["payload"]["data"].as_str() else {
        return Err(SecretError::NotFound { server: server.to_string(), what: format!("{name} (no payload)") });
    };
    let bytes = base64::engine::general_purpose::STANDARD.decode(data).map_err(|_| SecretError::Unreachable {
        server: server.to_string(),
        reason: format!("secret {name}: the payload is not base64"),
    })?;
    // `dataCrc32c` is an int64, sent as a string in JSON.
    let sent = match &answer["payload"]["dataCrc32c"] {
        Value::String(s) => s.parse::<u64>().ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    };
    if sent.is_some_and(|sent| sent != u64::from(crc32c(&bytes))) {
        return Err(SecretError::Unreachable {
            server: server.to_string(),
            reason: format!("secret {name}: data corruption detected"),
        });
    }
    String::from_utf8(bytes).map_err(|_| SecretError::Invalid(format!("secret {name} from {server} is not UTF-8 text")))
}

/// CRC-32C (Castagnoli), as Secret Manager checksums payloads.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for byte in data {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::secrets::GcpSecretManagerServer;

    fn secret(name: &str, version: &str) -> GcpSecretManagerSecret {
        GcpSecretManagerSecret {
            name: name.into(),
            version: version.into(),
            server: GcpSecretManagerServer {
                project_number: "1234".into(),
                workload_identity_federation_pool_id: "pool".into(),
                workload_identity_federation_provider_id: "prov".into(),
                jwt: "jwt".into(),
            },
        }
    }

    #[test]
    fn names_and_audience_as_gitlab_runner() {
        assert_eq!(version_name(&secret("db", "2")), "projects/1234/secrets/db/versions/2");
        assert_eq!(version_name(&secret("db", "")), "projects/1234/secrets/db/versions/latest");
        assert_eq!(version_name(&secret("projects/9/secrets/x", "latest")), "projects/9/secrets/x/versions/latest");
        assert_eq!(
            audience(&secret("db", "1")),
            "//iam.googleapis.com/projects/1234/locations/global/workloadIdentityPools/pool/providers/prov"
        );
    }

    #[test]
    fn crc32c_check_value() {
        // The standard check value of CRC-32C.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn endpoints_default_to_google() {
        let e = GcpEndpoints::from_env(&|_| None);
        assert_eq!((e.sts.as_str(), e.secret_manager.as_str()), (STS, SECRET_MANAGER));
        let e = GcpEndpoints::from_env(&|k| (k == "RUNWAY_GCP_STS_ENDPOINT").then(|| "http://127.0.0.1:1/".into()));
        assert_eq!(e.sts, "http://127.0.0.1:1");
    }
}
