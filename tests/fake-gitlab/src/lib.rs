//! A faithful fake of GitLab's runner API (and of its git HTTP server) for Runway's tests.
//!
//! [`FakeGitLab::start`] serves on `127.0.0.1:0`:
//! - `POST/DELETE /api/v4/runners`, `POST /api/v4/runners/verify`, `DELETE /api/v4/runners/managers`,
//!   `POST /api/v4/runners/reset_authentication_token` (token expiry and revocation)
//! - `POST /api/v4/jobs/request` with Workhorse long polling on a per-runner queue version
//! - two-phase job commit, `PUT /api/v4/jobs/:id` (keep-alives, final state, crc32 checksum check,
//!   202 backoff), `PATCH /api/v4/jobs/:id/trace` (inclusive `Content-Range`, 416 on mismatch);
//!   or, [`FakeGitLab::set_two_phase_commit`] off, a GitLab that hands every job out `running`
//!   and refuses `state=pending` ([`FakeGitLab::rejected_updates`])
//! - `GET /api/v4/job` (the job of a job token, with its status)
//! - cancel from the "UI" ([`FakeGitLab::cancel`], [`FakeGitLab::force_cancel`])
//! - injected failures per endpoint ([`FakeGitLab::inject`])
//! - real git repositories over smart HTTP through `git http-backend` ([`FakeGitLab::create_repo`]),
//!   with Git LFS (the batch API and object downloads, [`FakeGitLab::commit_lfs_files`]) and
//!   submodule links ([`FakeGitLab::commit_submodule`])
//! - a fault-injecting proxy to put in front of it ([`proxy::FaultProxy`])
//!
//! Everything a test may want to assert is recorded: [`FakeGitLab::requests`], [`FakeGitLab::job`].
//! The behaviour follows `gitlab-runner-protocol.md` §1; where GitLab's choice is unclear the
//! fake picks the stricter reading so client bugs show up.

mod api;
mod artifacts;
mod git;
pub mod id_tokens;
mod jobs_api;
mod lfs;
mod payload;
pub mod proxy;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

pub use artifacts::StoredArtifact;
pub use jobs_api::HistoricJob;
pub use payload::JobSpec;

/// The legacy registration token the fake accepts out of the box.
pub const REGISTRATION_TOKEN: &str = "GR1348941fake-registration-token";

/// In a payload given to [`FakeGitLab::enqueue`], replaced by the job token the fake issues.
pub const JOB_TOKEN_PLACEHOLDER: &str = "__FAKE_JOB_TOKEN__";
/// In a payload given to [`FakeGitLab::enqueue`], replaced by the job id the fake issues.
pub const JOB_ID_PLACEHOLDER: &str = "__FAKE_JOB_ID__";

/// The endpoints failures can be injected into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Register,
    Verify,
    UnregisterRunner,
    UnregisterManager,
    ResetToken,
    RequestJob,
    PatchTrace,
    UpdateJob,
    UploadArtifacts,
    DownloadArtifacts,
}

/// A canned response served instead of the real one.
#[derive(Debug, Clone)]
pub struct InjectedResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl InjectedResponse {
    /// A bare status with a JSON `message` body.
    pub fn status(status: u16) -> Self {
        InjectedResponse {
            status,
            headers: Vec::new(),
            body: format!("{{\"message\":\"{status} injected by fake-gitlab\"}}"),
        }
    }

    /// Adds a response header (e.g. `Retry-After`).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }
}

/// One request as the fake received it.
#[derive(Debug, Clone)]
pub struct LoggedRequest {
    pub method: String,
    /// Path without the query string.
    pub path: String,
    pub query: Option<String>,
    /// Header names lower-cased, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The body (empty for git requests, which are streamed to `git http-backend`).
    pub body: Vec<u8>,
    /// The status the fake answered with.
    pub status: u16,
}

impl LoggedRequest {
    /// The first value of a header (name case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    /// The body decoded as JSON, if it is JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

/// Rails' status of a job, as reported in `Job-Status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobStatus {
    Pending,
    Running,
    Success,
    Failed,
    Canceling,
    Canceled,
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Pending => "pending",
            JobStatus::Running => "running",
            JobStatus::Success => "success",
            JobStatus::Failed => "failed",
            JobStatus::Canceling => "canceling",
            JobStatus::Canceled => "canceled",
        }
    }

    /// "Processing on runner": the states in which job-token calls are allowed.
    pub fn is_processing(self) -> bool {
        matches!(self, JobStatus::Running | JobStatus::Canceling)
    }

    pub fn is_final(self) -> bool {
        matches!(self, JobStatus::Success | JobStatus::Failed | JobStatus::Canceled)
    }
}

/// One accepted `PATCH /trace` (or a rejected one, with `accepted == false`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracePatch {
    /// The `Content-Range` header as sent.
    pub content_range: String,
    pub start: u64,
    pub end: u64,
    pub len: u64,
    pub accepted: bool,
}

