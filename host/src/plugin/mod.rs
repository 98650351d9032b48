//! Plugin host: the wasmtime engine, the plugin registry, the directory watcher, hot swap,
//! sandbox grants and resource limits.

pub mod grant;

pub use grant::PluginGrant;
