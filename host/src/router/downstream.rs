//! The runner API the router serves to downstream runners, answering as GitLab does:
//! `POST /api/v4/jobs/request` (403 for unknown tokens; held up to `long_poll_timeout` like
//! Workhorse, answered at once when a job arrives; 201 with GitLab's payload unchanged),
//! `PUT /api/v4/jobs/:id` (two-phase pings answered here, acceptance and every other update
//! forwarded), `PATCH /api/v4/jobs/:id/trace` (forwarded; GitLab's 202/416/403 and `Job-Status`
//! come back as they are), `POST /api/v4/jobs/:id/runner_provisioning` (seed 002: `pending`,
//! `accepted`, `declined`), artifacts upload and download (streamed through both ways, a
//! redirect to object storage handed to the runner), and `POST /api/v4/runners/verify`.
//!
//! Owns request parsing and the HTTP answers. Must not change the state except through
//! `state`'s transitions and `upstream`'s helpers, nor write the store (`persist`).

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{post, put};
use futures::TryStreamExt as _;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::persist;
use super::state::{Phase, Waiter};
use super::stats::DeclineReason;
use super::upstream::{self, Accept};
use super::Inner;
use crate::gitlab::client::forward::{Forward, FORWARDED_RESPONSE_HEADERS};
use crate::gitlab::client::request::{DECLINE_FEATURE, ROUTER_FEATURES_HEADER};
use crate::gitlab::client::Endpoint;

type Shared = State<Arc<Inner>>;

/// The downstream API on `inner`.
pub(super) fn app(inner: Arc<Inner>) -> axum::Router {
    axum::Router::new()
        .route("/api/v4/jobs/request", post(request_job))
        .route("/api/v4/jobs/{id}", put(update_job))
        .route("/api/v4/jobs/{id}/trace", axum::routing::patch(patch_trace))
        .route("/api/v4/jobs/{id}/runner_provisioning", post(runner_provisioning))
        .route("/api/v4/jobs/{id}/artifacts", post(artifacts).get(artifacts))
        .route("/api/v4/runners/verify", post(verify))
        .fallback(|| async { message(StatusCode::NOT_FOUND, "404 Not Found") })
        .with_state(inner)
}

fn message(status: StatusCode, text: &str) -> Response {
    (status, [("content-type", "application/json")], json!({ "message": text }).to_string()).into_response()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty())
}

/// The downstream a runner-token call comes from (`RUNNER-TOKEN` header or `token` field).
fn downstream_of(inner: &Inner, headers: &HeaderMap, body: &Value) -> Option<usize> {
    let token = header(headers, "runner-token").or_else(|| body.get("token").and_then(Value::as_str))?;
    inner.settings.downstreams.iter().position(|d| d.token == token)
}

/// The job token of a job call (`JOB-TOKEN` header or `token` field).
fn job_token<'a>(headers: &'a HeaderMap, body: Option<&'a Value>) -> Option<&'a str> {
    header(headers, "job-token").or_else(|| body.and_then(|b| b.get("token")).and_then(Value::as_str))
}

/// Which upstream a job call goes to: the held job's, else the job the token belongs to (a
/// dependency's artifacts are fetched with the running job's token), else the only upstream.
/// The flag says whether job `id` is held with that very token.
fn route(inner: &Inner, id: i64, token: Option<&str>) -> Option<(usize, bool)> {
    let st = inner.lock();
    if let Some(job) = st.jobs.get(&id) {
        return Some((job.origin.upstream, Some(job.origin.token.as_str()) == token));
    }
    if let Some(holder) = token.and_then(|t| st.by_token.get(t)).and_then(|i| st.jobs.get(i)) {
        return Some((holder.origin.upstream, false));
    }
    (inner.settings.upstreams.len() == 1).then_some((0, false))
}

/// GitLab's answer as the downstream's: status, the headers that mean something, the body
/// streamed.
fn relay(response: reqwest::Response) -> Response {
    let mut out = Response::builder().status(response.status().as_u16());
    for name in FORWARDED_RESPONSE_HEADERS {
        if let Some(value) = response.headers().get(*name) {
            out = out.header(*name, value.clone());
        }
    }
    let body = Body::from_stream(response.bytes_stream());
    out.body(body).unwrap_or_else(|_| message(StatusCode::BAD_GATEWAY, "502 Bad Gateway"))
}

