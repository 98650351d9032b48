//! Prometheus metrics with GitLab Runner's names (protocol reference §7) and the health
//! endpoints, served on `listen_address`: `/metrics`, `/health/live`, `/health/ready`,
//! `/debug/jobs/list`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::autoscaler::RemovalReason;
use crate::config::Loaded;
use crate::manager::fleet::Fleet;
use crate::manager::health::HealthBoard;
use crate::manager::ManagerStats;

/// GitLab Runner's job duration buckets, seconds.
const JOB_DURATION_BUCKETS: &[f64] = &[30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 10800.0, 18000.0, 36000.0];

#[derive(Default)]
struct Inner {
    concurrent: usize,
    system_id: String,
    limits: Vec<(String, usize)>,
    stats: Vec<Arc<ManagerStats>>,
    /// (endpoint, status, method) → count
    api_requests: BTreeMap<(String, String, String), u64>,
    /// endpoint → (sum seconds, count)
    api_durations: BTreeMap<String, (f64, u64)>,
    fleets: Vec<Arc<Fleet>>,
    health: Option<Arc<HealthBoard>>,
}

/// Shared metrics state. Cheap to clone.
#[derive(Clone, Default)]
pub struct Metrics {
    inner: Arc<Mutex<Inner>>,
    ready: Arc<AtomicBool>,
}

impl Metrics {
    /// Metrics of a manager with `concurrent` slots.
    pub fn new(concurrent: usize, system_id: &str) -> Self {
        let metrics = Metrics::default();
        if let Ok(mut inner) = metrics.inner.lock() {
            inner.concurrent = concurrent;
            inner.system_id = system_id.to_string();
        }
        metrics
    }

