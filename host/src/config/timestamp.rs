//! `token_obtained_at` / `token_expires_at`: read as gitlab-runner writes them (TOML datetimes,
//! `0001-01-01T00:00:00Z` for "none") or as RFC 3339 strings, and written as TOML datetimes.
//!
//! Owns the serde of those two keys only; must not know what the times mean.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `#[serde(with = "timestamp")]` for an optional UTC time.
pub(super) fn serialize<S: Serializer>(value: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
    let Some(at) = value else { return s.serialize_none() };
    let text = at.to_rfc3339_opts(SecondsFormat::Secs, true);
    match text.parse::<toml::value::Datetime>() {
        Ok(datetime) => datetime.serialize(s),
        Err(_) => s.serialize_str(&text),
    }
}

/// See [`serialize`]; Go's zero time (year 1) reads as `None`.
pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Toml(toml::value::Datetime),
        Text(String),
    }
    let text = match Option::<Raw>::deserialize(d)? {
        None => return Ok(None),
        Some(Raw::Toml(datetime)) => datetime.to_string(),
        Some(Raw::Text(text)) => text,
    };
    let at = DateTime::parse_from_rfc3339(text.trim())
        .map_err(|e| serde::de::Error::custom(format!("{text:?} is not a date and time with an offset: {e}")))?
        .with_timezone(&Utc);
    Ok(if at.timestamp() <= DateTime::<Utc>::UNIX_EPOCH.timestamp() - 62_000_000_000 { None } else { Some(at) })
}
