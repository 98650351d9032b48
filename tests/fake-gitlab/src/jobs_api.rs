//! The project jobs API (`GET /api/v4/projects/:id/jobs`), as GitLab answers it: a personal,
//! project or group access token in `PRIVATE-TOKEN` (or `Authorization: Bearer`), the
//! project by numeric id or URL-encoded path, `scope[]` filters on status, newest job first,
//! and offset pagination (`page`, `per_page` default 20, at most 100) with GitLab's headers:
//! `X-Page`, `X-Per-Page`, `X-Next-Page` and `X-Prev-Page` (empty when there is none),
//! `X-Total` and `X-Total-Pages` (left out above 10,000 records, as GitLab does for
//! performance) and a `Link` header with `prev`, `next`, `first` and (with a total) `last`.
//! Job records are seeded by tests ([`HistoricJob`]); this module serves them only.
//!
//! Also `GET /api/v4/job`, the job of the `JOB-TOKEN` (or `job_token` parameter): GitLab's
//! `Ci::AuthJobFinder` takes the token of a running or canceling job, or of one waiting for its
//! runner's acknowledgement (two-phase commit), and answers 401 for any other.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use serde_json::{json, Value};

use crate::api::{finish, json_response, message, Incoming};
use crate::Shared;

/// GitLab stops counting (no `X-Total`, `X-Total-Pages`, `last` link) above this many records.
const COUNT_LIMIT: usize = 10_000;

/// A finished (or never started) job of a project's history, as the jobs API lists it.
#[derive(Clone, Debug)]
pub struct HistoricJob {
    /// Job id.
    pub id: i64,
    /// Pipeline id.
    pub pipeline_id: i64,
    /// `success`, `failed`, `canceled`, `skipped`, `pending`, `running`, …
    pub status: String,
    /// When the job was created (queued), RFC 3339.
    pub created_at: String,
    /// When a runner started it; `None` for jobs that never ran.
    pub started_at: Option<String>,
    /// When it finished; `None` while running or never started.
    pub finished_at: Option<String>,
    /// The description of the runner that ran it (`runner.description`); `None`: no runner
    /// took it (`"runner": null`).
    pub runner: Option<String>,
}

/// A project whose job history the API serves.
#[derive(Clone, Debug, Default)]
pub(crate) struct ProjectHistory {
    pub id: i64,
    pub path: String,
    pub jobs: Vec<HistoricJob>,
}

fn seconds_between(a: &str, b: &str) -> Option<f64> {
    let a = chrono::DateTime::parse_from_rfc3339(a).ok()?;
    let b = chrono::DateTime::parse_from_rfc3339(b).ok()?;
    Some((b - a).num_milliseconds() as f64 / 1000.0)
}

fn job_json(project: &ProjectHistory, job: &HistoricJob, base_url: &str) -> Value {
    let duration = match (&job.started_at, &job.finished_at) {
        (Some(s), Some(f)) => seconds_between(s, f).map(Value::from).unwrap_or(Value::Null),
        _ => Value::Null,
    };
    let queued = job.started_at.as_deref().and_then(|s| seconds_between(&job.created_at, s));
    // GitLab's runner object of the jobs API (`/api/v4/projects/:id/jobs`).
    let runner = job.runner.as_ref().map_or(Value::Null, |description| {
        json!({
            "id": 100 + description.bytes().map(i64::from).sum::<i64>(),
            "description": description,
            "ip_address": null,
            "active": true,
            "paused": false,
            "is_shared": false,
            "runner_type": "project_type",
            "name": "gitlab-runner",
            "online": true,
            "status": "online",
        })
    });
    json!({
        "id": job.id,
        "status": job.status,
        "stage": "test",
        "name": format!("job-{}", job.id),
        "ref": "main",
        "tag": false,
        "coverage": null,
        "allow_failure": false,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "erased_at": null,
        "duration": duration,
        "queued_duration": queued,
        "user": null,
        "commit": null,
        "pipeline": {
            "id": job.pipeline_id,
            "project_id": project.id,
            "ref": "main",
            "status": "success",
        },
        "web_url": format!("{base_url}/{}/-/jobs/{}", project.path, job.id),
        "artifacts": [],
        "runner": runner,
        "tag_list": [],
    })
}

fn query_pairs(uri: &Uri) -> Vec<(String, String)> {
    let query = uri.query().unwrap_or("");
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let decode = |s: &str| {
                let mut out = Vec::new();
                let bytes = s.as_bytes();
                let mut i = 0;
                while i < bytes.len() {
                    match bytes[i] {
                        b'%' if i + 2 < bytes.len() => {
                            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                            match u8::from_str_radix(hex, 16) {
                                Ok(b) => out.push(b),
                                Err(_) => out.extend_from_slice(&bytes[i..i + 3]),
                            }
                            i += 3;
                        }
                        b'+' => {
                            out.push(b' ');
                            i += 1;
                        }
                        b => {
                            out.push(b);
                            i += 1;
                        }
                    }
                }
                String::from_utf8_lossy(&out).into_owned()
            };
            (decode(k), decode(v))
        })
        .collect()
}

