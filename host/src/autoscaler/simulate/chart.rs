//! The chart of a `runway simulate` run (SVG, hand-written, no dependencies): busy and idle
//! instances stacked as areas, queued jobs as a line on the same axis, a title naming the
//! policy and trace with the headline numbers, axis titles, and evenly spaced ticks at round
//! values (1-2-5 steps on the count axis; minutes, hours or days on the time axis, chosen by
//! the run's length). Each pixel column shows the maximum of its time bucket, so short bursts
//! stay visible on a four-week chart.
//!
//! Presentation only: reads a finished [`SimReport`], touches nothing else.

use std::fmt::Write as _;

use super::report::SimReport;

const W: f64 = 1200.0;
const H: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 72.0;
const BOTTOM: f64 = 60.0;

/// A round step (1, 2 or 5 × 10^k) giving at most about `ticks` ticks up to `top`.
fn nice_step(top: f64, ticks: f64) -> f64 {
    let raw = (top / ticks).max(1.0);
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * magnitude).find(|s| *s >= raw).unwrap_or(10.0 * magnitude)
}

/// Time tick step (seconds) and how to label a tick, for a run of `span` seconds.
fn time_step(span: f64) -> (f64, &'static str) {
    const STEPS: [(f64, &str); 11] = [
        (60.0, "min"),
        (300.0, "min"),
        (900.0, "min"),
        (1800.0, "min"),
        (3600.0, "hour"),
        (3.0 * 3600.0, "hour"),
        (6.0 * 3600.0, "hour"),
        (12.0 * 3600.0, "hour"),
        (86_400.0, "day"),
        (2.0 * 86_400.0, "day"),
        (7.0 * 86_400.0, "day"),
    ];
    // A run ends a little after its last arrival (jobs finish): allow one tick more.
    STEPS.iter().copied().find(|(s, _)| span / s <= 15.0).unwrap_or((7.0 * 86_400.0, "day"))
}

fn time_label(t: f64, unit: &str) -> String {
    const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    let day = (t / 86_400.0).floor() as u64;
    let clock = format!("{:02}:{:02}", ((t % 86_400.0) / 3600.0) as u64, ((t % 3600.0) / 60.0) as u64);
    match unit {
        "day" => format!("d{day} {}", DAYS[(day % 7) as usize]),
        _ if t < 86_400.0 => clock,
        _ => format!("d{day} {clock}"),
    }
}

