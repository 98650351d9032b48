//! A plugin store's resource limits: wasmtime's [`StoreLimits`] (memory, instances, tables,
//! growth failures trap), and a record that the memory limit refused a growth, so a trap is
//! named a memory-limit failure from that fact, not from the words of wasmtime's error.
//!
//! Owns: [`PluginLimits`]. Must not touch: how the failure is reported (`crate::plugin::call`).

use wasmtime::{ResourceLimiter, StoreLimits};

/// The limiter of one plugin store.
pub struct PluginLimits {
    inner: StoreLimits,
    memory_refused: bool,
}

impl PluginLimits {
    /// `inner`'s limits, nothing refused yet.
    pub fn new(inner: StoreLimits) -> Self {
        PluginLimits { inner, memory_refused: false }
    }

    /// Did the memory limit refuse a growth in this store?
    pub fn memory_refused(&self) -> bool {
        self.memory_refused
    }
}

impl ResourceLimiter for PluginLimits {
    fn memory_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        let allowed = self.inner.memory_growing(current, desired, maximum);
        if !matches!(allowed, Ok(true)) {
            self.memory_refused = true;
        }
        allowed
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.inner.memory_grow_failed(error)
    }

    fn table_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        self.inner.table_growing(current, desired, maximum)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.inner.table_grow_failed(error)
    }

    fn instances(&self) -> usize {
        self.inner.instances()
    }

    fn tables(&self) -> usize {
        self.inner.tables()
    }

    fn memories(&self) -> usize {
        self.inner.memories()
    }
}
