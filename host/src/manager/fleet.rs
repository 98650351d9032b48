//! A runner's autoscaled fleet: the [`Autoscaler`] over its fleeting plugin, the SSH
//! connections jobs run through, and the fleet's state on disk.
//!
//! The manager reserves a slot before each job request and gives it back when GitLab has no
//! job; a job acquires its slot while preparing ([`InstanceSource::connect`]), and
//! [`Fleet::finish`] releases it afterwards. An instance that drops a job's connection is
//! probed `failure_threshold` times and replaced when it stays unreachable; an instance the
//! engine loses under running jobs aborts those jobs with `runner_system_failure`. An instance
//! the provider announces it takes away is drained by the engine; the jobs on it get a log line
//! naming the instance, the provider and its reason. A provider that fails (at start too) never
//! stops the fleet: it is logged, retried by the engine with back-off and reported through
//! [`Fleet::provider_error`] and the metrics.
//! With `state_storage` enabled the engine's snapshot is written under this manager's
//! identity, so a restart adopts the instances (with their use counts) instead of deleting them,
//! and `reattach` holds the slots of the jobs the job store resumes.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::autoscaler::from_config::{self, Mapping};
use crate::autoscaler::{
    AcquireError, Autoscaler, EngineEvent, EngineMetrics, EngineSnapshot, InstanceTiming, NotReady, PluginProvider,
    ReadyCommand, RealClock, RemovalReason, ReserveError, TimingHistogram,
};
use crate::config::autoscaler::{builtin_provider, AutoscalerConfig, ConnectorConfigToml, MachineConfig};
use crate::config::duration::{parse_duration, DurationError};
use crate::connector::{
    probe, ConnectError, ConnectSpec, ConnectorDefaults, InstanceConnectInfo, ProbeError, SpecError, SshSession,
};
use crate::executor::{ConnectedInstance, InstanceError, InstanceSource};
use crate::job::JobControl;
use crate::plugin::fleeting::{ConnectInfo, ConnectorConfig, InstanceState, Protocol};
use crate::plugin::PluginHost;
use crate::store::fleet_state;
use crate::trace::{FailureReason, TraceLog, TraceSink};

mod reattach;
pub use reattach::Reattached;

/// Longest a single provider call may take before the engine counts it as failed.
const PROVIDER_CALL_DEADLINE: Duration = Duration::from_secs(60);
/// Longest an `instance_ready_command` may run.
const READY_COMMAND_TIMEOUT: Duration = Duration::from_secs(300);
/// Pause between health probes of an instance that dropped a job's connection.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// How often the state file is refreshed when the fleet changed.
const STATE_SAVE_INTERVAL: Duration = Duration::from_secs(1);

/// Why a fleet could not start.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// `connector_config.key_path` cannot be read.
    #[error("connector_config.key_path {}: {source}", .path.display())]
    KeyFile {
        /// The configured path.
        path: PathBuf,
        /// The read error.
        source: std::io::Error,
    },
    /// A duration key of `connector_config` does not parse.
    #[error("connector_config.{key}: {source}")]
    Duration {
        /// `keepalive` or `timeout`.
        key: &'static str,
        /// The parse error.
        source: DurationError,
    },
    /// A protocol other than SSH.
    #[error("connector_config.protocol: {0:?} is not supported; Runway connects over ssh")]
    Protocol(String),
    /// The fleeting plugin did not start.
    #[error("fleeting plugin {plugin:?}: {message}")]
    Plugin {
        /// The plugin's name.
        plugin: String,
        /// Why.
        message: String,
    },
    /// The engine rejected the settings (or the saved state).
    #[error("[runners.autoscaler]: {0}")]
    Settings(String),
}

/// Why an instance could not be reached or checked.
#[derive(Debug, thiserror::Error)]
enum ReachError {
    #[error("connect info for {instance}: {message}")]
    ConnectInfo { instance: String, message: String },
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(transparent)]
    Probe(#[from] ProbeError),
}

