//! `runway run`: the runner manager as a service — config (reloaded on SIGHUP and when the
//! file changes, as gitlab-runner), plugins (hot reload), pollers, signals (SIGQUIT graceful,
//! SIGTERM/SIGINT forceful) and the metrics and health endpoints.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use super::setup;
use crate::config::autoscaler::AutoscalerConfig;
use crate::config::instance::CommonBuildDir;
use crate::config::store::StorePathVariables;
use crate::config::{self, Loaded};
use crate::executor::ResolvedExecutor;
use crate::gitlab::client::{ClientOptions, GitLabClient, RequestHook, RunnerCredentials};
use crate::job::JobEnvironment;
use crate::manager::capacity::Capacity;
use crate::manager::fleet::{Fleet, FleetPersistence};
use crate::manager::health::{PendingRunner, RunnerEntry, Unusable};
use crate::manager::{identity, signals, ActiveJobs, Manager, ManagerSettings, RunnerSettings, RunnerStore, Shutdown};
use crate::metrics::Metrics;
use crate::plugin::PluginHost;
use crate::script::ScriptSettings;
use crate::session::SessionServer;
use crate::store::fleet_state;
use crate::store::jobs::seal::StoreKey;
use crate::store::jobs::{JobStore, JobStoreError, StoreSettings};
use anyhow::Context as _;

/// The autoscaled fleets, by runner (URL and id, else token digest). A fleet outlives config reloads: its
/// instances and jobs carry over to the new manager.
#[derive(Default)]
pub(super) struct Fleets {
    by_runner: HashMap<String, (AutoscalerConfig, Arc<Fleet>)>,
}

impl Fleets {
    async fn get_or_start(
        &mut self,
        loaded: &Loaded,
        plugins: &PluginHost,
        runner: &config::RunnerConfig,
        (short, system_id): (&str, &str),
        hold_restored: bool,
    ) -> anyhow::Result<Arc<Fleet>> {
        let Some(autoscaler) = &runner.autoscaler else {
            anyhow::bail!("runner {} has no [runners.autoscaler]", runner.name)
        };
        // A runner with an id keeps its fleet when its token is rotated (gitlab-runner keys
        // taskscalers by URL and id).
        let digest = config::token_digest(&runner.resolved_token());
        let key = if runner.id != 0 { format!("{}|{}", runner.resolved_url(), runner.id) } else { digest.clone() };
        if let Some((running, fleet)) = self.by_runner.get(&key) {
            if running != autoscaler {
                tracing::warn!(runner = %runner.name, "changes to [runners.autoscaler] take effect after a restart");
            }
            fleet.set_runner_name(&runner.name);
            return Ok(fleet.clone());
        }
        let storage = &autoscaler.state_storage;
        let state = fleet_state::state_file(storage.enabled, storage.dir.as_deref(), &loaded.dir(), &digest, short);
        let machine = runner.machine.as_ref();
        let persistence = FleetPersistence { state_file: state, manager_id: system_id, hold_restored };
        let fleet = Fleet::start(plugins, short, autoscaler, machine, runner.limit, persistence)
            .await
            .map_err(|e| anyhow::anyhow!("{}: runner {:?}: {e}", loaded.path.display(), runner.name))?;
        fleet.set_runner_name(&runner.name);
        self.by_runner.insert(key, (autoscaler.clone(), fleet.clone()));
        Ok(fleet)
    }

    /// Stop every fleet (after the managers' jobs have ended).
    pub(super) async fn shutdown(self) {
        for (_, fleet) in self.by_runner.into_values() {
            fleet.shutdown().await;
        }
    }

    /// The running fleets.
    pub(super) fn all(&self) -> Vec<Arc<Fleet>> {
        self.by_runner.values().map(|(_, f)| f.clone()).collect()
    }
}

/// The opened job stores, by backend. A store (and a file store's lock) outlives config
/// reloads like a fleet: the new manager shares the old one's lock and its set of running jobs.
pub(super) struct Stores {
    key_path: PathBuf,
    opened: tokio::sync::Mutex<HashMap<String, OpenStore>>,
}

