//! Registry credentials for a pull, chosen as GitLab does: every source's credentials keyed by
//! registry path (`DOCKER_AUTH_CONFIG` first, then the job's `registry` credentials; the first
//! source to name a path wins), then the longest path that is a prefix of the image's
//! normalized name. Decodes `DOCKER_AUTH_CONFIG`; never logs secrets.

use std::collections::BTreeMap;

use base64::Engine as _;

use crate::reference::{normalize_image_path, registry_path};

/// Where a credential came from (GitLab's wording, shown in the job log).
pub const SOURCE_DOCKER_AUTH_CONFIG: &str = "$DOCKER_AUTH_CONFIG";
/// Where a credential came from (GitLab's wording, shown in the job log).
pub const SOURCE_JOB_PAYLOAD: &str = "job payload (GitLab Registry)";

/// Credentials for one registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// Registry address to send (`X-Registry-Auth`'s `serveraddress`).
    pub server_address: String,
    /// User name.
    pub username: String,
    /// Password or token.
    pub password: String,
    /// [`SOURCE_DOCKER_AUTH_CONFIG`] or [`SOURCE_JOB_PAYLOAD`].
    pub source: &'static str,
}

/// A job credential as GitLab sends it.
#[derive(Debug, Clone)]
pub struct JobCredential<'a> {
    /// The registry URL.
    pub url: &'a str,
    /// User name.
    pub username: &'a str,
    /// Password or token.
    pub password: &'a str,
}

/// The outcome of [`resolve`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolved {
    /// The credential for the image, if any source has one.
    pub credential: Option<Credential>,
    /// Problems with a source (its credentials are then not used), for the job log.
    pub warnings: Vec<String>,
}

#[derive(serde::Deserialize)]
struct AuthFile {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
    #[serde(default, rename = "credHelpers")]
    cred_helpers: Option<BTreeMap<String, String>>,
}

#[derive(serde::Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: String,
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
}

/// Credentials in a `DOCKER_AUTH_CONFIG` value (a Docker `config.json`), sorted by registry.
pub fn parse_docker_auth_config(json: &str) -> Result<Vec<Credential>, String> {
    let file: AuthFile = serde_json::from_str(json).map_err(|e| format!("not a Docker config.json: {e}"))?;
    if file.creds_store.is_some() || file.cred_helpers.is_some_and(|h| !h.is_empty()) {
        return Err("credsStore and credHelpers are not supported (the runner does not run credential helpers)".into());
    }
    let mut out = Vec::new();
    for (server, entry) in file.auths {
        let (username, password) = if entry.auth.is_empty() {
            (entry.username, entry.password)
        } else {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(entry.auth.trim())
                .map_err(|_| format!("auths.{server:?}.auth is not base64"))?;
            let text = String::from_utf8(decoded).map_err(|_| format!("auths.{server:?}.auth is not UTF-8"))?;
            let (user, pass) =
                text.split_once(':').ok_or_else(|| format!("auths.{server:?}.auth is not base64(user:password)"))?;
            (user.to_string(), pass.to_string())
        };
        out.push(Credential { server_address: server, username, password, source: SOURCE_DOCKER_AUTH_CONFIG });
    }
    Ok(out)
}

