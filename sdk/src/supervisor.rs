//! Local processes under a deadline, stopped with SIGTERM then SIGKILL (needs the
//! `allow_process` grant): for drivers the administrator configured, such as the custom
//! executor's `*_exec` programs. Output streams into the job log on the host side unless
//! standard output is captured.

use crate::bindings::executor::runway::host0_3_0::supervisor as wit;
pub use crate::bindings::executor::runway::host0_3_0::supervisor::{ExitStatus, Limits, Outcome, ProcessError};

/// A supervised command, in the spirit of `std::process::Command`.
#[derive(Debug, Clone)]
pub struct Supervised {
    command: wit::Command,
    limits: Limits,
}

impl Supervised {
    /// A command running `program` with only the runner's pass-through environment, no
    /// deadline of its own, stopped with SIGTERM then SIGKILL `graceful_kill_seconds` later,
    /// and given up `force_kill_seconds` after that.
    pub fn new(program: impl Into<String>, graceful_kill_seconds: u32, force_kill_seconds: u32) -> Self {
        Supervised {
            command: wit::Command {
                program: program.into(),
                args: Vec::new(),
                env: Vec::new(),
                cwd: None,
                stdin: None,
            },
            limits: Limits { timeout_seconds: None, graceful_kill_seconds, force_kill_seconds, capture_stdout: None },
        }
    }
    /// Add arguments.
    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.command.args.extend(args.into_iter().map(Into::into));
        self
    }
    /// Set environment variables (later ones win).
    pub fn envs<I: IntoIterator<Item = (K, V)>, K: Into<String>, V: Into<String>>(mut self, vars: I) -> Self {
        self.command.env.extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }
    /// Set the working directory.
    pub fn current_dir(mut self, dir: impl Into<String>) -> Self {
        self.command.cwd = Some(dir.into());
        self
    }
    /// Stop the command after `seconds` (the run fails with [`ProcessError::TimedOut`]).
    pub fn timeout(mut self, seconds: u32) -> Self {
        self.limits.timeout_seconds = Some(seconds);
        self
    }
    /// Capture at most `max_bytes` of standard output instead of streaming it.
    pub fn capture_stdout(mut self, max_bytes: u32) -> Self {
        self.limits.capture_stdout = Some(max_bytes);
        self
    }
    /// Run to completion.
    pub fn run(&self) -> Result<Outcome, ProcessError> {
        wit::run(&self.command, self.limits)
    }
}
