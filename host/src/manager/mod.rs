//! The runner manager behind `runway run`: per `[[runners]]` entry, `request_concurrency`
//! pollers asking GitLab for jobs; `concurrent` and `limit` enforced with semaphores; two-phase
//! job commit; graceful and forceful shutdown.
//!
//! A long poll never holds capacity: a poller asks only while a slot is free and releases it
//! before the request, so a poll blocked for 50 s costs nothing another runner could use. A
//! job that arrives when capacity was taken meanwhile stays `pending` at GitLab (two-phase
//! commit, with keep-alives) until a slot frees up.
//!
//! What happens to a job once GitLab handed it over — accepted, run, reported, declined,
//! resumed, cleaned up — is `received`'s, from a per-job context the manager cuts for it.

pub mod capacity;
pub mod fleet;
pub mod health;
mod kube_orphans;
pub mod observe;
pub mod persist;
mod received;
pub mod requests;
mod resume;
pub mod signals;
pub mod slots;
pub mod ssh_host;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::autoscaler::ReserveError;
use crate::executor::ExecutorFeatures;
use crate::gitlab::client::{
    FeaturesInfo, GitLabClient, JobSessionInfo, RequestJobResult, RunnerCredentials, UnhealthyRequest, VersionInfo,
};
use crate::job::JobEnvironment;
use crate::payload::flags;
use crate::session::SessionServer;
use crate::store::jobs::{JobStore, StoreSettings};
use crate::trace::format::RunnerIdentity;
use crate::trace::upload::UploadConfig;
use health::{HealthBoard, PendingRunner, RunnerEntry, Unusable};
use observe::ProcessingFailure;
use received::{Capacity, JobContext, Reservation};
use requests::RequestGate;
use slots::SlotAllocator;

/// Everything the manager needs about one `[[runners]]` entry.
#[derive(Clone)]
pub struct RunnerSettings {
    /// URL, token and system id the runner talks to GitLab with.
    pub credentials: RunnerCredentials,
    /// A client of its own when the runner has TLS settings (`tls-ca-file`, client
    /// certificate); otherwise the manager's shared client is used.
    pub client: Option<Arc<GitLabClient>>,
    /// Job environment template (executor, plugin host, script settings, identity).
    pub env: JobEnvironment,
    /// `limit`: 0 = unlimited.
    pub limit: usize,
    /// `request_concurrency`: job requests in flight at once.
    pub request_concurrency: usize,
    /// `output_limit`: the job log limit, KiB.
    pub output_limit_kib: u64,
    /// `unhealthy_requests_limit`: failed requests before the runner pauses.
    pub unhealthy_requests_limit: u32,
    /// `unhealthy_interval`: how long an unhealthy runner pauses.
    pub unhealthy_interval: Duration,
    /// `job_status_final_update_retry_limit`.
    pub final_update_retry_limit: u32,
    /// `strict_check_interval`: never re-poll early.
    pub strict_check_interval: bool,
    /// The autoscaled fleet jobs run on (`[runners.autoscaler]`).
    pub fleet: Option<Arc<fleet::Fleet>>,
    /// The job store running jobs are kept in (`[runners.store]`), when on.
    pub store: Option<RunnerStore>,
    /// `labels` (global, overlaid by the runner's) sent to GitLab in `info.labels`.
    pub labels: std::collections::BTreeMap<String, String>,
}

/// A runner's job store and its settings.
#[derive(Clone)]
pub struct RunnerStore {
    /// The opened store.
    pub store: Arc<dyn JobStore>,
    /// Intervals, timeouts and limits of `[runners.store]`.
    pub settings: StoreSettings,
    /// Jobs of this store that this process runs, across config reloads (a new manager's
    /// watcher must not resume what the retiring one still runs). Share it with the store.
    pub active: ActiveJobs,
}

/// Job ids running in this process, shared by every manager generation of one store.
pub type ActiveJobs = Arc<Mutex<std::collections::HashSet<i64>>>;

