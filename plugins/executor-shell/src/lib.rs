//! The shell executor: runs each stage script with the job's shell (bash) on the runner's
//! machine through the host's `process` capability. The host streams the shell's output
//! into the job log and kills its process group on cancel; this plugin decides only what to
//! run and where.
//!
//! Config (`[runners.shell]`, optional): `login = true|false` (default true) runs
//! `bash --login`, as gitlab-runner's shell executor does.

use runway_sdk::executor::*;
use runway_sdk::process::{Command, ProcessError};

struct Shell;

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_login")]
    login: bool,
}

fn default_login() -> bool {
    true
}

struct ShellEnvironment {
    shell: String,
    project_dir: String,
    builds_dir: String,
    login: bool,
}

fn parse_config(config: &str) -> Result<Config, ExecutorError> {
    if config.trim().is_empty() {
        return Ok(Config { login: true });
    }
    serde_json::from_str(config).map_err(|e| ExecutorError::InvalidConfig(format!("[runners.shell]: {e}")))
}

impl Executor for Shell {
    type Environment = ShellEnvironment;

    fn info(config: &str) -> Result<ProviderInfo, ExecutorError> {
        parse_config(config)?;
        Ok(ProviderInfo::new("shell", "bash"))
    }

    fn prepare(job: Job) -> Result<ShellEnvironment, ExecutorError> {
        let config = parse_config(&job.config)?;
        if job.shell != "bash" && job.shell != "sh" {
            return Err(ExecutorError::InvalidConfig(format!(
                "shell {:?} is not supported by the shell executor (bash, sh)",
                job.shell
            )));
        }
        // The builds directory must exist before get_sources can clone into it.
        let status = Command::new("mkdir").args(["-p", &job.builds_dir]).output(4096).map_err(process_error)?;
        if status.status.code != 0 {
            return Err(ExecutorError::Unavailable(format!(
                "cannot create builds directory {}: {}",
                job.builds_dir,
                String::from_utf8_lossy(&status.stderr).trim()
            )));
        }
        Ok(ShellEnvironment {
            shell: job.shell,
            project_dir: job.project_dir,
            builds_dir: job.builds_dir,
            login: config.login,
        })
    }

    fn resume(job: Job, _state: String) -> Result<ShellEnvironment, ExecutorError> {
        // A local shell process cannot outlive the runner that started it, so there is
        // nothing to reattach to: say so and let the host fail the job honestly.
        let _ = job;
        Err(ExecutorError::Unavailable("shell executor processes do not survive a runner restart".into()))
    }
}

fn process_error(e: ProcessError) -> ExecutorError {
    match e {
        ProcessError::Canceled | ProcessError::TimedOut => ExecutorError::Canceled,
        ProcessError::NotPermitted(m) => ExecutorError::InvalidConfig(format!(
            "the shell plugin needs `allow_process = true` in its [plugins.shell] grant: {m}"
        )),
        ProcessError::SpawnFailed(m) => ExecutorError::Unavailable(m),
        ProcessError::Other(m) => ExecutorError::Other(m),
    }
}

impl Environment for ShellEnvironment {
    fn run(&self, stage: StageScript) -> Result<ExitStatus, ExecutorError> {
        // Stages before get_sources run before the project directory exists.
        let cwd = if stage.name == "step_script" || stage.name == "after_script" {
            &self.project_dir
        } else {
            &self.builds_dir
        };
        let mut cmd = Command::new(&self.shell);
        if self.login && self.shell == "bash" {
            cmd = cmd.arg("--login");
        }
        let status = cmd.current_dir(cwd.as_str()).stdin(stage.script.into_bytes()).run().map_err(process_error)?;
        Ok(ExitStatus { code: status.code })
    }
}

runway_sdk::export_executor!(Shell, name: "shell", description: "runs job scripts with bash on the runner's machine");
