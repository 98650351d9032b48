//! `[session_server]`, as gitlab-runner reads it: `listen_address` (the session server runs
//! only when it is set), `advertise_address` (what GitLab is told to connect to) and
//! `session_timeout` (seconds a terminal may keep a finished job waiting; 1800 when unset or
//! not positive).
//!
//! Owns the section's fields and their checks. Must not touch: the server itself
//! (`crate::session`), the job request.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// gitlab-runner's `DefaultSessionTimeout`: 30 minutes.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(1800);

/// `[session_server]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SessionServerConfig {
    /// `host:port` the HTTPS server listens on; unset or empty: no session server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen_address: Option<String>,
    /// `host[:port]` (optionally `https://host:port`) GitLab connects to; the listen address
    /// when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise_address: Option<String>,
    /// Seconds a connected terminal keeps a job whose script ended waiting; ≤ 0 means 1800.
    #[serde(default)]
    pub session_timeout: i64,
}

/// A `[session_server]` that cannot be served; the message names the key and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionServerError {
    /// `listen_address` is not `host:port` with an IP host.
    #[error("session_server.listen_address {0:?} is not an IP address and port (for example \"0.0.0.0:8093\")")]
    ListenAddress(String),
    /// The address GitLab is told has no usable host.
    #[error(
        "session_server.advertise_address is needed when listen_address {0:?} listens on every interface: set it to the host and port GitLab reaches this runner on"
    )]
    AdvertiseAddress(String),
}

impl SessionServerConfig {
    /// Nothing set (the section is left out when config.toml is written).
    pub fn is_unset(&self) -> bool {
        *self == Self::default()
    }

    /// The address to listen on, when the session server is on.
    pub fn listen(&self) -> Result<Option<SocketAddr>, SessionServerError> {
        match self.listen_address.as_deref().map(str::trim).filter(|a| !a.is_empty()) {
            None => Ok(None),
            Some(a) => a.parse().map(Some).map_err(|_| SessionServerError::ListenAddress(a.to_string())),
        }
    }

    /// `session_timeout` as gitlab-runner's `GetSessionTimeout`.
    pub fn timeout(&self) -> Duration {
        match u64::try_from(self.session_timeout) {
            Ok(secs) if secs > 0 => Duration::from_secs(secs),
            _ => DEFAULT_SESSION_TIMEOUT,
        }
    }

    /// The `https://host:port` base GitLab is told (gitlab-runner's advertise address: the
    /// listen address when unset, `https://` added when no scheme is given; the port of
    /// the listen address when the advertised one has none).
    pub fn advertise_url(&self, listen: SocketAddr) -> Result<String, SessionServerError> {
        let given = self.advertise_address.as_deref().map(str::trim).filter(|a| !a.is_empty());
        let host_port = match given {
            Some(a) => {
                let bare = a.strip_prefix("https://").or_else(|| a.strip_prefix("http://")).unwrap_or(a);
                let bare = bare.trim_end_matches('/');
                if bare.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok()) {
                    bare.to_string()
                } else {
                    format!("{bare}:{}", listen.port())
                }
            }
            None if listen.ip().is_unspecified() => {
                return Err(SessionServerError::AdvertiseAddress(listen.to_string()));
            }
            None => listen.to_string(),
        };
        Ok(format!("https://{host_port}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(text: &str) -> SessionServerConfig {
        toml::from_str(text).expect("section parses")
    }

    #[test]
    fn gitlab_runners_defaults_and_addresses() {
        let off = section("");
        assert_eq!(off.listen().expect("ok"), None);
        assert_eq!(off.timeout(), Duration::from_secs(1800));
        assert_eq!(section("session_timeout = -5").timeout(), DEFAULT_SESSION_TIMEOUT);
        assert_eq!(section("session_timeout = 7").timeout(), Duration::from_secs(7));

        let on = section("listen_address = \"127.0.0.1:8093\"");
        let listen = on.listen().expect("ok").expect("on");
        assert_eq!(on.advertise_url(listen).expect("url"), "https://127.0.0.1:8093");
        let adv = section("listen_address = \"0.0.0.0:8093\"\nadvertise_address = \"runner.example.com\"");
        let listen = adv.listen().expect("ok").expect("on");
        assert_eq!(adv.advertise_url(listen).expect("url"), "https://runner.example.com:8093");
        let adv = section("listen_address = \"0.0.0.0:8093\"\nadvertise_address = \"https://r.example.com:443/\"");
        assert_eq!(adv.advertise_url(listen).expect("url"), "https://r.example.com:443");
    }

    #[test]
    fn bad_addresses_say_what_to_set() {
        let bad = section("listen_address = \"localhost\"");
        assert_eq!(bad.listen(), Err(SessionServerError::ListenAddress("localhost".into())));
        let wild = section("listen_address = \"[::]:8093\"");
        let listen = wild.listen().expect("ok").expect("on");
        let err = wild.advertise_url(listen).expect_err("needs advertise_address");
        assert!(err.to_string().contains("advertise_address is needed"), "{err}");
    }
}