/// Global settings.
#[derive(Clone)]
pub struct ManagerSettings {
    /// `concurrent`: jobs at once across all runners.
    pub concurrent: usize,
    /// `check_interval`: pause between job requests.
    pub check_interval: Duration,
    /// `shutdown_timeout`: how long a forceful stop waits for jobs.
    pub shutdown_timeout: Duration,
    /// Keep-alive `PUT state=pending` interval while a job waits for capacity or prepares.
    pub pending_keepalive: Duration,
    /// Trace loop timing (GitLab's defaults; tests shorten them).
    pub upload: UploadConfig,
    /// Told about feeds, requests, jobs and stages (metrics); [`observe::NoObserver`] by default.
    pub observer: Arc<dyn observe::Observer>,
    /// The web terminal's session server (`[session_server]`), when configured: runners
    /// whose executor can attach a terminal send a session with every job request.
    pub session_server: Option<Arc<SessionServer>>,
}

impl Default for ManagerSettings {
    fn default() -> Self {
        ManagerSettings {
            concurrent: 1,
            check_interval: Duration::from_secs(3),
            shutdown_timeout: Duration::from_secs(30),
            pending_keepalive: Duration::from_secs(10),
            upload: UploadConfig::default(),
            observer: Arc::new(observe::NoObserver),
            session_server: None,
        }
    }
}

/// How the manager is told to stop.
#[derive(Clone, Default)]
pub struct Shutdown {
    /// Stop requesting jobs; let running jobs finish (SIGQUIT).
    pub graceful: CancellationToken,
    /// Abort running jobs with `runner_interrupted` (SIGTERM/SIGINT).
    pub forceful: CancellationToken,
}

/// Counters for tests and metrics.
#[derive(Default, Debug)]
pub struct ManagerStats {
    /// Jobs running now.
    pub running: std::sync::atomic::AtomicUsize,
    /// Most jobs that ran at once.
    pub max_running: std::sync::atomic::AtomicUsize,
    /// Jobs finished.
    pub finished: std::sync::atomic::AtomicUsize,
    /// Failed jobs by failure reason (as sent to GitLab).
    pub failed: Mutex<std::collections::BTreeMap<String, u64>>,
    /// Durations of finished jobs, seconds.
    pub durations: Mutex<Vec<f64>>,
    /// Stored jobs taken up again, by result (`resumed`, `finished`, `canceled`, `gone`,
    /// `stale`, `max_retries`, `not_resumable`, `corrupt`).
    pub store_resumes: Mutex<std::collections::BTreeMap<String, u64>>,
    /// Jobs taken over from another manager whose lease had expired.
    pub store_takeovers: std::sync::atomic::AtomicU64,
    /// Jobs this manager keeps in a store now.
    pub store_entries: std::sync::atomic::AtomicUsize,
}

impl ManagerStats {
    fn record(&self, failure_reason: Option<&str>, duration: Duration) {
        if let Some(reason) = failure_reason {
            if let Ok(mut failed) = self.failed.lock() {
                *failed.entry(reason.to_string()).or_default() += 1;
            }
        }
        if let Ok(mut durations) = self.durations.lock() {
            durations.push(duration.as_secs_f64());
        }
    }

    fn record_resume(&self, result: &str) {
        if let Ok(mut resumes) = self.store_resumes.lock() {
            *resumes.entry(result.to_string()).or_default() += 1;
        }
    }
}

struct Shared {
    settings: ManagerSettings,
    global: Arc<Semaphore>,
    shutdown: Shutdown,
    stats: Arc<ManagerStats>,
}

struct Runner {
    settings: RunnerSettings,
    client: Arc<GitLabClient>,
    info: VersionInfo,
    limit: Arc<Semaphore>,
    slots: Arc<SlotAllocator>,
    /// How many job requests may be in flight (`request_concurrency`, adaptive by default).
    requests: RequestGate,
    /// The session server, when this runner's jobs can have a web terminal.
    sessions: Option<Arc<SessionServer>>,
}

impl Runner {
    /// What one job of this runner needs of it and of the manager, and nothing more.
    fn job_context(&self, shared: &Shared) -> JobContext {
        let settings = &self.settings;
        JobContext {
            client: self.client.clone(),
            url: settings.credentials.url.clone(),
            info: self.info.clone(),
            system_id: settings.credentials.system_id.clone(),
            env: settings.env.clone(),
            output_limit_kib: settings.output_limit_kib,
            upload: shared.settings.upload.clone(),
            final_update_retry_limit: settings.final_update_retry_limit,
            pending_keepalive: shared.settings.pending_keepalive,
            observer: shared.settings.observer.clone(),
            store: settings.store.clone(),
            fleet: settings.fleet.clone(),
            stats: shared.stats.clone(),
            capacity: Capacity {
                global: shared.global.clone(),
                limit: self.limit.clone(),
                forceful: shared.shutdown.forceful.clone(),
                stats: shared.stats.clone(),
                active: settings.store.as_ref().map(|s| s.active.clone()),
                slots: self.slots.clone(),
            },
            session: None,
        }
    }
}