/// Pass a request through to upstream `u`.
async fn forward(
    inner: &Inner,
    u: usize,
    endpoint: Endpoint,
    method: Method,
    path_and_query: &str,
    headers: &HeaderMap,
    body: reqwest::Body,
) -> Result<reqwest::Response, Response> {
    let Some(upstream) = inner.settings.upstreams.get(u) else {
        return Err(message(StatusCode::NOT_FOUND, "404 Not Found"));
    };
    let request = Forward { endpoint, method, url: &upstream.url, path_and_query, headers, body };
    upstream.client.forward(request).await.map_err(|e| {
        tracing::warn!(upstream = %upstream.url, "passing a request to GitLab failed: {e}");
        message(StatusCode::BAD_GATEWAY, "502 Bad Gateway - GitLab did not answer the router")
    })
}

/// The runner is alive for its accepted job.
fn seen(inner: &Inner, id: i64) {
    let mut st = inner.lock();
    if let Some(job) = st.jobs.get_mut(&id) {
        if let Phase::Accepted { last_seen, .. } = &mut job.phase {
            *last_seen = Instant::now();
        }
    }
}

/// Removes a waiting request that ended without a job (timeout, the runner hung up).
struct WaiterGuard<'a> {
    inner: &'a Inner,
    seq: u64,
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        self.inner.lock().waiters.retain(|w| w.seq != self.seq);
    }
}

async fn request_job(State(inner): Shared, headers: HeaderMap, body: Bytes) -> Response {
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return message(StatusCode::BAD_REQUEST, "400 Bad request - body is not JSON");
    };
    let Some(d) = downstream_of(&inner, &headers, &body) else {
        return message(StatusCode::FORBIDDEN, "403 Forbidden");
    };
    inner.stats.poll(d);
    let info = body.get("info").cloned().unwrap_or_else(|| json!({}));
    let two_phase = info.pointer("/features/two_phase_job_commit").and_then(Value::as_bool).unwrap_or(false);
    let settings = &inner.settings;
    let until = Instant::now() + settings.long_poll_timeout;
    loop {
        let (taken, rx, guard) = {
            let mut st = inner.lock();
            st.last_poll = Some(Instant::now());
            st.last_info = Some(info.clone());
            match st.take_for(&settings.downstreams, d, Instant::now() + settings.accept_timeout) {
                Some(h) => (Some(h), None, None),
                None => {
                    let (tx, rx) = oneshot::channel();
                    let seq = st.take_seq();
                    st.waiters.push(Waiter { seq, downstream: d, tx, info: info.clone() });
                    (None, Some(rx), Some(WaiterGuard { inner: &inner, seq }))
                }
            }
        };
        let id = match (taken, rx) {
            (Some(h), _) => {
                persist::after_hand_out(&inner, vec![h.clone()]).await;
                h.id
            }
            (None, Some(mut rx)) => {
                inner.wake.notify_waiters();
                let left = until.saturating_duration_since(Instant::now());
                let got = tokio::select! {
                    r = &mut rx => r.ok(),
                    _ = tokio::time::sleep(left) => None,
                    _ = inner.stop.cancelled() => None,
                };
                drop(guard);
                // A job sent just as the wait ended is still ours.
                match got.or_else(|| rx.try_recv().ok()) {
                    Some(id) => id,
                    None => return no_job(&inner),
                }
            }
            (None, None) => return no_job(&inner),
        };
        // Saved as offered (with how it will be accepted) before the runner gets the job: a
        // restarted router knows who has it. A save the hand-out already made is not repeated.
        if let Some(job) = inner.lock().jobs.get_mut(&id).filter(|j| j.two_phase != two_phase) {
            job.two_phase = two_phase;
            job.version += 1;
        }
        persist::save(&inner, id).await;
        let raw = inner.lock().jobs.get(&id).map(|j| j.origin.raw.clone());
        let Some(raw) = raw else { continue };
        return Response::builder()
            .status(StatusCode::CREATED)
            .header("content-type", "application/json")
            .header(ROUTER_FEATURES_HEADER, DECLINE_FEATURE)
            .body(Body::from(raw))
            .unwrap_or_else(|_| message(StatusCode::INTERNAL_SERVER_ERROR, "500"));
    }
}

/// The answer to a job request that ended without a job, as GitLab gives it: 204 with the
/// queue's version in `X-GitLab-Last-Update` (a runner sending it back while nothing entered
/// the queue waits its `check_interval`; one seeing it move on asks again at once).
fn no_job(inner: &Inner) -> Response {
    let version = format!("{:016x}", inner.lock().queue_version);
    (StatusCode::NO_CONTENT, [("gitlab-ci-builds-polling", "yes".to_string()), ("x-gitlab-last-update", version)])
        .into_response()
}

/// A runner's call about job `id` (with `token`): where it goes (upstream, held with this
/// token), the job accepted at GitLab first when due, the runner seen alive.
async fn contact(inner: &Arc<Inner>, id: i64, token: Option<&str>) -> Result<(usize, bool), Response> {
    let Some((u, held)) = route(inner, id, token) else {
        return Err(message(StatusCode::NOT_FOUND, "404 Not Found"));
    };
    if held {
        accept_on_contact(inner, id).await?;
        seen(inner, id);
    }
    Ok((u, held))
}

