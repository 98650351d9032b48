//! `aws_secrets_manager`: gitlab-runner's AWS Secrets Manager resolver. The job's JWT is
//! exchanged for temporary credentials with STS `AssumeRoleWithWebIdentity` (role ARN and
//! session name: the secret's over the server's), then `GetSecretValue` (SigV4-signed, with
//! `VersionId`/`VersionStage` when given) reads the secret; `field` picks one key of a JSON
//! secret. Without a role ARN (and without a JWT) the runner's own credentials from its
//! environment sign the read, as gitlab-runner's default credential chain would.
//!
//! Endpoints are AWS's regional ones unless the runner's environment overrides them the way
//! the AWS SDKs read it: `AWS_ENDPOINT_URL_STS`, `AWS_ENDPOINT_URL_SECRETS_MANAGER`, else
//! `AWS_ENDPOINT_URL`. Owns these two requests; must not write the job log or keep a value.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use crate::cache::sts::xml_text;
use crate::cache::{aws_env_credentials, sign_request, AwsCredentials, SignedRequest};
use crate::payload::secrets::{AwsSecret, Secret};
use crate::secrets::vault::error_chain;
use crate::secrets::{Resolved, Resolver, SecretError};

/// gitlab-runner's context timeout of one resolution.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The resolver (stateless: endpoints and credentials are read from the runner's environment
/// when a secret is read).
pub struct AwsSecretsManager;

/// Where STS and Secrets Manager are reached, and the runner's own fallbacks.
#[derive(Debug, Clone, Default)]
pub struct AwsEndpoints {
    /// STS's base URL; `None`: `https://sts.<region>.amazonaws.com`.
    pub sts: Option<String>,
    /// Secrets Manager's base URL; `None`: `https://secretsmanager.<region>.amazonaws.com`.
    pub secrets_manager: Option<String>,
    /// `AWS_REGION` / `AWS_DEFAULT_REGION`: the region when the secret names none.
    pub region: Option<String>,
    /// The runner's own credentials (`AWS_ACCESS_KEY_ID`, ...), used without a role ARN.
    pub credentials: Option<AwsCredentials>,
}

impl AwsEndpoints {
    /// The overrides and fallbacks `env` holds (the runner's environment in production).
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> AwsEndpoints {
        let var = |key: &str| env(key).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let any = var("AWS_ENDPOINT_URL");
        AwsEndpoints {
            sts: var("AWS_ENDPOINT_URL_STS").or_else(|| any.clone()),
            secrets_manager: var("AWS_ENDPOINT_URL_SECRETS_MANAGER").or(any),
            region: var("AWS_REGION").or_else(|| var("AWS_DEFAULT_REGION")),
            credentials: aws_env_credentials(env),
        }
    }

    fn url(over: &Option<String>, service: &str, region: &str) -> String {
        match over {
            Some(url) => url.trim_end_matches('/').to_string(),
            None => format!("https://{service}.{region}.amazonaws.com"),
        }
    }
}

impl Resolver for AwsSecretsManager {
    fn name(&self) -> &'static str {
        "aws_secrets_manager"
    }

    fn supports(&self, secret: &Secret) -> bool {
        secret.aws_secrets_manager.is_some()
    }

    fn resolve<'a>(&'a self, secret: &'a Secret, http: &'a reqwest::Client) -> Resolved<'a> {
        Box::pin(async move {
            let endpoints = AwsEndpoints::from_env(&|key| std::env::var(key).ok());
            match &secret.aws_secrets_manager {
                Some(aws) => read(aws, http, &endpoints).await,
                None => Err(SecretError::Invalid("the secret has no aws_secrets_manager".into())),
            }
        })
    }
}

fn pick<'a>(own: &'a str, server: &'a str) -> &'a str {
    if own.is_empty() {
        server
    } else {
        own
    }
}

/// Read `secret` through `endpoints`.
pub async fn read(secret: &AwsSecret, http: &reqwest::Client, endpoints: &AwsEndpoints) -> Result<String, SecretError> {
    let region = match pick(&secret.region, &secret.server.region) {
        "" => endpoints.region.clone().ok_or_else(|| {
            SecretError::Invalid(format!(
                "aws_secrets_manager secret {:?}: no region (set region: or AWS_REGION on the runner)",
                secret.secret_id
            ))
        })?,
        region => region.to_string(),
    };
    let role_arn = pick(&secret.role_arn, &secret.server.role_arn);
    let session_name = pick(&secret.role_session_name, &secret.server.role_session_name);
    if role_arn.is_empty() && !secret.server.jwt.is_empty() {
        return Err(SecretError::Invalid("Role ARN is required when using JWT for AWS authentication".into()));
    }
    let credentials = if role_arn.is_empty() {
        endpoints.credentials.clone().ok_or_else(|| {
            SecretError::Invalid(
                "aws_secrets_manager: no role_arn and no AWS credentials in the runner's environment".into(),
            )
        })?
    } else {
        let sts = AwsEndpoints::url(&endpoints.sts, "sts", &region);
        assume_role(http, &sts, role_arn, session_name, &secret.server.jwt).await?
    };
    let server = AwsEndpoints::url(&endpoints.secrets_manager, "secretsmanager", &region);
    let data = get_secret_value(http, &server, &region, &credentials, secret, Utc::now()).await?;
    if secret.field.is_empty() {
        return Ok(data);
    }
    flat_json_field(&data, &secret.field, &secret.secret_id, &server)
}

