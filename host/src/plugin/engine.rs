//! The one process-wide wasmtime [`Engine`]: configuration, the pooling allocator with its
//! fallback, and the epoch ticker that drives call deadlines and cooperative yields.
//!
//! Owns: the engine. Must not touch: stores, plugins, capabilities.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// How often the epoch advances. Every tick a running guest yields to tokio and its call
/// budget is checked.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Which instance allocator the engine ended up with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocator {
    /// The pooling allocator (instances from preallocated slots).
    Pooling,
    /// On-demand allocation (the pool could not be reserved).
    OnDemand,
}

/// The engine plus the ticker thread that stops when the engine is dropped.
pub struct PluginEngine {
    /// The wasmtime engine every plugin is compiled for.
    pub engine: Engine,
    /// The allocator it uses.
    pub allocator: Allocator,
    ticker_stop: Arc<AtomicBool>,
}

fn base_config() -> Config {
    let mut config = Config::new();
    config.epoch_interruption(true);
    // Plugins use neither WASIp3 nor component-model async; without the task bookkeeping a
    // host→guest call is ~5× cheaper (reference wasm-plugin-hosts.md §5.2).
    config.concurrency_support(false);
    config
}

impl PluginEngine {
    /// Build the engine, preferring the pooling allocator and falling back to on-demand
    /// allocation when the address-space reservation fails (tight `ulimit -v`, some arches).
    pub fn new() -> anyhow::Result<Self> {
        let (engine, allocator) = match Self::pooling() {
            Ok(engine) => (engine, Allocator::Pooling),
            Err(e) => {
                tracing::warn!("pooling allocator unavailable ({e:#}); using on-demand allocation");
                (
                    Engine::new(&base_config()).map_err(|e| anyhow::anyhow!("creating the wasm engine: {e:#}"))?,
                    Allocator::OnDemand,
                )
            }
        };
        let ticker_stop = Arc::new(AtomicBool::new(false));
        let weak = engine.weak();
        let stop = ticker_stop.clone();
        // A std thread, not a tokio task: if every runtime worker is busy inside guest code a
        // tokio ticker would never run, and deadlines would never fire.
        std::thread::Builder::new()
            .name("runway-epoch".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    match weak.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => break,
                    }
                }
            })
            .context("starting the epoch ticker thread")?;
        Ok(PluginEngine { engine, allocator, ticker_stop })
    }

    fn pooling() -> anyhow::Result<Engine> {
        let mut pool = PoolingAllocationConfig::default();
        // Sized for a runner: a few hundred concurrent job stores plus fleeting stores.
        pool.total_component_instances(256);
        pool.total_core_instances(1024);
        pool.total_memories(512);
        pool.total_tables(1024);
        pool.total_stacks(256);
        pool.max_memory_size(1 << 30);
        let mut config = base_config();
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        Engine::new(&config).map_err(|e| anyhow::anyhow!("{e:#}"))
    }

    /// A hash of everything that makes compiled code (a `.cwasm`) valid for this engine.
    pub fn compatibility_key(&self) -> String {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.engine.precompile_compatibility_hash().hash(&mut hasher);
        format!("{:016x}", hasher.finish())
    }
}

impl Drop for PluginEngine {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
    }
}
