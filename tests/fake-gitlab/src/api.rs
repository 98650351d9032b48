//! The runner API handlers: registration, verify, unregister, job request (with Workhorse long
//! polling), trace PATCH and job PUT, each following `gitlab-runner-protocol.md` §1.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use axum::routing::{delete, get, patch, post, put};
use axum::Router;
use serde_json::{json, Value};

use crate::{git, Endpoint, JobRecord, JobStatus, LoggedRequest, RejectedUpdate, RunnerRecord, Shared, TracePatch};

/// Rails' failure reasons (§3.2) the fake accepts on a final `failed` update; anything else
/// not in the job's `features.failure_reasons` becomes `unknown_failure`, as in Rails.
const RAILS_FAILURE_REASONS: &[&str] = &[
    "unknown_failure",
    "script_failure",
    "api_failure",
    "stuck_or_timeout_failure",
    "runner_system_failure",
    "missing_dependency_failure",
    "runner_unsupported",
    "stale_schedule",
    "job_execution_timeout",
    "archived_failure",
    "unmet_prerequisites",
    "scheduler_failure",
    "data_integrity_failure",
    "forward_deployment_failure",
    "user_blocked",
    "project_deleted",
    "ci_quota_exceeded",
    "pipeline_loop_detected",
    "no_matching_runner",
    "trace_size_exceeded",
    "builds_disabled",
    "environment_creation_failure",
    "deployment_rejected",
    "failed_outdated_deployment_job",
    "job_execution_server_timeout",
    "stuck_pending_with_matching_runners",
    "stuck_pending_no_matching_runners",
    "no_updates_running",
    "no_updates_canceling",
    "server_timeout_running",
    "server_timeout_canceling",
    "runner_configuration_error",
    "runner_external_dependency_failure",
    "runner_interrupted",
];

/// Workhorse refuses larger job-request bodies.
const MAX_JOB_REQUEST_BODY: usize = 32 * 1024;

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/api/v4/runners", post(register).delete(unregister_runner))
        .route("/api/v4/runners/verify", post(verify))
        .route("/api/v4/runners/managers", delete(unregister_manager))
        .route("/api/v4/runners/reset_authentication_token", post(reset_token))
        .route("/api/v4/runners/{id}/reset_authentication_token", post(reset_token_with_pat))
        .route("/api/v4/jobs/request", post(request_job))
        .route("/api/v4/jobs/{id}", put(update_job))
        .route("/api/v4/jobs/{id}/trace", patch(patch_trace))
        .route(
            "/api/v4/jobs/{id}/artifacts",
            post(crate::artifacts::upload)
                .get(crate::artifacts::download)
                .layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route("/objectstore/artifacts/{id}/{name}", get(crate::artifacts::object_store))
        .route("/api/v4/projects/{id}/jobs", get(crate::jobs_api::list_jobs))
        .route("/api/v4/job", get(crate::jobs_api::current_job))
        .route("/oauth/discovery/keys", get(crate::id_tokens::keys))
        .route("/.well-known/openid-configuration", get(crate::id_tokens::openid_configuration))
        .fallback(git::serve)
        .with_state(shared)
}

