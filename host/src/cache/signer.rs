//! The seam between a runner's distributed cache and its jobs' scripts: a [`RunnerCache`]
//! (the store of one `[[runners]]` entry and its short token) is the `script::CacheSigner`
//! that pre-signs each cache key's GET, HEAD and PUT, and keeps IAM credentials fresh.
//!
//! Owns: object names per runner and the credentials refresh loop. Must not touch: scripts
//! (it only answers the trait), the job environment.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::{CacheError, CacheStore, Presigned};
use crate::script::{CacheSigner, CacheUrls, SignError};

/// A runner's distributed cache, as its jobs' scripts use it.
pub struct RunnerCache {
    store: Arc<CacheStore>,
    short_token: String,
}

impl RunnerCache {
    /// The cache of the runner with `short_token`.
    pub fn new(store: Arc<CacheStore>, short_token: &str) -> RunnerCache {
        RunnerCache { store, short_token: short_token.to_string() }
    }

    /// Load credentials now and keep them fresh in the background for as long as `store` is
    /// in use (the task ends once the last runner holding it is gone, after a reload). A
    /// failed refresh is logged and retried a minute later; the URLs of that minute fail
    /// with a warning in the job log, and caches stay local.
    pub async fn start_refreshing(store: Arc<CacheStore>) -> tokio::task::JoinHandle<()> {
        if let Err(e) = store.refresh_credentials().await {
            tracing::warn!("[runners.cache]: {e}");
        }
        let weak = Arc::downgrade(&store);
        drop(store);
        tokio::spawn(async move {
            loop {
                let Some(expire) = weak.upgrade().map(|s| s.credentials_expire()) else { return };
                let wait = match expire {
                    // Five minutes before they expire, at least a minute from now.
                    Some(at) => (at - chrono::Utc::now() - chrono::Duration::minutes(5))
                        .to_std()
                        .unwrap_or(Duration::ZERO)
                        .max(Duration::from_secs(60)),
                    None => Duration::from_secs(3600),
                };
                tokio::time::sleep(wait).await;
                let Some(store) = weak.upgrade() else { return };
                if let Err(e) = store.refresh_credentials().await {
                    tracing::warn!("[runners.cache]: refreshing credentials: {e}");
                }
            }
        })
    }
}

fn header_lines(p: &Presigned) -> Vec<String> {
    p.headers.iter().map(|(k, v)| format!("{k}: {v}")).collect()
}

impl CacheSigner for RunnerCache {
    fn urls(&self, project_id: i64, key: &str, push: bool, valid_for: Duration) -> Result<CacheUrls, SignError> {
        let object = self
            .store
            .object_name(&self.short_token, project_id, key)
            .ok_or(CacheError::EmptyObject)
            .map_err(SignError::new)?;
        let get = self.store.download(&object, valid_for).map_err(SignError::new)?;
        let head = self.store.head(&object, valid_for).map_err(SignError::new)?;
        let put = if push {
            let metadata = BTreeMap::from([("cachekey".to_string(), key.to_string())]);
            let up = self.store.upload(&object, valid_for, &metadata).map_err(SignError::new)?;
            Some((up.url.clone(), header_lines(&up)))
        } else {
            None
        };
        Ok(CacheUrls { get: Some(get.url), head: Some(head.url), put })
    }

    fn max_uploaded_archive_size(&self) -> u64 {
        self.store.max_uploaded_archive_size().unwrap_or(0)
    }
}
