//! The plugin registry: loading a file through the pipeline (metadata → grant → compile or
//! cached `.cwasm` → `InstancePre` → smoke test) and publishing the set of loaded plugins
//! atomically, so a job that took a plugin keeps its version until it finishes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use wasmtime::component::Linker;
use wasmtime::Store;

use crate::bindings::executor::ExecutorPluginPre;
use crate::bindings::fleeting::FleetingPluginPre;
use crate::capability::docker::HelperImageSource;
use crate::capability::kv::{KvQuota, KvStore};
use crate::capability::log::LogLimiter;
use crate::capability::remote::StageOutput;
use crate::capability::CallContext;
use crate::config::grant::PluginGrant;
use crate::config::hosts::{AllowedHosts, HostGrantError};
use crate::plugin::cache::{content_hash, CompileCache};
use crate::plugin::call::{arm, classify, guarded, PluginError, PluginErrorKind};
use crate::plugin::engine::PluginEngine;
use crate::plugin::metadata::{self, MetadataError, PluginKind, PluginMeta};
use crate::plugin::state::{add_executor_imports, add_fleeting_imports, PluginState, SharedByInstances};

pub use crate::plugin::file::MAX_PLUGIN_FILE;
use crate::plugin::file::{read_plugin_file, FileError};

/// Why a plugin binary was not loaded.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read, or is not a file that may be read.
    #[error(transparent)]
    File(#[from] FileError),
    /// Its metadata section was refused.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// The file claims a plugin name that is bound to another file: `[plugins.NAME] file`,
    /// by default `<NAME>.wasm`.
    #[error(
        "claims plugin name {plugin:?}, which belongs to the file {} ([plugins.{plugin}] file, default {plugin}.wasm)",
        file.display()
    )]
    NotItsFile {
        /// The name the file claims.
        plugin: String,
        /// The file that name is bound to.
        file: PathBuf,
    },
    /// The file claims the name of a built-in plugin without `[plugins.NAME] file` naming it.
    #[error(
        "claims the name of the built-in plugin {plugin:?}; a built-in is replaced only by an explicit [plugins.{plugin}] file = \"...\""
    )]
    BuiltinName {
        /// The built-in's name.
        plugin: String,
    },
    /// Its grant's `allow_hosts` has an entry that is no host (a grant made in code: one from
    /// config.toml was checked when the file was loaded).
    #[error("allow_hosts: {0}")]
    Hosts(#[from] HostGrantError),
    /// Compilation failed (or its task died).
    #[error("{0}")]
    Compile(String),
    /// It imports interfaces this runner does not provide.
    #[error(
        "imports something this runner does not provide (built against a newer SDK, or a non-Runway component?): {0}"
    )]
    Imports(String),
    /// It does not export its kind's interface.
    #[error("does not export the {kind} interface: {message}")]
    Exports {
        /// The plugin kind whose interface is missing.
        kind: PluginKind,
        /// What wasmtime said.
        message: String,
    },
    /// The smoke test could not instantiate it.
    #[error("instantiation failed: {0}")]
    Instantiate(String),
    /// The smoke test's `metadata()` call failed in the sandbox.
    #[error(transparent)]
    Call(#[from] PluginError),
    /// `metadata()` disagrees with the embedded section.
    #[error("metadata() says {exported} (API {exported_api}) but the embedded section says {name} (API {api})")]
    MetadataMismatch {
        /// The exported name.
        exported: String,
        /// The exported API version.
        exported_api: String,
        /// The section's name.
        name: String,
        /// The section's API version.
        api: String,
    },
}

/// Where a plugin came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginSource {
    /// Built into the runner binary.
    Builtin,
    /// A file in `plugins_dir`.
    File(PathBuf),
}

impl std::fmt::Display for PluginSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PluginSource::Builtin => f.write_str("(built in)"),
            PluginSource::File(p) => write!(f, "{}", p.display()),
        }
    }
}

pub(crate) enum PluginPre {
    Executor(ExecutorPluginPre<PluginState>),
    Fleeting(FleetingPluginPre<PluginState>),
}

