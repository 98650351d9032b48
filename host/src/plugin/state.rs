//! What a plugin's [`wasmtime::Store`] holds: the sandboxed WASI context, the HTTP policy,
//! memory limits, the call budget and the context of the job the call works for.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wasmtime::component::ResourceTable;
use wasmtime::{StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::capability::http::HttpPolicy;
use crate::capability::kv::KvStore;
use crate::capability::remote::RemoteSession;
use crate::config::grant::PluginGrant;
use crate::stop::StopSignal;
use crate::trace::TraceSink;

/// Most bytes of a plugin's stderr kept for error messages.
const STDERR_CAPTURE: usize = 64 * 1024;

/// What the call works for: the job's log, its stop signal, its remote instance.
#[derive(Clone, Default)]
pub struct CallContext {
    /// The job log (absent for metadata and fleeting calls).
    pub trace: Option<Arc<dyn TraceSink>>,
    /// Stops running processes and remote commands.
    pub stop: StopSignal,
    /// The instance acquired for the job (instance executor).
    pub remote: Option<Arc<dyn RemoteSession>>,
}

/// Wasm execution time allowed per call. Time spent inside host capabilities that wait on
/// the outside world (a running job script, a remote command) does not count; everything
/// else — guest code, and a guest blocked in WASI polls — does.
#[derive(Debug)]
pub struct CallBudget {
    limit: Duration,
    state: Mutex<BudgetState>,
}

#[derive(Debug, Default)]
struct BudgetState {
    started: Option<Instant>,
    host_time: Duration,
    in_host_since: Option<Instant>,
}

impl CallBudget {
    /// A budget of `limit` per call.
    pub fn new(limit: Duration) -> Arc<Self> {
        Arc::new(CallBudget { limit, state: Mutex::new(BudgetState::default()) })
    }
    /// The per-call limit.
    pub fn limit(&self) -> Duration {
        self.limit
    }
    /// A top-level call starts.
    pub fn start_call(&self) {
        if let Ok(mut s) = self.state.lock() {
            *s = BudgetState { started: Some(Instant::now()), ..Default::default() };
        }
    }
    /// The guest entered a host capability whose waiting does not count.
    pub fn enter_host(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.in_host_since.get_or_insert_with(Instant::now);
        }
    }
    /// The guest left that capability.
    pub fn leave_host(&self) {
        if let Ok(mut s) = self.state.lock() {
            if let Some(since) = s.in_host_since.take() {
                s.host_time += since.elapsed();
            }
        }
    }
    /// Counted time used by the current call so far.
    pub fn used(&self) -> Duration {
        let Ok(s) = self.state.lock() else { return Duration::ZERO };
        let Some(started) = s.started else { return Duration::ZERO };
        let in_host = s.in_host_since.map(|t| t.elapsed()).unwrap_or_default();
        started.elapsed().saturating_sub(s.host_time + in_host)
    }
    /// Has the current call used up its budget?
    pub fn exhausted(&self) -> bool {
        self.used() > self.limit
    }
}

/// Store data of every plugin instance.
pub struct PluginState {
    pub(crate) plugin: Arc<str>,
    pub(crate) grant: Arc<PluginGrant>,
    pub(crate) wasi: WasiCtx,
    pub(crate) http: WasiHttpCtx,
    pub(crate) http_policy: HttpPolicy,
    pub(crate) table: ResourceTable,
    pub(crate) limits: StoreLimits,
    pub(crate) budget: Arc<CallBudget>,
    pub(crate) call: CallContext,
    pub(crate) kv: Arc<KvStore>,
    pub(crate) stderr: MemoryOutputPipe,
}

impl PluginState {
    /// Store data for one instance of `plugin` under `grant`.
    pub fn new(plugin: Arc<str>, grant: Arc<PluginGrant>, kv: Arc<KvStore>, call: CallContext) -> anyhow::Result<Self> {
        let stderr = MemoryOutputPipe::new(STDERR_CAPTURE);
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
            let (host, guest) = dir.split_once(':').unwrap_or((dir.as_str(), dir.as_str()));
            wasi.preopened_dir(host, guest, wasmtime_wasi::FsPerms::ReadWrite)
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
        let mut http = WasiHttpCtx::new();
        http.set_field_size_limit(64 * 1024);
        Ok(PluginState {
            http_policy: HttpPolicy::new(plugin.clone(), &grant.allow_hosts),
            budget: CallBudget::new(grant.call_timeout),
            plugin,
            grant,
            wasi: wasi.build(),
            http,
            table: ResourceTable::new(),
            limits,
            call,
            kv,
            stderr,
        })
    }

    /// Most bytes one host call may buffer for this plugin.
    pub(crate) fn max_buffer(&self) -> usize {
        usize::try_from(self.grant.max_buffer_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
    }

    /// The last lines the plugin wrote to stderr (a panic message, usually).
    pub fn stderr_tail(&self) -> String {
        let bytes = self.stderr.contents();
        let text = String::from_utf8_lossy(&bytes);
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(3)..].join(" | ")
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
