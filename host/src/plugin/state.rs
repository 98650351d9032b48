//! What a plugin's [`wasmtime::Store`] holds: the sandboxed WASI context, each capability's
//! context, memory limits, the call budget and the context of the job the call works for —
//! and how each interface is linked to its part of that state (by projection, as
//! wasmtime-wasi links `WasiCtxView`).
//!
//! Owns: [`PluginState`] and the linkers' projections. Must not touch: what a capability does
//! (that is `crate::capability`), jobs or executors.

use std::sync::Arc;

use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::StoreLimitsBuilder;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::bindings::{executor, fleeting};
use crate::capability::docker::{DockerCtx, DockerPolicy, DockerView, HasDocker, HelperImageSource};
use crate::capability::http::HttpPolicy;
use crate::capability::job::{HasJob, JobView};
use crate::capability::kube::{HasKube, KubeCtx, KubeView};
use crate::capability::kv::{KvCtx, KvStore};
use crate::capability::log::{LogCtx, LogLimiter};
use crate::capability::process::{HasProcess, ProcessCtx, ProcessView};
use crate::capability::remote::{HasRemote, RemoteCtx, RemoteView, StageOutput};
use crate::capability::terminal::{HasTerminal, TerminalView};
use crate::capability::trace::{HasTrace, TraceView};
use crate::capability::{CallBudget, CallContext, TypesOnly};
use crate::config::grant::PluginGrant;
use crate::config::hosts::AllowedHosts;
use crate::plugin::limits::PluginLimits;
use crate::plugin::stderr::StderrTail;

/// Store data of every plugin instance.
pub struct PluginState {
    pub(crate) grant: Arc<PluginGrant>,
    wasi: WasiCtx,
    http: WasiHttpCtx,
    http_policy: HttpPolicy,
    table: ResourceTable,
    pub(crate) limits: PluginLimits,
    pub(crate) budget: Arc<CallBudget>,
    pub(crate) call: CallContext,
    log: LogCtx,
    kv: KvCtx,
    process: ProcessCtx,
    remote: RemoteCtx,
    docker: DockerCtx,
    kube: KubeCtx,
    stderr: StderrTail,
}

/// What every instance of one loaded plugin shares: its kv store, its log budget and its
/// grant's `allow_hosts` (parsed once, when the plugin was loaded).
pub struct SharedByInstances {
    /// The plugin's kv store.
    pub kv: Arc<KvStore>,
    /// The plugin's log budget.
    pub log: Arc<LogLimiter>,
    /// The hosts it may reach over `wasi:http`.
    pub hosts: Arc<AllowedHosts>,
}

impl PluginState {
    /// Store data for one instance of `plugin` under `grant`, with what all its instances
    /// share.
    pub fn new(
        plugin: Arc<str>,
        grant: Arc<PluginGrant>,
        shared: SharedByInstances,
        call: CallContext,
        helper_image: Option<HelperImageSource>,
        stage_output: StageOutput,
    ) -> anyhow::Result<Self> {
        let docker = DockerPolicy::parse(&grant.allow_docker)
            .map_err(|e| anyhow::anyhow!("plugin {plugin}: allow_docker: {e}"))?;
        let stderr = StderrTail::default();
        let mut wasi = WasiCtx::builder();
        // Nothing ambient: no inherited environment, stdio, sockets or filesystem.
        wasi.stderr(stderr.clone());
        wasi.allow_tcp(false).allow_udp(false).allow_ip_name_lookup(false);
        for key in &grant.env {
            if let Ok(value) = std::env::var(key) {
                wasi.env(key, value);
            }
        }
        for dir in &grant.dirs {
            let (host, guest, perms) = crate::config::grant::split_dir(dir);
            let perms =
                if perms.read_only { wasmtime_wasi::FsPerms::ReadOnly } else { wasmtime_wasi::FsPerms::ReadWrite };
            wasi.preopened_dir(host, guest, perms)
                .map_err(|e| anyhow::anyhow!("plugin {plugin}: cannot open granted directory {host}: {e}"))?;
        }
        let memory = usize::try_from(grant.memory_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
        let limits = StoreLimitsBuilder::new()
            .memory_size(memory)
            .instances(64)
            .tables(64)
            .memories(16)
            .trap_on_grow_failure(true)
            .build();
        let limits = PluginLimits::new(limits);
        let mut http = WasiHttpCtx::new();
        http.set_field_size_limit(64 * 1024);
        // Most bytes one host call may buffer for this plugin.
        let max_buffer = usize::try_from(grant.max_buffer_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
        Ok(PluginState {
            http_policy: HttpPolicy::new(plugin.clone(), shared.hosts),
            budget: CallBudget::new(grant.call_timeout),
            log: LogCtx::new(plugin.clone(), shared.log),
            kv: KvCtx::new(shared.kv),
            process: ProcessCtx::new(plugin, grant.allow_process, max_buffer),
            remote: RemoteCtx::new(max_buffer, grant.allow_process, stage_output),
            docker: DockerCtx::new(docker, max_buffer, helper_image),
            kube: KubeCtx::new(grant.allow_kubernetes, max_buffer),
            grant,
            wasi: wasi.build(),
            http,
            table: ResourceTable::new(),
            limits,
            call,
            stderr,
        })
    }

    /// The `log` capability's state.
    fn log(&mut self) -> &mut LogCtx {
        &mut self.log
    }

    /// The `kv` capability's state.
    fn kv(&mut self) -> &mut KvCtx {
        &mut self.kv
    }

    /// The `trace` capability as the current call sees it.
    fn trace(&mut self) -> TraceView<'_> {
        TraceView { trace: self.call.trace.as_ref() }
    }

    /// The `process` capability as the current call sees it.
    fn process(&mut self) -> ProcessView<'_> {
        ProcessView { ctx: &self.process, call: &self.call, budget: &self.budget }
    }

