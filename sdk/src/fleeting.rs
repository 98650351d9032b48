//! Fleeting provider plugins: implement [`InstanceGroup`], then call
//! [`export_fleeting!`](crate::export_fleeting).

use crate::export::{Component, Named};
use std::cell::RefCell;

use crate::bindings::executor::runway::host0_1_0::plugin as wit_plugin;
use crate::bindings::fleeting::exports::runway::fleeting::instance_group as wit;
pub use crate::bindings::fleeting::exports::runway::fleeting::instance_group::{
    ConnectInfo, ConnectorConfig, Instance, Interruption, ProviderError, ProviderInfo,
};
pub use crate::bindings::fleeting::runway::fleeting::types::{
    CapacityError, InstanceState, InterruptionKind, Protocol,
};

/// A failure of the host's key-value store ([`crate::kv`]) fails the provider call as
/// transient: the host retries it, nothing the plugin remembered is lost.
impl From<crate::kv::KvError> for ProviderError {
    fn from(e: crate::kv::KvError) -> Self {
        ProviderError::Transient(format!("plugin state: {e:?}"))
    }
}

/// A group of machines at a provider. `init` creates the value; the host then calls the
/// other methods one at a time for as long as the plugin instance lives.
pub trait InstanceGroup: Sized + 'static {
    /// Validate `plugin_config` (JSON) and connect to the provider.
    fn init(connector: ConnectorConfig, plugin_config: &str) -> Result<(Self, ProviderInfo), ProviderError>;
    /// Every instance with its state.
    fn update(&mut self) -> Result<Vec<Instance>, ProviderError>;
    /// Request `n` more instances; return how many were requested.
    fn increase(&mut self, n: u32) -> Result<u32, ProviderError>;
    /// Request deletion; return the IDs accepted.
    fn decrease(&mut self, ids: Vec<String>) -> Result<Vec<String>, ProviderError>;
    /// How to reach an instance.
    fn connect_info(&mut self, id: &str) -> Result<ConnectInfo, ProviderError>;
    /// Is the instance still there?
    fn heartbeat(&mut self, id: &str) -> Result<(), ProviderError> {
        let _ = id;
        Ok(())
    }
    /// Interruption notices (spot reclaim, rebalance).
    fn interruptions(&mut self) -> Result<Vec<Interruption>, ProviderError> {
        Ok(Vec::new())
    }
    /// Release provider resources.
    fn shutdown(&mut self) -> Result<(), ProviderError> {
        Ok(())
    }
}

thread_local! {
    static GROUP: RefCell<Option<Box<dyn std::any::Any>>> = const { RefCell::new(None) };
}

fn with_group<T: InstanceGroup, R>(f: impl FnOnce(&mut T) -> Result<R, ProviderError>) -> Result<R, ProviderError> {
    GROUP.with(|slot| {
        let mut slot = slot.borrow_mut();
        match slot.as_mut().and_then(|g| g.downcast_mut::<T>()) {
            Some(group) => f(group),
            None => Err(ProviderError::Other("init has not been called".into())),
        }
    })
}

impl<T: InstanceGroup + Named> wit::Guest for Component<T> {
    fn metadata() -> wit_plugin::PluginMetadata {
        crate::export::metadata::<T>(wit_plugin::PluginKind::Fleeting)
    }

    fn init(connector: ConnectorConfig, plugin_config: String) -> Result<ProviderInfo, ProviderError> {
        let (group, info) = T::init(connector, &plugin_config)?;
        GROUP.with(|slot| *slot.borrow_mut() = Some(Box::new(group)));
        Ok(info)
    }
    fn update() -> Result<Vec<Instance>, ProviderError> {
        with_group::<T, _>(|g| g.update())
    }
    fn increase(n: u32) -> Result<u32, ProviderError> {
        with_group::<T, _>(|g| g.increase(n))
    }
    fn decrease(ids: Vec<String>) -> Result<Vec<String>, ProviderError> {
        with_group::<T, _>(|g| g.decrease(ids))
    }
    fn get_connect_info(id: String) -> Result<ConnectInfo, ProviderError> {
        with_group::<T, _>(|g| g.connect_info(&id))
    }
    fn heartbeat(id: String) -> Result<(), ProviderError> {
        with_group::<T, _>(|g| g.heartbeat(&id))
    }
    fn interruptions() -> Result<Vec<Interruption>, ProviderError> {
        with_group::<T, _>(|g| g.interruptions())
    }
    fn shutdown() -> Result<(), ProviderError> {
        with_group::<T, _>(|g| g.shutdown())
    }
}
