//! The report of a `runway simulate` run: the numbers ([`SimReport`]), their text summary and
//! an SVG chart of queued jobs and instances over time.
//!
//! Owns presentation only: the numbers are computed by the simulation loop in the parent
//! module; nothing here touches the engine, the provider or the config.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

/// One point of the chart: at `t` seconds after the start, the queue and fleet sizes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ChartPoint {
    /// Seconds after trace start.
    pub t: f64,
    /// Jobs waiting (in GitLab's queue or for a slot).
    pub queued: u32,
    /// Instances in any state.
    pub instances: u32,
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
    /// Simulated time, seconds.
    pub simulated_seconds: f64,
    /// `instance_hours × price_per_hour`.
    pub cost: f64,
    /// Chart samples (one per change).
    #[serde(skip)]
    pub chart: Vec<ChartPoint>,
}

impl SimReport {
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
        let removals: Vec<String> = self.removals.iter().map(|(r, n)| format!("{r} {n}")).collect();
        let _ =
            writeln!(s, "removals      {}", if removals.is_empty() { "none".to_string() } else { removals.join(", ") });
        if self.cost > 0.0 {
            let _ = writeln!(s, "cost          {:.2}", self.cost);
        }
        s
    }

    /// An SVG line chart of queued jobs and instances over time (hand-written, no deps).
    /// Each pixel column shows the maximum of its time bucket, so short bursts stay visible.
    pub fn to_svg(&self) -> String {
        const W: f64 = 1200.0;
        const H: f64 = 360.0;
        const LEFT: f64 = 56.0;
        const RIGHT: f64 = 16.0;
        const TOP: f64 = 28.0;
        const BOTTOM: f64 = 36.0;
        let span = self.simulated_seconds.max(1.0);
        let columns = (W - LEFT - RIGHT) as usize;
        let mut queued = vec![0u32; columns];
        let mut instances = vec![0u32; columns];
        // Carry each sample forward until the next one, keeping per-column maxima.
        for (i, p) in self.chart.iter().enumerate() {
            let until = self.chart.get(i + 1).map_or(span, |n| n.t);
            let first = ((p.t / span) * columns as f64).floor() as usize;
            let last = (((until / span) * columns as f64).ceil() as usize).max(first + 1).min(columns);
            for c in first.min(columns.saturating_sub(1))..last {
                queued[c] = queued[c].max(p.queued);
                instances[c] = instances[c].max(p.instances);
            }
        }
        let top = queued.iter().chain(instances.iter()).copied().max().unwrap_or(0).max(1);
        let y = |v: u32| TOP + (H - TOP - BOTTOM) * (1.0 - f64::from(v) / f64::from(top));
        let line = |values: &[u32]| {
            let mut d = String::new();
            for (c, v) in values.iter().enumerate() {
                let _ = write!(d, "{}{:.1},{:.1} ", if c == 0 { "M" } else { "L" }, LEFT + c as f64, y(*v));
            }
            d
        };
        let mut svg = String::new();
        let _ = writeln!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="11">"#
        );
        let _ = writeln!(svg, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
        let days = (span / 86_400.0).ceil() as u32;
        let step = if days > 14 { 7 } else { 1 };
        for d in (0..=days).step_by(step as usize) {
            let x = LEFT + (f64::from(d) * 86_400.0 / span) * columns as f64;
            if x > W - RIGHT + 0.5 {
                break;
            }
            let _ = writeln!(
                svg,
                r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">day {d}</text>"##,
                H - BOTTOM,
                H - BOTTOM + 14.0
            );
        }
        for frac in [0.0, 0.25, 0.5, 0.75, 1.0] {
            let v = (f64::from(top) * frac).round() as u32;
            let _ =
                writeln!(svg, r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{v}</text>"##, LEFT - 6.0, y(v) + 4.0);
        }
        let _ = writeln!(svg, r##"<path d="{}" fill="none" stroke="#1f77b4" stroke-width="1"/>"##, line(&instances));
        let _ = writeln!(svg, r##"<path d="{}" fill="none" stroke="#ff7f0e" stroke-width="1"/>"##, line(&queued));
        let _ = writeln!(
            svg,
            r##"<text x="{LEFT}" y="16" fill="#1f77b4">instances</text><text x="{:.1}" y="16" fill="#ff7f0e">queued jobs</text>"##,
            LEFT + 80.0
        );
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="16" text-anchor="end">p95 wait {:.1} s, {:.1} instance-hours, {:.1}% idle</text>"##,
            W - RIGHT,
            self.wait_p95_s,
            self.instance_hours,
            self.idle_share * 100.0
        );
        svg.push_str("</svg>\n");
        svg
    }
}
