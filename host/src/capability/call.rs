//! What one plugin call works with: the [`CallContext`] of the job it works for (its log, its
//! stop signal, its remote instance, its details) and the [`CallBudget`] that keeps time spent waiting
//! inside host capabilities out of the plugin's `call_timeout`.
//!
//! Owns: per-call context (with [`TerminalSlot`], where `runway:host/terminal` records the
//! job's [`AttachPoint`]) and the wasm-time budget. Must not touch: plugins or stores (the
//! plugin host composes these into its store data and arms the budget).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::bindings::executor::runway::host0_2_0::job::JobDetails;
use crate::capability::replan::Reconfigure;
use crate::connector::docker::DockerClient;
use crate::connector::kube::exec::ContainerRef;
use crate::connector::kube::KubeClient;
use crate::connector::RemoteSession;
use crate::stop::StopSignal;
use crate::trace::TraceSink;

/// What the call works for: the job's log, its stop signal, its remote instance.
#[derive(Clone, Default)]
pub struct CallContext {
    /// The job log (absent for metadata and fleeting calls).
    pub trace: Option<Arc<dyn TraceSink>>,
    /// Stops running processes and remote commands.
    pub stop: StopSignal,
    /// The instance acquired for the job (instance executor).
    pub remote: Option<Arc<dyn RemoteSession>>,
    /// What the job asked for beyond the executor's job record (`runway:host/job`).
    pub job: Option<Arc<JobDetails>>,
    /// Plans the job again for `runway:host/job-config` (only while it is prepared).
    pub reconfigure: Option<Arc<dyn Reconfigure>>,
    /// Where the job's web terminal attaches, as the executor says (`runway:host/terminal`);
    /// `None`: the job has no terminal.
    pub terminal: Option<Arc<TerminalSlot>>,
}

impl CallContext {
    /// The job log; outside a job (no log: an executor's cleanup, metadata) output is dropped.
    pub fn trace_or_discard(&self) -> Arc<dyn TraceSink> {
        self.trace.clone().unwrap_or_else(|| Arc::new(Discard))
    }
}

/// A running container a terminal can `exec` a shell in.
#[derive(Clone)]
pub enum AttachPoint {
    /// A container of a Docker engine.
    Docker {
        /// The engine (its transport: local, TCP, or a fleet instance's socket).
        client: DockerClient,
        /// The container's ID or name.
        container: String,
        /// The user the shell runs as (empty: the container's).
        user: String,
    },
    /// A container of a pod.
    Kube {
        /// The API server.
        client: KubeClient,
        /// The container.
        target: ContainerRef,
    },
}

impl std::fmt::Debug for AttachPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttachPoint::Docker { container, user, .. } => {
                f.debug_struct("Docker").field("container", container).field("user", user).finish()
            }
            AttachPoint::Kube { target, .. } => f.debug_struct("Kube").field("target", target).finish(),
        }
    }
}

/// Where one job's terminal attaches, once its executor said so.
#[derive(Default)]
pub struct TerminalSlot {
    point: Mutex<Option<AttachPoint>>,
}

impl TerminalSlot {
    /// An empty slot, for a job that can have a terminal.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// What the executor said last.
    pub fn get(&self) -> Option<AttachPoint> {
        self.point.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// What the executor says now.
    pub(crate) fn set_point(&self, point: AttachPoint) {
        *self.point.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(point);
    }
}

/// Where output goes when a call has no job log.
struct Discard;

impl TraceSink for Discard {
    fn write(&self, _: &[u8]) {}
}

/// Wasm execution time allowed per call. Time spent inside host capabilities that wait on
/// the outside world (a running job script, a remote command) does not count; everything
/// else — guest code, and a guest blocked in WASI polls — does.
#[derive(Debug)]
pub struct CallBudget {
    limit: Duration,
    state: Mutex<BudgetState>,
}

#[derive(Debug, Default)]
struct BudgetState {
    started: Option<Instant>,
    host_time: Duration,
    in_host_since: Option<Instant>,
}

impl CallBudget {
    /// A budget of `limit` per call.
    pub fn new(limit: Duration) -> Arc<Self> {
        Arc::new(CallBudget { limit, state: Mutex::new(BudgetState::default()) })
    }
    /// The per-call limit.
    pub fn limit(&self) -> Duration {
        self.limit
    }
    /// A top-level call starts.
    pub fn start_call(&self) {
        if let Ok(mut s) = self.state.lock() {
            *s = BudgetState { started: Some(Instant::now()), ..Default::default() };
        }
    }
    /// The guest entered a host capability whose waiting does not count.
    pub fn enter_host(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.in_host_since.get_or_insert_with(Instant::now);
        }
    }
    /// The guest left that capability.
    pub fn leave_host(&self) {
        if let Ok(mut s) = self.state.lock() {
            if let Some(since) = s.in_host_since.take() {
                s.host_time += since.elapsed();
            }
        }
    }
    /// Run `work` as time spent in the host: it does not count against the budget.
    pub async fn in_host<R>(&self, work: impl std::future::Future<Output = R>) -> R {
        self.enter_host();
        let result = work.await;
        self.leave_host();
        result
    }
    /// Counted time used by the current call so far.
    pub fn used(&self) -> Duration {
        let Ok(s) = self.state.lock() else { return Duration::ZERO };
        let Some(started) = s.started else { return Duration::ZERO };
        let in_host = s.in_host_since.map(|t| t.elapsed()).unwrap_or_default();
        started.elapsed().saturating_sub(s.host_time + in_host)
    }
    /// Has the current call used up its budget?
    pub fn exhausted(&self) -> bool {
        self.used() > self.limit
    }
}
