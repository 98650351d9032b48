//! STS `AssumeRole` for an S3 cache with `RoleARN`/`UploadRoleARN`, on the wire as
//! gitlab-runner's AWS SDK sends it (`cache/s3v2/s3.go`): a SigV4-signed query-API `POST` to
//! the STS endpoint of the bucket's region (or `AWS_ENDPOINT_URL_STS`, else `AWS_ENDPOINT_URL`,
//! as the AWS SDKs read them), with a random `gitlab-runner-cache-upload-<16 hex>` session name,
//! `DurationSeconds=3600` and an inline session policy that allows only `s3:GetObject` (or
//! `s3:PutObject` for an upload) on the one object, plus `kms:Decrypt`/`kms:GenerateDataKey`
//! on the KMS key when uploads are KMS-encrypted.
//!
//! Owns the endpoint, the request, the policy and the reading of the answer: pure functions
//! of their arguments and `now`, plus [`send`], the one request. Must not cache, limit or count
//! (`super::roles` does) and must not sign S3 URLs (`super::sigv4`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::cache::canonical::split_endpoint;
use crate::cache::sigv4::{sign_request, AwsCredentials, SignedRequest};

/// The session length gitlab-runner asks for (the longest a chained role may have).
pub(crate) const SESSION_DURATION: Duration = Duration::from_secs(3600);

/// How long one `AssumeRole` request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Why `AssumeRole` gave no credentials.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StsError {
    /// The endpoint is not an http(s) URL.
    #[error("STS endpoint {0:?} is not an http:// or https:// URL")]
    Endpoint(String),
    /// The request did not get an answer.
    #[error("AssumeRole {role}: STS at {endpoint} unreachable: {reason}")]
    Unreachable {
        /// The role.
        role: String,
        /// The endpoint.
        endpoint: String,
        /// Why.
        reason: String,
    },
    /// STS refused (its `Code: Message`).
    #[error("AssumeRole {role}: STS answered {status}: {reason}")]
    Refused {
        /// The role.
        role: String,
        /// HTTP status.
        status: u16,
        /// STS's error code and message.
        reason: String,
    },
    /// The request could not be run (its thread or runtime).
    #[error("AssumeRole: {0}")]
    Runtime(String),
    /// A success without the credentials in it.
    #[error("AssumeRole {role}: the answer has no {missing}")]
    Malformed {
        /// The role.
        role: String,
        /// The missing element.
        missing: &'static str,
    },
}

/// The STS endpoint override in `env`, as the AWS SDKs read it: `AWS_ENDPOINT_URL_STS`, else
/// `AWS_ENDPOINT_URL`, neither when `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS` is `true`.
pub(crate) fn endpoint_override(env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let var = |key: &str| env(key).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    if var("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return None;
    }
    var("AWS_ENDPOINT_URL_STS").or_else(|| var("AWS_ENDPOINT_URL")).map(|u| u.trim_end_matches('/').to_string())
}

/// STS's regional endpoint of `region` (the SDK's default): `https://sts.<region>.amazonaws.com`,
/// `.amazonaws.com.cn` in China.
pub(crate) fn regional_endpoint(region: &str) -> String {
    let suffix = if region.starts_with("cn-") { "amazonaws.com.cn" } else { "amazonaws.com" };
    format!("https://sts.{region}.{suffix}")
}

/// The ARN partition of `region`.
fn partition(region: &str) -> &'static str {
    if region.starts_with("us-gov-") {
        "aws-us-gov"
    } else if region.starts_with("cn-") {
        "aws-cn"
    } else {
        "aws"
    }
}

#[derive(Serialize)]
struct Statement<'a> {
    #[serde(rename = "Effect")]
    effect: &'static str,
    #[serde(rename = "Action")]
    action: Vec<&'static str>,
    #[serde(rename = "Resource")]
    resource: &'a str,
}

#[derive(Serialize)]
struct Policy<'a> {
    #[serde(rename = "Version")]
    version: &'static str,
    #[serde(rename = "Statement")]
    statement: Vec<Statement<'a>>,
}

/// gitlab-runner's session policy: `s3:GetObject` (download) or `s3:PutObject` (upload) on
/// `arn:<partition>:s3:::<bucket>/<object>` only, and with `kms_key` (uploads and downloads of
/// a KMS-encrypted cache) `kms:Decrypt` and `kms:GenerateDataKey` on that key.
pub(crate) fn session_policy(region: &str, bucket: &str, object: &str, upload: bool, kms_key: Option<&str>) -> String {
    let resource = format!("arn:{}:s3:::{bucket}/{object}", partition(region));
    let mut statement = vec![Statement {
        effect: "Allow",
        action: vec![if upload { "s3:PutObject" } else { "s3:GetObject" }],
        resource: &resource,
    }];
    if let Some(key) = kms_key {
        statement.push(Statement {
            effect: "Allow",
            action: vec!["kms:Decrypt", "kms:GenerateDataKey"],
            resource: key,
        });
    }
    // Serialising plain strings and vectors cannot fail.
    serde_json::to_string(&Policy { version: "2012-10-17", statement }).unwrap_or_default()
}

