//! The fake's own behaviour, driven with plain HTTP (reqwest) and real git.

use std::time::Duration;

use fake_gitlab::{Config, FakeGitLab, JobSpec, JobStatus};
use serde_json::{json, Value};

async fn start(long_poll: Duration) -> FakeGitLab {
    FakeGitLab::start_with(Config { long_poll, trace_update_interval: 3 }).await
}

fn http() -> reqwest::Client {
    reqwest::Client::new()
}

/// Requests a job as a two-phase runner and accepts it; returns (id, token).
async fn take_and_accept(fake: &FakeGitLab, runner_token: &str) -> (i64, String) {
    let resp = http()
        .post(format!("{}/api/v4/jobs/request", fake.url()))
        .json(&json!({"token": runner_token, "info": {"features": {"two_phase_job_commit": true}}}))
        .send()
        .await
        .expect("job request");
    assert_eq!(resp.status(), 201);
    assert!(resp.headers().get("x-gitlab-last-update").is_none(), "201 carries no X-GitLab-Last-Update");
    let job: Value = resp.json().await.expect("job json");
    let id = job["id"].as_i64().expect("id");
    let token = job["token"].as_str().expect("token").to_string();
    assert_eq!(fake.job(id).expect("job").status, JobStatus::Pending, "two-phase: pending until accepted");
    let resp = http()
        .put(format!("{}/api/v4/jobs/{id}", fake.url()))
        .json(&json!({"token": token, "state": "pending"}))
        .send()
        .await
        .expect("keep-alive");
    assert_eq!(resp.status(), 200);
    let resp = http()
        .put(format!("{}/api/v4/jobs/{id}", fake.url()))
        .json(&json!({"token": token, "state": "running"}))
        .send()
        .await
        .expect("accept");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["job-status"], "running");
    let record = fake.job(id).expect("job");
    assert_eq!((record.status, record.pending_keepalives), (JobStatus::Running, 1));
    (id, token)
}

#[tokio::test]
async fn clones_a_repository_over_smart_http_with_the_job_token() {
    let fake = start(Duration::from_secs(1)).await;
    fake.create_repo("group/project");
    let sha = fake.commit_files("group/project", "main", &[("README.md", "hello\n"), ("src/a.txt", "a\n")], "first");
    let runner = fake.create_runner("r");
    let id_payload = fake.job_payload(&JobSpec::new("group/project", "build", &["cat README.md"]));
    assert_eq!(id_payload["git_info"]["sha"], sha);
    fake.enqueue(id_payload);
    let (id, token) = take_and_accept(&fake, &runner.token).await;
    let payload = fake.job(id).expect("job").payload;
    let repo_url = payload["git_info"]["repo_url"].as_str().expect("repo_url").to_string();
    assert!(repo_url.contains(&token), "repo_url carries the job token");

    let dest = tempfile::tempdir().expect("tempdir");
    let target = dest.path().join("checkout");
    let out = tokio::process::Command::new("git")
        .args(["-c", "credential.helper=", "clone", "--quiet", &repo_url])
        .arg(&target)
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .await
        .expect("run git clone");
    assert!(out.status.success(), "clone failed: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(target.join("README.md")).expect("README"), "hello\n");

    // A wrong token is refused.
    let bad = fake.repo_url("group/project", "glcbt-wrong");
    let out = tokio::process::Command::new("git")
        .args(["-c", "credential.helper=", "ls-remote", &bad])
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .await
        .expect("run git ls-remote");
    assert!(!out.status.success());
    assert!(fake.requests().iter().any(|r| r.path.ends_with("/info/refs") && r.status == 401));
    fake.shutdown().await;
}

#[tokio::test]
async fn lfs_batch_api_answers_downloads_with_the_job_token_as_gitlab_does() {
    let fake = start(Duration::from_secs(1)).await;
    fake.create_repo("group/lfs");
    fake.commit_lfs_files("group/lfs", "main", &[("big.bin", b"large content\n")], "lfs");
    let runner = fake.create_runner("r");
    fake.enqueue(fake.job_payload(&JobSpec::new("group/lfs", "build", &["true"])));
    let (_, token) = take_and_accept(&fake, &runner.token).await;
    let oid = "2a0b8a4c2f4b4c76c8c4f2d4e2e0f6d9c0b7e2e9c1d8ce1e0f5d7a58a3e5f1b2";
    let content = b"large content\n";
    let real_oid: String = {
        use sha2::Digest;
        sha2::Sha256::digest(content).iter().map(|b| format!("{b:02x}")).collect()
    };
    let batch = format!("{}/group/lfs.git/info/lfs/objects/batch", fake.url());
    let body = json!({
        "operation": "download",
        "transfers": ["basic"],
        "objects": [{"oid": real_oid, "size": content.len()}, {"oid": oid, "size": 3}]
    });
    let send = |auth: Option<&str>, body: &Value| {
        let mut req = http()
            .post(&batch)
            .header("Accept", "application/vnd.git-lfs+json")
            .header("Content-Type", "application/vnd.git-lfs+json")
            .json(body);
        if let Some(password) = auth {
            req = req.basic_auth("gitlab-ci-token", Some(password));
        }
        req.send()
    };

    // A private project without credentials: the challenge git-lfs answers with credentials.
    let resp = send(None, &body).await.expect("batch");
    assert_eq!(resp.status(), 401);
    assert_eq!(resp.headers()["www-authenticate"], "Basic realm=\"GitLab\"");

    let resp = send(Some(&token), &body).await.expect("batch");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/vnd.git-lfs+json");
    let answer: Value = resp.json().await.expect("json");
    let objects = answer["objects"].as_array().expect("objects");
    let download = &objects[0]["actions"]["download"];
    assert_eq!(objects[0]["authenticated"], true);
    assert_eq!(download["href"], format!("{}/group/lfs.git/gitlab-lfs/objects/{real_oid}", fake.url()));
    assert!(download["header"]["Authorization"].as_str().is_some_and(|a| a.starts_with("Basic ")));
    assert_eq!(objects[1]["error"]["code"], 404, "an object the project does not have");

    let href = download["href"].as_str().expect("href");
    let auth = download["header"]["Authorization"].as_str().expect("auth");
    let resp = http().get(href).header("Authorization", auth).send().await.expect("download");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.bytes().await.expect("bytes").as_ref(), content);
    assert_eq!(http().get(href).send().await.expect("download").status(), 401, "downloads need the token too");

    // A job token cannot push LFS objects.
    let upload = json!({"operation": "upload", "objects": [{"oid": real_oid, "size": content.len()}]});
    assert_eq!(send(Some(&token), &upload).await.expect("batch").status(), 403);
    fake.shutdown().await;
}

