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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, ACCEPT, CONTENT_TYPE, USER_AGENT};
use reqwest::{Method, RequestBuilder, Response, StatusCode, Url};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::buildinfo;
use crate::gitlab::api::{
    JobApi, JobState, JobUpdate, PatchOutcome, PatchResponse, RemoteJobStatus, UpdateOutcome, UpdateResponse,
};
use crate::gitlab::retry::{is_retryable_status, RetryPolicy};
use crate::payload::JobResponse;

/// Which API call a request belongs to (for metrics and error messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    RegisterRunner,
    VerifyRunner,
    UnregisterRunner,
    UnregisterRunnerManager,
    RequestJob,
    UpdateJob,
    PatchTrace,
}

impl Endpoint {
    /// The label GitLab Runner uses in `gitlab_runner_api_request_statuses_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::RegisterRunner => "register_runner",
            Endpoint::VerifyRunner => "verify_runner",
            Endpoint::UnregisterRunner => "unregister_runner",
            Endpoint::UnregisterRunnerManager => "unregister_runner_manager",
            Endpoint::RequestJob => "request_job",
            Endpoint::UpdateJob => "update_job",
            Endpoint::PatchTrace => "patch_trace",
        }
    }
}

/// Called once per HTTP attempt: endpoint, method, status (`None` on a transport error),
/// time to response headers.
pub type RequestHook = Arc<dyn Fn(Endpoint, &Method, Option<u16>, Duration) + Send + Sync>;

/// Errors of the runner-token management calls.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("invalid GitLab URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("cannot set up the HTTP client: {0}")]
    ClientSetup(String),
    #[error("{}: forbidden (403): the token is invalid or the runner was removed{}", .endpoint.as_str(), suffix(.message))]
    Forbidden { endpoint: Endpoint, message: String },
    #[error("registration with a registration token is disabled on this GitLab instance (410 Gone); create the runner in the UI and use its glrt- token")]
    RegistrationDisabled,
    #[error("{}: HTTP {status}{}", .endpoint.as_str(), suffix(.message))]
    Status { endpoint: Endpoint, status: u16, message: String },
    #[error("{}: request failed: {message}", .endpoint.as_str())]
    Transport { endpoint: Endpoint, message: String },
    #[error("{}: invalid response: {message}", .endpoint.as_str())]
    InvalidResponse { endpoint: Endpoint, message: String },
}

fn suffix(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

/// `features` of the runner `info` (§1.6). Every key is always serialized, in GitLab Runner's
/// order; the caller sets only what the job path really supports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FeaturesInfo {
    pub variables: bool,
    pub image: bool,
    pub services: bool,
    pub artifacts: bool,
    pub cache: bool,
    pub fallback_cache_keys: bool,
    pub shared: bool,
    pub upload_multiple_artifacts: bool,
    pub upload_raw_artifacts: bool,
    pub session: bool,
    pub terminal: bool,
    pub refspecs: bool,
    pub masking: bool,
    pub proxy: bool,
    pub raw_variables: bool,
    pub artifacts_exclude: bool,
    pub multi_build_steps: bool,
    pub trace_reset: bool,
    pub trace_checksum: bool,
    pub trace_size: bool,
    pub vault_secrets: bool,
    pub cancelable: bool,
    pub return_exit_code: bool,
    pub service_variables: bool,
    pub service_multiple_aliases: bool,
    pub image_executor_opts: bool,
    pub service_executor_opts: bool,
    pub cancel_gracefully: bool,
    pub native_steps_integration: bool,
    pub two_phase_job_commit: bool,
    pub job_inputs: bool,
}

/// `info.config`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ConfigInfo {
    pub gpus: String,
}

/// The runner `info` object sent with verify, job request and job update (§1.6).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VersionInfo {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub revision: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub platform: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub architecture: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub executor: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub shell: String,
    pub features: FeaturesInfo,
    pub config: ConfigInfo,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
}

impl VersionInfo {
    /// Name, version, platform and architecture of this build (Go spellings: `amd64`,
    /// `arm64`), with the given executor, shell and features.
    pub fn this_runner(executor: &str, shell: &str, features: FeaturesInfo) -> Self {
        VersionInfo {
            name: "runway".into(),
            version: buildinfo::VERSION.into(),
            revision: buildinfo::REVISION.into(),
            platform: buildinfo::OS.into(),
            architecture: buildinfo::go_arch().into(),
            executor: executor.into(),
            shell: shell.into(),
            features,
            config: ConfigInfo::default(),
            labels: Default::default(),
        }
    }
}

