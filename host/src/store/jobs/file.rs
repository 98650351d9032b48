//! The file job store: one directory per runner, one manager per directory.
//!
//! Layout: `<dir>/<job id>.json` holds `{"meta": …, "body": "<base64 of the sealed body>"}`,
//! replaced atomically ([`crate::store::atomic::write_private`], mode 0600); `<dir>/<job
//! id>.trace` is the job's masked trace, append-only (truncated back to the last saved offset
//! when longer), fsynced after each append; `<dir>/.lock` carries an exclusive `flock` held
//! for the store's lifetime, and the holder's pid. Heartbeats and ages are on the system clock.
//!
//! Every file system call runs in `tokio::task::spawn_blocking` (an atomic write fsyncs twice);
//! only [`JobStore::now`] and [`JobStore::describe`] do no I/O. Owns this layout; must not know
//! what a body means.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::os::unix::io::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::seal::StoreKey;
use super::{Entry, EntryMeta, JobStore, JobStoreError, Listed};

/// The name of the lock file in a store directory.
pub const LOCK_FILE: &str = ".lock";

/// A job store in a directory (see the module doc for the layout).
#[derive(Debug, Clone)]
pub struct FileStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    key: StoreKey,
    /// The locked `.lock` file (the lock lives as long as this handle); `None` when opened
    /// read-only.
    lock: Option<File>,
    /// Owners of the entries this store wrote or read, so `save` need not read the entry it
    /// replaces: the lock makes this process the only writer of the directory.
    owners: Mutex<HashMap<u64, String>>,
}

/// An entry file as stored.
#[derive(Serialize, Deserialize)]
struct EntryFile {
    meta: EntryMeta,
    /// Base64 (standard alphabet) of the sealed body.
    body: String,
}

/// An entry file read for its meta only (`list`): the body is skipped, not decoded.
#[derive(Deserialize)]
struct MetaOnly {
    meta: EntryMeta,
}

impl FileStore {
    /// Open (creating it, mode 0700) the store directory `dir` for a manager: takes the
    /// directory's lock, so a second open of the same directory, by this process or another,
    /// fails with [`JobStoreError::Locked`] until this store is dropped.
    pub fn open(dir: &Path, key: StoreKey) -> Result<FileStore, JobStoreError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| backend("creating the job store directory", dir, e))?;
        let lock_path = dir.join(LOCK_FILE);
        let mut lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|e| backend("opening", &lock_path, e))?;
        // SAFETY: flock on a descriptor this function owns; no memory is involved.
        let locked = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if locked != 0 {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut holder = String::new();
                let _ = lock.read_to_string(&mut holder);
                let holder = holder.trim().parse::<u32>().map(|pid| format!(" (pid {pid})")).unwrap_or_default();
                return Err(JobStoreError::Locked(format!(
                    "job store {} is in use by another manager{holder}: each manager needs its own [runners.store.file] path",
                    dir.display()
                )));
            }
            return Err(backend("locking", &lock_path, error));
        }
        let pid = format!("{}\n", std::process::id());
        lock.set_len(0)
            .and_then(|()| lock.seek(SeekFrom::Start(0)))
            .and_then(|_| lock.write_all(pid.as_bytes()))
            .map_err(|e| backend("writing", &lock_path, e))?;
        Ok(FileStore::new(dir, key, Some(lock)))
    }

    /// Open `dir` to read it while a manager may hold it (`runway store list|show`): no lock
    /// is taken and nothing is created; every write fails.
    pub fn open_read_only(dir: &Path, key: StoreKey) -> Result<FileStore, JobStoreError> {
        match std::fs::metadata(dir) {
            Ok(meta) if meta.is_dir() => Ok(FileStore::new(dir, key, None)),
            Ok(_) => Err(JobStoreError::Backend(format!("job store {} is not a directory", dir.display()))),
            Err(e) => Err(backend("opening the job store", dir, e)),
        }
    }

    fn new(dir: &Path, key: StoreKey, lock: Option<File>) -> FileStore {
        FileStore { inner: Arc::new(Inner { dir: dir.to_path_buf(), key, lock, owners: Mutex::new(HashMap::new()) }) }
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Run `f` on the blocking pool with the store's state.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T, JobStoreError> + Send + 'static,
    ) -> Result<T, JobStoreError> {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| JobStoreError::Backend(format!("job store task failed: {e}")))?
    }
}

