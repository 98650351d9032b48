//! `runway:host/kv`: small persistent state per plugin, one file per key under the runner's
//! state directory (`<state dir>/kv/<plugin>/k-<sha256 of key>`, holding the key and the value),
//! written atomically, within a per-plugin quota of keys and bytes.
//!
//! File names are hashes so every key the WIT contract allows (256 bytes) makes a valid file
//! name; the key is stored inside the file. Files of the older layout (the hex-encoded key as
//! the name, which failed above 127 bytes) are migrated when the store is first used.
//!
//! Owns: [`KvStore`] with its limits ([`MAX_KEY`], [`MAX_VALUE`], [`KvQuota`]), [`KvCtx`] and
//! the `kv` host trait on it. Must not touch: plugins or stores (the plugin host projects its
//! store data onto a `&mut KvCtx`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use sha2::{Digest, Sha256};

use crate::bindings::executor::runway::host0_1_0::kv::{Host, KvError};

/// Longest key.
pub const MAX_KEY: usize = 256;
/// Largest value.
pub const MAX_VALUE: usize = 1 << 20;

/// How much one plugin may keep (`[plugins.NAME] kv_max_keys`, `kv_max_mb`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvQuota {
    /// Most keys.
    pub max_keys: u64,
    /// Most bytes, keys plus values.
    pub max_bytes: u64,
}

impl Default for KvQuota {
    fn default() -> Self {
        KvQuota { max_keys: 1024, max_bytes: 4 << 20 }
    }
}

/// Prefix of entry files (the rest is the key's SHA-256 in hex).
const ENTRY_PREFIX: &str = "k-";

#[derive(Default)]
struct KvState {
    /// Whether the disk index was read (always true in memory).
    indexed: bool,
    /// Key → value (in memory) or key → value length (on disk: the value is in the file).
    values: BTreeMap<String, Vec<u8>>,
    sizes: BTreeMap<String, u64>,
    bytes: u64,
}

/// One plugin's key-value store: on disk when a directory is given, else in memory. Shared by
/// every loaded version of the plugin, so the quota holds across hot reloads.
pub struct KvStore {
    dir: Option<PathBuf>,
    quota: Mutex<KvQuota>,
    state: Mutex<KvState>,
}

fn io(action: &str, path: &Path, e: impl std::fmt::Display) -> KvError {
    KvError::Other(format!("{action} {}: {e}", path.display()))
}

fn entry_name(key: &str) -> String {
    format!("{ENTRY_PREFIX}{}", hex::encode(Sha256::digest(key.as_bytes())))
}

/// An entry file: the key's length (4 bytes, big endian), the key, the value.
fn encode(key: &str, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + key.len() + value.len());
    out.extend_from_slice(&(key.len() as u32).to_be_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(value);
    out
}

fn decode(bytes: &[u8]) -> Option<(String, &[u8])> {
    let len = u32::from_be_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    let key = std::str::from_utf8(bytes.get(4..4 + len)?).ok()?;
    Some((key.to_string(), &bytes[4 + len..]))
}

impl KvStore {
    /// A store persisted in `dir`, or in memory when `None`, with the default quota.
    pub fn new(dir: Option<PathBuf>) -> Self {
        let indexed = dir.is_none();
        KvStore {
            dir,
            quota: Mutex::new(KvQuota::default()),
            state: Mutex::new(KvState { indexed, ..KvState::default() }),
        }
    }

    /// Set the quota (a grant changed); entries already stored are kept.
    pub fn set_quota(&self, quota: KvQuota) {
        *self.quota.lock().unwrap_or_else(|p| p.into_inner()) = quota;
    }

    fn quota(&self) -> KvQuota {
        *self.quota.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The state, with the disk index read on first use.
    fn state(&self) -> Result<MutexGuard<'_, KvState>, KvError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !state.indexed {
            if let Some(dir) = &self.dir {
                index(dir, &mut state)?;
            }
            state.indexed = true;
        }
        Ok(state)
    }

    /// The value under `key`.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        let state = self.state()?;
        let Some(dir) = &self.dir else { return Ok(state.values.get(key).cloned()) };
        if !state.sizes.contains_key(key) {
            return Ok(None);
        }
        let path = dir.join(entry_name(key));
        match std::fs::read(&path) {
            Ok(bytes) => match decode(&bytes) {
                Some((stored, value)) if stored == key => Ok(Some(value.to_vec())),
                _ => Err(KvError::Other(format!("{} is corrupt", path.display()))),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("reading", &path, e)),
        }
    }

    /// Store `value` under `key`, within the quota.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), KvError> {
        if key.len() > MAX_KEY {
            return Err(KvError::TooLarge(MAX_KEY as u32));
        }
        if value.len() > MAX_VALUE {
            return Err(KvError::TooLarge(MAX_VALUE as u32));
        }
        let quota = self.quota();
        let mut state = self.state()?;
        let cost = (key.len() + value.len()) as u64;
        let previous = state.sizes.get(key).map(|v| key.len() as u64 + v);
        if previous.is_none() && state.sizes.len() as u64 >= quota.max_keys {
            return Err(KvError::QuotaExceeded);
        }
        let total = state.bytes - previous.unwrap_or(0) + cost;
        if total > quota.max_bytes {
            return Err(KvError::QuotaExceeded);
        }
        match &self.dir {
            Some(dir) => {
                let path = dir.join(entry_name(key));
                crate::store::atomic::write(&path, &encode(key, value), None)
                    .map_err(|e| KvError::Other(e.to_string()))?;
            }
            None => {
                state.values.insert(key.to_string(), value.to_vec());
            }
        }
        state.sizes.insert(key.to_string(), value.len() as u64);
        state.bytes = total;
        Ok(())
    }

    /// Remove `key`.
    pub fn delete(&self, key: &str) -> Result<(), KvError> {
        let mut state = self.state()?;
        if let Some(dir) = &self.dir {
            let path = dir.join(entry_name(key));
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("removing", &path, e)),
            }
        }
        state.values.remove(key);
        if let Some(size) = state.sizes.remove(key) {
            state.bytes -= key.len() as u64 + size;
        }
        Ok(())
    }

    /// Keys starting with `prefix`, sorted.
    pub fn list(&self, prefix: &str) -> Result<Vec<String>, KvError> {
        Ok(self.state()?.sizes.keys().filter(|k| k.starts_with(prefix)).cloned().collect())
    }
}

