//! `runway:host/kube`: Kubernetes API servers for executors that run jobs in pods.
//!
//! The plugin says how to reach the server as `[runners.kubernetes]` does; the connector's
//! [`KubeClient`] resolves it (explicit host, in-cluster, kubeconfig), holds the credentials and
//! carries REST calls, watches and `pods/exec` streams. A stage runs detached in a container
//! through the connector's [`PodShell`] and `connector::detached`, the same code that runs
//! stages on SSH instances, so its output goes from the pod into the job's trace without
//! crossing into the plugin, and a restarted runner follows it again from its offset. Granted
//! by `allow_kubernetes = true` in `[plugins.NAME]`.
//!
//! Owns: [`KubeCtx`] (the grant and the buffer limit), [`KubeView`] and the `kube` host traits
//! on it, the cluster and watch handles in the resource table. Must not touch: plugins or
//! stores (the plugin host projects its store data onto a [`KubeView`]), connections (the
//! connector owns them).

use std::time::Duration;

use wasmtime::component::{HasData, Resource, ResourceTable};

use crate::bindings::executor::runway::host0_1_0::process::{ExitStatus, Output};
use crate::bindings::executor::runway::host0_5_0::kube::{
    ApiError, Cluster, ClusterConfig, Host, HostCluster, HostWatch, KubeError, Response, Target, Watch,
};
use crate::capability::call::{CallBudget, CallContext};
use crate::capability::remote::wit_status;
use crate::connector::detached;
use crate::connector::kube::exec::{kube_error, ContainerRef};
use crate::connector::kube::{self as connector, ClusterSettings, KubeClient, PodShell, WatchStream};

/// Most bytes `run-captured` keeps, whatever the plugin asks.
const MAX_CAPTURE: usize = 1 << 20;

/// The `kube` capability's own state.
pub struct KubeCtx {
    allowed: bool,
    max_buffer: usize,
}

impl KubeCtx {
    /// The capability for a plugin with (`allowed`) or without the `allow_kubernetes` grant,
    /// buffering at most `max_buffer` bytes per answer.
    pub fn new(allowed: bool, max_buffer: usize) -> Self {
        KubeCtx { allowed, max_buffer }
    }
}

/// One open cluster (the resource behind `cluster`).
pub struct ClusterHandle {
    client: KubeClient,
}

impl ClusterHandle {
    /// The cluster's client.
    pub fn client(&self) -> &KubeClient {
        &self.client
    }
}

/// One open watch (the resource behind `watch`).
pub struct WatchHandle {
    stream: WatchStream,
}

/// The `kube` capability as one call sees it.
pub struct KubeView<'a> {
    /// The grant and limits.
    pub ctx: &'a KubeCtx,
    /// The job the call works for (its trace and stop signal).
    pub call: &'a CallContext,
    /// The call's budget: time waiting on the server does not count.
    pub budget: &'a CallBudget,
    /// Where cluster and watch handles live.
    pub table: &'a mut ResourceTable,
}

/// [`HasData`] marker linking `kube` to a [`KubeView`].
pub struct HasKube;

impl HasData for HasKube {
    type Data<'a> = KubeView<'a>;
}

/// The WIT error of a connector failure.
fn wit_error(error: connector::KubeError) -> KubeError {
    match error {
        connector::KubeError::Config(m) => KubeError::Config(m),
        connector::KubeError::Connection(m) => KubeError::Connection(m),
        connector::KubeError::Api { status, reason, message } => KubeError::Api(ApiError { status, reason, message }),
        connector::KubeError::Canceled => KubeError::Canceled,
        connector::KubeError::TooLarge(limit) => KubeError::TooLarge(limit),
        connector::KubeError::Other(m) => KubeError::Other(m),
    }
}

/// The WIT output of a script captured by `ShellHost::capture`: its exit code and at most
/// `limit` bytes of output (more were there when `truncated`).
pub(crate) fn captured(code: i32, mut stdout: Vec<u8>, limit: usize) -> Output {
    let truncated = stdout.len() > limit;
    stdout.truncate(limit);
    Output { status: wit_status(crate::connector::ExitStatus::from_code(code)), stdout, stderr: Vec::new(), truncated }
}

fn container(target: &Target) -> ContainerRef {
    ContainerRef { namespace: target.namespace.clone(), pod: target.pod.clone(), container: target.container.clone() }
}

impl KubeView<'_> {
    fn client(&self, cluster: &Resource<Cluster>) -> wasmtime::Result<KubeClient> {
        let handle: Resource<ClusterHandle> = Resource::new_borrow(cluster.rep());
        Ok(self.table.get(&handle)?.client.clone())
    }

    fn shell(&self, cluster: &Resource<Cluster>, target: &Target) -> wasmtime::Result<PodShell> {
        Ok(PodShell::new(self.client(cluster)?, container(target)))
    }

    fn permitted(&self) -> Result<(), KubeError> {
        if self.ctx.allowed {
            Ok(())
        } else {
            Err(KubeError::NotPermitted("Kubernetes API servers: the plugin has no allow_kubernetes grant".into()))
        }
    }
}

impl Host for KubeView<'_> {}

