//! Atomic file replacement: the one way runner state reaches disk (config.toml, the system
//! id, plugin kv entries, compiled plugins, the fleet state).
//!
//! [`write`] writes to a temporary file in the destination's directory, fsyncs it, sets the
//! requested mode, renames it over the destination and fsyncs the directory, so a crash leaves
//! either the old or the new content, never a mix, and the rename itself is durable. Readers
//! therefore never see a partial file. Owns nothing else: what the bytes mean is the caller's.

use std::io::Write as _;
use std::path::Path;

use super::StoreError;

/// Replace `path` with `bytes`, creating its directory when missing. The file gets mode
/// 0600 (the temporary file's), unless `mode` says otherwise.
pub fn write(path: &Path, bytes: &[u8], mode: Option<u32>) -> Result<(), StoreError> {
    let dir = parent_dir(path);
    std::fs::create_dir_all(dir).map_err(StoreError::io("creating the directory of", path))?;
    let mut tmp =
        tempfile::NamedTempFile::new_in(dir).map_err(StoreError::io("creating a temporary file for", path))?;
    tmp.write_all(bytes).map_err(StoreError::io("writing", path))?;
    if let Some(mode) = mode {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(StoreError::io("setting the mode of", path))?;
    }
    tmp.as_file().sync_all().map_err(StoreError::io("syncing", path))?;
    tmp.persist(path).map_err(|e| StoreError::Io { action: "replacing", path: path.to_path_buf(), source: e.error })?;
    sync_dir(dir).map_err(StoreError::io("syncing the directory of", path))
}

/// [`write`] with mode 0600 spelled out: for files that hold secrets (tokens).
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    write(path, bytes, Some(0o600))
}

/// Create `path` with `bytes` and mode 0600 unless it exists, atomically (temp file, fsync,
/// link without replacing, directory fsync): `Ok(false)` when another writer created it first,
/// whose content is then left as it is. For files that must be created once (keys).
pub fn create_private(path: &Path, bytes: &[u8]) -> Result<bool, StoreError> {
    let dir = parent_dir(path);
    std::fs::create_dir_all(dir).map_err(StoreError::io("creating the directory of", path))?;
    let mut tmp =
        tempfile::NamedTempFile::new_in(dir).map_err(StoreError::io("creating a temporary file for", path))?;
    tmp.write_all(bytes).map_err(StoreError::io("writing", path))?;
    tmp.as_file().sync_all().map_err(StoreError::io("syncing", path))?;
    match tmp.persist_noclobber(path) {
        Ok(_) => {}
        Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(StoreError::Io { action: "creating", path: path.to_path_buf(), source: e.error }),
    }
    sync_dir(dir).map_err(StoreError::io("syncing the directory of", path))?;
    Ok(true)
}

/// The directory a file lives in (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Make a rename in `dir` durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::{create_private, write, write_private};

    #[test]
    fn replaces_the_file_and_leaves_no_temporary_behind() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("nested/state.json");
        write(&path, b"one", None).expect("first write creates the directory");
        write(&path, b"two", None).expect("second write replaces");
        assert_eq!(std::fs::read(&path).expect("read"), b"two");
        let entries = std::fs::read_dir(path.parent().expect("parent")).expect("list").count();
        assert_eq!(entries, 1, "only the destination remains");
        let mode = std::fs::metadata(&path).expect("metadata").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "temporary files are private, and so is the result");
    }

    #[test]
    fn applies_the_requested_mode() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("shared");
        write(&path, b"x", Some(0o644)).expect("write");
        assert_eq!(std::fs::metadata(&path).expect("metadata").permissions().mode() & 0o777, 0o644);
        write_private(&path, b"y").expect("write");
        assert_eq!(std::fs::metadata(&path).expect("metadata").permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn create_private_never_replaces() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("key");
        assert!(create_private(&path, b"first").expect("created"));
        assert!(!create_private(&path, b"second").expect("exists"));
        assert_eq!(std::fs::read(&path).expect("read"), b"first");
        assert_eq!(std::fs::metadata(&path).expect("metadata").permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 1, "no temporary left behind");
    }

    #[test]
    fn reports_the_path_it_failed_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, b"").expect("file");
        let err = write(&blocker.join("below"), b"x", None).expect_err("a file is not a directory");
        assert!(err.to_string().contains("below"), "{err}");
    }
}
