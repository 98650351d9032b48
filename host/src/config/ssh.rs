//! `[runners.ssh]`: where the `ssh` executor runs jobs, in gitlab-runner's keys and defaults
//! (`host` localhost, `port` 22, `user` root, host keys checked against
//! `~/.ssh/known_hosts` unless `disable_strict_host_key_checking`).
//!
//! Owns: [`SshConfig`] and reading it from a runner's sections. Must not touch: connecting
//! (the manager turns it into a connection spec).

use std::path::PathBuf;

use serde::Deserialize;

use crate::config::Invalid;

/// A port written as gitlab-runner writes it (a string) or as a number.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
enum Port {
    Number(u16),
    Text(String),
}

/// `[runners.ssh]` as the host reads it (the plugin reads `login`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct SshConfig {
    /// Host name or address (default `localhost`).
    #[serde(default)]
    host: Option<String>,
    /// Port (default 22).
    #[serde(default)]
    port: Option<Port>,
    /// Login user (default `root`).
    #[serde(default)]
    user: Option<String>,
    /// Password (used when no `identity_file` is set).
    #[serde(default)]
    password: Option<String>,
    /// Private key file.
    #[serde(default)]
    identity_file: Option<PathBuf>,
    /// Accept any host key.
    #[serde(default)]
    disable_strict_host_key_checking: Option<bool>,
    /// The `known_hosts` file (default `~/.ssh/known_hosts`).
    #[serde(default)]
    known_hosts_file: Option<PathBuf>,
}

impl SshConfig {
    /// The section of a runner (`[runners.ssh]`, as the config loader kept it); `Err` names
    /// the key that is wrong.
    pub fn from_section(section: Option<&toml::Value>) -> Result<Self, Invalid> {
        let Some(value) = section else { return Ok(SshConfig::default()) };
        let config: SshConfig =
            value.clone().try_into().map_err(|e: toml::de::Error| Invalid(format!("[runners.ssh]: {e}")))?;
        config.port()?;
        Ok(config)
    }

    /// The host (`localhost` when unset).
    pub fn host(&self) -> &str {
        self.host.as_deref().filter(|h| !h.is_empty()).unwrap_or("localhost")
    }

    /// The port (22 when unset).
    pub fn port(&self) -> Result<u16, Invalid> {
        match &self.port {
            None => Ok(22),
            Some(Port::Number(n)) => Ok(*n),
            Some(Port::Text(t)) if t.trim().is_empty() => Ok(22),
            Some(Port::Text(t)) => {
                t.trim().parse().map_err(|_| Invalid(format!("[runners.ssh] port: {t:?} is not a port number")))
            }
        }
    }

    /// The login user (`root` when unset).
    pub fn user(&self) -> &str {
        self.user.as_deref().filter(|u| !u.is_empty()).unwrap_or("root")
    }

    /// The password (empty when unset).
    pub fn password(&self) -> &str {
        self.password.as_deref().unwrap_or("")
    }

    /// The private key file, when set.
    pub fn identity_file(&self) -> Option<&std::path::Path> {
        self.identity_file.as_deref().filter(|p| !p.as_os_str().is_empty())
    }

    /// The `known_hosts` file host keys are checked against; `None` when strict checking is
    /// disabled. Unset: `$HOME/.ssh/known_hosts`.
    pub fn known_hosts(&self) -> Option<PathBuf> {
        if self.disable_strict_host_key_checking == Some(true) {
            return None;
        }
        match self.known_hosts_file.as_ref().filter(|p| !p.as_os_str().is_empty()) {
            Some(path) => Some(path.clone()),
            None => {
                let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"));
                Some(home.join(".ssh").join("known_hosts"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SshConfig;

    #[test]
    fn gitlab_runner_defaults_and_keys() {
        let none = SshConfig::from_section(None).expect("defaults");
        assert_eq!((none.host(), none.port(), none.user()), ("localhost", Ok(22), "root"));
        assert!(none.known_hosts().is_some_and(|p| p.ends_with(".ssh/known_hosts")));
        let table: toml::Value = toml::from_str(
            "host = \"127.0.0.9\"\nport = \"2222\"\nuser = \"ci\"\nknown_hosts_file = \"/k\"\nidentity_file = \"/id\"",
        )
        .expect("toml");
        let config = SshConfig::from_section(Some(&table)).expect("config");
        assert_eq!((config.host(), config.port(), config.user()), ("127.0.0.9", Ok(2222), "ci"));
        assert_eq!(config.known_hosts(), Some("/k".into()));
        assert_eq!(config.identity_file(), Some(std::path::Path::new("/id")));
        let insecure: toml::Value = toml::from_str("disable_strict_host_key_checking = true\nport = 22").expect("toml");
        assert_eq!(SshConfig::from_section(Some(&insecure)).expect("config").known_hosts(), None);
        let bad: toml::Value = toml::from_str("port = \"ssh\"").expect("toml");
        assert!(SshConfig::from_section(Some(&bad)).expect_err("bad port").0.contains("port"));
    }
}
