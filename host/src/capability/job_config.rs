//! `runway:host/job-config@0.3.0`: an executor moves the job it prepares before its stages are
//! written (the custom executor's `config_exec` output). The executor boundary puts a
//! [`Reconfigure`] in the [`CallContext`] of `prepare` calls; this capability hands the
//! plugin's overrides to it and its answer back, and refuses calls made at any other time.
//!
//! Owns: [`Reconfigure`] with its plain types ([`JobOverrides`], [`Replanned`],
//! [`ReconfigureError`]) and the
//! `job-config` host trait on [`JobView`]. Must not touch: planning itself (the job module
//! implements [`Reconfigure`]), plugins or stores.

use crate::bindings::executor::runway::host0_3_0::job_config::{Host, Overrides, Planned};
use crate::capability::job::JobView;

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

/// Why an executor's overrides were not used (the plugin gets the text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReconfigureError {
    /// The job is not being prepared (any more).
    #[error("the job can only be reconfigured while it is prepared")]
    NotPreparing,
    /// A shell stage scripts cannot be written for.
    #[error("shell {0:?} is not supported (bash, sh)")]
    UnsupportedShell(String),
    /// The job cannot be planned with the overrides: why, for the plugin's log.
    #[error("{0}")]
    Plan(String),
}

/// Plans the job being prepared again; what follows (its stages) uses the last plan made.
pub trait Reconfigure: Send + Sync {
    /// Plan again with `overrides`, or say why they cannot be used.
    fn reconfigure(&self, overrides: JobOverrides) -> Result<Replanned, ReconfigureError>;

    /// The job as GitLab sent it, as JSON.
    fn response(&self) -> Option<String>;
}

impl Host for JobView<'_> {
    async fn reconfigure(&mut self, overrides: Overrides) -> wasmtime::Result<Result<Planned, String>> {
        let Some(replan) = &self.call.reconfigure else {
            return Ok(Err(ReconfigureError::NotPreparing.to_string()));
        };
        let Overrides { builds_dir, cache_dir, builds_dir_is_shared, hostname, shell } = overrides;
        let overrides = JobOverrides { builds_dir, cache_dir, builds_dir_is_shared, hostname, shell };
        Ok(replan
            .reconfigure(overrides)
            .map(|p| Planned {
                builds_dir: p.builds_dir,
                project_dir: p.project_dir,
                cache_dir: p.cache_dir,
                variables: p.variables,
            })
            .map_err(|e| e.to_string()))
    }

    async fn response(&mut self) -> wasmtime::Result<Option<String>> {
        Ok(self.call.reconfigure.as_ref().and_then(|r| r.response()))
    }
}
