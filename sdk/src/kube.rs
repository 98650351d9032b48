//! Kubernetes API servers (API 0.5; needs the `allow_kubernetes` grant). The plugin speaks the
//! Kubernetes REST API's JSON through [`Cluster::request`] and [`Cluster::watch`]; the host
//! resolves the configuration, holds the credentials, and streams what runs in a pod's
//! containers straight into the job log ([`Cluster::attach`]).

use crate::bindings::executor::runway::host0_5_0::kube as wit;
pub use crate::bindings::executor::runway::host0_5_0::kube::{ApiError, ClusterConfig, KubeError, Response, Target};
pub use crate::process::{ExitStatus, Output};

/// A connection to one API server.
pub struct Cluster {
    inner: wit::Cluster,
}

impl Cluster {
    /// Resolve `config` (explicit host, else in-cluster, else kubeconfig) and check the server
    /// answers.
    pub fn connect(config: &ClusterConfig) -> Result<Cluster, KubeError> {
        Ok(Cluster { inner: wit::Cluster::connect(config)? })
    }
    /// The WIT resource, for interfaces that take a cluster.
    pub(crate) fn wit(&self) -> &wit::Cluster {
        &self.inner
    }
    /// Where the configuration came from, for the job log.
    pub fn source(&self) -> String {
        self.inner.source()
    }
    /// One REST call with a JSON body (or none); any HTTP status is a response.
    pub fn request(&self, method: &str, path: &str, body: Option<&[u8]>) -> Result<Response, KubeError> {
        self.inner.request(method, path, body, None)
    }
    /// One REST call with a body of another type (`application/merge-patch+json`, ...).
    pub fn request_with(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
        content_type: &str,
    ) -> Result<Response, KubeError> {
        self.inner.request(method, path, Some(body), Some(content_type))
    }
    /// Watch the collection at `path` (with its query) from `resource_version` (empty: the
    /// current state first, as ADDED events).
    pub fn watch(&self, path: &str, resource_version: &str) -> Result<Watch, KubeError> {
        Ok(Watch { inner: self.inner.watch(path, resource_version)? })
    }
    /// Run `script` with `sh -c` in a container, its output captured (for probes).
    pub fn run_captured(
        &self,
        target: &Target,
        script: &str,
        stdin: Option<&[u8]>,
        max_bytes: u32,
    ) -> Result<Output, KubeError> {
        self.inner.run_captured(target, script, stdin, max_bytes)
    }
    /// Start `command` detached in a container: output to `log_path`, exit code to
    /// `exit_path` (both in the container), `stdin` on its standard input.
    pub fn start_detached(
        &self,
        target: &Target,
        command: &str,
        stdin: &[u8],
        log_path: &str,
        exit_path: &str,
    ) -> Result<(), KubeError> {
        self.inner.start_detached(target, command, stdin, log_path, exit_path)
    }
    /// Follow a detached command into the job log from `offset` until it ends; its status.
    pub fn attach(
        &self,
        target: &Target,
        log_path: &str,
        exit_path: &str,
        offset: u64,
    ) -> Result<ExitStatus, KubeError> {
        self.inner.attach(target, log_path, exit_path, offset)
    }
}

/// A watch stream (reconnected by the host from the last `resourceVersion` it saw).
pub struct Watch {
    inner: wit::Watch,
}

impl Watch {
    /// The next event's JSON, `None` when `timeout_ms` passed without one.
    pub fn next(&self, timeout_ms: u32) -> Result<Option<String>, KubeError> {
        self.inner.next(timeout_ms)
    }
}

/// Percent-encode a query parameter value (label and field selectors).
pub fn query_escape(value: &str) -> String {
    crate::docker::query_escape(value)
}
