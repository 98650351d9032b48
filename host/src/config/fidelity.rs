//! Config fidelity with gitlab-runner: every key of its `common/config.go` (the list in
//! `gitlab_runner_keys.txt`, generated from gitlab-runner's source) is either honoured by
//! Runway or warned about by name at load — `<file>:<line>: <key>: not supported by Runway (ignored)` —
//! so no table of a gitlab-runner config.toml is silently absorbed. Keys neither knows get
//! `unknown key (ignored)`.
//!
//! Owns: the classification of a key path and the warning ([`ConfigWarning`]: its kind, for
//! callers that sort warnings, and its text, for people). Must not touch: the model or what a
//! key means (the loader in `config` decides what it reads).

use std::fmt;
use std::path::Path;

/// What a config warning is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarningKind {
    /// A key neither gitlab-runner nor Runway knows.
    UnknownKey,
    /// A gitlab-runner key Runway does not act on.
    Unsupported,
    /// Anything else (a setting that works badly, such as too low a `concurrent`).
    Other,
}

/// One warning about a loaded config: its kind, and its line for a person (naming file, line
/// and key). It reads as that line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigWarning {
    /// What it is about.
    pub kind: WarningKind,
    text: String,
}

impl ConfigWarning {
    /// A warning of `kind` reading `text`.
    pub fn new(kind: WarningKind, text: String) -> Self {
        ConfigWarning { kind, text }
    }
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::ops::Deref for ConfigWarning {
    type Target = str;
    fn deref(&self) -> &str {
        &self.text
    }
}

impl std::borrow::Borrow<str> for ConfigWarning {
    fn borrow(&self) -> &str {
        &self.text
    }
}

impl PartialEq<str> for ConfigWarning {
    fn eq(&self, other: &str) -> bool {
        self.text == other
    }
}

/// gitlab-runner's keys, one dotted path a line (`runners.cache.s3.BucketName`).
const GITLAB_RUNNER_KEYS: &str = include_str!("gitlab_runner_keys.txt");

/// Executor sections Runway has an executor for: handed to that executor's plugin as JSON
/// (the plugin reads, checks and warns about their keys).
pub const RUNWAY_EXECUTOR_SECTIONS: &[&str] = &["shell", "docker", "ssh", "custom", "instance", "kubernetes"];

/// gitlab-runner keys Runway honours that other parts of Runway read outside the typed model
/// (the git and user settings of the scripts), so they are never warned about here.
pub const HONOURED_ELSEWHERE: &[&str] = &["user", "runners.clean_git_config", "runners.safe_directory_checkout"];

/// gitlab-runner keys read into Runway's model that Runway does not act on: present in a
/// file, they are warned about like any other unsupported key.
pub const MODELLED_BUT_UNSUPPORTED: &[&str] = &["connection_max_age"];

/// The keys of `value` a `T` does not read (dotted paths below `value`). The loader runs this
/// on each runner's typed sub-tables: serde cannot report them through the runner's flattened
/// executor sections.
pub fn ignored_keys<T: serde::de::DeserializeOwned>(value: &toml::Value) -> Vec<String> {
    let mut ignored = Vec::new();
    let mut track = |p: serde_ignored::Path<'_>| ignored.push(p.to_string());
    let _ = T::deserialize(serde_ignored::Deserializer::new(value.clone(), &mut track));
    ignored
}

/// `runners.0.cache.s3.Foo` → `runners.cache.s3.Foo`: array indices and serde's `?` dropped.
pub fn normalize(path: &str) -> String {
    path.replace('[', ".")
        .replace(']', "")
        .split('.')
        .filter(|p| !p.is_empty() && *p != "?" && p.parse::<usize>().is_err())
        .collect::<Vec<_>>()
        .join(".")
}

/// Is `path` (any spelling [`normalize`] accepts) a key of gitlab-runner's config.toml?
pub fn is_gitlab_runner_key(path: &str) -> bool {
    let key = normalize(path);
    if HONOURED_ELSEWHERE.contains(&key.as_str()) {
        return false;
    }
    GITLAB_RUNNER_KEYS.lines().any(|line| !line.starts_with('#') && line.trim() == key)
}

/// Is `path` one of [`HONOURED_ELSEWHERE`]?
pub fn is_honoured_elsewhere(path: &str) -> bool {
    HONOURED_ELSEWHERE.contains(&normalize(path).as_str())
}

/// The warning for a key the model did not read: `not supported by Runway` for gitlab-runner's
/// keys, `unknown key (ignored)` for others; `None` for keys honoured elsewhere.
pub fn warning(path: &Path, line: Option<usize>, key: &str) -> Option<ConfigWarning> {
    if is_honoured_elsewhere(key) {
        return None;
    }
    let (kind, what) = if is_gitlab_runner_key(key) {
        (WarningKind::Unsupported, "not supported by Runway (ignored)")
    } else {
        (WarningKind::UnknownKey, "unknown key (ignored)")
    };
    let text = match line {
        Some(line) => format!("{}:{line}: {key}: {what}", path.display()),
        None => format!("{}: {key}: {what}", path.display()),
    };
    Some(ConfigWarning::new(kind, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gitlab_runner_keys_are_told_apart_from_unknown_ones() {
        for key in [
            "session_server",
            "sentry_dsn",
            "experimental",
            "machine",
            "runners.0.kubernetes",
            "runners[1].proxy_exec",
            "runners.0.cache.s3.DualStack",
            "runners.0.autoscaler.vm_isolation",
            "runners.0.machine.MachineDriver",
            "runners.0.experimental",
            "runners.0.referees",
            "runners.0.monitoring",
            "runners.0.step_runner_image",
        ] {
            assert!(is_gitlab_runner_key(key), "{key}");
        }
        for key in ["bogus", "runners.0.mystery", "runners.0.store.?.mystery", "runners.0.cache.s3.Nope"] {
            assert!(!is_gitlab_runner_key(key), "{key}");
        }
        let p = Path::new("/etc/runway/config.toml");
        assert_eq!(
            warning(p, Some(3), "sentry_dsn").as_deref(),
            Some("/etc/runway/config.toml:3: sentry_dsn: not supported by Runway (ignored)")
        );
        assert_eq!(warning(p, None, "bogus").as_deref(), Some("/etc/runway/config.toml: bogus: unknown key (ignored)"));
        assert_eq!(warning(p, Some(9), "runners.0.clean_git_config"), None);
        assert_eq!(warning(p, Some(1), "user"), None);
    }

    #[test]
    fn the_key_list_is_gitlab_runners_whole_schema_outside_executor_sections() {
        let keys: Vec<&str> = GITLAB_RUNNER_KEYS.lines().filter(|l| !l.starts_with('#')).collect();
        assert!(keys.len() > 200, "{}", keys.len());
        for top in ["concurrent", "log_format", "runners.token_expires_at", "runners.tls-ca-file", "runners.labels"] {
            assert!(keys.contains(&top), "{top}");
        }
        assert!(!keys.iter().any(|k| k.starts_with("runners.docker.")));
    }
}
