//! The taskscaler engine: a deterministic state machine over instances and job slots.
//!
//! Callers pass `now` into every call and step it with [`Taskscaler::tick`]; the engine asks
//! [`Taskscaler::next_wakeup`] when it next needs a tick, so a driver sleeps on a real clock in
//! production and jumps a virtual clock in the simulator. It owns: slot states (idle, reserved,
//! pending, acquired, unavailable, unhealthy), reservations and acquisitions, the desired
//! capacity from the active policy, scale-up bounded by `max_instances`, the scale throttle,
//! the legacy `MaxGrowthRate` and a back-off after failed creations, scale-down of instances
//! idle beyond `idle_time`, the instance lifecycle (creating → ready check → ready → deleting),
//! heartbeats, lost-instance reporting, removal reasons, metrics and snapshot/restore.
//! It does not run ready commands or heartbeats over SSH itself: it emits
//! [`EngineEvent::ReadyCheckRequested`] and takes the answer through
//! [`Taskscaler::ready_check_finished`]; heartbeats go through [`InstanceGroup::heartbeat`].

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::clock::Moment;
use super::provider::{InstanceGroup, InstanceState, ProviderError};
use super::settings::{AutoscalerSettings, CompiledSettings, SettingsError};

/// Why an instance was removed (exported as a metric label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemovalReason {
    /// Idle beyond `idle_time` and not needed for the idle target.
    Idle,
    /// Reached `max_use_count` / `MaxBuilds`.
    MaxUseCount,
    /// `failure_threshold` consecutive heartbeat failures.
    Unhealthy,
    /// Removed on shutdown (`delete_instances_on_shutdown`).
    Shutdown,
    /// `instance_ready_command` failed.
    ReadyFailed,
    /// The provider reported `timeout` while provisioning.
    ProvisioningFailed,
    /// The provider removed or lost it without being asked.
    Lost,
    /// Listed by the provider but unknown to this manager (no saved state): removed for safety.
    Unknown,
    /// More instances than `max_instances` / `limit` (after a settings change).
    OverLimit,
    /// Restored with acquisitions from before a restart (unless `keep_instance_with_acquisitions`).
    AbandonedAcquisitions,
}

impl RemovalReason {
    /// All reasons, for metric registration.
    pub const ALL: [RemovalReason; 10] = [
        RemovalReason::Idle,
        RemovalReason::MaxUseCount,
        RemovalReason::Unhealthy,
        RemovalReason::Shutdown,
        RemovalReason::ReadyFailed,
        RemovalReason::ProvisioningFailed,
        RemovalReason::Lost,
        RemovalReason::Unknown,
        RemovalReason::OverLimit,
        RemovalReason::AbandonedAcquisitions,
    ];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RemovalReason::Idle => "idle",
            RemovalReason::MaxUseCount => "max_use_count",
            RemovalReason::Unhealthy => "unhealthy",
            RemovalReason::Shutdown => "shutdown",
            RemovalReason::ReadyFailed => "ready_failed",
            RemovalReason::ProvisioningFailed => "provisioning_failed",
            RemovalReason::Lost => "lost",
            RemovalReason::Unknown => "unknown",
            RemovalReason::OverLimit => "over_limit",
            RemovalReason::AbandonedAcquisitions => "abandoned_acquisitions",
        }
    }
}

/// A slot on an instance held for one job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acquisition {
    /// The instance id.
    pub instance: String,
    /// The slot index on it (`0..capacity_per_instance`).
    pub slot: u32,
}

/// What the engine tells its driver.
#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    /// A pending `acquire` got a slot.
    Acquired {
        /// The reservation key.
        key: String,
        /// Where the job runs.
        acquisition: Acquisition,
    },
    /// A pending `acquire` waited `instance_acquire_timeout` without a slot.
    AcquireTimedOut {
        /// The reservation key.
        key: String,
    },
    /// Run `instance_ready_command` on this instance and report with `ready_check_finished`.
    ReadyCheckRequested {
        /// The instance id.
        instance: String,
    },
    /// An instance died under running jobs: fail these jobs (`runner_system_failure`).
    InstanceLost {
        /// The instance id.
        instance: String,
        /// Keys whose acquisitions were on it.
        keys: Vec<String>,
        /// Why it is gone.
        reason: RemovalReason,
    },
    /// A restored instance had acquisitions from before the restart; they are released.
    AcquisitionsAbandoned {
        /// The instance id.
        instance: String,
        /// The saved keys.
        keys: Vec<String>,
    },
    /// The engine decided to remove an instance.
    InstanceRemoved {
        /// The instance id.
        instance: String,
        /// Why.
        reason: RemovalReason,
    },
}

/// Why `reserve` failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReserveError {
    /// No capacity: do not ask GitLab for a job this round.
    #[error("no free capacity")]
    NoCapacity,
    /// The key is already in use.
    #[error("reservation key {0:?} already in use")]
    DuplicateKey(String),
    /// The engine is shutting down.
    #[error("autoscaler is shutting down")]
    ShuttingDown,
}

