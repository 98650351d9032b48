//! Behaviour tests of the engine on a virtual clock against the simulated provider: seed 001's
//! worked example step by step, scale from zero, idle-time scale-down, max_use_count, preemptive
//! reservations, ready-check back-off, heartbeats, lost instances and snapshot/restore.

use std::sync::Arc;
use std::time::Duration;

use super::clock::{Clock, Moment, VirtualClock};
use super::engine::{
    AcquireStatus, EngineEvent, EngineMetrics, InstanceTiming, RemovalReason, ReserveError, Taskscaler,
};
use super::provider::{DelayDistribution, SimProvider, SimProviderSettings};
use super::settings::{AutoscalerSettings, IdlePolicy, LegacyMachineSettings, ScaleThrottle};
use super::trace::TRACE_START;

/// The engine, the simulated cloud and a ready-command stand-in, stepped on a virtual clock.
struct Harness {
    clock: Arc<VirtualClock>,
    engine: Taskscaler,
    provider: SimProvider,
    events: Vec<EngineEvent>,
    ready_delay: Duration,
    ready_ok: bool,
    ready_due: Vec<(Moment, String)>,
    max_in_creation: u32,
    max_total: u32,
}

fn fixed(seconds: f64) -> DelayDistribution {
    DelayDistribution::Fixed { seconds, jitter_s: 0.0 }
}

fn cloud(provision_s: f64) -> SimProviderSettings {
    SimProviderSettings {
        provisioning: fixed(provision_s),
        deletion: fixed(5.0),
        timeout_rate: 0.0,
        ready_failure_rate: 0.0,
        ..Default::default()
    }
}

fn utc_policy(idle_count: u32, idle_time_s: u64) -> IdlePolicy {
    IdlePolicy {
        idle_count,
        idle_time: Duration::from_secs(idle_time_s),
        timezone: Some("UTC".into()),
        ..Default::default()
    }
}

impl Harness {
    fn new(settings: &AutoscalerSettings, provider: SimProviderSettings) -> Self {
        let clock = Arc::new(VirtualClock::new(TRACE_START));
        let engine = Taskscaler::new(settings, clock.now()).expect("valid settings");
        let provider = SimProvider::new(provider, clock.clone());
        Harness {
            clock,
            engine,
            provider,
            events: Vec::new(),
            ready_delay: Duration::from_secs(5),
            ready_ok: true,
            ready_due: Vec::new(),
            max_in_creation: 0,
            max_total: 0,
        }
    }

    fn now(&self) -> Moment {
        self.clock.now()
    }

    fn metrics(&self) -> EngineMetrics {
        self.engine.metrics()
    }

    fn in_creation(&self) -> u32 {
        let m = self.metrics();
        m.instances_requested + m.instances_creating + m.instances_ready_checking
    }

    fn total(&self) -> u32 {
        let m = self.metrics();
        m.instances_requested
            + m.instances_creating
            + m.instances_ready_checking
            + m.instances_ready
            + m.instances_deleting
    }

    /// Machines serving or ready to serve (ready instances).
    fn ready(&self) -> u32 {
        self.metrics().instances_ready
    }

    fn tick(&mut self) {
        let now = self.now();
        let due: Vec<String> = self.ready_due.iter().filter(|(t, _)| *t <= now).map(|(_, id)| id.clone()).collect();
        self.ready_due.retain(|(t, _)| *t > now);
        for id in due {
            let result = if self.ready_ok { Ok(()) } else { Err(super::NotReady("cloud-init failed".to_string())) };
            self.engine.ready_check_finished(&id, result, now);
        }
        self.engine.tick(now, &mut self.provider);
        for event in self.engine.take_events() {
            if let EngineEvent::ReadyCheckRequested { instance } = &event {
                self.ready_due.push((now.plus(self.ready_delay), instance.clone()));
            }
            self.events.push(event);
        }
        self.max_in_creation = self.max_in_creation.max(self.in_creation());
        self.max_total = self.max_total.max(self.total());
    }

    /// Advance to the next moment anything happens (engine timer or ready check) and tick.
    fn step(&mut self) {
        let mut next = self.engine.next_wakeup();
        if let Some(t) = self.ready_due.iter().map(|(t, _)| *t).min() {
            next = next.min(t);
        }
        if next <= self.now() {
            next = self.now().plus(Duration::from_millis(1));
        }
        self.clock.set(next);
        self.tick();
    }

    /// Step until `done` holds (checked after every tick); panics after `limit` virtual time.
    fn step_until(&mut self, limit: Duration, what: &str, mut done: impl FnMut(&Self) -> bool) {
        let give_up = self.now().plus(limit);
        self.tick();
        while !done(self) {
            assert!(self.now() < give_up, "not reached within {limit:?}: {what}");
            self.step();
        }
    }

    /// Step through everything up to `until`, then tick at `until`.
    fn run_until(&mut self, until: Moment) {
        self.tick();
        loop {
            let mut next = self.engine.next_wakeup();
            if let Some(t) = self.ready_due.iter().map(|(t, _)| *t).min() {
                next = next.min(t);
            }
            if next > until {
                break;
            }
            if next <= self.now() {
                next = self.now().plus(Duration::from_millis(1));
            }
            self.clock.set(next);
            self.tick();
        }
        self.clock.set(until);
        self.tick();
    }

    fn run_for(&mut self, d: Duration) {
        let until = self.now().plus(d);
        self.run_until(until);
    }

    fn reserve_and_acquire(&mut self, key: &str) -> bool {
        let now = self.now();
        if self.engine.reserve(key, now).is_err() {
            return false;
        }
        self.engine.acquire(key, now).expect("reserved key can acquire");
        let events = self.engine.take_events();
        self.events.extend(events);
        true
    }

    fn acquired_keys(&self) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|e| match e {
                EngineEvent::Acquired { key, .. } => Some(key.clone()),
                _ => None,
            })
            .collect()
    }

    fn instance_of(&self, key: &str) -> Option<String> {
        self.events.iter().rev().find_map(|e| match e {
            EngineEvent::Acquired { key: k, acquisition } if k == key => Some(acquisition.instance.clone()),
            _ => None,
        })
    }
}

fn seed_001_settings() -> AutoscalerSettings {
    AutoscalerSettings::legacy(LegacyMachineSettings {
        idle_count: 2,
        idle_time: Duration::from_secs(1800),
        max_growth_rate: 1,
        limit: 10,
        ..Default::default()
    })
}

