//! Checks run on a fleet instance over SSH: the health probe (`exit 0` on a fresh
//! connection), the autoscaler's `instance_ready_command`, and the login user's `$HOME`.
//!
//! Each takes a [`ConnectSpec`] (see [`super::spec`]) and owns its connection: connect, run,
//! close. What a failure means for the fleet (retry, replace the instance) is the caller's.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::ssh::{ConnectError, ConnectSpec, SshSession};
use crate::stop::StopSignal;

/// Why a check on an instance failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// No SSH connection could be made.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The command ran and exited non-zero.
    #[error("{what} exited with {code}")]
    Exit {
        /// Which check (`probe`, `instance_ready_command`).
        what: &'static str,
        /// Its exit code.
        code: i32,
    },
    /// The command could not run to completion (connection lost, timed out).
    #[error("{what}: {message}")]
    Run {
        /// Which check.
        what: &'static str,
        /// What went wrong.
        message: String,
    },
}

/// `exit 0` over a fresh connection, bounded by the spec's timeout.
pub async fn probe(spec: &ConnectSpec) -> Result<(), ProbeError> {
    run_check(spec, "probe", "exit 0", spec.timeout).await
}

/// `instance_ready_command` over a fresh connection, bounded by `timeout`: `Ok` when it
/// exits 0.
pub async fn ready_command(spec: &ConnectSpec, command: &str, timeout: Duration) -> Result<(), ProbeError> {
    run_check(spec, "instance_ready_command", command, timeout).await
}

async fn run_check(spec: &ConnectSpec, what: &'static str, command: &str, timeout: Duration) -> Result<(), ProbeError> {
    let session = SshSession::connect(spec).await?;
    let result = session.probe(command, timeout).await;
    session.close().await;
    match result {
        Ok(0) => Ok(()),
        Ok(code) => Err(ProbeError::Exit { what, code }),
        Err(e) => Err(ProbeError::Run { what, message: format!("{e:?}") }),
    }
}

/// `$HOME` of the login user on the instance, when it answers an absolute path within
/// `timeout`.
pub async fn remote_home(session: &SshSession, timeout: Duration) -> Option<String> {
    let output = Arc::new(Mutex::new(Vec::new()));
    let sink = {
        let output = output.clone();
        move |bytes: &[u8]| {
            if let Ok(mut o) = output.lock() {
                o.extend_from_slice(bytes);
            }
        }
    };
    let stop = StopSignal::new();
    let run = session.exec("printf %s \"$HOME\"", None, &sink, &stop);
    match tokio::time::timeout(timeout, run).await {
        Ok(Ok(0)) => {
            let text = output.lock().ok().map(|o| String::from_utf8_lossy(&o).trim().to_string())?;
            Some(text).filter(|h| h.starts_with('/'))
        }
        _ => None,
    }
}
