//! Hostile plugins and hostile plugin files (issue 10, security 1–4 and reliability 9): a file
//! claiming another plugin's name, kv and log floods, a granted process reading the runner's
//! environment, plugin files that are FIFOs, devices, `/proc` entries or too large, a flood of
//! stderr and a 50 MB error value. Each test failed against the code before its fix.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use runway::capability::CallContext;
use runway::config::grant::PluginGrant;
use runway::executor::{ExecutorFailure, ExecutorSession, ResolvedExecutor, Stage};
use runway::job::{run_job, JobControl, JobEnvironment, NoHooks};
use runway::plugin::{HostSettings, PluginErrorKind, PluginHost};
use runway::script::ScriptSettings;
use runway::stop::StopSignal;
use runway::trace::format::RunnerIdentity;
use runway::trace::{JobTrace, MemorySink, TraceOptions};

#[path = "support/wit_job.rs"]
mod wit_job;
use wit_job::job;

const GUEST_DIR: &str = env!("RUNWAY_GUEST_DIR");

fn guest(name: &str) -> PathBuf {
    Path::new(GUEST_DIR).join(name)
}

fn install(dir: &Path, wasm: &str, as_name: &str) {
    let tmp = dir.join(format!(".{as_name}.tmp"));
    std::fs::copy(guest(wasm), &tmp).expect("copy plugin");
    std::fs::rename(&tmp, dir.join(as_name)).expect("rename plugin");
}

fn settings(dir: &Path, grants: BTreeMap<String, PluginGrant>) -> HostSettings {
    HostSettings {
        plugins_dir: Some(dir.to_path_buf()),
        cache_dir: Some(dir.join("../cache")),
        state_dir: Some(dir.join("../state")),
        grants,
        builtins: runway::plugin::builtin_plugins(),
        helper_image: None,
        stage_output: Default::default(),
    }
}

async fn host_with(dir: &Path, grants: BTreeMap<String, PluginGrant>) -> PluginHost {
    PluginHost::new(settings(dir, grants)).await.expect("plugin host starts")
}

fn plugins_dir(root: &Path) -> PathBuf {
    let dir = root.join("plugins");
    std::fs::create_dir_all(&dir).expect("mkdir");
    dir
}

/// Run one stage of `plugin` in a fresh session; returns the result and the trace text.
async fn run_stage(host: &PluginHost, plugin: &str, work: &Path, name: &str) -> (Result<i32, ExecutorFailure>, String) {
    let sink = Arc::new(MemorySink::default());
    let plugin = host.executor(plugin).expect("plugin loaded");
    let call = CallContext { trace: Some(sink.clone()), ..CallContext::default() };
    let mut session = ExecutorSession::start(host, &plugin, call).await.expect("instantiates");
    session.prepare(&job(work)).await.expect("prepares");
    let stage = Stage { name: name.into(), script: "true".into(), predefined: false };
    let result = session.run(&stage, StopSignal::new()).await;
    session.cleanup().await;
    (result, sink.text())
}

fn listing_status(host: &PluginHost, file: &Path) -> Option<String> {
    host.listing().into_iter().find(|r| r.source == file.display().to_string()).map(|r| r.status)
}

