//! The host side of each `runway:host` WIT interface, one file per interface (the layout of
//! wasmtime's `crates/wasi` host side). Every capability checks the plugin's grant first and
//! returns a WIT error value, never a trap, for anything the guest can cause.

pub mod http;
pub mod kv;
pub mod log;
pub mod process;
pub mod remote;
pub mod trace;

use crate::bindings::{executor, fleeting};
use crate::plugin::state::PluginState;

// Types-only interfaces have empty host traits.
impl executor::runway::host::plugin::Host for PluginState {}
impl executor::runway::executor::types::Host for PluginState {}
impl fleeting::runway::fleeting::types::Host for PluginState {}
