//! The engine's view of a fleet: the [`InstanceGroup`] trait (GitLab fleeting's
//! `InstanceGroup`: increase, decrease, update, heartbeat) with capacity errors that carry a
//! retry-after, and [`SimProvider`], a seeded simulated cloud for tests and `runway simulate`
//! (provisioning delay distributions, `timeout` failures, deletion delay, billing records).
//! The WASM fleeting plugin adapter implements the same trait elsewhere.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::clock::{Clock, Moment};

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
}

impl SimProvider {
    /// A provider reading time from `clock`.
    pub fn new(settings: SimProviderSettings, clock: Arc<dyn Clock>) -> Self {
        let rng = StdRng::seed_from_u64(settings.seed);
        SimProvider {
            settings,
            clock,
            rng,
            next_id: 0,
            instances: BTreeMap::new(),
            gone: Vec::new(),
            increase_calls: 0,
            created_total: 0,
            notices: Vec::new(),
            self_launching: false,
            failing: None,
        }
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
            if i.deleted_at.is_none() {
                i.deleted_at = Some(now);
            }
        }
    }

    /// Instances alive (not deleted) at `now`.
    pub fn live_count(&self, now: Moment) -> usize {
        self.instances.values().filter(|i| i.deleted_at.is_none_or(|d| d > now)).count()
    }

    /// Billed seconds up to `end` (each instance at least `billing_minimum_s`).
    pub fn billed_seconds(&self, end: Moment) -> f64 {
        self.instances()
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

impl InstanceGroup for SimProvider {
    fn increase(&mut self, n: u32) -> Result<u32, ProviderError> {
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
                return Err(ProviderError::Capacity {
                    retry_after: Some(Duration::from_secs_f64(self.settings.capacity_retry_after_s)),
                });
            }
        }
        for _ in 0..granted {
            self.next_id += 1;
            let id = format!("sim-{:06}", self.next_id);
            let up_at = now.plus(self.settings.provisioning.sample(&mut self.rng));
            let times_out = self.rng.random::<f64>() < self.settings.timeout_rate;
            self.instances.insert(
                id,
                SimInstance {
                    created_at: now,
                    up_at,
                    times_out,
                    delete_requested_at: None,
                    deleted_at: None,
                    broken: false,
                },
            );
        }
        self.created_total += u64::from(granted);
        Ok(granted)
    }

    fn decrease(&mut self, ids: &[String]) -> Result<Vec<String>, ProviderError> {
        let now = self.clock.now();
        let mut accepted = Vec::new();
        for id in ids {
            let delay = self.settings.deletion.sample(&mut self.rng);
            if let Some(i) = self.instances.get_mut(id) {
                if i.deleted_at.is_none() && i.delete_requested_at.is_none() {
                    i.delete_requested_at = Some(now);
                    i.deleted_at = Some(now.plus(delay));
                    accepted.push(id.clone());
                }
            }
        }
        Ok(accepted)
    }

    fn update(&mut self) -> Result<Vec<(String, InstanceState)>, ProviderError> {
        if let Some(message) = &self.failing {
            return Err(ProviderError::Other(message.clone()));
        }
        let now = self.clock.now();
        self.prune(now);
        // Like real clouds, deleted instances drop out of the listing.
        Ok(self
            .instances
            .iter()
            .filter(|(_, i)| i.deleted_at.is_none_or(|d| d > now))
            .map(|(id, i)| (id.clone(), self.state_at(i, now)))
            .collect())
    }

    fn interruptions(&mut self) -> Result<Vec<Interruption>, ProviderError> {
        let now = self.clock.now();
        let live = |id: &str| self.instances.get(id).is_some_and(|i| i.deleted_at.is_none_or(|d| d > now));
        let notices: Vec<Interruption> = self.notices.iter().filter(|n| live(&n.id)).cloned().collect();
        self.notices = notices.clone();
        Ok(notices)
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
mod tests {
    use super::*;
    use crate::autoscaler::clock::VirtualClock;

    #[test]
    fn lognormal_samples_have_the_requested_median() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut samples: Vec<f64> = (0..20_001).map(|_| lognormal(&mut rng, 27.0, 45.0)).collect();
        samples.sort_by(f64::total_cmp);
        let median = samples[10_000];
        let p95 = samples[19_000];
        assert!((25.0..29.0).contains(&median), "median {median}");
        assert!((41.0..50.0).contains(&p95), "p95 {p95}");
    }

    #[test]
    fn simulated_instances_come_up_and_go_away() {
        let clock = Arc::new(VirtualClock::new(Moment(0)));
        let settings = SimProviderSettings {
            provisioning: DelayDistribution::Fixed { seconds: 30.0, jitter_s: 0.0 },
            deletion: DelayDistribution::Fixed { seconds: 10.0, jitter_s: 0.0 },
            timeout_rate: 0.0,
            billing_minimum_s: 0.0,
            ..Default::default()
        };
        let mut p = SimProvider::new(settings, clock.clone());
        assert_eq!(p.increase(2), Ok(2));
        let listed = p.update().expect("update");
        assert!(listed.iter().all(|(_, s)| *s == InstanceState::Creating));
        clock.advance(Duration::from_secs(30));
        let listed = p.update().expect("update");
        assert!(listed.iter().all(|(_, s)| *s == InstanceState::Running));
        let id = listed[0].0.clone();
        assert_eq!(p.decrease(std::slice::from_ref(&id)), Ok(vec![id.clone()]));
        assert!(p.update().expect("update").contains(&(id.clone(), InstanceState::Deleting)));
        clock.advance(Duration::from_secs(10));
        assert_eq!(p.update().expect("update").len(), 1);
        assert_eq!(p.billed_seconds(clock.now()), 40.0 + 40.0, "one deleted after 40 s, one still running");
    }

    #[test]
    fn full_group_reports_capacity_error_with_retry_after() {
        let clock = Arc::new(VirtualClock::new(Moment(0)));
        let mut p = SimProvider::new(SimProviderSettings { max_size: 1, ..Default::default() }, clock);
        assert_eq!(p.increase(3), Ok(1));
        assert!(matches!(p.increase(1), Err(ProviderError::Capacity { retry_after: Some(_) })));
    }
}
