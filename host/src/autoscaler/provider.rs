//! The engine's view of a fleet: the [`InstanceGroup`] trait (GitLab fleeting's
//! `InstanceGroup`: increase, decrease, update, heartbeat) with capacity errors that carry a
//! retry-after, and [`SimProvider`], a seeded simulated cloud for tests and `runway simulate`
//! (provisioning delay distributions, `timeout` failures, deletion delay, billing records,
//! spot interruptions with a notice, a creation rate limit that throttles with a retry-after,
//! and a quota shared by several instance groups: [`SimProvider::group`] is one `[[runners]]`
//! entry's group in the same cloud account).
//! The WASM fleeting plugin adapter implements the same trait elsewhere. Unit tests are in
//! `provider_tests.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::clock::{Clock, Moment};
use super::throttle::TokenBucket;

/// Simulated provider settings (`provider.toml`) that make no sense; the message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProviderSettingsError(pub String);

/// Instance states as fleeting reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InstanceState {
    /// Being provisioned.
    Creating,
    /// Up and reachable.
    Running,
    /// Being removed.
    Deleting,
    /// Gone.
    Deleted,
    /// Provisioning failed or took too long.
    Timeout,
}

/// Errors from a provider call.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ProviderError {
    /// The cloud is out of capacity or throttling; try again after `retry_after` if given.
    #[error("provider has no capacity{}", .retry_after.map(|d| format!(" (retry after {}s)", d.as_secs())).unwrap_or_default())]
    Capacity {
        /// When to try again.
        retry_after: Option<Duration>,
    },
    /// Anything else.
    #[error("provider error: {0}")]
    Other(String),
}

/// A provider's notice that it will take an instance away (spot reclaim, rebalance,
/// maintenance).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interruption {
    /// The instance id.
    pub id: String,
    /// Why, in words for logs and job traces (`spot capacity reclaimed`, ...).
    pub reason: String,
    /// Unix time (seconds) at which the instance goes away, when the provider knows.
    pub deadline: Option<u64>,
}

/// A group of instances the engine scales. Calls are synchronous (plugin calls are); a driver
/// runs the engine's `tick` off the async executor when calls may block.
pub trait InstanceGroup: Send {
    /// Ask for `n` more instances; returns how many were requested.
    fn increase(&mut self, n: u32) -> Result<u32, ProviderError>;
    /// Ask to remove `ids`; returns the ids whose removal was accepted.
    fn decrease(&mut self, ids: &[String]) -> Result<Vec<String>, ProviderError>;
    /// Every instance of the group with its state. Instances not listed are gone.
    fn update(&mut self) -> Result<Vec<(String, InstanceState)>, ProviderError>;
    /// [`InstanceGroup::update`] into `listing` (its old entries replaced), so a provider that
    /// writes its ids into the strings already there spares an allocation per instance and
    /// poll. By default it calls `update`.
    fn update_into(&mut self, listing: &mut Vec<(String, InstanceState)>) -> Result<(), ProviderError> {
        *listing = self.update()?;
        Ok(())
    }
    /// Liveness of one instance (the `exit 0` probe).
    fn heartbeat(&mut self, id: &str) -> Result<(), ProviderError>;
    /// Instances the provider announced it will take away. Asked after every successful
    /// `update()`; by default there are none.
    fn interruptions(&mut self) -> Result<Vec<Interruption>, ProviderError> {
        Ok(Vec::new())
    }
    /// Whether the provider's group launches instances on its own (an Auto Scaling group's
    /// health replacement or rebalancing): the engine then adopts instances it did not request
    /// instead of removing them as unknown. By default it does not.
    fn launches_on_its_own(&self) -> bool {
        false
    }
}

/// A delay distribution, seconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum DelayDistribution {
    /// `seconds` plus a uniform jitter in `[0, jitter_s)`.
    Fixed {
        /// Base delay.
        seconds: f64,
        /// Uniform jitter on top.
        #[serde(default)]
        jitter_s: f64,
    },
    /// Lognormal with the given median and 95th percentile, shifted by `shift_s`.
    Lognormal {
        /// Median of the lognormal part.
        median_s: f64,
        /// 95th percentile of the lognormal part (must be ≥ median).
        p95_s: f64,
        /// Constant added to every sample.
        #[serde(default)]
        shift_s: f64,
    },
}

