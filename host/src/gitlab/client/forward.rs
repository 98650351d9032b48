//! The router's pass-through (`runway router`): one request exactly as a downstream runner made
//! it — method, path and query under `/api/v4/`, the headers that carry meaning (`JOB-TOKEN`,
//! `Content-Type`, `Content-Range`, `Accept`), the body as a stream — sent to GitLab once,
//! redirects not followed, and GitLab's answer handed back as it came (status, headers, body
//! stream). Artifacts of any size pass through without being held whole.
//!
//! No retries here: the downstream runner retries as it would against GitLab, so the request
//! is never sent twice behind its back. Owns the pass-through call only; what a request means
//! to the router (leases, acceptance) is the router's.

use reqwest::header::{HeaderMap, HeaderName, USER_AGENT};
use reqwest::{Body, Method, Response};

use super::{api_base_url, describe_reqwest_error, ApiError, Endpoint, GitLabClient, RequestRecord};

/// Request headers a downstream runner sends that GitLab acts on; everything else (hop-by-hop
/// headers, `Host`, the downstream's own auth to the router) stays behind.
pub const FORWARDED_REQUEST_HEADERS: &[&str] =
    &["job-token", "content-type", "content-range", "accept", "range", "content-length", "x-request-id"];

/// Response headers handed back to the downstream runner.
pub const FORWARDED_RESPONSE_HEADERS: &[&str] = &[
    "content-type",
    "content-length",
    "content-disposition",
    "location",
    "range",
    "job-status",
    "x-gitlab-trace-update-interval",
    "retry-after",
    "ratelimit-resettime",
    "x-request-id",
];

/// One request to pass through.
pub struct Forward<'a> {
    /// Which call it is (for the request hook).
    pub endpoint: Endpoint,
    /// The method as received.
    pub method: Method,
    /// GitLab's URL (the upstream registration's `url`).
    pub url: &'a str,
    /// The path below `/api/v4/` with its query (`jobs/7/trace?debug_trace=false`).
    pub path_and_query: &'a str,
    /// The downstream's request headers (only [`FORWARDED_REQUEST_HEADERS`] are sent).
    pub headers: &'a HeaderMap,
    /// The body, streamed.
    pub body: Body,
}

impl GitLabClient {
    /// Send `request` to GitLab once, without following redirects; the response is GitLab's,
    /// unread. `Err` only when GitLab could not be reached (the caller answers 502).
    pub async fn forward(&self, request: Forward<'_>) -> Result<Response, ApiError> {
        let base = api_base_url(request.url)?;
        let url = Self::endpoint_url(&base, request.path_and_query.trim_start_matches('/'))?;
        let mut builder =
            self.no_redirect.request(request.method.clone(), url.clone()).header(USER_AGENT, &self.user_agent);
        for name in FORWARDED_REQUEST_HEADERS {
            if let Some(value) = request.headers.get(*name) {
                builder = builder.header(HeaderName::from_static(name), value.clone());
            }
        }
        let started = std::time::Instant::now();
        let result = builder.body(request.body).send().await;
        if let Some(hook) = &self.hook {
            hook(&RequestRecord {
                endpoint: request.endpoint,
                method: request.method.as_str(),
                path: url.path(),
                status: result.as_ref().ok().map(|r| r.status().as_u16()),
                duration: started.elapsed(),
                attempt: 1,
            });
        }
        result.map_err(|e| ApiError::Transport { endpoint: request.endpoint, message: describe_reqwest_error(&e) })
    }
}