/// The features Runway's job path really supports, for `info.features` (§1.6). Artifacts
/// and caches move through the helper in the job environment; an executor without one (an
/// image executor other than the docker plugin) does not advertise them, so GitLab refuses
/// jobs that need them instead of the runner dropping them silently. `session` and `terminal`
/// (GitLab's "Debug" button) only when the session server runs and the executor can attach a
/// terminal to the job ([`ExecutorFeatures::terminal`], as the manager decides it).
pub fn features(executor: ExecutorFeatures) -> FeaturesInfo {
    let helper = executor.helper;
    FeaturesInfo {
        artifacts: helper,
        upload_multiple_artifacts: helper,
        upload_raw_artifacts: helper,
        artifacts_exclude: helper,
        fallback_cache_keys: helper,
        variables: executor.variables,
        image: executor.image,
        services: executor.services,
        service_variables: executor.image,
        service_multiple_aliases: executor.image,
        shared: executor.shared,
        session: executor.terminal,
        terminal: executor.terminal,
        cache: helper,
        refspecs: true,
        masking: true,
        raw_variables: true,
        multi_build_steps: true,
        return_exit_code: true,
        trace_reset: true,
        trace_checksum: true,
        trace_size: true,
        cancelable: true,
        cancel_gracefully: true,
        two_phase_job_commit: true,
        vault_secrets: true,
        ..FeaturesInfo::default()
    }
}

/// The runner manager.
pub struct Manager {
    shared: Arc<Shared>,
    runners: Vec<Arc<Runner>>,
    pending: Vec<PendingRunner>,
    client: Arc<GitLabClient>,
    health: Arc<HealthBoard>,
}

fn make_runner(r: RunnerSettings, client: &Arc<GitLabClient>, sessions: Option<&Arc<SessionServer>>) -> Arc<Runner> {
    let executor = &r.env.executor;
    // The configured executor (`docker-autoscaler` is served by the `docker` plugin).
    let name = if r.env.settings.executor.is_empty() { &executor.info.name } else { &r.env.settings.executor };
    let mut executor_features = executor.features();
    // A web terminal needs the session server and a job environment the executor can attach
    // to: not a fleet instance's for a shell on this machine; the docker plugin's containers
    // on an instance (docker-autoscaler) are reached through the instance's connection.
    executor_features.terminal &= sessions.is_some() && (r.fleet.is_none() || executor.info.name != "shell");
    let sessions = sessions.filter(|_| executor_features.terminal).cloned();
    let mut info = VersionInfo::this_runner(name, &r.env.settings.shell, features(executor_features));
    info.labels = r.labels.clone();
    let limit = if r.limit == 0 { Semaphore::MAX_PERMITS } else { r.limit };
    let runner_client = r.client.clone().unwrap_or_else(|| client.clone());
    let adaptive = flags::resolve(flags::ADAPTIVE_REQUEST_CONCURRENCY, &r.env.settings.feature_flags, None);
    Arc::new(Runner {
        info,
        client: runner_client,
        limit: Arc::new(Semaphore::new(limit)),
        slots: Arc::default(),
        requests: RequestGate::new(r.request_concurrency, adaptive),
        sessions,
        settings: r,
    })
}

impl Manager {
    /// A manager for `runners` talking through `client`.
    pub fn new(
        settings: ManagerSettings,
        runners: Vec<RunnerSettings>,
        client: Arc<GitLabClient>,
        shutdown: Shutdown,
    ) -> Self {
        let global = Arc::new(Semaphore::new(settings.concurrent.max(1)));
        Self::with_capacity(settings, runners, client, shutdown, global)
    }

    /// A manager sharing `global` capacity with others (a config reload starts a new manager
    /// while the old one's jobs finish; together they still respect `concurrent`).
    pub fn with_capacity(
        settings: ManagerSettings,
        runners: Vec<RunnerSettings>,
        client: Arc<GitLabClient>,
        shutdown: Shutdown,
        global: Arc<Semaphore>,
    ) -> Self {
        let entries = runners.into_iter().map(|r| RunnerEntry::Ready(Box::new(r))).collect();
        Self::with_entries(settings, entries, client, shutdown, global)
    }

