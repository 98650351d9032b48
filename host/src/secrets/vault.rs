//! HashiCorp Vault and OpenBao over their HTTP API, as gitlab-runner's `helpers/vault` uses
//! them: the JWT auth method (`POST /v1/auth/<path>/login` with `jwt` and `role`), the KV
//! engines — `kv-v1` (also `generic`: `GET /v1/<mount>/<path>`) and `kv-v2`
//! (`GET /v1/<mount>/data/<path>`, the fields under `data.data`) — a namespace in
//! `X-Vault-Namespace`, and the `vault` resolver on top of them. The reading half
//! ([`Server::read_field`]) is shared with GitLab's secrets manager, which logs in inline.
//!
//! A 404 is "not found" (the secret, or its field); any other refusal carries the server's
//! `errors`. Owns: the Vault wire. Must not touch: anything beyond one secret's read.

use serde_json::Value;

use super::{Resolved, Resolver, SecretError};
use crate::payload::secrets::{Secret, VaultEngine};

/// The `vault` resolver.
pub struct VaultResolver;

impl Resolver for VaultResolver {
    fn name(&self) -> &'static str {
        "vault"
    }

    fn supports(&self, secret: &Secret) -> bool {
        secret.vault.is_some()
    }

    fn resolve<'a>(&'a self, secret: &'a Secret, http: &'a reqwest::Client) -> Resolved<'a> {
        Box::pin(async move {
            let vault = secret.vault.as_ref().ok_or_else(|| SecretError::Invalid("not a vault secret".into()))?;
            let server = Server::new(http, &vault.server.url, &vault.server.namespace)?;
            let auth = &vault.server.auth;
            if auth.name != "jwt" {
                return Err(SecretError::Invalid(format!(
                    "vault auth method {:?} is not supported (only \"jwt\")",
                    auth.name
                )));
            }
            let jwt = match auth.data.get("jwt") {
                Some(Value::String(jwt)) if !jwt.is_empty() => jwt.clone(),
                _ => {
                    return Err(SecretError::Invalid(
                        "vault auth data has no `jwt` (is the ID token variable set?)".into(),
                    ))
                }
            };
            let mount = if auth.path.is_empty() { auth.name.as_str() } else { auth.path.as_str() };
            let role = auth.data.get("role").and_then(Value::as_str).unwrap_or_default();
            let token = server.jwt_login(mount, &jwt, role).await?;
            let request = Auth::Token(&token);
            server.read_field(&request, &vault.engine, &vault.path, &vault.field, FieldMissing::NotFound).await
        })
    }
}

/// One Vault (or OpenBao) server.
pub struct Server<'a> {
    http: &'a reqwest::Client,
    /// `https://host:port`, without a trailing `/`.
    base: String,
    namespace: &'a str,
}

/// How a read authenticates.
pub enum Auth<'a> {
    /// A token from a login (`X-Vault-Token`).
    Token(&'a str),
    /// OpenBao's inline authentication: the login path and its parameters, sent with the
    /// read itself (`X-Vault-Inline-Auth-Path`, `X-Vault-Inline-Auth-Parameter-*`).
    Inline {
        /// The login path, such as `auth/gitlab_rails_jwt/login`.
        path: &'a str,
        /// Its parameters (`jwt`, `role`).
        parameters: Vec<(&'static str, &'a str)>,
    },
}

/// What a secret without the requested field is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum FieldMissing {
    /// Not found, like the secret itself (gitlab-runner's `vault` resolver).
    NotFound,
    /// An error of its own (gitlab-runner's `gitlab_secrets_manager` resolver).
    Invalid,
}