/// Seed 001: `limit = 10, MaxGrowthRate = 1, IdleCount = 2, IdleTime = 1800`, five jobs
/// queued → seven machines, five running jobs and two idle; then back to two after IdleTime.
#[test]
fn seed_001_worked_example_step_by_step() {
    let mut h = Harness::new(&seed_001_settings(), cloud(10.0));

    // "In the beginning, when no jobs are queued, GitLab Runner starts two machines" —
    // sequentially, because MaxGrowthRate = 1.
    h.tick();
    assert_eq!((h.in_creation(), h.total()), (1, 1), "first machine in creation, one at a time");
    h.step_until(Duration::from_secs(600), "two idle machines", |h| h.metrics().slots_idle == 2);
    assert_eq!((h.total(), h.ready(), h.in_creation()), (2, 2, 0), "two machines, both idle");
    assert_eq!(h.max_in_creation, 1, "never more than MaxGrowthRate machines in creation");

    // "Now, assume that five jobs are queued." The runner asks for a job only while an idle
    // machine exists (IdleCount > 0): the first two jobs go to the two idle machines.
    let mut queue: Vec<String> = (1..=5).map(|i| format!("job-{i}")).collect();
    let mut taken = Vec::new();
    while let Some(key) = queue.first().cloned() {
        if !h.reserve_and_acquire(&key) {
            break;
        }
        taken.push(queue.remove(0));
    }
    assert_eq!(taken, ["job-1", "job-2"], "first two jobs sent to the idle machines");
    assert_eq!(h.acquired_keys(), ["job-1", "job-2"]);
    assert_eq!(h.engine.reserve("job-3", h.now()), Err(ReserveError::NoCapacity), "job 3 waits in the queue");
    assert_eq!(h.metrics().slots_idle, 0);

    // "GitLab Runner starts new machines as it now notices that the number of idle is less than
    // IdleCount (0 < 2). These machines are provisioned sequentially."
    h.tick();
    assert_eq!((h.in_creation(), h.total()), (1, 3), "one new machine in creation");

    // "The remaining three jobs are assigned to the first machine that is ready." Jobs do not
    // finish (provisioning is fast compared to the jobs).
    let mut totals_when_job_started = Vec::new();
    while !queue.is_empty() {
        h.step();
        while let Some(key) = queue.first().cloned() {
            if !h.reserve_and_acquire(&key) {
                break;
            }
            queue.remove(0);
            totals_when_job_started.push(h.total());
        }
        assert!(h.in_creation() <= 1, "MaxGrowthRate = 1 holds at every step");
        assert!(h.now() < TRACE_START.plus(Duration::from_secs(3600)), "jobs 3–5 never started");
    }
    assert_eq!(h.acquired_keys(), ["job-1", "job-2", "job-3", "job-4", "job-5"]);
    // When a new machine becomes ready the runner sees one idle machine (1 < IdleCount) and
    // starts the next one at once; the queued job then takes the ready machine.
    assert_eq!(totals_when_job_started, [4, 5, 6], "each new machine took the next queued job");
    assert_eq!(h.metrics().slots_acquired, 5);

    // "We now have 1 Idle machine, so GitLab Runner starts another 1 new machine to satisfy
    // IdleCount" … "in total there are seven machines: five running jobs and two idle".
    h.step_until(Duration::from_secs(600), "two idle machines again", |h| {
        h.metrics().slots_idle == 2 && h.in_creation() == 0
    });
    assert_eq!((h.total(), h.metrics().slots_acquired, h.metrics().slots_idle), (7, 5, 2));
    assert_eq!(h.provider.created_total, 7);
    assert_eq!(h.max_in_creation, 1);
    assert!(h.max_total <= 10, "limit = 10");

    // "Because there are no new jobs in queue, those two machines stay in idle state":
    // IdleTime applies only above IdleCount.
    h.run_for(Duration::from_secs(3600));
    assert_eq!((h.total(), h.metrics().slots_idle), (7, 2), "satisfied: nothing removed, nothing added");

    // Scaling down: the jobs finish; each machine is removed IdleTime after its last job ended,
    // down to IdleCount.
    let finished = h.now();
    for i in 1..=5 {
        h.engine.release(&format!("job-{i}"), finished).expect("acquired");
    }
    h.tick();
    // Seven idle machines now exceed IdleCount: the two that have been idle for over IdleTime
    // go at once (each machine's idle time counts from its own last job, or from provisioning).
    assert_eq!((h.ready(), h.metrics().slots_idle), (5, 5), "the two long-idle machines are removed");
    assert_eq!(h.metrics().instances_removed_total.get(&RemovalReason::Idle), Some(&2));
    h.run_until(finished.plus(Duration::from_secs(1799)));
    assert_eq!(h.ready(), 5, "the others stay until IdleTime after their job ended");
    h.run_until(finished.plus(Duration::from_secs(1800 + 60)));
    assert_eq!((h.total(), h.metrics().slots_idle), (2, 2), "back to IdleCount idle machines");
    assert_eq!(h.metrics().instances_removed_total.get(&RemovalReason::Idle), Some(&5));
    assert_eq!(h.provider.created_total, 7, "no machine re-created after the scale-down");
}

/// Seed 001's summary: one job → one more machine to keep two idle → job finishes, three idle →
/// the one idle longer than IdleTime is removed → two idle remain.
#[test]
fn seed_001_summary_single_job_cycle() {
    let mut h = Harness::new(&seed_001_settings(), cloud(10.0));
    h.step_until(Duration::from_secs(600), "two idle machines", |h| h.metrics().slots_idle == 2);
    assert!(h.reserve_and_acquire("job"));
    h.step_until(Duration::from_secs(600), "one more machine", |h| h.metrics().slots_idle == 2 && h.in_creation() == 0);
    assert_eq!(h.total(), 3);
    let finished = h.now().plus(Duration::from_secs(600));
    h.run_until(finished);
    h.engine.release("job", finished).expect("acquired");
    h.tick();
    assert_eq!(h.metrics().slots_idle, 3, "job finishes: three idle machines");
    h.run_until(finished.plus(Duration::from_secs(1900)));
    assert_eq!((h.total(), h.metrics().slots_idle), (2, 2));
    assert_eq!(h.metrics().instances_removed_total.get(&RemovalReason::Idle), Some(&1));
}