/// Why an `acquire` (or a poll of one) failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AcquireError {
    /// `acquire` without a prior `reserve`.
    #[error("no reservation for key {0:?}")]
    NotReserved(String),
    /// No slot within `instance_acquire_timeout`.
    #[error("unable to acquire instance within the configured timeout of {0:?}")]
    TimedOut(Duration),
    /// The instance went away under the acquisition.
    #[error("instance {0} unexpectedly removed")]
    InstanceLost(String),
}

/// State of an `acquire`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireStatus {
    /// The slot is assigned.
    Ready(Acquisition),
    /// Still waiting; gives up at `deadline`.
    Waiting {
        /// When the acquire times out.
        deadline: Moment,
    },
}

/// Why `release` failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseError {
    /// The key holds no acquisition (never acquired, or its instance was lost).
    #[error("key {0:?} holds no acquisition")]
    NotAcquired(String),
}

#[derive(Clone, Debug, PartialEq)]
enum KeyState {
    Reserved,
    Pending { deadline: Moment },
    Acquired(Acquisition),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    Creating,
    ReadyCheck,
    Ready,
    Deleting { reason: RemovalReason, requested_at: Option<Moment> },
}

#[derive(Clone, Debug)]
struct Instance {
    phase: Phase,
    created_at: Moment,
    ready_at: Option<Moment>,
    idle_since: Moment,
    use_count: u32,
    slots: Vec<Option<String>>,
    heartbeat_failures: u32,
    next_heartbeat: Moment,
    /// Restored from a snapshot and not yet confirmed by `update()`; holds the saved keys.
    awaiting_adoption: Option<Vec<String>>,
}

impl Instance {
    /// An instance first seen at `now` in the provider's listing, with no history.
    fn discovered(phase: Phase, now: Moment, capacity: u32) -> Self {
        Instance {
            phase,
            created_at: now,
            ready_at: None,
            idle_since: now,
            use_count: 0,
            slots: vec![None; capacity as usize],
            heartbeat_failures: 0,
            next_heartbeat: now,
            awaiting_adoption: None,
        }
    }

    fn active(&self) -> u32 {
        self.slots.iter().filter(|s| s.is_some()).count() as u32
    }

    fn is_deleting(&self) -> bool {
        matches!(self.phase, Phase::Deleting { .. })
    }

    /// Slots this instance can still give out, were it ready.
    fn usable(&self, capacity: u32, max_use: u32) -> u32 {
        let free = capacity.saturating_sub(self.active());
        if max_use == 0 {
            free
        } else {
            free.min(max_use.saturating_sub(self.use_count + self.active()))
        }
    }

    fn retiring(&self, max_use: u32) -> bool {
        max_use > 0 && self.use_count + self.active() >= max_use
    }

    fn assignable(&self) -> bool {
        self.phase == Phase::Ready && self.awaiting_adoption.is_none()
    }
}

/// Gauges and counters, as plain numbers for the metrics module.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EngineMetrics {
    /// Creations requested but not yet listed by the provider.
    pub instances_requested: u32,
    /// Instances provisioning.
    pub instances_creating: u32,
    /// Instances running their ready check.
    pub instances_ready_checking: u32,
    /// Instances in service.
    pub instances_ready: u32,
    /// Instances being removed.
    pub instances_deleting: u32,
    /// Free slots on ready instances.
    pub slots_idle: u32,
    /// Reserved keys not yet acquiring.
    pub slots_reserved: u32,
    /// `acquire` calls waiting for a slot.
    pub slots_pending: u32,
    /// Slots running jobs.
    pub slots_acquired: u32,
    /// Slots that can never be used again (instances at `max_use_count`).
    pub slots_unavailable: u32,
    /// Slots on instances with failing heartbeats (below the threshold).
    pub slots_unhealthy: u32,
    /// The idle target of the last scaling pass (slots).
    pub idle_target: u32,
    /// Instances the last scaling pass wanted.
    pub desired_instances: u32,
    /// Instances requested from the provider in total.
    pub instances_requested_total: u64,
    /// Removals by reason.
    pub instances_removed_total: BTreeMap<RemovalReason, u64>,
    /// Ready-check failures.
    pub ready_failures_total: u64,
    /// Provisioning failures (`timeout`, vanished while creating).
    pub provisioning_failures_total: u64,
    /// Heartbeat failures.
    pub heartbeat_failures_total: u64,
    /// Successful acquisitions.
    pub acquisitions_total: u64,
    /// Acquisitions that timed out.
    pub acquisition_timeouts_total: u64,
    /// Instances lost under running jobs.
    pub instances_lost_total: u64,
    /// Failed provider calls.
    pub provider_errors_total: u64,
}

/// Saved state of one instance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstanceSnapshot {
    /// Provider id.
    pub id: String,
    /// `creating`, `ready` or `deleting`.
    pub phase: SnapshotPhase,
    /// First seen.
    pub created_at: Moment,
    /// When it passed its ready check.
    pub ready_at: Option<Moment>,
    /// Start of the current idle period.
    pub idle_since: Moment,
    /// Jobs completed on it.
    pub use_count: u32,
    /// Keys holding slots when the snapshot was taken.
    pub acquisitions: Vec<String>,
    /// Removal reason when deleting.
    pub removal_reason: Option<RemovalReason>,
}

