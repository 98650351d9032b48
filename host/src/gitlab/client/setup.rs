//! Building the HTTP client: timeouts, keepalive, and the TLS settings of a self-managed
//! GitLab (`tls-ca-file`, `tls-cert-file`/`tls-key-file`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use super::{describe_reqwest_error, ApiError, GitLabClient, RequestHook};
use crate::buildinfo;
use crate::gitlab::retry::RetryPolicy;

/// Options for [`GitLabClient::new`].
#[derive(Clone, Default)]
pub struct ClientOptions {
    /// How retryable statuses are retried.
    pub retry: RetryPolicy,
    /// Optional observer of every HTTP attempt (`runway run` counts them in its metrics).
    pub hook: Option<RequestHook>,
    /// `tls-ca-file`: extra PEM CA certificates to trust (self-managed GitLab with a
    /// private CA).
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// `tls-cert-file` + `tls-key-file`: a PEM client certificate and key.
    pub tls_client_cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl GitLabClient {
    /// A client with `options`; fails when a TLS file cannot be read or parsed.
    pub fn new(options: ClientOptions) -> Result<Self, ApiError> {
        let http = Self::http_client(&options, reqwest::redirect::Policy::default())?;
        let no_redirect = Self::http_client(&options, reqwest::redirect::Policy::none())?;
        Ok(GitLabClient {
            http,
            no_redirect,
            retry: options.retry,
            hook: options.hook,
            user_agent: buildinfo::user_agent(),
            last_update: Mutex::new(HashMap::new()),
        })
    }

    fn http_client(options: &ClientOptions, redirect: reqwest::redirect::Policy) -> Result<reqwest::Client, ApiError> {
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .tcp_keepalive(Duration::from_secs(30))
            .pool_idle_timeout(Duration::from_secs(90))
            .timeout(Duration::from_secs(60 * 60))
            .redirect(redirect);
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|e| ApiError::ClientSetup(format!("{}: {e}", path.display())))
        };
        if let Some(ca) = &options.tls_ca_file {
            let pem = read(ca)?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| ApiError::ClientSetup(format!("tls-ca-file {}: {e}", ca.display())))?;
            if certs.is_empty() {
                return Err(ApiError::ClientSetup(format!("tls-ca-file {}: no PEM certificates in it", ca.display())));
            }
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        if let Some((cert, key)) = &options.tls_client_cert {
            let mut pem = read(cert)?;
            pem.push(b'\n');
            pem.extend(read(key)?);
            let identity = reqwest::Identity::from_pem(&pem)
                .map_err(|e| ApiError::ClientSetup(format!("tls-cert-file/tls-key-file: {e}")))?;
            builder = builder.identity(identity);
        }
        builder.build().map_err(|e| ApiError::ClientSetup(describe_reqwest_error(&e)))
    }
}
