//! The job-token calls of one running job (protocol §1.8–§1.9): `PATCH /jobs/:id/trace` and
//! `PUT /jobs/:id`, mapped onto [`JobApi`]'s outcomes; `GET /job`, which says whether GitLab
//! handed the job out waiting for acceptance (two-phase commit) or already `running`.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::{Method, RequestBuilder, Url};
use serde_json::{json, Value};

use super::http::{error_message, range_end, remote_status, update_interval};
use super::{api_base_url, ApiError, Endpoint, GitLabClient, VersionInfo};
use crate::gitlab::api::{
    JobApi, JobState, JobUpdate, PatchOutcome, PatchResponse, RemoteJobStatus, UpdateOutcome, UpdateResponse,
};
use crate::gitlab::retry::is_retryable_status;

/// The job-token calls of one job (implements [`JobApi`]).
pub struct JobClient {
    client: Arc<GitLabClient>,
    base: Url,
    job_id: i64,
    token: String,
    info: VersionInfo,
    debug_trace: bool,
}

impl JobClient {
    /// `url` is the runner URL the job came from.
    pub fn new(
        client: Arc<GitLabClient>,
        url: &str,
        job_id: i64,
        job_token: &str,
        info: VersionInfo,
    ) -> Result<Self, ApiError> {
        Ok(JobClient {
            client,
            base: api_base_url(url)?,
            job_id,
            token: job_token.to_string(),
            info,
            debug_trace: false,
        })
    }

    /// Sets `?debug_trace=` on trace patches (`CI_DEBUG_TRACE` is on).
    pub fn with_debug_trace(mut self, debug_trace: bool) -> Self {
        self.debug_trace = debug_trace;
        self
    }

    /// The job this client reports on.
    pub fn job_id(&self) -> i64 {
        self.job_id
    }

    /// Hand the job back to the Runway router it came from (`POST /jobs/:id/runner_provisioning`
    /// with `status=declined`, seed 002): this runner could not prepare it, another may. Only
    /// for jobs whose [`super::ReceivedJob::declinable`] is set; GitLab itself has no such call.
    pub async fn decline(&self, reason: &str) -> Result<(), ApiError> {
        let url = GitLabClient::endpoint_url(&self.base, &format!("jobs/{}/runner_provisioning", self.job_id))?;
        let body = json!({ "token": self.token, "status": "declined", "reason": reason, "info": self.info });
        let decorate =
            |rb: RequestBuilder| rb.header("JOB-TOKEN", &self.token).header(ACCEPT, "application/json").json(&body);
        let response = self
            .client
            .execute(Endpoint::RunnerProvisioning, Method::POST, &url, decorate)
            .await
            .map_err(|e| e.at(Endpoint::RunnerProvisioning))?;
        match response.status().as_u16() {
            200..=299 => Ok(()),
            status => Err(ApiError::Status {
                endpoint: Endpoint::RunnerProvisioning,
                status,
                message: error_message(response).await,
            }),
        }
    }

    /// Does GitLab hold the job `pending` until this runner accepts it (two-phase commit)?
    ///
    /// GitLab keeps a job handed to a runner advertising `two_phase_job_commit` pending only
    /// with its `allow_runner_job_acknowledgement` feature flag on (GitLab 18.5 on, parked
    /// since); otherwise the job is `running` from the handout and `PUT state=pending` is
    /// refused with 400. The job payload says neither, but `GET /api/v4/job` with the job
    /// token does: GitLab authenticates the token of a job waiting for acknowledgement and
    /// answers its `status`, `pending`. Any other status (or no usable answer) is "not held".
    pub async fn held_pending(&self) -> Result<bool, ApiError> {
        let url = GitLabClient::endpoint_url(&self.base, "job")?;
        let decorate = |rb: RequestBuilder| rb.header("JOB-TOKEN", &self.token).header(ACCEPT, "application/json");
        let response = self
            .client
            .execute(Endpoint::CurrentJob, Method::GET, &url, decorate)
            .await
            .map_err(|e| e.at(Endpoint::CurrentJob))?;
        match response.status().as_u16() {
            200 => {
                let text = response
                    .text()
                    .await
                    .map_err(|e| ApiError::Transport { endpoint: Endpoint::CurrentJob, message: e.to_string() })?;
                let job: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                Ok(job.get("status").and_then(Value::as_str) == Some("pending"))
            }
            status => {
                Err(ApiError::Status { endpoint: Endpoint::CurrentJob, status, message: error_message(response).await })
            }
        }
    }

    /// The `PUT /jobs/:id` body for `update`.
    pub fn update_body(&self, update: &JobUpdate) -> Value {
        let mut body = json!({ "info": self.info, "token": self.token, "state": update.state.as_str() });
        if let Some(reason) = update.failure_reason.as_deref().filter(|r| !r.is_empty()) {
            body["failure_reason"] = reason.into();
        }
        let mut output = serde_json::Map::new();
        if let Some(checksum) = &update.checksum {
            body["checksum"] = checksum.clone().into();
            output.insert("checksum".into(), checksum.clone().into());
        }
        if let Some(size) = update.bytesize {
            output.insert("bytesize".into(), size.into());
        }
        body["output"] = Value::Object(output);
        if let (JobState::Failed, Some(code)) = (update.state, update.exit_code) {
            if code != 0 {
                body["exit_code"] = code.into();
            }
        }
        body
    }
}

