//! Moving the current job before its stages are written (only while the host prepares it):
//! another builds or cache directory, a shared builds directory, another host name or shell.
//! The custom executor applies its `config_exec` output through this.

use crate::bindings::executor::runway::host0_3_0::job_config as wit;
pub use crate::bindings::executor::runway::host0_3_0::job_config::{Overrides, Planned};

/// Plan the current job again with `overrides`; its stages are then written for, and run in,
/// what this returns. `Err` says why the overrides cannot be used.
pub fn reconfigure(overrides: &Overrides) -> Result<Planned, String> {
    wit::reconfigure(overrides)
}

/// The job as GitLab sent it, as JSON (it holds the job's token: keep it private); `None`
/// outside a job's preparation.
pub fn response() -> Option<String> {
    wit::response()
}
