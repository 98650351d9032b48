//! One stage of a job as the executor runs it: the [`Stage`] (name, script, whether it needs
//! only helper tooling) and how it ended ([`StageOutcome`]). Running one is the session's
//! (`crate::executor::session::run_stage`).
//!
//! Owns: the stage domain types. Must not touch: which stages run and
//! what their outcome means for the job (that is `crate::job`), plugins' WIT types.

use crate::executor::failure::ExecutorFailure;
use crate::stop::StopReason;

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
