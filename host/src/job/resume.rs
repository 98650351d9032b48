//! Going on with a job that a previous manager (or a previous run of this one) started and
//! stored: rebuild the executor's environment from its saved state, reattach to the stage that
//! was running, run the remaining stages, conclude as a fresh job would. And the other way
//! out: a stored job that may not go on (stale, resumed too often) is abandoned — its
//! environment rebuilt only to be cleaned up, the job failed with a trace line saying why.
//!
//! The trace handed in is the one restored from the store's checkpoint: nothing is written to
//! it before the stages go on (a resumed job's log reads as if nothing had happened), and the
//! executor's reattach continues each detached log where the trace left it.
//!
//! Owns: resuming and abandoning. Must not touch: stores, GitLab (the caller restores the
//! trace and the progress and sends the final update).

use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::progress::JobProgress;
use super::stages::{run_stages, StageStart};
use super::{
    conclude, on_instance, prepare_request, unix_now, JobCleanup, JobControl, JobEnvironment, JobHooks, JobOutcome,
};
use crate::executor::{resume, ExecutorSession, PrepareError};
use crate::payload::JobResponse;
use crate::script::{JobPlan, PlanError};
use crate::trace::{FailureReason, TraceLog, TraceSink};

/// Why a stored job cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CannotResume {
    /// It ran on a fleet instance and the runner has no way to it any more (no fleet, or the
    /// instance cannot be reached).
    #[error("reconnecting to its instance: {0}")]
    Instance(String),
    /// The runner's settings no longer plan it.
    #[error("planning the job again: {0}")]
    Plan(#[from] PlanError),
    /// Its executor saved no state to resume from.
    #[error("the \"{executor}\" executor cannot resume jobs")]
    NoState {
        /// The executor's name.
        executor: String,
    },
    /// Its executor did not take its saved state back.
    #[error("restoring the \"{executor}\" executor: {error}")]
    Restore {
        /// The executor's name.
        executor: String,
        /// What the executor said.
        error: PrepareError,
    },
}

/// How a stored job's resumption ended.
#[must_use = "the executor environment is only cleaned up by `cleanup.run`"]
pub struct Resumed {
    /// How the job ended.
    pub outcome: JobOutcome,
    /// The executor's cleanup, left to the caller.
    pub cleanup: JobCleanup,
    /// Why it could not go on (it was failed with this reason in its trace); `None`: it went on.
    pub refused: Option<CannotResume>,
}

/// Go on with stored job `job` from `stored` and hand back the executor's cleanup. A job that
/// cannot go on (no executor state, an executor that cannot resume, a plan that no longer
/// works) fails with `runner_system_failure` and a trace line saying why.
pub async fn resume_job_until_cleanup(
    job: &JobResponse,
    env: &JobEnvironment,
    trace: Arc<dyn TraceSink>,
    control: &JobControl,
    hooks: &dyn JobHooks,
    stored: JobProgress,
) -> Resumed {
    let (plan, mut session) = match restore(job, env, &trace, &stored).await {
        Ok(restored) => restored,
        Err(why) => {
            let outcome = fail(&*trace, hooks, &why.to_string()).await;
            return Resumed { outcome, cleanup: JobCleanup(None), refused: Some(why) };
        }
    };
    if stored.finished {
        // Only the final update was left.
        return Resumed { outcome: stored.outcome(), cleanup: JobCleanup(Some(session)), refused: None };
    }
    // Timeouts count from when the stages first began.
    let elapsed = std::time::Duration::from_secs(unix_now().saturating_sub(stored.started));
    let started = Instant::now().checked_sub(elapsed).unwrap_or_else(Instant::now);
    let start = StageStart { index: stored.stage, running: stored.running, outcome: stored.outcome(), started };
    let outcome = run_stages(&plan, &mut session, &*trace, control, hooks, start).await;
    let outcome = conclude(&*trace, hooks, outcome).await;
    Resumed { outcome, cleanup: JobCleanup(Some(session)), refused: None }
}

/// Fail stored job `job` without going on, because `why`: rebuild its environment only to
/// clean up what the previous manager left running, write why, conclude.
pub async fn abandon_job_until_cleanup(
    job: &JobResponse,
    env: &JobEnvironment,
    trace: Arc<dyn TraceSink>,
    hooks: &dyn JobHooks,
    stored: JobProgress,
    why: &str,
) -> (JobOutcome, JobCleanup) {
    let session = restore(job, env, &trace, &stored).await.ok().map(|(_, session)| session);
    (fail(&*trace, hooks, why).await, JobCleanup(session))
}

/// The plan and the executor session of a stored job, or why there are none.
async fn restore(
    job: &JobResponse,
    env: &JobEnvironment,
    trace: &Arc<dyn TraceSink>,
    stored: &JobProgress,
) -> Result<(JobPlan, ExecutorSession), CannotResume> {
    let executor = || env.executor.name().to_string();
    let Some(state) = stored.executor_state.as_deref() else {
        return Err(CannotResume::NoState { executor: executor() });
    };
    // Back on the instance it ran on (its lease reconnects, never acquires), planned there as
    // it was: the home's directories, the helper put there. Nothing goes to the trace.
    let instance = match (&env.instance, &stored.instance) {
        (Some(lease), _) => {
            let quiet = crate::trace::MemorySink::default();
            let connected = lease.connect(&quiet, &CancellationToken::new()).await;
            Some(connected.map_err(|e| CannotResume::Instance(e.to_string()))?)
        }
        (None, Some(stored)) => {
            return Err(CannotResume::Instance(format!("the runner has no fleet to reach instance {}", stored.id)))
        }
        (None, None) => None,
    };
    let settings = match &instance {
        Some(instance) => on_instance(job, env, instance, &**trace).await,
        None => env.settings.clone(),
    };
    let plan = JobPlan::new(job, &settings)?;
    let request = prepare_request(job, env, &plan);
    match resume(&env.executor, request, state, trace.clone(), instance.as_ref()).await {
        Ok(session) => Ok((plan, session)),
        Err(error) => Err(CannotResume::Restore { executor: executor(), error }),
    }
}

/// Fail a stored job that cannot go on: the reason in the trace, then the footer.
async fn fail(trace: &dyn TraceSink, hooks: &dyn JobHooks, why: &str) -> JobOutcome {
    let message = format!("the job cannot be resumed after a runner restart: {why}");
    trace.error(&message);
    conclude(trace, hooks, JobOutcome::failed(FailureReason::RunnerSystemFailure, None, message)).await
}
