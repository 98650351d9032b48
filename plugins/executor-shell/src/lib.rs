//! The shell executor: runs each stage script with the job's shell (bash) on the runner's
//! machine. This plugin decides only what to run and where; the host runs it.
//!
//! Every stage runs detached, as the instance executor's do, through the host's `remote`
//! capability on the runner's own machine (which the `allow_process` grant gives a job with
//! no fleet instance): `cd <dir> && exec bash --login` with the script on its standard input,
//! in its own session, output to `<builds_dir>/.runway-stages-<job id>-<nonce>/NN-<stage>.log`
//! (a new 0700 directory per job), exit code to `….exit`, and the host follows the log into
//! the job log. A stage therefore keeps running while no runner is alive, and a runner that
//! resumes the job (`resume` with the environment's `state`) reattaches to it instead of
//! running it again. Cancel kills the stage's process group; `cleanup` stops whatever stage
//! still runs and removes the stage files (when every stage was followed to its end, the
//! host removes them: no process). The stage directory is made by the host too
//! (`runway:host/files`, API 0.4): a job starts no process of the plugin's but its stages.
//!
//! Config (`[runners.shell]`, optional): `login = true|false` (default true) runs
//! `bash --login`, as gitlab-runner's shell executor does; `user = "name"` (the host fills it
//! from config.toml's global `user` or `runway run --user`) runs every stage as that user,
//! as gitlab-runner does: `su -s /bin/bash <user> -c 'bash --login'` with the script on its
//! standard input. The runner must then be root (`su` asks no password of root), and a
//! builds directory the plugin creates is given to that user.
//!
//! The stage files' numbering, resume and working directories are the `remote-stages` crate's
//! (shared with the instance and ssh executors).

use std::cell::Cell;
use std::hash::BuildHasher;

use remote_stages::{check_shell, shell_command, working_dir, StageFiles};

use runway_sdk::executor::*;
use runway_sdk::files;
use runway_sdk::process::{Command, ProcessError};
use runway_sdk::remote::{self, quote, RemoteError};

struct Shell;

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_login")]
    login: bool,
    #[serde(default)]
    user: Option<String>,
}

fn default_login() -> bool {
    true
}

/// The job's environment; `state` saves it as JSON and `resume` reads it back.
#[derive(serde::Serialize, serde::Deserialize)]
struct ShellEnvironment {
    shell: String,
    project_dir: String,
    builds_dir: String,
    login: bool,
    /// The user stages run as (`su`), when not the runner's.
    #[serde(default)]
    user: Option<String>,
    #[serde(flatten)]
    stages: StageFiles,
    /// Stages started by this environment and not followed to their end (a canceled one
    /// stays counted): while any, or after `resume`, `cleanup` must stop what still runs.
    /// Otherwise it only removes the stage files, with no shell.
    #[serde(skip)]
    unfinished: Cell<u32>,
}

fn parse_config(config: &str) -> Result<Config, ExecutorError> {
    if config.trim().is_empty() {
        return Ok(Config { login: true, user: None });
    }
    serde_json::from_str(config).map_err(|e| ExecutorError::InvalidConfig(format!("[runners.shell]: {e}")))
}

const GRANT_NEEDED: &str = "the shell plugin needs `allow_process = true` in its [plugins.shell] grant";

impl Executor for Shell {
    type Environment = ShellEnvironment;

    fn info(config: &str) -> Result<ProviderInfo, ExecutorError> {
        parse_config(config)?;
        Ok(ProviderInfo::new("shell", "bash"))
    }

    fn prepare(job: Job) -> Result<ShellEnvironment, ExecutorError> {
        let config = parse_config(&job.config)?;
        check_shell(&job.shell, "shell")?;
        // The stage files (unmasked output, scripts) in a new directory of the runner's user
        // alone, under a name no one else can have taken: `runway exec` numbers its jobs from 1
        // and puts builds in the parent of the project (`/tmp` with `--isolate`), which other
        // runs, and other users, share. Its parent, the builds directory, must exist before
        // get_sources can clone into it: created only when the first try says it is missing.
        let nonce = std::collections::hash_map::RandomState::new().hash_one(job.id) as u32;
        let stages_dir = format!("{}/.runway-stages-{}-{nonce:08x}", job.builds_dir.trim_end_matches('/'), job.id);
        let user = config.user.filter(|u| !u.is_empty());
        if files::make_private_dir(&stages_dir, 0o700).is_err() {
            files::make_dir_all(&job.builds_dir, 0o755).map_err(|e| dir_error(&job.builds_dir, e))?;
            if let Some(user) = &user {
                // The job's user checks out into the builds directory the runner made.
                chown(user, &job.builds_dir)?;
            }
            files::make_private_dir(&stages_dir, 0o700).map_err(|e| dir_error(&stages_dir, e))?;
        }
        Ok(ShellEnvironment {
            shell: job.shell,
            project_dir: job.project_dir,
            builds_dir: job.builds_dir,
            login: config.login,
            user,
            stages: StageFiles::new(stages_dir),
            unfinished: Cell::new(0),
        })
    }

