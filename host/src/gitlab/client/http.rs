//! Reading GitLab's responses: the headers that steer a job (`Job-Status`, trace update
//! interval, `Range`) and the `message` of an error body.

use std::time::Duration;

use reqwest::header::HeaderMap;
use reqwest::Response;
use serde_json::Value;

use crate::gitlab::api::RemoteJobStatus;

/// A header's value, trimmed; `None` when missing, empty or not text.
pub(super) fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty())
}

/// `Job-Status` → what the job should do.
pub(super) fn remote_status(headers: &HeaderMap) -> RemoteJobStatus {
    match header_str(headers, "job-status") {
        Some("canceling") => RemoteJobStatus::CancelRequested,
        Some("canceled" | "failed") => RemoteJobStatus::Abort,
        _ => RemoteJobStatus::Running,
    }
}

/// `X-GitLab-Trace-Update-Interval` (whole seconds, > 0).
pub(super) fn update_interval(headers: &HeaderMap) -> Option<Duration> {
    header_str(headers, "x-gitlab-trace-update-interval")
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
}

/// The end of a `Range: 0-<size>` header.
pub(super) fn range_end(headers: &HeaderMap) -> Option<u64> {
    header_str(headers, "range")?.rsplit_once('-')?.1.trim().parse().ok()
}

/// The `message` of a GitLab error body, or the body itself, shortened.
pub(super) async fn error_message(response: Response) -> String {
    let text = response.text().await.unwrap_or_default();
    let message = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v.get("message").map(|m| m.as_str().map(str::to_string).unwrap_or_else(|| m.to_string())))
        .unwrap_or(text);
    message.chars().take(500).collect()
}
