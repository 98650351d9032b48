//! Docker Engine API endpoints (needs the `allow_docker` grant naming the endpoint). The
//! plugin speaks the Engine API's JSON through [`Engine::request`]; the host carries it and
//! streams container output straight into the job log ([`Engine::follow`]).

use crate::bindings::executor::runway::host0_2_0::docker as wit;
pub use crate::bindings::executor::runway::host0_2_0::docker::{
    ApiError, DockerError, Endpoint, RegistryAuth, Response,
};

/// A connection to one engine.
pub struct Engine {
    inner: wit::Engine,
}

impl Engine {
    /// Connect to `endpoint`: the grant is checked, the engine pinged, the API version settled.
    pub fn connect(endpoint: &Endpoint) -> Result<Engine, DockerError> {
        Ok(Engine { inner: wit::Engine::connect(endpoint)? })
    }
    /// The WIT resource, for interfaces that take an engine.
    pub(crate) fn wit(&self) -> &wit::Engine {
        &self.inner
    }
    /// The API version in use, e.g. `1.41`.
    pub fn api_version(&self) -> String {
        self.inner.api_version()
    }
    /// One request: `path` with its query, without the version prefix; `body` is JSON.
    pub fn request(&self, method: &str, path: &str, body: Option<&[u8]>) -> Result<Response, DockerError> {
        self.inner.request(method, path, body, None)
    }
    /// `PUT /containers/{id}/archive?path=…` and other requests with a non-JSON body.
    pub fn request_with(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
        content_type: &str,
    ) -> Result<Response, DockerError> {
        self.inner.request(method, path, Some(body), Some(content_type))
    }
    /// Pull an image, to the end of its progress stream.
    pub fn pull(&self, image: &str, auth: Option<&RegistryAuth>) -> Result<(), DockerError> {
        self.inner.pull(image, auth)
    }
    /// Stream a started container's output into the job log until it stops (from `offset`, or
    /// past what the job log already holds of it).
    pub fn follow(&self, container: &str, offset: u64) -> Result<(), DockerError> {
        self.inner.follow(container, offset)
    }
    /// Runway's helper image on this engine (imported from the runner's machine on first use).
    pub fn helper_image(&self) -> Result<String, DockerError> {
        self.inner.helper_image()
    }
}

/// Percent-encode a query parameter value (RFC 3986 unreserved characters pass).
pub fn query_escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => out.push(byte as char),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}
