//! The taskscaler engine: a deterministic state machine over instances and job slots.
//!
//! Callers pass `now` into every call and step it with [`Taskscaler::tick`]; the engine asks
//! [`Taskscaler::next_wakeup`] when it next needs a tick, so a driver sleeps on a real clock in
//! production and jumps a virtual clock in the simulator. It owns: slot states (idle, reserved,
//! pending, acquired, unavailable, unhealthy), reservations and acquisitions, the desired
//! capacity from the active policy, scale-up bounded by `max_instances`, the scale throttle,
//! the legacy `MaxGrowthRate` and a back-off after failed creations, scale-down of instances
//! idle beyond `idle_time`, the instance lifecycle (creating → ready check → ready → deleting),
//! heartbeats, lost-instance reporting, removal reasons, metrics and snapshot/restore; the
//! draining of instances with interruption notices, the back-off while the provider fails (no
//! reservation it could not honour meanwhile) and the adoption of instances a self-launching
//! group started on its own.
//! It does not run ready commands or heartbeats over SSH itself: it emits
//! [`EngineEvent::ReadyCheckRequested`] and takes the answer through
//! [`Taskscaler::ready_check_finished`]; heartbeats go through [`InstanceGroup::heartbeat`].
//!
//! This file holds the engine's state and its public calls; `scaling` holds what a tick does
//! (provider polling, heartbeats, slot assignment, scale up/down, deletions), `instances` the
//! table of instances with its running census, `keys` the table of job keys with its counts
//! by state, `restored` the acquisitions a restarted manager holds
//! for jobs it may resume, and `types` the plain types the engine hands out (events, errors,
//! metrics, snapshots).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use super::clock::Moment;
use super::predictive::Predictor;
use super::provider::{InstanceGroup, InstanceState};
use super::settings::{AutoscalerSettings, CompiledSettings, SettingsError};
use super::throttle::TokenBucket;

mod instances;
mod keys;
mod restored;
mod scaling;
mod types;

pub use types::{
    AcquireError, AcquireStatus, Acquisition, EngineEvent, EngineMetrics, EngineSnapshot, InstanceSnapshot,
    InstanceTiming, NotReady, ReleaseError, RemovalReason, ReserveError, SnapshotPhase, TimingHistogram,
};

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
    /// When the creation was requested (unknown for adopted or discovered instances).
    requested_at: Option<Moment>,
    created_at: Moment,
    ready_at: Option<Moment>,
    idle_since: Moment,
    use_count: u32,
    slots: Vec<Option<String>>,
    heartbeat_failures: u32,
    next_heartbeat: Moment,
    /// Restored from a snapshot and not yet confirmed by `update()`; holds the saved keys.
    awaiting_adoption: Option<Vec<String>>,
    /// The provider announced it takes this instance away (its reason): draining, no new jobs.
    interrupted: Option<String>,
    /// When its removal was first asked of the provider (the deletion time's start).
    removal_requested_at: Option<Moment>,
}

impl Instance {
    /// An instance first seen at `now` in the provider's listing, with no history.
    fn discovered(phase: Phase, now: Moment, capacity: u32) -> Self {
        Instance {
            phase,
            requested_at: None,
            created_at: now,
            ready_at: None,
            idle_since: now,
            use_count: 0,
            slots: vec![None; capacity as usize],
            heartbeat_failures: 0,
            next_heartbeat: now,
            awaiting_adoption: None,
            interrupted: None,
            removal_requested_at: None,
        }
    }

    fn active(&self) -> u32 {
        self.slots.iter().filter(|s| s.is_some()).count() as u32
    }

    fn is_deleting(&self) -> bool {
        matches!(self.phase, Phase::Deleting { .. })
    }

    /// Slots this instance can still give out, were it ready (none once interrupted: its free
    /// slots leave the capacity, so the policy replaces them).
    fn usable(&self, capacity: u32, max_use: u32) -> u32 {
        self.usable_with(self.active(), capacity, max_use)
    }

    /// [`Instance::usable`] with `active` (= [`Instance::active`]) already counted: hot loops
    /// count the slots once.
    fn usable_with(&self, active: u32, capacity: u32, max_use: u32) -> u32 {
        let free = capacity.saturating_sub(active);
        if self.interrupted.is_some() {
            0
        } else if max_use == 0 {
            free
        } else {
            free.min(max_use.saturating_sub(self.use_count + active))
        }
    }

    fn retiring(&self, max_use: u32) -> bool {
        max_use > 0 && self.use_count + self.active() >= max_use
    }

    fn assignable(&self) -> bool {
        self.phase == Phase::Ready && self.awaiting_adoption.is_none() && self.interrupted.is_none()
    }
}

/// The taskscaler engine. See the module docs.
pub struct Taskscaler {
    cfg: CompiledSettings,
    instances: instances::Instances,
    keys: keys::Keys,
    pending_order: VecDeque<String>,
    failed_keys: HashMap<String, AcquireError>,
    requested: VecDeque<Moment>,
    /// The scale throttle (instance requests per second), when one is set.
    throttle: Option<TokenBucket>,
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
    predictor: Option<Predictor>,
    /// Consecutive failed `update()` calls (0: the provider answers).
    provider_failures: u32,
    /// The last provider error while `provider_failures > 0`.
    provider_error: Option<String>,
    /// Restored acquisitions held for jobs that may resume (see `restored`).
    restored: BTreeSet<String>,
    /// The provider's last listing, kept so the next poll reuses its strings.
    listing: Vec<(String, InstanceState)>,
}

