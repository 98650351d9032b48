//! The replay loop of `runway simulate`: one real [`Taskscaler`] per simulated `[[runners]]`
//! entry, each scaling its own instance group of one seeded [`SimProvider`] cloud (shared
//! quota, creation rate limit and random streams), on one virtual clock, with a simulated
//! GitLab queue. A runner takes a queued job whenever `reserve` succeeds (pickup is
//! immediate: no poll interval), calls `acquire`, and the job starts when the slot is
//! assigned; queue wait = start − arrival.
//!
//! Routing: with several runners a job whose trace entry names one of them (`runner`) waits
//! in that runner's queue; every other job waits in one queue all runners poll, in turn,
//! starting after the runner that took the previous such job (a runner takes jobs while it
//! can reserve capacity, so a full runner leaves them to the others). With one runner every
//! job is its own.
//!
//! Owns the loop and the tallies it keeps; the report's presentation is `report`'s, the
//! floors are `oracle`'s. Must not read files.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::report::{ChartPoint, HourRow, SimReport};
use super::{online_floor, oracle};
use crate::autoscaler::clock::{Clock, Moment, VirtualClock};
use crate::autoscaler::engine::{EngineEvent, RemovalReason, Taskscaler};
use crate::autoscaler::provider::{SimProvider, SimProviderSettings};
use crate::autoscaler::settings::AutoscalerSettings;
use crate::autoscaler::trace::{JobArrival, TRACE_START};

pub(super) fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Per hour of week (trace time 0 is Monday 00:00): waits of the jobs arriving in it, and the
/// fleet's instance-seconds and busy instance-seconds spent in it.
#[derive(Clone)]
struct HourTable {
    waits: Vec<Vec<f64>>,
    instance_seconds: Vec<f64>,
    busy_seconds: Vec<f64>,
}

impl Default for HourTable {
    fn default() -> Self {
        HourTable { waits: vec![Vec::new(); 168], instance_seconds: vec![0.0; 168], busy_seconds: vec![0.0; 168] }
    }
}

impl HourTable {
    fn hour_of(at: Moment) -> (usize, u64) {
        let ms = at.since(TRACE_START).as_millis() as u64;
        (((ms / 3_600_000) % 168) as usize, (ms / 3_600_000 + 1) * 3_600_000)
    }

    fn job(&mut self, arrival: Moment, wait: f64) {
        self.waits[Self::hour_of(arrival).0].push(wait);
    }

    /// `instances` (of which `busy` run jobs) from `from` to `to`, split at hour boundaries.
    fn fleet(&mut self, from: Moment, to: Moment, instances: u32, busy: u32) {
        let mut t = from;
        while t < to {
            let (hour, hour_end_ms) = Self::hour_of(t);
            let end = to.min(TRACE_START.plus(Duration::from_millis(hour_end_ms)));
            let seconds = end.since(t).as_secs_f64();
            self.instance_seconds[hour] += seconds * f64::from(instances);
            self.busy_seconds[hour] += seconds * f64::from(busy);
            t = end;
        }
    }

    fn merge(&mut self, other: &HourTable) {
        for h in 0..168 {
            self.waits[h].extend_from_slice(&other.waits[h]);
            self.instance_seconds[h] += other.instance_seconds[h];
            self.busy_seconds[h] += other.busy_seconds[h];
        }
    }

    fn rows(mut self) -> Vec<HourRow> {
        (0..168)
            .map(|h| {
                let waits = &mut self.waits[h];
                waits.sort_by(f64::total_cmp);
                HourRow {
                    hour_of_week: h as u32,
                    jobs: waits.len() as u64,
                    p95_wait_s: percentile(waits, 0.95),
                    mean_wait_s: if waits.is_empty() { 0.0 } else { waits.iter().sum::<f64>() / waits.len() as f64 },
                    instance_hours: self.instance_seconds[h] / 3600.0,
                    busy_instance_hours: self.busy_seconds[h] / 3600.0,
                }
            })
            .collect()
    }
}

struct JobRecord {
    arrival: Moment,
    duration: Duration,
}

