//! Dispatches per second through `runway router` with 50 downstream pollers, against the fake
//! GitLab on loopback, all in one process on this machine's two cores.
//!
//! A dispatch cycle is what a two-phase runner does for a job: `POST /jobs/request` to the
//! router (201), `PUT state=running` (forwarded: GitLab's acceptance) and `PUT state=success`
//! (forwarded). The router asks GitLab for each job (one upstream request per dispatch,
//! `request_concurrency` 8) and keeps its queue in the store. Measured: with no store, with
//! the file store (an fsync'd entry write per transition), with Redis (a `redis-server` on
//! loopback, when installed) and, as the floor, the same 50
//! pollers doing the same three calls straight against the fake GitLab. Ratios matter, not
//! absolute numbers (the fake GitLab shares the cores).

#![allow(missing_docs)]

#[path = "../../tests/support/redis_server.rs"]
mod redis_server;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_gitlab::{FakeGitLab, JobSpec};
use runway::config::router::Policy;
use runway::gitlab::client::{ClientOptions, GitLabClient};
use runway::router::{Downstream, Router, RouterSettings, Upstream};
use runway::store::jobs::file::FileStore;
use runway::store::jobs::redis::RedisStore;
use runway::store::jobs::seal::StoreKey;
use runway::store::jobs::JobStore;
use serde_json::{json, Value};

const POLLERS: usize = 50;
const JOBS: usize = 1500;
const TOKEN: &str = "bench-downstream";

async fn gitlab(jobs: usize) -> (FakeGitLab, String) {
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(2), trace_update_interval: 3 })
            .await;
    let runner = fake.create_runner("bench router");
    let spec = JobSpec::new("group/project", "bench", &["true"]);
    let payload = fake.job_payload(&spec);
    for _ in 0..jobs {
        fake.enqueue(payload.clone());
    }
    (fake, runner.token)
}

async fn router(fake: &FakeGitLab, token: &str, store: Option<Arc<dyn JobStore>>) -> (Router, String) {
    let client = Arc::new(GitLabClient::new(ClientOptions::default()).expect("client"));
    let settings = RouterSettings {
        policy: Policy::Fair,
        long_poll_timeout: Duration::from_secs(5),
        accept_timeout: Duration::from_secs(120),
        lease_timeout: Duration::from_secs(120),
        keepalive_interval: Duration::from_secs(30),
        queue_size: 100,
        upstreams: vec![Upstream { url: fake.url(), token: token.into(), request_concurrency: 8, client }],
        downstreams: vec![Downstream { name: "fleet".into(), token: TOKEN.into(), tags: None, weight: 1 }],
        router_id: "s_benchrouter1".into(),
        store,
        health_interval: Duration::from_secs(5),
        health_timeout: Duration::from_secs(30),
    };
    let router = Router::start(settings).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let app = router.app();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (router, url)
}

/// 50 pollers doing request → running → success at `url` with `token` until `jobs` jobs are
/// done; returns jobs per second.
async fn run_pollers(url: &str, token: &str, jobs: usize) -> f64 {
    let http = reqwest::Client::builder().pool_max_idle_per_host(POLLERS * 2).build().expect("client");
    let done = Arc::new(AtomicU64::new(0));
    let finished = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..POLLERS {
        let (http, url, token, done) = (http.clone(), url.to_string(), token.to_string(), done.clone());
        let finished = finished.clone();
        tasks.push(tokio::spawn(async move {
            let info = json!({ "name": "bench", "features": { "two_phase_job_commit": true } });
            while done.load(Ordering::SeqCst) < jobs as u64 {
                let request = http
                    .post(format!("{url}/api/v4/jobs/request"))
                    .json(&json!({ "token": token, "info": info }))
                    .send()
                    .await;
                let Ok(response) = request else { continue };
                if response.status() != 201 {
                    continue;
                }
                let Ok(job) = response.json::<Value>().await else { continue };
                let id = job["id"].as_i64().unwrap_or_default();
                let job_token = job["token"].as_str().unwrap_or_default().to_string();
                let put = |state: &str| {
                    http.put(format!("{url}/api/v4/jobs/{id}")).header("JOB-TOKEN", &job_token).json(&json!({
                        "token": job_token, "state": state,
                        "output": { "checksum": "crc32:00000000", "bytesize": 0 }
                    }))
                };
                let _ = put("running").send().await;
                let _ = put("success").send().await;
                if done.fetch_add(1, Ordering::SeqCst) + 1 == jobs as u64 {
                    *finished.lock().expect("lock") = Some(Instant::now());
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let end = finished.lock().expect("lock").unwrap_or_else(Instant::now);
    jobs as f64 / end.duration_since(started).as_secs_f64()
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        // Warm the connections and the code paths once.
        let (fake, token) = gitlab(200).await;
        let _ = run_pollers(&fake.url(), &token, 200).await;

        let (fake, token) = gitlab(JOBS + 200).await;
        let direct = run_pollers(&fake.url(), &token, JOBS).await;
        println!("50 pollers straight at the fake GitLab: {direct:.0} jobs/s");

        let (fake, token) = gitlab(JOBS + 200).await;
        let (router_plain, url) = router(&fake, &token, None).await;
        let no_store = run_pollers(&url, TOKEN, JOBS).await;
        router_plain.shutdown();
        println!("through the router, no store: {no_store:.0} dispatches/s ({:.2} of direct)", no_store / direct);

        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn JobStore> =
            Arc::new(FileStore::open(&dir.path().join("store"), StoreKey::from_bytes([7; 32])).expect("store"));
        let (fake, token) = gitlab(JOBS + 200).await;
        let (router_file, url) = router(&fake, &token, Some(store)).await;
        let file = run_pollers(&url, TOKEN, JOBS).await;
        router_file.shutdown();
        println!("through the router, file store: {file:.0} dispatches/s ({:.2} of direct)", file / direct);

        if std::process::Command::new("redis-server").arg("--version").output().is_ok_and(|o| o.status.success()) {
            let redis = redis_server::RedisServer::start();
            let store: Arc<dyn JobStore> = Arc::new(
                RedisStore::open(&redis.url(), "bench", StoreKey::from_bytes([7; 32])).await.expect("redis store"),
            );
            let (fake, token) = gitlab(JOBS + 200).await;
            let (router_redis, url) = router(&fake, &token, Some(store)).await;
            let on_redis = run_pollers(&url, TOKEN, JOBS).await;
            router_redis.shutdown();
            println!(
                "through the router, Redis store: {on_redis:.0} dispatches/s ({:.2} of direct)",
                on_redis / direct
            );
        }
    });
}
