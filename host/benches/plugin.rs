//! Plugin host costs: instantiate from `InstancePre`, a no-op host→guest call, and the shell
//! plugin running `true` end to end against spawning bash directly.

// criterion_group! generates undocumented public functions.
#![allow(missing_docs)]

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use runway::bindings::executor::exports::runway::executor0_1_0::executor::Job;
use runway::capability::CallContext;
use runway::executor::{ExecutorSession, Stage};
use runway::plugin::{builtin_plugins, HostSettings, PluginHost};
use runway::stop::StopSignal;
use runway::trace::MemorySink;

fn job(dir: &std::path::Path) -> Job {
    Job {
        id: 1,
        name: "bench".into(),
        project_path: "g/p".into(),
        shell: "bash".into(),
        builds_dir: dir.display().to_string(),
        project_dir: dir.display().to_string(),
        cache_dir: dir.display().to_string(),
        config: "{}".into(),
        timeout_seconds: 60,
        image: None,
        services: Vec::new(),
    }
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let host = rt
        .block_on(PluginHost::new(HostSettings { builtins: builtin_plugins(), ..HostSettings::default() }))
        .expect("host");
    let shell = host.executor("shell").expect("shell");
    println!("allocator: {:?}", host.allocator());

    c.bench_function("instantiate shell plugin from InstancePre (fresh store)", |b| {
        b.to_async(&rt).iter(|| async {
            ExecutorSession::start(&host, &shell, CallContext::default()).await.expect("instantiate")
        })
    });

    let mut session = rt.block_on(async {
        let mut s = ExecutorSession::start(&host, &shell, CallContext::default()).await.expect("session");
        s.prepare(&job(dir.path())).await.expect("prepare");
        s
    });
    c.bench_function("no-op host->guest call (environment.state)", |b| {
        // One block_on per batch, so the runtime's entry cost is not counted per call.
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = std::time::Instant::now();
                for _ in 0..iters {
                    std::hint::black_box(session.state().await);
                }
                start.elapsed()
            })
        })
    });

    let sink = Arc::new(MemorySink::default());
    let stage = Stage { name: "step_script".into(), script: "true\n".into(), predefined: false };
    let mut group = c.benchmark_group("run `true`");
    group.sample_size(30);
    group.bench_function("shell plugin end to end (instantiate, prepare, run, cleanup)", |b| {
        b.to_async(&rt).iter(|| async {
            let call = CallContext { trace: Some(sink.clone()), ..CallContext::default() };
            let mut s = ExecutorSession::start(&host, &shell, call).await.expect("session");
            s.prepare(&job(dir.path())).await.expect("prepare");
            s.run(&stage, StopSignal::new()).await.expect("run");
            s.cleanup().await;
        })
    });
    group.bench_function("bash --login directly", |b| {
        b.to_async(&rt).iter(|| async {
            let mut child = tokio::process::Command::new("bash")
                .arg("--login")
                .current_dir(dir.path())
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("bash");
            if let Some(mut stdin) = child.stdin.take() {
                tokio::io::AsyncWriteExt::write_all(&mut stdin, b"true\n").await.expect("stdin");
            }
            child.wait().await.expect("wait")
        })
    });
    group.finish();
}

criterion_group!(plugin, benches);
criterion_main!(plugin);