/// One `[[runners]]` entry to simulate: its `name` (for routing and the report) and its
/// fleet settings.
#[derive(Clone, Debug)]
pub struct SimRunner {
    /// The entry's `name` (trace entries name it in `runner`).
    pub name: String,
    /// Its fleet settings, mapped from `[runners.autoscaler]` / `[runners.machine]`.
    pub settings: AutoscalerSettings,
}

/// The result of simulating runners that share one cloud.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetReport {
    /// Per runner, in config order: its name and its report (its jobs, its instance group).
    pub runners: Vec<(String, SimReport)>,
    /// All runners together (with one runner, identical to its report).
    pub total: SimReport,
}

/// What one runner's replay counts.
#[derive(Clone, Default)]
struct Tally {
    waits: Vec<f64>,
    pickup_waits: Vec<f64>,
    instance_waits: Vec<f64>,
    busy_seconds: f64,
    job_seconds: f64,
    failed_timeout: u64,
    failed_lost: u64,
    interrupted: u64,
    hours: HourTable,
    peak_instances: u32,
    jobs_total: u64,
    /// Jobs it ran (for its floors).
    ran: Vec<usize>,
}

/// What the cloud and the engine add to a tally's report.
#[derive(Default)]
struct Billing {
    billed: f64,
    slot_seconds: f64,
    creations: u64,
    removals: BTreeMap<String, u64>,
    interruptions: u64,
    throttled: u64,
    throttled_wait_s: f64,
    capacity_refusals: u64,
}

impl Billing {
    /// Add another runner's bill (for the total).
    fn add(&mut self, other: &Billing) {
        self.billed += other.billed;
        self.slot_seconds += other.slot_seconds;
        self.creations += other.creations;
        for (reason, n) in &other.removals {
            *self.removals.entry(reason.clone()).or_insert(0) += n;
        }
        self.interruptions += other.interruptions;
        self.throttled += other.throttled;
        self.throttled_wait_s += other.throttled_wait_s;
        self.capacity_refusals += other.capacity_refusals;
    }
}

impl Tally {
    /// Add another runner's jobs (for the total; peak instances and the jobs' indices are the
    /// fleet's, set by the caller).
    fn add(&mut self, part: &Tally) {
        self.waits.extend_from_slice(&part.waits);
        self.pickup_waits.extend_from_slice(&part.pickup_waits);
        self.instance_waits.extend_from_slice(&part.instance_waits);
        self.busy_seconds += part.busy_seconds;
        self.job_seconds += part.job_seconds;
        self.failed_timeout += part.failed_timeout;
        self.failed_lost += part.failed_lost;
        self.interrupted += part.interrupted;
        self.hours.merge(&part.hours);
        self.jobs_total += part.jobs_total;
    }

    /// Share of the started jobs that waited more than `limit` seconds.
    fn share_over(&self, limit: f64) -> f64 {
        if self.waits.is_empty() {
            0.0
        } else {
            self.waits.iter().filter(|w| **w > limit).count() as f64 / self.waits.len() as f64
        }
    }

