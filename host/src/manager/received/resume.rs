//! A stored job taken up again (claimed by the store watcher, `crate::manager::resume`): its
//! trace restored from the store, GitLab asked where it stands, then — with capacity — it goes
//! on where its last checkpoint left it, is failed without going on (resumed too often,
//! stale, an executor that cannot resume), is cancelled, or, when GitLab no longer gives it to
//! us, is only cleaned up. A corrupt entry is logged and removed.
//!
//! Owns: [`resume`], [`drop_entry`]. Must not touch: claiming entries (the watcher), how
//! entries are saved (`crate::manager::persist`), the teardown (`super::Received::end`).

use std::sync::Arc;
use std::time::Duration;

use super::{unix_now, Ending, GitLabSide, JobContext, Received, Reservation};
use crate::executor::InstanceLease;
use crate::gitlab::api::{JobApi, JobState, JobUpdate, RemoteJobStatus, UpdateOutcome};
use crate::job::progress::{StoredInstance, StoredSecret};
use crate::job::resume::{abandon_job_until_cleanup, resume_job_until_cleanup, Resumed};
use crate::job::{JobControl, JobEnvironment, NoHooks, Progress};
use crate::manager::fleet::Reattached;
use crate::manager::persist::{JobRecord, StoredBody};
use crate::manager::ManagerStats;
use crate::payload::JobResponse;
use crate::store::jobs::{Entry, JobStore};
use crate::trace::{wire_reason, FailureReason, JobTrace, TraceSink};

/// Remove an entry that cannot be used, counting why (`result`).
pub(crate) async fn drop_entry(stats: &ManagerStats, store: &dyn JobStore, job_id: u64, result: &str, why: &str) {
    tracing::error!(job = job_id, "removing stored job: {why}");
    stats.record_resume(result);
    if let Err(e) = store.remove(job_id).await {
        tracing::warn!(job = job_id, "removing the job from the store failed: {e}");
    }
}

/// What GitLab says of a stored job before it goes on.
enum Standing {
    /// Still running: go on (`cancel`: a graceful cancel was asked meanwhile).
    Running { cancel: bool },
    /// Cancelled meanwhile: stop it, clean up.
    Canceled,
    /// Not ours any more (403/404/409): only clean up.
    Gone,
}

async fn standing(api: &dyn JobApi, trace: &JobTrace) -> Standing {
    let (checksum, bytesize) = trace.output_info();
    let update =
        JobUpdate { checksum: Some(checksum), bytesize: Some(bytesize), ..JobUpdate::state(JobState::Running) };
    let response = api.update_job(&update).await;
    match (response.outcome, response.remote_status) {
        (UpdateOutcome::Abort | UpdateOutcome::Conflict, _) => Standing::Gone,
        (_, RemoteJobStatus::Abort) => Standing::Canceled,
        (_, RemoteJobStatus::CancelRequested) => Standing::Running { cancel: true },
        // No answer: go on; the trace loop learns the rest.
        _ => Standing::Running { cancel: false },
    }
}

