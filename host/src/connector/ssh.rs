//! The SSH connector: one authenticated russh client connection to an instance, and the
//! remote operations jobs need on it.
//!
//! Every operation is an `exec` channel on the connection. Detached commands are
//! [`super::detached`]'s (the same snippets as on the runner's own machine), run through
//! [`ShellHost`] on this connection: they survive the connection and can be followed again
//! from any byte offset ([`RemoteSession::attach`]).
//! Host keys: fleeting providers do not publish host keys (GitLab's connector ignores them
//! as well), so the first key seen is accepted, reported by [`SshSession::host_key`], and
//! can be pinned for later connections through [`ConnectSpec::host_key`]. A configured host
//! (the `ssh` executor) is checked against a `known_hosts` file instead
//! ([`ConnectSpec::known_hosts`]), strictly, as gitlab-runner does: a missing file, an
//! unknown host or a different key fails the connection.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use runway_shell_quote::quote;
use russh::client;
use russh::keys::{HashAlg, PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use russh::ChannelMsg;

use crate::connector::detached::{self, OutputFn, ShellHost};
use crate::connector::remote::{ExitStatus, RemoteError, RemoteSession, SocketStream};
use crate::stop::StopSignal;
use crate::trace::TraceSink;

/// Where and how to connect.
#[derive(Clone, Debug)]
pub struct ConnectSpec {
    /// Host name or address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Login user.
    pub username: String,
    /// Credentials.
    pub auth: SshAuth,
    /// Keepalive interval; three unanswered keepalives drop the connection.
    pub keepalive: Option<Duration>,
    /// Bound on connecting and authenticating.
    pub timeout: Duration,
    /// Expected host key fingerprint (`SHA256:…`); `None` accepts the first key seen.
    pub host_key: Option<String>,
    /// Check the host key against this `known_hosts` file (OpenSSH format, hashed names too;
    /// `[host]:port` for ports other than 22): the host must be listed with this very key.
    pub known_hosts: Option<std::path::PathBuf>,
}

/// Credentials.
#[derive(Clone)]
pub enum SshAuth {
    /// An OpenSSH or PEM private key.
    Key {
        /// The key file's contents.
        pem: Vec<u8>,
        /// Its passphrase, when encrypted.
        passphrase: Option<String>,
    },
    /// Password authentication.
    Password(String),
}

impl std::fmt::Debug for SshAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SshAuth::Key { .. } => f.write_str("Key(…)"),
            SshAuth::Password(_) => f.write_str("Password(…)"),
        }
    }
}

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// TCP or SSH handshake failure.
    #[error("ssh {target}: {message}")]
    Connect {
        /// `user@host:port`.
        target: String,
        /// What failed.
        message: String,
    },
    /// The server refused the credentials.
    #[error("ssh {target}: authentication as {user} failed")]
    Auth {
        /// `user@host:port`.
        target: String,
        /// The login user.
        user: String,
    },
    /// The private key could not be read.
    #[error("ssh {target}: unreadable private key: {message}")]
    Key {
        /// `user@host:port`.
        target: String,
        /// Why the key is unusable.
        message: String,
    },
    /// Connecting took longer than the timeout.
    #[error("ssh {target}: no connection within {0:?}", .timeout)]
    Timeout {
        /// `user@host:port`.
        target: String,
        /// The limit that passed.
        timeout: Duration,
    },
    /// The server's host key is not the one its `known_hosts` file lists, or the host is not
    /// listed, or the file cannot be read.
    #[error("ssh {target}: host key verification failed: {message}")]
    KnownHosts {
        /// `user@host:port`.
        target: String,
        /// What did not match, naming the file (and line).
        message: String,
    },
    /// The server's host key is not the pinned one.
    #[error("ssh {target}: host key {seen} does not match the expected {expected}")]
    HostKey {
        /// `user@host:port`.
        target: String,
        /// The fingerprint the server showed.
        seen: String,
        /// The pinned fingerprint.
        expected: String,
    },
}

