//! `runway exec --isolate`: copy the files git tracks into a scratch directory so a job
//! cannot touch the working tree.

use std::path::Path;

use crate::config::ConfigError;

fn err(project_dir: &Path, message: String) -> ConfigError {
    ConfigError::new(project_dir, message)
}

/// Copy every file `git ls-files` lists (modes kept) into a new temporary directory.
pub fn copy_tracked(project_dir: &Path) -> Result<tempfile::TempDir, ConfigError> {
    let output = std::process::Command::new("git")
        .arg("-C")
        .arg(project_dir)
        .args(["ls-files", "-z", "--cached"])
        .output()
        .map_err(|e| err(project_dir, format!("running git: {e}")))?;
    if !output.status.success() {
        return Err(err(
            project_dir,
            format!("--isolate needs a git repository: {}", String::from_utf8_lossy(&output.stderr).trim()),
        ));
    }
    let scratch =
        tempfile::Builder::new().prefix("runway-exec-").tempdir().map_err(|e| err(project_dir, e.to_string()))?;
    for name in output.stdout.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let rel = String::from_utf8_lossy(name).into_owned();
        let from = project_dir.join(&rel);
        let to = scratch.path().join(&rel);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(|e| err(project_dir, format!("{}: {e}", parent.display())))?;
        }
        let meta = match std::fs::symlink_metadata(&from) {
            Ok(m) => m,
            Err(_) => continue, // deleted in the working tree
        };
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&from).map_err(|e| err(project_dir, format!("{rel}: {e}")))?;
            std::os::unix::fs::symlink(target, &to).map_err(|e| err(project_dir, format!("{rel}: {e}")))?;
        } else if meta.is_file() {
            std::fs::copy(&from, &to).map_err(|e| err(project_dir, format!("{rel}: {e}")))?;
        }
    }
    Ok(scratch)
}