fn unreachable(server: &str, e: reqwest::Error) -> SecretError {
    SecretError::Unreachable { server: server.to_string(), reason: error_chain(&e.without_url()) }
}

/// STS `AssumeRoleWithWebIdentity` (an unsigned call: the JWT is the proof).
async fn assume_role(
    http: &reqwest::Client,
    server: &str,
    role_arn: &str,
    session_name: &str,
    jwt: &str,
) -> Result<AwsCredentials, SecretError> {
    let form = [
        ("Action", "AssumeRoleWithWebIdentity"),
        ("Version", "2011-06-15"),
        ("RoleArn", role_arn),
        ("RoleSessionName", session_name),
        ("WebIdentityToken", jwt),
    ];
    let response = http
        .post(format!("{server}/"))
        .form(&form)
        .timeout(TIMEOUT)
        .send()
        .await
        .map_err(|e| unreachable(server, e))?;
    let status = response.status().as_u16();
    let body = response.text().await.map_err(|e| unreachable(server, e))?;
    if !(200..300).contains(&status) {
        let reason = match (xml_text(&body, "Code"), xml_text(&body, "Message")) {
            (Some(code), Some(message)) => format!("AssumeRoleWithWebIdentity {role_arn}: {code}: {message}"),
            (Some(code), None) => format!("AssumeRoleWithWebIdentity {role_arn}: {code}"),
            _ => format!("AssumeRoleWithWebIdentity {role_arn} failed"),
        };
        return Err(SecretError::Refused { server: server.to_string(), status, reason });
    }
    let field = |tag: &str| {
        xml_text(&body, tag).ok_or_else(|| SecretError::Unreachable {
            server: server.to_string(),
            reason: format!("AssumeRoleWithWebIdentity answered without {tag}"),
        })
    };
    Ok(AwsCredentials {
        access_key_id: field("AccessKeyId")?,
        secret_access_key: field("SecretAccessKey")?,
        session_token: Some(field("SessionToken")?),
        expires: xml_text(&body, "Expiration").and_then(|t| DateTime::parse_from_rfc3339(&t).ok()).map(|t| t.into()),
    })
}

/// Secrets Manager `GetSecretValue`: the secret's string (or its binary, base64).
async fn get_secret_value(
    http: &reqwest::Client,
    server: &str,
    region: &str,
    credentials: &AwsCredentials,
    secret: &AwsSecret,
    now: DateTime<Utc>,
) -> Result<String, SecretError> {
    let mut input = json!({ "SecretId": secret.secret_id });
    if !secret.version_id.is_empty() {
        input["VersionId"] = json!(secret.version_id);
    }
    if !secret.version_stage.is_empty() {
        input["VersionStage"] = json!(secret.version_stage);
    }
    let body = input.to_string().into_bytes();
    let url = url::Url::parse(server)
        .map_err(|e| SecretError::Invalid(format!("Secrets Manager endpoint {server:?} is not a URL: {e}")))?;
    let host = match (url.host_str(), url.port()) {
        (Some(host), Some(port)) => format!("{host}:{port}"),
        (Some(host), None) => host.to_string(),
        (None, _) => return Err(SecretError::Invalid(format!("Secrets Manager endpoint {server:?} has no host"))),
    };
    let path = if url.path().is_empty() { "/" } else { url.path() };
    let headers = vec![
        ("content-type".to_string(), "application/x-amz-json-1.1".to_string()),
        ("x-amz-target".to_string(), "secretsmanager.GetSecretValue".to_string()),
    ];
    let signed = sign_request(
        &SignedRequest {
            method: "POST",
            scheme: url.scheme(),
            host: &host,
            path,
            headers: &headers,
            body: &body,
            region,
            service: "secretsmanager",
        },
        credentials,
        now,
    );
    let mut request = http.post(url.as_str()).body(body).timeout(TIMEOUT);
    for (name, value) in headers.iter().chain(&signed) {
        request = request.header(name, value);
    }
    let response = request.send().await.map_err(|e| unreachable(server, e))?;
    let status = response.status().as_u16();
    let text = response.text().await.map_err(|e| unreachable(server, e))?;
    let answer: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    if !(200..300).contains(&status) {
        let kind = answer["__type"].as_str().unwrap_or_default();
        let kind = kind.rsplit('#').next().unwrap_or(kind);
        let message = answer["message"].as_str().or_else(|| answer["Message"].as_str()).unwrap_or_default();
        if kind == "ResourceNotFoundException" {
            let mut what = format!("secret {:?}", secret.secret_id);
            for (name, value) in [("version_id", &secret.version_id), ("version_stage", &secret.version_stage)] {
                if !value.is_empty() {
                    what.push_str(&format!(" {name} {value:?}"));
                }
            }
            return Err(SecretError::NotFound { server: server.to_string(), what: format!("{what} ({message})") });
        }
        let reason = match (kind, message) {
            ("", "") => format!("GetSecretValue {:?} failed", secret.secret_id),
            (kind, message) => format!("GetSecretValue {:?}: {kind}: {message}", secret.secret_id),
        };
        return Err(SecretError::Refused { server: server.to_string(), status, reason });
    }
    if let Some(value) = answer["SecretString"].as_str() {
        return Ok(value.to_string());
    }
    if let Some(value) = answer["SecretBinary"].as_str() {
        return Ok(value.to_string());
    }
    Err(SecretError::Unreachable {
        server: server.to_string(),
        reason: format!("secret {:?} contains no value", secret.secret_id),
    })
}

