//! A runner's autoscaled fleet: the [`Autoscaler`] over its fleeting plugin, the SSH
//! connections jobs run through, and the fleet's state on disk.
//!
//! The manager reserves a slot before each job request and gives it back when GitLab has no
//! job; a job acquires its slot while preparing ([`InstanceSource::connect`]), and
//! [`Fleet::finish`] releases it afterwards. An instance that drops a job's connection is
//! probed `failure_threshold` times and replaced when it stays unreachable; an instance the
//! engine loses under running jobs aborts those jobs with `runner_system_failure`.
//! With `state_storage` enabled the engine's snapshot is written under this manager's
//! identity, so a restart adopts the instances (with their use counts) instead of deleting them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::autoscaler::from_config::{self, Mapping};
use crate::autoscaler::{
    AcquireError, Autoscaler, EngineEvent, EngineMetrics, EngineSnapshot, PluginProvider, ReadyCommand, RealClock,
    ReserveError,
};
use crate::config::autoscaler::{AutoscalerConfig, ConnectorConfigToml, MachineConfig};
use crate::config::duration::parse_duration;
use crate::connector::{ConnectSpec, SshAuth, SshSession};
use crate::job::{ConnectedInstance, InstanceSource, JobControl};
use crate::plugin::fleeting::{ConnectInfo, ConnectorConfig, Protocol};
use crate::plugin::PluginHost;
use crate::trace::{FailureReason, TraceLog, TraceSink};

/// Longest a single provider call may take before the engine counts it as failed.
const PROVIDER_CALL_DEADLINE: Duration = Duration::from_secs(60);
/// Longest an `instance_ready_command` may run.
const READY_COMMAND_TIMEOUT: Duration = Duration::from_secs(300);
/// Pause between health probes of an instance that dropped a job's connection.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// How often the state file is refreshed when the fleet changed.
const STATE_SAVE_INTERVAL: Duration = Duration::from_secs(1);

/// Connection settings from `[runners.autoscaler.connector_config]`, filling what the
/// plugin's connect-info leaves blank.
#[derive(Clone, Debug)]
pub struct ConnectorDefaults {
    username: String,
    password: Option<String>,
    key: Option<Vec<u8>>,
    port: u16,
    keepalive: Option<Duration>,
    timeout: Duration,
    use_external_addr: bool,
}

impl ConnectorDefaults {
    /// Read the section (and the key file it names).
    pub fn from_config(config: &ConnectorConfigToml) -> Result<Self, String> {
        let key = match &config.key_path {
            Some(path) => {
                Some(std::fs::read(path).map_err(|e| format!("connector_config.key_path {}: {e}", path.display()))?)
            }
            None => None,
        };
        let duration = |value: &Option<String>, key: &str, default: Duration| match value {
            Some(text) => parse_duration(text).map_err(|e| format!("connector_config.{key}: {e}")),
            None => Ok(default),
        };
        if !matches!(config.protocol.as_str(), "" | "ssh") {
            return Err(format!(
                "connector_config.protocol: {:?} is not supported; Runway connects over ssh",
                config.protocol
            ));
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
    fn plugin_view(&self, config: &ConnectorConfigToml) -> ConnectorConfig {
        ConnectorConfig {
            os: if config.os.is_empty() { "linux".into() } else { config.os.clone() },
            arch: if config.arch.is_empty() { "amd64".into() } else { config.arch.clone() },
            protocol: Protocol::Ssh,
            protocol_port: self.port,
            username: self.username.clone(),
            password: self.password.clone(),
            key: self.key.clone(),
            use_static_credentials: config.use_static_credentials,
            keepalive_seconds: self.keepalive.map_or(0, |k| u32::try_from(k.as_secs()).unwrap_or(u32::MAX)),
            timeout_seconds: u32::try_from(self.timeout.as_secs()).unwrap_or(u32::MAX),
        }
    }

    /// How to reach an instance: the plugin's answer, blanks filled from config.toml.
    fn spec(&self, info: &ConnectInfo) -> Result<ConnectSpec, String> {
        let (first, second) = if self.use_external_addr {
            (&info.external_addr, &info.internal_addr)
        } else {
            (&info.internal_addr, &info.external_addr)
        };
        let address = first
            .as_deref()
            .or(second.as_deref())
            .filter(|a| !a.is_empty())
            .ok_or_else(|| format!("the provider gave no address for instance {}", info.id))?;
        let port = if info.connector.protocol_port == 0 { self.port } else { info.connector.protocol_port };
        let (host, port) = split_host_port(address, port)?;
        let username =
            if info.connector.username.is_empty() { self.username.clone() } else { info.connector.username.clone() };
        if username.is_empty() {
            return Err("no SSH user: set [runners.autoscaler.connector_config] username".into());
        }
        let auth = match (
            info.connector.key.clone().or_else(|| self.key.clone()),
            info.connector.password.clone().or_else(|| self.password.clone()),
        ) {
            (Some(pem), _) => SshAuth::Key { pem, passphrase: None },
            (None, Some(password)) => SshAuth::Password(password),
            (None, None) => return Err("no SSH credentials: set connector_config key_path or password".into()),
        };
        let keepalive = match info.connector.keepalive_seconds {
            0 => self.keepalive,
            s => Some(Duration::from_secs(u64::from(s))),
        };
        let timeout = match info.connector.timeout_seconds {
            0 => self.timeout,
            s => Duration::from_secs(u64::from(s)),
        };
        Ok(ConnectSpec { host, port, username, auth, keepalive, timeout, host_key: None })
    }
}

/// `host`, `host:port`, `[v6]:port`.
fn split_host_port(address: &str, default_port: u16) -> Result<(String, u16), String> {
    if let Some(rest) = address.strip_prefix('[') {
        let (host, tail) = rest.split_once(']').ok_or_else(|| format!("bad address {address:?}"))?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| format!("bad port in {address:?}"))?,
            None => default_port,
        };
        return Ok((host.to_string(), port));
    }
    match address.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => {
            Ok((host.to_string(), port.parse().map_err(|_| format!("bad port in {address:?}"))?))
        }
        _ => Ok((address.to_string(), default_port)),
    }
}

