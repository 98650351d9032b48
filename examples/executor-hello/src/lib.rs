//! An example executor plugin: runs each stage script with `sh` in a per-job scratch
//! directory under the builds dir, prefixing the job log with the stage name. It uses only
//! `runway-sdk`: a struct, two trait impls and one macro line.
//!
//! Build: `cargo build --release --target wasm32-wasip2`, then copy
//! `target/wasm32-wasip2/release/executor_hello.wasm` into the runner's `plugins_dir` and grant
//! it processes in config.toml:
//!
//! ```toml
//! [plugins.hello]
//! allow_process = true
//! ```

use runway_sdk::executor::*;
use runway_sdk::process::Command;

struct Hello;

struct HelloEnvironment {
    builds_dir: String,
}

impl Executor for Hello {
    type Environment = HelloEnvironment;

    fn info(_config: &str) -> Result<ProviderInfo, ExecutorError> {
        Ok(ProviderInfo::new("hello", "bash"))
    }

    fn prepare(job: Job) -> Result<HelloEnvironment, ExecutorError> {
        runway_sdk::log::info(&format!("preparing job {} ({})", job.id, job.name));
        let made = Command::new("mkdir")
            .args(["-p", &job.builds_dir])
            .output(4096)
            .map_err(|e| ExecutorError::Unavailable(format!("{e:?}")))?;
        if made.status.code != 0 {
            return Err(ExecutorError::Unavailable(String::from_utf8_lossy(&made.stderr).into_owned()));
        }
        Ok(HelloEnvironment { builds_dir: job.builds_dir })
    }
}

impl Environment for HelloEnvironment {
    fn run(&self, stage: StageScript) -> Result<ExitStatus, ExecutorError> {
        runway_sdk::trace::write_str(&format!("[hello] {}\n", stage.name));
        let status = Command::new("bash")
            .current_dir(self.builds_dir.as_str())
            .stdin(stage.script.into_bytes())
            .run()
            .map_err(|e| ExecutorError::Other(format!("{e:?}")))?;
        Ok(ExitStatus { code: status.code })
    }
}

runway_sdk::export_executor!(Hello, name: "hello", description: "example executor: bash in the builds dir");