struct Client {
    expected: Option<String>,
    /// `known_hosts` file, host and port to check the key against.
    known_hosts: Option<(std::path::PathBuf, String, u16)>,
    seen: Arc<Mutex<Option<String>>>,
    /// Why the `known_hosts` check refused the key.
    refused: Arc<Mutex<Option<String>>>,
}

impl Client {
    /// Is `public` the key `known_hosts` lists for the host? Records why not.
    fn known(&self, public: &russh::keys::PublicKey, fingerprint: &str) -> bool {
        let Some((path, host, port)) = &self.known_hosts else { return true };
        let name = if *port == 22 { host.clone() } else { format!("[{host}]:{port}") };
        let verdict = match russh::keys::check_known_hosts_path(host, *port, public, path) {
            Ok(true) => return true,
            Ok(false) => format!("{name} is not in {} with its key {fingerprint} (key is unknown)", path.display()),
            Err(russh::keys::Error::KeyChanged { line }) => format!(
                "the key of {name} ({fingerprint}) does not match the one in {}:{line} (key mismatch)",
                path.display()
            ),
            Err(e) => format!("reading {}: {e}", path.display()),
        };
        if let Ok(mut refused) = self.refused.lock() {
            *refused = Some(verdict);
        }
        false
    }
}

impl client::Handler for Client {
    type Error = russh::Error;

    async fn check_server_key(&mut self, key: &PublicKeyOrCertificate) -> Result<bool, Self::Error> {
        let public = match key {
            PublicKeyOrCertificate::PublicKey { key, .. } => key.clone(),
            PublicKeyOrCertificate::Certificate(cert) => cert.public_key().clone().into(),
        };
        let fingerprint = public.fingerprint(HashAlg::Sha256).to_string();
        if let Ok(mut seen) = self.seen.lock() {
            *seen = Some(fingerprint.clone());
        }
        Ok(self.expected.as_ref().is_none_or(|e| *e == fingerprint) && self.known(&public, &fingerprint))
    }
}

/// An authenticated connection to one instance.
pub struct SshSession {
    handle: client::Handle<Client>,
    target: String,
    host_key: String,
}

fn connection(e: impl std::fmt::Display) -> RemoteError {
    RemoteError::Connection(e.to_string())
}

impl SshSession {
    /// Connect and authenticate, within `spec.timeout`.
    pub async fn connect(spec: &ConnectSpec) -> Result<SshSession, ConnectError> {
        let target = format!("{}@{}:{}", spec.username, spec.host, spec.port);
        match tokio::time::timeout(spec.timeout, Self::connect_inner(spec, &target)).await {
            Ok(result) => result,
            Err(_) => Err(ConnectError::Timeout { target, timeout: spec.timeout }),
        }
    }

