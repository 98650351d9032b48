//! Plugin host: the wasmtime engine, the plugin registry, the directory watcher, hot swap,
//! sandbox grants and resource limits.
//!
//! The rest of the runner sees [`PluginHost`] and the typed facades ([`executor`]); wasmtime
//! types stay inside this module and [`crate::capability`].
//!
//! - [`engine`]: one `Engine` (pooling allocator with fallback, epoch ticker thread);
//! - [`metadata`]: the `runway-plugin` section read before compiling;
//! - [`file`]: reading a plugin file bounded (regular files only, byte cap, deadline);
//! - [`cache`]: compiled `.cwasm` files keyed by content and engine;
//! - [`registry`]: the load pipeline and atomic publication;
//! - [`watch`]: hot reload of `plugins_dir`;
//! - [`state`], [`call`]: store data, budgets and error classification, plugin messages bounded;
//! - [`stderr`]: a plugin's stderr as a bounded stream (the tail is kept for errors);
//! - grants (`[plugins.NAME]`) are `crate::config::grant`'s.
//!
//! Owns: the sandbox, the registry and the typed facades. Must not touch: jobs, executors'
//! sessions and domain types (`crate::executor`), what capabilities do (`crate::capability`).

pub mod cache;
pub mod call;
pub mod engine;
pub mod executor;
pub mod file;
pub mod fleeting;
pub mod limits;
pub mod metadata;
pub mod registry;
pub mod state;
pub mod stderr;
pub mod watch;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use crate::capability::docker::{HelperImageError, HelperImageSource};
pub use crate::capability::remote::StageOutput;
pub use call::{bound_message, PluginError, PluginErrorKind, MAX_PLUGIN_MESSAGE};
pub use executor::{ExecutorCall, ExecutorInstance};
pub use metadata::MetadataError;
pub use registry::{FileStatus, HostSettings, LoadError, LoadedPlugin, PluginSource};

use crate::config::grant::PluginGrant;
use registry::Registry;

/// The first-party plugins compiled into the binary by `host/build.rs`.
pub fn builtin_plugins() -> Vec<(&'static str, &'static [u8])> {
    vec![
        ("executor-shell.wasm", include_bytes!(concat!(env!("RUNWAY_GUEST_DIR"), "/executor_shell.wasm"))),
        ("executor-instance.wasm", include_bytes!(concat!(env!("RUNWAY_GUEST_DIR"), "/executor_instance.wasm"))),
        ("executor-docker.wasm", include_bytes!(concat!(env!("RUNWAY_GUEST_DIR"), "/executor_docker.wasm"))),
        ("executor-custom.wasm", include_bytes!(concat!(env!("RUNWAY_GUEST_DIR"), "/executor_custom.wasm"))),
        ("executor-ssh.wasm", include_bytes!(concat!(env!("RUNWAY_GUEST_DIR"), "/executor_ssh.wasm"))),
        ("executor-kubernetes.wasm", include_bytes!(concat!(env!("RUNWAY_GUEST_DIR"), "/executor_kubernetes.wasm"))),
        ("fleeting-static.wasm", include_bytes!(concat!(env!("RUNWAY_GUEST_DIR"), "/fleeting_static.wasm"))),
        ("fleeting-aws.wasm", include_bytes!(concat!(env!("RUNWAY_GUEST_DIR"), "/fleeting_aws.wasm"))),
        ("fleeting-azure.wasm", include_bytes!(concat!(env!("RUNWAY_GUEST_DIR"), "/fleeting_azure.wasm"))),
        ("fleeting-gcp.wasm", include_bytes!(concat!(env!("RUNWAY_GUEST_DIR"), "/fleeting_gcp.wasm"))),
    ]
}

/// Built-ins compiled when a runner first uses them rather than at start: the cloud fleeting
/// providers, large and needed by few runners (compiling them would double every cold start).
pub const ON_FIRST_USE: [&str; 3] = ["fleeting-aws.wasm", "fleeting-gcp.wasm", "fleeting-azure.wasm"];

/// Why `runway plugins check FILE` refused a file.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {reason}", path.display())]
pub struct CheckError {
    /// The file checked.
    pub path: PathBuf,
    /// What was wrong with it.
    pub reason: CheckFailure,
}