/// The parts of a request every handler logs.
pub(crate) struct Incoming {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Incoming {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// A user's (personal, project or group) access token, as the REST API takes it:
    /// `PRIVATE-TOKEN`, or `Authorization: Bearer`.
    pub(crate) fn access_token(&self) -> Option<&str> {
        self.header("private-token").or_else(|| self.header("authorization").and_then(|a| a.strip_prefix("Bearer ")))
    }
}

/// Records the request with the status it got and returns the response, with the
/// correlation ID GitLab gives every response (`X-Request-Id`).
pub(crate) fn finish(shared: &Shared, req: &Incoming, mut response: Response) -> Response {
    if !response.headers().contains_key("x-request-id") {
        let id = format!("{:032x}", rand::random::<u128>());
        if let Ok(value) = axum::http::HeaderValue::from_str(&id) {
            response.headers_mut().insert("x-request-id", value);
        }
    }
    let logged = LoggedRequest {
        method: req.method.to_string(),
        path: req.uri.path().to_string(),
        query: req.uri.query().map(str::to_string),
        headers: req
            .headers
            .iter()
            .map(|(n, v)| (n.as_str().to_ascii_lowercase(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect(),
        body: req.body.to_vec(),
        status: response.status().as_u16(),
    };
    shared.mutate(|s| s.requests.push(logged));
    response
}

pub(crate) fn response(status: u16, headers: &[(&str, String)], body: impl Into<Body>) -> Response {
    let mut builder = Response::builder().status(status);
    for (name, value) in headers {
        builder = builder.header(*name, value.as_str());
    }
    match builder.body(body.into()) {
        Ok(r) => r,
        Err(e) => {
            let mut r = Response::new(Body::from(format!("fake-gitlab built an invalid response: {e}")));
            *r.status_mut() = axum::http::StatusCode::INTERNAL_SERVER_ERROR;
            r
        }
    }
}

pub(crate) fn json_response(status: u16, headers: &[(&str, String)], value: &Value) -> Response {
    let mut all = vec![("Content-Type", "application/json".to_string())];
    all.extend(headers.iter().map(|(n, v)| (*n, v.clone())));
    response(status, &all, value.to_string())
}

pub(crate) fn message(status: u16, headers: &[(&str, String)], text: &str) -> Response {
    json_response(status, headers, &json!({ "message": text }))
}

/// The next injected response for `endpoint`, if any.
pub(crate) fn take_injected(shared: &Shared, endpoint: Endpoint) -> Option<Response> {
    let injected = shared.mutate(|s| s.injected.get_mut(&endpoint).and_then(|q| q.pop_front()))?;
    let mut headers: Vec<(&str, String)> = vec![("Content-Type", "application/json".to_string())];
    headers.extend(injected.headers.iter().map(|(n, v)| (n.as_str(), v.clone())));
    Some(response(injected.status, &headers, injected.body))
}

// Handlers answer errors with the very response GitLab would send; its size is no concern here.
#[allow(clippy::result_large_err)]
fn parse_json(req: &Incoming) -> Result<Value, Response> {
    serde_json::from_slice(&req.body)
        .map_err(|e| message(400, &[], &format!("400 Bad request - body is not JSON: {e}")))
}

fn str_field<'a>(body: &'a Value, key: &str) -> Option<&'a str> {
    body.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// Newer runners send `RUNNER-TOKEN` too; GitLab's test server asserts it equals `token`.
#[allow(clippy::result_large_err)]
fn check_runner_header(req: &Incoming, body_token: &str) -> Result<(), Response> {
    match req.header("runner-token") {
        Some(h) if h != body_token => {
            Err(message(400, &[], "400 Bad request - RUNNER-TOKEN header does not match token"))
        }
        _ => Ok(()),
    }
}

fn runner_details(runner: &RunnerRecord) -> Value {
    json!({ "id": runner.id, "token": runner.token, "token_expires_at": runner.token_expires_at_json() })
}

macro_rules! incoming {
    ($method:ident, $uri:ident, $headers:ident, $body:ident) => {
        Incoming { method: $method, uri: $uri, headers: $headers, body: $body }
    };
}

// ----- runners -------------------------------------------------------------------------------

async fn register(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req = incoming!(method, uri, headers, body);
    let resp = register_inner(&shared, &req);
    finish(&shared, &req, resp)
}

fn register_inner(shared: &Shared, req: &Incoming) -> Response {
    if let Some(r) = take_injected(shared, Endpoint::Register) {
        return r;
    }
    let body = match parse_json(req) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let token = str_field(&body, "token").unwrap_or_default().to_string();
    if let Err(r) = check_runner_header(req, &token) {
        return r;
    }
    shared.mutate(|s| {
        if !s.registration_enabled {
            return message(410, &[], "runner registration disallowed");
        }
        if !s.registration_tokens.contains(&token) {
            return message(403, &[], "403 Forbidden");
        }
        let id = s.next_runner_id;
        s.next_runner_id += 1;
        let runner = RunnerRecord {
            id,
            token: crate::random_token("t1_"),
            description: str_field(&body, "description").unwrap_or_default().to_string(),
            origin: "legacy-registration",
            managers: Default::default(),
            info: body.get("info").cloned().unwrap_or(Value::Null),
            paused: body.get("paused").and_then(Value::as_bool).unwrap_or(false),
            token_expires_at: s.token_expiry.map(crate::expiry_from_now),
            resets: 0,
        };
        let details = runner_details(&runner);
        s.runners.insert(runner.token.clone(), runner);
        json_response(201, &[], &details)
    })
}

async fn verify(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req = incoming!(method, uri, headers, body);
    let resp = verify_inner(&shared, &req);
    finish(&shared, &req, resp)
}

fn verify_inner(shared: &Shared, req: &Incoming) -> Response {
    if let Some(r) = take_injected(shared, Endpoint::Verify) {
        return r;
    }
    let body = match parse_json(req) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let token = str_field(&body, "token").unwrap_or_default().to_string();
    if let Err(r) = check_runner_header(req, &token) {
        return r;
    }
    shared.mutate(|s| match s.runners.get_mut(&token).filter(|r| !r.token_expired()) {
        None => message(403, &[], "403 Forbidden"),
        Some(runner) => {
            note_contact(runner, &body);
            json_response(200, &[], &runner_details(runner))
        }
    })
}

async fn reset_token(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req = incoming!(method, uri, headers, body);
    let resp = reset_token_inner(&shared, &req);
    finish(&shared, &req, resp)
}

/// `POST /runners/reset_authentication_token` (Rails `Ci::Runners::ResetAuthenticationTokenService`):
/// a valid, unexpired token gets a new one (201 `{token, token_expires_at}`); the old token is
/// revoked at once. The runner keeps its id, managers, jobs and queue.
fn reset_token_inner(shared: &Shared, req: &Incoming) -> Response {
    if let Some(r) = take_injected(shared, Endpoint::ResetToken) {
        return r;
    }
    let body = match parse_json(req) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let token = str_field(&body, "token").unwrap_or_default().to_string();
    if let Err(r) = check_runner_header(req, &token) {
        return r;
    }
    rotate_token(shared, token)
}

async fn reset_token_with_pat(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req = incoming!(method, uri, headers, body);
    let resp = reset_token_by_id(&shared, &req, &id);
    finish(&shared, &req, resp)
}

/// `POST /runners/:id/reset_authentication_token` (Rails `API::Ci::Runners`): a user's access
/// token stands in for the runner's own (401 without a known one, 404 for
/// an unknown runner id); the reset is the same.
fn reset_token_by_id(shared: &Shared, req: &Incoming, id: &str) -> Response {
    if let Some(r) = take_injected(shared, Endpoint::ResetToken) {
        return r;
    }
    let token = {
        let inner = shared.lock();
        if !req.access_token().is_some_and(|t| inner.api_tokens.contains(t)) {
            return message(401, &[], "401 Unauthorized");
        }
        inner.runners.values().find(|r| r.id.to_string() == id).map(|r| r.token.clone())
    };
    match token {
        Some(token) => rotate_token(shared, token),
        None => message(404, &[], "404 Runner Not Found"),
    }
}

/// A new token for the runner holding `token` (201 `{token, token_expires_at}`); the old one
/// is revoked at once. The runner keeps its id, managers, jobs and queue.
fn rotate_token(shared: &Shared, token: String) -> Response {
    shared.mutate(|s| {
        let Some(mut runner) = s.runners.remove(&token) else { return message(403, &[], "403 Forbidden") };
        if runner.token_expired() {
            s.runners.insert(token, runner);
            return message(403, &[], "403 Forbidden");
        }
        let new_token = crate::random_token("glrt-");
        runner.token = new_token.clone();
        runner.token_expires_at = s.token_expiry.map(crate::expiry_from_now);
        runner.resets += 1;
        let reply = json!({ "token": new_token, "token_expires_at": runner.token_expires_at_json() });
        s.runners.insert(new_token.clone(), runner);
        s.revoked_tokens.insert(token.clone());
        if let Some(version) = s.queue_versions.remove(&token) {
            s.queue_versions.insert(new_token.clone(), version);
        }
        for job in s.jobs.values_mut() {
            if job.runner_token.as_deref() == Some(token.as_str()) {
                job.runner_token = Some(new_token.clone());
            }
            if job.only_for_runner.as_deref() == Some(token.as_str()) {
                job.only_for_runner = Some(new_token.clone());
            }
        }
        json_response(201, &[], &reply)
    })
}

/// Records the runner manager (`system_id`) and `info` a runner sent.
fn note_contact(runner: &mut RunnerRecord, body: &Value) {
    runner.managers.insert(str_field(body, "system_id").unwrap_or("<legacy>").to_string());
    if let Some(info) = body.get("info") {
        runner.info = info.clone();
    }
}

async fn unregister_runner(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req = incoming!(method, uri, headers, body);
    let resp = (|| {
        if let Some(r) = take_injected(&shared, Endpoint::UnregisterRunner) {
            return r;
        }
        let body = match parse_json(&req) {
            Ok(b) => b,
            Err(r) => return r,
        };
        let token = str_field(&body, "token").unwrap_or_default().to_string();
        if let Err(r) = check_runner_header(&req, &token) {
            return r;
        }
        shared.mutate(|s| match s.runners.remove(&token) {
            Some(_) => {
                s.queue_versions.remove(&token);
                response(204, &[], Body::empty())
            }
            None => message(403, &[], "403 Forbidden"),
        })
    })();
    finish(&shared, &req, resp)
}

async fn unregister_manager(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req = incoming!(method, uri, headers, body);
    let resp = (|| {
        if let Some(r) = take_injected(&shared, Endpoint::UnregisterManager) {
            return r;
        }
        let body = match parse_json(&req) {
            Ok(b) => b,
            Err(r) => return r,
        };
        let token = str_field(&body, "token").unwrap_or_default().to_string();
        if let Err(r) = check_runner_header(&req, &token) {
            return r;
        }
        let Some(system_id) = str_field(&body, "system_id").map(str::to_string) else {
            return message(400, &[], "400 Bad request - system_id is missing");
        };
        shared.mutate(|s| match s.runners.get_mut(&token) {
            None => message(403, &[], "403 Forbidden"),
            Some(runner) => match runner.managers.remove(&system_id) {
                true => response(204, &[], Body::empty()),
                false => message(404, &[], "404 Runner manager not found"),
            },
        })
    })();
    finish(&shared, &req, resp)
}

// ----- job request -----------------------------------------------------------------------------

async fn request_job(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req = incoming!(method, uri, headers, body);
    let resp = request_job_inner(&shared, &req).await;
    finish(&shared, &req, resp)
}

async fn request_job_inner(shared: &Shared, req: &Incoming) -> Response {
    if let Some(r) = take_injected(shared, Endpoint::RequestJob) {
        return r;
    }
    if req.body.len() > MAX_JOB_REQUEST_BODY {
        return message(413, &[], "413 Request Entity Too Large");
    }
    let body = match parse_json(req) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let token = str_field(&body, "token").unwrap_or_default().to_string();
    if let Err(r) = check_runner_header(req, &token) {
        return r;
    }
    let last_update = str_field(&body, "last_update").map(str::to_string);
    let polling = [("Gitlab-Ci-Builds-Polling", "yes".to_string())];

    // Workhorse: with `token` and `last_update` present, watch the queue value.
    let long_poll = shared.lock().config.long_poll;
    if let (false, Some(last)) = (long_poll.is_zero() || token.is_empty(), last_update.as_deref()) {
        let current = shared.lock().queue_versions.get(&token).cloned();
        if current.as_deref() == Some(last) {
            // Seen change or timeout: plain 204 without X-GitLab-Last-Update (Workhorse does not
            // call Rails), so the runner re-polls with the old value and hits Rails.
            let _parked = ParkedLongPoll::new(shared, &token);
            wait_for_queue_change(shared, &token, last, long_poll).await;
            return response(204, &polling, Body::empty());
        }
    }

    let headers: &[(&str, String)] = if long_poll.is_zero() { &[] } else { &polling };
    shared.mutate(|s| {
        s.expire_unacknowledged();
        let paused = match s.runners.get_mut(&token).filter(|r| !r.token_expired()) {
            None => return message(403, headers, "403 Forbidden"),
            Some(runner) => {
                note_contact(runner, &body);
                runner.paused
            }
        };
        let version = s.queue_version(&token);
        let no_job = |version: String| {
            let mut h = headers.to_vec();
            h.push(("X-GitLab-Last-Update", version));
            response(204, &h, Body::empty())
        };
        if paused || last_update.as_deref() == Some(version.as_str()) {
            return no_job(version);
        }
        let two_phase = s.two_phase_commit
            && body.pointer("/info/features/two_phase_job_commit").and_then(Value::as_bool).unwrap_or(false);
        // Drop jobs no longer waiting (canceled meanwhile); take the first one for this runner.
        let jobs = &s.jobs;
        s.queue.retain(|id| jobs.get(id).is_some_and(|j| j.status == JobStatus::Pending && j.runner_token.is_none()));
        let eligible = s.queue.iter().position(|id| {
            s.jobs.get(id).is_some_and(|j| j.only_for_runner.as_deref().is_none_or(|only| only == token))
        });
        if let Some(id) = eligible.and_then(|pos| s.queue.remove(pos)) {
            let Some(job) = s.jobs.get_mut(&id) else { return no_job(version) };
            job.runner_token = Some(token.clone());
            if two_phase {
                job.awaiting_ack_since = Some(Instant::now());
            } else {
                job.status = JobStatus::Running;
            }
            job.handed_out = Some(job.status);
            job.runner_session = body.get("session").filter(|s| s.is_object()).cloned();
            let mut payload = job.payload.clone();
            let job_token = job.token.clone();
            fill_dependencies(&mut payload, &s.jobs, &job_token);
            s.tick_queue(&token);
            return json_response(201, headers, &payload);
        }
        no_job(version)
    })
}

/// Rails fills `dependencies[]` when it hands a job out: each dependency's name, the token to
/// download its artifacts with (on current GitLab the running job's own) and its archive's
/// file name and size when it has one.
fn fill_dependencies(payload: &mut Value, jobs: &BTreeMap<i64, JobRecord>, job_token: &str) {
    let Some(deps) = payload.get_mut("dependencies").and_then(Value::as_array_mut) else { return };
    for dep in deps {
        let Some(id) = dep.get("id").and_then(Value::as_i64) else { continue };
        let Some(record) = jobs.get(&id) else { continue };
        let Some(obj) = dep.as_object_mut() else { continue };
        let name = record.payload.pointer("/job_info/name").cloned().unwrap_or(Value::Null);
        obj.entry("name").or_insert(name);
        obj.insert("token".into(), job_token.into());
        match record.artifacts.iter().find(|a| a.artifact_type == "archive") {
            Some(a) => {
                obj.insert("artifacts_file".into(), json!({ "filename": a.filename, "size": a.data.len() }));
            }
            None => {
                obj.remove("artifacts_file");
            }
        }
    }
}

/// Counts a job request as parked in the long poll for as long as it lives (also when the
/// client drops the request mid-poll and the handler is dropped with it).
struct ParkedLongPoll<'a> {
    shared: &'a Shared,
    token: String,
}

impl<'a> ParkedLongPoll<'a> {
    fn new(shared: &'a Shared, token: &str) -> Self {
        shared.mutate(|s| *s.long_polls.entry(token.to_string()).or_default() += 1);
        ParkedLongPoll { shared, token: token.to_string() }
    }
}

impl Drop for ParkedLongPoll<'_> {
    fn drop(&mut self) {
        self.shared.mutate(|s| {
            if let Some(n) = s.long_polls.get_mut(&self.token) {
                *n = n.saturating_sub(1);
            }
        });
    }
}

/// Waits until the runner's queue value differs from `last`, the fake shuts down, or
/// `limit` passes.
async fn wait_for_queue_change(shared: &Shared, token: &str, last: &str, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    let mut rx = shared.changes.subscribe();
    loop {
        {
            let s = shared.lock();
            if s.shutting_down || s.queue_versions.get(token).map(String::as_str) != Some(last) {
                return;
            }
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => continue,
            _ => return,
        }
    }
}

// ----- job-token calls -------------------------------------------------------------------------

/// Rails' 202 backoff (`Gitlab::Ci::Runner::Backoff`) from the age of the pending final state.
fn final_update_backoff(age: Duration) -> u64 {
    match age.as_secs() {
        0..=3 => 1,
        4..=7 => 2,
        8..=15 => 4,
        16..=31 => 8,
        32..=63 => 16,
        64..=127 => 32,
        _ => 64,
    }
}

fn job_token<'a>(req: &'a Incoming, body: Option<&'a Value>) -> Option<&'a str> {
    req.header("job-token")
        .or_else(|| body.and_then(|b| str_field(b, "token")))
        .or_else(|| req.uri.query().and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("token="))))
}