    /// Count jobs of this manager (a reload attaches the new one; counters add up).
    pub fn attach(&self, stats: Arc<ManagerStats>, loaded: &Loaded) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.stats.push(stats);
            inner.limits = loaded
                .config
                .runners
                .iter()
                .map(|r| (crate::config::short_token(&r.resolved_token()), r.limit))
                .collect();
        }
    }

    /// Report the health of the current manager's runners (replacing the previous manager's).
    pub fn set_health(&self, health: Arc<HealthBoard>) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.health = Some(health);
        }
    }

    /// `/health/ready`'s body: `ready`, then one line per runner that cannot serve.
    fn readiness(&self) -> String {
        let mut out = String::from("ready\n");
        let Ok(inner) = self.inner.lock() else { return out };
        if let Some(health) = &inner.health {
            for (runner, status) in health.snapshot() {
                if !status.healthy {
                    let error = status.error.unwrap_or_default();
                    let _ = writeln!(out, "runner {runner} ({}) unhealthy: {error}", status.name);
                }
            }
        }
        out
    }

    /// Export the fleeting metrics of these fleets (replacing the previous list).
    pub fn set_fleets(&self, fleets: Vec<Arc<Fleet>>) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.fleets = fleets;
        }
    }

    /// `/health/ready` answers 200 once set.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// Count one API request attempt: its endpoint label (`request_job`, ...), HTTP method,
    /// status (`None` for a transport error, exported as `error`) and time to response.
    pub fn record_api_request(&self, endpoint: &str, method: &str, status: Option<u16>, duration: Duration) {
        if let Ok(mut inner) = self.inner.lock() {
            let status = status.map(|s| s.to_string()).unwrap_or_else(|| "error".into());
            *inner.api_requests.entry((endpoint.to_string(), status, method.to_string())).or_default() += 1;
            let entry = inner.api_durations.entry(endpoint.to_string()).or_default();
            entry.0 += duration.as_secs_f64();
            entry.1 += 1;
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let Ok(inner) = self.inner.lock() else { return String::new() };
        let mut out = String::new();
        let sid = &inner.system_id;
        let _ = writeln!(
            out,
            "# HELP gitlab_runner_version_info Runner version information.\n# TYPE gitlab_runner_version_info gauge"
        );
        let _ = writeln!(
            out,
            "gitlab_runner_version_info{{name=\"runway\",version=\"{}\",os=\"{}\",architecture=\"{}\"}} 1",
            crate::buildinfo::VERSION,
            crate::buildinfo::OS,
            crate::buildinfo::go_arch()
        );
        let _ = writeln!(out, "# HELP gitlab_runner_concurrent The current value of concurrent setting\n# TYPE gitlab_runner_concurrent gauge");
        let _ = writeln!(out, "gitlab_runner_concurrent{{system_id=\"{sid}\"}} {}", inner.concurrent);
        let _ = writeln!(
            out,
            "# HELP gitlab_runner_limit The current value of limit setting\n# TYPE gitlab_runner_limit gauge"
        );
        for (runner, limit) in &inner.limits {
            let _ = writeln!(out, "gitlab_runner_limit{{runner=\"{runner}\",system_id=\"{sid}\"}} {limit}");
        }
        let running: usize = inner.stats.iter().map(|s| s.running.load(Ordering::SeqCst)).sum();
        let finished: usize = inner.stats.iter().map(|s| s.finished.load(Ordering::SeqCst)).sum();
        let _ = writeln!(
            out,
            "# HELP gitlab_runner_jobs The current number of running builds.\n# TYPE gitlab_runner_jobs gauge"
        );
        let _ = writeln!(out, "gitlab_runner_jobs{{state=\"running\",system_id=\"{sid}\"}} {running}");
        let _ = writeln!(
            out,
            "# HELP gitlab_runner_jobs_total Total number of handled jobs\n# TYPE gitlab_runner_jobs_total counter"
        );
        let _ = writeln!(out, "gitlab_runner_jobs_total{{system_id=\"{sid}\"}} {}", finished + running);
        let mut failed: BTreeMap<String, u64> = BTreeMap::new();
        let mut durations: Vec<f64> = Vec::new();
        for stats in &inner.stats {
            if let Ok(f) = stats.failed.lock() {
                for (reason, count) in f.iter() {
                    *failed.entry(reason.clone()).or_default() += count;
                }
            }
            if let Ok(d) = stats.durations.lock() {
                durations.extend(d.iter().copied());
            }
        }
        let _ = writeln!(out, "# HELP gitlab_runner_failed_jobs_total Total number of failed jobs\n# TYPE gitlab_runner_failed_jobs_total counter");
        for (reason, count) in &failed {
            let _ = writeln!(
                out,
                "gitlab_runner_failed_jobs_total{{failure_reason=\"{reason}\",system_id=\"{sid}\"}} {count}"
            );
        }
        let _ = writeln!(out, "# HELP gitlab_runner_job_duration_seconds Histogram of job durations\n# TYPE gitlab_runner_job_duration_seconds histogram");
        for bound in JOB_DURATION_BUCKETS {
            let n = durations.iter().filter(|d| **d <= *bound).count();
            let _ =
                writeln!(out, "gitlab_runner_job_duration_seconds_bucket{{system_id=\"{sid}\",le=\"{bound}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "gitlab_runner_job_duration_seconds_bucket{{system_id=\"{sid}\",le=\"+Inf\"}} {}",
            durations.len()
        );
        let _ = writeln!(
            out,
            "gitlab_runner_job_duration_seconds_sum{{system_id=\"{sid}\"}} {}",
            durations.iter().sum::<f64>()
        );
        let _ = writeln!(out, "gitlab_runner_job_duration_seconds_count{{system_id=\"{sid}\"}} {}", durations.len());
        let _ = writeln!(
            out,
            "# HELP gitlab_runner_api_request_statuses_total The total number of api requests, partitioned by runner, endpoint, status and method.\n# TYPE gitlab_runner_api_request_statuses_total counter"
        );
        for ((endpoint, status, method), count) in &inner.api_requests {
            let _ = writeln!(
                out,
                "gitlab_runner_api_request_statuses_total{{system_id=\"{sid}\",endpoint=\"{endpoint}\",status=\"{status}\",method=\"{method}\"}} {count}"
            );
        }
        let _ = writeln!(out, "# HELP gitlab_runner_api_request_duration_seconds Latency of API requests.\n# TYPE gitlab_runner_api_request_duration_seconds summary");
        for (endpoint, (sum, count)) in &inner.api_durations {
            let _ = writeln!(
                out,
                "gitlab_runner_api_request_duration_seconds_sum{{system_id=\"{sid}\",endpoint=\"{endpoint}\"}} {sum}"
            );
            let _ = writeln!(out, "gitlab_runner_api_request_duration_seconds_count{{system_id=\"{sid}\",endpoint=\"{endpoint}\"}} {count}");
        }
        if let Some(health) = &inner.health {
            render_health(&mut out, sid, health);
        }
        render_fleets(&mut out, sid, &inner.fleets);
        render_store(&mut out, sid, &inner.stats);
        out
    }
}

/// `runway_store_entries` (jobs kept in a job store now), `runway_store_resumes_total` by
/// result and `runway_store_lease_takeovers_total`.
fn render_store(out: &mut String, sid: &str, stats: &[Arc<ManagerStats>]) {
    let entries: usize = stats.iter().map(|s| s.store_entries.load(Ordering::SeqCst)).sum();
    let takeovers: u64 = stats.iter().map(|s| s.store_takeovers.load(Ordering::SeqCst)).sum();
    let mut resumes: BTreeMap<String, u64> = BTreeMap::new();
    for s in stats {
        if let Ok(r) = s.store_resumes.lock() {
            for (result, count) in r.iter() {
                *resumes.entry(result.clone()).or_default() += count;
            }
        }
    }
    let _ = writeln!(out, "# HELP runway_store_entries Running jobs this manager keeps in a job store.\n# TYPE runway_store_entries gauge");
    let _ = writeln!(out, "runway_store_entries{{system_id=\"{sid}\"}} {entries}");
    let _ = writeln!(out, "# HELP runway_store_resumes_total Stored jobs taken up again after a manager stopped, by result.\n# TYPE runway_store_resumes_total counter");
    for (result, count) in &resumes {
        let _ = writeln!(out, "runway_store_resumes_total{{result=\"{}\",system_id=\"{sid}\"}} {count}", label(result));
    }
    let _ = writeln!(out, "# HELP runway_store_lease_takeovers_total Jobs taken over from another manager whose lease expired.\n# TYPE runway_store_lease_takeovers_total counter");
    let _ = writeln!(out, "runway_store_lease_takeovers_total{{system_id=\"{sid}\"}} {takeovers}");
}

/// A Prometheus label value: `\`, `"` and newlines escaped.
fn label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// `runway_runner_healthy` (1 serving, 0 not: its executor plugin is unusable) and GitLab
/// Runner's `gitlab_runner_worker_health_check_failures_total` for each runner.
fn render_health(out: &mut String, sid: &str, health: &HealthBoard) {
    let runners = health.snapshot();
    let _ = writeln!(out, "# HELP runway_runner_healthy Whether the runner requests jobs (0: its executor cannot be used).\n# TYPE runway_runner_healthy gauge");
    for (runner, status) in &runners {
        let _ = writeln!(
            out,
            "runway_runner_healthy{{runner=\"{}\",runner_name=\"{}\",system_id=\"{sid}\"}} {}",
            label(runner),
            label(&status.name),
            u8::from(status.healthy)
        );
    }
    let _ = writeln!(out, "# HELP gitlab_runner_worker_health_check_failures_total Total number of runner worker health check failures\n# TYPE gitlab_runner_worker_health_check_failures_total counter");
    for (runner, status) in &runners {
        let _ = writeln!(
            out,
            "gitlab_runner_worker_health_check_failures_total{{runner=\"{}\",runner_name=\"{}\",system_id=\"{sid}\"}} {}",
            label(runner),
            label(&status.name),
            status.failures
        );
    }
}

/// `fleeting_provisioner_*` and `fleeting_taskscaler_*` for each fleet, with GitLab's names
/// and a `reason` label on removals.
fn render_fleets(out: &mut String, sid: &str, fleets: &[Arc<Fleet>]) {
    if fleets.is_empty() {
        return;
    }
    let all: Vec<(String, crate::autoscaler::EngineMetrics)> =
        fleets.iter().map(|f| (f.name().to_string(), f.metrics())).collect();
    let family = |out: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    family(out, "fleeting_provisioner_instances", "gauge", "Instances of the fleet by state.");
    for (runner, m) in &all {
        for (state, n) in [
            ("requested", m.instances_requested),
            ("creating", m.instances_creating + m.instances_ready_checking),
            ("running", m.instances_ready),
            ("deleting", m.instances_deleting),
        ] {
            let _ = writeln!(
                out,
                "fleeting_provisioner_instances{{runner=\"{runner}\",system_id=\"{sid}\",state=\"{state}\"}} {n}"
            );
        }
    }
    family(out, "fleeting_provisioner_desired_instances", "gauge", "Instances the active policy wants.");
    for (runner, m) in &all {
        let _ = writeln!(
            out,
            "fleeting_provisioner_desired_instances{{runner=\"{runner}\",system_id=\"{sid}\"}} {}",
            m.desired_instances
        );
    }
    family(
        out,
        "fleeting_provisioner_instance_operations_total",
        "counter",
        "Instance creations requested and removals by reason.",
    );
    for (runner, m) in &all {
        let _ = writeln!(
            out,
            "fleeting_provisioner_instance_operations_total{{runner=\"{runner}\",system_id=\"{sid}\",operation=\"create\",reason=\"\"}} {}",
            m.instances_requested_total
        );
        for reason in RemovalReason::ALL {
            let n = m.instances_removed_total.get(&reason).copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "fleeting_provisioner_instance_operations_total{{runner=\"{runner}\",system_id=\"{sid}\",operation=\"remove\",reason=\"{}\"}} {n}",
                reason.as_str()
            );
        }
    }
    family(
        out,
        "fleeting_provisioner_failures_total",
        "counter",
        "Provisioning, readiness, heartbeat and provider failures.",
    );
    for (runner, m) in &all {
        for (kind, n) in [
            ("provisioning", m.provisioning_failures_total),
            ("ready_command", m.ready_failures_total),
            ("heartbeat", m.heartbeat_failures_total),
            ("provider", m.provider_errors_total),
            ("instance_lost", m.instances_lost_total),
        ] {
            let _ = writeln!(
                out,
                "fleeting_provisioner_failures_total{{runner=\"{runner}\",system_id=\"{sid}\",kind=\"{kind}\"}} {n}"
            );
        }
    }
    family(out, "fleeting_taskscaler_tasks", "gauge", "Job slots by state.");
    for (runner, m) in &all {
        for (state, n) in [
            ("idle", m.slots_idle),
            ("reserved", m.slots_reserved),
            ("pending", m.slots_pending),
            ("acquired", m.slots_acquired),
            ("unavailable", m.slots_unavailable),
            ("unhealthy", m.slots_unhealthy),
        ] {
            let _ = writeln!(
                out,
                "fleeting_taskscaler_tasks{{runner=\"{runner}\",system_id=\"{sid}\",state=\"{state}\"}} {n}"
            );
        }
    }
    family(out, "fleeting_taskscaler_idle_target", "gauge", "Idle slots the active policy keeps.");
    for (runner, m) in &all {
        let _ = writeln!(
            out,
            "fleeting_taskscaler_idle_target{{runner=\"{runner}\",system_id=\"{sid}\"}} {}",
            m.idle_target
        );
    }
    family(
        out,
        "fleeting_taskscaler_acquisitions_total",
        "counter",
        "Slots acquired by jobs, and acquisitions that timed out.",
    );
    for (runner, m) in &all {
        let _ = writeln!(
            out,
            "fleeting_taskscaler_acquisitions_total{{runner=\"{runner}\",system_id=\"{sid}\",result=\"acquired\"}} {}",
            m.acquisitions_total
        );
        let _ = writeln!(
            out,
            "fleeting_taskscaler_acquisitions_total{{runner=\"{runner}\",system_id=\"{sid}\",result=\"timeout\"}} {}",
            m.acquisition_timeouts_total
        );
    }
}

/// The running HTTP server; dropped when the runner stops.
pub struct ServerHandle {
    /// The address actually bound (a `:0` port resolved).
    pub address: std::net::SocketAddr,
    _task: tokio::task::JoinHandle<()>,
}

/// Why the metrics server could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// `listen_address` cannot be bound.
    #[error("listen_address {address}: {source}")]
    Listen {
        /// The configured address.
        address: String,
        /// The bind error.
        source: std::io::Error,
    },
}

/// Serve metrics and health on `address` (`host:port`).
pub async fn serve(address: &str, metrics: Metrics) -> Result<ServerHandle, MetricsError> {
    let listen = |source| MetricsError::Listen { address: address.to_string(), source };
    let listener = tokio::net::TcpListener::bind(address).await.map_err(listen)?;
    let local = listener.local_addr().map_err(listen)?;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(
                |State(m): State<Metrics>| async move { ([("content-type", "text/plain; version=0.0.4")], m.render()) },
            ),
        )
        .route("/health/live", get(|| async { (StatusCode::OK, "ok\n") }))
        .route(
            "/health/ready",
            get(|State(m): State<Metrics>| async move {
                if m.ready.load(Ordering::SeqCst) {
                    (StatusCode::OK, m.readiness())
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".to_string())
                }
            }),
        )
        .route(
            "/debug/jobs/list",
            get(|State(m): State<Metrics>| async move {
                let running: usize =
                    m.inner.lock().map(|i| i.stats.iter().map(|s| s.running.load(Ordering::SeqCst)).sum()).unwrap_or(0);
                format!("running={running}\n")
            }),
        )
        .with_state(metrics);
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("metrics server stopped: {e}");
        }
    });
    tracing::info!(address = %local, "metrics and health listening");
    Ok(ServerHandle { address: local, _task: task })
}
