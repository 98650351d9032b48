//! The plugin platform end to end: real wasm plugins built from `plugins/` by host/build.rs,
//! loaded from a plugin directory, sandboxed, hot-reloaded, and the shell plugin running real
//! bash.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use runway::capability::CallContext;
use runway::config::grant::PluginGrant;
use runway::executor::{ExecutorFailure, ExecutorSession, Stage};
use runway::plugin::{HostSettings, PluginErrorKind, PluginHost};
use runway::stop::{StopReason, StopSignal};
use runway::trace::MemorySink;

#[path = "support/wait.rs"]
mod wait;
#[path = "support/wit_job.rs"]
mod wit_job;
use wit_job::job;

const GUEST_DIR: &str = env!("RUNWAY_GUEST_DIR");

fn guest(name: &str) -> PathBuf {
    Path::new(GUEST_DIR).join(name)
}

fn install(dir: &Path, wasm: &str, as_name: &str) {
    // Publish atomically, as the docs tell operators to.
    let tmp = dir.join(format!(".{as_name}.tmp"));
    std::fs::copy(guest(wasm), &tmp).expect("copy plugin");
    std::fs::rename(&tmp, dir.join(as_name)).expect("rename plugin");
}

async fn host_with(dir: &Path, grants: BTreeMap<String, PluginGrant>) -> PluginHost {
    PluginHost::new(HostSettings {
        plugins_dir: Some(dir.to_path_buf()),
        cache_dir: Some(dir.join("../cache")),
        state_dir: None,
        grants,
        builtins: runway::plugin::builtin_plugins(),
        helper_image: None,
        stage_output: Default::default(),
    })
    .await
    .expect("plugin host starts")
}

fn stage(name: &str, script: &str) -> Stage {
    Stage { name: name.into(), script: script.into(), predefined: false }
}

/// Run one stage of `plugin` in a fresh session; returns the result and the trace text.
async fn run_stage(
    host: &PluginHost,
    plugin: &str,
    work: &Path,
    name: &str,
    script: &str,
) -> (Result<i32, ExecutorFailure>, String) {
    let sink = Arc::new(MemorySink::default());
    let plugin = host.executor(plugin).expect("plugin loaded");
    let call = CallContext { trace: Some(sink.clone()), ..CallContext::default() };
    let mut session = ExecutorSession::start(host, &plugin, call).await.expect("instantiates");
    session.prepare(&job(work)).await.expect("prepares");
    let result = session.run(&stage(name, script), StopSignal::new()).await;
    session.cleanup().await;
    (result, sink.text())
}

fn plugin_kind(result: &Result<i32, ExecutorFailure>) -> Option<PluginErrorKind> {
    match result {
        Err(ExecutorFailure::Plugin(e)) => Some(e.kind.clone()),
        _ => None,
    }
}

async fn http_server() -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "hello" }));
    let handle = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (port, handle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_plugins_are_contained_while_the_host_keeps_serving() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("plugins");
    std::fs::create_dir_all(&dir).expect("mkdir");
    install(&dir, "test_misbehave.wasm", "misbehave.wasm");
    let (allowed_port, _allowed) = http_server().await;
    let (denied_port, _denied) = http_server().await;
    let grant = PluginGrant {
        memory_mb: 32,
        call_timeout: Duration::from_secs(1),
        allow_hosts: vec![format!("127.0.0.1:{allowed_port}")],
        ..PluginGrant::default()
    };
    let host = host_with(&dir, BTreeMap::from([("misbehave".to_string(), grant)])).await;
    let work = root.path().join("work");
    std::fs::create_dir_all(&work).expect("mkdir");

    // An infinite loop is stopped by the call deadline — while the shell plugin, in the same
    // process, keeps running a job.
    let (looping, shell) = tokio::join!(
        run_stage(&host, "misbehave", &work, "loop", ""),
        run_stage(&host, "shell", &work, "step_script", "for i in 1 2 3; do echo tick $i; sleep 0.2; done")
    );
    assert_eq!(plugin_kind(&looping.0), Some(PluginErrorKind::Timeout), "{:?}", looping.0);
    assert_eq!(shell.0.expect("shell ran"), 0);
    assert_eq!(shell.1, "tick 1\ntick 2\ntick 3\n");

    let (bomb, _) = run_stage(&host, "misbehave", &work, "membomb", "").await;
    assert_eq!(plugin_kind(&bomb), Some(PluginErrorKind::MemoryLimit), "{bomb:?}");

    let (panic, _) = run_stage(&host, "misbehave", &work, "panic", "").await;
    assert_eq!(plugin_kind(&panic), Some(PluginErrorKind::Trap), "{panic:?}");
    let message = match &panic {
        Err(e) => e.to_string(),
        Ok(_) => String::new(),
    };
    assert!(message.contains("plugin `misbehave`") && message.contains("panics on purpose"), "{message}");

    let (ok, text) = run_stage(&host, "misbehave", &work, &format!("http:http://127.0.0.1:{allowed_port}/"), "").await;
    assert_eq!(ok.expect("allowed request"), 0);
    assert_eq!(text, "http status 200\n");
    let (_, text) = run_stage(&host, "misbehave", &work, &format!("http:http://127.0.0.1:{denied_port}/"), "").await;
    assert!(text.starts_with("http error") && text.contains("HttpRequestDenied"), "{text}");

    let secret = root.path().join("secret.txt");
    std::fs::write(&secret, "top secret").expect("write");
    let (_, text) = run_stage(&host, "misbehave", &work, &format!("readfile:{}", secret.display()), "").await;
    assert!(text.starts_with("read error"), "a plugin without a dirs grant read a host file: {text}");

    std::env::set_var("RUNWAY_TEST_HOST_SECRET", "leak");
    let (_, text) = run_stage(&host, "misbehave", &work, "env", "").await;
    assert_eq!(text, "env: []\n", "the host environment leaked into the plugin");

    let (flood, text) = run_stage(&host, "misbehave", &work, "flood:4194304", "").await;
    assert_eq!(flood.expect("flood returns"), 0);
    assert!(
        text.ends_with("TooLarge(1048576)\n") && text.contains("oversized write refused"),
        "{}",
        &text[text.len().saturating_sub(80)..]
    );
    assert_eq!(text.bytes().filter(|b| *b == b'x').count(), 4 * 1024 * 1024);

    // After all of that, the same plugin still serves a normal call.
    let (ok, text) = run_stage(&host, "misbehave", &work, "hello", "").await;
    assert_eq!((ok.expect("still serving"), text.as_str()), (0, "ok hello\n"));
}