/// Move an earlier version's store directory `old` (named by the runner's short token) to
/// `new`, when `new` does not exist yet: one rename within the same parent, so the entries
/// are in one place or the other, never split. A directory still locked by a running manager
/// (an older version) is left alone and the open fails as for any store in use.
pub fn migrate(old: &Path, new: &Path) -> Result<(), JobStoreError> {
    if new.exists() || !old.is_dir() {
        return Ok(());
    }
    let lock_path = old.join(LOCK_FILE);
    if let Ok(lock) = OpenOptions::new().read(true).write(true).open(&lock_path) {
        // SAFETY: flock on a descriptor this function owns; no memory is involved.
        let locked = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if locked != 0 {
            return Err(JobStoreError::Locked(format!(
                "job store {} is in use by another manager: stop it before this one moves the store to {}",
                old.display(),
                new.display()
            )));
        }
        // The lock goes with `lock` at the end of this block, before the rename.
    }
    if let Some(parent) = new.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|e| backend("creating the job store directory", parent, e))?;
    }
    std::fs::rename(old, new).map_err(|e| backend("moving the job store", old, e))?;
    tracing::info!(from = %old.display(), to = %new.display(), "moved the job store to the runner's token digest");
    Ok(())
}

fn backend(action: &str, path: &Path, error: std::io::Error) -> JobStoreError {
    JobStoreError::Backend(format!("{action} {}: {error}", path.display()))
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl Inner {
    fn entry_path(&self, job_id: u64) -> PathBuf {
        self.dir.join(format!("{job_id}.json"))
    }

    fn trace_path(&self, job_id: u64) -> PathBuf {
        self.dir.join(format!("{job_id}.trace"))
    }

    fn writable(&self) -> Result<(), JobStoreError> {
        match self.lock {
            Some(_) => Ok(()),
            None => Err(JobStoreError::Backend(format!("job store {} is open read-only", self.dir.display()))),
        }
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<u64, String>> {
        self.owners.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The entry file of `job_id`: `None` when absent, `Corrupt` when unreadable.
    fn read_entry(&self, job_id: u64) -> Result<Option<EntryFile>, JobStoreError> {
        let path = self.entry_path(job_id);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(backend("reading", &path, e)),
        };
        let entry: EntryFile = serde_json::from_slice(&bytes)
            .map_err(|e| JobStoreError::Corrupt { job_id, message: format!("{}: {e}", path.display()) })?;
        if entry.meta.job_id != job_id {
            return Err(JobStoreError::Corrupt {
                job_id,
                message: format!("{}: holds job {}", path.display(), entry.meta.job_id),
            });
        }
        Ok(Some(entry))
    }

    fn write_entry(&self, meta: &EntryMeta, sealed: &[u8]) -> Result<(), JobStoreError> {
        let path = self.entry_path(meta.job_id);
        let file = EntryFile { meta: meta.clone(), body: base64::engine::general_purpose::STANDARD.encode(sealed) };
        let bytes = serde_json::to_vec(&file)
            .map_err(|e| JobStoreError::Backend(format!("encoding {}: {e}", path.display())))?;
        crate::store::atomic::write_private(&path, &bytes).map_err(|e| JobStoreError::Backend(e.to_string()))?;
        self.owners().insert(meta.job_id, meta.owner.clone());
        Ok(())
    }

    fn save(&self, entry: &Entry) -> Result<(), JobStoreError> {
        self.writable()?;
        let job_id = entry.meta.job_id;
        let known = self.owners().get(&job_id).cloned();
        let current = match known {
            Some(owner) => Some(owner),
            None => match self.read_entry(job_id) {
                Ok(stored) => stored.map(|e| e.meta.owner),
                // A corrupt entry is replaced: the caller's entry is the one that is right.
                Err(JobStoreError::Corrupt { .. }) => None,
                Err(e) => return Err(e),
            },
        };
        if current.is_some_and(|owner| owner != entry.meta.owner) {
            return Err(JobStoreError::Lost(job_id));
        }
        let mut meta = entry.meta.clone();
        meta.heartbeat = unix_now();
        let sealed = self.key.seal(job_id, &entry.body);
        self.write_entry(&meta, &sealed)
    }

    fn append_trace(&self, job_id: u64, offset: u64, bytes: &[u8]) -> Result<(), JobStoreError> {
        self.writable()?;
        let path = self.trace_path(job_id);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| backend("opening", &path, e))?;
        let len = file.metadata().map_err(|e| backend("reading the size of", &path, e))?.len();
        if len < offset {
            return Err(JobStoreError::Corrupt {
                job_id,
                message: format!("{}: the trace has {len} bytes, {offset} were stored", path.display()),
            });
        }
        if len > offset {
            file.set_len(offset).map_err(|e| backend("truncating", &path, e))?;
        }
        file.seek(SeekFrom::Start(offset))
            .and_then(|_| file.write_all(bytes))
            .and_then(|()| file.sync_data())
            .map_err(|e| backend("appending to", &path, e))
    }

    fn read_trace(&self, job_id: u64, len: u64) -> Result<Vec<u8>, JobStoreError> {
        let path = self.trace_path(job_id);
        let short = |have: u64| JobStoreError::Corrupt {
            job_id,
            message: format!("{}: the trace has {have} bytes, {len} were stored", path.display()),
        };
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && len == 0 => return Ok(Vec::new()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(short(0)),
            Err(e) => return Err(backend("opening", &path, e)),
        };
        let have = file.metadata().map_err(|e| backend("reading the size of", &path, e))?.len();
        if have < len {
            return Err(short(have));
        }
        let mut out = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
        file.take(len).read_to_end(&mut out).map_err(|e| backend("reading", &path, e))?;
        if (out.len() as u64) < len {
            return Err(short(out.len() as u64));
        }
        Ok(out)
    }

    fn list(&self) -> Result<Vec<Listed>, JobStoreError> {
        let read = std::fs::read_dir(&self.dir).map_err(|e| backend("listing", &self.dir, e))?;
        let mut out = Vec::new();
        for item in read {
            let item = item.map_err(|e| backend("listing", &self.dir, e))?;
            let name = item.file_name();
            let Some(name) = name.to_str() else { continue };
            // `.lock`, and the temporary files of atomic writes (`.tmpXXXX`).
            if name.starts_with('.') {
                continue;
            }
            let Some(stem) = name.strip_suffix(".json") else { continue };
            let path = item.path();
            let job_id = stem.parse::<u64>().ok();
            let corrupt = |error: String| Listed::Corrupt { job_id, location: path.display().to_string(), error };
            let Some(id) = job_id else {
                out.push(corrupt("not an entry name (<job id>.json)".into()));
                continue;
            };
            let parsed = std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|bytes| serde_json::from_slice::<MetaOnly>(&bytes).map_err(|e| e.to_string()));
            match parsed {
                Ok(entry) if entry.meta.job_id == id => out.push(Listed::Entry(entry.meta)),
                Ok(entry) => out.push(corrupt(format!("holds job {}", entry.meta.job_id))),
                // Removed between the listing and the read: no longer an entry at all.
                Err(_) if !path.exists() => {}
                Err(error) => out.push(corrupt(error)),
            }
        }
        Ok(out)
    }

    fn claim(&self, job_id: u64, owner: &str, health_timeout: Duration) -> Result<Option<Entry>, JobStoreError> {
        self.writable()?;
        let Some(stored) = self.read_entry(job_id)? else { return Ok(None) };
        let now = unix_now();
        let age = now.saturating_sub(stored.meta.heartbeat);
        if stored.meta.owner != owner && age <= health_timeout.as_secs() {
            return Ok(None);
        }
        let sealed = base64::engine::general_purpose::STANDARD
            .decode(stored.body.as_bytes())
            .map_err(|e| JobStoreError::Corrupt { job_id, message: format!("body is not base64: {e}") })?;
        // Unsealed before the entry changes: a corrupt entry is left as it was.
        let body = self.key.open(job_id, &sealed)?;
        let mut meta = stored.meta;
        meta.owner = owner.to_string();
        meta.heartbeat = now;
        meta.resumes = meta.resumes.saturating_add(1);
        self.write_entry(&meta, &sealed)?;
        Ok(Some(Entry { meta, body }))
    }

    fn remove(&self, job_id: u64) -> Result<(), JobStoreError> {
        self.writable()?;
        // The trace first: a crash in between leaves an entry without its trace, which reads
        // as corrupt and is removed again, never a trace nobody lists.
        for path in [self.trace_path(job_id), self.entry_path(job_id)] {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(backend("removing", &path, e)),
            }
        }
        self.owners().remove(&job_id);
        File::open(&self.dir).and_then(|d| d.sync_all()).map_err(|e| backend("syncing", &self.dir, e))
    }
}

