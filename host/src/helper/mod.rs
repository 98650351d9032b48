//! The helper commands that run INSIDE the job environment, as gitlab-runner's helper binary
//! does there: `runway artifacts-uploader`, `artifacts-downloader`, `cache-archiver` and
//! `cache-extractor`, with gitlab-runner's flags. The stage scripts (`script`) call them in the
//! project directory; what they print goes to the job log through the stage's output.
//!
//! Why a helper in the environment rather than streams through the host: the bytes of
//! artifacts and caches are produced and consumed where the files are (a container, a cloud
//! instance), and travel from there straight to GitLab or object storage — the manager only
//! writes the commands, with pre-signed cache URLs, so no storage credentials reach the job
//! and no archive crosses the manager (docs/artifacts-and-caches.md).
//!
//! Owns: the four commands, their retries and their log lines. Must not touch: job scripts
//! (`script` writes the calls), the manager, plugins. Archives are `archive`'s; the GitLab
//! artifacts calls are `gitlab::client::artifacts`.

pub mod artifacts;
pub mod cache;
pub mod command;
mod output;
mod transfer;

pub use output::{error, info, warning};

/// Why a helper command failed: printed as its `ERROR:` line before it exits 1.
/// Only a person reads it; the commands branch on `transfer::StorageError` and the GitLab
/// client's outcomes, never on this text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HelperError(pub String);