/// Phase of a saved instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotPhase {
    /// Not yet ready (the ready check is redone after a restart).
    Creating,
    /// In service.
    Ready,
    /// Removal requested.
    Deleting,
}

/// The engine's persistent state (`state_storage`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineSnapshot {
    /// Format version.
    pub version: u32,
    /// When it was taken.
    pub taken_at: Moment,
    /// Every known instance.
    pub instances: Vec<InstanceSnapshot>,
}

/// The taskscaler engine. See the module docs.
pub struct Taskscaler {
    cfg: CompiledSettings,
    instances: BTreeMap<String, Instance>,
    keys: HashMap<String, KeyState>,
    pending_order: VecDeque<String>,
    failed_keys: HashMap<String, AcquireError>,
    requested: VecDeque<Moment>,
    tokens: f64,
    tokens_at: Moment,
    failure_streak: u32,
    create_blocked_until: Moment,
    next_update: Moment,
    last_tick: Moment,
    synced: bool,
    shutting_down: bool,
    dirty: bool,
    wants_more: bool,
    events: Vec<EngineEvent>,
    metrics: EngineMetrics,
}

fn ceil_div(a: u32, b: u32) -> u32 {
    a.div_ceil(b.max(1))
}

impl Taskscaler {
    /// A fresh engine. It makes no scaling decision before its first successful `update()`.
    pub fn new(settings: &AutoscalerSettings, now: Moment) -> Result<Self, SettingsError> {
        let cfg = settings.compile()?;
        let tokens = f64::from(cfg.throttle_burst);
        Ok(Taskscaler {
            cfg,
            instances: BTreeMap::new(),
            keys: HashMap::new(),
            pending_order: VecDeque::new(),
            failed_keys: HashMap::new(),
            requested: VecDeque::new(),
            tokens,
            tokens_at: now,
            failure_streak: 0,
            create_blocked_until: now,
            next_update: now,
            last_tick: now,
            synced: false,
            shutting_down: false,
            dirty: true,
            wants_more: false,
            events: Vec::new(),
            metrics: EngineMetrics::default(),
        })
    }

    /// An engine that adopts the instances of `snapshot` once `update()` confirms they exist,
    /// keeping their use counts, instead of removing them as unknown.
    pub fn restore(
        settings: &AutoscalerSettings,
        snapshot: &EngineSnapshot,
        now: Moment,
    ) -> Result<Self, SettingsError> {
        let mut engine = Self::new(settings, now)?;
        let capacity = engine.cfg.capacity as usize;
        for saved in &snapshot.instances {
            let phase = match saved.phase {
                SnapshotPhase::Creating => Phase::Creating,
                SnapshotPhase::Ready => Phase::Ready,
                SnapshotPhase::Deleting => Phase::Deleting {
                    reason: saved.removal_reason.unwrap_or(RemovalReason::Shutdown),
                    requested_at: Some(snapshot.taken_at),
                },
            };
            engine.instances.insert(
                saved.id.clone(),
                Instance {
                    phase,
                    created_at: saved.created_at,
                    ready_at: saved.ready_at,
                    idle_since: saved.idle_since,
                    use_count: saved.use_count,
                    slots: vec![None; capacity],
                    heartbeat_failures: 0,
                    next_heartbeat: now,
                    awaiting_adoption: Some(saved.acquisitions.clone()),
                },
            );
        }
        Ok(engine)
    }

    /// The state to persist. Keys of running jobs are saved with their instance.
    pub fn snapshot(&self, now: Moment) -> EngineSnapshot {
        let instances = self
            .instances
            .iter()
            .map(|(id, i)| {
                let (phase, removal_reason) = match i.phase {
                    Phase::Creating | Phase::ReadyCheck => (SnapshotPhase::Creating, None),
                    Phase::Ready => (SnapshotPhase::Ready, None),
                    Phase::Deleting { reason, .. } => (SnapshotPhase::Deleting, Some(reason)),
                };
                let mut acquisitions: Vec<String> = i.slots.iter().flatten().cloned().collect();
                if let Some(saved) = &i.awaiting_adoption {
                    acquisitions.extend(saved.iter().cloned());
                }
                InstanceSnapshot {
                    id: id.clone(),
                    phase,
                    created_at: i.created_at,
                    ready_at: i.ready_at,
                    idle_since: i.idle_since,
                    use_count: i.use_count,
                    acquisitions,
                    removal_reason,
                }
            })
            .collect();
        EngineSnapshot { version: 1, taken_at: now, instances }
    }

    /// Settings in force.
    pub fn settings(&self) -> &CompiledSettings {
        &self.cfg
    }

    /// Claim capacity for a job before asking GitLab for one. In preemptive mode only when an
    /// idle slot on a ready instance is free; otherwise while `max_instances` allows.
    pub fn reserve(&mut self, key: &str, now: Moment) -> Result<(), ReserveError> {
        if self.shutting_down {
            return Err(ReserveError::ShuttingDown);
        }
        if self.keys.contains_key(key) {
            return Err(ReserveError::DuplicateKey(key.to_string()));
        }
        let census = self.census();
        let demand = census.reserved + census.pending;
        let ok = if self.cfg.active_policy(now).preemptive() {
            census.idle > demand
        } else if self.cfg.max_instances > 0 {
            let max_slots = self.cfg.max_instances.saturating_mul(self.cfg.capacity);
            census.acquired + demand + census.unavailable < max_slots
        } else {
            true
        };
        if !ok {
            return Err(ReserveError::NoCapacity);
        }
        self.keys.insert(key.to_string(), KeyState::Reserved);
        self.failed_keys.remove(key);
        self.dirty = true;
        Ok(())
    }

