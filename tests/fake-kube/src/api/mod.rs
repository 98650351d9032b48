//! The HTTP API: one entry for every request that authenticates the bearer token, applies
//! the fault knobs (injected errors and connection resets), records create/update bodies, authorizes the verb on
//! the resource and dispatches to discovery, objects (CRUD, list, watch) or the pod streams
//! (log, exec, attach). Paths and answers follow the Kubernetes API reference.

mod discovery;
mod objects;
mod patch;
mod pods;
mod streams;
mod table;
mod watch;

pub(crate) use pods::prepare;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::Value;

use crate::app::Shared;
use crate::auth::{Attributes, User};
use crate::faults::Injected;
use crate::resources::{self, Resource};
use crate::status::ApiError;
use crate::tls::Peer;

/// The whole server: the control API and the Kubernetes API.
pub(crate) fn router(app: Shared) -> Router {
    Router::new().merge(crate::control::router()).fallback(entry).with_state(app)
}

/// What a request under `/api/v1` names.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub resource: Resource,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub sub: Option<String>,
}

/// Parse the segments after `/api/v1/` (`group` empty) or `/apis/GROUP/v1/`.
fn parse_target(group: &str, segments: &[&str]) -> Result<Target, ApiError> {
    let not_found = || ApiError::new(404, "NotFound", "the server could not find the requested resource");
    let resource_of = |name: &str| {
        resources::ALL.iter().copied().find(|r| r.plural == name && r.group == group).ok_or_else(not_found)
    };
    match segments {
        ["namespaces", ns, plural, rest @ ..] if !rest.is_empty() || *plural != "status" && *plural != "finalize" => {
            let resource = resource_of(plural)?;
            if !resource.namespaced {
                return Err(not_found());
            }
            let (name, sub) = match rest {
                [] => (None, None),
                [name] => (Some(name.to_string()), None),
                [name, sub] => (Some(name.to_string()), Some(sub.to_string())),
                _ => return Err(not_found()),
            };
            Ok(Target { resource, namespace: Some(ns.to_string()), name, sub })
        }
        [plural] => Ok(Target { resource: resource_of(plural)?, namespace: None, name: None, sub: None }),
        [plural, name] => {
            let resource = resource_of(plural)?;
            if resource.namespaced {
                return Err(not_found());
            }
            Ok(Target { resource, namespace: None, name: Some(name.to_string()), sub: None })
        }
        [plural, name, sub] => {
            let resource = resource_of(plural)?;
            Ok(Target { resource, namespace: None, name: Some(name.to_string()), sub: Some(sub.to_string()) })
        }
        _ => Err(not_found()),
    }
}

/// `a=b&c=d` → pairs, percent-decoded.
pub(crate) fn query_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The query of a request, as a lookup.
#[derive(Debug, Clone, Default)]
pub(crate) struct Query(pub Vec<(String, String)>);

impl Query {
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub(crate) fn all(&self, key: &str) -> Vec<&str> {
        self.0.iter().filter(|(k, _)| k == key).map(|(_, v)| v.as_str()).collect()
    }

    pub(crate) fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("1") | Some("true") | Some(""))
    }
}

/// The verb of a request, as authorization names it.
fn verb(method: &Method, target: &Target, query: &Query) -> &'static str {
    match (method.as_str(), &target.name, target.sub.as_deref()) {
        (_, _, Some("exec") | Some("attach")) => "create",
        ("GET", None, _) if query.flag("watch") => "watch",
        ("GET", None, _) => "list",
        ("GET", Some(_), _) => "get",
        ("POST", _, _) => "create",
        ("PUT", _, _) => "update",
        ("PATCH", _, _) => "patch",
        ("DELETE", None, _) => "deletecollection",
        ("DELETE", Some(_), _) => "delete",
        _ => "get",
    }
}

