//! `runway router` (seed 002's smart router): one process between GitLab and a fleet of
//! runners. Upstream it alone asks GitLab for jobs, with two-phase commit, so a job stays
//! `pending` at GitLab while the router finds a runner for it; downstream it serves the runner
//! API — the very calls runners make to GitLab — to runners that authenticate with tokens of
//! its own (`[[router.downstream]]`).
//!
//! A job's way through: a downstream job request waits ([`state::Waiter`]); while one waits,
//! [`upstream`] asks GitLab on its behalf (plus up to `queue_size` jobs ahead, so the policy
//! has a choice); the job is queued ([`queue`]: fifo, fair by project then pipeline, weighted)
//! and offered to a waiting runner that may take it (tags, never twice to one that gave it
//! back). A runner speaking two-phase commit pings (`PUT state=pending`, answered here) and
//! accepts (`PUT state=running`, forwarded: GitLab's job turns `running`); one that declines
//! (`POST /jobs/:id/runner_provisioning`, Runway does when preparation fails) or stays silent
//! past `accept_timeout` gives the job back to the queue. A job given to a runner without
//! two-phase commit is accepted at GitLab by the router on that runner's first call for it (its
//! first trace patch), so a job whose answer never reached its runner is offered again instead
//! of stranded. Once accepted, the runner's trace patches,
//! updates and artifacts pass through ([`downstream`], streamed); a runner silent for
//! `lease_timeout` has its job failed upstream with `runner_system_failure`. Every held job is
//! an entry of the job store ([`persist`]: file, or Redis shared by several routers), so a
//! restarted router loses none and a live router takes over a dead one's jobs.
//!
//! Owns the router's model, its tasks and its HTTP surface. Must not touch the manager or the
//! job path (it runs no job), nor render metrics (`metrics::router` reads [`Router::snapshot`]).

pub mod downstream;
mod persist;
pub mod queue;
pub mod state;
pub mod stats;
pub mod tls;
mod upstream;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::router::{resolved, LoadedRouter, Policy};
use crate::gitlab::client::{ClientOptions, FeaturesInfo, GitLabClient, VersionInfo};
use crate::store::jobs::JobStore;
use state::State;
use stats::RouterStats;

/// How long an upstream worker waits after GitLab had no job and did not long-poll
/// (gitlab-runner's default `check_interval`).
const CHECK_INTERVAL: Duration = Duration::from_secs(3);

/// A `[[router.downstream]]` entry, tokens expanded.
#[derive(Debug, Clone)]
pub struct Downstream {
    /// Name in logs and metrics.
    pub name: String,
    /// The token it authenticates with.
    pub token: String,
    /// The tags it takes (`None`: every job).
    pub tags: Option<BTreeSet<String>>,
    /// Its share under `weighted`.
    pub weight: u32,
}

/// A `[[router.upstream]]` entry with its HTTP client.
pub struct Upstream {
    /// GitLab's URL.
    pub url: String,
    /// The runner token the router polls with.
    pub token: String,
    /// Job requests in flight at once.
    pub request_concurrency: usize,
    /// The client (its TLS settings).
    pub client: Arc<GitLabClient>,
}

/// Everything the router runs with.
pub struct RouterSettings {
    /// The queue policy.
    pub policy: Policy,
    /// Downstream long poll.
    pub long_poll_timeout: Duration,
    /// Offer → accept/ping deadline.
    pub accept_timeout: Duration,
    /// Accepted runner silence before the job fails.
    pub lease_timeout: Duration,
    /// Upstream `PUT state=pending` interval for held jobs.
    pub keepalive_interval: Duration,
    /// Jobs held ahead of demand.
    pub queue_size: usize,
    /// GitLab registrations polled.
    pub upstreams: Vec<Upstream>,
    /// Runners served.
    pub downstreams: Vec<Downstream>,
    /// This router's identity (`system_id`; owner of its store entries).
    pub router_id: String,
    /// Where held jobs survive a restart (`None`: nowhere).
    pub store: Option<Arc<dyn JobStore>>,
    /// Store heartbeat and takeover scan.
    pub health_interval: Duration,
    /// A store entry whose heartbeat is older belongs to a dead router and is taken over.
    pub health_timeout: Duration,
}