    /// Give back a reservation (GitLab had no job), or cancel a waiting acquire.
    pub fn unreserve(&mut self, key: &str) -> bool {
        self.failed_keys.remove(key);
        match self.keys.get(key) {
            Some(KeyState::Reserved) | Some(KeyState::Pending { .. }) => {
                self.keys.remove(key);
                self.pending_order.retain(|k| k != key);
                self.dirty = true;
                true
            }
            _ => false,
        }
    }

    /// Ask for a slot for a reserved key. Returns the slot at once when one is free, else the
    /// deadline; the outcome arrives as an [`EngineEvent`] and through [`Taskscaler::poll_acquire`].
    pub fn acquire(&mut self, key: &str, now: Moment) -> Result<AcquireStatus, AcquireError> {
        match self.keys.get(key) {
            Some(KeyState::Reserved) => {}
            Some(_) => return self.poll_acquire(key),
            None => return Err(AcquireError::NotReserved(key.to_string())),
        }
        let deadline = now.plus(self.cfg.raw.instance_acquire_timeout);
        self.keys.insert(key.to_string(), KeyState::Pending { deadline });
        self.pending_order.push_back(key.to_string());
        self.dirty = true;
        self.assign_pending();
        self.poll_acquire(key)
    }

    /// Where an `acquire` stands. A failure is reported once, then forgotten.
    pub fn poll_acquire(&mut self, key: &str) -> Result<AcquireStatus, AcquireError> {
        match self.keys.get(key) {
            Some(KeyState::Acquired(a)) => Ok(AcquireStatus::Ready(a.clone())),
            Some(KeyState::Pending { deadline }) => Ok(AcquireStatus::Waiting { deadline: *deadline }),
            Some(KeyState::Reserved) | None => {
                Err(self.failed_keys.remove(key).unwrap_or_else(|| AcquireError::NotReserved(key.to_string())))
            }
        }
    }

    /// The job is done: free the slot, count a use, retire the instance at `max_use_count`.
    pub fn release(&mut self, key: &str, now: Moment) -> Result<(), ReleaseError> {
        let Some(KeyState::Acquired(a)) = self.keys.get(key).cloned() else {
            return Err(ReleaseError::NotAcquired(key.to_string()));
        };
        self.keys.remove(key);
        if let Some(inst) = self.instances.get_mut(&a.instance) {
            if let Some(slot) = inst.slots.get_mut(a.slot as usize) {
                *slot = None;
            }
            inst.use_count += 1;
            if inst.active() == 0 {
                inst.idle_since = now;
            }
        }
        self.dirty = true;
        Ok(())
    }

    /// Result of an `instance_ready_command` requested by [`EngineEvent::ReadyCheckRequested`].
    pub fn ready_check_finished(&mut self, instance: &str, result: Result<(), String>, now: Moment) {
        let Some(inst) = self.instances.get(instance) else { return };
        if inst.phase != Phase::ReadyCheck {
            return;
        }
        match result {
            Ok(()) => self.mark_ready(instance, now),
            Err(_) => {
                self.metrics.ready_failures_total += 1;
                self.record_creation_failure(now);
                self.mark_for_removal(instance, RemovalReason::ReadyFailed);
            }
        }
        self.dirty = true;
    }

    /// The connector found an instance unreachable (a job's connection dropped and a probe
    /// failed `failure_threshold` times): remove it and report jobs still on it as lost.
    pub fn instance_unhealthy(&mut self, instance: &str) {
        if self.instances.get(instance).is_some_and(|i| !i.is_deleting()) {
            self.metrics.heartbeat_failures_total += 1;
            self.mark_for_removal(instance, RemovalReason::Unhealthy);
            self.dirty = true;
        }
    }

    /// Stop reserving and creating; with `delete_instances_on_shutdown`, remove every instance
    /// without running jobs.
    pub fn shutdown(&mut self, now: Moment, provider: &mut dyn InstanceGroup) {
        self.shutting_down = true;
        if self.cfg.raw.delete_instances_on_shutdown {
            let ids: Vec<String> = self
                .instances
                .iter()
                .filter(|(_, i)| !i.is_deleting() && i.active() == 0)
                .map(|(id, _)| id.clone())
                .collect();
            for id in ids {
                self.mark_for_removal(&id, RemovalReason::Shutdown);
            }
            self.request_deletions(now, provider);
        }
    }

    /// Whether a reserve/acquire/release since the last tick wants a tick now.
    pub fn needs_tick(&self) -> bool {
        self.dirty
    }

    /// Events since the last call.
    pub fn take_events(&mut self) -> Vec<EngineEvent> {
        std::mem::take(&mut self.events)
    }