    /// A manager whose runners may still have to be resolved: a [`RunnerEntry::Pending`]
    /// runner is resolved in the background, reported unhealthy while that fails, and serves
    /// once it succeeds; the other runners serve meanwhile.
    pub fn with_entries(
        settings: ManagerSettings,
        entries: Vec<RunnerEntry>,
        client: Arc<GitLabClient>,
        shutdown: Shutdown,
        global: Arc<Semaphore>,
    ) -> Self {
        let health = Arc::new(HealthBoard::default());
        let mut runners = Vec::new();
        let mut pending = Vec::new();
        for entry in entries {
            match entry {
                RunnerEntry::Ready(r) => {
                    health.set_healthy(&r.env.identity.short_token, &r.env.identity.name);
                    runners.push(make_runner(*r, &client, settings.session_server.as_ref()));
                }
                RunnerEntry::Pending(p) => pending.push(p),
            }
        }
        Manager {
            shared: Arc::new(Shared { settings, global, shutdown, stats: Arc::default() }),
            runners,
            pending,
            client,
            health,
        }
    }

    /// The health of this manager's runners (for metrics and health endpoints).
    pub fn health(&self) -> Arc<HealthBoard> {
        self.health.clone()
    }

    /// Counters of running and finished jobs.
    pub fn stats(&self) -> Arc<ManagerStats> {
        self.shared.stats.clone()
    }

    /// Poll and run jobs until shut down. Returns when every job has ended (graceful) or the
    /// shutdown timeout expired (forceful).
    pub async fn run(self) {
        let mut jobs = JoinSet::new();
        let (job_tx, mut job_rx) = tokio::sync::mpsc::unbounded_channel::<tokio::task::JoinHandle<()>>();
        let mut pollers = JoinSet::new();
        for runner in &self.runners {
            if runner.settings.store.is_some() {
                pollers.spawn(resume::watch(runner.clone(), self.shared.clone(), job_tx.clone()));
            }
            for _ in 0..runner.settings.request_concurrency.max(1) {
                pollers.spawn(poll(runner.clone(), self.shared.clone(), job_tx.clone()));
            }
        }
        for pending in &self.pending {
            let (shared, client, health) = (self.shared.clone(), self.client.clone(), self.health.clone());
            pollers.spawn(resolve_then_poll(pending.clone(), shared, client, health, job_tx.clone()));
        }
        drop(job_tx);
        let stop = self.shared.shutdown.graceful.clone();
        let forceful = self.shared.shutdown.forceful.clone();
        // Collect job handles until the pollers are gone.
        loop {
            tokio::select! {
                handle = job_rx.recv() => match handle {
                    Some(h) => { jobs.spawn(async move { let _ = h.await; }); }
                    None => break,
                },
                _ = stop.cancelled() => {},
                _ = forceful.cancelled() => {},
            }
            if stop.is_cancelled() || forceful.is_cancelled() {
                pollers.shutdown().await;
                while let Ok(h) = job_rx.try_recv() {
                    jobs.spawn(async move {
                        let _ = h.await;
                    });
                }
                break;
            }
        }
        if forceful.is_cancelled() {
            let deadline = self.shared.settings.shutdown_timeout;
            if tokio::time::timeout(deadline, async { while jobs.join_next().await.is_some() {} }).await.is_err() {
                tracing::warn!("shutdown_timeout expired with jobs still running");
            }
        } else {
            tracing::info!("graceful shutdown: waiting for running jobs");
            loop {
                tokio::select! {
                    next = jobs.join_next() => if next.is_none() { break },
                    _ = forceful.cancelled() => {
                        let deadline = self.shared.settings.shutdown_timeout;
                        let _ = tokio::time::timeout(deadline, async { while jobs.join_next().await.is_some() {} }).await;
                        break;
                    }
                }
            }
        }
    }
}

async fn sleep_or_stop(duration: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(duration) => true,
        _ = stop.cancelled() => false,
    }
}

