//! `POST /jobs/request` (protocol §1.6): Workhorse long polling with `last_update`, and what
//! each answer means for the poller (a job, no job, ask again at once, unhealthy, a payload
//! that does not decode).

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::http::{error_message, header_str};
#[cfg(doc)]
use super::VersionInfo;
use super::{api_base_url, describe_reqwest_error, GitLabClient, RunnerCredentials};
use crate::payload::JobResponse;

/// A job handed out by `POST /jobs/request`.
#[derive(Debug, Clone)]
pub struct ReceivedJob {
    /// The response body exactly as received.
    pub raw: bytes::Bytes,
    /// The decoded payload.
    pub job: JobResponse,
    /// The job came from a Runway router that takes declines: a runner that cannot prepare
    /// the job hands it back ([`super::JobClient::decline`]) instead of failing it.
    pub declinable: bool,
}

/// The `session` of a job request (gitlab-runner's `SessionInfo`): where GitLab Workhorse
/// reaches the runner's session server for this job's terminal, the certificate it pins and the
/// `Authorization` value it sends. GitLab keeps it with the job it hands out.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct JobSessionInfo {
    /// `https://<advertise address>/session/<id>`.
    pub url: String,
    /// The session server's certificate, PEM.
    pub certificate: String,
    /// The exact `Authorization` header value.
    pub authorization: String,
}

/// Request header a runner sends to say it declines jobs it cannot prepare, and response
/// header a Runway router answers a job with to say it takes declines. GitLab ignores the
/// header, so the runner sends it everywhere and declines only when the answer has it.
pub const ROUTER_FEATURES_HEADER: &str = "runway-router-features";

/// The feature of [`ROUTER_FEATURES_HEADER`]: `POST /jobs/:id/runner_provisioning` with
/// `status=declined` (seed 002's proposal).
pub const DECLINE_FEATURE: &str = "runner_provisioning";

/// What a job request came to (§1.6 runner-side handling).
#[derive(Debug, Clone)]
pub enum RequestJobResult {
    /// 201.
    Job(Box<ReceivedJob>),
    /// 204: healthy, nothing to do.
    NoJob,
    /// 204 that ended a server-side wait (Workhorse long poll) or moved the queue value on:
    /// ask again at once instead of after `check_interval`.
    PollAgain,
    /// 403 or a transport error: counts toward `unhealthy_requests_limit`.
    Unhealthy(UnhealthyRequest),
    /// Anything else (409, 422, 429/5xx after retries): healthy, no job.
    Failed(String),
    /// 201 with a payload that does not decode (missing or mistyped fields). The job is
    /// assigned to us, so it must be failed with `runner_system_failure`, not left hanging.
    BadPayload(Box<BadJob>),
}

/// Why a job request counts toward `unhealthy_requests_limit`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnhealthyRequest {
    /// 403: GitLab refused the runner's token (invalid, expired or revoked); GitLab's words.
    #[error("request_job: forbidden (403): {0}")]
    Forbidden(String),
    /// The request did not get an answer (a bad URL, a transport error).
    #[error("{0}")]
    Unanswered(String),
}

/// A job whose payload does not decode, identified well enough to fail it.
#[derive(Debug, Clone)]
pub struct BadJob {
    /// Job id.
    pub id: i64,
    /// Job token (to fail the job with).
    pub token: String,
    /// Which field is wrong and how.
    pub error: String,
    /// `features.failure_reasons`, when readable.
    pub failure_reasons: Vec<String>,
}

impl BadJob {
    /// Pull `id` and `token` out of a payload that does not decode as a job.
    pub fn identify(raw: &[u8], error: String) -> Option<BadJob> {
        let value: Value = serde_json::from_slice(raw).ok()?;
        let id = value.get("id")?.as_i64()?;
        let token = value.get("token")?.as_str()?.to_string();
        let failure_reasons = value
            .pointer("/features/failure_reasons")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_default();
        Some(BadJob { id, token, error, failure_reasons })
    }
}

impl GitLabClient {
    /// `POST /jobs/request` (§1.6), echoing the last `X-GitLab-Last-Update` seen for this
    /// (URL, token) as `last_update`. May block for GitLab's long-poll window; it is drop-safe,
    /// so `select!` it against shutdown. `info` is this runner's [`VersionInfo`], or — for the
    /// router — the `info` a downstream runner sent.
    pub async fn request_job(
        &self,
        creds: &RunnerCredentials,
        info: &(impl serde::Serialize + Sync),
    ) -> RequestJobResult {
        self.request_job_with_session(creds, info, None).await
    }

