//! The one host of an `ssh` executor runner (`[runners.ssh]`), as the job path's
//! [`InstanceSource`]: each job connects to it through the SSH connector — host key checked
//! against `known_hosts` unless disabled, as gitlab-runner does — and runs there exactly as a
//! fleet job runs on its instance (relative directories are the login user's).
//!
//! Owns: [`SshHost`], [`SshHostError`]. Must not touch: fleets, plugins, how stages run.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::config::ssh::SshConfig;
use crate::connector::{probe, ConnectError, ConnectSpec, SshAuth, SshSession};
use crate::executor::{ConnectedInstance, InstanceError, InstanceSource};
use crate::trace::{TraceLog, TraceSink};

/// Connection attempts per job (gitlab-runner's `ConnectRetries` default) and the pause
/// between them.
const CONNECT_ATTEMPTS: u32 = 3;
const CONNECT_RETRY: Duration = Duration::from_secs(3);
/// Bound on one connection attempt and on the `$HOME` probe.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a runner's `[runners.ssh]` names no usable host.
#[derive(Debug, thiserror::Error)]
pub enum SshHostError {
    /// `identity_file` cannot be read.
    #[error("[runners.ssh] identity_file {}: {source}", .path.display())]
    IdentityFile {
        /// The file as configured.
        path: std::path::PathBuf,
        /// Why it cannot be read.
        source: std::io::Error,
    },
    /// A key of the section is wrong (the config's own words).
    #[error("{0}")]
    Config(#[from] crate::config::Invalid),
}

/// The configured host of an `ssh` executor runner.
pub struct SshHost {
    spec: ConnectSpec,
}

impl SshHost {
    /// The host `config` names; `Err` says which key is wrong (an unreadable identity file).
    pub fn new(config: &SshConfig) -> Result<Self, SshHostError> {
        let auth = match config.identity_file() {
            Some(path) => SshAuth::Key {
                pem: std::fs::read(path)
                    .map_err(|source| SshHostError::IdentityFile { path: path.to_path_buf(), source })?,
                passphrase: None,
            },
            None => SshAuth::Password(config.password().to_string()),
        };
        let spec = ConnectSpec {
            host: config.host().to_string(),
            port: config.port().map_err(SshHostError::Config)?,
            username: config.user().to_string(),
            auth,
            keepalive: Some(Duration::from_secs(30)),
            timeout: CONNECT_TIMEOUT,
            host_key: None,
            known_hosts: config.known_hosts(),
        };
        Ok(SshHost { spec })
    }

    /// `user@host:port`.
    fn target(&self) -> String {
        format!("{}@{}:{}", self.spec.username, self.spec.host, self.spec.port)
    }
}

/// Is a failed connection worth another attempt (the network), or final (keys, credentials)?
fn retryable(error: &ConnectError) -> bool {
    matches!(error, ConnectError::Connect { .. } | ConnectError::Timeout { .. })
}

#[async_trait]
impl InstanceSource for SshHost {
    async fn connect(
        &self,
        _key: &str,
        trace: &dyn TraceSink,
        abort: &CancellationToken,
    ) -> Result<ConnectedInstance, InstanceError> {
        let target = self.target();
        trace.println(&format!("Connecting to {target} over SSH..."));
        let mut attempt = 1;
        let session = loop {
            let result = tokio::select! {
                result = SshSession::connect(&self.spec) => result,
                _ = abort.cancelled() => return Err(InstanceError::AbortedConnecting),
            };
            match result {
                Ok(session) => break session,
                Err(e) if retryable(&e) && attempt < CONNECT_ATTEMPTS => {
                    trace.warning(&format!("{e}; trying again in {} s", CONNECT_RETRY.as_secs()));
                    attempt += 1;
                    tokio::select! {
                        _ = tokio::time::sleep(CONNECT_RETRY) => {}
                        _ = abort.cancelled() => return Err(InstanceError::AbortedConnecting),
                    }
                }
                Err(e) => return Err(InstanceError::Connect { instance: target, message: e.to_string() }),
            }
        };
        let home = probe::remote_home(&session, CONNECT_TIMEOUT).await;
        trace.println(&format!("Connected to {target}"));
        Ok(ConnectedInstance { id: self.spec.host.clone(), remote: Arc::new(session), home, reconnect: None })
    }
}
