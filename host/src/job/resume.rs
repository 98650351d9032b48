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

use super::progress::JobProgress;
use super::stages::{run_stages, StageStart};
use super::{conclude, prepare_request, unix_now, JobCleanup, JobControl, JobEnvironment, JobHooks, JobOutcome};
use crate::executor::{resume, ExecutorSession};
use crate::payload::JobResponse;
use crate::script::JobPlan;
use crate::trace::{FailureReason, TraceLog, TraceSink};

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
) -> (JobOutcome, JobCleanup) {
    let (plan, session) = match restore(job, env, &trace, &stored).await {
        Ok(restored) => restored,
        Err((why, session)) => return (fail(&*trace, hooks, &why).await, JobCleanup(session)),
    };
    let mut session = session;
    if stored.finished {
        // Only the final update was left.
        return (stored.outcome(), JobCleanup(Some(session)));
    }
    // Timeouts count from when the stages first began.
    let elapsed = std::time::Duration::from_secs(unix_now().saturating_sub(stored.started));
    let started = Instant::now().checked_sub(elapsed).unwrap_or_else(Instant::now);
    let start = StageStart { index: stored.stage, running: stored.running, outcome: stored.outcome(), started };
    let outcome = run_stages(&plan, &mut session, &*trace, control, hooks, start).await;
    (conclude(&*trace, hooks, outcome).await, JobCleanup(Some(session)))
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
    let session = match restore(job, env, &trace, &stored).await {
        Ok((_, session)) => Some(session),
        Err((_, session)) => session,
    };
    (fail(&*trace, hooks, why).await, JobCleanup(session))
}

/// The plan and the executor session of a stored job, or why there are none (with the session
/// when one exists, for cleanup).
async fn restore(
    job: &JobResponse,
    env: &JobEnvironment,
    trace: &Arc<dyn TraceSink>,
    stored: &JobProgress,
) -> Result<(JobPlan, ExecutorSession), (String, Option<ExecutorSession>)> {
    if env.instance.is_some() {
        return Err(("jobs on autoscaled instances cannot be resumed yet".into(), None));
    }
    let plan = JobPlan::new(job, &env.settings).map_err(|e| (format!("planning the job again: {e}"), None))?;
    let Some(state) = stored.executor_state.as_deref() else {
        return Err((format!("the \"{}\" executor cannot resume jobs", env.executor.name()), None));
    };
    let request = prepare_request(job, env, &plan);
    match resume(&env.executor, request, state, trace.clone(), None).await {
        Ok(session) => Ok((plan, session)),
        Err(e) => Err((format!("restoring the \"{}\" executor: {e}", env.executor.name()), None)),
    }
}

/// Fail a stored job that cannot go on: the reason in the trace, then the footer.
async fn fail(trace: &dyn TraceSink, hooks: &dyn JobHooks, why: &str) -> JobOutcome {
    let message = format!("the job cannot be resumed after a runner restart: {why}");
    trace.error(&message);
    conclude(trace, hooks, JobOutcome::failed(FailureReason::RunnerSystemFailure, None, message)).await
}