    /// The `remote` capability as the current call sees it.
    fn remote(&mut self) -> RemoteView<'_> {
        RemoteView { ctx: &self.remote, call: &self.call, budget: &self.budget }
    }

    /// The `docker` capability as the current call sees it.
    fn docker(&mut self) -> DockerView<'_> {
        DockerView { ctx: &self.docker, call: &self.call, budget: &self.budget, table: &mut self.table }
    }

    /// The `kube` capability as the current call sees it.
    fn kube(&mut self) -> KubeView<'_> {
        KubeView { ctx: &self.kube, call: &self.call, budget: &self.budget, table: &mut self.table }
    }

    /// The `terminal` capability as the current call sees it.
    fn terminal(&mut self) -> TerminalView<'_> {
        TerminalView { call: &self.call, table: &mut self.table }
    }

    /// The `job` capability as the current call sees it.
    fn job(&mut self) -> JobView<'_> {
        JobView { call: &self.call }
    }

    /// What the plugin wrote to stderr (its tail).
    pub(crate) fn stderr(&self) -> &StderrTail {
        &self.stderr
    }
}

impl WasiView for PluginState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl WasiHttpView for PluginState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView { ctx: &mut self.http, table: &mut self.table, hooks: &mut self.http_policy }
    }
}

/// Link the `runway:host` interfaces of the executor world, each to its capability's view.
pub(crate) fn add_executor_imports(linker: &mut Linker<PluginState>) -> wasmtime::Result<()> {
    use executor::runway::{executor0_1_0 as exec, host0_1_0 as host};
    host::log::add_to_linker::<_, HasSelf<LogCtx>>(linker, PluginState::log)?;
    host::kv::add_to_linker::<_, HasSelf<KvCtx>>(linker, PluginState::kv)?;
    host::trace::add_to_linker::<_, HasTrace>(linker, PluginState::trace)?;
    host::process::add_to_linker::<_, HasProcess>(linker, PluginState::process)?;
    host::remote::add_to_linker::<_, HasRemote>(linker, PluginState::remote)?;
    host::plugin::add_to_linker::<_, TypesOnly>(linker, |_| TypesOnly)?;
    executor::runway::host0_2_0::docker::add_to_linker::<_, HasDocker>(linker, PluginState::docker)?;
    executor::runway::host0_2_0::job::add_to_linker::<_, HasJob>(linker, PluginState::job)?;
    executor::runway::host0_3_0::supervisor::add_to_linker::<_, HasProcess>(linker, PluginState::process)?;
    executor::runway::host0_3_0::job_config::add_to_linker::<_, HasJob>(linker, PluginState::job)?;
    executor::runway::host0_4_0::files::add_to_linker::<_, HasRemote>(linker, PluginState::remote)?;
    executor::runway::host0_5_0::kube::add_to_linker::<_, HasKube>(linker, PluginState::kube)?;
    executor::runway::host0_6_0::terminal::add_to_linker::<_, HasTerminal>(linker, PluginState::terminal)?;
    executor::runway::host0_7_0::docker_stages::add_to_linker::<_, HasDocker>(linker, PluginState::docker)?;
    exec::types::add_to_linker::<_, TypesOnly>(linker, |_| TypesOnly)?;
    Ok(())
}

/// Link the `runway:host` interfaces of the fleeting world, each to its capability's view.
pub(crate) fn add_fleeting_imports(linker: &mut Linker<PluginState>) -> wasmtime::Result<()> {
    use executor::runway::host0_1_0 as host;
    host::log::add_to_linker::<_, HasSelf<LogCtx>>(linker, PluginState::log)?;
    host::kv::add_to_linker::<_, HasSelf<KvCtx>>(linker, PluginState::kv)?;
    host::plugin::add_to_linker::<_, TypesOnly>(linker, |_| TypesOnly)?;
    fleeting::runway::fleeting::types::add_to_linker::<_, TypesOnly>(linker, |_| TypesOnly)?;
    Ok(())
}