/// An opened store and the jobs this process runs from it.
type OpenStore = (Arc<dyn JobStore>, ActiveJobs);

impl Stores {
    /// Stores sealing with the key from `RUNWAY_STORE_KEY` or the key file `key_path`.
    pub(super) fn new(key_path: PathBuf) -> Self {
        Stores { key_path, opened: tokio::sync::Mutex::default() }
    }

    /// The store `settings` select (opened once) with the jobs this process runs from it,
    /// `None` when the store is off.
    async fn open(&self, settings: &StoreSettings) -> Result<Option<RunnerStore>, JobStoreError> {
        let Some(backend) = &settings.backend else { return Ok(None) };
        let name = format!("{backend:?}");
        let mut opened = self.opened.lock().await;
        let (store, active) = match opened.get(&name) {
            Some(open) => open.clone(),
            None => {
                let key = StoreKey::load_or_create(&self.key_path)?;
                let Some(store) = crate::store::jobs::open(settings, key).await? else { return Ok(None) };
                let open = (store, ActiveJobs::default());
                opened.insert(name, open.clone());
                open
            }
        };
        Ok(Some(RunnerStore { store, settings: settings.clone(), active }))
    }
}

/// How often a runner whose executor cannot be resolved tries again (a plugin published by
/// hot reload is picked up within this time).
const RESOLVE_RETRY: Duration = Duration::from_secs(5);

/// Every `[[runners]]` entry as the manager takes it. The fleet and the TLS client are set
/// up here (their errors fail the start or the reload); the executor is resolved by the
/// manager, so a runner whose plugin is missing or broken is only reported unhealthy while
/// every other runner serves.
pub(super) async fn runner_settings(
    loaded: &Loaded,
    plugins: &PluginHost,
    system_id: &str,
    fleets: &mut Fleets,
    stores: &Arc<Stores>,
    (client, metrics): (&GitLabClient, &Metrics),
) -> anyhow::Result<Vec<RunnerEntry>> {
    let cwd = std::env::current_dir().context("reading the working directory")?;
    let mut out = Vec::new();
    for (i, runner) in loaded.config.runners.iter().enumerate() {
        if let Some(why) = &runner.unusable {
            tracing::error!(runner = %runner.name, "{why}: this runner is left out; the others serve");
            continue;
        }
        let short = config::short_token(&runner.resolved_token());
        let vars =
            StorePathVariables { version: crate::buildinfo::VERSION, revision: crate::buildinfo::REVISION, tags: "" };
        let store = runner.store_settings(&loaded.path, &vars)?;
        // With a job store, the slots of jobs a killed manager ran stay held for their resumption.
        let hold = store.backend.is_some();
        let fleet = match runner.autoscaler {
            Some(_) => Some(fleets.get_or_start(loaded, plugins, runner, (&short, system_id), hold).await?),
            None => None,
        };
        // The ssh executor's one host, connected per job like a fleet instance.
        let ssh_host = match runner.executor.as_str() {
            "ssh" if fleet.is_none() => {
                let config = crate::config::ssh::SshConfig::from_section(runner.sections.get("ssh"))
                    .map_err(crate::manager::ssh_host::SshHostError::Config)
                    .and_then(|c| crate::manager::ssh_host::SshHost::new(&c))
                    .map_err(|e| anyhow::anyhow!("{}: runners[{i}] ({}): {e}", loaded.path.display(), runner.name))?;
                Some(Arc::new(config) as Arc<dyn crate::executor::InstanceSource>)
            }
            _ => None,
        };
        let certs_dir = config::tls::certs_dir(&loaded.path);
        let tls = runner.tls_files(&certs_dir);
        // Each runner's own client (sharing connections unless it has TLS files of its own),
        // so its requests are counted under its name.
        let hook = Some(api_hook(metrics, &short));
        let client = match tls.is_empty() {
            true => Some(Arc::new(client.with_hook(hook))),
            false => Some(Arc::new(setup::client_for(runner, &certs_dir, hook)?)),
        };
        // gitlab-runner's CI_SERVER_TLS_CA_FILE: the CA chain the runner trusts for GitLab.
        let server_tls_ca = match &tls.ca_file {
            Some(file) => Some(std::fs::read_to_string(file).with_context(|| {
                format!(
                    "{}: runners[{i}] ({}): reading the CA file {}",
                    loaded.path.display(),
                    runner.name,
                    file.display()
                )
            })?),
            None => None,
        };
        let labels = setup::labels(&loaded.config, runner);
        let context = Arc::new(RunnerContext {
            store,
            stores: stores.clone(),
            where_: format!("{}: runners[{i}] ({})", loaded.path.display(), runner.name),
            runner: runner.clone(),
            plugins: plugins.clone(),
            system_id: system_id.to_string(),
            short: short.clone(),
            cwd: cwd.clone(),
            fleet,
            ssh_host,
            user: loaded.config.user.clone().filter(|u| !u.is_empty()),
            client,
            server_tls_ca,
            labels,
        });
        out.push(RunnerEntry::Pending(PendingRunner {
            name: runner.name.clone(),
            short_token: short,
            resolve: Arc::new(move || {
                let context = context.clone();
                Box::pin(async move { context.resolve().await })
            }),
            retry_every: RESOLVE_RETRY,
        }));
    }
    Ok(out)
}

