//! The runner API's built-in retry policy (protocol §0, GitLab Runner's `retry_requester.go`):
//! which statuses are retried, how many attempts, and how long to wait between them.
//!
//! The HTTP loop itself lives in `gitlab::client`; this module only decides. As in GitLab
//! Runner, only statuses are retried here: transport errors go back to the caller, whose own
//! loop (job request health accounting, trace ticks, final-update retries) decides.

use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::header::HeaderMap;

/// How the client retries a request that got a retryable status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, the first included (GitLab Runner: 5).
    pub max_attempts: u32,
    /// First exponential backoff step (GitLab Runner: 100 ms); doubled per attempt.
    pub backoff_base: Duration,
    /// Largest exponential step, and the cap applied to server-requested waits (60 s).
    pub backoff_max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { max_attempts: 5, backoff_base: Duration::from_millis(100), backoff_max: Duration::from_secs(60) }
    }
}

/// 408, 429, 500, 502, 503, 504 and every status ≥ 512 are retried.
pub fn is_retryable_status(status: u16) -> bool {
    matches!(status, 408 | 429 | 500 | 502 | 503 | 504) || status >= 512
}

impl RetryPolicy {
    /// The wait before attempt `attempt + 1`, after attempt `attempt` (1-based) answered with
    /// `headers`: `RateLimit-ResetTime` (an RFC 1123 date) if present and parseable, else
    /// `Retry-After` (seconds), else exponential backoff with jitter. Server-requested waits are
    /// capped at `backoff_max` so a misconfigured proxy cannot park a job for hours.
    pub fn wait_before_retry(&self, headers: &HeaderMap, attempt: u32, now: DateTime<Utc>) -> Duration {
        if let Some(reset) =
            header_str(headers, "ratelimit-resettime").and_then(|v| DateTime::parse_from_rfc2822(v).ok())
        {
            let wait = (reset.with_timezone(&Utc) - now).to_std().unwrap_or(Duration::ZERO);
            return wait.min(self.backoff_max);
        }
        if let Some(secs) = header_str(headers, "retry-after").and_then(|v| v.trim().parse::<u64>().ok()) {
            return Duration::from_secs(secs).min(self.backoff_max);
        }
        self.backoff(attempt)
    }

    /// Exponential step for `attempt` (1-based: base, 2·base, 4·base, … ≤ max), jittered
    /// uniformly into its upper half so concurrent runners spread out.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt.saturating_sub(1));
        let step = self.backoff_base.saturating_mul(factor).min(self.backoff_max);
        let half = step / 2;
        let jitter_nanos = rand::random_range(0..=half.as_nanos().min(u64::MAX as u128) as u64);
        half + Duration::from_nanos(jitter_nanos)
    }
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).expect("valid header"));
        }
        h
    }

    #[test]
    fn retryable_statuses_match_gitlab_runner() {
        for s in [408, 429, 500, 502, 503, 504, 512, 599] {
            assert!(is_retryable_status(s), "{s}");
        }
        for s in [200, 201, 204, 400, 403, 404, 409, 412, 416, 422, 501, 505, 511] {
            assert!(!is_retryable_status(s), "{s}");
        }
    }

    #[test]
    fn ratelimit_reset_time_wins_over_retry_after() {
        let policy = RetryPolicy::default();
        let now = DateTime::parse_from_rfc2822("Mon, 02 Jan 2006 15:04:05 GMT").expect("date").with_timezone(&Utc);
        let h = headers(&[("RateLimit-ResetTime", "Mon, 02 Jan 2006 15:04:12 GMT"), ("Retry-After", "2")]);
        assert_eq!(policy.wait_before_retry(&h, 1, now), Duration::from_secs(7));
        let h = headers(&[("Retry-After", "2")]);
        assert_eq!(policy.wait_before_retry(&h, 1, now), Duration::from_secs(2));
        let h = headers(&[("Retry-After", "3600")]);
        assert_eq!(policy.wait_before_retry(&h, 1, now), Duration::from_secs(60), "capped");
        let h = headers(&[("RateLimit-ResetTime", "Mon, 02 Jan 2006 15:04:00 GMT")]);
        assert_eq!(policy.wait_before_retry(&h, 1, now), Duration::ZERO, "a past reset time means now");
    }

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        let policy = RetryPolicy::default();
        for attempt in 1..=12 {
            let step = Duration::from_millis(100).saturating_mul(1 << (attempt - 1)).min(Duration::from_secs(60));
            let wait = policy.backoff(attempt);
            assert!(wait >= step / 2 && wait <= step, "attempt {attempt}: {wait:?} not in [{:?}, {step:?}]", step / 2);
        }
        assert!(policy.backoff(40) <= Duration::from_secs(60));
    }
}