/// Everything the fake knows about a job.
#[derive(Debug, Clone)]
pub struct JobRecord {
    pub id: i64,
    pub token: String,
    pub status: JobStatus,
    /// The runner token the job was handed to.
    pub runner_token: Option<String>,
    /// Only this runner may take the job ([`FakeGitLab::enqueue_for`]).
    pub only_for_runner: Option<String>,
    /// The payload served in the 201 response.
    pub payload: serde_json::Value,
    /// Trace bytes the server has.
    pub trace: Vec<u8>,
    pub patches: Vec<TracePatch>,
    /// Times the trace was reset to 0 after a 412.
    pub trace_resets: u32,
    /// `state` of the accepted final update (`success`/`failed`).
    pub final_state: Option<String>,
    pub failure_reason: Option<String>,
    pub exit_code: Option<i64>,
    /// `output.checksum` / `output.bytesize` of the accepted final update.
    pub checksum: Option<String>,
    pub bytesize: Option<u64>,
    /// `PUT state=pending` keep-alives while awaiting acceptance.
    pub pending_keepalives: u32,
    /// `PUT state=running` after acceptance ("touch").
    pub running_keepalives: u32,
    /// Every `PUT /jobs/:id` body, in order.
    pub updates: Vec<serde_json::Value>,
    /// `Job-Status` of every PATCH/PUT response sent for this job, in order.
    pub reported_statuses: Vec<String>,
    /// The job created when this one was dropped waiting for the runner's ack.
    pub retried_as: Option<i64>,
    /// The status the job was handed out in: `Pending` under two-phase commit (until the
    /// runner accepts it), `Running` otherwise; `None` before a runner took it.
    pub handed_out: Option<JobStatus>,
    /// The `session` (`url`, `certificate`, `authorization`) of the job request the job was
    /// handed out to, as GitLab keeps it (`Ci::BuildRunnerSession`) for the job's terminal.
    pub runner_session: Option<serde_json::Value>,
    /// The payload as enqueued (before `id` and token were filled in), for a retry.
    template: serde_json::Value,
    /// Last handout or runner ping while waiting for acceptance (two-phase commit).
    pub(crate) awaiting_ack_since: Option<Instant>,
    trace_reset_armed: bool,
    final_attempts: u32,
    first_final_attempt: Option<Instant>,
    /// Artifacts uploaded for this job, in order.
    pub artifacts: Vec<StoredArtifact>,
}

impl JobRecord {
    /// The trace as GitLab's job log page shows it: (lossy) UTF-8 with the runner's per-line
    /// timestamps (`2026-01-02T03:04:05.123456Z 01O `) taken off and continuation lines (`+`)
    /// joined to the line they continue.
    pub fn trace_text(&self) -> String {
        strip_timestamps(&self.raw_trace_text())
    }

    /// The trace as the runner sent it, (lossy) UTF-8.
    pub fn raw_trace_text(&self) -> String {
        String::from_utf8_lossy(&self.trace).into_owned()
    }

    /// `crc32:xxxxxxxx` of the stored trace, as the runner must send it.
    pub fn trace_checksum(&self) -> String {
        format!("crc32:{:08x}", crc32fast::hash(&self.trace))
    }
}

/// A runner the fake knows.
#[derive(Debug, Clone)]
pub struct RunnerRecord {
    pub id: i64,
    pub token: String,
    pub description: String,
    /// `legacy-registration` or `created` (UI/API, `glrt-`).
    pub origin: &'static str,
    /// system_ids seen on verify / job requests (the runner managers).
    pub managers: BTreeSet<String>,
    /// Last `info` object the runner sent.
    pub info: serde_json::Value,
    pub paused: bool,
    /// When `token` stops being accepted (none: never).
    pub token_expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Times the token was reset through `POST /runners/reset_authentication_token`.
    pub resets: u32,
}

impl RunnerRecord {
    /// Has the token expired (runner-token calls then get 403, as in Rails)?
    pub fn token_expired(&self) -> bool {
        self.token_expires_at.is_some_and(|at| at <= chrono::Utc::now())
    }

    /// `token_expires_at` as GitLab's API renders it (ISO 8601, or null).
    pub fn token_expires_at_json(&self) -> serde_json::Value {
        match self.token_expires_at {
            Some(at) => at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true).into(),
            None => serde_json::Value::Null,
        }
    }
}

/// Now plus `d`, as a token expiry.
pub(crate) fn expiry_from_now(d: Duration) -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now() + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// Settings fixed at start; most can be changed later.
#[derive(Debug, Clone)]
pub struct Config {
    /// Workhorse long-poll duration (0 disables long polling). Default 50 s.
    pub long_poll: Duration,
    /// `X-GitLab-Trace-Update-Interval` sent on PATCH/PUT responses, seconds. Default 3.
    pub trace_update_interval: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config { long_poll: Duration::from_secs(50), trace_update_interval: 3 }
    }
}

