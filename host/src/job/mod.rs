//! One job's lifecycle: header, executor preparation (with two-phase acceptance), the stages
//! in GitLab's order with their `when` rules and timeouts, graceful cancel and abort, and
//! the final state with its failure reason.
//!
//! The job module knows nothing about HTTP or terminals: it writes to a [`TraceSink`] and is
//! told about cancels through [`JobControl`]. `runway run` (GitLab) and `runway exec` (local)
//! both drive it.
//!
//! Owns: the job's lifecycle and what each outcome means (failure reasons, footers). Must not
//! touch: plugins, WIT types or host interfaces — everything about the executor goes through
//! `crate::executor` (preparation, the fleet instance, stages, failures).

use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::executor::{
    depends_on_home, prepare, resolve_in_home, run_stage, ConnectedInstance, ExecutorSession, InstanceLease,
    PrepareError, PrepareRequest, ResolvedExecutor, Stage, StageOutcome,
};
use crate::payload::{JobResponse, StepWhen};
use crate::script::{BuildStage, JobPlan, PlanError, ScriptSettings};
use crate::stop::{StopReason, StopSignal};
use crate::trace::format::{section_header_line, RunnerIdentity, SectionOptions};
use crate::trace::{FailureReason, TraceLog, TraceSink};

/// Outside control of a running job.
#[derive(Clone, Default)]
pub struct JobControl {
    /// Graceful cancel (`Job-Status: canceling`): stop the script, still run after_script.
    pub cancel: CancellationToken,
    /// Abort (403, canceled, forceful shutdown): stop everything now.
    pub abort: CancellationToken,
    /// Why an abort happened, for the footer (e.g. the runner is shutting down).
    pub abort_reason: Arc<std::sync::Mutex<Option<FailureReason>>>,
}

impl JobControl {
    /// Abort with a reason (first one wins).
    pub fn abort_with(&self, reason: FailureReason) {
        if let Ok(mut r) = self.abort_reason.lock() {
            r.get_or_insert(reason);
        }
        self.abort.cancel();
    }
}

/// Why the job was not accepted at the two-phase commit point: it is gone for this runner.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AcceptError(pub String);

/// Called by the job at the two-phase commit point.
#[async_trait]
pub trait JobHooks: Send + Sync {
    /// The executor is prepared; accept the job (`PUT state=running`). An error means the
    /// job is gone for this runner and must be dropped.
    async fn prepared(&self) -> Result<(), AcceptError>;
}

/// No remote side (`runway exec`, tests).
pub struct NoHooks;

#[async_trait]
impl JobHooks for NoHooks {
    async fn prepared(&self) -> Result<(), AcceptError> {
        Ok(())
    }
}

/// What the runner needs to run jobs of one `[[runners]]` entry.
#[derive(Clone)]
pub struct JobEnvironment {
    /// The executor plugin and what it said about itself.
    pub executor: ResolvedExecutor,
    /// How scripts are generated for this runner.
    pub settings: ScriptSettings,
    /// Who runs the job (for the trace header).
    pub identity: RunnerIdentity,
    /// Set per job for runners with `[runners.autoscaler]`.
    pub instance: Option<InstanceLease>,
}

/// How the job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobOutcome {
    /// `None` when the job succeeded.
    pub failure: Option<FailureReason>,
    /// Exit code of the failing script, when there was one.
    pub exit_code: Option<i32>,
    /// The footer's error text.
    pub message: String,
    /// The job was taken away (abort before or during the run); GitLab must not be told
    /// anything more than the trace and a final state it will likely refuse.
    pub aborted: bool,
}

impl JobOutcome {
    fn success() -> Self {
        JobOutcome { failure: None, exit_code: None, message: String::new(), aborted: false }
    }
    fn failed(reason: FailureReason, exit_code: Option<i32>, message: impl Into<String>) -> Self {
        JobOutcome { failure: Some(reason), exit_code, message: message.into(), aborted: false }
    }
    /// Did the job succeed?
    pub fn succeeded(&self) -> bool {
        self.failure.is_none()
    }
    /// The state GitLab shows after `CI_JOB_STATUS` is updated for after_script.
    fn status_word(&self) -> &'static str {
        match self.failure {
            None => "success",
            Some(FailureReason::JobCanceled) => "canceled",
            Some(FailureReason::JobExecutionTimeout) => "timedout",
            Some(_) => "failed",
        }
    }
}

fn is_system(reason: FailureReason) -> bool {
    matches!(reason, FailureReason::RunnerSystemFailure | FailureReason::RunnerInterrupted)
}

fn finish(trace: &dyn TraceSink, outcome: JobOutcome) -> JobOutcome {
    match outcome.failure {
        None => trace.footer(&crate::trace::format::job_succeeded()),
        Some(reason) => trace.footer(&crate::trace::format::job_failed(&outcome.message, is_system(reason))),
    }
    outcome
}

