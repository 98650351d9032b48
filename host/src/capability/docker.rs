//! `runway:host/docker`: Docker Engine API endpoints for container executors.
//!
//! The plugin names an endpoint; [`DockerPolicy`] (parsed once from the plugin's
//! `allow_docker` grant) decides whether it may reach it; the connector's [`DockerClient`]
//! carries the requests and streams container output into the job's trace. On a job with a fleet
//! instance (`docker-autoscaler`) the endpoint is a unix socket on the instance, reached through
//! the instance's SSH session, and the grant must allow `"instance"`.
//!
//! Owns: [`DockerPolicy`] (and [`DockerGrantError`]), [`DockerCtx`] (policy, buffer limit, the
//! helper image importer, [`HelperImageError`] when it cannot build the image),
//! [`DockerView`] and the `docker` host traits on it, the engine handles in the resource table.
//! Must not touch: plugins or stores (the plugin host projects its store data onto a
//! [`DockerView`]), connections (the connector owns them).

use std::sync::Arc;

use base64::Engine as _;
use wasmtime::component::{HasData, Resource, ResourceTable};

use crate::bindings::executor::runway::host0_2_0::docker::{
    ApiError, DockerError, Endpoint, Engine, Host, HostEngine, RegistryAuth, Response,
};
use crate::capability::call::{CallBudget, CallContext};
use crate::connector::docker::{self as engine, Body, DockerClient, EngineAddress, StageStreams, Transport};

/// What `allow_docker` allows, parsed once: endpoints by their canonical address
/// (`unix:///path`, `tcp://host:port`), the engine on a job's fleet instance (`"instance"`), or
/// everything (`"*"`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DockerPolicy {
    any: bool,
    instance: bool,
    endpoints: Vec<String>,
}

impl DockerPolicy {
    /// Parse a grant's `allow_docker` list; an entry that is not an address, `instance` or `*`
    /// is an error naming it.
    pub fn parse(entries: &[String]) -> Result<DockerPolicy, DockerGrantError> {
        let mut policy = DockerPolicy::default();
        for entry in entries {
            match entry.trim() {
                "*" => policy.any = true,
                "instance" => policy.instance = true,
                other => {
                    let address = engine::endpoint::parse_address(other).map_err(DockerGrantError)?;
                    let canonical = EngineAddress { address, tls_dir: None }.canonical();
                    policy.endpoints.push(canonical);
                }
            }
        }
        Ok(policy)
    }

    /// May the plugin reach `address` on the runner's machine (or the network)?
    pub fn allows_local(&self, address: &EngineAddress) -> bool {
        self.any || self.endpoints.contains(&address.canonical())
    }

    /// May the plugin reach the engine on a job's fleet instance?
    pub fn allows_instance(&self) -> bool {
        self.any || self.instance
    }

    /// Does the grant allow anything at all?
    pub fn is_empty(&self) -> bool {
        !self.any && !self.instance && self.endpoints.is_empty()
    }
}

/// An `allow_docker` entry that is no engine address (the text names it).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DockerGrantError(engine::DockerError);

/// Why Runway's helper image could not be built (read by a person, in the job log). Clones
/// share the cause, so a failed build can be kept and reported to every job that needs it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct HelperImageError(Arc<dyn std::error::Error + Send + Sync>);

impl HelperImageError {
    /// The build failed with `cause`.
    pub fn new(cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        HelperImageError(Arc::new(cause))
    }
}

/// What builds Runway's helper image: its reference and root filesystem tar.
type BuildHelper = dyn Fn() -> Result<(String, bytes::Bytes), HelperImageError> + Send + Sync;

/// Builds Runway's helper image for an engine that lacks it (the runner wires the connector's
/// root filesystem builder in; tests may give their own).
#[derive(Clone)]
pub struct HelperImageSource(Arc<BuildHelper>);

impl HelperImageSource {
    /// A source that runs `build`.
    pub fn new(build: impl Fn() -> Result<(String, bytes::Bytes), HelperImageError> + Send + Sync + 'static) -> Self {
        HelperImageSource(Arc::new(build))
    }

    fn build(&self) -> Result<(String, bytes::Bytes), HelperImageError> {
        (self.0)()
    }
}

impl std::fmt::Debug for HelperImageSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HelperImageSource")
    }
}

/// The `docker` capability's own state.
pub struct DockerCtx {
    policy: DockerPolicy,
    max_buffer: usize,
    helper: Option<HelperImageSource>,
}

impl DockerCtx {
    /// The capability under `policy`, buffering at most `max_buffer` bytes per answer, with
    /// `helper` to build Runway's helper image.
    pub fn new(policy: DockerPolicy, max_buffer: usize, helper: Option<HelperImageSource>) -> Self {
        DockerCtx { policy, max_buffer, helper }
    }

    /// Most bytes buffered per answer.
    pub(crate) fn max_buffer(&self) -> usize {
        self.max_buffer
    }
}

/// One open engine (the resource behind `engine`).
pub struct EngineHandle {
    client: DockerClient,
    /// The streams of stages started through this handle (`docker-stages`).
    streams: StageStreams,
}