pub(crate) struct Inner {
    pub config: Config,
    pub registration_tokens: BTreeSet<String>,
    pub registration_enabled: bool,
    pub runners: BTreeMap<String, RunnerRecord>,
    pub next_runner_id: i64,
    /// Per-runner-token queue value (`runner:build_queue:<token>`).
    pub queue_versions: HashMap<String, String>,
    /// Enqueued job ids not yet handed out, oldest first.
    pub queue: VecDeque<i64>,
    pub jobs: BTreeMap<i64, JobRecord>,
    pub next_job_id: i64,
    pub requests: Vec<LoggedRequest>,
    pub injected: HashMap<Endpoint, VecDeque<InjectedResponse>>,
    /// Final updates left to answer with 202.
    pub final_update_backoffs: u32,
    /// Leave `Range` out of trace PATCH answers (a proxy that strips it).
    pub omit_trace_range: bool,
    /// How long a job handed out under two-phase commit waits for the runner's ping
    /// (`PUT state=pending|running`) before it is dropped and retried (Rails'
    /// `RUNNER_ACK_QUEUE_EXPIRY_TIME`, 2 minutes).
    pub runner_ack_expiry: Duration,
    /// Repositories served over HTTP: "group/project" → public?
    pub repos: BTreeMap<String, bool>,
    pub shutting_down: bool,
    /// `max_artifacts_size` in bytes (0: no limit): larger uploads get 413.
    pub max_artifacts_size: u64,
    /// Artifacts live in object storage: `direct_download=true` gets a redirect there.
    pub object_storage: bool,
    /// `http://127.0.0.1:<port>`, for URLs the fake hands out.
    pub base_url: String,
    /// Job requests parked in the Workhorse long poll right now, by runner token.
    pub long_polls: HashMap<String, usize>,
    /// Lifetime of runner tokens (created or reset); `None`: they never expire.
    pub token_expiry: Option<Duration>,
    /// Tokens replaced by a reset (revoked).
    pub revoked_tokens: BTreeSet<String>,
    /// Personal / project access tokens the REST API (`PRIVATE-TOKEN`) accepts.
    pub api_tokens: BTreeSet<String>,
    /// Projects whose job history `GET /api/v4/projects/:id/jobs` serves.
    pub projects: Vec<jobs_api::ProjectHistory>,
    /// GitLab's `allow_runner_job_acknowledgement` feature flag: on, a runner advertising
    /// `two_phase_job_commit` gets its job `pending` until it accepts it; off, every job is
    /// handed out `running` whatever the runner advertises.
    pub two_phase_commit: bool,
    /// `PUT /jobs/:id` calls GitLab refused (see [`RejectedUpdate`]).
    pub rejected_updates: Vec<RejectedUpdate>,
}

/// A `PUT /api/v4/jobs/:id` GitLab refused as invalid for the job (400, 403, 409; not the
/// 412 of the trace checksum handshake nor an injected answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedUpdate {
    pub job: i64,
    /// The `state` the runner sent.
    pub state: String,
    /// The job's status when it came.
    pub status: JobStatus,
    pub code: u16,
}

impl Inner {
    /// The runner's current queue value, created on first use.
    pub fn queue_version(&mut self, token: &str) -> String {
        self.queue_versions.entry(token.to_string()).or_insert_with(random_hex).clone()
    }

    /// Writes a new queue value for every runner (a job became available or went away).
    pub fn tick_all_queues(&mut self) {
        for v in self.queue_versions.values_mut() {
            *v = random_hex();
        }
    }

    /// Queue a job (see `FakeGitLab::enqueue`).
    pub fn enqueue(&mut self, payload: serde_json::Value, only_for_runner: Option<String>) -> i64 {
        let id = self.next_job_id;
        self.next_job_id += 1;
        let token = random_token("glcbt-");
        let template = payload.clone();
        let text =
            payload.to_string().replace(JOB_TOKEN_PLACEHOLDER, &token).replace(JOB_ID_PLACEHOLDER, &id.to_string());
        let mut payload: serde_json::Value = serde_json::from_str(&text).unwrap_or(payload);
        if let Some(obj) = payload.as_object_mut() {
            obj.insert("id".into(), id.into());
            obj.insert("token".into(), token.clone().into());
            if let Some(info) = obj.get_mut("job_info").and_then(|i| i.as_object_mut()) {
                info.insert("id".into(), id.into());
            }
        }
        id_tokens::mint(&mut payload, &self.base_url);
        self.jobs.insert(
            id,
            JobRecord {
                id,
                token,
                status: JobStatus::Pending,
                runner_token: None,
                only_for_runner: only_for_runner.clone(),
                payload,
                trace: Vec::new(),
                patches: Vec::new(),
                trace_resets: 0,
                final_state: None,
                failure_reason: None,
                exit_code: None,
                checksum: None,
                bytesize: None,
                pending_keepalives: 0,
                running_keepalives: 0,
                updates: Vec::new(),
                reported_statuses: Vec::new(),
                retried_as: None,
                handed_out: None,
                runner_session: None,
                template,
                awaiting_ack_since: None,
                trace_reset_armed: false,
                final_attempts: 0,
                first_final_attempt: None,
                artifacts: Vec::new(),
            },
        );
        self.queue.push_back(id);
        match &only_for_runner {
            Some(token) => self.tick_queue(token),
            None => self.tick_all_queues(),
        }
        id
    }

