//! The router's side facing GitLab: workers per `[[router.upstream]]` that ask for jobs only
//! while downstream runners want them (`State::claim_fetch`), sending the waiting runner's
//! `info` with two-phase commit on; the `PUT state=pending` keep-alives of every job not yet
//! accepted; the acceptance the router makes itself for runners without two-phase commit; the
//! deadlines (an offer not accepted in time goes back to the queue, an accepted job whose
//! runner went silent is failed); and failing a job at GitLab with `runner_system_failure`
//! and a line in its log when no runner can or will run it.
//!
//! GitLab's 409 (someone else took the job), 429 and `Retry-After` are handled by the client's
//! retry policy and by backing off here after failed requests. Owns these tasks. Must not
//! answer downstream HTTP (`downstream`) or write the store itself (`persist`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::persist;
use super::state::{Phase, Routed, State};
use super::stats::DeclineReason;
use super::{Inner, Upstream, CHECK_INTERVAL};
use crate::gitlab::api::{JobApi, JobState, JobUpdate, PatchOutcome, UpdateOutcome};
use crate::gitlab::client::{JobClient, ReceivedJob, RequestJobResult, RunnerCredentials};

/// How often offers and leases are checked against their deadlines.
const SWEEP: Duration = Duration::from_millis(250);

/// Start the upstream workers and the keep-alive, deadline and heartbeat tasks.
pub(super) fn spawn(inner: &Arc<Inner>) {
    for (u, upstream) in inner.settings.upstreams.iter().enumerate() {
        for _ in 0..upstream.request_concurrency {
            tokio::spawn(worker(inner.clone(), u));
        }
    }
    let every =
        |period: Duration, inner: &Arc<Inner>, task: fn(Arc<Inner>) -> futures::future::BoxFuture<'static, ()>| {
            let inner = inner.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                tick.tick().await;
                loop {
                    tokio::select! {
                        _ = tick.tick() => task(inner.clone()).await,
                        _ = inner.stop.cancelled() => return,
                    }
                }
            });
        };
    every(SWEEP, inner, |i| Box::pin(async move { sweep(&i).await }));
    every(inner.settings.keepalive_interval, inner, |i| Box::pin(async move { keep_alive(&i).await }));
    if inner.settings.store.is_some() {
        every(inner.settings.health_interval, inner, |i| Box::pin(async move { persist::heartbeat(&i).await }));
    }
}

/// One upstream request slot of upstream `u`.
async fn worker(inner: Arc<Inner>, u: usize) {
    let Some(upstream) = inner.settings.upstreams.get(u) else { return };
    let creds = RunnerCredentials {
        url: upstream.url.clone(),
        token: upstream.token.clone(),
        system_id: inner.settings.router_id.clone(),
    };
    let mut failures = 0u32;
    loop {
        let info = loop {
            let notified = inner.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let claimed = {
                let mut st = inner.lock();
                st.claim_fetch(u, inner.settings.queue_size, inner.settings.long_poll_timeout)
            };
            if let Some(info) = claimed {
                break info;
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = inner.stop.cancelled() => return,
            }
        };
        let info = with_two_phase(info);
        let result = tokio::select! {
            r = upstream.client.request_job(&creds, &info) => Some(r),
            _ = inner.stop.cancelled() => None,
        };
        inner.lock().fetch_done(u);
        let Some(result) = result else { return };
        let pause = match result {
            RequestJobResult::Job(received) => {
                failures = 0;
                inner.stats.upstream_request(u, "job");
                enqueue(&inner, u, *received).await;
                None
            }
            RequestJobResult::PollAgain => {
                inner.stats.upstream_request(u, "no_job");
                None
            }
            RequestJobResult::NoJob => {
                failures = 0;
                inner.stats.upstream_request(u, "no_job");
                Some(CHECK_INTERVAL)
            }
            RequestJobResult::BadPayload(bad) => {
                inner.stats.upstream_request(u, "job");
                tracing::error!(job = bad.id, "GitLab sent a job payload that does not decode: {}", bad.error);
                let client =
                    JobClient::new(upstream.client.clone(), &upstream.url, bad.id, &bad.token, inner.info.clone());
                if let Ok(api) = client {
                    inner.stats.failed("bad_payload");
                    fail_at_gitlab(&api, false, 0, &format!("the job's payload cannot be read: {}", bad.error)).await;
                }
                None
            }
            RequestJobResult::Unhealthy(e) => Some(request_failed(&inner, upstream, u, &mut failures, &e)),
            RequestJobResult::Failed(e) => Some(request_failed(&inner, upstream, u, &mut failures, &e)),
        };
        if let Some(pause) = pause {
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = inner.stop.cancelled() => return,
            }
        }
    }
}

