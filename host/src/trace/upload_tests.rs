//! Tests of the trace loop against a scripted GitLab on tokio's paused clock.
use std::collections::VecDeque;
use std::sync::Mutex;

use super::*;
use crate::gitlab::api::{PatchResponse, UpdateResponse};
use crate::trace::{TraceOptions, TraceSink};

/// What the scripted server does with the next PATCH.
enum PatchScript {
    /// Append like GitLab: 202 if the offset is the current size (or 0: re-upload), else 416.
    Normal,
    /// Normal, but the response carries this `Job-Status` and update interval.
    NormalWith(RemoteJobStatus, Option<Duration>),
    /// Store the bytes with the first one altered and answer 202 (a corrupted upload).
    Corrupt,
    /// The server loses everything after `n` bytes, then handles the patch normally.
    LoseAfter(usize),
    /// Answer this without storing anything.
    Respond(PatchOutcome),
}

/// What the scripted server does with the next PUT.
enum UpdateScript {
    /// 200 for `running`; for a final state 200 if checksum and bytesize match the stored
    /// log, else 412.
    Normal,
    NormalWith(RemoteJobStatus),
    Respond(UpdateOutcome),
}

#[derive(Debug, Clone, PartialEq)]
enum Call {
    Patch { offset: u64, content: Vec<u8>, at: Duration },
    Update { update: JobUpdate, at: Duration },
}

#[derive(Default)]
struct Server {
    log: Vec<u8>,
    patches: VecDeque<PatchScript>,
    updates: VecDeque<UpdateScript>,
    calls: Vec<Call>,
}

/// A test double of the HTTP client: records calls and answers per script.
struct ScriptedGitLab {
    started: Instant,
    server: Mutex<Server>,
}

impl ScriptedGitLab {
    fn new() -> Arc<Self> {
        Arc::new(ScriptedGitLab { started: Instant::now(), server: Mutex::new(Server::default()) })
    }
    fn script_patch(&self, step: PatchScript) {
        self.server.lock().expect("server lock").patches.push_back(step);
    }
    fn script_update(&self, step: UpdateScript) {
        self.server.lock().expect("server lock").updates.push_back(step);
    }
    fn log(&self) -> Vec<u8> {
        self.server.lock().expect("server lock").log.clone()
    }
    fn calls(&self) -> Vec<Call> {
        self.server.lock().expect("server lock").calls.clone()
    }
    fn patches(&self) -> Vec<(u64, Vec<u8>, Duration)> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Patch { offset, content, at } => Some((offset, content, at)),
                Call::Update { .. } => None,
            })
            .collect()
    }
    fn updates(&self) -> Vec<(JobUpdate, Duration)> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Update { update, at } => Some((update, at)),
                Call::Patch { .. } => None,
            })
            .collect()
    }
}

fn append(log: &mut Vec<u8>, offset: u64, content: &[u8]) -> PatchOutcome {
    let offset = offset as usize;
    if offset == log.len() || offset == 0 {
        log.truncate(offset);
        log.extend_from_slice(content);
        PatchOutcome::Accepted
    } else {
        PatchOutcome::RangeMismatch { server_size: log.len() as u64 }
    }
}

fn crc(bytes: &[u8]) -> String {
    format!("crc32:{:08x}", crc32fast::hash(bytes))
}

#[async_trait::async_trait]
impl JobApi for ScriptedGitLab {
    async fn patch_trace(&self, offset: u64, content: &[u8]) -> PatchResponse {
        let mut server = self.server.lock().expect("server lock");
        let at = self.started.elapsed();
        server.calls.push(Call::Patch { offset, content: content.to_vec(), at });
        let step = server.patches.pop_front().unwrap_or(PatchScript::Normal);
        let (outcome, remote_status, update_interval) = match step {
            PatchScript::Normal => (append(&mut server.log, offset, content), RemoteJobStatus::Running, None),
            PatchScript::NormalWith(status, interval) => (append(&mut server.log, offset, content), status, interval),
            PatchScript::Corrupt => {
                let mut bad = content.to_vec();
                bad[0] ^= 0xff;
                (append(&mut server.log, offset, &bad), RemoteJobStatus::Running, None)
            }
            PatchScript::LoseAfter(n) => {
                server.log.truncate(n);
                (append(&mut server.log, offset, content), RemoteJobStatus::Running, None)
            }
            PatchScript::Respond(outcome) => (outcome, RemoteJobStatus::Running, None),
        };
        PatchResponse { outcome, remote_status, update_interval }
    }

