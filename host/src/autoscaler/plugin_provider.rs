//! The engine's [`InstanceGroup`] over a `runway:fleeting` plugin.
//!
//! The engine calls its provider synchronously while holding its lock; plugin calls are async
//! and may do I/O through host capabilities. [`PluginProvider`] therefore owns the plugin's
//! [`FleetingGroup`] on a thread of its own with a single-threaded runtime, and both the
//! engine (blocking, with a deadline) and async callers (`connect_info`) send it requests.
//! A plugin that hangs or traps fails that one call; the engine treats it as a provider error.
//! So does a plugin whose `init` fails (at start or after a hot swap): every call tries `init`
//! again, paced by the engine's back-off. Interruption notices are asked only of a provider
//! whose `init` names the `interruptions` capability; `self-launching` makes the engine adopt
//! instances the group started by itself.

use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

use super::provider::{InstanceGroup, InstanceState, Interruption, ProviderError};
use crate::plugin::fleeting::{
    ConnectInfo, ConnectorConfig, FleetingFailure, FleetingGroup, InstanceState as WitState, InterruptionKind,
    ProviderError as WitError, ProviderInfo,
};

/// The capability a provider names when it reports interruption notices.
pub const INTERRUPTIONS: &str = "interruptions";
/// The capability a provider names when its group launches instances on its own (health
/// replacement, rebalancing) that the manager should adopt.
pub const SELF_LAUNCHING: &str = "self-launching";
use crate::plugin::PluginHost;

type Request = Box<dyn for<'a> FnOnce(&'a FleetingGroup) -> BoxFuture<'a, ()> + Send>;

/// A fleeting plugin instance group served from its own thread. Clones share the thread.
#[derive(Clone)]
pub struct PluginProvider {
    requests: mpsc::UnboundedSender<Request>,
    call_deadline: Duration,
    info: Arc<Mutex<Option<ProviderInfo>>>,
}

impl PluginProvider {
    /// Start plugin `name` and `init` it with `config_json`; engine calls wait at most
    /// `call_deadline` for an answer. Fails only when the provider's thread cannot start: a
    /// failed `init` (a host not in `allow_hosts`, bad credentials, a missing plugin) is
    /// returned beside the provider and tried again on every later call, so the engine's
    /// back-off paces the retries and the manager keeps running.
    pub async fn start(
        host: &PluginHost,
        name: &str,
        connector: ConnectorConfig,
        config_json: &str,
        call_deadline: Duration,
    ) -> Result<(PluginProvider, Option<FleetingFailure>), FleetingFailure> {
        let (requests, mut inbox) = mpsc::unbounded_channel::<Request>();
        let (started_tx, started_rx) = oneshot::channel();
        let info = Arc::new(Mutex::new(None));
        let (host, name, config_json, shared) = (host.clone(), name.to_string(), config_json.to_string(), info.clone());
        let spawned = std::thread::Builder::new().name(format!("fleeting-{name}")).spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = started_tx.send(Err(FleetingFailure::Provider(WitError::Other(format!("runtime: {e}")))));
                    return;
                }
            };
            runtime.block_on(async move {
                let group = FleetingGroup::new(&host, &name, connector, &config_json);
                let init_error = group.init().await.err();
                if let Ok(mut info) = shared.lock() {
                    *info = group.info();
                }
                let _ = started_tx.send(Ok(init_error));
                while let Some(request) = inbox.recv().await {
                    request(&group).await;
                    if let Ok(mut info) = shared.lock() {
                        *info = group.info();
                    }
                }
                if group.info().is_some() {
                    if let Err(e) = group.shutdown().await {
                        tracing::warn!(plugin = %name, "fleeting plugin shutdown failed: {e}");
                    }
                }
            });
        });
        if let Err(e) = spawned {
            return Err(FleetingFailure::Provider(WitError::Other(format!("cannot start the provider thread: {e}"))));
        }
        let init_error = started_rx
            .await
            .map_err(|_| FleetingFailure::Provider(WitError::Other("provider thread ended during init".into())))??;
        Ok((PluginProvider { requests, call_deadline, info }, init_error))
    }

    /// What the plugin's last successful `init` returned (`None` while it keeps failing).
    pub fn info(&self) -> Option<ProviderInfo> {
        self.info.lock().ok().and_then(|i| i.clone())
    }

    /// Whether the provider's last `init` named `capability`.
    fn has_capability(&self, capability: &str) -> bool {
        self.info().is_some_and(|i| i.capabilities.iter().any(|c| c == capability))
    }

    fn send<R: Send + 'static>(
        &self,
        call: impl for<'a> FnOnce(&'a FleetingGroup) -> BoxFuture<'a, R> + Send + 'static,
        reply: impl FnOnce(R) + Send + 'static,
    ) -> bool {
        let request: Request = Box::new(move |group| {
            Box::pin(async move {
                reply(call(group).await);
            })
        });
        self.requests.send(request).is_ok()
    }

    /// Run `call` on the provider thread and wait for it (async callers).
    pub async fn call<R: Send + 'static>(
        &self,
        call: impl for<'a> FnOnce(&'a FleetingGroup) -> BoxFuture<'a, Result<R, FleetingFailure>> + Send + 'static,
    ) -> Result<R, FleetingFailure> {
        let (tx, rx) = oneshot::channel();
        if !self.send(call, move |r| {
            let _ = tx.send(r);
        }) {
            return Err(gone());
        }
        rx.await.map_err(|_| gone())?
    }

    /// Run `call` on the provider thread and block until it answers or the deadline passes.
    fn call_blocking<R: Send + 'static>(
        &self,
        call: impl for<'a> FnOnce(&'a FleetingGroup) -> BoxFuture<'a, Result<R, FleetingFailure>> + Send + 'static,
    ) -> Result<R, ProviderError> {
        let (tx, rx) = std_mpsc::sync_channel(1);
        if !self.send(call, move |r| {
            let _ = tx.send(r);
        }) {
            return Err(ProviderError::Other(gone().to_string()));
        }
        match rx.recv_timeout(self.call_deadline) {
            Ok(result) => result.map_err(engine_error),
            Err(std_mpsc::RecvTimeoutError::Timeout) => {
                Err(ProviderError::Other(format!("provider call took longer than {:?}", self.call_deadline)))
            }
            Err(std_mpsc::RecvTimeoutError::Disconnected) => Err(ProviderError::Other(gone().to_string())),
        }
    }

    /// How to reach one instance.
    pub async fn connect_info(&self, id: &str) -> Result<ConnectInfo, FleetingFailure> {
        let id = id.to_string();
        self.call(move |g| Box::pin(async move { g.connect_info(&id).await })).await
    }
}

