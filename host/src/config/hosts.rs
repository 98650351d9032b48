//! A plugin's `allow_hosts`, parsed once when the config is loaded (the design of Spin's
//! `AllowedHostsConfig`): each entry becomes a [`HostPattern`] — a host name, an IP address or
//! every subdomain of a domain, with any port or one port — and a request is matched against
//! those structurally, never by splitting text per request.
//!
//! The syntax is the documented one: `host`, `host:port`, `*.domain` (any subdomain, any port
//! unless given), IPv6 addresses in brackets (`[::1]`, `[::1]:8080`). Names match without
//! regard to case; addresses match as addresses (`[0:0::1]` is `[::1]`).
//!
//! Owns: [`AllowedHosts`], [`HostPattern`] and [`HostGrantError`]. Must not touch: how a
//! request is refused (the `http` capability), the rest of the grant.

use std::fmt;
use std::net::IpAddr;

/// The hosts a plugin may reach over `wasi:http`; empty allows nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedHosts {
    patterns: Vec<HostPattern>,
}

/// One `allow_hosts` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    /// Which hosts.
    pub host: HostMatch,
    /// Which port: `None` allows any.
    pub port: Option<u16>,
}

/// The host part of an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    /// Exactly this name (lower case).
    Name(String),
    /// Every name under this domain (lower case), at any depth, not the domain itself.
    Subdomains(String),
    /// This address.
    Ip(IpAddr),
}

/// An `allow_hosts` entry that is not of the documented form; the text names the entry and
/// what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{entry:?} is not a host: {reason} (write `host`, `host:port`, `*.domain` or `[ipv6]:port`)")]
pub struct HostGrantError {
    /// The entry as written.
    pub entry: String,
    /// What is wrong with it.
    pub reason: HostGrantProblem,
}

/// What is wrong with an `allow_hosts` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostGrantProblem {
    /// Nothing but blanks.
    Empty,
    /// It starts with a scheme (`https://`).
    Scheme,
    /// It has a path, query, fragment or user part.
    NotJustAHost,
    /// The port is not a number from 1 to 65535.
    BadPort,
    /// A bare IPv6 address (its colons read as a port).
    UnbracketedIpv6,
    /// A `*` anywhere but a leading `*.` label.
    BadWildcard,
    /// A character or an empty label that no host name has.
    BadName,
}

impl fmt::Display for HostGrantProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HostGrantProblem::Empty => "it is empty",
            HostGrantProblem::Scheme => "a URL scheme is not part of a host",
            HostGrantProblem::NotJustAHost => "it has more than a host and a port",
            HostGrantProblem::BadPort => "the port must be a number from 1 to 65535",
            HostGrantProblem::UnbracketedIpv6 => "an IPv6 address goes in brackets",
            HostGrantProblem::BadWildcard => "`*` is only allowed as the first label, as in `*.example.com`",
            HostGrantProblem::BadName => "it is not a valid host name",
        })
    }
}

impl HostPattern {
    /// Parse one entry.
    pub fn parse(entry: &str) -> Result<HostPattern, HostGrantError> {
        let fail = |reason| HostGrantError { entry: entry.to_string(), reason };
        let text = entry.trim();
        if text.is_empty() {
            return Err(fail(HostGrantProblem::Empty));
        }
        if text.contains("://") {
            return Err(fail(HostGrantProblem::Scheme));
        }
        if text.contains(['/', '?', '#', '@']) {
            return Err(fail(HostGrantProblem::NotJustAHost));
        }
        let (host, port) = split_port(text).map_err(fail)?;
        let host = parse_host(host).map_err(fail)?;
        if text.starts_with('[') && !matches!(host, HostMatch::Ip(IpAddr::V6(_))) {
            return Err(fail(HostGrantProblem::BadName));
        }
        Ok(HostPattern { host, port })
    }

    /// Does this entry allow `host` (as a URI names it: IPv6 in brackets) on `port` (the
    /// URI's explicit port, if any)? An entry with a port allows only that explicit port.
    fn allows(&self, host: &RequestHost, port: Option<u16>) -> bool {
        if self.port.is_some() && self.port != port {
            return false;
        }
        match (&self.host, host) {
            (HostMatch::Ip(want), RequestHost::Ip(got)) => want == got,
            (HostMatch::Name(want), RequestHost::Name(got)) => want == got,
            (HostMatch::Subdomains(domain), RequestHost::Name(got)) => {
                got.strip_suffix(domain.as_str()).is_some_and(|head| head.len() > 1 && head.ends_with('.'))
            }
            _ => false,
        }
    }
}