/// A compiled, type-checked plugin ready to instantiate.
pub struct LoadedPlugin {
    /// Its identity from the metadata section.
    pub meta: PluginMeta,
    /// Where it came from.
    pub source: PluginSource,
    /// Hash of the binary (the compile cache's key).
    pub content_hash: String,
    /// What it may do.
    pub grant: Arc<PluginGrant>,
    /// The grant's `allow_hosts`, parsed when the plugin was loaded.
    pub(crate) hosts: Arc<AllowedHosts>,
    /// Whether the compiled code came from the on-disk cache.
    pub from_cache: bool,
    /// When it was loaded.
    pub loaded_at: SystemTime,
    pub(crate) pre: PluginPre,
    pub(crate) kv: Arc<KvStore>,
    pub(crate) log: Arc<LogLimiter>,
    pub(crate) helper_image: Option<HelperImageSource>,
    pub(crate) stage_output: StageOutput,
}

impl LoadedPlugin {
    /// A fresh store for this plugin, armed with its limits.
    pub(crate) fn new_store(
        &self,
        engine: &wasmtime::Engine,
        call: CallContext,
    ) -> Result<Store<PluginState>, PluginError> {
        let name = self.meta.name.as_str().into();
        let state = PluginState::new(
            name,
            self.grant.clone(),
            SharedByInstances { kv: self.kv.clone(), log: self.log.clone(), hosts: self.hosts.clone() },
            call,
            self.helper_image.clone(),
            self.stage_output,
        )
        .map_err(|e| PluginError {
            plugin: self.meta.name.clone(),
            kind: PluginErrorKind::Incompatible,
            message: format!("{e:#}"),
        })?;
        let mut store = Store::new(engine, state);
        store.limiter(|s| &mut s.limits);
        arm(&mut store);
        Ok(store)
    }

    pub(crate) fn error(&self, kind: PluginErrorKind, message: impl Into<String>) -> PluginError {
        PluginError { plugin: self.meta.name.clone(), kind, message: message.into() }
    }
}

/// How one file in `plugins_dir` fared at the last scan.
#[derive(Debug, Clone)]
pub enum FileStatus {
    /// Serving as the named plugin.
    Loaded {
        /// The plugin's name.
        name: String,
        /// Hash of the file's content.
        hash: String,
    },
    /// Refused; if an earlier version of the file loaded, it keeps serving.
    Rejected {
        /// Why.
        reason: String,
        /// Hash of the file's content (empty when it could not be read).
        hash: String,
    },
}

/// Settings of the plugin host.
#[derive(Debug, Clone, Default)]
pub struct HostSettings {
    /// Directory scanned for `*.wasm`.
    pub plugins_dir: Option<PathBuf>,
    /// Directory of compiled `.cwasm` files.
    pub cache_dir: Option<PathBuf>,
    /// Directory of plugin key-value state.
    pub state_dir: Option<PathBuf>,
    /// `[plugins.NAME]` grants.
    pub grants: BTreeMap<String, PluginGrant>,
    /// Plugins built into the binary: (file label, bytes).
    pub builtins: Vec<(&'static str, &'static [u8])>,
    /// Where the `docker` capability gets Runway's helper image from (`None`: plugins must be
    /// configured with a `helper_image`).
    pub helper_image: Option<HelperImageSource>,
    /// Where the output of stages on the runner's own machine goes (`runway exec`: pipes it
    /// follows once; a runner: log files it can resume from).
    pub stage_output: StageOutput,
}

/// Whether a file's plugin name must be the one bound to the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Binding {
    /// A file of `plugins_dir`: its name must be bound to it (`[plugins.NAME] file`, default
    /// `<NAME>.wasm`), and a built-in's name needs an explicit `file`.
    Bound,
    /// A built-in, or a file checked by `runway plugins check FILE`.
    Free,
}

/// Each file's status at the last scan, with the plugin it serves (if any).
pub(crate) type FileStatuses = BTreeMap<PathBuf, (FileStatus, Option<Arc<LoadedPlugin>>)>;

