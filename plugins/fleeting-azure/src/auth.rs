//! Microsoft Entra ID access tokens for Azure Resource Manager: a service principal's client
//! secret (`AZURE_TENANT_ID`, `AZURE_CLIENT_ID`, `AZURE_CLIENT_SECRET`, optionally
//! `AZURE_AUTHORITY_HOST` — the variables azidentity reads, visible only when granted), else
//! the managed identity of the VM the runner is on (the instance metadata service; reachable
//! only when `169.254.169.254` is in `allow_hosts`; `AZURE_CLIENT_ID` picks a user-assigned
//! identity). Tokens are refreshed five minutes before they expire.
//!
//! The docker+machine mode may name the service principal itself (docker-machine's
//! `azure-client-id` / `azure-client-secret`) and the environment's authority; without
//! `AZURE_TENANT_ID` the tenant is found as docker-machine finds it: from the
//! `WWW-Authenticate` header of an unauthenticated Get Subscription.
//!
//! Owns: getting and caching tokens. Must not touch: ARM calls.

use cloud_common::http::{self, Request};

/// Why no token could be had.
#[derive(Debug, Clone)]
pub struct AuthError(pub String);

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

/// A bearer token and when it expires.
#[derive(Clone)]
struct Token {
    value: String,
    expires_at: u64,
}

/// Tokens for one resource (ARM).
pub struct Auth {
    /// `https://management.azure.com/` (the token audience).
    resource: String,
    token: Option<Token>,
    /// The authority when `AZURE_AUTHORITY_HOST` is not granted.
    authority: String,
    /// A service principal named in the configuration (id, secret), before the environment's.
    principal: Option<(String, String)>,
    /// Where to find the tenant when `AZURE_TENANT_ID` is not granted (a subscription's URL).
    tenant_lookup: Option<String>,
    /// The tenant found there.
    tenant: Option<String>,
}

#[derive(serde::Deserialize)]
struct TokenAnswer {
    access_token: String,
    #[serde(default)]
    expires_in: Option<serde_json::Value>,
    #[serde(default)]
    expires_on: Option<serde_json::Value>,
}

#[derive(serde::Deserialize, Default)]
struct ErrorAnswer {
    #[serde(default)]
    error: serde_json::Value,
    #[serde(default)]
    error_description: Option<String>,
}

