//! `gitlab::client` against the fake GitLab: registration, long polling, retries, and the
//! job-token calls' status mapping.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fake_gitlab::{Config, Endpoint as FakeEndpoint, FakeGitLab, InjectedResponse, JobSpec, JobStatus};
use runway::gitlab::api::{JobApi, JobState, JobUpdate, PatchOutcome, RemoteJobStatus, UpdateOutcome};
use runway::gitlab::client::{
    ApiError, ClientOptions, Endpoint, FeaturesInfo, GitLabClient, JobClient, JobSessionInfo, RegisterParams,
    RequestJobResult, RunnerCredentials, VersionInfo,
};
use runway::gitlab::retry::RetryPolicy;

type Seen = Arc<Mutex<Vec<(Endpoint, String, Option<u16>)>>>;

fn client() -> (Arc<GitLabClient>, Seen) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let options = ClientOptions {
        retry: RetryPolicy {
            max_attempts: 5,
            backoff_base: Duration::from_millis(5),
            backoff_max: Duration::from_secs(2),
        },
        hook: Some(Arc::new(move |r: &runway::gitlab::client::RequestRecord<'_>| {
            log.lock().expect("hook log").push((r.endpoint, r.method.to_string(), r.status));
        })),
        ..ClientOptions::default()
    };
    (Arc::new(GitLabClient::new(options).expect("client")), seen)
}

fn info() -> VersionInfo {
    VersionInfo::this_runner(
        "shell",
        "bash",
        FeaturesInfo {
            two_phase_job_commit: true,
            trace_reset: true,
            trace_checksum: true,
            trace_size: true,
            cancelable: true,
            ..Default::default()
        },
    )
}

async fn fake(long_poll: Duration) -> FakeGitLab {
    FakeGitLab::start_with(Config { long_poll, trace_update_interval: 3 }).await
}

fn creds(fake: &FakeGitLab, token: &str) -> RunnerCredentials {
    RunnerCredentials { url: fake.url(), token: token.to_string(), system_id: "s_0123456789ab".into() }
}

#[tokio::test]
async fn register_verify_and_unregister() {
    let fake = fake(Duration::from_secs(1)).await;
    let (client, _) = client();
    let params = RegisterParams {
        description: "ci-1".into(),
        tags: vec!["a".into(), "b".into()],
        run_untagged: false,
        ..Default::default()
    };

    let err = client.register_legacy(&fake.url(), "wrong", &params, &info()).await.expect_err("bad token");
    assert!(matches!(err, ApiError::Forbidden { .. }), "{err}");

    // A legacy `/ci` suffix is stripped.
    let details = client
        .register_legacy(&format!("{}/ci", fake.url()), fake_gitlab::REGISTRATION_TOKEN, &params, &info())
        .await
        .expect("register");
    assert!(details.id > 0 && !details.token.is_empty());
    assert_eq!(details.token_expires_at, None);
    let request = fake.requests_to("POST", "/api/v4/runners").pop().expect("logged");
    let body = request.json().expect("json body");
    assert_eq!((body["tag_list"].as_str(), body["description"].as_str()), (Some("a,b"), Some("ci-1")));
    assert_eq!(request.header("content-type"), Some("application/json"));
    assert_eq!(request.header("accept"), Some("application/json"));
    assert!(request.header("user-agent").is_some_and(|ua| ua.starts_with("runway ")));
    let request_id = request.header("x-request-id").expect("request id");
    assert!(request_id.len() == 32 && request_id.chars().all(|c| c.is_ascii_hexdigit()), "{request_id}");

    let runner = creds(&fake, &details.token);
    let verified = client.verify(&runner, &info()).await.expect("verify");
    assert_eq!((verified.id, verified.token.as_str()), (details.id, details.token.as_str()));
    let request = fake.requests_to("POST", "/api/v4/runners/verify").pop().expect("logged");
    assert_eq!(request.header("runner-token"), Some(details.token.as_str()));
    let body = request.json().expect("json");
    assert_eq!(body["system_id"], "s_0123456789ab");
    assert_eq!(body["info"]["features"].as_object().map(|f| f.len()), Some(31));
    assert_eq!(body["info"]["features"]["two_phase_job_commit"], true);
    assert!(fake.runner(&details.token).expect("runner").managers.contains("s_0123456789ab"));

    client.unregister_manager(&runner).await.expect("unregister manager");
    assert!(fake.runner(&details.token).expect("runner").managers.is_empty());
    client.unregister_runner(&runner).await.expect("unregister runner");
    assert!(fake.runner(&details.token).is_none());
    let err = client.verify(&runner, &info()).await.expect_err("removed");
    assert!(matches!(err, ApiError::Forbidden { .. }), "{err}");

    fake.set_registration_enabled(false);
    let err = client
        .register_legacy(&fake.url(), fake_gitlab::REGISTRATION_TOKEN, &params, &info())
        .await
        .expect_err("disabled");
    assert!(matches!(err, ApiError::RegistrationDisabled), "{err}");
    assert!(matches!(
        client.verify(&RunnerCredentials { url: "ftp://x".into(), ..runner }, &info()).await,
        Err(ApiError::InvalidUrl { .. })
    ));
}

