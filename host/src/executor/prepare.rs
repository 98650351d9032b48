//! Preparing a job's executor: the WIT job record the plugin sees, and [`prepare`] — a fresh
//! session per attempt, up to [`PREPARATION_ATTEMPTS`] attempts [`PREPARATION_RETRY_INTERVAL`]
//! apart (GitLab's `PreparationRetries`), with the trace lines GitLab prints for them.
//!
//! [`resume`] rebuilds a session from an executor's saved state after a runner restart
//! (once: a failed resume is not retried, the job fails).
//!
//! Owns: preparation and its retries, resuming. Must not touch: acquiring instances
//! ([`super::instance`]), the job's sections, acceptance or failure reasons (`crate::job`
//! maps [`PrepareError`] to them).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::bindings::executor::exports::runway::executor0_1_0::executor::Job;
use crate::bindings::executor::runway::executor0_1_0::types::Image;
use crate::bindings::executor::runway::host0_2_0::job::{Credential, ImageDetails, JobDetails, Variable};
use crate::capability::replan::Reconfigure;
use crate::capability::terminal::TerminalSlot;
use crate::capability::CallContext;
use crate::executor::failure::ExecutorFailure;
use crate::executor::instance::ConnectedInstance;
use crate::executor::session::ExecutorSession;
use crate::executor::ResolvedExecutor;
use crate::payload::{JobResponse, JobVariable};
use crate::stop::StopSignal;
use crate::trace::{TraceLog, TraceSink};

/// Attempts at preparing the executor (GitLab's `PreparationRetries`).
pub const PREPARATION_ATTEMPTS: u32 = 3;
/// Pause between preparation attempts.
pub const PREPARATION_RETRY_INTERVAL: Duration = Duration::from_secs(3);

/// What the executor is prepared for: the job and where its plan put it.
#[derive(Clone, Copy)]
pub struct PrepareRequest<'a> {
    /// The job as GitLab sent it.
    pub job: &'a JobResponse,
    /// The shell its scripts are written for.
    pub shell: &'a str,
    /// The builds directory.
    pub builds_dir: &'a Path,
    /// The project's checkout directory.
    pub project_dir: &'a Path,
    /// The cache directory.
    pub cache_dir: &'a Path,
    /// The job timeout.
    pub timeout: Duration,
    /// The job's variables as its scripts see them: the payload's and the runner's predefined
    /// ones (`CI_RUNNER_SHORT_TOKEN`, `CI_PROJECT_DIR`, …), deduplicated and expanded.
    pub variables: &'a [JobVariable],
    /// Plans the job again when the executor moves it while preparing
    /// (`runway:host/job-config`); `None`: it cannot.
    pub reconfigure: Option<&'a Arc<dyn Reconfigure>>,
    /// Where the executor says the job's web terminal attaches (`runway:host/terminal`);
    /// `None`: the job has no terminal.
    pub terminal: Option<&'a Arc<TerminalSlot>>,
}

/// Why the executor could not be prepared.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrepareError {
    /// The executor's configuration is wrong: no retry (`runner_configuration_error`).
    #[error("invalid executor configuration: {0}")]
    InvalidConfig(String),
    /// Every attempt failed, or the job was aborted meanwhile (`runner_system_failure`).
    #[error("preparing the executor: {last_error}")]
    Failed {
        /// The last attempt's error (empty when none was made).
        last_error: String,
    },
}

fn image(img: &crate::payload::Image) -> Image {
    Image {
        name: img.name.clone(),
        entrypoint: img.entrypoint.clone(),
        command: img.command.clone(),
        aliases: img.alias.split([',', ' ']).filter(|a| !a.is_empty()).map(str::to_string).collect(),
    }
}

/// The WIT job record for a prepare request.
pub fn wit_job(request: &PrepareRequest<'_>, executor: &ResolvedExecutor) -> Job {
    let job = request.job;
    Job {
        id: u64::try_from(job.id).unwrap_or_default(),
        name: job.job_info.name.clone(),
        project_path: job.job_info.project_full_path.clone(),
        shell: request.shell.to_string(),
        builds_dir: request.builds_dir.display().to_string(),
        project_dir: request.project_dir.display().to_string(),
        cache_dir: request.cache_dir.display().to_string(),
        config: executor.config_json.clone(),
        timeout_seconds: u32::try_from(request.timeout.as_secs()).unwrap_or(u32::MAX),
        image: job.image.as_ref().filter(|i| !i.name.is_empty()).map(image),
        services: job.services.iter().map(image).collect(),
    }
}

fn variable(v: &JobVariable) -> Variable {
    Variable { key: v.key.clone(), value: v.value.clone(), public: v.public, file: v.file }
}

