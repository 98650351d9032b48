//! `runway` as an administrator runs it: register/list/verify/unregister against the fake
//! GitLab, then `runway run` as a real process with its signals, metrics and health.

#[path = "support/wait.rs"]
mod wait;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fake_gitlab::{FakeGitLab, JobSpec, JobStatus};

const RUNWAY: &str = env!("CARGO_BIN_EXE_runway");
const WAIT: Duration = Duration::from_secs(60);

fn runway(config: &Path, args: &[&str]) -> std::process::Output {
    Command::new(RUNWAY).arg("-c").arg(config).args(args).output().expect("runway runs")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

fn start(config: &Path, dir: &Path) -> Child {
    Command::new(RUNWAY)
        .arg("-c")
        .arg(config)
        .arg("run")
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("runway.log")).expect("log file"))
        .spawn()
        .expect("runway run starts")
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: sending a signal to our own child process.
    unsafe {
        libc::kill(child.id() as i32, sig);
    }
}

async fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    for _ in 0..600 {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill();
    panic!("runway did not exit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_run_signals_metrics_unregister() {
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(2), trace_update_interval: 1 })
            .await;
    let runner = fake.create_runner("cli test");
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "hi\n")], "init");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.toml");

    let out = runway(
        &config,
        &["register", "--url", &fake.url(), "--token", &runner.token, "--name", "e2e", "--executor", "shell", "-n"],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let system_id = std::fs::read_to_string(dir.path().join(".runner_system_id")).expect("system id written");
    assert!(system_id.trim().starts_with("s_") || system_id.trim().starts_with("r_"));
    assert!(fake.runner(&runner.token).expect("runner").managers.contains(system_id.trim()));
    let out = runway(&config, &["list"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("e2e"), "{}", String::from_utf8_lossy(&out.stdout));
    let out = runway(&config, &["verify"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));

    // Point builds at the temp dir, speed up polling, expose metrics.
    let port = free_port();
    let text = std::fs::read_to_string(&config).expect("config");
    let text = text
        .replacen("concurrent = 1", &format!("concurrent = 2\nlisten_address = \"127.0.0.1:{port}\""), 1)
        .replacen("check_interval = 0", "check_interval = 1", 1);
    let text = text.replace(
        "executor = \"shell\"",
        &format!("executor = \"shell\"\nbuilds_dir = \"{}\"", dir.path().join("builds").display()),
    );
    std::fs::write(&config, text).expect("write config");

    // A job that fails, one that succeeds with its stages timed, and a job request GitLab
    // answers with a 500 once (a retry): every exported family gets samples.
    let mut child = start(&config, dir.path());
    fake.inject(fake_gitlab::Endpoint::RequestJob, 1, fake_gitlab::InjectedResponse::status(500));
    let failed = fake.enqueue(fake.job_payload(&JobSpec::new("group/project", "fails", &["exit 3"])));
    let timed = fake.enqueue(fake.job_payload(
        &JobSpec::new("group/project", "timed", &["echo timed"]).variable("FF_EXPORT_HIGH_CARDINALITY_METRICS", "true"),
    ));
    for id in [failed, timed] {
        fake.wait_for_job_state(id, |j| j.final_state.is_some(), WAIT).await.expect("job finished");
    }
    // SIGQUIT: the running job finishes, then the process exits 0. It sleeps past the runner's
    // first trace patch (3 s, before GitLab's shorter interval applies), so "started" reaches
    // GitLab while the job still runs and the scrape below sees it running; with 2 s the whole
    // log could arrive in the final patch on a quiet machine.
    let job = fake.enqueue(fake.job_payload(&JobSpec::new(
        "group/project",
        "graceful",
        &["echo started", "sleep 8", "echo done"],
    )));
    if fake.wait_for_job_state(job, |j| j.trace_text().contains("started"), WAIT).await.is_none() {
        let _ = child.kill();
        panic!(
            "job did not start; runway log:\n{}\nconfig:\n{}",
            std::fs::read_to_string(dir.path().join("runway.log")).unwrap_or_default(),
            std::fs::read_to_string(&config).unwrap_or_default()
        );
    }
    let metrics =
        reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await.expect("scrape").text().await.expect("body");
    check_metrics_table(&metrics);
    assert!(metrics.contains("stage=\"step_script\""), "the running job's stage: {metrics}");
    assert!(metrics.contains("failure_reason=\"script_failure\""), "{metrics}");
    let ready = reqwest::get(format!("http://127.0.0.1:{port}/health/ready")).await.expect("ready");
    assert_eq!(ready.status(), 200);
    assert!(metrics.contains("gitlab_runner_process_state_info{state=\"running\"} 1\n"), "{metrics}");
    assert_eq!(scrape(port, "/debug/process/state").await, "running\n");
    signal(&child, libc::SIGQUIT);
    // gitlab-runner's process state while the running job drains.
    let mut state = String::new();
    for _ in 0..50 {
        state = scrape(port, "/debug/process/state").await;
        if state != "running\n" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(state, "graceful-shutdown\n");
    assert!(scrape(port, "/metrics")
        .await
        .contains("gitlab_runner_process_state_info{state=\"graceful-shutdown\"} 1\n"));
    let status = wait_exit(&mut child).await;
    assert!(status.success(), "exit status {status:?}");
    let record = fake.job(job).expect("job");
    assert_eq!(
        (record.status, record.final_state.as_deref()),
        (JobStatus::Success, Some("success")),
        "{}",
        record.trace_text()
    );
    assert!(record.trace_text().contains("done"));

    // SIGTERM: the running job is reported failed with runner_interrupted.
    let mut child = start(&config, dir.path());
    let job = fake.enqueue(fake.job_payload(&JobSpec::new("group/project", "forceful", &["echo started", "sleep 60"])));
    fake.wait_for_job_state(job, |j| j.trace_text().contains("started"), WAIT).await.expect("job started");
    signal(&child, libc::SIGTERM);
    let record = fake.wait_for_job_state(job, |j| j.final_state.is_some(), WAIT).await.expect("job reported");
    assert_eq!(record.failure_reason.as_deref(), Some("runner_interrupted"), "{}", record.trace_text());
    wait_exit(&mut child).await;

    let out = runway(&config, &["unregister", "--all-runners"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!std::fs::read_to_string(&config).expect("config").contains("[[runners]]"));
}

/// Every metric docs/migrating-from-gitlab-runner.md marks *exported* is in `metrics` with the
/// type and label names the table gives (gitlab-runner's), so dashboards and alerts written
/// for gitlab-runner work unchanged.
fn check_metrics_table(metrics: &str) {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/migrating-from-gitlab-runner.md"))
        .expect("migration doc");
    let table = doc
        .split("<!-- metrics-table -->")
        .nth(1)
        .and_then(|t| t.split("<!-- /metrics-table -->").next())
        .expect("the metrics table between its markers");
    let mut checked = 0;
    for row in table.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (name, kind, labels, status) = (cells[1].trim_matches('`'), cells[2], cells[3], cells[4]);
        if status != "exported" {
            continue;
        }
        checked += 1;
        assert!(metrics.contains(&format!("# TYPE {name} {kind}\n")), "{name}: no family of type {kind}:\n{metrics}");
        let sample = if kind == "histogram" { format!("{name}_bucket") } else { name.to_string() };
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("{sample}{{")) || l.starts_with(&format!("{sample} ")))
            .unwrap_or_else(|| panic!("{name}: no sample:\n{metrics}"));
        for label in labels.split(',').map(str::trim).filter(|l| !l.is_empty()) {
            assert!(line.contains(&format!("{label}=\"")), "{name}: sample without label {label}: {line}");
        }
    }
    assert!(checked >= 35, "the table lists the exported families ({checked})");
}

