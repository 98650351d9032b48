//! The scaling engine: slots on instances, reservations and acquisitions, and the policy
//! arithmetic that turns them into create and delete actions.
//!
//! Slot states follow taskscaler: idle (free on a ready instance), reserved (claimed before
//! asking GitLab for a job), acquired (running a job), unavailable (on an instance that
//! reached `max_use_count` and only finishes its work), plus keys pending for a slot.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

/// How many instances there should be.
#[derive(Debug, Clone, PartialEq)]
pub enum Policy {
    /// Taskscaler (`[[runners.autoscaler.policy]]`): `idle_count` counts job slots.
    Taskscaler { idle_count: u32, idle_time: Duration, scale_factor: f64, scale_factor_limit: u32, preemptive: bool },
    /// docker+machine (`[runners.machine]`): `idle_count` counts machines; 0 = on demand.
    Machine { idle_count: u32, idle_count_min: u32, idle_scale_factor: f64, idle_time: Duration, max_growth_rate: u32 },
}

/// Engine settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Job slots per instance (docker+machine: 1).
    pub capacity_per_instance: u32,
    /// Jobs per instance before it retires (0 = unlimited; docker+machine `MaxBuilds`).
    pub max_use_count: u32,
    /// Instances in any state (0 = unlimited; docker+machine: the runner's `limit`).
    pub max_instances: u32,
    pub policy: Policy,
}

/// What the runner should ask the provider to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Create(u32),
    Delete(Vec<String>, RemovalReason),
}

/// Why an instance is removed (a metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemovalReason {
    Idle,
    MaxUseCount,
    Unhealthy,
    Shutdown,
}

/// No slot can be reserved now; don't ask GitLab for a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoCapacity;

/// A slot assigned to a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquisition {
    pub instance: String,
    pub slot: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Creating,
    Ready,
    Removing,
}

#[derive(Debug, Clone)]
struct Instance {
    state: State,
    slots: Vec<Option<String>>,
    uses: u32,
    idle_since: Duration,
}

impl Instance {
    fn retired(&self, max_use_count: u32) -> bool {
        max_use_count > 0 && self.uses >= max_use_count
    }
    fn busy(&self) -> bool {
        self.slots.iter().any(Option::is_some)
    }
}

/// Counts for logs and metrics (`fleeting_taskscaler_tasks{state}` and friends).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub creating: u32,
    pub ready: u32,
    pub removing: u32,
    pub idle_slots: u32,
    pub reserved: u32,
    pub acquired: u32,
    pub pending: u32,
    pub unavailable: u32,
}

/// The engine. Deterministic: it never reads a clock; callers pass `now`.
#[derive(Debug, Clone)]
pub struct Engine {
    settings: Settings,
    instances: BTreeMap<String, Instance>,
    /// Creations asked of the provider and not yet reported.
    requested: u32,
    reserved: BTreeSet<String>,
    pending: VecDeque<String>,
    acquired: BTreeMap<String, Acquisition>,
}

impl Engine {
    pub fn new(mut settings: Settings) -> Self {
        if matches!(settings.policy, Policy::Machine { .. }) {
            settings.capacity_per_instance = 1;
        }
        settings.capacity_per_instance = settings.capacity_per_instance.max(1);
        Engine { settings, instances: BTreeMap::new(), requested: 0, reserved: BTreeSet::new(), pending: VecDeque::new(), acquired: BTreeMap::new() }
    }

    fn free_slots(&self) -> u32 {
        let max_use = self.settings.max_use_count;
        self.instances
            .values()
            .filter(|i| i.state == State::Ready && !i.retired(max_use))
            .map(|i| i.slots.iter().filter(|s| s.is_none()).count() as u32)
            .sum()
    }

    /// Current counts.
    pub fn counts(&self) -> Counts {
        let max_use = self.settings.max_use_count;
        let mut c = Counts { reserved: self.reserved.len() as u32, acquired: self.acquired.len() as u32, pending: self.pending.len() as u32, ..Counts::default() };
        for i in self.instances.values() {
            match i.state {
                State::Creating => c.creating += 1,
                State::Ready => c.ready += 1,
                State::Removing => c.removing += 1,
            }
            if i.state == State::Ready && i.retired(max_use) {
                c.unavailable += i.slots.len() as u32;
            }
        }
        c.creating += self.requested;
        c.idle_slots = self.free_slots().saturating_sub(c.reserved);
        c
    }

