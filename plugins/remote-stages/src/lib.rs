//! The stages of a job run detached on a machine the host reaches through its `remote`
//! capability, shared by the `shell` executor (the runner's own machine), the `instance`
//! executor (an autoscaled fleet's instance) and the `ssh` executor (one configured host).
//!
//! Every stage runs detached on the machine (in its own session, the script on its standard
//! input): its output goes to a log file and its exit code to a file in the job's stage
//! directory, and the host follows the log into the job trace. A dropped connection or a dead
//! runner therefore does not kill the stage, and a later runner can reattach from the
//! environment's `state`: after `resume`, a stage already started (its log exists) is only
//! followed, never started again. [`StageFiles`] numbers and names those files and remembers
//! what `state` must keep; [`working_dir`] and [`shell_command`] say where and how a stage
//! runs; [`remote_env::RemoteEnvironment`] is the whole environment of the instance and ssh
//! executors.
//!
//! Owns: the stage files' layout, their numbering across a resume, and the stage's working
//! directory and shell. Must not touch: how an executor makes its stage directory or maps the
//! host's errors (each plugin's own), or anything of the job but its stages.

pub mod remote_env;

use std::cell::{Cell, RefCell};

use runway_sdk::executor::ExecutorError;
use runway_sdk::remote::{self, quote, RemoteError};

/// Seconds between SIGTERM and SIGKILL when `cleanup` stops a stage still running.
pub const STOP_GRACE_SECONDS: u32 = 5;

/// The stage directory and the stages started in it: what `state` saves (flattened into the
/// executor's own state, so its JSON keys are `stages_dir`, `started` and `last`).
#[derive(serde::Serialize, serde::Deserialize)]
pub struct StageFiles {
    stages_dir: String,
    /// Stages started so far (names the next stage's files).
    #[serde(default)]
    started: Cell<u32>,
    /// The stage started last.
    #[serde(default)]
    last: RefCell<Option<String>>,
    /// Rebuilt by `resume`: a stage may already have been started by the previous runner.
    #[serde(skip)]
    resumed: bool,
}

/// The files of one stage.
pub struct StageFile {
    /// Its output.
    pub log: String,
    /// Its exit code, written when it ends.
    pub exit: String,
    /// Started already, by the runner the state was taken from: only to be followed.
    pub started: bool,
}

impl StageFiles {
    /// No stage started yet in `stages_dir`.
    pub fn new(stages_dir: String) -> StageFiles {
        StageFiles { stages_dir, started: Cell::new(0), last: RefCell::new(None), resumed: false }
    }

    /// The stage directory.
    pub fn dir(&self) -> &str {
        &self.stages_dir
    }

    /// Rebuilt from a previous runner's state: the next stage may be running already.
    pub fn mark_resumed(&mut self) {
        self.resumed = true;
    }

    /// Was this rebuilt from a previous runner's state?
    pub fn resumed(&self) -> bool {
        self.resumed
    }

    /// The log and exit files of stage `name`, and whether it was started already. After
    /// `resume`, the stage the state was taken in (the last one started) keeps its files, and
    /// an existing log means a previous runner started it; otherwise nothing is checked.
    /// `error` maps the host's error of that check.
    pub fn next(&self, name: &str, error: impl Fn(RemoteError) -> ExecutorError) -> Result<StageFile, ExecutorError> {
        self.next_checked(name, |log| remote::exists(log).map_err(error))
    }

    /// [`StageFiles::next`] on a machine the `remote` capability does not reach (a pod's
    /// container): `exists` tells whether a log file exists there.
    pub fn next_checked(
        &self,
        name: &str,
        exists: impl FnOnce(&str) -> Result<bool, ExecutorError>,
    ) -> Result<StageFile, ExecutorError> {
        let mut index = self.started.get();
        if self.resumed && index > 0 && self.last.borrow().as_deref() == Some(name) {
            index -= 1;
        }
        self.started.set(index + 1);
        *self.last.borrow_mut() = Some(name.to_string());
        let base = format!("{}/{index:02}-{name}", self.stages_dir);
        let (log, exit) = (format!("{base}.log"), format!("{base}.exit"));
        let started = self.resumed && exists(&log)?;
        Ok(StageFile { log, exit, started })
    }

    /// Best effort: stop a stage still running (one a previous runner started, too), then
    /// remove the stage files (logs, exit codes), only needed while the job runs.
    pub fn stop_and_remove(&self) {
        let stop = remote::stop_detached_script(&self.stages_dir, STOP_GRACE_SECONDS);
        let _ = remote::run(&format!("{stop}rm -rf {}", quote(&self.stages_dir)), None);
    }
}

/// Where stage `stage` runs: the project directory for the job's own steps (`step_script`,
/// other `step_*` steps such as `step_release`, and `after_script`), the builds directory for
/// the stages before them (get_sources runs before the project directory exists).
pub fn working_dir<'a>(stage: &str, project_dir: &'a str, builds_dir: &'a str) -> &'a str {
    if stage == "after_script" || stage.starts_with("step_") {
        project_dir
    } else {
        builds_dir
    }
}

/// The shell a stage's script is fed to: `bash --login` with `login` (as gitlab-runner runs
/// it), `sh` and a plain `bash` otherwise.
pub fn shell_command(shell: &str, login: bool) -> String {
    let login = if login && shell == "bash" { " --login" } else { "" };
    format!("{shell}{login}")
}

/// Is `shell` one a stage can be fed to?
pub fn check_shell(shell: &str, label: &str) -> Result<(), ExecutorError> {
    if shell != "bash" && shell != "sh" {
        return Err(ExecutorError::InvalidConfig(format!(
            "shell {shell:?} is not supported by the {label} executor (bash, sh)"
        )));
    }
    Ok(())
}
