//! What the current job asked for beyond the executor's [`crate::executor::Job`] record: its
//! variables, registry credentials, and the `image:`/`services:` details container executors
//! honour (pull policies, service variables, `docker: user`).

use crate::bindings::executor::runway::host0_2_0::job as wit;
pub use crate::bindings::executor::runway::host0_2_0::job::{Credential, ImageDetails, JobDetails, Variable};

/// The job the current call works for; `None` outside a job.
pub fn current() -> Option<JobDetails> {
    wit::current()
}

impl JobDetails {
    /// The value of the last variable named `key`, if any (GitLab's later definitions win).
    pub fn variable(&self, key: &str) -> Option<&str> {
        self.variables.iter().rev().find(|v| v.key == key).map(|v| v.value.as_str())
    }
}
