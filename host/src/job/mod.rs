//! One job's lifecycle: header, executor preparation (with two-phase acceptance), the stages
//! in GitLab's order with their `when` rules and timeouts, graceful cancel and abort, and
//! the final state with its failure reason.
//!
//! The job module knows nothing about HTTP or terminals: it writes to a [`TraceSink`] and is
//! told about cancels through [`JobControl`]. `runway run` (GitLab) and `runway exec` (local)
//! both drive it.
//!
//! - [`stages`]: the stage loop and its boundaries;
//! - [`progress`]: where the job stands, for a restarted manager;
//! - [`resume`]: going on with a job a previous manager started;
//! - [`replan`]: planning the job again when its executor moves it while preparing;
//! - [`secrets`]: the job's `secrets:` read before the executor is prepared.
//!
//! Owns: the job's lifecycle and what each outcome means (failure reasons, footers). Must not
//! touch: plugins, WIT types or host interfaces — everything about the executor goes through
//! `crate::executor` (preparation, the fleet instance, stages, failures); stores (the hooks
//! save the progress).

pub mod progress;
pub mod replan;
pub mod resume;
pub mod secrets;
mod stages;

use std::sync::Arc;

use async_trait::async_trait;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::executor::{
    depends_on_home, prepare, resolve_in_home, ConnectedInstance, ExecutorSession, InstanceLease, PrepareError,
    PrepareRequest, ResolvedExecutor, TerminalPlace, TerminalSlot,
};
use crate::payload::JobResponse;
use crate::script::{JobPlan, PlanError, ScriptSettings};
use crate::trace::format::{section_header_line, RunnerIdentity, SectionOptions};
use crate::trace::{FailureReason, TraceLog, TraceSink};
pub use progress::{JobProgress, Progress};
use stages::{run_stages, StageStart};

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

