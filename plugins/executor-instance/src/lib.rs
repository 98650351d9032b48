//! The instance executor: runs each stage script on the instance the autoscaler acquired for
//! the job, through the host's `remote` capability (SSH). The plugin never sees the
//! instance's address or credentials.
//!
//! Every stage runs detached on the instance (in its own session, the script on its standard
//! input): its output goes to a log file and its exit code to a file under
//! `<builds_dir>/.runway-stages/<job id>/`, and the host follows the log into the job trace.
//! A dropped connection therefore does not kill the stage, and a later manager can reattach
//! from the environment's `state`: after `resume`, a stage already started (its log exists) is
//! only followed, never started again. `cleanup` stops whatever stage still runs, then
//! removes the stage files.
//!
//! Config (`[runners.instance]`, optional): `login = true|false` (default true) runs
//! `bash --login`, as the shell executor does.

use std::cell::{Cell, RefCell};

use runway_sdk::executor::*;
use runway_sdk::remote::{self, quote, RemoteError};

struct Instance;

/// Seconds between SIGTERM and SIGKILL when `cleanup` stops a stage still running.
const STOP_GRACE_SECONDS: u32 = 5;

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_login")]
    login: bool,
}

fn default_login() -> bool {
    true
}

fn parse_config(config: &str) -> Result<Config, ExecutorError> {
    if config.trim().is_empty() {
        return Ok(Config { login: true });
    }
    serde_json::from_str(config).map_err(|e| ExecutorError::InvalidConfig(format!("[runners.instance]: {e}")))
}

/// What `state` saves and `resume` reads.
#[derive(serde::Serialize, serde::Deserialize)]
struct InstanceEnvironment {
    shell: String,
    login: bool,
    builds_dir: String,
    project_dir: String,
    stages_dir: String,
    /// Stages started so far (names the next stage's files).
    #[serde(default)]
    started: Cell<u32>,
    /// The stage started last.
    #[serde(default)]
    last: RefCell<Option<String>>,
    /// Rebuilt by `resume`: a stage may already have been started by the previous manager.
    #[serde(skip)]
    resumed: bool,
}

fn remote_error(e: RemoteError) -> ExecutorError {
    match e {
        RemoteError::NoInstance => ExecutorError::InvalidConfig(
            "the instance executor needs an instance: configure [runners.autoscaler] for this runner".into(),
        ),
        RemoteError::Connection(m) => ExecutorError::Unavailable(format!("instance connection: {m}")),
        RemoteError::Canceled => ExecutorError::Canceled,
        RemoteError::TooLarge(limit) => ExecutorError::Other(format!("transfer larger than {limit} bytes")),
        RemoteError::Other(m) => ExecutorError::Other(m),
    }
}

impl Executor for Instance {
    type Environment = InstanceEnvironment;

    fn info(config: &str) -> Result<ProviderInfo, ExecutorError> {
        parse_config(config)?;
        // Relative directories are the login user's on the instance (`~/builds`).
        Ok(ProviderInfo::new("instance", "bash"))
    }

    fn prepare(job: Job) -> Result<InstanceEnvironment, ExecutorError> {
        let config = parse_config(&job.config)?;
        if job.shell != "bash" && job.shell != "sh" {
            return Err(ExecutorError::InvalidConfig(format!(
                "shell {:?} is not supported by the instance executor (bash, sh)",
                job.shell
            )));
        }
        let stages_dir = format!("{}/.runway-stages/{}", job.builds_dir.trim_end_matches('/'), job.id);
        let mkdir = format!("mkdir -p {} {}", quote(&job.builds_dir), quote(&stages_dir));
        let status = remote::run(&mkdir, None).map_err(remote_error)?;
        if status.code != 0 {
            return Err(ExecutorError::Unavailable(format!(
                "cannot create the builds directory {} on the instance (exit code {})",
                job.builds_dir, status.code
            )));
        }
        Ok(InstanceEnvironment {
            shell: job.shell,
            login: config.login,
            builds_dir: job.builds_dir,
            project_dir: job.project_dir,
            stages_dir,
            started: Cell::new(0),
            last: RefCell::new(None),
            resumed: false,
        })
    }

    fn resume(_job: Job, state: String) -> Result<InstanceEnvironment, ExecutorError> {
        let mut env: InstanceEnvironment = serde_json::from_str(&state)
            .map_err(|e| ExecutorError::Other(format!("unreadable instance executor state: {e}")))?;
        env.resumed = true;
        Ok(env)
    }
}

impl InstanceEnvironment {
    /// The log and exit files of stage `name`, and whether it was started already. After
    /// `resume`, the stage the state was taken in (the last one started) keeps its files, and
    /// an existing log means a previous manager started it; otherwise nothing is checked.
    fn stage_files(&self, name: &str) -> Result<(String, String, bool), ExecutorError> {
        let mut index = self.started.get();
        if self.resumed && index > 0 && self.last.borrow().as_deref() == Some(name) {
            index -= 1;
        }
        self.started.set(index + 1);
        *self.last.borrow_mut() = Some(name.to_string());
        let base = format!("{}/{index:02}-{name}", self.stages_dir);
        let (log, exit) = (format!("{base}.log"), format!("{base}.exit"));
        let started = self.resumed && remote::exists(&log).map_err(remote_error)?;
        Ok((log, exit, started))
    }
}

impl Environment for InstanceEnvironment {
    fn run(&self, stage: StageScript) -> Result<ExitStatus, ExecutorError> {
        // Stages before get_sources run before the project directory exists.
        let cwd = if stage.name == "step_script" || stage.name == "after_script" || stage.name.starts_with("step_") {
            &self.project_dir
        } else {
            &self.builds_dir
        };
        let (log, exit, started) = self.stage_files(&stage.name)?;
        if !started {
            let login = if self.login && self.shell == "bash" { " --login" } else { "" };
            let command = format!("cd {} && exec {}{login}", quote(cwd), self.shell);
            remote::start_detached(&command, Some(stage.script.as_bytes()), &log, &exit).map_err(remote_error)?;
        }
        let status = remote::attach(&log, &exit, 0).map_err(remote_error)?;
        Ok(ExitStatus { code: status.code })
    }

    fn cleanup(&self) {
        // Best effort: stop a stage still running (one a previous manager started, too), then
        // remove the stage logs, only needed while the job runs.
        let stop = remote::stop_detached_script(&self.stages_dir, STOP_GRACE_SECONDS);
        let _ = remote::run(&format!("{stop}rm -rf {}", quote(&self.stages_dir)), None);
    }

    fn state(&self) -> Option<String> {
        serde_json::to_string(self).ok()
    }
}

runway_sdk::export_executor!(Instance, name: "instance", description: "runs job scripts on autoscaled instances over SSH");