/// Read `[runners.autoscaler.connector_config]` (and the key file it names) into the
/// connector's defaults.
pub fn connector_defaults(config: &ConnectorConfigToml) -> Result<ConnectorDefaults, FleetError> {
    let key = match &config.key_path {
        Some(path) => Some(std::fs::read(path).map_err(|source| FleetError::KeyFile { path: path.clone(), source })?),
        None => None,
    };
    let duration = |value: &Option<String>, key: &'static str, default: Duration| match value {
        Some(text) => parse_duration(text).map_err(|source| FleetError::Duration { key, source }),
        None => Ok(default),
    };
    if !matches!(config.protocol.as_str(), "" | "ssh") {
        return Err(FleetError::Protocol(config.protocol.clone()));
    }
    let keepalive = duration(&config.keepalive, "keepalive", Duration::from_secs(30))?;
    Ok(ConnectorDefaults {
        username: config.username.clone(),
        password: Some(config.password.clone()).filter(|p| !p.is_empty()),
        key,
        port: if config.protocol_port == 0 { 22 } else { config.protocol_port },
        keepalive: Some(keepalive).filter(|k| !k.is_zero()),
        timeout: duration(&config.timeout, "timeout", Duration::from_secs(30))?,
        use_external_addr: config.use_external_addr,
    })
}

/// What the plugin's `init` receives.
fn plugin_view(defaults: &ConnectorDefaults, config: &ConnectorConfigToml) -> ConnectorConfig {
    ConnectorConfig {
        os: if config.os.is_empty() { "linux".into() } else { config.os.clone() },
        arch: if config.arch.is_empty() { "amd64".into() } else { config.arch.clone() },
        protocol: Protocol::Ssh,
        protocol_port: defaults.port,
        username: defaults.username.clone(),
        password: defaults.password.clone(),
        key: defaults.key.clone(),
        use_static_credentials: config.use_static_credentials,
        keepalive_seconds: defaults.keepalive.map_or(0, |k| u32::try_from(k.as_secs()).unwrap_or(u32::MAX)),
        timeout_seconds: u32::try_from(defaults.timeout.as_secs()).unwrap_or(u32::MAX),
    }
}

/// The plugin's connect info in the connector's terms.
fn connect_info(info: ConnectInfo) -> InstanceConnectInfo {
    InstanceConnectInfo {
        id: info.id,
        external_addr: info.external_addr,
        internal_addr: info.internal_addr,
        port: info.connector.protocol_port,
        username: info.connector.username,
        password: info.connector.password,
        key: info.connector.key,
        keepalive_seconds: info.connector.keepalive_seconds,
        timeout_seconds: info.connector.timeout_seconds,
    }
}

/// Reaches the fleet's instances: asks the provider where one is, and hands the SSH part to
/// `connector`.
struct Connector {
    provider: PluginProvider,
    defaults: ConnectorDefaults,
}

impl Connector {
    /// The provider's answer for `instance`.
    async fn info(&self, instance: &str) -> Result<InstanceConnectInfo, ReachError> {
        let info = self
            .provider
            .connect_info(instance)
            .await
            .map_err(|e| ReachError::ConnectInfo { instance: instance.to_string(), message: e.to_string() })?;
        Ok(connect_info(info))
    }

    async fn spec(&self, instance: &str) -> Result<ConnectSpec, ReachError> {
        Ok(self.defaults.spec(&self.info(instance).await?)?)
    }

    /// A session on `instance`, and the connect info it was reached with.
    async fn connect(&self, instance: &str) -> Result<(SshSession, InstanceConnectInfo), ReachError> {
        let info = self.info(instance).await?;
        Ok((self.connect_with(&info).await?, info))
    }

    async fn connect_with(&self, info: &InstanceConnectInfo) -> Result<SshSession, ReachError> {
        Ok(SshSession::connect(&self.defaults.spec(info)?).await?)
    }

    /// Instance `id` as a job sees it through `session`, reached with `info`: its home
    /// directory, and `info` kept for a manager that reconnects without this provider.
    async fn connected(&self, id: String, session: SshSession, info: &InstanceConnectInfo) -> ConnectedInstance {
        let home = probe::remote_home(&session, self.defaults.timeout).await;
        let reconnect = serde_json::to_string(info).ok();
        ConnectedInstance { id, remote: Arc::new(session), home, reconnect }
    }