/// A runner without two-phase commit calls about its job for the first time (a trace patch,
/// a final update, an upload): it runs the job, so the router accepts it at GitLab now. A
/// runner whose job answer was lost never calls, and the job goes to another after
/// `accept_timeout` instead of being stranded. `Err` is the answer to give the runner.
async fn accept_on_contact(inner: &Arc<Inner>, id: i64) -> Result<(), Response> {
    let due = inner.lock().jobs.get(&id).is_some_and(|j| !j.two_phase && !matches!(j.phase, Phase::Accepted { .. }));
    if !due {
        return Ok(());
    }
    accept_now(inner, id).await
}

/// The router accepts held job `id` at GitLab for its runner (`PUT state=running`) and watches
/// it as accepted; `Err` is the answer to give the runner (403 when GitLab no longer has the
/// job for us, 503 when GitLab did not decide).
async fn accept_now(inner: &Arc<Inner>, id: i64) -> Result<(), Response> {
    match upstream::accept(inner, id).await {
        Accept::Accepted => {
            mark_accepted(inner, id, None);
            persist::save(inner, id).await;
            Ok(())
        }
        Accept::Gone => {
            upstream::release(inner, id).await;
            Err(message(StatusCode::FORBIDDEN, "403 Forbidden - Job is not processing on runner"))
        }
        Accept::Unavailable(e) => {
            tracing::warn!(job = id, "accepting the job at GitLab failed: {e}");
            Err(message(StatusCode::SERVICE_UNAVAILABLE, "503 Service Unavailable"))
        }
    }
}

fn mark_accepted(inner: &Inner, id: i64, fallback: Option<usize>) -> Option<usize> {
    let mut st = inner.lock();
    let job = st.jobs.get_mut(&id)?;
    let downstream = job.phase.downstream().or(fallback);
    job.phase = Phase::Accepted { downstream, last_seen: Instant::now() };
    job.version += 1;
    st.queue.remove(id);
    inner.stats.accepted(downstream);
    downstream
}

/// A two-phase ping for job `id`: its offer's deadline moves on (a job the router holds as
/// queued — it restarted between offer and ping — is the pinging runner's now).
fn ping(inner: &Inner, id: i64) -> bool {
    let mut st = inner.lock();
    let Some(job) = st.jobs.get_mut(&id) else { return false };
    let deadline = Instant::now() + inner.settings.accept_timeout;
    match job.phase {
        Phase::Offered { downstream, .. } => job.phase = Phase::Offered { downstream, deadline },
        Phase::Queued => {
            job.phase = Phase::Offered { downstream: None, deadline };
            job.version += 1;
            st.queue.remove(id);
        }
        Phase::Accepted { .. } => return false,
    }
    true
}

fn pending_ok() -> Response {
    (
        StatusCode::OK,
        [("content-type", "application/json"), ("job-status", "pending")],
        json!({"message": "200 OK"}).to_string(),
    )
        .into_response()
}

async fn update_job(State(inner): Shared, Path(id): Path<i64>, headers: HeaderMap, body: Bytes) -> Response {
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    let token = job_token(&headers, parsed.as_ref()).map(str::to_string);
    let Some((u, held)) = route(&inner, id, token.as_deref()) else {
        return message(StatusCode::NOT_FOUND, "404 Not Found");
    };
    let state = parsed.as_ref().and_then(|b| b.get("state")).and_then(Value::as_str).unwrap_or_default().to_string();
    if held && state == "pending" && ping(&inner, id) {
        persist::save(&inner, id).await;
        return pending_ok();
    }
    if held && state != "running" {
        if let Err(answer) = accept_on_contact(&inner, id).await {
            return answer;
        }
    }
    if held {
        seen(&inner, id);
    }
    let path = format!("jobs/{id}");
    let response =
        match forward(&inner, u, Endpoint::UpdateJob, Method::PUT, &path, &headers, reqwest::Body::from(body)).await {
            Ok(r) => r,
            Err(r) => return r,
        };
    if held && response.status() == reqwest::StatusCode::OK {
        match state.as_str() {
            "running" => {
                let was_accepted =
                    inner.lock().jobs.get(&id).is_some_and(|j| matches!(j.phase, Phase::Accepted { .. }));
                if !was_accepted {
                    mark_accepted(&inner, id, None);
                    persist::save(&inner, id).await;
                }
            }
            "success" | "failed" => upstream::release(&inner, id).await,
            _ => {}
        }
    }
    if held && matches!(response.status().as_u16(), 403 | 404) {
        upstream::release(&inner, id).await;
    }
    relay(response)
}