    fn report(
        mut self,
        bill: Billing,
        end: Moment,
        price: f64,
        floors: (oracle::Baseline, oracle::Baseline, oracle::Baseline),
        chart: Vec<ChartPoint>,
    ) -> SimReport {
        self.waits.sort_by(f64::total_cmp);
        self.pickup_waits.sort_by(f64::total_cmp);
        self.instance_waits.sort_by(f64::total_cmp);
        let waits = &self.waits;
        let billed = bill.billed;
        let jobs_total = self.jobs_total;
        let started = waits.len() as u64;
        let idle_seconds = (billed - self.busy_seconds).max(0.0);
        SimReport {
            jobs_total,
            jobs_started: started,
            jobs_failed_acquire_timeout: self.failed_timeout,
            jobs_failed_instance_lost: self.failed_lost,
            jobs_interrupted: self.interrupted,
            jobs_never_started: jobs_total.saturating_sub(started + self.failed_timeout),
            wait_p50_s: percentile(waits, 0.50),
            wait_p95_s: percentile(waits, 0.95),
            wait_p99_s: percentile(waits, 0.99),
            wait_max_s: waits.last().copied().unwrap_or(0.0),
            wait_pickup_p50_s: percentile(&self.pickup_waits, 0.50),
            wait_pickup_p95_s: percentile(&self.pickup_waits, 0.95),
            wait_instance_p50_s: percentile(&self.instance_waits, 0.50),
            wait_instance_p95_s: percentile(&self.instance_waits, 0.95),
            wait_mean_s: if waits.is_empty() { 0.0 } else { waits.iter().sum::<f64>() / waits.len() as f64 },
            share_wait_over_30s: self.share_over(30.0),
            share_wait_over_120s: self.share_over(120.0),
            instance_hours: billed / 3600.0,
            idle_instance_hours: idle_seconds / 3600.0,
            idle_share: if billed > 0.0 { idle_seconds / billed } else { 0.0 },
            slot_utilisation: if bill.slot_seconds > 0.0 { self.job_seconds / bill.slot_seconds } else { 0.0 },
            creations: bill.creations,
            creations_per_job: if jobs_total > 0 { bill.creations as f64 / jobs_total as f64 } else { 0.0 },
            peak_instances: self.peak_instances,
            removals: bill.removals,
            interruptions: bill.interruptions,
            throttled_requests: bill.throttled,
            throttled_wait_s: bill.throttled_wait_s,
            capacity_refusals: bill.capacity_refusals,
            simulated_seconds: end.since(TRACE_START).as_secs_f64(),
            cost: billed / 3600.0 * price,
            oracle: floors.0,
            infinite: floors.1,
            share_waited: self.share_over(0.0),
            online_floor: floors.2,
            hours: self.hours.rows(),
            chart,
        }
    }
}

/// One runner in the loop: its engine, its queue, its tally.
struct Lane {
    engine: Taskscaler,
    queue: VecDeque<usize>,
    waiting_for_slot: u32,
    busy: HashMap<String, (u32, Moment)>,
    tally: Tally,
    /// Its own chart (kept only with several runners; the shared queue is not in it).
    chart: Vec<ChartPoint>,
}

impl Lane {
    fn busy_change(&mut self, instance: &str, delta: i32, now: Moment) {
        // Looked up by `&str` first: the id is copied only for an instance not yet busy.
        let entry = if self.busy.contains_key(instance) {
            self.busy.get_mut(instance)
        } else {
            Some(self.busy.entry(instance.to_string()).or_insert((0, now)))
        };
        let Some(entry) = entry else { return };
        if delta > 0 {
            if entry.0 == 0 {
                entry.1 = now;
            }
            entry.0 += 1;
        } else if entry.0 > 0 {
            entry.0 -= 1;
            if entry.0 == 0 {
                self.tally.busy_seconds += now.since(entry.1).as_secs_f64();
                self.busy.remove(instance);
            }
        }
    }
}