/// Fail a job whose payload could not even be planned or decoded, with a readable trace line.
pub fn fail_unplannable(trace: &dyn TraceSink, identity: &RunnerIdentity, message: &str) -> JobOutcome {
    trace.header(identity);
    trace.error(message);
    finish(trace, JobOutcome::failed(FailureReason::RunnerSystemFailure, None, message))
}

/// The executor's cleanup of a finished job, left for the caller to run once the job's final
/// state is out (a slow or stuck plugin `cleanup` must not hold it back).
#[must_use = "the executor environment is only cleaned up by `run`"]
pub struct JobCleanup(Option<ExecutorSession>);

impl JobCleanup {
    fn none() -> Self {
        JobCleanup(None)
    }

    /// Clean up the executor environment (bounded by the plugin's `call_timeout`).
    pub async fn run(self) {
        if let Some(session) = self.0 {
            session.cleanup().await;
        }
    }
}

/// Run `job` to its end, the executor's cleanup included.
pub async fn run_job(
    job: &JobResponse,
    env: &JobEnvironment,
    trace: Arc<dyn TraceSink>,
    control: &JobControl,
    hooks: &dyn JobHooks,
) -> JobOutcome {
    let (outcome, cleanup) = run_job_until_cleanup(job, env, trace, control, hooks).await;
    cleanup.run().await;
    outcome
}

/// Run `job` to its end and hand back the executor's cleanup, so the caller can report the
/// outcome first (`runway run` sends the final update, then cleans up).
pub async fn run_job_until_cleanup(
    job: &JobResponse,
    env: &JobEnvironment,
    trace: Arc<dyn TraceSink>,
    control: &JobControl,
    hooks: &dyn JobHooks,
) -> (JobOutcome, JobCleanup) {
    let (outcome, session) = run_to_end(job, env, trace, control, hooks).await;
    (outcome, session.map(|s| JobCleanup(Some(s))).unwrap_or_else(JobCleanup::none))
}

async fn run_to_end(
    job: &JobResponse,
    env: &JobEnvironment,
    trace: Arc<dyn TraceSink>,
    control: &JobControl,
    hooks: &dyn JobHooks,
) -> (JobOutcome, Option<ExecutorSession>) {
    trace.header(&env.identity);
    if job.run.as_deref().is_some_and(|r| !r.trim().is_empty()) {
        let message = "this job uses `run:` (CI Steps), which Runway does not execute";
        trace.error(message);
        return (finish(&*trace, JobOutcome::failed(FailureReason::RunnerSystemFailure, Some(3), message)), None);
    }
    if job.steps.is_empty() && job.run.is_none() {
        let message = "invalid job payload: it has no `steps` (nothing to run)";
        trace.error(message);
        return (finish(&*trace, JobOutcome::failed(FailureReason::RunnerSystemFailure, None, message)), None);
    }
    // prepare_executor: plan first, so a configuration error never costs a fleet instance.
    trace.section_start("prepare_executor", SectionOptions::default());
    trace.write_str(&section_header_line(&format!("Preparing the \"{}\" executor", env.executor.name())));
    // On a fleet, relative directories are the instance's home's, which is known only once
    // connected: plan meanwhile as if it were `/`, and leave configuration errors that may
    // depend on where the home is (builds_dir, GIT_CLONE_PATH) to the plan on the instance.
    let home_dependent = env.instance.is_some()
        && (depends_on_home(&env.settings.builds_dir) || depends_on_home(&env.settings.cache_dir));
    let preliminary = if home_dependent {
        let home = std::path::Path::new("/");
        let (builds_dir, cache_dir) =
            (resolve_in_home(&env.settings.builds_dir, home), resolve_in_home(&env.settings.cache_dir, home));
        std::borrow::Cow::Owned(ScriptSettings { builds_dir, cache_dir, ..env.settings.clone() })
    } else {
        std::borrow::Cow::Borrowed(&env.settings)
    };
    let plan = match JobPlan::new(job, &preliminary) {
        Ok(plan) => Some(plan),
        Err(e) if home_dependent && e.is_configuration_error() => None,
        Err(e) => return (finish(&*trace, plan_failed(&*trace, &e)), None),
    };
    let instance = match &env.instance {
        None => None,
        Some(lease) => match lease.connect(&*trace, &control.abort).await {
            Ok(instance) => Some(instance),
            Err(e) => {
                let message = format!("preparing the instance: {e}");
                trace.error(&message);
                trace.section_end("prepare_executor");
                return (finish(&*trace, JobOutcome::failed(FailureReason::RunnerSystemFailure, None, message)), None);
            }
        },
    };
    let plan = match (plan, &instance) {
        // Relative directories live in the instance's home: plan there.
        (_, Some(instance)) if home_dependent => plan_job(job, &on_instance(&env.settings, instance), &*trace),
        (Some(plan), _) => Ok(plan),
        (None, _) => plan_job(job, &env.settings, &*trace),
    };
    let plan = match plan {
        Ok(plan) => plan,
        Err(outcome) => return (finish(&*trace, outcome), None),
    };
    let request = PrepareRequest {
        job,
        shell: &env.settings.shell,
        builds_dir: plan.builds_dir(),
        project_dir: plan.project_dir(),
        cache_dir: plan.cache_dir(),
        timeout: plan.job_timeout(),
    };
    let session = prepare(&env.executor, request, trace.clone(), &control.abort, instance.as_ref()).await;
    trace.section_end("prepare_executor");
    let mut session = match session {
        Ok(s) => s,
        Err(e @ PrepareError::InvalidConfig(_)) => {
            let outcome = JobOutcome::failed(FailureReason::RunnerConfigurationError, None, e.to_string());
            return (finish(&*trace, outcome), None);
        }
        Err(e @ PrepareError::Failed { .. }) => {
            let outcome = JobOutcome::failed(FailureReason::RunnerSystemFailure, None, e.to_string());
            return (finish(&*trace, outcome), None);
        }
    };
    if let Err(e) = hooks.prepared().await {
        tracing::warn!(job = job.id, "job dropped at acceptance: {e}");
        let outcome = JobOutcome { aborted: true, ..JobOutcome::failed(FailureReason::RunnerSystemFailure, None, e.0) };
        return (outcome, Some(session));
    }

    let outcome = run_stages(&plan, &mut session, &*trace, control).await;
    if outcome.aborted {
        // Nobody is listening for a footer on an aborted job, but the log should still say why.
        trace.error(&format!("Job aborted: {}", outcome.message));
        return (outcome, Some(session));
    }
    (finish(&*trace, outcome), Some(session))
}

