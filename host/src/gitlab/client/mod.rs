//! The runner API client (protocol §0–§1.9): registration, verify, unregister, job request with
//! long polling, and — through [`JobClient`] — the job-token calls behind [`JobApi`].
//!
//! Every request carries `User-Agent: runway <version> (<os>/<arch>)` and a fresh
//! `X-Request-Id`; runner-token calls add `RUNNER-TOKEN`, job-token calls `JOB-TOKEN`.
//! Retryable statuses go through [`RetryPolicy`] with the body rebuilt per attempt.
//!
//! Cancellation: every call is an ordinary future that owns nothing shared while awaiting, so
//! dropping it aborts the HTTP request cleanly. [`GitLabClient::request_job`] can block for
//! GitLab's whole long-poll window (~50 s); callers must `tokio::select!` it against their
//! shutdown/capacity signal rather than let it hold a slot.
//!
//! This file owns the client itself (endpoints, errors, the retrying send loop); the calls
//! live beside it: [`setup`] (options, TLS), [`info`] (the runner `info` and credentials),
//! [`runner`] (register, verify, unregister), [`request`] (job request), [`job`] (trace PATCH,
//! job PUT, a router's decline), [`forward`] (the router's pass-through), `http` (response
//! header helpers). Metrics are not known here: a caller may
//! observe every attempt through [`RequestHook`].
//!
//! [`JobApi`]: crate::gitlab::api::JobApi

pub mod artifacts;
pub mod forward;
mod http;
pub mod info;
pub mod job;
pub mod request;
pub mod runner;
pub mod setup;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, ACCEPT, USER_AGENT};
use reqwest::{Method, RequestBuilder, Response, Url};
use serde_json::Value;

use crate::gitlab::retry::{is_retryable_status, RetryPolicy};
use http::header_str;

pub use artifacts::{ArtifactUpload, DownloadOutcome, UploadOutcome};
pub use info::{
    ConfigInfo, FeaturesInfo, RegisterParams, ResetTokenResponse, RunnerCredentials, RunnerDetails, VersionInfo,
};
pub use job::JobClient;
pub use request::{BadJob, JobSessionInfo, ReceivedJob, RequestJobResult, UnhealthyRequest};
pub use setup::ClientOptions;

/// Which API call a request belongs to (for metrics and error messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `POST /runners`.
    RegisterRunner,
    /// `POST /runners/verify`.
    VerifyRunner,
    /// `DELETE /runners`.
    UnregisterRunner,
    /// `DELETE /runners/managers`.
    UnregisterRunnerManager,
    /// `POST /runners/reset_authentication_token`.
    ResetToken,
    /// `POST /jobs/request`.
    RequestJob,
    /// `PUT /jobs/:id`.
    UpdateJob,
    /// `PATCH /jobs/:id/trace`.
    PatchTrace,
    /// `POST /jobs/:id/artifacts`.
    UploadArtifacts,
    /// `GET /jobs/:id/artifacts`.
    DownloadArtifacts,
    /// `POST /jobs/:id/runner_provisioning` (a Runway router's decline).
    RunnerProvisioning,
    /// `GET /job`: the job of a job token, with its status.
    CurrentJob,
}

impl Endpoint {
    /// The label GitLab Runner uses in `gitlab_runner_api_request_statuses_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::RegisterRunner => "register_runner",
            Endpoint::VerifyRunner => "verify_runner",
            Endpoint::UnregisterRunner => "unregister_runner",
            Endpoint::UnregisterRunnerManager => "unregister_runner_manager",
            Endpoint::ResetToken => "reset_token",
            Endpoint::RequestJob => "request_job",
            Endpoint::UpdateJob => "update_job",
            Endpoint::PatchTrace => "patch_trace",
            Endpoint::UploadArtifacts => "upload_artifacts",
            Endpoint::DownloadArtifacts => "download_artifacts",
            Endpoint::RunnerProvisioning => "runner_provisioning",
            Endpoint::CurrentJob => "current_job",
        }
    }
}