/// What was wrong with a checked file.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CheckFailure {
    /// It could not be read, or is not a file that may be read.
    #[error(transparent)]
    Read(#[from] file::FileError),
    /// It did not load.
    #[error(transparent)]
    Load(#[from] LoadError),
}

/// One row of `runway plugins list`.
#[derive(Debug, Clone)]
pub struct PluginListing {
    /// The plugin's name (`-` for a file that never loaded).
    pub name: String,
    /// Executor or fleeting.
    pub kind: String,
    /// The plugin's own version.
    pub version: String,
    /// The WIT API version it was built against.
    pub api_version: String,
    /// Built in, or the file it came from.
    pub source: String,
    /// A summary of its grant ([`describe_grant`]).
    pub grants: String,
    /// Loaded, or why it was rejected.
    pub status: String,
}

/// The plugin host. Cheap to clone.
#[derive(Clone)]
pub struct PluginHost {
    pub(crate) registry: Arc<Registry>,
    watcher: Option<Arc<watch::DirWatcher>>,
}

impl PluginHost {
    /// Create the host, load built-in plugins and scan `plugins_dir` once.
    pub async fn new(settings: HostSettings) -> anyhow::Result<Self> {
        let registry = Arc::new(Registry::new(settings)?);
        registry.load_builtins().await?;
        registry.rescan().await;
        Ok(PluginHost { registry, watcher: None })
    }

    /// Start hot reload of `plugins_dir` (no-op without one).
    pub fn watch(&mut self) -> anyhow::Result<()> {
        if let Some(dir) = self.registry.settings.load().plugins_dir.clone() {
            std::fs::create_dir_all(&dir)?;
            let watcher = watch::watch(Arc::downgrade(&self.registry), &dir)?;
            self.watcher = Some(Arc::new(watcher));
        }
        Ok(())
    }

    /// Rescan `plugins_dir` now (also what the watcher does).
    pub async fn rescan(&self) {
        self.registry.rescan().await
    }

    /// Replace the grants (config reload) and rescan so they take effect for new calls.
    pub async fn set_grants(&self, grants: BTreeMap<String, PluginGrant>) {
        let mut settings = (**self.registry.settings.load()).clone();
        if settings.grants != grants {
            settings.grants = grants;
            self.registry.settings.store(Arc::new(settings));
            // Grants are part of a loaded plugin: force a reload of every file.
            if let Ok(mut files) = self.registry.files.lock() {
                files.clear();
            }
            if let Err(e) = self.registry.load_builtins().await {
                tracing::error!("reloading built-in plugins: {e:#}");
            }
            self.registry.rescan().await;
        }
    }

    /// The engine (for facades creating stores).
    pub(crate) fn engine(&self) -> &wasmtime::Engine {
        &self.registry.engine.engine
    }

    /// Which instance allocator the engine uses.
    pub fn allocator(&self) -> engine::Allocator {
        self.registry.engine.allocator
    }

    /// The loaded plugins by name.
    pub fn plugins(&self) -> Arc<BTreeMap<String, Arc<LoadedPlugin>>> {
        self.registry.plugins.load_full()
    }

    /// Compile and publish built-in `name` now if it is one compiled on first use
    /// ([`ON_FIRST_USE`]) and not loaded yet; whether it was.
    pub async fn load_on_first_use(&self, name: &str) -> Result<bool, LoadError> {
        self.registry.load_on_first_use(name).await
    }

    /// Every loaded plugin, every built-in waiting for its first use and every rejected file,
    /// for `runway plugins list`.
    pub fn listing(&self) -> Vec<PluginListing> {
        let plugins = self.plugins();
        let mut rows: Vec<PluginListing> = plugins.values().map(|p| listing_row(p, "loaded")).collect();
        let deferred = self.registry.deferred.lock().map(|d| d.clone()).unwrap_or_default();
        let grants = self.registry.settings.load().grants.clone();
        for (name, (meta, _)) in deferred.iter().filter(|(name, _)| !plugins.contains_key(*name)) {
            rows.push(PluginListing {
                name: name.clone(),
                kind: meta.kind.to_string(),
                version: meta.version.clone(),
                api_version: meta.api_version.clone(),
                source: PluginSource::Builtin.to_string(),
                grants: describe_grant(&grants.get(name).cloned().unwrap_or_default()),
                status: "compiled on first use".into(),
            });
        }
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        let files = self.registry.files.lock().map(|f| f.clone()).unwrap_or_default();
        for (path, (status, serving)) in files {
            if let FileStatus::Rejected { reason, .. } = status {
                let mut row = match serving {
                    Some(p) => listing_row(&p, "serving previous version"),
                    None => PluginListing {
                        name: "-".into(),
                        kind: "-".into(),
                        version: "-".into(),
                        api_version: "-".into(),
                        source: path.display().to_string(),
                        grants: "-".into(),
                        status: String::new(),
                    },
                };
                row.source = path.display().to_string();
                row.status = format!("{} — rejected: {reason}", row.status).trim_start_matches(" — ").to_string();
                rows.push(row);
            }
        }
        rows
    }

    /// Load `path` without publishing it: what `runway plugins check FILE` prints.
    pub async fn check_file(&self, path: &Path) -> Result<PluginListing, CheckError> {
        let failed = |reason| CheckError { path: path.to_path_buf(), reason };
        let bytes = file::read_plugin_file(path).await.map_err(|e| failed(CheckFailure::Read(e)))?;
        let plugin = self
            .registry
            .load(bytes, PluginSource::File(path.to_path_buf()), registry::Binding::Free)
            .await
            .map_err(|e| failed(CheckFailure::Load(e)))?;
        Ok(listing_row(&plugin, "ok"))
    }
}

fn listing_row(p: &LoadedPlugin, status: &str) -> PluginListing {
    PluginListing {
        name: p.meta.name.clone(),
        kind: p.meta.kind.to_string(),
        version: p.meta.version.clone(),
        api_version: p.meta.api_version.clone(),
        source: p.source.to_string(),
        grants: describe_grant(&p.grant),
        status: status.to_string(),
    }
}

/// A one-line summary of what a grant allows.
pub fn describe_grant(grant: &PluginGrant) -> String {
    let mut parts = Vec::new();
    if grant.allow_process {
        parts.push("process".to_string());
    }
    if !grant.allow_docker.is_empty() {
        parts.push(format!("docker:{}", grant.allow_docker.join(",")));
    }
    if grant.allow_kubernetes {
        parts.push("kubernetes".to_string());
    }
    if !grant.allow_hosts.is_empty() {
        parts.push(format!("http:{}", grant.allow_hosts.join(",")));
    }
    if !grant.env.is_empty() {
        parts.push(format!("env:{}", grant.env.join(",")));
    }
    if !grant.dirs.is_empty() {
        parts.push(format!("dirs:{}", grant.dirs.join(",")));
    }
    parts.push(format!("mem:{}MiB", grant.memory_mb));
    parts.push(format!("time:{:?}", grant.call_timeout));
    parts.join(" ")
}

/// Default directories relative to the config file's directory.
pub fn default_dirs(config_dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    (config_dir.join("plugins"), config_dir.join(".plugin-cache"), config_dir.join(".runway-state"))
}
