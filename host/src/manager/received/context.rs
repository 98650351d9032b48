//! What one received job needs of its runner and of the manager, and nothing more: the
//! [`JobContext`] the manager builds per job, the [`Capacity`] the job waits for and the
//! [`Seat`] it holds while it runs, and the fleet slot reserved for its request
//! ([`Reservation`]).
//!
//! Owns: [`JobContext`], [`Capacity`], [`Seat`], [`Reservation`]. Must not touch: the
//! manager's runners and pollers (`crate::manager` builds the context), GitLab calls
//! (`super::gitlab`).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::executor::InstanceLease;
use crate::gitlab::api::JobApi;
use crate::gitlab::client::{ApiError, GitLabClient, JobClient, VersionInfo};
use crate::gitlab::retry::RetryPolicy;
use crate::job::{JobControl, JobEnvironment};
use crate::manager::fleet::Fleet;
use crate::manager::observe::Observer;
use crate::manager::slots::{Slot, SlotAllocator};
use crate::manager::{ActiveJobs, ManagerStats, RunnerStore};
use crate::payload::{flags, JobResponse};
use crate::session::JobSession;
use crate::trace::upload::UploadConfig;
use crate::trace::{FailureReason, JobTrace, TraceOptions};

/// What one job needs of its runner (`[[runners]]`) and of the manager.
pub(crate) struct JobContext {
    /// The runner's GitLab client.
    pub(crate) client: Arc<GitLabClient>,
    /// The runner's GitLab URL.
    pub(crate) url: String,
    /// The runner's `info`, sent with the job's calls.
    pub(crate) info: VersionInfo,
    /// The runner's `system_id`: the owner of the job's store entry.
    pub(crate) system_id: String,
    /// The job environment template (executor, script settings, identity).
    pub(crate) env: JobEnvironment,
    /// `output_limit`, KiB.
    pub(crate) output_limit_kib: u64,
    /// The manager's trace loop timing.
    pub(crate) upload: UploadConfig,
    /// The runner's `job_status_final_update_retry_limit`.
    pub(crate) final_update_retry_limit: u32,
    /// Keep-alive `PUT state=pending` interval while the job waits for capacity.
    pub(crate) pending_keepalive: Duration,
    /// Told about the job and its stages.
    pub(crate) observer: Arc<dyn Observer>,
    /// The runner's job store, when it has one.
    pub(crate) store: Option<RunnerStore>,
    /// The runner's fleet, when it has one (a resumed job goes back to its instance there).
    pub(crate) fleet: Option<Arc<Fleet>>,
    /// The manager's counters.
    pub(crate) stats: Arc<ManagerStats>,
    /// The capacity the job waits for.
    pub(crate) capacity: Capacity,
    /// The web terminal session sent with the job's request and `session_timeout`.
    pub(crate) session: Option<(Arc<JobSession>, Duration)>,
}

impl JobContext {
    /// A client for job `id` with its `token`.
    pub(crate) fn job_client(&self, id: i64, token: &str) -> Result<JobClient, ApiError> {
        JobClient::new(self.client.clone(), &self.url, id, token, self.info.clone())
    }

    /// The API of `job` (trace patches with `debug_trace` when `CI_DEBUG_TRACE` is on).
    pub(crate) fn job_api(&self, job: &JobResponse) -> Option<Arc<dyn JobApi>> {
        match self.job_client(job.id, &job.token) {
            Ok(c) => Some(Arc::new(c.with_debug_trace(job.variable("CI_DEBUG_TRACE") == Some("true")))),
            Err(e) => {
                tracing::error!(job = job.id, "cannot talk to GitLab about job: {e}");
                None
            }
        }
    }

    /// The backoff between calls GitLab did not answer (the client's policy).
    pub(crate) fn retry(&self) -> RetryPolicy {
        self.client.retry_policy().clone()
    }

    /// The trace loop timing of a running job (with the runner's final update retry limit).
    pub(crate) fn job_upload(&self) -> UploadConfig {
        UploadConfig { final_update_retry_limit: self.final_update_retry_limit, ..self.upload.clone() }
    }

    /// The trace options of `job`.
    pub(crate) fn trace_options(&self, job: &JobResponse) -> TraceOptions {
        let feature_flags = &self.env.settings.feature_flags;
        TraceOptions {
            masked_phrases: job.masked_values(),
            token_prefixes: job.features.token_mask_prefixes.clone(),
            output_limit_kib: self.output_limit_kib,
            timestamps: flags::is_on(flags::TIMESTAMPS, feature_flags, job),
            only_personal_tokens: !flags::is_on(flags::MASK_ALL_DEFAULT_TOKENS, feature_flags, job),
        }
    }
}