/// The value of `metric` for the runner named `name` in a Prometheus text, if exported.
fn runner_metric(metrics: &str, metric: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(&format!("{metric}{{")) && l.contains(&format!("runner_name=\"{name}\"")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

async fn scrape(port: u16, path: &str) -> String {
    match reqwest::get(format!("http://127.0.0.1:{port}{path}")).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_executor_plugin_leaves_only_its_runner_unhealthy_until_fixed() {
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(2), trace_update_interval: 1 })
            .await;
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "hi\n")], "init");
    let dir = tempfile::tempdir().expect("tempdir");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugins dir");
    let guest = Path::new(env!("RUNWAY_GUEST_DIR")).join("test_stubborn.wasm");
    let wasm = std::fs::read(&guest).expect("stubborn plugin built");
    // A truncated plugin file, and no stubborn.wasm yet.
    std::fs::write(plugins.join("truncated.wasm"), &wasm[..wasm.len() / 3]).expect("write truncated plugin");
    let port = free_port();
    // name → (executor, its config section)
    let runners = [
        ("good", "shell", ""),
        ("late", "stubborn", "mode = \"fine\""),
        ("trapping", "stubborn", "mode = \"info_trap\""),
        ("huge-error", "stubborn", "mode = \"info_huge\""),
        ("truncated", "truncated", ""),
    ];
    let mut config = format!(
        "concurrent = 5\ncheck_interval = 1\nlisten_address = \"127.0.0.1:{port}\"\nplugins_dir = \"{}\"\n",
        plugins.display()
    );
    let mut tokens = std::collections::BTreeMap::new();
    for (name, executor, section) in runners {
        let token = fake.create_runner(name).token;
        config.push_str(&format!(
            "\n[[runners]]\nname = \"{name}\"\nurl = \"{}\"\ntoken = \"{token}\"\nexecutor = \"{executor}\"\nbuilds_dir = \"{}\"\n",
            fake.url(),
            dir.path().join("builds").display()
        ));
        if !section.is_empty() {
            config.push_str(&format!("[runners.{executor}]\n{section}\n"));
        }
        tokens.insert(name, token);
    }
    let config_path = dir.path().join("config.toml");
    std::fs::write(&config_path, config).expect("write config");
    let log = || std::fs::read_to_string(dir.path().join("runway.log")).unwrap_or_default();

    let mut child = start(&config_path, dir.path());
    // The healthy runner serves although the others' plugins are missing or broken.
    let job =
        fake.enqueue_for(&tokens["good"], fake.job_payload(&JobSpec::new("group/project", "ok", &["echo served"])));
    let Some(record) = fake.wait_for_job_state(job, |j| j.final_state.is_some(), WAIT).await else {
        let _ = child.kill();
        panic!("the healthy runner served nothing; runway log:\n{}", log());
    };
    assert_eq!(record.final_state.as_deref(), Some("success"), "{}", record.trace_text());
    let metrics = scrape(port, "/metrics").await;
    assert_eq!(runner_metric(&metrics, "runway_runner_healthy", "good"), Some(1.0), "{metrics}");
    for name in ["late", "trapping", "huge-error", "truncated"] {
        assert_eq!(runner_metric(&metrics, "runway_runner_healthy", name), Some(0.0), "{name}: {metrics}");
    }
    let ready = scrape(port, "/health/ready").await;
    assert!(ready.starts_with("ready\n") && ready.contains("(truncated) unhealthy"), "{ready}");

    // Publishing the plugin (hot reload) brings the runner that was only missing it back.
    let tmp = plugins.join(".stubborn.wasm.tmp");
    std::fs::write(&tmp, &wasm).expect("write plugin");
    std::fs::rename(&tmp, plugins.join("stubborn.wasm")).expect("publish plugin");
    let mut recovered = false;
    for _ in 0..200 {
        let metrics = scrape(port, "/metrics").await;
        if runner_metric(&metrics, "runway_runner_healthy", "late") == Some(1.0) {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(recovered, "the runner did not recover; runway log:\n{}", log());
    let job = fake.enqueue_for(&tokens["late"], fake.job_payload(&JobSpec::new("group/project", "late", &["true"])));
    let record =
        fake.wait_for_job_state(job, |j| j.final_state.is_some(), WAIT).await.expect("the recovered runner serves");
    assert_eq!(record.final_state.as_deref(), Some("success"), "{}", record.trace_text());
    assert!(record.trace_text().contains("ok step_script"), "{}", record.trace_text());

    // The plugin that traps or fails in info() keeps its runners unhealthy, with a bounded error.
    let unhealthy = ["trapping", "huge-error", "truncated"];
    let retried = |metrics: &str| {
        unhealthy.iter().all(|name| {
            runner_metric(metrics, "gitlab_runner_worker_health_check_failures_total", name).is_some_and(|n| n >= 2.0)
        })
    };
    wait::until_async("the failing runners' health checks are retried", wait::WAIT, || {
        let retried = &retried;
        async move { retried(&scrape(port, "/metrics").await) }
    })
    .await;
    let metrics = scrape(port, "/metrics").await;
    for name in unhealthy {
        assert_eq!(runner_metric(&metrics, "runway_runner_healthy", name), Some(0.0), "{name}: {metrics}");
        let failures = runner_metric(&metrics, "gitlab_runner_worker_health_check_failures_total", name);
        assert!(failures.is_some_and(|n| n >= 2.0), "{name} is retried: {metrics}");
    }
    assert!(metrics.len() < 64 * 1024, "a 50 MB plugin error must not reach the metrics");
    let text = log();
    assert!(text.contains("runner is unhealthy") && text.contains("runner recovered"), "{text}");
    assert!(text.len() < 1024 * 1024, "a 50 MB plugin error must not reach the log ({} bytes)", text.len());
    signal(&child, libc::SIGQUIT);
    let status = wait_exit(&mut child).await;
    assert!(status.success(), "exit status {status:?}");
}

fn runway_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("runway.log")).unwrap_or_default()
}

