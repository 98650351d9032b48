//! Local processes (needs the `allow_process` grant). Output of [`Command::run`] streams
//! straight into the job log on the host side.

use crate::bindings::executor::runway::host0_1_0::process as wit;
pub use crate::bindings::executor::runway::host0_1_0::process::{ExitStatus, Output, ProcessError};

/// A command builder, in the spirit of `std::process::Command`.
#[derive(Debug, Clone)]
pub struct Command {
    inner: wit::Command,
}

impl Command {
    /// A command running `program` with an empty environment.
    pub fn new(program: impl Into<String>) -> Self {
        Command {
            inner: wit::Command { program: program.into(), args: Vec::new(), env: Vec::new(), cwd: None, stdin: None },
        }
    }
    /// Add one argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.inner.args.push(arg.into());
        self
    }
    /// Add arguments.
    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.inner.args.extend(args.into_iter().map(Into::into));
        self
    }
    /// Set an environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.inner.env.push((key.into(), value.into()));
        self
    }
    /// Set the working directory.
    pub fn current_dir(mut self, dir: impl Into<String>) -> Self {
        self.inner.cwd = Some(dir.into());
        self
    }
    /// Bytes for standard input.
    pub fn stdin(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.inner.stdin = Some(data.into());
        self
    }
    /// Run to completion, streaming output into the job log.
    pub fn run(&self) -> Result<ExitStatus, ProcessError> {
        wit::run(&self.inner)
    }
    /// Run to completion and capture output (each stream at most `max_bytes`).
    pub fn output(&self, max_bytes: u32) -> Result<Output, ProcessError> {
        wit::run_captured(&self.inner, max_bytes)
    }
}
