//! On-disk cache of compiled plugins (`.cwasm`), keyed by the plugin's content hash and the
//! engine's compatibility hash, so a restart does not recompile.
//!
//! Only files this runner wrote are ever deserialized: the cache directory is the runner's
//! own, and entries are written atomically (temp file + rename).

use std::path::{Path, PathBuf};

use wasmtime::component::Component;
use wasmtime::Engine;

/// The compiled-code cache.
#[derive(Clone)]
pub struct CompileCache {
    dir: Option<PathBuf>,
    engine_key: String,
}

impl CompileCache {
    /// A cache in `dir` (created on first write), or no caching when `dir` is `None`.
    pub fn new(dir: Option<PathBuf>, engine_key: String) -> Self {
        CompileCache { dir, engine_key }
    }

    fn entry(&self, content_hash: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(format!("{content_hash}-{}.cwasm", self.engine_key)))
    }

    /// The component for `bytes`: from the cache when present, else compiled and stored.
    /// Returns whether it came from the cache.
    pub fn load_or_compile(
        &self,
        engine: &Engine,
        bytes: &[u8],
        content_hash: &str,
    ) -> anyhow::Result<(Component, bool)> {
        if let Some(path) = self.entry(content_hash) {
            // Read into memory rather than mmap: a cache file truncated by someone else while
            // mapped would crash the runner with SIGBUS.
            if let Ok(cached) = std::fs::read(&path) {
                // SAFETY: the file was produced by `Component::serialize` of this runner for an
                // engine with the same compatibility hash (it is in the file name) and lives in
                // the runner's private cache directory; wasmtime still checks its header.
                match unsafe { Component::deserialize(engine, &cached) } {
                    Ok(component) => return Ok((component, true)),
                    Err(e) => tracing::warn!(path = %path.display(), "discarding unusable cached plugin: {e:#}"),
                }
            }
        }
        let component = Component::new(engine, bytes).map_err(|e| anyhow::anyhow!("compiling the component: {e:#}"))?;
        if let Some(path) = self.entry(content_hash) {
            if let Err(e) = store(&path, &component) {
                tracing::warn!(path = %path.display(), "cannot cache compiled plugin: {e:#}");
            }
        }
        Ok((component, false))
    }
}

fn store(path: &Path, component: &Component) -> anyhow::Result<()> {
    let bytes = component.serialize()?;
    crate::store::atomic::write(path, &bytes, None)?;
    Ok(())
}

/// Hex SHA-256 of a plugin file.
pub fn content_hash(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}