    /// Claim capacity before asking GitLab for a job. Preemptive mode needs an idle slot on a
    /// ready instance; otherwise only the fleet's maximum size limits reservations.
    pub fn reserve(&mut self, key: &str) -> Result<(), NoCapacity> {
        let preemptive = match self.settings.policy {
            Policy::Taskscaler { preemptive, .. } => preemptive,
            Policy::Machine { idle_count, .. } => idle_count > 0,
        };
        let claimed = (self.reserved.len() + self.acquired.len() + self.pending.len()) as u32;
        if preemptive {
            if self.free_slots() <= self.reserved.len() as u32 {
                return Err(NoCapacity);
            }
        } else if self.settings.max_instances > 0 && claimed >= self.settings.max_instances * self.settings.capacity_per_instance {
            return Err(NoCapacity);
        }
        self.reserved.insert(key.to_string());
        Ok(())
    }

    /// GitLab had no job for the reservation.
    pub fn unreserve(&mut self, key: &str) {
        self.reserved.remove(key);
    }

    /// A job needs a slot: assigned at once when one is free, else it waits (see
    /// [`Engine::acquisition`]).
    pub fn acquire(&mut self, key: &str) -> Option<Acquisition> {
        self.reserved.remove(key);
        if let Some(a) = self.acquired.get(key) {
            return Some(a.clone());
        }
        if !self.pending.iter().any(|k| k == key) {
            self.pending.push_back(key.to_string());
        }
        self.assign_pending();
        self.acquired.get(key).cloned()
    }

    /// The slot of `key`, once assigned.
    pub fn acquisition(&self, key: &str) -> Option<Acquisition> {
        self.acquired.get(key).cloned()
    }

    /// The job of `key` gave up waiting (instance_acquire_timeout) or was cancelled.
    pub fn cancel(&mut self, key: &str) {
        self.pending.retain(|k| k != key);
        self.reserved.remove(key);
    }

    fn assign_pending(&mut self) {
        let max_use = self.settings.max_use_count;
        while let Some(key) = self.pending.front().cloned() {
            let slot = self.instances.iter_mut().filter(|(_, i)| i.state == State::Ready && !i.retired(max_use)).find_map(|(id, i)| {
                i.slots.iter().position(Option::is_none).map(|s| (id.clone(), s, i))
            });
            let Some((id, s, instance)) = slot else { return };
            instance.slots[s] = Some(key.clone());
            self.pending.pop_front();
            self.acquired.insert(key, Acquisition { instance: id, slot: s as u32 });
        }
    }

    /// The job of `key` ended: its slot frees up and the instance counts a use.
    pub fn release(&mut self, key: &str, now: Duration) {
        let Some(a) = self.acquired.remove(key) else { return };
        if let Some(instance) = self.instances.get_mut(&a.instance) {
            if let Some(slot) = instance.slots.get_mut(a.slot as usize) {
                *slot = None;
            }
            instance.uses += 1;
            if !instance.busy() {
                instance.idle_since = now;
            }
        }
        self.assign_pending();
    }

    /// The provider reports a new instance (after `Create`).
    pub fn instance_created(&mut self, id: &str, now: Duration) {
        self.requested = self.requested.saturating_sub(1);
        let slots = vec![None; self.settings.capacity_per_instance as usize];
        self.instances.entry(id.to_string()).or_insert(Instance { state: State::Creating, slots, uses: 0, idle_since: now });
    }

    /// The instance is ready for jobs (running and, if configured, the ready command passed).
    pub fn instance_ready(&mut self, id: &str, now: Duration) {
        if let Some(i) = self.instances.get_mut(id) {
            if i.state == State::Creating {
                i.state = State::Ready;
                i.idle_since = now;
            }
        }
        self.assign_pending();
    }

    /// Adopt an instance found at start (restored state): ready, with its use count.
    pub fn adopt(&mut self, id: &str, uses: u32, now: Duration) {
        let slots = vec![None; self.settings.capacity_per_instance as usize];
        self.instances.insert(id.to_string(), Instance { state: State::Ready, slots, uses, idle_since: now });
        self.assign_pending();
    }

