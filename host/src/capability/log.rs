//! `runway:host/log`: plugin log lines into the runner's `tracing` output.
//!
//! Owns: [`LogCtx`] (which plugin is speaking) and the `log` host trait on it. Must not
//! touch: plugins or stores (the plugin host links this interface by projecting its store
//! data onto a `&mut LogCtx`).

use std::sync::Arc;

use crate::bindings::executor::runway::host::log::{Host, Level};

/// Longest line kept; the rest is cut.
const MAX_LINE: usize = 64 * 1024;

/// The `log` capability's state: the name its lines are tagged with.
pub struct LogCtx {
    plugin: Arc<str>,
}

impl LogCtx {
    /// Log lines of `plugin`.
    pub fn new(plugin: Arc<str>) -> Self {
        LogCtx { plugin }
    }
}

impl Host for LogCtx {
    async fn write(&mut self, level: Level, mut message: String) -> wasmtime::Result<()> {
        if message.len() > MAX_LINE {
            let mut cut = MAX_LINE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push_str(" [truncated]");
        }
        let plugin = &*self.plugin;
        match level {
            Level::Trace => tracing::trace!(plugin, "{message}"),
            Level::Debug => tracing::debug!(plugin, "{message}"),
            Level::Info => tracing::info!(plugin, "{message}"),
            Level::Warn => tracing::warn!(plugin, "{message}"),
            Level::Error => tracing::error!(plugin, "{message}"),
        }
        Ok(())
    }
}