fn number(v: &Option<serde_json::Value>) -> Option<u64> {
    match v.as_ref()? {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

impl Auth {
    /// Tokens for `resource`.
    pub fn new(resource: &str) -> Auth {
        Auth {
            resource: resource.to_string(),
            token: None,
            authority: "https://login.microsoftonline.com".into(),
            principal: None,
            tenant_lookup: None,
            tenant: None,
        }
    }

    /// Tokens for `resource` from `authority`, with the service principal `principal` when
    /// given; the tenant, unless granted, from the subscription at `subscription_url`.
    pub fn for_machines(
        resource: &str,
        authority: &str,
        principal: Option<(String, String)>,
        subscription_url: String,
    ) -> Auth {
        Auth {
            authority: authority.to_string(),
            principal,
            tenant_lookup: Some(subscription_url),
            ..Auth::new(resource)
        }
    }

    /// The tenant: `AZURE_TENANT_ID`, else the one the subscription's ARM answer names.
    fn tenant(&mut self) -> Result<Option<String>, AuthError> {
        if let Some(tenant) = env("AZURE_TENANT_ID").or_else(|| self.tenant.clone()) {
            return Ok(Some(tenant));
        }
        let Some(url) = self.tenant_lookup.clone() else { return Ok(None) };
        let response = http::send(&Request::new("GET", url.clone()))
            .map_err(|e| AuthError(format!("finding the tenant of the subscription ({url}): {e}")))?;
        let header = response.header("www-authenticate").unwrap_or_default();
        let tenant = tenant_of(header).ok_or_else(|| {
            AuthError(format!(
                "finding the tenant of the subscription: {url} answered HTTP {} without a tenant in WWW-Authenticate                  ({header:?}); grant AZURE_TENANT_ID",
                response.status
            ))
        })?;
        self.tenant = Some(tenant.clone());
        Ok(Some(tenant))
    }

    /// Drop the cached token (the server refused it).
    pub fn invalidate(&mut self) {
        self.token = None;
    }

    /// A valid bearer token.
    pub fn bearer(&mut self) -> Result<String, AuthError> {
        let now = cloud_common::now_unix();
        if let Some(token) = self.token.as_ref().filter(|t| t.expires_at > now + 300) {
            return Ok(token.value.clone());
        }
        let principal = self.principal.clone().or_else(|| env("AZURE_CLIENT_ID").zip(env("AZURE_CLIENT_SECRET")));
        let tenant = if principal.is_some() { self.tenant()? } else { None };
        let token = match (tenant, principal) {
            (Some(tenant), Some((client, secret))) => self.client_secret(&tenant, &client, &secret)?,
            _ => self.managed_identity().map_err(|e| {
                AuthError(format!(
                    "no Azure credentials: AZURE_TENANT_ID, AZURE_CLIENT_ID and AZURE_CLIENT_SECRET are not all granted, and the managed identity failed: {}",
                    e.0
                ))
            })?,
        };
        self.token = Some(token.clone());
        Ok(token.value)
    }

    fn answer(&self, response: http::Response, what: &str) -> Result<Token, AuthError> {
        if response.status != 200 {
            let error: ErrorAnswer = serde_json::from_slice(&response.body).unwrap_or_default();
            let code = match &error.error {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Object(o) => o.get("code").and_then(|c| c.as_str()).unwrap_or_default().to_string(),
                _ => String::new(),
            };
            let detail = error.error_description.unwrap_or_else(|| response.text().chars().take(300).collect());
            return Err(AuthError(format!("{what} refused (HTTP {}): {code} {detail}", response.status)));
        }
        let answer: TokenAnswer =
            serde_json::from_slice(&response.body).map_err(|e| AuthError(format!("{what}: bad token answer: {e}")))?;
        let now = cloud_common::now_unix();
        let expires_at =
            number(&answer.expires_on).or_else(|| number(&answer.expires_in).map(|s| now + s)).unwrap_or(now + 600);
        Ok(Token { value: answer.access_token, expires_at })
    }

    fn client_secret(&self, tenant: &str, client: &str, secret: &str) -> Result<Token, AuthError> {
        let authority = env("AZURE_AUTHORITY_HOST").unwrap_or_else(|| self.authority.clone());
        let url = format!("{}/{tenant}/oauth2/v2.0/token", authority.trim_end_matches('/'));
        let scope = format!("{}/.default", self.resource.trim_end_matches('/'));
        let body = cloud_common::form_encode(&[
            ("grant_type", "client_credentials"),
            ("client_id", client),
            ("client_secret", secret),
            ("scope", &scope),
        ]);
        let response = http::send(
            &Request::new("POST", url).header("content-type", "application/x-www-form-urlencoded").body(body),
        )
        .map_err(|e| AuthError(format!("client secret of {client}: {e}")))?;
        self.answer(response, &format!("the client secret of {client}"))
    }

    fn managed_identity(&self) -> Result<Token, AuthError> {
        let base = env("AZURE_IMDS_ENDPOINT").unwrap_or_else(|| "http://169.254.169.254".into());
        let mut url = format!(
            "{}/metadata/identity/oauth2/token?api-version=2018-02-01&resource={}",
            base.trim_end_matches('/'),
            cloud_common::percent_encode(&self.resource)
        );
        if let Some(client) = env("AZURE_CLIENT_ID") {
            url.push_str(&format!("&client_id={}", cloud_common::percent_encode(&client)));
        }
        let response = http::send(&Request::new("GET", url).header("metadata", "true"))
            .map_err(|e| AuthError(format!("managed identity: {e}")))?;
        self.answer(response, "the managed identity")
    }
}

/// The tenant in an ARM `WWW-Authenticate` header
/// (`Bearer authorization_uri="https://login.windows.net/<tenant>", error=...`).
fn tenant_of(header: &str) -> Option<String> {
    let uri = header.split("authorization_uri=\"").nth(1)?.split('"').next()?;
    let tenant = uri.trim_end_matches('/').rsplit('/').next()?;
    (!tenant.is_empty() && tenant.chars().all(|c| c.is_ascii_hexdigit() || c == '-')).then(|| tenant.to_string())
}
