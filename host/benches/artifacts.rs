//! What an artifact upload costs the job (issue 13's benchmark): 200 MB in 2,000 files (half
//! compressible log-like text, half random bytes, 100 KB each, in 20 directories), generated once
//! into a temp directory, then
//!
//! - (a) Runway: `archive::select` + `archive::write` (zip, default level, parallel) into a temp
//!   file, uploaded as a multipart POST with reqwest ([`upload`]: the one step the lead will swap
//!   for the real GitLab artifacts client);
//! - (b) the baseline: `zip -r -q` + `curl -F file=@…`;
//!
//! both to the same loopback HTTP sink (axum) that reads and drops the body. The ratio (a)/(b)
//! of the mean times is printed at the end; the goal is ≤ 1.2. For scale, the archive alone and
//! extracting it (ours vs `unzip -q`) are measured too. Needs `zip`, `unzip` and `curl` on PATH.

// criterion_group! generates undocumented public functions.
#![allow(missing_docs)]

use std::io::{Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::post;
use criterion::{criterion_group, criterion_main, Criterion};
use futures::StreamExt;
use runway::archive::{self, Format, Level, Selection};

#[path = "support/tree.rs"]
mod tree;
use tree::{generate, FILES};

/// The upload step: `file` as the `file` part of a multipart POST to `url`, streamed.
async fn upload(client: &reqwest::Client, url: &str, mut file: std::fs::File, name: &str) {
    let len = file.metadata().expect("archive metadata").len();
    file.seek(SeekFrom::Start(0)).expect("rewind archive");
    let boundary = "runway-artifacts-boundary-5f1c";
    let head = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n\
         Content-Type: application/zip\r\n\r\n"
    );
    let tail = format!("\r\n--{boundary}--\r\n");
    let body_len = head.len() as u64 + len + tail.len() as u64;
    let file_stream = tokio_util::io::ReaderStream::with_capacity(tokio::fs::File::from_std(file), 256 << 10);
    let stream = futures::stream::once(async move { Ok::<_, std::io::Error>(bytes::Bytes::from(head)) })
        .chain(file_stream)
        .chain(futures::stream::once(async move { Ok(bytes::Bytes::from(tail)) }));
    let resp = client
        .post(url)
        .header("content-type", format!("multipart/form-data; boundary={boundary}"))
        .header("content-length", body_len)
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .expect("upload");
    assert!(resp.status().is_success(), "sink answered {}", resp.status());
}

/// A loopback HTTP server that reads every request body and drops it.
fn start_sink(rt: &tokio::runtime::Runtime) -> String {
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind sink");
    let addr = listener.local_addr().expect("sink address");
    let app = axum::Router::new().route(
        "/upload",
        post(|body: Body| async move {
            let mut stream = body.into_data_stream();
            let mut n = 0usize;
            while let Some(chunk) = stream.next().await {
                n += chunk.map(|c| c.len()).unwrap_or(0);
            }
            (axum::http::StatusCode::CREATED, n.to_string())
        }),
    );
    rt.spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/upload")
}

fn ours(rt: &tokio::runtime::Runtime, client: &reqwest::Client, url: &str, root: &Path) -> u64 {
    let sel = Selection { paths: vec!["data".into()], ..Default::default() };
    let selected = archive::select(root, &sel).expect("select");
    let mut out = tempfile::tempfile().expect("temp archive");
    let written = archive::write(Format::Zip, Level::Default, root, &selected.entries, &mut out).expect("archive");
    rt.block_on(upload(client, url, out, "artifacts.zip"));
    written.bytes_out
}

