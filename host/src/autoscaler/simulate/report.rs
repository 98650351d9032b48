//! The report of a `runway simulate` run: the numbers ([`SimReport`]), the summary
//! `--json` prints ([`Summary`]), the per-hour-of-week table ([`HourRow`]) and the text
//! summary. The chart is drawn by the sibling `chart` module.
//!
//! Owns presentation only: the numbers are computed by the simulation loop in the parent
//! module; nothing here touches the engine, the provider or the config.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::oracle::Baseline;

/// One point of the chart: at `t` seconds after the start, the queue and fleet sizes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ChartPoint {
    /// Seconds after trace start.
    pub t: f64,
    /// Jobs waiting (in GitLab's queue or for a slot).
    pub queued: u32,
    /// Instances in any state.
    pub instances: u32,
    /// Instances running at least one job.
    pub busy: u32,
}

/// One hour of the week (0 = Monday 00:00–01:00 of the trace's clock, UTC) over the whole run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HourRow {
    /// Hour of week, 0–167.
    pub hour_of_week: u32,
    /// Jobs that arrived in this hour and started.
    pub jobs: u64,
    /// Their 95th percentile queue wait.
    pub p95_wait_s: f64,
    /// Their mean queue wait.
    pub mean_wait_s: f64,
    /// Instance-hours (all states, unbilled minimums aside) spent in this hour.
    pub instance_hours: f64,
    /// Of which instances running a job.
    pub busy_instance_hours: f64,
}

/// The headline numbers (`runway simulate --json`'s `summary`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// Median queue wait.
    pub p50_wait_s: f64,
    /// 95th percentile queue wait.
    pub p95_wait_s: f64,
    /// 99th percentile queue wait.
    pub p99_wait_s: f64,
    /// 95th percentile of the pickup part (arrival → the runner takes the job).
    pub pickup_p95_wait_s: f64,
    /// 95th percentile of the instance part (taken → a slot is assigned).
    pub instance_p95_wait_s: f64,
    /// Billed instance-hours.
    pub instance_hours: f64,
    /// Billed hours with no job over billed hours.
    pub idle_share: f64,
    /// Instances created per job.
    pub creations_per_job: f64,
    /// `instance_hours × price_per_hour`.
    pub cost: f64,
}

/// Results of one simulation run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimReport {
    /// Jobs in the trace.
    pub jobs_total: u64,
    /// Jobs that got a slot.
    pub jobs_started: u64,
    /// Jobs failed by acquire timeout.
    pub jobs_failed_acquire_timeout: u64,
    /// Jobs failed because their instance was lost.
    pub jobs_failed_instance_lost: u64,
    /// Of those, jobs whose instance the cloud took away (a spot interruption).
    pub jobs_interrupted: u64,
    /// Jobs still waiting when the simulation gave up (2 days after the last arrival).
    pub jobs_never_started: u64,
    /// Queue wait percentiles over started jobs, seconds.
    pub wait_p50_s: f64,
    /// 95th percentile.
    pub wait_p95_s: f64,
    /// 99th percentile.
    pub wait_p99_s: f64,
    /// Maximum.
    pub wait_max_s: f64,
    /// Pickup wait (arrival → the runner takes the job): median.
    pub wait_pickup_p50_s: f64,
    /// Pickup wait, 95th percentile.
    pub wait_pickup_p95_s: f64,
    /// Instance wait (taken → slot assigned): median.
    pub wait_instance_p50_s: f64,
    /// Instance wait, 95th percentile.
    pub wait_instance_p95_s: f64,
    /// Mean.
    pub wait_mean_s: f64,
    /// Share of started jobs that waited more than 30 s.
    pub share_wait_over_30s: f64,
    /// Share that waited more than 120 s.
    pub share_wait_over_120s: f64,
    /// Billed instance-hours (with the provider's billing minimum).
    pub instance_hours: f64,
    /// Billed instance-hours with no job running.
    pub idle_instance_hours: f64,
    /// `idle_instance_hours / instance_hours`.
    pub idle_share: f64,
    /// Job-seconds / billed slot-seconds.
    pub slot_utilisation: f64,
    /// Instances created.
    pub creations: u64,
    /// Creations per job (churn).
    pub creations_per_job: f64,
    /// Most instances at once.
    pub peak_instances: u32,
    /// Removals by reason.
    pub removals: BTreeMap<String, u64>,
    /// Spot interruption notices the cloud gave (`interruption_rate_per_hour`).
    pub interruptions: u64,
    /// Creation requests the cloud's rate limit refused or cut (`create_rate_per_s`).
    pub throttled_requests: u64,
    /// Retry-after handed out with those refusals, seconds in total: time creation was held
    /// back by the rate limit.
    pub throttled_wait_s: f64,
    /// Creation requests refused because the cloud's quota (`max_size`) was reached.
    pub capacity_refusals: u64,
    /// Simulated time, seconds.
    pub simulated_seconds: f64,
    /// `instance_hours × price_per_hour`.
    pub cost: f64,
    /// The zero-wait oracle on the same trace and cloud.
    pub oracle: Baseline,
    /// Infinite instant capacity on the same trace.
    pub infinite: Baseline,
    /// Share of the jobs that waited at all (for an instance or a pickup).
    pub share_waited: f64,
    /// The online floor (`online_floor`) at this run's `share_waited`: what a policy that
    /// cannot see a job before it arrives pays at least for the same share of waiting jobs.
    pub online_floor: Baseline,
    /// Per hour of week.
    pub hours: Vec<HourRow>,
    /// Chart samples (one per change).
    #[serde(skip)]
    pub chart: Vec<ChartPoint>,
}

