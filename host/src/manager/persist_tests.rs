//! A stored job's trace reaches GitLab only once the store has it, so a manager killed at any
//! moment and resumed from the store never has less of the log than GitLab.
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::*;
use crate::gitlab::api::{JobApi, JobState, JobUpdate, PatchOutcome, PatchResponse, RemoteJobStatus};
use crate::gitlab::api::{UpdateOutcome, UpdateResponse};
use crate::store::jobs::file::FileStore;
use crate::store::jobs::seal::StoreKey;
use crate::trace::upload::{TraceUploader, UploadConfig};
use crate::trace::{TraceOptions, TraceSink};

/// GitLab's side of one job's trace: appends at its exact size, 416 with its size otherwise,
/// 412 on a final checksum that is not its log's.
#[derive(Default)]
struct GitLabLog(Mutex<Vec<u8>>);

impl GitLabLog {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[async_trait::async_trait]
impl JobApi for GitLabLog {
    async fn patch_trace(&self, offset: u64, content: &[u8]) -> PatchResponse {
        let mut log = self.0.lock().unwrap();
        let outcome = if offset == log.len() as u64 || offset == 0 {
            log.truncate(offset as usize);
            log.extend_from_slice(content);
            PatchOutcome::Accepted
        } else {
            PatchOutcome::RangeMismatch { server_size: log.len() as u64 }
        };
        PatchResponse { outcome, remote_status: RemoteJobStatus::Running, update_interval: None }
    }

