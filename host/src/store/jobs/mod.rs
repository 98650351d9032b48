//! The job store (seed 003): what a manager keeps about each running job so that another run
//! of it — or, with Redis, another manager — can resume the job after a crash.
//!
//! One trait, [`JobStore`], two backends: [`file`] (one directory per runner, an exclusive
//! lock so two managers never share it) and [`redis`] (one namespace per runner, a lease per
//! job taken with compare-and-set). Entries are an [`EntryMeta`] in clear (job id, owner,
//! heartbeat, resumes — nothing secret) and a body sealed with [`seal::StoreKey`] (AEAD): the
//! store never holds the body, or anything else a job's secrets could be in, in clear. The
//! job's trace (already masked) is kept beside the entry as an append-only byte stream, so a
//! heartbeat writes only what is new.
//!
//! Owns: the store contract, its backends, sealing, and the `[runners.store]` settings as the
//! store needs them ([`StoreSettings`]). Must not touch: anything of the crate (the store is a
//! leaf): what a body means — payload, progress, trace state — is the caller's (`manager`).

pub mod file;
pub mod journal;
pub mod redis;
pub mod seal;

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// What anyone may read of an entry without the key: no secrets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryMeta {
    /// GitLab's job id.
    pub job_id: u64,
    /// The `system_id` of the manager that owns (runs) the job.
    pub owner: String,
    /// When the job was first stored, unix seconds.
    pub created: u64,
    /// The owner's last heartbeat, unix seconds (the store's clock for Redis).
    pub heartbeat: u64,
    /// How many times the job was resumed so far.
    pub resumes: u32,
    /// The stage running or next, for operators (`runway store list`).
    pub stage: String,
    /// `group/project` of the job, for operators.
    pub project: String,
}

/// One stored job: its meta and its body in clear (sealing happens inside the store).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The unsealed part.
    pub meta: EntryMeta,
    /// The caller's bytes (payload, progress, executor state...), sealed at rest.
    pub body: Vec<u8>,
}

/// An entry that could be listed.
#[derive(Debug)]
pub enum Listed {
    /// A readable entry's meta (the body is read by [`JobStore::claim`]).
    Entry(EntryMeta),
    /// Something in the store that is not a readable entry: the job id when it could be told,
    /// where it is, and why it is unreadable. [`JobStore::remove`] deletes it.
    Corrupt {
        /// The job id, when the entry's name or meta says it.
        job_id: Option<u64>,
        /// A file path or Redis key, for the log.
        location: String,
        /// What is wrong with it.
        error: String,
    },
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum JobStoreError {
    /// Another manager owns the entry now (its lease expired and was taken over, or the entry
    /// is gone): the caller must stop working on the job and leave it alone.
    #[error("job {0} is owned by another manager now")]
    Lost(u64),
    /// The store path is locked by another manager (file store).
    #[error("{0}")]
    Locked(String),
    /// The entry's body cannot be unsealed (wrong or missing key, tampering) or decoded.
    #[error("job {job_id}: {message}")]
    Corrupt {
        /// The job.
        job_id: u64,
        /// What is wrong.
        message: String,
    },
    /// The backend failed (I/O, Redis connection).
    #[error("{0}")]
    Backend(String),
}

/// The job store contract. Every method is safe to call concurrently for different jobs.
#[async_trait]
pub trait JobStore: Send + Sync {
    /// A short description for logs: `file /var/lib/runway/store/abc` or `redis 127.0.0.1:6379/0`.
    fn describe(&self) -> String;

    /// Create or replace the entry of `entry.meta.job_id`, owned by `entry.meta.owner`, with
    /// the heartbeat set to now. Atomic: a reader sees the old or the new entry, never a mix.
    /// Fails with [`JobStoreError::Lost`] when the entry exists and another manager owns it.
    async fn save(&self, entry: &Entry) -> Result<(), JobStoreError>;

    /// Append `bytes` to the job's trace, which must be exactly `offset` bytes long now
    /// (longer is truncated to `offset` first: bytes past the last saved entry are unconfirmed).
    async fn append_trace(&self, job_id: u64, offset: u64, bytes: &[u8]) -> Result<(), JobStoreError>;