async fn entry(State(app): State<Shared>, request: Request) -> Response {
    match handle(app, request).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn handle(app: Shared, request: Request) -> Result<Response, ApiError> {
    let user = app.tokens.authenticate(request.headers().get("authorization").and_then(|v| v.to_str().ok()))?;
    let user = crate::rbac::resolve(&app.store, user);
    let path = request.uri().path().to_string();
    let query_text = request.uri().query().unwrap_or("").to_string();
    let path_and_query = if query_text.is_empty() { path.clone() } else { format!("{path}?{query_text}") };
    let peer = request.extensions().get::<ConnectInfo<Peer>>().map(|info| info.0 .0);
    if let Some(peer) = peer {
        app.faults.connections().note(peer, &path);
    }
    match app.faults.failure_for(request.method().as_str(), &path_and_query, peer) {
        Some(Injected::Answer(error)) => return Err(error),
        // The connection fails before this answer is written.
        Some(Injected::Reset) => return Err(ApiError::new(500, "InternalError", "connection reset by fake-kube")),
        None => {}
    }
    let query = Query(query_pairs(&query_text));
    let segments: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    let api = match segments.as_slice() {
        ["api", "v1", rest @ ..] if !rest.is_empty() => Some(("", rest)),
        ["apis", group, "v1", rest @ ..] if !rest.is_empty() && resources::GROUPS.contains(group) => {
            Some((*group, rest))
        }
        _ => None,
    };
    match (api, segments.as_slice()) {
        (Some((group, rest)), _) => {
            let target = parse_target(group, rest)?;
            let attributes = Attributes {
                verb: verb(request.method(), &target, &query).to_string(),
                resource: match &target.sub {
                    Some(sub) if target.resource == resources::PODS => format!("pods/{sub}"),
                    _ => target.resource.plural.to_string(),
                },
                group: group.to_string(),
                namespace: target.namespace.clone(),
                name: target.name.clone(),
            };
            if !user.allows(&attributes) {
                return Err(user.forbidden(&attributes));
            }
            if matches!(target.sub.as_deref(), Some("exec") | Some("attach") | Some("log")) {
                return streams::handle(app, target, query, request).await;
            }
            let method = request.method().clone();
            let headers = request.headers().clone();
            let body = body_json(&app, &method, &headers, &path, &query_text, request.into_body()).await?;
            objects::handle(app, &method, &headers, target, query, body).await
        }
        (None, ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"])
            if request.method() == Method::POST =>
        {
            let headers = request.headers().clone();
            let body = body_json(&app, &Method::POST, &headers, &path, &query_text, request.into_body()).await?;
            Ok(access_review(&user, body.unwrap_or_default()))
        }
        (None, _) => discovery::handle(&path, request.headers()),
    }
}

/// The JSON body of a create/update/patch (recorded for `/fake-kube/requests`).
async fn body_json(
    app: &Shared,
    method: &Method,
    headers: &axum::http::HeaderMap,
    path: &str,
    query: &str,
    body: Body,
) -> Result<Option<Value>, ApiError> {
    if !matches!(method.as_str(), "POST" | "PUT" | "PATCH" | "DELETE") {
        return Ok(None);
    }
    let bytes = axum::body::to_bytes(body, 64 << 20).await.map_err(|e| ApiError::bad_request(e.to_string()))?;
    if bytes.is_empty() {
        return Ok(None);
    }
    let kind = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("application/json");
    let value: Value = if kind.starts_with("application/vnd.kubernetes.protobuf") {
        crate::proto::decode(&bytes)?
    } else if kind.contains("cbor") || kind.contains("yaml") {
        return Err(ApiError::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json, application/vnd.kubernetes.protobuf (got {kind})")));
    } else {
        serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::bad_request(format!("the body of the request was in an unknown format - accepted media types include: application/json ({e})"))
        })?
    };
    if method != Method::DELETE {
        app.faults.record(method.as_str(), path, query, value.clone());
    }
    Ok(Some(value))
}

/// A SelfSubjectAccessReview: `status.allowed` for the user's rules.
fn access_review(user: &User, mut review: Value) -> Response {
    let attributes = &review["spec"]["resourceAttributes"];
    let resource = attributes["resource"].as_str().unwrap_or_default();
    let sub = attributes["subresource"].as_str().filter(|s| !s.is_empty());
    let asked = Attributes {
        verb: attributes["verb"].as_str().unwrap_or_default().to_string(),
        resource: match sub {
            Some(sub) => format!("{resource}/{sub}"),
            None => resource.to_string(),
        },
        group: attributes["group"].as_str().unwrap_or_default().to_string(),
        namespace: attributes["namespace"].as_str().filter(|n| !n.is_empty()).map(String::from),
        name: attributes["name"].as_str().filter(|n| !n.is_empty()).map(String::from),
    };
    let allowed = user.allows(&asked) || user.rules.is_none();
    review["kind"] = Value::from("SelfSubjectAccessReview");
    review["apiVersion"] = Value::from("authorization.k8s.io/v1");
    if !review["metadata"].is_object() {
        review["metadata"] = serde_json::json!({});
    }
    review["metadata"]["creationTimestamp"] = Value::Null;
    review["status"] = if allowed {
        serde_json::json!({"allowed": true, "reason": format!("fake-kube: a rule of user {:?} allows it", user.name)})
    } else {
        serde_json::json!({"allowed": false})
    };
    (axum::http::StatusCode::CREATED, axum::Json(review)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_queries() {
        let q = Query(query_pairs("labelSelector=app%3Dweb%2Ctier&watch=1&command=echo&command=a+b"));
        assert_eq!(q.get("labelSelector"), Some("app=web,tier"));
        assert!(q.flag("watch"));
        assert_eq!(q.all("command"), vec!["echo", "a b"]);
        assert_eq!(decode("100%"), "100%");
    }

    #[test]
    fn parses_paths() {
        let t = parse_target("", &["namespaces", "a", "pods", "p", "exec"]).unwrap();
        assert_eq!((t.namespace.as_deref(), t.name.as_deref(), t.sub.as_deref()), (Some("a"), Some("p"), Some("exec")));
        let t = parse_target("", &["namespaces", "a"]).unwrap();
        assert_eq!((t.resource.plural, t.name.as_deref()), ("namespaces", Some("a")));
        assert!(parse_target("", &["bogus"]).is_err());
        let t = parse_target("apps", &["namespaces", "a", "deployments", "d"]).unwrap();
        assert_eq!((t.resource.kind, t.name.as_deref()), ("Deployment", Some("d")));
        assert!(parse_target("", &["namespaces", "a", "deployments"]).is_err());
    }
}