#[tokio::test]
async fn request_job_echoes_last_update_through_the_long_poll() {
    let fake = fake(Duration::from_millis(500)).await;
    let (client, _) = client();
    let runner = fake.create_runner("r");
    let creds = creds(&fake, &runner.token);

    // First request: no last_update, answered at once with the queue value.
    assert!(matches!(client.request_job(&creds, &info()).await, RequestJobResult::NoJob));
    let version = fake.queue_version(&runner.token);
    assert_eq!(client.last_update(&creds).as_deref(), Some(version.as_str()));
    let first = fake.requests_to("POST", "/api/v4/jobs/request").pop().expect("logged").json().expect("json");
    assert!(first.get("last_update").is_none());

    // Second: sends it back, blocks in the long poll, times out with a bare 204 — the server
    // already waited, so the client is told to ask again at once.
    assert!(matches!(client.request_job(&creds, &info()).await, RequestJobResult::PollAgain));
    let second = fake.requests_to("POST", "/api/v4/jobs/request").pop().expect("logged");
    assert_eq!(second.json().expect("json")["last_update"], version.as_str());
    assert!(second.header("runner-token") == Some(runner.token.as_str()));

    // A poll waiting when a job arrives ends with 204; the next one gets the job.
    fake.set_long_poll(Duration::from_secs(30));
    let waiting = tokio::spawn({
        let (client, creds) = (client.clone(), creds.clone());
        async move { client.request_job(&creds, &info()).await }
    });
    // Enqueue only once the request is parked in the long poll, so it is the arrival of the
    // job (not the poll's 30 s timeout, nor an early answer) that ends it.
    assert!(fake.wait_for_long_polls(&runner.token, 1, Duration::from_secs(10)).await, "the request long-polls");
    let job_id = fake.enqueue(fake.job_payload(&JobSpec::new("g/p", "build", &["echo hi"])));
    let ended = tokio::time::timeout(Duration::from_secs(10), waiting).await;
    let ended = ended.expect("the job's arrival ends the long poll well before its 30 s").expect("join");
    assert!(matches!(ended, RequestJobResult::PollAgain), "the woken poll asks again at once: {ended:?}");
    let result = client.request_job(&creds, &info()).await;
    let RequestJobResult::Job(received) = result else { panic!("expected a job, got {result:?}") };
    assert_eq!(received.job.id, job_id);
    assert_eq!(received.job.steps[0].script, vec!["echo hi"]);
    assert!(received.job.features.trace_sections);
    let served: serde_json::Value = serde_json::from_slice(&received.raw).expect("raw is JSON");
    assert_eq!(served, fake.job(job_id).expect("job").payload, "raw bytes are the payload as served");
    assert_eq!(fake.job(job_id).expect("job").status, JobStatus::Pending, "two-phase: pending until accepted");
    // Every job request sent the stored value, never a fresh one.
    for request in fake.requests_to("POST", "/api/v4/jobs/request").iter().skip(1) {
        assert_eq!(request.json().expect("json")["last_update"], version.as_str());
    }

    // Dropping a long poll mid-flight (once the server holds it, unless it answers at once) is
    // clean: the client keeps working.
    let runner_info = info();
    tokio::select! {
        _ = client.request_job(&creds, &runner_info) => {}
        _ = fake.wait_for_long_polls(&runner.token, 1, Duration::from_secs(10)) => {}
    }
    fake.set_long_poll(Duration::from_millis(100));
    // The queue moved on when the job was taken: a 204 with the new value, ask again at once.
    assert!(matches!(client.request_job(&creds, &info()).await, RequestJobResult::PollAgain));
    // Asking with the new value long-polls and times out: again at once, never a hot loop
    // because each such answer took the server's full wait.
    assert!(matches!(client.request_job(&creds, &info()).await, RequestJobResult::PollAgain));
}