    async fn connect_inner(spec: &ConnectSpec, target: &str) -> Result<SshSession, ConnectError> {
        let config = client::Config {
            keepalive_interval: spec.keepalive,
            keepalive_max: 3,
            inactivity_timeout: None,
            ..client::Config::default()
        };
        if let Some(path) = &spec.known_hosts {
            // As gitlab-runner (Go's knownhosts.New): no file, no connection.
            if let Err(e) = std::fs::metadata(path) {
                let message = format!("known_hosts file {}: {e}", path.display());
                return Err(ConnectError::KnownHosts { target: target.to_string(), message });
            }
        }
        let seen = Arc::new(Mutex::new(None));
        let refused = Arc::new(Mutex::new(None));
        let handler = Client {
            expected: spec.host_key.clone(),
            known_hosts: spec.known_hosts.clone().map(|p| (p, spec.host.clone(), spec.port)),
            seen: seen.clone(),
            refused: refused.clone(),
        };
        let connected = client::connect(Arc::new(config), (spec.host.as_str(), spec.port), handler).await;
        let seen_key = || seen.lock().ok().and_then(|s| s.clone()).unwrap_or_default();
        let mut handle = match connected {
            Ok(handle) => handle,
            Err(russh::Error::UnknownKey) if refused.lock().ok().is_some_and(|r| r.is_some()) => {
                let message = refused.lock().ok().and_then(|mut r| r.take()).unwrap_or_default();
                return Err(ConnectError::KnownHosts { target: target.to_string(), message });
            }
            Err(russh::Error::UnknownKey) => {
                return Err(ConnectError::HostKey {
                    target: target.to_string(),
                    seen: seen_key(),
                    expected: spec.host_key.clone().unwrap_or_default(),
                })
            }
            Err(e) => return Err(ConnectError::Connect { target: target.to_string(), message: e.to_string() }),
        };
        let authenticated = match &spec.auth {
            SshAuth::Key { pem, passphrase } => {
                let text = String::from_utf8_lossy(pem);
                let key = russh::keys::decode_secret_key(&text, passphrase.as_deref())
                    .map_err(|e| ConnectError::Key { target: target.to_string(), message: e.to_string() })?;
                let hash = if key.algorithm().is_rsa() {
                    handle.best_supported_rsa_hash().await.ok().flatten().flatten()
                } else {
                    None
                };
                handle.authenticate_publickey(&spec.username, PrivateKeyWithHashAlg::new(Arc::new(key), hash)).await
            }
            SshAuth::Password(password) => handle.authenticate_password(&spec.username, password).await,
        };
        match authenticated {
            Ok(result) if result.success() => {}
            Ok(_) => return Err(ConnectError::Auth { target: target.to_string(), user: spec.username.clone() }),
            Err(e) => return Err(ConnectError::Connect { target: target.to_string(), message: e.to_string() }),
        }
        Ok(SshSession { handle, target: target.to_string(), host_key: seen_key() })
    }

    /// `user@host:port`.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The server's host key fingerprint (`SHA256:…`), to pin for later connections.
    pub fn host_key(&self) -> &str {
        &self.host_key
    }

    /// Has the connection dropped?
    pub fn is_closed(&self) -> bool {
        self.handle.is_closed()
    }

    /// Say goodbye.
    pub async fn close(&self) {
        let _ = self.handle.disconnect(russh::Disconnect::ByApplication, "", "en").await;
    }

    /// Run `command`; output (stdout and stderr, in arrival order) goes to `output`. Returns
    /// the exit code (`128 + n` for a signal). When `stop` fires the channel is closed and
    /// the result is `Canceled`.
    pub async fn exec(
        &self,
        command: &str,
        stdin: Option<&[u8]>,
        output: &OutputFn<'_>,
        stop: &StopSignal,
    ) -> Result<i32, RemoteError> {
        let mut channel =
            self.handle.channel_open_session().await.map_err(|e| connection(format!("{}: {e}", self.target)))?;
        channel.exec(true, command).await.map_err(connection)?;
        if let Some(data) = stdin {
            channel.data(data).await.map_err(connection)?;
        }
        channel.eof().await.map_err(connection)?;
        let mut code = None;
        loop {
            tokio::select! {
                message = channel.wait() => match message {
                    Some(ChannelMsg::Data { data }) | Some(ChannelMsg::ExtendedData { data, .. }) => output(&data),
                    Some(ChannelMsg::ExitStatus { exit_status }) => code = Some(i32::try_from(exit_status).unwrap_or(i32::MAX)),
                    Some(ChannelMsg::ExitSignal { signal_name, .. }) => code = Some(128 + signal_number(&signal_name)),
                    Some(_) => {}
                    None => break,
                },
                _ = stop.stopped() => {
                    let _ = channel.close().await;
                    return Err(RemoteError::Canceled);
                }
            }
        }
        code.ok_or_else(|| connection(format!("{}: the connection closed before the command exited", self.target)))
    }

    /// Run `command` without input or captured output, bounded by `timeout`.
    pub async fn probe(&self, command: &str, timeout: Duration) -> Result<i32, RemoteError> {
        let stop = StopSignal::new();
        match tokio::time::timeout(timeout, self.exec(command, None, &|_| {}, &stop)).await {
            Ok(result) => result,
            Err(_) => {
                stop.stop(crate::stop::StopReason::TimedOut);
                Err(RemoteError::Other(format!("{command:?} did not finish within {timeout:?}")))
            }
        }
    }
}

