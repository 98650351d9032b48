//! Outgoing HTTP (`wasi:http/outgoing-handler`) filtered by the plugin's `allow_hosts`.
//!
//! Deny by default: a plugin with no `allow_hosts` can reach nothing. Patterns are `host`,
//! `host:port` or `*.domain` (any subdomain, any port unless given).
//!
//! Owns: [`HttpPolicy`] (the `wasi:http` hooks of one plugin instance). Must not touch:
//! plugins or stores (the plugin host hands it to wasmtime-wasi-http as its hooks).

use std::sync::Arc;

use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

/// The allow-list of one plugin instance.
pub struct HttpPolicy {
    plugin: Arc<str>,
    allow: Vec<String>,
}

impl HttpPolicy {
    /// A policy for `plugin` allowing `allow_hosts`.
    pub fn new(plugin: Arc<str>, allow_hosts: &[String]) -> Self {
        HttpPolicy { plugin, allow: allow_hosts.iter().map(|h| h.to_ascii_lowercase()).collect() }
    }

    /// Is `host` (with `port`) on the list?
    pub fn allows(&self, host: &str, port: Option<u16>) -> bool {
        let host = host.to_ascii_lowercase();
        self.allow.iter().any(|pattern| {
            let (pat_host, pat_port) = match pattern.rsplit_once(':') {
                Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) => (h, p.parse::<u16>().ok()),
                _ => (pattern.as_str(), None),
            };
            let port_ok = pat_port.is_none() || pat_port == port;
            let host_ok = match pat_host.strip_prefix("*.") {
                Some(domain) => host.ends_with(&format!(".{domain}")),
                None => pat_host == host,
            };
            port_ok && host_ok
        })
    }
}

impl WasiHttpHooks for HttpPolicy {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>,
    ) -> Box<
        dyn std::future::Future<
                Output = Result<
                    (http::Response<WasiBody>, Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>),
                    HttpError,
                >,
            > + Send,
    > {
        let host = request.uri().host().unwrap_or("").to_string();
        let port = request.uri().port_u16();
        if !self.allows(&host, port) {
            tracing::warn!(plugin = &*self.plugin, host, "HTTP request denied: host not in allow_hosts");
            return Box::new(async { Err(HttpError::HttpRequestDenied) });
        }
        let _ = fut;
        Box::new(async move {
            use http_body_util::BodyExt;
            let (response, io) = wasmtime_wasi_http::default_send_request(request, options).await?;
            Ok((
                response.map(BodyExt::boxed_unsync),
                Box::new(io) as Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>,
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_hosts_ports_and_wildcards() {
        let policy =
            HttpPolicy::new("p".into(), &["api.example.com".into(), "*.amazonaws.com".into(), "127.0.0.1:8080".into()]);
        assert!(policy.allows("api.example.com", None));
        assert!(policy.allows("API.example.com", Some(443)));
        assert!(policy.allows("ec2.us-east-1.amazonaws.com", Some(443)));
        assert!(!policy.allows("amazonaws.com.evil.net", None));
        assert!(policy.allows("127.0.0.1", Some(8080)));
        assert!(!policy.allows("127.0.0.1", Some(8081)));
        assert!(!HttpPolicy::new("p".into(), &[]).allows("example.com", None));
    }
}
