//! What a plugin may do: the `[plugins.NAME]` section of config.toml.
//!
//! Nothing is ambient. A plugin without a section gets the defaults below: no process,
//! no HTTP, no environment, no filesystem, 64 MiB of memory and 30 s of wasm time per call.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// `[plugins.NAME]`.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
pub struct PluginGrant {
    /// Plugin file, relative to `plugins_dir`; default `<name>.wasm`.
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// Hosts the plugin may reach over wasi:http (`host` or `host:port`, `*.example.com`).
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    /// Environment variables copied from the runner's environment into the plugin's.
    #[serde(default)]
    pub env: Vec<String>,
    /// May the plugin start local processes (the `process` capability)?
    #[serde(default)]
    pub allow_process: bool,
    /// Host directories preopened for the plugin (read-write), as `host_path` or
    /// `host_path:guest_path`.
    #[serde(default)]
    pub dirs: Vec<String>,
    /// Linear memory limit in MiB.
    #[serde(default = "default_memory_mb")]
    pub memory_mb: u64,
    /// Wasm execution time allowed per call (time spent waiting in host capabilities such as
    /// a running job script does not count), e.g. `"30s"`, `"2m"`.
    #[serde(default = "default_call_timeout", deserialize_with = "duration_str::deserialize", serialize_with = "duration_str::serialize")]
    pub call_timeout: Duration,
    /// Most bytes one call may make the host buffer (trace chunks, captured output, kv
    /// values, HTTP bodies), in MiB.
    #[serde(default = "default_max_buffer_mb")]
    pub max_buffer_mb: u64,
}

fn default_memory_mb() -> u64 {
    64
}
fn default_call_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_max_buffer_mb() -> u64 {
    16
}

impl Default for PluginGrant {
    fn default() -> Self {
        PluginGrant {
            file: None,
            allow_hosts: Vec::new(),
            env: Vec::new(),
            allow_process: false,
            dirs: Vec::new(),
            memory_mb: default_memory_mb(),
            call_timeout: default_call_timeout(),
            max_buffer_mb: default_max_buffer_mb(),
        }
    }
}

/// Parse Go-style duration strings: `"30s"`, `"1m30s"`, `"2h"`, `"500ms"`; a bare integer is seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return Err("empty duration".into());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("invalid duration {text:?}: expected a number"));
        }
        let value: f64 = rest[..digits].parse().map_err(|_| format!("invalid duration {text:?}"))?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => value / 1e9,
            "us" | "µs" => value / 1e6,
            "ms" => value / 1e3,
            "s" => value,
            "m" => value * 60.0,
            "h" => value * 3600.0,
            unit => return Err(format!("invalid duration {text:?}: unknown unit {unit:?} (use ms, s, m, h)")),
        };
        total += Duration::from_secs_f64(seconds);
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
    fn defaults_deny_everything() {
        let grant: PluginGrant = toml::from_str("").expect("empty grant");
        assert!(!grant.allow_process && grant.allow_hosts.is_empty() && grant.env.is_empty());
        assert_eq!(grant.memory_mb, 64);
    }
}
