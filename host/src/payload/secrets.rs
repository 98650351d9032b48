//! The job payload's `secrets:` (gitlab-runner's `spec.Secrets`): one entry per CI variable to
//! fill, each naming the one secret store it comes from — HashiCorp Vault (`vault`), GitLab's
//! own secrets manager (`gitlab_secrets_manager`, OpenBao behind it), AWS Secrets Manager,
//! Google Cloud Secret Manager or Azure Key Vault — and whether it becomes a file variable.
//! [`Secret::expand_variables`] expands the job's variables into the fields gitlab-runner
//! expands, with its defaults (the AWS role session name).
//!
//! Owns the wire shape only: no network, no resolving (that is `crate::secrets`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::null_default;

/// `secrets:` of a job: CI variable name → where its value lives.
pub type Secrets = BTreeMap<String, Secret>;

/// One entry of `secrets:`. GitLab sends exactly one store per entry.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Secret {
    /// HashiCorp Vault (or OpenBao).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vault: Option<VaultSecret>,
    /// Google Cloud Secret Manager.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gcp_secret_manager: Option<GcpSecretManagerSecret>,
    /// Azure Key Vault.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub azure_key_vault: Option<AzureKeyVaultSecret>,
    /// AWS Secrets Manager.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws_secrets_manager: Option<AwsSecret>,
    /// GitLab's secrets manager (OpenBao).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gitlab_secrets_manager: Option<GitLabSecretsManagerSecret>,
    /// `file:` — a file variable unless `false` (GitLab's default is a file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<bool>,
}

impl Secret {
    /// Whether the variable is a file variable (the default) or holds the value itself.
    pub fn is_file(&self) -> bool {
        self.file.unwrap_or(true)
    }

    /// Expand the job's variables (`lookup`) into the fields gitlab-runner expands, as it
    /// does before resolving. GitLab's secrets manager has no user input to expand.
    pub fn expand_variables(&mut self, lookup: &dyn Fn(&str) -> Option<String>) {
        let x = |s: &mut String| *s = super::variables::expand(s, lookup);
        if let Some(v) = &mut self.vault {
            x(&mut v.server.url);
            x(&mut v.server.namespace);
            x(&mut v.server.auth.name);
            x(&mut v.server.auth.path);
            for value in v.server.auth.data.values_mut() {
                let text = match &*value {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                *value = serde_json::Value::String(super::variables::expand(&text, lookup));
            }
            x(&mut v.engine.name);
            x(&mut v.engine.path);
            x(&mut v.path);
            x(&mut v.field);
        }
        if let Some(g) = &mut self.gcp_secret_manager {
            x(&mut g.name);
            x(&mut g.version);
            x(&mut g.server.project_number);
            x(&mut g.server.workload_identity_federation_pool_id);
            x(&mut g.server.workload_identity_federation_provider_id);
            x(&mut g.server.jwt);
        }
        if let Some(a) = &mut self.azure_key_vault {
            x(&mut a.server.jwt);
            x(&mut a.name);
            x(&mut a.version);
        }
        if let Some(a) = &mut self.aws_secrets_manager {
            for s in [
                &mut a.secret_id,
                &mut a.version_id,
                &mut a.version_stage,
                &mut a.field,
                &mut a.region,
                &mut a.role_arn,
                &mut a.role_session_name,
                &mut a.server.jwt,
                &mut a.server.region,
                &mut a.server.role_arn,
            ] {
                x(s);
            }
            if a.server.role_session_name.is_empty() {
                a.server.role_session_name = "${CI_JOB_ID}-${CI_PROJECT_ID}-${CI_SERVER_HOST}".to_string();
            }
            x(&mut a.server.role_session_name);
            // AWS allows 64 characters; cut on a character boundary.
            if let Some((cut, _)) = a.server.role_session_name.char_indices().nth(64) {
                a.server.role_session_name.truncate(cut);
            }
        }
    }
}

/// `vault:` — a secret of a KV engine (`kv-v1`, `kv-v2`) read with a token from an auth method.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct VaultSecret {
    /// The server and how to log in.
    #[serde(default, deserialize_with = "null_default")]
    pub server: VaultServer,
    /// The secrets engine: its kind (`name`) and mount (`path`).
    #[serde(default, deserialize_with = "null_default")]
    pub engine: VaultEngine,
    /// The secret's path under the engine's mount.
    #[serde(default, deserialize_with = "null_default")]
    pub path: String,
    /// The field of the secret's data to use.
    #[serde(default, deserialize_with = "null_default")]
    pub field: String,
}

