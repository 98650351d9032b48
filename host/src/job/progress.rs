//! Where a running job stands, in terms a restarted manager can resume it from: the stage
//! running or next, the outcome so far, the executor's saved state.
//!
//! The job updates its [`Progress`] at every stage boundary together with the trace lines of
//! that boundary (section start or end, warnings, the footer), under one lock: whoever
//! snapshots the progress under the same lock (the manager's heartbeat takes the trace's
//! checkpoint inside [`Progress::read`]) sees the trace and the progress agree — a section is
//! open in the trace exactly when the progress says its stage is running.
//!
//! Owns: [`JobProgress`] (with the [`StoredInstance`] a fleet job runs on) and [`Progress`].
//! Must not touch: stores, the trace's format, GitLab.

use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use super::JobOutcome;
use crate::payload::JobVariable;
use crate::trace::FailureReason;

/// What a restarted manager needs to know to continue a job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobProgress {
    /// When the job's stages began, unix seconds: timeouts count from here across restarts.
    pub started: u64,
    /// Index (into the plan's stages) of the stage running, or of the next one to consider.
    pub stage: usize,
    /// Its name, for operators.
    pub stage_name: String,
    /// Stage `stage` has started: its section is open in the trace and the executor may be
    /// running it (a resumed job reattaches to it instead of starting it).
    pub running: bool,
    /// The failure so far (`None`: none yet).
    pub failure: Option<FailureReason>,
    /// The failing script's exit code.
    pub exit_code: Option<i32>,
    /// The footer's error text so far.
    pub message: String,
    /// Every stage is done and the footer written: only the final update is left.
    pub finished: bool,
    /// The executor's `state()` at the last stage boundary; `None` when it cannot resume.
    pub executor_state: Option<String>,
    /// The job's `secrets:` as resolved before it was accepted: a resumed job goes on with
    /// these values (sealed in the store with the rest), not with a second read — the ID
    /// token may have expired and a stage must see what the earlier ones saw.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<StoredSecret>,
    /// The fleet instance the job runs on (`instance`, `docker-autoscaler`, `docker+machine`):
    /// a resumed job reconnects to this one, never to another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<StoredInstance>,
}

/// The fleet instance of a stored job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredInstance {
    /// The provider's instance id.
    pub id: String,
    /// How the fleet reached it (opaque to jobs; sealed in the store with the rest): what a
    /// manager whose own provider does not know the instance reconnects with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconnect: Option<String>,
}

/// One resolved secret in a job's progress.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSecret {
    /// The variable's name.
    pub key: String,
    /// Its value.
    pub value: String,
    /// Is it a file variable?
    pub file: bool,
}

impl From<&JobVariable> for StoredSecret {
    fn from(v: &JobVariable) -> Self {
        StoredSecret { key: v.key.clone(), value: v.value.clone(), file: v.file }
    }
}

impl StoredSecret {
    /// The job variable it was: masked and raw.
    pub fn variable(&self) -> JobVariable {
        JobVariable {
            key: self.key.clone(),
            value: self.value.clone(),
            public: false,
            masked: true,
            file: self.file,
            raw: true,
        }
    }
}

impl JobProgress {
    /// The outcome so far.
    pub fn outcome(&self) -> JobOutcome {
        JobOutcome {
            failure: self.failure,
            exit_code: self.exit_code,
            message: self.message.clone(),
            aborted: false,
            preparation_failed: false,
        }
    }

    /// Record `outcome` as the outcome so far.
    pub fn set_outcome(&mut self, outcome: &JobOutcome) {
        self.failure = outcome.failure;
        self.exit_code = outcome.exit_code;
        self.message.clone_from(&outcome.message);
    }
}

/// A job's progress, shared between the job and whoever saves it. Cheap to clone.
#[derive(Clone, Default)]
pub struct Progress {
    inner: Arc<Mutex<JobProgress>>,
}

impl Progress {
    /// Progress starting from `progress` (a fresh job's default, or a stored one).
    pub fn new(progress: JobProgress) -> Self {
        Progress { inner: Arc::new(Mutex::new(progress)) }
    }

    /// Hold the progress while updating it together with the trace lines of a boundary.
    /// Never hold the guard across an `.await`.
    pub fn lock(&self) -> MutexGuard<'_, JobProgress> {
        // The fields are plain data: a panic elsewhere leaves them consistent enough to save.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Read the progress and, under the same lock, whatever must agree with it (the trace).
    pub fn read<R>(&self, f: impl FnOnce(&JobProgress) -> R) -> R {
        f(&self.lock())
    }
}
