//! Stages in long-lived containers of a Docker engine (API 0.7; needs the `allow_docker` grant
//! for the engine): a probe captured, a stage started detached from the exec stream, its log
//! followed into the job log until it ends ([`attach`]); a restarted runner attaches again.

use crate::bindings::executor::runway::host0_7_0::docker_stages as wit;
use crate::docker::{DockerError, Engine};
pub use crate::process::{ExitStatus, Output};

/// Run `script` with `sh -c` in the running `container`, its output captured (at most
/// `max_bytes`). For probes, never for job scripts.
pub fn run_captured(
    engine: &Engine,
    container: &str,
    script: &str,
    stdin: Option<&[u8]>,
    max_bytes: u32,
) -> Result<Output, DockerError> {
    wit::run_captured(engine.wit(), container, script, stdin, max_bytes)
}

/// Start `command` detached in the running `container`: output to `log_path`, exit code to
/// `exit_path` (both in the container), `stdin` on its standard input.
pub fn start_detached(
    engine: &Engine,
    container: &str,
    command: &str,
    stdin: &[u8],
    log_path: &str,
    exit_path: &str,
) -> Result<(), DockerError> {
    wit::start_detached(engine.wit(), container, command, stdin, log_path, exit_path)
}

/// Follow a detached command into the job log from `offset` until it ends; its status.
pub fn attach(
    engine: &Engine,
    container: &str,
    log_path: &str,
    exit_path: &str,
    offset: u64,
) -> Result<ExitStatus, DockerError> {
    wit::attach(engine.wit(), container, log_path, exit_path, offset)
}