#[test]
fn on_demand_mode_at_idle_count_zero_creates_a_machine_per_job() {
    let settings = AutoscalerSettings::legacy(LegacyMachineSettings {
        idle_count: 0,
        idle_time: Duration::from_secs(600),
        limit: 3,
        ..Default::default()
    });
    let mut h = Harness::new(&settings, cloud(20.0));
    h.run_for(Duration::from_secs(120));
    assert_eq!(h.total(), 0, "no idle machines in on-demand mode");
    for i in 0..4 {
        let key = format!("job-{i}");
        assert_eq!(h.reserve_and_acquire(&key), i < 3, "limit = 3 caps jobs taken on demand");
    }
    h.step_until(Duration::from_secs(300), "three jobs running", |h| h.metrics().slots_acquired == 3);
    assert_eq!(h.total(), 3);
}

#[test]
fn scales_from_zero_to_n_on_queued_jobs_and_back_to_zero() {
    let settings = AutoscalerSettings {
        capacity_per_instance: 2,
        max_instances: 10,
        policies: vec![utc_policy(0, 300)],
        ..Default::default()
    };
    let mut h = Harness::new(&settings, cloud(30.0));
    h.run_for(Duration::from_secs(60));
    assert_eq!(h.total(), 0);
    for i in 0..5 {
        assert!(h.reserve_and_acquire(&format!("job-{i}")), "non-preemptive: jobs are taken before instances exist");
    }
    h.tick();
    assert_eq!(h.in_creation(), 3, "ceil(5 jobs / 2 slots) instances requested at once");
    h.step_until(Duration::from_secs(600), "all five jobs running", |h| h.metrics().slots_acquired == 5);
    assert_eq!(h.total(), 3);
    let done = h.now();
    for i in 0..5 {
        h.engine.release(&format!("job-{i}"), done).expect("acquired");
    }
    h.run_until(done.plus(Duration::from_secs(300 + 60)));
    assert_eq!(h.total(), 0, "idle_count = 0 with capacity 2 scales to zero (gitlab-runner#37643)");
    // Each instance's life was timed once at every point (the fleeting histograms).
    let timed = |which: InstanceTiming| -> Vec<f64> {
        h.events
            .iter()
            .filter_map(|e| match e {
                EngineEvent::Timed { timing, seconds } if *timing == which => Some(*seconds),
                _ => None,
            })
            .collect()
    };
    for which in InstanceTiming::ALL {
        assert_eq!(timed(which).len(), 3, "{which:?}: {:?}", timed(which));
    }
    let sum = |which| timed(which).iter().sum::<f64>();
    assert!(timed(InstanceTiming::IsRunning).iter().all(|s| *s >= 30.0), "provisioning takes 30 s");
    // No instance_ready_command here: an instance is ready when it runs.
    assert_eq!(sum(InstanceTiming::Readiness), sum(InstanceTiming::IsRunning));
    assert!(timed(InstanceTiming::Deletion).iter().all(|s| *s >= 5.0), "deletion takes 5 s");
    assert!(timed(InstanceTiming::Life).iter().all(|s| *s >= 300.0), "idle for idle_time before removal");
}

#[test]
fn idle_time_scale_down_keeps_the_idle_target_without_churn() {
    let settings = AutoscalerSettings { policies: vec![utc_policy(1, 1200)], ..Default::default() };
    let mut h = Harness::new(&settings, cloud(20.0));
    h.step_until(Duration::from_secs(600), "one idle", |h| h.metrics().slots_idle == 1);
    for i in 0..3 {
        h.step_until(Duration::from_secs(600), "an idle slot", |h| h.metrics().slots_idle >= 1);
        assert!(h.reserve_and_acquire(&format!("job-{i}")));
    }
    h.step_until(Duration::from_secs(600), "idle target met", |h| h.metrics().slots_idle == 1 && h.in_creation() == 0);
    assert_eq!(h.total(), 4);
    let done = h.now();
    for i in 0..3 {
        h.engine.release(&format!("job-{i}"), done).expect("acquired");
    }
    h.run_until(done.plus(Duration::from_secs(1199)));
    assert_eq!(h.total(), 4, "nothing removed before idle_time");
    h.run_until(done.plus(Duration::from_secs(4 * 3600)));
    assert_eq!((h.total(), h.metrics().slots_idle), (1, 1), "idle_count = 1 keeps exactly one (gitlab-runner#37673)");
    assert_eq!(h.provider.created_total, 4, "no delete-one-create-one churn");
}

#[test]
fn max_use_count_retires_instances() {
    let settings = AutoscalerSettings { max_use_count: 2, policies: vec![utc_policy(1, 3600)], ..Default::default() };
    let mut h = Harness::new(&settings, cloud(10.0));
    h.step_until(Duration::from_secs(600), "one idle", |h| h.metrics().slots_idle == 1);
    let mut first_instance = None;
    for i in 0..2 {
        h.step_until(Duration::from_secs(600), "an idle slot", |h| h.metrics().slots_idle >= 1);
        let key = format!("job-{i}");
        assert!(h.reserve_and_acquire(&key));
        let instance = h.instance_of(&key).expect("acquired at once");
        first_instance.get_or_insert(instance.clone());
        h.run_for(Duration::from_secs(60));
        h.engine.release(&key, h.now()).expect("acquired");
        h.tick();
    }
    let first = first_instance.expect("first job ran");
    assert!(
        h.events.iter().any(|e| matches!(e, EngineEvent::InstanceRemoved { instance, reason: RemovalReason::MaxUseCount } if *instance == first)),
        "instance used twice is retired"
    );
    assert_eq!(h.metrics().instances_removed_total.get(&RemovalReason::MaxUseCount), Some(&1));
    h.step_until(Duration::from_secs(600), "a fresh idle instance", |h| h.metrics().slots_idle == 1);
    assert!(h.reserve_and_acquire("job-2"));
    assert_ne!(h.instance_of("job-2"), Some(first), "a retired instance is never reused");
}

#[test]
fn unavailable_slots_of_retiring_instances_are_not_handed_out() {
    let settings = AutoscalerSettings {
        capacity_per_instance: 4,
        max_use_count: 2,
        max_instances: 1,
        policies: vec![IdlePolicy { preemptive_mode: Some(true), ..utc_policy(1, 3600) }],
        ..Default::default()
    };
    let mut h = Harness::new(&settings, cloud(10.0));
    h.step_until(Duration::from_secs(600), "instance ready", |h| h.ready() == 1);
    assert_eq!(h.metrics().slots_idle, 2, "only max_use_count slots of four are usable");
    assert_eq!(h.metrics().slots_unavailable, 2);
    assert!(h.reserve_and_acquire("a"));
    assert!(h.reserve_and_acquire("b"));
    assert!(!h.reserve_and_acquire("c"), "the remaining slots are unavailable");
}

