//! The autoscaled fleet's state file: the engine snapshot under the identity of the manager
//! that wrote it, so a restarted manager adopts its own instances (with their use counts)
//! and never another manager's.
//!
//! Generic over the snapshot type (any serde value): `store` does not know the autoscaler.
//! Written through [`super::atomic`]; reading never fails the caller — a missing, unreadable
//! or foreign file means "start without it", with a warning.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{atomic, StoreError};

/// Where a runner's fleet state lives (`[runners.autoscaler.state_storage]`): `None` when
/// `enabled` is off, else `<dir>/<token digest>.json`, `dir` defaulting to
/// `<config dir>/.taskscaler`. A file an earlier version wrote as `<legacy_name>.json` (the
/// runner's short token, which two runners can share) is renamed to it first, when the new
/// one does not exist yet.
pub fn state_file(
    enabled: bool,
    dir: Option<&Path>,
    config_dir: &Path,
    token_digest: &str,
    legacy_name: &str,
) -> Option<PathBuf> {
    enabled.then(|| {
        let dir = dir.map(Path::to_path_buf).unwrap_or_else(|| config_dir.join(".taskscaler"));
        let path = dir.join(format!("{token_digest}.json"));
        let legacy = dir.join(format!("{legacy_name}.json"));
        if !legacy_name.is_empty() && !path.exists() && legacy.is_file() {
            match std::fs::rename(&legacy, &path) {
                Ok(()) => tracing::info!(from = %legacy.display(), to = %path.display(), "moved the fleet state to the runner's token digest"),
                Err(e) => tracing::warn!(path = %legacy.display(), "cannot move the fleet state ({e}); starting without it"),
            }
        }
        path
    })
}

/// The file's content as written.
#[derive(Serialize)]
struct SavedStateRef<'a, S> {
    manager: &'a str,
    snapshot: &'a S,
}

/// The file's content as read.
#[derive(Deserialize)]
struct SavedState<S> {
    manager: String,
    snapshot: S,
}

/// Save `snapshot` as written by manager `manager` (its system id), atomically.
pub fn write_state<S: Serialize>(path: &Path, manager: &str, snapshot: &S) -> Result<(), StoreError> {
    let json = serde_json::to_vec_pretty(&SavedStateRef { manager, snapshot }).map_err(|source| StoreError::Json {
        action: "encoding",
        path: path.to_path_buf(),
        source,
    })?;
    atomic::write(path, &json, None)
}

/// The saved snapshot, when the file exists, parses and was written by `manager`.
pub fn load_state<S: DeserializeOwned>(path: &Path, manager: &str) -> Option<S> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(path = %path.display(), "cannot read the fleet state: {e}");
            return None;
        }
    };
    match serde_json::from_slice::<SavedState<S>>(&bytes) {
        Ok(state) if state.manager == manager => Some(state.snapshot),
        Ok(state) => {
            tracing::warn!(path = %path.display(), owner = %state.manager, "the fleet state belongs to another manager; not adopting it");
            None
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), "the fleet state is unreadable ({e}); starting without it");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::{load_state, state_file, write_state};

    /// Stands in for the engine snapshot (store does not know the autoscaler).
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Snapshot {
        version: u32,
        taken_at: u64,
        instances: Vec<String>,
    }

    #[test]
    fn state_is_adopted_only_by_the_manager_that_wrote_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state/runner.json");
        assert!(load_state::<Snapshot>(&path, "s_1").is_none(), "no file: nothing to adopt");
        let snapshot = Snapshot { version: 1, taken_at: 42, instances: Vec::new() };
        write_state(&path, "s_1", &snapshot).expect("write");
        assert_eq!(load_state(&path, "s_1"), Some(snapshot));
        assert!(load_state::<Snapshot>(&path, "s_2").is_none(), "another manager's instances are not ours");
        std::fs::write(&path, b"{ truncated").expect("corrupt");
        assert!(load_state::<Snapshot>(&path, "s_1").is_none(), "an unreadable file is ignored");
    }

    #[test]
    fn the_file_is_named_by_the_token_digest_and_an_old_one_moves_there() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(state_file(false, None, dir.path(), "0123456789abcdef", "abcdefghi"), None);
        let snapshot = Snapshot { version: 1, taken_at: 7, instances: vec!["i-1".into()] };
        let legacy = dir.path().join(".taskscaler/abcdefghi.json");
        write_state(&legacy, "s_1", &snapshot).expect("write");
        let path = state_file(true, None, dir.path(), "0123456789abcdef", "abcdefghi").expect("on");
        assert_eq!(path, dir.path().join(".taskscaler/0123456789abcdef.json"));
        assert!(!legacy.exists());
        assert_eq!(load_state(&path, "s_1"), Some(snapshot));
        // A newer file is never overwritten by an old one.
        write_state(&legacy, "s_1", &Snapshot { version: 1, taken_at: 1, instances: Vec::new() }).expect("write");
        state_file(true, None, dir.path(), "0123456789abcdef", "abcdefghi").expect("on");
        assert_eq!(load_state::<Snapshot>(&path, "s_1").map(|s| s.taken_at), Some(7));
    }
}