    /// `exit 0` over a fresh connection.
    async fn probe(&self, instance: &str) -> Result<(), ReachError> {
        Ok(probe::probe(&self.spec(instance).await?).await?)
    }
}

/// The autoscaler's `instance_ready_command`, run over SSH by `connector`.
struct ReadyOverSsh {
    connector: Arc<Connector>,
    command: String,
}

#[async_trait]
impl ReadyCommand for ReadyOverSsh {
    async fn run(&self, instance: &str) -> Result<(), NotReady> {
        let spec = self.connector.spec(instance).await.map_err(|e| NotReady(e.to_string()))?;
        match probe::ready_command(&spec, &self.command, READY_COMMAND_TIMEOUT).await {
            Ok(()) => {
                tracing::info!(instance, "instance_ready_command succeeded");
                Ok(())
            }
            Err(ProbeError::Exit { code, .. }) => {
                tracing::warn!(instance, code, "instance_ready_command failed");
                Err(NotReady(format!("instance_ready_command exited with {code}")))
            }
            Err(ProbeError::Run { message, .. }) => {
                tracing::warn!(instance, "instance_ready_command could not run: {message}");
                Err(NotReady(format!("instance_ready_command: {message}")))
            }
            Err(e @ ProbeError::Connect(_)) => Err(NotReady(e.to_string())),
        }
    }
}

/// A job running on the fleet: how to abort it and where its log goes.
struct TrackedJob {
    control: JobControl,
    trace: Arc<dyn TraceSink>,
}

/// One runner's fleet.
pub struct Fleet {
    name: String,
    /// The runner's `name` (the `runner_name` label of the fleeting metrics); a reload may
    /// rename it.
    runner_name: Mutex<String>,
    /// `max_instances`, `capacity_per_instance` and `max_use_count` as configured, for the
    /// fleeting gauges of the same names.
    limits: (u32, u32, u32),
    /// The instance timing histograms, with the configured buckets.
    timings: Mutex<BTreeMap<InstanceTiming, TimingHistogram>>,
    scaler: Arc<Autoscaler>,
    connector: Arc<Connector>,
    failure_threshold: u32,
    shutdown_deletion: (Duration, u32),
    delete_on_shutdown: bool,
    jobs: Mutex<HashMap<String, TrackedJob>>,
    provider_name: String,
    acquired: Mutex<HashMap<String, String>>,
    state_file: Option<PathBuf>,
    manager_id: String,
    sequence: AtomicU64,
    cancel: CancellationToken,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// Where a fleet keeps its state across restarts, and for whom.
pub struct FleetPersistence<'a> {
    /// The state file (`state_storage`); `None`: nothing is kept.
    pub state_file: Option<PathBuf>,
    /// The manager's `system_id`: a state file written by another manager is not adopted.
    pub manager_id: &'a str,
    /// The runner has a job store: the slots of the jobs a killed manager ran stay held for
    /// their resumption (see `reattach`).
    pub hold_restored: bool,
}