/// A runner's identity towards one GitLab.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerCredentials {
    /// The runner `url` from config.toml (without `/api/v4`).
    pub url: String,
    pub token: String,
    /// `s_…`/`r_…`; empty means "not sent".
    pub system_id: String,
}

/// `POST /runners` body apart from `token` and `info` (§1.1).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegisterParams {
    pub description: String,
    pub maintenance_note: String,
    pub tags: Vec<String>,
    pub run_untagged: bool,
    pub locked: bool,
    /// `not_protected` / `ref_protected`; empty = not sent.
    pub access_level: String,
    /// Seconds; 0 = not sent.
    pub maximum_timeout: i64,
    pub paused: bool,
}

/// `{id, token, token_expires_at}` from register and verify.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct RunnerDetails {
    #[serde(default)]
    pub id: i64,
    #[serde(default)]
    pub token: String,
    #[serde(default)]
    pub token_expires_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// A job handed out by `POST /jobs/request`.
#[derive(Debug, Clone)]
pub struct ReceivedJob {
    /// The response body exactly as received.
    pub raw: bytes::Bytes,
    pub job: JobResponse,
}

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
    Unhealthy(String),
    /// Anything else (409, 422, 429/5xx after retries): healthy, no job.
    Failed(String),
    /// 201 with a payload that does not decode (missing or mistyped fields). The job is
    /// assigned to us, so it must be failed with `runner_system_failure`, not left hanging.
    BadPayload(Box<BadJob>),
}

/// A job whose payload does not decode, identified well enough to fail it.
#[derive(Debug, Clone)]
pub struct BadJob {
    pub id: i64,
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

/// Options for [`GitLabClient::new`].
#[derive(Clone, Default)]
pub struct ClientOptions {
    pub retry: RetryPolicy,
    /// Optional metrics hook, called per HTTP attempt.
    pub hook: Option<RequestHook>,
    /// `tls-ca-file`: extra PEM CA certificates to trust (self-managed GitLab with a
    /// private CA).
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// `tls-cert-file` + `tls-key-file`: a PEM client certificate and key.
    pub tls_client_cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// The runner API client. Cheap to share (`Arc`); one per process is enough.
pub struct GitLabClient {
    http: reqwest::Client,
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

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty())
}

/// `Job-Status` → what the job should do.
fn remote_status(headers: &HeaderMap) -> RemoteJobStatus {
    match header_str(headers, "job-status") {
        Some("canceling") => RemoteJobStatus::CancelRequested,
        Some("canceled" | "failed") => RemoteJobStatus::Abort,
        _ => RemoteJobStatus::Running,
    }
}

/// `X-GitLab-Trace-Update-Interval` (whole seconds, > 0).
fn update_interval(headers: &HeaderMap) -> Option<Duration> {
    header_str(headers, "x-gitlab-trace-update-interval")
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
}

/// The end of a `Range: 0-<size>` header.
fn range_end(headers: &HeaderMap) -> Option<u64> {
    header_str(headers, "range")?.rsplit_once('-')?.1.trim().parse().ok()
}

/// The `message` of a GitLab error body, or the body itself, shortened.
async fn error_message(response: Response) -> String {
    let text = response.text().await.unwrap_or_default();
    let message = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v.get("message").map(|m| m.as_str().map(str::to_string).unwrap_or_else(|| m.to_string())))
        .unwrap_or(text);
    message.chars().take(500).collect()
}