pub(crate) struct Registry {
    pub(crate) engine: PluginEngine,
    executor_linker: Linker<PluginState>,
    fleeting_linker: Linker<PluginState>,
    cache: CompileCache,
    pub(crate) settings: ArcSwap<HostSettings>,
    pub(crate) plugins: ArcSwap<BTreeMap<String, Arc<LoadedPlugin>>>,
    builtins: Mutex<BTreeMap<String, Arc<LoadedPlugin>>>,
    pub(crate) files: Mutex<FileStatuses>,
    pub(crate) reload_lock: tokio::sync::Mutex<()>,
    /// Each plugin's kv store, kept across reloads so its quota holds for every version.
    kv_stores: Mutex<BTreeMap<String, Arc<KvStore>>>,
    /// Built-ins compiled on first use ([`crate::plugin::ON_FIRST_USE`]) not used yet: name →
    /// (metadata, bytes).
    pub(crate) deferred: Mutex<BTreeMap<String, (PluginMeta, &'static [u8])>>,
    /// Built-ins compiled on first use that have been used (a grant change reloads them).
    demanded: Mutex<std::collections::BTreeSet<String>>,
    /// One first-use compilation at a time.
    first_use: tokio::sync::Mutex<()>,
}

fn linker<F>(engine: &wasmtime::Engine, add_world: F) -> anyhow::Result<Linker<PluginState>>
where
    F: FnOnce(&mut Linker<PluginState>) -> wasmtime::Result<()>,
{
    let mut linker = Linker::new(engine);
    let result = (|| -> wasmtime::Result<()> {
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
        add_world(&mut linker)
    })();
    result.map_err(|e| anyhow::anyhow!("building the plugin linker: {e:#}"))?;
    Ok(linker)
}

impl Registry {
    pub(crate) fn new(settings: HostSettings) -> anyhow::Result<Self> {
        let engine = PluginEngine::new()?;
        let executor_linker = linker(&engine.engine, add_executor_imports)?;
        let fleeting_linker = linker(&engine.engine, add_fleeting_imports)?;
        let cache = CompileCache::new(settings.cache_dir.clone(), engine.compatibility_key());
        Ok(Registry {
            engine,
            executor_linker,
            fleeting_linker,
            cache,
            settings: ArcSwap::from_pointee(settings),
            plugins: ArcSwap::from_pointee(BTreeMap::new()),
            builtins: Mutex::new(BTreeMap::new()),
            files: Mutex::new(BTreeMap::new()),
            reload_lock: tokio::sync::Mutex::new(()),
            kv_stores: Mutex::new(BTreeMap::new()),
            deferred: Mutex::new(BTreeMap::new()),
            demanded: Mutex::new(std::collections::BTreeSet::new()),
            first_use: tokio::sync::Mutex::new(()),
        })
    }

    /// The grant of `meta`'s plugin; for a file of `plugins_dir` ([`Binding::Bound`]), also
    /// check the file is the one the name is bound to: `[plugins.NAME] file`, by default
    /// `<NAME>.wasm`, and never a built-in's name without an explicit `file`.
    fn grant_for(&self, meta: &PluginMeta, source: &PluginSource, binding: Binding) -> Result<PluginGrant, LoadError> {
        let settings = self.settings.load();
        let grant = settings.grants.get(&meta.name);
        if let (PluginSource::File(path), Binding::Bound) = (source, binding) {
            let explicit = grant.and_then(|g| g.file.clone());
            let is_builtin = self.builtins.lock().map(|b| b.contains_key(&meta.name)).unwrap_or(true)
                || self.deferred.lock().map(|d| d.contains_key(&meta.name)).unwrap_or(true);
            if is_builtin && explicit.is_none() {
                return Err(LoadError::BuiltinName { plugin: meta.name.clone() });
            }
            let want = explicit.unwrap_or_else(|| PathBuf::from(format!("{}.wasm", meta.name)));
            let want_path = settings.plugins_dir.as_deref().map(|d| d.join(&want)).unwrap_or(want);
            if want_path != *path {
                return Err(LoadError::NotItsFile { plugin: meta.name.clone(), file: want_path });
            }
        }
        match grant {
            Some(grant) => Ok(grant.clone()),
            None if *source == PluginSource::Builtin && (meta.name == "shell" || meta.name == "custom") => {
                // The first-party shell and custom executors exist to start local processes.
                Ok(PluginGrant { allow_process: true, ..PluginGrant::default() })
            }
            None if *source == PluginSource::Builtin && meta.name == "docker" => {
                // The first-party docker executor exists to drive the engines its runners name.
                Ok(PluginGrant { allow_docker: vec!["*".into()], ..PluginGrant::default() })
            }
            None if *source == PluginSource::Builtin && meta.name == "kubernetes" => {
                // The first-party kubernetes executor exists to drive the clusters its runners name.
                Ok(PluginGrant { allow_kubernetes: true, ..PluginGrant::default() })
            }
            None => Ok(PluginGrant::default()),
        }
    }