/// Wait until the runway logging to `dir`/runway.log has started serving: a fresh config
/// directory compiles the plugins first, which takes long on a loaded machine.
async fn wait_started(dir: &Path) {
    wait::until("runway has started", Duration::from_secs(300), || runway_log(dir).contains("runway started")).await;
}

/// A config file replaced by a bad one and delivered by SIGHUP while a job runs: the reload
/// is refused and logged, the job finishes, and the runner keeps serving the old configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_with_a_bad_config_keeps_the_old_one() {
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(1), trace_update_interval: 1 })
            .await;
    let runner = fake.create_runner("reload test");
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "hi\n")], "init");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.toml");
    let good = format!(
        "concurrent = 2\ncheck_interval = 1\n\n[[runners]]\nname = \"reload\"\nurl = \"{}\"\ntoken = \"{}\"\nexecutor = \"shell\"\nbuilds_dir = \"{}\"\n",
        fake.url(),
        runner.token,
        dir.path().join("builds").display()
    );
    std::fs::write(&config, &good).expect("write config");
    let mut child = start(&config, dir.path());
    let job = fake.enqueue(fake.job_payload(&JobSpec::new(
        "group/project",
        "long",
        &["echo started", "sleep 3", "echo finished"],
    )));
    if fake.wait_for_job_state(job, |j| j.trace_text().contains("started"), WAIT).await.is_none() {
        let _ = child.kill();
        panic!("job did not start; runway log:\n{}", runway_log(dir.path()));
    }
    // A `limit` past tokio's semaphore maximum: it used to load and then panic the manager.
    let bad = good.replace("builds_dir", "limit = 2305843009213693952\nbuilds_dir");
    std::fs::write(&config, bad).expect("write bad config");
    signal(&child, libc::SIGHUP);
    let record = fake.wait_for_job_state(job, |j| j.final_state.is_some(), WAIT).await.expect("job reported");
    assert_eq!(
        (record.status, record.final_state.as_deref()),
        (JobStatus::Success, Some("success")),
        "{}\nrunway log:\n{}",
        record.trace_text(),
        runway_log(dir.path())
    );
    assert!(record.trace_text().contains("finished"));
    assert!(child.try_wait().expect("wait").is_none(), "runway exited; log:\n{}", runway_log(dir.path()));
    let log = runway_log(dir.path());
    assert!(
        log.contains("config reload failed, keeping the running configuration")
            && log.contains("config.toml:9: runners[0].limit: "),
        "{log}"
    );
    // Still serving: the next job runs on the old configuration.
    let next = fake.enqueue(fake.job_payload(&JobSpec::new("group/project", "after", &["echo still serving"])));
    let record = fake.wait_for_job_state(next, |j| j.final_state.is_some(), WAIT).await.expect("next job reported");
    assert_eq!(record.final_state.as_deref(), Some("success"), "{}", record.trace_text());
    signal(&child, libc::SIGQUIT);
    let status = wait_exit(&mut child).await;
    assert!(status.success(), "exit status {status:?}; log:\n{}", runway_log(dir.path()));
    assert!(!runway_log(dir.path()).contains("panicked"), "{}", runway_log(dir.path()));
}

/// `runway verify` and `runway run` on malformed files: exit code 1, the file:line:key error,
/// no panic.
#[test]
fn verify_and_run_refuse_malformed_configs_without_panicking() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/config/bad");
    for (fixture, expected) in [
        ("concurrent-tokio-max.toml", ":2: concurrent: "),
        ("unhealthy-interval-overflow.toml", ":8: runners[0].unhealthy_interval: "),
        ("call-timeout-zero.toml", ":11: plugins.shell.call_timeout: "),
        ("listen-address-no-port.toml", ":3: listen_address: "),
        ("limit-huge.toml", ":8: runners[0].limit: "),
    ] {
        let file = corpus.join(fixture);
        for verb in ["verify", "run"] {
            let dir = tempfile::tempdir().expect("tempdir");
            let config = dir.path().join("config.toml");
            std::fs::copy(&file, &config).expect("copy fixture");
            let out = Command::new(RUNWAY)
                .arg("-c")
                .arg(&config)
                .arg(verb)
                .current_dir(dir.path())
                .output()
                .expect("runway runs");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{verb} {fixture}: {stderr}");
            assert!(
                stderr.contains(&format!("{}{expected}", config.display())) && !stderr.contains("panicked"),
                "{verb} {fixture}: {stderr}"
            );
        }
    }
}

