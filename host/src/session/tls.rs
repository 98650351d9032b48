//! The session server's TLS: a self-signed certificate made at start for the advertised host
//! (gitlab-runner makes one the same way; GitLab pins it from the job request), and the TLS
//! listener axum serves on (HTTP/1.1, which the WebSocket upgrade needs).
//!
//! Owns the certificate and the accept loop. Must not touch: routes, sessions.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose, SanType};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// The certificate could not be made or loaded.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    /// rcgen failed.
    #[error("making the session server's certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls refused the certificate.
    #[error("the session server's TLS configuration: {0}")]
    Tls(#[from] tokio_rustls::rustls::Error),
}

/// The certificate (PEM) sent to GitLab and the server's rustls configuration.
pub struct Certificate {
    /// The certificate, PEM.
    pub pem: String,
    /// The serving configuration.
    pub server: Arc<tokio_rustls::rustls::ServerConfig>,
}

/// A self-signed server certificate for `host` (an IP address or a DNS name).
pub fn self_signed(host: &str) -> Result<Certificate, CertificateError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::OrganizationName, "GitLab Runner");
    params.distinguished_name.push(DnType::CommonName, host);
    match host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
        Ok(ip) => params.subject_alt_names.push(SanType::IpAddress(ip)),
        Err(_) => params.subject_alt_names.push(SanType::DnsName(host.to_string().try_into()?)),
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let mut server = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )?;
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Certificate { pem: cert.pem(), server: Arc::new(server) })
}

/// A TLS listener for `axum::serve`: handshakes run in their own tasks so a slow one never
/// holds the accept loop; the loop ends with `stop`.
pub struct TlsListener {
    accepted: mpsc::Receiver<(TlsStream<tokio::net::TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Accept on `listener` with `config` until `stop`.
    pub fn new(
        listener: TcpListener,
        config: Arc<tokio_rustls::rustls::ServerConfig>,
        stop: CancellationToken,
    ) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let (tx, accepted) = mpsc::channel(16);
        let acceptor = TlsAcceptor::from(config);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    () = stop.cancelled() => return,
                };
                let Ok((stream, peer)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!("session server: TLS handshake from {peer}: {e}"),
                        Err(_) => tracing::debug!("session server: TLS handshake from {peer} timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { accepted, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(pair) => pair,
            // The accept loop ended (server stopped): nothing more comes.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