impl SimReport {
    /// The headline numbers.
    pub fn summary(&self) -> Summary {
        Summary {
            p50_wait_s: self.wait_p50_s,
            p95_wait_s: self.wait_p95_s,
            p99_wait_s: self.wait_p99_s,
            pickup_p95_wait_s: self.wait_pickup_p95_s,
            instance_p95_wait_s: self.wait_instance_p95_s,
            instance_hours: self.instance_hours,
            idle_share: self.idle_share,
            creations_per_job: self.creations_per_job,
            cost: self.cost,
        }
    }

    /// The per-hour-of-week table as text (hours with neither jobs nor instances left out).
    pub fn hours_text(&self) -> String {
        const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
        let mut s = String::from("hour       jobs   p95 wait  mean wait  instance-h  busy-h  idle %\n");
        for row in &self.hours {
            if row.jobs == 0 && row.instance_hours == 0.0 {
                continue;
            }
            let idle = if row.instance_hours > 0.0 { 1.0 - row.busy_instance_hours / row.instance_hours } else { 0.0 };
            let _ = writeln!(
                s,
                "{} {:02}:00 {:>7} {:>8.1} s {:>8.1} s {:>11.1} {:>7.1} {:>6.1}",
                DAYS[(row.hour_of_week / 24) as usize % 7],
                row.hour_of_week % 24,
                row.jobs,
                row.p95_wait_s,
                row.mean_wait_s,
                row.instance_hours,
                row.busy_instance_hours,
                idle * 100.0
            );
        }
        s
    }

    /// A human-readable summary.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "jobs          {} in trace, {} started over {:.1} simulated days",
            self.jobs_total,
            self.jobs_started,
            self.simulated_seconds / 86_400.0
        );
        let _ = writeln!(
            s,
            "queue wait    p50 {:.1} s, p95 {:.1} s, p99 {:.1} s, max {:.1} s, mean {:.1} s; >30 s {:.1}%, >120 s {:.1}%",
            self.wait_p50_s,
            self.wait_p95_s,
            self.wait_p99_s,
            self.wait_max_s,
            self.wait_mean_s,
            self.share_wait_over_30s * 100.0,
            self.share_wait_over_120s * 100.0
        );
        let _ = writeln!(
            s,
            "  split       pickup p50 {:.1} s, p95 {:.1} s; instance p50 {:.1} s, p95 {:.1} s",
            self.wait_pickup_p50_s, self.wait_pickup_p95_s, self.wait_instance_p50_s, self.wait_instance_p95_s
        );
        let _ = writeln!(
            s,
            "instances     {:.1} instance-hours billed, {:.1} idle ({:.1}% idle), slot utilisation {:.1}%, peak {}",
            self.instance_hours,
            self.idle_instance_hours,
            self.idle_share * 100.0,
            self.slot_utilisation * 100.0,
            self.peak_instances
        );
        let _ = writeln!(s, "churn         {} creations, {:.3} per job", self.creations, self.creations_per_job);
        let _ = writeln!(
            s,
            "failures      {} acquire timeouts, {} lost with their instance, {} never started",
            self.jobs_failed_acquire_timeout, self.jobs_failed_instance_lost, self.jobs_never_started
        );
        if self.interruptions + self.throttled_requests + self.capacity_refusals > 0 {
            let _ = writeln!(
                s,
                "cloud         {} spot interruptions ({} jobs lost), {} throttled creation requests ({:.0} s retry-after), {} quota refusals",
                self.interruptions,
                self.jobs_interrupted,
                self.throttled_requests,
                self.throttled_wait_s,
                self.capacity_refusals
            );
        }
        let removals: Vec<String> = self.removals.iter().map(|(r, n)| format!("{r} {n}")).collect();
        let _ =
            writeln!(s, "removals      {}", if removals.is_empty() { "none".to_string() } else { removals.join(", ") });
        if self.cost > 0.0 {
            let _ = writeln!(s, "cost          {:.2}", self.cost);
        }
        let distance = |floor: f64| {
            if floor > 0.0 {
                format!("{:+.1}%", (self.instance_hours / floor - 1.0) * 100.0)
            } else {
                "n/a".to_string()
            }
        };
        let _ = writeln!(
            s,
            "oracle        {:.1} instance-hours at zero wait ({:.1}% idle, {:.3} creations per job); this run {}",
            self.oracle.instance_hours,
            self.oracle.idle_share * 100.0,
            self.oracle.creations_per_job,
            distance(self.oracle.instance_hours)
        );
        let _ = writeln!(
            s,
            "online floor  {:.1} instance-hours with {:.1}% of jobs waiting, as this run (no policy that cannot see jobs before they arrive pays less); this run {}",
            self.online_floor.instance_hours,
            self.share_waited * 100.0,
            distance(self.online_floor.instance_hours)
        );
        let _ = writeln!(
            s,
            "infinite      {:.1} instance-hours (job time only); this run {}",
            self.infinite.instance_hours,
            distance(self.infinite.instance_hours)
        );
        s
    }
}

