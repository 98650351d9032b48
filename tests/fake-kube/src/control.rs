//! The control API under `/fake-kube/` (admin token only): add tokens with rules, hold pods
//! Unschedulable, answer chosen calls with errors (or reset their connections), cut watches
//! and exec/attach streams, reset every open connection, evict a pod, compact the watch
//! history, and read the faults injected by kind and the create/update bodies received.
//! Turns knobs in `faults.rs` and the auth/kubelet state; serves no Kubernetes path.

use axum::body::Bytes;
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::app::Shared;
use crate::auth::{Rule, User};
use crate::faults::{Failure, Hold};
use crate::resources::PODS;
use crate::selectors::LabelSelector;
use crate::status::ApiError;
use crate::tls::Peer;

pub(crate) fn router() -> Router<Shared> {
    Router::new()
        .route("/fake-kube/tokens", post(add_token))
        .route("/fake-kube/unschedulable", post(hold).delete(clear_holds))
        .route("/fake-kube/failures", post(fail))
        .route("/fake-kube/cut-watches", post(cut_watches))
        .route("/fake-kube/cut-streams", post(cut_streams))
        .route("/fake-kube/reset-connections", post(reset_connections))
        .route("/fake-kube/injected", get(injected))
        .route("/fake-kube/evict", post(evict))
        .route("/fake-kube/compact", post(compact))
        .route("/fake-kube/requests", get(requests).delete(clear_requests))
}

fn admin(app: &Shared, headers: &HeaderMap) -> Result<(), ApiError> {
    let user = app.tokens.authenticate(headers.get("authorization").and_then(|v| v.to_str().ok()))?;
    if user.rules.is_some() {
        return Err(ApiError::new(
            403,
            "Forbidden",
            format!("User \"{}\" may not use the fake-kube control API", user.name),
        ));
    }
    Ok(())
}

fn parse<T: for<'de> Deserialize<'de>>(body: Value) -> Result<T, ApiError> {
    serde_json::from_value(body).map_err(|e| ApiError::bad_request(format!("control API: {e}")))
}

fn answer(result: Result<Value, ApiError>) -> Response {
    match result {
        Ok(value) => (StatusCode::OK, Json(value)).into_response(),
        Err(e) => e.into_response(),
    }
}

#[derive(Deserialize)]
struct TokenBody {
    token: String,
    user: String,
    #[serde(default)]
    rules: Vec<Rule>,
}

async fn add_token(State(app): State<Shared>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    answer(admin(&app, &headers).and_then(|()| {
        let body: TokenBody = parse(body)?;
        app.tokens.add(body.token, User { name: body.user.clone(), rules: Some(body.rules), service_account: None });
        Ok(json!({"user": body.user}))
    }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HoldBody {
    namespace: Option<String>,
    name: Option<String>,
    label_selector: Option<String>,
    seconds: f64,
}

async fn hold(State(app): State<Shared>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    answer(admin(&app, &headers).and_then(|()| {
        let body: HoldBody = parse(body)?;
        let selector = body.label_selector.as_deref().map(LabelSelector::parse).transpose()?;
        app.faults.hold(Hold { namespace: body.namespace, name: body.name, selector, seconds: body.seconds });
        Ok(json!({}))
    }))
}

async fn clear_holds(State(app): State<Shared>, headers: HeaderMap) -> Response {
    answer(admin(&app, &headers).map(|()| {
        app.faults.clear_holds();
        json!({})
    }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FailureBody {
    method: Option<String>,
    path: String,
    #[serde(default = "one")]
    count: u64,
    #[serde(default = "internal")]
    status: u16,
    message: Option<String>,
    retry_after_seconds: Option<u64>,
    #[serde(default)]
    etcd_timeout: bool,
    #[serde(default)]
    reset: bool,
}

fn one() -> u64 {
    1
}

fn internal() -> u16 {
    500
}

async fn fail(State(app): State<Shared>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    answer(admin(&app, &headers).and_then(|()| {
        let body: FailureBody = parse(body)?;
        let path = regex::Regex::new(&body.path).map_err(|e| ApiError::bad_request(format!("path: {e}")))?;
        let status = if body.etcd_timeout { 500 } else { body.status };
        let message = match (body.etcd_timeout, body.message) {
            (true, _) => "etcdserver: request timed out".to_string(),
            (false, Some(m)) => m,
            (false, None) => match status {
                429 => "Too many requests, please try again later.".to_string(),
                503 => "the server is currently unable to handle the request".to_string(),
                _ => "Internal error occurred: injected by fake-kube".to_string(),
            },
        };
        let retry_after = body.retry_after_seconds.or((status == 429).then_some(1));
        let reset = body.reset;
        app.faults.fail(Failure {
            method: body.method,
            path,
            remaining: body.count,
            status,
            message,
            retry_after,
            reset,
        });
        Ok(json!({}))
    }))
}

/// The optional `{"namespace": "ns"}` of a cut or a reset (none: every one).
#[derive(Deserialize, Default)]
struct Scope {
    namespace: Option<String>,
}

fn scope(body: &Bytes) -> Result<Scope, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Scope::default());
    }
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("control API: {e}")))
}

async fn cut_watches(State(app): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    answer(
        admin(&app, &headers)
            .and_then(|()| scope(&body))
            .map(|scope| json!({"cut": app.faults.cut_watches(scope.namespace.as_deref())})),
    )
}

async fn cut_streams(State(app): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    answer(
        admin(&app, &headers)
            .and_then(|()| scope(&body))
            .map(|scope| json!({"cut": app.faults.cut_streams(scope.namespace.as_deref())})),
    )
}

async fn reset_connections(
    State(app): State<Shared>,
    ConnectInfo(Peer(caller)): ConnectInfo<Peer>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    answer(
        admin(&app, &headers)
            .and_then(|()| scope(&body))
            .map(|scope| json!({"reset": app.faults.reset_connections(Some(caller), scope.namespace.as_deref())})),
    )
}

async fn injected(
    State(app): State<Shared>,
    headers: HeaderMap,
    Query(scope): Query<std::collections::HashMap<String, String>>,
) -> Response {
    answer(admin(&app, &headers).map(|()| app.faults.injected(scope.get("namespace").map(String::as_str))))
}

#[derive(Deserialize)]
struct EvictBody {
    #[serde(default = "default_namespace")]
    namespace: String,
    name: String,
}

fn default_namespace() -> String {
    "default".to_string()
}

async fn evict(State(app): State<Shared>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    answer(admin(&app, &headers).and_then(|()| {
        let body: EvictBody = parse(body)?;
        let pod =
            app.store.get(PODS, &body.namespace, &body.name).ok_or_else(|| ApiError::not_found("pods", &body.name))?;
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
        if !app.kubelet.evict(uid) {
            return Err(ApiError::new(409, "Conflict", format!("pod {} has no kubelet worker", body.name)));
        }
        Ok(json!({"uid": uid}))
    }))
}

async fn compact(State(app): State<Shared>, headers: HeaderMap) -> Response {
    answer(admin(&app, &headers).map(|()| json!({"resourceVersion": app.store.compact().to_string()})))
}

async fn requests(State(app): State<Shared>, headers: HeaderMap) -> Response {
    answer(admin(&app, &headers).map(|()| json!(app.faults.requests())))
}

async fn clear_requests(State(app): State<Shared>, headers: HeaderMap) -> Response {
    answer(admin(&app, &headers).map(|()| {
        app.faults.clear_requests();
        json!({})
    }))
}