/// Wait for the watcher to publish `version` of `name`. The bound is generous: compiling a
/// plugin on a loaded 2-core machine can take seconds, and only the event matters here.
async fn wait_for_version(host: &PluginHost, name: &str, version: &str) {
    for _ in 0..1200 {
        if host.plugins().get(name).map(|p| p.meta.version.as_str()) == Some(version) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{name} never reached version {version}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_reload_swaps_versions_without_disturbing_calls_in_flight() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("plugins");
    std::fs::create_dir_all(&dir).expect("mkdir");
    install(&dir, "test_versioned_v1.wasm", "versioned.wasm");
    let grant = PluginGrant { allow_process: true, ..PluginGrant::default() };
    let mut host = host_with(&dir, BTreeMap::from([("versioned".to_string(), grant)])).await;
    host.watch().expect("watch");
    let work = root.path().join("work");
    std::fs::create_dir_all(&work).expect("mkdir");
    assert_eq!(host.plugins()["versioned"].meta.version, "1.0.0");

    // A v1 call in flight: it says it runs, then waits for a file the test creates after the
    // swap.
    let (started, gate) = (work.join("started"), work.join("gate"));
    let script = format!("touch {}; while [ ! -e {} ]; do sleep 0.05; done", started.display(), gate.display());
    let in_flight = {
        let host = host.clone();
        let work = work.clone();
        tokio::spawn(async move { run_stage(&host, "versioned", &work, "step_script", &script).await })
    };
    wait::until("the v1 call runs its stage", wait::WAIT, || started.exists()).await;

    install(&dir, "test_versioned_v2.wasm", "versioned.wasm");
    wait_for_version(&host, "versioned", "2.0.0").await;
    let (result, text) = run_stage(&host, "versioned", &work, "step_script", "true").await;
    assert_eq!((result.expect("v2 serves"), text.as_str()), (0, "served by 2.0.0\n"));

    std::fs::write(&gate, "").expect("open the gate");
    let (result, text) = in_flight.await.expect("join");
    assert_eq!((result.expect("v1 finishes"), text.as_str()), (0, "served by 1.0.0\n"));

    // A corrupt v3 is rejected; v2 keeps serving.
    std::fs::write(dir.join("versioned.wasm"), b"\0asm\x0d\0\x01\0garbage").expect("write v3");
    let path = dir.join("versioned.wasm");
    let mut rejected = false;
    for _ in 0..100 {
        if host.listing().iter().any(|r| r.source == path.display().to_string() && r.status.contains("rejected")) {
            rejected = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(rejected, "corrupt plugin was not reported: {:?}", host.listing());
    let (result, text) = run_stage(&host, "versioned", &work, "step_script", "true").await;
    assert_eq!((result.expect("v2 still serves"), text.as_str()), (0, "served by 2.0.0\n"));

    // Removing the file stops new calls.
    std::fs::remove_file(&path).expect("remove");
    for _ in 0..100 {
        if host.executor("versioned").is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("removed plugin still served");
}

#[tokio::test]
async fn incompatible_and_ungranted_plugins_are_refused_with_clear_errors() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("plugins");
    std::fs::create_dir_all(&dir).expect("mkdir");
    // Same plugin, but its metadata claims API 0.9.0.
    let bytes = std::fs::read(guest("test_versioned_v1.wasm")).expect("read");
    // The SDK's `API_VERSION` (sdk/src/lib.rs), as its metadata marker spells it.
    let needle = b"api=0.7.0";
    let mut patched = bytes.clone();
    let positions: Vec<usize> =
        bytes.windows(needle.len()).enumerate().filter(|(_, w)| w == needle).map(|(i, _)| i).collect();
    assert!(!positions.is_empty(), "metadata present");
    for pos in positions {
        patched[pos..pos + needle.len()].copy_from_slice(b"api=0.9.0");
    }
    let bad = dir.join("future.wasm");
    std::fs::write(&bad, &patched).expect("write");
    install(&dir, "test_versioned_v1.wasm", "versioned.wasm");
    let host = host_with(&dir, BTreeMap::new()).await;
    let err = host.check_file(&bad).await.expect_err("refused").to_string();
    assert!(err.contains("future.wasm") && err.contains("0.9.0") && err.contains("0.1.x"), "{err}");
    assert!(host.listing().iter().any(|r| r.source.ends_with("future.wasm") && r.status.contains("0.9.0")));

    // No allow_process grant: the call fails with an error that says so.
    let work = root.path().join("work");
    std::fs::create_dir_all(&work).expect("mkdir");
    let (result, _) = run_stage(&host, "versioned", &work, "step_script", "true").await;
    match result {
        Err(ExecutorFailure::Other(m)) => assert!(m.contains("allow_process"), "{m}"),
        other => panic!("expected a grant error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_plugin_runs_bash_in_order_with_exit_codes_and_kills_the_tree_on_cancel() {
    let root = tempfile::tempdir().expect("tempdir");
    let host = host_with(root.path(), BTreeMap::new()).await;
    let work = root.path().join("work");
    std::fs::create_dir_all(&work).expect("mkdir");

    let script = "export GREETING=hello\ncd sub 2>/dev/null || { mkdir sub; cd sub; }\necho \"$GREETING from $(basename \"$PWD\")\"\necho to-stderr >&2\nfor i in 1 2 3; do echo line $i; done\n";
    let (result, text) = run_stage(&host, "shell", &work, "step_script", script).await;
    assert_eq!(result.expect("runs"), 0);
    assert_eq!(text, "hello from sub\nto-stderr\nline 1\nline 2\nline 3\n");

    let (result, _) = run_stage(&host, "shell", &work, "step_script", "echo before; exit 1; echo after").await;
    assert_eq!(result.expect("runs"), 1);
    let (result, _) = run_stage(&host, "shell", &work, "step_script", "kill -9 $$").await;
    assert_eq!(result.expect("runs"), 137);

    // Cancel: a script with a background child and a foreground child; both must die.
    let pids = work.join("pids");
    let script = format!("sleep 300 & echo $! > {p}; sh -c 'echo $$ >> {p}; sleep 300'", p = pids.display());
    let sink = Arc::new(MemorySink::default());
    let plugin = host.executor("shell").expect("shell");
    let call = CallContext { trace: Some(sink.clone()), ..CallContext::default() };
    let mut session = ExecutorSession::start(&host, &plugin, call).await.expect("session");
    session.prepare(&job(&work)).await.expect("prepare");
    let stop = StopSignal::new();
    let stopper = {
        let stop = stop.clone();
        let pids = pids.clone();
        tokio::spawn(async move {
            while std::fs::read_to_string(&pids).map(|s| s.lines().count()).unwrap_or(0) < 2 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            stop.stop(StopReason::Canceled);
        })
    };
    let result = session.run(&stage("step_script", &script), stop).await;
    stopper.await.expect("stopper");
    session.cleanup().await;
    assert!(matches!(result, Err(ExecutorFailure::Canceled)), "{result:?}");
    let pids = std::fs::read_to_string(&pids).expect("pids");
    for pid in pids.lines() {
        let alive = Path::new(&format!("/proc/{}", pid.trim())).exists()
            && !std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).unwrap_or_default().contains(") Z ");
        assert!(!alive, "process {pid} survived the cancel");
    }
}

#[tokio::test]
async fn the_sdk_example_plugin_loads_and_runs() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("plugins");
    std::fs::create_dir_all(&dir).expect("mkdir");
    // Installed as `<name>.wasm`, as docs/plugin-authoring.md says: a name is bound to its file.
    install(&dir, "executor_hello.wasm", "hello.wasm");
    let grant = PluginGrant { allow_process: true, ..PluginGrant::default() };
    let host = host_with(&dir, BTreeMap::from([("hello".to_string(), grant)])).await;
    let work = root.path().join("work");
    let (result, text) = run_stage(&host, "hello", &work, "step_script", "echo from the example; exit 3").await;
    assert_eq!(result.expect("runs"), 3);
    assert_eq!(text, "[hello] step_script\nfrom the example\n");
}

#[tokio::test]
async fn compiled_plugins_are_cached_so_a_restart_does_not_recompile() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("plugins");
    std::fs::create_dir_all(&dir).expect("mkdir");
    install(&dir, "test_versioned_v1.wasm", "versioned.wasm");
    let first = host_with(&dir, BTreeMap::new()).await;
    assert!(!first.plugins()["versioned"].from_cache, "first load compiles");
    drop(first);
    let second = host_with(&dir, BTreeMap::new()).await;
    assert!(second.plugins()["versioned"].from_cache, "restart loads the cached .cwasm");
    drop(second);
    // A cache entry that is not a valid artifact is discarded, not trusted.
    for entry in std::fs::read_dir(root.path().join("cache")).expect("cache dir") {
        let path = entry.expect("entry").path();
        std::fs::write(&path, b"not a cwasm").expect("corrupt cache");
    }
    let third = host_with(&dir, BTreeMap::new()).await;
    assert!(!third.plugins()["versioned"].from_cache, "a corrupt cache entry is recompiled");
}

#[tokio::test]
async fn the_static_fleeting_plugin_serves_an_instance_group_and_survives_a_restart() {
    use runway::plugin::fleeting::{
        ConnectorConfig, FleetingFailure, FleetingGroup, InstanceState, Protocol, ProviderError,
    };
    let root = tempfile::tempdir().expect("tempdir");
    let settings = || HostSettings {
        state_dir: Some(root.path().join("state")),
        builtins: runway::plugin::builtin_plugins(),
        ..HostSettings::default()
    };
    let connector = ConnectorConfig {
        os: "linux".into(),
        arch: "amd64".into(),
        protocol: Protocol::Ssh,
        protocol_port: 22,
        username: "runner".into(),
        password: None,
        key: None,
        use_static_credentials: true,
        keepalive_seconds: 30,
        timeout_seconds: 10,
    };
    let config = r#"{"hosts": ["127.0.0.2", "127.0.0.3", "127.0.0.4"]}"#;
    let host = PluginHost::new(settings()).await.expect("host");
    let (group, info) = FleetingGroup::start(&host, "static", connector.clone(), config).await.expect("init");
    assert_eq!(info.max_size, 3);
    assert_eq!(group.increase(2).await.expect("increase"), 2);
    let running: Vec<String> = group
        .update()
        .await
        .expect("update")
        .into_iter()
        .filter(|i| i.state == InstanceState::Running)
        .map(|i| i.id)
        .collect();
    assert_eq!(running, vec!["127.0.0.2", "127.0.0.3"]);
    assert_eq!(group.decrease(vec!["127.0.0.2".into()]).await.expect("decrease"), vec!["127.0.0.2"]);
    let info = group.connect_info("127.0.0.3").await.expect("connect info");
    assert_eq!((info.external_addr.as_deref(), info.connector.username.as_str()), (Some("127.0.0.3"), "runner"));
    assert!(matches!(group.connect_info("10.9.9.9").await, Err(FleetingFailure::Provider(ProviderError::NotFound(_)))));
    drop(group);
    drop(host);

    // A restarted runner adopts the hosts in service instead of forgetting them.
    let host = PluginHost::new(settings()).await.expect("host again");
    let (group, _) = FleetingGroup::start(&host, "static", connector.clone(), config).await.expect("init again");
    let ids: Vec<String> = group.update().await.expect("update").into_iter().map(|i| i.id).collect();
    assert_eq!(ids, vec!["127.0.0.3"]);
    assert_eq!(group.increase(5).await.expect("the two free hosts"), 2);
    assert!(matches!(group.increase(1).await, Err(FleetingFailure::Provider(ProviderError::Capacity(_)))));
    // A bad plugin_config is refused by init with the reason.
    match FleetingGroup::start(&host, "static", connector, r#"{"hosts": []}"#).await {
        Err(FleetingFailure::Provider(ProviderError::InvalidConfig(m))) => assert!(m.contains("hosts"), "{m}"),
        Err(other) => panic!("unexpected {other}"),
        Ok(_) => panic!("an empty host list was accepted"),
    }
}