#[tokio::test]
async fn long_poll_blocks_until_a_job_is_enqueued() {
    let fake = start(Duration::from_secs(30)).await;
    let runner = fake.create_runner("r");
    let url = format!("{}/api/v4/jobs/request", fake.url());
    // First request (no last_update): Rails answers at once with the queue value.
    let resp = http().post(&url).json(&json!({"token": runner.token})).send().await.expect("request");
    assert_eq!(resp.status(), 204);
    let version = resp.headers()["x-gitlab-last-update"].to_str().expect("header").to_string();
    assert_eq!(version, fake.queue_version(&runner.token));

    // With last_update equal to the queue value the request blocks...
    let poll = tokio::spawn({
        let (url, token, version) = (url.clone(), runner.token.clone(), version.clone());
        async move { http().post(&url).json(&json!({"token": token, "last_update": version})).send().await }
    });
    assert!(fake.wait_for_long_polls(&runner.token, 1, Duration::from_secs(10)).await, "the request parks");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!poll.is_finished(), "long poll must block while the queue is unchanged");
    assert_eq!(fake.long_polls_waiting(&runner.token), 1);
    // ...until the queue changes: then Workhorse answers 204 without a new value.
    let job_id = fake.enqueue(fake.job_payload(&JobSpec::new("g/p", "j", &["true"])));
    let resp = poll.await.expect("join").expect("response");
    assert_eq!(resp.status(), 204);
    assert_eq!(resp.headers()["gitlab-ci-builds-polling"], "yes");
    assert!(resp.headers().get("x-gitlab-last-update").is_none());
    assert_eq!(fake.long_polls_waiting(&runner.token), 0, "no longer parked once answered");

    // Re-polling with the old value reaches "Rails", which hands out the job.
    let resp =
        http().post(&url).json(&json!({"token": runner.token, "last_update": version})).send().await.expect("request");
    assert_eq!(resp.status(), 201);
    let job: Value = resp.json().await.expect("json");
    assert_eq!(job["id"], job_id);
    assert_eq!(fake.job(job_id).expect("job").status, JobStatus::Running, "not two-phase: running at once");

    // Unknown runner token.
    let resp = http().post(&url).json(&json!({"token": "nope"})).send().await.expect("request");
    assert_eq!(resp.status(), 403);
}