/// Read the directory's entries into `state`, migrating files of the hex-named layout.
fn index(dir: &Path, state: &mut KvState) -> Result<(), KvError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io("listing", dir, e)),
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.starts_with('.') || !entry.file_type().map(|t| t.is_file()).unwrap_or(false) {
            continue;
        }
        let Ok(bytes) = std::fs::read(&path) else { continue };
        if name.starts_with(ENTRY_PREFIX) {
            if let Some((key, value)) = decode(&bytes) {
                state.bytes += (key.len() + value.len()) as u64;
                state.sizes.insert(key, value.len() as u64);
            }
        } else if let Some(key) = hex::decode(&name).ok().and_then(|k| String::from_utf8(k).ok()) {
            // The older layout: the hex-encoded key is the file name, the file is the value.
            let new = dir.join(entry_name(&key));
            crate::store::atomic::write(&new, &encode(&key, &bytes), None)
                .map_err(|e| KvError::Other(e.to_string()))?;
            std::fs::remove_file(&path).map_err(|e| io("removing", &path, e))?;
            state.bytes += (key.len() + bytes.len()) as u64;
            state.sizes.insert(key, bytes.len() as u64);
        }
    }
    Ok(())
}

/// The `kv` capability's state: the plugin's store (shared by all its instances).
pub struct KvCtx {
    store: Arc<KvStore>,
}

impl KvCtx {
    /// The capability over `store`.
    pub fn new(store: Arc<KvStore>) -> Self {
        KvCtx { store }
    }
}

impl Host for KvCtx {
    async fn get(&mut self, key: String) -> wasmtime::Result<Result<Option<Vec<u8>>, KvError>> {
        Ok(self.store.get(&key))
    }
    async fn set(&mut self, key: String, value: Vec<u8>) -> wasmtime::Result<Result<(), KvError>> {
        Ok(self.store.set(&key, &value))
    }
    async fn delete(&mut self, key: String) -> wasmtime::Result<Result<(), KvError>> {
        Ok(self.store.delete(&key))
    }
    async fn list_keys(&mut self, prefix: String) -> wasmtime::Result<Result<Vec<String>, KvError>> {
        Ok(self.store.list(&prefix))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persists_and_lists() {
        let dir = tempfile::tempdir().expect("tempdir");
        let kv = KvStore::new(Some(dir.path().join("p")));
        kv.set("job/1", b"state").expect("set");
        kv.set("job/2", b"x").expect("set");
        kv.set("other", b"y").expect("set");
        let again = KvStore::new(Some(dir.path().join("p")));
        assert_eq!(again.get("job/1").expect("get"), Some(b"state".to_vec()));
        assert_eq!(again.list("job/").expect("list"), vec!["job/1", "job/2"]);
        again.delete("job/1").expect("delete");
        assert_eq!(again.get("job/1").expect("get"), None);
        assert!(matches!(kv.set(&"k".repeat(300), b""), Err(KvError::TooLarge(_))));
    }

    #[test]
    fn keys_of_256_bytes_work_and_old_hex_files_are_migrated() {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = "é".repeat(128);
        let kv = KvStore::new(Some(dir.path().join("p")));
        kv.set(&key, b"v").expect("a 256-byte key");
        assert_eq!(KvStore::new(Some(dir.path().join("p"))).get(&key).expect("get"), Some(b"v".to_vec()));
        std::fs::write(dir.path().join("p").join(hex::encode("old/key")), b"old value").expect("legacy file");
        let again = KvStore::new(Some(dir.path().join("p")));
        assert_eq!(again.list("").expect("list"), vec!["old/key".to_string(), key]);
        assert_eq!(again.get("old/key").expect("get"), Some(b"old value".to_vec()));
    }

    #[test]
    fn the_quota_counts_keys_and_bytes_and_replacing_is_not_growing() {
        for dir in [None, Some(tempfile::tempdir().expect("tempdir"))] {
            let kv = KvStore::new(dir.as_ref().map(|d| d.path().join("p")));
            kv.set_quota(KvQuota { max_keys: 3, max_bytes: 100 });
            kv.set("a", &[0; 40]).expect("41 bytes");
            kv.set("a", &[0; 49]).expect("replaced: 50 bytes");
            kv.set("b", &[0; 49]).expect("100 bytes");
            assert!(matches!(kv.set("c", &[0; 1]), Err(KvError::QuotaExceeded)));
            kv.delete("b").expect("delete");
            kv.set("c", &[]).expect("one byte");
            kv.set("d", &[]).expect("one byte");
            assert!(matches!(kv.set("e", &[]), Err(KvError::QuotaExceeded)), "a fourth key");
        }
    }
}