    /// Rails' `Ci::RetryWaitingJobService`: a job a runner did not acknowledge within
    /// `runner_ack_expiry` is dropped (`runner_provisioning_timeout`) and retried as a new job.
    pub fn expire_unacknowledged(&mut self) {
        let expired = self.unacknowledged_expired();
        for id in expired {
            let Some(job) = self.jobs.get_mut(&id) else { continue };
            job.status = JobStatus::Failed;
            job.failure_reason = Some("runner_provisioning_timeout".into());
            job.awaiting_ack_since = None;
            let (template, only) = (job.template.clone(), job.only_for_runner.clone());
            let retry = self.enqueue(template, only);
            if let Some(job) = self.jobs.get_mut(&id) {
                job.retried_as = Some(retry);
            }
        }
    }

    /// The jobs whose runner did not acknowledge them within `runner_ack_expiry`.
    pub fn unacknowledged_expired(&self) -> Vec<i64> {
        let expiry = self.runner_ack_expiry;
        self.jobs
            .values()
            .filter(|j| j.status == JobStatus::Pending && j.awaiting_ack_since.is_some_and(|t| t.elapsed() >= expiry))
            .map(|j| j.id)
            .collect()
    }

    pub fn tick_queue(&mut self, token: &str) {
        self.queue_versions.insert(token.to_string(), random_hex());
    }
}

pub(crate) struct Shared {
    inner: Mutex<Inner>,
    /// Bumped after every state change; waiters re-check what they wait for.
    pub changes: watch::Sender<u64>,
    pub repo_root: PathBuf,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        match self.inner.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Runs a mutation and wakes every waiter.
    pub fn mutate<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let r = f(&mut self.lock());
        self.changes.send_modify(|g| *g = g.wrapping_add(1));
        r
    }
}

pub(crate) fn random_hex() -> String {
    format!("{:016x}", rand::random::<u64>())
}

pub(crate) fn random_token(prefix: &str) -> String {
    use rand::distr::{Alphanumeric, SampleString};
    format!("{prefix}{}", Alphanumeric.sample_string(&mut rand::rng(), 20))
}

/// A runner created "in the UI" (`glrt-` token).
#[derive(Debug, Clone)]
pub struct CreatedRunner {
    pub id: i64,
    pub token: String,
}

/// A running fake GitLab. Stops when dropped.
pub struct FakeGitLab {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
    _repo_dir: tempfile::TempDir,
}

impl FakeGitLab {
    /// Starts with default settings (50 s long polling).
    pub async fn start() -> FakeGitLab {
        Self::start_with(Config::default()).await
    }