/// The credential for pulling `image`: from `DOCKER_AUTH_CONFIG` (the job variable's value, if
/// set) and the job's registry credentials, GitLab's order and matching.
pub fn resolve(image: &str, docker_auth_config: Option<&str>, job: &[JobCredential<'_>]) -> Resolved {
    let mut resolved = Resolved::default();
    let mut known: Vec<(String, Credential)> = Vec::new();
    let mut add = |credential: Credential| {
        let path = registry_path(&credential.server_address);
        if !known.iter().any(|(p, _)| *p == path) {
            known.push((path, credential));
        }
    };
    if let Some(json) = docker_auth_config.filter(|j| !j.trim().is_empty()) {
        match parse_docker_auth_config(json) {
            Ok(credentials) => credentials.into_iter().for_each(&mut add),
            Err(e) => resolved.warnings.push(format!(
                "Failed to resolve credentials from {SOURCE_DOCKER_AUTH_CONFIG}: {e}. Credentials from this source will not be used."
            )),
        }
    }
    for c in job {
        add(Credential {
            server_address: c.url.to_string(),
            username: c.username.to_string(),
            password: c.password.to_string(),
            source: SOURCE_JOB_PAYLOAD,
        });
    }
    let mut path = normalize_image_path(image);
    loop {
        if let Some((_, credential)) = known.iter().find(|(p, _)| *p == path) {
            resolved.credential = Some(credential.clone());
            break;
        }
        match path.rfind('/') {
            Some(i) => path.truncate(i),
            None => break,
        }
    }
    resolved
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(user_pass: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(user_pass)
    }

    #[test]
    fn parses_docker_auth_config() {
        let json = format!(
            r#"{{"auths": {{"reg.local:5000": {{"auth": "{}"}}, "https://index.docker.io/v1/": {{"username": "u", "password": "p"}}}}}}"#,
            auth("alice:s3:cret")
        );
        let creds = parse_docker_auth_config(&json).unwrap();
        assert_eq!(creds.len(), 2);
        assert_eq!(creds[0].server_address, "https://index.docker.io/v1/");
        assert_eq!((creds[1].username.as_str(), creds[1].password.as_str()), ("alice", "s3:cret"));
        assert!(parse_docker_auth_config("{").is_err());
        assert!(parse_docker_auth_config(r#"{"auths": {"x": {"auth": "!!"}}}"#).unwrap_err().contains("base64"));
        assert!(parse_docker_auth_config(r#"{"credsStore": "desktop"}"#).unwrap_err().contains("credsStore"));
    }

    #[test]
    fn job_credentials_match_the_registry() {
        let job = [JobCredential { url: "reg.local:5000", username: "gitlab-ci-token", password: "tok" }];
        let r = resolve("reg.local:5000/group/img:1", None, &job);
        let c = r.credential.unwrap();
        assert_eq!((c.username.as_str(), c.source), ("gitlab-ci-token", SOURCE_JOB_PAYLOAD));
        assert_eq!(resolve("other.local/img", None, &job).credential, None);
        assert_eq!(resolve("alpine", None, &job).credential, None);
    }

    #[test]
    fn docker_auth_config_wins_and_longest_path_matches() {
        let json = format!(
            r#"{{"auths": {{"reg.local:5000": {{"auth": "{}"}}, "reg.local:5000/team": {{"auth": "{}"}}, "docker.io": {{"auth": "{}"}}}}}}"#,
            auth("host:1"),
            auth("team:2"),
            auth("hub:3")
        );
        let job = [JobCredential { url: "reg.local:5000", username: "gitlab-ci-token", password: "tok" }];
        let c = resolve("reg.local:5000/other/img", Some(&json), &job).credential.unwrap();
        assert_eq!((c.username.as_str(), c.source), ("host", SOURCE_DOCKER_AUTH_CONFIG));
        let c = resolve("reg.local:5000/team/img:1", Some(&json), &job).credential.unwrap();
        assert_eq!(c.username, "team");
        let c = resolve("alpine:3", Some(&json), &[]).credential.unwrap();
        assert_eq!(c.username, "hub");
    }

    #[test]
    fn a_broken_docker_auth_config_is_a_warning() {
        let job = [JobCredential { url: "reg.local", username: "u", password: "p" }];
        let r = resolve("reg.local/img", Some("not json"), &job);
        assert_eq!(r.credential.unwrap().source, SOURCE_JOB_PAYLOAD);
        assert_eq!(r.warnings.len(), 1);
        assert!(r.warnings[0].contains("$DOCKER_AUTH_CONFIG"));
    }
}
