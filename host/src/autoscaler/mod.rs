//! The autoscaler (GitLab's taskscaler): job slots on a fleet of instances.
//!
//! - [`clock`]: [`clock::Moment`], the [`clock::Clock`] trait, real and virtual clocks;
//! - [`settings`]: the engine's own settings structs (taskscaler policies and legacy
//!   Docker Machine keys), validated by `compile`;
//! - [`from_config`]: the one mapping of config.toml's fleet keys onto [`settings`];
//! - [`cron`]: cron periods and timezones of idle policies;
//! - [`provider`]: the [`provider::InstanceGroup`] trait the engine scales, and a seeded
//!   simulated provider;
//! - [`plugin_provider`]: the [`provider::InstanceGroup`] over a `runway:fleeting` plugin,
//!   served from a thread of its own so the engine's synchronous calls never stall the runtime;
//! - [`predictive`]: the predictive policy's forecaster (demand history, lead time, learned
//!   keep-alive), used by the engine;
//! - [`throttle`]: the token bucket of the engine's scale throttle and the simulated cloud's
//!   launch rate limit;
//! - [`engine`]: the deterministic state machine ([`engine::Taskscaler`]);
//! - [`driver`]: the production wrapper ([`driver::Autoscaler`]): async `acquire`, a run loop
//!   sleeping on the clock, concurrent ready checks;
//! - [`trace`]: job-arrival traces (JSONL) and the seeded generators of autoscaling.md §3.4;
//! - [`simulate`]: `runway simulate`, the real engine on a virtual clock against the simulated
//!   provider and a simulated job queue.
//!
//! This module does not parse config.toml (it maps `config`'s model of it), run SSH commands or export Prometheus metrics; it
//! exposes plain settings, events and numbers for the modules that do.

pub mod clock;
pub mod cron;
pub mod driver;
pub mod engine;
pub mod from_config;
pub mod plugin_provider;
pub mod predictive;
pub mod provider;
pub mod settings;
pub mod simulate;
pub mod throttle;
pub mod trace;

#[cfg(test)]
mod engine_tests;

pub use clock::{Clock, Moment, RealClock, VirtualClock};
pub use driver::{Autoscaler, ReadyCommand};
pub use engine::{
    AcquireError, AcquireStatus, Acquisition, EngineEvent, EngineMetrics, EngineSnapshot, InstanceTiming, NotReady,
    RemovalReason, ReserveError, Taskscaler, TimingHistogram,
};
pub use plugin_provider::PluginProvider;
pub use provider::{InstanceGroup, InstanceState, ProviderError, SimProvider, SimProviderSettings};
pub use settings::{AutoscalerSettings, IdlePolicy, LegacyMachineSettings, LegacyPeriod, ScaleThrottle};
pub use simulate::{run_simulation, simulate_command, SimReport};
pub use trace::JobArrival;