    /// Starts with the given settings. Panics if it cannot bind loopback (test-only crate).
    pub async fn start_with(config: Config) -> FakeGitLab {
        let repo_dir = tempfile::tempdir().expect("fake-gitlab: temp dir for repositories");
        let (changes, _) = watch::channel(0u64);
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                config,
                registration_tokens: BTreeSet::from([REGISTRATION_TOKEN.to_string()]),
                registration_enabled: true,
                runners: BTreeMap::new(),
                next_runner_id: 1,
                queue_versions: HashMap::new(),
                queue: VecDeque::new(),
                jobs: BTreeMap::new(),
                next_job_id: 1000,
                requests: Vec::new(),
                injected: HashMap::new(),
                final_update_backoffs: 0,
                omit_trace_range: false,
                runner_ack_expiry: Duration::from_secs(120),
                repos: BTreeMap::new(),
                shutting_down: false,
                max_artifacts_size: 0,
                object_storage: false,
                base_url: String::new(),
                long_polls: HashMap::new(),
                token_expiry: None,
                revoked_tokens: BTreeSet::new(),
                api_tokens: BTreeSet::new(),
                projects: Vec::new(),
                two_phase_commit: true,
                rejected_updates: Vec::new(),
            }),
            changes,
            repo_root: repo_dir.path().to_path_buf(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("fake-gitlab: bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("fake-gitlab: local address");
        shared.mutate(|inner| inner.base_url = format!("http://{addr}"));
        let router = api::router(shared.clone());
        let (tx, rx) = oneshot::channel::<()>();
        // Rails runs `Ci::RetryWaitingJobService` from a cron worker, not on requests: expiry
        // must happen also while every runner's poll is parked in Workhorse.
        let sweeper = shared.clone();
        let server = tokio::spawn(async move {
            let serve = axum::serve(listener, router).with_graceful_shutdown(async move {
                let _ = rx.await;
            });
            let sweep = async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                loop {
                    tick.tick().await;
                    if !sweeper.lock().unacknowledged_expired().is_empty() {
                        sweeper.mutate(|s| s.expire_unacknowledged());
                    }
                }
            };
            tokio::select! {
                served = serve => if let Err(e) = served {
                    tracing::warn!("fake-gitlab server stopped: {e}");
                },
                _ = sweep => {}
            }
        });
        FakeGitLab { addr, shared, shutdown: Some(tx), server: Some(server), _repo_dir: repo_dir }
    }

    /// Accept `token` as a personal access token on the REST API (`PRIVATE-TOKEN`).
    pub fn add_api_token(&self, token: &str) {
        self.shared.mutate(|inner| inner.api_tokens.insert(token.to_string()));
    }

    /// Serve `jobs` as the history of project `id` (also reachable as `path`) on
    /// `GET /api/v4/projects/:id/jobs`.
    pub fn add_project_history(&self, id: i64, path: &str, jobs: Vec<HistoricJob>) {
        self.shared.mutate(|inner| {
            inner.projects.retain(|p| p.id != id);
            inner.projects.push(jobs_api::ProjectHistory { id, path: path.to_string(), jobs });
        });
    }

    /// Refuse artifact uploads larger than `bytes` with 413 (0: no limit).
    pub fn set_max_artifacts_size(&self, bytes: u64) {
        self.shared.mutate(|inner| inner.max_artifacts_size = bytes);
    }

    /// Keep artifacts in "object storage": downloads with `direct_download=true` are
    /// redirected to a pre-signed URL of the fake's object store.
    pub fn set_object_storage(&self, on: bool) {
        self.shared.mutate(|inner| inner.object_storage = on);
    }

    /// The artifacts uploaded for job `id`.
    pub fn artifacts(&self, id: i64) -> Vec<StoredArtifact> {
        self.shared.mutate(|inner| inner.jobs.get(&id).map(|j| j.artifacts.clone()).unwrap_or_default())
    }

    /// Number the next enqueued jobs from `id` on (tests sharing one Docker daemon keep their
    /// job ids, and so the containers labelled with them, apart).
    pub fn set_next_job_id(&self, id: i64) {
        self.shared.mutate(|inner| inner.next_job_id = id);
    }

    /// `http://127.0.0.1:<port>` (what a runner's `url` is set to).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving: ends long polls at once, then waits for connections to finish.
    pub async fn shutdown(mut self) {
        self.begin_shutdown();
        if let Some(server) = self.server.take() {
            if tokio::time::timeout(Duration::from_secs(10), server).await.is_err() {
                tracing::warn!("fake-gitlab did not stop within 10 s");
            }
        }
    }

    fn begin_shutdown(&mut self) {
        self.shared.mutate(|s| s.shutting_down = true);
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    // ----- configuration -----------------------------------------------------------------

    pub fn set_long_poll(&self, d: Duration) {
        self.shared.mutate(|s| s.config.long_poll = d);
    }

    pub fn set_trace_update_interval(&self, secs: u64) {
        self.shared.mutate(|s| s.config.trace_update_interval = secs);
    }

    /// `false` makes `POST /runners` answer 410 (registration tokens disabled on the instance).
    pub fn set_registration_enabled(&self, enabled: bool) {
        self.shared.mutate(|s| s.registration_enabled = enabled);
    }

    pub fn add_registration_token(&self, token: &str) {
        self.shared.mutate(|s| s.registration_tokens.insert(token.to_string()));
    }

    /// The next `times` requests to `endpoint` get `response` instead of the real answer.
    pub fn inject(&self, endpoint: Endpoint, times: usize, response: InjectedResponse) {
        self.shared.mutate(|s| {
            let q = s.injected.entry(endpoint).or_default();
            for _ in 0..times {
                q.push_back(response.clone());
            }
        });
    }

    /// The next `times` final updates (`state=success|failed`) are answered 202 with a backoff
    /// in `X-GitLab-Trace-Update-Interval` (Rails: live trace chunks not yet persisted).
    pub fn set_final_update_backoff(&self, times: u32) {
        self.shared.mutate(|s| s.final_update_backoffs = times);
    }

    /// `false` leaves the `Range` header out of trace PATCH answers (202 and 416), as a proxy
    /// that strips it would: the runner then cannot learn the server's trace size from a 416.
    pub fn set_trace_range_header(&self, send: bool) {
        self.shared.mutate(|s| s.omit_trace_range = !send);
    }

    /// How long a job handed out under two-phase commit may go without a ping from the runner
    /// before it is dropped with `runner_provisioning_timeout` and retried as a new job
    /// (GitLab: 2 minutes). Checked whenever a runner asks for a job.
    pub fn set_runner_ack_expiry(&self, expiry: Duration) {
        self.shared.mutate(|s| s.runner_ack_expiry = expiry);
    }

    /// Behave as a GitLab with (`true`, the default) or without the
    /// `allow_runner_job_acknowledgement` feature flag (two-phase commit; parked since GitLab
    /// merge request 215705, so most instances hand every job out `running`).
    pub fn set_two_phase_commit(&self, on: bool) {
        self.shared.mutate(|s| s.two_phase_commit = on);
    }

    /// Every `PUT /jobs/:id` GitLab refused, in order.
    pub fn rejected_updates(&self) -> Vec<RejectedUpdate> {
        self.shared.lock().rejected_updates.clone()
    }

    /// The job that retried `id` after it was dropped, if any.
    pub fn retried_as(&self, id: i64) -> Option<i64> {
        self.shared.lock().jobs.get(&id).and_then(|j| j.retried_as)
    }

    // ----- runners --------------------------------------------------------------------------

    /// Creates a runner "in the UI": returns its `glrt-` authentication token.
    pub fn create_runner(&self, description: &str) -> CreatedRunner {
        self.create_runner_with_token(description, &random_token("glrt-"))
    }

    /// [`Self::create_runner`] with the token the test chooses: GitLab's are random, and a
    /// test of what is named after a token needs two that share their first characters.
    pub fn create_runner_with_token(&self, description: &str, token: &str) -> CreatedRunner {
        self.shared.mutate(|s| {
            let id = s.next_runner_id;
            s.next_runner_id += 1;
            let token = token.to_string();
            let token_expires_at = s.token_expiry.map(expiry_from_now);
            s.runners.insert(
                token.clone(),
                RunnerRecord {
                    id,
                    token: token.clone(),
                    description: description.to_string(),
                    origin: "created",
                    managers: BTreeSet::new(),
                    info: serde_json::Value::Null,
                    paused: false,
                    token_expires_at,
                    resets: 0,
                },
            );
            CreatedRunner { id, token }
        })
    }

    /// Runner tokens created or reset from now on expire after `lifetime` (GitLab's
    /// "runner authentication token expiration"); `None`: they never expire.
    pub fn set_token_expiry(&self, lifetime: Option<Duration>) {
        self.shared.mutate(|s| s.token_expiry = lifetime);
    }

    /// Revoke a runner's token (the runner was deleted or its token reset elsewhere): every
    /// runner-token call with it gets 403 from now on. Its queue value goes too (in GitLab the
    /// Redis key of a token no runner has expires), so a parked long poll does not keep
    /// answering 204 for it: the next request reaches "Rails" and gets the 403.
    pub fn revoke_runner_token(&self, token: &str) -> Option<RunnerRecord> {
        self.shared.mutate(|s| {
            s.revoked_tokens.insert(token.to_string());
            s.queue_versions.remove(token);
            s.runners.remove(token)
        })
    }

    /// The runner whose token once was `token` (before resets), by id.
    pub fn runner_by_id(&self, id: i64) -> Option<RunnerRecord> {
        self.shared.lock().runners.values().find(|r| r.id == id).cloned()
    }

    /// Was `token` revoked (by a reset or [`FakeGitLab::revoke_runner_token`])?
    pub fn token_revoked(&self, token: &str) -> bool {
        self.shared.lock().revoked_tokens.contains(token)
    }

    pub fn runners(&self) -> Vec<RunnerRecord> {
        self.shared.lock().runners.values().cloned().collect()
    }

    pub fn runner(&self, token: &str) -> Option<RunnerRecord> {
        self.shared.lock().runners.get(token).cloned()
    }

    /// A paused runner's job requests get 204.
    pub fn set_runner_paused(&self, token: &str, paused: bool) {
        self.shared.mutate(|s| {
            if let Some(r) = s.runners.get_mut(token) {
                r.paused = paused;
            }
        });
    }

    /// The runner's current queue value (what `X-GitLab-Last-Update` reports).
    pub fn queue_version(&self, token: &str) -> String {
        self.shared.mutate(|s| s.queue_version(token))
    }

    // ----- jobs -----------------------------------------------------------------------------

    /// Queues a job. The fake sets `id`, `token` (and `job_info.id`) and replaces
    /// [`JOB_TOKEN_PLACEHOLDER`] / [`JOB_ID_PLACEHOLDER`] anywhere in the payload. Every
    /// runner's queue value changes, which wakes long polls.
    pub fn enqueue(&self, payload: serde_json::Value) -> i64 {
        self.enqueue_inner(payload, None)
    }

    /// Like [`FakeGitLab::enqueue`], but only runner `runner_token` may take the job (as a
    /// project runner); only that runner's queue value changes.
    pub fn enqueue_for(&self, runner_token: &str, payload: serde_json::Value) -> i64 {
        self.enqueue_inner(payload, Some(runner_token.to_string()))
    }

    fn enqueue_inner(&self, payload: serde_json::Value, only_for_runner: Option<String>) -> i64 {
        self.shared.mutate(|s| s.enqueue(payload, only_for_runner))
    }

    /// Builds a realistic payload for `spec` pointing at this fake's git server (see
    /// [`JobSpec`]); give it to [`FakeGitLab::enqueue`].
    pub fn job_payload(&self, spec: &JobSpec) -> serde_json::Value {
        let sha = git::head_sha(&self.repo_path(&spec.project), &spec.git_ref).unwrap_or_else(|| "0".repeat(40));
        payload::build(spec, &self.url(), &sha)
    }

    pub fn job(&self, id: i64) -> Option<JobRecord> {
        self.shared.lock().jobs.get(&id).cloned()
    }

    pub fn jobs(&self) -> Vec<JobRecord> {
        self.shared.lock().jobs.values().cloned().collect()
    }

    /// Cancel from the UI: a running job goes to `canceling` (the runner learns it from
    /// `Job-Status`); a job not yet accepted goes straight to `canceled`.
    pub fn cancel(&self, id: i64) -> Option<JobStatus> {
        self.shared.mutate(|s| {
            let job = s.jobs.get_mut(&id)?;
            job.status = match job.status {
                JobStatus::Running => JobStatus::Canceling,
                JobStatus::Pending => JobStatus::Canceled,
                other => other,
            };
            let status = job.status;
            s.queue.retain(|j| *j != id);
            Some(status)
        })
    }

    /// `force_cancel`: the job becomes `canceled` at once; job-token calls then get 403.
    pub fn force_cancel(&self, id: i64) -> Option<JobStatus> {
        self.shared.mutate(|s| {
            let job = s.jobs.get_mut(&id)?;
            if !job.status.is_final() {
                job.status = JobStatus::Canceled;
            }
            let status = job.status;
            s.queue.retain(|j| *j != id);
            Some(status)
        })
    }

    /// Waits until `predicate` holds for job `id`; returns the record, or `None` on timeout
    /// or when the job does not exist.
    pub async fn wait_for_job_state(
        &self,
        id: i64,
        predicate: impl Fn(&JobRecord) -> bool,
        timeout: Duration,
    ) -> Option<JobRecord> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rx = self.shared.changes.subscribe();
        loop {
            {
                let s = self.shared.lock();
                let job = s.jobs.get(&id)?;
                if predicate(job) {
                    return Some(job.clone());
                }
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                _ => return None,
            }
        }
    }

    /// Waits until `predicate` holds for the fake's view of the world; returns whether it did
    /// before `timeout`. Every state change (a request answered, a job enqueued, a long poll
    /// parked) re-checks it.
    async fn wait_until(&self, predicate: impl Fn(&Inner) -> bool, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rx = self.shared.changes.subscribe();
        loop {
            if predicate(&self.shared.lock()) {
                return true;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                _ => return false,
            }
        }
    }

    /// Job requests of runner `token` parked in the Workhorse long poll right now (they answer
    /// when the runner's queue value changes or the long poll times out).
    pub fn long_polls_waiting(&self, token: &str) -> usize {
        self.shared.lock().long_polls.get(token).copied().unwrap_or(0)
    }

    /// Waits until at least `count` job requests of runner `token` are parked in the long
    /// poll; returns whether that happened before `timeout`.
    pub async fn wait_for_long_polls(&self, token: &str, count: usize, timeout: Duration) -> bool {
        self.wait_until(|s| s.long_polls.get(token).copied().unwrap_or(0) >= count, timeout).await
    }

    /// Waits until a request matching `predicate` has been answered (it is in
    /// [`FakeGitLab::requests`]); returns the first such request, or `None` on timeout.
    pub async fn wait_for_request(
        &self,
        predicate: impl Fn(&LoggedRequest) -> bool,
        timeout: Duration,
    ) -> Option<LoggedRequest> {
        let found = self.wait_until(|s| s.requests.iter().any(&predicate), timeout).await;
        if !found {
            return None;
        }
        self.shared.lock().requests.iter().find(|r| predicate(r)).cloned()
    }

    /// Waits until `count` requests to `method path` have been answered in total; returns
    /// whether that happened before `timeout`.
    pub async fn wait_for_request_count(&self, method: &str, path: &str, count: usize, timeout: Duration) -> bool {
        self.wait_until(
            |s| s.requests.iter().filter(|r| r.method == method && r.path == path).count() >= count,
            timeout,
        )
        .await
    }

    /// Every request received so far, oldest first.
    pub fn requests(&self) -> Vec<LoggedRequest> {
        self.shared.lock().requests.clone()
    }

    /// Requests whose path equals `path` (e.g. `/api/v4/jobs/request`).
    pub fn requests_to(&self, method: &str, path: &str) -> Vec<LoggedRequest> {
        self.shared.lock().requests.iter().filter(|r| r.method == method && r.path == path).cloned().collect()
    }

    // ----- git --------------------------------------------------------------------------------

    /// Creates an empty bare repository served at `<url>/<path>.git` (default branch `main`,
    /// private: clones need `gitlab-ci-token:<job token>` of a running job).
    pub fn create_repo(&self, path: &str) -> PathBuf {
        let dir = self.repo_path(path);
        git::init_bare(&dir).unwrap_or_else(|e| panic!("fake-gitlab: create repo {path}: {e}"));
        self.shared.mutate(|s| s.repos.insert(path.to_string(), false));
        dir
    }

    /// A public repository can be cloned without credentials.
    pub fn set_repo_public(&self, path: &str, public: bool) {
        self.shared.mutate(|s| {
            if let Some(p) = s.repos.get_mut(path) {
                *p = public;
            }
        });
    }

    /// On disk location of repository `path` (`group/project`).
    pub fn repo_path(&self, path: &str) -> PathBuf {
        self.shared.repo_root.join(format!("{path}.git"))
    }

    /// Commits `files` (path, content, executable?) on top of `branch` of repository `path`;
    /// returns the new commit sha.
    pub fn commit_files(&self, path: &str, branch: &str, files: &[(&str, &str)], message: &str) -> String {
        let files: Vec<(&str, &[u8], bool)> = files.iter().map(|(p, c)| (*p, c.as_bytes(), false)).collect();
        git::commit_files(&self.repo_path(path), branch, &files, message)
            .unwrap_or_else(|e| panic!("fake-gitlab: commit to {path}: {e}"))
    }

    /// Like [`FakeGitLab::commit_files`] with raw contents and an executable bit per file.
    pub fn commit_files_raw(&self, path: &str, branch: &str, files: &[(&str, &[u8], bool)], message: &str) -> String {
        git::commit_files(&self.repo_path(path), branch, files, message)
            .unwrap_or_else(|e| panic!("fake-gitlab: commit to {path}: {e}"))
    }

    /// Commits `files` (path, content) to repository `path` as Git LFS objects: the objects
    /// are stored on the fake's LFS server, the repository gets their pointer files and a
    /// `.gitattributes` routing each through the `lfs` filter. Returns the new commit sha.
    pub fn commit_lfs_files(&self, path: &str, branch: &str, files: &[(&str, &[u8])], message: &str) -> String {
        let dir = self.repo_path(path);
        let mut attributes = String::new();
        let mut pointers = Vec::new();
        for (file, content) in files {
            let pointer = lfs::store(&dir, content).unwrap_or_else(|e| panic!("fake-gitlab: LFS object: {e}"));
            pointers.push((file.to_string(), pointer));
            attributes.push_str(&format!("{file} filter=lfs diff=lfs merge=lfs -text\n"));
        }
        let mut entries: Vec<(&str, &[u8], bool)> = vec![(".gitattributes", attributes.as_bytes(), false)];
        entries.extend(pointers.iter().map(|(f, p)| (f.as_str(), p.as_bytes(), false)));
        git::commit_files(&dir, branch, &entries, message)
            .unwrap_or_else(|e| panic!("fake-gitlab: commit to {path}: {e}"))
    }

    /// Adds a submodule at `sub_path` of repository `path`: `.gitmodules` pointing at `url`
    /// (as a project would write it: absolute, relative like `../other.git`, or SSH) and the
    /// submodule link at commit `sha`. Returns the new commit sha.
    pub fn commit_submodule(&self, path: &str, branch: &str, sub_path: &str, url: &str, sha: &str) -> String {
        let gitmodules = format!("[submodule \"{sub_path}\"]\n\tpath = {sub_path}\n\turl = {url}\n");
        git::commit_entries(
            &self.repo_path(path),
            branch,
            &[(".gitmodules", gitmodules.as_bytes(), false)],
            &[(sub_path, sha)],
            "add submodule",
        )
        .unwrap_or_else(|e| panic!("fake-gitlab: commit to {path}: {e}"))
    }

    /// `http://gitlab-ci-token:<token>@127.0.0.1:<port>/<path>.git`
    pub fn repo_url(&self, path: &str, job_token: &str) -> String {
        format!("http://gitlab-ci-token:{job_token}@{}/{path}.git", self.addr)
    }
}

