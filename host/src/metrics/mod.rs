//! Prometheus metrics with GitLab Runner's names, types and labels (protocol reference §7;
//! docs/migrating-from-gitlab-runner.md lists them) and the health endpoints, served on
//! `listen_address`: `/metrics`, `/health/live`, `/health/ready`, `/debug/jobs/list`,
//! `/debug/process/state`.
//!
//! Owns the exposition: the families (`families.rs`), what the manager's events add to them
//! (`observer.rs`, the manager's `Observer`), the logged-errors counter (`errors.rs`), and the
//! gauges read at scrape time (health, fleets, job store). Must not talk to GitLab or steer
//! the manager: it only observes.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::autoscaler::{InstanceTiming, RemovalReason};
use crate::config::Loaded;
use crate::gitlab::client::RequestRecord;
use crate::manager::fleet::Fleet;
use crate::manager::health::HealthBoard;
use crate::manager::{ManagerStats, Shutdown};

mod errors;
mod families;
mod observer;
pub mod router;

pub use errors::ErrorCounter;
use families::Families;

/// A job running now, for `gitlab_runner_jobs`.
struct RunningJob {
    runner: String,
    runner_name: String,
    stage: String,
}

#[derive(Default)]
struct Inner {
    stats: Vec<Arc<ManagerStats>>,
    fleets: Vec<Arc<Fleet>>,
    health: Option<Arc<HealthBoard>>,
    /// Jobs running now, by job ID.
    running: BTreeMap<i64, RunningJob>,
}

/// Shared metrics state. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    /// This manager's system ID (a label of most families); fixed for the process.
    system_id: Arc<str>,
    inner: Arc<Mutex<Inner>>,
    ready: Arc<AtomicBool>,
    /// Set once the runner first served (`running` in `gitlab_runner_process_state_info`).
    started: Arc<AtomicBool>,
    /// The process's stop signals, read for the process state.
    shutdown: Arc<Mutex<Option<Shutdown>>>,
    families: Arc<Families>,
}

impl Metrics {
    /// Metrics of a manager with `concurrent` slots.
    pub fn new(concurrent: usize, system_id: &str) -> Result<Self, MetricsError> {
        let families = Families::new().map_err(|e| MetricsError::Families(e.to_string()))?;
        families
            .version_info
            .with_label_values(&[
                "runway",
                crate::buildinfo::VERSION,
                crate::buildinfo::REVISION,
                "",
                "",
                "",
                crate::buildinfo::OS,
                crate::buildinfo::go_arch(),
            ])
            .set(1);
        let slots = i64::try_from(concurrent).unwrap_or(i64::MAX);
        families.concurrent.set(slots);
        // GitLab Runner's workers are its `concurrent` job slots; so are Runway's.
        families.worker_slots.set(slots);
        families.worker_slot_operations.with_label_values(&["started"]).inc_by(u64::try_from(slots).unwrap_or(0));
        families.worker_slot_operations.with_label_values(&["stopped"]).inc_by(0);
        Ok(Metrics {
            system_id: Arc::from(system_id),
            inner: Arc::default(),
            ready: Arc::default(),
            started: Arc::default(),
            shutdown: Arc::default(),
            families: Arc::new(families),
        })
    }

    /// Count jobs of this manager (a reload attaches the new one; counters add up) and
    /// export the runners of `loaded` with their settings.
    pub fn attach(&self, stats: Arc<ManagerStats>, loaded: &Loaded) {
        let Ok(mut inner) = self.inner.lock() else { return };
        inner.stats.push(stats);
        let f = &self.families;
        let sid: &str = &self.system_id;
        for r in &loaded.config.runners {
            let short = crate::config::short_token(&r.resolved_token());
            let labels = [short.as_str(), r.name.as_str(), sid];
            f.limit.with_label_values(&labels).set(i64::try_from(r.limit).unwrap_or(i64::MAX));
            for family in [&f.jobs_total, &f.worker_feeds, &f.worker_feed_failures, &f.acceptable_queuing_exceeded] {
                family.with_label_values(&labels).inc_by(0);
            }
            for kind in ["no_free_executor", "job_failure", "other"] {
                f.worker_processing_failures.with_label_values(&[kind, &short, &r.name, sid]).inc_by(0);
            }
            // The request-concurrency gauges are set by the pollers (the observer); until the
            // first request, the configured limit and nothing in flight.
            let pair = [short.as_str(), sid];
            let requests = i64::try_from(r.request_concurrency).unwrap_or(i64::MAX);
            f.request_concurrency_hard_limit.with_label_values(&pair).set(requests);
            f.request_concurrency_exceeded.with_label_values(&pair).inc_by(0);
            f.request_concurrency.with_label_values(&pair).add(0);
            f.request_concurrency_adaptive_limit.with_label_values(&pair).add(0.0);
            f.request_concurrency_used_limit.with_label_values(&pair).add(0);
        }
    }