impl Taskscaler {
    /// A fresh engine. It makes no scaling decision before its first successful `update()`.
    pub fn new(settings: &AutoscalerSettings, now: Moment) -> Result<Self, SettingsError> {
        let cfg = settings.compile()?;
        let throttle = cfg.throttle_rate.map(|rate| TokenBucket::full(rate, cfg.throttle_burst, now));
        let predictor = cfg.raw.predictive.clone().map(|p| Predictor::new(p, None));
        Ok(Taskscaler {
            instances: instances::Instances::new(cfg.capacity, cfg.max_use),
            cfg,
            keys: keys::Keys::default(),
            pending_order: VecDeque::new(),
            failed_keys: HashMap::new(),
            requested: VecDeque::new(),
            throttle,
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
            predictor,
            provider_failures: 0,
            provider_error: None,
            restored: BTreeSet::new(),
            listing: Vec::new(),
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
        if let (Some(p), Some(saved)) = (&settings.predictive, &snapshot.predictor) {
            engine.predictor = Some(Predictor::new(p.clone(), Some(saved.clone())));
        }
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
                    requested_at: None,
                    created_at: saved.created_at,
                    ready_at: saved.ready_at,
                    idle_since: saved.idle_since,
                    use_count: saved.use_count,
                    slots: vec![None; capacity],
                    heartbeat_failures: 0,
                    next_heartbeat: now,
                    awaiting_adoption: Some(saved.acquisitions.clone()),
                    interrupted: None,
                    removal_requested_at: None,
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
        EngineSnapshot {
            version: 1,
            taken_at: now,
            instances,
            predictor: self.predictor.as_ref().map(|p| p.state().clone()),
        }
    }

    /// Settings in force.
    pub fn settings(&self) -> &CompiledSettings {
        &self.cfg
    }

    /// The predictive policy's forecaster, when `[runners.autoscaler.predictive]` is enabled.
    pub fn predictor(&self) -> Option<&Predictor> {
        self.predictor.as_ref()
    }

    /// Whether reservations need a ready idle slot at `now`. The predictive policy never
    /// reserves preemptively: a queued job must become demand at once.
    fn preemptive(&self, now: Moment) -> bool {
        self.predictor.is_none() && self.cfg.active_policy(now).preemptive()
    }

    /// How long an instance above the idle target may stay idle at `now`: the predictive
    /// policy's learned keep-alive, else the active policy's `idle_time`.
    fn idle_time(&self, now: Moment) -> Duration {
        match &self.predictor {
            Some(p) => p.keep_alive(now),
            None => self.cfg.active_policy(now).idle_time(),
        }
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
        // While the provider fails no instance can be created: only idle slots on ready
        // instances can take a job, so no job is asked for that could not run.
        let provider_down = self.provider_failures > 0;
        let ok = if provider_down || self.preemptive(now) {
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
        if let Some(p) = &mut self.predictor {
            p.observe_arrival(now);
        }
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
        if let Some(mut inst) = self.instances.get_mut(&a.instance) {
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
    pub fn ready_check_finished(&mut self, instance: &str, result: Result<(), NotReady>, now: Moment) {
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
        m.instances_interrupted = self.instances.values().filter(|i| i.interrupted.is_some()).count() as u32;
        m.provider_consecutive_failures = self.provider_failures;
        m
    }

    /// The provider's last error while its `update()` keeps failing (`None` when it answers).
    pub fn provider_error(&self) -> Option<&str> {
        self.provider_error.as_deref()
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
        for key in &self.pending_order {
            if let Some(KeyState::Pending { deadline }) = self.keys.get(key) {
                consider(*deadline);
            }
        }
        let idle_time = self.idle_time(self.last_tick);
        if let Some(p) = &self.predictor {
            consider(p.next_change(self.last_tick));
        }
        if self.cfg.raw.heartbeat_interval.is_some() {
            if let Some(at) = self.instances.first_heartbeat() {
                consider(at);
            }
        }
        if let Some(expiry) = self.instances.next_idle_expiry(self.last_tick, idle_time) {
            consider(expiry);
        }
        if self.wants_more {
            let mut ready_at = self.create_blocked_until.max(self.last_tick);
            if let Some(bucket) = &self.throttle {
                if let Some(wait) = bucket.wait_for_token() {
                    ready_at = ready_at.max(bucket.counted_at().plus(wait));
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
            consider(self.cfg.next_policy_check(self.last_tick));
        }
        t
    }

    /// One step: expire acquisitions, poll the provider when due, heartbeats, assign slots,
    /// scale up or down.
    pub fn tick(&mut self, now: Moment, provider: &mut dyn InstanceGroup) {
        self.last_tick = now;
        if let Some(bucket) = &mut self.throttle {
            bucket.refill(now);
        }
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
}
