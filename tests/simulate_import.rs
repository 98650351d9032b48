//! `runway simulate import` against the fake GitLab's jobs API: a project's history of 250 jobs
//! (three pages of 100, newest first, with GitLab's pagination headers) becomes a JSONL trace
//! aligned on the Monday of its first week; jobs that never ran are skipped; a wrong token is
//! refused with GitLab's message; the imported trace replays in `runway simulate`, alone and, as
//! each job names the runner that ran it, with two runners on one simulated cloud.

use std::process::Output;

use fake_gitlab::{FakeGitLab, HistoricJob};

const RUNWAY: &str = env!("CARGO_BIN_EXE_runway");

fn stamp(seconds_after_monday: i64) -> String {
    // Wednesday 2026-03-04 is in the week of Monday 2026-03-02.
    let monday = chrono::DateTime::parse_from_rfc3339("2026-03-02T00:00:00Z").expect("date");
    (monday + chrono::Duration::milliseconds(seconds_after_monday * 1000))
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// 250 finished jobs from Wednesday 09:00, one a minute, each queued 5 s and running 100 + i s,
/// plus 3 canceled before they started.
fn history() -> Vec<HistoricJob> {
    let wednesday_9 = 2 * 86_400 + 9 * 3600;
    let mut jobs: Vec<HistoricJob> = (0..250)
        .map(|i| {
            let created = wednesday_9 + i * 60;
            HistoricJob {
                id: 5000 + i,
                pipeline_id: 700 + i / 5,
                status: if i % 10 == 0 { "failed".into() } else { "success".into() },
                created_at: stamp(created),
                started_at: Some(stamp(created + 5)),
                finished_at: Some(stamp(created + 5 + 100 + i)),
                runner: Some(if i % 2 == 0 { "linux" } else { "gpu" }.into()),
            }
        })
        .collect();
    for k in 0..3 {
        jobs.push(HistoricJob {
            id: 6000 + k,
            pipeline_id: 900,
            status: "canceled".into(),
            created_at: stamp(wednesday_9 + 30),
            started_at: None,
            finished_at: None,
            runner: None,
        });
    }
    jobs
}

async fn runway(args: &[&str]) -> Output {
    tokio::process::Command::new(RUNWAY).args(args).output().await.expect("run runway")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_pages_through_the_jobs_api_and_writes_a_trace() {
    let gitlab = FakeGitLab::start().await;
    gitlab.add_api_token("glpat-import");
    gitlab.add_project_history(42, "group/app", history());
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("trace.jsonl");
    let url = gitlab.url();
    let result = runway(&[
        "simulate",
        "import",
        "--url",
        &url,
        "--token",
        "glpat-import",
        "--project",
        "group/app",
        "--out",
        out.to_str().expect("utf-8 path"),
    ])
    .await;
    assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("250 jobs fetched, 250 in the trace"), "{stderr}");

    // Three pages of 100 (the default scope skips the canceled jobs), each with the token.
    let pages: Vec<_> =
        gitlab.requests().into_iter().filter(|r| r.path == "/api/v4/projects/group%2Fapp/jobs").collect();
    assert_eq!(pages.len(), 3, "followed X-Next-Page to the end");
    for (n, page) in pages.iter().enumerate() {
        let query = page.query.clone().unwrap_or_default();
        assert!(query.contains(&format!("page={}", n + 1)) && query.contains("per_page=100"), "{query}");
        assert!(query.contains("scope%5B%5D=success") && query.contains("scope%5B%5D=failed"), "{query}");
        assert_eq!(page.header("private-token"), Some("glpat-import"));
        assert_eq!(page.status, 200);
    }

    let text = std::fs::read_to_string(&out).expect("trace written");
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).expect("JSON line")).collect();
    assert_eq!(lines.len(), 250);
    // Trace time 0 is the Monday of the first job's week: Wednesday 09:00 is 2 days 9 hours in.
    assert_eq!(lines[0]["at"].as_f64(), Some(f64::from(2 * 86_400 + 9 * 3600)));
    assert_eq!(lines[0]["duration"].as_f64(), Some(100.0));
    assert_eq!(lines[0]["pipeline"].as_u64(), Some(700));
    assert_eq!(lines[249]["at"].as_f64(), Some(f64::from(2 * 86_400 + 9 * 3600 + 249 * 60)));
    assert_eq!(lines[249]["duration"].as_f64(), Some(349.0));

    // The imported trace replays.
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "concurrent = 20\n[[runners]]\n[runners.autoscaler]\nmax_instances = 20\n[[runners.autoscaler.policy]]\nidle_count = 1\nidle_time = \"5m\"\n",
    )
    .expect("config");
    let sim = runway(&[
        "simulate",
        "--config",
        config.to_str().expect("utf-8"),
        "--trace",
        out.to_str().expect("utf-8"),
        "--json",
    ])
    .await;
    assert!(sim.status.success(), "{}", String::from_utf8_lossy(&sim.stderr));
    let report: serde_json::Value = serde_json::from_slice(&sim.stdout).expect("JSON report");
    assert_eq!(report["report"]["jobs_total"].as_u64(), Some(250));
    for key in ["p50_wait_s", "p95_wait_s", "p99_wait_s", "instance_hours", "idle_share", "creations_per_job", "cost"] {
        assert!(report["summary"][key].is_number(), "summary.{key}");
    }
    assert!(report["oracle"]["instance_hours"].as_f64().is_some_and(|h| h > 0.0));
    assert!(report.get("runners").is_none(), "one runner: the trace's `runner` is ignored");

    // Each job names the runner that ran it: a config with both runners on one plugin
    // replays them together, each with the jobs it ran, on one simulated cloud.
    assert_eq!(lines[0]["runner"].as_str(), Some("linux"));
    assert_eq!(lines[1]["runner"].as_str(), Some("gpu"));
    let two = dir.path().join("two.toml");
    std::fs::write(
        &two,
        "concurrent = 20\n[[runners]]\nname = \"linux\"\n[runners.autoscaler]\nplugin = \"aws\"\nmax_instances = 10\n[[runners]]\nname = \"gpu\"\n[runners.autoscaler]\nplugin = \"aws\"\nmax_instances = 2\n",
    )
    .expect("config");
    let provider = dir.path().join("spot.toml");
    std::fs::write(
        &provider,
        "seed = 3\ninterruption_rate_per_hour = 0.5\ncreate_rate_per_s = 0.01\ncreate_burst = 2\n",
    )
    .expect("provider");
    let args = ["simulate", "--config", two.to_str().expect("utf-8"), "--trace", out.to_str().expect("utf-8")];
    let sim = runway(&[&args[..], &["--provider", provider.to_str().expect("utf-8"), "--json"]].concat()).await;
    assert!(sim.status.success(), "{}", String::from_utf8_lossy(&sim.stderr));
    let report: serde_json::Value = serde_json::from_slice(&sim.stdout).expect("JSON report");
    let runners = report["runners"].as_array().expect("a report per runner");
    assert_eq!(runners.iter().map(|r| r["name"].as_str().unwrap_or("")).collect::<Vec<_>>(), ["linux", "gpu"]);
    assert_eq!(runners[0]["report"]["jobs_total"].as_u64(), Some(125));
    assert_eq!(runners[1]["report"]["jobs_total"].as_u64(), Some(125));
    assert_eq!(report["report"]["jobs_total"].as_u64(), Some(250));
    assert!(report["report"]["throttled_requests"].as_u64().is_some_and(|n| n > 0), "{}", report["report"]);
    assert!(report["report"]["interruptions"].as_u64().is_some(), "{}", report["report"]);
    let text = runway(&args).await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("== runner linux") && text.contains("== total (2 runners on one cloud)"), "{text}");

    // A wrong token: GitLab's 401, named in the error.
    let denied = runway(&["simulate", "import", "--url", &url, "--token", "nope", "--project", "42"]).await;
    assert!(!denied.status.success());
    let stderr = String::from_utf8_lossy(&denied.stderr);
    assert!(stderr.contains("401") && stderr.contains("Unauthorized"), "{stderr}");
    gitlab.shutdown().await;
}