#[test]
fn lint_fails_on_errors_and_unknown_keys_and_passes_a_valid_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.toml");
    let valid = "concurrent = 2\n\n[[runners]]\nname = \"a\"\nurl = \"https://gitlab.example\"\ntoken = \"glrt-abc\"\nexecutor = \"shell\"\n";
    std::fs::write(&config, valid).expect("write");
    let out = runway(&config, &["lint"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Configuration file is valid."));

    std::fs::write(&config, valid.replace("executor = \"shell\"\n", "executor = \"shell\"\nnot_a_key = 1\n"))
        .expect("write");
    let out = runway(&config, &["lint"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("1 unknown key(s) found") && stderr.contains(":8: runners[0].not_a_key"), "{stderr}");

    std::fs::write(&config, valid.replace("concurrent = 2", "concurrent = 0")).expect("write");
    let out = runway(&config, &["lint"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("concurrent"), "{stderr}");

    let out = runway(&dir.path().join("missing.toml"), &["lint"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("config file not found"));

    // What `run` would say of a runner: an executor Runway has no plugin for fails lint, and
    // the docker executor's ignored keys are named.
    for executor in ["virtualbox", "parallels", "docker-windows"] {
        std::fs::write(&config, valid.replace("executor = \"shell\"", &format!("executor = \"{executor}\"")))
            .expect("write");
        let out = runway(&config, &["lint"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{executor}: {stderr}");
        assert!(stderr.contains(&format!("executor \"{executor}\"")), "{stderr}");
    }
    let docker = valid.replace(
        "executor = \"shell\"\n",
        "executor = \"docker\"\n[runners.docker]\nimage = \"alpine\"\ngpus = \"all\"\n",
    );
    std::fs::write(&config, docker).expect("write");
    let out = runway(&config, &["lint"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("unsupported keys ignored: gpus"), "{stderr}");

    // A fleet runner as gitlab-runner users write it: the instance plugin takes both of
    // gitlab-runner's [runners.instance] keys, and every key Runway does not act on is named
    // with its line, as `run` names them.
    let fleet = valid.replace(
        "executor = \"shell\"\n",
        "executor = \"instance\"\n[runners.instance]\nuse_common_build_dir = true\nallowed_images = [\"ruby:*\"]\n[runners.autoscaler]\nplugin = \"static\"\nmax_use_count = 1\nreservation_throttling = false\n[runners.machine]\nMachineDriver = \"amazonec2\"\nMachineName = \"ci-%s\"\nMachineOptions = [\"amazonec2-region=eu-west-1\"]\n",
    );
    std::fs::write(&config, fleet).expect("write");
    let out = runway(&config, &["lint"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for warning in [
        ":10: runners.0.instance.allowed_images: applies only with vm_isolation, which Runway does not support (ignored)",
        ":14: runners.0.autoscaler.reservation_throttling: not supported by Runway (ignored)",
        ":16: runners.0.machine.MachineDriver: not supported by Runway (ignored)",
        ":17: runners.0.machine.MachineName: not supported by Runway (ignored)",
        ":18: runners.0.machine.MachineOptions: not supported by Runway (ignored)",
    ] {
        assert!(stderr.contains(warning), "missing {warning:?} in:\n{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runners_whose_tokens_share_a_prefix_both_serve_from_one_directory() {
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(1), trace_update_interval: 1 })
            .await;
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "hi\n")], "init");
    let dir = tempfile::tempdir().expect("tempdir");
    // The same short token (9 characters after the prefixes), different tokens.
    let tokens = ["glrt-t1_sharedpreAAAAAAAAAAAAAAAAAAAA", "glrt-t1_sharedpreBBBBBBBBBBBBBBBBBBBB"];
    let mut config = "concurrent = 2\ncheck_interval = 1\n".to_string();
    for (i, token) in tokens.iter().enumerate() {
        fake.create_runner_with_token(&format!("runner {i}"), token);
        config.push_str(&format!(
            "\n[[runners]]\nname = \"r{i}\"\nurl = \"{}\"\ntoken = \"{token}\"\nexecutor = \"shell\"\nbuilds_dir = \"{}\"\n",
            fake.url(),
            dir.path().join(format!("builds{i}")).display()
        ));
    }
    let config_path = dir.path().join("config.toml");
    std::fs::write(&config_path, config).expect("write config");
    // An earlier version's store directory, named by the short token both tokens share.
    let stores = dir.path().join(".runway/store");
    std::fs::create_dir_all(stores.join("sharedpre")).expect("legacy store");
    let mut child = start(&config_path, dir.path());
    let log = || std::fs::read_to_string(dir.path().join("runway.log")).unwrap_or_default();
    for (i, token) in tokens.iter().enumerate() {
        let job = fake
            .enqueue_for(token, fake.job_payload(&JobSpec::new("group/project", &format!("job{i}"), &["echo served"])));
        let Some(record) = fake.wait_for_job_state(job, |j| j.final_state.is_some(), WAIT).await else {
            let _ = child.kill();
            panic!("runner {i} served nothing; runway log:\n{}", log());
        };
        assert_eq!(record.final_state.as_deref(), Some("success"), "{}", record.trace_text());
    }
    let mut names: Vec<String> = std::fs::read_dir(&stores)
        .expect("store dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 2, "one store per runner, the old one moved: {names:?}\n{}", log());
    assert!(!names.contains(&"sharedpre".to_string()), "{names:?}");
    assert!(!log().contains("in use by another manager"), "{}", log());
    signal(&child, libc::SIGQUIT);
    let status = wait_exit(&mut child).await;
    assert!(status.success(), "exit status {status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_waits_for_a_config_written_later_with_gitlab_runners_defaults() {
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(1), trace_update_interval: 1 })
            .await;
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "hi\n")], "init");
    let runner = fake.create_runner("late config");
    let dir = tempfile::tempdir().expect("tempdir");
    let config_path = dir.path().join("etc/config.toml");
    let mut child = start(&config_path, dir.path());
    let log = || std::fs::read_to_string(dir.path().join("runway.log")).unwrap_or_default();
    wait::until("runway says it waits for the config", wait::WAIT, || log().contains("does not exist yet")).await;
    assert!(child.try_wait().expect("wait").is_none(), "runway exited without a config:\n{}", log());
    // No `concurrent` (1, as gitlab-runner) and gitlab-runner's `:port` listen address.
    let port = free_port();
    std::fs::create_dir_all(config_path.parent().expect("parent")).expect("config dir");
    std::fs::write(
        &config_path,
        format!(
            "listen_address = \":{port}\"\ncheck_interval = 0\n[[runners]]\nname = \"late\"\nurl = \"{}\"\ntoken = \"{}\"\nexecutor = \"shell\"\nbuilds_dir = \"{}\"\n",
            fake.url(),
            runner.token,
            dir.path().join("builds").display()
        ),
    )
    .expect("write config");
    let job = fake.enqueue(fake.job_payload(&JobSpec::new("group/project", "late", &["echo served"])));
    let Some(record) = fake.wait_for_job_state(job, |j| j.final_state.is_some(), WAIT).await else {
        let _ = child.kill();
        panic!("the config written later served nothing; runway log:\n{}", log());
    };
    assert_eq!(record.final_state.as_deref(), Some("success"), "{}", record.trace_text());
    let metrics = scrape(port, "/metrics").await;
    assert!(metrics.contains("gitlab_runner_concurrent 1"), "{metrics}");
    signal(&child, libc::SIGQUIT);
    let status = wait_exit(&mut child).await;
    assert!(status.success(), "exit status {status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitlab_runners_service_exec_start_line_runs_runway() {
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(1), trace_update_interval: 1 })
            .await;
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "hi\n")], "init");
    let runner = fake.create_runner("service");
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    std::fs::write(
        dir.path().join("config.toml"),
        format!(
            "concurrent = 1\ncheck_interval = 1\n[[runners]]\nname = \"svc\"\nurl = \"{}\"\ntoken = \"{}\"\nexecutor = \"shell\"\nbuilds_dir = \"{}\"\n",
            fake.url(),
            runner.token,
            dir.path().join("builds").display()
        ),
    )
    .expect("write config");
    // `run` followed by what gitlab-runner's GetServiceArguments builds for `install --user root
    // --working-directory D` on a host without systemd, plus --listen-address; the config path
    // is relative, so it is found only once runway works in D.
    let mut child = Command::new(RUNWAY)
        .args(["run", "--config", "config.toml", "--working-directory"])
        .arg(dir.path())
        .args(["--service", "gitlab-runner", "--syslog", "--user", "root", "--listen-address"])
        .arg(format!("127.0.0.1:{port}"))
        .current_dir("/")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("stderr.log")).expect("log file"))
        .spawn()
        .expect("runway run starts");
    let job = fake.enqueue(fake.job_payload(&JobSpec::new("group/project", "svc", &["echo \"as $(id -un)\""])));
    let Some(record) = fake.wait_for_job_state(job, |j| j.final_state.is_some(), WAIT).await else {
        let _ = child.kill();
        panic!(
            "nothing served; stderr:\n{}",
            std::fs::read_to_string(dir.path().join("stderr.log")).unwrap_or_default()
        );
    };
    assert_eq!(record.final_state.as_deref(), Some("success"), "{}", record.trace_text());
    assert!(record.trace_text().contains("as root"), "{}", record.trace_text());
    let metrics = scrape(port, "/metrics").await;
    assert!(metrics.contains("gitlab_runner_concurrent 1"), "metrics on --listen-address: {metrics}");
    // The log went to the system logger, not to standard error.
    let stderr = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap_or_default();
    assert!(!stderr.contains("runway started"), "{stderr}");
    signal(&child, libc::SIGQUIT);
    let status = wait_exit(&mut child).await;
    assert!(status.success(), "exit status {status:?}");
}