/// What resolving one runner needs, kept for its retries.
struct RunnerContext {
    /// `[runners.store]`.
    store: StoreSettings,
    stores: Arc<Stores>,
    /// `file: runners[i] (name)`, for errors.
    where_: String,
    runner: config::RunnerConfig,
    plugins: PluginHost,
    system_id: String,
    short: String,
    cwd: PathBuf,
    fleet: Option<Arc<Fleet>>,
    /// The host of an `ssh` executor runner.
    ssh_host: Option<Arc<dyn crate::executor::InstanceSource>>,
    /// The global `user` (or `--user`) shell jobs run as.
    user: Option<String>,
    client: Option<Arc<GitLabClient>>,
    /// The CA chain trusted for GitLab (the CA file's PEM), for `CI_SERVER_TLS_CA_FILE`.
    server_tls_ca: Option<String>,
    /// Labels sent to GitLab.
    labels: std::collections::BTreeMap<String, String>,
}

/// `[runners.kubernetes]` JSON `json` with `namespace` set to `namespace` (the in-cluster
/// service account's) when it sets neither `host` (the cluster is then elsewhere) nor
/// `namespace`, as the namespace a manager in a pod runs its jobs in by default.
fn in_cluster_namespace(json: &str, namespace: Option<String>) -> String {
    let Some(namespace) = namespace else {
        return json.to_string();
    };
    let Ok(mut value) = serde_json::from_str::<serde_json::Value>(json) else {
        return json.to_string();
    };
    let unset = |key: &str| value[key].as_str().is_none_or(|v| v.trim().is_empty());
    if !(unset("host") && unset("namespace")) {
        return json.to_string();
    }
    if let Some(section) = value.as_object_mut() {
        section.insert("namespace".into(), serde_json::Value::String(namespace));
    }
    value.to_string()
}

impl RunnerContext {
    /// The executor's section as JSON. A shell executor's gets the global `user` (unless its
    /// `[runners.shell]` names one), as gitlab-runner runs shell jobs as that user; an ssh
    /// executor's loses the connection keys (the host connects: the plugin never sees the
    /// credentials); a kubernetes executor's without `host` and `namespace`, in a pod, gets the
    /// in-cluster service account's namespace.
    fn executor_config_json(&self) -> String {
        let json = self.runner.executor_config_json();
        let plugin = self.runner.executor_plugin();
        if plugin == "kubernetes" {
            let env = crate::connector::kube::config::Environment::process();
            return in_cluster_namespace(&json, crate::connector::kube::config::in_cluster_namespace(&env));
        }
        if plugin != "shell" && plugin != "ssh" {
            return json;
        }
        let mut value: serde_json::Value = serde_json::from_str(&json).unwrap_or_else(|_| serde_json::json!({}));
        if let Some(section) = value.as_object_mut() {
            match (plugin, &self.user) {
                ("shell", Some(user)) => {
                    section.entry("user").or_insert_with(|| serde_json::Value::String(user.clone()));
                }
                ("ssh", _) => section.retain(|key, _| key == "login"),
                _ => {}
            }
        }
        value.to_string()
    }

