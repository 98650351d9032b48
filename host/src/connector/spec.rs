//! How to reach a fleet instance: the provider's connect info for one instance, with its
//! blanks filled from `[runners.autoscaler.connector_config]`, becomes a [`ConnectSpec`].
//!
//! Owns address parsing and the precedence between provider and config values. It speaks
//! its own input types ([`InstanceConnectInfo`], [`ConnectorDefaults`]): the fleeting plugin's
//! WIT records and the config file are converted into them by the manager, never read here.

use std::time::Duration;

use super::ssh::{ConnectSpec, SshAuth};

/// Connection settings from `[runners.autoscaler.connector_config]`, filling what the
/// provider's connect info leaves blank.
#[derive(Clone, Debug)]
pub struct ConnectorDefaults {
    /// Login user (`username`).
    pub username: String,
    /// Password (`password`), when set.
    pub password: Option<String>,
    /// Private key (the contents of `key_path`), when set.
    pub key: Option<Vec<u8>>,
    /// Port (`protocol_port`; 22 when unset).
    pub port: u16,
    /// Keepalive interval (`keepalive`); `None` disables keepalives.
    pub keepalive: Option<Duration>,
    /// Bound on connecting and on probes (`timeout`).
    pub timeout: Duration,
    /// Prefer the instance's external address (`use_external_addr`).
    pub use_external_addr: bool,
}

/// What the provider reports about reaching one instance. Empty and zero values mean "use
/// the configured default". Serialized, it is how a job resumed by another manager reaches
/// the instance again (kept sealed in the job store: it may hold a key or password).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InstanceConnectInfo {
    /// Instance id (for error messages).
    pub id: String,
    /// Public address (`host`, `host:port` or `[v6]:port`).
    pub external_addr: Option<String>,
    /// Private address.
    pub internal_addr: Option<String>,
    /// Port; 0 = the configured one.
    pub port: u16,
    /// Login user; empty = the configured one.
    pub username: String,
    /// Password for this instance.
    pub password: Option<String>,
    /// Private key for this instance.
    pub key: Option<Vec<u8>>,
    /// Keepalive interval in seconds; 0 = the configured one.
    pub keepalive_seconds: u32,
    /// Connect timeout in seconds; 0 = the configured one.
    pub timeout_seconds: u32,
}

/// Why no [`ConnectSpec`] could be made for an instance.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// Neither address is set.
    #[error("the provider gave no address for instance {instance}")]
    NoAddress {
        /// The instance id.
        instance: String,
    },
    /// An address that does not parse (an unclosed `[`).
    #[error("bad address {0:?}")]
    BadAddress(String),
    /// A port that is not a number.
    #[error("bad port in {0:?}")]
    BadPort(String),
    /// No login user anywhere.
    #[error("no SSH user: set [runners.autoscaler.connector_config] username")]
    NoUser,
    /// Neither key nor password anywhere.
    #[error("no SSH credentials: set connector_config key_path or password")]
    NoCredentials,
}

impl ConnectorDefaults {
    /// How to reach an instance: the provider's answer, blanks filled from config.toml.
    pub fn spec(&self, info: &InstanceConnectInfo) -> Result<ConnectSpec, SpecError> {
        let (first, second) = if self.use_external_addr {
            (&info.external_addr, &info.internal_addr)
        } else {
            (&info.internal_addr, &info.external_addr)
        };
        let address = first
            .as_deref()
            .or(second.as_deref())
            .filter(|a| !a.is_empty())
            .ok_or_else(|| SpecError::NoAddress { instance: info.id.clone() })?;
        let port = if info.port == 0 { self.port } else { info.port };
        let (host, port) = split_host_port(address, port)?;
        let username = if info.username.is_empty() { self.username.clone() } else { info.username.clone() };
        if username.is_empty() {
            return Err(SpecError::NoUser);
        }
        let auth = match (
            info.key.clone().or_else(|| self.key.clone()),
            info.password.clone().or_else(|| self.password.clone()),
        ) {
            (Some(pem), _) => SshAuth::Key { pem, passphrase: None },
            (None, Some(password)) => SshAuth::Password(password),
            (None, None) => return Err(SpecError::NoCredentials),
        };
        let keepalive = match info.keepalive_seconds {
            0 => self.keepalive,
            s => Some(Duration::from_secs(u64::from(s))),
        };
        let timeout = match info.timeout_seconds {
            0 => self.timeout,
            s => Duration::from_secs(u64::from(s)),
        };
        Ok(ConnectSpec { host, port, username, auth, keepalive, timeout, host_key: None, known_hosts: None })
    }
}

/// `host`, `host:port`, `[v6]:port`, or a bare IPv6 address (which keeps `default_port`).
pub fn split_host_port(address: &str, default_port: u16) -> Result<(String, u16), SpecError> {
    if let Some(rest) = address.strip_prefix('[') {
        let (host, tail) = rest.split_once(']').ok_or_else(|| SpecError::BadAddress(address.to_string()))?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| SpecError::BadPort(address.to_string()))?,
            None => default_port,
        };
        return Ok((host.to_string(), port));
    }
    match address.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => {
            Ok((host.to_string(), port.parse().map_err(|_| SpecError::BadPort(address.to_string()))?))
        }
        _ => Ok((address.to_string(), default_port)),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{split_host_port, ConnectorDefaults, InstanceConnectInfo, SpecError};
    use crate::connector::SshAuth;

    #[test]
    fn addresses_split_into_host_and_port() {
        assert_eq!(split_host_port("10.0.0.5", 22), Ok(("10.0.0.5".into(), 22)));
        assert_eq!(split_host_port("build-2:2222", 22), Ok(("build-2".into(), 2222)));
        assert_eq!(split_host_port("[::1]:2200", 22), Ok(("::1".into(), 2200)));
        assert_eq!(split_host_port("fe80::1", 22), Ok(("fe80::1".into(), 22)));
        assert!(split_host_port("host:port", 22).is_err());
    }

    #[test]
    fn the_provider_wins_and_config_fills_the_blanks() {
        let defaults = ConnectorDefaults {
            username: "runner".into(),
            password: Some("pw".into()),
            key: None,
            port: 22,
            keepalive: Some(Duration::from_secs(30)),
            timeout: Duration::from_secs(30),
            use_external_addr: false,
        };
        let info = InstanceConnectInfo {
            id: "i-1".into(),
            external_addr: Some("203.0.113.9".into()),
            internal_addr: Some("10.0.0.9:2222".into()),
            timeout_seconds: 5,
            ..InstanceConnectInfo::default()
        };
        let spec = defaults.spec(&info).expect("spec");
        assert_eq!((spec.host.as_str(), spec.port, spec.username.as_str()), ("10.0.0.9", 2222, "runner"));
        assert!(matches!(spec.auth, SshAuth::Password(ref p) if p == "pw"));
        assert_eq!((spec.timeout, spec.keepalive), (Duration::from_secs(5), Some(Duration::from_secs(30))));
        let external = ConnectorDefaults { use_external_addr: true, ..defaults.clone() };
        assert_eq!(external.spec(&info).expect("spec").host, "203.0.113.9");
        let bare = InstanceConnectInfo { id: "i-2".into(), ..InstanceConnectInfo::default() };
        assert_eq!(defaults.spec(&bare).err(), Some(SpecError::NoAddress { instance: "i-2".into() }));
        let no_credentials = ConnectorDefaults { password: None, ..defaults };
        assert_eq!(no_credentials.spec(&info).err(), Some(SpecError::NoCredentials));
    }
}
