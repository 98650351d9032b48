//! The environment of a job on a machine reached over the host's SSH connector: the
//! `instance` executor's (an autoscaled fleet's instance) and the `ssh` executor's (one
//! configured host). The stage directory is `<builds_dir>/.runway-stages/<job id>-<nonce>/`, made
//! over the connection; `cleanup` stops whatever stage still runs, then removes it.
//!
//! Owns: prepare, resume, run and cleanup of such a job. Must not touch: the executors'
//! config sections (each plugin parses its own and hands over `login`).

use runway_sdk::executor::*;
use runway_sdk::remote::{self, quote, RemoteError};

use crate::{check_shell, shell_command, working_dir, StageFiles};

/// What `state` saves and `resume` reads.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct RemoteEnvironment {
    shell: String,
    login: bool,
    builds_dir: String,
    project_dir: String,
    #[serde(flatten)]
    stages: StageFiles,
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
        check_shell(&job.shell, label)?;
        // A directory of this environment's own (as the shell executor's): the stage files an
        // earlier job with this id left (a manager killed before its cleanup, a GitLab whose
        // job ids started over) are never taken for this job's after a resume.
        let nonce = std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), job.id) as u32;
        let stages_dir = format!("{}/.runway-stages/{}-{nonce:08x}", job.builds_dir.trim_end_matches('/'), job.id);
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
            stages: StageFiles::new(stages_dir),
            no_instance,
        })
    }

    /// Rebuild the environment from `state` (see [`Environment::state`]).
    pub fn resume(state: &str, label: &str, no_instance: &'static str) -> Result<Self, ExecutorError> {
        let mut env: RemoteEnvironment = serde_json::from_str(state)
            .map_err(|e| ExecutorError::Other(format!("unreadable {label} executor state: {e}")))?;
        env.stages.mark_resumed();
        env.no_instance = no_instance;
        Ok(env)
    }
}

impl Environment for RemoteEnvironment {
    fn run(&self, stage: StageScript) -> Result<ExitStatus, ExecutorError> {
        let error = |e: RemoteError| remote_error(e, self.no_instance);
        let cwd = working_dir(&stage.name, &self.project_dir, &self.builds_dir);
        let files = self.stages.next(&stage.name, error)?;
        if !files.started {
            let command = format!("cd {} && exec {}", quote(cwd), shell_command(&self.shell, self.login));
            remote::start_detached(&command, Some(stage.script.as_bytes()), &files.log, &files.exit).map_err(error)?;
        }
        let status = remote::attach(&files.log, &files.exit, 0).map_err(error)?;
        Ok(ExitStatus { code: status.code })
    }

    fn cleanup(&self) {
        self.stages.stop_and_remove();
    }

    fn state(&self) -> Option<String> {
        serde_json::to_string(self).ok()
    }
}