    /// Resolve the executor plugin and build the runner's settings from what it says.
    async fn resolve(&self) -> Result<RunnerSettings, Unusable> {
        let runner = &self.runner;
        let executor = ResolvedExecutor::resolve(&self.plugins, runner.executor_plugin(), &self.executor_config_json())
            .await
            .map_err(|e| Unusable::new(&format!("{}: executor {:?}: {e}", self.where_, runner.executor)))?;
        let store = match self.stores.open(&self.store).await {
            Ok(store) => store,
            Err(e) => return Err(Unusable::new(&format!("{}: job store: {e}", self.where_))),
        };
        let short = self.short.clone();
        let shell = runner.shell.clone().unwrap_or_else(|| executor.info.default_shell.clone());
        // On a fleet, directories are the instance's: relative ones stay relative to the
        // login user's home there.
        let (builds_dir, cache_dir) = if self.fleet.is_some() || self.ssh_host.is_some() {
            (
                PathBuf::from(runner.builds_dir.clone().unwrap_or_else(|| executor.info.default_builds_dir.clone())),
                PathBuf::from(runner.cache_dir.clone().unwrap_or_else(|| executor.info.default_cache_dir.clone())),
            )
        } else {
            (
                executor.builds_dir(runner.builds_dir.as_deref(), &self.cwd),
                executor.cache_dir(runner.cache_dir.as_deref(), &self.cwd),
            )
        };
        // `[runners.instance] use_common_build_dir`: decided here from the running fleet's
        // max_use_count, which the instance plugin does not see.
        let max_use_count = self.fleet.as_ref().map(|fleet| fleet.limits().2);
        let common_build_dir = config::instance::common_build_dir(runner, max_use_count);
        let settings = ScriptSettings {
            builds_dir,
            cache_dir,
            shared_builds_dir: executor.shared() && common_build_dir != CommonBuildDir::Applies,
            prepare_warnings: match common_build_dir {
                CommonBuildDir::NoEffect => vec![config::instance::NO_EFFECT_WARNING.to_string()],
                CommonBuildDir::NotAsked | CommonBuildDir::Applies => Vec::new(),
            },
            short_token: short.clone(),
            executor: runner.executor.clone(),
            shell,
            clone_url: runner.clone_url.clone(),
            environment: runner.environment.clone(),
            pre_get_sources_script: runner.pre_get_sources_script.clone(),
            post_get_sources_script: runner.post_get_sources_script.clone(),
            pre_build_script: runner.pre_build_script.clone(),
            post_build_script: runner.post_build_script.clone(),
            feature_flags: runner.feature_flags.clone(),
            debug_trace_disabled: runner.debug_trace_disabled,
            clean_git_config: runner.clean_git_config,
            safe_directory_checkout: runner.safe_directory_checkout,
            runner_version: crate::buildinfo::VERSION.into(),
            runner_revision: crate::buildinfo::REVISION.into(),
            project_dir_override: None,
            shared_environment: executor.shared(),
            runner_command: setup::helper_command(&executor),
            gitlab_url: runner.resolved_url(),
            server_tls_ca_chain: self.server_tls_ca.clone(),
            cache_signer: setup::runner_cache(runner, &short)
                .await
                .map_err(|e| Unusable::new(&format!("{}: {e}", self.where_)))?,
            ..ScriptSettings::default()
        };
        Ok(RunnerSettings {
            credentials: RunnerCredentials {
                url: runner.resolved_url(),
                token: runner.resolved_token(),
                system_id: self.system_id.clone(),
            },
            client: self.client.clone(),
            env: JobEnvironment {
                executor,
                settings,
                identity: identity(&runner.name, &short, &self.system_id),
                instance: self
                    .ssh_host
                    .clone()
                    .map(|source| crate::executor::InstanceLease { source, key: String::new() }),
            },
            limit: runner.limit,
            request_concurrency: runner.request_concurrency,
            output_limit_kib: runner.output_limit,
            unhealthy_requests_limit: runner.unhealthy_requests_limit,
            unhealthy_interval: runner.unhealthy_interval,
            final_update_retry_limit: runner.job_status_final_update_retry_limit,
            strict_check_interval: runner.strict_check_interval,
            fleet: self.fleet.clone(),
            store,
            labels: self.labels.clone(),
        })
    }
}