impl Fleet {
    /// Start the fleet of a runner: the plugin, the engine (restored from the state file when
    /// this manager wrote it), its run loop, event handling and state saving.
    pub async fn start(
        host: &PluginHost,
        name: &str,
        config: &AutoscalerConfig,
        machine: Option<&MachineConfig>,
        runner_limit: usize,
        persistence: FleetPersistence<'_>,
    ) -> Result<Arc<Fleet>, FleetError> {
        let FleetPersistence { state_file, manager_id, hold_restored } = persistence;
        let defaults = connector_defaults(&config.connector_config)?;
        if let Some(builtin) = builtin_provider(&config.plugin) {
            tracing::info!(runner = name, plugin = %config.plugin, provider = builtin, "fleeting plugin {:?} is GitLab's: using Runway's built-in {builtin} provider", config.plugin);
        }
        let (provider, init_error) = PluginProvider::start(
            host,
            config.provider(),
            plugin_view(&defaults, &config.connector_config),
            &config.plugin_config_json(manager_id),
            PROVIDER_CALL_DEADLINE,
        )
        .await
        .map_err(|e| FleetError::Plugin { plugin: config.plugin.clone(), message: e.to_string() })?;
        match (init_error, provider.info()) {
            (None, Some(info)) => {
                tracing::info!(runner = name, plugin = %config.plugin, group = %info.id, "fleet provider ready")
            }
            (error, _) => tracing::error!(
                runner = name,
                plugin = %config.plugin,
                "fleet provider failed to start: {}; this runner asks GitLab for no job until it answers (retrying with back-off); other runners are not affected",
                error.map(|e| e.to_string()).unwrap_or_default()
            ),
        }
        let settings = from_config::settings(config, machine, runner_limit, Mapping::RUN);
        let clock = Arc::new(RealClock::new());
        let saved: Option<EngineSnapshot> =
            state_file.as_deref().and_then(|path| fleet_state::load_state(path, manager_id));
        let scaler = match &saved {
            Some(snapshot) => {
                tracing::info!(
                    runner = name,
                    instances = snapshot.instances.len(),
                    "adopting the instances recorded in the fleet state"
                );
                Autoscaler::restore(&settings, snapshot, Box::new(provider.clone()), clock)
            }
            None => Autoscaler::new(&settings, Box::new(provider.clone()), clock),
        }
        .map_err(|e| FleetError::Settings(e.to_string()))?;
        if hold_restored && saved.is_some() {
            // A job store may resume the jobs the snapshot has on its instances.
            scaler.hold_restored();
        }
        let connector = Arc::new(Connector { provider, defaults });
        let fleet = Arc::new(Fleet {
            name: name.to_string(),
            runner_name: Mutex::default(),
            limits: (config.max_instances, config.capacity_per_instance, config.max_use_count),
            timings: Mutex::new(
                InstanceTiming::ALL.into_iter().map(|t| (t, TimingHistogram::new(timing_buckets(config, t)))).collect(),
            ),
            scaler: scaler.clone(),
            connector: connector.clone(),
            failure_threshold: config.failure_threshold.max(1),
            shutdown_deletion: (config.shutdown_deletion_interval, config.shutdown_deletion_retries),
            delete_on_shutdown: config.delete_instances_on_shutdown,
            jobs: Mutex::default(),
            provider_name: config.provider().to_string(),
            acquired: Mutex::default(),
            state_file,
            manager_id: manager_id.to_string(),
            sequence: AtomicU64::new(0),
            cancel: CancellationToken::new(),
            tasks: Mutex::default(),
        });
        let ready: Arc<dyn ReadyCommand> =
            Arc::new(ReadyOverSsh { connector, command: config.instance_ready_command.clone() });
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let run = tokio::spawn(scaler.run(ready, events_tx, fleet.cancel.clone()));
        let events = tokio::spawn(handle_events(Arc::downgrade(&fleet), events_rx));
        let saver = tokio::spawn(save_periodically(Arc::downgrade(&fleet), fleet.cancel.clone()));
        if let Ok(mut tasks) = fleet.tasks.lock() {
            tasks.extend([run, events, saver]);
        }
        Ok(fleet)
    }

    /// A fresh reservation key.
    pub fn next_key(&self) -> String {
        format!("{}/{}", self.name, self.sequence.fetch_add(1, Ordering::Relaxed))
    }

    /// Claim a slot before asking GitLab for a job.
    pub fn reserve(&self, key: &str) -> Result<(), ReserveError> {
        self.scaler.reserve(key)
    }

    /// GitLab had no job for this reservation.
    pub fn unreserve(&self, key: &str) {
        self.scaler.unreserve(key);
    }

