//! The router's held jobs in the job store: one entry per job (owner = the router's id, stage =
//! its phase, body sealed: payload, upstream, phase, the downstream holding it, who gave it
//! back), written on every change before the change is acted on outside (a job is saved as
//! offered before the runner gets it), refreshed by a heartbeat, removed when the job ends.
//! At start and every `health_interval`, entries of routers whose heartbeat is older than
//! `health_timeout` — or of this router before a restart — are claimed and held again.
//!
//! Owns the entry format and the save ordering per job (versions under the job's own lock, so
//! an older snapshot never overwrites a newer one and nothing is saved after a removal). Must
//! not decide transitions (`state`, `upstream`, `downstream` do).

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::state::{Handed, Phase, Routed};
use super::Inner;
use crate::store::jobs::{Entry, EntryMeta, JobStoreError, Listed};

/// The sealed body of an entry.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    token: String,
    upstream: usize,
    upstream_url: String,
    payload: String,
    phase: String,
    downstream: Option<String>,
    declined: Vec<String>,
    seq: u64,
    upstream_trace_size: u64,
    #[serde(default = "yes")]
    two_phase: bool,
}

fn yes() -> bool {
    true
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The entry of `job` as it is now.
fn entry_of(inner: &Inner, job: &Routed) -> Entry {
    let names = |d: usize| inner.settings.downstreams.get(d).map(|x| x.name.clone());
    let record = Record {
        token: job.origin.token.clone(),
        upstream: job.origin.upstream,
        upstream_url: inner.settings.upstreams.get(job.origin.upstream).map(|u| u.url.clone()).unwrap_or_default(),
        payload: String::from_utf8_lossy(&job.origin.raw).into_owned(),
        phase: job.phase.name().to_string(),
        downstream: job.phase.downstream().and_then(names),
        declined: job.declined.iter().filter_map(|d| names(*d)).collect(),
        seq: job.seq,
        upstream_trace_size: job.upstream_trace_size,
        two_phase: job.two_phase,
    };
    Entry {
        meta: EntryMeta {
            job_id: u64::try_from(job.origin.id).unwrap_or_default(),
            owner: inner.settings.router_id.clone(),
            created: unix_now(),
            heartbeat: 0,
            resumes: 0,
            stage: job.phase.name().to_string(),
            project: job.origin.project_path.clone(),
        },
        body: serde_json::to_vec(&record).unwrap_or_default(),
    }
}

/// Save job `id` as it is now (skipped when a newer state was saved already). A job another
/// router took over is let go of.
pub(super) async fn save(inner: &Arc<Inner>, id: i64) {
    save_inner(inner, id, false).await;
}

async fn save_inner(inner: &Arc<Inner>, id: i64, heartbeat: bool) {
    let Some(store) = inner.settings.store.clone() else { return };
    let Some((entry, version, lock)) = ({
        let st = inner.lock();
        st.jobs.get(&id).map(|j| (entry_of(inner, j), j.version, j.saved.clone()))
    }) else {
        return;
    };
    let mut saved = lock.lock().await;
    if *saved == u64::MAX || (*saved >= version && !heartbeat) {
        return;
    }
    match store.save(&entry).await {
        Ok(()) => *saved = (*saved).max(version),
        Err(JobStoreError::Lost(_)) => {
            tracing::warn!(job = id, "another router took this job over; letting it go");
            *saved = u64::MAX;
            inner.lock().remove(id);
        }
        Err(e) => tracing::error!(job = id, "saving the routed job: {e}"),
    }
}

/// Book and save jobs handed to waiting requests.
pub(super) async fn after_hand_out(inner: &Arc<Inner>, handed: Vec<Handed>) {
    for h in handed {
        inner.stats.dispatched(h.downstream, &h.project_path, h.waited);
        save(inner, h.id).await;
    }
}

/// The job was let go of (`removed` is what the state held): delete its entry.
pub(super) async fn forget(inner: &Arc<Inner>, removed: &Routed) {
    let mut saved = removed.saved.lock().await;
    *saved = u64::MAX;
    if let Some(store) = &inner.settings.store {
        if let Err(e) = store.remove(u64::try_from(removed.origin.id).unwrap_or_default()).await {
            tracing::error!(job = removed.origin.id, "removing the routed job from the store: {e}");
        }
    }
}

/// Refresh every held job's heartbeat, then take over what dead routers left.
pub(super) async fn heartbeat(inner: &Arc<Inner>) {
    let ids: Vec<i64> = inner.lock().jobs.keys().copied().collect();
    for id in ids {
        save_inner(inner, id, true).await;
    }
    take_over(inner).await;
}

/// Claim every entry not held here whose owner is this router (a restart) or silent for
/// `health_timeout`, and hold its job again.
pub(super) async fn take_over(inner: &Arc<Inner>) {
    let Some(store) = inner.settings.store.clone() else { return };
    let listed = match store.list().await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("listing the router store: {e}");
            return;
        }
    };
    for item in listed {
        let meta = match item {
            Listed::Entry(meta) => meta,
            Listed::Corrupt { location, error, .. } => {
                tracing::warn!(%location, "unreadable router store entry left alone: {error}");
                continue;
            }
        };
        let Ok(id) = i64::try_from(meta.job_id) else { continue };
        if inner.lock().jobs.contains_key(&id) {
            continue;
        }
        let claimed = store.claim(meta.job_id, &inner.settings.router_id, inner.settings.health_timeout).await;
        match claimed {
            Ok(Some(entry)) => match restore(inner, id, &entry.body) {
                Ok(phase) => {
                    tracing::info!(job = id, phase, previous_owner = %meta.owner, "holding a stored job again");
                    let handed = {
                        let mut st = inner.lock();
                        st.hand_out(&inner.settings.downstreams, inner.settings.accept_timeout)
                    };
                    after_hand_out(inner, handed).await;
                    save(inner, id).await;
                }
                Err(e) => tracing::error!(job = id, "stored routed job cannot be read: {e}"),
            },
            Ok(None) => {}
            Err(e) => tracing::error!(job = id, "claiming a stored routed job: {e}"),
        }
    }
    inner.wake.notify_waiters();
}

