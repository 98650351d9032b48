//! The plain types the engine hands out: events, errors of its calls, acquisitions, removal
//! reasons, metrics and the persistent snapshot.
//!
//! Data only, no engine logic: must not reach into the engine's state.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::autoscaler::clock::Moment;
use crate::autoscaler::predictive::PredictorState;

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
    /// The provider announced it takes the instance away (spot reclaim, rebalance,
    /// maintenance) and then did.
    Interrupted,
}

impl RemovalReason {
    /// All reasons, for metric registration.
    pub const ALL: [RemovalReason; 11] = [
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
        RemovalReason::Interrupted,
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
            RemovalReason::Interrupted => "interrupted",
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
    /// The provider announced it takes an instance away: it is drained (no new jobs, its free
    /// slots leave the capacity); jobs still on it run until it disappears.
    InstanceInterrupted {
        /// The instance id.
        instance: String,
        /// The provider's reason (`spot reclaim`, `rebalance`, `maintenance`, with the deadline
        /// when known).
        reason: String,
        /// Keys of the jobs running on it.
        keys: Vec<String>,
    },
    /// `update()` failed: no instance is created until it answers again; the engine retries
    /// with a growing interval.
    ProviderFailing {
        /// The provider's error.
        message: String,
        /// Consecutive failures so far.
        failures: u32,
        /// When the engine asks again.
        retry_in: Duration,
    },
    /// `update()` answers again after failing.
    ProviderRecovered {
        /// How many consecutive calls had failed.
        failures: u32,
    },
    /// The engine decided to remove an instance.
    InstanceRemoved {
        /// The instance id.
        instance: String,
        /// Why.
        reason: RemovalReason,
    },
    /// An instance passed a point of its life; `seconds` since the point it is measured from
    /// (the fleeting timing histograms).
    Timed {
        /// Which duration.
        timing: InstanceTiming,
        /// How long it took.
        seconds: f64,
    },
}

/// The durations of an instance's life that gitlab-runner's fleeting collectors export as
/// histograms (`fleeting_provisioner_instance_*_seconds`,
/// `fleeting_taskscaler_task_instance_readiness_time_seconds`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum InstanceTiming {
    /// From the creation request to the instance appearing in the provider's listing.
    Creation,
    /// From the creation request (or first sight) to the provider reporting it running.
    IsRunning,
    /// From the creation request (or first sight) to ready for jobs (after the ready check).
    Readiness,
    /// From the first removal request to the instance gone from the listing.
    Deletion,
    /// From first sight to gone.
    Life,
}

impl InstanceTiming {
    /// Every timing, in exposition order.
    pub const ALL: [InstanceTiming; 5] = [
        InstanceTiming::Creation,
        InstanceTiming::IsRunning,
        InstanceTiming::Readiness,
        InstanceTiming::Deletion,
        InstanceTiming::Life,
    ];
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
    /// Instances the provider announced it takes away (draining).
    pub instances_interrupted: u32,
    /// Interruption notices received in total (one per instance).
    pub interruptions_total: u64,
    /// Instances the provider's group launched on its own that were adopted.
    pub instances_adopted_total: u64,
    /// Consecutive failed `update()` calls (0 while the provider answers).
    pub provider_consecutive_failures: u32,
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
    /// What the predictive policy learned (its history), when it is enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predictor: Option<PredictorState>,
}

/// Why a new instance is not ready: what its `instance_ready_command`, or the way to run it,
/// said. The engine removes the instance and backs off further creations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotReady(pub String);

/// A Prometheus histogram of one instance timing: counts per upper bound (not cumulative),
/// the sum and the count.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TimingHistogram {
    /// Upper bounds in seconds, ascending (`+Inf` is implied).
    pub bounds: Vec<f64>,
    /// Observations per bound (the last entry: above every bound).
    pub counts: Vec<u64>,
    /// Sum of the observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl TimingHistogram {
    /// An empty histogram over `bounds` (sorted, duplicates and non-finite ones dropped).
    pub fn new(mut bounds: Vec<f64>) -> Self {
        bounds.retain(|b| b.is_finite());
        bounds.sort_by(f64::total_cmp);
        bounds.dedup();
        let counts = vec![0; bounds.len() + 1];
        TimingHistogram { bounds, counts, sum: 0.0, count: 0 }
    }

    /// Count one observation of `seconds`.
    pub fn observe(&mut self, seconds: f64) {
        let slot = self.bounds.iter().position(|b| seconds <= *b).unwrap_or(self.bounds.len());
        if let Some(c) = self.counts.get_mut(slot) {
            *c += 1;
        }
        self.sum += seconds;
        self.count += 1;
    }

    /// `(le, cumulative count)` per bound, then `+Inf`.
    pub fn cumulative(&self) -> Vec<(String, u64)> {
        let mut total = 0;
        let mut out = Vec::with_capacity(self.counts.len());
        for (i, c) in self.counts.iter().enumerate() {
            total += c;
            let le = self.bounds.get(i).map_or_else(|| "+Inf".to_string(), |b| b.to_string());
            out.push((le, total));
        }
        out
    }
}