/// The web terminal's `session` rides on the job request, and GitLab keeps it with the job it
/// hands out (what Workhorse later reads to reach the runner).
#[tokio::test]
async fn the_job_requests_session_is_kept_with_the_job() {
    let fake = fake(Duration::ZERO).await;
    let (client, _) = client();
    let runner = fake.create_runner("r");
    let creds = creds(&fake, &runner.token);
    let job_id = fake.enqueue(fake.job_payload(&JobSpec::new("g/p", "build", &["echo hi"])));
    let session = JobSessionInfo {
        url: "https://127.0.0.1:8093/session/0123456789abcdef0123456789abcdef".into(),
        certificate: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into(),
        authorization: "fedcba9876543210fedcba9876543210".into(),
    };
    let result = client.request_job_with_session(&creds, &info(), Some(&session)).await;
    assert!(matches!(result, RequestJobResult::Job(_)), "{result:?}");
    let kept = fake.job(job_id).expect("job").runner_session.expect("session kept");
    assert_eq!(
        kept,
        serde_json::json!({"url": session.url, "certificate": session.certificate, "authorization": session.authorization})
    );
    // Without a session server, no `session` at all.
    let other = fake.enqueue(fake.job_payload(&JobSpec::new("g/p", "build", &["echo hi"])));
    assert!(matches!(client.request_job(&creds, &info()).await, RequestJobResult::Job(_)));
    assert_eq!(fake.job(other).expect("job").runner_session, None);
    let sent = fake.requests_to("POST", "/api/v4/jobs/request").pop().expect("logged").json().expect("json");
    assert!(sent.get("session").is_none(), "{sent}");
}

#[tokio::test]
async fn retries_429_honouring_retry_after_then_succeeds() {
    let fake = fake(Duration::ZERO).await;
    let (client, seen) = client();
    let runner = fake.create_runner("r");
    fake.inject(FakeEndpoint::RequestJob, 1, InjectedResponse::status(429).header("Retry-After", "1"));
    let started = std::time::Instant::now();
    assert!(matches!(client.request_job(&creds(&fake, &runner.token), &info()).await, RequestJobResult::NoJob));
    assert!(started.elapsed() >= Duration::from_secs(1), "waited for Retry-After");
    let statuses: Vec<u16> = fake.requests_to("POST", "/api/v4/jobs/request").iter().map(|r| r.status).collect();
    assert_eq!(statuses, vec![429, 204]);
    let ids: Vec<String> = fake
        .requests_to("POST", "/api/v4/jobs/request")
        .iter()
        .map(|r| r.header("x-request-id").unwrap_or_default().to_string())
        .collect();
    assert_ne!(ids[0], ids[1], "a fresh X-Request-Id per attempt");
    let hooked: Vec<_> = seen.lock().expect("seen").clone();
    assert_eq!(
        hooked,
        vec![(Endpoint::RequestJob, "POST".into(), Some(429)), (Endpoint::RequestJob, "POST".into(), Some(204))]
    );

    // Five attempts in total, then "failed" (healthy).
    fake.inject(FakeEndpoint::RequestJob, 10, InjectedResponse::status(500));
    let result = client.request_job(&creds(&fake, &runner.token), &info()).await;
    assert!(matches!(&result, RequestJobResult::Failed(m) if m.contains("500")), "{result:?}");
    assert_eq!(fake.requests_to("POST", "/api/v4/jobs/request").len(), 2 + 5);
}