#[async_trait]
impl JobStore for FileStore {
    fn describe(&self) -> String {
        format!("file {}", self.inner.dir.display())
    }

    async fn save(&self, entry: &Entry) -> Result<(), JobStoreError> {
        let entry = entry.clone();
        self.blocking(move |inner| inner.save(&entry)).await
    }

    async fn append_trace(&self, job_id: u64, offset: u64, bytes: &[u8]) -> Result<(), JobStoreError> {
        let bytes = bytes.to_vec();
        self.blocking(move |inner| inner.append_trace(job_id, offset, &bytes)).await
    }

    async fn read_trace(&self, job_id: u64, len: u64) -> Result<Vec<u8>, JobStoreError> {
        self.blocking(move |inner| inner.read_trace(job_id, len)).await
    }

    async fn list(&self) -> Result<Vec<Listed>, JobStoreError> {
        self.blocking(Inner::list).await
    }

    async fn claim(&self, job_id: u64, owner: &str, health_timeout: Duration) -> Result<Option<Entry>, JobStoreError> {
        let owner = owner.to_string();
        self.blocking(move |inner| inner.claim(job_id, &owner, health_timeout)).await
    }

    async fn remove(&self, job_id: u64) -> Result<(), JobStoreError> {
        self.blocking(move |inner| inner.remove(job_id)).await
    }