    async fn update_job(&self, update: &JobUpdate) -> UpdateResponse {
        let mut server = self.server.lock().expect("server lock");
        let at = self.started.elapsed();
        server.calls.push(Call::Update { update: update.clone(), at });
        let normal = |server: &Server| {
            let matches = update.checksum.as_deref() == Some(crc(&server.log).as_str())
                && update.bytesize == Some(server.log.len() as u64);
            if update.state == JobState::Running || matches {
                UpdateOutcome::Accepted
            } else {
                UpdateOutcome::TraceValidationFailed
            }
        };
        let (outcome, remote_status) = match server.updates.pop_front().unwrap_or(UpdateScript::Normal) {
            UpdateScript::Normal => (normal(&server), RemoteJobStatus::Running),
            UpdateScript::NormalWith(status) => (normal(&server), status),
            UpdateScript::Respond(outcome) => (outcome, RemoteJobStatus::Running),
        };
        UpdateResponse { outcome, remote_status, update_interval: None }
    }
}

fn job_trace(phrases: &[&str]) -> JobTrace {
    JobTrace::new(&TraceOptions {
        masked_phrases: phrases.iter().map(|s| s.to_string()).collect(),
        ..TraceOptions::default()
    })
    .expect("patterns compile")
}

fn start(api: &Arc<ScriptedGitLab>, trace: &JobTrace, config: UploadConfig) -> TraceUploader {
    TraceUploader::start(api.clone(), trace.clone(), config)
}

fn success() -> JobUpdate {
    JobUpdate::state(JobState::Success)
}

async fn wait(secs: u64) {
    sleep(Duration::from_secs(secs)).await;
}

/// The server holds exactly the trace and the last PUT carried its checksum and size.
fn assert_server_has_trace(api: &ScriptedGitLab, trace: &JobTrace) {
    assert_eq!(api.log(), trace.contents(), "server log == trace");
    let (last, _) = api.updates().pop().expect("a final update was sent");
    assert_eq!(last.checksum, Some(crc(&api.log())));
    assert_eq!(last.bytesize, Some(api.log().len() as u64));
    assert!(api.patches().iter().all(|(_, content, _)| !content.is_empty()), "no empty patch");
}

#[tokio::test(start_paused = true)]
async fn secret_split_across_writes_and_patches_is_masked() {
    let api = ScriptedGitLab::new();
    let trace = job_trace(&["TOPSECRET"]);
    let uploader = start(&api, &trace, UploadConfig::default());
    trace.write(b"token is TOPS");
    wait(4).await;
    trace.write(b"ECRET, ok\n");
    wait(3).await;
    let patches = api.patches();
    assert_eq!(patches.len(), 2, "one patch per interval: {patches:?}");
    assert_eq!(patches[0].1, b"token is ", "the partial secret is held back");
    assert_eq!(patches[1].1, b"[MASKED], ok\n");
    uploader.finish(success()).await.expect("final update accepted");
    assert_eq!(api.log(), b"token is [MASKED], ok\n");
    assert_server_has_trace(&api, &trace);
    let (last, _) = api.updates().pop().expect("final update");
    assert_eq!(last.state, JobState::Success);
}

#[tokio::test(start_paused = true)]
async fn partial_secret_at_the_end_is_released_by_finish() {
    let api = ScriptedGitLab::new();
    let trace = job_trace(&["TOPSECRET"]);
    let uploader = start(&api, &trace, UploadConfig::default());
    trace.write(b"ends with TOP");
    wait(4).await;
    uploader.finish(success()).await.expect("final update accepted");
    assert_eq!(api.log(), b"ends with TOP");
    assert_server_has_trace(&api, &trace);
}