/// Plan `job` under `settings`; a failure is written to the trace, closes the
/// `prepare_executor` section and says how the job fails.
fn plan_job(job: &JobResponse, settings: &ScriptSettings, trace: &dyn TraceSink) -> Result<JobPlan, JobOutcome> {
    JobPlan::new(job, settings).map_err(|e| plan_failed(trace, &e))
}

/// Write a planning error to the trace, close `prepare_executor`, and say how the job fails.
fn plan_failed(trace: &dyn TraceSink, error: &PlanError) -> JobOutcome {
    let reason = if error.is_configuration_error() {
        FailureReason::RunnerConfigurationError
    } else {
        FailureReason::RunnerSystemFailure
    };
    trace.error(&error.to_string());
    trace.section_end("prepare_executor");
    JobOutcome::failed(reason, None, error.to_string())
}

/// The script settings on a connected instance: relative builds and cache directories
/// resolved against the login user's home.
fn on_instance(settings: &ScriptSettings, instance: &ConnectedInstance) -> ScriptSettings {
    let builds_dir = instance.resolve_dir(&settings.builds_dir);
    let cache_dir = instance.resolve_dir(&settings.cache_dir);
    ScriptSettings { builds_dir, cache_dir, ..settings.clone() }
}

/// Whether a stage runs, given what happened so far.
fn should_run(plan: &JobPlan, stage: &BuildStage, failed: bool) -> bool {
    match stage {
        BuildStage::PrepareScript
        | BuildStage::GetSources
        | BuildStage::RestoreCache
        | BuildStage::DownloadArtifacts => !failed,
        BuildStage::Step(name) => match plan.step(name).map(|s| s.when).unwrap_or_default() {
            StepWhen::OnSuccess => !failed,
            StepWhen::OnFailure => failed,
            StepWhen::Always => true,
        },
        BuildStage::AfterScript | BuildStage::CleanupFileVariables => true,
        BuildStage::ArchiveCache | BuildStage::UploadArtifactsOnSuccess => !failed,
        BuildStage::ArchiveCacheOnFailure | BuildStage::UploadArtifactsOnFailure => failed,
    }
}

/// Which outside signals stop a stage: user stages stop on cancel; after_script, cache
/// archiving and cleanup only on abort.
fn cancellable(stage: &BuildStage) -> bool {
    !matches!(
        stage,
        BuildStage::AfterScript
            | BuildStage::ArchiveCache
            | BuildStage::ArchiveCacheOnFailure
            | BuildStage::UploadArtifactsOnSuccess
            | BuildStage::UploadArtifactsOnFailure
            | BuildStage::CleanupFileVariables
    )
}