fn manager_settings(loaded: &Loaded, metrics: &Metrics, sessions: Option<Arc<SessionServer>>) -> ManagerSettings {
    ManagerSettings {
        session_server: sessions,
        observer: Arc::new(metrics.clone()),
        concurrent: loaded.config.concurrent,
        check_interval: loaded.check_interval(),
        shutdown_timeout: loaded.shutdown_timeout(),
        ..ManagerSettings::default()
    }
}

/// The client hook that counts every API request attempt of runner `short` in `metrics`.
fn api_hook(metrics: &Metrics, short: &str) -> RequestHook {
    let metrics = metrics.clone();
    let short = short.to_string();
    Arc::new(move |request| metrics.record_api_request(&short, request))
}

/// Load `path`, with `--user` (when given) over its `user`.
fn load_with_user(path: &Path, user: Option<&str>) -> anyhow::Result<Loaded> {
    let mut loaded = setup::load_config(path)?;
    if let Some(user) = user {
        loaded.config.user = Some(user.to_string());
    }
    Ok(loaded)
}

/// Wait until `path` exists, as gitlab-runner's `run` does for a config file not written yet
/// (a service installed before `register`): checked every 3 s. `false` when a stop signal
/// came first.
async fn wait_for_file(path: &Path) -> anyhow::Result<bool> {
    if path.exists() {
        return Ok(true);
    }
    use tokio::signal::unix::{signal, SignalKind};
    let mut stops = [SignalKind::terminate(), SignalKind::interrupt(), SignalKind::quit()]
        .into_iter()
        .map(signal)
        .collect::<Result<Vec<_>, _>>()
        .context("installing signal handlers")?;
    tracing::warn!(config = %path.display(), "the config file does not exist yet; waiting for it");
    loop {
        let stopped = futures::future::select_all(stops.iter_mut().map(|s| Box::pin(s.recv())));
        tokio::select! {
            _ = stopped => return Ok(false),
            () = tokio::time::sleep(Duration::from_secs(3)) => {}
        }
        if path.exists() {
            tracing::info!(config = %path.display(), "the config file appeared");
            return Ok(true);
        }
    }
}

/// How often config.toml is checked for changes (gitlab-runner's `reloadConfigInterval`).
const RELOAD_CHECK: Duration = Duration::from_secs(3);

/// What identifies one version of a file: its modification time, size and inode (an editor
/// that saves by renaming changes the inode). `None` when it cannot be read.
fn file_version(path: &Path) -> Option<(std::time::SystemTime, u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len(), meta.ino()))
}

/// `runway run`'s flags: gitlab-runner's `run`, so the ExecStart line of its service units
/// (`run --config … --working-directory … --service … --user … [--syslog]`) starts Runway.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Run shell executor jobs as this user (over config.toml's `user`).
    #[arg(long, short = 'u')]
    pub user: Option<String>,
    /// Work in this directory (changed to before the config is read).
    #[arg(long = "working-directory", short = 'd')]
    pub working_directory: Option<PathBuf>,
    /// The service's name: the system logger's ident with `--syslog`.
    #[arg(long = "service", short = 'n', default_value = "gitlab-runner")]
    pub service: String,
    /// Log to the system logger instead of standard error.
    #[arg(long, env = "LOG_SYSLOG")]
    pub syslog: bool,
    /// Serve metrics and health here (over config.toml's `listen_address`).
    #[arg(long = "listen-address", env = "LISTEN_ADDRESS", alias = "metrics-server")]
    pub listen_address: Option<String>,
}