#[tokio::test(start_paused = true)]
async fn range_mismatch_resends_from_the_server_size() {
    let api = ScriptedGitLab::new();
    let trace = job_trace(&[]);
    let uploader = start(&api, &trace, UploadConfig::default());
    trace.write(&[b'a'; 100]);
    wait(4).await;
    trace.write(&[b'b'; 50]);
    api.script_patch(PatchScript::LoseAfter(60));
    wait(3).await; // 416: the server has 60 bytes
    wait(3).await; // resend from 60
    let offsets: Vec<(u64, usize)> = api.patches().iter().map(|(o, c, _)| (*o, c.len())).collect();
    assert_eq!(offsets, vec![(0, 100), (100, 50), (60, 90)]);
    assert_eq!(uploader.sent_offset(), 150);
    uploader.finish(success()).await.expect("final update accepted");
    assert_server_has_trace(&api, &trace);
}

#[tokio::test(start_paused = true)]
async fn checksum_mismatch_reuploads_everything_from_zero() {
    let api = ScriptedGitLab::new();
    let trace = job_trace(&[]);
    let uploader = start(&api, &trace, UploadConfig::default());
    api.script_patch(PatchScript::Corrupt);
    trace.write(b"first part\n");
    wait(4).await;
    trace.write(b"second part\n");
    uploader.finish(success()).await.expect("final update accepted after re-upload");
    let offsets: Vec<u64> = api.patches().iter().map(|(o, _, _)| *o).collect();
    assert_eq!(offsets, vec![0, 11, 0], "after 412 the whole trace is sent again from 0");
    assert_eq!(api.patches()[2].1, b"first part\nsecond part\n");
    let updates = api.updates();
    assert_eq!(updates.len(), 2, "412, then accepted");
    assert_server_has_trace(&api, &trace);
}

#[tokio::test(start_paused = true)]
async fn failed_patch_is_retried_on_the_next_tick() {
    let api = ScriptedGitLab::new();
    let trace = job_trace(&[]);
    let uploader = start(&api, &trace, UploadConfig::default());
    api.script_patch(PatchScript::Respond(PatchOutcome::Failed("500 Internal Server Error".into())));
    trace.write(b"hello\n");
    wait(4).await;
    assert_eq!(uploader.sent_offset(), 0);
    wait(3).await;
    assert_eq!(uploader.sent_offset(), 6);
    let patches = api.patches();
    assert_eq!(
        patches.iter().map(|(o, c, _)| (*o, c.clone())).collect::<Vec<_>>(),
        vec![(0, b"hello\n".to_vec()), (0, b"hello\n".to_vec())]
    );
    uploader.finish(success()).await.expect("final update accepted");
    assert_server_has_trace(&api, &trace);
}

#[tokio::test(start_paused = true)]
async fn failed_final_patch_and_put_back_off_then_recover() {
    let api = ScriptedGitLab::new();
    let trace = job_trace(&[]);
    let uploader = start(&api, &trace, UploadConfig::default());
    trace.write(b"output\n");
    api.script_patch(PatchScript::Respond(PatchOutcome::Failed("502 Bad Gateway".into())));
    api.script_update(UpdateScript::Respond(UpdateOutcome::Failed("500".into())));
    api.script_update(UpdateScript::Respond(UpdateOutcome::Failed("503".into())));
    uploader.finish(success()).await.expect("recovers");
    let calls = api.calls();
    let kinds: Vec<&str> = calls
        .iter()
        .map(|c| match c {
            Call::Patch { .. } => "patch",
            Call::Update { .. } => "put",
        })
        .collect();
    assert_eq!(kinds, vec!["patch", "patch", "put", "put", "put"]);
    let at: Vec<Duration> = calls
        .iter()
        .map(|c| match c {
            Call::Patch { at, .. } | Call::Update { at, .. } => *at,
        })
        .collect();
    // Exponential backoff 1 s, 2 s, 4 s between failed rounds (virtual time).
    assert!(at[1] - at[0] >= Duration::from_secs(1), "{at:?}");
    assert!(at[3] - at[2] >= Duration::from_secs(2), "{at:?}");
    assert!(at[4] - at[3] >= Duration::from_secs(4), "{at:?}");
    assert_server_has_trace(&api, &trace);
}