#[tokio::test]
async fn long_poll_times_out_with_204() {
    let fake = start(Duration::from_millis(200)).await;
    let runner = fake.create_runner("r");
    let version = fake.queue_version(&runner.token);
    let resp = http()
        .post(format!("{}/api/v4/jobs/request", fake.url()))
        .json(&json!({"token": runner.token, "last_update": version}))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 204);
    assert_eq!(fake.queue_version(&runner.token), version);
}

#[tokio::test]
async fn trace_patches_need_contiguous_ranges_and_final_update_checks_the_checksum() {
    let fake = start(Duration::from_secs(1)).await;
    let runner = fake.create_runner("r");
    fake.enqueue(fake.job_payload(&JobSpec::new("g/p", "j", &["true"])));
    let (id, token) = take_and_accept(&fake, &runner.token).await;
    let trace_url = format!("{}/api/v4/jobs/{id}/trace", fake.url());
    let patch = |range: Option<&str>, body: &'static str| {
        let mut req =
            http().patch(&trace_url).header("JOB-TOKEN", &token).header("Content-Type", "text/plain").body(body);
        if let Some(range) = range {
            req = req.header("Content-Range", range);
        }
        req.send()
    };

    let resp = patch(Some("0-5"), "hello\n").await.expect("patch");
    assert_eq!(resp.status(), 202);
    assert_eq!(resp.headers()["range"], "0-6");
    assert_eq!(resp.headers()["job-status"], "running");
    assert_eq!(resp.headers()["x-gitlab-trace-update-interval"], "3");

    let resp = patch(Some("10-14"), "gap!\n").await.expect("patch");
    assert_eq!(resp.status(), 416, "a gap is refused");
    assert_eq!(resp.headers()["range"], "0-6");
    let resp = patch(Some("2-6"), "llo\n\n").await.expect("patch");
    assert_eq!(resp.status(), 416, "an overlap is refused");
    let resp = patch(None, "x").await.expect("patch");
    assert_eq!(resp.status(), 400, "Content-Range is required");
    let resp = patch(Some("6-11"), "world\n").await.expect("patch");
    assert_eq!(resp.status(), 202);
    assert_eq!(fake.job(id).expect("job").trace_text(), "hello\nworld\n");

    let put = |body: Value| {
        http().put(format!("{}/api/v4/jobs/{id}", fake.url())).header("JOB-TOKEN", &token).json(&body).send()
    };
    let resp =
        put(json!({"token": token, "state": "success", "output": {"checksum": "crc32:00000000", "bytesize": 12}}))
            .await
            .expect("put");
    assert_eq!(resp.status(), 412);
    assert_eq!(fake.job(id).expect("job").status, JobStatus::Running);

    // After a 412 the runner re-uploads from 0.
    let resp = patch(Some("0-11"), "hello\nworld\n").await.expect("patch");
    assert_eq!(resp.status(), 202);
    let record = fake.job(id).expect("job");
    assert_eq!((record.trace_text().as_str(), record.trace_resets), ("hello\nworld\n", 1));

    let checksum = format!("crc32:{:08x}", crc32fast::hash(b"hello\nworld\n"));
    let resp = put(json!({"token": token, "state": "failed", "failure_reason": "script_failure", "exit_code": 2,
        "output": {"checksum": checksum, "bytesize": 12}}))
    .await
    .expect("put");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["job-status"], "failed");
    let record = fake.job(id).expect("job");
    assert_eq!(record.failure_reason.as_deref(), Some("script_failure"));
    assert_eq!(record.exit_code, Some(2));

    // Finished: job-token calls are refused.
    let resp = patch(Some("12-13"), "x\n").await.expect("patch");
    assert_eq!(resp.status(), 403);
}