#[async_trait::async_trait]
impl JobApi for JobClient {
    async fn patch_trace(&self, offset: u64, content: &[u8]) -> PatchResponse {
        let failed = |message: String| PatchResponse {
            outcome: PatchOutcome::Failed(message),
            remote_status: RemoteJobStatus::Running,
            update_interval: None,
        };
        if content.is_empty() {
            return failed("patch_trace: empty patches are not sent".into());
        }
        let mut url = match GitLabClient::endpoint_url(&self.base, &format!("jobs/{}/trace", self.job_id)) {
            Ok(u) => u,
            Err(e) => return failed(e.to_string()),
        };
        url.query_pairs_mut().append_pair("debug_trace", if self.debug_trace { "true" } else { "false" });
        let end = offset + content.len() as u64 - 1;
        let range = format!("{offset}-{end}");
        let decorate = |rb: RequestBuilder| {
            rb.header("JOB-TOKEN", &self.token)
                .header(CONTENT_TYPE, "text/plain")
                .header("Content-Range", &range)
                .body(content.to_vec())
        };
        let response = match self.client.execute(Endpoint::PatchTrace, Method::PATCH, &url, decorate).await {
            Ok(r) => r,
            Err(e) => return failed(format!("patch_trace: {e}")),
        };
        let headers = response.headers().clone();
        let status = response.status().as_u16();
        let mut remote_status = remote_status(&headers);
        let outcome = match status {
            202 => match range_end(&headers) {
                Some(size) if size != end + 1 => PatchOutcome::RangeMismatch { server_size: size },
                _ => PatchOutcome::Accepted,
            },
            416 => match range_end(&headers) {
                Some(size) => PatchOutcome::RangeMismatch { server_size: size },
                None => PatchOutcome::RangeUnknown,
            },
            403 => {
                remote_status = RemoteJobStatus::Abort;
                PatchOutcome::Abort
            }
            404 => PatchOutcome::NotFound,
            other => PatchOutcome::Failed(format!("patch_trace: HTTP {other}: {}", error_message(response).await)),
        };
        let outcome = if remote_status == RemoteJobStatus::Abort && outcome != PatchOutcome::NotFound {
            PatchOutcome::Abort
        } else {
            outcome
        };
        PatchResponse { outcome, remote_status, update_interval: update_interval(&headers) }
    }

    async fn update_job(&self, update: &JobUpdate) -> UpdateResponse {
        let failed = |message: String| UpdateResponse {
            outcome: UpdateOutcome::Failed(message),
            remote_status: RemoteJobStatus::Running,
            update_interval: None,
        };
        let url = match GitLabClient::endpoint_url(&self.base, &format!("jobs/{}", self.job_id)) {
            Ok(u) => u,
            Err(e) => return failed(e.to_string()),
        };
        let body = self.update_body(update);
        let decorate =
            |rb: RequestBuilder| rb.header("JOB-TOKEN", &self.token).header(ACCEPT, "application/json").json(&body);
        let response = match self.client.execute(Endpoint::UpdateJob, Method::PUT, &url, decorate).await {
            Ok(r) => r,
            Err(e) => {
                return UpdateResponse {
                    outcome: UpdateOutcome::Unavailable(format!("update_job: {e}")),
                    remote_status: RemoteJobStatus::Running,
                    update_interval: None,
                }
            }
        };
        let headers = response.headers().clone();
        let mut remote_status = remote_status(&headers);
        let interval = update_interval(&headers);
        let is_final = matches!(update.state, JobState::Success | JobState::Failed);
        let outcome = match response.status().as_u16() {
            // After a final update GitLab reports the state we just set (`failed`); that is
            // not a reason to abort anything.
            200 if is_final || remote_status != RemoteJobStatus::Abort => UpdateOutcome::Accepted,
            200 => UpdateOutcome::Abort,
            202 => UpdateOutcome::AcceptedRetryLater(interval.unwrap_or(Duration::from_secs(3))),
            412 => UpdateOutcome::TraceValidationFailed,
            403 | 404 => {
                remote_status = RemoteJobStatus::Abort;
                UpdateOutcome::Abort
            }
            409 => UpdateOutcome::Conflict,
            other if is_retryable_status(other) => {
                UpdateOutcome::Unavailable(format!("update_job: HTTP {other}: {}", error_message(response).await))
            }
            other => UpdateOutcome::Failed(format!("update_job: HTTP {other}: {}", error_message(response).await)),
        };
        UpdateResponse { outcome, remote_status, update_interval: interval }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gitlab::client::ClientOptions;

    #[test]
    fn update_body_sends_exit_code_only_for_nonzero_failures() {
        let client = Arc::new(GitLabClient::new(ClientOptions::default()).expect("client"));
        let job = JobClient::new(client, "http://127.0.0.1:1", 7, "jt", VersionInfo::default()).expect("job client");
        let mut update = JobUpdate {
            state: JobState::Failed,
            failure_reason: Some("script_failure".into()),
            exit_code: Some(2),
            checksum: Some("crc32:0000abcd".into()),
            bytesize: Some(5),
        };
        let body = job.update_body(&update);
        assert_eq!(body["exit_code"], 2);
        assert_eq!(body["output"], json!({"checksum": "crc32:0000abcd", "bytesize": 5}));
        assert_eq!(body["checksum"], "crc32:0000abcd");
        assert_eq!(body["token"], "jt");
        update.exit_code = Some(0);
        assert!(job.update_body(&update).get("exit_code").is_none());
        update.state = JobState::Success;
        update.exit_code = Some(3);
        update.failure_reason = None;
        let body = job.update_body(&update);
        assert!(body.get("exit_code").is_none() && body.get("failure_reason").is_none());
    }
}
