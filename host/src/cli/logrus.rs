//! `log_format = "json"` as gitlab-runner writes it: logrus's `JSONFormatter` with
//! `RFC3339Nano` times — one object a line, its keys sorted (Go's maps), `level` in lower case
//! (`warning`, not `warn`), the message under `msg`, the time under `time`, the event's fields
//! beside them (a field named `level`, `msg` or `time` becomes `fields.<name>`, as logrus
//! does). Log shippers parsing a gitlab-runner fleet's logs read Runway's unchanged.
//!
//! Owns the line's shape; must not decide what is logged.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The formatter.
pub(crate) struct LogrusJson;

/// An event's fields as JSON values.
#[derive(Default)]
struct Fields(BTreeMap<String, Value>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), Value::String(value.to_string()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_string(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_string(), Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_string(), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_string(), Value::Bool(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_string(), Value::String(format!("{value:?}")));
    }
}

/// logrus's level names.
fn level(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "error",
        Level::WARN => "warning",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    }
}

/// Go's `time.RFC3339Nano`: nanoseconds with trailing zeros dropped, `Z` for UTC.
fn rfc3339_nano(time: chrono::DateTime<chrono::Utc>) -> String {
    let text = time.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
    match text.strip_suffix('Z').and_then(|t| t.split_once('.')) {
        Some((seconds, fraction)) => {
            let fraction = fraction.trim_end_matches('0');
            if fraction.is_empty() {
                format!("{seconds}Z")
            } else {
                format!("{seconds}.{fraction}Z")
            }
        }
        None => text,
    }
}

/// One logrus line of `fields` at `lvl` and `time`.
fn line(mut fields: BTreeMap<String, Value>, lvl: &Level, time: chrono::DateTime<chrono::Utc>) -> String {
    let message = fields.remove("message").unwrap_or(Value::String(String::new()));
    let mut object: BTreeMap<String, Value> = BTreeMap::new();
    for (key, value) in fields {
        let key = if matches!(key.as_str(), "level" | "msg" | "time") { format!("fields.{key}") } else { key };
        object.insert(key, value);
    }
    object.insert("level".into(), Value::String(level(lvl).into()));
    object.insert("msg".into(), message);
    object.insert("time".into(), Value::String(rfc3339_nano(time)));
    serde_json::to_string(&object).unwrap_or_default()
}

impl<S, N> FormatEvent<S, N> for LogrusJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, _ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let mut fields = Fields::default();
        event.record(&mut fields);
        writeln!(writer, "{}", line(fields.0, event.metadata().level(), chrono::Utc::now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_logrus_json() {
        let time =
            chrono::DateTime::parse_from_rfc3339("2026-11-28T04:20:01.250Z").unwrap().with_timezone(&chrono::Utc);
        let fields = BTreeMap::from([
            ("message".to_string(), Value::from("token rotated")),
            ("runner".to_string(), Value::from("abcdefghi")),
            ("level".to_string(), Value::from(3)),
        ]);
        assert_eq!(
            line(fields, &Level::WARN, time),
            r#"{"fields.level":3,"level":"warning","msg":"token rotated","runner":"abcdefghi","time":"2026-11-28T04:20:01.25Z"}"#
        );
        let whole = chrono::DateTime::parse_from_rfc3339("2026-11-28T04:20:01Z").unwrap().with_timezone(&chrono::Utc);
        assert_eq!(rfc3339_nano(whole), "2026-11-28T04:20:01Z");
    }
}
