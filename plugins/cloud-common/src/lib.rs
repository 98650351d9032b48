//! What the cloud fleeting plugins (`fleeting-aws`, `fleeting-gcp`, `fleeting-azure`) share:
//! blocking HTTP through `wasi:http` (the host lets through only the hosts the plugin's grant
//! names in `allow_hosts`), retries with exponential back-off for throttling and transient
//! failures, one authorized call to a JSON REST API and why it failed (`call`: the Azure and
//! Google plugins'), the wall clock and sleeping, and what a plugin remembers about its group
//! between calls (`group_state`), and the `docker+machine` modes' machine
//! template and flag reading (`machine`).
//!
//! Owns: the transport, the retry policy and the remembered group state. Must not touch: any cloud's API shapes or
//! credentials (each plugin's own).

pub mod call;
pub mod group_state;
pub mod http;
pub mod machine;
pub mod retry;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Block the plugin for `duration` (a WASI poll on the monotonic clock).
pub fn sleep(duration: Duration) {
    let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
    wasip2::clocks::monotonic_clock::subscribe_duration(nanos).block();
}

/// `%`-encode `value` as RFC 3986 unreserved characters (`A-Z a-z 0-9 - _ . ~`) plus
/// everything else escaped: what form bodies, query strings and SigV4 expect.
pub fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `application/x-www-form-urlencoded` body (or query string) of `pairs`, in their order.
pub fn form_encode<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", percent_encode(k.as_ref()), percent_encode(v.as_ref())))
        .collect::<Vec<_>>()
        .join("&")
}

/// Unix seconds of an RFC 3339 UTC or offset time (`2025-01-31T12:00:00Z`,
/// `2025-01-31T12:00:00.123+02:00`); `None` when it does not parse.
pub fn parse_rfc3339(text: &str) -> Option<u64> {
    let text = text.trim();
    let (date, time) = text.split_once(['T', 't', ' '])?;
    let mut d = date.split('-');
    let (y, m, day): (i64, i64, i64) = (d.next()?.parse().ok()?, d.next()?.parse().ok()?, d.next()?.parse().ok()?);
    let (clock, offset) = if let Some(c) = time.strip_suffix(['Z', 'z']) {
        (c, 0)
    } else {
        let i = time.rfind(['+', '-'])?;
        let (c, o) = time.split_at(i);
        let sign = if o.starts_with('-') { -1 } else { 1 };
        let (oh, om) = o[1..].split_once(':')?;
        (c, sign * (oh.parse::<i64>().ok()? * 3600 + om.parse::<i64>().ok()? * 60))
    };
    let clock = clock.split('.').next()?;
    let mut t = clock.split(':');
    let (h, min, s): (i64, i64, i64) = (t.next()?.parse().ok()?, t.next()?.parse().ok()?, t.next()?.parse().ok()?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || h > 23 || min > 59 || s > 60 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + h * 3600 + min * 60 + s - offset).ok()
}