impl EngineHandle {
    /// The engine's client.
    pub fn client(&self) -> &DockerClient {
        &self.client
    }
}

/// The `docker` capability as one call sees it.
pub struct DockerView<'a> {
    /// The policy and limits.
    pub ctx: &'a DockerCtx,
    /// The job the call works for (its trace, stop signal and fleet instance).
    pub call: &'a CallContext,
    /// The call's budget: time waiting on the engine does not count.
    pub budget: &'a CallBudget,
    /// Where engine handles live.
    pub table: &'a mut ResourceTable,
}

/// [`HasData`] marker linking `docker` to a [`DockerView`].
pub struct HasDocker;

impl HasData for HasDocker {
    type Data<'a> = DockerView<'a>;
}

/// The WIT error of an engine failure.
pub(crate) fn wit_error(error: engine::DockerError) -> DockerError {
    match error {
        engine::DockerError::Connection(m) => DockerError::Connection(m),
        engine::DockerError::Api { status, message } => DockerError::Api(ApiError { status, message }),
        engine::DockerError::Canceled => DockerError::Canceled,
        engine::DockerError::TooLarge(limit) => DockerError::TooLarge(limit),
        engine::DockerError::Other(m) => DockerError::Other(m),
    }
}

/// `X-Registry-Auth`: base64url of the credentials' JSON.
fn registry_auth(auth: &RegistryAuth) -> String {
    let json = serde_json::json!({
        "username": auth.username,
        "password": auth.password,
        "serveraddress": auth.server_address,
    });
    base64::engine::general_purpose::URL_SAFE.encode(json.to_string())
}

impl DockerView<'_> {
    /// The client of engine handle `engine`.
    pub(crate) fn client(&self, engine: &Resource<Engine>) -> wasmtime::Result<DockerClient> {
        let handle: Resource<EngineHandle> = Resource::new_borrow(engine.rep());
        Ok(self.table.get(&handle)?.client.clone())
    }

    /// The client of `engine` and the streams of the stages started through it.
    pub(crate) fn client_and_streams(
        &self,
        engine: &Resource<Engine>,
    ) -> wasmtime::Result<(DockerClient, StageStreams)> {
        let handle: Resource<EngineHandle> = Resource::new_borrow(engine.rep());
        let handle = self.table.get(&handle)?;
        Ok((handle.client.clone(), handle.streams.clone()))
    }

    /// The transport to `endpoint`, if the grant allows it.
    fn transport(&self, endpoint: &Endpoint) -> Result<Transport, DockerError> {
        if let Some(session) = &self.call.remote {
            if !self.ctx.policy.allows_instance() {
                return Err(DockerError::NotPermitted(
                    "the engine on the job's instance: the plugin's allow_docker grant does not name \"instance\""
                        .into(),
                ));
            }
            let host = if endpoint.host.trim().is_empty() {
                format!("unix://{}", engine::endpoint::DEFAULT_SOCKET)
            } else {
                endpoint.host.clone()
            };
            return match engine::endpoint::parse_address(&host).map_err(wit_error)? {
                engine::Address::Unix(path) => {
                    Ok(Transport::Remote { session: session.clone(), path: path.display().to_string() })
                }
                engine::Address::Tcp { .. } => Err(DockerError::Other(format!(
                    "Docker host {host:?}: on a fleet instance the engine is reached through its unix socket"
                ))),
            };
        }
        let env = |key: &str| std::env::var(key).ok();
        let address = EngineAddress::resolve(&endpoint.host, endpoint.tls_verify, &endpoint.tls_cert_path, &env)
            .map_err(wit_error)?;
        if !self.ctx.policy.allows_local(&address) {
            return Err(DockerError::NotPermitted(format!(
                "{}: not in the plugin's allow_docker grant",
                address.canonical()
            )));
        }
        Transport::local(&address).map_err(wit_error)
    }
}

impl Host for DockerView<'_> {}

