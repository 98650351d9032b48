//! Failure reasons the runner reports in the final `PUT /jobs/:id` and their mapping onto what
//! the GitLab instance supports (§3.2, GitLab Runner's `failureReasonMapper`).

/// Why a job failed, as the runner attributes it (stored by its wire name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureReason {
    /// A user script exited non-zero.
    ScriptFailure,
    /// Executor/infrastructure error.
    RunnerSystemFailure,
    /// Job or stage timeout.
    JobExecutionTimeout,
    /// The job image could not be pulled.
    ImagePullFailure,
    /// A failure of no other kind.
    UnknownFailure,
    /// Bad runner or job configuration (`GIT_CLONE_PATH`, missing builds dir, ...).
    RunnerConfigurationError,
    /// An external dependency (registry, secrets provider, ...) failed.
    RunnerExternalDependencyFailure,
    /// The runner process was told to stop.
    RunnerInterrupted,
    /// Cancelled by the user (runner-internal; Rails moves the job to `canceled`).
    JobCanceled,
}

/// Reasons every GitLab accepts, whatever `features.failure_reasons` says.
const ALWAYS_SUPPORTED: [FailureReason; 3] =
    [FailureReason::ScriptFailure, FailureReason::RunnerSystemFailure, FailureReason::JobExecutionTimeout];

impl FailureReason {
    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::ScriptFailure => "script_failure",
            FailureReason::RunnerSystemFailure => "runner_system_failure",
            FailureReason::JobExecutionTimeout => "job_execution_timeout",
            FailureReason::ImagePullFailure => "image_pull_failure",
            FailureReason::UnknownFailure => "unknown_failure",
            FailureReason::RunnerConfigurationError => "runner_configuration_error",
            FailureReason::RunnerExternalDependencyFailure => "runner_external_dependency_failure",
            FailureReason::RunnerInterrupted => "runner_interrupted",
            FailureReason::JobCanceled => "job_canceled",
        }
    }

    /// What an instance that does not know this reason gets instead.
    fn fallback(self) -> FailureReason {
        match self {
            FailureReason::ImagePullFailure | FailureReason::RunnerExternalDependencyFailure => {
                FailureReason::RunnerSystemFailure
            }
            FailureReason::RunnerConfigurationError => FailureReason::ScriptFailure,
            _ => FailureReason::UnknownFailure,
        }
    }
}

impl std::fmt::Display for FailureReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `failure_reason` to send: `reason` when the instance supports it (`supported` is the
/// job's `features.failure_reasons`, plus the three always supported), else its fallback;
/// no reason means `script_failure`.
pub fn wire_reason(reason: Option<FailureReason>, supported: &[String]) -> String {
    let reason = reason.unwrap_or(FailureReason::ScriptFailure);
    let is_supported = ALWAYS_SUPPORTED.contains(&reason) || supported.iter().any(|s| s == reason.as_str());
    if is_supported { reason.as_str() } else { reason.fallback().as_str() }.to_string()
}

#[cfg(test)]
mod tests {
    use super::FailureReason::*;
    use super::*;

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn supported_reasons_pass_through() {
        let all = strings(&["image_pull_failure", "runner_configuration_error", "runner_interrupted", "job_canceled"]);
        assert_eq!(wire_reason(Some(ImagePullFailure), &all), "image_pull_failure");
        assert_eq!(wire_reason(Some(RunnerConfigurationError), &all), "runner_configuration_error");
        assert_eq!(wire_reason(Some(RunnerInterrupted), &all), "runner_interrupted");
        assert_eq!(wire_reason(Some(JobCanceled), &all), "job_canceled");
    }

    #[test]
    fn always_supported_without_features() {
        assert_eq!(wire_reason(Some(ScriptFailure), &[]), "script_failure");
        assert_eq!(wire_reason(Some(RunnerSystemFailure), &[]), "runner_system_failure");
        assert_eq!(wire_reason(Some(JobExecutionTimeout), &[]), "job_execution_timeout");
        assert_eq!(wire_reason(None, &[]), "script_failure");
    }

    #[test]
    fn unsupported_reasons_fall_back() {
        assert_eq!(wire_reason(Some(ImagePullFailure), &[]), "runner_system_failure");
        assert_eq!(wire_reason(Some(RunnerConfigurationError), &[]), "script_failure");
        assert_eq!(wire_reason(Some(RunnerExternalDependencyFailure), &[]), "runner_system_failure");
        assert_eq!(wire_reason(Some(RunnerInterrupted), &[]), "unknown_failure");
        assert_eq!(wire_reason(Some(JobCanceled), &strings(&["image_pull_failure"])), "unknown_failure");
        assert_eq!(wire_reason(Some(UnknownFailure), &[]), "unknown_failure");
    }
}