async fn update_job(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req = incoming!(method, uri, headers, body);
    let resp = update_job_inner(&shared, &req, &id);
    finish(&shared, &req, resp)
}

fn update_job_inner(shared: &Shared, req: &Incoming, id: &str) -> Response {
    if let Some(r) = take_injected(shared, Endpoint::UpdateJob) {
        return r;
    }
    let body = match parse_json(req) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Ok(id) = id.parse::<i64>() else { return message(404, &[], "404 Not Found") };
    shared.mutate(|s| {
        let interval = s.config.trace_update_interval.to_string();
        let backoffs_left = s.final_update_backoffs;
        let Some(job) = s.jobs.get_mut(&id) else { return message(404, &[], "404 Not Found") };
        let status_headers = |status: JobStatus, interval: &str| {
            vec![("Job-Status", status.as_str().to_string()), ("X-GitLab-Trace-Update-Interval", interval.to_string())]
        };
        if job_token(req, Some(&body)) != Some(job.token.as_str()) {
            job.reported_statuses.push(job.status.as_str().into());
            return message(403, &status_headers(job.status, &interval), "403 Forbidden");
        }
        job.updates.push(body.clone());
        let state = str_field(&body, "state").unwrap_or_default();
        let status_before = job.status;
        let mut consumed_backoff = false;
        let (code, text, extra): (u16, &str, Option<(&str, String)>) = match (job.status, state) {
            (JobStatus::Pending, _) if job.runner_token.is_none() => {
                (400, "400 Bad request - job is not waiting for a runner", None)
            }
            (JobStatus::Pending, "pending") => {
                job.pending_keepalives += 1;
                job.awaiting_ack_since = Some(Instant::now());
                (200, "200 OK", None)
            }
            (JobStatus::Pending, "running") => {
                job.awaiting_ack_since = None;
                job.status = JobStatus::Running;
                (200, "200 OK", None)
            }
            (JobStatus::Pending, _) => (400, "400 Bad request - invalid state for a job awaiting acceptance", None),
            (status, _) if !status.is_processing() => (403, "403 Forbidden - Job is not processing on runner", None),
            // Not waiting for an acknowledgement: `update_build_state!` knows no `pending`.
            (_, "pending") => (400, "400 Bad request - job is not waiting for acknowledgement", None),
            (_, "running") => {
                job.running_keepalives += 1;
                (200, "200 OK", None)
            }
            (_, "success" | "failed") => {
                job.final_attempts += 1;
                let first = *job.first_final_attempt.get_or_insert_with(Instant::now);
                let sent =
                    body.pointer("/output/checksum").and_then(Value::as_str).or_else(|| str_field(&body, "checksum"));
                if backoffs_left > 0 {
                    consumed_backoff = true;
                    (
                        202,
                        "202 Accepted",
                        Some(("X-GitLab-Trace-Update-Interval", final_update_backoff(first.elapsed()).to_string())),
                    )
                } else if sent.is_some_and(|c| c != job.trace_checksum()) {
                    job.trace_reset_armed = true;
                    (412, "412 Precondition Failed - trace checksum validation failed", None)
                } else {
                    let failed = state == "failed";
                    job.status = match (job.status, failed) {
                        (JobStatus::Canceling, _) => JobStatus::Canceled,
                        (_, true) => JobStatus::Failed,
                        (_, false) => JobStatus::Success,
                    };
                    job.final_state = Some(state.to_string());
                    if failed {
                        let supported = job
                            .payload
                            .pointer("/features/failure_reasons")
                            .and_then(Value::as_array)
                            .cloned()
                            .unwrap_or_default();
                        let reason = str_field(&body, "failure_reason").unwrap_or("unknown_failure");
                        let known = RAILS_FAILURE_REASONS.contains(&reason)
                            || supported.iter().any(|r| r.as_str() == Some(reason));
                        job.failure_reason = Some(if known { reason } else { "unknown_failure" }.to_string());
                        job.exit_code = body.get("exit_code").and_then(Value::as_i64);
                    }
                    job.checksum = sent.map(str::to_string);
                    job.bytesize = body.pointer("/output/bytesize").and_then(Value::as_u64);
                    (200, "200 OK", None)
                }
            }
            _ => (400, "400 Bad request - invalid state", None),
        };
        let mut headers = status_headers(job.status, &interval);
        if let Some((name, value)) = extra {
            headers.retain(|(n, _)| *n != name);
            headers.push((name, value));
        }
        job.reported_statuses.push(job.status.as_str().into());
        if matches!(code, 400 | 403 | 409) {
            let rejected = RejectedUpdate { job: id, state: state.to_string(), status: status_before, code };
            s.rejected_updates.push(rejected);
        }
        if consumed_backoff {
            s.final_update_backoffs -= 1;
        }
        message(code, &headers, text)
    })
}