/// The fake's jobs API itself: GitLab's pagination headers and Link relations, newest first,
/// `scope[]` filtering, numeric ids, 404 for an unknown project.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_jobs_api_paginates_like_gitlab() {
    let gitlab = FakeGitLab::start().await;
    gitlab.add_api_token("glpat-x");
    gitlab.add_project_history(42, "group/app", history());
    let client = reqwest::Client::new();
    let get = |q: &str| {
        client.get(format!("{}/api/v4/projects/42/jobs?{q}", gitlab.url())).header("PRIVATE-TOKEN", "glpat-x").send()
    };
    let first = get("per_page=100").await.expect("GET");
    let h =
        |r: &reqwest::Response, n: &str| r.headers().get(n).and_then(|v| v.to_str().ok()).unwrap_or("?").to_string();
    assert_eq!(first.status(), 200);
    assert_eq!(h(&first, "x-page"), "1");
    assert_eq!(h(&first, "x-per-page"), "100");
    assert_eq!(h(&first, "x-next-page"), "2");
    assert_eq!(h(&first, "x-prev-page"), "");
    assert_eq!(h(&first, "x-total"), "253");
    assert_eq!(h(&first, "x-total-pages"), "3");
    let link = h(&first, "link");
    assert!(link.contains("rel=\"next\"") && link.contains("rel=\"first\"") && link.contains("rel=\"last\""), "{link}");
    let jobs: Vec<serde_json::Value> = first.json().await.expect("JSON");
    assert_eq!(jobs[0]["id"], 6002, "newest first");
    let last = get("per_page=100&page=3").await.expect("GET");
    assert_eq!(h(&last, "x-next-page"), "");
    assert_eq!(h(&last, "x-prev-page"), "2");
    assert_eq!(last.json::<Vec<serde_json::Value>>().await.expect("JSON").len(), 53);
    let canceled = get("scope[]=canceled").await.expect("GET");
    let canceled: Vec<serde_json::Value> = canceled.json().await.expect("JSON");
    assert_eq!(canceled.len(), 3);
    assert!(canceled.iter().all(|j| j["started_at"].is_null() && j["duration"].is_null()));
    let finished = get("per_page=1&scope[]=success").await.expect("GET");
    let job: Vec<serde_json::Value> = finished.json().await.expect("JSON");
    assert_eq!(job[0]["queued_duration"].as_f64(), Some(5.0));
    assert_eq!(job[0]["pipeline"]["project_id"], 42);
    let missing = client
        .get(format!("{}/api/v4/projects/7/jobs", gitlab.url()))
        .header("PRIVATE-TOKEN", "glpat-x")
        .send()
        .await
        .expect("GET");
    assert_eq!(missing.status(), 404);
    gitlab.shutdown().await;
}