    /// Follow a job so an instance lost under it aborts it, and a notice that its instance is
    /// being reclaimed is written to its trace.
    pub fn track(&self, key: &str, control: JobControl, trace: Arc<dyn TraceSink>) {
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.insert(key.to_string(), TrackedJob { control, trace });
        }
    }

    /// The provider's last error while it keeps failing (`None` while it answers).
    pub fn provider_error(&self) -> Option<String> {
        self.scaler.provider_error()
    }

    /// Gauges and counters of the engine.
    pub fn metrics(&self) -> EngineMetrics {
        self.scaler.metrics()
    }

    /// The runner this fleet serves (its short token).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The `name` of the runner this fleet serves, as the metrics label it.
    pub fn runner_name(&self) -> String {
        self.runner_name.lock().map(|n| n.clone()).unwrap_or_default()
    }

    /// Label the fleet with its runner's `name` (set when the runner is configured, again on
    /// every reload).
    pub fn set_runner_name(&self, name: &str) {
        if let Ok(mut current) = self.runner_name.lock() {
            name.clone_into(&mut current);
        }
    }

    /// `max_instances`, `capacity_per_instance` and `max_use_count` as configured.
    pub fn limits(&self) -> (u32, u32, u32) {
        self.limits
    }

    /// The instance timing histograms so far.
    pub fn timings(&self) -> BTreeMap<InstanceTiming, TimingHistogram> {
        self.timings.lock().map(|t| t.clone()).unwrap_or_default()
    }

    /// The job under `key` ended: when it ended with a system failure, probe its instance
    /// and replace it if it stays unreachable; then free the slot.
    pub async fn finish(&self, key: &str, system_failure: bool) {
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.remove(key);
        }
        let instance = self.acquired.lock().ok().and_then(|mut a| a.remove(key));
        match instance {
            Some(instance) => {
                if system_failure && !self.healthy(&instance).await {
                    tracing::warn!(runner = %self.name, instance, "instance unreachable after a job failure; replacing it");
                    self.scaler.instance_unhealthy(&instance);
                }
                let _ = self.scaler.release(key);
            }
            None => {
                // Never acquired (preparation aborted, acquire timed out): give the reservation back.
                self.scaler.unreserve(key);
            }
        }
    }

    async fn healthy(&self, instance: &str) -> bool {
        for attempt in 1..=self.failure_threshold {
            match self.connector.probe(instance).await {
                Ok(()) => return true,
                Err(e) => {
                    tracing::warn!(runner = %self.name, instance, attempt, "instance probe failed: {e}")
                }
            }
            if attempt < self.failure_threshold {
                tokio::time::sleep(PROBE_INTERVAL).await;
            }
        }
        false
    }

    /// Stop scaling: with `delete_instances_on_shutdown`, delete idle instances and wait for
    /// them to go (`shutdown_deletion_interval` × `shutdown_deletion_retries`); save the state.
    pub async fn shutdown(&self) {
        self.cancel.cancel();
        let tasks: Vec<_> = self.tasks.lock().map(|mut t| std::mem::take(&mut *t)).unwrap_or_default();
        for task in tasks {
            let _ = task.await;
        }
        if self.delete_on_shutdown {
            self.delete_what_remains().await;
        }
        self.save();
    }

    /// The engine's last round asked to delete the idle instances it knew. Instances the
    /// provider was still creating then (a scale-up just before the stop) appear only later,
    /// and a deletion may not take: list the group every `shutdown_deletion_interval` and
    /// delete whatever is there without a job, until it is empty or
    /// `shutdown_deletion_retries` rounds have passed.
    async fn delete_what_remains(&self) {
        let (interval, retries) = self.shutdown_deletion;
        let busy: std::collections::HashSet<String> = self.scaler.busy_instances().into_iter().collect();
        let mut remaining = 0;
        for round in 0..=retries {
            let listed = match self.connector.provider.call(|g| Box::pin(g.update())).await {
                Ok(listed) => listed,
                Err(e) => {
                    tracing::warn!(runner = %self.name, "cannot list the fleet's instances to delete them: {e}");
                    Vec::new()
                }
            };
            let live: Vec<_> = listed.iter().filter(|i| !matches!(i.state, InstanceState::Deleted)).collect();
            remaining = live.len();
            if remaining == 0 || live.iter().all(|i| busy.contains(&i.id)) {
                return;
            }
            let stray: Vec<String> = live
                .iter()
                .filter(|i| !matches!(i.state, InstanceState::Deleting) && !busy.contains(&i.id))
                .map(|i| i.id.clone())
                .collect();
            if !stray.is_empty() {
                tracing::info!(runner = %self.name, instances = ?stray, "deleting instances that appeared while stopping");
                let ids = stray.clone();
                if let Err(e) = self.connector.provider.call(move |g| Box::pin(g.decrease(ids))).await {
                    tracing::warn!(runner = %self.name, "cannot delete instances {stray:?}: {e}");
                }
            }
            if round < retries {
                tracing::info!(runner = %self.name, remaining, "waiting for instances to be deleted");
                tokio::time::sleep(interval).await;
            }
        }
        tracing::warn!(runner = %self.name, remaining, "instances are left after the last deletion round (shutdown_deletion_retries)");
    }

    fn save(&self) {
        let Some(path) = &self.state_file else { return };
        if let Err(e) = fleet_state::write_state(path, &self.manager_id, &self.scaler.snapshot()) {
            tracing::warn!(runner = %self.name, path = %path.display(), "cannot save the fleet state: {e}");
        }
    }
}

