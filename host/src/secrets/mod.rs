//! The job's `secrets:` resolved before its first stage, as gitlab-runner's secrets resolver
//! does: one [`Resolver`] per secret store (HashiCorp Vault and GitLab's secrets manager on
//! OpenBao, AWS Secrets Manager, Google Cloud Secret Manager, Azure Key Vault), each reading
//! one [`Secret`] over HTTPS with the job's ID token, and [`SecretError`], what a failed read
//! tells the job log: the secret, the server and the server's reason — never a value.
//!
//! [`RESOLVERS`] is the registry, a plain list in gitlab-runner's registration order: the
//! first resolver that [`Resolver::supports`] a secret reads it ([`resolver_for`]).
//!
//! Owns talking to secret stores. Must not touch the job log, the job's variables, stores or
//! executors: the caller (`crate::job`'s resolution step) writes the trace lines, turns values
//! into masked (file) variables and fails the job; a resolver only reads.

pub mod aws;
pub mod azure;
pub mod gcp;
pub mod gitlab;
pub mod vault;

use std::future::Future;
use std::pin::Pin;

use crate::payload::secrets::Secret;

/// What a resolver's read gives back.
pub type Resolved<'a> = Pin<Box<dyn Future<Output = Result<String, SecretError>> + Send + 'a>>;

/// One secret store (gitlab-runner's `SecretResolver`): it says whether a secret is its own,
/// and reads it.
pub trait Resolver: Send + Sync {
    /// gitlab-runner's name of the resolver, as the job log names it (`vault`,
    /// `gitlab_secrets_manager`, `aws_secrets_manager`, `gcp_secret_manager`,
    /// `azure-key-vault` — gitlab-runner spells that one with dashes).
    fn name(&self) -> &'static str;

    /// Whether `secret` is read from this store (its key is set).
    fn supports(&self, secret: &Secret) -> bool;

    /// Read the value of `secret` (its variables already expanded) over `http`.
    fn resolve<'a>(&'a self, secret: &'a Secret, http: &'a reqwest::Client) -> Resolved<'a>;
}

/// Every resolver, in the order they are asked (gitlab-runner's registry). Adding a
/// resolver is one line here.
#[rustfmt::skip]
pub static RESOLVERS: &[&dyn Resolver] = &[
    &vault::VaultResolver,
    &gitlab::GitLabSecretsManagerResolver,
    &aws::AwsSecretsManager,
    &azure::AzureKeyVault,
    &gcp::GcpSecretManager,
];

/// The resolver that reads `secret`: the first of [`RESOLVERS`] that supports it; `None`
/// when none does (gitlab-runner warns and leaves the variable out).
pub fn resolver_for(secret: &Secret) -> Option<&'static dyn Resolver> {
    RESOLVERS.iter().copied().find(|r| r.supports(secret))
}

/// How a failed read fails the job, as gitlab-runner classifies it (`helpers/secrets`'
/// `ResolvingConfigurationError` and `ResolvingExternalDependencyError`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureClass {
    /// The job's or the store's configuration: the store answered 400, 401, 403 or 404
    /// (`runner_configuration_error`).
    Configuration,
    /// The store itself failed: it answered 5xx (`runner_external_dependency_failure`).
    ExternalDependency,
    /// Anything else — the store unreachable, a missing secret or field, an unusable
    /// description (gitlab-runner's unclassified errors: `runner_system_failure`).
    Unclassified,
}

/// Why a secret was not read. Its text names the server and gives the server's reason; it
/// never holds the secret's value or a token.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The store answered that the secret (or its version, or its field) is not there
    /// (gitlab-runner's `ErrSecretNotFound`: `FF_SECRET_RESOLVING_FAILS_IF_MISSING` decides
    /// whether the job fails).
    #[error("secret not found: {what} on {server}")]
    NotFound {
        /// The store's address.
        server: String,
        /// What is missing: the path, version or field.
        what: String,
    },
    /// The store refused the request or the login (a wrong role, an expired token, no
    /// permission).
    #[error("{server}: {status}: {reason}")]
    Refused {
        /// The store's address.
        server: String,
        /// The HTTP status.
        status: u16,
        /// The store's own reason, from its error body.
        reason: String,
    },
    /// The store could not be reached or its answer could not be read.
    #[error("{server}: {reason}")]
    Unreachable {
        /// The store's address.
        server: String,
        /// What went wrong, for a person.
        reason: String,
    },
    /// The secret's description in the job is unusable (a missing field, an unknown engine
    /// or auth method).
    #[error("{0}")]
    Invalid(String),
}

impl SecretError {
    /// How this failure fails the job.
    pub fn class(&self) -> FailureClass {
        match self {
            SecretError::Refused { status: 400 | 401 | 403 | 404, .. } => FailureClass::Configuration,
            SecretError::Refused { status, .. } if *status >= 500 => FailureClass::ExternalDependency,
            _ => FailureClass::Unclassified,
        }
    }

    /// Whether the store said the secret (or its field) is not there: the job fails only with
    /// `FF_SECRET_RESOLVING_FAILS_IF_MISSING` on (the default).
    pub fn is_not_found(&self) -> bool {
        matches!(self, SecretError::NotFound { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_classified_as_gitlab_runner_does() {
        let refused = |status| SecretError::Refused { server: "s".into(), status, reason: "r".into() };
        assert_eq!(refused(403).class(), FailureClass::Configuration);
        assert_eq!(refused(400).class(), FailureClass::Configuration);
        assert_eq!(refused(503).class(), FailureClass::ExternalDependency);
        assert_eq!(refused(429).class(), FailureClass::Unclassified);
        let gone = SecretError::Unreachable { server: "s".into(), reason: "refused".into() };
        assert_eq!(gone.class(), FailureClass::Unclassified);
        assert!(SecretError::NotFound { server: "s".into(), what: "p".into() }.is_not_found());
    }
}