/// One HTTP attempt, as a [`RequestHook`] sees it.
#[derive(Debug, Clone, Copy)]
pub struct RequestRecord<'a> {
    /// What the request is for.
    pub endpoint: Endpoint,
    /// `GET`, `POST`, ...
    pub method: &'a str,
    /// The URL path (`/api/v4/jobs/request`).
    pub path: &'a str,
    /// The status; `None` on a transport error.
    pub status: Option<u16>,
    /// Time to the response headers.
    pub duration: Duration,
    /// 1 for the first attempt of a logical request, 2 for its first retry, ...
    pub attempt: u32,
}

/// Called once per HTTP attempt. Defined here so observers (metrics) depend on the client,
/// never the other way round.
pub type RequestHook = Arc<dyn Fn(&RequestRecord<'_>) + Send + Sync>;

/// Errors of the runner-token management calls.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The runner URL is not an http(s) URL.
    #[error("invalid GitLab URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as configured.
        url: String,
        /// Why it is rejected.
        reason: String,
    },
    /// The HTTP client could not be built (TLS files).
    #[error("cannot set up the HTTP client: {0}")]
    ClientSetup(String),
    /// A local file of the call (an artifacts archive) could not be read or written.
    #[error("{0}")]
    File(String),
    /// 403: bad token or removed runner.
    #[error("{}: forbidden (403): the token is invalid or the runner was removed{}", .endpoint.as_str(), suffix(.message))]
    Forbidden {
        /// The call.
        endpoint: Endpoint,
        /// GitLab's `message`, if any.
        message: String,
    },
    /// 410 on registration: registration tokens are disabled.
    #[error("registration with a registration token is disabled on this GitLab instance (410 Gone); create the runner in the UI and use its glrt- token")]
    RegistrationDisabled,
    /// Any other unexpected status.
    #[error("{}: HTTP {status}{}", .endpoint.as_str(), suffix(.message))]
    Status {
        /// The call.
        endpoint: Endpoint,
        /// The HTTP status.
        status: u16,
        /// GitLab's `message`, if any.
        message: String,
    },
    /// No response (connection, TLS, timeout).
    #[error("{}: request failed: {message}", .endpoint.as_str())]
    Transport {
        /// The call.
        endpoint: Endpoint,
        /// What failed, with its causes.
        message: String,
    },
    /// A response body that does not decode.
    #[error("{}: invalid response: {message}", .endpoint.as_str())]
    InvalidResponse {
        /// The call.
        endpoint: Endpoint,
        /// The decoding error.
        message: String,
    },
}