/// The unit gitlab-runner (kardianos/service's systemd template) writes for `install --config C
/// --working-directory D --user U`: its lines in order, blank lines and comments left out.
fn gitlab_runners_unit(exec: &str, config: &Path, dir: &Path, user: &str) -> Vec<String> {
    let exec_start = format!(
        "ExecStart={exec} \"run\" \"--config\" \"{}\" \"--working-directory\" \"{}\" \"--service\" \"gitlab-runner\" \"--user\" \"{user}\"",
        config.display(),
        dir.display()
    );
    [
        "[Unit]",
        "Description=GitLab Runner",
        &format!("ConditionFileIsExecutable={exec}"),
        "After=network.target",
        "[Service]",
        "StartLimitInterval=5",
        "StartLimitBurst=10",
        &exec_start,
        "Restart=always",
        "RestartSec=120",
        "EnvironmentFile=-/etc/sysconfig/gitlab-runner",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    .iter()
    .map(|l| l.to_string())
    .collect()
}

/// `runway install` writes gitlab-runner's unit (plus Runway's graceful stop) under a
/// `systemctl --root` tree, systemd-analyze accepts it, its ExecStart line — the argument list
/// gitlab-runner's GetServiceArguments builds on systemd — serves a job from the fake GitLab;
/// `status` and `start` say systemd is not running (it is not booted here), `uninstall` removes
/// the unit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_install_writes_gitlab_runners_unit_whose_exec_start_serves_jobs() {
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(1), trace_update_interval: 1 })
            .await;
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "hi\n")], "init");
    let runner = fake.create_runner("installed");
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).expect("work dir");
    let config = dir.path().join("etc/config.toml");
    std::fs::create_dir_all(config.parent().expect("parent")).expect("config dir");
    std::fs::write(
        &config,
        format!(
            "concurrent = 1\ncheck_interval = 1\n[[runners]]\nname = \"unit\"\nurl = \"{}\"\ntoken = \"{}\"\nexecutor = \"shell\"\nbuilds_dir = \"{}\"\n",
            fake.url(),
            runner.token,
            dir.path().join("builds").display()
        ),
    )
    .expect("write config");
    let user = String::from_utf8(Command::new("id").arg("-un").output().expect("id").stdout).expect("utf-8");
    let user = user.trim();
    let systemctl = format!("systemctl --root={}", root.display());
    let service = |verb: &str, extra: &[&str]| {
        Command::new(RUNWAY)
            .arg(verb)
            .args(extra)
            .env("RUNWAY_SYSTEMD_ROOT", &root)
            .env("RUNWAY_SYSTEMCTL", &systemctl)
            .output()
            .expect("runway runs")
    };
    let work_arg = work.display().to_string();
    let config_arg = config.display().to_string();
    let out = service("install", &["--config", &config_arg, "--working-directory", &work_arg, "--user", user]);
    assert!(out.status.success(), "install: {}", String::from_utf8_lossy(&out.stderr));
    let unit_file = root.join("etc/systemd/system/gitlab-runner.service");
    // The link points at /etc/systemd/system/… as systemd will see it: look at the link itself.
    let wants = root.join("etc/systemd/system/multi-user.target.wants/gitlab-runner.service");
    assert!(std::fs::symlink_metadata(&wants).is_ok(), "not enabled");
    let unit = std::fs::read_to_string(&unit_file).expect("the unit is written");
    let lines: Vec<String> =
        unit.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_string).collect();
    let ours = ["KillSignal=SIGQUIT", "KillMode=mixed", "TimeoutStopSec=7200"];
    let theirs: Vec<String> = lines.iter().filter(|l| !ours.contains(&l.as_str())).cloned().collect();
    assert_eq!(theirs, gitlab_runners_unit(RUNWAY, &config, &work, user), "{unit}");
    let service_section = unit.split("[Service]").nth(1).and_then(|s| s.split("[Install]").next()).expect("sections");
    for line in ours {
        assert!(service_section.lines().any(|l| l == line), "{line} in [Service]: {unit}");
    }
    let verify = Command::new("systemd-analyze").arg("verify").arg(&unit_file).output().expect("systemd-analyze runs");
    let complaints = String::from_utf8_lossy(&verify.stderr).to_string();
    assert!(verify.status.success() && complaints.trim().is_empty(), "systemd-analyze verify: {complaints}\n{unit}");

    let out = service("status", &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("systemd is not running") && stderr.contains("is installed"), "{stderr}");
    let out = service("start", &[]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("systemd is not running"));

    // What systemd would start: ExecStart's words, unquoted.
    let exec_start = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("ExecStart");
    let argv = shell_words::split(exec_start).expect("ExecStart words");
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .current_dir("/")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("runway.log")).expect("log file"))
        .spawn()
        .expect("ExecStart starts");
    wait_started(dir.path()).await;
    let job = fake.enqueue(fake.job_payload(&JobSpec::new("group/project", "unit", &["echo \"in $(pwd)\""])));
    let Some(record) = fake.wait_for_job_state(job, |j| j.final_state.is_some(), WAIT).await else {
        let _ = child.kill();
        panic!("the unit's ExecStart served nothing; log:\n{}", runway_log(dir.path()));
    };
    assert_eq!(record.final_state.as_deref(), Some("success"), "{}", record.trace_text());
    signal(&child, libc::SIGQUIT);
    let status = wait_exit(&mut child).await;
    assert!(status.success(), "exit status {status:?}");

    let out = service("uninstall", &[]);
    assert!(out.status.success(), "uninstall: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!unit_file.exists(), "the unit is removed");
    assert!(std::fs::symlink_metadata(&wants).is_err(), "still enabled");
}

