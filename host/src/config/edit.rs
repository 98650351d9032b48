//! In-place edits of config.toml: what `register`, `unregister`, `verify --delete`,
//! `reset-token` and token rotation change, and nothing else. Every other key, comment, blank
//! line and the order of the file are kept (`toml_edit`); the file is written atomically with
//! mode 0600 (it holds tokens).
//!
//! Owns: reading the document, the three edits (append a runner, remove runners, set a
//! runner's token) and the atomic write through `store::atomic`. Must not touch: what the
//! values mean (loading and checking stay in `config`), or GitLab.

use std::path::Path;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use toml_edit::{DocumentMut, Item, Value};

use super::{ConfigError, RunnerConfig};

/// The starting keys of a config.toml that `register` creates: what gitlab-runner's encoder
/// writes for a new `common.Config` (`NewConfig`: concurrent 1, connection_max_age 15m,
/// session_timeout 1800).
const NEW_FILE: &str = "concurrent = 1\ncheck_interval = 0\nconnection_max_age = \"15m0s\"\nshutdown_timeout = 0\n\n[session_server]\n  session_timeout = 1800\n";

/// A runner's new token, as GitLab returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenUpdate {
    /// The new runner authentication token.
    pub token: String,
    /// When it was obtained (now, whole seconds).
    pub obtained_at: DateTime<Utc>,
    /// When it expires; `None` removes `token_expires_at`.
    pub expires_at: Option<DateTime<Utc>>,
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError::new(path, format!("cannot read: {e}")))
}

fn parse(path: &Path, text: &str) -> Result<DocumentMut, ConfigError> {
    text.parse::<DocumentMut>().map_err(|e| ConfigError::new(path, format!("cannot edit: {e}")))
}

fn write(path: &Path, text: &str) -> Result<(), ConfigError> {
    crate::store::atomic::write_private(path, text.as_bytes())
        .map_err(|e| ConfigError::new(path, format!("cannot write: {e}")))
}

/// `runners` of the document as an array of tables (`[[runners]]`).
fn runners_mut<'a>(path: &Path, doc: &'a mut DocumentMut) -> Result<&'a mut toml_edit::ArrayOfTables, ConfigError> {
    doc.get_mut("runners")
        .and_then(Item::as_array_of_tables_mut)
        .ok_or_else(|| ConfigError::new(path, "has no [[runners]] entries").with_key("runners"))
}

/// Append `runner` as a new `[[runners]]` entry at the end of `path` (created with
/// gitlab-runner's starting keys when absent); the text before it is kept byte for byte.
pub fn add_runner(path: &Path, runner: &RunnerConfig) -> Result<(), ConfigError> {
    #[derive(Serialize)]
    struct One<'a> {
        runners: [&'a RunnerConfig; 1],
    }
    let entry = toml::to_string(&One { runners: [runner] })
        .map_err(|e| ConfigError::new(path, format!("cannot write the runner entry: {e}")))?;
    append(path, &entry)
}

/// Append `entry` (a `[[runners]]` table as `register` builds it) like [`add_runner`].
pub fn add_runner_table(path: &Path, entry: toml_edit::Table) -> Result<(), ConfigError> {
    let mut runners = toml_edit::ArrayOfTables::new();
    runners.push(entry);
    let mut one = DocumentMut::new();
    one.insert("runners", Item::ArrayOfTables(runners));
    append(path, &one.to_string())
}

fn append(path: &Path, entry: &str) -> Result<(), ConfigError> {
    let existing = if path.exists() { read(path)? } else { NEW_FILE.to_string() };
    let mut text = existing;
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push('\n');
    text.push_str(entry);
    // The result must still be one valid document (an inline `runners = [...]` would not be).
    parse(path, &text)?;
    write(path, &text)
}

/// Remove the `[[runners]]` entries at `indices` (their own comments go with them).
pub fn remove_runners(path: &Path, indices: &[usize]) -> Result<(), ConfigError> {
    if indices.is_empty() {
        return Ok(());
    }
    let text = read(path)?;
    let mut doc = parse(path, &text)?;
    let runners = runners_mut(path, &mut doc)?;
    let mut sorted = indices.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    for index in sorted.into_iter().rev() {
        if index >= runners.len() {
            return Err(
                ConfigError::new(path, "changed while it was being edited").with_key(format!("runners[{index}]"))
            );
        }
        runners.remove(index);
    }
    write(path, &doc.to_string())
}

/// A TOML datetime (`2026-01-02T03:04:05Z`) as gitlab-runner writes `token_*_at`.
fn datetime(at: &DateTime<Utc>) -> Value {
    let text = at.to_rfc3339_opts(SecondsFormat::Secs, true);
    match text.parse::<toml_edit::Datetime>() {
        Ok(d) => Value::from(d),
        Err(_) => Value::from(text),
    }
}

/// Replace (keeping the key's place and comments) or insert `key = value` in `table`.
fn set(table: &mut toml_edit::Table, key: &str, new: Value) {
    match table.get_mut(key).and_then(Item::as_value_mut) {
        Some(old) => {
            let decor = old.decor().clone();
            *old = new;
            *old.decor_mut() = decor;
        }
        None => {
            table.insert(key, Item::Value(new));
        }
    }
}

