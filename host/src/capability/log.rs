//! `runway:host/log`: plugin log lines into the runner's `tracing` output.

use crate::bindings::executor::runway::host::log::{Host, Level};
use crate::plugin::state::PluginState;

/// Longest line kept; the rest is cut.
const MAX_LINE: usize = 64 * 1024;

impl Host for PluginState {
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