    /// Current gauges and counters.
    pub fn metrics(&self) -> EngineMetrics {
        let c = self.census();
        let mut m = self.metrics.clone();
        m.instances_requested = self.requested.len() as u32;
        m.instances_creating = c.creating;
        m.instances_ready_checking = c.ready_checking;
        m.instances_ready = c.ready;
        m.instances_deleting = c.deleting;
        m.slots_idle = c.idle;
        m.slots_reserved = c.reserved;
        m.slots_pending = c.pending;
        m.slots_acquired = c.acquired;
        m.slots_unavailable = c.unavailable;
        m.slots_unhealthy = c.unhealthy;
        m
    }

    /// Instances in any state, including requested ones not yet listed by the provider.
    pub fn instance_count(&self) -> u32 {
        (self.instances.len() + self.requested.len()) as u32
    }

    /// The instances the engine knows, with `(id, use_count, active jobs)`, for logs and tests.
    pub fn instance_summary(&self) -> Vec<(String, u32, u32)> {
        self.instances.iter().map(|(id, i)| (id.clone(), i.use_count, i.active())).collect()
    }

    /// When the engine next needs a tick (timers, polls, deadlines). `None` never happens in
    /// practice: the provider poll is always scheduled.
    pub fn next_wakeup(&self) -> Moment {
        let mut t = self.next_update;
        let mut consider = |m: Moment| {
            if m < t {
                t = m;
            }
        };
        for state in self.keys.values() {
            if let KeyState::Pending { deadline } = state {
                consider(*deadline);
            }
        }
        let idle_time = self.cfg.active_policy(self.last_tick).idle_time();
        for inst in self.instances.values() {
            if inst.phase == Phase::Ready {
                if self.cfg.raw.heartbeat_interval.is_some() {
                    consider(inst.next_heartbeat);
                }
                if inst.active() == 0 {
                    let expiry = inst.idle_since.plus(idle_time);
                    if expiry > self.last_tick {
                        consider(expiry);
                    }
                }
            }
        }
        if self.wants_more {
            let mut ready_at = self.create_blocked_until.max(self.last_tick);
            if let Some(rate) = self.cfg.throttle_rate {
                if self.tokens < 1.0 {
                    let wait = Duration::from_secs_f64((1.0 - self.tokens) / rate);
                    ready_at = ready_at.max(self.tokens_at.plus(wait));
                }
            }
            if ready_at > self.last_tick {
                consider(ready_at);
            }
        }
        if let Some(first) = self.requested.front() {
            consider(first.plus(self.cfg.raw.pending_request_timeout));
        }
        if self.cfg.policies.len() > 1 {
            let minute = 60_000;
            consider(Moment((self.last_tick.0 / minute + 1) * minute));
        }
        t
    }

    /// One step: expire acquisitions, poll the provider when due, heartbeats, assign slots,
    /// scale up or down.
    pub fn tick(&mut self, now: Moment, provider: &mut dyn InstanceGroup) {
        self.last_tick = now;
        self.refill_tokens(now);
        self.expire_pending(now);
        if now >= self.next_update {
            self.poll_provider(now, provider);
        }
        self.heartbeats(now, provider);
        self.assign_pending();
        if self.synced {
            self.scale(now, provider);
        }
        self.request_deletions(now, provider);
        self.dirty = false;
    }

    // ---- internals ------------------------------------------------------------------------

    fn census(&self) -> Census {
        let mut c = Census::default();
        let cap = self.cfg.capacity;
        let max_use = self.cfg.max_use;
        for inst in self.instances.values() {
            let active = inst.active();
            match inst.phase {
                Phase::Deleting { .. } => {
                    c.deleting += 1;
                    continue;
                }
                Phase::Creating => c.creating += 1,
                Phase::ReadyCheck => c.ready_checking += 1,
                Phase::Ready => c.ready += 1,
            }
            c.acquired += active;
            let usable = inst.usable(cap, max_use);
            c.unavailable += cap - active - usable;
            if inst.assignable() {
                if inst.heartbeat_failures > 0 {
                    c.unhealthy += usable;
                } else {
                    c.idle += usable;
                }
            }
        }
        for state in self.keys.values() {
            match state {
                KeyState::Reserved => c.reserved += 1,
                KeyState::Pending { .. } => c.pending += 1,
                KeyState::Acquired(_) => {}
            }
        }
        c
    }

    fn refill_tokens(&mut self, now: Moment) {
        if let Some(rate) = self.cfg.throttle_rate {
            let elapsed = now.since(self.tokens_at).as_secs_f64();
            self.tokens = (self.tokens + elapsed * rate).min(f64::from(self.cfg.throttle_burst));
        }
        self.tokens_at = now;
    }

    fn expire_pending(&mut self, now: Moment) {
        let expired: Vec<String> = self
            .pending_order
            .iter()
            .filter(|k| matches!(self.keys.get(*k), Some(KeyState::Pending { deadline }) if *deadline <= now))
            .cloned()
            .collect();
        for key in expired {
            self.keys.remove(&key);
            self.pending_order.retain(|k| *k != key);
            self.failed_keys.insert(key.clone(), AcquireError::TimedOut(self.cfg.raw.instance_acquire_timeout));
            self.metrics.acquisition_timeouts_total += 1;
            self.events.push(EngineEvent::AcquireTimedOut { key });
        }
    }

