//! One stage of a job as the executor runs it: the [`Stage`] (name, script, whether it needs
//! only helper tooling), how it ended ([`StageOutcome`]), and [`run_stage`], which runs it
//! under the caller's stop signal and the stage's deadline.
//!
//! Owns: the stage domain types and the stage deadline. Must not touch: which stages run and
//! what their outcome means for the job (that is `crate::job`), plugins' WIT types.

use std::time::Duration;

use crate::executor::failure::ExecutorFailure;
use crate::executor::session::ExecutorSession;
use crate::stop::{StopReason, StopSignal};

/// A stage script for the executor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// Stage name as GitLab names it (`get_sources`, `step_script`, ...).
    pub name: String,
    /// Complete script text for the job's shell.
    pub script: String,
    /// True for stages that need only the runner's helper tooling (git, cache, artifacts),
    /// false for user scripts.
    pub predefined: bool,
}

/// How one stage ended.
#[derive(Debug)]
pub enum StageOutcome {
    /// The script exited with this code.
    Exited(i32),
    /// The stage was stopped (cancel, abort, timeout) and its processes killed.
    Stopped(StopReason),
    /// The executor or plugin failed.
    Failed(ExecutorFailure),
}

/// Run `stage` in `session`; `stop` is fired by the caller's controls, and additionally
/// with `TimedOut` once `timeout` elapses.
pub async fn run_stage(
    session: &mut ExecutorSession,
    stage: &Stage,
    stop: StopSignal,
    timeout: Duration,
) -> StageOutcome {
    let timer = {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            stop.stop(StopReason::TimedOut);
        })
    };
    let result = session.run(stage, stop.clone()).await;
    timer.abort();
    match (result, stop.reason()) {
        (_, Some(reason)) => StageOutcome::Stopped(reason),
        (Ok(code), None) => StageOutcome::Exited(code),
        (Err(ExecutorFailure::Canceled), None) => StageOutcome::Stopped(StopReason::Canceled),
        (Err(e), None) => StageOutcome::Failed(e),
    }
}
