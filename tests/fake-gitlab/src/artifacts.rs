//! GitLab's artifacts endpoints as a runner meets them (protocol §1.11–§1.12):
//!
//! - `POST /api/v4/jobs/:id/artifacts`: the job's token in `JOB-TOKEN`, the job running,
//!   the archive as the multipart `file` part, `artifact_type` (default `archive`),
//!   `artifact_format` (default `zip`) and `expire_in` in the query; the format must be one
//!   GitLab allows for the type (archive: zip; reports: their own); one archive per job
//!   (400 for a second); larger than the configured maximum: 413. Answer: 201 `"201"`.
//! - `GET /api/v4/jobs/:id/artifacts[?direct_download=true]`: the `JOB-TOKEN` of the job
//!   itself or of a running job that depends on it (what Rails hands out as
//!   `dependencies[].token`); 401 for an unknown token, 403 for a job that does not depend
//!   on it, 404 without an archive. With object storage on and `direct_download=true`: a
//!   302 to a pre-signed URL of the fake's object store (`/objectstore/...?signature=`),
//!   which refuses a bad signature and records whether a job token reached it.
//!
//! What a test asserts on: [`crate::FakeGitLab::artifacts`], the request log.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;

use crate::api::{finish, response, Incoming};
use crate::{Endpoint, JobStatus, Shared};

/// One uploaded artifact, as the fake stored it.
#[derive(Debug, Clone)]
pub struct StoredArtifact {
    /// `artifact_type` (archive, junit, ...).
    pub artifact_type: String,
    /// `artifact_format` (zip, gzip, raw).
    pub format: String,
    /// The multipart file name.
    pub filename: String,
    /// `expire_in` as sent.
    pub expire_in: Option<String>,
    /// The bytes.
    pub data: Vec<u8>,
    /// The random part of its pre-signed object-store URL.
    pub(crate) signature: String,
}

/// Formats Rails accepts per type (`Ci::JobArtifact::TYPE_AND_FORMAT_PAIRS`), for the
/// types tests use; any other type accepts gzip and raw.
fn format_allowed(artifact_type: &str, format: &str) -> bool {
    match artifact_type {
        "archive" => format == "zip",
        "metadata" | "junit" | "metrics" | "dotenv" | "cobertura" | "cyclonedx" | "annotations" | "jacoco" => {
            format == "gzip"
        }
        "lsif" => format == "zip",
        _ => format == "raw" || format == "gzip",
    }
}

