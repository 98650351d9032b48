//! The Engine API calls the executor makes, over the host's `docker` capability: one method
//! per endpoint, JSON in and out, 404s turned into `None` where a missing object is an answer,
//! and the mapping of [`DockerError`] to [`ExecutorError`]. Decides nothing about the job.

use std::collections::BTreeMap;

use docker_logic::spec;
use runway_sdk::docker::{query_escape, DockerError, Engine, RegistryAuth};
use runway_sdk::executor::ExecutorError;
use serde_json::Value;

/// A connected engine.
pub struct Api {
    engine: Engine,
}

/// `what` failed with `e`, as the executor reports it: connection problems make the engine
/// unavailable, a missing grant is the runner's configuration, cancellation ends the job.
pub fn executor_error(e: DockerError, what: &str) -> ExecutorError {
    match e {
        DockerError::NotPermitted(m) => ExecutorError::InvalidConfig(format!(
            "{what}: the docker plugin may not use this engine ({m}); name it in allow_docker of [plugins.docker]"
        )),
        DockerError::Connection(m) => {
            ExecutorError::Unavailable(format!("{what}: cannot reach the Docker engine: {m}"))
        }
        DockerError::Api(a) => ExecutorError::Other(format!("{what}: {} (HTTP {})", a.message.trim(), a.status)),
        DockerError::Canceled => ExecutorError::Canceled,
        DockerError::TooLarge(limit) => ExecutorError::Other(format!("{what}: more than {limit} bytes")),
        DockerError::Other(m) => ExecutorError::Other(format!("{what}: {m}")),
    }
}

/// The engine's message for `e`, for job log lines.
pub fn message(e: &DockerError) -> String {
    match e {
        DockerError::NotPermitted(m) | DockerError::Connection(m) | DockerError::Other(m) => m.clone(),
        DockerError::Api(a) => format!("{} (HTTP {})", a.message.trim(), a.status),
        DockerError::Canceled => "canceled".into(),
        DockerError::TooLarge(limit) => format!("more than {limit} bytes"),
    }
}

fn is_status(e: &DockerError, status: u16) -> bool {
    matches!(e, DockerError::Api(a) if a.status == status)
}

/// Ok for `Ok` and for an API error with `status` (a 404 on removal, a 304 on start).
fn tolerate(result: Result<(), DockerError>, status: u16) -> Result<(), DockerError> {
    match result {
        Err(e) if is_status(&e, status) => Ok(()),
        other => other,
    }
}

impl Api {
    /// Connect to `host` (empty: the host's default) with TLS settings.
    pub fn connect(host: &str, tls_verify: bool, tls_cert_path: &str) -> Result<Api, DockerError> {
        let endpoint = runway_sdk::docker::Endpoint {
            host: host.to_string(),
            tls_verify,
            tls_cert_path: tls_cert_path.to_string(),
        };
        Ok(Api { engine: Engine::connect(&endpoint)? })
    }

