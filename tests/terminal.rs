//! GitLab's web terminal end to end: `runway run` as a real process with `[session_server]`
//! against the fake GitLab, and this test playing GitLab Workhorse. It reads the session
//! (`url`, `certificate`, `authorization`) from the job request the fake GitLab received,
//! trusts the sent certificate, connects over TLS with the authorization and the
//! `terminal.gitlab.com` subprotocol, types into a shell job's terminal and reads what it
//! prints; a resize changes `stty size`; a wrong token gets 401; a finished job's session
//! 404; a connected terminal holds the job after its script until it disconnects (or
//! `session_timeout` closes it) and the trace says which; a cancelled job closes its terminal.

#[path = "support/browser.rs"]
mod browser;
#[path = "support/runway_process.rs"]
mod runway_process;
#[path = "support/workhorse.rs"]
mod workhorse;

use std::time::Duration;

use fake_gitlab::{FakeGitLab, JobRecord, JobSpec, JobStatus};
use futures::SinkExt;
use runway_process::RunwayProcess;
use serde_json::json;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use workhorse::{closed_by_server, status_of, type_and_read, Session, Ws};

const WAIT: Duration = Duration::from_secs(120);
/// `session_timeout` of the runner under test, seconds.
const SESSION_TIMEOUT: u64 = 10;

struct Harness {
    fake: FakeGitLab,
    root: tempfile::TempDir,
    process: RunwayProcess,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

impl Harness {
    async fn start() -> Harness {
        let fake =
            FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(1), trace_update_interval: 1 })
                .await;
        let runner = fake.create_runner("terminal");
        fake.create_repo("group/project");
        fake.commit_files("group/project", "main", &[("README.md", "hi\n")], "init");
        let root = tempfile::tempdir().expect("tempdir");
        let config = format!(
            r#"concurrent = 2
check_interval = 1
shutdown_timeout = 5

[session_server]
  listen_address = "127.0.0.1:{port}"
  session_timeout = {SESSION_TIMEOUT}

[plugins.shell]
allow_process = true

[[runners]]
name = "terminal"
url = "{url}"
token = "{token}"
executor = "shell"
builds_dir = "{builds}"
cache_dir = "{cache}"
  [runners.shell]
  login = false
"#,
            port = free_port(),
            url = fake.url(),
            token = runner.token,
            builds = root.path().join("builds").display(),
            cache = root.path().join("cache").display(),
        );
        std::fs::write(root.path().join("config.toml"), config).expect("config.toml");
        let mut process = RunwayProcess::new(root.path().to_path_buf());
        process.start();
        Harness { fake, root, process }
    }

    fn context(&self, id: i64) -> String {
        format!(
            "trace:\n{}\nrunway log:\n{}",
            self.fake.job(id).map(|j| j.trace_text()).unwrap_or_default(),
            self.process.log()
        )
    }

    async fn until(&self, id: i64, what: &str, predicate: impl Fn(&JobRecord) -> bool) -> JobRecord {
        match self.fake.wait_for_job_state(id, predicate, WAIT).await {
            Some(record) => record,
            None => panic!("job {id}: {what} never came; {}", self.context(id)),
        }
    }

    /// Job `id`'s session, once the job was handed out with one.
    async fn session(&self, id: i64) -> Session {
        let record = self.until(id, "a session", |j| j.runner_session.is_some()).await;
        Session::of(&record)
    }

    /// A job that waits in its project directory until a terminal touches `released`.
    fn waiting_job(&self, name: &str) -> i64 {
        let script = "while [ ! -f released ]; do sleep 0.1; done; echo script-over";
        let mut spec = JobSpec::new("group/project", name, &[script]);
        spec.variables.push(("TERMINAL_MARK".into(), "from-the-job".into()));
        self.fake.enqueue(self.fake.job_payload(&spec))
    }
}