impl DelayDistribution {
    /// Draw a delay.
    pub fn sample(&self, rng: &mut StdRng) -> Duration {
        let seconds = match *self {
            DelayDistribution::Fixed { seconds, jitter_s } => {
                seconds + if jitter_s > 0.0 { rng.random::<f64>() * jitter_s } else { 0.0 }
            }
            DelayDistribution::Lognormal { median_s, p95_s, shift_s } => shift_s + lognormal(rng, median_s, p95_s),
        };
        Duration::from_secs_f64(seconds.clamp(0.0, 1e9))
    }

    /// Check parameters; errors name the field.
    pub fn validate(&self, what: &str) -> Result<(), ProviderSettingsError> {
        match *self {
            DelayDistribution::Fixed { seconds, jitter_s } if seconds < 0.0 || jitter_s < 0.0 => {
                Err(ProviderSettingsError(format!("{what}: seconds and jitter_s must be ≥ 0")))
            }
            DelayDistribution::Lognormal { median_s, p95_s, shift_s }
                if median_s <= 0.0 || p95_s < median_s || shift_s < 0.0 =>
            {
                Err(ProviderSettingsError(format!("{what}: need median_s > 0, p95_s ≥ median_s, shift_s ≥ 0")))
            }
            _ => Ok(()),
        }
    }
}

/// A lognormal sample with the given median and 95th percentile (Box–Muller).
pub fn lognormal(rng: &mut StdRng, median: f64, p95: f64) -> f64 {
    let sigma = (p95 / median).ln() / 1.644_853_6;
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random::<f64>();
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    median * (sigma * z).exp()
}

/// How the simulated cloud behaves (`provider.toml`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimProviderSettings {
    /// RNG seed; identical inputs give identical results.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Request → `running`.
    #[serde(default = "default_provisioning")]
    pub provisioning: DelayDistribution,
    /// Duration of the `instance_ready_command` (used when the config sets one).
    #[serde(default = "default_ready")]
    pub ready: DelayDistribution,
    /// Probability that the ready command fails.
    #[serde(default)]
    pub ready_failure_rate: f64,
    /// Probability that an instance ends in `timeout` instead of `running`.
    #[serde(default)]
    pub timeout_rate: f64,
    /// `decrease` → `deleted`.
    #[serde(default = "default_deletion")]
    pub deletion: DelayDistribution,
    /// Largest group size (0 = unlimited); beyond it `increase` fails with a capacity error.
    #[serde(default)]
    pub max_size: u32,
    /// Retry-after reported with capacity errors.
    #[serde(default = "default_retry_after_s")]
    pub capacity_retry_after_s: f64,
    /// Minimum billed time per instance.
    #[serde(default = "default_billing_minimum_s")]
    pub billing_minimum_s: f64,
    /// Price per instance-hour (for the report's cost line).
    #[serde(default)]
    pub price_per_hour: f64,
    /// Spot interruptions: expected interruption notices per running instance-hour (0 = none).
    /// Each instance draws its notice time once it is up (exponential, from the seed).
    #[serde(default)]
    pub interruption_rate_per_hour: f64,
    /// Time from an interruption notice to the instance's removal (AWS gives two minutes).
    #[serde(default = "default_interruption_notice_s")]
    pub interruption_notice_s: f64,
    /// Creation rate limit of the account: instances launched per second over all groups
    /// (0 = unlimited). A refused or cut `increase` is a throttling error with a retry-after.
    #[serde(default)]
    pub create_rate_per_s: f64,
    /// Launches the rate limit lets through at once (token bucket size).
    #[serde(default = "default_create_burst")]
    pub create_burst: u32,
}