/// Live reload without a signal, as gitlab-runner's 3-second modification-time check: with a
/// job running, a runner appended and `concurrent` raised in the file serve within 5 s; the
/// running job finishes untouched; a broken edit is refused with file:line and the old
/// configuration keeps serving; a later good edit (a new log level) is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_file_edits_apply_without_a_signal_and_a_broken_edit_keeps_the_old_config() {
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(1), trace_update_interval: 1 })
            .await;
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "hi\n")], "init");
    let first = fake.create_runner("first");
    let second = fake.create_runner("second");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.toml");
    let runner_table = |name: &str, token: &str| {
        format!(
            "\n[[runners]]\nname = \"{name}\"\nurl = \"{}\"\ntoken = \"{token}\"\nexecutor = \"shell\"\nbuilds_dir = \"{}\"\n",
            fake.url(),
            dir.path().join("builds").display()
        )
    };
    let one = runner_table("first", &first.token);
    std::fs::write(&config, format!("concurrent = 1\ncheck_interval = 1\n{one}")).expect("write config");
    let mut child = start(&config, dir.path());
    wait_started(dir.path()).await;
    let gate = dir.path().join("gate");
    let waiting = format!("while [ ! -e {} ]; do sleep 0.1; done", gate.display());
    let running = fake.enqueue_for(
        &first.token,
        fake.job_payload(&JobSpec::new("group/project", "held", &["echo waiting", &waiting, "echo released"])),
    );
    if fake.wait_for_job_state(running, |j| j.trace_text().contains("waiting"), WAIT).await.is_none() {
        let _ = child.kill();
        panic!("the first job did not start; log:\n{}", runway_log(dir.path()));
    }
    // The edit: `concurrent` 1 -> 2 and a second runner appended; no signal.
    let two = format!("concurrent = 2\ncheck_interval = 1\n{one}{}", runner_table("second", &second.token));
    std::fs::write(&config, &two).expect("edit config");
    let edited = std::time::Instant::now();
    // Its first job request: answered, or parked in the fake's long poll.
    let polled = || {
        fake.long_polls_waiting(&second.token) > 0
            || fake
                .requests_to("POST", "/api/v4/jobs/request")
                .iter()
                .any(|r| String::from_utf8_lossy(&r.body).contains(&second.token))
    };
    while !polled() {
        assert!(
            edited.elapsed() < Duration::from_secs(5),
            "the appended runner did not poll within 5 s; log:\n{}",
            runway_log(dir.path())
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let served =
        fake.enqueue_for(&second.token, fake.job_payload(&JobSpec::new("group/project", "new", &["echo new"])));
    let record = fake.wait_for_job_state(served, |j| j.final_state.is_some(), WAIT).await.expect("second job ends");
    assert_eq!(record.final_state.as_deref(), Some("success"), "{}", record.trace_text());
    // It ran beside the held job: `concurrent` is 2 now.
    assert!(fake.job(running).expect("held job").final_state.is_none(), "the held job ended early");
    eprintln!("the appended runner served {:?} after the edit", edited.elapsed());
    std::fs::write(&gate, "").expect("open the gate");
    let record = fake.wait_for_job_state(running, |j| j.final_state.is_some(), WAIT).await.expect("held job ends");
    assert_eq!(record.final_state.as_deref(), Some("success"), "{}", record.trace_text());
    assert!(record.trace_text().contains("released"), "{}", record.trace_text());

    // A broken edit (bad TOML on its last line) is refused and named by file:line.
    let broken = format!("{two}\n[[runners]\nname = \"broken\"\n");
    let bad_line = two.lines().count() + 2;
    std::fs::write(&config, &broken).expect("break config");
    let named = format!("config.toml:{bad_line}");
    wait::until("the broken edit is reported", WAIT, || {
        let log = runway_log(dir.path());
        log.contains("config reload failed, keeping the running configuration") && log.contains(&named)
    })
    .await;
    for token in [&first.token, &second.token] {
        let job = fake.enqueue_for(token, fake.job_payload(&JobSpec::new("group/project", "after", &["echo still"])));
        let record =
            fake.wait_for_job_state(job, |j| j.final_state.is_some(), WAIT).await.expect("job after the break");
        assert_eq!(record.final_state.as_deref(), Some("success"), "{}", record.trace_text());
    }
    // A later good edit is taken: the log level changes with it.
    std::fs::write(&config, format!("log_level = \"debug\"\n{two}")).expect("fix config");
    wait::until("the fixed config is taken", WAIT, || runway_log(dir.path()).contains("log level changed")).await;
    signal(&child, libc::SIGQUIT);
    let status = wait_exit(&mut child).await;
    assert!(status.success(), "exit status {status:?}; log:\n{}", runway_log(dir.path()));
    assert!(!runway_log(dir.path()).contains("panicked"), "{}", runway_log(dir.path()));
}

/// One case of tests/fixtures/register: gitlab-runner's flags and variables for `register`,
/// and the config.toml gitlab-runner writes for them (derivation named in each fixture).
struct RegisterCase {
    name: String,
    fixture: toml::Table,
}

fn register_cases() -> Vec<RegisterCase> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/register");
    let mut paths: Vec<_> = std::fs::read_dir(&dir).expect("fixtures").map(|e| e.expect("entry").path()).collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| RegisterCase {
            name: path.file_name().expect("name").to_string_lossy().into_owned(),
            fixture: std::fs::read_to_string(&path).expect("read").parse().expect("fixture is TOML"),
        })
        .collect()
}

