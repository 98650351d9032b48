//! `runway:host/trace`: plugin writes into the current job's log.
//!
//! Owns: [`TraceView`] and the `trace` host trait on it. Must not touch: plugins or stores
//! (the plugin host projects its call context onto a [`TraceView`]).

use std::sync::Arc;

use wasmtime::component::HasData;

use crate::bindings::executor::runway::host0_1_0::trace::{Host, TraceError};
use crate::trace::TraceSink;

/// Most bytes accepted in one write.
pub const MAX_TRACE_WRITE: usize = 1 << 20;

/// The `trace` capability as one call sees it: the log of the job the call works for.
pub struct TraceView<'a> {
    /// The job log; `None` outside a job.
    pub trace: Option<&'a Arc<dyn TraceSink>>,
}

/// [`HasData`] marker linking `trace` to a [`TraceView`].
pub struct HasTrace;

impl HasData for HasTrace {
    type Data<'a> = TraceView<'a>;
}

impl Host for TraceView<'_> {
    async fn write(&mut self, data: Vec<u8>) -> wasmtime::Result<Result<(), TraceError>> {
        if data.len() > MAX_TRACE_WRITE {
            return Ok(Err(TraceError::TooLarge(MAX_TRACE_WRITE as u32)));
        }
        match self.trace {
            Some(trace) => {
                trace.write(&data);
                Ok(Ok(()))
            }
            None => Ok(Err(TraceError::NoJob)),
        }
    }
}