fn default_seed() -> u64 {
    1
}
fn default_provisioning() -> DelayDistribution {
    DelayDistribution::Lognormal { median_s: 27.0, p95_s: 45.0, shift_s: 0.0 }
}
fn default_ready() -> DelayDistribution {
    DelayDistribution::Lognormal { median_s: 20.0, p95_s: 60.0, shift_s: 0.0 }
}
fn default_deletion() -> DelayDistribution {
    DelayDistribution::Fixed { seconds: 10.0, jitter_s: 5.0 }
}
fn default_retry_after_s() -> f64 {
    30.0
}
fn default_billing_minimum_s() -> f64 {
    60.0
}
fn default_interruption_notice_s() -> f64 {
    120.0
}
fn default_create_burst() -> u32 {
    10
}

impl Default for SimProviderSettings {
    /// The `linux-cold` profile of autoscaling.md §3.4.
    fn default() -> Self {
        SimProviderSettings {
            seed: default_seed(),
            provisioning: default_provisioning(),
            ready: default_ready(),
            ready_failure_rate: 0.02,
            timeout_rate: 0.005,
            deletion: default_deletion(),
            max_size: 0,
            capacity_retry_after_s: default_retry_after_s(),
            billing_minimum_s: default_billing_minimum_s(),
            price_per_hour: 0.0,
            interruption_rate_per_hour: 0.0,
            interruption_notice_s: default_interruption_notice_s(),
            create_rate_per_s: 0.0,
            create_burst: default_create_burst(),
        }
    }
}

impl SimProviderSettings {
    /// Check every field; errors name the key.
    pub fn validate(&self) -> Result<(), ProviderSettingsError> {
        self.provisioning.validate("provisioning")?;
        self.ready.validate("ready")?;
        self.deletion.validate("deletion")?;
        for (name, p) in [("ready_failure_rate", self.ready_failure_rate), ("timeout_rate", self.timeout_rate)] {
            if !(0.0..=1.0).contains(&p) {
                return Err(ProviderSettingsError(format!("{name} must be between 0 and 1")));
            }
        }
        if self.capacity_retry_after_s < 0.0 || self.billing_minimum_s < 0.0 {
            return Err(ProviderSettingsError("capacity_retry_after_s and billing_minimum_s must be ≥ 0".into()));
        }
        for (name, v) in [
            ("interruption_rate_per_hour", self.interruption_rate_per_hour),
            ("interruption_notice_s", self.interruption_notice_s),
            ("create_rate_per_s", self.create_rate_per_s),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(ProviderSettingsError(format!("{name} must be a number ≥ 0")));
            }
        }
        if self.create_rate_per_s > 0.0 && self.create_burst == 0 {
            return Err(ProviderSettingsError("create_burst must be ≥ 1 when create_rate_per_s is set".into()));
        }
        Ok(())
    }
}

/// One simulated instance's life.
#[derive(Clone, Debug, PartialEq)]
pub struct SimInstance {
    /// When `increase` created it.
    pub created_at: Moment,
    /// When it becomes `running` (or `timeout`).
    pub up_at: Moment,
    /// Ends in `timeout` instead of `running`.
    pub times_out: bool,
    /// When deletion was requested.
    pub delete_requested_at: Option<Moment>,
    /// When it is gone.
    pub deleted_at: Option<Moment>,
    /// Heartbeats fail (a broken instance).
    pub broken: bool,
    /// The instance group (`[[runners]]` entry) it belongs to; 0 for a lone group.
    pub group: u32,
    /// When the cloud announces it takes the instance away (a spot interruption); it is
    /// deleted `interruption_notice_s` later.
    pub interruption_at: Option<Moment>,
}

impl SimInstance {
    /// Whether its spot interruption notice came by `now` (and it was not already being
    /// deleted at our request before then).
    fn noticed_by(&self, now: Moment) -> bool {
        self.interruption_at.is_some_and(|at| at <= now && self.delete_requested_at.is_none_or(|r| r >= at))
    }
}