fn baseline(url: &str, root: &Path, scratch: &Path) -> u64 {
    let zip_path: PathBuf = scratch.join("baseline.zip");
    let _ = std::fs::remove_file(&zip_path);
    let z = Command::new("zip").args(["-r", "-q"]).arg(&zip_path).arg("data").current_dir(root).status().expect("zip");
    assert!(z.success(), "zip failed");
    let form = format!("file=@{}", zip_path.display());
    let c = Command::new("curl").args(["-sS", "-f", "-o", "/dev/null", "-F", &form, url]).status().expect("curl");
    assert!(c.success(), "curl failed");
    std::fs::metadata(&zip_path).map(|m| m.len()).unwrap_or(0)
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let url = start_sink(&rt);
    let client = reqwest::Client::new();
    let data = tempfile::tempdir().expect("data dir");
    let scratch = tempfile::tempdir().expect("scratch dir");
    let total = generate(data.path());
    eprintln!("artifacts: {FILES} files, {} MB", total / 1_000_000);

    let times: Arc<Mutex<[(Duration, u64); 2]>> = Arc::new(Mutex::new([(Duration::ZERO, 0); 2]));
    let sizes = Arc::new(Mutex::new([0u64; 2]));
    let mut group = c.benchmark_group("artifacts_200MB_2000_files");
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(30));
    {
        let (times, sizes) = (times.clone(), sizes.clone());
        group.bench_function("runway_archive_and_upload", |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                let mut size = 0;
                for _ in 0..iters {
                    size = ours(&rt, &client, &url, data.path());
                }
                let took = start.elapsed();
                let mut t = times.lock().expect("times");
                t[0].0 += took;
                t[0].1 += iters;
                sizes.lock().expect("sizes")[0] = size;
                took
            })
        });
    }
    {
        let (times, sizes) = (times.clone(), sizes.clone());
        group.bench_function("zip_r_and_curl", |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                let mut size = 0;
                for _ in 0..iters {
                    size = baseline(&url, data.path(), scratch.path());
                }
                let took = start.elapsed();
                let mut t = times.lock().expect("times");
                t[1].0 += took;
                t[1].1 += iters;
                sizes.lock().expect("sizes")[1] = size;
                took
            })
        });
    }
    // For scale: the archive alone, and extracting it again (as the cache extractor does).
    group.bench_function("runway_archive_only", |b| {
        b.iter(|| {
            let sel = Selection { paths: vec!["data".into()], ..Default::default() };
            let selected = archive::select(data.path(), &sel).expect("select");
            let mut out = tempfile::tempfile().expect("temp archive");
            archive::write(Format::Zip, Level::Default, data.path(), &selected.entries, &mut out).expect("archive")
        })
    });
    let zip_path = scratch.path().join("ours.zip");
    {
        let selected = archive::select(data.path(), &Selection { paths: vec!["data".into()], ..Default::default() })
            .expect("select");
        let mut out = std::fs::File::create(&zip_path).expect("create ours.zip");
        archive::write(Format::Zip, Level::Default, data.path(), &selected.entries, &mut out).expect("archive");
    }
    group.bench_function("runway_extract", |b| {
        b.iter(|| {
            let dest = tempfile::tempdir_in(scratch.path()).expect("extract dir");
            archive::extract_zip(&zip_path, dest.path()).expect("extract")
        })
    });
    group.bench_function("unzip_q", |b| {
        b.iter(|| {
            let dest = tempfile::tempdir_in(scratch.path()).expect("extract dir");
            let ok = Command::new("unzip").arg("-q").arg(&zip_path).arg("-d").arg(dest.path()).status().expect("unzip");
            assert!(ok.success(), "unzip failed");
        })
    });
    group.finish();
    let t = *times.lock().expect("times");
    let s = *sizes.lock().expect("sizes");
    let mean = |(d, n): (Duration, u64)| d.as_secs_f64() / n.max(1) as f64;
    let (a, b) = (mean(t[0]), mean(t[1]));
    println!(
        "artifacts: runway {a:.3} s ({} bytes), zip -r + curl {b:.3} s ({} bytes), ratio runway/baseline = {:.2}",
        s[0],
        s[1],
        a / b
    );
}

criterion_group!(artifacts, benches);
criterion_main!(artifacts);