#[async_trait]
impl InstanceSource for Fleet {
    async fn connect(
        &self,
        key: &str,
        trace: &dyn TraceSink,
        abort: &CancellationToken,
    ) -> Result<ConnectedInstance, InstanceError> {
        trace.println("Waiting for an instance from the fleet...");
        let started = std::time::Instant::now();
        let acquisition = tokio::select! {
            result = self.scaler.acquire(key) => result.map_err(|e| match e {
                AcquireError::TimedOut(limit) => InstanceError::AcquireTimedOut(limit),
                other => InstanceError::Acquire(other.to_string()),
            })?,
            _ = abort.cancelled() => return Err(InstanceError::AbortedWaiting),
        };
        if let Ok(mut acquired) = self.acquired.lock() {
            acquired.insert(key.to_string(), acquisition.instance.clone());
        }
        // On disk before the job can be stored as running there: a manager killed from now
        // on finds the slot acquired when it restarts, and keeps it for the job.
        self.save();
        trace.println(&format!(
            "Instance {} acquired (slot {}) after {:.1}s",
            acquisition.instance,
            acquisition.slot,
            started.elapsed().as_secs_f64()
        ));
        let (session, info) = tokio::select! {
            s = self.connector.connect(&acquisition.instance) => s.map_err(|e| InstanceError::Connect { instance: acquisition.instance.clone(), message: e.to_string() })?,
            _ = abort.cancelled() => return Err(InstanceError::AbortedConnecting),
        };
        let connected = self.connector.connected(acquisition.instance, session, &info).await;
        trace.println(&format!("Connected to instance {} over SSH", connected.id));
        Ok(connected)
    }
}

impl Fleet {
    /// The jobs under `keys` still followed.
    fn tracked(&self, keys: &[String]) -> Vec<TrackedJob> {
        let Ok(jobs) = self.jobs.lock() else { return Vec::new() };
        keys.iter()
            .filter_map(|k| jobs.get(k).map(|j| TrackedJob { control: j.control.clone(), trace: j.trace.clone() }))
            .collect()
    }
}

/// The histogram buckets of `timing` (gitlab-runner's `GetInstance*TimeBuckets`): the specific
/// list, else the operation list (not for the life duration), else the default.
fn timing_buckets(config: &AutoscalerConfig, timing: InstanceTiming) -> Vec<f64> {
    use crate::config::autoscaler::{DEFAULT_LIFE_BUCKETS, DEFAULT_OPERATION_BUCKETS};
    let specific = match timing {
        InstanceTiming::Creation => &config.instance_creation_time_buckets,
        InstanceTiming::IsRunning => &config.instance_is_running_time_buckets,
        InstanceTiming::Deletion => &config.instance_deletion_time_buckets,
        InstanceTiming::Readiness => &config.instance_readiness_time_buckets,
        InstanceTiming::Life => &config.instance_life_duration_buckets,
    };
    if !specific.is_empty() {
        return specific.clone();
    }
    match timing {
        InstanceTiming::Life => DEFAULT_LIFE_BUCKETS.to_vec(),
        _ if !config.instance_operation_time_buckets.is_empty() => config.instance_operation_time_buckets.clone(),
        _ => DEFAULT_OPERATION_BUCKETS.to_vec(),
    }
}