/// The saved state: the engine snapshot under the identity of the manager that wrote it.
#[derive(Serialize, Deserialize)]
struct SavedState {
    manager: String,
    snapshot: EngineSnapshot,
}

struct Connector {
    provider: PluginProvider,
    defaults: ConnectorDefaults,
}

impl Connector {
    async fn connect(&self, instance: &str) -> Result<SshSession, String> {
        let info =
            self.provider.connect_info(instance).await.map_err(|e| format!("connect info for {instance}: {e}"))?;
        let spec = self.defaults.spec(&info)?;
        SshSession::connect(&spec).await.map_err(|e| e.to_string())
    }

    /// `exit 0` over a fresh connection.
    async fn probe(&self, instance: &str) -> Result<(), String> {
        let session = self.connect(instance).await?;
        let result = session.probe("exit 0", self.defaults.timeout).await;
        session.close().await;
        match result {
            Ok(0) => Ok(()),
            Ok(code) => Err(format!("probe exited with {code}")),
            Err(e) => Err(format!("{e:?}")),
        }
    }
}

struct ReadyOverSsh {
    connector: Arc<Connector>,
    command: String,
}

#[async_trait]
impl ReadyCommand for ReadyOverSsh {
    async fn run(&self, instance: &str) -> Result<(), String> {
        let session = self.connector.connect(instance).await?;
        let result = session.probe(&self.command, READY_COMMAND_TIMEOUT).await;
        session.close().await;
        match result {
            Ok(0) => {
                tracing::info!(instance, "instance_ready_command succeeded");
                Ok(())
            }
            Ok(code) => {
                tracing::warn!(instance, code, "instance_ready_command failed");
                Err(format!("instance_ready_command exited with {code}"))
            }
            Err(e) => {
                tracing::warn!(instance, "instance_ready_command could not run: {e:?}");
                Err(format!("instance_ready_command: {e:?}"))
            }
        }
    }
}