/// What one instance group met in the simulated cloud.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimGroupStats {
    /// Instances created for it.
    pub created: u64,
    /// `increase` calls refused or cut by the creation rate limit.
    pub throttled: u64,
    /// `increase` calls refused by the quota (`max_size`).
    pub capacity_refused: u64,
    /// Retry-after handed out with throttling errors, seconds in total (creation held back).
    pub throttled_wait_s: f64,
    /// Spot interruption notices its instances received.
    pub interruptions: u64,
}

/// A seeded fake cloud. Reads time from the shared clock.
pub struct SimProvider {
    settings: SimProviderSettings,
    clock: Arc<dyn Clock>,
    rng: StdRng,
    next_id: u64,
    /// Instances not yet known to be deleted.
    instances: BTreeMap<String, SimInstance>,
    /// Deleted instances, kept for billing.
    gone: Vec<(String, SimInstance)>,
    /// No instance of `instances` is deleted before this (`None`: none has a deletion time),
    /// so `prune` walks them only when one is due.
    next_prune: Option<Moment>,
    /// `increase` calls and instances requested in total.
    pub increase_calls: u64,
    /// Instances created in total.
    pub created_total: u64,
    /// Interruption notices `interruptions()` reports (set by tests with [`SimProvider::interrupt`]).
    notices: Vec<Interruption>,
    /// The group launches instances on its own (see [`InstanceGroup::launches_on_its_own`]).
    pub self_launching: bool,
    /// When set, every call fails with this message (a broken grant, bad credentials).
    pub failing: Option<String>,
    /// Draws interruption times (its own stream: a profile without interruptions draws none,
    /// so the other draws stay as they were).
    interrupt_rng: StdRng,
    /// The `create_rate_per_s` bucket (`None`: unlimited).
    launches: Option<TokenBucket>,
    /// Per instance group.
    stats: Vec<SimGroupStats>,
}

/// One instance group (one `[[runners]]` entry's autoscaling group) in a [`SimProvider`]
/// cloud: lists and removes only its own instances, shares the cloud's quota and rate limit.
pub struct SimGroup<'a> {
    cloud: &'a mut SimProvider,
    group: u32,
}

impl InstanceGroup for SimGroup<'_> {
    fn increase(&mut self, n: u32) -> Result<u32, ProviderError> {
        self.cloud.increase_in(self.group, n)
    }
    fn decrease(&mut self, ids: &[String]) -> Result<Vec<String>, ProviderError> {
        self.cloud.decrease_in(self.group, ids)
    }
    fn update(&mut self) -> Result<Vec<(String, InstanceState)>, ProviderError> {
        self.cloud.update_in(self.group)
    }
    fn update_into(&mut self, listing: &mut Vec<(String, InstanceState)>) -> Result<(), ProviderError> {
        self.cloud.update_into_in(self.group, listing)
    }
    fn heartbeat(&mut self, id: &str) -> Result<(), ProviderError> {
        self.cloud.heartbeat(id)
    }
    fn interruptions(&mut self) -> Result<Vec<Interruption>, ProviderError> {
        self.cloud.interruptions_in(self.group)
    }
    fn launches_on_its_own(&self) -> bool {
        self.cloud.self_launching
    }
}

impl SimProvider {
    /// A provider reading time from `clock`.
    pub fn new(settings: SimProviderSettings, clock: Arc<dyn Clock>) -> Self {
        let rng = StdRng::seed_from_u64(settings.seed);
        let interrupt_rng = StdRng::seed_from_u64(settings.seed ^ 0x5bd1_e995_1e7e_4a11);
        let launches = (settings.create_rate_per_s > 0.0)
            .then(|| TokenBucket::full(settings.create_rate_per_s, settings.create_burst, clock.now()));
        SimProvider {
            settings,
            clock,
            rng,
            next_id: 0,
            instances: BTreeMap::new(),
            gone: Vec::new(),
            next_prune: None,
            increase_calls: 0,
            created_total: 0,
            notices: Vec::new(),
            self_launching: false,
            failing: None,
            interrupt_rng,
            launches,
            stats: Vec::new(),
        }
    }

