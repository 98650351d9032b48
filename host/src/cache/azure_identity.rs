//! Azure credentials of a `[runners.cache.azure]` without `AccountKey`, as gitlab-runner gets
//! them through azidentity's `DefaultAzureCredential`: an Entra ID access token for Azure
//! Storage (`https://storage.azure.com/`) from the first source the environment sets up —
//!
//! 1. a client secret (`AZURE_TENANT_ID`, `AZURE_CLIENT_ID`, `AZURE_CLIENT_SECRET`);
//! 2. workload identity (`AZURE_TENANT_ID`, `AZURE_CLIENT_ID`, `AZURE_FEDERATED_TOKEN_FILE`:
//!    the file's token is the client assertion), both at
//!    `<AZURE_AUTHORITY_HOST>/<tenant>/oauth2/v2.0/token`;
//! 3. managed identity: App Service (`IDENTITY_ENDPOINT` + `IDENTITY_HEADER`), Azure Arc
//!    (`IDENTITY_ENDPOINT` + `IMDS_ENDPOINT`: a challenge file), else the instance metadata
//!    service (`AZURE_POD_IDENTITY_AUTHORITY_HOST`, else `http://169.254.169.254`), with
//!    `AZURE_CLIENT_ID` naming a user-assigned identity —
//!
//! then the blob service's Get User Delegation Key (`POST /?restype=service&comp=userdelegationkey`
//! with that token), the key user delegation SAS tokens are signed with. `SSL_CERT_FILE` adds
//! trusted CAs, as Go's TLS stack does for gitlab-runner.
//!
//! Owns these requests and the token kept until near its expiry; the environment is passed in
//! (tests point every endpoint at loopback). Must not sign SAS tokens (`azure` does) or touch
//! the store's other providers.

use std::sync::Mutex;
use std::time::Duration;

use base64::Engine as _;
use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::cache::azure::UserDelegationKey;

/// Microsoft's public cloud authority, unless `AZURE_AUTHORITY_HOST` says otherwise.
pub(crate) const DEFAULT_AUTHORITY: &str = "https://login.microsoftonline.com";
/// The instance metadata service of Azure VMs, unless `AZURE_POD_IDENTITY_AUTHORITY_HOST` says
/// otherwise.
pub(crate) const DEFAULT_IMDS: &str = "http://169.254.169.254";
/// The resource (managed identity) and scope (Entra ID) of Azure Storage.
const STORAGE_RESOURCE: &str = "https://storage.azure.com/";
const STORAGE_SCOPE: &str = "https://storage.azure.com/.default";
/// The blob service version asked for the user delegation key.
const BLOB_API_VERSION: &str = "2020-12-06";
const TIMEOUT: Duration = Duration::from_secs(30);
/// A token is used until this long before it expires.
const TOKEN_MARGIN: chrono::Duration = chrono::Duration::minutes(5);

/// Why no token or key could be had (the message names the source and what it answered).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct IdentityError(String);

/// Where the token comes from, chosen from the environment in `DefaultAzureCredential`'s order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TokenSource {
    /// Client credentials with `AZURE_CLIENT_SECRET`.
    ClientSecret { authority: String, tenant: String, client_id: String, secret: String },
    /// Client credentials with the token in `AZURE_FEDERATED_TOKEN_FILE` as the assertion.
    WorkloadIdentity { authority: String, tenant: String, client_id: String, token_file: String },
    /// App Service / Functions: `GET <IDENTITY_ENDPOINT>?api-version=2019-08-01` with
    /// `X-IDENTITY-HEADER`.
    AppService { endpoint: String, header: String, client_id: Option<String> },
    /// Azure Arc: `GET <IDENTITY_ENDPOINT>?api-version=2020-06-01`, answered with a challenge
    /// naming a key file whose content is the `Basic` credential of the second try.
    Arc { endpoint: String },
    /// The instance metadata service: `GET <host>/metadata/identity/oauth2/token` with
    /// `Metadata: true`.
    Imds { host: String, client_id: Option<String> },
}