#[test]
fn preemptive_and_non_preemptive_reservations() {
    // Preemptive: only with an idle slot on a ready instance.
    let preemptive = AutoscalerSettings { policies: vec![utc_policy(1, 3600)], ..Default::default() };
    let mut h = Harness::new(&preemptive, cloud(30.0));
    h.tick();
    assert_eq!(h.engine.reserve("early", h.now()), Err(ReserveError::NoCapacity), "instance still provisioning");
    h.step_until(Duration::from_secs(600), "ready", |h| h.metrics().slots_idle == 1);
    assert_eq!(h.engine.reserve("a", h.now()), Ok(()));
    assert_eq!(h.engine.reserve("b", h.now()), Err(ReserveError::NoCapacity), "the one idle slot is promised");
    assert!(h.engine.unreserve("a"), "GitLab had no job");
    assert_eq!(h.engine.reserve("b", h.now()), Ok(()));

    // Non-preemptive: as long as max_instances × capacity allows, even with nothing running.
    let on_demand = AutoscalerSettings {
        capacity_per_instance: 2,
        max_instances: 1,
        policies: vec![utc_policy(0, 60)],
        ..Default::default()
    };
    let mut h = Harness::new(&on_demand, cloud(30.0));
    h.tick();
    assert_eq!(h.engine.reserve("x", h.now()), Ok(()));
    assert_eq!(h.engine.reserve("y", h.now()), Ok(()));
    assert_eq!(h.engine.reserve("z", h.now()), Err(ReserveError::NoCapacity), "1 instance × 2 slots");
    assert_eq!(h.engine.reserve("x", h.now()), Err(ReserveError::DuplicateKey("x".into())));
}

#[test]
fn acquire_times_out_when_no_instance_arrives() {
    let settings = AutoscalerSettings {
        policies: vec![utc_policy(0, 60)],
        instance_acquire_timeout: Duration::from_secs(120),
        ..Default::default()
    };
    let mut h = Harness::new(&settings, SimProviderSettings { max_size: 0, ..cloud(600.0) });
    h.tick();
    assert!(h.reserve_and_acquire("slow"));
    assert!(matches!(h.engine.poll_acquire("slow"), Ok(AcquireStatus::Waiting { .. })));
    h.run_for(Duration::from_secs(121));
    assert!(h.events.contains(&EngineEvent::AcquireTimedOut { key: "slow".into() }));
    assert!(h.engine.poll_acquire("slow").is_err());
}

#[test]
fn failing_ready_command_backs_off_instead_of_storming() {
    let settings = AutoscalerSettings {
        policies: vec![utc_policy(10, 0)],
        instance_ready_command: Some("cloud-init status --wait".into()),
        ..Default::default()
    };
    let mut h = Harness::new(&settings, cloud(30.0));
    h.ready_ok = false;
    h.ready_delay = Duration::from_secs(20);
    let mut creations_at = Vec::new();
    let end = h.now().plus(Duration::from_secs(24 * 3600));
    h.tick();
    while h.now() < end {
        let before = h.provider.created_total;
        h.step();
        for _ in before..h.provider.created_total {
            creations_at.push(h.now());
        }
    }
    let created = h.provider.created_total;
    // Without back-off ten instances would be re-created every ~50 s: > 17,000 a day.
    assert!(created >= 10, "it keeps probing: {created}");
    assert!(created <= 10 + 24 * 6 + 10, "creations bounded by the back-off: {created}");
    let gaps: Vec<Duration> = creations_at.windows(2).map(|w| w[1].since(w[0])).collect();
    let late = &gaps[gaps.len() - 10..];
    assert!(
        late.iter().all(|g| *g >= Duration::from_secs(600)),
        "later creations are spaced by the maximum back-off: {late:?}"
    );
    assert_eq!(h.metrics().slots_idle, 0);
    assert!(h.metrics().ready_failures_total >= 10);

    // Once the command works again, the fleet fills up.
    h.ready_ok = true;
    h.step_until(Duration::from_secs(3600), "ten idle slots", |h| h.metrics().slots_idle == 10);
}

#[test]
fn heartbeat_failures_replace_an_unhealthy_instance() {
    let settings = AutoscalerSettings {
        policies: vec![utc_policy(1, 3600)],
        heartbeat_interval: Some(Duration::from_secs(10)),
        failure_threshold: 3,
        ..Default::default()
    };
    let mut h = Harness::new(&settings, cloud(10.0));
    h.step_until(Duration::from_secs(600), "ready", |h| h.metrics().slots_idle == 1);
    let (broken, _, _) = h.engine.instance_summary()[0].clone();
    h.provider.break_instance(&broken);
    h.run_for(Duration::from_secs(25));
    assert!(h.engine.instance_summary().iter().any(|(id, _, _)| *id == broken), "below the threshold it stays");
    h.step_until(Duration::from_secs(600), "replacement ready", |h| {
        h.metrics().slots_idle == 1 && !h.engine.instance_summary().iter().any(|(id, _, _)| *id == broken)
    });
    assert_eq!(h.metrics().instances_removed_total.get(&RemovalReason::Unhealthy), Some(&1));
    assert!(h.metrics().heartbeat_failures_total >= 3);
    assert_eq!(h.provider.created_total, 2, "exactly one replacement");
}

#[test]
fn instance_lost_mid_job_reports_the_job_keys_and_is_replaced() {
    let settings =
        AutoscalerSettings { capacity_per_instance: 2, policies: vec![utc_policy(2, 3600)], ..Default::default() };
    let mut h = Harness::new(&settings, cloud(10.0));
    h.step_until(Duration::from_secs(600), "ready", |h| h.metrics().slots_idle == 2);
    assert!(h.reserve_and_acquire("job-a"));
    assert!(h.reserve_and_acquire("job-b"));
    let instance = h.instance_of("job-a").expect("acquired");
    assert_eq!(h.instance_of("job-b").as_ref(), Some(&instance), "packed on one instance");
    h.step_until(Duration::from_secs(600), "idle target restored", |h| h.metrics().slots_idle == 2);
    h.provider.vanish(&instance);
    h.step_until(Duration::from_secs(600), "loss noticed", |h| {
        h.events.iter().any(|e| matches!(e, EngineEvent::InstanceLost { .. }))
    });
    let lost = h.events.iter().find_map(|e| match e {
        EngineEvent::InstanceLost { instance, keys, reason } => Some((instance.clone(), keys.clone(), *reason)),
        _ => None,
    });
    let (lost_instance, mut keys, reason) = lost.expect("lost event");
    keys.sort();
    assert_eq!(
        (lost_instance, keys, reason),
        (instance, vec!["job-a".to_string(), "job-b".to_string()], RemovalReason::Lost)
    );
    assert!(h.engine.release("job-a", h.now()).is_err(), "the acquisition is gone");
    assert_eq!(h.metrics().slots_acquired, 0);
    assert_eq!(h.metrics().instances_lost_total, 1);
}