/// One runner's fleet.
pub struct Fleet {
    name: String,
    scaler: Arc<Autoscaler>,
    connector: Arc<Connector>,
    failure_threshold: u32,
    shutdown_deletion: (Duration, u32),
    delete_on_shutdown: bool,
    jobs: Mutex<HashMap<String, JobControl>>,
    acquired: Mutex<HashMap<String, String>>,
    state_file: Option<PathBuf>,
    manager_id: String,
    sequence: AtomicU64,
    cancel: CancellationToken,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// Where a runner's fleet state lives: `<dir>/<runner short token>.json`.
pub fn state_file(config: &AutoscalerConfig, config_dir: &Path, short_token: &str) -> Option<PathBuf> {
    let storage = &config.state_storage;
    storage.enabled.then(|| {
        storage.dir.clone().unwrap_or_else(|| config_dir.join(".taskscaler")).join(format!("{short_token}.json"))
    })
}

impl Fleet {
    /// Start the fleet of a runner: the plugin, the engine (restored from `state_file` when it
    /// was written by `manager_id`), its run loop, event handling and state saving.
    pub async fn start(
        host: &PluginHost,
        name: &str,
        config: &AutoscalerConfig,
        machine: Option<&MachineConfig>,
        runner_limit: usize,
        state_file: Option<PathBuf>,
        manager_id: &str,
    ) -> Result<Arc<Fleet>, String> {
        let defaults = ConnectorDefaults::from_config(&config.connector_config)?;
        let provider = PluginProvider::start(
            host,
            &config.plugin,
            defaults.plugin_view(&config.connector_config),
            &config.plugin_config_json(),
            PROVIDER_CALL_DEADLINE,
        )
        .await
        .map_err(|e| format!("fleeting plugin {:?}: {e}", config.plugin))?;
        tracing::info!(runner = name, plugin = %config.plugin, group = %provider.info.id, "fleet provider ready");
        let settings = from_config::settings(config, machine, runner_limit, Mapping::RUN);
        let clock = Arc::new(RealClock::new());
        let saved = state_file.as_deref().and_then(|path| load_state(path, manager_id));
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
        .map_err(|e| format!("[runners.autoscaler]: {e}"))?;
        let connector = Arc::new(Connector { provider, defaults });
        let fleet = Arc::new(Fleet {
            name: name.to_string(),
            scaler: scaler.clone(),
            connector: connector.clone(),
            failure_threshold: config.failure_threshold.max(1),
            shutdown_deletion: (config.shutdown_deletion_interval, config.shutdown_deletion_retries),
            delete_on_shutdown: config.delete_instances_on_shutdown,
            jobs: Mutex::default(),
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

    /// Follow a job so an instance lost under it aborts it.
    pub fn track(&self, key: &str, control: JobControl) {
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.insert(key.to_string(), control);
        }
    }

    /// Gauges and counters of the engine.
    pub fn metrics(&self) -> EngineMetrics {
        self.scaler.metrics()
    }

    /// The runner this fleet serves (its short token).
    pub fn name(&self) -> &str {
        &self.name
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
            let (interval, retries) = self.shutdown_deletion;
            for _ in 0..retries.max(1) {
                let remaining =
                    self.connector.provider.call(|g| Box::pin(g.update())).await.map(|l| l.len()).unwrap_or(0);
                if remaining == 0 {
                    break;
                }
                tracing::info!(runner = %self.name, remaining, "waiting for instances to be deleted");
                tokio::time::sleep(interval).await;
            }
        }
        self.save();
    }

    fn save(&self) {
        let Some(path) = &self.state_file else { return };
        let state = SavedState { manager: self.manager_id.clone(), snapshot: self.scaler.snapshot() };
        if let Err(e) = write_state(path, &state) {
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
    ) -> Result<ConnectedInstance, String> {
        trace.println("Waiting for an instance from the fleet...");
        let started = std::time::Instant::now();
        let acquisition = tokio::select! {
            result = self.scaler.acquire(key) => result.map_err(|e| match e {
                AcquireError::TimedOut(limit) => format!("no instance became available within instance_acquire_timeout ({}s)", limit.as_secs()),
                other => other.to_string(),
            })?,
            _ = abort.cancelled() => return Err("the job was aborted while waiting for an instance".into()),
        };
        if let Ok(mut acquired) = self.acquired.lock() {
            acquired.insert(key.to_string(), acquisition.instance.clone());
        }
        trace.println(&format!(
            "Instance {} acquired (slot {}) after {:.1}s",
            acquisition.instance,
            acquisition.slot,
            started.elapsed().as_secs_f64()
        ));
        let session = tokio::select! {
            s = self.connector.connect(&acquisition.instance) => s.map_err(|e| format!("connecting to instance {}: {e}", acquisition.instance))?,
            _ = abort.cancelled() => return Err("the job was aborted while connecting to its instance".into()),
        };
        let home = remote_home(&session, self.connector.defaults.timeout).await;
        trace.println(&format!("Connected to instance {} over SSH", acquisition.instance));
        Ok(ConnectedInstance { id: acquisition.instance, remote: Arc::new(session), home })
    }
}

/// `$HOME` of the login user on the instance.
async fn remote_home(session: &SshSession, timeout: Duration) -> Option<String> {
    let output = Arc::new(Mutex::new(Vec::new()));
    let sink = {
        let output = output.clone();
        move |bytes: &[u8]| {
            if let Ok(mut o) = output.lock() {
                o.extend_from_slice(bytes);
            }
        }
    };
    let stop = crate::stop::StopSignal::new();
    let run = session.exec("printf %s \"$HOME\"", None, &sink, &stop);
    match tokio::time::timeout(timeout, run).await {
        Ok(Ok(0)) => {
            let text = output.lock().ok().map(|o| String::from_utf8_lossy(&o).trim().to_string())?;
            Some(text).filter(|h| h.starts_with('/'))
        }
        _ => None,
    }
}

async fn handle_events(fleet: std::sync::Weak<Fleet>, mut events: mpsc::UnboundedReceiver<EngineEvent>) {
    while let Some(event) = events.recv().await {
        let Some(fleet) = fleet.upgrade() else { return };
        match event {
            EngineEvent::InstanceLost { instance, keys, reason } => {
                tracing::warn!(runner = %fleet.name, instance, reason = reason.as_str(), jobs = keys.len(), "instance lost under running jobs");
                let jobs = fleet
                    .jobs
                    .lock()
                    .map(|j| keys.iter().filter_map(|k| j.get(k).cloned()).collect::<Vec<_>>())
                    .unwrap_or_default();
                for control in jobs {
                    control.abort_with(FailureReason::RunnerSystemFailure);
                }
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
        // Compare the instance part only: `taken_at` changes every time.
        let snapshot = fleet.scaler.snapshot();
        let key = serde_json::to_string(&snapshot.instances).unwrap_or_default();
        if key == last {
            continue;
        }
        let state = SavedState { manager: fleet.manager_id.clone(), snapshot };
        match write_state(path, &state) {
            Ok(()) => last = key,
            Err(e) => {
                tracing::warn!(runner = %fleet.name, path = %path.display(), "cannot save the fleet state: {e}")
            }
        }
    }
}

fn write_state(path: &Path, state: &SavedState) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let json = serde_json::to_vec_pretty(state).map_err(std::io::Error::other)?;
    let mut file = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut file, &json)?;
    file.as_file().sync_all()?;
    file.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// The saved snapshot, when it exists, parses and was written by this manager.
fn load_state(path: &Path, manager_id: &str) -> Option<EngineSnapshot> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(path = %path.display(), "cannot read the fleet state: {e}");
            return None;
        }
    };
    match serde_json::from_slice::<SavedState>(&bytes) {
        Ok(state) if state.manager == manager_id => Some(state.snapshot),
        Ok(state) => {
            tracing::warn!(path = %path.display(), owner = %state.manager, "the fleet state belongs to another manager; not adopting it");
            None
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), "the fleet state is unreadable ({e}); starting without it");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{load_state, split_host_port, write_state, SavedState};
    use crate::autoscaler::engine::EngineSnapshot;
    use crate::autoscaler::Moment;