impl RouterSettings {
    /// Settings from `router.toml`, with its HTTP clients; `store` is opened by the caller.
    pub fn from_config(
        loaded: &LoadedRouter,
        router_id: String,
        store: Option<Arc<dyn JobStore>>,
    ) -> anyhow::Result<Self> {
        let r = &loaded.file.router;
        let mut upstreams = Vec::new();
        for (i, u) in r.upstream.iter().enumerate() {
            let options = ClientOptions { tls_ca_file: u.tls_ca_file.clone(), ..ClientOptions::default() };
            let client = GitLabClient::new(options).with_context(|| format!("router.upstream[{i}]"))?;
            upstreams.push(Upstream {
                url: resolved(&u.url),
                token: resolved(&u.token),
                request_concurrency: u.request_concurrency,
                client: Arc::new(client),
            });
        }
        let downstreams = r
            .downstream
            .iter()
            .map(|d| Downstream {
                name: d.name.clone(),
                token: resolved(&d.token),
                tags: d.tags.as_ref().map(|t| t.iter().cloned().collect()),
                weight: d.weight,
            })
            .collect();
        let store_settings = loaded.store_settings();
        Ok(RouterSettings {
            policy: r.policy,
            long_poll_timeout: r.long_poll_timeout,
            accept_timeout: r.accept_timeout,
            lease_timeout: r.lease_timeout,
            keepalive_interval: r.keepalive_interval,
            queue_size: r.queue_size,
            upstreams,
            downstreams,
            router_id,
            store,
            health_interval: store_settings.health_interval,
            health_timeout: store_settings.health_timeout,
        })
    }
}

/// The running router. Cheap to clone.
#[derive(Clone)]
pub struct Router {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    settings: RouterSettings,
    state: Mutex<State>,
    /// Woken when demand may have changed (a request waits, a job left the queue).
    wake: Notify,
    stats: RouterStats,
    /// What the router sends as `info` on its own job calls (acceptance, keep-alives).
    info: VersionInfo,
    stop: CancellationToken,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What the metrics endpoint shows of the router.
#[derive(Debug, Clone, Default)]
pub struct RouterSnapshot {
    /// Queued jobs by project path.
    pub queued_by_project: std::collections::BTreeMap<String, u64>,
    /// Jobs offered to a downstream, not accepted yet.
    pub offered: u64,
    /// Jobs accepted by downstreams.
    pub accepted: u64,
    /// Downstream job requests waiting.
    pub waiting: u64,
    /// Upstream job requests in flight.
    pub upstream_inflight: u64,
    /// Counters and histograms.
    pub stats: stats::StatsSnapshot,
    /// Downstream names, in config order.
    pub downstreams: Vec<String>,
}

impl Router {
    /// Restore the held jobs from the store, then start asking GitLab, keeping jobs alive and
    /// watching deadlines. Serve [`Router::app`] to downstreams.
    pub async fn start(settings: RouterSettings) -> Router {
        let features = FeaturesInfo {
            two_phase_job_commit: true,
            trace_reset: true,
            trace_checksum: true,
            trace_size: true,
            cancelable: true,
            ..FeaturesInfo::default()
        };
        let info = VersionInfo::this_runner("router", "", features);
        let state = State::new(settings.policy, settings.upstreams.len(), settings.downstreams.len());
        let inner = Arc::new(Inner {
            stats: RouterStats::new(settings.downstreams.len()),
            settings,
            state: Mutex::new(state),
            wake: Notify::new(),
            info,
            stop: CancellationToken::new(),
        });
        persist::take_over(&inner).await;
        upstream::keep_alive(&inner).await;
        upstream::spawn(&inner);
        Router { inner }
    }

    /// The runner API served to downstream runners.
    pub fn app(&self) -> axum::Router {
        downstream::app(self.inner.clone())
    }

    /// Stop asking GitLab and stop the background tasks; held jobs stay in the store for the
    /// next start.
    pub fn shutdown(&self) {
        self.inner.stop.cancel();
        self.inner.wake.notify_waiters();
    }

    /// Held jobs right now (queued, offered, accepted).
    pub fn held(&self) -> usize {
        self.inner.lock().jobs.len()
    }

    /// The numbers the metrics endpoint renders.
    pub fn snapshot(&self) -> RouterSnapshot {
        let st = self.inner.lock();
        let mut snap = RouterSnapshot {
            downstreams: self.inner.settings.downstreams.iter().map(|d| d.name.clone()).collect(),
            waiting: st.waiters.len() as u64,
            upstream_inflight: st.inflight.iter().sum::<usize>() as u64,
            ..RouterSnapshot::default()
        };
        for job in st.jobs.values() {
            match job.phase {
                state::Phase::Queued => {
                    *snap.queued_by_project.entry(job.origin.project_path.clone()).or_default() += 1
                }
                state::Phase::Offered { .. } => snap.offered += 1,
                state::Phase::Accepted { .. } => snap.accepted += 1,
            }
        }
        drop(st);
        snap.stats = self.inner.stats.snapshot();
        snap
    }
}