/// Several runs side by side on one trace (`runway simulate --compare`), with the oracle and
/// infinite capacity as the last columns.
pub(super) fn compare_text(runs: &[(String, &SimReport)]) -> String {
    let Some((_, first)) = runs.first() else { return String::new() };
    let mut names: Vec<String> = runs.iter().map(|(n, _)| n.clone()).collect();
    names.push("oracle".into());
    names.push("infinite".into());
    let width = names.iter().map(|n| n.len()).max().unwrap_or(8).max(10);
    let mut s = format!("{:<20}", "");
    for n in &names {
        let _ = write!(s, " {n:>width$}");
    }
    s.push('\n');
    let summaries: Vec<Summary> = runs.iter().map(|(_, r)| r.summary()).collect();
    let floor = |b: &Baseline| Summary {
        p50_wait_s: b.p50_wait_s,
        p95_wait_s: b.p95_wait_s,
        p99_wait_s: b.p99_wait_s,
        pickup_p95_wait_s: 0.0,
        instance_p95_wait_s: 0.0,
        instance_hours: b.instance_hours,
        idle_share: b.idle_share,
        creations_per_job: b.creations_per_job,
        cost: b.cost,
    };
    let all: Vec<Summary> = summaries.into_iter().chain([floor(&first.oracle), floor(&first.infinite)]).collect();
    type Row = (&'static str, fn(&Summary) -> String);
    let rows: [Row; 9] = [
        ("p50 wait (s)", |x| format!("{:.1}", x.p50_wait_s)),
        ("p95 wait (s)", |x| format!("{:.1}", x.p95_wait_s)),
        ("p99 wait (s)", |x| format!("{:.1}", x.p99_wait_s)),
        ("  pickup p95 (s)", |x| format!("{:.1}", x.pickup_p95_wait_s)),
        ("  instance p95 (s)", |x| format!("{:.1}", x.instance_p95_wait_s)),
        ("instance-hours", |x| format!("{:.1}", x.instance_hours)),
        ("idle %", |x| format!("{:.1}", x.idle_share * 100.0)),
        ("creations / job", |x| format!("{:.3}", x.creations_per_job)),
        ("cost", |x| format!("{:.2}", x.cost)),
    ];
    for (label, f) in rows {
        let _ = write!(s, "{label:<20}");
        for x in &all {
            let _ = write!(s, " {:>width$}", f(x));
        }
        s.push('\n');
    }
    // Each run's online floor is at its own share of waiting jobs; the floors have none.
    let _ = write!(s, "{:<20}", "online floor (h)");
    for (_, r) in runs {
        let _ = write!(s, " {:>width$}", format!("{:.1}", r.online_floor.instance_hours));
    }
    for _ in 0..2 {
        let _ = write!(s, " {:>width$}", "–");
    }
    s.push('\n');
    s
}