/// The capacity a job waits for: a global (`concurrent`) and a runner (`limit`) permit.
pub(crate) struct Capacity {
    /// `concurrent`, shared by every runner (and manager generation).
    pub(crate) global: Arc<Semaphore>,
    /// The runner's `limit`.
    pub(crate) limit: Arc<Semaphore>,
    /// The manager's forceful shutdown: stop waiting, abort the running job.
    pub(crate) forceful: CancellationToken,
    /// Running and finished jobs are counted here.
    pub(crate) stats: Arc<ManagerStats>,
    /// The jobs of the runner's store this process runs, when it has a store.
    pub(crate) active: Option<ActiveJobs>,
    /// The runner's `CI_CONCURRENT_ID` slots.
    pub(crate) slots: Arc<SlotAllocator>,
}

impl Capacity {
    /// Wait for capacity for job `job`, count it as running, and abort it through `control`
    /// when the manager stops forcefully; with `project`, take its `CI_CONCURRENT_*` slot.
    /// `None` when a forceful shutdown came first.
    pub(crate) async fn seat(&self, job: i64, project: Option<i64>, control: &JobControl) -> Option<Seat> {
        let global = tokio::select! {
            g = self.global.clone().acquire_owned() => g.ok()?,
            _ = self.forceful.cancelled() => return None,
        };
        let limit = tokio::select! {
            l = self.limit.clone().acquire_owned() => l.ok()?,
            _ = self.forceful.cancelled() => return None,
        };
        let running = Running::start(self.stats.clone(), self.active.clone(), job);
        let forceful = self.forceful.clone();
        let control = control.clone();
        let interrupt = tokio::spawn(async move {
            forceful.cancelled().await;
            control.abort_with(FailureReason::RunnerInterrupted);
        });
        let slot = project.map(|p| self.slots.take(p));
        Some(Seat { permits: (global, limit), running, interrupt, slot })
    }
}

/// Capacity held by one job: its permits, its count as running, its shutdown watcher, its
/// `CI_CONCURRENT_*` slot.
pub(crate) struct Seat {
    permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
    running: Running,
    interrupt: tokio::task::JoinHandle<()>,
    slot: Option<Slot>,
}

impl Seat {
    /// `(CI_CONCURRENT_ID, CI_CONCURRENT_PROJECT_ID)`, when the seat has a slot.
    pub(crate) fn concurrent_ids(&self) -> Option<(u32, u32)> {
        self.slot.as_ref().map(|s| (s.concurrent_id, s.concurrent_project_id))
    }

    /// The job is over: free its slot and stop watching for a shutdown; what is left is given
    /// back by [`Vacating::done`].
    pub(crate) fn vacate(self) -> Vacating {
        let Seat { permits, running, interrupt, slot } = self;
        drop(slot);
        interrupt.abort();
        Vacating { permits, running }
    }
}

/// A seat whose job is over but not yet torn down.
pub(crate) struct Vacating {
    permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
    running: Running,
}

impl Vacating {
    /// Give the capacity back, then count the job as finished.
    pub(crate) fn done(self) {
        let Vacating { permits, running } = self;
        drop(permits);
        drop(running);
    }
}

/// A job counted as running (stats, its store's active set) until dropped.
struct Running {
    stats: Arc<ManagerStats>,
    active: Option<ActiveJobs>,
    job: i64,
}

impl Running {
    fn start(stats: Arc<ManagerStats>, active: Option<ActiveJobs>, job: i64) -> Self {
        use std::sync::atomic::Ordering::SeqCst;
        let running = stats.running.fetch_add(1, SeqCst) + 1;
        stats.max_running.fetch_max(running, SeqCst);
        if let Some(Ok(mut active)) = active.as_ref().map(|a| a.lock()) {
            active.insert(job);
        }
        Running { stats, active, job }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering::SeqCst;
        if let Some(Ok(mut active)) = self.active.as_ref().map(|a| a.lock()) {
            active.remove(&self.job);
        }
        self.stats.running.fetch_sub(1, SeqCst);
        self.stats.finished.fetch_add(1, SeqCst);
    }
}

/// A fleet slot reserved for a job request; given back on drop unless the job finished it.
pub(crate) struct Reservation {
    fleet: Arc<Fleet>,
    key: String,
    open: bool,
}

impl Reservation {
    /// Slot `key` of `fleet`, reserved.
    pub(crate) fn new(fleet: Arc<Fleet>, key: String) -> Self {
        Reservation { fleet, key, open: true }
    }

    /// Job `job` runs in this slot (keyed by the job from now on, so a restarted manager
    /// knows whose slot it was): the fleet may abort it (its instance is going away) and
    /// write to its trace; the job reaches the instance through the lease.
    pub(crate) fn lease(&mut self, job: i64, control: &JobControl, trace: &JobTrace) -> InstanceLease {
        self.key = self.fleet.assign(&self.key, job);
        self.fleet.track(&self.key, control.clone(), Arc::new(trace.clone()));
        InstanceLease { source: self.fleet.clone(), key: self.key.clone() }
    }

    /// The job ended: free the slot (after probing the instance on a system failure).
    pub(crate) async fn finish(mut self, system_failure: bool) {
        self.open = false;
        self.fleet.finish(&self.key, system_failure).await;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.open {
            self.fleet.unreserve(&self.key);
        }
    }
}