impl HostCluster for KubeView<'_> {
    async fn connect(&mut self, config: ClusterConfig) -> wasmtime::Result<Result<Resource<Cluster>, KubeError>> {
        if let Err(e) = self.permitted() {
            return Ok(Err(e));
        }
        let settings = ClusterSettings {
            host: config.host,
            bearer_token: config.bearer_token,
            cert_file: config.cert_file,
            key_file: config.key_file,
            ca_file: config.ca_file,
            context: config.context,
        };
        let stop = self.call.stop.clone();
        let client = match self.budget.in_host(KubeClient::connect(&settings, &stop)).await {
            Ok(client) => client,
            Err(e) => return Ok(Err(wit_error(e))),
        };
        let handle = self.table.push(ClusterHandle { client })?;
        Ok(Ok(Resource::new_own(handle.rep())))
    }

    async fn source(&mut self, cluster: Resource<Cluster>) -> wasmtime::Result<String> {
        Ok(self.client(&cluster)?.endpoint().source.clone())
    }

    async fn request(
        &mut self,
        cluster: Resource<Cluster>,
        method: String,
        path: String,
        body: Option<Vec<u8>>,
        content_type: Option<String>,
    ) -> wasmtime::Result<Result<Response, KubeError>> {
        let client = self.client(&cluster)?;
        let max = self.ctx.max_buffer;
        if body.as_ref().is_some_and(|b| b.len() > max) {
            return Ok(Err(KubeError::TooLarge(u32::try_from(max).unwrap_or(u32::MAX))));
        }
        let stop = self.call.stop.clone();
        let result =
            self.budget.in_host(client.request(&method, &path, body, content_type.as_deref(), max, &stop)).await;
        Ok(result.map(|(status, body)| Response { status, body }).map_err(wit_error))
    }

    async fn watch(
        &mut self,
        cluster: Resource<Cluster>,
        path: String,
        resource_version: String,
    ) -> wasmtime::Result<Result<Resource<Watch>, KubeError>> {
        let client = self.client(&cluster)?;
        let stream = match client.watch(&path, &resource_version) {
            Ok(stream) => stream,
            Err(e) => return Ok(Err(wit_error(e))),
        };
        let handle = self.table.push(WatchHandle { stream })?;
        Ok(Ok(Resource::new_own(handle.rep())))
    }

    async fn run_captured(
        &mut self,
        cluster: Resource<Cluster>,
        target: Target,
        script: String,
        stdin: Option<Vec<u8>>,
        max_bytes: u32,
    ) -> wasmtime::Result<Result<Output, KubeError>> {
        let shell = self.shell(&cluster, &target)?;
        let limit = (max_bytes as usize).min(MAX_CAPTURE).min(self.ctx.max_buffer);
        let result = self.budget.in_host(detached::ShellHost::capture(&shell, &script, stdin.as_deref(), limit)).await;
        Ok(result.map(|(code, stdout)| captured(code, stdout, limit)).map_err(|e| wit_error(kube_error(e))))
    }

    async fn start_detached(
        &mut self,
        cluster: Resource<Cluster>,
        target: Target,
        command: String,
        stdin: Vec<u8>,
        log_path: String,
        exit_path: String,
    ) -> wasmtime::Result<Result<(), KubeError>> {
        let shell = self.shell(&cluster, &target)?;
        let result = self.budget.in_host(shell.start_detached(&command, &stdin, &log_path, &exit_path)).await;
        Ok(result.map_err(|e| wit_error(kube_error(e))))
    }

    async fn attach(
        &mut self,
        cluster: Resource<Cluster>,
        target: Target,
        log_path: String,
        exit_path: String,
        offset: u64,
    ) -> wasmtime::Result<Result<ExitStatus, KubeError>> {
        let shell = self.shell(&cluster, &target)?;
        let trace = self.call.trace_or_discard();
        let stop = self.call.stop.clone();
        let result = self.budget.in_host(shell.attach(&log_path, &exit_path, offset, &*trace, &stop)).await;
        Ok(result.map(wit_status).map_err(|e| wit_error(kube_error(e))))
    }

    async fn drop(&mut self, cluster: Resource<Cluster>) -> wasmtime::Result<()> {
        let handle: Resource<ClusterHandle> = Resource::new_own(cluster.rep());
        self.table.delete(handle)?;
        Ok(())
    }
}

impl HostWatch for KubeView<'_> {
    async fn next(
        &mut self,
        watch: Resource<Watch>,
        timeout_ms: u32,
    ) -> wasmtime::Result<Result<Option<String>, KubeError>> {
        let handle: Resource<WatchHandle> = Resource::new_borrow(watch.rep());
        let stop = self.call.stop.clone();
        let budget = self.budget;
        let stream = &mut self.table.get_mut(&handle)?.stream;
        let result = budget.in_host(stream.next(Duration::from_millis(u64::from(timeout_ms)), &stop)).await;
        Ok(result.map_err(wit_error))
    }

    async fn drop(&mut self, watch: Resource<Watch>) -> wasmtime::Result<()> {
        let handle: Resource<WatchHandle> = Resource::new_own(watch.rep());
        self.table.delete(handle)?;
        Ok(())
    }
}
