//! The downstream API over TLS (`tls_cert_file`/`tls_key_file`): a listener for `axum::serve`
//! whose connections are TLS streams. Handshakes run in their own tasks (bounded by a
//! timeout), so a slow or broken client never holds up the others.
//!
//! Owns loading the PEM files and accepting TLS connections. Must not know the API served.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client has to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepted TLS connections.
pub struct TlsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<tokio::net::TcpStream>, SocketAddr)>,
    _accept: tokio::task::JoinHandle<()>,
}

/// The server config of `cert` (PEM chain) and `key` (PEM private key).
pub fn server_config(cert: &Path, key: &Path) -> anyhow::Result<Arc<tokio_rustls::rustls::ServerConfig>> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("router.tls_cert_file {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("router.tls_cert_file {}", cert.display()))?;
    if certs.is_empty() {
        anyhow::bail!("router.tls_cert_file {}: no PEM certificate in it", cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(key).with_context(|| format!("router.tls_key_file {}", key.display()))?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("router.tls_cert_file and router.tls_key_file do not make a certificate and its key")?;
    Ok(Arc::new(config))
}

impl TlsListener {
    /// Accept TLS connections on `listener` with `config`.
    pub fn new(listener: TcpListener, config: Arc<tokio_rustls::rustls::ServerConfig>) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let acceptor = TlsAcceptor::from(config);
        let (tx, ready) = mpsc::channel(64);
        let accept = tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!("accepting a downstream connection: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { local, ready, _accept: accept })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self._accept.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            if let Some(conn) = self.ready.recv().await {
                return conn;
            }
            // The accept task ended (it never does on its own): wait for shutdown.
            std::future::pending::<()>().await;
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
