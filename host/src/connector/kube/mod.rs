//! Kubernetes API servers for the kubernetes executor: [`config`] resolves where the server is
//! and how to authenticate (explicit host, in-cluster service account, kubeconfig), [`client`]
//! carries REST calls and watch streams, [`exec`] runs commands in a pod's containers over the
//! `pods/exec` WebSocket (`v5.channel.k8s.io`), [`terminal`] opens an interactive one with a tty
//! (GitLab's web terminal), and [`PodShell`] puts one container behind the
//! [`super::ShellHost`] trait, so a stage runs detached in the pod exactly as it does over SSH
//! (`super::detached`): started in its own session, its output in a log file in the pod,
//! followed again from any byte offset by this runner or the next.
//!
//! Owns: the Kubernetes connection, its TLS and credentials, and [`KubeError`]. Must not touch:
//! WIT types or capabilities (`capability::kube` maps our types), plugins, what a pod holds
//! (the plugin decides).

pub mod client;
pub mod config;
pub mod exec;
pub mod terminal;

pub use client::{KubeClient, WatchStream};
pub use config::{ClusterSettings, Endpoint};
pub use exec::PodShell;

/// Why a Kubernetes operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeError {
    /// No usable configuration (missing file, bad certificate, nothing configured).
    #[error("{0}")]
    Config(String),
    /// The server could not be reached or the connection dropped.
    #[error("{0}")]
    Connection(String),
    /// The server refused the call with a `Status`.
    #[error("{message} ({status} {reason})")]
    Api {
        /// HTTP status.
        status: u16,
        /// The Status `reason`.
        reason: String,
        /// The Status `message`.
        message: String,
    },
    /// The job was cancelled or timed out.
    #[error("canceled")]
    Canceled,
    /// An answer was larger than the limit in bytes.
    #[error("larger than the {0}-byte limit")]
    TooLarge(u32),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

impl KubeError {
    /// The error of an HTTP failure status with its body (a `Status` object when the server
    /// is a Kubernetes API server).
    pub fn from_status(status: u16, body: &[u8]) -> KubeError {
        let parsed: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        let text = |key: &str| parsed[key].as_str().unwrap_or_default().to_string();
        let message = match text("message") {
            m if m.is_empty() => String::from_utf8_lossy(&body[..body.len().min(512)]).trim().to_string(),
            m => m,
        };
        KubeError::Api { status, reason: text("reason"), message }
    }
}