/// Set `token`, `token_obtained_at` and `token_expires_at` of the `index`-th runner, whose
/// `token` must still read `expected_token` (else the file changed meanwhile and nothing is
/// written).
pub fn set_runner_token(
    path: &Path,
    index: usize,
    expected_token: &str,
    update: &TokenUpdate,
) -> Result<(), ConfigError> {
    let text = read(path)?;
    let mut doc = parse(path, &text)?;
    let runners = runners_mut(path, &mut doc)?;
    let key = format!("runners[{index}].token");
    let Some(table) = runners.get_mut(index) else {
        return Err(ConfigError::new(path, "changed while it was being edited").with_key(key));
    };
    if table.get("token").and_then(Item::as_str) != Some(expected_token) {
        return Err(
            ConfigError::new(path, "changed while it was being edited: the token is not the one reset").with_key(key)
        );
    }
    set(table, "token", Value::from(update.token.as_str()));
    set(table, "token_obtained_at", datetime(&update.obtained_at));
    match &update.expires_at {
        Some(at) => set(table, "token_expires_at", datetime(at)),
        None => {
            table.remove("token_expires_at");
        }
    }
    write(path, &doc.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# fleet config\nconcurrent = 4 # four at once\n\n[[runners]]\n  # the first\n  name = \"one\"\n  url = \"https://gitlab.example.com\"\n  token = \"glrt-one\" # rotated by runway\n  token_obtained_at = 2026-01-01T00:00:00Z\n  token_expires_at = 2026-02-01T00:00:00Z\n  executor = \"shell\"\n  [runners.docker]\n    image = \"alpine\" # kept\n\n# the second\n[[runners]]\n  name = \"two\"\n  url = \"https://gitlab.example.com\"\n  token = \"glrt-two\"\n  executor = \"shell\"\n";

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().expect("datetime")
    }

    #[test]
    fn a_token_change_keeps_every_other_byte() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.toml");
        std::fs::write(&path, FILE).expect("write");
        let update = TokenUpdate {
            token: "glrt-new".into(),
            obtained_at: at("2026-01-24T00:00:00Z"),
            expires_at: Some(at("2026-02-24T00:00:00Z")),
        };
        set_runner_token(&path, 0, "glrt-one", &update).expect("edit");
        let text = std::fs::read_to_string(&path).expect("read");
        let want = FILE
            .replace("\"glrt-one\" # rotated", "\"glrt-new\" # rotated")
            .replace("2026-01-01T00:00:00Z", "2026-01-24T00:00:00Z")
            .replace("2026-02-01T00:00:00Z", "2026-02-24T00:00:00Z");
        assert_eq!(text, want);
        let loaded = crate::config::parse(&text, &path).expect("loads");
        assert_eq!(loaded.config.runners[0].token_expires_at, Some(at("2026-02-24T00:00:00Z")));
        // A stale expectation writes nothing.
        let e = set_runner_token(&path, 0, "glrt-one", &update).expect_err("stale");
        assert_eq!(e.key.as_deref(), Some("runners[0].token"));
        assert_eq!(std::fs::read_to_string(&path).expect("read"), want);
        // No expiry: the key goes, a missing obtained_at is added.
        let update = TokenUpdate { token: "glrt-2b".into(), obtained_at: at("2026-01-24T00:00:00Z"), expires_at: None };
        set_runner_token(&path, 1, "glrt-two", &update).expect("edit");
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(
            text.ends_with("token = \"glrt-2b\"\n  executor = \"shell\"\ntoken_obtained_at = 2026-01-24T00:00:00Z\n"),
            "{text}"
        );
    }

    #[test]
    fn runners_are_removed_and_added_without_touching_the_rest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.toml");
        std::fs::write(&path, FILE).expect("write");
        remove_runners(&path, &[1]).expect("remove");
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(text, FILE.split("\n# the second\n").next().expect("first part"));
        let mut runner = RunnerConfig::new("three", "https://gitlab.example.com", "glrt-three", "docker");
        runner.token_obtained_at = Some(at("2026-01-24T00:00:00Z"));
        runner.sections.insert("docker".into(), toml::Value::Table(toml::toml! { image = "debian" }));
        add_runner(&path, &runner).expect("add");
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(text.starts_with(FILE.split("\n# the second\n").next().expect("first part")), "{text}");
        assert!(text.contains("token_obtained_at = 2026-01-24T00:00:00Z\n"), "{text}");
        let loaded = crate::config::parse(&text, &path).expect("loads");
        let names: Vec<&str> = loaded.config.runners.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["one", "three"]);
        assert_eq!(loaded.config.runners[1].executor_config_json(), r#"{"image":"debian"}"#);
        // A new file starts with gitlab-runner's keys.
        let fresh = dir.path().join("new.toml");
        add_runner(&fresh, &runner).expect("add");
        let text = std::fs::read_to_string(&fresh).expect("read");
        assert!(text.starts_with(NEW_FILE), "{text}");
        crate::config::parse(&text, &fresh).expect("loads");
    }
}