impl TokenSource {
    /// The first source `env` sets up (the instance metadata service when none is).
    pub(crate) fn select(env: &dyn Fn(&str) -> Option<String>) -> TokenSource {
        let var = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        let authority = var("AZURE_AUTHORITY_HOST")
            .unwrap_or_else(|| DEFAULT_AUTHORITY.to_string())
            .trim_end_matches('/')
            .to_string();
        let client_id = var("AZURE_CLIENT_ID");
        if let (Some(tenant), Some(client_id)) = (var("AZURE_TENANT_ID"), client_id.clone()) {
            if let Some(secret) = var("AZURE_CLIENT_SECRET") {
                return TokenSource::ClientSecret { authority, tenant, client_id, secret };
            }
            if let Some(token_file) = var("AZURE_FEDERATED_TOKEN_FILE") {
                return TokenSource::WorkloadIdentity { authority, tenant, client_id, token_file };
            }
        }
        if let Some(endpoint) = var("IDENTITY_ENDPOINT") {
            if let Some(header) = var("IDENTITY_HEADER") {
                return TokenSource::AppService { endpoint, header, client_id };
            }
            if var("IMDS_ENDPOINT").is_some() {
                return TokenSource::Arc { endpoint };
            }
        }
        let host = var("AZURE_POD_IDENTITY_AUTHORITY_HOST")
            .unwrap_or_else(|| DEFAULT_IMDS.to_string())
            .trim_end_matches('/')
            .to_string();
        TokenSource::Imds { host, client_id }
    }

    /// A name for logs and errors.
    pub(crate) fn describe(&self) -> String {
        match self {
            TokenSource::ClientSecret { authority, .. } => format!("client secret at {authority}"),
            TokenSource::WorkloadIdentity { authority, token_file, .. } => {
                format!("workload identity ({token_file}) at {authority}")
            }
            TokenSource::AppService { endpoint, .. } => format!("managed identity at {endpoint}"),
            TokenSource::Arc { endpoint } => format!("Azure Arc managed identity at {endpoint}"),
            TokenSource::Imds { host, .. } => format!("managed identity (instance metadata) at {host}"),
        }
    }
}

/// An access token and when it stops working.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct AccessToken {
    pub token: String,
    pub expires: DateTime<Utc>,
}

impl std::fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessToken").field("expires", &self.expires).finish_non_exhaustive()
    }
}

/// The user delegation credentials of one store: the last token, reused until
/// [`TOKEN_MARGIN`] before it expires.
#[derive(Default)]
pub(crate) struct Delegation {
    token: Mutex<Option<AccessToken>>,
}

impl Delegation {
    /// A token for Azure Storage from `source`: the kept one while it is fresh, else a new one.
    pub(crate) async fn token(
        &self,
        source: &TokenSource,
        env: &(dyn Fn(&str) -> Option<String> + Sync),
        now: DateTime<Utc>,
    ) -> Result<String, IdentityError> {
        if let Some(kept) = self.kept(now) {
            return Ok(kept);
        }
        let fresh = fetch_token(source, env).await?;
        let token = fresh.token.clone();
        if let Ok(mut slot) = self.token.lock() {
            *slot = Some(fresh);
        }
        Ok(token)
    }

    fn kept(&self, now: DateTime<Utc>) -> Option<String> {
        let slot = self.token.lock().ok()?;
        slot.as_ref().filter(|t| t.expires - TOKEN_MARGIN > now).map(|t| t.token.clone())
    }
}

fn http(env: &dyn Fn(&str) -> Option<String>, direct: bool) -> Result<reqwest::Client, IdentityError> {
    let mut builder = reqwest::Client::builder().timeout(TIMEOUT);
    if direct {
        // Managed identity endpoints are local to the host: never through a proxy.
        builder = builder.no_proxy();
    }
    if let Some(file) = env("SSL_CERT_FILE").filter(|f| !f.is_empty()) {
        let pem = std::fs::read(&file).map_err(|e| IdentityError(format!("SSL_CERT_FILE {file}: {e}")))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| IdentityError(format!("SSL_CERT_FILE {file}: {e}")))?;
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder.build().map_err(|e| IdentityError(format!("HTTP client: {e}")))
}