    /// [`JobStore::append_trace`] then [`JobStore::save`], as one write where the backend can
    /// (the file store: both or neither, with one sync).
    async fn save_with_trace(&self, entry: &Entry, offset: u64, bytes: &[u8]) -> Result<(), JobStoreError> {
        self.append_trace(entry.meta.job_id, offset, bytes).await?;
        self.save(entry).await
    }

    /// The first `len` bytes of the job's trace; an error when fewer are stored.
    async fn read_trace(&self, job_id: u64, len: u64) -> Result<Vec<u8>, JobStoreError>;

    /// Every entry of this runner's store, readable or not.
    async fn list(&self) -> Result<Vec<Listed>, JobStoreError>;

    /// Take the entry of `job_id` over for manager `owner` when it is unowned by a live
    /// manager: its owner is `owner` already (a restart of the same manager), or its heartbeat
    /// is older than `health_timeout`. Sets owner and heartbeat, counts one resume, and
    /// returns the entry with its body unsealed; `Ok(None)` when another manager holds a live
    /// lease or won the race. Exactly one caller wins a contested entry.
    async fn claim(&self, job_id: u64, owner: &str, health_timeout: Duration) -> Result<Option<Entry>, JobStoreError>;

    /// Delete the entry and its trace (no error when already gone).
    async fn remove(&self, job_id: u64) -> Result<(), JobStoreError>;

    /// The store's clock, unix seconds (Redis `TIME` for Redis, the system clock for files),
    /// so ages are compared on one clock.
    async fn now(&self) -> Result<u64, JobStoreError>;
}

/// Which backend `[runners.store] name` selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// `file`: entries under `path` (variables already expanded).
    File {
        /// The runner's store directory.
        path: PathBuf,
    },
    /// `redis`: entries under `namespace` in the database at `url`.
    Redis {
        /// `redis://` or `rediss://` URL.
        url: String,
        /// Key prefix separating runners (a digest of their token).
        namespace: String,
    },
}

/// `[runners.store]` as the store and its users need it (config parses and checks it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreSettings {
    /// The backend; `None` when the store is off (`name = "none"`).
    pub backend: Option<Backend>,
    /// Where an earlier version kept this runner's store (named by its short token, which
    /// two runners can share): moved to `backend` when that is still empty ([`open`]).
    pub migrate_from: Option<Backend>,
    /// Heartbeat of each running job.
    pub health_interval: Duration,
    /// A job whose heartbeat is older is resumed by a manager.
    pub health_timeout: Duration,
    /// Entries older than this are failed and removed.
    pub stale_timeout: Duration,
    /// How often the store is swept for stale entries.
    pub cleanup_interval: Duration,
    /// Resumes of one job before it is failed.
    pub max_retries: u32,
}

impl Default for StoreSettings {
    fn default() -> Self {
        StoreSettings {
            backend: None,
            migrate_from: None,
            health_interval: Duration::from_secs(5),
            health_timeout: Duration::from_secs(30),
            stale_timeout: Duration::from_secs(10800),
            cleanup_interval: Duration::from_secs(300),
            max_retries: 10,
        }
    }
}

/// Open the store `settings` select, sealing bodies with `key`; `None` when it is off.
pub async fn open(
    settings: &StoreSettings,
    key: seal::StoreKey,
) -> Result<Option<std::sync::Arc<dyn JobStore>>, JobStoreError> {
    match (&settings.backend, &settings.migrate_from) {
        (None, _) => Ok(None),
        (Some(Backend::File { path }), old) => {
            if let Some(Backend::File { path: old }) = old {
                file::migrate(old, path)?;
            }
            Ok(Some(std::sync::Arc::new(file::FileStore::open(path, key)?)))
        }
        (Some(Backend::Redis { url, namespace }), old) => {
            let store = redis::RedisStore::open(url, namespace, key).await?;
            if let Some(Backend::Redis { url: old_url, namespace: old }) = old {
                if old_url == url && old != namespace {
                    store.migrate(old).await?;
                }
            }
            Ok(Some(std::sync::Arc::new(store)))
        }
    }
}
