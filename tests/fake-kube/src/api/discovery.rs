//! Discovery and OpenAPI: `/version`, `/api`, `/apis`, `/api/v1`, the authorization group,
//! `/openapi/v3` (an index and the `api/v1` document, with the PATCH operations' GVK and
//! `fieldValidation` parameter kubectl looks for before it leaves validation to the server),
//! `/healthz`, `/livez`, `/readyz`. `/openapi/v2` is not served (404), which kubectl 1.37
//! tolerates.

use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::resources;
use crate::status::ApiError;

/// The Kubernetes version fake-kube answers as.
pub(crate) const VERSION: &str = "v1.37.0";

fn ok(value: Value) -> Result<Response, ApiError> {
    Ok(axum::Json(value).into_response())
}

pub(super) fn handle(path: &str, headers: &HeaderMap) -> Result<Response, ApiError> {
    let host = headers.get("host").and_then(|h| h.to_str().ok()).unwrap_or("127.0.0.1").to_string();
    match path.trim_end_matches('/') {
        "/version" => ok(json!({
            "major": "1",
            "minor": "37",
            "emulationMajor": "1",
            "emulationMinor": "37",
            "gitVersion": VERSION,
            "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean",
            "buildDate": "2026-11-01T00:00:00Z",
            "goVersion": "go1.25.0",
            "compiler": "gc",
            "platform": "linux/amd64"
        })),
        "/api" => ok(json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}]
        })),
        "/api/v1" => ok(resources::core_resource_list()),
        "/apis" => ok(resources::group_list()),
        "/apis/authorization.k8s.io" => ok(resources::authorization_group()),
        "/apis/authorization.k8s.io/v1" => ok(resources::authorization_resource_list()),
        "/openapi/v3" => {
            let mut paths = serde_json::Map::new();
            paths.insert("api/v1".into(), json!({"serverRelativeURL": "/openapi/v3/api/v1?hash=FAKEKUBE1"}));
            paths.insert("api".into(), json!({"serverRelativeURL": "/openapi/v3/api?hash=FAKEKUBE1"}));
            for group in resources::GROUPS {
                let url = format!("/openapi/v3/apis/{group}/v1?hash=FAKEKUBE1");
                paths.insert(format!("apis/{group}/v1"), json!({"serverRelativeURL": url}));
            }
            ok(json!({ "paths": paths }))
        }
        "/openapi/v3/api/v1" => ok(openapi_group("")),
        other if other.starts_with("/apis/") || other.starts_with("/openapi/v3/apis/") => named(other),
        "/openapi/v3/api" => {
            ok(json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": VERSION}, "paths": {}}))
        }
        "/healthz" | "/livez" | "/readyz" => Ok("ok".into_response()),
        _ => Err(ApiError::new(404, "NotFound", "the server could not find the requested resource")),
    }
}

/// `/apis/GROUP`, `/apis/GROUP/v1` and `/openapi/v3/apis/GROUP/v1` of the named groups.
fn named(path: &str) -> Result<Response, ApiError> {
    for group in resources::GROUPS {
        if path == format!("/apis/{group}") {
            return ok(resources::named_group(group));
        }
        if path == format!("/apis/{group}/v1") {
            return ok(resources::group_resource_list(group));
        }
        if path == format!("/openapi/v3/apis/{group}/v1") {
            return ok(openapi_group(group));
        }
    }
    Err(ApiError::new(404, "NotFound", "the server could not find the requested resource"))
}

/// The OpenAPI v3 document of a group version (`api/v1` for the core group): for each
/// resource, its collection and object paths with their operations, GVK extensions and the
/// `fieldValidation` parameter.
fn openapi_group(group: &str) -> Value {
    let mut paths = serde_json::Map::new();
    for r in resources::ALL.iter().filter(|r| r.group == group) {
        let gvk = json!({"group": group, "version": "v1", "kind": r.kind});
        let param =
            |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}});
        let op = |action: &str, id: &str, with_validation: bool| {
            let mut parameters = vec![param("dryRun"), param("fieldManager")];
            if with_validation {
                parameters.push(param("fieldValidation"));
            }
            json!({
                "operationId": format!("{id}{}", r.kind),
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk,
                "parameters": parameters,
                "responses": {"200": {"description": "OK"}}
            })
        };
        let prefix = r.prefix();
        let (collection, object) = if r.namespaced {
            (
                format!("{prefix}/namespaces/{{namespace}}/{}", r.plural),
                format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", r.plural),
            )
        } else {
            (format!("{prefix}/{}", r.plural), format!("{prefix}/{}/{{name}}", r.plural))
        };
        paths.insert(collection, json!({"get": op("list", "list", false), "post": op("post", "create", true)}));
        paths.insert(
            object,
            json!({
                "get": op("get", "read", false),
                "put": op("put", "replace", true),
                "patch": op("patch", "patch", true),
                "delete": op("delete", "delete", false)
            }),
        );
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": VERSION},
        "paths": paths,
        "components": {"schemas": {}}
    })
}