#[tokio::test]
async fn conflict_is_not_unhealthy_but_forbidden_is() {
    let fake = fake(Duration::ZERO).await;
    let (client, _) = client();
    let runner = fake.create_runner("r");
    fake.inject(FakeEndpoint::RequestJob, 1, InjectedResponse::status(409));
    let result = client.request_job(&creds(&fake, &runner.token), &info()).await;
    assert!(matches!(&result, RequestJobResult::Failed(m) if m.contains("409")), "{result:?}");
    assert_eq!(fake.requests_to("POST", "/api/v4/jobs/request").len(), 1, "409 is not retried");
    let result = client.request_job(&creds(&fake, "glrt-unknown"), &info()).await;
    assert!(matches!(result, RequestJobResult::Unhealthy(_)), "{result:?}");
    // A dead server is a transport error: unhealthy.
    let dead =
        RunnerCredentials { url: "http://127.0.0.1:9".into(), token: runner.token.clone(), system_id: String::new() };
    assert!(matches!(client.request_job(&dead, &info()).await, RequestJobResult::Unhealthy(_)));
}

/// Takes the queued job and returns a JobClient for it.
async fn take_job(fake: &FakeGitLab, client: &Arc<GitLabClient>, runner_token: &str) -> JobClient {
    let RequestJobResult::Job(received) = client.request_job(&creds(fake, runner_token), &info()).await else {
        panic!("expected a job")
    };
    JobClient::new(client.clone(), &fake.url(), received.job.id, &received.job.token, info()).expect("job client")
}

fn checksum(bytes: &[u8]) -> String {
    format!("crc32:{:08x}", crc32fast::hash(bytes))
}

fn final_update(state: JobState, trace: &[u8]) -> JobUpdate {
    JobUpdate {
        state,
        failure_reason: (state == JobState::Failed).then(|| "script_failure".to_string()),
        exit_code: (state == JobState::Failed).then_some(7),
        checksum: Some(checksum(trace)),
        bytesize: Some(trace.len() as u64),
    }
}

/// `GET /api/v4/job` tells whether GitLab holds a job pending for acceptance: yes with
/// two-phase commit on, no on a GitLab that hands jobs out `running` (and refuses
/// `state=pending` there, 400, while `state=running` is a keep-alive it takes).
#[tokio::test]
async fn held_pending_tells_a_two_phase_handout_from_a_running_one() {
    let fake = fake(Duration::ZERO).await;
    let (client, _) = client();
    let runner = fake.create_runner("r");

    let id = fake.enqueue(fake.job_payload(&JobSpec::new("g/p", "j", &["true"])));
    let job = take_job(&fake, &client, &runner.token).await;
    assert!(job.held_pending().await.expect("GET /job"), "two-phase commit on: held pending");
    assert_eq!(job.update_job(&JobUpdate::state(JobState::Running)).await.outcome, UpdateOutcome::Accepted);
    assert!(!job.held_pending().await.expect("GET /job"), "accepted: running");
    assert_eq!(fake.job(id).expect("job").handed_out, Some(JobStatus::Pending));

    fake.set_two_phase_commit(false);
    let id = fake.enqueue(fake.job_payload(&JobSpec::new("g/p", "j2", &["true"])));
    let job = take_job(&fake, &client, &runner.token).await;
    assert_eq!(fake.job(id).expect("job").handed_out, Some(JobStatus::Running), "running whatever is advertised");
    assert!(!job.held_pending().await.expect("GET /job"), "two-phase commit off: running from the handout");
    assert_eq!(fake.rejected_updates(), vec![]);
    let r = job.update_job(&JobUpdate::state(JobState::Pending)).await;
    assert!(matches!(&r.outcome, UpdateOutcome::Failed(m) if m.contains("400")), "{:?}", r.outcome);
    let rejected = fake.rejected_updates();
    assert_eq!(
        (rejected.len(), rejected[0].job, rejected[0].state.as_str(), rejected[0].code),
        (1, id, "pending", 400)
    );
    assert_eq!(job.update_job(&JobUpdate::state(JobState::Running)).await.outcome, UpdateOutcome::Accepted);
    assert_eq!(fake.rejected_updates().len(), 1, "running is a keep-alive GitLab takes");
}