/// A job request to upstream `u` that failed (`error`): count it, and how long to wait.
fn request_failed(
    inner: &Inner,
    upstream: &Upstream,
    u: usize,
    failures: &mut u32,
    error: &dyn std::fmt::Display,
) -> Duration {
    *failures += 1;
    inner.stats.upstream_request(u, "error");
    let wait = upstream.client.retry_policy().backoff(*failures + 3).min(Duration::from_secs(60));
    tracing::warn!(upstream = %upstream.url, %error, ?wait, "job request to GitLab failed");
    wait
}

/// The downstream runner's `info` with `two_phase_job_commit` on: the router, not the runner,
/// tells GitLab when the job runs.
fn with_two_phase(mut info: serde_json::Value) -> serde_json::Value {
    if !info.is_object() {
        info = serde_json::json!({});
    }
    if let Some(obj) = info.as_object_mut() {
        let features = obj.entry("features").or_insert_with(|| serde_json::json!({}));
        if let Some(f) = features.as_object_mut() {
            f.insert("two_phase_job_commit".into(), true.into());
        }
    }
    info
}

/// A job GitLab handed out: hold it (store first), then give it to a waiting runner.
async fn enqueue(inner: &Arc<Inner>, u: usize, received: ReceivedJob) {
    let seq = inner.lock().take_seq();
    let job = match Routed::from_payload(received.job.id, received.job.token.clone(), u, received.raw.clone(), seq) {
        Ok(j) => j,
        Err(e) => {
            tracing::error!(job = received.job.id, "cannot hold job: {e}");
            return;
        }
    };
    let id = job.origin.id;
    if !State::anyone_may_take(&inner.settings.downstreams, &job) {
        tracing::error!(job = id, tags = ?job.origin.tags, "no downstream takes this job's tags; failing it");
        inner.stats.failed("no_downstream");
        if let Some(api) = job_api(inner, u, id, &job.origin.token) {
            let message = format!("no runner behind this router takes the job's tags {:?}", job.origin.tags);
            fail_at_gitlab(&api, false, 0, &message).await;
        }
        return;
    }
    // Held and handed out under one lock, then saved once in its latest state (queued, or
    // offered to the runner that was waiting): one store write, not two, per job dispatched at
    // once.
    let handed = {
        let mut st = inner.lock();
        st.insert(job);
        if let Some(j) = st.jobs.get_mut(&id) {
            j.version = 1;
        }
        st.hand_out(&inner.settings.downstreams, inner.settings.accept_timeout)
    };
    if !handed.iter().any(|h| h.id == id) {
        persist::save(inner, id).await;
    }
    persist::after_hand_out(inner, handed).await;
}

/// The job calls of held job `id` at its GitLab, as the router.
pub(super) fn job_api(inner: &Inner, upstream: usize, id: i64, token: &str) -> Option<JobClient> {
    let u = inner.settings.upstreams.get(upstream)?;
    JobClient::new(u.client.clone(), &u.url, id, token, inner.info.clone()).ok()
}

/// What the router's own acceptance came to.
pub(super) enum Accept {
    /// Running at GitLab.
    Accepted,
    /// GitLab no longer has it for us (canceled, someone else's).
    Gone,
    /// No decision (GitLab unreachable or erring).
    Unavailable(String),
}