/// Resolve a pending runner, retrying while it fails (unhealthy, no job requests), then
/// poll for it like any other.
async fn resolve_then_poll(
    pending: PendingRunner,
    shared: Arc<Shared>,
    client: Arc<GitLabClient>,
    health: Arc<HealthBoard>,
    jobs: tokio::sync::mpsc::UnboundedSender<tokio::task::JoinHandle<()>>,
) {
    let stop = shared.shutdown.graceful.clone();
    let forceful = shared.shutdown.forceful.clone();
    let mut last_error: Option<Unusable> = None;
    let settings = loop {
        let attempt = tokio::select! {
            r = (pending.resolve)() => r,
            _ = stop.cancelled() => return,
            _ = forceful.cancelled() => return,
        };
        match attempt {
            Ok(settings) => break settings,
            Err(error) => {
                if last_error.as_ref() != Some(&error) {
                    tracing::error!(
                        runner = %pending.short_token,
                        name = %pending.name,
                        "runner is unhealthy and requests no jobs: {error}; retrying every {:?}",
                        pending.retry_every
                    );
                }
                health.set_unhealthy(&pending.short_token, &pending.name, &error);
                last_error = Some(error);
                if !sleep_or_stop(pending.retry_every, &stop).await || forceful.is_cancelled() {
                    return;
                }
            }
        }
    };
    if last_error.is_some() {
        tracing::info!(runner = %pending.short_token, name = %pending.name, "runner recovered; requesting jobs");
    }
    health.set_healthy(&pending.short_token, &pending.name);
    let runner = make_runner(settings, &client, shared.settings.session_server.as_ref());
    let watcher = runner.settings.store.is_some().then(|| resume::watch(runner.clone(), shared.clone(), jobs.clone()));
    let pollers = (0..runner.settings.request_concurrency.max(1))
        .map(|_| poll(runner.clone(), shared.clone(), jobs.clone()))
        .collect::<Vec<_>>();
    drop(jobs);
    futures::future::join(futures::future::join_all(pollers), futures::future::OptionFuture::from(watcher)).await;
}