    #[test]
    fn state_is_adopted_only_by_the_manager_that_wrote_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state/runner.json");
        assert!(load_state(&path, "s_1").is_none(), "no file: nothing to adopt");
        let snapshot = EngineSnapshot { version: 1, taken_at: Moment(42), instances: Vec::new() };
        write_state(&path, &SavedState { manager: "s_1".into(), snapshot: snapshot.clone() }).expect("write");
        assert_eq!(load_state(&path, "s_1"), Some(snapshot));
        assert!(load_state(&path, "s_2").is_none(), "another manager's instances are not ours");
        std::fs::write(&path, b"{ truncated").expect("corrupt");
        assert!(load_state(&path, "s_1").is_none(), "an unreadable file is ignored");
    }

    #[test]
    fn addresses_split_into_host_and_port() {
        assert_eq!(split_host_port("10.0.0.5", 22), Ok(("10.0.0.5".into(), 22)));
        assert_eq!(split_host_port("build-2:2222", 22), Ok(("build-2".into(), 2222)));
        assert_eq!(split_host_port("[::1]:2200", 22), Ok(("::1".into(), 2200)));
        assert_eq!(split_host_port("fe80::1", 22), Ok(("fe80::1".into(), 22)));
        assert!(split_host_port("host:port", 22).is_err());
    }
}