/// `PUT state=running` for held job `id` (the first call of a runner without two-phase
/// commit for it, or a runner accepting through `runner_provisioning`).
pub(super) async fn accept(inner: &Arc<Inner>, id: i64) -> Accept {
    let target = inner.lock().jobs.get(&id).map(|j| (j.origin.upstream, j.origin.token.clone()));
    let Some((u, token)) = target else { return Accept::Gone };
    let Some(api) = job_api(inner, u, id, &token) else { return Accept::Unavailable("no upstream".into()) };
    match api.update_job(&JobUpdate::state(JobState::Running)).await.outcome {
        UpdateOutcome::Accepted | UpdateOutcome::AcceptedRetryLater(_) => Accept::Accepted,
        UpdateOutcome::Abort | UpdateOutcome::Conflict => Accept::Gone,
        other => Accept::Unavailable(format!("{other:?}")),
    }
}

/// Let go of job `id` for good (finished, failed, gone at GitLab).
pub(super) async fn release(inner: &Arc<Inner>, id: i64) {
    let removed = inner.lock().remove(id);
    if let Some(job) = removed {
        persist::forget(inner, &job).await;
    }
    inner.wake.notify_waiters();
}

/// Job `id` goes back to the queue; `by` never gets it again. When nobody else may take it,
/// it is failed at GitLab.
pub(super) async fn give_back(inner: &Arc<Inner>, id: i64, by: Option<usize>, reason: DeclineReason) {
    let (handed, stranded) = {
        let mut st = inner.lock();
        if !st.requeue(id, by) {
            return;
        }
        let stranded = st.jobs.get(&id).is_some_and(|j| !State::anyone_may_take(&inner.settings.downstreams, j));
        let handed =
            if stranded { Vec::new() } else { st.hand_out(&inner.settings.downstreams, inner.settings.accept_timeout) };
        (handed, stranded)
    };
    if let Some(d) = by {
        inner.stats.declined(d, reason);
        let name = inner.settings.downstreams.get(d).map(|x| x.name.as_str()).unwrap_or("?");
        tracing::warn!(
            job = id,
            downstream = name,
            reason = reason.as_str(),
            "job given back; offering it to another runner"
        );
    }
    persist::save(inner, id).await;
    persist::after_hand_out(inner, handed).await;
    if stranded {
        inner.stats.failed("declined_by_all");
        fail(
            inner,
            id,
            "every runner behind this router that could take the job declined it or did not accept it in time",
        )
        .await;
    }
    inner.wake.notify_waiters();
}

/// Fail held job `id` at GitLab with `runner_system_failure` and `message` in its log, then let
/// go of it.
pub(super) async fn fail(inner: &Arc<Inner>, id: i64, message: &str) {
    let target = {
        let mut st = inner.lock();
        st.queue.remove(id);
        st.jobs.get_mut(&id).map(|j| {
            j.failing = true;
            (
                j.origin.upstream,
                j.origin.token.clone(),
                matches!(j.phase, Phase::Accepted { .. }),
                j.upstream_trace_size,
            )
        })
    };
    let Some((u, token, accepted, size)) = target else { return };
    tracing::error!(job = id, "failing the job at GitLab: {message}");
    if let Some(api) = job_api(inner, u, id, &token) {
        fail_at_gitlab(&api, accepted, size, message).await;
    }
    release(inner, id).await;
}

/// Accept (unless `accepted`), append `message` as an error line at `offset` of the trace
/// (where GitLab says, after a 416), and send `failed` with `runner_system_failure`.
async fn fail_at_gitlab(api: &JobClient, accepted: bool, offset: u64, message: &str) {
    if !accepted {
        let outcome = api.update_job(&JobUpdate::state(JobState::Running)).await.outcome;
        if matches!(outcome, UpdateOutcome::Abort | UpdateOutcome::Conflict) {
            return;
        }
    }
    let line = format!("\n\x1b[31;1mERROR: Job failed (runway router): {message}\x1b[0;m\n");
    let mut offset = offset;
    for _ in 0..3 {
        match api.patch_trace(offset, line.as_bytes()).await.outcome {
            PatchOutcome::RangeMismatch { server_size } if server_size != offset => offset = server_size,
            _ => break,
        }
    }
    let update = JobUpdate {
        state: JobState::Failed,
        failure_reason: Some("runner_system_failure".into()),
        exit_code: None,
        checksum: None,
        bytesize: None,
    };
    for attempt in 1..=10u32 {
        match api.update_job(&update).await.outcome {
            UpdateOutcome::AcceptedRetryLater(wait) => tokio::time::sleep(wait.min(Duration::from_secs(10))).await,
            UpdateOutcome::Unavailable(_) => tokio::time::sleep(Duration::from_secs(u64::from(attempt))).await,
            _ => return,
        }
    }
}