/// `vault: server:`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct VaultServer {
    /// The server's URL.
    #[serde(default, deserialize_with = "null_default")]
    pub url: String,
    /// The auth method.
    #[serde(default, deserialize_with = "null_default")]
    pub auth: VaultAuth,
    /// The Vault Enterprise namespace (`X-Vault-Namespace`), empty for none.
    #[serde(default, deserialize_with = "null_default")]
    pub namespace: String,
}

/// `vault: server: auth:` — an auth method (`jwt`), where it is mounted and its login data
/// (`jwt`, `role`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct VaultAuth {
    /// The auth method's kind (`jwt`).
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    /// Where it is mounted (`jwt` → `auth/jwt/login`).
    #[serde(default, deserialize_with = "null_default")]
    pub path: String,
    /// Login data: `jwt` (usually `$VAULT_ID_TOKEN`, expanded), `role`.
    #[serde(default, deserialize_with = "null_default")]
    pub data: BTreeMap<String, serde_json::Value>,
}

/// `vault: engine:` — the secrets engine's kind (`kv-v1`, `kv-v2`) and mount path.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct VaultEngine {
    /// `kv-v1` or `kv-v2`.
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    /// The engine's mount path.
    #[serde(default, deserialize_with = "null_default")]
    pub path: String,
}

/// `gcp_secret_manager:` — a secret version read with a workload identity federation token.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GcpSecretManagerSecret {
    /// The secret's name.
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    /// The version (`latest` or a number).
    #[serde(default, deserialize_with = "null_default")]
    pub version: String,
    /// The project and the federation to exchange the job's JWT with.
    #[serde(default, deserialize_with = "null_default")]
    pub server: GcpSecretManagerServer,
}

/// `gcp_secret_manager: server:`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GcpSecretManagerServer {
    /// The project's number.
    #[serde(default, deserialize_with = "null_default")]
    pub project_number: String,
    /// The workload identity pool.
    #[serde(default, deserialize_with = "null_default")]
    pub workload_identity_federation_pool_id: String,
    /// The pool's provider.
    #[serde(default, deserialize_with = "null_default")]
    pub workload_identity_federation_provider_id: String,
    /// The job's ID token (expanded from a variable).
    #[serde(default, deserialize_with = "null_default")]
    pub jwt: String,
}

/// `aws_secrets_manager:` — a secret read with credentials from `AssumeRoleWithWebIdentity`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AwsSecret {
    /// The secret's name or ARN.
    #[serde(default, deserialize_with = "null_default")]
    pub secret_id: String,
    /// A version by ID.
    #[serde(default, deserialize_with = "null_default")]
    pub version_id: String,
    /// A version by stage (`AWSCURRENT`, ...).
    #[serde(default, deserialize_with = "null_default")]
    pub version_stage: String,
    /// A field of a JSON secret; empty for the whole string.
    #[serde(default, deserialize_with = "null_default")]
    pub field: String,
    /// The secret's region, over the server's.
    #[serde(default, deserialize_with = "null_default")]
    pub region: String,
    /// The role to assume, over the server's.
    #[serde(default, deserialize_with = "null_default")]
    pub role_arn: String,
    /// The session name, over the server's.
    #[serde(default, deserialize_with = "null_default")]
    pub role_session_name: String,
    /// Defaults and the job's JWT.
    #[serde(default, deserialize_with = "null_default")]
    pub server: AwsServer,
}

/// `aws_secrets_manager: server:`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AwsServer {
    /// The region.
    #[serde(default, deserialize_with = "null_default")]
    pub region: String,
    /// The job's ID token (expanded from a variable).
    #[serde(default, deserialize_with = "null_default")]
    pub jwt: String,
    /// The role to assume with it.
    #[serde(default, deserialize_with = "null_default")]
    pub role_arn: String,
    /// The session name; `${CI_JOB_ID}-${CI_PROJECT_ID}-${CI_SERVER_HOST}` (64 characters
    /// at most) when empty.
    #[serde(default, deserialize_with = "null_default")]
    pub role_session_name: String,
}