    /// Plugin `name`'s kv store (one per name, shared by its versions), with `grant`'s quota.
    fn kv_store(&self, name: &str, grant: &PluginGrant) -> Arc<KvStore> {
        let mut stores = self.kv_stores.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let store = stores
            .entry(name.to_string())
            .or_insert_with(|| {
                let dir = self.settings.load().state_dir.as_ref().map(|d| d.join("kv").join(name));
                Arc::new(KvStore::new(dir))
            })
            .clone();
        store.set_quota(KvQuota { max_keys: grant.kv_max_keys, max_bytes: grant.kv_max_mb.saturating_mul(1 << 20) });
        store
    }

    /// The whole load pipeline for one plugin binary.
    pub(crate) async fn load(
        &self,
        bytes: Vec<u8>,
        source: PluginSource,
        binding: Binding,
    ) -> Result<Arc<LoadedPlugin>, LoadError> {
        let meta = metadata::read(&bytes)?;
        let grant = Arc::new(self.grant_for(&meta, &source, binding)?);
        let hosts = Arc::new(grant.allowed_hosts()?);
        let hash = content_hash(&bytes);
        let engine = self.engine.engine.clone();
        let cache_hash = hash.clone();
        let cache = self.cache.clone();
        // Compilation is CPU-bound; keep it off the async workers.
        let compiled = tokio::task::spawn_blocking(move || cache.load_or_compile(&engine, &bytes, &cache_hash))
            .await
            .map_err(|e| LoadError::Compile(format!("compiler task failed: {e}")))?;
        let (component, from_cache) = compiled.map_err(|e| LoadError::Compile(format!("{e:#}")))?;
        let pre = match meta.kind {
            PluginKind::Executor => {
                let instance_pre = self.executor_linker.instantiate_pre(&component).map_err(|e| import_error(&e))?;
                PluginPre::Executor(
                    ExecutorPluginPre::new(instance_pre)
                        .map_err(|e| LoadError::Exports { kind: meta.kind, message: format!("{e:#}") })?,
                )
            }
            PluginKind::Fleeting => {
                let instance_pre = self.fleeting_linker.instantiate_pre(&component).map_err(|e| import_error(&e))?;
                PluginPre::Fleeting(
                    FleetingPluginPre::new(instance_pre)
                        .map_err(|e| LoadError::Exports { kind: meta.kind, message: format!("{e:#}") })?,
                )
            }
        };
        let kv = self.kv_store(&meta.name, &grant);
        let log = Arc::new(LogLimiter::new(grant.log_lines_per_second));
        let settings = self.settings.load();
        let plugin = Arc::new(LoadedPlugin {
            meta,
            source,
            content_hash: hash,
            grant,
            hosts,
            from_cache,
            loaded_at: SystemTime::now(),
            pre,
            kv,
            log,
            helper_image: settings.helper_image.clone(),
            stage_output: settings.stage_output,
        });
        self.smoke_test(&plugin).await?;
        Ok(plugin)
    }