#[tokio::test(start_paused = true)]
async fn final_update_gives_up_after_the_retry_limit() {
    let api = ScriptedGitLab::new();
    let trace = job_trace(&[]);
    let config = UploadConfig { final_update_retry_limit: 2, ..UploadConfig::default() };
    let uploader = start(&api, &trace, config);
    for _ in 0..5 {
        api.script_update(UpdateScript::Respond(UpdateOutcome::Failed("500".into())));
    }
    let err = uploader.finish(success()).await.expect_err("gives up");
    assert_eq!(err, FinalUpdateError::RetriesExhausted { attempts: 3, last_error: "500".into() });
    assert_eq!(api.updates().len(), 3, "first try plus two retries");
}

#[tokio::test(start_paused = true)]
async fn accepted_retry_later_waits_the_given_interval() {
    let api = ScriptedGitLab::new();
    let trace = job_trace(&[]);
    let uploader = start(&api, &trace, UploadConfig::default());
    trace.write(b"done\n");
    api.script_update(UpdateScript::Respond(UpdateOutcome::AcceptedRetryLater(Duration::from_secs(8))));
    uploader.finish(JobUpdate { exit_code: Some(2), ..JobUpdate::state(JobState::Failed) }).await.expect("accepted");
    let updates = api.updates();
    assert_eq!(updates.len(), 2);
    assert!(updates[1].1 - updates[0].1 >= Duration::from_secs(8), "{updates:?}");
    assert_eq!(updates[1].0.state, JobState::Failed);
    assert_eq!(updates[1].0.exit_code, Some(2));
    assert_server_has_trace(&api, &trace);
}

#[tokio::test(start_paused = true)]
async fn canceling_then_abort_surface_as_signals() {
    let api = ScriptedGitLab::new();
    let trace = job_trace(&[]);
    let uploader = start(&api, &trace, UploadConfig::default());
    let signals = uploader.signals();
    api.script_patch(PatchScript::NormalWith(RemoteJobStatus::CancelRequested, None));
    trace.write(b"running\n");
    wait(4).await;
    assert!(signals.cancel_requested.is_cancelled());
    assert!(!signals.abort.is_cancelled());
    api.script_patch(PatchScript::Respond(PatchOutcome::Abort));
    trace.write(b"after_script\n");
    wait(3).await;
    assert!(signals.abort.is_cancelled());
    trace.write(b"more\n");
    wait(30).await;
    assert_eq!(api.patches().len(), 2, "no patches after abort");
    api.script_update(UpdateScript::Respond(UpdateOutcome::Abort));
    let err = uploader.finish(success()).await.expect_err("job is gone");
    assert!(matches!(err, FinalUpdateError::JobGone(_)), "{err}");
}

#[tokio::test(start_paused = true)]
async fn keep_alive_put_after_idle_and_its_status_is_observed() {
    let api = ScriptedGitLab::new();
    let trace = job_trace(&[]);
    let uploader = start(&api, &trace, UploadConfig::default());
    let signals = uploader.signals();
    wait(29).await;
    assert!(api.updates().is_empty(), "no keep-alive before 30 s idle");
    api.script_update(UpdateScript::NormalWith(RemoteJobStatus::CancelRequested));
    wait(5).await;
    let updates = api.updates();
    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0].0.state, JobState::Running);
    assert_eq!(updates[0].0.checksum.as_deref(), Some("crc32:00000000"));
    assert_eq!(updates[0].0.bytesize, Some(0));
    assert!(signals.cancel_requested.is_cancelled());
    // Acknowledged patches count as activity: no keep-alive while output flows.
    for _ in 0..20 {
        trace.write(b"tick\n");
        wait(3).await;
    }
    assert_eq!(api.updates().len(), 1, "patches acknowledged every 3 s keep the job alive");
    uploader.finish(success()).await.expect("accepted");
    assert_server_has_trace(&api, &trace);
}

