//! The file job store: one directory per runner, one manager per directory.
//!
//! Layout: `<dir>/<job id>.json` holds `{"meta": …, "body": "<base64 of the sealed body>"}`,
//! replaced atomically ([`crate::store::atomic::write_private`], mode 0600); `<dir>/<job
//! id>.trace` is the job's masked trace (mode 0600); `<dir>/journal` (mode 0600) holds the
//! writes not yet in those files ([`super::journal`]); `<dir>/.lock` carries an exclusive
//! `flock` held for the store's lifetime, and the holder's pid. Heartbeats and ages are on the
//! system clock.
//!
//! Writes (save, trace bytes, remove) go to the journal through one committer thread, which
//! takes every write queued while its last sync ran and makes them durable with one
//! `fdatasync` (group commit): a write returns once it is on disk, and sixteen jobs saving at
//! once cost one sync, not sixteen times three. When the journal passes [`COMPACT_AT`], after
//! two seconds without a write, at open (after a crash) and when the store is dropped, the
//! files are brought up to date and the journal starts over. Reads see the files with the journal over them.
//!
//! Every other file system call runs in `tokio::task::spawn_blocking`; only
//! [`JobStore::now`] and [`JobStore::describe`] do no I/O. Owns this layout and the committer;
//! must not know what a body means.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::os::unix::io::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::journal::{self, Overlay, Record};
use super::seal::StoreKey;
use super::{Entry, EntryMeta, JobStore, JobStoreError, Listed};

/// The name of the lock file in a store directory.
pub const LOCK_FILE: &str = ".lock";

/// The journal's size past which the committer brings the files up to date and starts the
/// journal over (it also bounds the memory the pending writes take).
pub const COMPACT_AT: u64 = 16 << 20;

/// After this long without a write the committer brings the files up to date (so a quiet
/// store's directory says what it holds).
const IDLE_COMPACT: Duration = Duration::from_secs(2);

/// Writes the committer takes at most in one sync.
const MAX_BATCH: usize = 1024;

/// A job store in a directory (see the module doc for the layout).
#[derive(Debug, Clone)]
pub struct FileStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    /// The committer of a writable store (`None` read-only).
    committer: Option<Committer>,
}

/// What the committer thread and the callers share.
#[derive(Debug)]
struct Shared {
    dir: PathBuf,
    key: StoreKey,
    /// The locked `.lock` file (the lock lives as long as this handle); `None` when opened
    /// read-only.
    lock: Option<File>,
    /// The journal and what it says; `None` read-only (readers read the journal each time).
    state: Option<Mutex<State>>,
}

/// A writable store's journal and its overlay.
#[derive(Debug)]
struct State {
    journal: File,
    /// The journal's length.
    len: u64,
    /// What the journal says over the files.
    overlay: Overlay,
    /// Owners of the entries in the files this store wrote or read, so `save` need not read
    /// the entry it replaces: the lock makes this process the only writer of the directory.
    owners: HashMap<u64, String>,
}

/// One write a caller waits for.
#[derive(Debug)]
enum Write {
    /// The entry (meta with its heartbeat, sealed body), refused as `Lost` when another
    /// manager owns the entry.
    Save(EntryMeta, Vec<u8>),
    /// Trace bytes at `offset`; the trace must have at least `offset` bytes.
    Trace { job_id: u64, offset: u64, bytes: Vec<u8> },
    /// The entry and trace go.
    Remove(u64),
    /// The entry taken over by `meta.owner` ([`JobStore::claim`] checked the lease).
    Claim(EntryMeta, Vec<u8>),
}

/// Writes that succeed or fail together, and who waits for them.
#[derive(Debug)]
struct Op {
    writes: Vec<Write>,
    reply: tokio::sync::oneshot::Sender<Result<(), JobStoreError>>,
}

/// The committer thread: stops (bringing the files up to date) when dropped.
#[derive(Debug)]
struct Committer {
    queue: Option<mpsc::Sender<Op>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Committer {
    fn drop(&mut self) {
        self.queue.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
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
    /// fails with [`JobStoreError::Locked`] until this store is dropped. A journal a crash
    /// left is brought into the files first.
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
        let (journal, records, len) = journal::open(dir)?;
        let mut state = State { journal, len, overlay: Overlay::of(records), owners: HashMap::new() };
        state.compact(dir)?;
        let shared = Arc::new(Shared { dir: dir.to_path_buf(), key, lock: Some(lock), state: Some(Mutex::new(state)) });
        let (queue, ops) = mpsc::channel();
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("runway-store".into())
                .spawn(move || commit_loop(&shared, &ops))
                .map_err(|e| JobStoreError::Backend(format!("starting the job store's committer: {e}")))?
        };
        let committer = Committer { queue: Some(queue), thread: Some(thread) };
        Ok(FileStore { inner: Arc::new(Inner { shared, committer: Some(committer) }) })
    }