fn image_details(img: &crate::payload::Image) -> ImageDetails {
    let Image { name, entrypoint, command, aliases } = image(img);
    ImageDetails {
        name,
        entrypoint,
        command,
        aliases,
        pull_policies: img.pull_policy.clone(),
        variables: img.variables.iter().map(variable).collect(),
        user: img.executor_opts.docker.user.clone(),
        platform: img.executor_opts.docker.platform.clone(),
    }
}

/// What the job asked for beyond the WIT job record (`runway:host/job`), with the variables of
/// `request` (GitLab gives services the job's variables as the job sees them).
pub fn job_details(request: &PrepareRequest<'_>) -> JobDetails {
    let job = request.job;
    JobDetails {
        variables: request.variables.iter().map(variable).collect(),
        credentials: job
            .credentials
            .iter()
            .filter(|c| c.kind.eq_ignore_ascii_case("registry"))
            .map(|c| Credential { url: c.url.clone(), username: c.username.clone(), password: c.password.clone() })
            .collect(),
        image: job.image.as_ref().filter(|i| !i.name.is_empty()).map(image_details),
        services: job.services.iter().map(image_details).collect(),
    }
}

/// The call context of a job's session: its log, its fleet instance, its details, and what
/// plans the job again while it is prepared.
fn call_context(
    details: &Arc<JobDetails>,
    trace: Arc<dyn TraceSink>,
    instance: Option<&ConnectedInstance>,
    reconfigure: Option<&Arc<dyn Reconfigure>>,
    terminal: Option<&Arc<TerminalSlot>>,
) -> CallContext {
    CallContext {
        trace: Some(trace),
        stop: StopSignal::new(),
        remote: instance.map(|i| i.remote.clone()),
        job: Some(details.clone()),
        reconfigure: reconfigure.cloned(),
        terminal: terminal.cloned(),
    }
}

/// Prepare `executor` for `request`, writing each failed attempt to `trace`; stops retrying
/// when `abort` fires. Calls of the session work for `trace` and, on a fleet, `instance`.
pub async fn prepare(
    executor: &ResolvedExecutor,
    request: PrepareRequest<'_>,
    trace: Arc<dyn TraceSink>,
    abort: &CancellationToken,
    instance: Option<&ConnectedInstance>,
) -> Result<ExecutorSession, PrepareError> {
    let wit = wit_job(&request, executor);
    let details = Arc::new(job_details(&request));
    let mut last_error = String::new();
    for attempt in 1..=PREPARATION_ATTEMPTS {
        if abort.is_cancelled() {
            break;
        }
        let call = call_context(&details, trace.clone(), instance, request.reconfigure, request.terminal);
        let mut session = match ExecutorSession::start(&executor.host, &executor.plugin, call).await {
            Ok(s) => s,
            Err(e) => {
                last_error = e.to_string();
                trace.error(&format!("Preparation failed: {last_error}"));
                break;
            }
        };
        match session.prepare(&wit).await {
            Ok(()) => return Ok(session),
            Err(ExecutorFailure::InvalidConfig(m)) => {
                let error = PrepareError::InvalidConfig(m);
                trace.error(&error.to_string());
                return Err(error);
            }
            Err(e) => {
                last_error = e.to_string();
                trace.error(&format!("Preparation failed: {last_error}"));
                if attempt < PREPARATION_ATTEMPTS {
                    trace.println(&format!("Will be retried in {} s ...", PREPARATION_RETRY_INTERVAL.as_secs()));
                    tokio::select! {
                        _ = tokio::time::sleep(PREPARATION_RETRY_INTERVAL) => {}
                        _ = abort.cancelled() => break,
                    }
                }
            }
        }
    }
    Err(PrepareError::Failed { last_error })
}

/// Rebuild the session of a job started before a runner restart from the executor's saved
/// `state` (`environment.state`). Calls of the session work for `trace` and, on a fleet,
/// `instance`. Not retried: a job whose environment cannot be rebuilt fails.
pub async fn resume(
    executor: &ResolvedExecutor,
    request: PrepareRequest<'_>,
    state: &str,
    trace: Arc<dyn TraceSink>,
    instance: Option<&ConnectedInstance>,
) -> Result<ExecutorSession, PrepareError> {
    let wit = wit_job(&request, executor);
    let call = call_context(&Arc::new(job_details(&request)), trace, instance, None, None);
    let failed = |e: ExecutorFailure| PrepareError::Failed { last_error: e.to_string() };
    let mut session = ExecutorSession::start(&executor.host, &executor.plugin, call)
        .await
        .map_err(|e| failed(ExecutorFailure::Plugin(e)))?;
    session.resume(&wit, state).await.map_err(failed)?;
    Ok(session)
}