    /// Give waiting keys slots, first come first served. Packs: the busiest ready instance with
    /// a free slot wins (ties: the one ready first), so other instances can drain and go idle.
    fn assign_pending(&mut self) {
        let cap = self.cfg.capacity;
        let max_use = self.cfg.max_use;
        while let Some(key) = self.pending_order.front().cloned() {
            let best = self
                .instances
                .iter()
                .filter(|(_, i)| i.assignable() && i.heartbeat_failures == 0 && i.usable(cap, max_use) > 0)
                .max_by(|(_, a), (_, b)| a.active().cmp(&b.active()).then_with(|| b.ready_at.cmp(&a.ready_at)))
                .map(|(id, _)| id.clone());
            let Some(id) = best else { break };
            self.pending_order.pop_front();
            let Some(inst) = self.instances.get_mut(&id) else { break };
            let Some(slot) = inst.slots.iter().position(|s| s.is_none()) else { break };
            inst.slots[slot] = Some(key.clone());
            let acquisition = Acquisition { instance: id, slot: slot as u32 };
            self.keys.insert(key.clone(), KeyState::Acquired(acquisition.clone()));
            self.metrics.acquisitions_total += 1;
            self.events.push(EngineEvent::Acquired { key, acquisition });
        }
    }

    fn mark_ready(&mut self, id: &str, now: Moment) {
        let interval = self.cfg.raw.heartbeat_interval;
        if let Some(inst) = self.instances.get_mut(id) {
            inst.phase = Phase::Ready;
            inst.ready_at = Some(now);
            inst.idle_since = now;
            inst.next_heartbeat = interval.map_or(now, |d| now.plus(d));
            self.failure_streak = 0;
        }
    }

    fn record_creation_failure(&mut self, now: Moment) {
        self.failure_streak = self.failure_streak.saturating_add(1);
        let base = self.cfg.raw.ready_failure_backoff.as_secs_f64();
        let max = self.cfg.raw.ready_failure_backoff_max.as_secs_f64();
        let exponent = self.failure_streak.saturating_sub(1).min(30);
        let backoff = (base * 2f64.powi(exponent as i32)).min(max);
        let until = now.plus(Duration::from_secs_f64(backoff));
        self.create_blocked_until = self.create_blocked_until.max(until);
    }

    /// Mark an instance for removal; report keys of jobs running on it as lost.
    fn mark_for_removal(&mut self, id: &str, reason: RemovalReason) {
        let Some(inst) = self.instances.get_mut(id) else { return };
        if inst.is_deleting() {
            return;
        }
        inst.phase = Phase::Deleting { reason, requested_at: None };
        let keys: Vec<String> = inst.slots.iter_mut().filter_map(Option::take).collect();
        *self.metrics.instances_removed_total.entry(reason).or_insert(0) += 1;
        if !keys.is_empty() {
            for key in &keys {
                self.keys.remove(key);
                self.failed_keys.insert(key.clone(), AcquireError::InstanceLost(id.to_string()));
            }
            self.metrics.instances_lost_total += 1;
            self.events.push(EngineEvent::InstanceLost { instance: id.to_string(), keys, reason });
        }
        self.events.push(EngineEvent::InstanceRemoved { instance: id.to_string(), reason });
    }

    /// The provider removed an instance we did not ask it to remove.
    fn instance_vanished(&mut self, id: &str, now: Moment) {
        let Some(inst) = self.instances.get(id) else { return };
        match inst.phase {
            Phase::Deleting { .. } => {}
            Phase::Creating | Phase::ReadyCheck => {
                self.metrics.provisioning_failures_total += 1;
                self.record_creation_failure(now);
                self.mark_for_removal(id, RemovalReason::ProvisioningFailed);
            }
            Phase::Ready => self.mark_for_removal(id, RemovalReason::Lost),
        }
    }

    fn became_running(&mut self, id: &str, now: Moment) {
        if self.cfg.raw.instance_ready_command.is_some() {
            if let Some(inst) = self.instances.get_mut(id) {
                inst.phase = Phase::ReadyCheck;
            }
            self.events.push(EngineEvent::ReadyCheckRequested { instance: id.to_string() });
        } else {
            self.mark_ready(id, now);
        }
    }

    fn adopt(&mut self, id: &str) {
        let keep = self.cfg.raw.keep_instance_with_acquisitions;
        let Some(inst) = self.instances.get_mut(id) else { return };
        let Some(saved) = inst.awaiting_adoption.take() else { return };
        if saved.is_empty() {
            return;
        }
        if keep {
            inst.use_count += saved.len() as u32;
        }
        self.events.push(EngineEvent::AcquisitionsAbandoned { instance: id.to_string(), keys: saved });
        if !keep {
            self.mark_for_removal(id, RemovalReason::AbandonedAcquisitions);
        }
    }