    fn resume(_job: Job, state: String) -> Result<ShellEnvironment, ExecutorError> {
        let mut env: ShellEnvironment = serde_json::from_str(&state)
            .map_err(|e| ExecutorError::Other(format!("unreadable shell executor state: {e}")))?;
        env.stages.mark_resumed();
        Ok(env)
    }
}

/// The error of a directory `dir` that could not be created.
fn dir_error(dir: &str, e: RemoteError) -> ExecutorError {
    match e {
        RemoteError::Other(m) => ExecutorError::Unavailable(format!("cannot create directory {dir}: {m}")),
        e => remote_error(e),
    }
}

/// Give `dir` to `user` (and its primary group).
fn chown(user: &str, dir: &str) -> Result<(), ExecutorError> {
    let output =
        Command::new("chown").args([format!("{user}:"), dir.to_string()]).output(4096).map_err(process_error)?;
    if output.status.code != 0 {
        return Err(ExecutorError::InvalidConfig(format!(
            "cannot give the builds directory {dir} to user {user:?}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(())
}

fn process_error(e: ProcessError) -> ExecutorError {
    match e {
        ProcessError::Canceled | ProcessError::TimedOut => ExecutorError::Canceled,
        ProcessError::NotPermitted(m) => ExecutorError::InvalidConfig(format!("{GRANT_NEEDED}: {m}")),
        ProcessError::SpawnFailed(m) => ExecutorError::Unavailable(m),
        ProcessError::Other(m) => ExecutorError::Other(m),
    }
}

fn remote_error(e: RemoteError) -> ExecutorError {
    match e {
        RemoteError::NoInstance => ExecutorError::InvalidConfig(format!("{GRANT_NEEDED} (no machine to run on)")),
        RemoteError::Connection(m) => ExecutorError::Unavailable(m),
        RemoteError::Canceled => ExecutorError::Canceled,
        RemoteError::TooLarge(limit) => ExecutorError::Other(format!("transfer larger than {limit} bytes")),
        RemoteError::Other(m) => ExecutorError::Other(m),
    }
}

impl Environment for ShellEnvironment {
    fn run(&self, stage: StageScript) -> Result<ExitStatus, ExecutorError> {
        let cwd = working_dir(&stage.name, &self.project_dir, &self.builds_dir);
        let files = self.stages.next(&stage.name, remote_error)?;
        if !files.started {
            let shell = shell_command(&self.shell, self.login);
            let command = match &self.user {
                // As gitlab-runner: `su -s /bin/<shell> <user> -c '<shell> -l'`.
                Some(user) => format!(
                    "cd {} && exec su -s {} {} -c {}",
                    quote(cwd),
                    quote(&format!("/bin/{}", self.shell)),
                    quote(user),
                    quote(&shell)
                ),
                None => format!("cd {} && exec {shell}", quote(cwd)),
            };
            self.unfinished.set(self.unfinished.get() + 1);
            remote::start_detached(&command, Some(stage.script.as_bytes()), &files.log, &files.exit)
                .map_err(remote_error)?;
            let status = remote::attach(&files.log, &files.exit, 0).map_err(remote_error)?;
            // Followed to its exit code: nothing of it is left to stop.
            self.unfinished.set(self.unfinished.get() - 1);
            return Ok(ExitStatus { code: status.code });
        }
        let status = remote::attach(&files.log, &files.exit, 0).map_err(remote_error)?;
        Ok(ExitStatus { code: status.code })
    }

    fn cleanup(&self) {
        if !self.stages.resumed() && self.unfinished.get() == 0 {
            // Every stage ended: only the files are left, removed by the host, no process.
            let _ = files::remove_all(self.stages.dir());
            return;
        }
        self.stages.stop_and_remove();
    }

    fn state(&self) -> Option<String> {
        serde_json::to_string(self).ok()
    }
}

runway_sdk::export_executor!(Shell, name: "shell", description: "runs job scripts with bash on the runner's machine");
