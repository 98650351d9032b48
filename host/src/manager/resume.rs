//! Taking stored jobs up again: a runner's store is read when the manager starts, then every
//! `health_interval` with Redis (other managers' leases expire) and every `cleanup_interval`
//! with the file store (only this manager writes it: the sweeps find entries nothing runs). An entry this manager owns (a previous run of it crashed), or whose
//! heartbeat is older than `health_timeout` (its manager is gone; with Redis, another one), is
//! claimed — exactly one manager wins it — and the job goes on where its last checkpoint left
//! it: the trace restored from the store, the executor's environment rebuilt, the running stage
//! reattached, the rest of the stages run, the final update sent.
//!
//! A job that may not go on is failed with `runner_system_failure` and a trace line saying why,
//! and what its previous manager left running is cleaned up: resumed too often
//! (`max_retries`), stale (`stale_timeout`), an executor that cannot resume. A job GitLab
//! cancelled meanwhile is cancelled (its stage stopped) and cleaned up; one GitLab no longer
//! gives us is only cleaned up. A corrupt entry is logged and removed, and the manager goes on.
//!
//! Owns: the store watcher and resuming one stored job. Must not touch: how entries are saved
//! (`super::persist`), polling.

use std::sync::Arc;
use std::time::Duration;

use super::persist::{JobRecord, StoredBody};
use super::received::{job_api, report_and_clean_up, trace_options, unix_now, Acceptance};
use super::{capacity, interrupt_on_shutdown, sleep_or_stop, Runner, Running, Shared};
use crate::gitlab::api::{JobApi, JobState, JobUpdate, RemoteJobStatus, UpdateOutcome};
use crate::job::resume::{abandon_job_until_cleanup, resume_job_until_cleanup};
use crate::job::{JobControl, Progress};
use crate::payload::JobResponse;
use crate::store::jobs::{Backend, Entry, JobStore, JobStoreError, Listed};
use crate::trace::{wire_reason, FailureReason, JobTrace};

type JobSender = tokio::sync::mpsc::UnboundedSender<tokio::task::JoinHandle<()>>;

/// Read `runner`'s store now and then periodically until shutdown, resuming what may be.
pub(super) async fn watch(runner: Arc<Runner>, shared: Arc<Shared>, jobs: JobSender) {
    let Some(store) = runner.settings.store.clone() else { return };
    tracing::info!(runner = %runner.settings.env.identity.short_token, "job store: {}", store.store.describe());
    let every = match store.settings.backend {
        Some(Backend::Redis { .. }) => store.settings.health_interval,
        _ => store.settings.cleanup_interval,
    };
    loop {
        if let Err(e) = scan(&runner, &shared, &*store.store, &jobs).await {
            tracing::warn!(runner = %runner.settings.env.identity.short_token, "reading the job store failed: {e}");
        }
        if shared.shutdown.forceful.is_cancelled() || !sleep_or_stop(every, &shared.shutdown.graceful).await {
            return;
        }
    }
}

/// One pass over the store: claim what is claimable and start resuming it.
async fn scan(
    runner: &Arc<Runner>,
    shared: &Arc<Shared>,
    store: &dyn JobStore,
    jobs: &JobSender,
) -> Result<(), JobStoreError> {
    let Some((settings, store_active)) = runner.settings.store.as_ref().map(|s| (s.settings.clone(), s.active.clone()))
    else {
        return Ok(());
    };
    let me = runner.settings.credentials.system_id.clone();
    // Only this manager writes a file store (its lock says so): its own entries are its
    // previous run's at once. A shared store's are someone's while their heartbeat is fresh.
    let exclusive = matches!(settings.backend, Some(Backend::File { .. }));
    let now = store.now().await?;
    for listed in store.list().await? {
        let meta = match listed {
            Listed::Entry(meta) => meta,
            Listed::Corrupt { job_id, location, error } => {
                tracing::error!(job = ?job_id, %location, "removing a corrupt job store entry: {error}");
                shared.stats.record_resume("corrupt");
                if let Some(id) = job_id {
                    let _ = store.remove(id).await;
                }
                continue;
            }
        };
        let active = store_active.lock().map(|a| a.contains(&(meta.job_id as i64))).unwrap_or(true);
        let expired = now.saturating_sub(meta.heartbeat) > settings.health_timeout.as_secs();
        let claimable = expired || (meta.owner == me && exclusive);
        if active || !claimable {
            if !active && !expired && meta.owner == me {
                // Only with a shared store: a live heartbeat under our own system_id is another
                // process's (a manager restarted so fast its old self's heartbeat is fresh, or
                // a second manager with this system_id). Wait for it to expire.
                tracing::debug!(job = meta.job_id, "stored job of this system_id has a live heartbeat; waiting");
            }
            continue;
        }
        let entry = match store.claim(meta.job_id, &me, settings.health_timeout).await {
            Ok(Some(entry)) => entry,
            Ok(None) => continue,
            Err(e @ JobStoreError::Corrupt { .. }) => {
                drop_entry(shared, store, meta.job_id, "corrupt", &e.to_string()).await;
                continue;
            }
            Err(e) => {
                tracing::warn!(job = meta.job_id, "claiming a stored job failed: {e}");
                continue;
            }
        };
        if meta.owner != me {
            shared.stats.store_takeovers.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tracing::warn!(job = meta.job_id, previous = %meta.owner, "taking over a job whose manager stopped");
        }
        let handle = tokio::spawn(resume_one(runner.clone(), shared.clone(), entry));
        if jobs.send(handle).is_err() {
            return Ok(());
        }
    }
    Ok(())
}