impl Drop for FakeGitLab {
    fn drop(&mut self) {
        self.begin_shutdown();
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

/// The length of a runner's per-line timestamp prefix: `YYYY-MM-DDTHH:MM:SS.uuuuuuZ ` (28)
/// plus stream id (2), type (1) and append flag (1).
const STAMP_LEN: usize = 32;

/// Whether `line` starts with a timestamp prefix; its append flag (`+` or ` `) if so.
fn stamp_flag(line: &str) -> Option<u8> {
    let b = line.as_bytes();
    if b.len() < STAMP_LEN {
        return None;
    }
    let digits = [0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18, 20, 21, 22, 23, 24, 25];
    let shape = digits.iter().all(|i| b[*i].is_ascii_digit())
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && b[19] == b'.'
        && b[26] == b'Z'
        && b[27] == b' '
        && b[28].is_ascii_hexdigit()
        && b[29].is_ascii_hexdigit()
        && matches!(b[30], b'O' | b'E')
        && matches!(b[31], b' ' | b'+');
    shape.then_some(b[31])
}

/// [`JobRecord::trace_text`]'s rendering of a raw trace.
pub fn strip_timestamps(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for line in raw.split_inclusive('\n') {
        match stamp_flag(line) {
            Some(b'+') => {
                if out.ends_with('\n') {
                    out.pop();
                }
                out.push_str(&line[STAMP_LEN..]);
            }
            Some(_) => out.push_str(&line[STAMP_LEN..]),
            None => out.push_str(line),
        }
    }
    out
}
