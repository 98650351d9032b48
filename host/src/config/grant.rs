//! What a plugin may do: the `[plugins.NAME]` section of config.toml.
//!
//! Nothing is ambient. A plugin without a section gets the defaults below: no process,
//! no Docker engine, no Kubernetes cluster, no HTTP, no environment, no filesystem, 64 MiB of memory and 30 s of wasm time per call,
//! 1024 kv keys holding at most 4 MiB, and 20 log lines per second (bursts of 100).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::duration::duration_str;
use super::hosts::{AllowedHosts, HostGrantError};

/// `[plugins.NAME]`.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
pub struct PluginGrant {
    /// Plugin file, relative to `plugins_dir`; default `<name>.wasm`.
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// Hosts the plugin may reach over wasi:http (`host` or `host:port`, `*.example.com`,
    /// `[::1]:8080`), each checked when the config is loaded ([`AllowedHosts`]).
    #[serde(default, deserialize_with = "host_entries")]
    pub allow_hosts: Vec<String>,
    /// Environment variables copied from the runner's environment into the plugin's.
    #[serde(default)]
    pub env: Vec<String>,
    /// May the plugin start local processes (the `process` capability)?
    #[serde(default)]
    pub allow_process: bool,
    /// Docker engines the plugin may reach (the `docker` capability): `unix:///path`,
    /// `tcp://host:port`, `instance` (the engine on a job's fleet instance) or `*`.
    #[serde(default, deserialize_with = "docker_endpoints")]
    pub allow_docker: Vec<String>,
    /// May the plugin reach Kubernetes API servers (the `kube` capability), with the
    /// credentials `[runners.kubernetes]`, the in-cluster service account or the kubeconfig
    /// give? The host holds them; the plugin never sees them.
    #[serde(default)]
    pub allow_kubernetes: bool,
    /// Host directories preopened for the plugin, as `host_path` or `host_path:guest_path`,
    /// read-write unless followed by `:ro` (e.g. `/etc/runway/aws:/aws:ro`).
    #[serde(default)]
    pub dirs: Vec<String>,
    /// Linear memory limit in MiB.
    #[serde(default = "default_memory_mb")]
    pub memory_mb: u64,
    /// Wasm execution time allowed per call (time spent waiting in host capabilities such as
    /// a running job script does not count), e.g. `"30s"`, `"2m"`.
    #[serde(
        default = "default_call_timeout",
        deserialize_with = "duration_str::deserialize",
        serialize_with = "duration_str::serialize"
    )]
    pub call_timeout: Duration,
    /// Most bytes one call may make the host buffer (trace chunks, captured output, kv
    /// values, HTTP bodies), in MiB.
    #[serde(default = "default_max_buffer_mb")]
    pub max_buffer_mb: u64,
    /// Most keys the plugin may keep in `kv` (1 to 1,000,000).
    #[serde(default = "default_kv_max_keys", deserialize_with = "in_range::<_, 1, 1_000_000>")]
    pub kv_max_keys: u64,
    /// Most bytes (keys plus values) the plugin may keep in `kv`, in MiB (1 to 4096).
    #[serde(default = "default_kv_max_mb", deserialize_with = "in_range::<_, 1, 4096>")]
    pub kv_max_mb: u64,
    /// Plugin log lines per second passed to the runner's log; a burst of five seconds'
    /// worth is allowed, a line costs one per started KiB, the rest is dropped and counted
    /// (0 to 10,000; 0 drops every line).
    #[serde(default = "default_log_lines_per_second", deserialize_with = "in_range::<_, 0, 10_000>")]
    pub log_lines_per_second: u64,
}

/// Deserialize an integer and refuse it outside `MIN..=MAX` (the error names the range;
/// the config loader adds file, line and key).
fn in_range<'de, D: serde::Deserializer<'de>, const MIN: u64, const MAX: u64>(d: D) -> Result<u64, D::Error> {
    let value = u64::deserialize(d)?;
    if (MIN..=MAX).contains(&value) {
        Ok(value)
    } else {
        Err(serde::de::Error::custom(format!("{value} is out of range: must be from {MIN} to {MAX}")))
    }
}

/// Deserialize `allow_hosts`, refusing entries that are not of the documented form (the
/// error names the entry; the config loader adds file, line and key).
fn host_entries<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let entries = Vec::<String>::deserialize(d)?;
    AllowedHosts::parse(&entries).map_err(serde::de::Error::custom)?;
    Ok(entries)
}

impl PluginGrant {
    /// `allow_hosts` parsed: what the `wasi:http` hooks match requests against.
    pub fn allowed_hosts(&self) -> Result<AllowedHosts, HostGrantError> {
        AllowedHosts::parse(&self.allow_hosts)
    }
}

/// Deserialize `allow_docker`, refusing entries that name no engine.
fn docker_endpoints<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let entries = Vec::<String>::deserialize(d)?;
    for entry in &entries {
        let ok = matches!(entry.as_str(), "*" | "instance")
            || ["unix:///", "/", "tcp://", "http://", "https://"]
                .iter()
                .any(|p| entry.starts_with(p) && entry.len() > p.len());
        if !ok {
            return Err(serde::de::Error::custom(format!(
                "{entry:?} is not a Docker endpoint: use unix:///path, tcp://host:port, \"instance\" or \"*\""
            )));
        }
    }
    Ok(entries)
}

