//! The TLS files of a runner's GitLab, as gitlab-runner finds them: `tls-ca-file`,
//! `tls-cert-file` and `tls-key-file` when set, else `<host>.crt`, `<host>.auth.crt` and
//! `<host>.auth.key` in the certificates directory (`<config dir>/certs`) when they exist.
//! The configured file always wins over the discovered one.
//!
//! Owns: where the files are. Must not read or parse them (the GitLab client does).

use std::path::{Path, PathBuf};

use super::RunnerConfig;

/// The certificates directory of a config file: `<config dir>/certs`.
pub fn certs_dir(config_path: &Path) -> PathBuf {
    config_path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).join("certs")
}

/// The TLS files a runner uses towards GitLab.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA certificates (PEM) trusted beside the system's.
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM).
    pub cert_file: Option<PathBuf>,
    /// Key of the client certificate (PEM).
    pub key_file: Option<PathBuf>,
}

impl TlsFiles {
    /// Nothing configured or found.
    pub fn is_empty(&self) -> bool {
        self.ca_file.is_none() && self.cert_file.is_none() && self.key_file.is_none()
    }
}

/// The host of `url` without port or credentials (`gitlab.example.com`), as gitlab-runner
/// names the files of the certificates directory.
pub fn url_host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if let Some(v6) = host_port.strip_prefix('[') {
        v6.split(']').next()?.to_string()
    } else {
        host_port.split(':').next()?.to_string()
    };
    (!host.is_empty()).then_some(host)
}

/// The files for GitLab at `url` with the configured ones (`tls-*-file`), looked up in
/// `certs_dir` where not configured.
pub fn resolve(
    url: &str,
    certs_dir: &Path,
    ca_file: Option<&Path>,
    cert_file: Option<&Path>,
    key_file: Option<&Path>,
) -> TlsFiles {
    let host = url_host(url);
    let find = |configured: Option<&Path>, suffix: &str| -> Option<PathBuf> {
        if let Some(path) = configured {
            return Some(path.to_path_buf());
        }
        let candidate = certs_dir.join(format!("{}{suffix}", host.as_deref()?));
        candidate.is_file().then_some(candidate)
    };
    TlsFiles {
        ca_file: find(ca_file, ".crt"),
        cert_file: find(cert_file, ".auth.crt"),
        key_file: find(key_file, ".auth.key"),
    }
}

impl RunnerConfig {
    /// This runner's TLS files (see [`resolve`]), `certs_dir` being `<config dir>/certs`.
    pub fn tls_files(&self, certs_dir: &Path) -> TlsFiles {
        resolve(
            &self.resolved_url(),
            certs_dir,
            self.tls_ca_file.as_deref(),
            self.tls_cert_file.as_deref(),
            self.tls_key_file.as_deref(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_drop_scheme_port_and_credentials() {
        assert_eq!(url_host("https://gitlab.example.com:8443/group").as_deref(), Some("gitlab.example.com"));
        assert_eq!(url_host("https://user:pw@127.0.0.1:9/").as_deref(), Some("127.0.0.1"));
        assert_eq!(url_host("https://[::1]:9/").as_deref(), Some("::1"));
        assert_eq!(url_host("https:///x"), None);
    }

    #[test]
    fn the_configured_file_wins_over_the_certs_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let certs = dir.path().join("certs");
        std::fs::create_dir_all(&certs).expect("mkdir");
        let mut runner = RunnerConfig::new("r", "https://gitlab.example.com:8443", "t", "shell");
        assert!(runner.tls_files(&certs).is_empty());
        for name in ["gitlab.example.com.crt", "gitlab.example.com.auth.crt", "gitlab.example.com.auth.key"] {
            std::fs::write(certs.join(name), "x").expect("write");
        }
        let found = runner.tls_files(&certs);
        assert_eq!(found.ca_file, Some(certs.join("gitlab.example.com.crt")));
        assert_eq!(found.key_file, Some(certs.join("gitlab.example.com.auth.key")));
        runner.tls_ca_file = Some(PathBuf::from("/etc/ssl/private-ca.pem"));
        assert_eq!(runner.tls_files(&certs).ca_file, Some(PathBuf::from("/etc/ssl/private-ca.pem")));
        assert_eq!(certs_dir(Path::new("/etc/runway/config.toml")), PathBuf::from("/etc/runway/certs"));
        assert_eq!(certs_dir(Path::new("config.toml")), PathBuf::from("./certs"));
    }
}