/// Run the real engine of every runner against one simulated cloud and queue. Deterministic:
/// identical inputs give identical reports.
pub fn run_fleet(
    runners: &[SimRunner],
    provider_settings: &SimProviderSettings,
    trace: &[JobArrival],
) -> anyhow::Result<FleetReport> {
    anyhow::ensure!(!runners.is_empty(), "no runner to simulate");
    provider_settings.validate().map_err(|e| anyhow::anyhow!("provider settings: {e}"))?;
    let clock = Arc::new(VirtualClock::new(TRACE_START));
    let mut lanes = Vec::with_capacity(runners.len());
    for r in runners {
        let engine = Taskscaler::new(&r.settings, clock.now())
            .map_err(|e| anyhow::anyhow!("runner {:?}: autoscaler settings: {e}", r.name))?;
        lanes.push(Lane {
            engine,
            queue: VecDeque::new(),
            waiting_for_slot: 0,
            busy: HashMap::new(),
            tally: Tally::default(),
            chart: Vec::new(),
        });
    }
    let mut provider = SimProvider::new(provider_settings.clone(), clock.clone());
    let mut ready_rng = StdRng::seed_from_u64(provider_settings.seed ^ 0x005e_ed0f_7ead);

    // Jobs by arrival (a stable sort: jobs arriving together keep the trace's order).
    let arrival = |i: usize| TRACE_START.plus(Duration::from_secs_f64(trace[i].at));
    let mut order: Vec<usize> = (0..trace.len()).collect();
    order.sort_by_key(|&i| arrival(i));
    let jobs: Vec<JobRecord> = order
        .iter()
        .map(|&i| JobRecord { arrival: arrival(i), duration: Duration::from_secs_f64(trace[i].duration) })
        .collect();
    // The runner each job is routed to (`None`: the queue every runner polls).
    let routed: Vec<Option<usize>> = if runners.len() == 1 {
        vec![Some(0); jobs.len()]
    } else {
        order
            .iter()
            .map(|&i| trace[i].runner.as_deref().and_then(|name| runners.iter().position(|r| r.name == name)))
            .collect()
    };
    let last_arrival = jobs.last().map_or(TRACE_START, |j| j.arrival);
    let give_up_at = last_arrival.plus(Duration::from_secs(2 * 86_400));

    let mut next_arrival = 0usize;
    let mut shared: VecDeque<usize> = VecDeque::new();
    let mut turn = 0usize;
    let mut lane_of: Vec<usize> = routed.iter().map(|r| r.unwrap_or(0)).collect();
    let mut running: BinaryHeap<Reverse<(Moment, usize)>> = BinaryHeap::new();
    let mut instance_of: HashMap<usize, String> = HashMap::new();
    let mut ready_checks: BinaryHeap<Reverse<(Moment, String, bool, usize)>> = BinaryHeap::new();
    let mut done = 0usize;
    let mut chart: Vec<ChartPoint> = Vec::new();
    let mut peak_instances = 0u32;
    let mut pickup = vec![0.0f64; jobs.len()];

    let key_of = |idx: usize| idx.to_string();
    let idx_of = |key: &str| key.parse::<usize>().ok();

    loop {
        let now = clock.now();
        while next_arrival < jobs.len() && jobs[next_arrival].arrival <= now {
            match routed[next_arrival] {
                Some(lane) => lanes[lane].queue.push_back(next_arrival),
                None => shared.push_back(next_arrival),
            }
            next_arrival += 1;
        }
        while let Some(Reverse((t, idx))) = running.peek().cloned() {
            if t > now {
                break;
            }
            running.pop();
            if let Some(instance) = instance_of.remove(&idx) {
                let lane = &mut lanes[lane_of[idx]];
                let _ = lane.engine.release(&key_of(idx), now);
                lane.busy_change(&instance, -1, now);
                lane.tally.job_seconds += jobs[idx].duration.as_secs_f64();
                done += 1;
            }
        }
        while let Some(Reverse((t, _, _, _))) = ready_checks.peek() {
            if *t > now {
                break;
            }
            let Some(Reverse((_, id, ok, lane))) = ready_checks.pop() else { break };
            let result = if ok { Ok(()) } else { Err(crate::autoscaler::NotReady("ready command failed".to_string())) };
            lanes[lane].engine.ready_check_finished(&id, result, now);
        }

        let count = lanes.len();
        for step in 0..count {
            let l = (turn + step) % count;
            for _ in 0..16 {
                let lane = &mut lanes[l];
                lane.engine.tick(now, &mut provider.group(l as u32));
                // The runner asks GitLab for a job whenever a reservation succeeds: its own
                // jobs first, then the ones any runner may take.
                loop {
                    let (idx, from_shared) = match (lane.queue.front(), shared.front()) {
                        (Some(&idx), _) => (idx, false),
                        (None, Some(&idx)) => (idx, true),
                        (None, None) => break,
                    };
                    if lane.engine.reserve(&key_of(idx), now).is_err() {
                        break;
                    }
                    if from_shared {
                        shared.pop_front();
                        lane_of[idx] = l;
                        turn = (l + 1) % count;
                    } else {
                        lane.queue.pop_front();
                    }
                    pickup[idx] = now.since(jobs[idx].arrival).as_secs_f64();
                    lane.waiting_for_slot += 1;
                    let _ = lane.engine.acquire(&key_of(idx), now);
                }
                for event in lane.engine.take_events() {
                    match event {
                        EngineEvent::Acquired { key, acquisition } => {
                            let Some(idx) = idx_of(&key) else { continue };
                            lane.waiting_for_slot = lane.waiting_for_slot.saturating_sub(1);
                            let wait = now.since(jobs[idx].arrival).as_secs_f64();
                            lane.tally.waits.push(wait);
                            lane.tally.pickup_waits.push(pickup[idx]);
                            lane.tally.instance_waits.push((wait - pickup[idx]).max(0.0));
                            lane.tally.hours.job(jobs[idx].arrival, wait);
                            running.push(Reverse((now.plus(jobs[idx].duration), idx)));
                            lane.busy_change(&acquisition.instance, 1, now);
                            instance_of.insert(idx, acquisition.instance);
                        }
                        EngineEvent::AcquireTimedOut { .. } => {
                            lane.waiting_for_slot = lane.waiting_for_slot.saturating_sub(1);
                            lane.tally.failed_timeout += 1;
                            done += 1;
                        }
                        EngineEvent::ReadyCheckRequested { instance } => {
                            let delay = provider_settings.ready.sample(&mut ready_rng);
                            let ok = ready_rng.random::<f64>() >= provider_settings.ready_failure_rate;
                            ready_checks.push(Reverse((now.plus(delay), instance, ok, l)));
                        }
                        EngineEvent::InstanceLost { keys, reason, .. } => {
                            // Only the cloud takes instances away here: a spot interruption
                            // (announced, or gone before the engine saw the notice).
                            let taken = matches!(reason, RemovalReason::Interrupted | RemovalReason::Lost);
                            for key in keys {
                                let Some(idx) = idx_of(&key) else { continue };
                                if let Some(instance) = instance_of.remove(&idx) {
                                    lane.busy_change(&instance, -1, now);
                                    lane.tally.failed_lost += 1;
                                    lane.tally.interrupted += u64::from(taken);
                                    done += 1;
                                }
                            }
                        }
                        EngineEvent::AcquisitionsAbandoned { .. }
                        | EngineEvent::InstanceRemoved { .. }
                        | EngineEvent::InstanceInterrupted { .. }
                        | EngineEvent::ProviderFailing { .. }
                        | EngineEvent::ProviderRecovered { .. }
                        | EngineEvent::Timed { .. } => {}
                    }
                }
                if !lane.engine.needs_tick() {
                    break;
                }
            }
        }

        let mut queued = shared.len() as u32;
        let mut instances = 0u32;
        let mut busy_now = 0u32;
        for lane in &mut lanes {
            let n = lane.engine.instance_count();
            lane.tally.peak_instances = lane.tally.peak_instances.max(n);
            let waiting = lane.queue.len() as u32 + lane.waiting_for_slot;
            let busy = lane.busy.len() as u32;
            queued += waiting;
            instances += n;
            busy_now += busy;
            if count > 1 && lane.chart.last().is_none_or(|p| p.queued != waiting || p.instances != n || p.busy != busy)
            {
                let t = now.since(TRACE_START).as_secs_f64();
                lane.chart.push(ChartPoint { t, queued: waiting, instances: n, busy });
            }
        }
        peak_instances = peak_instances.max(instances);
        let point = ChartPoint { t: now.since(TRACE_START).as_secs_f64(), queued, instances, busy: busy_now };
        if chart.last().is_none_or(|p| p.queued != queued || p.instances != instances || p.busy != busy_now) {
            chart.push(point);
        }

        if done == jobs.len() && next_arrival == jobs.len() {
            break;
        }
        let mut next = lanes.iter().map(|l| l.engine.next_wakeup()).min().unwrap_or(give_up_at);
        if let Some(job) = jobs.get(next_arrival) {
            next = next.min(job.arrival);
        }
        if let Some(Reverse((t, _))) = running.peek() {
            next = next.min(*t);
        }
        if let Some(Reverse((t, _, _, _))) = ready_checks.peek() {
            next = next.min(*t);
        }
        if next <= now {
            next = now.plus(Duration::from_millis(1));
        }
        if next > give_up_at {
            break;
        }
        for lane in &mut lanes {
            let n = lane.engine.instance_count();
            let b = lane.busy.len() as u32;
            lane.tally.hours.fleet(now, next, n, b);
        }
        clock.set(next);
    }

    let end = clock.now();
    let price = provider_settings.price_per_hour;
    for (idx, lane) in lane_of.iter().enumerate() {
        lanes[*lane].tally.jobs_total += 1;
        lanes[*lane].tally.ran.push(idx);
    }
    // Each runner's floors on the jobs it ran (one runner: the whole trace, as given); the
    // online floor at the runner's own share of waiting jobs.
    let floors = |tally: &Tally, settings: &AutoscalerSettings, capacity: u32| {
        let owned: Vec<JobArrival>;
        let ran: &[JobArrival] = if runners.len() == 1 {
            trace
        } else {
            owned = tally.ran.iter().map(|&i| trace[order[i]].clone()).collect();
            &owned
        };
        let ready = settings.instance_ready_command.is_some();
        (
            oracle::oracle(ran, provider_settings, ready, capacity),
            oracle::infinite(ran, provider_settings, capacity),
            online_floor::online_floor(ran, provider_settings, ready, capacity, tally.share_over(0.0)),
        )
    };
    let mut reports = Vec::with_capacity(lanes.len());
    let mut total = Tally::default();
    let mut total_bill = Billing::default();
    let mut oracles = Vec::new();
    let mut infinites = Vec::new();
    let mut online_floors = Vec::new();
    for (g, (mut lane, runner)) in lanes.into_iter().zip(runners).enumerate() {
        for (_, (count, since)) in lane.busy.drain() {
            if count > 0 {
                lane.tally.busy_seconds += end.since(since).as_secs_f64();
            }
        }
        let group = g as u32;
        let billed = provider.group_billed_seconds(group, end);
        let stats = provider.group_stats(group);
        let capacity = lane.engine.settings().capacity;
        let metrics = lane.engine.metrics();
        let bill = Billing {
            billed,
            slot_seconds: billed * f64::from(capacity),
            creations: stats.created,
            removals: metrics.instances_removed_total.iter().map(|(r, n)| (r.as_str().to_string(), *n)).collect(),
            interruptions: stats.interruptions,
            throttled: stats.throttled,
            throttled_wait_s: stats.throttled_wait_s,
            capacity_refusals: stats.capacity_refused,
        };
        total_bill.add(&bill);
        let (o, i, f) = floors(&lane.tally, &runner.settings, capacity);
        let jobs_ran = lane.tally.jobs_total;
        oracles.push((o.clone(), jobs_ran));
        infinites.push((i.clone(), jobs_ran));
        online_floors.push((f.clone(), jobs_ran));
        if runners.len() > 1 {
            total.add(&lane.tally);
        }
        let lane_chart = if runners.len() == 1 { std::mem::take(&mut chart) } else { std::mem::take(&mut lane.chart) };
        reports.push((runner.name.clone(), lane.tally.report(bill, end, price, (o, i, f), lane_chart)));
    }
    let total = if reports.len() == 1 {
        reports[0].1.clone()
    } else {
        total.peak_instances = peak_instances;
        // The runners' floors side by side; the online floors each at its runner's share.
        let floors = (oracle::combine(&oracles), oracle::combine(&infinites), oracle::combine(&online_floors));
        total.report(total_bill, end, price, floors, chart)
    };
    Ok(FleetReport { runners: reports, total })
}

/// Run the real engine against the simulated provider and queue for one runner's fleet.
/// Deterministic: identical inputs give identical reports.
pub fn run_simulation(
    settings: &AutoscalerSettings,
    provider_settings: &SimProviderSettings,
    trace: &[JobArrival],
) -> anyhow::Result<SimReport> {
    let runner = SimRunner { name: String::new(), settings: settings.clone() };
    Ok(run_fleet(&[runner], provider_settings, trace)?.total)
}
