//! Typed facade over fleeting provider plugins: one long-lived instance per instance group,
//! called one call at a time. A trap poisons only that instance: the next call instantiates
//! the plugin again and calls `init` again (plugins keep what must survive in `kv`). A newer
//! version of the plugin published by hot reload is picked up the same way.
//!
//! Owns: [`FleetingGroup`]. Must not touch: scaling decisions (the autoscaler's), connections.

use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::Mutex;
use wasmtime::Store;

pub use crate::bindings::fleeting::exports::runway::fleeting::instance_group::{
    ConnectInfo, ConnectorConfig, Instance, Interruption, ProviderError, ProviderInfo,
};
pub use crate::bindings::fleeting::runway::fleeting::types::{
    CapacityError, InstanceState, InterruptionKind, Protocol,
};
use crate::bindings::fleeting::FleetingPlugin;
use crate::capability::CallContext;
use crate::plugin::call::{bound_message, classify, guarded, PluginError, PluginErrorKind};
use crate::plugin::registry::{LoadedPlugin, PluginPre};
use crate::plugin::state::PluginState;
use crate::plugin::PluginHost;

/// Why a provider call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FleetingFailure {
    /// The plugin misbehaved or is not loaded.
    #[error("{0}")]
    Plugin(PluginError),
    /// The provider returned an error value.
    #[error("provider error: {0:?}")]
    Provider(ProviderError),
}

/// The provider's error value with its messages cut to a sane length.
fn bound_provider_error(error: ProviderError) -> ProviderError {
    match error {
        ProviderError::InvalidConfig(m) => ProviderError::InvalidConfig(bound_message(m)),
        ProviderError::Capacity(mut c) => {
            c.message = bound_message(c.message);
            ProviderError::Capacity(c)
        }
        ProviderError::NotFound(m) => ProviderError::NotFound(bound_message(m)),
        ProviderError::Transient(m) => ProviderError::Transient(bound_message(m)),
        ProviderError::Other(m) => ProviderError::Other(bound_message(m)),
    }
}

struct Live {
    plugin: Arc<LoadedPlugin>,
    store: Store<PluginState>,
    bindings: FleetingPlugin,
}

/// One instance group driven through a fleeting plugin.
pub struct FleetingGroup {
    host: PluginHost,
    name: String,
    connector: ConnectorConfig,
    config_json: String,
    live: Mutex<Option<Live>>,
    /// What the last successful `init` returned.
    info: std::sync::Mutex<Option<ProviderInfo>>,
}

type Call<'a, R> = BoxFuture<'a, wasmtime::Result<Result<R, ProviderError>>>;

impl FleetingGroup {
    /// Start the group: instantiate plugin `name` and `init` it with `config_json`
    /// (`[runners.autoscaler.plugin_config]` as JSON).
    pub async fn start(
        host: &PluginHost,
        name: &str,
        connector: ConnectorConfig,
        config_json: &str,
    ) -> Result<(FleetingGroup, ProviderInfo), FleetingFailure> {
        let group = FleetingGroup::new(host, name, connector, config_json);
        let info = group.init().await?;
        Ok((group, info))
    }

    /// The group of plugin `name`, not yet started: the first call (or [`FleetingGroup::init`])
    /// instantiates the plugin and calls `init`; a failed `init` is tried again on the next call.
    pub fn new(host: &PluginHost, name: &str, connector: ConnectorConfig, config_json: &str) -> FleetingGroup {
        FleetingGroup {
            host: host.clone(),
            name: name.to_string(),
            connector,
            config_json: config_json.to_string(),
            live: Mutex::new(None),
            info: std::sync::Mutex::new(None),
        }
    }

    /// Instantiate the current version of the plugin and `init` it when no live instance
    /// exists (or a newer version was published); the provider information.
    pub async fn init(&self) -> Result<ProviderInfo, FleetingFailure> {
        let mut live = self.live.lock().await;
        self.ensure(&mut live).await?;
        Ok(self.info().unwrap_or_else(|| ProviderInfo {
            id: String::new(),
            max_size: 0,
            version: String::new(),
            capabilities: Vec::new(),
        }))
    }

    /// What the plugin's last successful `init` returned (`None` before one succeeded).
    pub fn info(&self) -> Option<ProviderInfo> {
        self.info.lock().ok().and_then(|i| i.clone())
    }

    fn current(&self) -> Result<Arc<LoadedPlugin>, FleetingFailure> {
        let plugins = self.host.plugins();
        match plugins.get(&self.name) {
            Some(p) if matches!(p.pre, PluginPre::Fleeting(_)) => Ok(p.clone()),
            Some(p) => Err(FleetingFailure::Plugin(p.error(PluginErrorKind::Incompatible, "is not a fleeting plugin"))),
            None => Err(FleetingFailure::Plugin(PluginError {
                plugin: self.name.clone(),
                kind: PluginErrorKind::NotFound,
                message: format!("no fleeting plugin named {:?}", self.name),
            })),
        }
    }

