//! Where a Docker engine is: `[runners.docker] host` (else `DOCKER_HOST`, else the default
//! socket) parsed into an [`EngineAddress`], with the TLS material of `tls_verify` and
//! `tls_cert_path` (else `DOCKER_TLS_VERIFY`/`DOCKER_CERT_PATH`), as the docker CLI reads them.
//!
//! Owns: parsing addresses and loading TLS files. Must not touch: connections (see
//! [`super::client`]), grants (the capability checks [`EngineAddress::canonical`] against them).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::DockerError;

/// The engine's socket when nothing names one.
pub const DEFAULT_SOCKET: &str = "/var/run/docker.sock";

/// How to reach an engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// A unix socket (on the runner's machine, or on a fleet instance).
    Unix(PathBuf),
    /// A TCP address.
    Tcp {
        /// Host name or IP.
        host: String,
        /// Port.
        port: u16,
    },
}

/// An engine address with its TLS files (TCP only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineAddress {
    /// Where.
    pub address: Address,
    /// `ca.pem`, `cert.pem`, `key.pem` in this directory; `None`: plain TCP.
    pub tls_dir: Option<PathBuf>,
}

/// What the environment says when the configuration is silent (`DOCKER_HOST`,
/// `DOCKER_TLS_VERIFY`, `DOCKER_CERT_PATH`).
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

impl EngineAddress {
    /// The engine named by `host` (empty: `DOCKER_HOST`, else the default socket), with TLS when
    /// `tls_verify` (or `DOCKER_TLS_VERIFY`) is set and the address is TCP; the certificates are
    /// in `cert_path` (empty: `DOCKER_CERT_PATH`, else `~/.docker`).
    pub fn resolve(host: &str, tls_verify: bool, cert_path: &str, env: EnvLookup<'_>) -> Result<Self, DockerError> {
        let host = match host.trim() {
            "" => env("DOCKER_HOST").filter(|h| !h.is_empty()).unwrap_or_else(|| format!("unix://{DEFAULT_SOCKET}")),
            h => h.to_string(),
        };
        let address = parse_address(&host)?;
        let verify = tls_verify || env("DOCKER_TLS_VERIFY").is_some_and(|v| !v.is_empty() && v != "0");
        let tls_dir = match (&address, verify) {
            (Address::Tcp { .. }, true) => Some(match cert_path.trim() {
                "" => env("DOCKER_CERT_PATH")
                    .filter(|p| !p.is_empty())
                    .map(PathBuf::from)
                    .or_else(|| env("HOME").map(|h| Path::new(&h).join(".docker")))
                    .ok_or_else(|| DockerError::Other("tls_verify is set but no tls_cert_path is given".into()))?,
                p => PathBuf::from(p),
            }),
            _ => None,
        };
        Ok(EngineAddress { address, tls_dir })
    }

    /// `unix:///path` or `tcp://host:port`: the form grants name.
    pub fn canonical(&self) -> String {
        match &self.address {
            Address::Unix(path) => format!("unix://{}", path.display()),
            Address::Tcp { host, port } => format!("tcp://{host}:{port}"),
        }
    }
}

/// Parse `unix:///path`, `tcp://host:port`, `http://host:port`, `https://host:port` (TLS is
/// decided by `tls_verify`, as GitLab's runner does) or a bare `/path`.
pub fn parse_address(host: &str) -> Result<Address, DockerError> {
    let bad = |why: &str| DockerError::Other(format!("Docker host {host:?}: {why}"));
    if let Some(path) = host.strip_prefix("unix://") {
        if !path.starts_with('/') {
            return Err(bad("a unix socket path must be absolute (unix:///path)"));
        }
        return Ok(Address::Unix(PathBuf::from(path)));
    }
    if host.starts_with('/') {
        return Ok(Address::Unix(PathBuf::from(host)));
    }
    let rest = ["tcp://", "http://", "https://"]
        .iter()
        .find_map(|scheme| host.strip_prefix(scheme))
        .ok_or_else(|| bad("expected unix:///path or tcp://host:port"))?;
    let rest = rest.trim_end_matches('/');
    let (name, port) = match rest.rsplit_once(':') {
        Some((name, port)) if !name.ends_with(']') || name.starts_with('[') => {
            (name, port.parse::<u16>().map_err(|_| bad("the port is not a number"))?)
        }
        _ => (rest, 2375),
    };
    let name = name.trim_start_matches('[').trim_end_matches(']');
    if name.is_empty() || name.contains('/') {
        return Err(bad("no host name"));
    }
    Ok(Address::Tcp { host: name.to_string(), port })
}

/// The rustls client configuration of a TLS directory: the engine's certificate is verified
/// against `ca.pem`, and `cert.pem`/`key.pem` are presented.
pub fn tls_config(dir: &Path) -> Result<Arc<tokio_rustls::rustls::ClientConfig>, DockerError> {
    use tokio_rustls::rustls;
    let file = |name: &str| dir.join(name);
    let read_err =
        |name: &str, e: &dyn std::fmt::Display| DockerError::Other(format!("reading {}: {e}", file(name).display()));
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(file("ca.pem")).map_err(|e| read_err("ca.pem", &e))? {
        let cert = cert.map_err(|e| read_err("ca.pem", &e))?;
        roots.add(cert).map_err(|e| read_err("ca.pem", &e))?;
    }
    let certs = CertificateDer::pem_file_iter(file("cert.pem"))
        .map_err(|e| read_err("cert.pem", &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| read_err("cert.pem", &e))?;
    let key = PrivateKeyDer::from_pem_file(file("key.pem")).map_err(|e| read_err("key.pem", &e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| DockerError::Other(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .map_err(|e| read_err("cert.pem", &e))?;
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn addresses() {
        assert_eq!(parse_address("unix:///run/d.sock").expect("unix"), Address::Unix("/run/d.sock".into()));
        assert_eq!(parse_address("/run/d.sock").expect("bare"), Address::Unix("/run/d.sock".into()));
        assert_eq!(
            parse_address("tcp://127.0.0.1:2376").expect("tcp"),
            Address::Tcp { host: "127.0.0.1".into(), port: 2376 }
        );
        assert_eq!(parse_address("tcp://docker").expect("tcp"), Address::Tcp { host: "docker".into(), port: 2375 });
        assert_eq!(parse_address("tcp://[::1]:2376").expect("v6"), Address::Tcp { host: "::1".into(), port: 2376 });
        for bad in ["unix://relative", "npipe:////./pipe/docker", "tcp://:2375", "tcp://h:x", "ssh://user@h"] {
            assert!(parse_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn environment_fills_what_the_config_leaves_out() {
        let default = EngineAddress::resolve("", false, "", &none).expect("default");
        assert_eq!(default.canonical(), "unix:///var/run/docker.sock");
        let env = |k: &str| match k {
            "DOCKER_HOST" => Some("tcp://127.0.0.2:2376".to_string()),
            "DOCKER_TLS_VERIFY" => Some("1".to_string()),
            "DOCKER_CERT_PATH" => Some("/certs".to_string()),
            _ => None,
        };
        let from_env = EngineAddress::resolve("", false, "", &env).expect("env");
        assert_eq!(from_env.canonical(), "tcp://127.0.0.2:2376");
        assert_eq!(from_env.tls_dir.as_deref(), Some(Path::new("/certs")));
        // A configured host wins; TLS never applies to a unix socket.
        let unix = EngineAddress::resolve("unix:///x.sock", true, "/c", &env).expect("unix");
        assert_eq!((unix.canonical().as_str(), unix.tls_dir), ("unix:///x.sock", None));
    }
}