/// A boundary the job passed: its [`Progress`] (when kept) says so, and whoever keeps it
/// saves it before the job goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boundary<'a> {
    /// Accepted: the stages are about to begin.
    Accepted,
    /// A stage (GitLab's name, e.g. `step_script`) starts, or is reattached to.
    StageStarted(&'a str),
    /// A stage could not be scripted: the outcome changed, the stage did not run.
    StageUnscripted,
    /// A stage ended after a duration (all its attempts).
    StageEnded(&'a str, std::time::Duration),
    /// Every stage is done and the footer written: only the final update is left.
    Finished,
}

/// The job's remote side: told at the two-phase commit point and at every boundary. The
/// job names no GitLab, store or metrics: `runway run` answers here, `runway exec` does not
/// ([`NoHooks`]).
#[async_trait]
pub trait JobHooks: Send + Sync {
    /// The executor is prepared; accept the job (`PUT state=running`). An error means the
    /// job is gone for this runner and must be dropped.
    async fn prepared(&self) -> Result<(), AcceptError>;

    /// Where the job keeps its progress for a restarted manager; `None` (the default): not kept.
    fn progress(&self) -> Option<Progress> {
        None
    }

    /// The job passed `boundary` and its [`Progress`] says so: save it (and report a stage's
    /// start or end) before the job goes on.
    async fn boundary(&self, boundary: Boundary<'_>) {
        let _ = boundary;
    }

    /// The job is accepted and its environment prepared: a terminal into it opens at `place`
    /// from now on (GitLab's web terminal). Called only for executors that have one.
    fn terminal(&self, place: TerminalPlace) {
        let _ = place;
    }

    /// Whether the job can have a terminal (its request carried a session): the executor is
    /// then asked where one attaches while it prepares the job.
    fn wants_terminal(&self) -> bool {
        false
    }

    /// The stages are over and the footer is not written yet: a job whose terminal is
    /// connected waits here (gitlab-runner's `waitForTerminal`), at most `left` — what remains
    /// of the job's timeout — and the hook's own limit (`session_timeout`).
    async fn stages_over(&self, left: std::time::Duration) {
        let _ = left;
    }
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
    /// The executor or the job's instance could not be prepared: a problem of this runner
    /// another one may not have (a Runway router offers such a job elsewhere).
    pub preparation_failed: bool,
}

impl JobOutcome {
    /// A job that succeeded (so far).
    pub fn success() -> Self {
        JobOutcome { failure: None, exit_code: None, message: String::new(), aborted: false, preparation_failed: false }
    }
    /// A job that failed for `reason`.
    pub fn failed(reason: FailureReason, exit_code: Option<i32>, message: impl Into<String>) -> Self {
        JobOutcome {
            failure: Some(reason),
            exit_code,
            message: message.into(),
            aborted: false,
            preparation_failed: false,
        }
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
    // resolve_secrets: before the executor is prepared, as gitlab-runner does; the values
    // join the job's variables (masked, raw) for everything after.
    let resolved = tokio::select! {
        resolved = secrets::resolve(job, &env.settings.feature_flags, &*trace) => resolved,
        () = control.abort.cancelled() => {
            let reason = control.abort_reason.lock().ok().and_then(|r| *r).unwrap_or(FailureReason::JobCanceled);
            let message = "the job was aborted while its secrets were resolved";
            trace.error(&format!("Job aborted: {message}"));
            return (JobOutcome { aborted: true, ..JobOutcome::failed(reason, None, message) }, None);
        }
    };
    let secret_variables = match resolved {
        Ok(variables) => variables,
        Err(outcome) => return (finish(&*trace, outcome), None),
    };
    let with_secrets = secrets::with_secrets(job, secret_variables.clone());
    let job: &JobResponse = &with_secrets;
    // prepare_executor: plan first, so a configuration error never costs a fleet instance.
    trace.section_start("prepare_executor", SectionOptions::default());
    trace.write_str(&section_header_line(&format!("Preparing the \"{}\" executor", env.executor.name())));
    for warning in &env.settings.prepare_warnings {
        trace.warning(warning);
    }
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
                let outcome = JobOutcome::failed(FailureReason::RunnerSystemFailure, None, message);
                return (finish(&*trace, JobOutcome { preparation_failed: true, ..outcome }), None);
            }
        },
    };
    let plan = match (plan, &instance) {
        // Relative directories live in the instance's home, and the helper is the copy put
        // there: plan on the instance.
        (_, Some(instance)) => plan_job(job, &on_instance(job, env, instance, &*trace).await, &*trace),
        (Some(plan), None) => Ok(plan),
        (None, None) => plan_job(job, &env.settings, &*trace),
    };
    let plan = match plan {
        Ok(plan) => plan,
        Err(outcome) => return (finish(&*trace, outcome), None),
    };
    let replanner = Arc::new(replan::Replanner::new(job, plan.settings()));
    let reconfigure: Arc<dyn crate::executor::Reconfigure> = replanner.clone();
    // A job whose request carried a session asks its executor where a terminal attaches.
    let terminal = (hooks.wants_terminal() && env.executor.features().terminal).then(TerminalSlot::new);
    let request = PrepareRequest {
        reconfigure: Some(&reconfigure),
        terminal: terminal.as_ref(),
        ..prepare_request(job, env, &plan)
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
            return (finish(&*trace, JobOutcome { preparation_failed: true, ..outcome }), None);
        }
    };
    // The executor may have moved the job while preparing (a custom executor's config_exec).
    let replanned = replanner.close();
    let plan = replanned.unwrap_or(plan);
    if let Err(e) = hooks.prepared().await {
        tracing::warn!(job = job.id, "job dropped at acceptance: {e}");
        let outcome = JobOutcome { aborted: true, ..JobOutcome::failed(FailureReason::RunnerSystemFailure, None, e.0) };
        return (outcome, Some(session));
    }

    // Boundary: accepted. From here on a restarted manager can go on with the job.
    let progress = hooks.progress();
    let executor_state = if progress.is_some() { session.state().await } else { None };
    if let Some(progress) = &progress {
        let mut p = progress.lock();
        p.started = unix_now();
        p.executor_state = executor_state;
        p.secrets = secret_variables.iter().map(progress::StoredSecret::from).collect();
        p.instance =
            instance.as_ref().map(|i| progress::StoredInstance { id: i.id.clone(), reconnect: i.reconnect.clone() });
    }
    hooks.boundary(Boundary::Accepted).await;
    let env_vars = plan.terminal_env();
    let on_instance = instance.is_some();
    if let Some(place) =
        env.executor.terminal_place(&env.settings.shell, plan.project_dir(), env_vars, on_instance, terminal.as_deref())
    {
        hooks.terminal(place);
    }
    let start = StageStart { index: 0, running: false, outcome: JobOutcome::success(), started: Instant::now() };
    let started = start.started;
    let outcome = run_stages(&plan, &mut session, &*trace, control, hooks, start).await;
    if !outcome.aborted {
        hooks.stages_over(plan.job_timeout().saturating_sub(started.elapsed())).await;
    }
    (conclude(&*trace, hooks, outcome).await, Some(session))
}