/// `register` with gitlab-runner's flags and environment variables writes the config.toml
/// gitlab-runner writes for the same input, compared as TOML values (token_obtained_at is
/// "now", checked to be a datetime).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_writes_the_config_gitlab_runner_writes() {
    let fake = FakeGitLab::start().await;
    let cases = register_cases();
    assert!(cases.len() >= 4, "fixtures missing");
    // One directory for all cases: the compiled-plugin cache beside the configs is shared.
    let dir = tempfile::tempdir().expect("tempdir");
    for case in cases {
        let config = dir.path().join(&case.name);
        let glrt = case.fixture["token"].as_str() == Some("glrt");
        let created = glrt.then(|| fake.create_runner(&case.name));
        let template = dir.path().join(format!("{}.template", case.name));
        if let Some(text) = case.fixture.get("template").and_then(toml::Value::as_str) {
            std::fs::write(&template, text).expect("template");
        }
        let fill = |text: &str| {
            text.replace("{url}", &fake.url())
                .replace("{registration_token}", fake_gitlab::REGISTRATION_TOKEN)
                .replace("{template}", &template.display().to_string())
                .replace("{token}", created.as_ref().map(|c| c.token.as_str()).unwrap_or("{token}"))
        };
        let args: Vec<String> =
            case.fixture["args"].as_array().expect("args").iter().map(|a| fill(a.as_str().expect("arg"))).collect();
        // Only the fixture's variables (and what finds programs and the shared plugin cache):
        // a CI_SERVER_URL or DOCKER_IMAGE of the test's own environment must not leak in.
        let mut command = Command::new(RUNWAY);
        command.arg("-c").arg(&config).args(&args).env_clear().current_dir(dir.path()).stdin(Stdio::null());
        for keep in ["PATH", "HOME", "RUNWAY_PLUGIN_CACHE_DIR"] {
            if let Some(value) = std::env::var_os(keep) {
                command.env(keep, value);
            }
        }
        for (key, value) in case.fixture.get("env").and_then(toml::Value::as_table).into_iter().flatten() {
            command.env(key, fill(value.as_str().expect("env value")));
        }
        let out = command.output().expect("runway runs");
        assert!(out.status.success(), "{}: {}", case.name, String::from_utf8_lossy(&out.stderr));
        let (id, token) = match &created {
            Some(c) => (c.id, c.token.clone()),
            None => {
                let name = case.fixture["env"]["RUNNER_NAME"].as_str().expect("legacy cases name the runner");
                let record = fake.runners().into_iter().find(|r| r.description == name).expect("registered at GitLab");
                assert_eq!(record.origin, "legacy-registration");
                (record.id, record.token)
            }
        };
        let expected = fill(case.fixture["expected"]["config"].as_str().expect("expected config"))
            .replace("{id}", &id.to_string())
            .replace("{token}", &token);
        let expected: toml::Table = expected.parse().expect("expected config is TOML");
        let mut written: toml::Table = std::fs::read_to_string(&config).expect("written").parse().expect("TOML");
        let entry = written["runners"][0].as_table().expect("entry").clone();
        assert!(
            matches!(entry.get("token_obtained_at"), Some(toml::Value::Datetime(_))),
            "{}: token_obtained_at {:?}",
            case.name,
            entry.get("token_obtained_at")
        );
        if let Some(toml::Value::Array(runners)) = written.get_mut("runners") {
            if let Some(toml::Value::Table(entry)) = runners.first_mut() {
                entry.remove("token_obtained_at");
            }
        }
        assert_eq!(written, expected, "{}:\n{}", case.name, std::fs::read_to_string(&config).expect("written"));
        // Runway runs the file it wrote.
        let list = runway(&config, &["list"]);
        assert!(list.status.success(), "{}: {}", case.name, String::from_utf8_lossy(&list.stderr));
    }
}