    /// Make sure a live, initialised instance of the current plugin version exists; returns
    /// the provider info when it had to (re)initialise.
    async fn ensure(&self, live: &mut Option<Live>) -> Result<Option<ProviderInfo>, FleetingFailure> {
        if live.is_none() {
            // A built-in cloud provider is compiled when a group first uses it.
            self.host.registry.load_on_first_use(&self.name).await.map_err(|e| {
                FleetingFailure::Plugin(PluginError {
                    plugin: self.name.clone(),
                    kind: PluginErrorKind::Incompatible,
                    message: format!("built-in plugin did not load: {e}"),
                })
            })?;
        }
        let plugin = self.current()?;
        if live.as_ref().is_some_and(|l| Arc::ptr_eq(&l.plugin, &plugin)) {
            return Ok(None);
        }
        let PluginPre::Fleeting(pre) = &plugin.pre else {
            return Err(FleetingFailure::Plugin(
                plugin.error(PluginErrorKind::Incompatible, "is not a fleeting plugin"),
            ));
        };
        let mut store =
            plugin.new_store(self.host.engine(), CallContext::default()).map_err(FleetingFailure::Plugin)?;
        let bindings = pre.instantiate_async(&mut store).await.map_err(|e| {
            FleetingFailure::Plugin(plugin.error(PluginErrorKind::Incompatible, format!("instantiation failed: {e:#}")))
        })?;
        let budget = store.data().budget.clone();
        let result = guarded(
            budget,
            bindings.runway_fleeting_instance_group().call_init(&mut store, &self.connector, &self.config_json),
        )
        .await;
        let info = match result {
            Ok(Ok(info)) => info,
            Ok(Err(e)) => return Err(FleetingFailure::Provider(bound_provider_error(e))),
            Err(f) => return Err(FleetingFailure::Plugin(classify(&plugin.meta.name, f, store.data()))),
        };
        tracing::info!(plugin = %plugin.meta.name, version = %plugin.meta.version, group = %info.id, "fleeting plugin initialised");
        if let Ok(mut saved) = self.info.lock() {
            *saved = Some(info.clone());
        }
        *live = Some(Live { plugin, store, bindings });
        Ok(Some(info))
    }

    /// One call on the live instance; a trap drops the instance so the next call starts over.
    async fn call<R: Send>(
        &self,
        f: impl for<'a> FnOnce(&'a FleetingPlugin, &'a mut Store<PluginState>) -> Call<'a, R>,
    ) -> Result<R, FleetingFailure> {
        let mut guard = self.live.lock().await;
        self.ensure(&mut guard).await?;
        let Some(live) = guard.as_mut() else {
            return Err(FleetingFailure::Plugin(PluginError {
                plugin: self.name.clone(),
                kind: PluginErrorKind::NotFound,
                message: "not started".into(),
            }));
        };
        let budget = live.store.data().budget.clone();
        let result = guarded(budget, f(&live.bindings, &mut live.store)).await;
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(FleetingFailure::Provider(bound_provider_error(e))),
            Err(failure) => {
                let error = classify(&live.plugin.meta.name, failure, live.store.data());
                tracing::warn!("{error}; the instance will be re-created and re-initialised");
                *guard = None;
                Err(FleetingFailure::Plugin(error))
            }
        }
    }

    /// Every instance of the group with its state.
    pub async fn update(&self) -> Result<Vec<Instance>, FleetingFailure> {
        self.call(|b, s| Box::pin(b.runway_fleeting_instance_group().call_update(s))).await
    }
    /// Request `n` more instances; returns how many were requested.
    pub async fn increase(&self, n: u32) -> Result<u32, FleetingFailure> {
        self.call(move |b, s| Box::pin(b.runway_fleeting_instance_group().call_increase(s, n))).await
    }
    /// Request deletion; returns the IDs accepted.
    pub async fn decrease(&self, ids: Vec<String>) -> Result<Vec<String>, FleetingFailure> {
        self.call(move |b, s| Box::pin(async move { b.runway_fleeting_instance_group().call_decrease(s, &ids).await }))
            .await
    }
    /// How to reach one instance.
    pub async fn connect_info(&self, id: &str) -> Result<ConnectInfo, FleetingFailure> {
        let id = id.to_string();
        self.call(move |b, s| {
            Box::pin(async move { b.runway_fleeting_instance_group().call_get_connect_info(s, &id).await })
        })
        .await
    }
    /// Is the instance still there?
    pub async fn heartbeat(&self, id: &str) -> Result<(), FleetingFailure> {
        let id = id.to_string();
        self.call(move |b, s| Box::pin(async move { b.runway_fleeting_instance_group().call_heartbeat(s, &id).await }))
            .await
    }
    /// Interruption notices.
    pub async fn interruptions(&self) -> Result<Vec<Interruption>, FleetingFailure> {
        self.call(|b, s| Box::pin(b.runway_fleeting_instance_group().call_interruptions(s))).await
    }
    /// Release provider resources (not the instances).
    pub async fn shutdown(&self) -> Result<(), FleetingFailure> {
        self.call(|b, s| Box::pin(b.runway_fleeting_instance_group().call_shutdown(s))).await
    }
}