#[tokio::test(start_paused = true)]
async fn server_interval_is_honoured_and_capped() {
    let api = ScriptedGitLab::new();
    let trace = job_trace(&[]);
    let uploader = start(&api, &trace, UploadConfig::default());
    api.script_patch(PatchScript::NormalWith(RemoteJobStatus::Running, Some(Duration::from_secs(3600))));
    trace.write(b"one\n");
    wait(4).await;
    trace.write(b"two\n");
    wait(14 * 60).await;
    assert_eq!(api.patches().len(), 1, "the next patch waits the server's interval");
    wait(2 * 60).await;
    let patches = api.patches();
    assert_eq!(patches.len(), 2, "but never more than 15 minutes");
    assert_eq!(patches[1].2 - patches[0].2, Duration::from_secs(15 * 60));
    uploader.finish(success()).await.expect("accepted");
    assert_server_has_trace(&api, &trace);
}

#[tokio::test(start_paused = true)]
async fn not_found_stops_patching_but_final_put_is_sent() {
    let api = ScriptedGitLab::new();
    let trace = job_trace(&[]);
    let uploader = start(&api, &trace, UploadConfig::default());
    api.script_patch(PatchScript::Respond(PatchOutcome::NotFound));
    trace.write(b"x\n");
    wait(10).await;
    assert_eq!(api.patches().len(), 1);
    api.script_update(UpdateScript::Respond(UpdateOutcome::Accepted));
    uploader.finish(success()).await.expect("accepted");
    assert_eq!(api.patches().len(), 1, "no patch after 404");
    assert_eq!(api.updates().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn large_trace_goes_in_limited_chunks() {
    let api = ScriptedGitLab::new();
    let trace = job_trace(&[]);
    let config = UploadConfig { patch_limit: 10, ..UploadConfig::default() };
    let uploader = start(&api, &trace, config);
    trace.write(b"0123456789abcdefghijKLMNO");
    wait(4).await;
    assert_eq!(api.patches().len(), 1, "one patch per tick while running");
    uploader.finish(success()).await.expect("accepted");
    let chunks: Vec<(u64, Vec<u8>)> = api.patches().into_iter().map(|(o, c, _)| (o, c)).collect();
    assert_eq!(chunks, vec![(0, b"0123456789".to_vec()), (10, b"abcdefghij".to_vec()), (20, b"KLMNO".to_vec())]);
    assert_server_has_trace(&api, &trace);
}

#[tokio::test(start_paused = true)]
async fn range_unknown_resends_the_whole_trace_from_zero() {
    let api = ScriptedGitLab::new();
    let trace = job_trace(&[]);
    let uploader = start(&api, &trace, UploadConfig::default());
    trace.write(&[b'a'; 100]);
    wait(4).await;
    trace.write(&[b'b'; 50]);
    api.script_patch(PatchScript::Respond(PatchOutcome::RangeUnknown));
    wait(3).await; // 416 without Range: GitLab Runner's answer is offset 0
    wait(3).await;
    let offsets: Vec<(u64, usize)> = api.patches().iter().map(|(o, c, _)| (*o, c.len())).collect();
    assert_eq!(offsets, vec![(0, 100), (100, 50), (0, 150)]);
    uploader.finish(success()).await.expect("final update accepted");
    assert_server_has_trace(&api, &trace);
}

#[tokio::test(start_paused = true)]
async fn an_unknown_offset_is_settled_by_the_final_checksum() {
    let api = ScriptedGitLab::new();
    let trace = job_trace(&[]);
    let uploader = start(&api, &trace, UploadConfig::default());
    trace.write(&[b'a'; 100]);
    wait(4).await;
    trace.write(&[b'b'; 50]);
    // Even the resend from 0 gets a 416 without Range: patching cannot find the offset.
    api.script_patch(PatchScript::Respond(PatchOutcome::RangeUnknown));
    api.script_patch(PatchScript::Respond(PatchOutcome::RangeUnknown));
    wait(60).await;
    assert_eq!(api.patches().len(), 3, "patching pauses once the offset is unknown");
    let started = Instant::now();
    uploader.finish(success()).await.expect("final update accepted");
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
    let finals: Vec<_> = api.updates().into_iter().filter(|(u, _)| u.state != JobState::Running).collect();
    assert_eq!(finals.len(), 2, "the PUT at once (412), then again after the re-upload: {finals:?}");
    assert_eq!(api.patches().last().map(|(o, c, _)| (*o, c.len())), Some((0, 150)));
    assert_server_has_trace(&api, &trace);
}

#[tokio::test(start_paused = true)]
async fn the_final_put_goes_out_when_the_trace_cannot_be_sent() {
    let api = ScriptedGitLab::new();
    let trace = job_trace(&[]);
    let uploader = start(&api, &trace, UploadConfig::default());
    trace.write(b"never arrives\n");
    for _ in 0..1000 {
        api.script_patch(PatchScript::Respond(PatchOutcome::Failed("connection reset".into())));
    }
    api.script_update(UpdateScript::Respond(UpdateOutcome::Accepted));
    let started = Instant::now();
    uploader.finish(success()).await.expect("the final state is accepted without the trace");
    let updates = api.updates();
    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0].0.state, JobState::Success);
    // Five retries backing off 1+2+4+8+16 s, then the PUT.
    assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
    assert_eq!(api.patches().len(), 6, "the first try and five retries");
}

