//! `runway:host/job-config@0.3.0`: an executor moves the job it prepares before its stages are
//! written (the custom executor's `config_exec` output). The executor boundary puts a
//! [`Reconfigure`](crate::capability::replan::Reconfigure) in the call context of `prepare`
//! calls; this capability hands the plugin's overrides to it and its answer back, and refuses
//! calls made at any other time.
//!
//! Owns: the `job-config` host trait on [`JobView`] (the WIT types to and from
//! [`crate::capability::replan`]'s). Must not touch: planning itself (the job module
//! implements `Reconfigure`), plugins or stores.

use crate::bindings::executor::runway::host0_3_0::job_config::{Host, Overrides, Planned};
use crate::capability::job::JobView;
use crate::capability::replan::{JobOverrides, ReplanError};

impl Host for JobView<'_> {
    async fn reconfigure(&mut self, overrides: Overrides) -> wasmtime::Result<Result<Planned, String>> {
        let Some(replan) = &self.call.reconfigure else {
            return Ok(Err(ReplanError::NotPreparing.to_string()));
        };
        let Overrides { builds_dir, cache_dir, builds_dir_is_shared, hostname, shell } = overrides;
        let overrides = JobOverrides { builds_dir, cache_dir, builds_dir_is_shared, hostname, shell };
        Ok(replan
            .reconfigure(overrides)
            .map(|p| Planned {
                builds_dir: p.builds_dir,
                project_dir: p.project_dir,
                cache_dir: p.cache_dir,
                variables: p.variables,
            })
            .map_err(|e| e.to_string()))
    }

    async fn response(&mut self) -> wasmtime::Result<Option<String>> {
        Ok(self.call.reconfigure.as_ref().and_then(|r| r.response()))
    }
}
