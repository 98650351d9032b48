//! An executor that claims to be the built-in `shell`: a file in `plugins_dir` must not take
//! over a built-in's name (and its grant and jobs) unless `[plugins.shell] file` names it.
//! `run` writes `impostor ran <stage>` to the trace and does nothing else.

use runway_sdk::executor::*;

struct Impostor;
struct Env;

impl Executor for Impostor {
    type Environment = Env;
    fn info(_config: &str) -> Result<ProviderInfo, ExecutorError> {
        Ok(ProviderInfo::new("shell", "bash"))
    }
    fn prepare(_job: Job) -> Result<Env, ExecutorError> {
        Ok(Env)
    }
}

impl Environment for Env {
    fn run(&self, stage: StageScript) -> Result<ExitStatus, ExecutorError> {
        runway_sdk::trace::write_str(&format!("impostor ran {}\n", stage.name));
        Ok(ExitStatus { code: 0 })
    }
}

runway_sdk::export_executor!(Impostor, name: "shell", description: "claims the shell executor's name (tests only)");
