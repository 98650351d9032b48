//! The host side of each `runway:host` WIT interface, one file per interface (the layout of
//! wasmtime's `crates/wasi` host side). Every capability checks the plugin's grant first and
//! returns a WIT error value, never a trap, for anything the guest can cause.
//!
//! Each capability owns its state — a `*Ctx` ([`log::LogCtx`], [`kv::KvCtx`],
//! [`process::ProcessCtx`], [`remote::RemoteCtx`], [`docker::DockerCtx`], [`kube::KubeCtx`], [`http::HttpPolicy`]) — and implements its
//! WIT `Host` trait on its own view type: the `*Ctx` itself, or a `*View` that adds the call's
//! [`call::CallContext`] and [`call::CallBudget`]. The plugin host's store data composes the
//! contexts and links each interface by projection (`add_to_linker::<_, HasX>(l, |s| s.x())`),
//! as wasmtime-wasi does with `WasiCtxView`.
//!
//! Owns: capability state and policy, the per-call context and budget. Must not touch:
//! `plugin` (it imports us, never the other way round), jobs or executors.

pub mod call;
pub mod docker;
pub mod docker_stages;
pub mod files;
pub mod http;
pub mod job;
pub mod job_config;
pub mod kube;
pub mod kv;
pub mod log;
pub mod process;
pub mod remote;
pub mod replan;
pub mod supervisor;
pub mod terminal;
pub mod trace;

pub use call::{CallBudget, CallContext};

use wasmtime::component::HasData;

use crate::bindings::{executor, fleeting};

/// The view of interfaces that only define types (`runway:host/plugin`,
/// `runway:executor/types`, `runway:fleeting/types`): nothing to hold, nothing to do.
pub struct TypesOnly;

impl HasData for TypesOnly {
    type Data<'a> = TypesOnly;
}

impl executor::runway::host0_1_0::plugin::Host for TypesOnly {}
impl executor::runway::executor0_1_0::types::Host for TypesOnly {}
impl fleeting::runway::fleeting::types::Host for TypesOnly {}
