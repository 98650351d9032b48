//! What the job store costs a running job: one `save` of a realistic entry (a 20 KiB body:
//! payload, trace position, executor state), as at every stage boundary and every heartbeat,
//! and one `append_trace` of 4 KiB of new log, for the file store (atomic write with two
//! fsyncs; append with one) and for Redis (a Lua compare-and-set on a `redis-server` on
//! loopback, no persistence). Sealing alone is measured for scale.
//!
//! Then what many jobs at once cost: 16 jobs each reaching a stage boundary at the same
//! moment (`save_with_trace`: 20 KiB entry and 512 bytes of log each; the file store's
//! committer makes them durable together), and the store's whole cost of a trivial job run 16
//! at a time — ten boundaries and the removal, as `runway run` saves a five-stage job —
//! printed as wall time and CPU time (user + system of this process, the committer thread
//! included) per job.

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

fn entry_of(job_id: u64) -> Entry {
    let mut entry = entry();
    entry.meta.job_id = job_id;
    entry
}

/// Jobs reaching a boundary at once.
const AT_ONCE: u64 = 16;
/// Trace bytes each boundary adds.
const BOUNDARY_LOG: usize = 512;

/// 16 jobs save at the same moment.
fn bench_at_once(c: &mut Criterion, rt: &tokio::runtime::Runtime, name: &str, store: &Arc<dyn JobStore>) {
    let log = vec![b'x'; BOUNDARY_LOG];
    let offset = AtomicU64::new(0);
    let entries: Vec<Entry> = (0..AT_ONCE).map(|j| entry_of(9000 + j)).collect();
    let mut group = c.benchmark_group(format!("job store: {name}"));
    group.throughput(Throughput::Elements(AT_ONCE));
    group.bench_function("16 jobs save at once (20 KiB entry + 512 B of log each)", |b| {
        b.to_async(rt).iter(|| async {
            let at = offset.fetch_add(BOUNDARY_LOG as u64, Ordering::Relaxed);
            let saves = entries.iter().map(|e| store.save_with_trace(e, at, &log));
            futures::future::try_join_all(saves).await.expect("saves")
        })
    });
    group.finish();
    for e in &entries {
        rt.block_on(store.remove(e.meta.job_id)).expect("remove");
    }
}

/// User + system CPU time of this process so far, seconds.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF counts every thread of the process.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// The store's whole cost of 200 trivial jobs, 16 at a time: wall and CPU per job.
fn per_job(rt: &tokio::runtime::Runtime, name: &str, store: &Arc<dyn JobStore>) {
    const JOBS: u64 = 200;
    const BOUNDARIES: u64 = 10;
    let log = vec![b'x'; BOUNDARY_LOG];
    let (wall, cpu) = (std::time::Instant::now(), cpu_seconds());
    rt.block_on(async {
        let next = Arc::new(AtomicU64::new(0));
        let workers = (0..AT_ONCE).map(|_| {
            let (store, next, log) = (Arc::clone(store), Arc::clone(&next), log.clone());
            tokio::spawn(async move {
                loop {
                    let job = next.fetch_add(1, Ordering::Relaxed);
                    if job >= JOBS {
                        return;
                    }
                    let entry = entry_of(20_000 + job);
                    for boundary in 0..BOUNDARIES {
                        let at = boundary * BOUNDARY_LOG as u64;
                        store.save_with_trace(&entry, at, &log).await.expect("save");
                    }
                    store.remove(entry.meta.job_id).await.expect("remove");
                }
            })
        });
        for worker in futures::future::join_all(workers).await {
            worker.expect("worker");
        }
    });
    let (wall, cpu) = (wall.elapsed().as_secs_f64(), cpu_seconds() - cpu);
    println!(
        "job store: {name}: {JOBS} trivial jobs, 16 at a time, {BOUNDARIES} boundaries + removal each: {:.2} ms wall, {:.2} ms CPU per job",
        wall * 1e3 / JOBS as f64,
        cpu * 1e3 / JOBS as f64
    );
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
    let file: Arc<dyn JobStore> =
        Arc::new(FileStore::open(&dir.path().join("store"), key.clone()).expect("file store"));
    bench_store(c, &rt, "file", Arc::clone(&file));
    bench_at_once(c, &rt, "file", &file);
    per_job(&rt, "file", &file);

    if redis_available() {
        let server = redis_server::RedisServer::start();
        let redis: Arc<dyn JobStore> =
            Arc::new(rt.block_on(RedisStore::open(&server.url(), "bench", key)).expect("redis store"));
        bench_store(c, &rt, "redis", Arc::clone(&redis));
        bench_at_once(c, &rt, "redis", &redis);
        per_job(&rt, "redis", &redis);
    } else {
        eprintln!("redis-server is not installed: the Redis store is not measured");
    }
}

criterion_group!(store, benches);
criterion_main!(store);