async fn patch_trace(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req = incoming!(method, uri, headers, body);
    let resp = patch_trace_inner(&shared, &req, &id);
    finish(&shared, &req, resp)
}

/// `a-b`, inclusive, without a `bytes ` prefix.
fn parse_content_range(value: &str) -> Option<(u64, u64)> {
    let (a, b) = value.trim().split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

fn patch_trace_inner(shared: &Shared, req: &Incoming, id: &str) -> Response {
    if let Some(r) = take_injected(shared, Endpoint::PatchTrace) {
        return r;
    }
    let Ok(id) = id.parse::<i64>() else { return message(404, &[], "404 Not Found") };
    shared.mutate(|s| {
        let interval = s.config.trace_update_interval.to_string();
        let send_range = !s.omit_trace_range;
        let Some(job) = s.jobs.get_mut(&id) else { return message(404, &[], "404 Not Found") };
        let mut headers =
            vec![("Job-Status", job.status.as_str().to_string()), ("X-GitLab-Trace-Update-Interval", interval)];
        job.reported_statuses.push(job.status.as_str().into());
        if job_token(req, None) != Some(job.token.as_str()) || !job.status.is_processing() {
            return message(403, &headers, "403 Forbidden - Job is not processing on runner");
        }
        let Some(range_header) = req.header("content-range") else {
            return message(400, &headers, "400 Missing header Content-Range");
        };
        let Some((start, end)) = parse_content_range(range_header) else {
            return message(400, &headers, "400 Bad request - invalid Content-Range");
        };
        let len = req.body.len() as u64;
        let mut record = TracePatch { content_range: range_header.to_string(), start, end, len, accepted: false };
        if start == 0 && job.trace_reset_armed && !job.trace.is_empty() {
            job.trace.clear();
            job.trace_resets += 1;
        }
        if start != job.trace.len() as u64 {
            if send_range {
                headers.push(("Range", format!("0-{}", job.trace.len())));
            }
            job.patches.push(record);
            return message(416, &headers, "416 Range Not Satisfiable");
        }
        job.trace_reset_armed = false;
        job.trace.extend_from_slice(&req.body);
        record.accepted = true;
        job.patches.push(record);
        if send_range {
            headers.push(("Range", format!("0-{}", job.trace.len())));
        }
        response(202, &headers, Body::empty())
    })
}