fn gone() -> FleetingFailure {
    FleetingFailure::Provider(WitError::Other("the provider thread has stopped".into()))
}

/// Capacity errors keep their retry-after; everything else is a plain provider error.
fn engine_error(failure: FleetingFailure) -> ProviderError {
    match failure {
        FleetingFailure::Provider(WitError::Capacity(c)) => {
            ProviderError::Capacity { retry_after: Some(Duration::from_secs(u64::from(c.retry_after_seconds))) }
        }
        other => ProviderError::Other(other.to_string()),
    }
}

fn engine_state(state: WitState) -> InstanceState {
    match state {
        WitState::Creating => InstanceState::Creating,
        WitState::Running => InstanceState::Running,
        WitState::Deleting => InstanceState::Deleting,
        WitState::Deleted => InstanceState::Deleted,
        WitState::Timeout => InstanceState::Timeout,
    }
}

impl InstanceGroup for PluginProvider {
    fn increase(&mut self, n: u32) -> Result<u32, ProviderError> {
        self.call_blocking(move |g| Box::pin(g.increase(n)))
    }

    fn decrease(&mut self, ids: &[String]) -> Result<Vec<String>, ProviderError> {
        let ids = ids.to_vec();
        self.call_blocking(move |g| Box::pin(g.decrease(ids)))
    }

    fn update(&mut self) -> Result<Vec<(String, InstanceState)>, ProviderError> {
        let listed = self.call_blocking(|g| Box::pin(g.update()))?;
        Ok(listed.into_iter().map(|i| (i.id, engine_state(i.state))).collect())
    }

    fn heartbeat(&mut self, id: &str) -> Result<(), ProviderError> {
        let id = id.to_string();
        self.call_blocking(move |g| Box::pin(async move { g.heartbeat(&id).await }))
    }

    fn interruptions(&mut self) -> Result<Vec<Interruption>, ProviderError> {
        if !self.has_capability(INTERRUPTIONS) {
            return Ok(Vec::new());
        }
        let notices = self.call_blocking(|g| Box::pin(g.interruptions()))?;
        Ok(notices
            .into_iter()
            .map(|n| Interruption { reason: interruption_reason(n.kind, n.deadline), id: n.id, deadline: n.deadline })
            .collect())
    }

    fn launches_on_its_own(&self) -> bool {
        self.has_capability(SELF_LAUNCHING)
    }
}

/// A notice's reason in words, for logs and job traces.
fn interruption_reason(kind: InterruptionKind, deadline: Option<u64>) -> String {
    let what = match kind {
        InterruptionKind::SpotReclaim => "spot/preemptible capacity reclaimed",
        InterruptionKind::Rebalance => "the group is rebalancing or replacing it",
        InterruptionKind::Maintenance => "scheduled maintenance",
    };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    match deadline {
        Some(at) if at > now => format!("{what}; it goes away in about {}s", at - now),
        Some(_) => format!("{what}; it goes away now"),
        None => what.to_string(),
    }
}