#[tokio::test]
async fn patch_and_update_map_every_status() {
    let fake = fake(Duration::ZERO).await;
    let (client, _) = client();
    let runner = fake.create_runner("r");
    let id = fake.enqueue(fake.job_payload(&JobSpec::new("g/p", "j", &["true"])));
    let job = take_job(&fake, &client, &runner.token).await;

    // Two-phase commit: keep-alive, then accept.
    let r = job.update_job(&JobUpdate::state(JobState::Pending)).await;
    assert_eq!(r.outcome, UpdateOutcome::Accepted);
    let r = job.update_job(&JobUpdate::state(JobState::Running)).await;
    assert_eq!(
        (r.outcome, r.remote_status, r.update_interval),
        (UpdateOutcome::Accepted, RemoteJobStatus::Running, Some(Duration::from_secs(3)))
    );
    assert_eq!(fake.job(id).expect("job").pending_keepalives, 1);
    // After acceptance the job no longer waits for an acknowledgement: GitLab's
    // `update_build_state!` refuses `pending` with 400.
    let r = job.update_job(&JobUpdate::state(JobState::Pending)).await;
    assert!(matches!(&r.outcome, UpdateOutcome::Failed(m) if m.contains("400")), "{:?}", r.outcome);

    let r = job.patch_trace(0, b"line 1\n").await;
    assert_eq!((r.outcome, r.remote_status), (PatchOutcome::Accepted, RemoteJobStatus::Running));
    assert_eq!(r.update_interval, Some(Duration::from_secs(3)));
    let sent = fake.requests_to("PATCH", &format!("/api/v4/jobs/{id}/trace")).pop().expect("logged");
    assert_eq!(sent.header("content-range"), Some("0-6"));
    assert_eq!(sent.header("content-type"), Some("text/plain"));
    assert_eq!(sent.query.as_deref(), Some("debug_trace=false"));
    assert!(sent.header("job-token").is_some());

    let r = job.patch_trace(100, b"gap").await;
    assert_eq!(r.outcome, PatchOutcome::RangeMismatch { server_size: 7 });
    let r = job.patch_trace(3, b"overlap").await;
    assert_eq!(r.outcome, PatchOutcome::RangeMismatch { server_size: 7 });

    // Two 502s are retried away.
    fake.inject(FakeEndpoint::PatchTrace, 2, InjectedResponse::status(502));
    let r = job.patch_trace(7, b"line 2\n").await;
    assert_eq!(r.outcome, PatchOutcome::Accepted);
    assert_eq!(fake.job(id).expect("job").trace_text(), "line 1\nline 2\n");

    // Cancel from the UI: canceling is reported; the final update cancels.
    fake.cancel(id);
    let r = job.patch_trace(14, b"canceled\n").await;
    assert_eq!((r.outcome, r.remote_status), (PatchOutcome::Accepted, RemoteJobStatus::CancelRequested));
    let trace = b"line 1\nline 2\ncanceled\n";

    fake.set_final_update_backoff(1);
    let r = job.update_job(&final_update(JobState::Failed, trace)).await;
    assert_eq!(r.outcome, UpdateOutcome::AcceptedRetryLater(Duration::from_secs(1)));
    assert_eq!(r.remote_status, RemoteJobStatus::CancelRequested);

    let r = job
        .update_job(&JobUpdate { checksum: Some("crc32:deadbeef".into()), ..final_update(JobState::Failed, trace) })
        .await;
    assert_eq!(r.outcome, UpdateOutcome::TraceValidationFailed);

    let r = job.update_job(&final_update(JobState::Failed, trace)).await;
    assert_eq!((r.outcome, r.remote_status), (UpdateOutcome::Accepted, RemoteJobStatus::Abort));
    let record = fake.job(id).expect("job");
    assert_eq!(record.status, JobStatus::Canceled);
    assert_eq!((record.exit_code, record.failure_reason.as_deref()), (Some(7), Some("script_failure")));

    // The job is over: 403 → abort.
    let r = job.patch_trace(trace.len() as u64, b"late\n").await;
    assert_eq!((r.outcome, r.remote_status), (PatchOutcome::Abort, RemoteJobStatus::Abort));
    let r = job.update_job(&JobUpdate::state(JobState::Running)).await;
    assert_eq!((r.outcome, r.remote_status), (UpdateOutcome::Abort, RemoteJobStatus::Abort));

    // An unknown job: 404.
    let ghost = JobClient::new(client.clone(), &fake.url(), 999_999, "nope", info()).expect("job client");
    assert_eq!(ghost.patch_trace(0, b"x").await.outcome, PatchOutcome::NotFound);
    assert_eq!(ghost.update_job(&JobUpdate::state(JobState::Running)).await.outcome, UpdateOutcome::Abort);
}