impl GitLabClient {
    pub fn new(options: ClientOptions) -> Result<Self, ApiError> {
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .tcp_keepalive(Duration::from_secs(30))
            .pool_idle_timeout(Duration::from_secs(90))
            .timeout(Duration::from_secs(60 * 60));
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|e| ApiError::ClientSetup(format!("{}: {e}", path.display())))
        };
        if let Some(ca) = &options.tls_ca_file {
            let pem = read(ca)?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| ApiError::ClientSetup(format!("tls-ca-file {}: {e}", ca.display())))?;
            if certs.is_empty() {
                return Err(ApiError::ClientSetup(format!("tls-ca-file {}: no PEM certificates in it", ca.display())));
            }
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        if let Some((cert, key)) = &options.tls_client_cert {
            let mut pem = read(cert)?;
            pem.push(b'\n');
            pem.extend(read(key)?);
            let identity = reqwest::Identity::from_pem(&pem)
                .map_err(|e| ApiError::ClientSetup(format!("tls-cert-file/tls-key-file: {e}")))?;
            builder = builder.identity(identity);
        }
        let http = builder.build().map_err(|e| ApiError::ClientSetup(describe_reqwest_error(&e)))?;
        Ok(GitLabClient {
            http,
            retry: options.retry,
            hook: options.hook,
            user_agent: buildinfo::user_agent(),
            last_update: Mutex::new(HashMap::new()),
        })
    }

    /// The `User-Agent` sent on every request.
    pub fn user_agent(&self) -> &str {
        &self.user_agent
    }

    /// Sends one logical request, retrying retryable statuses. `decorate` adds headers and the
    /// body; it runs once per attempt so the body is rebuilt each time.
    async fn execute(
        &self,
        endpoint: Endpoint,
        method: Method,
        url: &Url,
        decorate: impl Fn(RequestBuilder) -> RequestBuilder + Send + Sync,
    ) -> Result<Response, String> {
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
                hook(endpoint, &method, result.as_ref().ok().map(|r| r.status().as_u16()), started.elapsed());
            }
            let response = result.map_err(|e| describe_reqwest_error(&e))?;
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

    /// `POST /runners` with a legacy registration token (§1.1).
    pub async fn register_legacy(
        &self,
        url: &str,
        registration_token: &str,
        params: &RegisterParams,
        info: &VersionInfo,
    ) -> Result<RunnerDetails, ApiError> {
        let endpoint = Endpoint::RegisterRunner;
        let base = api_base_url(url)?;
        let mut body = json!({
            "token": registration_token,
            "description": params.description,
            "run_untagged": params.run_untagged,
            "locked": params.locked,
            "paused": params.paused,
            "info": info,
        });
        if !params.maintenance_note.is_empty() {
            body["maintenance_note"] = params.maintenance_note.clone().into();
        }
        if !params.tags.is_empty() {
            body["tag_list"] = params.tags.join(",").into();
        }
        if !params.access_level.is_empty() {
            body["access_level"] = params.access_level.clone().into();
        }
        if params.maximum_timeout > 0 {
            body["maximum_timeout"] = params.maximum_timeout.into();
        }
        let response = self
            .execute(
                endpoint,
                Method::POST,
                &Self::endpoint_url(&base, "runners")?,
                Self::runner_token_request(registration_token, &body),
            )
            .await
            .map_err(|message| ApiError::Transport { endpoint, message })?;
        match response.status() {
            StatusCode::CREATED => decode_details(endpoint, response, None).await,
            StatusCode::FORBIDDEN => Err(ApiError::Forbidden { endpoint, message: error_message(response).await }),
            StatusCode::GONE => Err(ApiError::RegistrationDisabled),
            status => {
                Err(ApiError::Status { endpoint, status: status.as_u16(), message: error_message(response).await })
            }
        }
    }

    /// `POST /runners/verify` (§1.3). Older GitLab answers a plain `200` text; then the
    /// details are the token itself with id 0.
    pub async fn verify(&self, creds: &RunnerCredentials, info: &VersionInfo) -> Result<RunnerDetails, ApiError> {
        let endpoint = Endpoint::VerifyRunner;
        let base = api_base_url(&creds.url)?;
        let mut body = json!({ "token": creds.token, "info": info });
        if !creds.system_id.is_empty() {
            body["system_id"] = creds.system_id.clone().into();
        }
        let response = self
            .execute(
                endpoint,
                Method::POST,
                &Self::endpoint_url(&base, "runners/verify")?,
                Self::runner_token_request(&creds.token, &body),
            )
            .await
            .map_err(|message| ApiError::Transport { endpoint, message })?;
        self.remember_last_update(&base, &creds.token, response.headers());
        match response.status() {
            StatusCode::OK => decode_details(endpoint, response, Some(&creds.token)).await,
            StatusCode::FORBIDDEN => Err(ApiError::Forbidden { endpoint, message: error_message(response).await }),
            status => {
                Err(ApiError::Status { endpoint, status: status.as_u16(), message: error_message(response).await })
            }
        }
    }

    /// `DELETE /runners` (§1.4): removes the whole runner (legacy-registered runners).
    pub async fn unregister_runner(&self, creds: &RunnerCredentials) -> Result<(), ApiError> {
        let body = json!({ "token": creds.token });
        self.delete(Endpoint::UnregisterRunner, creds, "runners", &body).await
    }

    /// `DELETE /runners/managers` (§1.4): removes only this runner manager (`glrt-` runners).
    pub async fn unregister_manager(&self, creds: &RunnerCredentials) -> Result<(), ApiError> {
        let body = json!({ "token": creds.token, "system_id": creds.system_id });
        self.delete(Endpoint::UnregisterRunnerManager, creds, "runners/managers", &body).await
    }

    async fn delete(
        &self,
        endpoint: Endpoint,
        creds: &RunnerCredentials,
        path: &str,
        body: &Value,
    ) -> Result<(), ApiError> {
        let base = api_base_url(&creds.url)?;
        let response = self
            .execute(
                endpoint,
                Method::DELETE,
                &Self::endpoint_url(&base, path)?,
                Self::runner_token_request(&creds.token, body),
            )
            .await
            .map_err(|message| ApiError::Transport { endpoint, message })?;
        match response.status() {
            StatusCode::NO_CONTENT => Ok(()),
            StatusCode::FORBIDDEN => Err(ApiError::Forbidden { endpoint, message: error_message(response).await }),
            status => {
                Err(ApiError::Status { endpoint, status: status.as_u16(), message: error_message(response).await })
            }
        }
    }

    /// `POST /jobs/request` (§1.6), echoing the last `X-GitLab-Last-Update` seen for this
    /// (URL, token) as `last_update`. May block for GitLab's long-poll window; it is drop-safe,
    /// so `select!` it against shutdown.
    pub async fn request_job(&self, creds: &RunnerCredentials, info: &VersionInfo) -> RequestJobResult {
        let endpoint = Endpoint::RequestJob;
        let base = match api_base_url(&creds.url) {
            Ok(b) => b,
            Err(e) => return RequestJobResult::Unhealthy(e.to_string()),
        };
        let url = match Self::endpoint_url(&base, "jobs/request") {
            Ok(u) => u,
            Err(e) => return RequestJobResult::Unhealthy(e.to_string()),
        };
        let mut body = json!({ "token": creds.token, "info": info });
        if !creds.system_id.is_empty() {
            body["system_id"] = creds.system_id.clone().into();
        }
        let sent_last_update = self.stored_last_update(&base, &creds.token);
        if let Some(last_update) = &sent_last_update {
            body["last_update"] = last_update.clone().into();
        }
        let response =
            match self.execute(endpoint, Method::POST, &url, Self::runner_token_request(&creds.token, &body)).await {
                Ok(r) => r,
                Err(message) => return RequestJobResult::Unhealthy(format!("request_job: {message}")),
            };
        self.remember_last_update(&base, &creds.token, response.headers());
        match response.status() {
            StatusCode::CREATED => {
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
                    Ok(job) => RequestJobResult::Job(Box::new(ReceivedJob { raw, job })),
                    Err(error) => match BadJob::identify(&raw, error) {
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
                RequestJobResult::Unhealthy(format!("request_job: forbidden (403): {}", error_message(response).await))
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

async fn decode_details(
    endpoint: Endpoint,
    response: Response,
    plain_token: Option<&str>,
) -> Result<RunnerDetails, ApiError> {
    let bytes =
        response.bytes().await.map_err(|e| ApiError::Transport { endpoint, message: describe_reqwest_error(&e) })?;
    match serde_json::from_slice::<RunnerDetails>(&bytes) {
        Ok(details) => Ok(details),
        Err(_) if plain_token.is_some() && !bytes.trim_ascii().starts_with(b"{") => {
            Ok(RunnerDetails { id: 0, token: plain_token.unwrap_or_default().to_string(), token_expires_at: None })
        }
        Err(e) => Err(ApiError::InvalidResponse { endpoint, message: e.to_string() }),
    }
}

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

    pub fn job_id(&self) -> i64 {
        self.job_id
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
            Err(message) => return failed(format!("patch_trace: {message}")),
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
                None => PatchOutcome::Failed("patch_trace: 416 without a usable Range header".into()),
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
            Err(message) => return failed(format!("update_job: {message}")),
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
            other => UpdateOutcome::Failed(format!("update_job: HTTP {other}: {}", error_message(response).await)),
        };
        UpdateResponse { outcome, remote_status, update_interval: interval }
    }
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

    #[test]
    fn features_serialize_every_key_in_gitlab_order() {
        let value = serde_json::to_value(FeaturesInfo { cancelable: true, ..Default::default() }).expect("serializes");
        let keys: Vec<&str> = value.as_object().expect("object").keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 31);
        assert_eq!(value["cancelable"], true);
        assert_eq!(value["two_phase_job_commit"], false);
        let text = serde_json::to_string(&FeaturesInfo::default()).expect("serializes");
        assert!(
            text.starts_with(r#"{"variables":false,"image":false,"services""#)
                && text.ends_with(r#""two_phase_job_commit":false,"job_inputs":false}"#)
        );
    }

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