/// Take stored job `entry` up again.
pub(crate) async fn resume(ctx: JobContext, entry: Entry) {
    let Some(store) = ctx.store.clone() else { return };
    let stats = &*ctx.stats;
    let job_id = entry.meta.job_id;
    let body: StoredBody = match serde_json::from_slice(&entry.body) {
        Ok(body) => body,
        Err(e) => return drop_entry(stats, &*store.store, job_id, "corrupt", &format!("unreadable body: {e}")).await,
    };
    let job: JobResponse = match serde_json::from_str::<JobResponse>(&body.payload) {
        // The secrets it resolved before it was accepted, as it had them (masked, raw).
        Ok(mut job) => {
            job.variables.extend(body.progress.secrets.iter().map(StoredSecret::variable));
            job
        }
        Err(e) => {
            let why = format!("unreadable job payload: {e}");
            return drop_entry(stats, &*store.store, job_id, "corrupt", &why).await;
        }
    };
    let Some(api) = ctx.job_api(&job) else {
        return drop_entry(stats, &*store.store, job_id, "corrupt", "no GitLab client for the job").await;
    };
    let restored = match store.store.read_trace(job_id, body.trace.len).await {
        Ok(bytes) => JobTrace::restore(&ctx.trace_options(&job), bytes, body.trace.clone()).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let trace = match restored {
        Ok(trace) => trace,
        Err(why) => {
            // Without its trace the job cannot go on: clean up what its manager left running,
            // fail it at GitLab (its log there stays what GitLab has), then forget it.
            if let Ok(scratch) = JobTrace::new(&ctx.trace_options(&job)) {
                let why = "its stored trace is unreadable";
                let (_, cleanup) =
                    abandon_job_until_cleanup(&job, &ctx.env, Arc::new(scratch), &NoHooks, body.progress, why).await;
                cleanup.run().await;
            }
            let update = JobUpdate {
                failure_reason: Some(wire_reason(
                    Some(FailureReason::RunnerSystemFailure),
                    &job.features.failure_reasons,
                )),
                ..JobUpdate::state(JobState::Failed)
            };
            let _ = api.update_job(&update).await;
            return drop_entry(stats, &*store.store, job_id, "corrupt", &format!("unreadable trace: {why}")).await;
        }
    };
    let standing = standing(&*api, &trace).await;
    let control = JobControl::default();
    let Some(seat) = ctx.capacity.seat(job.id, None, &control).await else { return };

    let progress = Progress::new(body.progress.clone());
    let record = JobRecord::new(
        store.store.clone(),
        entry.meta.clone(),
        body.payload.clone(),
        trace.clone(),
        progress,
        body.trace.len,
        ctx.stats.clone(),
    );
    let side = GitLabSide::new(api, trace.clone(), control.clone(), ctx.retry(), ctx.job_upload())
        .stored_in(record, store.settings.health_interval);
    let sink: Arc<dyn TraceSink> = Arc::new(trace.clone());
    let (env, reservation) = on_its_instance(&ctx, &job, body.progress.instance.as_ref(), &control, &sink);
    let received = Received::new(job.id, job.features.failure_reasons.clone(), side, Some(seat), reservation);
    let hooks = received.side();
    let env = &env;
    let age = unix_now().saturating_sub(entry.meta.created);
    let refusal = if entry.meta.resumes > store.settings.max_retries {
        Some((
            "max_retries",
            format!("it was resumed {} times (max_retries = {})", entry.meta.resumes - 1, store.settings.max_retries),
        ))
    } else if Duration::from_secs(age) > store.settings.stale_timeout {
        Some((
            "stale",
            format!("its entry is {age} s old (stale_timeout = {} s)", store.settings.stale_timeout.as_secs()),
        ))
    } else {
        None
    };
    let (result, (outcome, cleanup)) = match (standing, refusal) {
        (Standing::Gone, _) => {
            tracing::warn!(job = job.id, "stored job is no longer ours at GitLab; cleaning up");
            let why = "GitLab no longer assigns it to this runner";
            let (_, cleanup) = abandon_job_until_cleanup(&job, env, sink, hooks, body.progress, why).await;
            // Nothing goes to GitLab: clean up and forget.
            received.end(Ending::Unreported(cleanup)).await;
            stats.record_resume("gone");
            return;
        }
        (Standing::Canceled, _) => {
            hooks.start_uploader(body.acked);
            control.abort_with(FailureReason::JobCanceled);
            let Resumed { outcome, cleanup, .. } =
                resume_job_until_cleanup(&job, env, sink, &control, hooks, body.progress).await;
            ("canceled", (outcome, cleanup))
        }
        (Standing::Running { .. }, Some((result, why))) => {
            hooks.start_uploader(body.acked);
            (result, abandon_job_until_cleanup(&job, env, sink, hooks, body.progress, &why).await)
        }
        (Standing::Running { cancel }, None) => {
            hooks.start_uploader(body.acked);
            if cancel {
                control.cancel.cancel();
            }
            tracing::info!(job = job.id, stage = %entry.meta.stage, resumes = entry.meta.resumes, "resuming a stored job");
            let finished = body.progress.finished;
            let lost = hooks.lost();
            let run = resume_job_until_cleanup(&job, env, sink, &control, hooks, body.progress);
            let ended = tokio::select! {
                ended = run => Some(ended),
                _ = lost.cancelled() => None,
            };
            let Some(Resumed { outcome, cleanup, refused }) = ended else {
                return received.end(Ending::Lost).await;
            };
            let result = match (finished, refused) {
                (true, _) => "finished",
                (false, Some(_)) => "not_resumable",
                (false, None) => "resumed",
            };
            (result, (outcome, cleanup))
        }
    };
    stats.record_resume(result);
    received.end(Ending::Reported(outcome, Some(cleanup))).await;
}

/// The environment of a stored job that ran on fleet instance `stored`: a lease back to that
/// instance (never another), and — when this manager held the job's slot across its restart —
/// the slot, freed when the job ends. A job another manager ran reaches the instance without a
/// slot here (its own manager's fleet holds it).
fn on_its_instance(
    ctx: &JobContext,
    job: &JobResponse,
    stored: Option<&StoredInstance>,
    control: &JobControl,
    trace: &Arc<dyn TraceSink>,
) -> (JobEnvironment, Option<Reservation>) {
    let mut env = ctx.env.clone();
    let (Some(stored), Some(fleet)) = (stored, &ctx.fleet) else { return (env, None) };
    let (key, reservation) = match fleet.reattach(job.id) {
        Some((key, instance)) if instance == stored.id => {
            fleet.track(&key, control.clone(), trace.clone());
            (key.clone(), Some(Reservation::new(fleet.clone(), key)))
        }
        Some((key, instance)) => {
            // Not the instance the job stored: free that slot, reach the job's own.
            tracing::warn!(job = job.id, instance, stored = %stored.id, "the held slot is on another instance than the job's; releasing it");
            let held = Reservation::new(fleet.clone(), key.clone());
            tokio::spawn(held.finish(false));
            (key, None)
        }
        None => {
            tracing::info!(job = job.id, instance = %stored.id, "no slot held for the job here (another manager ran it); reconnecting to its instance");
            (fleet.job_key(job.id), None)
        }
    };
    let source = Reattached { fleet: fleet.clone(), instance: stored.id.clone(), stored: stored.reconnect.clone() };
    env.instance = Some(InstanceLease { source: Arc::new(source), key });
    (env, reservation)
}
