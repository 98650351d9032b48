//! Where the plugin's AWS credentials come from, in the SDKs' order: the environment
//! variables granted to the plugin (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`), the shared credentials and config files (readable only through a
//! `dirs` grant), then the instance metadata service (IMDSv2; reachable only when its address
//! is in `allow_hosts`). Temporary credentials are refreshed five minutes before they expire.
//!
//! Owns: finding, parsing and refreshing credentials. Must not touch: signing or API calls.

use std::collections::BTreeMap;

use cloud_common::http::{self, HttpError, Request};

/// A set of credentials.
#[derive(Clone)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
    /// Unix time after which they are no good (temporary credentials).
    pub expires_at: Option<u64>,
    /// Where they came from, for messages.
    pub source: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, {})", self.access_key_id, self.source)
    }
}

/// Where to look, from `plugin_config` and the granted environment.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    /// Keys given in the plugin's configuration (docker+machine's `amazonec2-access-key`):
    /// used before any other source, as docker-machine uses its flags.
    pub configured: Option<Credentials>,
    pub profile: Option<String>,
    pub config_file: Option<String>,
    pub credentials_file: Option<String>,
}

/// The default IMDS address.
const IMDS: &str = "http://169.254.169.254";

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

impl Sources {
    /// The profile in use: `profile`, `AWS_PROFILE`, or `default`.
    pub fn profile_name(&self) -> String {
        self.profile.clone().or_else(|| env("AWS_PROFILE")).unwrap_or_else(|| "default".into())
    }

    fn file(&self, configured: &Option<String>, env_key: &str, default: &str) -> Option<String> {
        configured.clone().or_else(|| env(env_key)).or_else(|| env("HOME").map(|h| format!("{h}/.aws/{default}")))
    }

    /// The profile's section of the shared config file (`[profile NAME]`, or `[default]`).
    pub fn config_section(&self) -> Result<BTreeMap<String, String>, String> {
        let Some(path) = self.file(&self.config_file, "AWS_CONFIG_FILE", "config") else {
            return Ok(BTreeMap::new());
        };
        let name = self.profile_name();
        let sections = read_ini(&path, self.config_file.is_some())?;
        let wanted = if name == "default" { "default".to_string() } else { format!("profile {name}") };
        Ok(sections.get(&wanted).or_else(|| sections.get(&name)).cloned().unwrap_or_default())
    }

    /// Resolve credentials: configured keys, environment, shared files, then IMDSv2.
    pub fn resolve(&self) -> Result<Credentials, String> {
        if let Some(configured) = &self.configured {
            return Ok(configured.clone());
        }
        if let (Some(id), Some(secret)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
            return Ok(Credentials {
                access_key_id: id,
                secret_access_key: secret,
                session_token: env("AWS_SESSION_TOKEN"),
                expires_at: None,
                source: "environment".into(),
            });
        }
        let name = self.profile_name();
        let mut tried = vec!["the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)".to_string()];
        if let Some(path) = self.file(&self.credentials_file, "AWS_SHARED_CREDENTIALS_FILE", "credentials") {
            let sections = read_ini(&path, self.credentials_file.is_some())?;
            if let Some(found) = from_section(sections.get(&name), &format!("{path} [{name}]")) {
                return Ok(found);
            }
            tried.push(format!("{path} [{name}]"));
        }
        if let Some(found) = from_section(Some(&self.config_section()?), &format!("config file profile {name}")) {
            return Ok(found);
        }
        if env("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Err(format!("no AWS credentials in {}; IMDS is disabled", tried.join(", ")));
        }
        imds().map_err(|e| {
            format!("no AWS credentials in {}, nor from the instance metadata service: {e}", tried.join(", "))
        })
    }
}

fn from_section(section: Option<&BTreeMap<String, String>>, source: &str) -> Option<Credentials> {
    let section = section?;
    Some(Credentials {
        access_key_id: section.get("aws_access_key_id")?.clone(),
        secret_access_key: section.get("aws_secret_access_key")?.clone(),
        session_token: section.get("aws_session_token").cloned(),
        expires_at: None,
        source: source.to_string(),
    })
}

/// Sections of an INI file (`[name]` then `key = value`; `#`/`;` comments). A missing file is
/// empty unless `required` (it was named in `plugin_config`).
fn read_ini(path: &str, required: bool) -> Result<BTreeMap<String, BTreeMap<String, String>>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if !required => {
            let _ = e;
            return Ok(BTreeMap::new());
        }
        Err(e) => return Err(format!("cannot read {path}: {e} (is its directory granted to the plugin in `dirs`?)")),
    };
    Ok(parse_ini(&text))
}

/// Parse INI text into sections.
pub fn parse_ini(text: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut sections: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
            sections.entry(name.clone()).or_default();
            current = Some(name);
        } else if let (Some(section), Some((key, value))) = (&current, line.split_once('=')) {
            sections
                .entry(section.clone())
                .or_default()
                .insert(key.trim().to_ascii_lowercase(), value.trim().to_string());
        }
    }
    sections
}

/// IMDSv2: a session token (PUT), the instance profile's role, then its credentials.
fn imds() -> Result<Credentials, String> {
    let base = env("AWS_EC2_METADATA_SERVICE_ENDPOINT").unwrap_or_else(|| IMDS.to_string());
    let base = base.trim_end_matches('/');
    let fail = |e: HttpError| e.to_string();
    let token = http::send(
        &Request::new("PUT", format!("{base}/latest/api/token"))
            .header("x-aws-ec2-metadata-token-ttl-seconds", "21600"),
    )
    .map_err(fail)?;
    if token.status != 200 {
        return Err(format!("IMDS token request answered {}", token.status));
    }
    let token = token.text();
    let get = |path: &str| -> Result<String, String> {
        let response = http::send(
            &Request::new("GET", format!("{base}/latest/meta-data/iam/security-credentials/{path}"))
                .header("x-aws-ec2-metadata-token", token.trim()),
        )
        .map_err(fail)?;
        match response.status {
            200 => Ok(response.text()),
            404 => Err("the instance has no instance profile (IAM role)".into()),
            s => Err(format!("IMDS answered {s}")),
        }
    };
    let role = get("")?.lines().next().unwrap_or_default().trim().to_string();
    if role.is_empty() {
        return Err("the instance has no instance profile (IAM role)".into());
    }
    let body = get(&role)?;
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Imds {
        access_key_id: String,
        secret_access_key: String,
        token: String,
        expiration: String,
    }
    let parsed: Imds = serde_json::from_str(&body).map_err(|e| format!("IMDS credentials: {e}"))?;
    Ok(Credentials {
        access_key_id: parsed.access_key_id,
        secret_access_key: parsed.secret_access_key,
        session_token: Some(parsed.token),
        expires_at: cloud_common::parse_rfc3339(&parsed.expiration),
        source: format!("instance profile {role}"),
    })
}