impl SimReport {
    /// The chart as SVG; `title` names the policy and the trace.
    pub fn to_svg(&self, title: &str) -> String {
        let span = self.simulated_seconds.max(1.0);
        let columns = (W - LEFT - RIGHT) as usize;
        let mut queued = vec![0u32; columns];
        let mut instances = vec![0u32; columns];
        let mut busy = vec![0u32; columns];
        for (i, p) in self.chart.iter().enumerate() {
            let until = self.chart.get(i + 1).map_or(span, |n| n.t);
            let first = ((p.t / span) * columns as f64).floor() as usize;
            let last = (((until / span) * columns as f64).ceil() as usize).max(first + 1).min(columns);
            for c in first.min(columns.saturating_sub(1))..last {
                queued[c] = queued[c].max(p.queued);
                instances[c] = instances[c].max(p.instances);
                busy[c] = busy[c].max(p.busy.min(p.instances));
            }
        }
        let peak = queued.iter().chain(instances.iter()).copied().max().unwrap_or(0).max(1);
        let step = nice_step(f64::from(peak), 6.0);
        let top = (f64::from(peak) / step).ceil() * step;
        let plot_h = H - TOP - BOTTOM;
        let y = |v: f64| TOP + plot_h * (1.0 - v / top);
        let x = |c: usize| LEFT + c as f64;

        let mut svg = String::new();
        let _ = writeln!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(svg, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="20" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
            W / 2.0,
            escape(title)
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="38" text-anchor="middle">p95 wait {:.1} s · {:.0} instance-hours ({:.1} % idle) · oracle {:.0} instance-hours · {} jobs</text>"#,
            W / 2.0,
            self.wait_p95_s,
            self.instance_hours,
            self.idle_share * 100.0,
            self.oracle.instance_hours,
            self.jobs_total
        );
        // Count axis: gridlines and labels at round steps.
        let mut v = 0.0;
        while v <= top + 1e-9 {
            let yy = y(v);
            let _ = writeln!(
                svg,
                r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#e4e4e4"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                W - RIGHT,
                LEFT - 6.0,
                yy + 4.0,
                v as u64
            );
            v += step;
        }
        // Time axis.
        let (tstep, unit) = time_step(span);
        let mut t = 0.0;
        while t <= span + 1e-9 {
            let xx = LEFT + t / span * columns as f64;
            if xx + 28.0 > W {
                break; // its label would be cut at the right edge
            }
            let _ = writeln!(
                svg,
                r##"<line x1="{xx:.1}" y1="{TOP}" x2="{xx:.1}" y2="{:.1}" stroke="#e4e4e4"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                H - BOTTOM,
                H - BOTTOM + 16.0,
                time_label(t, unit)
            );
            t += tstep;
        }
        // Busy instances (bottom) and idle instances stacked on them.
        let mut busy_path = format!("M{:.1},{:.1} ", x(0), y(0.0));
        for (c, b) in busy.iter().enumerate() {
            let _ = write!(busy_path, "L{:.1},{:.1} L{:.1},{:.1} ", x(c), y(f64::from(*b)), x(c + 1), y(f64::from(*b)));
        }
        let _ = write!(busy_path, "L{:.1},{:.1} Z", x(columns), y(0.0));
        let mut idle_path = String::new();
        for (c, n) in instances.iter().enumerate() {
            let _ = write!(
                idle_path,
                "{}{:.1},{:.1} L{:.1},{:.1} ",
                if c == 0 { "M" } else { "L" },
                x(c),
                y(f64::from(*n)),
                x(c + 1),
                y(f64::from(*n))
            );
        }
        for (c, b) in busy.iter().enumerate().rev() {
            let _ = write!(idle_path, "L{:.1},{:.1} L{:.1},{:.1} ", x(c + 1), y(f64::from(*b)), x(c), y(f64::from(*b)));
        }
        idle_path.push('Z');
        let _ = writeln!(svg, r##"<path d="{idle_path}" fill="#9ecae1" stroke="none"/>"##);
        let _ = writeln!(svg, r##"<path d="{busy_path}" fill="#2171b5" stroke="none"/>"##);
        let mut queue_path = String::new();
        for (c, q) in queued.iter().enumerate() {
            let _ = write!(queue_path, "{}{:.1},{:.1} ", if c == 0 { "M" } else { "L" }, x(c) + 0.5, y(f64::from(*q)));
        }
        let _ = writeln!(svg, r##"<path d="{queue_path}" fill="none" stroke="#e6550d" stroke-width="1.2"/>"##);
        // Axes and their titles.
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{:.1}" stroke="#333"/><line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#333"/>"##,
            H - BOTTOM,
            H - BOTTOM,
            W - RIGHT,
            H - BOTTOM
        );
        let axis = match unit {
            "day" => "time since trace start (days, UTC; d0 is a Monday)",
            "hour" => "time since trace start (hours, UTC)",
            _ => "time since trace start (minutes, UTC)",
        };
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{axis}</text>"#,
            LEFT + columns as f64 / 2.0,
            H - 14.0
        );
        let _ = writeln!(
            svg,
            r#"<text transform="translate(18,{:.1}) rotate(-90)" text-anchor="middle">instances / queued jobs</text>"#,
            TOP + plot_h / 2.0
        );
        // Legend.
        let legend = [
            ("#2171b5", "busy instances"),
            ("#9ecae1", "idle instances (incl. starting, deleting)"),
            ("#e6550d", "queued jobs"),
        ];
        let mut lx = LEFT + 8.0;
        for (color, label) in legend {
            let _ = writeln!(
                svg,
                r##"<rect x="{lx:.1}" y="{:.1}" width="12" height="12" fill="{color}"/><text x="{:.1}" y="{:.1}">{label}</text>"##,
                TOP - 24.0,
                lx + 16.0,
                TOP - 14.0
            );
            lx += 24.0 + 7.0 * label.len() as f64;
        }
        svg.push_str("</svg>\n");
        svg
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_even() {
        assert_eq!(nice_step(430.0, 6.0), 100.0);
        assert_eq!(nice_step(96.0, 6.0), 20.0);
        assert_eq!(nice_step(3.0, 6.0), 1.0);
        assert_eq!(time_step(28.0 * 86_400.0).0, 2.0 * 86_400.0, "28 days: two-day ticks");
        assert_eq!(time_step(6.0 * 3600.0).0, 1800.0);
        assert_eq!(time_label(4.0 * 86_400.0, "day"), "d4 Fri");
        assert_eq!(time_label(5400.0, "min"), "01:30");
    }
}