/// `field` of a flat JSON object: a string, number or boolean, as text (gitlab-runner's rule).
fn flat_json_field(data: &str, field: &str, secret_id: &str, server: &str) -> Result<String, SecretError> {
    let object: serde_json::Map<String, Value> = serde_json::from_str(data).map_err(|_| {
        SecretError::Invalid(format!(
            "failed to parse JSON for secret '{secret_id}' from {server} to read key '{field}'"
        ))
    })?;
    match object.get(field) {
        None => Err(SecretError::Invalid(format!(
            "key '{field}' not found in AWS Secrets Manager response for secret '{secret_id}' from {server}"
        ))),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(v @ (Value::Number(_) | Value::Bool(_))) => Ok(v.to_string()),
        Some(_) => Err(SecretError::Invalid(format!(
            "key '{field}' in aws secrets manager response for secret '{secret_id}' is not a string, number or boolean"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_follow_the_sdk_variables() {
        let env = |k: &str| match k {
            "AWS_ENDPOINT_URL" => Some("http://127.0.0.1:9/".to_string()),
            "AWS_ENDPOINT_URL_STS" => Some("http://127.0.0.2:9".to_string()),
            "AWS_DEFAULT_REGION" => Some("eu-west-3".to_string()),
            _ => None,
        };
        let e = AwsEndpoints::from_env(&env);
        assert_eq!(AwsEndpoints::url(&e.sts, "sts", "x"), "http://127.0.0.2:9");
        assert_eq!(AwsEndpoints::url(&e.secrets_manager, "secretsmanager", "x"), "http://127.0.0.1:9");
        assert_eq!(e.region.as_deref(), Some("eu-west-3"));
        let none = AwsEndpoints::from_env(&|_| None);
        assert_eq!(AwsEndpoints::url(&none.sts, "sts", "us-east-2"), "https://sts.us-east-2.amazonaws.com");
    }

    #[test]
    fn fields_of_flat_json() {
        let data = r#"{"user":"u","port":5432,"tls":true,"nested":{"a":1}}"#;
        assert_eq!(flat_json_field(data, "user", "db", "s").unwrap(), "u");
        assert_eq!(flat_json_field(data, "port", "db", "s").unwrap(), "5432");
        assert_eq!(flat_json_field(data, "tls", "db", "s").unwrap(), "true");
        assert!(flat_json_field(data, "nested", "db", "s").is_err());
        let missing = flat_json_field(data, "password", "db", "s").unwrap_err().to_string();
        assert!(missing.contains("key 'password' not found") && !missing.contains("5432"), "{missing}");
        assert!(flat_json_field("not json", "a", "db", "s").unwrap_err().to_string().contains("failed to parse"));
    }

    #[test]
    fn sts_answers_are_read() {
        let body = "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult><Credentials>\
                    <AccessKeyId>AK</AccessKeyId><SecretAccessKey>S&amp;K</SecretAccessKey></Credentials>";
        assert_eq!(xml_text(body, "AccessKeyId").as_deref(), Some("AK"));
        assert_eq!(xml_text(body, "SecretAccessKey").as_deref(), Some("S&K"));
        assert_eq!(xml_text(body, "SessionToken"), None);
    }
}
