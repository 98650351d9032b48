//! The stages of a job on a machine reached over the host's SSH connector, shared by the
//! `instance` executor (an autoscaled fleet's instance) and the `ssh` executor (one configured
//! host): this file is compiled into both plugins (`#[path]`).
//!
//! Every stage runs detached on the machine (in its own session, the script on its standard
//! input): its output goes to a log file and its exit code to a file under
//! `<builds_dir>/.runway-stages/<job id>/`, and the host follows the log into the job trace.
//! A dropped connection therefore does not kill the stage, and a later manager can reattach
//! from the environment's `state`: after `resume`, a stage already started (its log exists) is
//! only followed, never started again. `cleanup` stops whatever stage still runs, then
//! removes the stage files.

use std::cell::{Cell, RefCell};

use runway_sdk::executor::*;
use runway_sdk::remote::{self, quote, RemoteError};

/// Seconds between SIGTERM and SIGKILL when `cleanup` stops a stage still running.
const STOP_GRACE_SECONDS: u32 = 5;

/// What `state` saves and `resume` reads.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct RemoteEnvironment {
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
    /// What to configure when the job has no machine.
    #[serde(skip)]
    no_instance: &'static str,
}

/// What a remote error means for the executor: `no_instance` says what to configure.
pub fn remote_error(e: RemoteError, no_instance: &str) -> ExecutorError {
    match e {
        RemoteError::NoInstance => ExecutorError::InvalidConfig(no_instance.to_string()),
        RemoteError::Connection(m) => ExecutorError::Unavailable(format!("connection: {m}")),
        RemoteError::Canceled => ExecutorError::Canceled,
        RemoteError::TooLarge(limit) => ExecutorError::Other(format!("transfer larger than {limit} bytes")),
        RemoteError::Other(m) => ExecutorError::Other(m),
    }
}

impl RemoteEnvironment {
    /// Prepare `job` on the machine: check the shell, create the builds and stage
    /// directories. `label` names the executor in errors; `no_instance` says what to configure
    /// when the job has no machine.
    pub fn prepare(job: Job, login: bool, label: &str, no_instance: &'static str) -> Result<Self, ExecutorError> {
        if job.shell != "bash" && job.shell != "sh" {
            return Err(ExecutorError::InvalidConfig(format!(
                "shell {:?} is not supported by the {label} executor (bash, sh)",
                job.shell
            )));
        }
        let stages_dir = format!("{}/.runway-stages/{}", job.builds_dir.trim_end_matches('/'), job.id);
        let mkdir = format!("mkdir -p {} {}", quote(&job.builds_dir), quote(&stages_dir));
        let status = remote::run(&mkdir, None).map_err(|e| remote_error(e, no_instance))?;
        if status.code != 0 {
            return Err(ExecutorError::Unavailable(format!(
                "cannot create the builds directory {} on the {label} machine (exit code {})",
                job.builds_dir, status.code
            )));
        }
        Ok(RemoteEnvironment {
            shell: job.shell,
            login,
            builds_dir: job.builds_dir,
            project_dir: job.project_dir,
            stages_dir,
            started: Cell::new(0),
            last: RefCell::new(None),
            resumed: false,
            no_instance,
        })
    }

    /// Rebuild the environment from `state` (see [`Environment::state`]).
    pub fn resume(state: &str, label: &str, no_instance: &'static str) -> Result<Self, ExecutorError> {
        let mut env: RemoteEnvironment = serde_json::from_str(state)
            .map_err(|e| ExecutorError::Other(format!("unreadable {label} executor state: {e}")))?;
        env.resumed = true;
        env.no_instance = no_instance;
        Ok(env)
    }

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
        let started = self.resumed && remote::exists(&log).map_err(|e| remote_error(e, self.no_instance))?;
        Ok((log, exit, started))
    }
}

impl Environment for RemoteEnvironment {
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
            remote::start_detached(&command, Some(stage.script.as_bytes()), &log, &exit)
                .map_err(|e| remote_error(e, self.no_instance))?;
        }
        let status = remote::attach(&log, &exit, 0).map_err(|e| remote_error(e, self.no_instance))?;
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