#[tokio::test]
async fn cancel_reports_canceling_then_the_final_update_cancels() {
    let fake = start(Duration::from_secs(1)).await;
    let runner = fake.create_runner("r");
    fake.enqueue(fake.job_payload(&JobSpec::new("g/p", "j", &["true"])));
    let (id, token) = take_and_accept(&fake, &runner.token).await;
    assert_eq!(fake.cancel(id), Some(JobStatus::Canceling));
    let resp = http()
        .patch(format!("{}/api/v4/jobs/{id}/trace", fake.url()))
        .header("JOB-TOKEN", &token)
        .header("Content-Range", "0-1")
        .body("x\n")
        .send()
        .await
        .expect("patch");
    assert_eq!((resp.status().as_u16(), resp.headers()["job-status"].to_str().expect("ascii")), (202, "canceling"));
    fake.set_final_update_backoff(1);
    let body = json!({"token": token, "state": "failed", "failure_reason": "job_canceled", "output": {"checksum": format!("crc32:{:08x}", crc32fast::hash(b"x\n")), "bytesize": 2}});
    let put = || http().put(format!("{}/api/v4/jobs/{id}", fake.url())).json(&body).send();
    let resp = put().await.expect("put");
    assert_eq!(resp.status(), 202, "first final update backs off");
    assert_eq!(resp.headers()["x-gitlab-trace-update-interval"], "1");
    let resp = put().await.expect("put");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["job-status"], "canceled");
    let record = fake
        .wait_for_job_state(id, |j| j.status == JobStatus::Canceled, Duration::from_secs(5))
        .await
        .expect("canceled");
    assert_eq!(record.failure_reason.as_deref(), Some("unknown_failure"), "job_canceled is not a Rails reason");
}

#[tokio::test]
async fn registration_verify_and_unregister() {
    let fake = start(Duration::from_secs(1)).await;
    let api = |p: &str| format!("{}/api/v4/{p}", fake.url());
    let resp = http().post(api("runners")).json(&json!({"token": "wrong"})).send().await.expect("register");
    assert_eq!(resp.status(), 403);
    let resp = http()
        .post(api("runners"))
        .json(&json!({"token": fake_gitlab::REGISTRATION_TOKEN, "description": "d"}))
        .send()
        .await
        .expect("register");
    assert_eq!(resp.status(), 201);
    let details: Value = resp.json().await.expect("json");
    let token = details["token"].as_str().expect("token").to_string();
    let resp = http()
        .post(api("runners/verify"))
        .header("RUNNER-TOKEN", "other")
        .json(&json!({"token": token}))
        .send()
        .await
        .expect("verify");
    assert_eq!(resp.status(), 400, "RUNNER-TOKEN must match the body token");
    let resp = http()
        .post(api("runners/verify"))
        .json(&json!({"token": token, "system_id": "s_0123456789ab"}))
        .send()
        .await
        .expect("verify");
    assert_eq!(resp.status(), 200);
    assert!(fake.runner(&token).expect("runner").managers.contains("s_0123456789ab"));
    let resp = http().delete(api("runners/managers")).json(&json!({"token": token})).send().await.expect("delete");
    assert_eq!(resp.status(), 400);
    let resp = http()
        .delete(api("runners/managers"))
        .json(&json!({"token": token, "system_id": "s_0123456789ab"}))
        .send()
        .await
        .expect("delete");
    assert_eq!(resp.status(), 204);
    let resp = http().delete(api("runners")).json(&json!({"token": token})).send().await.expect("delete");
    assert_eq!(resp.status(), 204);
    let resp = http().post(api("runners/verify")).json(&json!({"token": token})).send().await.expect("verify");
    assert_eq!(resp.status(), 403);
    fake.set_registration_enabled(false);
    let resp = http()
        .post(api("runners"))
        .json(&json!({"token": fake_gitlab::REGISTRATION_TOKEN}))
        .send()
        .await
        .expect("register");
    assert_eq!(resp.status(), 410);
}

#[tokio::test]
async fn a_job_enqueued_for_one_runner_is_not_handed_to_another() {
    let fake = start(Duration::ZERO).await;
    let (a, b) = (fake.create_runner("a"), fake.create_runner("b"));
    let id = fake.enqueue_for(&b.token, fake.job_payload(&JobSpec::new("g/p", "j", &["true"])));
    let url = format!("{}/api/v4/jobs/request", fake.url());
    let resp = http().post(&url).json(&json!({"token": a.token})).send().await.expect("request");
    assert_eq!(resp.status(), 204);
    let resp = http().post(&url).json(&json!({"token": b.token})).send().await.expect("request");
    assert_eq!(resp.status(), 201);
    assert_eq!(fake.job(id).expect("job").runner_token.as_deref(), Some(b.token.as_str()));
    // A canceled job leaves the queue.
    let gone = fake.enqueue(fake.job_payload(&JobSpec::new("g/p", "j", &["true"])));
    assert_eq!(fake.cancel(gone), Some(JobStatus::Canceled));
    let resp = http().post(&url).json(&json!({"token": a.token})).send().await.expect("request");
    assert_eq!(resp.status(), 204);
}