fn query_value(uri: &Uri, key: &str) -> Option<String> {
    uri.query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| {
            let bytes = v.replace('+', " ");
            percent_decode(&bytes)
        })
    })
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&text[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn message(status: u16, text: &str) -> Response {
    response(
        status,
        &[("Content-Type", "application/json".to_string())],
        serde_json::json!({ "message": text }).to_string(),
    )
}

/// The `file` part of a multipart body: its file name and bytes.
async fn file_part(headers: &HeaderMap, body: Bytes) -> Result<Option<(String, Vec<u8>)>, String> {
    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let boundary = multer::parse_boundary(content_type).map_err(|e| e.to_string())?;
    let stream = futures::stream::once(async move { Ok::<Bytes, std::io::Error>(body) });
    let mut multipart = multer::Multipart::new(stream, boundary);
    while let Some(field) = multipart.next_field().await.map_err(|e| e.to_string())? {
        if field.name() == Some("file") {
            let name = field.file_name().unwrap_or_default().to_string();
            let data = field.bytes().await.map_err(|e| e.to_string())?;
            return Ok(Some((name, data.to_vec())));
        }
    }
    Ok(None)
}

pub(crate) async fn upload(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let part = file_part(&headers, body.clone()).await;
    // The log keeps the request, not the archive.
    let req = Incoming { method, uri, headers, body: Bytes::new() };
    let resp = upload_inner(&shared, &req, &id, part);
    finish(&shared, &req, resp)
}

fn upload_inner(
    shared: &Shared,
    req: &Incoming,
    id: &str,
    part: Result<Option<(String, Vec<u8>)>, String>,
) -> Response {
    if let Some(r) = crate::api::take_injected(shared, Endpoint::UploadArtifacts) {
        return r;
    }
    let Ok(id) = id.parse::<i64>() else { return message(404, "404 Not Found") };
    let token = req.headers.get("job-token").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let artifact_type = query_value(&req.uri, "artifact_type").unwrap_or_else(|| "archive".into());
    let format = query_value(&req.uri, "artifact_format").unwrap_or_else(|| "zip".into());
    let expire_in = query_value(&req.uri, "expire_in");
    shared.mutate(|s| {
        let max = s.max_artifacts_size;
        let Some(job) = s.jobs.get_mut(&id) else { return message(404, "404 Not Found") };
        if token != job.token || !job.status.is_processing() {
            return message(403, "403 Forbidden");
        }
        let (filename, data) = match part {
            Ok(Some(p)) => p,
            Ok(None) => return message(400, "400 Bad request - file is missing"),
            Err(e) => return message(400, &format!("400 Bad request - {e}")),
        };
        if max > 0 && data.len() as u64 > max {
            return message(413, "413 Request Entity Too Large");
        }
        if !format_allowed(&artifact_type, &format) {
            return message(400, &format!("400 Bad request - format {format} is not allowed for {artifact_type}"));
        }
        if job.artifacts.iter().any(|a| a.artifact_type == artifact_type) {
            return message(
                400,
                &format!("400 Bad request - another artifact of the type `{artifact_type}` already exists"),
            );
        }
        job.artifacts.push(StoredArtifact {
            artifact_type,
            format,
            filename,
            expire_in,
            data,
            signature: crate::random_hex(),
        });
        response(201, &[("Content-Type", "application/json".to_string())], "201")
    })
}

pub(crate) async fn download(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req = Incoming { method, uri, headers, body };
    let resp = download_inner(&shared, &req, &id);
    finish(&shared, &req, resp)
}

fn download_inner(shared: &Shared, req: &Incoming, id: &str) -> Response {
    if let Some(r) = crate::api::take_injected(shared, Endpoint::DownloadArtifacts) {
        return r;
    }
    let Ok(id) = id.parse::<i64>() else { return message(404, "404 Not Found") };
    let token = req.headers.get("job-token").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let direct = query_value(&req.uri, "direct_download").as_deref() == Some("true");
    shared.mutate(|s| {
        let Some(reader) = s.jobs.values().find(|j| j.token == token) else {
            return message(401, "401 Unauthorized");
        };
        let depends = reader
            .payload
            .get("dependencies")
            .and_then(|d| d.as_array())
            .is_some_and(|deps| deps.iter().any(|d| d.get("id").and_then(|i| i.as_i64()) == Some(id)));
        let allowed = reader.id == id || (depends && reader.status == JobStatus::Running);
        if !allowed {
            return message(403, "403 Forbidden");
        }
        let Some(job) = s.jobs.get(&id) else { return message(404, "404 Not Found") };
        let Some(archive) = job.artifacts.iter().find(|a| a.artifact_type == "archive") else {
            return message(404, "404 Not Found");
        };
        if direct && s.object_storage {
            let location = format!(
                "{}/objectstore/artifacts/{id}/{}?signature={}",
                s.base_url, archive.filename, archive.signature
            );
            return response(302, &[("Location", location)], "");
        }
        response(
            200,
            &[
                ("Content-Type", "application/octet-stream".to_string()),
                ("Content-Disposition", format!("attachment; filename=\"{}\"", archive.filename)),
            ],
            archive.data.clone(),
        )
    })
}

pub(crate) async fn object_store(
    State(shared): State<Arc<Shared>>,
    Path((id, _name)): Path<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req = Incoming { method, uri, headers, body };
    let signature = query_value(&req.uri, "signature").unwrap_or_default();
    let resp = shared.mutate(|s| {
        let archive = id
            .parse::<i64>()
            .ok()
            .and_then(|id| s.jobs.get(&id))
            .and_then(|j| j.artifacts.iter().find(|a| a.artifact_type == "archive" && a.signature == signature));
        match archive {
            Some(a) => response(200, &[("Content-Type", "application/zip".to_string())], a.data.clone()),
            None => response(
                403,
                &[("Content-Type", "application/xml".to_string())],
                "<Error><Code>SignatureDoesNotMatch</Code></Error>",
            ),
        }
    });
    finish(&shared, &req, resp)
}
