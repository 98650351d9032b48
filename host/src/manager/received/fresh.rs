//! A job fresh from the poll: kept `pending` at GitLab (keep-alives) while it waits for
//! capacity when GitLab holds it pending (two-phase commit: a Runway router, a GitLab with
//! `allow_runner_job_acknowledgement` on), accepted at once as gitlab-runner does when GitLab
//! handed it out `running`; given its store entry and its `CI_CONCURRENT_*` slot, run, and
//! ended — declined back to a Runway router when this runner could not prepare it, reported
//! otherwise.
//!
//! Owns: [`run`] and the decline. Must not touch: polling (`crate::manager`), the teardown
//! (`super::Received::end`).

use std::sync::Arc;

use super::gitlab::StageReport;
use super::terminal::JobTerminal;
use super::{bad, unix_now, Ending, GitLabSide, JobContext, Received, Reservation};
use crate::gitlab::client::{ApiError, BadJob, ReceivedJob};
use crate::job::{run_job_until_cleanup, JobControl, JobOutcome, JobProgress, Progress};
use crate::manager::observe::{FinishedJob, ProcessingFailure};
use crate::manager::persist::JobRecord;
use crate::payload::{flags, JobResponse};
use crate::store::jobs::EntryMeta;
use crate::trace::format::TraceLog;
use crate::trace::{wire_reason, FailureReason, JobTrace};

