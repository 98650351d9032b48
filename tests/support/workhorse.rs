//! The part of GitLab Workhorse that the web terminal goes through, for tests: a client of a
//! runner's session server (TLS trusting only the certificate the runner sent with the job
//! request, the session's `Authorization`, the `terminal.gitlab.com` subprotocol), and a small
//! proxy that serves a page with xterm.js (npm `@xterm/xterm`) on 127.0.0.1 and carries its
//! WebSocket to the runner's terminal, as Workhorse carries GitLab's "Debug" page.

#![allow(dead_code)]

use std::sync::Arc;

use axum::extract::ws::{Message as PageMessage, WebSocket, WebSocketUpgrade};
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use futures::{SinkExt, StreamExt};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

/// The runner's end of a terminal as Workhorse holds it.
pub(crate) type Ws = tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

/// A job's session as the runner sent it in its job request.
#[derive(Clone, Debug)]
pub(crate) struct Session {
    pub(crate) url: String,
    pub(crate) certificate: String,
    pub(crate) authorization: String,
}

impl Session {
    /// The session the runner sent with `job`'s request (panics when it sent none).
    pub(crate) fn of(job: &fake_gitlab::JobRecord) -> Session {
        let session = job.runner_session.as_ref().expect("the job request carried a session");
        let field = |k: &str| session.get(k).and_then(|v| v.as_str()).expect("session field").to_string();
        Session { url: field("url"), certificate: field("certificate"), authorization: field("authorization") }
    }
}

/// How long a terminal's answer may take.
const TERMINAL_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

pub(crate) fn status_of(result: Result<Ws, WsError>) -> u16 {
    match result {
        Err(WsError::Http(response)) => response.status().as_u16(),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("connected"),
    }
}

/// Type `line` and read until `want` shows up in the output.
pub(crate) async fn type_and_read(ws: &mut Ws, line: &str, want: &str) -> String {
    ws.send(Message::Binary(format!("{line}\n").into_bytes().into())).await.expect("typed");
    read_until(ws, want).await
}

pub(crate) async fn read_until(ws: &mut Ws, want: &str) -> String {
    let mut seen = String::new();
    let read = async {
        while let Some(message) = ws.next().await {
            match message.expect("frame") {
                Message::Binary(bytes) => seen.push_str(&String::from_utf8_lossy(&bytes)),
                Message::Close(_) => break,
                _ => {}
            }
            if seen.contains(want) {
                return true;
            }
        }
        false
    };
    let found = tokio::time::timeout(TERMINAL_WAIT, read).await.unwrap_or(false);
    assert!(found, "{want:?} never came; the terminal showed:\n{seen}");
    seen
}

/// Resolves when the server closes the WebSocket.
pub(crate) async fn closed_by_server(ws: &mut Ws) {
    let closed = async {
        while let Some(message) = ws.next().await {
            if matches!(message, Ok(Message::Close(_)) | Err(_)) {
                return;
            }
        }
    };
    tokio::time::timeout(TERMINAL_WAIT, closed).await.expect("the server closed the terminal");
}

/// Connect to the session's terminal as Workhorse does: TLS trusting only the sent
/// certificate, `Authorization: <authorization>`, the `protocol` subprotocol.
pub(crate) async fn connect(session: &Session, authorization: &str, protocol: &str) -> Result<Ws, WsError> {
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(session.certificate.as_bytes()).expect("pem")).expect("root");
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = tokio_rustls::rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("tls")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let url = format!("{}/terminal", session.url.replacen("https://", "wss://", 1));
    let authority = url.trim_start_matches("wss://").split('/').next().expect("authority").to_string();
    let host = authority.rsplit_once(':').map(|(h, _)| h.to_string()).expect("host:port");
    let tcp = tokio::net::TcpStream::connect(&authority).await.expect("the advertised address answers");
    let name = ServerName::try_from(host).expect("name");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("the sent certificate is trusted for the advertised host");
    let mut request = url.into_client_request().expect("request");
    request.headers_mut().insert("Authorization", authorization.parse().expect("header"));
    request.headers_mut().insert("Sec-WebSocket-Protocol", protocol.parse().expect("header"));
    let (ws, response) = tokio_tungstenite::client_async(request, tls).await?;
    assert_eq!(response.headers().get("sec-websocket-protocol").and_then(|v| v.to_str().ok()), Some(protocol));
    Ok(ws)
}

