//! Drop-in for gitlab-runner (issue 14 items 3, 6, 10), end to end with the `runway` binary:
//! GitLab behind TLS signed by a test CA — trusted through the system trust store, through
//! `<config dir>/certs/<host>.crt`, or through `register --tls-ca-file` — with jobs cloning
//! over the same TLS; token rotation against the fake GitLab with a short expiry; a revoked
//! token pausing one runner while another keeps running jobs; `log_format = "json"`.

#[path = "support/runway_process.rs"]
mod runway_process;
#[path = "support/test_ca.rs"]
mod test_ca;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use fake_gitlab::{FakeGitLab, JobSpec, JobStatus};
use runway_process::RunwayProcess;
use test_ca::{make_ca, TestCa};
use tokio_rustls::rustls;

const RUNWAY: &str = env!("CARGO_BIN_EXE_runway");
const WAIT: Duration = Duration::from_secs(90);

fn runway(config: &Path, args: &[&str]) -> std::process::Output {
    Command::new(RUNWAY).arg("-c").arg(config).args(args).output().expect("runway runs")
}

fn text(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The test CA in the system trust store (Debian's `update-ca-certificates`) while alive;
/// removed again when dropped, also when the test fails.
struct SystemTrust {
    installed: PathBuf,
}

impl SystemTrust {
    fn install(ca: &Path, name: &str) -> SystemTrust {
        let installed =
            PathBuf::from(format!("/usr/local/share/ca-certificates/runway-test-{name}-{}.crt", std::process::id()));
        std::fs::copy(ca, &installed).expect("copy the CA into /usr/local/share/ca-certificates (tests run as root)");
        let trust = SystemTrust { installed };
        let out = Command::new("update-ca-certificates").output().expect("update-ca-certificates runs");
        assert!(out.status.success(), "{}", text(&out));
        trust
    }
}

impl Drop for SystemTrust {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.installed);
        let _ = Command::new("update-ca-certificates").output();
    }
}

/// TLS in front of the fake GitLab: terminates TLS with the test server certificate and
/// forwards the bytes to the fake's plain HTTP port. Stops when dropped.
struct TlsFront {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl TlsFront {
    async fn start(ca: &TestCa, backend: SocketAddr) -> TlsFront {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(&ca.cert).expect("cert").collect::<Result<_, _>>().expect("certs");
        let key = PrivateKeyDer::from_pem_file(&ca.key).expect("key");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocols")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // A client that does not trust the CA aborts the handshake: nothing to forward.
                    let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                    let Ok(mut plain) = tokio::net::TcpStream::connect(backend).await else { return };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        TlsFront { addr, task }
    }

    fn url(&self) -> String {
        format!("https://{}", self.addr)
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A job payload whose every URL (repository, CI_SERVER_URL, ...) goes through `front`.
fn payload_through(fake: &FakeGitLab, front: &TlsFront, spec: &JobSpec) -> serde_json::Value {
    let text = fake.job_payload(spec).to_string().replace(&fake.url(), &front.url());
    serde_json::from_str(&text).expect("payload")
}

/// After `register`: faster polling and builds in the test directory.
fn tune_for_run(config: &Path, extra_global: &str) {
    let dir = config.parent().expect("dir");
    let text = std::fs::read_to_string(config).expect("config");
    let text = text.replacen("check_interval = 0", &format!("check_interval = 1\n{extra_global}"), 1);
    let text = text.replace(
        "executor = \"shell\"",
        &format!("executor = \"shell\"\nbuilds_dir = \"{}\"", dir.join("builds").display()),
    );
    std::fs::write(config, text).expect("write config");
}

fn repo(fake: &FakeGitLab) {
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "over TLS\n")], "init");
}