#[test]
fn snapshot_restore_adopts_instances_with_use_counts() {
    let settings = AutoscalerSettings { max_use_count: 10, policies: vec![utc_policy(2, 3600)], ..Default::default() };
    let mut h = Harness::new(&settings, cloud(10.0));
    h.step_until(Duration::from_secs(600), "ready", |h| h.metrics().slots_idle == 2);
    assert!(h.reserve_and_acquire("running"), "one job still running at the restart");
    let running_on = h.instance_of("running").expect("acquired");
    for i in 0..3 {
        let key = format!("job-{i}");
        h.step_until(Duration::from_secs(600), "an idle slot", |h| h.metrics().slots_idle >= 1);
        assert!(h.reserve_and_acquire(&key));
        h.run_for(Duration::from_secs(30));
        h.engine.release(&key, h.now()).expect("acquired");
        h.tick();
    }
    h.step_until(Duration::from_secs(600), "steady", |h| h.in_creation() == 0 && h.metrics().slots_idle >= 2);
    let idle_before = h.metrics().slots_idle;
    let before: Vec<(String, u32, u32)> = h.engine.instance_summary();
    let saved = serde_json::to_string(&h.engine.snapshot(h.now())).expect("serialise");

    // The manager restarts: a new engine from the saved state, same cloud.
    let snapshot = serde_json::from_str(&saved).expect("deserialise");
    h.engine = Taskscaler::restore(&settings, &snapshot, h.now()).expect("restore");
    h.events.clear();
    let created_before = h.provider.created_total;
    h.run_for(Duration::from_secs(5));
    let after = h.engine.instance_summary();
    let expected: Vec<(String, u32, u32)> =
        before.iter().filter(|(id, _, _)| *id != running_on).map(|(id, uses, _)| (id.clone(), *uses, 0)).collect();
    let adopted: Vec<(String, u32, u32)> = after.iter().filter(|(id, _, _)| *id != running_on).cloned().collect();
    assert_eq!(adopted, expected, "adopted with their use counts");
    assert!(expected.iter().map(|(_, uses, _)| uses).sum::<u32>() >= 1, "use counts survived");
    assert!(h
        .events
        .contains(&EngineEvent::AcquisitionsAbandoned { instance: running_on.clone(), keys: vec!["running".into()] }));
    assert!(h.events.contains(&EngineEvent::InstanceRemoved {
        instance: running_on,
        reason: RemovalReason::AbandonedAcquisitions
    }));
    assert!(!h.events.iter().any(|e| matches!(e, EngineEvent::InstanceRemoved { reason: RemovalReason::Unknown, .. })));
    assert_eq!(h.provider.created_total, created_before, "idle target still met: nothing created");
    assert_eq!(h.metrics().slots_idle, idle_before, "every idle instance adopted and assignable");

    // Without saved state a restarted manager removes pre-existing instances for safety.
    let mut fresh = Taskscaler::new(&settings, h.now()).expect("valid");
    fresh.tick(h.now(), &mut h.provider);
    let unknown = fresh
        .take_events()
        .into_iter()
        .filter(|e| matches!(e, EngineEvent::InstanceRemoved { reason: RemovalReason::Unknown, .. }))
        .count();
    assert_eq!(unknown, adopted.len(), "every running instance is unknown to a manager without state");
}

#[test]
fn held_restored_acquisitions_keep_their_instance_until_reattached_or_abandoned() {
    let settings = AutoscalerSettings { max_use_count: 10, policies: vec![utc_policy(1, 60)], ..Default::default() };
    let mut h = Harness::new(&settings, cloud(10.0));
    h.step_until(Duration::from_secs(600), "ready", |h| h.metrics().slots_idle == 1);
    assert!(h.reserve_and_acquire("fleet/1"));
    assert!(h.engine.rekey("fleet/1", "fleet/job/7"), "renamed to its job's key");
    assert!(!h.engine.rekey("fleet/1", "fleet/job/8"), "the old key is gone");
    let on = h.instance_of("fleet/1").expect("acquired");
    h.step_until(Duration::from_secs(600), "a second idle instance", |h| h.metrics().slots_idle == 1);
    assert!(h.reserve_and_acquire("fleet/2"));
    assert!(h.engine.rekey("fleet/2", "fleet/job/9"));
    let other = h.instance_of("fleet/2").expect("acquired");
    let saved = serde_json::to_string(&h.engine.snapshot(h.now())).expect("serialise");

    // Restarted with both jobs in its snapshot; the store still has job 7 only.
    let snapshot = serde_json::from_str(&saved).expect("deserialise");
    h.engine = Taskscaler::restore(&settings, &snapshot, h.now()).expect("restore");
    h.engine.hold_restored();
    h.events.clear();
    // Long past idle_time: held slots keep their instances, and are never handed out.
    h.run_for(Duration::from_secs(600));
    assert_eq!(h.metrics().slots_acquired, 2, "both held");
    assert!(!h
        .events
        .iter()
        .any(|e| matches!(e, EngineEvent::InstanceRemoved { instance, .. } if *instance == on || *instance == other)));
    assert!(h.reserve_and_acquire("fleet/3"));
    let third = h.instance_of("fleet/3").expect("acquired");
    assert!(third != on && third != other, "a held slot is not handed out");
    h.engine.release("fleet/3", h.now()).expect("release");

    // Job 9 is in no store: its key is abandoned and its instance removed.
    assert_eq!(h.engine.abandon_restored(&|key| key == "fleet/job/7"), 1, "job 9's slot released");
    h.tick();
    assert!(h
        .events
        .contains(&EngineEvent::AcquisitionsAbandoned { instance: other.clone(), keys: vec!["fleet/job/9".into()] }));
    assert!(h
        .events
        .contains(&EngineEvent::InstanceRemoved { instance: other, reason: RemovalReason::AbandonedAcquisitions }));
    assert_eq!(h.engine.restored_keys(), ["fleet/job/7"]);
    // Job 7 resumes: its slot is its own again, released as any other.
    let back = h.engine.reattach("fleet/job/7").expect("held");
    assert_eq!(back.instance, on);
    assert!(h.engine.reattach("fleet/job/7").is_none(), "once");
    assert!(h.engine.reattach("fleet/job/9").is_none(), "abandoned");
    h.run_for(Duration::from_secs(5));
    h.engine.release("fleet/job/7", h.now()).expect("an ordinary acquisition");
    assert!(h.engine.restored_keys().is_empty());
}