/// A new token from `source`.
pub(crate) async fn fetch_token(
    source: &TokenSource,
    env: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<AccessToken, IdentityError> {
    let fail = |e: String| IdentityError(format!("Azure token from {}: {e}", source.describe()));
    let direct = matches!(source, TokenSource::AppService { .. } | TokenSource::Arc { .. } | TokenSource::Imds { .. });
    let client = http(env, direct).map_err(|e| fail(e.0))?;
    let request = match source {
        TokenSource::ClientSecret { authority, tenant, client_id, secret } => {
            client.post(format!("{authority}/{tenant}/oauth2/v2.0/token")).form(&[
                ("grant_type", "client_credentials"),
                ("client_id", client_id),
                ("client_secret", secret),
                ("scope", STORAGE_SCOPE),
            ])
        }
        TokenSource::WorkloadIdentity { authority, tenant, client_id, token_file } => {
            // Re-read each time: the kubelet rotates the projected token.
            let assertion = tokio::fs::read_to_string(token_file)
                .await
                .map_err(|e| fail(format!("AZURE_FEDERATED_TOKEN_FILE: {e}")))?;
            client.post(format!("{authority}/{tenant}/oauth2/v2.0/token")).form(&[
                ("grant_type", "client_credentials"),
                ("client_id", client_id),
                ("client_assertion_type", "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"),
                ("client_assertion", assertion.trim()),
                ("scope", STORAGE_SCOPE),
            ])
        }
        TokenSource::AppService { endpoint, header, client_id } => {
            let mut query = vec![("api-version", "2019-08-01"), ("resource", STORAGE_RESOURCE)];
            if let Some(id) = client_id {
                query.push(("client_id", id));
            }
            client.get(endpoint).query(&query).header("X-IDENTITY-HEADER", header)
        }
        TokenSource::Arc { endpoint } => {
            let query = [("api-version", "2020-06-01"), ("resource", STORAGE_RESOURCE)];
            let challenge = client
                .get(endpoint)
                .query(&query)
                .header("Metadata", "true")
                .send()
                .await
                .map_err(|e| fail(e.to_string()))?;
            let key_file = arc_key_file(&challenge).ok_or_else(|| {
                fail(format!(
                    "expected a 401 with WWW-Authenticate: Basic realm=<key file>, got {}",
                    challenge.status()
                ))
            })?;
            let secret = tokio::fs::read_to_string(&key_file)
                .await
                .map_err(|e| fail(format!("Arc key file {key_file}: {e}")))?;
            client
                .get(endpoint)
                .query(&query)
                .header("Metadata", "true")
                .header("Authorization", format!("Basic {}", secret.trim()))
        }
        TokenSource::Imds { host, client_id } => {
            let mut query = vec![("api-version", "2018-02-01"), ("resource", STORAGE_RESOURCE)];
            if let Some(id) = client_id {
                query.push(("client_id", id));
            }
            client.get(format!("{host}/metadata/identity/oauth2/token")).query(&query).header("Metadata", "true")
        }
    };
    let response = request.send().await.map_err(|e| fail(e.to_string()))?;
    let status = response.status();
    let body = response.text().await.map_err(|e| fail(e.to_string()))?;
    if !status.is_success() {
        return Err(fail(format!("{status}: {}", error_text(&body))));
    }
    parse_token(&body, Utc::now()).map_err(fail)
}

/// The key file an Arc challenge names (`WWW-Authenticate: Basic realm=<path>`).
fn arc_key_file(challenge: &reqwest::Response) -> Option<String> {
    if challenge.status() != reqwest::StatusCode::UNAUTHORIZED {
        return None;
    }
    let header = challenge.headers().get("www-authenticate")?.to_str().ok()?;
    let realm = header.split_once("realm=")?.1.trim().trim_matches('"');
    Some(realm.to_string()).filter(|r| !r.is_empty())
}

/// An error answer's most readable part: Entra ID's `error_description`, a managed identity's
/// `error`/`message`, else the body.
fn error_text(body: &str) -> String {
    let json: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let field = |v: &Value| v.as_str().map(str::to_string);
    field(&json["error_description"])
        .or_else(|| field(&json["error"]["message"]))
        .or_else(|| field(&json["message"]))
        .or_else(|| field(&json["error"]))
        .unwrap_or_else(|| body.chars().take(300).collect())
}

/// A token answer: `access_token` with `expires_on` (Unix seconds, managed identity; a number
/// or a string) or `expires_in` (seconds from `now`, Entra ID).
pub(crate) fn parse_token(body: &str, now: DateTime<Utc>) -> Result<AccessToken, String> {
    let json: Value = serde_json::from_str(body).map_err(|e| format!("not a token answer: {e}"))?;
    let token = json["access_token"].as_str().filter(|t| !t.is_empty()).ok_or("no access_token in the answer")?;
    let number = |v: &Value| v.as_i64().or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()));
    let expires = if let Some(on) = number(&json["expires_on"]) {
        DateTime::from_timestamp(on, 0).ok_or("expires_on out of range")?
    } else if let Some(seconds) = number(&json["expires_in"]) {
        now + chrono::Duration::seconds(seconds)
    } else {
        return Err("neither expires_on nor expires_in in the answer".into());
    };
    Ok(AccessToken { token: token.to_string(), expires })
}

