//! AWS credentials for `AuthenticationType = "iam"`: the standard `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN` variables, else the EC2 instance profile through
//! the instance metadata service (IMDSv2: a session token, then the role's credentials),
//! at `AWS_EC2_METADATA_SERVICE_ENDPOINT` when set.
//!
//! Owns these requests only; the environment is passed in (so a test points it at a loopback
//! server). Must not sign anything.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::cache::sigv4::AwsCredentials;

/// The metadata service of EC2 instances.
pub const DEFAULT_METADATA_ENDPOINT: &str = "http://169.254.169.254";

/// How long one metadata request may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(5);

/// Credentials from `env` (`AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`, with
/// `AWS_SESSION_TOKEN` if set), `None` when either is absent.
pub(crate) fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Option<AwsCredentials> {
    let id = env("AWS_ACCESS_KEY_ID").filter(|v| !v.is_empty())?;
    let secret = env("AWS_SECRET_ACCESS_KEY").filter(|v| !v.is_empty())?;
    Some(AwsCredentials {
        access_key_id: id,
        secret_access_key: secret,
        session_token: env("AWS_SESSION_TOKEN").filter(|v| !v.is_empty()),
        expires: None,
    })
}

/// The metadata endpoint: `AWS_EC2_METADATA_SERVICE_ENDPOINT` from `env`, else the EC2 one.
pub(crate) fn metadata_endpoint(env: &dyn Fn(&str) -> Option<String>) -> String {
    env("AWS_EC2_METADATA_SERVICE_ENDPOINT")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| DEFAULT_METADATA_ENDPOINT.to_string())
        .trim_end_matches('/')
        .to_string()
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RoleCredentials {
    access_key_id: String,
    secret_access_key: String,
    token: Option<String>,
    expiration: Option<DateTime<Utc>>,
}

/// Why the instance profile's credentials could not be had from the metadata service.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct MetadataError(String);

/// The instance profile's credentials from the metadata service at `endpoint` (IMDSv2).
pub(crate) async fn from_instance_metadata(endpoint: &str) -> Result<AwsCredentials, MetadataError> {
    let client = reqwest::Client::builder()
        .timeout(METADATA_TIMEOUT)
        .no_proxy()
        .build()
        .map_err(|e| MetadataError(format!("HTTP client: {e}")))?;
    let fail = |what: &str, e: String| MetadataError(format!("instance metadata at {endpoint}: {what}: {e}"));
    let token = client
        .put(format!("{endpoint}/latest/api/token"))
        .header("X-aws-ec2-metadata-token-ttl-seconds", "21600")
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| fail("session token (IMDSv2)", e.to_string()))?
        .text()
        .await
        .map_err(|e| fail("session token (IMDSv2)", e.to_string()))?;
    let get = |path: String| {
        let client = &client;
        let token = token.trim().to_string();
        async move {
            client
                .get(format!("{endpoint}/latest/meta-data/iam/security-credentials/{path}"))
                .header("X-aws-ec2-metadata-token", token)
                .send()
                .await
                .and_then(reqwest::Response::error_for_status)?
                .text()
                .await
        }
    };
    let roles = get(String::new()).await.map_err(|e| fail("instance profile role", e.to_string()))?;
    let role = roles
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .ok_or_else(|| fail("instance profile role", "the instance has no IAM role".into()))?
        .to_string();
    let body = get(role.clone()).await.map_err(|e| fail(&format!("credentials of role {role}"), e.to_string()))?;
    let creds: RoleCredentials =
        serde_json::from_str(&body).map_err(|e| fail(&format!("credentials of role {role}"), e.to_string()))?;
    Ok(AwsCredentials {
        access_key_id: creds.access_key_id,
        secret_access_key: creds.secret_access_key,
        session_token: creds.token.filter(|t| !t.is_empty()),
        expires: creds.expiration,
    })
}
