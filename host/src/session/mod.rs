//! The session server behind GitLab's interactive web terminal (`[session_server]`), as
//! gitlab-runner's `session/`: one HTTPS server with a certificate the runner makes for its
//! advertised host ([`tls`]), one [`JobSession`] per job with a random id and authorization
//! token, and `/session/<id>/terminal` (and gitlab-runner's `/session/<id>/exec`) as a
//! WebSocket speaking GitLab's `terminal.gitlab.com` / `base64.terminal.gitlab.com`
//! subprotocols ([`server`]). What a terminal attaches to is a [`TerminalTarget`] the job's
//! executor side hands in; [`pty`] is the one for a shell on this machine.
//!
//! Owns: the server, the sessions' registry, the terminal byte pump, the local pty. Must not
//! touch: GitLab's API (the manager sends [`SessionInfo`] with the job request), jobs, plugins.

pub mod pty;
pub mod server;
pub mod tls;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use server::{SessionServer, SessionServerStartError};

/// What the job request carries about a job's session (gitlab-runner's `SessionInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// `https://<advertise>/session/<id>`.
    pub url: String,
    /// The server's certificate (PEM) GitLab verifies the connection with.
    pub certificate: String,
    /// The exact `Authorization` header value a connection must send.
    pub authorization: String,
}

/// A terminal that cannot be opened or resized.
#[derive(Debug, thiserror::Error)]
pub enum TerminalError {
    /// The operating system refused (pty, process).
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The job environment refused (e.g. the Docker Engine answered an error).
    #[error("{0}")]
    Environment(String),
}

/// Changes the size of an open terminal.
#[async_trait]
pub trait Resize: Send + Sync {
    /// Set the terminal to `cols` × `rows`.
    async fn resize(&self, cols: u16, rows: u16) -> Result<(), TerminalError>;
}

/// An open terminal: its output, its input, how to resize it. Dropping it ends the shell.
pub struct Attached {
    /// What the shell writes.
    pub output: Box<dyn AsyncRead + Send + Unpin>,
    /// What the shell reads.
    pub input: Box<dyn AsyncWrite + Send + Unpin>,
    /// Its size.
    pub resize: Box<dyn Resize>,
}

/// Where a job's terminal attaches: a shell on this machine, an exec in a container.
#[async_trait]
pub trait TerminalTarget: Send + Sync {
    /// Open a new shell in the job's environment, `cols` × `rows` to begin with.
    async fn open(&self, cols: u16, rows: u16) -> Result<Attached, TerminalError>;
}

/// One job's session: its id and token, the terminal target once the executor has one, and
/// whether a terminal is connected.
pub struct JobSession {
    id: String,
    token: String,
    target: watch::Sender<Option<Arc<dyn TerminalTarget>>>,
    connected: watch::Sender<bool>,
    /// Closes every terminal of the session (job finished, cancelled, timed out).
    closed: CancellationToken,
    registry: Arc<Registry>,
}

impl JobSession {
    /// The session's id (`/session/<id>`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The authorization token a connection must send.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Hook the job's terminal up: connections from now on (and those waiting) attach there.
    pub fn set_target(&self, target: Arc<dyn TerminalTarget>) {
        self.target.send_replace(Some(target));
    }

    /// Whether a terminal is connected right now.
    pub fn connected(&self) -> bool {
        *self.connected.borrow()
    }

    /// Resolves when no terminal is connected (at once when none is).
    pub async fn disconnected(&self) {
        let mut rx = self.connected.subscribe();
        let _ = rx.wait_for(|c| !*c).await;
    }

    /// Resolves once the session is closed.
    pub async fn closed(&self) {
        self.closed.cancelled().await;
    }

    /// Close the terminals and forget the session: its URL answers 404 from now on.
    pub fn close(&self) {
        self.closed.cancel();
        self.registry.remove(&self.id);
    }
}

impl Drop for JobSession {
    fn drop(&mut self) {
        self.closed.cancel();
        self.registry.remove(&self.id);
    }
}

/// The live sessions by id.
#[derive(Default)]
pub struct Registry {
    sessions: Mutex<HashMap<String, std::sync::Weak<JobSession>>>,
}

impl Registry {
    fn get(&self, id: &str) -> Option<Arc<JobSession>> {
        let sessions = self.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        sessions.get(id).and_then(std::sync::Weak::upgrade)
    }

    fn remove(&self, id: &str) {
        let mut sessions = self.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        sessions.remove(id);
    }

    /// A new session with a random id and token (32 random hex characters each, as
    /// gitlab-runner's `GenerateRandomUUID(32)`).
    pub fn create(self: &Arc<Self>) -> Arc<JobSession> {
        let session = Arc::new(JobSession {
            id: random_hex(),
            token: random_hex(),
            target: watch::Sender::new(None),
            connected: watch::Sender::new(false),
            closed: CancellationToken::new(),
            registry: self.clone(),
        });
        let mut sessions = self.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        sessions.insert(session.id.clone(), Arc::downgrade(&session));
        session
    }
}

fn random_hex() -> String {
    let bytes: [u8; 16] = rand::random();
    hex::encode(bytes)
}

/// How long a connection waits for the job's terminal to be hooked up (gitlab-runner: 1 min).
pub const TARGET_WAIT: Duration = Duration::from_secs(60);