// ---- 1. Plugin identity ----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_cannot_take_a_built_in_or_another_plugins_name() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = plugins_dir(root.path());
    // Sorts before every other file: alphabetical order used to let it win.
    install(&dir, "test_impostor.wasm", "aaa-impostor.wasm");
    install(&dir, "test_impostor.wasm", "shell.wasm");
    install(&dir, "test_versioned_v2.wasm", "a-versioned.wasm");
    install(&dir, "test_versioned_v1.wasm", "versioned.wasm");
    let host = host_with(&dir, BTreeMap::new()).await;

    // The built-in shell keeps its name, even against a file called shell.wasm: a built-in is
    // replaced only by an explicit `[plugins.shell] file = ...`.
    assert_eq!(host.plugins()["shell"].source.to_string(), "(built in)");
    for file in ["aaa-impostor.wasm", "shell.wasm"] {
        let status = listing_status(&host, &dir.join(file)).unwrap_or_default();
        assert!(status.contains("rejected") && status.contains("\"shell\"") && status.contains("built-in"), "{status}");
    }
    let work = root.path().join("work");
    std::fs::create_dir_all(&work).expect("mkdir");
    let sink = Arc::new(MemorySink::default());
    let shell = host.executor("shell").expect("shell");
    let call = CallContext { trace: Some(sink.clone()), ..CallContext::default() };
    let mut session = ExecutorSession::start(&host, &shell, call).await.expect("session");
    session.prepare(&job(&work)).await.expect("prepare");
    let stage = Stage { name: "step_script".into(), script: "echo real shell".into(), predefined: false };
    assert_eq!(session.run(&stage, StopSignal::new()).await.expect("runs"), 0);
    assert_eq!(sink.text(), "real shell\n");

    // `versioned` comes from versioned.wasm; a-versioned.wasm claims its name and is refused,
    // with a reason naming both the file's claim and the file the name belongs to.
    assert_eq!(host.plugins()["versioned"].meta.version, "1.0.0");
    let status = listing_status(&host, &dir.join("a-versioned.wasm")).unwrap_or_default();
    assert!(
        status.contains("rejected") && status.contains("\"versioned\"") && status.contains("versioned.wasm"),
        "{status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_file_grant_replaces_a_built_in_and_binds_a_name_to_its_file() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = plugins_dir(root.path());
    install(&dir, "test_impostor.wasm", "my-shell.wasm");
    install(&dir, "test_versioned_v1.wasm", "v1.wasm");
    install(&dir, "test_versioned_v2.wasm", "v2.wasm");
    let grants = BTreeMap::from([
        ("shell".to_string(), PluginGrant { file: Some("my-shell.wasm".into()), ..PluginGrant::default() }),
        ("versioned".to_string(), PluginGrant { file: Some("v2.wasm".into()), ..PluginGrant::default() }),
    ]);
    let host = host_with(&dir, grants).await;
    assert_eq!(host.plugins()["shell"].source.to_string(), dir.join("my-shell.wasm").display().to_string());
    assert_eq!(host.plugins()["versioned"].meta.version, "2.0.0");
    let status = listing_status(&host, &dir.join("v1.wasm")).unwrap_or_default();
    assert!(status.contains("rejected") && status.contains("v2.wasm"), "{status}");
    let work = root.path().join("work");
    let (result, text) = run_stage(&host, "shell", &work, "step_script").await;
    assert_eq!((result.expect("runs"), text.as_str()), (0, "impostor ran step_script\n"));
}

// ---- 2. kv quota and log limits --------------------------------------------------------

fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .filter_map(|e| e.ok())
        .map(|e| {
            let meta = e.metadata().expect("metadata");
            if meta.is_dir() {
                dir_bytes(&e.path())
            } else {
                meta.len()
            }
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_has_a_per_plugin_quota_and_takes_256_byte_keys() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = plugins_dir(root.path());
    install(&dir, "test_misbehave.wasm", "misbehave.wasm");
    let host = host_with(&dir, BTreeMap::new()).await;
    let work = root.path().join("work");

    // The WIT contract promises keys of 256 bytes.
    let (result, text) = run_stage(&host, "misbehave", &work, "kvkey:256").await;
    assert_eq!((result.expect("runs"), text.as_str()), (0, "kvkey 256 ok\n"));

    // 64 values of 1 MiB: the default quota stops the plugin long before 64 MiB.
    let (result, text) = run_stage(&host, "misbehave", &work, "kvflood:64:1048576").await;
    assert_eq!(result.expect("runs"), 0);
    assert!(text.contains("QuotaExceeded"), "{text}");
    let used = dir_bytes(&root.path().join("state"));
    assert!(used <= 5 << 20, "kv holds {used} bytes with no grant");

    // Many small keys: the key-count quota stops them.
    let (_, text) = run_stage(&host, "misbehave", &work, "kvflood:5000:1").await;
    assert!(text.contains("QuotaExceeded"), "{text}");
}

/// Everything the runner logs while this test binary runs.
fn captured_log() -> Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let writer = log.clone();
        let make = move || Capture(writer.clone());
        let _ = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(make)
            .try_init();
        log
    })
    .clone()
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_log_lines_are_rate_limited_and_cannot_forge_runner_log_lines() {
    let log = captured_log();
    let root = tempfile::tempdir().expect("tempdir");
    let dir = plugins_dir(root.path());
    install(&dir, "test_misbehave.wasm", "misbehave.wasm");
    let host = host_with(&dir, BTreeMap::new()).await;
    let work = root.path().join("work");
    let started = Instant::now();
    let (result, text) = run_stage(&host, "misbehave", &work, "logflood:20000").await;
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!((result.expect("runs"), text.as_str()), (0, "logged 20000\n"));
    // A dropped-lines report comes at the latest with the plugin's next line.
    let _ = run_stage(&host, "misbehave", &work, "logflood:1").await;

    let text = String::from_utf8_lossy(&log.lock().expect("log")).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert!(!lines.iter().any(|l| l.starts_with("FORGED")), "a plugin forged a runner-log line");
    let flood = lines.iter().filter(|l| l.contains("flood ") && l.contains("misbehave")).count();
    // Default: 20 lines per second with a burst of 100.
    let allowed = 100.0 + 20.0 * (elapsed + 1.0) + 1.0;
    assert!(flood as f64 <= allowed, "{flood} plugin lines in {elapsed:.1}s (allowed {allowed})");
    assert!(flood >= 50, "the burst was not let through: {flood}");
    assert!(
        lines.iter().any(|l| l.contains("misbehave") && l.contains("log lines dropped")),
        "no report of dropped lines"
    );
}