    /// The engine connection (pull, follow, helper image).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, DockerError> {
        let bytes = body.map(|b| b.to_string().into_bytes());
        let response = self.engine.request(method, path, bytes.as_deref())?;
        if response.body.is_empty() {
            return Ok(Value::Null);
        }
        // Some answers are not JSON (a 204, plain text); the callers that need fields check them.
        Ok(serde_json::from_slice(&response.body).unwrap_or(Value::Null))
    }

    fn unit(&self, method: &str, path: &str, body: Option<&Value>) -> Result<(), DockerError> {
        self.call(method, path, body).map(|_| ())
    }

    fn optional(&self, path: &str) -> Result<Option<Value>, DockerError> {
        match self.call("GET", path, None) {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_status(&e, 404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `GET /images/{name}/json`; `None` when the engine does not have the image.
    pub fn inspect_image(&self, name: &str) -> Result<Option<Value>, DockerError> {
        self.optional(&format!("/images/{name}/json"))
    }

    /// Pull `reference`, with credentials.
    pub fn pull(&self, reference: &str, auth: Option<&RegistryAuth>) -> Result<(), DockerError> {
        self.engine.pull(reference, auth)
    }

    /// `POST path` without a body; the answer's raw body.
    pub fn post_raw(&self, path: &str) -> Result<Vec<u8>, DockerError> {
        Ok(self.engine.request("POST", path, None)?.body)
    }

    /// Every line a container wrote so far (stdout and stderr, with timestamps), as text.
    pub fn logs_all(&self, id: &str) -> Result<String, DockerError> {
        let path = format!("/containers/{id}/logs?stdout=1&stderr=1&timestamps=1");
        let response = self.engine.request("GET", &path, None)?;
        Ok(docker_logic::archive::demux_logs(&response.body))
    }

    /// `GET /containers/{name}/json`; `None` when there is no such container.
    pub fn inspect_container(&self, name: &str) -> Result<Option<Value>, DockerError> {
        self.optional(&format!("/containers/{name}/json"))
    }

    /// `POST /containers/create?name=…`; the new container's ID.
    pub fn create_container(&self, name: &str, body: &Value) -> Result<String, DockerError> {
        let answer = self.call("POST", &format!("/containers/create?name={}", query_escape(name)), Some(body))?;
        match answer["Id"].as_str() {
            Some(id) => Ok(id.to_string()),
            None => Err(DockerError::Other(format!("the engine created container {name} but sent no ID"))),
        }
    }

    /// `PUT /containers/{id}/archive?path=/`: unpack `tar` at the container's root.
    pub fn upload(&self, id: &str, tar: &[u8]) -> Result<(), DockerError> {
        self.engine
            .request_with("PUT", &format!("/containers/{id}/archive?path=/"), tar, "application/x-tar")
            .map(|_| ())
    }

    /// `POST /containers/{id}/start` (already started is fine).
    pub fn start(&self, id: &str) -> Result<(), DockerError> {
        tolerate(self.unit("POST", &format!("/containers/{id}/start"), None), 304)
    }

    /// `POST /containers/{id}/wait`: the exit code once the container stops.
    pub fn wait(&self, id: &str) -> Result<i32, DockerError> {
        let answer = self.call("POST", &format!("/containers/{id}/wait"), None)?;
        if let Some(message) = answer["Error"]["Message"].as_str().filter(|m| !m.is_empty()) {
            return Err(DockerError::Other(format!("waiting for container {id}: {message}")));
        }
        match answer["StatusCode"].as_i64() {
            Some(code) => Ok(code as i32),
            None => Err(DockerError::Other(format!("the engine's wait answer for container {id} has no StatusCode"))),
        }
    }

    /// `POST /containers/{id}/kill`, best effort (the container may have stopped).
    pub fn kill(&self, id: &str) {
        let _ = self.unit("POST", &format!("/containers/{id}/kill"), None);
    }

    /// `DELETE /containers/{id}?force=1&v=1` (its anonymous volumes too); gone already is fine.
    pub fn remove_container(&self, id: &str) -> Result<(), DockerError> {
        tolerate(self.unit("DELETE", &format!("/containers/{id}?force=1&v=1"), None), 404)
    }

    /// The IDs of every container (running or not) matching `filters` (a JSON filter map).
    pub fn list_containers(&self, filters: &str) -> Result<Vec<String>, DockerError> {
        let answer = self.call("GET", &format!("/containers/json?all=1&filters={}", query_escape(filters)), None)?;
        Ok(ids(&answer, "Id"))
    }

    /// The names of every volume matching `filters`.
    pub fn list_volumes(&self, filters: &str) -> Result<Vec<String>, DockerError> {
        let answer = self.call("GET", &format!("/volumes?filters={}", query_escape(filters)), None)?;
        Ok(ids(&answer["Volumes"], "Name"))
    }

    /// The last `lines` lines of a container's output, as text.
    pub fn logs_tail(&self, id: &str, lines: u32) -> Result<String, DockerError> {
        let path = format!("/containers/{id}/logs?stdout=1&stderr=1&timestamps=1&tail={lines}");
        let response = self.engine.request("GET", &path, None)?;
        Ok(docker_logic::archive::demux_logs(&response.body))
    }

    /// `POST /networks/create`; an existing network of that name is reused.
    pub fn create_network(&self, name: &str, labels: &BTreeMap<String, String>) -> Result<(), DockerError> {
        tolerate(self.unit("POST", "/networks/create", Some(&spec::network_body(name, labels))), 409)
    }

    /// `DELETE /networks/{name}`; gone already is fine.
    pub fn remove_network(&self, name: &str) -> Result<(), DockerError> {
        tolerate(self.unit("DELETE", &format!("/networks/{name}"), None), 404)
    }

    /// `POST /volumes/create` (idempotent: an existing volume is returned as it is).
    pub fn create_volume(&self, name: &str, labels: &BTreeMap<String, String>) -> Result<(), DockerError> {
        self.unit("POST", "/volumes/create", Some(&spec::volume_body(name, labels)))
    }

    /// `DELETE /volumes/{name}`; gone already is fine.
    pub fn remove_volume(&self, name: &str) -> Result<(), DockerError> {
        tolerate(self.unit("DELETE", &format!("/volumes/{name}"), None), 404)
    }
}

fn ids(list: &Value, key: &str) -> Vec<String> {
    list.as_array()
        .map(|items| items.iter().filter_map(|c| c[key].as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}
