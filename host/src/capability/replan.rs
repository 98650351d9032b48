//! What an executor may change about the job it prepares, and the job's side of that: the
//! plain types [`JobOverrides`] and [`Replanned`], the [`Reconfigure`] trait the job module
//! implements, and why a plan was refused ([`ReplanError`]). The call context carries a
//! [`Reconfigure`]; `runway:host/job-config` hands the plugin's overrides to it.
//!
//! Owns: these types. Must not touch: WIT bindings (the `job-config` capability converts),
//! planning itself (the job module), plugins or stores.

/// What an executor asks to change about the job it prepares; `None` keeps the setting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobOverrides {
    /// The builds directory.
    pub builds_dir: Option<String>,
    /// The cache directory.
    pub cache_dir: Option<String>,
    /// Whether concurrent jobs share the builds directory.
    pub builds_dir_is_shared: Option<bool>,
    /// The host name the job reports.
    pub hostname: Option<String>,
    /// The shell the stage scripts are written for.
    pub shell: Option<String>,
}

/// The job as planned again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replanned {
    /// Absolute builds directory.
    pub builds_dir: String,
    /// Absolute project directory.
    pub project_dir: String,
    /// Absolute cache directory.
    pub cache_dir: String,
    /// The job's variables as its scripts see them, in order.
    pub variables: Vec<(String, String)>,
}

/// Why the job could not be planned again; its text goes back to the plugin.
#[derive(Debug, thiserror::Error)]
pub enum ReplanError {
    /// The job is past its preparation (or was never being prepared).
    #[error("the job can only be reconfigured while it is prepared")]
    NotPreparing,
    /// The overrides name a shell the scripts cannot be written for.
    #[error("shell {0:?} is not supported (bash, sh)")]
    UnsupportedShell(String),
    /// The plan with the overrides is invalid (a relative builds directory, ...).
    #[error("{0}")]
    Plan(Box<dyn std::error::Error + Send + Sync>),
}

/// Plans the job being prepared again; what follows (its stages) uses the last plan made.
pub trait Reconfigure: Send + Sync {
    /// Plan again with `overrides`, or say why they cannot be used.
    fn reconfigure(&self, overrides: JobOverrides) -> Result<Replanned, ReplanError>;

    /// The job as GitLab sent it, as JSON.
    fn response(&self) -> Option<String>;
}
