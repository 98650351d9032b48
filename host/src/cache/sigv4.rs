//! Amazon S3 pre-signed URLs (AWS Signature Version 4, query-string authentication) and
//! where they point: AWS's regional, dual-stack or accelerated endpoints, or an S3-compatible
//! `ServerAddress`, virtual-hosted or path-style as gitlab-runner decides; and the same
//! signature as an `Authorization` header ([`sign_request`]) for the other AWS APIs the runner
//! calls (Secrets Manager, for `crate::secrets`).
//!
//! Owns pure functions of the config, the credentials and `now`; must not do I/O or read the
//! clock (the caller passes `now`).

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::cache::canonical::{strip_default_port, uri_encode, Canonical};
use crate::config::cache::CacheS3Config;

/// gitlab-runner's default endpoint: `ServerAddress` empty or this means AWS.
const AWS_DEFAULT_HOST: &str = "s3.amazonaws.com";

/// Access keys that sign S3 requests.
#[derive(Clone, PartialEq, Eq)]
pub struct AwsCredentials {
    /// `AWS_ACCESS_KEY_ID`.
    pub access_key_id: String,
    /// `AWS_SECRET_ACCESS_KEY`.
    pub secret_access_key: String,
    /// `AWS_SESSION_TOKEN` of temporary credentials.
    pub session_token: Option<String>,
    /// When temporary credentials stop working.
    pub expires: Option<DateTime<Utc>>,
}

impl std::fmt::Debug for AwsCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsCredentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field("session_token", &self.session_token.as_ref().map(|_| "<redacted>"))
            .field("expires", &self.expires)
            .finish()
    }
}

/// Where an object of a bucket is reached: scheme, host (with port) and encoded path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct S3Location {
    pub scheme: &'static str,
    pub host: String,
    pub path: String,
}

/// The bucket itself (`GET ?location` goes there): `/` of the virtual host, or `/<bucket>`.
pub(crate) fn bucket_location(cfg: &CacheS3Config, region: &str) -> S3Location {
    let mut loc = location(cfg, region, "");
    if loc.path != "/" {
        loc.path = loc.path.trim_end_matches('/').to_string();
    }
    loc
}

/// The region of a `GetBucketLocation` answer: `<LocationConstraint>` (empty: `us-east-1`,
/// `EU`: `eu-west-1`, as gitlab-runner reads it).
pub(crate) fn parse_location(body: &str) -> Option<String> {
    let start = body.find("<LocationConstraint")?;
    let rest = &body[start..];
    let open_end = rest.find('>')?;
    if rest[..open_end].ends_with('/') {
        return Some("us-east-1".into());
    }
    let value = &rest[open_end + 1..rest.find("</LocationConstraint>")?];
    Some(match value.trim() {
        "" => "us-east-1".into(),
        "EU" => "eu-west-1".into(),
        v => v.to_string(),
    })
}

fn is_aws_default(cfg: &CacheS3Config) -> bool {
    cfg.server_address.is_empty() || cfg.server_address == AWS_DEFAULT_HOST
}

/// The URL of `object` in the bucket of `cfg`, in `region`, as gitlab-runner's S3 client
/// builds it.
pub(crate) fn location(cfg: &CacheS3Config, region: &str, object: &str) -> S3Location {
    let bucket = cfg.bucket_name.as_str();
    let key = uri_encode(object, true);
    if is_aws_default(cfg) {
        let dual = cfg.dual_stack.unwrap_or(true);
        let host = match (cfg.accelerate, dual) {
            (true, true) => "s3-accelerate.dualstack.amazonaws.com".to_string(),
            (true, false) => "s3-accelerate.amazonaws.com".to_string(),
            (false, true) => format!("s3.dualstack.{region}.amazonaws.com"),
            (false, false) => format!("s3.{region}.amazonaws.com"),
        };
        // A bucket with dots cannot be a host name under AWS's TLS certificate.
        let path_style = cfg.path_style.unwrap_or(false) || bucket.contains('.');
        return if path_style {
            S3Location { scheme: "https", host, path: format!("/{}/{key}", uri_encode(bucket, false)) }
        } else {
            S3Location { scheme: "https", host: format!("{bucket}.{host}"), path: format!("/{key}") }
        };
    }
    let scheme = if cfg.insecure { "http" } else { "https" };
    let host = strip_default_port(scheme, &cfg.server_address);
    let path_style = cfg.path_style.unwrap_or_else(|| !virtual_host_supported(scheme, &host, bucket));
    if path_style {
        S3Location { scheme, host, path: format!("/{}/{key}", uri_encode(bucket, false)) }
    } else {
        S3Location { scheme, host: format!("{bucket}.{host}"), path: format!("/{key}") }
    }
}

/// minio's rule gitlab-runner follows: virtual hosts only on AWS and Google endpoints, and
/// not for a bucket with dots over https.
fn virtual_host_supported(scheme: &str, host: &str, bucket: &str) -> bool {
    if scheme == "https" && bucket.contains('.') {
        return false;
    }
    let name = host.rsplit_once(':').map_or(host, |(h, _)| h);
    name.ends_with(".amazonaws.com") || name == "storage.googleapis.com"
}

