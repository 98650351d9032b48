//! The credentials an S3 cache with `RoleARN`/`UploadRoleARN` signs with, as gitlab-runner
//! gets them (`cache/s3v2/s3.go`, `adapter.go`): `RoleARN` for every request, else
//! `UploadRoleARN` for uploads; the runner's own credentials assume the role through STS
//! (`super::sts`) with a session policy scoped to the one object, and the temporary
//! credentials (with their session token) sign the URL. Credentials are cached per role,
//! bucket, object and direction until less than the URL's validity (at least a minute, at most
//! 55 minutes) is left (`DisableAssumeRoleCredentialsCaching` turns that off); at most
//! `AssumeRoleMaxConcurrency` requests (0: 5, negative: no limit) are in flight per store; and
//! gitlab-runner's `gitlab_runner_cache_s3_assume_role_*` families count it all, in collectors
//! the metrics registry takes from the CLI ([`collectors`]), so this module imports no metrics.
//!
//! Owns the cache, the limit and the counting, and the one bridge from the synchronous signing
//! path to the STS request ([`block_on`]). Must not build the request (`super::sts`) or sign
//! S3 URLs (`super::sigv4`).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use prometheus::core::Collector;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge, Opts};

use crate::cache::sigv4::AwsCredentials;
use crate::cache::sts::{self, AssumeRoleInput, StsError};
use crate::config::cache::CacheS3Config;

/// gitlab-runner's default of `AssumeRoleMaxConcurrency = 0`.
pub(crate) const DEFAULT_MAX_CONCURRENCY: usize = 5;

/// Most credentials kept (gitlab-runner's LRU size).
const CACHE_CAPACITY: usize = 1000;

/// `gitlab_runner_cache_s3_assume_role_wait_seconds` buckets.
const WAIT_BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/// `gitlab_runner_cache_s3_assume_role_duration_seconds` buckets.
const CALL_BUCKETS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// gitlab-runner's seven AssumeRole families, with its names, help texts and buckets.
pub(crate) struct AssumeRoleMetrics {
    pub in_flight: IntGauge,
    pub wait: Histogram,
    pub duration: Histogram,
    pub hits: IntCounter,
    pub misses: IntCounter,
    pub cached: IntGauge,
    pub failures: IntCounter,
}

impl AssumeRoleMetrics {
    pub(crate) fn new() -> prometheus::Result<Self> {
        let histogram = |name: &str, help: &str, buckets: &[f64]| {
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
        };
        Ok(AssumeRoleMetrics {
            in_flight: IntGauge::with_opts(Opts::new(
                "gitlab_runner_cache_s3_assume_role_requests_in_flight",
                "Number of AssumeRole requests to AWS STS in progress.",
            ))?,
            wait: histogram(
                "gitlab_runner_cache_s3_assume_role_wait_seconds",
                "Wait time to acquire a concurrency slot before an AssumeRole request.",
                WAIT_BUCKETS,
            )?,
            duration: histogram(
                "gitlab_runner_cache_s3_assume_role_duration_seconds",
                "Duration of AssumeRole API calls to AWS STS.",
                CALL_BUCKETS,
            )?,
            hits: IntCounter::with_opts(Opts::new(
                "gitlab_runner_cache_s3_assume_role_cache_hits_total",
                "Number of AssumeRole credential cache hits.",
            ))?,
            misses: IntCounter::with_opts(Opts::new(
                "gitlab_runner_cache_s3_assume_role_cache_misses_total",
                "Number of AssumeRole credential cache misses (This is also a count of the STS calls for cache credentials that were made).",
            ))?,
            cached: IntGauge::with_opts(Opts::new(
                "gitlab_runner_cache_s3_assume_role_cached_credentials",
                "Current number of AssumeRole credentials held in the LRU cache.",
            ))?,
            failures: IntCounter::with_opts(Opts::new(
                "gitlab_runner_cache_s3_assume_role_failures_total",
                "Number of AssumeRole requests which failed.",
            ))?,
        })
    }

    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.in_flight.clone()),
            Box::new(self.wait.clone()),
            Box::new(self.duration.clone()),
            Box::new(self.hits.clone()),
            Box::new(self.misses.clone()),
            Box::new(self.cached.clone()),
            Box::new(self.failures.clone()),
        ]
    }
}

/// The process's families (one set, as gitlab-runner's globals), `None` only if prometheus
/// refused their definitions.
static METRICS: LazyLock<Option<Arc<AssumeRoleMetrics>>> = LazyLock::new(|| {
    AssumeRoleMetrics::new().map(Arc::new).map_err(|e| tracing::warn!("AssumeRole metrics: {e}")).ok()
});

/// The process's credential cache (shared by every store, as gitlab-runner's).
static CACHE: LazyLock<Arc<CredentialCache>> = LazyLock::new(Arc::default);

