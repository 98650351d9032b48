//! The store watcher: a runner's store is read when the manager starts, then every
//! `health_interval` with Redis (other managers' leases expire) and every `cleanup_interval`
//! with the file store (only this manager writes it: the sweeps find entries nothing runs). An entry this manager owns (a previous run of it crashed), or whose
//! heartbeat is older than `health_timeout` (its manager is gone; with Redis, another one), is
//! claimed — exactly one manager wins it — and handed to `super::received::resume`, which
//! takes the job up again where its last checkpoint left it (or fails, cancels or only cleans
//! it up). A corrupt entry is logged and removed, and the manager goes on. Each pass also tells
//! the runner's fleet which jobs are stored, so the slots it held since a restart for jobs
//! gone meanwhile are released.
//!
//! Owns: the store watcher. Must not touch: resuming one job (`super::received::resume`), how
//! entries are saved (`super::persist`), polling.

use std::sync::Arc;

use super::received::resume::{drop_entry, resume};
use super::{sleep_or_stop, Runner, Shared};
use crate::store::jobs::{Backend, JobStore, JobStoreError, Listed};

type JobSender = tokio::sync::mpsc::UnboundedSender<tokio::task::JoinHandle<()>>;

/// Read `runner`'s store now and then periodically until shutdown, resuming what may be.
pub(super) async fn watch(runner: Arc<Runner>, shared: Arc<Shared>, jobs: JobSender) {
    let Some(store) = runner.settings.store.clone() else { return };
    tracing::info!(runner = %runner.settings.env.identity.short_token, "job store: {}", store.store.describe());
    let every = match store.settings.backend {
        Some(Backend::Redis { .. }) => store.settings.health_interval,
        _ => store.settings.cleanup_interval,
    };
    loop {
        if let Err(e) = scan(&runner, &shared, &*store.store, &jobs).await {
            tracing::warn!(runner = %runner.settings.env.identity.short_token, "reading the job store failed: {e}");
        }
        if shared.shutdown.forceful.is_cancelled() || !sleep_or_stop(every, &shared.shutdown.graceful).await {
            return;
        }
    }
}

/// One pass over the store: claim what is claimable and start resuming it.
async fn scan(
    runner: &Arc<Runner>,
    shared: &Arc<Shared>,
    store: &dyn JobStore,
    jobs: &JobSender,
) -> Result<(), JobStoreError> {
    let Some((settings, store_active)) = runner.settings.store.as_ref().map(|s| (s.settings.clone(), s.active.clone()))
    else {
        return Ok(());
    };
    let me = runner.settings.credentials.system_id.clone();
    // Only this manager writes a file store (its lock says so): its own entries are its
    // previous run's at once. A shared store's are someone's while their heartbeat is fresh.
    let exclusive = matches!(settings.backend, Some(Backend::File { .. }));
    let now = store.now().await?;
    let listing = store.list().await?;
    if let Some(fleet) = &runner.settings.fleet {
        // Slots held since a restart for jobs no longer stored are given up; the others wait
        // for their job (resumed below, or run by another live manager).
        let stored = listing
            .iter()
            .filter_map(|l| match l {
                Listed::Entry(meta) => i64::try_from(meta.job_id).ok(),
                Listed::Corrupt { .. } => None,
            })
            .collect();
        fleet.settle_restored(&stored);
    }
    let stored = super::kube_orphans::stored_ids(&listing, &store_active);
    for listed in listing {
        let meta = match listed {
            Listed::Entry(meta) => meta,
            Listed::Corrupt { job_id, location, error } => {
                tracing::error!(job = ?job_id, %location, "removing a corrupt job store entry: {error}");
                shared.stats.record_resume("corrupt");
                if let Some(id) = job_id {
                    let _ = store.remove(id).await;
                }
                continue;
            }
        };
        let active = store_active.lock().map(|a| a.contains(&(meta.job_id as i64))).unwrap_or(true);
        let expired = now.saturating_sub(meta.heartbeat) > settings.health_timeout.as_secs();
        let claimable = expired || (meta.owner == me && exclusive);
        if active || !claimable {
            if !active && !expired && meta.owner == me {
                // Only with a shared store: a live heartbeat under our own system_id is another
                // process's (a manager restarted so fast its old self's heartbeat is fresh, or
                // a second manager with this system_id). Wait for it to expire.
                tracing::debug!(job = meta.job_id, "stored job of this system_id has a live heartbeat; waiting");
            }
            continue;
        }
        let entry = match store.claim(meta.job_id, &me, settings.health_timeout).await {
            Ok(Some(entry)) => entry,
            Ok(None) => continue,
            Err(e @ JobStoreError::Corrupt { .. }) => {
                drop_entry(&shared.stats, store, meta.job_id, "corrupt", &e.to_string()).await;
                continue;
            }
            Err(e) => {
                tracing::warn!(job = meta.job_id, "claiming a stored job failed: {e}");
                continue;
            }
        };
        if meta.owner != me {
            shared.stats.store_takeovers.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tracing::warn!(job = meta.job_id, previous = %meta.owner, "taking over a job whose manager stopped");
        }
        let handle = tokio::spawn(resume(runner.job_context(shared), entry));
        if jobs.send(handle).is_err() {
            return Ok(());
        }
    }
    super::kube_orphans::sweep_runner(runner, &stored).await;
    Ok(())
}