fn signal_number(signal: &russh::Sig) -> i32 {
    use russh::Sig;
    match signal {
        Sig::HUP => 1,
        Sig::INT => 2,
        Sig::QUIT => 3,
        Sig::ILL => 4,
        Sig::ABRT => 6,
        Sig::FPE => 8,
        Sig::KILL => 9,
        Sig::USR1 => 10,
        Sig::SEGV => 11,
        Sig::PIPE => 13,
        Sig::ALRM => 14,
        Sig::TERM => 15,
        _ => 1,
    }
}

/// An exit status from a shell-style code (`128 + n` means signal `n`).
fn status(code: i32) -> ExitStatus {
    ExitStatus::from_code(code)
}

fn other(what: &str, code: i32, output: &[u8]) -> RemoteError {
    RemoteError::Other(format!("{what} failed (exit code {code}): {}", String::from_utf8_lossy(output).trim()))
}

#[async_trait]
impl RemoteSession for SshSession {
    async fn run(
        &self,
        command: &str,
        stdin: Option<&[u8]>,
        trace: &dyn TraceSink,
        stop: &StopSignal,
    ) -> Result<ExitStatus, RemoteError> {
        // One stream, so stdout and stderr keep their order in the job log.
        let command = format!("exec 2>&1\n{command}");
        let code = self.exec(&command, stdin, &|bytes| trace.write_output(bytes), stop).await?;
        Ok(status(code))
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
        let target = quote(path);
        let script = format!(
            "d=$(dirname -- {target}) && mkdir -p \"$d\" && t={target}.runway-tmp.$$ && cat > \"$t\" && chmod {mode:o} \"$t\" && mv -f \"$t\" {target}"
        );
        let (code, output) = self.capture(&script, Some(data), 4096).await?;
        if code != 0 {
            return Err(other(&format!("writing {path}"), code, &output));
        }
        Ok(())
    }

    async fn make_dir(&self, path: &str, mode: u32, parents: bool) -> Result<(), RemoteError> {
        let script = format!("mkdir {}-m {mode:o} -- {}", if parents { "-p " } else { "" }, quote(path));
        let (code, output) = self.capture(&script, None, 4096).await?;
        if code != 0 {
            return Err(other(&format!("creating the directory {path}"), code, &output));
        }
        Ok(())
    }

    async fn remove_all(&self, path: &str) -> Result<(), RemoteError> {
        let (code, output) = self.capture(&format!("rm -rf -- {}", quote(path)), None, 4096).await?;
        if code != 0 {
            return Err(other(&format!("removing {path}"), code, &output));
        }
        Ok(())
    }

    async fn download(&self, path: &str, max_bytes: usize) -> Result<Vec<u8>, RemoteError> {
        let script = format!("cat -- {} | head -c {}", quote(path), max_bytes + 1);
        let script =
            format!("[ -r {p} ] || {{ echo 'no such readable file' >&2; exit 1; }}; {script}", p = quote(path));
        let (code, data) = self.capture(&script, None, max_bytes).await?;
        if code != 0 {
            return Err(other(&format!("reading {path}"), code, &data));
        }
        if data.len() > max_bytes {
            return Err(RemoteError::TooLarge(u32::try_from(max_bytes).unwrap_or(u32::MAX)));
        }
        Ok(data)
    }

    async fn connect_unix(&self, path: &str) -> Result<Box<dyn SocketStream>, RemoteError> {
        let channel = self
            .handle
            .channel_open_direct_streamlocal(path)
            .await
            .map_err(|e| RemoteError::Connection(format!("{}: forwarding to {path}: {e}", self.target)))?;
        Ok(Box::new(channel.into_stream()))
    }
}

/// Scripts run by the login shell of the instance user (which must be POSIX), in one `exec`
/// channel each.
#[async_trait]
impl ShellHost for SshSession {
    async fn shell(
        &self,
        script: &str,
        stdin: Option<&[u8]>,
        output: &OutputFn<'_>,
        stop: &StopSignal,
    ) -> Result<i32, RemoteError> {
        self.exec(script, stdin, output, stop).await
    }
}
