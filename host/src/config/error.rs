//! The error of a configuration file that did not load: config.toml here, and the
//! `.gitlab-ci.yml` that `runway exec` reads (the `local` module uses the same type).
//!
//! Owns the error type and its `file:line: key: message` display only; finding the line of a
//! key is the business of the reader that builds the error.

use std::fmt;
use std::path::PathBuf;

/// A configuration file problem, naming file, line and key: `path:line: key: message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", Located(self))]
pub struct ConfigError {
    /// The file (config.toml, `.gitlab-ci.yml`, an included file, or a project directory).
    pub path: PathBuf,
    /// 1-based line of the key, when known.
    pub line: Option<usize>,
    /// The key (`runners[0].limit`, `job.stage`), when the problem has one.
    pub key: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl ConfigError {
    /// An error about `path` with no line or key yet.
    pub fn new(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        ConfigError { path: path.into(), line: None, key: None, message: message.into() }
    }

    /// The same error at `line`.
    pub fn at_line(mut self, line: Option<usize>) -> Self {
        self.line = line;
        self
    }

    /// The same error about `key`; an empty key means none.
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into()).filter(|k| !k.is_empty());
        self
    }
}

/// What is wrong with one value of a configuration file, said before the reader knows the
/// file, line and key: the reader wraps it into a [`ConfigError`] (or a plugin's grant error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

struct Located<'a>(&'a ConfigError);

impl fmt::Display for Located<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = self.0;
        write!(f, "{}", e.path.display())?;
        if let Some(line) = e.line {
            write!(f, ":{line}")?;
        }
        if let Some(key) = &e.key {
            write!(f, ": {key}")?;
        }
        write!(f, ": {}", e.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_file_line_and_key() {
        let e = ConfigError::new("/etc/runway/config.toml", "must be at least 1")
            .at_line(Some(7))
            .with_key("runners[0].limit");
        assert_eq!(e.to_string(), "/etc/runway/config.toml:7: runners[0].limit: must be at least 1");
        assert_eq!(ConfigError::new("ci.yml", "bad").with_key("").to_string(), "ci.yml: bad");
    }
}
