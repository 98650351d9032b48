//! The engine's [`InstanceGroup`] over a `runway:fleeting` plugin.
//!
//! The engine calls its provider synchronously while holding its lock; plugin calls are async
//! and may do I/O through host capabilities. [`PluginProvider`] therefore owns the plugin's
//! [`FleetingGroup`] on a thread of its own with a single-threaded runtime, and both the
//! engine (blocking, with a deadline) and async callers (`connect_info`) send it requests.
//! A plugin that hangs or traps fails that one call; the engine treats it as a provider error.

use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

use super::provider::{InstanceGroup, InstanceState, ProviderError};
use crate::plugin::fleeting::{
    ConnectInfo, ConnectorConfig, FleetingFailure, FleetingGroup, InstanceState as WitState, ProviderError as WitError,
    ProviderInfo,
};
use crate::plugin::PluginHost;

type Request = Box<dyn for<'a> FnOnce(&'a FleetingGroup) -> BoxFuture<'a, ()> + Send>;

/// A fleeting plugin instance group served from its own thread. Clones share the thread.
#[derive(Clone)]
pub struct PluginProvider {
    requests: mpsc::UnboundedSender<Request>,
    call_deadline: Duration,
    /// Provider information from `init`.
    pub info: ProviderInfo,
}

impl PluginProvider {
    /// Start plugin `name` and `init` it with `config_json`; engine calls wait at most
    /// `call_deadline` for an answer.
    pub async fn start(
        host: &PluginHost,
        name: &str,
        connector: ConnectorConfig,
        config_json: &str,
        call_deadline: Duration,
    ) -> Result<PluginProvider, FleetingFailure> {
        let (requests, mut inbox) = mpsc::unbounded_channel::<Request>();
        let (started_tx, started_rx) = oneshot::channel();
        let (host, name, config_json) = (host.clone(), name.to_string(), config_json.to_string());
        let spawned = std::thread::Builder::new().name(format!("fleeting-{name}")).spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = started_tx.send(Err(FleetingFailure::Provider(WitError::Other(format!("runtime: {e}")))));
                    return;
                }
            };
            runtime.block_on(async move {
                let group = match FleetingGroup::start(&host, &name, connector, &config_json).await {
                    Ok((group, info)) => {
                        let _ = started_tx.send(Ok(info));
                        group
                    }
                    Err(e) => {
                        let _ = started_tx.send(Err(e));
                        return;
                    }
                };
                while let Some(request) = inbox.recv().await {
                    request(&group).await;
                }
                if let Err(e) = group.shutdown().await {
                    tracing::warn!(plugin = %name, "fleeting plugin shutdown failed: {e}");
                }
            });
        });
        if let Err(e) = spawned {
            return Err(FleetingFailure::Provider(WitError::Other(format!("cannot start the provider thread: {e}"))));
        }
        let info = started_rx
            .await
            .map_err(|_| FleetingFailure::Provider(WitError::Other("provider thread ended during init".into())))??;
        Ok(PluginProvider { requests, call_deadline, info })
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
}