/// `GET /api/v4/projects/:id/jobs`.
pub(crate) async fn list_jobs(
    State(shared): State<Arc<Shared>>,
    Path(project): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req = Incoming { method, uri, headers, body };
    let answer = answer(&shared, &project, &req);
    finish(&shared, &req, answer)
}

fn answer(shared: &Shared, project: &str, req: &Incoming) -> Response {
    let inner = shared.lock();
    if !req.access_token().is_some_and(|t| inner.api_tokens.contains(t)) {
        return message(401, &[], "401 Unauthorized");
    }
    let Some(history) = inner.projects.iter().find(|p| p.id.to_string() == project || p.path == project) else {
        return message(404, &[], "404 Project Not Found");
    };
    let params = query_pairs(&req.uri);
    let number = |key: &str, default: usize| {
        params.iter().find(|(k, _)| k == key).and_then(|(_, v)| v.parse::<usize>().ok()).unwrap_or(default)
    };
    let page = number("page", 1).max(1);
    let per_page = number("per_page", 20).clamp(1, 100);
    let scopes: Vec<&str> =
        params.iter().filter(|(k, _)| k == "scope[]" || k == "scope").map(|(_, v)| v.as_str()).collect();
    let mut jobs: Vec<&HistoricJob> =
        history.jobs.iter().filter(|j| scopes.is_empty() || scopes.contains(&j.status.as_str())).collect();
    jobs.sort_by_key(|j| std::cmp::Reverse(j.id));
    let total = jobs.len();
    let pages = total.div_ceil(per_page).max(1);
    let slice: Vec<Value> =
        jobs.iter().skip((page - 1) * per_page).take(per_page).map(|j| job_json(history, j, &inner.base_url)).collect();
    let has_next = page * per_page < total;
    let link_to = |p: usize| {
        let mut kept: Vec<String> =
            params.iter().filter(|(k, _)| k != "page").map(|(k, v)| format!("{k}={v}")).collect();
        kept.push(format!("page={p}"));
        kept.sort();
        format!("<{}{}?{}>", inner.base_url, req.uri.path(), kept.join("&"))
    };
    let mut links = Vec::new();
    if page > 1 {
        links.push(format!("{}; rel=\"prev\"", link_to(page - 1)));
    }
    if has_next {
        links.push(format!("{}; rel=\"next\"", link_to(page + 1)));
    }
    links.push(format!("{}; rel=\"first\"", link_to(1)));
    let mut headers = vec![
        ("X-Page", page.to_string()),
        ("X-Per-Page", per_page.to_string()),
        ("X-Next-Page", if has_next { (page + 1).to_string() } else { String::new() }),
        ("X-Prev-Page", if page > 1 { (page - 1).to_string() } else { String::new() }),
    ];
    if total <= COUNT_LIMIT {
        links.push(format!("{}; rel=\"last\"", link_to(pages)));
        headers.push(("X-Total", total.to_string()));
        headers.push(("X-Total-Pages", pages.to_string()));
    }
    headers.push(("Link", links.join(", ")));
    json_response(200, &headers, &Value::Array(slice))
}

/// `GET /api/v4/job`.
pub(crate) async fn current_job(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req = Incoming { method, uri, headers, body };
    let answer = current_job_answer(&shared, &req);
    finish(&shared, &req, answer)
}

fn current_job_answer(shared: &Shared, req: &Incoming) -> Response {
    let params = query_pairs(&req.uri);
    let token = req
        .header("job-token")
        .map(str::to_string)
        .or_else(|| params.iter().find(|(k, _)| k == "job_token").map(|(_, v)| v.clone()));
    let inner = shared.lock();
    let job = inner.jobs.values().find(|j| token.as_deref() == Some(j.token.as_str()));
    let Some(job) = job.filter(|j| j.status.is_processing() || j.awaiting_ack_since.is_some()) else {
        return message(401, &[], "401 Unauthorized");
    };
    let name = job.payload.pointer("/job_info/name").cloned().unwrap_or(Value::Null);
    let stage = job.payload.pointer("/job_info/stage").cloned().unwrap_or(Value::Null);
    let body = json!({
        "id": job.id,
        "status": job.status.as_str(),
        "name": name,
        "stage": stage,
        "web_url": format!("{}/-/jobs/{}", inner.base_url, job.id),
    });
    json_response(200, &[], &body)
}
