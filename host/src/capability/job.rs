//! `runway:host/job`: what the current job asked for beyond the executor's frozen `job` record
//! (variables, registry credentials, `image:`/`services:` details). The executor boundary fills
//! [`CallContext::job`] from the payload when it prepares a job; this capability hands it to the
//! plugin, and `none` outside a job.
//!
//! Owns: [`JobView`] and the `job` host trait on it. Must not touch: the payload (the executor
//! converts it), plugins or stores.

use wasmtime::component::HasData;

use crate::bindings::executor::runway::host0_2_0::job::{Host, JobDetails};
use crate::capability::call::CallContext;

/// The `job` capability as one call sees it.
pub struct JobView<'a> {
    /// The job the call works for.
    pub call: &'a CallContext,
}

/// [`HasData`] marker linking `job` to a [`JobView`].
pub struct HasJob;

impl HasData for HasJob {
    type Data<'a> = JobView<'a>;
}

impl Host for JobView<'_> {
    async fn current(&mut self) -> wasmtime::Result<Option<JobDetails>> {
        Ok(self.call.job.as_deref().cloned())
    }
}