    /// Instance group `group` of this cloud (see [`SimGroup`]); the cloud itself acts as group 0.
    pub fn group(&mut self, group: u32) -> SimGroup<'_> {
        SimGroup { cloud: self, group }
    }

    /// What instance group `group` met so far (interruptions: notices due by now for
    /// instances not removed before them).
    pub fn group_stats(&self, group: u32) -> SimGroupStats {
        let now = self.clock.now();
        let mut stats = self.stats.get(group as usize).cloned().unwrap_or_default();
        stats.interruptions =
            self.instances().filter(|(_, i)| i.group == group).filter(|(_, i)| i.noticed_by(now)).count() as u64;
        stats
    }

    fn stats_mut(&mut self, group: u32) -> &mut SimGroupStats {
        let i = group as usize;
        if self.stats.len() <= i {
            self.stats.resize(i + 1, SimGroupStats::default());
        }
        &mut self.stats[i]
    }

    /// Announce that `id` will be taken away for `reason` (reported until it is gone).
    pub fn interrupt(&mut self, id: &str, reason: &str) {
        self.notices.push(Interruption { id: id.to_string(), reason: reason.to_string(), deadline: None });
    }

    /// The group launches one instance by itself (a health replacement), up at once; its id.
    pub fn launch_on_its_own(&mut self) -> String {
        let now = self.clock.now();
        self.next_id += 1;
        let id = format!("sim-{:06}", self.next_id);
        let instance = SimInstance {
            created_at: now,
            up_at: now,
            times_out: false,
            delete_requested_at: None,
            deleted_at: None,
            broken: false,
            group: 0,
            interruption_at: None,
        };
        self.instances.insert(id.clone(), instance);
        self.created_total += 1;
        id
    }

    /// The settings in use.
    pub fn settings(&self) -> &SimProviderSettings {
        &self.settings
    }

    /// Every instance ever created (live ones first, then deleted ones).
    pub fn instances(&self) -> impl Iterator<Item = (&String, &SimInstance)> {
        self.instances.iter().chain(self.gone.iter().map(|(id, i)| (id, i)))
    }

    /// Move instances deleted by `now` out of the live map (keeps `update()` O(live)).
    fn prune(&mut self, now: Moment) {
        if self.next_prune.is_none_or(|t| t > now) {
            return;
        }
        self.next_prune = self.instances.values().filter_map(|i| i.deleted_at).filter(|d| *d > now).min();
        let dead: Vec<String> = self
            .instances
            .iter()
            .filter(|(_, i)| i.deleted_at.is_some_and(|d| d <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in dead {
            if let Some(i) = self.instances.remove(&id) {
                self.gone.push((id, i));
            }
        }
    }

    /// Make heartbeats of `id` fail from now on.
    pub fn break_instance(&mut self, id: &str) {
        if let Some(i) = self.instances.get_mut(id) {
            i.broken = true;
        }
    }

    /// The cloud removes `id` by itself (spot reclaim, crash): it is gone immediately.
    pub fn vanish(&mut self, id: &str) {
        let now = self.clock.now();
        if let Some(i) = self.instances.get_mut(id) {
            if i.deleted_at.is_none_or(|d| d > now) {
                i.deleted_at = Some(now);
                self.next_prune = Some(self.next_prune.map_or(now, |t| t.min(now)));
            }
        }
    }

    /// Instances alive (not deleted) at `now`.
    pub fn live_count(&self, now: Moment) -> usize {
        self.instances.values().filter(|i| i.deleted_at.is_none_or(|d| d > now)).count()
    }

    /// Billed seconds up to `end` (each instance at least `billing_minimum_s`).
    pub fn billed_seconds(&self, end: Moment) -> f64 {
        self.billed_seconds_where(end, |_| true)
    }

    /// [`SimProvider::billed_seconds`] of instance group `group` only.
    pub fn group_billed_seconds(&self, group: u32, end: Moment) -> f64 {
        self.billed_seconds_where(end, |i| i.group == group)
    }

    fn billed_seconds_where(&self, end: Moment, keep: impl Fn(&SimInstance) -> bool) -> f64 {
        self.instances()
            .filter(|(_, i)| keep(i))
            .map(|(_, i)| {
                let stop = i.deleted_at.map_or(end, |d| d.min(end));
                let lived = stop.since(i.created_at).as_secs_f64();
                lived.max(self.settings.billing_minimum_s)
            })
            .sum()
    }

    fn state_at(&self, i: &SimInstance, now: Moment) -> InstanceState {
        if i.deleted_at.is_some_and(|d| d <= now) {
            InstanceState::Deleted
        } else if i.delete_requested_at.is_some() {
            InstanceState::Deleting
        } else if now < i.up_at {
            InstanceState::Creating
        } else if i.times_out {
            InstanceState::Timeout
        } else {
            InstanceState::Running
        }
    }
}

impl SimProvider {
    fn increase_in(&mut self, group: u32, n: u32) -> Result<u32, ProviderError> {
        if let Some(message) = &self.failing {
            return Err(ProviderError::Other(message.clone()));
        }
        let now = self.clock.now();
        self.increase_calls += 1;
        let mut granted = n;
        if self.settings.max_size > 0 {
            let live = self.live_count(now) as u32;
            granted = n.min(self.settings.max_size.saturating_sub(live));
            if granted == 0 {
                self.stats_mut(group).capacity_refused += 1;
                return Err(ProviderError::Capacity {
                    retry_after: Some(Duration::from_secs_f64(self.settings.capacity_retry_after_s)),
                });
            }
        }
        let limit = self.launches.as_mut().map(|bucket| {
            bucket.refill(now);
            (bucket.available(), bucket.wait_for_token())
        });
        if let Some((allowed, wait)) = limit {
            if allowed < granted {
                self.stats_mut(group).throttled += 1;
            }
            if allowed == 0 {
                // Throttled (EC2's `RequestLimitExceeded`): try again once a launch is allowed.
                let retry_after = wait.unwrap_or_default().max(Duration::from_secs_f64(0.001));
                self.stats_mut(group).throttled_wait_s += retry_after.as_secs_f64();
                return Err(ProviderError::Capacity { retry_after: Some(retry_after) });
            }
            granted = granted.min(allowed);
            if let Some(bucket) = &mut self.launches {
                bucket.take(granted);
            }
        }
        let interruptions = self.settings.interruption_rate_per_hour;
        for _ in 0..granted {
            self.next_id += 1;
            let id = format!("sim-{:06}", self.next_id);
            let up_at = now.plus(self.settings.provisioning.sample(&mut self.rng));
            let times_out = self.rng.random::<f64>() < self.settings.timeout_rate;
            let mut deleted_at = None;
            let mut interruption_at = None;
            if interruptions > 0.0 && !times_out {
                // Exponential time to the notice, counted from the moment the instance runs.
                let u: f64 = self.interrupt_rng.random::<f64>().max(f64::MIN_POSITIVE);
                let hours = (-u.ln() / interruptions).min(1e5);
                let notice = up_at.plus(Duration::from_secs_f64(hours * 3600.0));
                interruption_at = Some(notice);
                let at = notice.plus(Duration::from_secs_f64(self.settings.interruption_notice_s.min(1e9)));
                deleted_at = Some(at);
                self.next_prune = Some(self.next_prune.map_or(at, |t| t.min(at)));
            }
            self.instances.insert(
                id,
                SimInstance {
                    created_at: now,
                    up_at,
                    times_out,
                    delete_requested_at: None,
                    deleted_at,
                    broken: false,
                    group,
                    interruption_at,
                },
            );
        }
        self.created_total += u64::from(granted);
        self.stats_mut(group).created += u64::from(granted);
        Ok(granted)
    }

    fn decrease_in(&mut self, group: u32, ids: &[String]) -> Result<Vec<String>, ProviderError> {
        let now = self.clock.now();
        let mut accepted = Vec::new();
        for id in ids {
            let delay = self.settings.deletion.sample(&mut self.rng);
            if let Some(i) = self.instances.get_mut(id) {
                if i.group == group && i.deleted_at.is_none_or(|d| d > now) && i.delete_requested_at.is_none() {
                    let done = now.plus(delay);
                    i.delete_requested_at = Some(now);
                    i.deleted_at = Some(i.deleted_at.map_or(done, |d| d.min(done)));
                    self.next_prune = Some(self.next_prune.map_or(done, |t| t.min(done)));
                    accepted.push(id.clone());
                }
            }
        }
        Ok(accepted)
    }

    fn update_in(&mut self, group: u32) -> Result<Vec<(String, InstanceState)>, ProviderError> {
        let mut listing = Vec::new();
        self.update_into_in(group, &mut listing)?;
        Ok(listing)
    }

    /// The listing of `group` into `listing`, reusing its strings (the engine polls every few
    /// seconds while instances come and go).
    fn update_into_in(&mut self, group: u32, listing: &mut Vec<(String, InstanceState)>) -> Result<(), ProviderError> {
        if let Some(message) = &self.failing {
            return Err(ProviderError::Other(message.clone()));
        }
        let now = self.clock.now();
        self.prune(now);
        // Like real clouds, deleted instances drop out of the listing.
        let live = self.instances.iter().filter(|(_, i)| i.group == group && i.deleted_at.is_none_or(|d| d > now));
        let mut len = 0;
        for (n, (id, i)) in live.enumerate() {
            let state = self.state_at(i, now);
            match listing.get_mut(n) {
                Some(entry) => {
                    entry.0.clone_from(id);
                    entry.1 = state;
                }
                None => listing.push((id.clone(), state)),
            }
            len = n + 1;
        }
        listing.truncate(len);
        Ok(())
    }

    fn interruptions_in(&mut self, group: u32) -> Result<Vec<Interruption>, ProviderError> {
        let now = self.clock.now();
        let live = |i: &SimInstance| i.deleted_at.is_none_or(|d| d > now);
        let instances = &self.instances;
        let mut notices: Vec<Interruption> = self
            .notices
            .iter()
            .filter(|n| instances.get(&n.id).is_some_and(|i| i.group == group && live(i)))
            .cloned()
            .collect();
        self.notices.retain(|n| instances.get(&n.id).is_some_and(live));
        if self.settings.interruption_rate_per_hour > 0.0 {
            for (id, i) in instances.iter().filter(|(_, i)| i.group == group && live(i)) {
                if !i.noticed_by(now) {
                    continue;
                }
                let deadline = i.deleted_at.map(|d| d.0 / 1000);
                notices.push(Interruption { id: id.clone(), reason: "spot capacity reclaimed".into(), deadline });
            }
        }
        Ok(notices)
    }
}

impl InstanceGroup for SimProvider {
    fn increase(&mut self, n: u32) -> Result<u32, ProviderError> {
        self.increase_in(0, n)
    }

    fn decrease(&mut self, ids: &[String]) -> Result<Vec<String>, ProviderError> {
        self.decrease_in(0, ids)
    }

    fn update(&mut self) -> Result<Vec<(String, InstanceState)>, ProviderError> {
        self.update_in(0)
    }

    fn update_into(&mut self, listing: &mut Vec<(String, InstanceState)>) -> Result<(), ProviderError> {
        self.update_into_in(0, listing)
    }

    fn interruptions(&mut self) -> Result<Vec<Interruption>, ProviderError> {
        self.interruptions_in(0)
    }

    fn launches_on_its_own(&self) -> bool {
        self.self_launching
    }

    fn heartbeat(&mut self, id: &str) -> Result<(), ProviderError> {
        let now = self.clock.now();
        match self.instances.get(id) {
            Some(i) if !i.broken && self.state_at(i, now) == InstanceState::Running => Ok(()),
            Some(_) => Err(ProviderError::Other(format!("instance {id} does not answer"))),
            None => Err(ProviderError::Other(format!("unknown instance {id}"))),
        }
    }
}

#[cfg(test)]
#[path = "provider_tests.rs"]
mod tests;
