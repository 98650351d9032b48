//! The HTTPS server: `/session/<id>/terminal` (and gitlab-runner's `/session/<id>/exec`)
//! as gitlab-runner answers them — 404 for an unknown or finished session, 401 when the
//! `Authorization` header is not exactly the session's token, 405 for a request that is not a
//! WebSocket upgrade, 503 when the job's terminal was not hooked up within a minute, 423 when a
//! terminal is already connected — and the byte pump between the WebSocket and the terminal.
//!
//! Frames, as GitLab Workhorse speaks them: on `terminal.gitlab.com` binary frames are input
//! and output; on `base64.terminal.gitlab.com` text frames carry base64. A text frame holding a
//! JSON object `{"width":N,"height":N}` (which base64 never starts with) resizes the terminal:
//! Runway's addition, gitlab-runner has no resize. Closing the connection sends the shell an
//! end-of-transmission (0x04) and ends it.
//!
//! Owns the routes and the pump. Must not touch: TLS (`super::tls`), the registry's rules.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::ws::{rejection::WebSocketUpgradeRejection, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use base64::Engine as _;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::tls::{self, CertificateError, TlsListener};
use super::{Attached, JobSession, Registry, SessionInfo, TARGET_WAIT};
use crate::config::session_server::{SessionServerConfig, SessionServerError};

const SUBPROTOCOLS: [&str; 2] = ["terminal.gitlab.com", "base64.terminal.gitlab.com"];

