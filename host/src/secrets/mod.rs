//! The job's `secrets:` resolved before its first stage, as gitlab-runner's secrets resolver
//! does: one [`Resolver`] per secret store (HashiCorp Vault and GitLab's secrets manager on
//! OpenBao, AWS Secrets Manager, Google Cloud Secret Manager, Azure Key Vault), each reading
//! one [`Secret`] over HTTPS with the job's ID token, and [`SecretError`], what a failed read
//! tells the job log: the secret, the server and the server's reason — never a value.
//!
//! Owns talking to secret stores. Must not touch the job log, the job's variables, stores or
//! executors: the caller turns values into masked (file) variables; a resolver only reads.

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
    /// `azure_key_vault`).
    fn name(&self) -> &'static str;

    /// Whether `secret` is read from this store (its key is set).
    fn supports(&self, secret: &Secret) -> bool;

    /// Read the value of `secret` (its variables already expanded) over `http`.
    fn resolve<'a>(&'a self, secret: &'a Secret, http: &'a reqwest::Client) -> Resolved<'a>;
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
