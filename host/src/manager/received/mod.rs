//! One job GitLab handed to this runner, on GitLab's side, from the moment it arrives to its
//! final update. [`Received`] is that job as one value — its side at GitLab (acceptance,
//! trace upload, store entry: [`GitLabSide`]), the capacity it holds ([`Seat`]) and the fleet
//! slot reserved for it ([`Reservation`]) — built from a narrow [`JobContext`], and
//! [`Received::end`] is its only way out: the teardown is written once.
//!
//! - [`context`]: what a job needs of its runner and of the manager, the capacity it waits
//!   for, the fleet slot;
//! - [`gitlab`]: the job's hooks (`crate::job::JobHooks`): the acceptance PUT, the trace
//!   uploader, the store checkpoints, the stage reports, and the final update;
//! - [`fresh`]: a job from the poll: keep-alives while it waits for capacity, the run, a
//!   decline back to a Runway router;
//! - [`resume`]: a job from the store: what GitLab says of it, then go on, abandon, or only
//!   clean up;
//! - [`bad`]: a job whose payload cannot be used, failed at once;
//! - [`terminal`]: the job's web terminal session and how long it holds the job;
//! - [`exec_terminal`]: a terminal's shell in one of the job's containers (Docker, Kubernetes).
//!
//! Owns: a received job's GitLab-side lifecycle. Must not touch: polling and the store
//! watcher (`crate::manager`), how a job runs (`crate::job`, which knows no GitLab), what a
//! store entry holds (`crate::manager::persist`).

pub(crate) mod bad;
pub(crate) mod context;
pub(crate) mod exec_terminal;
pub(crate) mod fresh;
pub(crate) mod gitlab;
pub(crate) mod resume;
pub(crate) mod terminal;

use crate::job::{JobCleanup, JobOutcome};
use crate::trace::FailureReason;
pub(crate) use context::{Capacity, JobContext, Reservation, Seat};
pub(crate) use gitlab::GitLabSide;

/// A job GitLab handed to this runner, whole: ended once, by [`Received::end`].
pub(crate) struct Received {
    id: i64,
    /// `features.failure_reasons` of the payload: which reasons GitLab understands.
    failure_reasons: Vec<String>,
    side: GitLabSide,
    /// The capacity held (none for a job failed before it needed any).
    seat: Option<Seat>,
    reservation: Option<Reservation>,
}

/// How a received job leaves this runner.
pub(crate) enum Ending {
    /// GitLab is told how the job ended (after accepting a job that never was), then the
    /// executor is cleaned up.
    Reported(JobOutcome, Option<JobCleanup>),
    /// GitLab is told nothing more (declined back to the router, no longer ours): the
    /// executor is only cleaned up, and the fleet slot freed as after a system failure.
    Unreported(JobCleanup),
    /// Another manager owns the job now: its trace, update, cleanup and store entry are theirs.
    Lost,
}

impl Received {
    /// Job `id` at GitLab (`side`), holding `seat` and `reservation`.
    pub(crate) fn new(
        id: i64,
        failure_reasons: Vec<String>,
        side: GitLabSide,
        seat: Option<Seat>,
        reservation: Option<Reservation>,
    ) -> Self {
        Received { id, failure_reasons, side, seat, reservation }
    }

    /// The job's side at GitLab: its hooks while it runs.
    pub(crate) fn side(&self) -> &GitLabSide {
        &self.side
    }

    /// The one teardown: free the job's slot, stop watching for a shutdown, report (or not),
    /// stop the keep-alives, clean up the executor — a plugin whose `cleanup` hangs holds
    /// this job's capacity until its call_timeout, never the job's state —, drop the store
    /// entry, free the fleet slot, give the capacity back.
    pub(crate) async fn end(self, ending: Ending) {
        let Received { id, failure_reasons, side, seat, reservation } = self;
        let vacating = seat.map(Seat::vacate);
        let (cleanup, system_failure) = match ending {
            Ending::Lost => {
                side.stop_keepalive();
                return;
            }
            Ending::Reported(outcome, cleanup) => {
                side.report(id, &outcome, &failure_reasons).await;
                (cleanup, outcome.failure == Some(FailureReason::RunnerSystemFailure))
            }
            Ending::Unreported(cleanup) => (Some(cleanup), true),
        };
        side.stop_keepalive();
        if let Some(cleanup) = cleanup {
            cleanup.run().await;
        }
        side.forget().await;
        if let Some(reservation) = reservation {
            reservation.finish(system_failure).await;
        }
        if let Some(vacating) = vacating {
            vacating.done();
        }
    }
}

/// Now as unix seconds.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
