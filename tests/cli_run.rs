//! `runway` as an administrator runs it: register/list/verify/unregister against the fake
//! GitLab, then `runway run` as a real process with its signals, metrics and health.

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
        .replacen("check_interval = 3", "check_interval = 1", 1);
    let text = text.replace(
        "executor = \"shell\"",
        &format!("executor = \"shell\"\nbuilds_dir = \"{}\"", dir.path().join("builds").display()),
    );
    std::fs::write(&config, text).expect("write config");

    // SIGQUIT: the running job finishes, then the process exits 0.
    let mut child = start(&config, dir.path());
    let job = fake.enqueue(fake.job_payload(&JobSpec::new(
        "group/project",
        "graceful",
        &["echo started", "sleep 2", "echo done"],
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
    assert!(
        metrics.contains("gitlab_runner_concurrent{system_id=")
            && metrics.contains("gitlab_runner_jobs{state=\"running\""),
        "{metrics}"
    );
    assert!(metrics.contains("gitlab_runner_api_request_statuses_total{"), "{metrics}");
    let ready = reqwest::get(format!("http://127.0.0.1:{port}/health/ready")).await.expect("ready");
    assert_eq!(ready.status(), 200);
    signal(&child, libc::SIGQUIT);
    let status = wait_exit(&mut child).await;
    assert!(status.success(), "exit status {status:?}");
    let record = fake.job(job).expect("job");
    assert_eq!(
        (record.status, record.final_state.as_deref()),
        (JobStatus::Success, Some("success")),
        "{}",
        record.trace_text()
    );
    assert!(metrics.contains("gitlab_runner_job_duration_seconds_bucket{"), "{metrics}");
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

fn runway_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("runway.log")).unwrap_or_default()
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
