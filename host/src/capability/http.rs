//! Outgoing HTTP (`wasi:http/outgoing-handler`) filtered by the plugin's `allow_hosts`.
//!
//! Deny by default: a plugin with no `allow_hosts` can reach nothing. The entries were parsed
//! when the config was loaded ([`AllowedHosts`]: `host`, `host:port`, `*.domain`, `[ipv6]`);
//! each request's host and port are matched against them structurally.
//!
//! Owns: [`HttpPolicy`] (the `wasi:http` hooks of one plugin instance). Must not touch:
//! plugins or stores (the plugin host hands it to wasmtime-wasi-http as its hooks), the
//! grant's syntax (`crate::config::hosts`).

use std::sync::Arc;

use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use crate::config::hosts::AllowedHosts;

/// The allow-list of one plugin instance.
pub struct HttpPolicy {
    plugin: Arc<str>,
    allow: Arc<AllowedHosts>,
}

impl HttpPolicy {
    /// A policy for `plugin` allowing the hosts of its grant.
    pub fn new(plugin: Arc<str>, allow: Arc<AllowedHosts>) -> Self {
        HttpPolicy { plugin, allow }
    }

    /// Is `host` (as the request's URI names it, with its explicit `port`) allowed?
    pub fn allows(&self, host: &str, port: Option<u16>) -> bool {
        self.allow.allows(host, port)
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
        let hosts = ["api.example.com".into(), "*.amazonaws.com".into(), "127.0.0.1:8080".into()];
        let policy = HttpPolicy::new("p".into(), Arc::new(AllowedHosts::parse(&hosts).expect("valid")));
        assert!(policy.allows("api.example.com", None));
        assert!(policy.allows("API.example.com", Some(443)));
        assert!(policy.allows("ec2.us-east-1.amazonaws.com", Some(443)));
        assert!(!policy.allows("amazonaws.com.evil.net", None));
        assert!(policy.allows("127.0.0.1", Some(8080)));
        assert!(!policy.allows("127.0.0.1", Some(8081)));
        assert!(!HttpPolicy::new("p".into(), Arc::default()).allows("example.com", None));
    }
}
