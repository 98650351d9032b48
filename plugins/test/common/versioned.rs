//! Shared body of the `versioned` test plugins: v1 and v2 differ only in their crate version.
//! `run` runs the stage script with `sh -c` (so a test can hold a call in flight with
//! `sleep`), then writes `served by <version>` to the trace.

use runway_sdk::executor::*;
use runway_sdk::process::Command;

struct Versioned;
struct Env;

impl Executor for Versioned {
    type Environment = Env;
    fn info(_config: &str) -> Result<ProviderInfo, ExecutorError> {
        Ok(ProviderInfo::new("versioned", "bash"))
    }
    fn prepare(_job: Job) -> Result<Env, ExecutorError> {
        Ok(Env)
    }
}

impl Environment for Env {
    fn run(&self, stage: StageScript) -> Result<ExitStatus, ExecutorError> {
        let status =
            Command::new("sh").arg("-c").arg(stage.script).run().map_err(|e| ExecutorError::Other(format!("{e:?}")))?;
        runway_sdk::trace::write_str(&format!("served by {}\n", env!("CARGO_PKG_VERSION")));
        Ok(ExitStatus { code: status.code })
    }
}

runway_sdk::export_executor!(Versioned, name: "versioned", description: "reports its version (tests only)");