impl<'a> Server<'a> {
    /// The server at `url` (the job's `url:`), in `namespace` (empty: none).
    pub fn new(http: &'a reqwest::Client, url: &str, namespace: &'a str) -> Result<Self, SecretError> {
        let base = url.trim_end_matches('/').to_string();
        let parsed = reqwest::Url::parse(&base)
            .map_err(|e| SecretError::Invalid(format!("the server URL {url:?} is not a URL: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(SecretError::Invalid(format!("the server URL {url:?} is not http(s)")));
        }
        Ok(Server { http, base, namespace })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, format!("{}/v1/{}", self.base, path.trim_start_matches('/')));
        if self.namespace.is_empty() {
            request
        } else {
            request.header("X-Vault-Namespace", self.namespace)
        }
    }

    /// Log in with the JWT auth method mounted at `mount`; the client token.
    pub async fn jwt_login(&self, mount: &str, jwt: &str, role: &str) -> Result<String, SecretError> {
        let mut body = serde_json::Map::new();
        body.insert("jwt".into(), Value::String(jwt.into()));
        if !role.is_empty() {
            body.insert("role".into(), Value::String(role.into()));
        }
        let path = format!("auth/{}/login", mount.trim_matches('/'));
        let response = self.send(self.request(reqwest::Method::POST, &path).json(&body)).await?;
        let (status, answer) = response;
        if !status.is_success() {
            return Err(self.refused(status, &answer, &format!("logging in at {path}")));
        }
        answer
            .pointer("/auth/client_token")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .ok_or_else(|| self.unreadable(&format!("the login at {path} gave no client token")))
    }

    /// Read `field` of the secret at `path` of the KV `engine`, authenticated by `auth`.
    pub async fn read_field(
        &self,
        auth: &Auth<'_>,
        engine: &VaultEngine,
        path: &str,
        field: &str,
        missing: FieldMissing,
    ) -> Result<String, SecretError> {
        let mount = engine.path.trim_matches('/');
        let secret = path.trim_matches('/');
        let (url_path, v2) = match engine.name.as_str() {
            "kv-v2" => (format!("{mount}/data/{secret}"), true),
            "kv-v1" | "generic" => (format!("{mount}/{secret}"), false),
            other => {
                return Err(SecretError::Invalid(format!(
                    "secret engine {other:?} is not supported (kv-v1, generic or kv-v2)"
                )))
            }
        };
        let mut request = self.request(reqwest::Method::GET, &url_path);
        request = match auth {
            Auth::Token(token) => request.header("X-Vault-Token", *token),
            Auth::Inline { path, parameters } => {
                let mut r = request.header("X-Vault-Inline-Auth-Path", *path);
                for (name, value) in parameters {
                    r = r.header(format!("X-Vault-Inline-Auth-Parameter-{name}"), inline_parameter(name, value));
                }
                r
            }
        };
        let (status, answer) = self.send(request).await?;
        let not_found = || SecretError::NotFound { server: self.base.clone(), what: url_path.clone() };
        if status == reqwest::StatusCode::NOT_FOUND {
            return Err(not_found());
        }
        if !status.is_success() {
            return Err(self.refused(status, &answer, &format!("reading {url_path}")));
        }
        let data = if v2 { answer.pointer("/data/data") } else { answer.get("data") };
        let Some(Value::Object(data)) = data else { return Err(not_found()) };
        match (data.get(field), missing) {
            (Some(Value::String(s)), _) => Ok(s.clone()),
            (None | Some(Value::Null), FieldMissing::NotFound) => {
                Err(SecretError::NotFound { server: self.base.clone(), what: format!("field {field:?} of {url_path}") })
            }
            (None, FieldMissing::Invalid) => {
                Err(SecretError::Invalid(format!("{}: field {field:?} not found in secret {url_path}", self.base)))
            }
            (Some(_), FieldMissing::Invalid) => {
                Err(SecretError::Invalid(format!("{}: field {field:?} of {url_path} is not a string", self.base)))
            }
            // gitlab-runner prints any other JSON value as it reads it.
            (Some(other), FieldMissing::NotFound) => Ok(other.to_string()),
        }
    }

    /// Send `request`; the status and the JSON answer (`null` when the body is not JSON).
    async fn send(&self, request: reqwest::RequestBuilder) -> Result<(reqwest::StatusCode, Value), SecretError> {
        let response = request.send().await.map_err(|e| SecretError::Unreachable {
            server: self.base.clone(),
            reason: error_chain(&e.without_url()),
        })?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| SecretError::Unreachable {
            server: self.base.clone(),
            reason: format!("reading the answer: {}", error_chain(&e.without_url())),
        })?;
        Ok((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
    }

    fn refused(&self, status: reqwest::StatusCode, answer: &Value, doing: &str) -> SecretError {
        let errors: Vec<&str> =
            answer.get("errors").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
        let said = if errors.is_empty() { "no reason given".to_string() } else { errors.join(", ") };
        SecretError::Refused { server: self.base.clone(), status: status.as_u16(), reason: format!("{doing}: {said}") }
    }

    fn unreadable(&self, reason: &str) -> SecretError {
        SecretError::Unreachable { server: self.base.clone(), reason: reason.to_string() }
    }
}

/// An inline auth parameter as OpenBao reads it: URL-safe base64, unpadded, of
/// `{"key": name, "value": value}`.
fn inline_parameter(name: &str, value: &str) -> String {
    use base64::Engine as _;
    let json = serde_json::json!({ "key": name, "value": value }).to_string();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
}

/// An error with its causes (`error sending request: connection refused`).
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_parameters_are_openbaos_encoding() {
        use base64::Engine as _;
        let encoded = inline_parameter("role", "ci");
        let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(encoded).unwrap();
        let value: Value = serde_json::from_slice(&decoded).unwrap();
        assert_eq!(value, serde_json::json!({"key": "role", "value": "ci"}));
    }

    #[test]
    fn a_server_url_must_be_http() {
        let http = reqwest::Client::new();
        assert!(Server::new(&http, "ftp://x", "").is_err());
        assert!(Server::new(&http, "not a url", "").is_err());
        assert_eq!(Server::new(&http, "http://127.0.0.1:8200/", "").unwrap().base, "http://127.0.0.1:8200");
    }

    #[tokio::test]
    async fn an_unknown_engine_or_auth_method_is_invalid() {
        let http = reqwest::Client::new();
        let server = Server::new(&http, "http://127.0.0.1:9", "").unwrap();
        let engine = VaultEngine { name: "kv-v9".into(), path: "kv".into() };
        let e = server.read_field(&Auth::Token("t"), &engine, "p", "f", FieldMissing::NotFound).await.unwrap_err();
        assert!(e.to_string().contains("kv-v9"), "{e}");
        let secret: Secret = serde_json::from_str(
            r#"{"vault": {"server": {"url": "http://127.0.0.1:9", "auth": {"name": "approle", "path": "x"}}}}"#,
        )
        .unwrap();
        let e = VaultResolver.resolve(&secret, &http).await.unwrap_err();
        assert!(e.to_string().contains("approle"), "{e}");
    }
}