    /// [`GitLabClient::request_job`] with the job's `session` (sent as gitlab-runner sends it
    /// when its session server runs).
    pub async fn request_job_with_session(
        &self,
        creds: &RunnerCredentials,
        info: &(impl serde::Serialize + Sync),
        session: Option<&JobSessionInfo>,
    ) -> RequestJobResult {
        let endpoint = super::Endpoint::RequestJob;
        let base = match api_base_url(&creds.url) {
            Ok(b) => b,
            Err(e) => return RequestJobResult::Unhealthy(UnhealthyRequest::Unanswered(e.to_string())),
        };
        let url = match Self::endpoint_url(&base, "jobs/request") {
            Ok(u) => u,
            Err(e) => return RequestJobResult::Unhealthy(UnhealthyRequest::Unanswered(e.to_string())),
        };
        let mut body = json!({ "token": creds.token, "info": info });
        if !creds.system_id.is_empty() {
            body["system_id"] = creds.system_id.clone().into();
        }
        if let Some(session) = session {
            body["session"] = json!(session);
        }
        let sent_last_update = self.stored_last_update(&base, &creds.token);
        if let Some(last_update) = &sent_last_update {
            body["last_update"] = last_update.clone().into();
        }
        let request = Self::runner_token_request(&creds.token, &body);
        let decorate = |rb| request(rb).header(ROUTER_FEATURES_HEADER, DECLINE_FEATURE);
        let response = match self.execute(endpoint, Method::POST, &url, decorate).await {
            Ok(r) => r,
            Err(e) => return RequestJobResult::Unhealthy(UnhealthyRequest::Unanswered(format!("request_job: {e}"))),
        };
        self.remember_last_update(&base, &creds.token, response.headers());
        // GitLab's correlation ID for the request; one of our own when it gives none.
        let correlation_id = header_str(response.headers(), "x-request-id")
            .map(str::to_string)
            .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
        match response.status() {
            StatusCode::CREATED => {
                let declinable = header_str(response.headers(), ROUTER_FEATURES_HEADER)
                    .is_some_and(|v| v.split(',').any(|f| f.trim() == DECLINE_FEATURE));
                let is_json = header_str(response.headers(), "content-type").is_some_and(|t| t.contains("json"));
                let raw = match response.bytes().await {
                    Ok(b) => b,
                    Err(e) => {
                        return RequestJobResult::Failed(format!(
                            "request_job: reading the job payload: {}",
                            describe_reqwest_error(&e)
                        ))
                    }
                };
                if !is_json {
                    return RequestJobResult::Failed("request_job: 201 response is not JSON".into());
                }
                match JobResponse::from_json(&raw) {
                    Ok(mut job) => {
                        job.request_correlation_id = correlation_id;
                        RequestJobResult::Job(Box::new(ReceivedJob { raw, job, declinable }))
                    }
                    Err(error) => match BadJob::identify(&raw, error.to_string()) {
                        Some(bad) => RequestJobResult::BadPayload(Box::new(bad)),
                        None => RequestJobResult::Failed("request_job: 201 payload has no job id and token".into()),
                    },
                }
            }
            StatusCode::NO_CONTENT => {
                let long_polled = header_str(response.headers(), "gitlab-ci-builds-polling") == Some("yes");
                let new_value = header_str(response.headers(), "x-gitlab-last-update").filter(|v| !v.is_empty());
                // Ask again at once when Workhorse ended a long poll (the server already
                // waited), or when the queue value moved on: the next request long-polls on the
                // new value server-side, so this costs one request per queue change, never a loop.
                let moved_on =
                    new_value.is_some_and(|v| sent_last_update.as_deref() != Some(v)) && sent_last_update.is_some();
                if (long_polled && new_value.is_none()) || moved_on {
                    RequestJobResult::PollAgain
                } else {
                    RequestJobResult::NoJob
                }
            }
            StatusCode::FORBIDDEN => {
                RequestJobResult::Unhealthy(UnhealthyRequest::Forbidden(error_message(response).await))
            }
            status => RequestJobResult::Failed(format!(
                "request_job: HTTP {}: {}",
                status.as_u16(),
                error_message(response).await
            )),
        }
    }

    /// The stored `X-GitLab-Last-Update` for this runner, if any (what the next request sends).
    pub fn last_update(&self, creds: &RunnerCredentials) -> Option<String> {
        api_base_url(&creds.url).ok().and_then(|base| self.stored_last_update(&base, &creds.token))
    }
}