#[test]
fn scale_throttle_limits_creation_rate() {
    let settings = AutoscalerSettings {
        policies: vec![utc_policy(0, 60)],
        scale_throttle: ScaleThrottle { limit: 1.0, burst: 2 },
        ..Default::default()
    };
    let mut h = Harness::new(&settings, cloud(60.0));
    h.tick();
    for i in 0..6 {
        assert!(h.reserve_and_acquire(&format!("job-{i}")));
    }
    h.tick();
    assert_eq!(h.provider.created_total, 2, "burst");
    h.run_for(Duration::from_millis(2500));
    assert_eq!(h.provider.created_total, 4, "then one per second");
}

#[test]
fn cron_policies_switch_idle_capacity_with_office_hours() {
    let settings = AutoscalerSettings {
        policies: vec![
            utc_policy(0, 600),
            IdlePolicy { periods: vec!["* 8-18 * * mon-fri".into()], ..utc_policy(3, 600) },
        ],
        ..Default::default()
    };
    let mut h = Harness::new(&settings, cloud(20.0));
    h.run_until(TRACE_START.plus(Duration::from_secs(7 * 3600 + 59 * 60)));
    assert_eq!(h.total(), 0, "night: nothing idle");
    h.run_until(TRACE_START.plus(Duration::from_secs(8 * 3600 + 120)));
    assert_eq!(h.metrics().slots_idle, 3, "office hours: three idle slots");
    h.run_until(TRACE_START.plus(Duration::from_secs(19 * 3600 + 11 * 60)));
    assert_eq!(h.total(), 0, "evening: idle instances removed after idle_time");
}

#[test]
fn legacy_max_builds_removes_a_machine_after_its_jobs() {
    let settings = AutoscalerSettings::legacy(LegacyMachineSettings {
        idle_count: 1,
        idle_time: Duration::from_secs(600),
        max_builds: 1,
        limit: 5,
        ..Default::default()
    });
    let mut h = Harness::new(&settings, cloud(10.0));
    h.step_until(Duration::from_secs(600), "one idle machine", |h| h.metrics().slots_idle == 1);
    assert!(h.reserve_and_acquire("job"));
    let machine = h.instance_of("job").expect("acquired");
    h.run_for(Duration::from_secs(120));
    h.engine.release("job", h.now()).expect("acquired");
    h.tick();
    assert!(h.events.contains(&EngineEvent::InstanceRemoved { instance: machine, reason: RemovalReason::MaxUseCount }));
    h.step_until(Duration::from_secs(600), "idle machine kept", |h| {
        h.metrics().slots_idle == 1 && h.in_creation() == 0
    });
    assert_eq!(h.provider.created_total, 2, "one machine per build, plus the idle one");
}

#[test]
fn capacity_errors_pause_creation_for_retry_after() {
    let settings = AutoscalerSettings { policies: vec![utc_policy(5, 600)], ..Default::default() };
    let provider = SimProviderSettings { max_size: 2, capacity_retry_after_s: 30.0, ..cloud(10.0) };
    let mut h = Harness::new(&settings, provider);
    h.run_for(Duration::from_secs(3600));
    assert_eq!(h.provider.created_total, 2, "the cloud's limit");
    assert_eq!(h.metrics().slots_idle, 2);
    let calls = h.provider.increase_calls;
    assert!(calls <= 3600 / 30 + 3, "retries honour retry-after: {calls} increase calls in an hour");
    assert!(h.metrics().provider_errors_total >= 100, "it keeps asking every 30 s");
}

#[test]
fn shutdown_removes_idle_instances_and_stops_reserving() {
    let settings = AutoscalerSettings {
        policies: vec![utc_policy(3, 600)],
        delete_instances_on_shutdown: true,
        ..Default::default()
    };
    let mut h = Harness::new(&settings, cloud(10.0));
    h.step_until(Duration::from_secs(600), "three idle", |h| h.metrics().slots_idle == 3);
    assert!(h.reserve_and_acquire("busy"));
    let busy_on = h.instance_of("busy").expect("acquired");
    let now = h.now();
    h.engine.shutdown(now, &mut h.provider);
    assert_eq!(h.engine.reserve("late", now), Err(ReserveError::ShuttingDown));
    assert_eq!(h.metrics().instances_removed_total.get(&RemovalReason::Shutdown), Some(&2));
    h.run_for(Duration::from_secs(120));
    let left: Vec<String> = h.engine.instance_summary().into_iter().map(|(id, _, _)| id).collect();
    assert_eq!(left, vec![busy_on], "the instance running a job stays; nothing is re-created");
}

/// Long polling as the manager drives it: before every job request a reservation is held for
/// the whole poll (here 25 s) and given back when GitLab had no job, again and again for six
/// hours of virtual time. The fleet must sit at `idle_count` without creating or removing a
/// single instance after warm-up, preemptive or not, and with the predictive policy.
#[test]
fn long_polling_reservations_cause_no_churn() {
    let predictive = || Some(super::predictive::PredictiveSettings::default());
    let cases = [
        ("preemptive", IdlePolicy { preemptive_mode: Some(true), ..utc_policy(2, 300) }, None),
        ("non-preemptive", IdlePolicy { preemptive_mode: Some(false), ..utc_policy(2, 300) }, None),
        ("predictive", utc_policy(2, 300), predictive()),
    ];
    for (name, policy, predictive) in cases {
        let settings = AutoscalerSettings { policies: vec![policy], predictive, ..Default::default() };
        let mut h = Harness::new(&settings, cloud(10.0));
        h.step_until(Duration::from_secs(600), "warm-up", |h| h.metrics().slots_idle == 2 && h.in_creation() == 0);
        let created = h.provider.created_total;
        let removed: u64 = h.metrics().instances_removed_total.values().sum();
        let end = h.now().plus(Duration::from_secs(6 * 3600));
        let mut polls = 0u64;
        while h.now() < end {
            let key = format!("poll-{polls}");
            assert!(h.engine.reserve(&key, h.now()).is_ok(), "{name}: the poller can always reserve");
            h.run_for(Duration::from_secs(25));
            assert!(h.engine.unreserve(&key), "{name}: released without a job");
            h.run_for(Duration::from_secs(2));
            polls += 1;
        }
        assert!(polls > 700);
        assert_eq!(h.provider.created_total, created, "{name}: no instance created by polling");
        assert_eq!(h.metrics().instances_removed_total.values().sum::<u64>(), removed, "{name}: none removed");
        assert_eq!(h.total(), 2, "{name}: the fleet stays at idle_count");
    }
}