impl HostEngine for DockerView<'_> {
    async fn connect(&mut self, endpoint: Endpoint) -> wasmtime::Result<Result<Resource<Engine>, DockerError>> {
        let transport = match self.transport(&endpoint) {
            Ok(t) => t,
            Err(e) => return Ok(Err(e)),
        };
        let stop = self.call.stop.clone();
        let client = match self.budget.in_host(DockerClient::connect(transport, &stop)).await {
            Ok(client) => client,
            Err(e) => return Ok(Err(wit_error(e))),
        };
        let handle = self.table.push(EngineHandle { client, streams: StageStreams::default() })?;
        Ok(Ok(Resource::new_own(handle.rep())))
    }

    async fn api_version(&mut self, engine: Resource<Engine>) -> wasmtime::Result<String> {
        Ok(self.client(&engine)?.api_version().to_string())
    }

    async fn request(
        &mut self,
        engine: Resource<Engine>,
        method: String,
        path: String,
        body: Option<Vec<u8>>,
        content_type: Option<String>,
    ) -> wasmtime::Result<Result<Response, DockerError>> {
        let client = self.client(&engine)?;
        if body.as_ref().is_some_and(|b| b.len() > self.ctx.max_buffer) {
            return Ok(Err(DockerError::TooLarge(u32::try_from(self.ctx.max_buffer).unwrap_or(u32::MAX))));
        }
        let body = body.map(|data| Body { data: data.into(), content_type });
        let stop = self.call.stop.clone();
        let result = self.budget.in_host(client.request(&method, &path, body, &[], self.ctx.max_buffer, &stop)).await;
        Ok(result.map(|(status, body)| Response { status, body }).map_err(wit_error))
    }

    async fn pull(
        &mut self,
        engine: Resource<Engine>,
        image: String,
        auth: Option<RegistryAuth>,
    ) -> wasmtime::Result<Result<(), DockerError>> {
        let client = self.client(&engine)?;
        let stop = self.call.stop.clone();
        let auth = auth.as_ref().map(registry_auth);
        Ok(self.budget.in_host(client.pull(&image, auth, &stop)).await.map_err(wit_error))
    }

    async fn follow(
        &mut self,
        engine: Resource<Engine>,
        container: String,
        offset: u64,
    ) -> wasmtime::Result<Result<(), DockerError>> {
        let client = self.client(&engine)?;
        let Some(trace) = self.call.trace.clone() else {
            return Ok(Err(DockerError::Other("following a container needs a job".into())));
        };
        let stop = self.call.stop.clone();
        Ok(self.budget.in_host(client.follow(&container, offset, &*trace, &stop)).await.map_err(wit_error))
    }

    async fn helper_image(&mut self, engine: Resource<Engine>) -> wasmtime::Result<Result<String, DockerError>> {
        let client = self.client(&engine)?;
        let Some(source) = self.ctx.helper.clone() else {
            return Ok(Err(DockerError::Other("this runner provides no helper image; set helper_image".into())));
        };
        let stop = self.call.stop.clone();
        let result = self.budget.in_host(ensure_helper_image(&client, source, &stop)).await;
        Ok(result.map_err(wit_error))
    }

    async fn drop(&mut self, engine: Resource<Engine>) -> wasmtime::Result<()> {
        let handle: Resource<EngineHandle> = Resource::new_own(engine.rep());
        self.table.delete(handle)?;
        Ok(())
    }
}

/// The helper image on `client`'s engine: inspected, and imported from `source` when missing.
async fn ensure_helper_image(
    client: &DockerClient,
    source: HelperImageSource,
    stop: &crate::stop::StopSignal,
) -> Result<String, engine::DockerError> {
    let built = tokio::task::spawn_blocking(move || source.build())
        .await
        .map_err(|e| engine::DockerError::Other(format!("building the helper image: {e}")))?
        .map_err(|e| engine::DockerError::Other(format!("building the helper image: {e}")))?;
    let (reference, tar) = built;
    let inspect = format!("/images/{}/json", engine::client::query_escape(&reference));
    match client.request("GET", &inspect, None, &[], 4 << 20, stop).await {
        Ok(_) => return Ok(reference),
        Err(engine::DockerError::Api { status: 404, .. }) => {}
        Err(e) => return Err(e),
    }
    client.import(&reference, tar, stop).await?;
    Ok(reference)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(host: &str) -> EngineAddress {
        EngineAddress::resolve(host, false, "", &|_| None).expect("address")
    }

    #[test]
    fn the_grant_names_what_a_plugin_reaches() {
        let none = DockerPolicy::parse(&[]).expect("empty");
        assert!(none.is_empty() && !none.allows_local(&addr("")) && !none.allows_instance());
        let some = DockerPolicy::parse(&["unix:///run/d.sock".into(), "tcp://10.0.0.1:2376".into()]).expect("list");
        assert!(some.allows_local(&addr("unix:///run/d.sock")));
        assert!(some.allows_local(&addr("/run/d.sock")), "a bare path is the same socket");
        assert!(some.allows_local(&addr("tcp://10.0.0.1:2376")));
        assert!(!some.allows_local(&addr("tcp://10.0.0.1:2375")));
        assert!(!some.allows_local(&addr("")), "the default socket is not granted");
        assert!(!some.allows_instance());
        let instance = DockerPolicy::parse(&["instance".into()]).expect("instance");
        assert!(instance.allows_instance() && !instance.allows_local(&addr("")));
        let any = DockerPolicy::parse(&["*".into()]).expect("any");
        assert!(any.allows_local(&addr("tcp://h:1")) && any.allows_instance());
        let err = DockerPolicy::parse(&["ssh://x".into()]).expect_err("bad entry");
        assert!(err.to_string().contains("ssh://x"), "{err}");
    }

    #[test]
    fn registry_auth_is_base64url_json() {
        let auth = RegistryAuth { username: "u".into(), password: "p?".into(), server_address: "r:5000".into() };
        let decoded = base64::engine::general_purpose::URL_SAFE.decode(registry_auth(&auth)).expect("base64");
        let json: serde_json::Value = serde_json::from_slice(&decoded).expect("json");
        assert_eq!((json["username"].as_str(), json["serveraddress"].as_str()), (Some("u"), Some("r:5000")));
    }
}