async fn handle_events(fleet: std::sync::Weak<Fleet>, mut events: mpsc::UnboundedReceiver<EngineEvent>) {
    while let Some(event) = events.recv().await {
        let Some(fleet) = fleet.upgrade() else { return };
        match event {
            EngineEvent::InstanceLost { instance, keys, reason } => {
                tracing::warn!(runner = %fleet.name, instance, reason = reason.as_str(), jobs = keys.len(), "instance lost under running jobs");
                for job in fleet.tracked(&keys) {
                    if reason == RemovalReason::Interrupted {
                        job.trace.warning(&format!(
                            "Instance {instance} was taken away by the {} fleeting provider: failing the job with runner_system_failure (retry: when: runner_system_failure applies)",
                            fleet.provider_name
                        ));
                    }
                    job.control.abort_with(FailureReason::RunnerSystemFailure);
                }
            }
            EngineEvent::InstanceInterrupted { instance, reason, keys } => {
                tracing::warn!(runner = %fleet.name, instance, reason, jobs = keys.len(), "the provider is reclaiming an instance; draining it (no new jobs)");
                for job in fleet.tracked(&keys) {
                    job.trace.warning(&format!(
                        "The {} fleeting provider is reclaiming instance {instance} ({reason}). No new job goes to it; this job runs on until the instance goes away, and then fails with runner_system_failure.",
                        fleet.provider_name
                    ));
                }
            }
            EngineEvent::ProviderFailing { message, failures, retry_in } => {
                if failures == 1 {
                    tracing::error!(runner = %fleet.name, plugin = %fleet.provider_name, "fleet provider failing: {message}; this runner asks GitLab for no job it cannot run; retrying in {}s", retry_in.as_secs());
                } else {
                    tracing::warn!(runner = %fleet.name, plugin = %fleet.provider_name, failures, "fleet provider still failing: {message}; retrying in {}s", retry_in.as_secs());
                }
            }
            EngineEvent::ProviderRecovered { failures } => {
                tracing::info!(runner = %fleet.name, plugin = %fleet.provider_name, failures, "fleet provider answers again");
            }
            EngineEvent::InstanceRemoved { instance, reason } => {
                tracing::info!(runner = %fleet.name, instance, reason = reason.as_str(), "removing instance");
            }
            EngineEvent::AcquisitionsAbandoned { instance, keys } => {
                tracing::warn!(runner = %fleet.name, instance, jobs = keys.len(), "instance had jobs when the manager stopped");
            }
            EngineEvent::AcquireTimedOut { key } => {
                tracing::warn!(runner = %fleet.name, key, "instance_acquire_timeout expired")
            }
            EngineEvent::Timed { timing, seconds } => {
                if let Ok(mut timings) = fleet.timings.lock() {
                    if let Some(h) = timings.get_mut(&timing) {
                        h.observe(seconds);
                    }
                }
            }
            EngineEvent::Acquired { .. } | EngineEvent::ReadyCheckRequested { .. } => {}
        }
    }
}

async fn save_periodically(fleet: std::sync::Weak<Fleet>, cancel: CancellationToken) {
    let mut last = String::new();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(STATE_SAVE_INTERVAL) => {}
            _ = cancel.cancelled() => return,
        }
        let Some(fleet) = fleet.upgrade() else { return };
        let Some(path) = &fleet.state_file else {
            return;
        };
        // Compare the instances and the predictor's revision only: `taken_at` changes every time.
        let snapshot = fleet.scaler.snapshot();
        let key = format!(
            "{}/{:?}",
            serde_json::to_string(&snapshot.instances).unwrap_or_default(),
            fleet.scaler.predictor_revision()
        );
        if key == last {
            continue;
        }
        match fleet_state::write_state(path, &fleet.manager_id, &snapshot) {
            Ok(()) => last = key,
            Err(e) => {
                tracing::warn!(runner = %fleet.name, path = %path.display(), "cannot save the fleet state: {e}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::autoscaler::engine::EngineSnapshot;
    use crate::autoscaler::Moment;
    use crate::store::fleet_state::{load_state, write_state};

    #[test]
    fn the_engine_snapshot_round_trips_through_the_state_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state/runner.json");
        let snapshot = EngineSnapshot { version: 1, taken_at: Moment(42), instances: Vec::new(), predictor: None };
        write_state(&path, "s_1", &snapshot).expect("write");
        assert_eq!(load_state::<EngineSnapshot>(&path, "s_1"), Some(snapshot));
        assert!(load_state::<EngineSnapshot>(&path, "s_2").is_none(), "another manager's instances are not ours");
    }
}