/// Why a stored job cannot be held again (only logged).
#[derive(Debug, thiserror::Error)]
enum RestoreError {
    /// The entry's body is not a record of this format.
    #[error("{0}")]
    Record(#[from] serde_json::Error),
    /// The job's GitLab is no longer configured.
    #[error("its GitLab {0} is no longer an upstream")]
    UpstreamGone(String),
    /// The stored payload does not decode.
    #[error("{0}")]
    Payload(#[from] crate::payload::PayloadError),
}

/// Put the stored job back into the state.
fn restore(inner: &Arc<Inner>, id: i64, body: &[u8]) -> Result<&'static str, RestoreError> {
    let record: Record = serde_json::from_slice(body)?;
    let settings = &inner.settings;
    let index = |name: &str| settings.downstreams.iter().position(|d| d.name == name);
    let upstream = match settings.upstreams.get(record.upstream) {
        Some(u) if u.url == record.upstream_url => record.upstream,
        _ => settings
            .upstreams
            .iter()
            .position(|u| u.url == record.upstream_url)
            .ok_or_else(|| RestoreError::UpstreamGone(record.upstream_url.clone()))?,
    };
    let mut job = Routed::from_payload(id, record.token, upstream, bytes::Bytes::from(record.payload), record.seq)?;
    job.declined = record.declined.iter().filter_map(|n| index(n)).collect();
    job.upstream_trace_size = record.upstream_trace_size;
    job.two_phase = record.two_phase;
    let downstream = record.downstream.as_deref().and_then(index);
    let now = Instant::now();
    job.phase = match record.phase.as_str() {
        "accepted" => Phase::Accepted { downstream, last_seen: now },
        "offered" => Phase::Offered { downstream, deadline: now + settings.accept_timeout },
        _ => Phase::Queued,
    };
    job.version = 1;
    let name = job.phase.name();
    inner.lock().insert(job);
    Ok(name)
}