async fn run_stages(
    plan: &JobPlan,
    session: &mut ExecutorSession,
    trace: &dyn TraceSink,
    control: &JobControl,
) -> JobOutcome {
    let started = tokio::time::Instant::now();
    let job_timeout = plan.job_timeout();
    let mut outcome = JobOutcome::success();
    for stage in plan.stages() {
        if control.abort.is_cancelled() {
            outcome.aborted = true;
            break;
        }
        if !should_run(plan, &stage, outcome.failure.is_some()) {
            continue;
        }
        let is_after_script = matches!(stage, BuildStage::AfterScript);
        let status = if is_after_script { outcome.status_word() } else { "running" };
        let script = match plan.script(&stage, status) {
            Ok(s) => s,
            Err(e) => {
                trace.error(&e.to_string());
                outcome = JobOutcome::failed(FailureReason::RunnerSystemFailure, None, e.to_string());
                continue;
            }
        };
        let timeout = match stage {
            BuildStage::AfterScript => plan.after_script_timeout(),
            BuildStage::Step(_) => plan.script_timeout().min(job_timeout.saturating_sub(started.elapsed())),
            _ => job_timeout.saturating_sub(started.elapsed()),
        };
        let name = stage.name();
        trace.section_start(&name, SectionOptions::default());
        trace.write_str(&section_header_line(&stage.description()));
        let stop = StopSignal::new();
        let watcher = {
            let stop = stop.clone();
            let control = control.clone();
            let on_cancel = cancellable(&stage);
            tokio::spawn(async move {
                tokio::select! {
                    _ = control.abort.cancelled() => stop.stop(StopReason::Canceled),
                    _ = async { if on_cancel { control.cancel.cancelled().await } else { std::future::pending().await } } => stop.stop(StopReason::Canceled),
                }
            })
        };
        let attempts = if matches!(stage, BuildStage::GetSources) { plan.get_sources_attempts().max(1) } else { 1 };
        let mut result = StageOutcome::Exited(0);
        for attempt in 1..=attempts {
            let script_stage = Stage { name: name.clone(), script: script.clone(), predefined: stage.predefined() };
            result = run_stage(session, &script_stage, stop.clone(), timeout).await;
            if matches!(result, StageOutcome::Exited(0)) || attempt == attempts || stop.is_stopped() {
                break;
            }
            trace.warning(&format!("Retrying {name} (attempt {} of {attempts})", attempt + 1));
        }
        watcher.abort();
        trace.section_end(&name);

        match result {
            StageOutcome::Exited(0) => {}
            StageOutcome::Exited(code) => {
                if is_after_script {
                    trace.warning(&format!("after_script failed, but job will continue unaffected: exit code {code}"));
                } else if matches!(
                    stage,
                    BuildStage::ArchiveCache | BuildStage::ArchiveCacheOnFailure | BuildStage::CleanupFileVariables
                ) {
                    trace.warning(&format!("{name} failed: exit code {code}"));
                } else if outcome.failure.is_none() {
                    outcome = JobOutcome::failed(FailureReason::ScriptFailure, Some(code), format!("exit code {code}"));
                }
            }
            StageOutcome::Stopped(reason) => {
                if control.abort.is_cancelled() {
                    let why = control.abort_reason.lock().ok().and_then(|r| *r).unwrap_or(FailureReason::JobCanceled);
                    outcome = JobOutcome { aborted: true, ..JobOutcome::failed(why, None, "job aborted") };
                    break;
                }
                match reason {
                    StopReason::TimedOut if is_after_script => {
                        trace.warning(&format!("after_script timed out after {} seconds", timeout.as_secs()));
                    }
                    StopReason::TimedOut => {
                        if outcome.failure.is_none() {
                            // Name the limit that fired: RUNNER_SCRIPT_TIMEOUT for a step that
                            // has its own, else the job timeout.
                            let limit = match stage {
                                BuildStage::Step(_) if plan.script_timeout() < job_timeout => plan.script_timeout(),
                                _ => job_timeout,
                            };
                            outcome = JobOutcome::failed(
                                FailureReason::JobExecutionTimeout,
                                None,
                                format!("execution took longer than {} seconds", limit.as_secs()),
                            );
                        }
                    }
                    StopReason::Canceled => {
                        trace.error("script canceled externally (UI, API)");
                        outcome = JobOutcome::failed(FailureReason::JobCanceled, None, "canceled");
                    }
                }
            }
            StageOutcome::Failed(e) => {
                trace.error(&e.to_string());
                if outcome.failure.is_none() || is_after_script {
                    outcome = JobOutcome::failed(FailureReason::RunnerSystemFailure, None, e.to_string());
                }
                if e.is_plugin_failure() {
                    // The plugin instance is unusable after a trap; nothing else can run.
                    break;
                }
            }
        }
    }
    outcome
}

#[cfg(test)]
mod tests;
