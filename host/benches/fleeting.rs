//! The cloud fleeting plugins' cold start: each plugin's size, the plugin host loading it with
//! an empty compile cache (Cranelift compiles it), and loading it again from the compile
//! cache (what a runner restart pays). Each load is a `PluginHost::new` with that one
//! built-in, then its first use (`load_on_first_use`: read, check, compile or load the
//! `.cwasm`, make its `InstancePre`, smoke test, publish).

// criterion_group! generates undocumented public functions.
#![allow(missing_docs)]

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use runway::plugin::{builtin_plugins, HostSettings, PluginHost};

const PROVIDERS: [(&str, &str); 3] =
    [("aws", "fleeting-aws.wasm"), ("googlecompute", "fleeting-gcp.wasm"), ("azure", "fleeting-azure.wasm")];

async fn load(plugin: (&'static str, &'static [u8]), cache: &std::path::Path) -> Duration {
    let start = Instant::now();
    let host = PluginHost::new(HostSettings {
        cache_dir: Some(cache.to_path_buf()),
        builtins: vec![plugin],
        ..HostSettings::default()
    })
    .await
    .expect("host");
    let name = PROVIDERS.iter().find(|(_, file)| *file == plugin.0).map_or("", |(name, _)| *name);
    assert!(host.load_on_first_use(name).await.expect("loads"), "{} was not waiting for its first use", plugin.0);
    start.elapsed()
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let builtins = builtin_plugins();
    let mut group = c.benchmark_group("fleeting plugin cold start");
    group.sample_size(10);
    for (name, file) in PROVIDERS {
        let plugin = *builtins.iter().find(|(f, _)| *f == file).expect("built-in provider");
        println!("{name}: {file} is {} bytes ({:.1} MiB)", plugin.1.len(), plugin.1.len() as f64 / (1 << 20) as f64);
        group.bench_function(format!("{name}: compile (empty cache)"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let cache = tempfile::tempdir().expect("cache");
                    total += rt.block_on(load(plugin, cache.path()));
                }
                total
            })
        });
        let warm = tempfile::tempdir().expect("cache");
        rt.block_on(load(plugin, warm.path()));
        group.bench_function(format!("{name}: from the compile cache"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    total += rt.block_on(load(plugin, warm.path()));
                }
                total
            })
        });
    }
    group.finish();
}

criterion_group!(fleeting, benches);
criterion_main!(fleeting);
