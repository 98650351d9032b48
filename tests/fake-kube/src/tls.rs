//! TLS: a CA of its own and a serving certificate for the listen address (made with rcgen
//! at start), the kubeconfig naming them (cluster CA data, the admin bearer token, context
//! `fake-kube`), and the TLS listener axum serves on (HTTP/1.1 only, which kubectl's
//! WebSocket upgrade for exec/attach needs), each connection tracked for resets
//! (`resets.rs`). Owns nothing of the API.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::resets::{Connections, Resettable};

/// The CA (PEM) clients trust, and the server's rustls configuration.
pub(crate) struct Certificates {
    pub ca_pem: String,
    pub server: Arc<tokio_rustls::rustls::ServerConfig>,
}

/// Make a CA and a certificate it signs for `ip` (and `localhost`).
pub(crate) fn make_certificates(ip: IpAddr) -> anyhow::Result<Certificates> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.distinguished_name.push(DnType::CommonName, format!("fake-kube CA {}", std::process::id()));
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_key = KeyPair::generate()?;
    let ca = ca_params.self_signed(&ca_key)?;

    let mut params = CertificateParams::new(vec!["localhost".to_string(), "kubernetes".to_string()])?;
    params.distinguished_name.push(DnType::CommonName, "kube-apiserver");
    params.subject_alt_names.push(SanType::IpAddress(ip));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &ca, &ca_key)?;

    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let mut server = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )?;
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Certificates { ca_pem: ca.pem(), server: Arc::new(server) })
}

/// Write the kubeconfig (JSON, which is YAML) for `https://addr` with the CA and `token`.
pub(crate) fn write_kubeconfig(path: &Path, addr: SocketAddr, ca_pem: &str, token: &str) -> anyhow::Result<()> {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake-kube", "cluster": {"server": format!("https://{addr}"), "certificate-authority-data": ca}}],
        "users": [{"name": "fake-kube-admin", "user": {"token": token}}],
        "contexts": [{"name": "fake-kube", "context": {"cluster": "fake-kube", "user": "fake-kube-admin", "namespace": "default"}}],
        "current-context": "fake-kube",
        "preferences": {}
    });
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&config)?)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// The client address of a connection (axum's `ConnectInfo` for [`TlsListener`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Peer(pub SocketAddr);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> Self {
        Peer(*stream.remote_addr())
    }
}

/// A TLS listener for `axum::serve`: handshakes run in their own tasks, so a slow or failed
/// one never holds the accept loop.
pub(crate) struct TlsListener {
    accepted: mpsc::Receiver<(TlsStream<tokio::net::TcpStream>, SocketAddr)>,
    local: SocketAddr,
    connections: Arc<Connections>,
}

impl TlsListener {
    pub(crate) fn new(
        listener: TcpListener,
        config: Arc<tokio_rustls::rustls::ServerConfig>,
        connections: Arc<Connections>,
    ) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let (tx, accepted) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(config);
        tokio::spawn(async move {
            loop {
                let Ok((stream, peer)) = listener.accept().await else {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(std::time::Duration::from_secs(10), acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!("TLS handshake from {peer}: {e}"),
                        Err(_) => tracing::debug!("TLS handshake from {peer} timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { accepted, local, connections })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = Resettable;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some((stream, peer)) => (self.connections.track(stream, peer), peer),
            // The accept task never ends while the listener lives.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