    fn poll_provider(&mut self, now: Moment, provider: &mut dyn InstanceGroup) {
        let listed = match provider.update() {
            Ok(listed) => listed,
            Err(_) => {
                self.metrics.provider_errors_total += 1;
                self.next_update = now.plus(self.cfg.raw.update_interval_when_expecting);
                return;
            }
        };
        // Forget creations the provider never delivered.
        let timeout = self.cfg.raw.pending_request_timeout;
        while self.requested.front().is_some_and(|t| t.plus(timeout) <= now) {
            self.requested.pop_front();
            self.metrics.provisioning_failures_total += 1;
        }
        let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::with_capacity(listed.len());
        for (id, state) in &listed {
            seen.insert(id.as_str());
            if !self.instances.contains_key(id) {
                let alive = matches!(state, InstanceState::Creating | InstanceState::Running | InstanceState::Timeout);
                if !alive {
                    continue;
                }
                if self.requested.pop_front().is_some() {
                    self.instances.insert(id.clone(), Instance::discovered(Phase::Creating, now, self.cfg.capacity));
                } else {
                    // No saved state for it: remove for safety.
                    self.instances.insert(
                        id.clone(),
                        Instance::discovered(
                            Phase::Deleting { reason: RemovalReason::Unknown, requested_at: None },
                            now,
                            self.cfg.capacity,
                        ),
                    );
                    *self.metrics.instances_removed_total.entry(RemovalReason::Unknown).or_insert(0) += 1;
                    self.events
                        .push(EngineEvent::InstanceRemoved { instance: id.clone(), reason: RemovalReason::Unknown });
                    continue;
                }
            }
            let Some(phase) = self.instances.get(id).map(|i| i.phase) else { continue };
            match (phase, state) {
                (
                    Phase::Deleting { requested_at, reason },
                    InstanceState::Creating | InstanceState::Running | InstanceState::Timeout,
                ) => {
                    // Still there: ask again once the retry interval has passed.
                    if requested_at.is_some_and(|t| t.plus(self.cfg.raw.deletion_retry_interval) <= now) {
                        if let Some(inst) = self.instances.get_mut(id) {
                            inst.phase = Phase::Deleting { reason, requested_at: None };
                        }
                    }
                }
                (Phase::Deleting { .. }, _) => {}
                (_, InstanceState::Deleted) | (_, InstanceState::Deleting) => self.instance_vanished(id, now),
                (Phase::Creating, InstanceState::Running) => {
                    if self.instances.get(id).is_some_and(|i| i.awaiting_adoption.is_some()) {
                        // A restored instance that was still provisioning: the ready check reruns.
                        if let Some(inst) = self.instances.get_mut(id) {
                            inst.awaiting_adoption = None;
                        }
                    }
                    self.became_running(id, now);
                }
                (Phase::Creating | Phase::ReadyCheck, InstanceState::Timeout) => {
                    self.metrics.provisioning_failures_total += 1;
                    self.record_creation_failure(now);
                    self.mark_for_removal(id, RemovalReason::ProvisioningFailed);
                }
                (Phase::Ready, InstanceState::Timeout) => self.mark_for_removal(id, RemovalReason::Lost),
                (Phase::Ready, InstanceState::Running) => self.adopt(id),
                (Phase::Creating, InstanceState::Creating)
                | (Phase::ReadyCheck, _)
                | (Phase::Ready, InstanceState::Creating) => {}
            }
        }
        let missing: Vec<String> = self.instances.keys().filter(|id| !seen.contains(id.as_str())).cloned().collect();
        for id in missing {
            let restored_unconfirmed = self.instances.get(&id).is_some_and(|i| i.awaiting_adoption.is_some());
            if !restored_unconfirmed {
                self.instance_vanished(&id, now);
            }
            self.instances.remove(&id);
        }
        self.synced = true;
        let expecting = !self.requested.is_empty()
            || self.instances.values().any(|i| i.phase == Phase::Creating || i.is_deleting());
        let interval =
            if expecting { self.cfg.raw.update_interval_when_expecting } else { self.cfg.raw.update_interval };
        self.next_update = now.plus(interval);
    }

    fn heartbeats(&mut self, now: Moment, provider: &mut dyn InstanceGroup) {
        let Some(interval) = self.cfg.raw.heartbeat_interval else { return };
        let due: Vec<String> = self
            .instances
            .iter()
            .filter(|(_, i)| i.phase == Phase::Ready && i.awaiting_adoption.is_none() && i.next_heartbeat <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            let result = provider.heartbeat(&id);
            let threshold = self.cfg.raw.failure_threshold.max(1);
            let Some(inst) = self.instances.get_mut(&id) else { continue };
            inst.next_heartbeat = now.plus(interval);
            match result {
                Ok(()) => inst.heartbeat_failures = 0,
                Err(_) => {
                    inst.heartbeat_failures += 1;
                    self.metrics.heartbeat_failures_total += 1;
                    if inst.heartbeat_failures >= threshold {
                        self.mark_for_removal(&id, RemovalReason::Unhealthy);
                    }
                }
            }
        }
    }