/// Remove an entry that cannot be used, counting why.
async fn drop_entry(shared: &Shared, store: &dyn JobStore, job_id: u64, result: &str, why: &str) {
    tracing::error!(job = job_id, "removing stored job: {why}");
    shared.stats.record_resume(result);
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
async fn resume_one(runner: Arc<Runner>, shared: Arc<Shared>, entry: Entry) {
    let Some(store) = runner.settings.store.clone() else { return };
    let job_id = entry.meta.job_id;
    let body: StoredBody = match serde_json::from_slice(&entry.body) {
        Ok(body) => body,
        Err(e) => return drop_entry(&shared, &*store.store, job_id, "corrupt", &format!("unreadable body: {e}")).await,
    };
    let job: JobResponse = match serde_json::from_str(&body.payload) {
        Ok(job) => job,
        Err(e) => {
            let why = format!("unreadable job payload: {e}");
            return drop_entry(&shared, &*store.store, job_id, "corrupt", &why).await;
        }
    };
    let Some(api) = job_api(&runner, &job) else {
        return drop_entry(&shared, &*store.store, job_id, "corrupt", "no GitLab client for the job").await;
    };
    let restored = match store.store.read_trace(job_id, body.trace.len).await {
        Ok(bytes) => {
            JobTrace::restore(&trace_options(&job, &runner), bytes, body.trace.clone()).map_err(|e| e.to_string())
        }
        Err(e) => Err(e.to_string()),
    };
    let trace = match restored {
        Ok(trace) => trace,
        Err(why) => {
            // Without its trace the job cannot go on: clean up what its manager left running,
            // fail it at GitLab (its log there stays what GitLab has), then forget it.
            if let Ok(scratch) = JobTrace::new(&trace_options(&job, &runner)) {
                let hooks = crate::job::NoHooks;
                let env = &runner.settings.env;
                let why = "its stored trace is unreadable";
                let (_, cleanup) =
                    abandon_job_until_cleanup(&job, env, Arc::new(scratch), &hooks, body.progress, why).await;
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
            return drop_entry(&shared, &*store.store, job_id, "corrupt", &format!("unreadable trace: {why}")).await;
        }
    };
    let standing = standing(&*api, &trace).await;
    let Some(permits) = capacity(&runner, &shared).await else { return };
    let _running = Running::start(&shared, &runner, job.id);

    let mut upload = shared.settings.upload.clone();
    upload.final_update_retry_limit = runner.settings.final_update_retry_limit;
    let control = JobControl::default();
    let interrupt = interrupt_on_shutdown(&shared, &control);
    let progress = Progress::new(body.progress.clone());
    let record = JobRecord::new(
        store.store.clone(),
        entry.meta.clone(),
        body.payload.clone(),
        trace.clone(),
        progress,
        body.trace.len,
        shared.stats.clone(),
    );
    let mut hooks =
        Acceptance::new(api.clone(), runner.client.retry_policy().clone(), trace.clone(), upload, control.clone());
    hooks.record = Some(Arc::new(record));
    hooks.health_interval = store.settings.health_interval;
    let env = runner.settings.env.clone();
    let sink: Arc<dyn crate::trace::TraceSink> = Arc::new(trace.clone());
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
    let (result, ended) = match standing {
        Standing::Gone => {
            tracing::warn!(job = job.id, "stored job is no longer ours at GitLab; cleaning up");
            let ended = abandon_job_until_cleanup(
                &job,
                &env,
                sink,
                &hooks,
                body.progress,
                "GitLab no longer assigns it to this runner",
            )
            .await;
            // Nothing goes to GitLab: clean up and forget.
            ended.1.run().await;
            if let Some(record) = &hooks.record {
                record.finish().await;
            }
            shared.stats.record_resume("gone");
            interrupt.abort();
            drop(permits);
            return;
        }
        Standing::Canceled => {
            hooks.start_uploader(body.acked);
            control.abort_with(FailureReason::JobCanceled);
            ("canceled", resume_job_until_cleanup(&job, &env, sink, &control, &hooks, body.progress).await)
        }
        Standing::Running { .. } if refusal.is_some() => {
            hooks.start_uploader(body.acked);
            let (result, why) = refusal.unwrap_or_default();
            (result, abandon_job_until_cleanup(&job, &env, sink, &hooks, body.progress, &why).await)
        }
        Standing::Running { cancel } => {
            hooks.start_uploader(body.acked);
            if cancel {
                control.cancel.cancel();
            }
            tracing::info!(job = job.id, stage = %entry.meta.stage, resumes = entry.meta.resumes, "resuming a stored job");
            let finished = body.progress.finished;
            let lost = hooks.record.as_ref().map(|r| r.lost()).unwrap_or_default();
            let run = resume_job_until_cleanup(&job, &env, sink, &control, &hooks, body.progress);
            let ended = tokio::select! {
                ended = run => ended,
                _ = lost.cancelled() => {
                    interrupt.abort();
                    return;
                }
            };
            let result = if finished {
                "finished"
            } else if ended.0.message.contains("cannot be resumed") {
                "not_resumable"
            } else {
                "resumed"
            };
            (result, ended)
        }
    };
    let (outcome, cleanup) = ended;
    shared.stats.record_resume(result);
    interrupt.abort();
    report_and_clean_up(job.id, &hooks, &outcome, &job.features.failure_reasons, cleanup).await;
    drop(permits);
}
