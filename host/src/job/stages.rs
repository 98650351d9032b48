//! The stages of a job in GitLab's order: which run (`when`, failures so far), their
//! timeouts, what cancel and abort stop, what each stage's end means for the outcome — and the
//! two boundaries of every stage where the job's [`Progress`] is brought up to date with the
//! trace and saved through [`JobHooks::boundary`], so a restarted manager can go on from the
//! last boundary (reattaching to a stage that had started).
//!
//! Owns: the stage loop. Must not touch: preparation, the header and footer (`super`).

use std::sync::MutexGuard;

use tokio::time::Instant;

use super::progress::{JobProgress, Progress};
use super::{Boundary, JobControl, JobHooks, JobOutcome};
use crate::executor::{run_stage, ExecutorSession, Stage, StageOutcome};
use crate::payload::StepWhen;
use crate::script::{BuildStage, JobPlan};
use crate::stop::{StopReason, StopSignal};
use crate::trace::format::{section_header_line, SectionOptions};
use crate::trace::{FailureReason, TraceLog, TraceSink};

/// Where the stage loop starts: at the beginning of a fresh job, or where a stored one was.
pub(super) struct StageStart {
    /// Index of the first stage to consider.
    pub index: usize,
    /// That stage had started (reattach to it: no section start, no `when` check).
    pub running: bool,
    /// The outcome so far.
    pub outcome: JobOutcome,
    /// When the stages began (timeouts count from here).
    pub started: Instant,
}

/// Lock the job's progress, when it is kept, for one boundary.
fn boundary(progress: &Option<Progress>) -> Option<MutexGuard<'_, JobProgress>> {
    progress.as_ref().map(Progress::lock)
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
        BuildStage::AfterScript | BuildStage::CleanupFileVariables | BuildStage::ClearWorktree => true,
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

pub(super) async fn run_stages(
    plan: &JobPlan,
    session: &mut ExecutorSession,
    trace: &dyn TraceSink,
    control: &JobControl,
    hooks: &dyn JobHooks,
    start: StageStart,
) -> JobOutcome {
    let started = start.started;
    let job_timeout = plan.job_timeout();
    let progress = hooks.progress();
    let mut outcome = start.outcome;
    for (index, stage) in plan.stages().into_iter().enumerate().skip(start.index) {
        let reattach = start.running && index == start.index;
        if control.abort.is_cancelled() {
            outcome.aborted = true;
            break;
        }
        if !reattach && !should_run(plan, &stage, outcome.failure.is_some()) {
            continue;
        }
        let is_after_script = matches!(stage, BuildStage::AfterScript);
        let status = if is_after_script { outcome.status_word() } else { "running" };
        let script = match plan.script(&stage, status) {
            Ok(s) => s,
            Err(e) => {
                {
                    let mut progress = boundary(&progress);
                    trace.error(&e.to_string());
                    outcome = JobOutcome::failed(FailureReason::RunnerSystemFailure, None, e.to_string());
                    if let Some(p) = progress.as_deref_mut() {
                        (p.stage, p.running) = (index + 1, false);
                        p.set_outcome(&outcome);
                    }
                }
                hooks.boundary(Boundary::StageUnscripted).await;
                continue;
            }
        };
        let timeout = match stage {
            BuildStage::AfterScript => plan.after_script_timeout(),
            BuildStage::Step(_) => plan.script_timeout().min(job_timeout.saturating_sub(started.elapsed())),
            _ => job_timeout.saturating_sub(started.elapsed()),
        };
        let name = stage.name();
        // Boundary: the stage starts (or is reattached to, its section already open).
        let executor_state = if progress.is_some() { session.state().await } else { None };
        {
            let mut progress = boundary(&progress);
            if !reattach {
                trace.section_start(&name, SectionOptions::default());
                trace.write_str(&section_header_line(&stage.description()));
            }
            if let Some(p) = progress.as_deref_mut() {
                (p.stage, p.running) = (index, true);
                p.stage_name.clone_from(&name);
                p.executor_state = executor_state;
            }
        }
        hooks.boundary(Boundary::StageStarted(&name)).await;
        let stage_started = std::time::Instant::now();
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
        let attempts = plan.attempts(&stage);
        let mut result = StageOutcome::Exited(0);
        for attempt in 1..=attempts {
            let script_stage = Stage { name: name.clone(), script: script.clone(), predefined: stage.predefined() };
            result = run_stage(session, &script_stage, stop.clone(), timeout).await;
            if matches!(result, StageOutcome::Exited(0)) || attempt == attempts || stop.is_stopped() {
                break;
            }
            let wait = plan.stage_retry_backoff(attempt);
            trace.warning(&format!("Retrying {name} in {wait:?} (attempt {} of {attempts})", attempt + 1));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.stopped() => break,
            }
            // gitlab-runner's retry callback: clear_worktree before get_sources' second try.
            if attempt == 1 && stage == BuildStage::GetSources {
                clear_worktree(plan, session, trace, stop.clone(), timeout).await;
            }
        }
        watcher.abort();
        let duration = stage_started.elapsed();

        // Boundary: the stage ended; its section closes with what its end means.
        let last = {
            let mut progress = boundary(&progress);
            trace.section_end(&name);
            let last = stage_ended(plan, &stage, &name, result, timeout, trace, control, &mut outcome);
            if let Some(p) = progress.as_deref_mut() {
                (p.stage, p.running) = (index + 1, false);
                p.set_outcome(&outcome);
            }
            last
        };
        hooks.boundary(Boundary::StageEnded(&name, duration)).await;
        if last {
            break;
        }
    }
    outcome
}