#[tokio::test(start_paused = true)]
async fn the_final_put_goes_out_when_patches_hang() {
    /// Answers every PATCH never; PUTs at once.
    struct Hanging(Mutex<Vec<JobUpdate>>);
    #[async_trait::async_trait]
    impl JobApi for Hanging {
        async fn patch_trace(&self, _: u64, _: &[u8]) -> PatchResponse {
            std::future::pending().await
        }
        async fn update_job(&self, update: &JobUpdate) -> UpdateResponse {
            self.0.lock().expect("lock").push(update.clone());
            UpdateResponse {
                outcome: UpdateOutcome::Accepted,
                remote_status: RemoteJobStatus::Running,
                update_interval: None,
            }
        }
    }
    let api = Arc::new(Hanging(Mutex::new(Vec::new())));
    let trace = job_trace(&[]);
    let config = UploadConfig { final_trace_timeout: Duration::from_secs(20), ..UploadConfig::default() };
    let uploader = TraceUploader::start(api.clone(), trace.clone(), config);
    trace.write(b"stuck\n");
    let started = Instant::now();
    uploader.finish(success()).await.expect("accepted");
    assert!(started.elapsed() <= Duration::from_secs(21), "{:?}", started.elapsed());
    assert_eq!(api.0.lock().expect("lock").len(), 1);
}

/// A limit the test moves by hand.
struct Limit(AtomicU64);

#[async_trait::async_trait]
impl SendLimit for Limit {
    async fn sendable(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[tokio::test(start_paused = true)]
async fn no_byte_past_the_send_limit_goes_to_gitlab() {
    let api = ScriptedGitLab::new();
    let trace = job_trace(&[]);
    let limit = Arc::new(Limit(AtomicU64::new(40)));
    let uploader =
        TraceUploader::within(api.clone(), trace.clone(), UploadConfig::default(), 0, Some(limit.clone() as _));
    trace.write(&[b'a'; 100]);
    wait(4).await;
    wait(3).await;
    assert_eq!(api.log(), vec![b'a'; 40], "only what the limit allows");
    limit.0.store(u64::MAX, Ordering::SeqCst);
    wait(3).await;
    let offsets: Vec<(u64, usize)> = api.patches().iter().map(|(o, c, _)| (*o, c.len())).collect();
    assert_eq!(offsets, vec![(0, 40), (40, 60)], "nothing sent while held back, no empty patch");
    uploader.finish(success()).await.expect("final update accepted");
    assert_server_has_trace(&api, &trace);
}
