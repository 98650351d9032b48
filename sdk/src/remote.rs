//! The instance acquired for the current job, reached over the host's SSH connector.

pub use crate::bindings::executor::runway::host::process::ExitStatus;
use crate::bindings::executor::runway::host::remote as wit;
pub use crate::bindings::executor::runway::host::remote::RemoteError;

/// Run a shell command on the instance, streaming its output into the job log.
pub fn run(command: &str, stdin: Option<&[u8]>) -> Result<ExitStatus, RemoteError> {
    wit::run(&wit::RemoteCommand { command: command.to_string(), stdin: stdin.map(<[u8]>::to_vec) })
}
/// Start a command detached from the connection, logging to `log_path` and writing its
/// exit code to `exit_path`.
pub fn start_detached(command: &str, stdin: Option<&[u8]>, log_path: &str, exit_path: &str) -> Result<(), RemoteError> {
    let cmd = wit::RemoteCommand { command: command.to_string(), stdin: stdin.map(<[u8]>::to_vec) };
    wit::start_detached(&cmd, log_path, exit_path)
}
/// Follow a detached command's log from `offset` until it exits.
pub fn attach(log_path: &str, exit_path: &str, offset: u64) -> Result<ExitStatus, RemoteError> {
    wit::attach(log_path, exit_path, offset)
}
/// Write a file on the instance.
pub fn upload(path: &str, data: &[u8], mode: u32) -> Result<(), RemoteError> {
    wit::upload(path, data, mode)
}
/// Read a file from the instance.
pub fn download(path: &str, max_bytes: u32) -> Result<Vec<u8>, RemoteError> {
    wit::download(path, max_bytes)
}