/// Connect as Workhorse: TLS trusting only the sent certificate, `Authorization`, the
/// subprotocol.
async fn connect(session: &Session, authorization: &str) -> Result<Ws, WsError> {
    workhorse::connect(session, authorization, "terminal.gitlab.com").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workhorse_types_into_a_shell_jobs_terminal() {
    let h = Harness::start().await;

    // A job held by its terminal until the terminal disconnects.
    let id = h.waiting_job("debug-me");
    let session = h.session(id).await;
    assert!(session.url.starts_with("https://127.0.0.1:"), "{}", session.url);
    // The request that carried it advertised the terminal. The fake logs a request once its
    // response is made, a moment after the job it hands out shows the session.
    let carried = || {
        h.fake
            .requests_to("POST", "/api/v4/jobs/request")
            .iter()
            .filter_map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok())
            .find(|body| body["session"]["authorization"] == session.authorization.as_str())
    };
    let logged = async {
        loop {
            match carried() {
                Some(request) => return request,
                None => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    };
    let request = tokio::time::timeout(WAIT, logged).await.expect("the job request with the session");
    let features = &request["info"]["features"];
    assert_eq!((&features["session"], &features["terminal"]), (&json!(true), &json!(true)), "{features}");
    assert_eq!(status_of(connect(&session, "wrong-token").await), 401, "{}", h.context(id));
    // Once the sources are there, the terminal opens in the job's directory.
    h.until(id, "the script", |j| j.trace_text().contains("Executing \"step_script\"")).await;
    let mut ws = connect(&session, &session.authorization).await.expect("connects");
    // In the job's directory, with its variables.
    type_and_read(&mut ws, "echo \"mark-$((6*7))-$TERMINAL_MARK\"", "mark-42-from-the-job").await;
    let pwd = type_and_read(&mut ws, "echo \"dir=$(pwd)=\"", "=\r\n").await;
    let project_dir = h.root.path().join("builds");
    assert!(pwd.contains(&format!("dir={}", project_dir.display())), "{pwd}");
    // A second terminal is refused while one is connected.
    assert_eq!(status_of(connect(&session, &session.authorization).await), 423);
    // Resize changes what the shell sees.
    ws.send(Message::Text(r#"{"width":101,"height":33}"#.into())).await.expect("resize");
    type_and_read(&mut ws, "stty size", "33 101").await;
    // Let the script end: the job waits for the terminal, and says so. The terminal opens once
    // the job is prepared, before get_sources, whose clean would remove a file made earlier.
    h.until(id, "the script", |j| j.trace_text().contains("Executing \"step_script\"")).await;
    type_and_read(&mut ws, "touch released && echo released-$((1+1))", "released-2").await;
    h.until(id, "the wait for the terminal", |j| j.trace_text().contains("Terminal is connected, will time out in"))
        .await;
    let record = h.fake.job(id).expect("job");
    assert!(record.final_state.is_none(), "the job waits while the terminal is connected");
    assert!(record.trace_text().contains("script-over"), "{}", record.trace_text());
    // Closing the terminal lets it finish.
    ws.close(None).await.expect("closed");
    let record = h.until(id, "the end", |j| j.final_state.is_some()).await;
    assert_eq!(record.final_state.as_deref(), Some("success"), "{}", h.context(id));
    let trace = record.trace_text();
    assert!(trace.contains("Terminal disconnected"), "{trace}");
    assert!(trace.find("Terminal disconnected") < trace.find("Job succeeded"), "{trace}");
    // The finished job's session is gone.
    let gone = async {
        loop {
            match connect(&session, &session.authorization).await {
                Err(WsError::Http(r)) if r.status().as_u16() == 404 => return,
                Err(WsError::Http(_)) | Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                Ok(_) => panic!("a finished job's terminal connected"),
            }
        }
    };
    tokio::time::timeout(WAIT, gone).await.expect("404 for a finished session");

    // An idle terminal: session_timeout closes it and the job finishes.
    let id = h.waiting_job("idle");
    let session = h.session(id).await;
    let mut ws = connect(&session, &session.authorization).await.expect("connects");
    h.until(id, "the script", |j| j.trace_text().contains("Executing \"step_script\"")).await;
    type_and_read(&mut ws, "touch released && echo idle-$((2+2))", "idle-4").await;
    closed_by_server(&mut ws).await;
    let record = h.until(id, "the end", |j| j.final_state.is_some()).await;
    assert_eq!(record.final_state.as_deref(), Some("success"), "{}", h.context(id));
    let trace = record.trace_text();
    let wanted = format!("terminal session timed out (maximum time allowed - {SESSION_TIMEOUT}s)");
    assert!(trace.contains(&format!("will time out in {SESSION_TIMEOUT}s...")), "{trace}");
    assert!(trace.contains(&wanted), "{trace}");

    // A cancelled job closes its terminal.
    let id = h.waiting_job("cancelled");
    let session = h.session(id).await;
    let mut ws = connect(&session, &session.authorization).await.expect("connects");
    type_and_read(&mut ws, "echo live-$((3+3))", "live-6").await;
    h.until(id, "running", |j| j.trace_text().contains("Executing \"step_script\"")).await;
    h.fake.cancel(id).expect("cancelled");
    closed_by_server(&mut ws).await;
    let record = h.until(id, "the cancel", |j| j.status.is_final()).await;
    assert_eq!(record.status, JobStatus::Canceled, "{}", h.context(id));
}

/// A real browser: headless Chromium opens a page with xterm.js (npm `@xterm/xterm`) that a
/// Workhorse-like proxy connects to a running job's terminal, a person's keys type a command
/// into it, and the terminal shows the output. The screenshot is written beside the test's
/// other files (`target/tmp/web-terminal.png`; docs/images/web-terminal.png is one of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_types_into_a_jobs_terminal_through_a_workhorse_like_proxy() {
    let h = Harness::start().await;
    let id = h.waiting_job("in-the-browser");
    let session = h.session(id).await;
    let page = workhorse::serve_page(session.clone()).await;
    let mut browser = browser::Browser::start().await;
    browser.navigate(&page).await;
    browser.until("the page's terminal to connect", WAIT, "window.connected === true").await;
    browser.evaluate("term.focus(); true").await;
    browser.type_text("echo \"typed-$((6*7))-$TERMINAL_MARK\"\r").await;
    browser
        .until("the command's output in the browser", WAIT, "window.screenText().includes('typed-42-from-the-job')")
        .await;
    let png = browser.screenshot().await;
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 2000, "a screenshot of {} bytes", png.len());
    std::fs::write(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-terminal.png"), &png)
        .expect("screenshot written");
    // The job's script ends when the terminal releases it; closing the page's terminal
    // disconnects it, and the job finishes.
    h.until(id, "the script", |j| j.trace_text().contains("Executing \"step_script\"")).await;
    browser.type_text("touch released\r").await;
    h.until(id, "the wait for the terminal", |j| j.trace_text().contains("Terminal is connected, will time out in"))
        .await;
    browser.evaluate("window.socket.close(); true").await;
    let record = h.until(id, "the end", |j| j.final_state.is_some()).await;
    assert_eq!(record.final_state.as_deref(), Some("success"), "{}", h.context(id));
    assert!(record.trace_text().contains("Terminal disconnected"), "{}", record.trace_text());
}
