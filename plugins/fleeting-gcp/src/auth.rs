//! OAuth 2.0 access tokens for the Compute Engine API: a service account key file (JSON,
//! `credentials_file` or a granted `GOOGLE_APPLICATION_CREDENTIALS`; readable only through a
//! `dirs` grant) exchanged for a token with a JWT signed (RS256) in the plugin, else the
//! metadata server of the VM the runner runs on (`metadata.google.internal`, or a granted
//! `GCE_METADATA_HOST`; reachable only when in `allow_hosts`). Tokens are refreshed five
//! minutes before they expire.
//!
//! Owns: getting and caching tokens. Must not touch: Compute API calls.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use cloud_common::http::{self, Request};
use rsa::pkcs1v15::SigningKey;
use rsa::pkcs8::DecodePrivateKey;
use rsa::signature::{SignatureEncoding, Signer};
use rsa::RsaPrivateKey;

/// The scope the plugin asks for.
const SCOPE: &str = "https://www.googleapis.com/auth/compute";
const DEFAULT_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

/// A service account key file's fields the plugin uses.
#[derive(serde::Deserialize)]
struct KeyFile {
    #[serde(rename = "type")]
    kind: String,
    client_email: String,
    private_key: String,
    #[serde(default)]
    private_key_id: Option<String>,
    #[serde(default)]
    token_uri: Option<String>,
}

/// Where tokens come from.
enum Source {
    ServiceAccount { email: String, key: Box<RsaPrivateKey>, key_id: Option<String>, token_uri: String },
    Metadata { host: String },
}

/// Tokens, cached.
pub struct Auth {
    source: Source,
    token: Option<(String, u64)>,
}

#[derive(serde::Deserialize)]
struct TokenAnswer {
    access_token: String,
    #[serde(default)]
    expires_in: Option<u64>,
}

impl Auth {
    /// Read `credentials_file` (or `GOOGLE_APPLICATION_CREDENTIALS`) now; without either, the
    /// metadata server is used.
    pub fn new(credentials_file: Option<&str>) -> Result<Auth, String> {
        let path = credentials_file.map(str::to_string).or_else(|| env("GOOGLE_APPLICATION_CREDENTIALS"));
        let source = match path {
            Some(path) => {
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    format!(
                        "cannot read credentials file {path}: {e} (is its directory granted to the plugin in `dirs`?)"
                    )
                })?;
                let file: KeyFile = serde_json::from_str(&text).map_err(|e| format!("credentials file {path}: {e}"))?;
                if file.kind != "service_account" {
                    return Err(format!("credentials file {path}: type {:?} is not service_account", file.kind));
                }
                let key = RsaPrivateKey::from_pkcs8_pem(&file.private_key)
                    .map_err(|e| format!("credentials file {path}: private_key: {e}"))?;
                Source::ServiceAccount {
                    email: file.client_email,
                    key: Box::new(key),
                    key_id: file.private_key_id,
                    token_uri: file.token_uri.unwrap_or_else(|| DEFAULT_TOKEN_URI.into()),
                }
            }
            None => {
                Source::Metadata { host: env("GCE_METADATA_HOST").unwrap_or_else(|| "metadata.google.internal".into()) }
            }
        };
        Ok(Auth { source, token: None })
    }

    /// Drop the cached token (the API refused it).
    pub fn invalidate(&mut self) {
        self.token = None;
    }

    /// A valid access token.
    pub fn bearer(&mut self) -> Result<String, String> {
        let now = cloud_common::now_unix();
        if let Some((token, _)) = self.token.as_ref().filter(|(_, at)| *at > now + 300) {
            return Ok(token.clone());
        }
        let (response, what) = match &self.source {
            Source::ServiceAccount { email, key, key_id, token_uri } => {
                let assertion = jwt(email, key, key_id.as_deref(), token_uri, now)?;
                let body = cloud_common::form_encode(&[
                    ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
                    ("assertion", assertion.as_str()),
                ]);
                let request = Request::new("POST", token_uri.clone())
                    .header("content-type", "application/x-www-form-urlencoded")
                    .body(body);
                (
                    http::send(&request).map_err(|e| format!("service account {email}: {e}"))?,
                    format!("service account {email}"),
                )
            }
            Source::Metadata { host } => {
                let url = format!("http://{host}/computeMetadata/v1/instance/service-accounts/default/token");
                let request = Request::new("GET", url).header("metadata-flavor", "Google");
                (
                    http::send(&request).map_err(|e| format!("metadata server {host}: {e}"))?,
                    format!("metadata server {host}"),
                )
            }
        };
        if response.status != 200 {
            let error: serde_json::Value = serde_json::from_slice(&response.body).unwrap_or_default();
            let code = error.get("error").and_then(|e| e.as_str()).unwrap_or_default();
            let detail = error
                .get("error_description")
                .and_then(|e| e.as_str())
                .map(str::to_string)
                .unwrap_or_else(|| response.text().chars().take(300).collect());
            return Err(format!("{what}: token refused (HTTP {}): {code} {detail}", response.status));
        }
        let answer: TokenAnswer =
            serde_json::from_slice(&response.body).map_err(|e| format!("{what}: bad token answer: {e}"))?;
        let expires = now + answer.expires_in.unwrap_or(600);
        self.token = Some((answer.access_token.clone(), expires));
        Ok(answer.access_token)
    }
}

/// The signed JWT a service account exchanges for a token (Google's OAuth 2.0 for
/// server-to-server applications).
fn jwt(email: &str, key: &RsaPrivateKey, key_id: Option<&str>, audience: &str, now: u64) -> Result<String, String> {
    let mut header = serde_json::json!({"alg": "RS256", "typ": "JWT"});
    if let Some(kid) = key_id {
        header["kid"] = kid.into();
    }
    let claims = serde_json::json!({"iss": email, "scope": SCOPE, "aud": audience, "iat": now, "exp": now + 3600});
    let input =
        format!("{}.{}", URL_SAFE_NO_PAD.encode(header.to_string()), URL_SAFE_NO_PAD.encode(claims.to_string()));
    let signer = SigningKey::<sha2::Sha256>::new(key.clone());
    let signature = signer.try_sign(input.as_bytes()).map_err(|e| format!("signing the JWT: {e}"))?;
    Ok(format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature.to_bytes())))
}