/// The `gitlab_runner_cache_s3_assume_role_*` collectors, for the metrics registry.
pub fn collectors() -> Vec<Box<dyn Collector>> {
    METRICS.as_ref().map(|m| m.collectors()).unwrap_or_default()
}

/// Temporary credentials by role, bucket, object and direction (and STS endpoint).
#[derive(Default)]
pub(crate) struct CredentialCache {
    entries: Mutex<HashMap<String, AwsCredentials>>,
}

impl CredentialCache {
    /// Credentials of `key` valid for at least `min_validity` after `now`.
    fn get(&self, key: &str, min_validity: Duration, now: DateTime<Utc>) -> Option<AwsCredentials> {
        let entries = self.entries.lock().ok()?;
        let creds = entries.get(key)?;
        let left = (creds.expires? - now).to_std().ok()?;
        (left >= min_validity).then(|| creds.clone())
    }

    /// Keep `creds` (which expire) under `key`; expired entries go first, then, when full,
    /// the one expiring soonest. Returns the number of entries kept.
    fn put(&self, key: String, creds: AwsCredentials, now: DateTime<Utc>) -> usize {
        let Ok(mut entries) = self.entries.lock() else { return 0 };
        entries.retain(|_, c| c.expires.is_some_and(|e| e > now));
        if entries.len() >= CACHE_CAPACITY && !entries.contains_key(&key) {
            let soonest = entries.iter().min_by_key(|(_, c)| c.expires).map(|(k, _)| k.clone());
            if let Some(k) = soonest {
                entries.remove(&k);
            }
        }
        entries.insert(key, creds);
        entries.len()
    }
}

/// The roles of one S3 store and how they are assumed.
pub(crate) struct RoleAssumer {
    role_arn: String,
    upload_role_arn: String,
    /// `AWS_ENDPOINT_URL_STS`/`AWS_ENDPOINT_URL` when set; else the region's endpoint.
    endpoint_override: Option<String>,
    /// The KMS key uploads are encrypted with (`KMS`/`DSSE-KMS`).
    kms_key: Option<String>,
    bucket: String,
    limit: Option<Arc<tokio::sync::Semaphore>>,
    caching: bool,
    cache: Arc<CredentialCache>,
    metrics: Option<Arc<AssumeRoleMetrics>>,
}

