//! The runner's own machine as a [`RemoteSession`]: what a plugin with the `allow_process`
//! grant gets from `runway:host/remote` when its job has no fleet instance.
//!
//! Commands are `sh -c` in the runner's working directory with nothing of the runner's
//! environment but [`super::process::PASSTHROUGH`], leading their own process group, output
//! streamed into the trace, the group killed on stop ([`super::process`]). Detached commands
//! are [`super::detached`]'s: under `setsid`, in their own session and not a child of the
//! runner, with no parent-death signal, so they outlive the runner; a follower ends when the
//! runner is gone. Files are written atomically (a temporary file in the same directory,
//! renamed over the target) and read with the caller's size cap.
//!
//! Owns: [`LocalSession`]. Must not touch: WIT types, plugins, grants (the capability decides
//! who gets a local session).

use std::io::{Read, Write};
use std::path::Path;

use async_trait::async_trait;

use crate::connector::detached::{self, OutputFn, ShellHost};
use crate::connector::process::{run_streaming, LocalCommand, ProcessFailure};
use crate::connector::remote::{ExitStatus, RemoteError, RemoteSession};
use crate::stop::StopSignal;
use crate::trace::TraceSink;

/// The runner's own machine. Holds nothing: every operation starts its own process.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalSession;

impl LocalSession {
    /// The runner's machine.
    pub fn new() -> Self {
        LocalSession
    }
}

fn remote_error(failure: ProcessFailure) -> RemoteError {
    match failure {
        ProcessFailure::Canceled | ProcessFailure::TimedOut => RemoteError::Canceled,
        ProcessFailure::SpawnFailed(m) | ProcessFailure::Other(m) => RemoteError::Other(m),
    }
}

fn io_error(what: &str, path: &str, e: std::io::Error) -> RemoteError {
    RemoteError::Other(format!("{what} {path}: {e}"))
}

fn write_file(path: &str, data: &[u8], mode: u32) -> Result<(), RemoteError> {
    use std::os::unix::fs::PermissionsExt;
    let target = Path::new(path);
    let dir = target.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| io_error("creating the directory of", path, e))?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| io_error("creating a file next to", path, e))?;
    tmp.write_all(data).map_err(|e| io_error("writing", path, e))?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode & 0o7777))
        .map_err(|e| io_error("setting the mode of", path, e))?;
    tmp.persist(target).map_err(|e| io_error("writing", path, e.error))?;
    Ok(())
}

fn read_file(path: &str, max_bytes: usize) -> Result<Vec<u8>, RemoteError> {
    let file = std::fs::File::open(path).map_err(|e| io_error("reading", path, e))?;
    let mut data = Vec::new();
    let cap = u64::try_from(max_bytes).unwrap_or(u64::MAX).saturating_add(1);
    file.take(cap).read_to_end(&mut data).map_err(|e| io_error("reading", path, e))?;
    if data.len() > max_bytes {
        return Err(RemoteError::TooLarge(u32::try_from(max_bytes).unwrap_or(u32::MAX)));
    }
    Ok(data)
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, RemoteError> + Send + 'static,
) -> Result<T, RemoteError> {
    tokio::task::spawn_blocking(work).await.map_err(|e| RemoteError::Other(format!("file operation failed: {e}")))?
}

#[async_trait]
impl ShellHost for LocalSession {
    async fn shell(
        &self,
        script: &str,
        stdin: Option<&[u8]>,
        output: &OutputFn<'_>,
        stop: &StopSignal,
    ) -> Result<i32, RemoteError> {
        let status = run_streaming(&LocalCommand::shell(script, stdin), output, stop).await.map_err(remote_error)?;
        Ok(status.code)
    }
}

#[async_trait]
impl RemoteSession for LocalSession {
    async fn run(
        &self,
        command: &str,
        stdin: Option<&[u8]>,
        trace: &dyn TraceSink,
        stop: &StopSignal,
    ) -> Result<ExitStatus, RemoteError> {
        let output = |bytes: &[u8]| trace.write(bytes);
        run_streaming(&LocalCommand::shell(command, stdin), &output, stop).await.map_err(remote_error)
    }

    async fn start_detached(
        &self,
        command: &str,
        stdin: Option<&[u8]>,
        log_path: &str,
        exit_path: &str,
    ) -> Result<(), RemoteError> {
        detached::start(self, command, stdin, log_path, exit_path).await
    }

    async fn attach(
        &self,
        log_path: &str,
        exit_path: &str,
        offset: u64,
        trace: &dyn TraceSink,
        stop: &StopSignal,
    ) -> Result<ExitStatus, RemoteError> {
        detached::attach(self, log_path, exit_path, offset, trace, stop).await
    }

    async fn upload(&self, path: &str, data: &[u8], mode: u32) -> Result<(), RemoteError> {
        let (path, data) = (path.to_string(), data.to_vec());
        blocking(move || write_file(&path, &data, mode)).await
    }

    async fn download(&self, path: &str, max_bytes: usize) -> Result<Vec<u8>, RemoteError> {
        let path = path.to_string();
        blocking(move || read_file(&path, max_bytes)).await
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::trace::MemorySink;

    #[tokio::test]
    async fn commands_stream_output_and_files_round_trip() {
        let session = LocalSession::new();
        let trace = MemorySink::default();
        let stop = StopSignal::new();
        let status = session.run("echo one; echo two >&2; cat; exit 7", Some(b"three\n"), &trace, &stop).await;
        assert_eq!(status.expect("run").code, 7);
        assert_eq!(trace.text(), "one\ntwo\nthree\n");

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub dir/it's.bin").display().to_string();
        let data: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
        session.upload(&path, &data, 0o750).await.expect("upload");
        assert_eq!(std::fs::metadata(&path).expect("written").permissions().mode() & 0o777, 0o750);
        assert_eq!(session.download(&path, 1 << 20).await.expect("download"), data);
        assert!(matches!(session.download(&path, 1000).await, Err(RemoteError::TooLarge(1000))));
        assert!(matches!(session.download("/nonexistent/file", 10).await, Err(RemoteError::Other(_))));
        let leftovers = std::fs::read_dir(dir.path().join("sub dir")).expect("dir").count();
        assert_eq!(leftovers, 1, "no temporary file is left behind");
    }

    #[tokio::test]
    async fn only_the_passthrough_environment_reaches_commands() {
        std::env::set_var("RUNWAY_LOCAL_SESSION_SECRET", "leak");
        let trace = MemorySink::default();
        LocalSession::new().run("env", None, &trace, &StopSignal::new()).await.expect("run");
        let names: Vec<String> =
            trace.text().lines().filter_map(|l| l.split_once('=')).map(|(k, _)| k.to_string()).collect();
        assert!(!names.iter().any(|k| k == "RUNWAY_LOCAL_SESSION_SECRET"), "{names:?}");
        for name in &names {
            // `sh` itself sets PWD (and some shells OLDPWD, SHLVL, `_`).
            assert!(
                crate::connector::process::PASSTHROUGH.contains(&name.as_str())
                    || ["PWD", "OLDPWD", "SHLVL", "_"].contains(&name.as_str()),
                "{name} leaked into a local command"
            );
        }
    }
}