    fn scale(&mut self, now: Moment, provider: &mut dyn InstanceGroup) {
        let cap = self.cfg.capacity;
        let max_use = self.cfg.max_use;
        // Instances that used up max_use_count leave as soon as their last job is done.
        let retired: Vec<String> = self
            .instances
            .iter()
            .filter(|(_, i)| i.assignable() && i.active() == 0 && i.retiring(max_use))
            .map(|(id, _)| id.clone())
            .collect();
        for id in retired {
            self.mark_for_removal(&id, RemovalReason::MaxUseCount);
        }

        let policy = self.cfg.active_policy(now);
        let c = self.census();
        // A reservation is only a job request in flight. In preemptive mode it holds an idle
        // slot; otherwise it must not create demand, or an idle runner polling GitLab would
        // keep an instance forever and never scale to zero.
        let held = if policy.preemptive() { c.reserved } else { 0 };
        let in_use = c.acquired + held + c.pending;
        let idle_target = if self.shutting_down { 0 } else { self.cfg.idle_target(&policy, in_use) };
        let needed_slots = in_use + c.unavailable + idle_target;
        let mut required = ceil_div(needed_slots, cap);
        if self.cfg.max_instances > 0 {
            required = required.min(self.cfg.max_instances);
        }
        let in_creation = self.requested.len() as u32 + c.creating + c.ready_checking;
        let current = in_creation + c.ready;
        let total = current + c.deleting;
        self.metrics.idle_target = idle_target;
        self.metrics.desired_instances = required;

        // Scale up.
        self.wants_more = required > current && !self.shutting_down;
        if self.wants_more {
            let mut n = required - current;
            if self.cfg.max_instances > 0 {
                n = n.min(self.cfg.max_instances.saturating_sub(total));
            }
            if self.cfg.max_growth > 0 {
                n = n.min(self.cfg.max_growth.saturating_sub(in_creation));
            }
            if self.failure_streak > 0 {
                // While creations keep failing, probe with one instance at a time.
                n = n.min(1u32.saturating_sub(in_creation));
            }
            if now < self.create_blocked_until {
                n = 0;
            }
            if self.cfg.throttle_rate.is_some() {
                n = n.min(self.tokens.floor().max(0.0) as u32);
            }
            if n > 0 {
                match provider.increase(n) {
                    Ok(granted) => {
                        for _ in 0..granted {
                            self.requested.push_back(now);
                        }
                        if self.cfg.throttle_rate.is_some() {
                            self.tokens -= f64::from(granted);
                        }
                        self.metrics.instances_requested_total += u64::from(granted);
                        if granted > 0 {
                            self.next_update =
                                self.next_update.min(now.plus(self.cfg.raw.update_interval_when_expecting));
                        }
                    }
                    Err(ProviderError::Capacity { retry_after }) => {
                        self.metrics.provider_errors_total += 1;
                        let wait = retry_after.unwrap_or(self.cfg.raw.update_interval);
                        self.create_blocked_until = self.create_blocked_until.max(now.plus(wait));
                    }
                    Err(ProviderError::Other(_)) => {
                        self.metrics.provider_errors_total += 1;
                        let wait = self.cfg.raw.update_interval_when_expecting;
                        self.create_blocked_until = self.create_blocked_until.max(now.plus(wait));
                    }
                }
            }
        }

        // Scale down: idle instances beyond idle_time that the target does not need,
        // longest idle first; over the instance limit, idle ones go regardless of idle_time.
        let excess = current.saturating_sub(required);
        let over_limit = if self.cfg.max_instances > 0 { total.saturating_sub(self.cfg.max_instances) } else { 0 };
        if excess == 0 && over_limit == 0 {
            return;
        }
        let idle_time = policy.idle_time();
        let mut idle: Vec<(Moment, String)> = self
            .instances
            .iter()
            .filter(|(_, i)| i.assignable() && i.active() == 0 && i.usable(cap, max_use) > 0)
            .map(|(id, i)| (i.idle_since, id.clone()))
            .collect();
        idle.sort();
        let mut removed = 0;
        for (idle_since, id) in idle {
            if removed < over_limit {
                self.mark_for_removal(&id, RemovalReason::OverLimit);
                removed += 1;
            } else if removed < excess.max(over_limit) && idle_since.plus(idle_time) <= now {
                self.mark_for_removal(&id, RemovalReason::Idle);
                removed += 1;
            }
        }
    }

    fn request_deletions(&mut self, now: Moment, provider: &mut dyn InstanceGroup) {
        let ids: Vec<String> = self
            .instances
            .iter()
            .filter(|(_, i)| matches!(i.phase, Phase::Deleting { requested_at: None, .. }))
            .map(|(id, _)| id.clone())
            .collect();
        if ids.is_empty() {
            return;
        }
        if provider.decrease(&ids).is_err() {
            self.metrics.provider_errors_total += 1;
        }
        // Accepted or not, wait for the retry interval: `update()` shows whether it worked.
        for id in &ids {
            if let Some(inst) = self.instances.get_mut(id) {
                if let Phase::Deleting { reason, .. } = inst.phase {
                    inst.phase = Phase::Deleting { reason, requested_at: Some(now) };
                }
            }
        }
        self.next_update = self.next_update.min(now.plus(self.cfg.raw.update_interval_when_expecting));
    }
}

#[derive(Debug, Default)]
struct Census {
    creating: u32,
    ready_checking: u32,
    ready: u32,
    deleting: u32,
    idle: u32,
    reserved: u32,
    pending: u32,
    acquired: u32,
    unavailable: u32,
    unhealthy: u32,
}