    /// The instance is gone (deleted, or lost). Returns the keys of jobs that were running
    /// on it: they must fail with `runner_system_failure`.
    pub fn instance_removed(&mut self, id: &str) -> Vec<String> {
        let Some(instance) = self.instances.remove(id) else { return Vec::new() };
        let lost: Vec<String> = instance.slots.into_iter().flatten().collect();
        for key in &lost {
            self.acquired.remove(key);
        }
        lost
    }

    /// The instances and their use counts, for state storage.
    pub fn snapshot(&self) -> Vec<(String, u32)> {
        self.instances.iter().filter(|(_, i)| i.state != State::Removing).map(|(id, i)| (id.clone(), i.uses)).collect()
    }

    fn mark_removing(&mut self, ids: &[String]) {
        for id in ids {
            if let Some(i) = self.instances.get_mut(id) {
                i.state = State::Removing;
            }
        }
    }

    /// Decide what to create and delete at `now`.
    pub fn tick(&mut self, now: Duration) -> Vec<Action> {
        let mut actions = Vec::new();
        let max_use = self.settings.max_use_count;
        let cap = self.settings.capacity_per_instance;

        // Retired instances leave once their last job is done.
        let retired: Vec<String> = self.instances.iter().filter(|(_, i)| i.state == State::Ready && i.retired(max_use) && !i.busy()).map(|(id, _)| id.clone()).collect();
        if !retired.is_empty() {
            self.mark_removing(&retired);
            actions.push(Action::Delete(retired, RemovalReason::MaxUseCount));
        }

        let counts = self.counts();
        let in_use = counts.acquired + counts.reserved;
        let total = counts.creating + counts.ready + counts.removing;
        let (create, idle_target_slots, idle_time) = match self.settings.policy {
            Policy::Taskscaler { idle_count, idle_time, scale_factor, scale_factor_limit, .. } => {
                let mut idle = idle_count;
                if scale_factor > 0.0 {
                    let scaled = (f64::from(in_use) * scale_factor).ceil() as u32;
                    idle = idle.max(if scale_factor_limit > 0 { scaled.min(scale_factor_limit) } else { scaled });
                }
                let required = in_use + counts.pending + idle;
                let capacity = (counts.ready - counts.unavailable.div_ceil(cap).min(counts.ready) + counts.creating) * cap;
                let want = required.saturating_sub(capacity).div_ceil(cap);
                (want, idle, idle_time)
            }
            Policy::Machine { idle_count, idle_count_min, idle_scale_factor, idle_time, max_growth_rate } => {
                let idle = if idle_scale_factor > 0.0 {
                    let scaled = (f64::from(in_use) * idle_scale_factor) as u32;
                    scaled.max(idle_count_min.max(1)).min(idle_count)
                } else {
                    idle_count
                };
                let available = counts.idle_slots + counts.creating;
                let mut want = (counts.pending + idle).saturating_sub(available);
                if max_growth_rate > 0 {
                    want = want.min(max_growth_rate.saturating_sub(counts.creating));
                }
                (want, idle, idle_time)
            }
        };
        let room = if self.settings.max_instances > 0 { self.settings.max_instances.saturating_sub(total) } else { u32::MAX };
        let create = create.min(room);
        if create > 0 {
            self.requested += create;
            actions.push(Action::Create(create));
        }

        // Idle instances beyond the idle target leave after idle_time, oldest idle first.
        let counts = self.counts();
        let mut spare_slots = counts.idle_slots.saturating_sub(idle_target_slots + counts.pending);
        let mut idle: Vec<(Duration, String)> = self
            .instances
            .iter()
            .filter(|(_, i)| i.state == State::Ready && !i.busy() && !i.retired(max_use) && now.saturating_sub(i.idle_since) >= idle_time)
            .map(|(id, i)| (i.idle_since, id.clone()))
            .collect();
        idle.sort();
        let mut remove = Vec::new();
        for (_, id) in idle {
            if spare_slots < cap {
                break;
            }
            spare_slots -= cap;
            remove.push(id);
        }
        if !remove.is_empty() {
            self.mark_removing(&remove);
            actions.push(Action::Delete(remove, RemovalReason::Idle));
        }
        actions
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