    /// Open `dir` to read it while a manager may hold it (`runway store list|show`): no lock
    /// is taken and nothing is created; every write fails.
    pub fn open_read_only(dir: &Path, key: StoreKey) -> Result<FileStore, JobStoreError> {
        match std::fs::metadata(dir) {
            Ok(meta) if meta.is_dir() => Ok(FileStore {
                inner: Arc::new(Inner {
                    shared: Arc::new(Shared { dir: dir.to_path_buf(), key, lock: None, state: None }),
                    committer: None,
                }),
            }),
            Ok(_) => Err(JobStoreError::Backend(format!("job store {} is not a directory", dir.display()))),
            Err(e) => Err(backend("opening the job store", dir, e)),
        }
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.inner.shared.dir
    }

    /// Run `f` on the blocking pool with the store's state.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Shared) -> Result<T, JobStoreError> + Send + 'static,
    ) -> Result<T, JobStoreError> {
        let shared = Arc::clone(&self.inner.shared);
        tokio::task::spawn_blocking(move || f(&shared))
            .await
            .map_err(|e| JobStoreError::Backend(format!("job store task failed: {e}")))?
    }

    /// Hand `writes` to the committer and wait until they are on disk (or refused).
    async fn commit(&self, writes: Vec<Write>) -> Result<(), JobStoreError> {
        let read_only = || JobStoreError::Backend(format!("job store {} is open read-only", self.dir().display()));
        let queue = self.inner.committer.as_ref().and_then(|c| c.queue.as_ref()).ok_or_else(read_only)?;
        let (reply, done) = tokio::sync::oneshot::channel();
        let stopped = || JobStoreError::Backend(format!("job store {}: the committer stopped", self.dir().display()));
        queue.send(Op { writes, reply }).map_err(|_| stopped())?;
        done.await.map_err(|_| stopped())?
    }

    fn sealed_save(&self, entry: &Entry) -> Write {
        let mut meta = entry.meta.clone();
        meta.heartbeat = unix_now();
        let sealed = self.inner.shared.key.seal(meta.job_id, &entry.body);
        Write::Save(meta, sealed)
    }
}