/// The session server could not start.
#[derive(Debug, thiserror::Error)]
pub enum SessionServerStartError {
    /// `[session_server]` cannot be served.
    #[error(transparent)]
    Config(#[from] SessionServerError),
    /// No certificate.
    #[error(transparent)]
    Certificate(#[from] CertificateError),
    #[error("session_server: listening on {address}: {source}")]
    /// The address cannot be listened on.
    Listen {
        /// The listen address.
        address: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The running server: where GitLab reaches it, its certificate, its sessions.
pub struct SessionServer {
    url: String,
    certificate: String,
    local: SocketAddr,
    timeout: std::time::Duration,
    registry: Arc<Registry>,
    stop: CancellationToken,
}

impl SessionServer {
    /// Start serving `config` (whose `listen_address` is set) until [`SessionServer::stop`].
    pub async fn start(config: &SessionServerConfig) -> Result<Option<Self>, SessionServerStartError> {
        let Some(listen) = config.listen()? else { return Ok(None) };
        let url = config.advertise_url(listen)?;
        let host = advertised_host(&url);
        let cert = tls::self_signed(&host)?;
        let tcp = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|source| SessionServerStartError::Listen { address: listen, source })?;
        let local = tcp.local_addr().map_err(|source| SessionServerStartError::Listen { address: listen, source })?;
        let stop = CancellationToken::new();
        let listener = TlsListener::new(tcp, cert.server.clone(), stop.clone())
            .map_err(|source| SessionServerStartError::Listen { address: listen, source })?;
        let registry = Arc::new(Registry::default());
        let app = Router::new()
            .route("/session/{id}/terminal", get(terminal))
            .route("/session/{id}/exec", get(terminal))
            .with_state(registry.clone());
        let until = stop.clone();
        tokio::spawn(async move {
            let served = axum::serve(listener, app).with_graceful_shutdown(async move { until.cancelled().await });
            if let Err(e) = served.await {
                tracing::warn!("session server: {e}");
            }
        });
        tracing::info!("session server listening on {local}, advertised as {url}");
        let timeout = config.timeout();
        Ok(Some(SessionServer { url, certificate: cert.pem, local, timeout, registry, stop }))
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// `session_timeout`: how long a connected terminal keeps a job whose script ended.
    pub fn session_timeout(&self) -> std::time::Duration {
        self.timeout
    }

    /// A new session for a job request, and what the request tells GitLab about it.
    pub fn new_session(&self) -> (Arc<JobSession>, SessionInfo) {
        let session = self.registry.create();
        let info = SessionInfo {
            url: format!("{}/session/{}", self.url, session.id()),
            certificate: self.certificate.clone(),
            authorization: session.token().to_string(),
        };
        (session, info)
    }

    /// Stop listening.
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

impl Drop for SessionServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn advertised_host(url: &str) -> String {
    let rest = url.trim_start_matches("https://");
    match rest.rsplit_once(':') {
        Some((host, _)) => host.trim_start_matches('[').trim_end_matches(']').to_string(),
        None => rest.to_string(),
    }
}

async fn terminal(
    State(registry): State<Arc<Registry>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let Some(session) = registry.get(&id) else { return status(StatusCode::NOT_FOUND) };
    let given = headers.get(axum::http::header::AUTHORIZATION).map(|v| v.as_bytes());
    if given != Some(session.token.as_bytes()) {
        tracing::warn!(session = %id, "session server: authorization header is not valid");
        return status(StatusCode::UNAUTHORIZED);
    }
    let Ok(upgrade) = upgrade else { return status(StatusCode::METHOD_NOT_ALLOWED) };
    let mut targets = session.target.subscribe();
    let waited = tokio::select! {
        t = tokio::time::timeout(TARGET_WAIT, targets.wait_for(Option::is_some)) => t.ok().and_then(Result::ok).and_then(|t| t.clone()),
        () = session.closed.cancelled() => None,
    };
    let Some(target) = waited else { return status(StatusCode::SERVICE_UNAVAILABLE) };
    if session.connected.send_replace(true) {
        return status(StatusCode::LOCKED);
    }
    let attached = match target.open(80, 24).await {
        Ok(a) => a,
        Err(e) => {
            session.connected.send_replace(false);
            tracing::warn!(session = %id, "session server: opening the terminal: {e}");
            return status(StatusCode::INTERNAL_SERVER_ERROR);
        }
    };
    let closed = session.closed.clone();
    upgrade
        .protocols(SUBPROTOCOLS)
        .on_upgrade(move |socket| async move {
            pump(socket, attached, closed).await;
            session.connected.send_replace(false);
        })
        .into_response()
}

fn status(code: StatusCode) -> Response {
    (code, code.canonical_reason().unwrap_or_default()).into_response()
}

/// What one client frame means.
#[derive(Debug, PartialEq, Eq)]
enum Frame {
    Input(Vec<u8>),
    Resize(u16, u16),
    Ignore,
    Close,
}

#[derive(serde::Deserialize)]
struct ResizeMessage {
    width: u16,
    height: u16,
}

fn decode(message: Message, base64: bool) -> Frame {
    let data = match message {
        Message::Close(_) => return Frame::Close,
        Message::Ping(_) | Message::Pong(_) => return Frame::Ignore,
        Message::Text(text) => {
            if text.as_str().trim_start().starts_with('{') {
                return match serde_json::from_str::<ResizeMessage>(text.as_str()) {
                    Ok(r) if r.width > 0 && r.height > 0 => Frame::Resize(r.width, r.height),
                    _ => Frame::Ignore,
                };
            }
            text.as_str().as_bytes().to_vec()
        }
        Message::Binary(bytes) => bytes.to_vec(),
    };
    if !base64 {
        return Frame::Input(data);
    }
    match base64::engine::general_purpose::STANDARD.decode(data.trim_ascii()) {
        Ok(bytes) => Frame::Input(bytes),
        Err(_) => Frame::Ignore,
    }
}

async fn pump(socket: WebSocket, attached: Attached, closed: CancellationToken) {
    let base64 = socket.protocol().is_some_and(|p| p.as_bytes() == SUBPROTOCOLS[1].as_bytes());
    let Attached { mut output, mut input, resize } = attached;
    let (mut to_client, mut from_client) = socket.split();
    let (out_tx, mut out_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match output.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if out_tx.send(buf[..n].to_vec()).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    loop {
        tokio::select! {
            out = out_rx.recv() => {
                let Some(bytes) = out else { break };
                let message = if base64 {
                    Message::Text(base64::engine::general_purpose::STANDARD.encode(&bytes).into())
                } else {
                    Message::Binary(bytes.into())
                };
                if to_client.send(message).await.is_err() {
                    break;
                }
            }
            message = from_client.next() => {
                let Some(Ok(message)) = message else { break };
                match decode(message, base64) {
                    Frame::Input(bytes) => {
                        if input.write_all(&bytes).await.is_err() || input.flush().await.is_err() {
                            break;
                        }
                    }
                    Frame::Resize(cols, rows) => {
                        if let Err(e) = resize.resize(cols, rows).await {
                            tracing::debug!("session server: resize: {e}");
                        }
                    }
                    Frame::Ignore => {}
                    Frame::Close => break,
                }
            }
            () = closed.cancelled() => break,
        }
    }
    // gitlab-terminal's proxy: an end-of-transmission tells the shell to end.
    let _ = input.write_all(&[0x04]).await;
    let _ = input.flush().await;
    reader.abort();
    let _ = to_client.send(Message::Close(None)).await;
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