/// The predictive policy learns a daily burst at 04:00 through the engine's own observations
/// and, on the fourth day, has instances requested before 04:00 and ready when it arrives;
/// what it learned survives a snapshot and restore.
#[test]
fn predictive_policy_pre_warms_a_daily_burst_and_keeps_its_history_across_restarts() {
    let settings = AutoscalerSettings {
        policies: vec![utc_policy(0, 600)],
        predictive: Some(super::predictive::PredictiveSettings {
            lead_time: Some(Duration::from_secs(60)),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut h = Harness::new(&settings, cloud(30.0));
    let day = Duration::from_secs(86_400);
    let burst = 40;
    for d in 0..3u32 {
        let four = TRACE_START.plus(day * d).plus(Duration::from_secs(4 * 3600));
        h.run_until(four);
        for i in 0..burst {
            assert!(h.reserve_and_acquire(&format!("d{d}-{i}")), "non-preemptive: every job is taken");
        }
        h.step_until(Duration::from_secs(600), "the burst runs", |h| h.metrics().slots_acquired == burst);
        h.run_for(Duration::from_secs(600));
        for i in 0..burst {
            h.engine.release(&format!("d{d}-{i}"), h.now()).expect("acquired");
        }
        h.tick();
    }
    // Day 3, shortly before 04:00: the fleet is being pre-warmed.
    let four = TRACE_START.plus(day * 3).plus(Duration::from_secs(4 * 3600));
    h.run_until(four.minus(Duration::from_secs(45 * 60)));
    assert_eq!(h.total(), 0, "nothing kept idle during the night");
    let saved = serde_json::to_string(&h.engine.snapshot(h.now())).expect("serialise");
    let snapshot = serde_json::from_str(&saved).expect("deserialise");
    h.engine = Taskscaler::restore(&settings, &snapshot, h.now()).expect("restore");
    let target_before = h.engine.predictor().map(|p| p.idle_target(four.minus(Duration::from_secs(10))));
    assert!(target_before.is_some_and(|t| t >= burst), "the history survived the restart: {target_before:?}");
    h.run_until(four);
    assert!(h.ready() >= burst, "{} instances ready when the burst arrives", h.ready());
    let now = h.now();
    for i in 0..burst {
        let key = format!("d3-{i}");
        h.engine.reserve(&key, now).expect("reserve");
        assert!(
            matches!(h.engine.acquire(&key, now), Ok(AcquireStatus::Ready(_))),
            "job {i} starts at once on a pre-warmed instance"
        );
    }
}

/// Scale-down to the forecast level (`release_horizon`): after an unforeseen burst of 20 jobs
/// ends, the idle instances the forecast does not expect to need within the horizon leave at
/// once; without it they wait for their keep-alive (here `min_idle_time` = 10 minutes).
#[test]
fn release_horizon_removes_idle_instances_beyond_the_forecast_at_once() {
    let remaining_after_burst = |release_horizon: Option<Duration>| {
        let settings = AutoscalerSettings {
            policies: vec![utc_policy(0, 600)],
            predictive: Some(super::predictive::PredictiveSettings {
                lead_time: Some(Duration::from_secs(60)),
                min_idle_time: Duration::from_secs(600),
                release_horizon,
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut h = Harness::new(&settings, cloud(30.0));
        // A quiet Monday is the history; the burst comes on Tuesday at 10:00.
        let ten = TRACE_START.plus(Duration::from_secs(86_400 + 10 * 3600));
        h.run_until(ten);
        for i in 0..20 {
            assert!(h.reserve_and_acquire(&format!("job-{i}")));
        }
        h.step_until(Duration::from_secs(600), "the burst runs", |h| h.metrics().slots_acquired == 20);
        h.run_for(Duration::from_secs(300));
        for i in 0..20 {
            h.engine.release(&format!("job-{i}"), h.now()).expect("acquired");
        }
        h.run_for(Duration::from_secs(60));
        h.ready()
    };
    assert_eq!(remaining_after_burst(None), 20, "keep-alive: all idle instances stay");
    assert_eq!(remaining_after_burst(Some(Duration::from_secs(300))), 0, "beyond the forecast: released");
}

// ---- GitLab's semantics, one test per point (sources cited in docs/autoscaling.md §10) ----

/// `scale_factor` raises the idle target to a minimum of `idle_count` (it does not add to it),
/// and `scale_factor_limit = 0` means no cap; the engine acts on that target.
#[test]
fn semantics_scale_factor_is_a_minimum_and_a_zero_limit_is_no_cap() {
    let policy = IdlePolicy { scale_factor: 0.5, scale_factor_limit: 0, ..utc_policy(2, 600) };
    let settings = AutoscalerSettings { policies: vec![policy], ..Default::default() };
    let compiled = settings.compile().expect("valid");
    let p = compiled.active_policy(TRACE_START);
    assert_eq!(compiled.idle_target(&p, 10), 5, "max(2, ceil(10 × 0.5)), not 2 + 5");
    assert_eq!(compiled.idle_target(&p, 2), 2, "idle_count is the floor");
    assert_eq!(compiled.idle_target(&p, 1000), 500, "scale_factor_limit = 0: no cap");
    let mut h = Harness::new(&settings, cloud(10.0));
    h.step_until(Duration::from_secs(600), "idle_count", |h| h.metrics().slots_idle == 2);
    for i in 0..10 {
        h.step_until(Duration::from_secs(600), "an idle slot", |h| h.metrics().slots_idle >= 1);
        assert!(h.reserve_and_acquire(&format!("job-{i}")));
    }
    h.step_until(Duration::from_secs(600), "scaled", |h| h.in_creation() == 0 && h.metrics().slots_idle == 5);
    assert_eq!(h.metrics().idle_target, 5);
    assert_eq!(h.total(), 15, "10 running + 5 idle");
}

/// No period matches: taskscaler falls back to nothing idle and no preemption (so jobs are
/// still taken); docker+machine falls back to the `[runners.machine]` values.
#[test]
fn semantics_no_matching_period_is_a_zero_policy_or_the_machine_defaults() {
    let office = IdlePolicy { periods: vec!["* 8-18 * * mon-fri".into()], ..utc_policy(5, 600) };
    let settings = AutoscalerSettings { policies: vec![office], ..Default::default() };
    let compiled = settings.compile().expect("valid");
    let sunday = TRACE_START.plus(Duration::from_secs(6 * 86_400 + 10 * 3600));
    let p = compiled.active_policy(sunday);
    assert!(p.policy().is_none() && !p.preemptive());
    assert_eq!((compiled.idle_target(&p, 3), p.idle_time()), (0, Duration::ZERO));
    let legacy = AutoscalerSettings::legacy(LegacyMachineSettings {
        idle_count: 3,
        idle_time: Duration::from_secs(900),
        autoscaling: vec![super::settings::LegacyPeriod {
            periods: vec!["* * 8-18 * * mon-fri *".into()],
            timezone: Some("UTC".into()),
            idle_count: 20,
            idle_time: Duration::from_secs(60),
            ..Default::default()
        }],
        ..Default::default()
    })
    .compile()
    .expect("valid");
    let p = legacy.active_policy(sunday);
    assert_eq!((legacy.idle_target(&p, 0), p.idle_time()), (3, Duration::from_secs(900)));
}

/// docker+machine periods have seconds (`sec min hour dom mon dow year`), and gitlab-runner
/// looks at them whenever it checks its machines: a period that starts or ends within a minute
/// changes the idle count then, not at the next minute boundary. Extra idle machines come when
/// the higher `IdleCount` applies; when it ends, the idle machines beyond the lower count go
/// once idle for the `IdleTime` in force then.
#[test]
fn semantics_docker_machine_periods_switch_on_the_second() {
    let settings = AutoscalerSettings::legacy(LegacyMachineSettings {
        idle_count: 1,
        idle_time: Duration::from_secs(30),
        autoscaling: vec![super::settings::LegacyPeriod {
            periods: vec!["20-39 * * * * * *".into()],
            timezone: Some("UTC".into()),
            idle_count: 3,
            idle_time: Duration::from_secs(3600),
            ..Default::default()
        }],
        ..Default::default()
    });
    let at = |s: u64| TRACE_START.plus(Duration::from_secs(s));
    let mut h = Harness::new(&settings, cloud(2.0));
    h.step_until(Duration::from_secs(60), "one idle machine", |h| h.ready() == 1);
    h.step_until(Duration::from_secs(60), "the period's idle count", |h| h.ready() == 3);
    assert!((at(20)..at(30)).contains(&h.now()), "created from second 20 on, at {:?}", h.now().since(TRACE_START));
    assert_eq!(h.provider.created_total, 3);

    let removed = |h: &Harness| h.metrics().instances_removed_total.get(&RemovalReason::Idle).copied().unwrap_or(0);
    h.step_until(Duration::from_secs(60), "a removal", |h| removed(h) > 0);
    // The first machine, idle since second 2, is past the 30 s IdleTime when the period ends.
    assert_eq!(h.now(), at(40), "the period ended at second 40");
    assert_eq!(removed(&h), 1, "the extra machines became idle at second 22: not yet past IdleTime");
    h.step_until(Duration::from_secs(60), "back to IdleCount", |h| removed(h) == 2);
    assert!(
        (at(52)..at(60)).contains(&h.now()),
        "30 s after the extra machines became idle: {:?}",
        h.now().since(TRACE_START)
    );
    h.run_for(Duration::from_secs(10));
    assert_eq!((h.ready(), h.metrics().slots_idle, h.provider.created_total), (1, 1, 3), "one idle machine kept");
}

/// docker+machine `IdleScaleFactor` multiplies the machines running jobs only (`InUse`), never
/// idle or creating ones, truncated (`int(...)`), capped by `IdleCount`, floored at
/// `max(IdleCountMin, 1)`.
#[test]
fn semantics_idle_scale_factor_multiplies_busy_machines_only() {
    let settings = AutoscalerSettings::legacy(LegacyMachineSettings {
        idle_count: 10,
        idle_count_min: 1,
        idle_scale_factor: 0.5,
        idle_time: Duration::from_secs(600),
        ..Default::default()
    });
    let mut h = Harness::new(&settings, cloud(10.0));
    h.step_until(Duration::from_secs(600), "IdleCountMin", |h| h.metrics().slots_idle == 1 && h.in_creation() == 0);
    assert_eq!(h.metrics().idle_target, 1, "no machine in use: the floor, not 0.5 × idle machines");
    for i in 0..5 {
        h.step_until(Duration::from_secs(600), "an idle machine", |h| h.metrics().slots_idle >= 1);
        assert!(h.reserve_and_acquire(&format!("job-{i}")));
    }
    h.step_until(Duration::from_secs(600), "scaled", |h| h.in_creation() == 0 && h.metrics().slots_acquired == 5);
    h.tick();
    assert_eq!(h.metrics().idle_target, 2, "int(5 × 0.5): busy machines only");
}

/// Which idle instances survive a scale-down: the most recently used; the longest idle go
/// first (docker+machine removes any machine past `IdleTime` while idle machines exceed the
/// target; taskscaler keeps what the idle target needs). Recently used instances have warm
/// caches and the longest remaining billing.
#[test]
fn semantics_scale_down_keeps_the_most_recently_used_instances() {
    let settings = AutoscalerSettings { policies: vec![utc_policy(1, 600)], ..Default::default() };
    let mut h = Harness::new(&settings, cloud(10.0));
    h.step_until(Duration::from_secs(600), "one idle", |h| h.metrics().slots_idle == 1);
    for i in 0..3 {
        h.step_until(Duration::from_secs(600), "an idle slot", |h| h.metrics().slots_idle >= 1);
        assert!(h.reserve_and_acquire(&format!("job-{i}")));
    }
    h.step_until(Duration::from_secs(600), "steady", |h| h.in_creation() == 0 && h.metrics().slots_idle == 1);
    let last = h.instance_of("job-2").expect("acquired");
    for i in 0..3 {
        h.run_for(Duration::from_secs(60));
        h.engine.release(&format!("job-{i}"), h.now()).expect("acquired");
    }
    h.run_for(Duration::from_secs(3600));
    let left: Vec<String> = h.engine.instance_summary().into_iter().map(|(id, _, _)| id).collect();
    assert_eq!(left, vec![last], "the instance whose job ended last survives");
}

#[path = "engine_drain_tests.rs"]
mod drain;