/// `host[:port]` or `[v6][:port]` into the host text and the port.
fn split_port(text: &str) -> Result<(&str, Option<u16>), HostGrantProblem> {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest.split_once(']').ok_or(HostGrantProblem::BadName)?;
        match after {
            "" => (inside, None),
            _ => (inside, Some(after.strip_prefix(':').ok_or(HostGrantProblem::NotJustAHost)?)),
        }
    } else {
        match text.split_once(':') {
            None => (text, None),
            Some((_, rest)) if rest.contains(':') => return Err(HostGrantProblem::UnbracketedIpv6),
            Some((host, port)) => (host, Some(port)),
        }
    };
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.chars().all(|c| c.is_ascii_digit()) => Some(n),
            _ => return Err(HostGrantProblem::BadPort),
        },
    };
    Ok((host, port))
}

/// The host part of an entry: an address, `*.domain` or a name.
fn parse_host(host: &str) -> Result<HostMatch, HostGrantProblem> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(HostMatch::Ip(ip));
    }
    let (wildcard, name) = match host.strip_prefix("*.") {
        Some(domain) => (true, domain),
        None => (false, host),
    };
    if name.contains('*') || name == "*" || host == "*" {
        return Err(HostGrantProblem::BadWildcard);
    }
    let valid_label = |l: &str| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !name.split('.').all(valid_label) {
        return Err(HostGrantProblem::BadName);
    }
    let name = name.to_ascii_lowercase();
    Ok(if wildcard { HostMatch::Subdomains(name) } else { HostMatch::Name(name) })
}

/// A request's host, read once per request.
enum RequestHost {
    Name(String),
    Ip(IpAddr),
}

impl RequestHost {
    fn of(host: &str) -> RequestHost {
        let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        match bare.parse::<IpAddr>() {
            Ok(ip) => RequestHost::Ip(ip),
            Err(_) => RequestHost::Name(host.to_ascii_lowercase()),
        }
    }
}

impl AllowedHosts {
    /// Parse every entry of an `allow_hosts` list; the first bad one is the error.
    pub fn parse(entries: &[String]) -> Result<AllowedHosts, HostGrantError> {
        let patterns = entries.iter().map(|e| HostPattern::parse(e)).collect::<Result<_, _>>()?;
        Ok(AllowedHosts { patterns })
    }

    /// May a request reach `host` (as its URI names it) with the URI's explicit `port`?
    pub fn allows(&self, host: &str, port: Option<u16>) -> bool {
        if self.patterns.is_empty() {
            return false;
        }
        let host = RequestHost::of(host);
        self.patterns.iter().any(|p| p.allows(&host, port))
    }