/// `azure_key_vault:` — a secret read with a token from a federated client assertion.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AzureKeyVaultSecret {
    /// The secret's name.
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    /// The version; empty for the latest.
    #[serde(default, deserialize_with = "null_default")]
    pub version: String,
    /// The vault and the application to sign in as.
    #[serde(default, deserialize_with = "null_default")]
    pub server: AzureKeyVaultServer,
}

/// `azure_key_vault: server:`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AzureKeyVaultServer {
    /// The application (client) ID.
    #[serde(default, deserialize_with = "null_default")]
    pub client_id: String,
    /// The directory (tenant) ID.
    #[serde(default, deserialize_with = "null_default")]
    pub tenant_id: String,
    /// The job's ID token (expanded from a variable).
    #[serde(default, deserialize_with = "null_default")]
    pub jwt: String,
    /// The vault's URL.
    #[serde(default, deserialize_with = "null_default")]
    pub url: String,
}

/// `gitlab_secrets_manager:` — GitLab's own secrets, in OpenBao, read with an inline JWT login.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GitLabSecretsManagerSecret {
    /// The OpenBao server and its login.
    #[serde(default, deserialize_with = "null_default")]
    pub server: GitLabSecretsManagerServer,
    /// The KV engine.
    #[serde(default, deserialize_with = "null_default")]
    pub engine: VaultEngine,
    /// The secret's path.
    #[serde(default, deserialize_with = "null_default")]
    pub path: String,
    /// The field of its data.
    #[serde(default, deserialize_with = "null_default")]
    pub field: String,
}

/// `gitlab_secrets_manager: server:`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GitLabSecretsManagerServer {
    /// OpenBao's URL.
    #[serde(default, deserialize_with = "null_default")]
    pub url: String,
    /// The login sent with each request.
    #[serde(default, deserialize_with = "null_default")]
    pub inline_auth: GitLabSecretsManagerInlineAuth,
}

/// `gitlab_secrets_manager: server: inline_auth:`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GitLabSecretsManagerInlineAuth {
    /// The full login path (newer GitLab).
    #[serde(default, deserialize_with = "null_default")]
    pub path: String,
    /// The job's JWT.
    #[serde(default, deserialize_with = "null_default")]
    pub jwt: String,
    /// The login role.
    #[serde(default, deserialize_with = "null_default")]
    pub role: String,
    /// Older GitLab: the auth mount, as `auth/<auth_mount>/login`.
    #[serde(default, deserialize_with = "null_default")]
    pub auth_mount: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vault_secret_decodes_and_expands() {
        let json = r#"{"DB": {"vault": {"server": {"url": "https://vault.example", "namespace": null,
            "auth": {"name": "jwt", "path": "jwt", "data": {"jwt": "$VAULT_ID_TOKEN", "role": "ci"}}},
            "engine": {"name": "kv-v2", "path": "kv"}, "path": "prod/db", "field": "password"}, "file": false}}"#;
        let mut secrets: Secrets = serde_json::from_str(json).unwrap();
        let db = secrets.get_mut("DB").unwrap();
        assert!(!db.is_file());
        db.expand_variables(&|k| (k == "VAULT_ID_TOKEN").then(|| "eyJ.x.y".to_string()));
        let vault = db.vault.as_ref().unwrap();
        assert_eq!(vault.server.auth.data["jwt"], "eyJ.x.y");
        assert_eq!(vault.engine.name, "kv-v2");
        assert_eq!(vault.field, "password");
    }

    #[test]
    fn the_aws_session_name_defaults_as_gitlab_runner_builds_it() {
        let json = r#"{"aws_secrets_manager": {"secret_id": "db", "server": {"region": "eu-west-1", "jwt": "$T"}}}"#;
        let mut secret: Secret = serde_json::from_str(json).unwrap();
        assert!(secret.is_file());
        let vars = |k: &str| match k {
            "CI_JOB_ID" => Some("17".to_string()),
            "CI_PROJECT_ID" => Some("4".to_string()),
            "CI_SERVER_HOST" => Some("x".repeat(80)),
            _ => None,
        };
        secret.expand_variables(&vars);
        let name = &secret.aws_secrets_manager.unwrap().server.role_session_name;
        assert_eq!(name.len(), 64);
        assert!(name.starts_with("17-4-xxx"));
    }
}