// ---- 3. allow_process and the runner's environment --------------------------------------

#[cfg(target_os = "linux")]
#[test]
fn a_granted_process_cannot_read_the_runners_environment() {
    use std::os::unix::fs::PermissionsExt;
    let project = tempfile::tempdir().expect("tempdir");
    // Stages run detached from the runner (they survive it), so the runner is not the job's
    // parent: its pid comes in as a variable (`$$` of the shell that execs into the runner).
    let probe = r#"echo "runner=$(cat /proc/$RUNNER_PID/comm)"; echo "env-read=$(cat /proc/$RUNNER_PID/environ 2>/dev/null | tr '\0' '\n' | grep -c RUNWAY_PROBE_SECRET)""#;
    let yaml = format!("probe:\n  script:\n    - '{}'\n", probe.replace('\'', "''"));
    std::fs::write(project.path().join(".gitlab-ci.yml"), yaml).expect("write");
    for args in [
        &["init", "-q", "-b", "main"][..],
        &["add", "."],
        &["-c", "user.email=t@e", "-c", "user.name=t", "commit", "-q", "-m", "init"],
    ] {
        std::process::Command::new("git").arg("-C").arg(project.path()).args(args).output().expect("git");
    }
    // As root (CI containers) root's capabilities would read any process's environ anyway:
    // run the runner as an unprivileged user, as the docs tell operators to.
    // SAFETY: getuid has no preconditions.
    let root = unsafe { libc::getuid() } == 0;
    let runner = ["sh", "-c", r#"exec "$0" exec --var "RUNNER_PID=$$" "$@""#, env!("CARGO_BIN_EXE_runway")];
    let mut command = if root {
        std::process::Command::new("chmod").arg("-R").arg("a+rwX").arg(project.path()).status().expect("chmod");
        std::fs::set_permissions(project.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let mut c = std::process::Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"]).args(runner).env("HOME", "/tmp");
        c
    } else {
        let mut c = std::process::Command::new(runner[0]);
        c.args(&runner[1..]);
        c
    };
    let out = command
        .arg("--cwd")
        .arg(project.path())
        .arg("probe")
        .env("RUNWAY_PROBE_SECRET", "hunter2")
        .output()
        .expect("runway exec runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("\nrunner=runway\n"), "the probe did not find the runner:\n{stdout}");
    assert!(stdout.contains("\nenv-read=0\n"), "a job read the runner's environment:\n{stdout}");
}

// ---- 4. Plugin files read bounded ------------------------------------------------------

/// Give a reader blocked on `fifo` its EOF (so a hung read does not outlive the test).
fn unblock(fifo: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(fifo);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_files_that_are_fifos_devices_proc_entries_or_too_large_are_refused_quickly() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = plugins_dir(root.path());
    let fifo = dir.join("fifo.wasm");
    let c_path = std::ffi::CString::new(fifo.display().to_string()).expect("path");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0, "mkfifo");
    std::os::unix::fs::symlink("/dev/zero", dir.join("zero.wasm")).expect("symlink");
    std::os::unix::fs::symlink("/proc/self/pagemap", dir.join("pagemap.wasm")).expect("symlink");
    let big = std::fs::File::create(dir.join("big.wasm")).expect("create");
    big.set_len((64 << 20) + 1).expect("sparse file");
    install(&dir, "test_versioned_v1.wasm", "versioned.wasm");

    // No built-ins: the only compilation is versioned.wasm's, so the bound below is about the
    // reads (a FIFO used to hang, /proc/self/pagemap to read gigabytes), not the compiler.
    let host = tokio::spawn(PluginHost::new(HostSettings { builtins: Vec::new(), ..settings(&dir, BTreeMap::new()) }));
    let host = match tokio::time::timeout(Duration::from_secs(180), host).await {
        Ok(host) => host.expect("join").expect("host starts"),
        Err(_) => {
            unblock(&fifo);
            panic!("scanning plugins_dir hung");
        }
    };
    assert_eq!(host.plugins()["versioned"].meta.version, "1.0.0", "the good plugin still loads");
    for (file, why) in [
        ("fifo.wasm", "not a regular file"),
        ("zero.wasm", "not a regular file"),
        ("pagemap.wasm", "/proc"),
        ("big.wasm", "limit"),
    ] {
        let status = listing_status(&host, &dir.join(file)).unwrap_or_default();
        assert!(status.contains("rejected") && status.contains(why), "{file}: {status:?}");
    }

    // `runway plugins check FILE` reads the same way.
    for (file, why) in [
        (fifo.clone(), "not a regular file"),
        (PathBuf::from("/dev/zero"), "not a regular file"),
        (dir.join("zero.wasm"), "not a regular file"),
        (PathBuf::from("/proc/self/pagemap"), "/proc"),
        (dir.join("pagemap.wasm"), "/proc"),
        (dir.join("big.wasm"), "limit"),
    ] {
        let check = {
            let host = host.clone();
            let file = file.clone();
            tokio::spawn(async move { host.check_file(&file).await.map(|_| ()).map_err(|e| e.to_string()) })
        };
        match tokio::time::timeout(Duration::from_secs(30), check).await {
            Ok(result) => {
                let err = result.expect("join").expect_err("refused");
                assert!(err.contains(why), "{}: {err}", file.display());
            }
            Err(_) => {
                unblock(&fifo);
                panic!("plugins check {} hung", file.display());
            }
        }
    }
}

// ---- 9. Plugin messages and stderr -----------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_stderr_is_a_bounded_stream_that_never_traps_the_plugin() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = plugins_dir(root.path());
    install(&dir, "test_misbehave.wasm", "misbehave.wasm");
    let host = host_with(&dir, BTreeMap::new()).await;
    let work = root.path().join("work");

    let (result, text) = run_stage(&host, "misbehave", &work, "stderr:1048576").await;
    assert_eq!((result.expect("1 MiB of stderr is not a trap"), text.as_str()), (0, "stderr ok\n"));

    let (result, _) = run_stage(&host, "misbehave", &work, "stderrpanic:1048576").await;
    match result {
        Err(ExecutorFailure::Plugin(e)) => {
            assert_eq!(e.kind, PluginErrorKind::Trap);
            assert!(e.message.contains("panics after a flood of stderr"), "{}", &e.message[..e.message.len().min(500)]);
            assert!(e.message.len() <= 8192, "a {}-byte error message", e.message.len());
        }
        other => panic!("expected a trap, got {:?}", other.map_err(|e| e.to_string().len())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_plugin_error_is_truncated_and_never_pushes_out_the_failure_footer() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = plugins_dir(root.path());
    install(&dir, "test_misbehave.wasm", "misbehave.wasm");
    let grant = PluginGrant { memory_mb: 256, ..PluginGrant::default() };
    let host = host_with(&dir, BTreeMap::from([("misbehave".to_string(), grant)])).await;

    // The session's error value, as the executor boundary hands it on.
    let work = root.path().join("work");
    let (result, _) = run_stage(&host, "misbehave", &work, "bigerror:50000000").await;
    let message = result.expect_err("an error value").to_string();
    assert!(message.len() <= 8192, "a {}-byte error message reached the job", message.len());
    assert!(message.contains("truncated"), "{}", &message[message.len().saturating_sub(200)..]);

    // A whole job with a 4 KiB output limit: the footer is still the log's last line.
    let executor = ResolvedExecutor::resolve(&host, "misbehave", "bigerror:50000000").await.expect("resolves");
    let env = JobEnvironment {
        executor,
        settings: ScriptSettings {
            builds_dir: work.join("builds"),
            cache_dir: work.join("cache"),
            shell: "bash".into(),
            ..ScriptSettings::default()
        },
        identity: RunnerIdentity {
            version: "v".into(),
            revision: "r".into(),
            name: "test".into(),
            short_token: "t".into(),
            system_id: "s".into(),
        },
        instance: None,
    };
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/job-response-example.json"))
            .expect("fixture");
    let payload: runway::payload::JobResponse = serde_json::from_str(&text).expect("payload");
    let trace = JobTrace::new(&TraceOptions { output_limit_kib: 4, ..TraceOptions::default() }).expect("trace");
    let outcome = run_job(&payload, &env, Arc::new(trace.clone()), &JobControl::default(), &NoHooks).await;
    trace.finish();
    assert!(!outcome.succeeded());
    assert!(outcome.message.len() <= 8192, "a {}-byte footer message", outcome.message.len());
    let log = String::from_utf8_lossy(&trace.contents()).into_owned();
    assert!(trace.len() <= (4 << 10) + (16 << 10), "{} bytes kept", trace.len());
    let last = log.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.contains("ERROR: Job failed"),
        "the footer was pushed out; the log ends with {:?}",
        &log[log.len().saturating_sub(300)..]
    );
    let _ = std::io::stderr().flush();
}
