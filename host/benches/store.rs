//! What the job store costs a running job: one `save` of a realistic entry (a 20 KiB body:
//! payload, trace position, executor state), as at every stage boundary and every heartbeat,
//! and one `append_trace` of 4 KiB of new log, for the file store (atomic write with two
//! fsyncs; append with one) and for Redis (a Lua compare-and-set on a `redis-server` on
//! loopback, no persistence). Sealing alone is measured for scale.

// criterion_group! generates undocumented public functions.
#![allow(missing_docs)]

#[path = "../../tests/support/redis_server.rs"]
mod redis_server;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use runway::store::jobs::file::FileStore;
use runway::store::jobs::redis::RedisStore;
use runway::store::jobs::seal::StoreKey;
use runway::store::jobs::{Entry, EntryMeta, JobStore};

const BODY: usize = 20 * 1024;
const TRACE_CHUNK: usize = 4 * 1024;

fn entry() -> Entry {
    Entry {
        meta: EntryMeta {
            job_id: 4711,
            owner: "s_0123456789ab".into(),
            created: 1_700_000_000,
            heartbeat: 0,
            resumes: 0,
            stage: "build_script".into(),
            project: "group/project".into(),
        },
        // JSON-like text compresses nothing away: the sealed body is as large as this.
        body: (0..BODY).map(|i| b"{\"key\":\"value\",}"[i % 16]).collect(),
    }
}

fn redis_available() -> bool {
    std::process::Command::new("redis-server").arg("--version").output().is_ok_and(|o| o.status.success())
}

fn bench_store(c: &mut Criterion, rt: &tokio::runtime::Runtime, name: &str, store: Arc<dyn JobStore>) {
    let entry = entry();
    let mut group = c.benchmark_group(format!("job store: {name}"));
    group.throughput(Throughput::Bytes(BODY as u64));
    group.bench_function("save, 20 KiB body", |b| {
        b.to_async(rt).iter(|| async { store.save(&entry).await.expect("save") })
    });
    let chunk = vec![b'x'; TRACE_CHUNK];
    let offset = AtomicU64::new(0);
    group.throughput(Throughput::Bytes(TRACE_CHUNK as u64));
    group.bench_function("append_trace, 4 KiB", |b| {
        b.to_async(rt).iter(|| async {
            let at = offset.fetch_add(TRACE_CHUNK as u64, Ordering::Relaxed);
            store.append_trace(entry.meta.job_id, at, &chunk).await.expect("append")
        })
    });
    group.finish();
    rt.block_on(store.remove(entry.meta.job_id)).expect("remove");
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let key = StoreKey::from_bytes([9; 32]);

    let plain = entry().body;
    let mut group = c.benchmark_group("job store: sealing");
    group.throughput(Throughput::Bytes(BODY as u64));
    group.bench_function("seal 20 KiB (XChaCha20-Poly1305)", |b| b.iter(|| key.seal(4711, &plain)));
    group.finish();

    let dir = tempfile::tempdir().expect("tempdir");
    let file = FileStore::open(&dir.path().join("store"), key.clone()).expect("file store");
    bench_store(c, &rt, "file", Arc::new(file));

    if redis_available() {
        let server = redis_server::RedisServer::start();
        let redis = rt.block_on(RedisStore::open(&server.url(), "bench", key)).expect("redis store");
        bench_store(c, &rt, "redis", Arc::new(redis));
    } else {
        eprintln!("redis-server is not installed: the Redis store is not measured");
    }
}

criterion_group!(store, benches);
criterion_main!(store);