    async fn now(&self) -> Result<u64, JobStoreError> {
        Ok(unix_now())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn key() -> StoreKey {
        StoreKey::from_bytes([7; 32])
    }

    #[tokio::test]
    async fn an_earlier_versions_store_is_moved_whole_unless_in_use() {
        let root = tempfile::tempdir().unwrap();
        let (old, new) = (root.path().join("abcdefghi"), root.path().join("0123456789abcdef"));
        {
            let store = FileStore::open(&old, key()).unwrap();
            store.save(&entry(7, "m1", b"kept")).await.unwrap();
            // While a manager holds the old directory, nothing moves.
            let err = migrate(&old, &new).unwrap_err();
            assert!(matches!(err, JobStoreError::Locked(_)), "{err}");
            assert!(old.is_dir() && !new.exists());
        }
        migrate(&old, &new).unwrap();
        assert!(!old.exists());
        let store = FileStore::open(&new, key()).unwrap();
        let claimed = store.claim(7, "m1", Duration::from_secs(30)).await.unwrap().unwrap();
        assert_eq!(claimed.body, b"kept");
        // Once moved (or when the new one exists), a later start changes nothing.
        std::fs::create_dir_all(&old).unwrap();
        migrate(&old, &new).unwrap();
        assert!(old.is_dir() && new.is_dir());
    }

    fn entry(job_id: u64, owner: &str, body: &[u8]) -> Entry {
        Entry {
            meta: EntryMeta {
                job_id,
                owner: owner.into(),
                created: 1,
                heartbeat: 0,
                resumes: 0,
                stage: "build_script".into(),
                project: "group/project".into(),
            },
            body: body.to_vec(),
        }
    }

    #[test]
    fn a_second_open_is_locked_and_names_the_holder() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("store");
        let first = FileStore::open(&path, key()).expect("first");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let err = FileStore::open(&path, key()).expect_err("locked");
        let JobStoreError::Locked(message) = &err else { panic!("{err:?}") };
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains(&format!("pid {}", std::process::id())), "{message}");
        drop(first);
        FileStore::open(&path, key()).expect("free again once the first is dropped");
    }

    #[tokio::test]
    async fn read_only_opens_beside_the_holder_and_never_writes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = FileStore::open(dir.path(), key()).expect("open");
        store.save(&entry(5, "m1", b"body")).await.expect("save");
        let reader = FileStore::open_read_only(dir.path(), key()).expect("read-only beside the holder");
        let listed = reader.list().await.expect("list");
        assert!(matches!(listed.as_slice(), [Listed::Entry(m)] if m.job_id == 5 && m.owner == "m1"), "{listed:?}");
        let err = reader.remove(5).await.expect_err("read-only");
        assert!(err.to_string().contains("read-only"), "{err}");
        assert!(reader.claim(5, "m1", Duration::from_secs(30)).await.is_err());
        assert!(FileStore::open_read_only(&dir.path().join("absent"), key()).is_err());
    }

    #[tokio::test]
    async fn list_skips_temporary_and_lock_files_and_reports_unreadable_entries() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = FileStore::open(dir.path(), key()).expect("open");
        store.save(&entry(1, "m1", b"one")).await.expect("save");
        std::fs::write(dir.path().join(".tmpAbC123"), b"half a write").expect("temp");
        std::fs::write(dir.path().join("1.trace"), b"trace bytes").expect("trace");
        std::fs::write(dir.path().join("2.json"), b"{ not json").expect("corrupt");
        std::fs::write(
            dir.path().join("3.json"),
            serde_json::to_vec(&EntryFile { meta: entry(4, "m1", b"").meta, body: String::new() }).expect("json"),
        )
        .expect("moved");
        std::fs::write(dir.path().join("notes.json"), b"{}").expect("stray");
        let mut listed = store.list().await.expect("list");
        listed.sort_by_key(|l| match l {
            Listed::Entry(m) => Some(m.job_id),
            Listed::Corrupt { job_id, .. } => *job_id,
        });
        assert_eq!(listed.len(), 4, "{listed:?}");
        assert!(
            matches!(&listed[0], Listed::Corrupt { job_id: None, location, .. } if location.ends_with("notes.json"))
        );
        assert!(matches!(&listed[1], Listed::Entry(m) if m.job_id == 1));
        assert!(matches!(&listed[2], Listed::Corrupt { job_id: Some(2), .. }), "{:?}", listed[2]);
        assert!(matches!(&listed[3], Listed::Corrupt { job_id: Some(3), error, .. } if error.contains("job 4")));
        // A corrupt entry is claimed as an error, saved over, and removed.
        let err = store.claim(2, "m1", Duration::from_secs(30)).await.expect_err("corrupt");
        assert!(matches!(err, JobStoreError::Corrupt { job_id: 2, .. }), "{err:?}");
        store.remove(3).await.expect("remove");
        store.save(&entry(2, "m1", b"two")).await.expect("a corrupt entry is replaced");
        assert!(store.claim(2, "m1", Duration::ZERO).await.expect("claim").is_some());
    }

    #[tokio::test]
    async fn files_are_private_and_hold_no_body_in_clear() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = FileStore::open(dir.path(), key()).expect("open");
        store.save(&entry(9, "m1", b"password=hunter2")).await.expect("save");
        store.append_trace(9, 0, b"masked [MASKED]\n").await.expect("trace");
        for name in ["9.json", "9.trace"] {
            let path = dir.path().join(name);
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{name}");
            let bytes = std::fs::read(&path).expect("read");
            assert!(!bytes.windows(7).any(|w| w == b"hunter2"), "{name} holds the secret");
        }
    }

    #[tokio::test]
    async fn a_trace_shorter_than_the_saved_offset_is_corrupt() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = FileStore::open(dir.path(), key()).expect("open");
        store.append_trace(1, 0, b"abc").await.expect("append");
        let err = store.append_trace(1, 5, b"x").await.expect_err("short");
        assert!(matches!(err, JobStoreError::Corrupt { job_id: 1, .. }), "{err:?}");
        assert!(store.read_trace(1, 4).await.is_err());
        assert_eq!(store.read_trace(1, 2).await.expect("prefix"), b"ab");
        assert_eq!(store.read_trace(2, 0).await.expect("no trace, nothing stored"), b"");
        assert!(store.read_trace(2, 1).await.is_err());
    }
}
