//! Files the runner keeps on disk: [`atomic`] writes (temp file in the same directory, fsync,
//! optional mode, rename, fsync of the directory) used by every writer of runner state, and
//! the autoscaled fleet's state file ([`fleet_state`]), and the job store ([`jobs`]: what a
//! manager keeps about each running job so it can be resumed after a crash, on files or in Redis).
//!
//! `store` imports nothing of the crate (it is a leaf, so `config`, `capability` and `plugin`
//! can write through it without a cycle): it knows how to keep bytes safe on disk, never what
//! a config, an engine snapshot, a plugin or a job means (callers hand it bytes or serde values).

pub mod atomic;
pub mod fleet_state;
pub mod jobs;

use std::path::PathBuf;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file system call failed.
    #[error("{action} {}: {source}", .path.display())]
    Io {
        /// What was being done (`writing`, `creating the directory of`, ...).
        action: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A value could not be encoded or decoded.
    #[error("{action} {}: {source}", .path.display())]
    Json {
        /// What was being done (`encoding`, `decoding`).
        action: &'static str,
        /// The file concerned.
        path: PathBuf,
        /// The underlying error.
        source: serde_json::Error,
    },
}

impl StoreError {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> StoreError {
        let path = path.into();
        move |source| StoreError::Io { action, path, source }
    }

    /// The underlying I/O error kind, when the failure was an I/O error.
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match self {
            StoreError::Io { source, .. } => Some(source.kind()),
            StoreError::Json { .. } => None,
        }
    }
}
