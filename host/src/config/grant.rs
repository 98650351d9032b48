//! What a plugin may do: the `[plugins.NAME]` section of config.toml.
//!
//! Nothing is ambient. A plugin without a section gets the defaults below: no process,
//! no HTTP, no environment, no filesystem, 64 MiB of memory and 30 s of wasm time per call.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::duration::duration_str;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_deny_everything() {
        let grant: PluginGrant = toml::from_str("").expect("empty grant");
        assert!(!grant.allow_process && grant.allow_hosts.is_empty() && grant.env.is_empty());
        assert_eq!(grant.memory_mb, 64);
    }
}