/// gitlab-runner's clear_worktree stage, once, before get_sources' second attempt: its own
/// section; a failure there is only a warning (the retry decides).
async fn clear_worktree(
    plan: &JobPlan,
    session: &mut ExecutorSession,
    trace: &dyn TraceSink,
    stop: StopSignal,
    timeout: std::time::Duration,
) {
    let stage = BuildStage::ClearWorktree;
    let name = stage.name();
    let script = match plan.script(&stage, "running") {
        Ok(script) => script,
        Err(e) => return trace.warning(&e.to_string()),
    };
    trace.section_start(&name, SectionOptions::default());
    trace.write_str(&section_header_line(&stage.description()));
    let result =
        run_stage(session, &Stage { name: name.clone(), script, predefined: stage.predefined() }, stop, timeout).await;
    if !matches!(result, StageOutcome::Exited(0)) {
        trace.warning(&format!("{name} failed: {result:?}"));
    }
    trace.section_end(&name);
}

/// What a stage's end means for the outcome, with its trace lines; `true` when no further
/// stage may run (abort, an unusable plugin).
#[allow(clippy::too_many_arguments)]
fn stage_ended(
    plan: &JobPlan,
    stage: &BuildStage,
    name: &str,
    result: StageOutcome,
    timeout: std::time::Duration,
    trace: &dyn TraceSink,
    control: &JobControl,
    outcome: &mut JobOutcome,
) -> bool {
    let is_after_script = matches!(stage, BuildStage::AfterScript);
    let job_timeout = plan.job_timeout();
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
                *outcome = JobOutcome::failed(FailureReason::ScriptFailure, Some(code), format!("exit code {code}"));
            }
        }
        StageOutcome::Stopped(reason) => {
            if control.abort.is_cancelled() {
                let why = control.abort_reason.lock().ok().and_then(|r| *r).unwrap_or(FailureReason::JobCanceled);
                *outcome = JobOutcome { aborted: true, ..JobOutcome::failed(why, None, "job aborted") };
                return true;
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
                        *outcome = JobOutcome::failed(
                            FailureReason::JobExecutionTimeout,
                            None,
                            format!("execution took longer than {} seconds", limit.as_secs()),
                        );
                    }
                }
                StopReason::Canceled => {
                    trace.error("script canceled externally (UI, API)");
                    *outcome = JobOutcome::failed(FailureReason::JobCanceled, None, "canceled");
                }
            }
        }
        StageOutcome::Failed(e) => {
            trace.error(&e.to_string());
            if outcome.failure.is_none() || is_after_script {
                *outcome = JobOutcome::failed(FailureReason::RunnerSystemFailure, None, e.to_string());
            }
            if e.is_plugin_failure() {
                // The plugin instance is unusable after a trap; nothing else can run.
                return true;
            }
        }
    }
    false
}