/// The page the proxy serves: xterm.js in the whole window, connected to `/terminal` with
/// GitLab's subprotocol; keys typed go out as binary frames, what arrives is written to the
/// terminal. `window.term`, `window.socket` and `window.connected` are there for the test.
const PAGE: &str = r#"<!doctype html>
<html><head><meta charset="utf-8"><title>Runway job terminal</title>
<link rel="stylesheet" href="/xterm.css">
<style>html, body { margin: 0; height: 100%; background: #1e1e1e; } #terminal { height: 100%; }</style>
</head><body><div id="terminal"></div>
<script src="/xterm.js"></script>
<script>
  const term = new Terminal({ cols: 100, rows: 24, fontSize: 14 });
  window.term = term;
  window.connected = false;
  term.open(document.getElementById('terminal'));
  const socket = new WebSocket('ws://' + location.host + '/terminal', ['terminal.gitlab.com']);
  window.socket = socket;
  socket.binaryType = 'arraybuffer';
  const encoder = new TextEncoder();
  socket.onopen = () => { window.connected = true; term.focus(); };
  socket.onmessage = (event) => {
    term.write(typeof event.data === 'string' ? event.data : new Uint8Array(event.data));
  };
  socket.onclose = () => { window.connected = false; };
  term.onData((data) => socket.send(encoder.encode(data)));
  window.screenText = () => {
    const buffer = term.buffer.active;
    const lines = [];
    for (let i = 0; i < buffer.length; i++) lines.push(buffer.getLine(i).translateToString(true));
    return lines.join('\n');
  };
</script></body></html>
"#;

/// npm's global `@xterm/xterm` (tests/setup.sh installs it): its directory.
fn xterm_dir() -> std::path::PathBuf {
    let out = std::process::Command::new("npm").args(["root", "-g"]).output().expect("npm runs");
    let root = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let dir = std::path::Path::new(&root).join("@xterm/xterm");
    assert!(
        dir.join("lib/xterm.js").exists(),
        "npm's @xterm/xterm is missing under {root} (tests/setup.sh installs it)"
    );
    dir
}

/// Serve the terminal page on 127.0.0.1 with its WebSocket carried to `session`'s terminal:
/// the page's URL. The proxy lives as long as the test's runtime.
pub(crate) async fn serve_page(session: Session) -> String {
    let dir = xterm_dir();
    let js = std::fs::read(dir.join("lib/xterm.js")).expect("xterm.js");
    let css = std::fs::read(dir.join("css/xterm.css")).expect("xterm.css");
    let app = axum::Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route("/xterm.js", get(move || async move { ([("content-type", "application/javascript")], js) }))
        .route("/xterm.css", get(move || async move { ([("content-type", "text/css")], css) }))
        .route(
            "/terminal",
            get(move |upgrade: WebSocketUpgrade| async move {
                let session = session.clone();
                upgrade.protocols(["terminal.gitlab.com"]).on_upgrade(move |page| carry(page, session)).into_response()
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{address}/")
}

/// Carry frames both ways between the page and the runner until either side closes.
async fn carry(page: WebSocket, session: Session) {
    let runner = match connect(&session, &session.authorization, "terminal.gitlab.com").await {
        Ok(runner) => runner,
        Err(_) => return,
    };
    let (mut page_tx, mut page_rx) = page.split();
    let (mut runner_tx, mut runner_rx) = runner.split();
    let up = async {
        while let Some(Ok(message)) = page_rx.next().await {
            let message = match message {
                PageMessage::Binary(data) => Message::Binary(data),
                PageMessage::Text(text) => Message::Text(text.as_str().into()),
                PageMessage::Close(_) => break,
                _ => continue,
            };
            if runner_tx.send(message).await.is_err() {
                break;
            }
        }
        let _ = runner_tx.close().await;
    };
    let down = async {
        while let Some(Ok(message)) = runner_rx.next().await {
            let message = match message {
                Message::Binary(data) => PageMessage::Binary(data),
                Message::Text(text) => PageMessage::Text(text.as_str().into()),
                Message::Close(_) => break,
                _ => continue,
            };
            if page_tx.send(message).await.is_err() {
                break;
            }
        }
        let _ = page_tx.close().await;
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

/// What a container job's terminal shows of its environment, typed as a person would: the
/// job image's marker with the job variable `TERMINAL_MARK` (checked here), the shell's working
/// directory and `$CI_PROJECT_DIR` (returned for the caller to hold to its executor's layout),
/// and the size a Workhorse resize gives the tty (checked here: the job images have no `stty`,
/// so bash's `$LINES`/`$COLUMNS`).
pub(crate) async fn container_shell(ws: &mut Ws) -> (String, String) {
    type_and_read(ws, "echo \"image-$(cat /etc/runway-image)-$TERMINAL_MARK\"", "image-job-from-the-job").await;
    let pwd = type_and_read(ws, "echo \"dir=$(pwd)=$CI_PROJECT_DIR=\"", "=\r\n").await;
    let dirs: Vec<&str> = pwd.rsplit("dir=").next().unwrap_or_default().split('=').collect();
    assert!(dirs.len() > 2, "{pwd}");
    let (dir, project_dir) = (dirs[0].to_string(), dirs[1].to_string());
    ws.send(Message::Text(r#"{"width":101,"height":33}"#.into())).await.expect("resize");
    type_and_read(ws, "echo \"size-$LINES-$COLUMNS\"", "size-33-101").await;
    (dir, project_dir)
}
