//! Git LFS as GitLab serves it: objects stored per project, the batch API
//! (`POST <repo>.git/info/lfs/objects/batch`, `application/vnd.git-lfs+json`) answering
//! downloads with `<repo>.git/gitlab-lfs/objects/<oid>` links that carry the request's
//! `Authorization`, and those downloads. Uploads are refused as GitLab refuses them to a job
//! token (403). Authentication is the git endpoint's (`git::serve` checks it first).

use std::path::{Path, PathBuf};

use axum::body::{Body, Bytes};
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::api::response;

/// GitLab's LFS content type.
const LFS_JSON: &str = "application/vnd.git-lfs+json";

/// Where the LFS object `oid` of the repository at `repo_dir` is stored.
fn object_path(repo_dir: &Path, oid: &str) -> Option<PathBuf> {
    let valid = oid.len() == 64 && oid.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
    valid.then(|| repo_dir.join("lfs-objects").join(&oid[..2]).join(&oid[2..4]).join(oid))
}

/// Stores `content` as an LFS object of the repository at `repo_dir`; returns the pointer
/// file git-lfs would commit for it.
pub(crate) fn store(repo_dir: &Path, content: &[u8]) -> Result<String, String> {
    let oid = hex(&Sha256::digest(content));
    let path = object_path(repo_dir, &oid).ok_or("bad oid")?;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    std::fs::write(&path, content).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(format!("version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {}\n", content.len()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn lfs_json(status: u16, body: serde_json::Value) -> Response {
    response(status, &[("Content-Type", LFS_JSON.to_string())], body.to_string())
}

#[derive(Deserialize)]
struct BatchRequest {
    operation: String,
    #[serde(default)]
    objects: Vec<BatchObject>,
}

#[derive(Deserialize)]
struct BatchObject {
    oid: String,
    size: u64,
}

/// `POST <repo>.git/info/lfs/objects/batch`.
pub(crate) fn batch(repo_dir: &Path, repo_url: &str, headers: &HeaderMap, body: &Bytes) -> Response {
    let request: BatchRequest = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return lfs_json(422, json!({ "message": format!("Unprocessable entity: {e}") })),
    };
    match request.operation.as_str() {
        "download" => {}
        "upload" => return lfs_json(403, json!({ "message": "Access forbidden. Check your access level." })),
        other => return lfs_json(422, json!({ "message": format!("Unknown operation {other:?}") })),
    }
    let authorization = headers.get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string);
    let objects: Vec<serde_json::Value> = request
        .objects
        .iter()
        .map(|object| {
            let stored = object_path(repo_dir, &object.oid)
                .and_then(|p| std::fs::metadata(p).ok())
                .is_some_and(|m| m.len() == object.size);
            if !stored {
                return json!({
                    "oid": object.oid,
                    "size": object.size,
                    "error": {
                        "code": 404,
                        "message": "Object does not exist on the server or you don't have permissions to access it",
                    },
                });
            }
            let mut header = serde_json::Map::new();
            if let Some(auth) = &authorization {
                header.insert("Authorization".into(), json!(auth));
            }
            json!({
                "oid": object.oid,
                "size": object.size,
                "authenticated": true,
                "actions": {
                    "download": {
                        "href": format!("{repo_url}/gitlab-lfs/objects/{}", object.oid),
                        "header": header,
                    },
                },
            })
        })
        .collect();
    lfs_json(200, json!({ "objects": objects }))
}

/// `GET <repo>.git/gitlab-lfs/objects/<oid>[/<size>]`.
pub(crate) fn download(repo_dir: &Path, rest: &str) -> Response {
    let oid = rest.split('/').next().unwrap_or("");
    match object_path(repo_dir, oid).and_then(|p| std::fs::read(p).ok()) {
        Some(content) => {
            response(200, &[("Content-Type", "application/octet-stream".to_string())], Body::from(content))
        }
        None => response(404, &[], "404 Not Found"),
    }
}