/// Run `received`, fresh from the poll, on the fleet slot `reservation` when the runner has
/// a fleet, to its final update.
pub(crate) async fn run(mut ctx: JobContext, received: ReceivedJob, reservation: Option<Reservation>) {
    let ReceivedJob { raw, job, declinable } = received;
    // Never run a job whose secrets cannot be masked: fail it with only the error in its log.
    let trace = match JobTrace::new(&ctx.trace_options(&job)) {
        Ok(t) => t,
        Err(e) => {
            let error = format!("cannot set up masking for this job's log: {e}");
            let bad = BadJob {
                id: job.id,
                token: job.token.clone(),
                error,
                failure_reasons: job.features.failure_reasons.clone(),
            };
            return bad::fail(ctx, bad).await;
        }
    };
    let Some(api) = ctx.job_api(&job) else { return };
    let control = JobControl::default();
    let side = GitLabSide::new(api, trace.clone(), control.clone(), ctx.retry(), ctx.job_upload());
    let side = match ctx.session.take() {
        Some((session, timeout)) => {
            side.with_terminal(JobTerminal::new(session, timeout, control.clone(), trace.clone()))
        }
        None => side,
    };
    let side = if held_pending(&ctx, &job, declinable).await {
        side.keeping_pending(ctx.pending_keepalive)
    } else {
        // GitLab handed the job out `running`: a `PUT state=pending` would be refused (400).
        // Take it now, as gitlab-runner does, so its trace and keep-alives flow while it
        // waits for capacity and prepares.
        if let Err(e) = side.accept().await {
            tracing::warn!(job = job.id, "job dropped: {e}");
            return;
        }
        side
    };

    // Wait for capacity (while the job stays pending at GitLab, when it does).
    let Some(seat) = ctx.capacity.seat(job.id, Some(job.job_info.project_id), &control).await else {
        side.stop_keepalive();
        if side.accepted() {
            let message = "the runner stopped before the job could start".to_string();
            trace.error(&message);
            let outcome = JobOutcome::failed(FailureReason::RunnerInterrupted, None, message);
            side.report(job.id, &outcome, &job.features.failure_reasons).await;
        }
        return;
    };
    let observer = ctx.observer.clone();
    observer.job_received(&ctx.env.identity, job.id, &job.job_info);
    for message in flags::notice_unsupported(flags::job_flags(&job)) {
        tracing::warn!(job = job.id, "{message}");
    }
    let mut side = side.reporting_stages(StageReport::new(observer.clone(), &ctx.env, &job));
    if let Some(store) = &ctx.store {
        let meta = EntryMeta {
            job_id: u64::try_from(job.id).unwrap_or_default(),
            owner: ctx.system_id.clone(),
            created: unix_now(),
            heartbeat: 0,
            resumes: 0,
            stage: String::new(),
            project: job.job_info.project_full_path.clone(),
        };
        let payload = String::from_utf8_lossy(&raw).into_owned();
        let progress = Progress::new(JobProgress::default());
        let record = JobRecord::new(store.store.clone(), meta, payload, trace.clone(), progress, 0, ctx.stats.clone());
        side = side.stored_in(record, store.settings.health_interval);
    }
    let mut env = ctx.env.clone();
    if let Some((concurrent_id, concurrent_project_id)) = seat.concurrent_ids() {
        env.settings.concurrent_id = concurrent_id;
        env.settings.concurrent_project_id = concurrent_project_id;
    }
    let mut reservation = reservation;
    if let Some(reservation) = &mut reservation {
        // On a fleet, the job runs on the reserved slot's instance (the runner's own lease, an
        // `ssh` executor's host, stays otherwise).
        env.instance = Some(reservation.lease(job.id, &control, &trace));
    }
    let received = Received::new(job.id, job.features.failure_reasons.clone(), side, Some(seat), reservation);

    let started = std::time::Instant::now();
    let lost = received.side().lost();
    let run = run_job_until_cleanup(&job, &env, Arc::new(trace.clone()), &control, received.side());
    let ended = tokio::select! {
        ended = run => Some(ended),
        // Another manager resumed the job: it is theirs now, trace, update and cleanup.
        _ = lost.cancelled() => None,
    };
    let Some((outcome, cleanup)) = ended else { return received.end(Ending::Lost).await };
    if declinable && outcome.preparation_failed && !received.side().accepted() {
        // Behind a Runway router: hand the job back so another runner can take it.
        match decline(&ctx, &job, &outcome.message).await {
            Ok(()) => {
                tracing::warn!(job = job.id, error = %outcome.message, "preparation failed; job declined back to the router");
                return received.end(Ending::Unreported(cleanup)).await;
            }
            Err(e) => tracing::warn!(job = job.id, "declining the job failed ({e}); failing it instead"),
        }
    }
    let wire_failure = outcome.failure.map(|r| wire_reason(Some(r), &job.features.failure_reasons));
    ctx.stats.record(wire_failure.as_deref(), started.elapsed());
    let finished = FinishedJob {
        id: job.id,
        executor: &ctx.env.settings.executor,
        duration: started.elapsed(),
        failure: wire_failure.as_deref(),
    };
    observer.job_finished(&ctx.env.identity, &finished);
    if wire_failure.is_some() {
        observer.processing_failure(&ctx.env.identity, ProcessingFailure::JobFailure);
    }
    received.end(Ending::Reported(outcome, Some(cleanup))).await;
}

/// Does GitLab hold `job` pending until this runner accepts it? A Runway router (`from_router`)
/// always does; GitLab does only with two-phase commit on, which `GET /api/v4/job` tells. No
/// answer: treat it as handed out `running` (accepting early is valid either way).
async fn held_pending(ctx: &JobContext, job: &JobResponse, from_router: bool) -> bool {
    if from_router {
        return true;
    }
    let held = match ctx.job_client(job.id, &job.token) {
        Ok(client) => client.held_pending().await,
        Err(e) => Err(e),
    };
    match held {
        Ok(held) => {
            tracing::debug!(job = job.id, held, "GitLab holds the job pending until accepted (two-phase commit)");
            held
        }
        Err(e) => {
            tracing::warn!(job = job.id, "cannot tell whether GitLab holds the job pending ({e}); accepting it now");
            false
        }
    }
}

/// `POST /jobs/:id/runner_provisioning` `status=declined` to the router `job` came from.
async fn decline(ctx: &JobContext, job: &JobResponse, reason: &str) -> Result<(), ApiError> {
    ctx.job_client(job.id, &job.token)?.decline(reason).await
}
