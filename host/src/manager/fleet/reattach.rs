//! Jobs that go on on their fleet instance after a manager restart. A job's slot is keyed by
//! the job once the job is known ([`Fleet::assign`]), so the fleet state names the jobs whose
//! slots it holds; a restarted manager with a job store holds those slots
//! ([`Fleet::start`]'s `hold_restored`) until the stored job takes its slot back
//! ([`Fleet::reattach`]) or is found gone ([`Fleet::settle_restored`]). The resumed job
//! reconnects to the instance it ran on through a [`Reattached`] lease, never acquiring
//! another; a manager whose provider does not know the instance (another manager took the job
//! over) reaches it with the connect info stored with the job.
//!
//! Owns: job keys, the reattachment of stored jobs, [`Reattached`]. Must not touch: which jobs
//! are stored (the store watcher's), how a job resumes (`crate::job::resume`).

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::Fleet;
use crate::connector::InstanceConnectInfo;
use crate::executor::{ConnectedInstance, InstanceError, InstanceSource};
use crate::trace::TraceSink;

impl Fleet {
    /// The key of job `job`'s slot.
    pub fn job_key(&self, job: i64) -> String {
        format!("{}/job/{job}", self.name)
    }

    /// The job of a key made by [`Fleet::job_key`].
    fn job_of(&self, key: &str) -> Option<i64> {
        key.strip_prefix(&self.name)?.strip_prefix("/job/")?.parse().ok()
    }

    /// The reservation `key` now serves job `job`: rename it to the job's key and return the
    /// key to use from now on (`key` itself if the rename is impossible).
    pub fn assign(&self, key: &str, job: i64) -> String {
        let new = self.job_key(job);
        if self.scaler.rekey(key, &new) {
            new
        } else {
            key.to_string()
        }
    }

    /// Stored job `job` resumes: take back the slot this manager held for it since its
    /// restart. Its key and instance; `None` when this fleet held no slot for it (another
    /// manager ran it, or its instance is gone).
    pub fn reattach(&self, job: i64) -> Option<(String, String)> {
        let key = self.job_key(job);
        let acquisition = self.scaler.reattach(&key)?;
        if let Ok(mut acquired) = self.acquired.lock() {
            acquired.insert(key.clone(), acquisition.instance.clone());
        }
        Some((key, acquisition.instance))
    }

    /// The store watcher read the store: slots held for jobs in none of `stored` (finished, or
    /// failed meanwhile) are given up as abandoned acquisitions; the others stay held (their
    /// job resumes, or another live manager runs it).
    pub fn settle_restored(&self, stored: &HashSet<i64>) {
        let keep = |key: &str| self.job_of(key).is_some_and(|job| stored.contains(&job));
        let released = self.scaler.abandon_restored(&keep);
        if released > 0 {
            let held = self.scaler.restored_keys().len();
            tracing::info!(runner = %self.name, released, held, "slots of jobs no longer stored released");
        }
    }

    /// Connect to `instance` again: as the provider says (fresh credentials), or, when the
    /// provider does not know it, with `stored` (the connect info the job was started with).
    async fn reconnect(&self, instance: &str, stored: Option<&str>) -> Result<ConnectedInstance, InstanceError> {
        let failed = |message: String| InstanceError::Connect { instance: instance.to_string(), message };
        let info = match (self.connector.info(instance).await, stored) {
            (Ok(info), _) => info,
            (Err(e), Some(stored)) => {
                tracing::info!(runner = %self.name, instance, "the provider does not know the instance ({e}); reconnecting with the stored connect info");
                serde_json::from_str::<InstanceConnectInfo>(stored)
                    .map_err(|e| failed(format!("the stored connect info is unreadable: {e}")))?
            }
            (Err(e), None) => return Err(failed(e.to_string())),
        };
        let session = self.connector.connect_with(&info).await.map_err(|e| failed(e.to_string()))?;
        Ok(self.connector.connected(instance.to_string(), session, &info).await)
    }
}

/// The lease of a resumed job: its own instance again, reached without acquiring a slot.
pub struct Reattached {
    /// The fleet that reaches it.
    pub fleet: Arc<Fleet>,
    /// The instance the job ran on.
    pub instance: String,
    /// The connect info stored with the job.
    pub stored: Option<String>,
}

#[async_trait]
impl InstanceSource for Reattached {
    async fn connect(
        &self,
        _key: &str,
        _trace: &dyn TraceSink,
        abort: &CancellationToken,
    ) -> Result<ConnectedInstance, InstanceError> {
        tokio::select! {
            connected = self.fleet.reconnect(&self.instance, self.stored.as_deref()) => connected,
            _ = abort.cancelled() => Err(InstanceError::AbortedConnecting),
        }
    }
}