    /// Instantiate once and check the exported metadata agrees with the section.
    async fn smoke_test(&self, plugin: &Arc<LoadedPlugin>) -> Result<(), LoadError> {
        let mut store = plugin.new_store(&self.engine.engine, CallContext::default())?;
        let budget = store.data().budget.clone();
        let exported = match &plugin.pre {
            PluginPre::Executor(pre) => {
                let bindings =
                    pre.instantiate_async(&mut store).await.map_err(|e| LoadError::Instantiate(format!("{e:#}")))?;
                guarded(budget, bindings.runway_executor0_1_0_executor().call_metadata(&mut store)).await
            }
            PluginPre::Fleeting(pre) => {
                let bindings =
                    pre.instantiate_async(&mut store).await.map_err(|e| LoadError::Instantiate(format!("{e:#}")))?;
                guarded(budget, bindings.runway_fleeting_instance_group().call_metadata(&mut store)).await
            }
        };
        let exported = exported.map_err(|f| classify(&plugin.meta.name, f, store.data()))?;
        if exported.name != plugin.meta.name || exported.api_version != plugin.meta.api_version {
            return Err(LoadError::MetadataMismatch {
                exported: exported.name,
                exported_api: exported.api_version,
                name: plugin.meta.name.clone(),
                api: plugin.meta.api_version.clone(),
            });
        }
        Ok(())
    }

    /// Load the built-in plugins (at start, and again when grants change). Those compiled on
    /// first use ([`crate::plugin::ON_FIRST_USE`]) are only read for their metadata until a
    /// runner asks for them ([`Registry::load_on_first_use`]).
    pub(crate) async fn load_builtins(&self) -> anyhow::Result<()> {
        let builtins = self.settings.load().builtins.clone();
        let demanded = self.demanded.lock().map(|d| d.clone()).unwrap_or_default();
        let mut loaded = BTreeMap::new();
        let mut deferred = BTreeMap::new();
        for (label, bytes) in builtins {
            if crate::plugin::ON_FIRST_USE.contains(&label) {
                let meta = crate::plugin::metadata::read(bytes)
                    .map_err(|e| anyhow::anyhow!("built-in plugin {label}: {e}"))?;
                if !demanded.contains(&meta.name) {
                    deferred.insert(meta.name.clone(), (meta, bytes));
                    continue;
                }
            }
            let plugin = self
                .load(bytes.to_vec(), PluginSource::Builtin, Binding::Free)
                .await
                .map_err(|e| anyhow::anyhow!("built-in plugin {label}: {e}"))?;
            loaded.insert(plugin.meta.name.clone(), plugin);
        }
        if let Ok(mut b) = self.builtins.lock() {
            *b = loaded;
        }
        if let Ok(mut d) = self.deferred.lock() {
            *d = deferred;
        }
        Ok(())
    }

    /// Compile and publish built-in `name` if it is one compiled on first use and not loaded
    /// yet; whether it was.
    pub(crate) async fn load_on_first_use(&self, name: &str) -> Result<bool, LoadError> {
        let _one = self.first_use.lock().await;
        let Some((_, bytes)) = self.deferred.lock().ok().and_then(|d| d.get(name).cloned()) else {
            return Ok(false);
        };
        let plugin = self.load(bytes.to_vec(), PluginSource::Builtin, Binding::Free).await?;
        tracing::info!(plugin = name, "built-in plugin compiled on first use");
        if let Ok(mut b) = self.builtins.lock() {
            b.insert(name.to_string(), plugin);
        }
        if let Ok(mut d) = self.deferred.lock() {
            d.remove(name);
        }
        if let Ok(mut d) = self.demanded.lock() {
            d.insert(name.to_string());
        }
        // Publish it with the rest (a file of the same name still wins, as for any built-in).
        self.rescan().await;
        Ok(true)
    }