/// Get User Delegation Key from the blob service at `service_url` (`scheme://host[/base]`) with
/// `token`, valid from `start` to `expiry`.
pub(crate) async fn user_delegation_key(
    service_url: &str,
    token: &str,
    start: DateTime<Utc>,
    expiry: DateTime<Utc>,
    env: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<UserDelegationKey, IdentityError> {
    let fail = |e: String| IdentityError(format!("user delegation key from {service_url}: {e}"));
    let client = http(env, false).map_err(|e| fail(e.0))?;
    let time = |t: DateTime<Utc>| t.format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<KeyInfo><Start>{}</Start><Expiry>{}</Expiry></KeyInfo>",
        time(start),
        time(expiry)
    );
    let response = client
        .post(format!("{service_url}/"))
        .query(&[("restype", "service"), ("comp", "userdelegationkey")])
        .bearer_auth(token)
        .header("x-ms-version", BLOB_API_VERSION)
        .header("x-ms-date", Utc::now().format("%a, %d %b %Y %H:%M:%S GMT").to_string())
        .header("content-type", "application/xml")
        .body(body)
        .send()
        .await
        .map_err(|e| fail(e.to_string()))?;
    let status = response.status();
    let text = response.text().await.map_err(|e| fail(e.to_string()))?;
    if !status.is_success() {
        let message = xml_text(&text, "Message").unwrap_or_else(|| text.chars().take(300).collect());
        let code = xml_text(&text, "Code").unwrap_or_default();
        return Err(fail(format!("{status} {code}: {}", message.lines().next().unwrap_or_default())));
    }
    parse_user_delegation_key(&text).map_err(fail)
}

/// The `<UserDelegationKey>` answer.
pub(crate) fn parse_user_delegation_key(xml: &str) -> Result<UserDelegationKey, String> {
    let field = |tag: &str| xml_text(xml, tag).filter(|v| !v.is_empty()).ok_or(format!("no {tag} in the answer"));
    let start = field("SignedStart")?;
    let expiry = field("SignedExpiry")?;
    let parse =
        |t: &str| DateTime::parse_from_rfc3339(t).map(|d| d.with_timezone(&Utc)).map_err(|e| format!("{t:?}: {e}"));
    let value = base64::engine::general_purpose::STANDARD
        .decode(field("Value")?.trim())
        .map_err(|e| format!("Value is not base64: {e}"))?;
    Ok(UserDelegationKey {
        object_id: field("SignedOid")?,
        tenant_id: field("SignedTid")?,
        starts: parse(&start)?,
        expires: parse(&expiry)?,
        start,
        expiry,
        service: field("SignedService")?,
        version: field("SignedVersion")?,
        value,
    })
}

/// The text of the first `<tag>…</tag>` (these answers have no attributes or entities there).
fn xml_text(xml: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let from = xml.find(&open)? + open.len();
    let to = xml[from..].find(&format!("</{tag}>"))? + from;
    Some(xml[from..to].trim().to_string())
}

#[cfg(test)]
#[path = "azure_identity_tests.rs"]
mod tests;
