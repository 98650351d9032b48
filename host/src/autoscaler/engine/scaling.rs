//! What a [`Taskscaler::tick`] does: the census of instances and slots, throttle tokens,
//! expiry of pending acquisitions, slot assignment, provider polling and instance lifecycle,
//! heartbeats, scaling up and down against the active policy, and deletion requests.
//!
//! Internals of the engine (called from its public calls in the parent module); must not be
//! called from outside the engine, and holds no state of its own.

use std::time::Duration;

use super::{
    AcquireError, Acquisition, EngineEvent, Instance, InstanceTiming, KeyState, Phase, RemovalReason, Taskscaler,
};
use crate::autoscaler::clock::Moment;
use crate::autoscaler::provider::{InstanceGroup, InstanceState, ProviderError};

/// The longest pause between `update()` calls while the provider keeps failing (unless
/// `update_interval` is longer).
const PROVIDER_RETRY_MAX: Duration = Duration::from_secs(60);

impl Taskscaler {
    pub(super) fn census(&self) -> Census {
        let mut c = self.instances.census();
        c.reserved = self.keys.reserved();
        c.pending = self.keys.pending();
        c
    }

    pub(super) fn expire_pending(&mut self, now: Moment) {
        let expired: Vec<String> = self
            .pending_order
            .iter()
            .filter(|k| matches!(self.keys.get(k), Some(KeyState::Pending { deadline }) if *deadline <= now))
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
    pub(super) fn assign_pending(&mut self) {
        while let Some(key) = self.pending_order.front().cloned() {
            let Some(id) = self.instances.best_assignable().cloned() else { break };
            self.pending_order.pop_front();
            let Some(mut inst) = self.instances.get_mut(&id) else { break };
            let Some(slot) = inst.slots.iter().position(|s| s.is_none()) else { break };
            inst.slots[slot] = Some(key.clone());
            let acquisition = Acquisition { instance: id, slot: slot as u32 };
            self.keys.insert(key.clone(), KeyState::Acquired(acquisition.clone()));
            self.metrics.acquisitions_total += 1;
            self.events.push(EngineEvent::Acquired { key, acquisition });
        }
    }

    pub(super) fn mark_ready(&mut self, id: &str, now: Moment) {
        let interval = self.cfg.raw.heartbeat_interval;
        if let Some(mut inst) = self.instances.get_mut(id) {
            inst.phase = Phase::Ready;
            inst.ready_at = Some(now);
            if let (Some(p), Some(requested)) = (&mut self.predictor, inst.requested_at) {
                p.observe_lead(requested, now);
            }
            let since = inst.requested_at.unwrap_or(inst.created_at);
            self.events.push(timed(InstanceTiming::Readiness, since, now));
            inst.idle_since = now;
            inst.next_heartbeat = interval.map_or(now, |d| now.plus(d));
            self.failure_streak = 0;
        }
    }

    pub(super) fn record_creation_failure(&mut self, now: Moment) {
        self.failure_streak = self.failure_streak.saturating_add(1);
        let base = self.cfg.raw.ready_failure_backoff.as_secs_f64();
        let max = self.cfg.raw.ready_failure_backoff_max.as_secs_f64();
        let exponent = self.failure_streak.saturating_sub(1).min(30);
        let backoff = (base * 2f64.powi(exponent as i32)).min(max);
        let until = now.plus(Duration::from_secs_f64(backoff));
        self.create_blocked_until = self.create_blocked_until.max(until);
    }

    /// Mark an instance for removal; report keys of jobs running on it as lost.
    pub(super) fn mark_for_removal(&mut self, id: &str, reason: RemovalReason) {
        let Some(mut inst) = self.instances.get_mut(id) else { return };
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
    pub(super) fn instance_vanished(&mut self, id: &str, now: Moment) {
        let Some(inst) = self.instances.get(id) else { return };
        if inst.interrupted.is_some() && !inst.is_deleting() {
            // Announced: no provisioning failure, no back-off; jobs still on it are lost.
            return self.mark_for_removal(id, RemovalReason::Interrupted);
        }
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

    pub(super) fn became_running(&mut self, id: &str, now: Moment) {
        if let Some(inst) = self.instances.get(id) {
            let since = inst.requested_at.unwrap_or(inst.created_at);
            self.events.push(timed(InstanceTiming::IsRunning, since, now));
        }
        if self.cfg.raw.instance_ready_command.is_some() {
            if let Some(mut inst) = self.instances.get_mut(id) {
                inst.phase = Phase::ReadyCheck;
            }
            self.events.push(EngineEvent::ReadyCheckRequested { instance: id.to_string() });
        } else {
            self.mark_ready(id, now);
        }
    }

    pub(super) fn adopt(&mut self, id: &str) {
        let keep = self.cfg.raw.keep_instance_with_acquisitions;
        let Some(mut inst) = self.instances.get_mut(id) else { return };
        let Some(saved) = inst.awaiting_adoption.take() else { return };
        if saved.is_empty() {
            return;
        }
        if keep {
            inst.use_count += saved.len() as u32;
        }
        drop(inst);
        self.events.push(EngineEvent::AcquisitionsAbandoned { instance: id.to_string(), keys: saved });
        if !keep {
            self.mark_for_removal(id, RemovalReason::AbandonedAcquisitions);
        }
    }

    /// `update()` failed: no scaling until it answers; ask again after a growing interval
    /// (`update_interval_when_expecting` doubled per failure, at most the larger of
    /// `update_interval` and [`PROVIDER_RETRY_MAX`]).
    fn provider_failed(&mut self, now: Moment, error: &ProviderError) {
        self.metrics.provider_errors_total += 1;
        self.provider_failures = self.provider_failures.saturating_add(1);
        let base = self.cfg.raw.update_interval_when_expecting;
        let cap = self.cfg.raw.update_interval.max(PROVIDER_RETRY_MAX);
        let factor = 1u32 << self.provider_failures.saturating_sub(1).min(16);
        let retry_in = base.saturating_mul(factor).min(cap);
        let message = match error {
            ProviderError::Other(m) => m.clone(),
            capacity => capacity.to_string(),
        };
        self.provider_error = Some(message.clone());
        self.next_update = now.plus(retry_in);
        self.events.push(EngineEvent::ProviderFailing { message, failures: self.provider_failures, retry_in });
    }

    /// Drain the instances the provider announced it takes away.
    fn apply_interruptions(&mut self, provider: &mut dyn InstanceGroup) {
        let notices = match provider.interruptions() {
            Ok(notices) => notices,
            Err(_) => {
                self.metrics.provider_errors_total += 1;
                return;
            }
        };
        for notice in notices {
            let Some(mut inst) = self.instances.get_mut(&notice.id) else { continue };
            if inst.is_deleting() || inst.interrupted.is_some() {
                continue;
            }
            inst.interrupted = Some(notice.reason.clone());
            let keys: Vec<String> = inst.slots.iter().flatten().cloned().collect();
            self.metrics.interruptions_total += 1;
            self.events.push(EngineEvent::InstanceInterrupted { instance: notice.id, reason: notice.reason, keys });
        }
    }

    pub(super) fn poll_provider(&mut self, now: Moment, provider: &mut dyn InstanceGroup) {
        let mut listed = std::mem::take(&mut self.listing);
        if let Err(e) = provider.update_into(&mut listed) {
            self.listing = listed;
            return self.provider_failed(now, &e);
        }
        if self.provider_failures > 0 {
            self.events.push(EngineEvent::ProviderRecovered { failures: self.provider_failures });
            self.provider_failures = 0;
            self.provider_error = None;
        }
        self.apply_interruptions(provider);
        // Forget creations the provider never delivered.
        let timeout = self.cfg.raw.pending_request_timeout;
        while self.requested.front().is_some_and(|t| t.plus(timeout) <= now) {
            self.requested.pop_front();
            self.metrics.provisioning_failures_total += 1;
        }
        // Listed ids that are (or became) known instances: when that is all of them and the
        // listing has no duplicate (strictly sorted, as the simulated provider lists), none is
        // missing and the listing need not be searched for each known id.
        let mut matched = 0usize;
        let distinct = listed.windows(2).all(|w| w[0].0 < w[1].0);
        for (id, state) in &listed {
            let known = self.instances.get(id).map(|i| (i.phase, i.awaiting_adoption.is_some()));
            if known.is_none() {
                let alive = matches!(state, InstanceState::Creating | InstanceState::Running | InstanceState::Timeout);
                if !alive {
                    continue;
                }
                if let Some(requested) = self.requested.pop_front() {
                    let mut inst = Instance::discovered(Phase::Creating, now, self.cfg.capacity);
                    inst.requested_at = Some(requested);
                    self.events.push(timed(InstanceTiming::Creation, requested, now));
                    self.instances.insert(id.clone(), inst);
                } else if self.synced && provider.launches_on_its_own() {
                    // The group launched it by itself (a health replacement, rebalancing): it is
                    // the group's, so ours; it goes through the ready check like any new one.
                    self.instances.insert(id.clone(), Instance::discovered(Phase::Creating, now, self.cfg.capacity));
                    self.metrics.instances_adopted_total += 1;
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
                    matched += 1;
                    continue;
                }
            }
            matched += 1;
            let (phase, awaiting_adoption) = known.unwrap_or((Phase::Creating, false));
            match (phase, state) {
                (
                    Phase::Deleting { requested_at, reason },
                    InstanceState::Creating | InstanceState::Running | InstanceState::Timeout,
                ) => {
                    // Still there: ask again once the retry interval has passed.
                    if requested_at.is_some_and(|t| t.plus(self.cfg.raw.deletion_retry_interval) <= now) {
                        if let Some(mut inst) = self.instances.get_mut(id) {
                            inst.phase = Phase::Deleting { reason, requested_at: None };
                        }
                    }
                }
                (Phase::Deleting { .. }, _) => {}
                // An interrupted instance being taken away still runs its jobs until it is gone.
                (Phase::Ready, InstanceState::Deleting)
                    if self.instances.get(id).is_some_and(|i| i.interrupted.is_some()) => {}
                (_, InstanceState::Deleted) | (_, InstanceState::Deleting) => self.instance_vanished(id, now),
                (Phase::Creating, InstanceState::Running) => {
                    if awaiting_adoption {
                        // A restored instance that was still provisioning: the ready check reruns.
                        if let Some(mut inst) = self.instances.get_mut(id) {
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
                (Phase::Ready, InstanceState::Running) => {
                    if awaiting_adoption {
                        self.adopt(id);
                    }
                }
                (Phase::Creating, InstanceState::Creating)
                | (Phase::ReadyCheck, _)
                | (Phase::Ready, InstanceState::Creating) => {}
            }
        }
        let missing: Vec<String> = if distinct && matched == self.instances.len() {
            Vec::new()
        } else {
            let seen: std::collections::HashSet<&str> = listed.iter().map(|(id, _)| id.as_str()).collect();
            self.instances.keys().filter(|id| !seen.contains(id.as_str())).cloned().collect()
        };
        for id in missing {
            // A restored instance the provider does not list is forgotten quietly, unless it
            // holds restored acquisitions: the jobs resuming on it must learn it is gone.
            let restored_unconfirmed =
                self.instances.get(&id).is_some_and(|i| i.awaiting_adoption.is_some() && i.active() == 0);
            if !restored_unconfirmed {
                self.instance_vanished(&id, now);
            }
            if let Some(gone) = self.instances.remove(&id) {
                if let Some(asked) = gone.removal_requested_at {
                    self.events.push(timed(InstanceTiming::Deletion, asked, now));
                }
                self.events.push(timed(InstanceTiming::Life, gone.created_at, now));
            }
        }
        self.listing = listed;
        self.synced = true;
        let c = self.instances.census();
        let expecting = !self.requested.is_empty() || c.creating > 0 || c.deleting > 0;
        let interval =
            if expecting { self.cfg.raw.update_interval_when_expecting } else { self.cfg.raw.update_interval };
        self.next_update = now.plus(interval);
    }

    pub(super) fn heartbeats(&mut self, now: Moment, provider: &mut dyn InstanceGroup) {
        let Some(interval) = self.cfg.raw.heartbeat_interval else { return };
        // Ready instances due, in id order (the order of the provider calls).
        let mut due: Vec<String> = self
            .instances
            .heartbeats_due(now)
            .filter(|id| {
                self.instances.get(id).is_some_and(|i| i.awaiting_adoption.is_none() && i.interrupted.is_none())
            })
            .cloned()
            .collect();
        due.sort_unstable();
        for id in due {
            let result = provider.heartbeat(&id);
            let threshold = self.cfg.raw.failure_threshold.max(1);
            let Some(mut inst) = self.instances.get_mut(&id) else { continue };
            inst.next_heartbeat = now.plus(interval);
            match result {
                Ok(()) => inst.heartbeat_failures = 0,
                Err(_) => {
                    inst.heartbeat_failures += 1;
                    self.metrics.heartbeat_failures_total += 1;
                    let failed = inst.heartbeat_failures >= threshold;
                    drop(inst);
                    if failed {
                        self.mark_for_removal(&id, RemovalReason::Unhealthy);
                    }
                }
            }
        }
    }

    pub(super) fn scale(&mut self, now: Moment, provider: &mut dyn InstanceGroup) {
        let cap = self.cfg.capacity;
        let max_use = self.cfg.max_use;
        // Instances that used up max_use_count leave as soon as their last job is done.
        let retired: Vec<String> = if max_use == 0 {
            Vec::new()
        } else {
            self.instances
                .iter()
                .filter(|(_, i)| i.assignable() && i.active() == 0 && i.retiring(max_use))
                .map(|(id, _)| id.clone())
                .collect()
        };
        for id in retired {
            self.mark_for_removal(&id, RemovalReason::MaxUseCount);
        }

        let policy = self.cfg.active_policy(now);
        let c = self.census();
        if let Some(p) = &mut self.predictor {
            p.observe_in_use(now, c.acquired + c.pending);
        }
        // A reservation is only a job request in flight (the poller holds one for every long
        // poll and gives it back when GitLab has no job): it never creates demand. In
        // preemptive mode it sits on an idle slot, which is still idle capacity; counting it
        // as in use would create an instance for every poll and remove it `idle_time` later
        // (create/remove churn under long polling). A job that arrives becomes pending, then
        // acquired, and that is demand.
        let in_use = c.acquired + c.pending;
        let mut idle_target = if self.shutting_down { 0 } else { self.cfg.idle_target(&policy, in_use) };
        // Scale-down to the forecast level (`release_horizon`): the idle slots worth keeping.
        let mut keep_level = None;
        if let (Some(p), false) = (&self.predictor, self.shutting_down) {
            // The policy's idle target is the floor; the forecast may only add to it.
            idle_target = idle_target.max(p.idle_target(now));
            keep_level = p.keep_level(now).map(|k| k.max(idle_target));
        }
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
            if let Some(bucket) = &self.throttle {
                n = n.min(bucket.available());
            }
            if n > 0 {
                match provider.increase(n) {
                    Ok(granted) => {
                        for _ in 0..granted {
                            self.requested.push_back(now);
                        }
                        if let Some(bucket) = &mut self.throttle {
                            bucket.take(granted);
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
        let idle_time = self.idle_time(now);
        let wanted = excess.max(over_limit);
        // Idle instances beyond the forecast level leave without waiting for their keep-alive.
        let beyond_level = keep_level.map_or(0, |k| {
            let keep = ceil_div(in_use + c.unavailable + k, cap);
            let keep = if self.cfg.max_instances > 0 { keep.min(self.cfg.max_instances) } else { keep };
            current.saturating_sub(keep).min(wanted)
        });
        let mut doomed: Vec<(String, RemovalReason)> = Vec::new();
        for (idle_since, id) in self.instances.idle() {
            if !self.instances.get(id).is_some_and(|i| i.assignable() && i.usable(cap, max_use) > 0) {
                continue;
            }
            let removed = doomed.len() as u32;
            if removed < over_limit {
                doomed.push((id.clone(), RemovalReason::OverLimit));
            } else if removed < beyond_level || (removed < wanted && idle_since.plus(idle_time) <= now) {
                doomed.push((id.clone(), RemovalReason::Idle));
            } else {
                // Enough removed, or idle too briefly, as everyone after it (idle since later).
                break;
            }
        }
        for (id, reason) in doomed {
            self.mark_for_removal(&id, reason);
        }
    }

    pub(super) fn request_deletions(&mut self, now: Moment, provider: &mut dyn InstanceGroup) {
        let ids: Vec<String> = self.instances.to_delete().cloned().collect();
        if ids.is_empty() {
            return;
        }
        if provider.decrease(&ids).is_err() {
            self.metrics.provider_errors_total += 1;
        }
        // Accepted or not, wait for the retry interval: `update()` shows whether it worked.
        for id in &ids {
            if let Some(mut inst) = self.instances.get_mut(id) {
                if let Phase::Deleting { reason, .. } = inst.phase {
                    inst.phase = Phase::Deleting { reason, requested_at: Some(now) };
                    inst.removal_requested_at.get_or_insert(now);
                }
            }
        }
        self.next_update = self.next_update.min(now.plus(self.cfg.raw.update_interval_when_expecting));
    }
}

/// The `timing` event of a duration from `since` to `now` (0 when the clock went back).
fn timed(timing: InstanceTiming, since: Moment, now: Moment) -> EngineEvent {
    let millis = now.as_millis().saturating_sub(since.as_millis());
    EngineEvent::Timed { timing, seconds: millis as f64 / 1000.0 }
}

fn ceil_div(a: u32, b: u32) -> u32 {
    a.div_ceil(b.max(1))
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
/// Instances and slots by state at one moment.
pub(super) struct Census {
    pub(super) creating: u32,
    pub(super) ready_checking: u32,
    pub(super) ready: u32,
    pub(super) deleting: u32,
    pub(super) idle: u32,
    pub(super) reserved: u32,
    pub(super) pending: u32,
    pub(super) acquired: u32,
    pub(super) unavailable: u32,
    pub(super) unhealthy: u32,
}