async fn poll(
    runner: Arc<Runner>,
    shared: Arc<Shared>,
    jobs: tokio::sync::mpsc::UnboundedSender<tokio::task::JoinHandle<()>>,
) {
    let stop = shared.shutdown.graceful.clone();
    let forceful = shared.shutdown.forceful.clone();
    let stop_requesting = CancellationToken::new();
    {
        let (s, f, r) = (stop.clone(), forceful.clone(), stop_requesting.clone());
        tokio::spawn(async move {
            tokio::select! { _ = s.cancelled() => {}, _ = f.cancelled() => {} }
            r.cancel();
        });
    }
    let mut unhealthy = 0u32;
    let check = shared.settings.check_interval;
    let observer = shared.settings.observer.clone();
    let me = &runner.settings.env.identity;
    loop {
        if stop_requesting.is_cancelled() {
            return;
        }
        // Ask only while capacity exists; don't hold it during the (long) poll.
        let capacity = tokio::select! {
            g = shared.global.clone().acquire_owned() => g.ok(),
            _ = stop_requesting.cancelled() => return,
        };
        let limit = tokio::select! {
            l = runner.limit.clone().acquire_owned() => l.ok(),
            _ = stop_requesting.cancelled() => return,
        };
        drop((capacity, limit));
        let hard = runner.requests.hard_limit();
        match runner.requests.acquire() {
            Ok(limits) => observer.requests(me, hard, limits, false),
            Err(limits) => {
                // Over the (adaptive) request limit: this poller sits out a check interval.
                observer.requests(me, hard, limits, true);
                if !sleep_or_stop(check, &stop_requesting).await {
                    return;
                }
                continue;
            }
        }
        let admitted = Admitted { gate: &runner.requests, answer: requests::Answer::Empty };
        // A fleet runner asks only with a slot reserved (in preemptive mode: an idle slot
        // on a ready instance), and gives it back when GitLab has nothing.
        let reservation = match &runner.settings.fleet {
            None => None,
            Some(fleet) => {
                let key = fleet.next_key();
                match fleet.reserve(&key) {
                    Ok(()) => Some(Reservation::new(fleet.clone(), key)),
                    Err(ReserveError::ShuttingDown) => return,
                    Err(e) => {
                        tracing::debug!(runner = %runner.settings.env.identity.short_token, "not requesting a job: {e}");
                        observer.processing_failure(me, ProcessingFailure::NoFreeExecutor);
                        if !sleep_or_stop(check.min(Duration::from_secs(1)), &stop_requesting).await {
                            return;
                        }
                        continue;
                    }
                }
            }
        };
        observer.fed(me, true);
        // A session per request, as gitlab-runner: it lives on only when a job comes with it.
        let session = runner.sessions.as_ref().map(|server| (server.new_session(), server.session_timeout()));
        let session_info = session.as_ref().map(|((_, info), _)| JobSessionInfo {
            url: info.url.clone(),
            certificate: info.certificate.clone(),
            authorization: info.authorization.clone(),
        });
        let result = tokio::select! {
            r = runner.client.request_job_with_session(&runner.settings.credentials, &runner.info, session_info.as_ref()) => r,
            _ = stop_requesting.cancelled() => return,
        };
        let answer = match &result {
            RequestJobResult::Job(_) | RequestJobResult::BadPayload(_) => requests::Answer::Job,
            RequestJobResult::Unhealthy(_) | RequestJobResult::Failed(_) => requests::Answer::Failed,
            RequestJobResult::NoJob | RequestJobResult::PollAgain => requests::Answer::Empty,
        };
        observer.requests(me, hard, admitted.release(answer), false);
        let reservation = match result {
            RequestJobResult::Job(_) => reservation,
            _ => {
                drop(reservation);
                None
            }
        };
        match result {
            RequestJobResult::Job(received) => {
                unhealthy = 0;
                let mut ctx = runner.job_context(&shared);
                ctx.session = session.map(|((session, _), timeout)| (session, timeout));
                let job = received::fresh::run(ctx, *received, reservation);
                let handle = tokio::spawn(job);
                if jobs.send(handle).is_err() {
                    return;
                }
                if runner.settings.strict_check_interval && !sleep_or_stop(check, &stop_requesting).await {
                    return;
                }
            }
            RequestJobResult::BadPayload(bad) => {
                unhealthy = 0;
                let handle = tokio::spawn(received::bad::fail(runner.job_context(&shared), *bad));
                if jobs.send(handle).is_err() {
                    return;
                }
            }
            RequestJobResult::PollAgain => unhealthy = 0,
            RequestJobResult::NoJob => {
                unhealthy = 0;
                if !sleep_or_stop(check, &stop_requesting).await {
                    return;
                }
            }
            RequestJobResult::Unhealthy(message) => {
                unhealthy += 1;
                observer.processing_failure(me, ProcessingFailure::Other);
                if let UnhealthyRequest::Forbidden(_) = message {
                    tracing::error!(
                        runner = %runner.settings.env.identity.short_token,
                        name = %runner.settings.env.identity.name,
                        "GitLab refused this runner's token (403 Forbidden): it is invalid, expired or revoked; this runner pauses after {} such answers (unhealthy_requests_limit) while the others go on. Register it again or put a valid token in config.toml",
                        runner.settings.unhealthy_requests_limit.max(1)
                    );
                } else {
                    tracing::warn!(runner = %runner.settings.env.identity.short_token, "job request failed: {message}");
                }
                let limit = runner.settings.unhealthy_requests_limit.max(1);
                let wait = if unhealthy >= limit {
                    tracing::error!(
                        runner = %runner.settings.env.identity.short_token,
                        "{unhealthy} consecutive unhealthy requests: pausing this runner for {:?}",
                        runner.settings.unhealthy_interval
                    );
                    unhealthy = 0;
                    observer.fed(me, false);
                    runner.settings.unhealthy_interval
                } else {
                    check
                };
                if !sleep_or_stop(wait, &stop_requesting).await {
                    return;
                }
            }
            RequestJobResult::Failed(message) => {
                observer.processing_failure(me, ProcessingFailure::Other);
                tracing::warn!(runner = %runner.settings.env.identity.short_token, "job request failed: {message}");
                if !sleep_or_stop(check, &stop_requesting).await {
                    return;
                }
            }
        }
    }
}

/// A request admitted by a runner's [`RequestGate`], released when answered (or, when the
/// poller stops while it waits, on drop, as an empty answer).
struct Admitted<'a> {
    gate: &'a RequestGate,
    answer: requests::Answer,
}

impl Admitted<'_> {
    /// The request was answered: release it with `answer` and say where the limits stand.
    fn release(mut self, answer: requests::Answer) -> requests::RequestLimits {
        self.answer = answer;
        let limits = self.gate.release(answer);
        std::mem::forget(self);
        limits
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.gate.release(self.answer);
    }
}

/// The identity printed in job headers.
pub fn identity(name: &str, short_token: &str, system_id: &str) -> RunnerIdentity {
    RunnerIdentity {
        version: crate::buildinfo::VERSION.into(),
        revision: crate::buildinfo::REVISION.into(),
        name: name.into(),
        short_token: short_token.into(),
        system_id: system_id.into(),
    }
}