    /// Scan `plugins_dir` and publish the result. Unchanged files are not reloaded; a file
    /// that fails to load keeps its previous version serving.
    pub(crate) async fn rescan(&self) {
        let _serial = self.reload_lock.lock().await;
        let dir = self.settings.load().plugins_dir.clone();
        let files = dir.as_deref().map(list_plugin_files).unwrap_or_default();
        let previous = self.files.lock().map(|f| f.clone()).unwrap_or_default();
        let mut statuses = BTreeMap::new();
        let mut published: BTreeMap<String, Arc<LoadedPlugin>> =
            self.builtins.lock().map(|b| b.clone()).unwrap_or_default();
        let mut from_file: BTreeMap<String, PathBuf> = BTreeMap::new();
        for path in files {
            let prev = previous.get(&path);
            let prev_plugin = prev.and_then(|(_, p)| p.clone());
            let bytes = match read_plugin_file(&path).await {
                Ok(b) => b,
                Err(error) => {
                    let reason = error.to_string();
                    tracing::warn!(file = %path.display(), "plugin rejected: {reason}");
                    statuses.insert(
                        path.clone(),
                        (FileStatus::Rejected { reason, hash: String::new() }, prev_plugin.clone()),
                    );
                    if let Some(p) = prev_plugin {
                        publish(&mut published, &mut from_file, &path, p, &mut statuses);
                    }
                    continue;
                }
            };
            let hash = content_hash(&bytes);
            let unchanged = matches!(prev, Some((FileStatus::Loaded { hash: h, .. }, Some(_))) if *h == hash)
                || matches!(prev, Some((FileStatus::Rejected { hash: h, .. }, _)) if *h == hash);
            let (status, plugin) = if unchanged {
                (
                    prev.map(|(s, _)| s.clone())
                        .unwrap_or(FileStatus::Rejected { reason: String::new(), hash: hash.clone() }),
                    prev_plugin.clone(),
                )
            } else {
                match self.load(bytes, PluginSource::File(path.clone()), Binding::Bound).await {
                    Ok(p) => {
                        tracing::info!(file = %path.display(), plugin = %p.meta.name, version = %p.meta.version, "plugin loaded");
                        (FileStatus::Loaded { name: p.meta.name.clone(), hash }, Some(p))
                    }
                    Err(error) => {
                        let reason = error.to_string();
                        tracing::error!(file = %path.display(), "plugin file {} rejected: {reason}", path.display());
                        (FileStatus::Rejected { reason, hash }, prev_plugin.clone())
                    }
                }
            };
            statuses.insert(path.clone(), (status, plugin.clone()));
            if let Some(p) = plugin {
                publish(&mut published, &mut from_file, &path, p, &mut statuses);
            }
        }
        for (path, (status, _)) in &previous {
            if !statuses.contains_key(path) {
                if let FileStatus::Loaded { name, .. } = status {
                    tracing::info!(file = %path.display(), plugin = %name, "plugin file removed; plugin unloaded");
                }
            }
        }
        if let Ok(mut f) = self.files.lock() {
            *f = statuses;
        }
        self.plugins.store(Arc::new(published));
    }
}

fn publish(
    published: &mut BTreeMap<String, Arc<LoadedPlugin>>,
    from_file: &mut BTreeMap<String, PathBuf>,
    path: &Path,
    plugin: Arc<LoadedPlugin>,
    statuses: &mut FileStatuses,
) {
    let name = plugin.meta.name.clone();
    if let Some(other) = from_file.get(&name) {
        let reason = format!("plugin {name:?} is already provided by {}", other.display());
        tracing::error!(file = %path.display(), "plugin rejected: {reason}");
        statuses.insert(path.to_path_buf(), (FileStatus::Rejected { reason, hash: plugin.content_hash.clone() }, None));
        return;
    }
    from_file.insert(name.clone(), path.to_path_buf());
    published.insert(name, plugin);
}

fn import_error(e: &wasmtime::Error) -> LoadError {
    LoadError::Imports(format!("{e:#}"))
}

/// `*.wasm` entries of a directory, sorted; dotfiles and partial downloads are skipped.
/// Entries that are not regular files are listed too, so the scan reports them as refused.
pub fn list_plugin_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            !name.starts_with('.') && name.ends_with(".wasm")
        })
        .collect();
    files.sort();
    files
}