/// Run until stopped by a signal; shell jobs run as `user` when given (`--user`).
pub(super) async fn run(config_path: PathBuf, args: RunArgs) -> anyhow::Result<ExitCode> {
    if !wait_for_file(&config_path).await? {
        return Ok(ExitCode::SUCCESS);
    }
    let user = args.user;
    let mut loaded = load_with_user(&config_path, user.as_deref())?;
    let listen_flag = args.listen_address.filter(|a| !a.is_empty());
    if let Some(address) = &listen_flag {
        loaded.config.listen_address = Some(address.clone());
    }
    let system_id = config::system_id(&loaded.dir())?;
    let mut plugins = setup::plugin_host(&loaded).await?;
    plugins.watch()?;
    let metrics = Metrics::new(loaded.config.concurrent, &system_id)?;
    metrics.register(crate::cache::assume_role_collectors())?;
    metrics.config_loaded(true);
    let client = Arc::new(GitLabClient::new(ClientOptions::default())?);
    let _server = match &loaded.config.listen_address {
        Some(address) => Some(crate::metrics::serve(address, metrics.clone()).await?),
        None => None,
    };

    // The web terminal's session server lives as long as the process; a reload keeps it.
    let sessions = SessionServer::start(&loaded.config.session_server).await?.map(Arc::new);

    let shutdown = Shutdown::default();
    let (reload_tx, mut reload_rx) = tokio::sync::mpsc::unbounded_channel();
    signals::install(shutdown.clone(), reload_tx.clone())?;
    let capacity = Capacity::new(loaded.config.concurrent);
    let global = capacity.semaphore();
    let mut seen_version = file_version(&config_path);
    let mut watch = tokio::time::interval(RELOAD_CHECK);
    watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tracing::info!(config = %config_path.display(), runners = loaded.config.runners.len(), system_id, "runway started");

    let mut generation = Shutdown::default();
    let mut fleets = Fleets::default();
    let stores = Arc::new(Stores::new(loaded.dir().join(".runway-store.key")));
    let mut current = {
        let runners = runner_settings(&loaded, &plugins, &system_id, &mut fleets, &stores, (&client, &metrics)).await?;
        let manager = Manager::with_entries(
            manager_settings(&loaded, &metrics, sessions.clone()),
            runners,
            client.clone(),
            generation.clone(),
            global.clone(),
        );
        metrics.attach(manager.stats(), &loaded);
        metrics.set_health(manager.health());
        metrics.set_fleets(fleets.all());
        tokio::spawn(manager.run())
    };
    let mut retiring = Vec::new();
    let rotation = tokio::spawn(super::rotation::rotate_tokens(
        config_path.clone(),
        system_id.clone(),
        reload_tx.clone(),
        shutdown.clone(),
    ));
    metrics.follow_shutdown(&shutdown);
    metrics.set_ready(true);
    loop {
        tokio::select! {
            _ = shutdown.graceful.cancelled() => {
                generation.graceful.cancel();
                break;
            }
            _ = shutdown.forceful.cancelled() => {
                generation.forceful.cancel();
                break;
            }
            Some(()) = reload_rx.recv() => {}
            _ = watch.tick() => {
                if file_version(&config_path) == seen_version {
                    continue;
                }
                tracing::info!(config = %config_path.display(), "the config file changed: reloading");
            }
        }
        // A version is read once: a bad edit is reported once, not every 3 s.
        seen_version = file_version(&config_path);
        let next = match load_with_user(&config_path, user.as_deref()) {
            Ok(mut next) => {
                metrics.config_loaded(true);
                if let Some(address) = &listen_flag {
                    next.config.listen_address = Some(address.clone());
                }
                if next.config.listen_address != loaded.config.listen_address {
                    tracing::warn!("changes to `listen_address` take effect after a restart");
                }
                if next.config.session_server != loaded.config.session_server {
                    tracing::warn!("changes to `[session_server]` take effect after a restart");
                }
                next
            }
            Err(e) => {
                metrics.config_loaded(false);
                tracing::error!("config reload failed, keeping the running configuration: {e:#}");
                continue;
            }
        };
        plugins.set_grants(next.grants()).await;
        match runner_settings(&next, &plugins, &system_id, &mut fleets, &stores, (&client, &metrics)).await {
            Ok(runners) => {
                // The old manager stops requesting; its jobs finish in the background
                // while the new one serves, sharing the same capacity.
                let old = std::mem::take(&mut generation);
                old.graceful.cancel();
                retiring.push((old, current));
                let manager = Manager::with_entries(
                    manager_settings(&next, &metrics, sessions.clone()),
                    runners,
                    client.clone(),
                    generation.clone(),
                    global.clone(),
                );
                metrics.attach(manager.stats(), &next);
                metrics.set_health(manager.health());
                metrics.set_fleets(fleets.all());
                current = tokio::spawn(manager.run());
                if next.config.concurrent != loaded.config.concurrent {
                    capacity.set(next.config.concurrent);
                    metrics.set_concurrent(next.config.concurrent);
                }
                super::reload_logging(&next.config.log_level, &next.config.log_format);
                tracing::info!(
                    concurrent = next.config.concurrent,
                    runners = next.config.runners.len(),
                    "configuration reloaded"
                );
                loaded = next;
            }
            Err(e) => {
                // Keep the old configuration whole: its grants too, not only its runners.
                plugins.set_grants(loaded.grants()).await;
                tracing::error!("config reload failed, keeping the running configuration: {e:#}");
            }
        }
    }
    metrics.set_ready(false);
    rotation.abort();
    metrics.slots_stopped();
    let old_shutdowns: Vec<Shutdown> = retiring.iter().map(|(s, _)| s.clone()).collect();
    let abort_all = |generation: &Shutdown| {
        generation.forceful.cancel();
        for old in &old_shutdowns {
            old.forceful.cancel();
        }
    };
    if shutdown.forceful.is_cancelled() {
        abort_all(&generation);
    }
    let waiting = async {
        let _ = current.await;
        for (_, handle) in retiring {
            let _ = handle.await;
        }
    };
    tokio::pin!(waiting);
    let forceful = shutdown.forceful.clone();
    tokio::select! {
        _ = &mut waiting => {}
        // SIGQUIT, then SIGTERM while waiting: switch to a forceful stop.
        _ = forceful.cancelled() => {
            abort_all(&generation);
            let grace = loaded.shutdown_timeout() + Duration::from_secs(5);
            if tokio::time::timeout(grace, &mut waiting).await.is_err() {
                tracing::warn!("jobs still running after shutdown_timeout; exiting");
            }
        }
    }
    fleets.shutdown().await;
    tracing::info!("runway stopped");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::in_cluster_namespace;

    #[test]
    fn the_in_cluster_namespace_fills_only_an_unset_namespace_without_host() {
        let ns = || Some("runway".to_string());
        let set: serde_json::Value =
            serde_json::from_str(&in_cluster_namespace(r#"{"image":"a"}"#, ns())).expect("json");
        assert_eq!(set["namespace"], "runway");
        let empty: serde_json::Value =
            serde_json::from_str(&in_cluster_namespace(r#"{"namespace":""}"#, ns())).expect("json");
        assert_eq!(empty["namespace"], "runway");
        assert_eq!(in_cluster_namespace(r#"{"namespace":"ci"}"#, ns()), r#"{"namespace":"ci"}"#);
        assert_eq!(in_cluster_namespace(r#"{"host":"https://k:6443"}"#, ns()), r#"{"host":"https://k:6443"}"#);
        assert_eq!(in_cluster_namespace(r#"{"image":"a"}"#, None), r#"{"image":"a"}"#);
    }
}
