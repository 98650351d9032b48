//! A running job's entry in the job store: what is saved (the payload as GitLab sent it, the
//! job's progress, the trace's checkpoint, how much of the trace GitLab acknowledged), when
//! (every boundary the job reports, and a heartbeat every `health_interval`), and what a save
//! refused as `Lost` means (another manager owns the job now: leave it alone).
//!
//! The trace itself is appended to the store's trace stream: a save writes only the bytes the
//! store does not have yet, with the entry that says how many of them count, as one write
//! ([`JobStore::save_with_trace`]: one sync with the file store's journal). The record is
//! also the uploader's [`SendLimit`]: GitLab gets only trace bytes a saved entry counts, so a
//! job resumed from the store never has less of its log than GitLab.
//!
//! Owns: [`JobRecord`], [`StoredBody`]. Must not touch: resuming (`super::resume`), GitLab.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::job::{JobProgress, Progress};
use crate::store::jobs::{Entry, EntryMeta, JobStore, JobStoreError};
use crate::trace::upload::SendLimit;
use crate::trace::{JobTrace, TraceCheckpoint};

/// The sealed part of a store entry.
#[derive(Debug, Serialize, Deserialize)]
pub struct StoredBody {
    /// The job payload exactly as GitLab sent it (JSON text).
    pub payload: String,
    /// Where the job stands.
    pub progress: JobProgress,
    /// The trace's checkpoint (its bytes are the store's trace stream).
    pub trace: TraceCheckpoint,
    /// Trace bytes GitLab acknowledged.
    pub acked: u64,
}

/// One running job's entry, kept up to date while the job runs.
pub struct JobRecord {
    store: Arc<dyn JobStore>,
    meta: EntryMeta,
    payload: String,
    trace: JobTrace,
    progress: Progress,
    /// The uploader's acknowledged offset, once it runs.
    acked: std::sync::Mutex<Option<Arc<AtomicU64>>>,
    /// Trace bytes the store has; also serialises saves.
    persisted: tokio::sync::Mutex<u64>,
    /// Trace bytes the last saved entry counts (what may go to GitLab).
    saved: AtomicU64,
    /// The store holds an entry of the job (a boundary saved it, or it was resumed from it).
    stored: std::sync::atomic::AtomicBool,
    /// Another manager owns the job now.
    lost: CancellationToken,
    /// Stops the heartbeat.
    done: CancellationToken,
    /// Counts this record in `store_entries` while it lives.
    stats: Arc<super::ManagerStats>,
}

impl JobRecord {
    /// The record of a job: `meta` (owner, creation, resumes so far), the payload text, its
    /// trace and progress; `persisted` trace bytes are in the store already.
    pub fn new(
        store: Arc<dyn JobStore>,
        meta: EntryMeta,
        payload: String,
        trace: JobTrace,
        progress: Progress,
        persisted: u64,
        stats: Arc<super::ManagerStats>,
    ) -> Self {
        stats.store_entries.fetch_add(1, Ordering::SeqCst);
        JobRecord {
            stats,
            store,
            meta,
            payload,
            trace,
            progress,
            acked: std::sync::Mutex::new(None),
            persisted: tokio::sync::Mutex::new(persisted),
            saved: AtomicU64::new(persisted),
            stored: (persisted > 0).into(),
            lost: CancellationToken::new(),
            done: CancellationToken::new(),
        }
    }

    /// The job's progress (shared with the job).
    pub fn progress(&self) -> Progress {
        self.progress.clone()
    }

    /// Fires when another manager took the job over.
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Read GitLab's acknowledged trace offset from `counter` from now on.
    pub fn set_acked(&self, counter: Arc<AtomicU64>) {
        if let Ok(mut acked) = self.acked.lock() {
            *acked = Some(counter);
        }
    }

    fn acked(&self) -> u64 {
        self.acked.lock().ok().and_then(|a| a.as_ref().map(|c| c.load(Ordering::SeqCst))).unwrap_or(0)
    }