async fn patch_trace(
    State(inner): Shared,
    Path(id): Path<i64>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let token = job_token(&headers, None).map(str::to_string);
    let (u, held) = match contact(&inner, id, token.as_deref()).await {
        Ok(routed) => routed,
        Err(answer) => return answer,
    };
    let path = with_query(format!("jobs/{id}/trace"), query);
    let response =
        match forward(&inner, u, Endpoint::PatchTrace, Method::PATCH, &path, &headers, reqwest::Body::from(body)).await
        {
            Ok(r) => r,
            Err(r) => return r,
        };
    let size = response
        .headers()
        .get("range")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.rsplit_once('-'))
        .and_then(|(_, end)| end.trim().parse::<u64>().ok());
    if let (true, Some(size)) = (held, size) {
        if let Some(job) = inner.lock().jobs.get_mut(&id) {
            job.upstream_trace_size = size;
        }
    }
    relay(response)
}

/// `path` with the runner's query string, when it sent one, passed on as it was.
fn with_query(path: String, query: Option<String>) -> String {
    match query {
        Some(q) => format!("{path}?{q}"),
        None => path,
    }
}

async fn runner_provisioning(
    State(inner): Shared,
    Path(id): Path<i64>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    let token = job_token(&headers, parsed.as_ref()).map(str::to_string);
    let from_query = query.as_deref().and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes()).find(|(k, _)| k == "status").map(|(_, v)| v.into_owned())
    });
    let status = from_query
        .or_else(|| parsed.as_ref().and_then(|b| b.get("status")).and_then(Value::as_str).map(str::to_string))
        .unwrap_or_default();
    let phase = {
        let st = inner.lock();
        st.jobs.get(&id).filter(|j| Some(j.origin.token.as_str()) == token.as_deref()).map(|j| j.phase)
    };
    let Some(phase) = phase else {
        return message(StatusCode::NOT_FOUND, "404 Not Found - the router holds no such job");
    };
    match status.as_str() {
        "pending" => {
            if ping(&inner, id) {
                persist::save(&inner, id).await;
                pending_ok()
            } else {
                message(StatusCode::CONFLICT, "409 Conflict - job is already running")
            }
        }
        "accepted" => match phase {
            Phase::Accepted { .. } => message(StatusCode::OK, "200 OK"),
            _ => match accept_now(&inner, id).await {
                Ok(()) => message(StatusCode::OK, "200 OK"),
                Err(answer) => answer,
            },
        },
        "declined" => {
            let by = match phase {
                Phase::Accepted { .. } => {
                    return message(StatusCode::CONFLICT, "409 Conflict - job is already running");
                }
                other => other.downstream(),
            };
            let reason = parsed.as_ref().and_then(|b| b.get("reason")).and_then(Value::as_str).unwrap_or_default();
            tracing::info!(job = id, reason, "a runner declined the job");
            upstream::give_back(&inner, id, by, DeclineReason::Declined).await;
            message(StatusCode::OK, "200 OK")
        }
        other => message(
            StatusCode::BAD_REQUEST,
            &format!("400 Bad request - status {other:?} is not pending, accepted or declined"),
        ),
    }
}

async fn artifacts(
    State(inner): Shared,
    Path(id): Path<i64>,
    method: Method,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let token = job_token(&headers, None).map(str::to_string);
    let (u, _) = match contact(&inner, id, token.as_deref()).await {
        Ok(routed) => routed,
        Err(answer) => return answer,
    };
    if let Some(holder) = token.as_deref().and_then(|t| inner.lock().by_token.get(t).copied()) {
        seen(&inner, holder);
    }
    let path = with_query(format!("jobs/{id}/artifacts"), query);
    let endpoint = if method == Method::GET { Endpoint::DownloadArtifacts } else { Endpoint::UploadArtifacts };
    let stream = body.into_data_stream().map_err(std::io::Error::other);
    match forward(&inner, u, endpoint, method, &path, &headers, reqwest::Body::wrap_stream(stream)).await {
        Ok(r) => relay(r),
        Err(r) => r,
    }
}

async fn verify(State(inner): Shared, headers: HeaderMap, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let Some(d) = downstream_of(&inner, &headers, &body) else {
        return message(StatusCode::FORBIDDEN, "403 Forbidden");
    };
    let token = inner.settings.downstreams.get(d).map(|x| x.token.clone()).unwrap_or_default();
    let answer = json!({ "id": d + 1, "token": token, "token_expires_at": Value::Null });
    (StatusCode::OK, [("content-type", "application/json")], answer.to_string()).into_response()
}
