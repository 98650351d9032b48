//! Durations in config.toml, in one place: Go-style strings (`"30s"`, `"1m30s"`, `"500ms"`)
//! or bare integers (seconds), the serde adapter that reads either, and Go's
//! `Duration.String()` for writing them back and for log lines gitlab-runner prints.
//!
//! Owns the parsing only; which key takes which unit is the caller's business.

use std::time::Duration;

/// A duration string that does not parse; the message names the text and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DurationError(pub String);

/// Parse Go-style duration strings: `"30s"`, `"1m30s"`, `"2h"`, `"500ms"`; a bare integer is seconds.
///
/// Never panics: a value too large for a [`Duration`] (`"99999999999999999999h"`) is an error.
/// Which durations make sense for a key is checked by the caller (config's range checks).
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return Err(DurationError("empty duration".to_string()));
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if digits == 0 {
            return Err(DurationError(format!("invalid duration {text:?}: expected a number")));
        }
        let value: f64 = rest[..digits].parse().map_err(|_| DurationError(format!("invalid duration {text:?}")))?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => value / 1e9,
            "us" | "µs" => value / 1e6,
            "ms" => value / 1e3,
            "s" => value,
            "m" => value * 60.0,
            "h" => value * 3600.0,
            unit => {
                return Err(DurationError(format!(
                    "invalid duration {text:?}: unknown unit {unit:?} (use ms, s, m, h)"
                )))
            }
        };
        let part = Duration::try_from_secs_f64(seconds)
            .map_err(|_| DurationError(format!("invalid duration {text:?}: too large")))?;
        total =
            total.checked_add(part).ok_or_else(|| DurationError(format!("invalid duration {text:?}: too large")))?;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

/// Serde adapter for durations written as strings (`"30s"`) or integers (seconds).
pub mod duration_str {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    /// Serialize as whole seconds (`"30s"`).
    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{}s", d.as_secs()))
    }

    /// Deserialize a duration.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Secs(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Secs(s) => Ok(Duration::from_secs(s)),
            Raw::Text(t) => super::parse_duration(&t).map_err(serde::de::Error::custom),
        }
    }
}

/// Serde adapter for durations GitLab writes as integer seconds (the `[runners.machine]`
/// `IdleTime` keys): reads what [`duration_str`] reads, writes whole seconds as an integer.
pub mod duration_secs {
    use std::time::Duration;

    use serde::Deserializer;

    /// Serialize as whole seconds (`1800`).
    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }

    /// Deserialize a duration (integer seconds or a duration string).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        super::duration_str::deserialize(d)
    }
}

/// Go's `time.Duration.String()` for a non-negative duration.
pub fn go_string(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    let trim = |whole: u128, frac: u128, digits: usize| {
        let frac = format!("{frac:0digits$}");
        let frac = frac.trim_end_matches('0');
        if frac.is_empty() {
            whole.to_string()
        } else {
            format!("{whole}.{frac}")
        }
    };
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", trim(nanos / 1_000, nanos % 1_000, 3));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", trim(nanos / 1_000_000, nanos % 1_000_000, 6));
    }
    let secs = nanos / 1_000_000_000;
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let s = format!("{}s", trim(s, nanos % 1_000_000_000, 9));
    match (h, m) {
        (0, 0) => s,
        (0, m) => format!("{m}m{s}"),
        (h, m) => format!("{h}h{m}m{s}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("15"), Ok(Duration::from_secs(15)));
        assert!(parse_duration("3 days").is_err());
    }

    #[test]
    fn overflowing_durations_are_errors_not_panics() {
        for text in [
            "99999999999999999999h",
            "1e400s",
            "18446744073709551615s18446744073709551615s",
            "9999999999999999999999999999999999ns",
            "....s",
            "5.5.5s",
        ] {
            let e = parse_duration(text).expect_err(text);
            assert!(e.0.contains(&format!("{text:?}")), "{e}");
        }
        assert!(parse_duration("99999999999999999999h").expect_err("huge").0.contains("too large"));
    }
}