impl RoleAssumer {
    /// The assumer of `cfg`, `None` without `RoleARN` and `UploadRoleARN`; `kms` says whether
    /// uploads are KMS-encrypted.
    pub(crate) fn from_config(
        cfg: &CacheS3Config,
        kms: bool,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Option<RoleAssumer> {
        if cfg.role_arn.is_empty() && cfg.upload_role_arn.is_empty() {
            return None;
        }
        let limit = match usize::try_from(cfg.assume_role_max_concurrency) {
            Ok(0) => Some(DEFAULT_MAX_CONCURRENCY),
            Ok(n) => Some(n),
            Err(_) => None,
        };
        Some(RoleAssumer {
            role_arn: cfg.role_arn.clone(),
            upload_role_arn: cfg.upload_role_arn.clone(),
            endpoint_override: sts::endpoint_override(env),
            kms_key: Some(cfg.server_side_encryption_key_id.clone()).filter(|k| kms && !k.is_empty()),
            bucket: cfg.bucket_name.clone(),
            limit: limit.map(|n| Arc::new(tokio::sync::Semaphore::new(n))),
            caching: !cfg.disable_assume_role_credentials_caching,
            cache: CACHE.clone(),
            metrics: METRICS.clone(),
        })
    }

    /// The role an upload (or a download: GET and HEAD, which needs `s3:GetObject`) is signed
    /// with: `RoleARN` for every request, else `UploadRoleARN` for an upload (gitlab-runner's
    /// `getARNForGoCloud`); `None`: the runner's own credentials.
    pub(crate) fn role_for(&self, upload: bool) -> Option<&str> {
        if !self.role_arn.is_empty() {
            Some(&self.role_arn)
        } else if upload && !self.upload_role_arn.is_empty() {
            Some(&self.upload_role_arn)
        } else {
            None
        }
    }

    /// The STS endpoint for `region`.
    pub(crate) fn endpoint(&self, region: &str) -> String {
        self.endpoint_override.clone().unwrap_or_else(|| sts::regional_endpoint(region))
    }

    fn cache_key(&self, role: &str, region: &str, object: &str, upload: bool) -> String {
        format!("{role}\0{}\0{}\0{object}\0{}", self.endpoint(region), self.bucket, u8::from(upload))
    }

    /// Temporary credentials of `role` for `object` (`upload` or not), assumed with `base` in
    /// `region`, usable for the URL's `valid_for`: from the cache when it has them, else from
    /// STS (one call per miss, at most the store's limit at once). Blocks until STS answers;
    /// on a multi-threaded runtime the other tasks move off this thread meanwhile.
    pub(crate) fn credentials(
        &self,
        role: &str,
        base: &AwsCredentials,
        region: &str,
        object: &str,
        upload: bool,
        valid_for: Duration,
    ) -> Result<AwsCredentials, StsError> {
        let min_validity = valid_for.max(Duration::from_secs(60)).min(Duration::from_secs(55 * 60));
        let key = self.cache_key(role, region, object, upload);
        if let Some(creds) = self.cached(&key, min_validity) {
            return Ok(creds);
        }
        block_on(self.assume(role, base, region, object, upload, &key, min_validity))?
    }

    fn cached(&self, key: &str, min_validity: Duration) -> Option<AwsCredentials> {
        if !self.caching {
            return None;
        }
        let creds = self.cache.get(key, min_validity, Utc::now())?;
        if let Some(m) = &self.metrics {
            m.hits.inc();
        }
        Some(creds)
    }

    #[allow(clippy::too_many_arguments)]
    async fn assume(
        &self,
        role: &str,
        base: &AwsCredentials,
        region: &str,
        object: &str,
        upload: bool,
        key: &str,
        min_validity: Duration,
    ) -> Result<AwsCredentials, StsError> {
        let policy = sts::session_policy(region, &self.bucket, object, upload, self.kms_key.as_deref());
        let input = AssumeRoleInput {
            role_arn: role.to_string(),
            session_name: sts::session_name(),
            policy,
            duration: sts::SESSION_DURATION,
        };
        let _slot = match &self.limit {
            Some(limit) => {
                let waiting = Instant::now();
                let permit = limit.clone().acquire_owned().await.ok();
                Some(Slot::new(permit, waiting.elapsed(), self.metrics.clone()))
            }
            None => None,
        };
        // Another request may have fetched the same credentials while this one waited.
        if let Some(creds) = self.cached(key, min_validity) {
            return Ok(creds);
        }
        let endpoint = self.endpoint(region);
        if let Some(m) = &self.metrics {
            m.misses.inc();
        }
        let started = Instant::now();
        let answer = async { sts::send(role, &sts::request(&endpoint, region, &input, base, Utc::now())?).await }.await;
        let elapsed = started.elapsed();
        if let Some(m) = &self.metrics {
            m.duration.observe(elapsed.as_secs_f64());
        }
        match answer {
            Ok(creds) => {
                tracing::debug!(
                    role_arn = role,
                    duration_s = elapsed.as_secs_f64(),
                    "Successfully assumed role for cache credentials"
                );
                if self.caching && creds.expires.is_some() {
                    let kept = self.cache.put(key.to_string(), creds.clone(), Utc::now());
                    if let Some(m) = &self.metrics {
                        m.cached.set(i64::try_from(kept).unwrap_or(i64::MAX));
                    }
                }
                Ok(creds)
            }
            Err(e) => {
                if let Some(m) = &self.metrics {
                    m.failures.inc();
                }
                tracing::error!(role_arn = role, duration_s = elapsed.as_secs_f64(), error = %e, "Failed to assume role for cache credentials");
                Err(e)
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn with_parts(mut self, cache: Arc<CredentialCache>, metrics: Arc<AssumeRoleMetrics>) -> Self {
        self.cache = cache;
        self.metrics = Some(metrics);
        self
    }

    #[cfg(test)]
    pub(crate) fn limit(&self) -> Option<usize> {
        self.limit.as_ref().map(|l| l.available_permits())
    }
}

/// A held concurrency slot: counted in flight until dropped.
struct Slot {
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
    metrics: Option<Arc<AssumeRoleMetrics>>,
}

impl Slot {
    fn new(
        permit: Option<tokio::sync::OwnedSemaphorePermit>,
        waited: Duration,
        metrics: Option<Arc<AssumeRoleMetrics>>,
    ) -> Slot {
        if let Some(m) = &metrics {
            m.wait.observe(waited.as_secs_f64());
            m.in_flight.inc();
        }
        Slot { _permit: permit, metrics }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(m) = &self.metrics {
            m.in_flight.dec();
        }
    }
}

/// Run `future` to completion from synchronous code (the signing path): on a thread of its
/// own with a runtime of its own, so it works inside or outside a runtime; on a
/// multi-threaded runtime the caller's other tasks move off this thread meanwhile.
pub(crate) fn block_on<F>(future: F) -> Result<F::Output, StsError>
where
    F: Future + Send,
    F::Output: Send,
{
    let run = || {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| StsError::Runtime(format!("runtime: {e}")))?;
                    Ok(runtime.block_on(future))
                })
                .join()
                .unwrap_or_else(|_| Err(StsError::Runtime("the request's thread panicked".into())))
        })
    };
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(run),
        _ => run(),
    }
}

#[cfg(test)]
#[path = "roles_tests.rs"]
mod tests;