    async fn update_job(&self, update: &JobUpdate) -> UpdateResponse {
        let log = self.0.lock().unwrap();
        let checksum = format!("crc32:{:08x}", crc32fast::hash(&log));
        let outcome = if update.state == JobState::Running || update.checksum.as_deref() == Some(checksum.as_str()) {
            UpdateOutcome::Accepted
        } else {
            UpdateOutcome::TraceValidationFailed
        };
        UpdateResponse { outcome, remote_status: RemoteJobStatus::Running, update_interval: None }
    }
}

fn meta() -> EntryMeta {
    EntryMeta {
        job_id: 7,
        owner: "manager".into(),
        created: 1,
        heartbeat: 0,
        resumes: 0,
        stage: String::new(),
        project: "group/project".into(),
    }
}

fn config() -> UploadConfig {
    UploadConfig { update_interval: Duration::from_millis(20), ..UploadConfig::default() }
}

async fn until(what: &str, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(20), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The doomed-pod case of the kill -9 test in one process: GitLab took a line, the manager
/// died before any boundary or heartbeat saved the job, the job's stage cannot be followed
/// again, and its failure lines are written after what was restored. GitLab keeps every line
/// it had, once, followed by the failure lines.
#[tokio::test]
async fn a_resumed_job_never_has_less_of_its_trace_than_gitlab() {
    let dir = tempfile::tempdir().unwrap();
    let key = StoreKey::from_bytes([3; 32]);
    let options = TraceOptions::default();
    let gitlab = Arc::new(GitLabLog::default());
    let stats = Arc::new(crate::manager::ManagerStats::default());
    let store: Arc<dyn JobStore> = Arc::new(FileStore::open(dir.path(), key).unwrap());
    {
        let store = store.clone();
        let trace = JobTrace::new(&options).unwrap();
        let progress = Progress::new(JobProgress::default());
        let record = JobRecord::new(store, meta(), "{}".into(), trace.clone(), progress, 0, stats.clone());
        let record = Arc::new(record);
        record.save().await.unwrap();
        let limit: Arc<dyn SendLimit> = record.clone();
        let uploader = TraceUploader::within(gitlab.clone(), trace.clone(), config(), 0, Some(limit));
        record.set_acked(uploader.sent_counter());
        trace.write(b"$ echo doomed-started\n");
        trace.write(b"doomed-started\n");
        until("GitLab to take the line", || gitlab.text().contains("doomed-started\n")).await;
        // kill -9: nothing more is saved, nothing more is sent (the record's trace stays as
        // it is; the store's files are what the next manager reads).
        drop(uploader);
        drop(record);
    }
    // What the next manager finds in the store's directory.
    let entry = store.claim(7, "manager", Duration::from_secs(30)).await.unwrap().expect("the stored job");
    let body: StoredBody = serde_json::from_slice(&entry.body).unwrap();
    let bytes = store.read_trace(7, body.trace.len).await.unwrap();
    let had = gitlab.text();
    assert!(
        bytes.starts_with(had.as_bytes()),
        "the store has all GitLab has: {:?} vs {had:?}",
        String::from_utf8_lossy(&bytes)
    );

    let trace = JobTrace::restore(&options, bytes, body.trace.clone()).unwrap();
    let progress = Progress::new(body.progress);
    let record = JobRecord::new(store, entry.meta, body.payload, trace.clone(), progress, body.trace.len, stats);
    let record = Arc::new(record);
    let limit: Arc<dyn SendLimit> = record.clone();
    let uploader = TraceUploader::within(gitlab.clone(), trace.clone(), config(), body.acked, Some(limit));
    trace.write(b"ERROR: Job failed (system failure): the pod no longer exists\n");
    uploader.finish(JobUpdate::state(JobState::Failed)).await.unwrap();
    record.finish().await;
    let log = gitlab.text();
    assert_eq!(
        log,
        "$ echo doomed-started\ndoomed-started\nERROR: Job failed (system failure): the pod no longer exists\n"
    );
    assert_eq!(log.as_bytes(), trace.contents());
}

/// Without a job store there is nothing to wait for; with one, a store that fails does not
/// keep the trace from GitLab.
#[tokio::test]
async fn a_failing_store_does_not_hold_the_trace_back() {
    let dir = tempfile::tempdir().unwrap();
    let file = FileStore::open(&dir.path().join("store"), StoreKey::from_bytes([4; 32])).unwrap();
    let failing = Arc::new(FailingStore { inner: file, failing: AtomicBool::new(false) });
    let store: Arc<dyn JobStore> = failing.clone();
    let trace = JobTrace::new(&TraceOptions::default()).unwrap();
    let stats = Arc::new(crate::manager::ManagerStats::default());
    let progress = Progress::new(JobProgress::default());
    let record = Arc::new(JobRecord::new(store, meta(), "{}".into(), trace.clone(), progress, 0, stats));
    trace.write(b"first\n");
    assert_eq!(record.sendable().await, u64::MAX, "no entry before the job's first boundary: nothing to hold back");
    record.save().await.unwrap();
    trace.write(b"second\n");
    assert_eq!(record.sendable().await, 13, "saved, then sendable");
    // The store's disk fails: saving fails from now on.
    failing.failing.store(true, Ordering::SeqCst);
    trace.write(b"third\n");
    assert_eq!(record.sendable().await, u64::MAX);
    record.finish().await;
    assert_eq!(record.sendable().await, u64::MAX, "a finished job's record holds nothing back");
}

/// A file store whose writes fail once `failing` is set (a disk that went away).
struct FailingStore {
    inner: FileStore,
    failing: AtomicBool,
}

impl FailingStore {
    fn check(&self) -> Result<(), JobStoreError> {
        match self.failing.load(Ordering::SeqCst) {
            true => Err(JobStoreError::Backend("writing the journal: Input/output error (os error 5)".into())),
            false => Ok(()),
        }
    }
}

#[async_trait::async_trait]
impl JobStore for FailingStore {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    async fn save(&self, entry: &Entry) -> Result<(), JobStoreError> {
        self.check()?;
        self.inner.save(entry).await
    }

    async fn append_trace(&self, job_id: u64, offset: u64, bytes: &[u8]) -> Result<(), JobStoreError> {
        self.check()?;
        self.inner.append_trace(job_id, offset, bytes).await
    }

    async fn read_trace(&self, job_id: u64, len: u64) -> Result<Vec<u8>, JobStoreError> {
        self.inner.read_trace(job_id, len).await
    }

    async fn list(&self) -> Result<Vec<crate::store::jobs::Listed>, JobStoreError> {
        self.inner.list().await
    }

    async fn claim(&self, job_id: u64, owner: &str, health_timeout: Duration) -> Result<Option<Entry>, JobStoreError> {
        self.inner.claim(job_id, owner, health_timeout).await
    }

    async fn remove(&self, job_id: u64) -> Result<(), JobStoreError> {
        self.check()?;
        self.inner.remove(job_id).await
    }

    async fn now(&self) -> Result<u64, JobStoreError> {
        self.inner.now().await
    }
}