/// The committer: takes the writes queued, appends them to the journal with one sync, answers
/// every caller, and compacts when the journal is long. Ends when every sender is gone, with
/// the files brought up to date.
fn commit_loop(shared: &Shared, ops: &mpsc::Receiver<Op>) {
    let Some(state) = &shared.state else { return };
    loop {
        let first = match ops.recv_timeout(IDLE_COMPACT) {
            Ok(op) => op,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let mut state = state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Err(e) = state.compact(&shared.dir) {
                    tracing::warn!(store = %shared.dir.display(), "bringing the job store's files up to date failed (the journal keeps the writes): {e}");
                }
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match ops.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        let mut state = state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (replies, writes): (Vec<_>, Vec<_>) = batch.into_iter().map(|op| (op.reply, op.writes)).unzip();
        let results = state.commit(&shared.dir, writes);
        for (reply, result) in replies.into_iter().zip(results) {
            let _ = reply.send(result);
        }
        if state.len > COMPACT_AT {
            if let Err(e) = state.compact(&shared.dir) {
                tracing::warn!(store = %shared.dir.display(), "bringing the job store's files up to date failed (the journal keeps the writes): {e}");
            }
        }
    }
    let mut state = state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Err(e) = state.compact(&shared.dir) {
        tracing::warn!(store = %shared.dir.display(), "bringing the job store's files up to date failed (the journal keeps the writes): {e}");
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

fn entry_path(dir: &Path, job_id: u64) -> PathBuf {
    dir.join(format!("{job_id}.json"))
}

fn trace_path(dir: &Path, job_id: u64) -> PathBuf {
    dir.join(format!("{job_id}.trace"))
}

/// The entry file of `job_id`: `None` when absent, `Corrupt` when unreadable.
fn read_entry(dir: &Path, job_id: u64) -> Result<Option<EntryFile>, JobStoreError> {
    let path = entry_path(dir, job_id);
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

/// The entry of `job_id` as the files with the journal over them say: meta and sealed body.
fn current_entry(dir: &Path, overlay: &Overlay, job_id: u64) -> Result<Option<(EntryMeta, Vec<u8>)>, JobStoreError> {
    match overlay.get(job_id) {
        Some(pending) if pending.entry.is_some() => Ok(pending.entry.clone()),
        Some(pending) if pending.removed => Ok(None),
        _ => {
            let Some(stored) = read_entry(dir, job_id)? else { return Ok(None) };
            let sealed = base64::engine::general_purpose::STANDARD
                .decode(stored.body.as_bytes())
                .map_err(|e| JobStoreError::Corrupt { job_id, message: format!("body is not base64: {e}") })?;
            Ok(Some((stored.meta, sealed)))
        }
    }
}

/// The length of `job_id`'s trace file (0 when absent).
fn trace_file_len(dir: &Path, job_id: u64) -> Result<u64, JobStoreError> {
    let path = trace_path(dir, job_id);
    match std::fs::metadata(&path) {
        Ok(meta) => Ok(meta.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(backend("reading the size of", &path, e)),
    }
}

/// The first `len` bytes of `job_id`'s trace file; `have` is how many it has when fewer.
fn read_trace_file(dir: &Path, job_id: u64, len: u64) -> Result<Result<Vec<u8>, u64>, JobStoreError> {
    let path = trace_path(dir, job_id);
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(if len == 0 { Ok(Vec::new()) } else { Err(0) })
        }
        Err(e) => return Err(backend("opening", &path, e)),
    };
    let have = file.metadata().map_err(|e| backend("reading the size of", &path, e))?.len();
    if have < len {
        return Ok(Err(have));
    }
    let mut out = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(len).read_to_end(&mut out).map_err(|e| backend("reading", &path, e))?;
    if (out.len() as u64) < len {
        return Ok(Err(out.len() as u64));
    }
    Ok(Ok(out))
}

/// The first `len` bytes of `job_id`'s trace as the files with the journal over them say.
fn read_trace(dir: &Path, overlay: &Overlay, job_id: u64, len: u64) -> Result<Vec<u8>, JobStoreError> {
    let short = |have: u64| JobStoreError::Corrupt {
        job_id,
        message: format!("{}: the trace has {have} bytes, {len} were stored", trace_path(dir, job_id).display()),
    };
    let pending = overlay.get(job_id);
    let Some((start, tail)) = pending.and_then(|p| p.trace.as_ref()) else {
        if pending.is_some_and(|p| p.removed) {
            return if len == 0 { Ok(Vec::new()) } else { Err(short(0)) };
        }
        return read_trace_file(dir, job_id, len)?.map_err(short);
    };
    let have = start + tail.len() as u64;
    if have < len {
        return Err(short(have));
    }
    let from_file = (*start).min(len);
    let mut out = if pending.is_some_and(|p| p.removed) {
        Vec::new()
    } else {
        read_trace_file(dir, job_id, from_file)?.map_err(short)?
    };
    if (out.len() as u64) < from_file {
        return Err(short(out.len() as u64));
    }
    let from_tail = usize::try_from(len - from_file).unwrap_or(usize::MAX).min(tail.len());
    out.extend_from_slice(&tail[..from_tail]);
    Ok(out)
}

/// Every entry the files with the journal over them hold.
fn list(dir: &Path, overlay: &Overlay) -> Result<Vec<Listed>, JobStoreError> {
    let read = std::fs::read_dir(dir).map_err(|e| backend("listing", dir, e))?;
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for item in read {
        let item = item.map_err(|e| backend("listing", dir, e))?;
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
        if let Some(pending) = overlay.get(id) {
            if pending.entry.is_some() || pending.removed {
                // The journal's entry, listed below; or removed.
                continue;
            }
        }
        seen.insert(id);
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
    for (id, pending) in overlay.iter() {
        if let Some((meta, _)) = &pending.entry {
            if !seen.contains(id) {
                out.push(Listed::Entry(meta.clone()));
            }
        }
    }
    Ok(out)
}

impl Shared {
    fn writable(&self) -> Result<std::sync::MutexGuard<'_, State>, JobStoreError> {
        match (&self.lock, &self.state) {
            (Some(_), Some(state)) => Ok(state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)),
            _ => Err(JobStoreError::Backend(format!("job store {} is open read-only", self.dir.display()))),
        }
    }

    /// Run `f` on the files with the journal over them.
    fn view<T>(&self, f: impl FnOnce(&Overlay) -> Result<T, JobStoreError>) -> Result<T, JobStoreError> {
        match &self.state {
            Some(state) => f(&state.lock().unwrap_or_else(std::sync::PoisonError::into_inner).overlay),
            None => f(&Overlay::of(journal::read(&self.dir)?)),
        }
    }

    fn claim(&self, job_id: u64, owner: &str, health_timeout: Duration) -> Result<Option<Entry>, JobStoreError> {
        let mut state = self.writable()?;
        let Some((stored, sealed)) = current_entry(&self.dir, &state.overlay, job_id)? else { return Ok(None) };
        let now = unix_now();
        let age = now.saturating_sub(stored.heartbeat);
        if stored.owner != owner && age <= health_timeout.as_secs() {
            return Ok(None);
        }
        // Unsealed before the entry changes: a corrupt entry is left as it was.
        let body = self.key.open(job_id, &sealed)?;
        let mut meta = stored;
        meta.owner = owner.to_string();
        meta.heartbeat = now;
        meta.resumes = meta.resumes.saturating_add(1);
        let result = state.commit(&self.dir, vec![vec![Write::Claim(meta.clone(), sealed)]]);
        result.into_iter().next().unwrap_or(Ok(()))?;
        Ok(Some(Entry { meta, body }))
    }
}

impl State {
    /// Check each op's writes against what the store holds, append the records of those that
    /// pass to the journal with one sync, and fold them in: one result per op, in order.
    fn commit(&mut self, dir: &Path, ops: Vec<Vec<Write>>) -> Vec<Result<(), JobStoreError>> {
        let mut bytes = Vec::new();
        let mut results = Vec::with_capacity(ops.len());
        let mut accepted = Vec::new();
        for writes in ops {
            let records = writes.into_iter().map(|w| self.check(dir, w)).collect::<Result<Vec<_>, _>>();
            let encoded = records.and_then(|records| {
                let mut op_bytes = Vec::new();
                for record in &records {
                    record.encode(&mut op_bytes)?;
                }
                Ok((records, op_bytes))
            });
            match encoded {
                Ok((records, op_bytes)) => {
                    bytes.extend_from_slice(&op_bytes);
                    // Folded now, so the next op of the batch is checked against it.
                    for record in &records {
                        self.overlay.apply(record.clone());
                    }
                    accepted.push(results.len());
                    results.push(Ok(()));
                    for record in records {
                        match record {
                            Record::Save { meta, .. } => {
                                self.owners.insert(meta.job_id, meta.owner);
                            }
                            Record::Remove { job_id } => {
                                self.owners.remove(&job_id);
                            }
                            Record::Trace { .. } => {}
                        }
                    }
                }
                Err(e) => results.push(Err(e)),
            }
        }
        if bytes.is_empty() {
            return results;
        }
        let path = dir.join(journal::JOURNAL_FILE);
        let written = self.journal.write_all(&bytes).and_then(|()| self.journal.sync_data());
        match written {
            Ok(()) => self.len += bytes.len() as u64,
            Err(e) => {
                let message = format!("writing {}: {e}", path.display());
                // Back to what is on disk: the journal as it was before this batch.
                if let Err(reload) = self.reload(dir) {
                    tracing::error!(store = %dir.display(), "the job store's journal could not be read back after a failed write: {reload}");
                }
                for at in accepted {
                    results[at] = Err(JobStoreError::Backend(message.clone()));
                }
            }
        }
        results
    }

    /// The record of `write` when the store allows it.
    fn check(&mut self, dir: &Path, write: Write) -> Result<Record, JobStoreError> {
        match write {
            Write::Save(meta, sealed) => {
                let job_id = meta.job_id;
                let current = match self.overlay.get(job_id) {
                    Some(pending) if pending.entry.is_some() => pending.entry.as_ref().map(|(m, _)| m.owner.clone()),
                    Some(pending) if pending.removed => None,
                    _ => match self.owners.get(&job_id) {
                        Some(owner) => Some(owner.clone()),
                        None => match read_entry(dir, job_id) {
                            Ok(stored) => stored.map(|e| e.meta.owner),
                            // A corrupt entry is replaced: the caller's entry is the one that is right.
                            Err(JobStoreError::Corrupt { .. }) => None,
                            Err(e) => return Err(e),
                        },
                    },
                };
                if current.is_some_and(|owner| owner != meta.owner) {
                    return Err(JobStoreError::Lost(job_id));
                }
                Ok(Record::Save { meta, sealed })
            }
            Write::Trace { job_id, offset, bytes } => {
                let len = match self.overlay.get(job_id).and_then(journal::Pending::trace_len) {
                    Some(len) => len,
                    None => trace_file_len(dir, job_id)?,
                };
                if len < offset {
                    return Err(JobStoreError::Corrupt {
                        job_id,
                        message: format!(
                            "{}: the trace has {len} bytes, {offset} were stored",
                            trace_path(dir, job_id).display()
                        ),
                    });
                }
                Ok(Record::Trace { job_id, offset, bytes })
            }
            Write::Remove(job_id) => Ok(Record::Remove { job_id }),
            Write::Claim(meta, sealed) => Ok(Record::Save { meta, sealed }),
        }
    }

    /// Read the journal back from disk after a failed write (its end cut to the last whole
    /// record).
    fn reload(&mut self, dir: &Path) -> Result<(), JobStoreError> {
        let (journal, records, len) = journal::open(dir)?;
        self.journal = journal;
        self.len = len;
        self.overlay = Overlay::of(records);
        self.owners.clear();
        Ok(())
    }

    /// Bring the files up to date with the journal, then start the journal over.
    fn compact(&mut self, dir: &Path) -> Result<(), JobStoreError> {
        if self.overlay.is_empty() {
            return Ok(());
        }
        for (&job_id, pending) in self.overlay.iter() {
            if pending.removed {
                // The trace first: a crash in between leaves an entry without its trace, which
                // reads as corrupt and is removed again, never a trace nobody lists.
                for path in [trace_path(dir, job_id), entry_path(dir, job_id)] {
                    match std::fs::remove_file(&path) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(backend("removing", &path, e)),
                    }
                }
            }
            if let Some((start, bytes)) = &pending.trace {
                match journal::write_trace(&trace_path(dir, job_id), job_id, *start, bytes) {
                    Ok(()) => {}
                    Err(e @ JobStoreError::Corrupt { .. }) => {
                        tracing::warn!(
                            job = job_id,
                            "the job store's trace is shorter than the journal's bytes need; left as it was: {e}"
                        )
                    }
                    Err(e) => return Err(e),
                }
            }
            if let Some((meta, sealed)) = &pending.entry {
                let path = entry_path(dir, job_id);
                let file =
                    EntryFile { meta: meta.clone(), body: base64::engine::general_purpose::STANDARD.encode(sealed) };
                let bytes = serde_json::to_vec(&file)
                    .map_err(|e| JobStoreError::Backend(format!("encoding {}: {e}", path.display())))?;
                crate::store::atomic::write_private(&path, &bytes)
                    .map_err(|e| JobStoreError::Backend(e.to_string()))?;
                self.owners.insert(job_id, meta.owner.clone());
            }
        }
        File::open(dir).and_then(|d| d.sync_all()).map_err(|e| backend("syncing", dir, e))?;
        let path = dir.join(journal::JOURNAL_FILE);
        let start = journal::MAGIC.len() as u64;
        self.journal
            .set_len(start)
            .and_then(|()| self.journal.sync_all())
            .and_then(|()| self.journal.seek(SeekFrom::Start(start)).map(drop))
            .map_err(|e| backend("starting over", &path, e))?;
        self.len = start;
        self.overlay.clear();
        Ok(())
    }
}

#[async_trait]
impl JobStore for FileStore {
    fn describe(&self) -> String {
        format!("file {}", self.dir().display())
    }

    async fn save(&self, entry: &Entry) -> Result<(), JobStoreError> {
        self.commit(vec![self.sealed_save(entry)]).await
    }

    async fn append_trace(&self, job_id: u64, offset: u64, bytes: &[u8]) -> Result<(), JobStoreError> {
        self.commit(vec![Write::Trace { job_id, offset, bytes: bytes.to_vec() }]).await
    }

    async fn save_with_trace(&self, entry: &Entry, offset: u64, bytes: &[u8]) -> Result<(), JobStoreError> {
        let trace = Write::Trace { job_id: entry.meta.job_id, offset, bytes: bytes.to_vec() };
        self.commit(vec![trace, self.sealed_save(entry)]).await
    }

    async fn read_trace(&self, job_id: u64, len: u64) -> Result<Vec<u8>, JobStoreError> {
        self.blocking(move |shared| shared.view(|overlay| read_trace(&shared.dir, overlay, job_id, len))).await
    }

    async fn list(&self) -> Result<Vec<Listed>, JobStoreError> {
        self.blocking(|shared| shared.view(|overlay| list(&shared.dir, overlay))).await
    }

    async fn claim(&self, job_id: u64, owner: &str, health_timeout: Duration) -> Result<Option<Entry>, JobStoreError> {
        let owner = owner.to_string();
        self.blocking(move |shared| shared.claim(job_id, &owner, health_timeout)).await
    }

    async fn remove(&self, job_id: u64) -> Result<(), JobStoreError> {
        self.commit(vec![Write::Remove(job_id)]).await
    }

    async fn now(&self) -> Result<u64, JobStoreError> {
        Ok(unix_now())
    }
}

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
