//! The router's metrics (`runway router`, on its `listen_address`): queued jobs and queue wait
//! by project, jobs offered and accepted, waiting downstream requests, dispatches, accepts,
//! declines and lost runners by downstream, the router's own failures, upstream job requests by
//! result, and the upstream requests the router saved (downstream polls it absorbed).
//! `/health/live` and `/health/ready` as for `run`.
//!
//! Owns the router's exposition. Must not steer the router (it reads `Router::snapshot`).

use std::fmt::Write as _;

use axum::extract::State;
use axum::routing::get;

use super::{MetricsError, ServerHandle};
use crate::router::stats::WAIT_BUCKETS;
use crate::router::{Router, RouterSnapshot};

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The Prometheus text of `snap`.
pub fn render(snap: &RouterSnapshot) -> String {
    let mut out = String::new();
    let name = |d: usize| escape(snap.downstreams.get(d).map(String::as_str).unwrap_or("?"));
    let family = |out: &mut String, metric: &str, kind: &str, help: &str| {
        let _ = writeln!(out, "# HELP {metric} {help}\n# TYPE {metric} {kind}");
    };
    family(
        &mut out,
        "runway_router_queue_jobs",
        "gauge",
        "Jobs queued in the router for a downstream runner, by project.",
    );
    for (project, n) in &snap.queued_by_project {
        let _ = writeln!(out, "runway_router_queue_jobs{{project=\"{}\"}} {n}", escape(project));
    }
    family(&mut out, "runway_router_jobs", "gauge", "Jobs the router holds, by phase.");
    let queued: u64 = snap.queued_by_project.values().sum();
    for (phase, n) in [("queued", queued), ("offered", snap.offered), ("accepted", snap.accepted)] {
        let _ = writeln!(out, "runway_router_jobs{{phase=\"{phase}\"}} {n}");
    }
    family(&mut out, "runway_router_waiting_requests", "gauge", "Downstream job requests waiting for a job.");
    let _ = writeln!(out, "runway_router_waiting_requests {}", snap.waiting);
    family(&mut out, "runway_router_upstream_requests_in_flight", "gauge", "Job requests to GitLab in flight.");
    let _ = writeln!(out, "runway_router_upstream_requests_in_flight {}", snap.upstream_inflight);
    let s = &snap.stats;
    family(
        &mut out,
        "runway_router_queue_wait_seconds",
        "histogram",
        "Time jobs waited in the router's queue, by project.",
    );
    for (project, h) in &s.queue_wait {
        let project = escape(project);
        for (i, le) in WAIT_BUCKETS.iter().enumerate() {
            let n = h.buckets.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "runway_router_queue_wait_seconds_bucket{{project=\"{project}\",le=\"{le}\"}} {n}");
        }
        let _ =
            writeln!(out, "runway_router_queue_wait_seconds_bucket{{project=\"{project}\",le=\"+Inf\"}} {}", h.count);
        let _ = writeln!(out, "runway_router_queue_wait_seconds_sum{{project=\"{project}\"}} {}", h.sum);
        let _ = writeln!(out, "runway_router_queue_wait_seconds_count{{project=\"{project}\"}} {}", h.count);
    }
    for (metric, help, list) in [
        ("runway_router_downstream_requests_total", "Job requests from downstream runners.", &s.polls),
        ("runway_router_dispatches_total", "Jobs given to downstream runners.", &s.dispatches),
        ("runway_router_accepts_total", "Jobs accepted (running at GitLab) by downstream runners.", &s.accepts),
        ("runway_router_lost_total", "Accepted jobs failed because their runner stopped reporting.", &s.lost),
    ] {
        family(&mut out, metric, "counter", help);
        for (d, n) in list.iter().enumerate() {
            let _ = writeln!(out, "{metric}{{downstream=\"{}\"}} {n}", name(d));
        }
    }
    family(&mut out, "runway_router_declines_total", "counter", "Jobs given back by a downstream runner, by reason.");
    for ((d, reason), n) in &s.declines {
        let _ = writeln!(
            out,
            "runway_router_declines_total{{downstream=\"{}\",reason=\"{}\"}} {n}",
            name(*d),
            reason.as_str()
        );
    }
    family(&mut out, "runway_router_failed_total", "counter", "Jobs the router failed at GitLab itself, by reason.");
    for (why, n) in &s.failed {
        let _ = writeln!(out, "runway_router_failed_total{{reason=\"{why}\"}} {n}");
    }
    family(
        &mut out,
        "runway_router_upstream_requests_total",
        "counter",
        "Job requests to GitLab, by upstream and result.",
    );
    let mut upstream_total = 0u64;
    for ((u, result), n) in &s.upstream_requests {
        upstream_total += n;
        let _ = writeln!(out, "runway_router_upstream_requests_total{{upstream=\"{u}\",result=\"{result}\"}} {n}");
    }
    family(
        &mut out,
        "runway_router_upstream_requests_saved_total",
        "counter",
        "Downstream job requests the router answered without a job request of its own to GitLab.",
    );
    let polls: u64 = s.polls.iter().sum();
    let _ = writeln!(out, "runway_router_upstream_requests_saved_total {}", polls.saturating_sub(upstream_total));
    out
}

/// Serve the router's metrics and health on `address`.
pub async fn serve(address: &str, router: Router) -> Result<ServerHandle, MetricsError> {
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(|State(r): State<Router>| async move {
                ([("content-type", "text/plain; version=0.0.4")], render(&r.snapshot()))
            }),
        )
        .route("/health/live", get(|| async { "ok\n" }))
        .route("/health/ready", get(|| async { "ok\n" }))
        .with_state(router);
    super::serve_app(address, app, "router metrics and health listening").await
}