#[tokio::test]
async fn force_cancel_aborts_keepalives() {
    let fake = fake(Duration::ZERO).await;
    let (client, _) = client();
    let runner = fake.create_runner("r");
    let id = fake.enqueue(fake.job_payload(&JobSpec::new("g/p", "j", &["true"])));
    let job = take_job(&fake, &client, &runner.token).await;
    assert_eq!(job.update_job(&JobUpdate::state(JobState::Running)).await.outcome, UpdateOutcome::Accepted);
    fake.force_cancel(id);
    let r = job.update_job(&JobUpdate::state(JobState::Running)).await;
    assert_eq!((r.outcome, r.remote_status), (UpdateOutcome::Abort, RemoteJobStatus::Abort));
}

#[tokio::test]
async fn checksum_round_trip_after_a_412_reupload() {
    let fake = fake(Duration::ZERO).await;
    let (client, _) = client();
    let runner = fake.create_runner("r");
    let id = fake.enqueue(fake.job_payload(&JobSpec::new("g/p", "j", &["true"])));
    let job = take_job(&fake, &client, &runner.token).await;
    assert_eq!(job.update_job(&JobUpdate::state(JobState::Running)).await.outcome, UpdateOutcome::Accepted);

    let trace: Vec<u8> = (0..5000u32).flat_map(|i| format!("{i} ünïcode\n").into_bytes()).collect();
    let (a, b) = trace.split_at(trace.len() / 2);
    assert_eq!(job.patch_trace(0, a).await.outcome, PatchOutcome::Accepted);
    // The runner believes it sent more than the server kept: the checksum disagrees.
    let r = job.update_job(&final_update(JobState::Success, &trace)).await;
    assert_eq!(r.outcome, UpdateOutcome::TraceValidationFailed);
    // Re-upload from 0 as GitLab Runner does after a 412, then the final update succeeds.
    assert_eq!(job.patch_trace(0, a).await.outcome, PatchOutcome::Accepted);
    assert_eq!(job.patch_trace(a.len() as u64, b).await.outcome, PatchOutcome::Accepted);
    let r = job.update_job(&final_update(JobState::Success, &trace)).await;
    assert_eq!((r.outcome, r.remote_status), (UpdateOutcome::Accepted, RemoteJobStatus::Running));
    let record = fake.job(id).expect("job");
    assert_eq!(record.status, JobStatus::Success);
    assert_eq!(record.trace, trace);
    assert_eq!(record.checksum, Some(checksum(&trace)));
    assert_eq!(record.bytesize, Some(trace.len() as u64));
    assert_eq!(record.exit_code, None);
    let last = record.updates.last().expect("updates");
    assert!(last.get("exit_code").is_none() && last.get("failure_reason").is_none());
}

#[test]
fn tls_files_are_loaded_or_refused_with_the_file_named() {
    use runway::gitlab::client::{ApiError, ClientOptions, GitLabClient};
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
    let status = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=runway-test-ca", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl runs");
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    let ok = GitLabClient::new(ClientOptions {
        tls_ca_file: Some(cert.clone()),
        tls_client_cert: Some((cert.clone(), key.clone())),
        ..ClientOptions::default()
    });
    assert!(ok.is_ok(), "a PEM CA and client identity load");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").expect("write");
    match GitLabClient::new(ClientOptions { tls_ca_file: Some(garbage.clone()), ..ClientOptions::default() }) {
        Err(ApiError::ClientSetup(message)) => assert!(message.contains("garbage.pem"), "{message}"),
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("a CA file without certificates was accepted"),
    }
    match GitLabClient::new(ClientOptions {
        tls_ca_file: Some(dir.path().join("missing.crt")),
        ..ClientOptions::default()
    }) {
        Err(ApiError::ClientSetup(message)) => assert!(message.contains("missing.crt"), "{message}"),
        _ => panic!("a missing CA file was accepted"),
    }
}