fn hmac(key: &[u8], data: &str) -> Vec<u8> {
    // HMAC takes a key of any length: new_from_slice cannot fail.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    mac.update(data.as_bytes());
    mac.finalize().into_bytes().to_vec()
}

/// A pre-signed URL: `method` on `loc`, valid `expires_secs` from `now`, carrying `headers`
/// (signed: the request must send them as given).
pub(crate) fn presign(
    method: &str,
    loc: &S3Location,
    region: &str,
    creds: &AwsCredentials,
    headers: &[(String, String)],
    expires_secs: u64,
    now: DateTime<Utc>,
) -> String {
    presign_with_query(method, loc, region, creds, headers, &[], expires_secs, now)
}

/// [`presign`] of a request with query parameters of its own (e.g. `location`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn presign_with_query(
    method: &str,
    loc: &S3Location,
    region: &str,
    creds: &AwsCredentials,
    headers: &[(String, String)],
    extra_query: &[(String, String)],
    expires_secs: u64,
    now: DateTime<Utc>,
) -> String {
    let date = now.format("%Y%m%d").to_string();
    let timestamp = now.format("%Y%m%dT%H%M%SZ").to_string();
    let scope = format!("{date}/{region}/s3/aws4_request");
    let mut canonical =
        Canonical { method, scheme: loc.scheme, host: &loc.host, path: &loc.path, query: Vec::new(), headers };
    let mut query = vec![
        ("X-Amz-Algorithm".to_string(), "AWS4-HMAC-SHA256".to_string()),
        ("X-Amz-Credential".to_string(), format!("{}/{scope}", creds.access_key_id)),
        ("X-Amz-Date".to_string(), timestamp.clone()),
        ("X-Amz-Expires".to_string(), expires_secs.to_string()),
        ("X-Amz-SignedHeaders".to_string(), canonical.signed_headers()),
    ];
    if let Some(token) = &creds.session_token {
        query.push(("X-Amz-Security-Token".to_string(), token.clone()));
    }
    query.extend(extra_query.iter().cloned());
    canonical.query = query;
    let request_hash = hex::encode(Sha256::digest(canonical.request().as_bytes()));
    let string_to_sign = format!("AWS4-HMAC-SHA256\n{timestamp}\n{scope}\n{request_hash}");
    let signature = hex::encode(hmac(&signing_key(creds, &date, region, "s3"), &string_to_sign));
    canonical.url("X-Amz-Signature", &signature)
}

/// SigV4's derived key: `secret` → date → region → service → `aws4_request`.
fn signing_key(creds: &AwsCredentials, date: &str, region: &str, service: &str) -> Vec<u8> {
    let key = hmac(format!("AWS4{}", creds.secret_access_key).as_bytes(), date);
    let key = hmac(&key, region);
    let key = hmac(&key, service);
    hmac(&key, "aws4_request")
}

/// One request to sign with an `Authorization` header (AWS Signature Version 4).
pub struct SignedRequest<'a> {
    /// `POST`, `GET`, ...
    pub method: &'a str,
    /// `http` or `https`.
    pub scheme: &'a str,
    /// The host as sent (with a non-default port).
    pub host: &'a str,
    /// The path as sent (already encoded).
    pub path: &'a str,
    /// Headers the request carries besides `host` (all signed).
    pub headers: &'a [(String, String)],
    /// The body.
    pub body: &'a [u8],
    /// The region, e.g. `eu-west-1`.
    pub region: &'a str,
    /// The service's signing name, e.g. `secretsmanager`.
    pub service: &'a str,
}

/// The headers that sign `request` with `creds` at `now`: `x-amz-date`, the session token
/// when the credentials are temporary, and `authorization` (over every header of `request`,
/// `host` and those two). Pure: the caller sends them with the request's own headers.
pub fn sign_request(request: &SignedRequest<'_>, creds: &AwsCredentials, now: DateTime<Utc>) -> Vec<(String, String)> {
    let date = now.format("%Y%m%d").to_string();
    let timestamp = now.format("%Y%m%dT%H%M%SZ").to_string();
    let scope = format!("{date}/{}/{}/aws4_request", request.region, request.service);
    let mut added = vec![("x-amz-date".to_string(), timestamp.clone())];
    if let Some(token) = &creds.session_token {
        added.push(("x-amz-security-token".to_string(), token.clone()));
    }
    let mut headers = request.headers.to_vec();
    headers.extend(added.iter().cloned());
    let canonical = Canonical {
        method: request.method,
        scheme: request.scheme,
        host: request.host,
        path: request.path,
        query: Vec::new(),
        headers: &headers,
    };
    let payload_hash = hex::encode(Sha256::digest(request.body));
    let request_hash = hex::encode(Sha256::digest(canonical.request_with_payload(&payload_hash).as_bytes()));
    let string_to_sign = format!("AWS4-HMAC-SHA256\n{timestamp}\n{scope}\n{request_hash}");
    let key = signing_key(creds, &date, request.region, request.service);
    let signature = hex::encode(hmac(&key, &string_to_sign));
    added.push((
        "authorization".to_string(),
        format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={}, Signature={signature}",
            creds.access_key_id,
            canonical.signed_headers()
        ),
    ));
    added
}