    /// Export families another layer owns and feeds (the S3 cache's
    /// `gitlab_runner_cache_s3_assume_role_*`), handed over by the CLI so that layer imports
    /// no metrics.
    pub fn register(&self, collectors: Vec<Box<dyn prometheus::core::Collector>>) -> Result<(), MetricsError> {
        for c in collectors {
            self.families.registry.register(c).map_err(|e| MetricsError::Families(e.to_string()))?;
        }
        Ok(())
    }

    /// Count a configuration file load (`ok`) or a load that failed.
    pub fn config_loaded(&self, ok: bool) {
        if ok {
            self.families.configuration_loaded.inc();
        } else {
            self.families.configuration_loading_error.inc();
        }
    }

    /// Count a configuration file save (`ok`) or a save that failed.
    pub fn config_saved(&self, ok: bool) {
        if ok {
            self.families.configuration_saved.inc();
        } else {
            self.families.configuration_saving_error.inc();
        }
    }

    /// The manager's job slots stopped (the process is stopping).
    pub fn slots_stopped(&self) {
        let slots = self.families.worker_slots.get();
        self.families.worker_slot_operations.with_label_values(&["stopped"]).inc_by(u64::try_from(slots).unwrap_or(0));
        self.families.worker_slots.set(0);
    }

    /// `concurrent` changed by a config reload: the gauge and the job slots follow (slots
    /// added count as started, slots removed as stopped, as gitlab-runner's worker slots).
    pub fn set_concurrent(&self, concurrent: usize) {
        let slots = i64::try_from(concurrent).unwrap_or(i64::MAX);
        let before = self.families.worker_slots.get();
        self.families.concurrent.set(slots);
        self.families.worker_slots.set(slots);
        let (operation, by) = if slots >= before { ("started", slots - before) } else { ("stopped", before - slots) };
        self.families.worker_slot_operations.with_label_values(&[operation]).inc_by(u64::try_from(by).unwrap_or(0));
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
        for fleet in &inner.fleets {
            if let Some(error) = fleet.provider_error() {
                let _ = writeln!(out, "runner {} fleet provider failing: {error}", fleet.name());
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

    /// `/health/ready` answers 200 once set; the process state is `running` from then on.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
        if ready {
            self.started.store(true, Ordering::SeqCst);
        }
    }

    /// Read the process's stop signals for `gitlab_runner_process_state_info` and
    /// `/debug/process/state`.
    pub fn follow_shutdown(&self, shutdown: &Shutdown) {
        if let Ok(mut current) = self.shutdown.lock() {
            *current = Some(shutdown.clone());
        }
    }

    /// gitlab-runner's process state (`commands/internal/process_state`): `starting` until the
    /// runner serves, `running`, then `graceful-shutdown` (SIGQUIT) or `forceful-shutdown`.
    fn process_state(&self) -> &'static str {
        let stopping = self.shutdown.lock().ok().and_then(|s| s.clone());
        match stopping {
            Some(s) if s.forceful.is_cancelled() => "forceful-shutdown",
            Some(s) if s.graceful.is_cancelled() => "graceful-shutdown",
            _ if self.started.load(Ordering::SeqCst) => "running",
            _ => "starting",
        }
    }

    /// Count one API request attempt of runner `runner` (its short token) as GitLab Runner
    /// does: transport errors are not counted, the method is lower case, the duration
    /// histogram is labelled by status class (`2xx`), and every attempt after the first is
    /// a retry of its path.
    pub fn record_api_request(&self, runner: &str, request: &RequestRecord<'_>) {
        let Some(status) = request.status else { return };
        let sid = &*self.system_id;
        let method = request.method.to_ascii_lowercase();
        let endpoint = request.endpoint.as_str();
        let f = &self.families;
        f.api_request_statuses.with_label_values(&[runner, sid, endpoint, &status.to_string(), &method]).inc();
        let class = format!("{}xx", status / 100);
        f.api_request_duration
            .with_label_values(&[runner, sid, endpoint, &class, &method])
            .observe(request.duration.as_secs_f64());
        if request.attempt > 1 {
            f.api_request_retries.with_label_values(&[request.path, &method]).inc();
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let Ok(inner) = self.inner.lock() else { return String::new() };
        let sid = &*self.system_id;
        let f = &self.families;
        f.jobs.reset();
        for job in inner.running.values() {
            f.jobs.with_label_values(&[&job.runner, &job.runner_name, sid, "running", &job.stage, ""]).inc();
        }
        let mut out = String::new();
        if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&f.registry.gather(), &mut out) {
            tracing::warn!("rendering metrics: {e}");
        }
        errors::render(&mut out);
        let _ = writeln!(
            out,
            "# HELP gitlab_runner_process_state_info This metric provides info about the current state of the GitLab Runner process\n# TYPE gitlab_runner_process_state_info gauge\ngitlab_runner_process_state_info{{state=\"{}\"}} 1",
            self.process_state()
        );
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

/// One fleet as the fleeting families label it: `runner` (short token), `runner_name`,
/// `system_id` (gitlab-runner's const labels of its taskscaler and provisioner collectors),
/// its configured limits, and the engine's numbers.
struct FleetSample {
    labels: String,
    limits: (u32, u32, u32),
    m: crate::autoscaler::EngineMetrics,
    timings: BTreeMap<InstanceTiming, crate::autoscaler::TimingHistogram>,
}

/// `fleeting_provisioner_*` and `fleeting_taskscaler_*` for each fleet, with GitLab's names
/// and const labels, and a `reason` label on removals.
fn render_fleets(out: &mut String, sid: &str, fleets: &[Arc<Fleet>]) {
    if fleets.is_empty() {
        return;
    }
    let all: Vec<FleetSample> = fleets
        .iter()
        .map(|f| FleetSample {
            labels: format!(
                "runner=\"{}\",runner_name=\"{}\",system_id=\"{sid}\"",
                label(f.name()),
                label(&f.runner_name())
            ),
            limits: f.limits(),
            m: f.metrics(),
            timings: f.timings(),
        })
        .collect();
    // One family: its header, then one sample per fleet and extra label set.
    let family =
        |out: &mut String, name: &str, kind: &str, help: &str, rows: &dyn Fn(&FleetSample) -> Vec<(String, u64)>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for fleet in &all {
                for (extra, value) in rows(fleet) {
                    let _ = writeln!(out, "{name}{{{}{extra}}} {value}", fleet.labels);
                }
            }
        };
    let plain = |v: u64| vec![(String::new(), v)];
    let by = |key: &str, pairs: Vec<(&str, u64)>| -> Vec<(String, u64)> {
        pairs.into_iter().map(|(k, v)| (format!(",{key}=\"{k}\""), v)).collect()
    };
    family(out, "fleeting_provisioner_instances", "gauge", "Instances of the fleet by state.", &|f| {
        let m = &f.m;
        by(
            "state",
            vec![
                ("requested", m.instances_requested.into()),
                ("creating", u64::from(m.instances_creating) + u64::from(m.instances_ready_checking)),
                ("running", m.instances_ready.into()),
                ("deleting", m.instances_deleting.into()),
            ],
        )
    });
    family(out, "fleeting_provisioner_max_instances", "gauge", "The configured max_instances.", &|f| {
        plain(f.limits.0.into())
    });
    family(out, "fleeting_provisioner_desired_instances", "gauge", "Instances the active policy wants.", &|f| {
        plain(f.m.desired_instances.into())
    });
    family(
        out,
        "fleeting_provisioner_instance_operations_total",
        "counter",
        "Instance creations requested and removals by reason.",
        &|f| {
            let mut rows = vec![(",operation=\"create\",reason=\"\"".to_string(), f.m.instances_requested_total)];
            for reason in RemovalReason::ALL {
                let n = f.m.instances_removed_total.get(&reason).copied().unwrap_or(0);
                rows.push((format!(",operation=\"remove\",reason=\"{}\"", reason.as_str()), n));
            }
            rows
        },
    );
    family(
        out,
        "fleeting_provisioner_failures_total",
        "counter",
        "Provisioning, readiness, heartbeat and provider failures.",
        &|f| {
            let m = &f.m;
            by(
                "kind",
                vec![
                    ("provisioning", m.provisioning_failures_total),
                    ("ready_command", m.ready_failures_total),
                    ("heartbeat", m.heartbeat_failures_total),
                    ("provider", m.provider_errors_total),
                    ("instance_lost", m.instances_lost_total),
                ],
            )
        },
    );
    family(out, "fleeting_taskscaler_tasks", "gauge", "Job slots by state.", &|f| {
        let m = &f.m;
        by(
            "state",
            vec![
                ("idle", m.slots_idle.into()),
                ("reserved", m.slots_reserved.into()),
                ("pending", m.slots_pending.into()),
                ("acquired", m.slots_acquired.into()),
                ("unavailable", m.slots_unavailable.into()),
                ("unhealthy", m.slots_unhealthy.into()),
            ],
        )
    });
    family(out, "fleeting_taskscaler_max_tasks_per_instance", "gauge", "The configured capacity_per_instance.", &|f| {
        plain(f.limits.1.into())
    });
    family(
        out,
        "fleeting_taskscaler_max_use_count_per_instance",
        "gauge",
        "The configured max_use_count (0: unlimited).",
        &|f| plain(f.limits.2.into()),
    );
    family(out, "fleeting_taskscaler_idle_target", "gauge", "Idle slots the active policy keeps.", &|f| {
        plain(f.m.idle_target.into())
    });
    family(
        out,
        "fleeting_taskscaler_acquisitions_total",
        "counter",
        "Slots acquired by jobs, and acquisitions that timed out.",
        &|f| by("result", vec![("acquired", f.m.acquisitions_total), ("timeout", f.m.acquisition_timeouts_total)]),
    );
    for (timing, name, help) in TIMING_FAMILIES {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for fleet in &all {
            let Some(h) = fleet.timings.get(&timing) else { continue };
            for (le, n) in h.cumulative() {
                let _ = writeln!(out, "{name}_bucket{{{},le=\"{le}\"}} {n}", fleet.labels);
            }
            let _ =
                writeln!(out, "{name}_sum{{{}}} {}\n{name}_count{{{}}} {}", fleet.labels, h.sum, fleet.labels, h.count);
        }
    }
    render_fleet_health(out, &all);
}

/// The instance timing histograms under gitlab-runner's fleeting names.
const TIMING_FAMILIES: [(InstanceTiming, &str, &str); 5] = [
    (
        InstanceTiming::Creation,
        "fleeting_provisioner_instance_creation_time_seconds",
        "Time from an instance's creation request to the provider listing it.",
    ),
    (
        InstanceTiming::IsRunning,
        "fleeting_provisioner_instance_is_running_time_seconds",
        "Time from an instance's creation request to the provider reporting it running.",
    ),
    (
        InstanceTiming::Deletion,
        "fleeting_provisioner_instance_deletion_time_seconds",
        "Time from an instance's removal request to it being gone.",
    ),
    (
        InstanceTiming::Life,
        "fleeting_provisioner_instance_life_duration_seconds",
        "Time from an instance's first appearance to it being gone.",
    ),
    (
        InstanceTiming::Readiness,
        "fleeting_taskscaler_task_instance_readiness_time_seconds",
        "Time from an instance's creation request to it being ready for jobs (after instance_ready_command).",
    ),
];

/// Runway's own fleet gauges: whether the provider answers, instances being drained after an
/// interruption notice, notices and adoptions in total.
fn render_fleet_health(out: &mut String, all: &[FleetSample]) {
    type Read = fn(&crate::autoscaler::EngineMetrics) -> u64;
    let families: [(&str, &str, &str, Read); 4] = [
        (
            "runway_fleet_provider_up",
            "gauge",
            "Whether the fleeting provider answers (0: it fails; the runner asks for no job it cannot run).",
            |m| u64::from(m.provider_consecutive_failures == 0),
        ),
        (
            "runway_fleet_instances_interrupted",
            "gauge",
            "Instances the provider announced it takes away, being drained.",
            |m| u64::from(m.instances_interrupted),
        ),
        ("runway_fleet_interruptions_total", "counter", "Interruption notices received (one per instance).", |m| {
            m.interruptions_total
        }),
        (
            "runway_fleet_instances_adopted_total",
            "counter",
            "Instances the provider's group launched on its own, adopted.",
            |m| m.instances_adopted_total,
        ),
    ];
    for (name, kind, help, value) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for fleet in all {
            let _ = writeln!(out, "{name}{{{}}} {}", fleet.labels, value(&fleet.m));
        }
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
    /// A metric family could not be defined (a programming error in `families.rs`).
    #[error("defining the metric families: {0}")]
    Families(String),
}

/// Serve metrics and health on `address` (`host:port`).
pub async fn serve(address: &str, metrics: Metrics) -> Result<ServerHandle, MetricsError> {
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
            "/debug/process/state",
            get(|State(m): State<Metrics>| async move { format!("{}\n", m.process_state()) }),
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
    serve_app(address, app, "metrics and health listening").await
}

/// Bind `address` and serve `app` there in the background, logging `what` with the address.
async fn serve_app(address: &str, app: axum::Router, what: &'static str) -> Result<ServerHandle, MetricsError> {
    let listen = |source| MetricsError::Listen { address: address.to_string(), source };
    let listener = match address.strip_prefix(':') {
        // `:9252`, the form gitlab-runner's docs use (Go's listen on every address): IPv6 and
        // IPv4 on one socket where the kernel has IPv6, IPv4 alone where it has not.
        Some(port) => match tokio::net::TcpListener::bind(format!("[::]:{port}")).await {
            Ok(listener) => listener,
            Err(_) => tokio::net::TcpListener::bind(format!("0.0.0.0:{port}")).await.map_err(listen)?,
        },
        None => tokio::net::TcpListener::bind(address).await.map_err(listen)?,
    };
    let local = listener.local_addr().map_err(listen)?;
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("metrics server stopped: {e}");
        }
    });
    tracing::info!(address = %local, "{what}");
    Ok(ServerHandle { address: local, _task: task })
}