/// The last boundary: the footer (or why the job was aborted) and the progress saying only
/// the final update is left.
async fn conclude(trace: &dyn TraceSink, hooks: &dyn JobHooks, outcome: JobOutcome) -> JobOutcome {
    let progress = hooks.progress();
    let outcome = {
        let mut guard = progress.as_ref().map(Progress::lock);
        let outcome = if outcome.aborted {
            // Nobody is listening for a footer on an aborted job, but the log should still say why.
            trace.error(&format!("Job aborted: {}", outcome.message));
            outcome
        } else {
            finish(trace, outcome)
        };
        if let Some(p) = guard.as_deref_mut() {
            p.set_outcome(&outcome);
            p.finished = true;
            p.running = false;
        }
        outcome
    };
    hooks.boundary(Boundary::Finished).await;
    outcome
}

/// Now as unix seconds (0 before 1970).
fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// What the executor is prepared (or resumed) for: `job` where `plan` put it.
fn prepare_request<'a>(job: &'a JobResponse, env: &'a JobEnvironment, plan: &'a JobPlan) -> PrepareRequest<'a> {
    PrepareRequest {
        job,
        shell: &env.settings.shell,
        builds_dir: plan.builds_dir(),
        project_dir: plan.project_dir(),
        cache_dir: plan.cache_dir(),
        timeout: plan.job_timeout(),
        variables: plan.variables(),
        reconfigure: None,
        terminal: None,
    }
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

/// The helper command of a job on `instance`: the runner's own binary copied there when the
/// job moves files (caches, artifacts); when that fails, a `runway` on the instance's `PATH`
/// (the stages check for it and say so when it is missing).
async fn helper_on_instance(
    job: &JobResponse,
    settings: &ScriptSettings,
    instance: &ConnectedInstance,
    trace: &dyn TraceSink,
) -> Option<String> {
    let local = settings.runner_command.as_deref()?;
    if !crate::script::transfer::uses_helper(job) {
        return Some(local.to_string());
    }
    match instance.install_helper(std::path::Path::new(local), &settings.builds_dir).await {
        Ok(path) => Some(path),
        Err(e) => {
            trace.warning(&format!(
                "the runner's helper could not be put on the instance ({e}); using `runway` from its PATH"
            ));
            Some("runway".to_string())
        }
    }
}

/// The script settings of `job` on a connected instance: relative builds and cache
/// directories resolved against the login user's home and, for executors without a helper
/// image (which run the helper there, not on the instance), the helper put on the instance.
async fn on_instance(
    job: &JobResponse,
    env: &JobEnvironment,
    instance: &ConnectedInstance,
    trace: &dyn TraceSink,
) -> ScriptSettings {
    let settings = &env.settings;
    let builds_dir = instance.resolve_dir(&settings.builds_dir);
    let cache_dir = instance.resolve_dir(&settings.cache_dir);
    let mut settings = ScriptSettings { builds_dir, cache_dir, ..settings.clone() };
    if !env.executor.features().image {
        settings.runner_command = helper_on_instance(job, &settings, instance, trace).await;
    }
    settings
}

#[cfg(test)]
mod tests;