async fn run_one_job(fake: &FakeGitLab, front: &TlsFront, dir: &Path, script: &[&str]) -> fake_gitlab::JobRecord {
    let mut process = RunwayProcess::new(dir.to_path_buf());
    process.start();
    let job = fake.enqueue(payload_through(fake, front, &JobSpec::new("group/project", "tls", script)));
    let record = fake.wait_for_job_state(job, |j| j.final_state.is_some(), WAIT).await;
    let Some(record) = record else { panic!("the job did not finish; runway log:\n{}", process.log()) };
    assert_eq!(record.status, JobStatus::Success, "{}\nrunway log:\n{}", record.trace_text(), process.log());
    record
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitlab_behind_a_ca_in_the_system_trust_store() {
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(2), trace_update_interval: 1 })
            .await;
    repo(&fake);
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = make_ca(&dir.path().join("ca"), "system");
    let front = TlsFront::start(&ca, fake.addr()).await;
    let config = dir.path().join("config.toml");
    let runner = fake.create_runner("system trust");
    let register = ["register", "--url", &front.url(), "--token", &runner.token, "--executor", "shell", "-n"];

    // Not trusted yet: the handshake fails and nothing is written.
    let out = runway(&config, &register);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("certificate"), "{}", text(&out));
    assert!(!config.exists());

    let _trust = SystemTrust::install(&ca.ca, "system");
    let out = runway(&config, &register);
    assert!(out.status.success(), "{}", text(&out));
    let out = runway(&config, &["verify"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("is valid"), "{}", text(&out));
    tune_for_run(&config, "");
    // git trusts the same store: no CA file is handed to the job.
    let record =
        run_one_job(&fake, &front, dir.path(), &["cat README.md", "echo \"ca=[${CI_SERVER_TLS_CA_FILE:-}]\""]).await;
    let trace = record.trace_text();
    assert!(trace.contains("over TLS") && trace.contains("ca=[]"), "{trace}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitlab_behind_a_ca_in_the_certs_directory_or_tls_ca_file() {
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(2), trace_update_interval: 1 })
            .await;
    repo(&fake);
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = make_ca(&dir.path().join("ca"), "private");
    let front = TlsFront::start(&ca, fake.addr()).await;

    // --tls-ca-file: trusted for register and verify, and written to the entry.
    let flag_dir = dir.path().join("flag");
    std::fs::create_dir_all(&flag_dir).expect("mkdir");
    let config = flag_dir.join("config.toml");
    let runner = fake.create_runner("tls-ca-file");
    let out = runway(&config, &["register", "--url", &front.url(), "--token", &runner.token, "-n"]);
    assert!(!out.status.success(), "untrusted: {}", text(&out));
    let ca_file = ca.ca.display().to_string();
    let args = ["register", "--url", &front.url(), "--token", &runner.token, "--tls-ca-file", &ca_file, "-n"];
    let out = runway(&config, &args);
    assert!(out.status.success(), "{}", text(&out));
    let written = std::fs::read_to_string(&config).expect("config");
    assert!(written.contains(&format!("tls-ca-file = \"{ca_file}\"")), "{written}");
    let out = runway(&config, &["verify"]);
    assert!(out.status.success(), "{}", text(&out));

    // <config dir>/certs/127.0.0.1.crt: found for register, verify and run; the job gets
    // CI_SERVER_TLS_CA_FILE and git's sslCAInfo, so it clones over the same TLS.
    let certs_dir = dir.path().join("certs-dir");
    std::fs::create_dir_all(certs_dir.join("certs")).expect("mkdir");
    std::fs::copy(&ca.ca, certs_dir.join("certs/127.0.0.1.crt")).expect("copy");
    let config = certs_dir.join("config.toml");
    let runner = fake.create_runner("certs dir");
    let out =
        runway(&config, &["register", "--url", &front.url(), "--token", &runner.token, "--executor", "shell", "-n"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!std::fs::read_to_string(&config).expect("config").contains("tls-ca-file"));
    let out = runway(&config, &["verify"]);
    assert!(out.status.success(), "{}", text(&out));
    tune_for_run(&config, "");
    let record = run_one_job(
        &fake,
        &front,
        &certs_dir,
        &["cat README.md", "grep -c 'BEGIN CERTIFICATE' \"$CI_SERVER_TLS_CA_FILE\"", "git config --get http.sslCAInfo"],
    )
    .await;
    let trace = record.trace_text();
    assert!(trace.contains("over TLS"), "{trace}");
    assert!(trace.contains("\n1\n") || trace.contains("\n1\r\n"), "one CA certificate in the file: {trace}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rotate_before_they_expire_and_config_toml_keeps_its_comments() {
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(2), trace_update_interval: 1 })
            .await;
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "hi\n")], "init");
    // Register first (tokens without expiry); the rotating runner's token lives 30 s, so its
    // rotation is due 22.5 s after it was obtained (gitlab-runner's 75 %).
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.toml");
    let first = fake.create_runner("registered");
    let out =
        runway(&config, &["register", "--url", &fake.url(), "--token", &first.token, "--executor", "shell", "-n"]);
    assert!(out.status.success(), "{}", text(&out));
    fake.set_token_expiry(Some(Duration::from_secs(30)));
    let runner = fake.create_runner("rotating");
    let obtained = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let expires = fake.runner(&runner.token).and_then(|r| r.token_expires_at).expect("expiry");
    let expires = expires.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    // The rotating runner as register writes it, with an administrator's comments, and
    // log_format = "json".
    let registered = std::fs::read_to_string(&config).expect("config");
    let entry = format!(
        "\n# the rotating one, edited by hand\n[[runners]]\n  name = \"rotating\"\n  url = \"{}\"\n  id = {}\n  token = \"{}\" # rotated by runway\n  token_obtained_at = {obtained}\n  token_expires_at = {expires}\n  executor = \"shell\" # the shell executor\n  # keep this comment\n",
        fake.url(),
        runner.id,
        runner.token
    );
    std::fs::write(&config, format!("# fleet, edited by hand\n{registered}{entry}")).expect("write");
    tune_for_run(&config, "log_format = \"json\" # one JSON object a line");
    let before = std::fs::read_to_string(&config).expect("config");

    let mut process = RunwayProcess::new(dir.path().to_path_buf());
    process.start();
    let wait_resets = |n: u32| {
        let fake = &fake;
        async move {
            for _ in 0..(WAIT.as_millis() / 200) {
                if fake.runner_by_id(runner.id).is_some_and(|r| r.resets >= n) {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            false
        }
    };
    assert!(wait_resets(1).await, "no rotation; log:\n{}", process.log());
    assert!(fake.token_revoked(&runner.token));
    // The runner goes on with the new token: a job runs, and the token rotates again.
    let rotated = fake.runner_by_id(runner.id).expect("runner").token;
    let spec = JobSpec::new("group/project", "after rotation", &["echo rotated"]);
    let job = fake.enqueue_for(&rotated, fake.job_payload(&spec));
    let record = fake.wait_for_job_state(job, |j| j.final_state.is_some(), WAIT).await;
    let record = record.unwrap_or_else(|| panic!("job not run; log:\n{}", process.log()));
    assert_eq!(record.status, JobStatus::Success, "{}", record.trace_text());
    assert!(wait_resets(2).await, "no second rotation; log:\n{}", process.log());
    let current = fake.runner_by_id(runner.id).expect("runner");

    // config.toml: the new token written in place, every comment and other key kept.
    let mut after = String::new();
    for _ in 0..50 {
        after = std::fs::read_to_string(&config).expect("config");
        if after.contains(&current.token) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(after.contains(&format!("token = \"{}\"", current.token)), "{after}");
    let strip = |t: &str| {
        t.lines().filter(|l| !l.trim_start().starts_with("token")).map(str::to_string).collect::<Vec<_>>().join("\n")
    };
    assert_eq!(strip(&after), strip(&before));

    // log_format = "json": every line of the log is a JSON object as logrus writes it
    // (gitlab-runner's `msg`, lower-case `level`, `time`); the rotation is one of them.
    let log = process.log();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines.iter().any(|l| l["msg"].as_str().is_some_and(|m| m.contains("token rotated")) && l["level"] == "info"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_pauses_its_runner_while_the_other_keeps_running_jobs() {
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(1), trace_update_interval: 1 })
            .await;
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "hi\n")], "init");
    let revoked = fake.create_runner("revoked");
    let healthy = fake.create_runner("healthy");
    let dir = tempfile::tempdir().expect("tempdir");
    let builds = dir.path().join("builds");
    let entry = |name: &str, token: &str| {
        format!(
            "[[runners]]\nname = \"{name}\"\nurl = \"{}\"\ntoken = \"{token}\"\nexecutor = \"shell\"\nbuilds_dir = \"{}\"\nunhealthy_requests_limit = 1\nunhealthy_interval = \"1h\"\n",
            fake.url(),
            builds.display()
        )
    };
    std::fs::write(
        dir.path().join("config.toml"),
        format!(
            "concurrent = 2\ncheck_interval = 1\n{}{}",
            entry("revoked", &revoked.token),
            entry("healthy", &healthy.token)
        ),
    )
    .expect("config");
    let mut process = RunwayProcess::new(dir.path().to_path_buf());
    process.start();
    assert!(fake.wait_for_long_polls(&revoked.token, 1, WAIT).await, "log:\n{}", process.log());
    fake.revoke_runner_token(&revoked.token);
    let refused = |r: &fake_gitlab::LoggedRequest| {
        r.path == "/api/v4/jobs/request"
            && r.status == 403
            && r.json().is_some_and(|b| b["token"] == revoked.token.as_str())
    };
    fake.wait_for_request(refused, WAIT).await.unwrap_or_else(|| panic!("no 403; log:\n{}", process.log()));
    for name in ["one", "two"] {
        let job = fake.enqueue(fake.job_payload(&JobSpec::new("group/project", name, &["echo served"])));
        let record = fake.wait_for_job_state(job, |j| j.final_state.is_some(), WAIT).await;
        let record = record.unwrap_or_else(|| panic!("job not run; log:\n{}", process.log()));
        assert_eq!(record.status, JobStatus::Success, "{}", record.trace_text());
        assert_eq!(record.runner_token.as_deref(), Some(healthy.token.as_str()));
    }
    // Paused after its one allowed unhealthy answer: no further request with the revoked token.
    let refused_count = fake.requests().iter().filter(|r| refused(r)).count();
    assert_eq!(refused_count, 1, "log:\n{}", process.log());
    let log = process.log();
    assert!(
        log.contains("GitLab refused this runner's token (403 Forbidden): it is invalid, expired or revoked"),
        "{log}"
    );
    assert!(log.contains("pausing this runner for 3600s"), "{log}");
}
