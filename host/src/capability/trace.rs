//! `runway:host/trace`: plugin writes into the current job's log.

use crate::bindings::executor::runway::host::trace::{Host, TraceError};
use crate::plugin::state::PluginState;

/// Most bytes accepted in one write.
pub const MAX_TRACE_WRITE: usize = 1 << 20;

impl Host for PluginState {
    async fn write(&mut self, data: Vec<u8>) -> wasmtime::Result<Result<(), TraceError>> {
        if data.len() > MAX_TRACE_WRITE {
            return Ok(Err(TraceError::TooLarge(MAX_TRACE_WRITE as u32)));
        }
        match &self.call.trace {
            Some(trace) => {
                trace.write(&data);
                Ok(Ok(()))
            }
            None => Ok(Err(TraceError::NoJob)),
        }
    }
}