/// `reset-token --pat` (gitlab-runner's): a user's access token resets a runner's token by the
/// runner's `id` — the way back for a runner whose own token is lost or expired — and the new
/// token is written in place; a token GitLab does not accept changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_token_with_a_personal_access_token_writes_the_new_token() {
    let fake = FakeGitLab::start().await;
    let runner = fake.create_runner("pat");
    fake.add_api_token("glpat-admin");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "concurrent = 1\n\n# kept\n[[runners]]\n  name = \"pat\"\n  url = \"{}\"\n  id = {}\n  token = \"{}\"\n  executor = \"shell\"\n",
            fake.url(),
            runner.id,
            runner.token
        ),
    )
    .expect("write config");

    let out = runway(&config, &["reset-token", "--name", "pat", "--pat", "glpat-wrong"]);
    assert!(!out.status.success(), "an unknown access token is refused");
    assert!(std::fs::read_to_string(&config).expect("config").contains(&runner.token), "nothing changed");

    let out = runway(&config, &["reset-token", "--name", "pat", "--pat", "glpat-admin"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&config).expect("config");
    assert!(text.contains("# kept") && !text.contains(&runner.token), "{text}");
    let table: toml::Table = text.parse().expect("toml");
    let new = table["runners"][0]["token"].as_str().expect("token");
    assert!(fake.runner(&runner.token).is_none(), "the old token is revoked");
    assert_eq!(fake.runner(new).expect("GitLab knows the new token").id, runner.id);
}

/// `runway-helper` (the helper executable Runway's helper image and fleet instances carry)
/// has the four helper commands with `runway`'s names and flags and nothing of the runner,
/// and is a fraction of `runway`'s code: it links no plugin host.
#[test]
fn the_helper_executable_has_the_helper_commands_alone() {
    let helper = env!("CARGO_BIN_EXE_runway-helper");
    let out = Command::new(helper).arg("--version").output().expect("runway-helper runs");
    assert!(out.status.success(), "{out:?}");
    for command in ["artifacts-uploader", "artifacts-downloader", "cache-archiver", "cache-extractor"] {
        let ours = Command::new(helper).args([command, "--help"]).output().expect("runs");
        let runway = Command::new(RUNWAY).args([command, "--help"]).output().expect("runs");
        assert!(ours.status.success(), "{command}: {ours:?}");
        // The same flags as under `runway` (the usage line names the binary).
        // Each option's long name (help texts are aligned to the longest option).
        let flags = |out: &std::process::Output| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| {
                    l.split_whitespace().find(|w| w.starts_with("--")).map(|w| w.trim_end_matches(',').to_string())
                })
                .collect::<Vec<_>>()
        };
        // `runway`'s global flags (config and logging) are the runner's, not the helper's.
        let global = ["--config", "--log-level", "--debug", "--log-format"];
        let runway: Vec<String> =
            flags(&runway).into_iter().filter(|f| !global.iter().any(|g| f.contains(g))).collect();
        assert_eq!(flags(&ours), runway, "{command}");
    }
    let run = Command::new(helper).arg("run").output().expect("runs");
    assert!(!run.status.success(), "the runner's verbs are not the helper's: {run:?}");
    // A missing cache file is the helper's own error, with gitlab-runner's words, exit 1.
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("cache.zip");
    let out = Command::new(helper)
        .args(["cache-extractor", "--file", missing.to_str().expect("utf-8"), "--timeout", "1"])
        .current_dir(dir.path())
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let expected = Command::new(RUNWAY)
        .args(["cache-extractor", "--file", missing.to_str().expect("utf-8"), "--timeout", "1"])
        .current_dir(dir.path())
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), expected.status.code(), "{text}");
    let size = |path: &str| std::fs::metadata(path).expect("built").len();
    assert!(size(helper) < size(RUNWAY), "runway-helper {} bytes, runway {}", size(helper), size(RUNWAY));
}
