//! The job-token half of the runner API as the job path sees it: trace PATCH and job PUT.
//!
//! [`JobApi`] is implemented by the HTTP client (`gitlab::client`) and consumed by the trace
//! uploader (`trace::upload`), so the uploader's state machine can be driven by tests
//! without HTTP and the client never knows about trace buffering.

use std::time::Duration;

/// Runner-side job state sent in `PUT /jobs/:id` (§1.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// Two-phase commit keep-alive while the executor prepares.
    Pending,
    /// Acceptance (two-phase) and keep-alive ("touch").
    Running,
    /// Final: the job succeeded.
    Success,
    /// Final: the job failed (with a failure reason and maybe an exit code).
    Failed,
}

impl JobState {
    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Running => "running",
            JobState::Success => "success",
            JobState::Failed => "failed",
        }
    }
}

/// Body of `PUT /jobs/:id` apart from `token` and `info`, which the client adds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobUpdate {
    /// The state to report.
    pub state: JobState,
    /// Already mapped through the job's `features.failure_reasons` (§3.2).
    pub failure_reason: Option<String>,
    /// Sent only with `Failed` and only when non-zero.
    pub exit_code: Option<i32>,
    /// `crc32:xxxxxxxx` of every trace byte, when known.
    pub checksum: Option<String>,
    /// Trace length in bytes, when known.
    pub bytesize: Option<u64>,
}

impl JobUpdate {
    /// A bare state update without trace output information.
    pub fn state(state: JobState) -> Self {
        JobUpdate { state, failure_reason: None, exit_code: None, checksum: None, bytesize: None }
    }
}

/// What GitLab's `Job-Status` header and status code mean for the running job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteJobStatus {
    /// Keep going.
    Running,
    /// `Job-Status: canceling`: cancel the script gracefully (after_script still runs).
    CancelRequested,
    /// 403, 404 on PUT, or `Job-Status: canceled|failed`: kill everything now.
    Abort,
}

/// Result of `PATCH /jobs/:id/trace` (§1.8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchOutcome {
    /// 202: the server now has `0..=end`; next offset is `end + 1`.
    Accepted,
    /// 416: the server has `server_size` bytes; resend from there.
    RangeMismatch {
        /// Bytes the server has.
        server_size: u64,
    },
    /// 416 without a usable `Range` header (a proxy stripped it): the server's size is unknown.
    RangeUnknown,
    /// 404: stop patching this job.
    NotFound,
    /// 403 (or Job-Status canceled/failed): abort the job.
    Abort,
    /// Anything else (after the client's retries): try again on the next tick.
    Failed(String),
}

/// A PATCH response with the headers that matter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchResponse {
    /// What the PATCH came to.
    pub outcome: PatchOutcome,
    /// What `Job-Status` asks of the job.
    pub remote_status: RemoteJobStatus,
    /// `X-GitLab-Trace-Update-Interval`, when present.
    pub update_interval: Option<Duration>,
}

/// Result of `PUT /jobs/:id` (§1.9).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdateOutcome {
    /// 200: done.
    Accepted,
    /// 202: accepted but not complete; ask again after the given interval.
    AcceptedRetryLater(Duration),
    /// 412: the trace checksum did not match; re-upload the whole trace from 0, then retry.
    TraceValidationFailed,
    /// 403/404 or Job-Status canceled/failed: the job is gone for this runner.
    Abort,
    /// 409 during two-phase commit: the job belongs to someone else.
    Conflict,
    /// GitLab did not decide: no answer at all (connection refused, reset, timeout, a reply
    /// lost or cut) or a retryable status (408, 429, 5xx) after the client's own retries.
    /// Asking again later may work.
    Unavailable(String),
    /// Any other answer (a 4xx GitLab will repeat).
    Failed(String),
}

/// A PUT response with the headers that matter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateResponse {
    /// What the PUT came to.
    pub outcome: UpdateOutcome,
    /// What `Job-Status` asks of the job.
    pub remote_status: RemoteJobStatus,
    /// `X-GitLab-Trace-Update-Interval`, when present.
    pub update_interval: Option<Duration>,
}

/// The calls one running job makes, authenticated by its job token.
#[async_trait::async_trait]
pub trait JobApi: Send + Sync {
    /// `PATCH /jobs/:id/trace` with `Content-Range: offset-(offset+len-1)`.
    async fn patch_trace(&self, offset: u64, content: &[u8]) -> PatchResponse;
    /// `PUT /jobs/:id`.
    async fn update_job(&self, update: &JobUpdate) -> UpdateResponse;
}