    /// The parsed entries.
    pub fn patterns(&self) -> &[HostPattern] {
        &self.patterns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(entries: &[&str]) -> AllowedHosts {
        AllowedHosts::parse(&entries.iter().map(|e| e.to_string()).collect::<Vec<_>>()).expect("valid entries")
    }

    fn problem(entry: &str) -> HostGrantProblem {
        HostPattern::parse(entry).expect_err(entry).reason
    }

    #[test]
    fn names_match_whole_and_without_case() {
        let allowed = hosts(&["api.example.com", "Metadata.Google.Internal"]);
        assert!(allowed.allows("api.example.com", None));
        assert!(allowed.allows("API.example.COM", Some(443)));
        assert!(allowed.allows("metadata.google.internal", Some(80)));
        assert!(!allowed.allows("example.com", None));
        assert!(!allowed.allows("api.example.com.evil.net", None));
        assert!(!allowed.allows("xapi.example.com", None));
        assert!(!AllowedHosts::default().allows("example.com", None), "nothing is allowed by default");
    }

    #[test]
    fn a_port_given_is_the_only_port() {
        let allowed = hosts(&["127.0.0.1:8080", "example.com:443"]);
        assert!(allowed.allows("127.0.0.1", Some(8080)));
        assert!(!allowed.allows("127.0.0.1", Some(8081)));
        assert!(!allowed.allows("127.0.0.1", None), "the port must be explicit in the request");
        assert!(allowed.allows("example.com", Some(443)));
        assert_eq!(HostPattern::parse("h:65535").expect("max port").port, Some(65535));
        for bad in ["h:0", "h:65536", "h:", "h:80x", "h:+80", "h:-1"] {
            assert_eq!(problem(bad), HostGrantProblem::BadPort, "{bad}");
        }
    }

    #[test]
    fn wildcards_cover_subdomains_at_any_depth_not_the_domain() {
        let allowed = hosts(&["*.amazonaws.com", "*.internal:9000"]);
        assert!(allowed.allows("ec2.us-east-1.amazonaws.com", Some(443)));
        assert!(allowed.allows("S3.AMAZONAWS.com", None));
        assert!(!allowed.allows("amazonaws.com", None));
        assert!(!allowed.allows("amazonaws.com.evil.net", None));
        assert!(!allowed.allows("evilamazonaws.com", None));
        assert!(allowed.allows("a.internal", Some(9000)));
        assert!(!allowed.allows("a.internal", Some(9001)));
        for bad in ["*", "*.", "a.*.com", "*example.com", "**.example.com", "*.*.com"] {
            assert!(HostPattern::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(problem("a.*.com"), HostGrantProblem::BadWildcard);
    }

    #[test]
    fn addresses_match_as_addresses() {
        let allowed = hosts(&["[::1]:8080", "[fd00::1]", "169.254.169.254"]);
        assert!(allowed.allows("[::1]", Some(8080)));
        assert!(allowed.allows("[0:0:0:0:0:0:0:1]", Some(8080)), "another spelling of ::1");
        assert!(!allowed.allows("[::1]", Some(80)));
        assert!(allowed.allows("[FD00::1]", Some(1)));
        assert!(allowed.allows("169.254.169.254", None));
        assert!(!allowed.allows("169.254.169.25", None));
        assert_eq!(
            HostPattern::parse("[::1]:8080").expect("v6"),
            HostPattern { host: HostMatch::Ip("::1".parse().expect("ip")), port: Some(8080) }
        );
        assert_eq!(problem("::1"), HostGrantProblem::UnbracketedIpv6);
        assert_eq!(problem("fd00::1:80"), HostGrantProblem::UnbracketedIpv6);
        assert_eq!(problem("[::1"), HostGrantProblem::BadName);
        assert_eq!(problem("[example.com]"), HostGrantProblem::BadName);
        assert_eq!(problem("[10.0.0.1]:80"), HostGrantProblem::BadName);
        assert_eq!(problem("[::1]8080"), HostGrantProblem::NotJustAHost);
    }

    #[test]
    fn schemes_paths_and_junk_are_refused_naming_the_entry() {
        assert_eq!(problem("https://api.example.com"), HostGrantProblem::Scheme);
        assert_eq!(problem("http://127.0.0.1:8080"), HostGrantProblem::Scheme);
        assert_eq!(problem("api.example.com/v1"), HostGrantProblem::NotJustAHost);
        assert_eq!(problem("user@host"), HostGrantProblem::NotJustAHost);
        assert_eq!(problem(""), HostGrantProblem::Empty);
        assert_eq!(problem("  "), HostGrantProblem::Empty);
        assert_eq!(problem("a..b"), HostGrantProblem::BadName);
        assert_eq!(problem("a b"), HostGrantProblem::BadName);
        let err = AllowedHosts::parse(&["ok.example.com".into(), "https://x.example".into()]).expect_err("scheme");
        let text = err.to_string();
        assert!(text.contains("\"https://x.example\"") && text.contains("scheme"), "{text}");
    }

    #[test]
    fn each_entry_parses_to_its_structure() {
        assert_eq!(
            hosts(&["Example.com", "*.Example.org:8443", "10.0.0.1:22"]).patterns(),
            &[
                HostPattern { host: HostMatch::Name("example.com".into()), port: None },
                HostPattern { host: HostMatch::Subdomains("example.org".into()), port: Some(8443) },
                HostPattern { host: HostMatch::Ip("10.0.0.1".parse().expect("ip")), port: Some(22) },
            ]
        );
    }
}
