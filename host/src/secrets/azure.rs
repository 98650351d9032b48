//! `azure_key_vault`: gitlab-runner's Azure Key Vault resolver. The job's JWT is a federated
//! client assertion: Microsoft identity platform's client credentials grant
//! (`POST <authority>/<tenant>/oauth2/v2.0/token`, `client_assertion_type`
//! `urn:ietf:params:oauth:client-assertion-type:jwt-bearer`, scope
//! `https://vault.azure.net/.default`) gives an access token, then Key Vault's Get Secret
//! (`GET <vault url>/secrets/<name>/<version>?api-version=7.4`) gives the value.
//!
//! The authority is `https://login.microsoftonline.com` unless the runner's environment sets
//! `AZURE_AUTHORITY_HOST` (as Azure's SDKs read it: sovereign clouds, tests); the vault's URL
//! comes with the secret. Owns these two requests; must not write the job log or keep a value.

use std::time::Duration;

use serde_json::Value;

use crate::payload::secrets::{AzureKeyVaultSecret, Secret};
use crate::secrets::vault::error_chain;
use crate::secrets::{Resolved, Resolver, SecretError};

const TIMEOUT: Duration = Duration::from_secs(30);
const AUTHORITY: &str = "https://login.microsoftonline.com";
/// Key Vault's REST API version.
pub const API_VERSION: &str = "7.4";

/// The resolver (the authority is read from the runner's environment when a secret is read).
pub struct AzureKeyVault;

impl Resolver for AzureKeyVault {
    /// gitlab-runner registers this one as `azure-key-vault` (its job log says so).
    fn name(&self) -> &'static str {
        "azure-key-vault"
    }

    fn supports(&self, secret: &Secret) -> bool {
        secret.azure_key_vault.is_some()
    }

    fn resolve<'a>(&'a self, secret: &'a Secret, http: &'a reqwest::Client) -> Resolved<'a> {
        Box::pin(async move {
            let authority = authority(&|key| std::env::var(key).ok());
            match &secret.azure_key_vault {
                Some(azure) => read(azure, http, &authority).await,
                None => Err(SecretError::Invalid("the secret has no azure_key_vault".into())),
            }
        })
    }
}

/// The authority host: `AZURE_AUTHORITY_HOST` from `env`, else Microsoft's public cloud.
pub fn authority(env: &dyn Fn(&str) -> Option<String>) -> String {
    env("AZURE_AUTHORITY_HOST")
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| AUTHORITY.to_string())
        .trim_end_matches('/')
        .to_string()
}

fn unreachable(server: &str, e: reqwest::Error) -> SecretError {
    SecretError::Unreachable { server: server.to_string(), reason: error_chain(&e.without_url()) }
}

/// Read `secret`, signing in at `authority`.
pub async fn read(
    secret: &AzureKeyVaultSecret,
    http: &reqwest::Client,
    authority: &str,
) -> Result<String, SecretError> {
    for (what, value) in
        [("tenant_id", &secret.server.tenant_id), ("client_id", &secret.server.client_id), ("url", &secret.server.url)]
    {
        if value.trim().is_empty() {
            return Err(SecretError::Invalid(format!(
                "azure_key_vault secret {:?}: server {what} is empty",
                secret.name
            )));
        }
    }
    let token = sign_in(http, authority, secret).await?;
    get_secret(http, secret, &token).await
}

/// The client credentials grant with the job's JWT as the client assertion.
async fn sign_in(http: &reqwest::Client, authority: &str, secret: &AzureKeyVaultSecret) -> Result<String, SecretError> {
    let server = format!("{authority}/{}", secret.server.tenant_id);
    let form = [
        ("client_assertion_type", "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"),
        ("client_assertion", secret.server.jwt.as_str()),
        ("client_id", secret.server.client_id.as_str()),
        ("grant_type", "client_credentials"),
        ("scope", "https://vault.azure.net/.default"),
    ];
    let response = http
        .post(format!("{server}/oauth2/v2.0/token"))
        .form(&form)
        .timeout(TIMEOUT)
        .send()
        .await
        .map_err(|e| unreachable(&server, e))?;
    let status = response.status().as_u16();
    let answer: Value = response.json().await.unwrap_or(Value::Null);
    if !(200..300).contains(&status) {
        let error = answer["error"].as_str().unwrap_or("error");
        let description = answer["error_description"].as_str().unwrap_or_default();
        // The description's first line carries the AADSTS code and reason; the rest is trace IDs.
        let description = description.lines().next().unwrap_or_default();
        return Err(SecretError::Refused {
            server,
            status,
            reason: format!("getting a token for client {} failed: {error}: {description}", secret.server.client_id),
        });
    }
    match answer["access_token"].as_str() {
        Some(token) if !token.is_empty() => Ok(token.to_string()),
        _ => Err(SecretError::Unreachable { server, reason: "the token answer has no access_token".into() }),
    }
}

/// Key Vault's Get Secret.
async fn get_secret(http: &reqwest::Client, secret: &AzureKeyVaultSecret, token: &str) -> Result<String, SecretError> {
    let server = secret.server.url.trim_end_matches('/').to_string();
    let segment = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let url =
        format!("{server}/secrets/{}/{}?api-version={API_VERSION}", segment(&secret.name), segment(&secret.version));
    let response =
        http.get(url).bearer_auth(token).timeout(TIMEOUT).send().await.map_err(|e| unreachable(&server, e))?;
    let status = response.status().as_u16();
    let answer: Value = response.json().await.unwrap_or(Value::Null);
    if !(200..300).contains(&status) {
        let code = answer["error"]["code"].as_str().unwrap_or_default();
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        if status == 404 {
            let version =
                if secret.version.is_empty() { String::new() } else { format!(" version {:?}", secret.version) };
            return Err(SecretError::NotFound {
                server,
                what: format!("secret {:?}{version} ({code}: {message})", secret.name),
            });
        }
        return Err(SecretError::Refused {
            server,
            status,
            reason: format!("getting secret {:?} failed: {code}: {message}", secret.name),
        });
    }
    match answer["value"].as_str() {
        Some(value) => Ok(value.to_string()),
        None => Err(SecretError::NotFound { server, what: format!("secret {:?} (no value)", secret.name) }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authority_follows_the_sdk_variable() {
        assert_eq!(authority(&|_| None), AUTHORITY);
        let local = |k: &str| (k == "AZURE_AUTHORITY_HOST").then(|| "http://127.0.0.1:9/".to_string());
        assert_eq!(authority(&local), "http://127.0.0.1:9");
    }
}