fn suffix(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

/// A request that got no response at all (connection refused, TLS, timeout), after the
/// client's own handling.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TransportError(String);

impl TransportError {
    /// As the error of a runner-token call to `endpoint`.
    fn at(self, endpoint: Endpoint) -> ApiError {
        ApiError::Transport { endpoint, message: self.0 }
    }
}

/// The runner API client. Cheap to share (`Arc`); one per process is enough.
pub struct GitLabClient {
    http: reqwest::Client,
    /// The same settings, redirects not followed (artifact downloads follow them by hand,
    /// without the job token).
    no_redirect: reqwest::Client,
    retry: RetryPolicy,
    hook: Option<RequestHook>,
    user_agent: String,
    /// `X-GitLab-Last-Update` per (API base URL, runner token).
    last_update: Mutex<HashMap<(String, String), String>>,
}

/// The API base for a runner URL: `<url>/api/v4/`, a legacy `/ci` suffix stripped; only
/// `http` and `https` are accepted.
pub fn api_base_url(runner_url: &str) -> Result<Url, ApiError> {
    let invalid = |reason: String| ApiError::InvalidUrl { url: runner_url.to_string(), reason };
    let trimmed = runner_url.trim().trim_end_matches('/');
    let trimmed = trimmed.strip_suffix("/ci").unwrap_or(trimmed).trim_end_matches('/');
    let url = Url::parse(&format!("{trimmed}/api/v4/")).map_err(|e| invalid(e.to_string()))?;
    match url.scheme() {
        "http" | "https" => Ok(url),
        other => Err(invalid(format!("scheme {other:?} is not http or https"))),
    }
}

impl GitLabClient {
    /// The `User-Agent` sent on every request.
    pub fn user_agent(&self) -> &str {
        &self.user_agent
    }

    /// The same client (connections, TLS, retries, user agent) reporting its requests to
    /// `hook` instead: one per runner, so each runner's requests are counted under its name.
    pub fn with_hook(&self, hook: Option<RequestHook>) -> GitLabClient {
        GitLabClient {
            http: self.http.clone(),
            no_redirect: self.no_redirect.clone(),
            retry: self.retry.clone(),
            hook,
            user_agent: self.user_agent.clone(),
            last_update: Mutex::default(),
        }
    }

    /// How this client backs off between attempts; callers that retry a whole call (the
    /// job's acceptance) use the same steps.
    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.retry
    }

    /// Sends one logical request, retrying retryable statuses. `decorate` adds headers and the
    /// body; it runs once per attempt so the body is rebuilt each time.
    async fn execute(
        &self,
        endpoint: Endpoint,
        method: Method,
        url: &Url,
        decorate: impl Fn(RequestBuilder) -> RequestBuilder + Send + Sync,
    ) -> Result<Response, TransportError> {
        let mut attempt = 1u32;
        loop {
            let request = self
                .http
                .request(method.clone(), url.clone())
                .header(USER_AGENT, &self.user_agent)
                .header("X-Request-Id", uuid::Uuid::new_v4().simple().to_string());
            let started = Instant::now();
            let result = decorate(request).send().await;
            if let Some(hook) = &self.hook {
                hook(&RequestRecord {
                    endpoint,
                    method: method.as_str(),
                    path: url.path(),
                    status: result.as_ref().ok().map(|r| r.status().as_u16()),
                    duration: started.elapsed(),
                    attempt,
                });
            }
            let response = result.map_err(|e| TransportError(describe_reqwest_error(&e)))?;
            let status = response.status().as_u16();
            if !is_retryable_status(status) || attempt >= self.retry.max_attempts {
                return Ok(response);
            }
            let wait = self.retry.wait_before_retry(response.headers(), attempt, chrono::Utc::now());
            tracing::debug!(endpoint = endpoint.as_str(), status, attempt, ?wait, "retrying GitLab request");
            drop(response);
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    fn runner_token_request<'a>(
        token: &'a str,
        body: &'a Value,
    ) -> impl Fn(RequestBuilder) -> RequestBuilder + Send + Sync + 'a {
        move |rb| rb.header(ACCEPT, "application/json").header("RUNNER-TOKEN", token).json(body)
    }

    fn remember_last_update(&self, base: &Url, token: &str, headers: &HeaderMap) {
        if let Some(value) = header_str(headers, "x-gitlab-last-update") {
            let mut map = self.last_update.lock().unwrap_or_else(|p| p.into_inner());
            map.insert((base.to_string(), token.to_string()), value.to_string());
        }
    }

    fn stored_last_update(&self, base: &Url, token: &str) -> Option<String> {
        let map = self.last_update.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&(base.to_string(), token.to_string())).cloned()
    }

    fn endpoint_url(base: &Url, path: &str) -> Result<Url, ApiError> {
        base.join(path).map_err(|e| ApiError::InvalidUrl { url: base.to_string(), reason: e.to_string() })
    }
}

fn describe_reqwest_error(e: &reqwest::Error) -> String {
    use std::error::Error;
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_base_appends_api_v4_and_strips_ci() {
        let cases = [
            ("https://gitlab.example.com", "https://gitlab.example.com/api/v4/"),
            ("https://gitlab.example.com/", "https://gitlab.example.com/api/v4/"),
            ("https://gitlab.example.com/ci", "https://gitlab.example.com/api/v4/"),
            ("https://gitlab.example.com/ci/", "https://gitlab.example.com/api/v4/"),
            ("http://127.0.0.1:8080/gitlab", "http://127.0.0.1:8080/gitlab/api/v4/"),
        ];
        for (input, want) in cases {
            assert_eq!(api_base_url(input).expect(input).as_str(), want);
        }
        assert!(api_base_url("ftp://gitlab.example.com").is_err());
        assert!(api_base_url("not a url").is_err());
    }
}
