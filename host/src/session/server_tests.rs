//! The session server over real TLS and WebSockets, with a real shell in a real pty: what
//! GitLab Workhorse does (trust the sent certificate, send the authorization, speak the
//! subprotocol), and gitlab-runner's answers to what it must refuse.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use futures::{SinkExt, StreamExt};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use super::*;
use crate::session::pty::LocalShell;

type Ws = tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

async fn server() -> SessionServer {
    let config = SessionServerConfig { listen_address: Some("127.0.0.1:0".into()), ..Default::default() };
    SessionServer::start(&config).await.expect("starts").expect("configured")
}

async fn connect(
    server: &SessionServer,
    info: &SessionInfo,
    token: Option<&str>,
    protocol: &str,
) -> Result<(Ws, String), WsError> {
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(info.certificate.as_bytes()).expect("pem")).expect("root");
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = tokio_rustls::rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("tls")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(server.local_addr()).await.expect("tcp");
    let name = ServerName::try_from("127.0.0.1").expect("name");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("the sent certificate is trusted");
    let url = format!("{}/terminal", info.url.replacen("https://", "wss://", 1));
    let mut request = url.into_client_request().expect("request");
    if let Some(token) = token {
        request.headers_mut().insert("Authorization", token.parse().expect("header"));
    }
    request.headers_mut().insert("Sec-WebSocket-Protocol", protocol.parse().expect("header"));
    let (ws, response) = tokio_tungstenite::client_async(request, tls).await?;
    let chosen =
        response.headers().get("sec-websocket-protocol").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    Ok((ws, chosen))
}

fn status_of(result: Result<(Ws, String), WsError>) -> u16 {
    match result {
        Err(WsError::Http(response)) => response.status().as_u16(),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("connected"),
    }
}

async fn read_until(ws: &mut Ws, base64: bool, want: &str) -> String {
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !seen.contains(want) {
        let message = tokio::time::timeout_at(deadline, ws.next())
            .await
            .unwrap_or_else(|_| panic!("no {want:?} in {seen:?}"))
            .expect("open")
            .expect("frame");
        match message {
            Message::Binary(b) => {
                assert!(!base64, "binary frame on base64");
                seen.push_str(&String::from_utf8_lossy(&b));
            }
            Message::Text(t) => {
                assert!(base64, "text frame on terminal.gitlab.com");
                let bytes = base64::engine::general_purpose::STANDARD.decode(t.as_str()).expect("base64");
                seen.push_str(&String::from_utf8_lossy(&bytes));
            }
            _ => {}
        }
    }
    seen
}

fn shell(dir: &std::path::Path) -> Arc<LocalShell> {
    Arc::new(LocalShell {
        shell: "bash".into(),
        dir: dir.to_path_buf(),
        env: vec![("JOB_VAR".into(), "from-the-job".into()), ("PS1".into(), "$ ".into())],
        user: None,
    })
}

#[tokio::test]
async fn a_shell_in_a_pty_over_gitlabs_terminal_protocol() {
    let server = server().await;
    let dir = tempfile::tempdir().expect("dir");
    let (session, info) = server.new_session();
    assert!(info.url.starts_with("https://127.0.0.1:") && info.url.contains("/session/"), "{}", info.url);
    session.set_target(shell(dir.path()));
    let (mut ws, chosen) =
        connect(&server, &info, Some(&info.authorization), "terminal.gitlab.com").await.expect("connects");
    assert_eq!(chosen, "terminal.gitlab.com");
    assert!(session.connected());
    ws.send(Message::Binary(b"echo \"$JOB_VAR in $PWD\" $((6*7))\n".to_vec().into())).await.expect("send");
    let want = format!("from-the-job in {} 42", dir.path().display());
    read_until(&mut ws, false, &want).await;
    ws.send(Message::Text(r#"{"width":123,"height":45}"#.into())).await.expect("resize");
    ws.send(Message::Binary(b"stty size\n".to_vec().into())).await.expect("send");
    read_until(&mut ws, false, "45 123").await;
    // Workhorse's second subprotocol while the first is connected: 423, one at a time.
    assert_eq!(status_of(connect(&server, &info, Some(&info.authorization), "terminal.gitlab.com").await), 423);
    ws.close(None).await.expect("close");
    tokio::time::timeout(Duration::from_secs(10), session.disconnected()).await.expect("disconnected");

    let (mut ws, chosen) =
        connect(&server, &info, Some(&info.authorization), "base64.terminal.gitlab.com").await.expect("connects");
    assert_eq!(chosen, "base64.terminal.gitlab.com");
    let typed = base64::engine::general_purpose::STANDARD.encode("echo b64-$((20+3))\n");
    ws.send(Message::Text(typed.into())).await.expect("send");
    read_until(&mut ws, true, "b64-23").await;
    // The job ends: the terminal closes and the session's URL is gone.
    session.close();
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(m)) = ws.next().await {
            if matches!(m, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the terminal closes with its session");
    assert_eq!(status_of(connect(&server, &info, Some(&info.authorization), "terminal.gitlab.com").await), 404);
}

#[tokio::test]
async fn wrong_or_missing_tokens_get_401_and_unknown_sessions_404() {
    let server = server().await;
    let (_session, info) = server.new_session();
    assert_eq!(info.authorization.len(), 32);
    assert_eq!(status_of(connect(&server, &info, Some("wrong"), "terminal.gitlab.com").await), 401);
    assert_eq!(status_of(connect(&server, &info, None, "terminal.gitlab.com").await), 401);
    let unknown = SessionInfo { url: format!("{}x", info.url), ..info.clone() };
    assert_eq!(status_of(connect(&server, &unknown, Some(&info.authorization), "terminal.gitlab.com").await), 404);
    let (other, _) = server.new_session();
    assert_ne!(other.id(), _session.id());
    assert_ne!(other.token(), _session.token());
}

#[test]
fn frames_as_workhorse_sends_them() {
    use axum::extract::ws::Message as M;
    assert_eq!(decode(M::Binary(b"ls\n".to_vec().into()), false), Frame::Input(b"ls\n".to_vec()));
    assert_eq!(decode(M::Text("bHMK".into()), true), Frame::Input(b"ls\n".to_vec()));
    assert_eq!(decode(M::Text(r#"{"width":80,"height":24}"#.into()), true), Frame::Resize(80, 24));
    assert_eq!(decode(M::Text(r#"{"width":0,"height":24}"#.into()), false), Frame::Ignore);
    assert_eq!(decode(M::Text("not base64!".into()), true), Frame::Ignore);
    assert_eq!(decode(M::Close(None), false), Frame::Close);
}
