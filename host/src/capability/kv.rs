//! `runway:host/kv`: small persistent state per plugin, one file per key under the runner's
//! state directory (`<state dir>/kv/<plugin>/<hex key>`), written atomically.
//!
//! Owns: [`KvStore`] with its quota ([`MAX_KEY`], [`MAX_VALUE`], [`MAX_KEYS`]), [`KvCtx`] and
//! the `kv` host trait on it. Must not touch: plugins or stores (the plugin host projects its
//! store data onto a `&mut KvCtx`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::bindings::executor::runway::host::kv::{Host, KvError};

/// Longest key.
pub const MAX_KEY: usize = 256;
/// Largest value.
pub const MAX_VALUE: usize = 1 << 20;
/// Most keys per plugin.
pub const MAX_KEYS: usize = 1024;

/// One plugin's key-value store: on disk when a directory is given, else in memory.
pub struct KvStore {
    dir: Option<PathBuf>,
    memory: Mutex<BTreeMap<String, Vec<u8>>>,
}

impl KvStore {
    /// A store persisted in `dir`, or in memory when `None`.
    pub fn new(dir: Option<PathBuf>) -> Self {
        KvStore { dir, memory: Mutex::new(BTreeMap::new()) }
    }

    fn path(&self, key: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(hex::encode(key.as_bytes())))
    }

    fn keys(&self) -> Result<Vec<String>, KvError> {
        match &self.dir {
            None => Ok(self.memory.lock().map(|m| m.keys().cloned().collect()).unwrap_or_default()),
            Some(dir) => {
                let entries = match std::fs::read_dir(dir) {
                    Ok(entries) => entries,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                    Err(e) => return Err(KvError::Other(format!("listing {}: {e}", dir.display()))),
                };
                let mut keys: Vec<String> = entries
                    .filter_map(|e| e.ok())
                    .filter_map(|e| hex::decode(e.file_name().to_string_lossy().as_bytes()).ok())
                    .filter_map(|k| String::from_utf8(k).ok())
                    .collect();
                keys.sort();
                Ok(keys)
            }
        }
    }

    /// The value under `key`.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        match self.path(key) {
            None => Ok(self.memory.lock().ok().and_then(|m| m.get(key).cloned())),
            Some(path) => match std::fs::read(&path) {
                Ok(v) => Ok(Some(v)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(KvError::Other(format!("reading {}: {e}", path.display()))),
            },
        }
    }

    /// Store `value` under `key`.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), KvError> {
        if key.len() > MAX_KEY {
            return Err(KvError::TooLarge(MAX_KEY as u32));
        }
        if value.len() > MAX_VALUE {
            return Err(KvError::TooLarge(MAX_VALUE as u32));
        }
        if self.get(key)?.is_none() && self.keys()?.len() >= MAX_KEYS {
            return Err(KvError::QuotaExceeded);
        }
        match (&self.dir, self.path(key)) {
            (Some(_), Some(path)) => {
                crate::store::atomic::write(&path, value, None).map_err(|e| KvError::Other(e.to_string()))
            }
            _ => {
                if let Ok(mut m) = self.memory.lock() {
                    m.insert(key.to_string(), value.to_vec());
                }
                Ok(())
            }
        }
    }

    /// Remove `key`.
    pub fn delete(&self, key: &str) -> Result<(), KvError> {
        match self.path(key) {
            None => {
                if let Ok(mut m) = self.memory.lock() {
                    m.remove(key);
                }
                Ok(())
            }
            Some(path) => match std::fs::remove_file(&path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(KvError::Other(format!("removing {}: {e}", path.display()))),
            },
        }
    }

    /// Keys starting with `prefix`, sorted.
    pub fn list(&self, prefix: &str) -> Result<Vec<String>, KvError> {
        Ok(self.keys()?.into_iter().filter(|k| k.starts_with(prefix)).collect())
    }
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
}