/// gitlab-runner's session name: `gitlab-runner-cache-upload-` and 8 random bytes in hex
/// (for downloads too, as gitlab-runner names them).
pub(crate) fn session_name() -> String {
    format!("gitlab-runner-cache-upload-{}", hex::encode(rand::random::<[u8; 8]>()))
}

/// What `AssumeRole` is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AssumeRoleInput {
    pub role_arn: String,
    pub session_name: String,
    pub policy: String,
    pub duration: Duration,
}

/// A request ready to send: URL, headers (signed) and form body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StsRequest {
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// The form body, encoded as the AWS SDK encodes query-API bodies.
fn form(input: &AssumeRoleInput) -> String {
    let duration = input.duration.as_secs().to_string();
    let fields = [
        ("Action", "AssumeRole"),
        ("Version", "2011-06-15"),
        ("RoleArn", input.role_arn.as_str()),
        ("RoleSessionName", input.session_name.as_str()),
        ("Policy", input.policy.as_str()),
        ("DurationSeconds", duration.as_str()),
    ];
    fields
        .iter()
        .map(|(k, v)| format!("{k}={}", crate::cache::canonical::uri_encode(v, false)))
        .collect::<Vec<_>>()
        .join("&")
}

/// `AssumeRole` of `input` at `endpoint`, signed for `region` with `creds` at `now`.
pub(crate) fn request(
    endpoint: &str,
    region: &str,
    input: &AssumeRoleInput,
    creds: &AwsCredentials,
    now: DateTime<Utc>,
) -> Result<StsRequest, StsError> {
    let (scheme, host, base) = split_endpoint(endpoint).ok_or_else(|| StsError::Endpoint(endpoint.to_string()))?;
    let path = format!("{base}/");
    let body = form(input).into_bytes();
    let mut headers =
        vec![("content-type".to_string(), "application/x-www-form-urlencoded; charset=utf-8".to_string())];
    let signed = sign_request(
        &SignedRequest {
            method: "POST",
            scheme,
            host: &host,
            path: &path,
            headers: &headers,
            body: &body,
            region,
            service: "sts",
        },
        creds,
        now,
    );
    headers.extend(signed);
    Ok(StsRequest { url: format!("{scheme}://{host}{path}"), headers, body })
}

/// The text of the first `<tag>…</tag>` of an XML answer, entities decoded.
pub(crate) fn xml_text(body: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let start = body.find(&open)? + open.len();
    let end = body[start..].find(&format!("</{tag}>"))? + start;
    Some(
        body[start..end]
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&amp;", "&"),
    )
}

/// The temporary credentials of an `AssumeRole` answer with HTTP `status`.
pub(crate) fn parse_answer(role: &str, status: u16, body: &str) -> Result<AwsCredentials, StsError> {
    if !(200..300).contains(&status) {
        let reason = match (xml_text(body, "Code"), xml_text(body, "Message")) {
            (Some(code), Some(message)) => format!("{code}: {message}"),
            (Some(code), None) => code,
            _ => body.chars().take(200).collect(),
        };
        return Err(StsError::Refused { role: role.to_string(), status, reason });
    }
    let field = |tag: &'static str| {
        xml_text(body, tag)
            .filter(|v| !v.is_empty())
            .ok_or(StsError::Malformed { role: role.to_string(), missing: tag })
    };
    Ok(AwsCredentials {
        access_key_id: field("AccessKeyId")?,
        secret_access_key: field("SecretAccessKey")?,
        session_token: Some(field("SessionToken")?),
        expires: xml_text(body, "Expiration")
            .and_then(|t| DateTime::parse_from_rfc3339(t.trim()).ok())
            .map(|t| t.with_timezone(&Utc)),
    })
}

/// Send `request` (one attempt) and read its answer.
pub(crate) async fn send(role: &str, request: &StsRequest) -> Result<AwsCredentials, StsError> {
    let unreachable = |e: reqwest::Error| StsError::Unreachable {
        role: role.to_string(),
        endpoint: request.url.clone(),
        reason: e.without_url().to_string(),
    };
    let client = reqwest::Client::builder().timeout(REQUEST_TIMEOUT).build().map_err(unreachable)?;
    let mut builder = client.post(&request.url).body(request.body.clone());
    for (name, value) in &request.headers {
        builder = builder.header(name, value);
    }
    let response = builder.send().await.map_err(unreachable)?;
    let status = response.status().as_u16();
    let body = response.text().await.map_err(unreachable)?;
    parse_answer(role, status, &body)
}

#[cfg(test)]
#[path = "sts_tests.rs"]
mod tests;
