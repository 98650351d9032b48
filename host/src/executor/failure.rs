//! Why an executor step failed, in the executor boundary's own terms: the plugin's error
//! values (invalid configuration, unavailable, canceled, other) and sandbox failures of the
//! plugin itself.
//!
//! Owns: [`ExecutorFailure`] and its mapping from the WIT `executor-error`. Must not touch:
//! jobs (which decide what a failure means for the job), sessions.

use crate::bindings::executor::runway::executor0_1_0::types::ExecutorError;
use crate::plugin::{bound_message, PluginError};

/// Why an executor step failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecutorFailure {
    /// The plugin misbehaved (trap, timeout, memory limit): a system failure, and its
    /// instance cannot be used again.
    #[error("{0}")]
    Plugin(PluginError),
    /// config.toml's section for this executor is wrong (`runner_configuration_error`).
    #[error("invalid executor configuration: {0}")]
    InvalidConfig(String),
    /// The environment could not be created or reached.
    #[error("executor unavailable: {0}")]
    Unavailable(String),
    /// The job was canceled or ran out of time while the executor waited.
    #[error("canceled")]
    Canceled,
    /// Anything else the executor reported.
    #[error("{0}")]
    Other(String),
}

impl ExecutorFailure {
    /// Did the plugin itself fail (so its instance is unusable)?
    pub fn is_plugin_failure(&self) -> bool {
        matches!(self, ExecutorFailure::Plugin(_))
    }
}

/// The plugin's error value, its message cut to a sane length (`plugin::MAX_PLUGIN_MESSAGE`)
/// before it can reach the job log, the runner log or a job update.
impl From<ExecutorError> for ExecutorFailure {
    fn from(error: ExecutorError) -> Self {
        match error {
            ExecutorError::InvalidConfig(m) => ExecutorFailure::InvalidConfig(bound_message(m)),
            ExecutorError::Unavailable(m) => ExecutorFailure::Unavailable(bound_message(m)),
            ExecutorError::Canceled => ExecutorFailure::Canceled,
            ExecutorError::Other(m) => ExecutorFailure::Other(bound_message(m)),
        }
    }
}

impl From<PluginError> for ExecutorFailure {
    fn from(error: PluginError) -> Self {
        ExecutorFailure::Plugin(error)
    }
}
