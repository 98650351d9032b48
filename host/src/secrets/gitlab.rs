//! The `gitlab_secrets_manager` resolver: GitLab's own secrets, kept in OpenBao, read as
//! gitlab-runner's resolver reads them — one KV read carrying OpenBao's inline
//! authentication (the job's JWT and role, sent to the login path `inline_auth.path`, or
//! `auth/<auth_mount>/login` from older GitLab), no token kept.
//!
//! Owns: that resolver. Must not touch: the Vault wire itself (`super::vault`).

use super::vault::{Auth, FieldMissing, Server};
use super::{Resolved, Resolver, SecretError};
use crate::payload::secrets::Secret;

/// The `gitlab_secrets_manager` resolver.
pub struct GitLabSecretsManagerResolver;

impl Resolver for GitLabSecretsManagerResolver {
    fn name(&self) -> &'static str {
        "gitlab_secrets_manager"
    }

    fn supports(&self, secret: &Secret) -> bool {
        secret.gitlab_secrets_manager.is_some()
    }

    fn resolve<'a>(&'a self, secret: &'a Secret, http: &'a reqwest::Client) -> Resolved<'a> {
        Box::pin(async move {
            let gsm = secret
                .gitlab_secrets_manager
                .as_ref()
                .ok_or_else(|| SecretError::Invalid("not a gitlab_secrets_manager secret".into()))?;
            let inline = &gsm.server.inline_auth;
            let path = if inline.path.is_empty() {
                format!("auth/{}/login", inline.auth_mount.trim_matches('/'))
            } else {
                inline.path.clone()
            };
            let mut missing = Vec::new();
            if inline.path.is_empty() && inline.auth_mount.is_empty() {
                missing.push("path");
            }
            if inline.jwt.is_empty() {
                missing.push("JWT");
            }
            if inline.role.is_empty() {
                missing.push("role");
            }
            if !missing.is_empty() {
                return Err(SecretError::Invalid(format!(
                    "configuring inline auth: no inline auth {}",
                    missing.join(", ")
                )));
            }
            let server = Server::new(http, &gsm.server.url, "")?;
            let auth = Auth::Inline { path: &path, parameters: vec![("jwt", &inline.jwt), ("role", &inline.role)] };
            server.read_field(&auth, &gsm.engine, &gsm.path, &gsm.field, FieldMissing::Invalid).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn inline_auth_needs_its_jwt_and_role() {
        let secret: Secret = serde_json::from_str(
            r#"{"gitlab_secrets_manager": {"server": {"url": "http://127.0.0.1:9",
                "inline_auth": {"auth_mount": "gitlab_rails_jwt", "jwt": ""}},
                "engine": {"name": "kv-v2", "path": "secrets"}, "path": "p", "field": "value"}}"#,
        )
        .unwrap();
        let e = GitLabSecretsManagerResolver.resolve(&secret, &reqwest::Client::new()).await.unwrap_err();
        assert_eq!(e.to_string(), "configuring inline auth: no inline auth JWT, role");
    }
}