/// Offers past their deadline go back to the queue; accepted jobs whose runner is silent past
/// `lease_timeout` are failed.
async fn sweep(inner: &Arc<Inner>) {
    let now = Instant::now();
    let lease = inner.settings.lease_timeout;
    type Holders = Vec<(i64, Option<usize>)>;
    let (expired, lost): (Holders, Holders) = {
        let mut st = inner.lock();
        let mut expired = Vec::new();
        let mut lost = Vec::new();
        for job in st.jobs.values_mut() {
            match job.phase {
                Phase::Offered { downstream, deadline } if deadline <= now => expired.push((job.origin.id, downstream)),
                Phase::Accepted { downstream, last_seen } if !job.failing && now.duration_since(last_seen) >= lease => {
                    job.failing = true;
                    lost.push((job.origin.id, downstream));
                }
                _ => {}
            }
        }
        (expired, lost)
    };
    for (id, by) in expired {
        give_back(inner, id, by, DeclineReason::Timeout).await;
    }
    for (id, by) in lost {
        inner.stats.lost(by);
        inner.stats.failed("lost_runner");
        let name = by.and_then(|d| inner.settings.downstreams.get(d)).map(|d| d.name.clone()).unwrap_or("?".into());
        let inner = inner.clone();
        tokio::spawn(async move {
            let message = format!("runner {name} stopped reporting on the job for {lease:?} (lease_timeout)");
            fail(&inner, id, &message).await;
        });
    }
}

/// `PUT state=pending` for every job not accepted yet; jobs GitLab no longer has for us are
/// let go of, jobs it runs already (409) are watched as accepted.
pub(super) async fn keep_alive(inner: &Arc<Inner>) {
    let pending: Vec<(i64, usize, String)> = {
        let st = inner.lock();
        st.jobs
            .values()
            .filter(|j| !matches!(j.phase, Phase::Accepted { .. }) && !j.failing)
            .map(|j| (j.origin.id, j.origin.upstream, j.origin.token.clone()))
            .collect()
    };
    let calls = pending.into_iter().map(|(id, u, token)| {
        let inner = inner.clone();
        async move {
            let Some(api) = job_api(&inner, u, id, &token) else { return };
            match api.update_job(&JobUpdate::state(JobState::Pending)).await.outcome {
                UpdateOutcome::Abort => {
                    tracing::info!(job = id, "GitLab no longer has the job for us (canceled?); letting it go");
                    release(&inner, id).await;
                }
                // Already running: a runner accepted it and the router did not see it through
                // (it was restarted in between). Its runner is watched from now on.
                UpdateOutcome::Conflict => {
                    let changed = {
                        let mut st = inner.lock();
                        st.queue.remove(id);
                        match st.jobs.get_mut(&id) {
                            Some(job) if !matches!(job.phase, Phase::Accepted { .. }) => {
                                let downstream = job.phase.downstream();
                                job.phase = Phase::Accepted { downstream, last_seen: Instant::now() };
                                job.version += 1;
                                true
                            }
                            _ => false,
                        }
                    };
                    if changed {
                        tracing::info!(job = id, "the job runs at GitLab already; watching its runner");
                        persist::save(&inner, id).await;
                    }
                }
                _ => {}
            }
        }
    });
    futures::stream::iter(calls).for_each_concurrent(16, |f| f).await;
}

use futures::StreamExt as _;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_router_asks_gitlab_with_two_phase_commit_on() {
        let info = with_two_phase(
            serde_json::json!({"name": "gitlab-runner", "features": {"two_phase_job_commit": false, "image": true}}),
        );
        assert_eq!(info["features"]["two_phase_job_commit"], true);
        assert_eq!(info["features"]["image"], true);
        assert_eq!(with_two_phase(serde_json::Value::Null)["features"]["two_phase_job_commit"], true);
    }
}