    /// Save the job as it stands: the new trace bytes, then the entry. A `Lost` answer fires
    /// [`JobRecord::lost`].
    pub async fn save(&self) -> Result<(), JobStoreError> {
        let mut persisted = self.persisted.lock().await;
        if self.done.is_cancelled() {
            // Finished meanwhile: the entry is being (or was) removed, never write it again.
            return Ok(());
        }
        let (progress, (checkpoint, tail)) = self.progress.read(|p| (p.clone(), self.trace.checkpoint(*persisted)));
        let result = async {
            let len = checkpoint.len;
            let meta = EntryMeta { stage: progress.stage_name.clone(), ..self.meta.clone() };
            let body = StoredBody { payload: self.payload.clone(), progress, trace: checkpoint, acked: self.acked() };
            let body = serde_json::to_vec(&body).map_err(|e| JobStoreError::Backend(format!("encoding: {e}")))?;
            // The new trace bytes and the entry that counts them, as one write.
            self.store.save_with_trace(&Entry { meta, body }, *persisted, &tail).await?;
            *persisted = len;
            self.saved.store(len, Ordering::SeqCst);
            self.stored.store(true, Ordering::SeqCst);
            Ok(())
        }
        .await;
        if let Err(JobStoreError::Lost(_)) = &result {
            self.lost.cancel();
        }
        result
    }

    /// Save, logging a failure (a store that fails does not fail the job).
    pub async fn save_logged(&self) {
        match self.save().await {
            Ok(()) => {}
            Err(JobStoreError::Lost(job)) => {
                tracing::error!(job, "another manager took this job over; leaving it alone")
            }
            Err(e) => tracing::warn!(job = self.meta.job_id, "saving the job to the store failed: {e}"),
        }
    }

    /// Save every `interval` until [`JobRecord::finish`] or the job is lost.
    pub fn start_heartbeat(self: &Arc<Self>, interval: Duration) {
        let record = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = record.done.cancelled() => return,
                    _ = record.lost.cancelled() => return,
                }
                record.save_logged().await;
            }
        });
    }

    /// The job is over for this manager: stop the heartbeat and delete the entry (unless
    /// another manager owns it now).
    pub async fn finish(&self) {
        self.done.cancel();
        // Wait for a save in flight; none starts after this.
        let _saves = self.persisted.lock().await;
        if self.lost.is_cancelled() {
            return;
        }
        if let Err(e) = self.store.remove(self.meta.job_id).await {
            tracing::warn!(job = self.meta.job_id, "removing the job from the store failed: {e}");
        }
    }
}

#[async_trait::async_trait]
impl SendLimit for JobRecord {
    /// Save the trace GitLab has not got yet (unless the store has it all) and allow what the
    /// saved entry counts. Before the job's first boundary there is no entry (nothing a
    /// restarted manager could go on with) and nothing is held back; nor after the job, nor by
    /// a store that fails (it does not fail the job, nor keep its log from GitLab); a job
    /// another manager owns now sends nothing more.
    async fn sendable(&self) -> u64 {
        if self.done.is_cancelled() || !self.stored.load(Ordering::SeqCst) {
            return u64::MAX;
        }
        let saved = self.saved.load(Ordering::SeqCst);
        if saved >= self.trace.len() {
            return saved;
        }
        match self.save().await {
            Ok(()) if self.done.is_cancelled() => u64::MAX,
            Ok(()) => self.saved.load(Ordering::SeqCst),
            Err(JobStoreError::Lost(job)) => {
                tracing::error!(job, "another manager took this job over; sending no more of its trace");
                saved
            }
            Err(e) => {
                tracing::warn!(job = self.meta.job_id, "saving the trace to the store failed, sending it anyway: {e}");
                u64::MAX
            }
        }
    }
}

impl Drop for JobRecord {
    fn drop(&mut self) {
        self.stats.store_entries.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
#[path = "persist_tests.rs"]
mod tests;
