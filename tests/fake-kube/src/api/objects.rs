//! Object calls under `/api/v1`: create (201, 409 AlreadyExists, 404 for a missing
//! namespace), get, list (label and field selectors, Table answers), update and patch
//! (optimistic `resourceVersion`, pod spec immutability, the `status` subresource), delete
//! (pods through the kubelet with their grace period, namespaces with what is in them) and
//! deletecollection. Watches are in `watch.rs`.

use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::{patch, pods, table, watch, Query, Target};
use crate::app::Shared;
use crate::resources::{Resource, CONFIGMAPS, NAMESPACES, PODS, SERVICEACCOUNTS};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::now_rfc3339;

fn json_response(code: StatusCode, value: Value) -> Response {
    (code, axum::Json(value)).into_response()
}

pub(super) fn accept(headers: &HeaderMap) -> String {
    headers.get("accept").and_then(|v| v.to_str().ok()).unwrap_or("application/json").to_string()
}

pub(super) async fn handle(
    app: Shared,
    method: &Method,
    headers: &HeaderMap,
    target: Target,
    query: Query,
    body: Option<Value>,
) -> Result<Response, ApiError> {
    let ns = target.namespace.clone().unwrap_or_default();
    let resource = target.resource;
    let sub = target.sub.as_deref();
    if sub.is_some_and(|s| s != "status") {
        return Err(ApiError::new(404, "NotFound", "the server could not find the requested resource"));
    }
    match (method.as_str(), target.name.as_deref()) {
        ("GET", None) if query.flag("watch") => watch::serve(app, target, query, &accept(headers)),
        ("GET", None) => list(&app, resource, target.namespace.as_deref(), &query, &accept(headers)),
        ("POST", None) => create(&app, resource, &ns, body, &query),
        ("GET", Some(name)) => {
            let object =
                app.store.get(resource, &ns, name).ok_or_else(|| ApiError::not_found(resource.plural, name))?;
            if table::wants_table(&accept(headers)) {
                let include = query.get("includeObject").unwrap_or("Metadata");
                return Ok(json_response(
                    StatusCode::OK,
                    table::table(resource, &[object], app.store.current(), include, true),
                ));
            }
            Ok(json_response(StatusCode::OK, object))
        }
        ("PUT", Some(name)) => {
            let body = body.ok_or_else(|| ApiError::bad_request("the request body is empty"))?;
            let object = replace(&app, resource, &ns, name, sub, body)?;
            Ok(json_response(StatusCode::OK, object))
        }
        ("PATCH", Some(name)) => {
            let body = body.ok_or_else(|| ApiError::bad_request("the request body is empty"))?;
            let kind = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
            let current =
                app.store.get(resource, &ns, name).ok_or_else(|| ApiError::not_found(resource.plural, name))?;
            let mut patched = current.clone();
            if kind.starts_with("application/merge-patch+json") {
                patch::merge(&mut patched, &body);
            } else if kind.starts_with("application/strategic-merge-patch+json") {
                patch::strategic(&mut patched, &body);
            } else if kind.starts_with("application/json-patch+json") {
                patch::json_patch(&mut patched, &body)?;
            } else {
                return Err(ApiError::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {kind:?})")));
            }
            // A patch naming a resourceVersion makes it a precondition; otherwise none.
            if body["metadata"]["resourceVersion"].is_null() {
                patched["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
            }
            if query.get("dryRun") == Some("All") {
                return Ok(json_response(StatusCode::OK, patched));
            }
            let object = replace(&app, resource, &ns, name, sub, patched)?;
            Ok(json_response(StatusCode::OK, object))
        }
        ("DELETE", Some(name)) => delete(&app, resource, &ns, name, &query, body.as_ref()),
        ("DELETE", None) => {
            let (items, _) = select(&app, resource, target.namespace.as_deref(), &query)?;
            let mut deleted = Vec::new();
            for item in items {
                let name = item["metadata"]["name"].as_str().unwrap_or_default().to_string();
                let item_ns = item["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
                if let Ok(response) = delete_object(&app, resource, &item_ns, &name, &query, body.as_ref()) {
                    deleted.push(response);
                }
            }
            Ok(json_response(
                StatusCode::OK,
                json!({"kind": format!("{}List", resource.kind), "apiVersion": resource.api_version(), "metadata": {}, "items": deleted}),
            ))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// The objects a list or watch selects.
pub(super) fn select(
    app: &Shared,
    resource: Resource,
    namespace: Option<&str>,
    query: &Query,
) -> Result<(Vec<Value>, u64), ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or(""))?;
    let fields = FieldSelector::parse(query.get("fieldSelector").unwrap_or(""))?;
    let (items, rv) = app.store.list(resource, namespace);
    Ok((items.into_iter().filter(|o| labels.matches(o) && fields.matches(o)).collect(), rv))
}

fn list(
    app: &Shared,
    resource: Resource,
    namespace: Option<&str>,
    query: &Query,
    accept: &str,
) -> Result<Response, ApiError> {
    let (items, rv) = select(app, resource, namespace, query)?;
    if table::wants_table(accept) {
        let include = query.get("includeObject").unwrap_or("Metadata");
        return Ok(json_response(StatusCode::OK, table::table(resource, &items, rv, include, true)));
    }
    let items: Vec<Value> = items
        .into_iter()
        .map(|mut item| {
            if let Some(map) = item.as_object_mut() {
                map.remove("kind");
                map.remove("apiVersion");
            }
            item
        })
        .collect();
    Ok(json_response(
        StatusCode::OK,
        json!({"kind": format!("{}List", resource.kind), "apiVersion": resource.api_version(), "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
    ))
}

fn create(
    app: &Shared,
    resource: Resource,
    ns: &str,
    body: Option<Value>,
    query: &Query,
) -> Result<Response, ApiError> {
    let mut object = body.ok_or_else(|| ApiError::bad_request("the request body is empty"))?;
    if !object.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    if let Some(kind) = object["kind"].as_str() {
        if kind != resource.kind {
            return Err(ApiError::bad_request(format!("the API version in the data ({}) does not match the expected API version ({}) or kind {kind} is not {}", object["apiVersion"].as_str().unwrap_or(""), resource.api_version(), resource.kind)));
        }
    }
    if resource.namespaced {
        match object["metadata"]["namespace"].as_str() {
            Some(given) if !given.is_empty() && given != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ))
            }
            _ => {}
        }
        if app.store.get(NAMESPACES, "", ns).is_none() {
            return Err(ApiError::not_found("namespaces", ns));
        }
        if app.store.get(NAMESPACES, "", ns).is_some_and(|n| n["status"]["phase"] == "Terminating") {
            return Err(ApiError::new(403, "Forbidden", format!("{} \"{}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated", resource.plural, object["metadata"]["name"].as_str().unwrap_or(""))));
        }
    }
    if let Some(meta) = object["metadata"].as_object_mut() {
        for key in ["uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"] {
            meta.remove(key);
        }
    }
    pods::prepare(resource, &mut object)?;
    if query.get("dryRun") == Some("All") {
        return Ok(json_response(StatusCode::CREATED, object));
    }
    let created = app.store.create(resource, ns, object)?;
    if resource == NAMESPACES {
        let name = created["metadata"]["name"].as_str().unwrap_or_default();
        let _ = app.store.create(SERVICEACCOUNTS, name, json!({"metadata": {"name": "default"}}));
        let _ = app.store.create(CONFIGMAPS, name, crate::rbac::root_ca_config_map(&app.ca_pem));
    }
    Ok(json_response(StatusCode::CREATED, created))
}

/// Replace an object (PUT, or the result of a PATCH), keeping what the client may not set.
fn replace(
    app: &Shared,
    resource: Resource,
    ns: &str,
    name: &str,
    sub: Option<&str>,
    mut new: Value,
) -> Result<Value, ApiError> {
    if new["metadata"]["name"].as_str().is_some_and(|n| n != name) {
        return Err(ApiError::bad_request("the name of the object does not match the name on the URL"));
    }
    if resource == crate::resources::SECRETS {
        pods::prepare_secret(&mut new)?;
    }
    app.store.update(resource, ns, name, |current| {
        let wanted = new["metadata"]["resourceVersion"].as_str().filter(|v| !v.is_empty());
        if wanted.is_some_and(|v| Some(v) != current["metadata"]["resourceVersion"].as_str()) {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!("Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again", resource.plural),
            )
            .with_details(json!({"name": name, "kind": resource.plural})));
        }
        if sub == Some("status") {
            current["status"] = new["status"].take();
            return Ok(());
        }
        if resource == PODS && new["spec"] != current["spec"] {
            return Err(ApiError::invalid(
                "Pod",
                name,
                &[("spec".into(), "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)".into())],
            ));
        }
        let keep = ["uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "namespace", "name", "resourceVersion"];
        for key in keep {
            new["metadata"][key] = current["metadata"][key].clone();
        }
        if let Some(meta) = new["metadata"].as_object_mut() {
            meta.retain(|_, v| !v.is_null());
        }
        if resource == PODS || resource == NAMESPACES {
            new["status"] = current["status"].clone();
        }
        new["kind"] = json!(resource.kind);
        new["apiVersion"] = json!(resource.api_version());
        *current = new;
        Ok(())
    })
}

fn delete(
    app: &Shared,
    resource: Resource,
    ns: &str,
    name: &str,
    query: &Query,
    body: Option<&Value>,
) -> Result<Response, ApiError> {
    let object = delete_object(app, resource, ns, name, query, body)?;
    Ok(json_response(StatusCode::OK, object))
}

fn grace_of(query: &Query, body: Option<&Value>) -> Option<u64> {
    body.and_then(|b| b["gracePeriodSeconds"].as_u64())
        .or_else(|| query.get("gracePeriodSeconds").and_then(|g| g.parse().ok()))
}

fn delete_object(
    app: &Shared,
    resource: Resource,
    ns: &str,
    name: &str,
    query: &Query,
    body: Option<&Value>,
) -> Result<Value, ApiError> {
    let current = app.store.get(resource, ns, name).ok_or_else(|| ApiError::not_found(resource.plural, name))?;
    if let Some(uid) = body.and_then(|b| b["preconditions"]["uid"].as_str()) {
        if current["metadata"]["uid"].as_str() != Some(uid) {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    current["metadata"]["uid"].as_str().unwrap_or("")
                ),
            ));
        }
    }
    if query.get("dryRun") == Some("All") {
        return Ok(current);
    }
    match resource {
        PODS => {
            if current["metadata"]["deletionTimestamp"].is_string() {
                let grace = grace_of(query, body);
                let shorter = grace
                    .is_some_and(|g| current["metadata"]["deletionGracePeriodSeconds"].as_u64().is_none_or(|c| g < c));
                if !shorter {
                    return Ok(current);
                }
            }
            let grace =
                grace_of(query, body).or(current["spec"]["terminationGracePeriodSeconds"].as_u64()).unwrap_or(30);
            let at = chrono::Utc::now() + chrono::Duration::seconds(grace as i64);
            app.store.update(PODS, ns, name, |pod| {
                pod["metadata"]["deletionTimestamp"] = json!(at.format("%Y-%m-%dT%H:%M:%SZ").to_string());
                pod["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
                Ok(())
            })
        }
        NAMESPACES => {
            if name == "default" || name.starts_with("kube-") {
                return Err(ApiError::new(
                    403,
                    "Forbidden",
                    format!("namespaces \"{name}\" is forbidden: this namespace may not be deleted"),
                ));
            }
            let updated = app.store.update(NAMESPACES, "", name, |n| {
                n["status"]["phase"] = json!("Terminating");
                if n["metadata"]["deletionTimestamp"].is_null() {
                    n["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
                }
                Ok(())
            })?;
            let app = app.clone();
            let name = name.to_string();
            tokio::spawn(async move { finish_namespace(app, name).await });
            Ok(updated)
        }
        _ => app.store.delete(resource, ns, name).ok_or_else(|| ApiError::not_found(resource.plural, name)),
    }
}

/// Delete what a terminating namespace holds (pods through the kubelet), then the namespace.
async fn finish_namespace(app: Shared, name: String) {
    let (pods, _) = app.store.list(PODS, Some(&name));
    for pod in pods {
        let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let _ = delete_object(&app, PODS, &name, &pod_name, &Query::default(), None);
    }
    for _ in 0..1200 {
        if app.store.list(PODS, Some(&name)).0.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    for resource in crate::resources::ALL.iter().filter(|r| r.namespaced) {
        for object in app.store.list(*resource, Some(&name)).0 {
            app.store.delete(*resource, &name, object["metadata"]["name"].as_str().unwrap_or_default());
        }
    }
    app.store.delete(NAMESPACES, "", &name);
}