/// How a `dirs` entry is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirPerms {
    /// `:ro`: the plugin may read, never write.
    pub read_only: bool,
}

/// Split a `dirs` entry into host path, guest path and permissions:
/// `host[:guest][:ro|:rw]` (the guest path defaults to the host path).
pub fn split_dir(entry: &str) -> (&str, &str, DirPerms) {
    let (rest, read_only) = match entry.rsplit_once(':') {
        Some((rest, "ro")) => (rest, true),
        Some((rest, "rw")) => (rest, false),
        _ => (entry, false),
    };
    let (host, guest) = rest.split_once(':').unwrap_or((rest, rest));
    (host, guest, DirPerms { read_only })
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
/// 1024 keys: what the kv interface always allowed; the first-party plugins use a handful.
fn default_kv_max_keys() -> u64 {
    1024
}
/// 4 MiB: room for a few of the largest values the WIT contract allows (1 MiB) and for far
/// more state than the first-party plugins keep (a few KiB), while a plugin with no grant can
/// no longer fill the disk (1 GiB in 3.5 s before this limit).
fn default_kv_max_mb() -> u64 {
    4
}
/// 20 lines per second (bursts of 100): more than a well-behaved plugin logs, and at most
/// ~20 KiB/s into the runner's log from one that floods.
fn default_log_lines_per_second() -> u64 {
    20
}

impl Default for PluginGrant {
    fn default() -> Self {
        PluginGrant {
            file: None,
            allow_hosts: Vec::new(),
            env: Vec::new(),
            allow_process: false,
            allow_docker: Vec::new(),
            allow_kubernetes: false,
            dirs: Vec::new(),
            memory_mb: default_memory_mb(),
            call_timeout: default_call_timeout(),
            max_buffer_mb: default_max_buffer_mb(),
            kv_max_keys: default_kv_max_keys(),
            kv_max_mb: default_kv_max_mb(),
            log_lines_per_second: default_log_lines_per_second(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_deny_everything() {
        let grant: PluginGrant = toml::from_str("").expect("empty grant");
        assert!(!grant.allow_process && grant.allow_hosts.is_empty() && grant.env.is_empty());
        assert_eq!(grant.memory_mb, 64);
        assert_eq!((grant.kv_max_keys, grant.kv_max_mb, grant.log_lines_per_second), (1024, 4, 20));
        assert_eq!(grant, PluginGrant::default());
    }

    #[test]
    fn dirs_split_into_host_guest_and_permissions() {
        assert_eq!(split_dir("/a"), ("/a", "/a", DirPerms { read_only: false }));
        assert_eq!(split_dir("/a:/b"), ("/a", "/b", DirPerms { read_only: false }));
        assert_eq!(split_dir("/a:/b:ro"), ("/a", "/b", DirPerms { read_only: true }));
        assert_eq!(split_dir("/a:ro"), ("/a", "/a", DirPerms { read_only: true }));
        assert_eq!(split_dir("/a:/b:rw"), ("/a", "/b", DirPerms { read_only: false }));
    }

    #[test]
    fn docker_endpoints_are_checked() {
        let grant: PluginGrant =
            toml::from_str(r#"allow_docker = ["unix:///run/d.sock", "tcp://h:2376", "instance", "*"]"#).expect("ok");
        assert_eq!(grant.allow_docker.len(), 4);
        let err = toml::from_str::<PluginGrant>(r#"allow_docker = ["docker.sock"]"#).expect_err("bad").to_string();
        assert!(err.contains("docker.sock") && err.contains("not a Docker endpoint"), "{err}");
    }

    #[test]
    fn host_entries_are_checked_at_load() {
        let grant: PluginGrant =
            toml::from_str(r#"allow_hosts = ["api.example.com", "*.amazonaws.com", "127.0.0.1:8080", "[::1]:9000"]"#)
                .expect("ok");
        assert_eq!(grant.allowed_hosts().expect("parsed").patterns().len(), 4);
        let err = toml::from_str::<PluginGrant>(r#"allow_hosts = ["https://api.example.com"]"#)
            .expect_err("scheme")
            .to_string();
        assert!(err.contains("https://api.example.com") && err.contains("scheme"), "{err}");
    }

    #[test]
    fn quotas_are_range_checked() {
        let grant: PluginGrant =
            toml::from_str("kv_max_keys = 10\nkv_max_mb = 1\nlog_lines_per_second = 0").expect("ok");
        assert_eq!((grant.kv_max_keys, grant.kv_max_mb, grant.log_lines_per_second), (10, 1, 0));
        for bad in ["kv_max_keys = 0", "kv_max_mb = 0", "kv_max_mb = 99999999999", "log_lines_per_second = 10001"] {
            let err = toml::from_str::<PluginGrant>(bad).expect_err(bad).to_string();
            assert!(err.contains("out of range"), "{bad}: {err}");
        }
    }
}
