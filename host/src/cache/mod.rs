//! The distributed cache of `[runners.cache]`: object names as gitlab-runner makes them and
//! pre-signed URLs (S3, Google Cloud Storage, Azure Blob Storage) that let the job environment
//! download, check and upload one cache archive without ever holding a credential.
//!
//! Owns the [`CacheStore`] built once per runner from its config, the credentials it signs
//! with (refreshed by [`CacheStore::refresh_credentials`]; for an S3 `RoleARN`/`UploadRoleARN`,
//! assumed through STS when a URL is asked for: `roles`, `sts`) and the signing, which is pure
//! and takes `now`. Must not move cache bytes (the in-job helper does), build archives, or
//! know about jobs beyond the object name's parts.

mod aws_iam;
mod azure;
mod azure_identity;
mod canonical;
mod gcs;
mod roles;
pub mod signer;
mod sigv4;
pub mod sts;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use base64::Engine as _;
use chrono::{DateTime, Utc};

use crate::config::cache::{CacheConfig, CacheS3Config, CacheType, S3AuthType, S3Encryption};
pub(crate) use aws_iam::from_env as aws_env_credentials;
pub use aws_iam::DEFAULT_METADATA_ENDPOINT;
pub use gcs::GcsSigner;
pub use roles::collectors as assume_role_collectors;
pub use sigv4::{sign_request, AwsCredentials, SignedRequest};

/// Longest validity of an S3 or GCS signed URL (both providers refuse more): 7 days.
pub const MAX_URL_EXPIRY: Duration = Duration::from_secs(7 * 24 * 3600);

/// gitlab-runner's region when `BucketLocation` is empty.
pub const DEFAULT_S3_REGION: &str = "us-east-1";

/// A request the job environment may make without credentials: the method, the URL with its
/// signature, and the headers it must send as they are (they are signed, or required by the
/// provider).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Presigned {
    /// `GET`, `HEAD` or `PUT`.
    pub method: String,
    /// The pre-signed URL.
    pub url: String,
    /// Headers to send with the request (`name`, `value`), e.g. `x-amz-server-side-encryption`,
    /// `x-ms-blob-type: BlockBlob`, `content-type`, metadata.
    pub headers: Vec<(String, String)>,
}

/// What a URL is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `GET` the archive.
    Download,
    /// `HEAD` the archive (does it exist, how big, when written).
    Head,
    /// `PUT` the archive.
    Upload,
}

impl Operation {
    /// The HTTP method.
    pub fn method(self) -> &'static str {
        match self {
            Operation::Download => "GET",
            Operation::Head => "HEAD",
            Operation::Upload => "PUT",
        }
    }
}

/// Why no URL could be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    /// A `[runners.cache]` key is missing or wrong (`key` is e.g. `s3.BucketName`).
    #[error("[runners.cache] {key}: {message}")]
    Config {
        /// The key, relative to `[runners.cache]`.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// No usable credentials (not loaded yet, expired, or a source that failed).
    #[error("cache credentials: {0}")]
    Credentials(String),
    /// An empty object name.
    #[error("cache object name is empty")]
    EmptyObject,
}

fn config_error(key: &str, message: impl Into<String>) -> CacheError {
    CacheError::Config { key: key.into(), message: message.into() }
}

struct S3Store {
    cfg: CacheS3Config,
    /// `BucketLocation`, else what the bucket said when asked, else `us-east-1`.
    region: arc_swap::ArcSwap<String>,
    /// The bucket has been asked its region (once is enough).
    region_asked: std::sync::atomic::AtomicBool,
    auth: S3AuthType,
    encryption: S3Encryption,
    creds: ArcSwapOption<AwsCredentials>,
    /// `RoleARN`/`UploadRoleARN`: the roles assumed through STS to sign with.
    roles: Option<Box<roles::RoleAssumer>>,
}

impl S3Store {
    /// With no `BucketLocation`, ask the bucket its region once (`GET /?location`, signed), as
    /// gitlab-runner does; on failure keep `us-east-1` and say so in the log.
    async fn detect_region(&self) {
        use std::sync::atomic::Ordering;
        if !self.cfg.bucket_location.is_empty() || self.region_asked.load(Ordering::Relaxed) {
            return;
        }
        let Some(creds) = self.creds.load_full() else { return };
        self.region_asked.store(true, Ordering::Relaxed);
        let loc = sigv4::bucket_location(&self.cfg, DEFAULT_S3_REGION);
        let query = [("location".to_string(), String::new())];
        let url = sigv4::presign_with_query("GET", &loc, DEFAULT_S3_REGION, &creds, &[], &query, 60, Utc::now());
        let answer = async {
            let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
            client.get(&url).send().await?.error_for_status()?.text().await
        };
        match answer.await.map(|body| sigv4::parse_location(&body)) {
            Ok(Some(region)) => self.region.store(Arc::new(region)),
            Ok(None) => {
                tracing::warn!(bucket = %self.cfg.bucket_name, "S3 bucket location: no LocationConstraint in the answer; using us-east-1 (set BucketLocation)")
            }
            Err(e) => {
                tracing::warn!(bucket = %self.cfg.bucket_name, error = %e, "S3 bucket location unknown; using us-east-1 (set BucketLocation)")
            }
        }
    }
}

struct GcsStore {
    bucket: String,
    scheme: &'static str,
    host: String,
    /// The service-account file read by `refresh_credentials` (none: inline key).
    credentials_file: Option<String>,
    signer: ArcSwapOption<GcsSigner>,
}

struct AzureStore {
    account: String,
    /// `AccountKey` (service SAS); none: user delegation SAS with an Entra ID identity.
    key: Option<Vec<u8>>,
    /// Without a key: the token kept between refreshes and the current user delegation key.
    delegation: azure_identity::Delegation,
    delegation_key: ArcSwapOption<azure::UserDelegationKey>,
    container: String,
    scheme: &'static str,
    host: String,
    /// Path of the blob service under the host (`/devstoreaccount1` on Azurite), or empty.
    base_path: String,
}

/// How long an Azure user delegation key is asked for: Azure's limit, 7 days (less a minute
/// of clock skew).
const AZURE_KEY_VALIDITY: chrono::Duration = chrono::Duration::minutes(7 * 24 * 60 - 1);

/// A user delegation key is renewed this long before it expires (a job's SAS, which ends with
/// its key, stays valid for at least this long).
pub const AZURE_KEY_RENEWAL: chrono::Duration = chrono::Duration::days(1);

impl AzureStore {
    /// With no `AccountKey`: a user delegation key from the blob service with a token from the
    /// environment's Azure identity, once per key (kept until [`AZURE_KEY_RENEWAL`] before it
    /// expires).
    async fn refresh_delegation_key(
        &self,
        env: &(dyn Fn(&str) -> Option<String> + Sync),
        now: DateTime<Utc>,
    ) -> Result<(), CacheError> {
        if self
            .delegation_key
            .load()
            .as_ref()
            .is_some_and(|k| k.expires - AZURE_KEY_RENEWAL - chrono::Duration::minutes(10) > now)
        {
            return Ok(());
        }
        let source = azure_identity::TokenSource::select(env);
        let credentials = |e: azure_identity::IdentityError| CacheError::Credentials(e.to_string());
        let token = self.delegation.token(&source, env, now).await.map_err(credentials)?;
        let service_url = format!("{}://{}{}", self.scheme, self.host, self.base_path);
        let start = now - chrono::Duration::minutes(5);
        let key = azure_identity::user_delegation_key(&service_url, &token, start, now + AZURE_KEY_VALIDITY, env)
            .await
            .map_err(credentials)?;
        tracing::info!(account = %self.account, identity = %source.describe(), expires = %key.expiry, "Azure cache: user delegation key");
        self.delegation_key.store(Some(Arc::new(key)));
        Ok(())
    }
}

enum Provider {
    S3(S3Store),
    Gcs(GcsStore),
    Azure(AzureStore),
}

/// The distributed cache of one runner: built once from `[runners.cache]`
/// ([`CacheStore::from_config`]), credentials refreshed in the background
/// ([`CacheStore::refresh_credentials`]), URLs signed on demand without I/O.
pub struct CacheStore {
    path: String,
    shared: bool,
    max_uploaded_archive_size: u64,
    provider: Provider,
}

impl std::fmt::Debug for CacheStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let provider = match &self.provider {
            Provider::S3(_) => "s3",
            Provider::Gcs(_) => "gcs",
            Provider::Azure(_) => "azure",
        };
        f.debug_struct("CacheStore")
            .field("provider", &provider)
            .field("path", &self.path)
            .field("shared", &self.shared)
            .finish_non_exhaustive()
    }
}

impl CacheStore {
    /// The store of `cfg`; `Ok(None)` when `Type` is empty (no distributed cache). Does no
    /// I/O: IAM credentials and a GCS credentials file are loaded by
    /// [`CacheStore::refresh_credentials`], which must run before URLs can be signed.
    pub fn from_config(cfg: &CacheConfig) -> Result<Option<CacheStore>, CacheError> {
        Self::from_config_with(cfg, &|k| std::env::var(k).ok())
    }

    /// [`CacheStore::from_config`] reading `GOOGLE_APPLICATION_CREDENTIALS` and the STS
    /// endpoint of an S3 role (`AWS_ENDPOINT_URL_STS`, `AWS_ENDPOINT_URL`) from `env`.
    pub fn from_config_with(
        cfg: &CacheConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<CacheStore>, CacheError> {
        let Some(kind) = cfg.provider().map_err(|m| config_error("Type", m.0))? else { return Ok(None) };
        let max_uploaded_archive_size = u64::try_from(cfg.max_uploaded_archive_size)
            .map_err(|_| config_error("MaxUploadedArchiveSize", "must be 0 (no limit) or a number of bytes"))?;
        let provider = match kind {
            CacheType::S3 => Provider::S3(s3_store(cfg, env)?),
            CacheType::Gcs => Provider::Gcs(gcs_store(cfg, env)?),
            CacheType::Azure => Provider::Azure(azure_store(cfg)?),
        };
        Ok(Some(CacheStore { path: cfg.path.clone(), shared: cfg.shared, max_uploaded_archive_size, provider }))
    }

    /// Load the credentials that are not in config.toml: for S3 with IAM, `AWS_ACCESS_KEY_ID`/
    /// `AWS_SECRET_ACCESS_KEY`/`AWS_SESSION_TOKEN` from the environment, else the instance
    /// profile (IMDSv2 at `AWS_EC2_METADATA_SERVICE_ENDPOINT` or 169.254.169.254); for GCS,
    /// the service-account file. For S3 without `BucketLocation` it also asks the bucket its
    /// region, once (gitlab-runner's `GetBucketLocation`; `us-east-1` when that fails). Call it
    /// at start and again before [`CacheStore::credentials_expire`].
    pub async fn refresh_credentials(&self) -> Result<(), CacheError> {
        self.refresh_credentials_from(&|k| std::env::var(k).ok()).await
    }

    /// [`CacheStore::refresh_credentials`] with the environment variables read from `env`.
    pub async fn refresh_credentials_from(
        &self,
        env: &(dyn Fn(&str) -> Option<String> + Sync),
    ) -> Result<(), CacheError> {
        match &self.provider {
            Provider::S3(s3) if s3.auth == S3AuthType::Iam => {
                let creds = match aws_iam::from_env(env) {
                    Some(c) => c,
                    None => aws_iam::from_instance_metadata(&aws_iam::metadata_endpoint(env))
                        .await
                        .map_err(|e| CacheError::Credentials(e.to_string()))?,
                };
                s3.creds.store(Some(Arc::new(creds)));
                s3.detect_region().await;
                Ok(())
            }
            Provider::S3(s3) => {
                s3.detect_region().await;
                Ok(())
            }
            Provider::Gcs(GcsStore { credentials_file: Some(file), signer, .. }) => {
                let json = tokio::fs::read_to_string(file)
                    .await
                    .map_err(|e| CacheError::Credentials(format!("GCS credentials file {file}: {e}")))?;
                let loaded = GcsSigner::from_json(&json)
                    .map_err(|e| CacheError::Credentials(format!("GCS credentials file {file}: {e}")))?;
                signer.store(Some(Arc::new(loaded)));
                Ok(())
            }
            Provider::Azure(a) if a.key.is_none() => a.refresh_delegation_key(env, Utc::now()).await,
            _ => Ok(()),
        }
    }

    /// When the credentials signing now stop working (temporary IAM credentials), if ever; for
    /// an Azure user delegation key, when it is due for renewal ([`AZURE_KEY_RENEWAL`] before
    /// it expires, or now while there is none).
    pub fn credentials_expire(&self) -> Option<DateTime<Utc>> {
        match &self.provider {
            Provider::S3(s3) => s3.creds.load().as_ref().and_then(|c| c.expires),
            // No key yet (a failed first fetch): due now, so the refresh loop retries in a minute.
            Provider::Azure(a) if a.key.is_none() => {
                Some(a.delegation_key.load().as_ref().map_or_else(Utc::now, |k| k.expires - AZURE_KEY_RENEWAL))
            }
            _ => None,
        }
    }

    /// `MaxUploadedArchiveSize` in bytes, `None` for no limit (the uploader checks it; GCS
    /// uploads also carry it in `x-goog-content-length-range`).
    pub fn max_uploaded_archive_size(&self) -> Option<u64> {
        Some(self.max_uploaded_archive_size).filter(|n| *n > 0)
    }

    /// The object name of cache `key` of project `project_id` as gitlab-runner makes it:
    /// `<Path>/runner/<short token>/project/<id>/<key>` (without `runner/<short token>` when
    /// `Shared`), cleaned of `.`/`..`; `None` for an empty key or one that would leave the
    /// project's prefix.
    pub fn object_name(&self, short_token: &str, project_id: i64, key: &str) -> Option<String> {
        if key.is_empty() {
            return None;
        }
        let namespace = if self.shared { String::new() } else { format!("runner/{short_token}") };
        let base = join(&[&self.path, &namespace, "project", &project_id.to_string()]);
        let full = join(&[&base, key]);
        full.starts_with(&format!("{base}/")).then_some(full)
    }

    /// [`CacheStore::object_name`] with gitlab-runner's sharding (`FF_HASH_CACHE_KEYS`, whose
    /// keys are already hashed): the key's first two characters as a directory before it,
    /// `…/project/<id>/<key[..2]>/<key>`; `None` also for a key shorter than two characters.
    pub fn object_name_sharded(&self, short_token: &str, project_id: i64, key: &str) -> Option<String> {
        let shard: String = key.chars().take(2).collect();
        if shard.chars().count() < 2 {
            return None;
        }
        self.object_name(short_token, project_id, &format!("{shard}/{key}"))
    }

    /// A URL to download `object`, valid for `expires` (at most [`MAX_URL_EXPIRY`] on S3 and GCS).
    pub fn download(&self, object: &str, expires: Duration) -> Result<Presigned, CacheError> {
        self.sign_now(Operation::Download, object, expires, &BTreeMap::new())
    }

    /// A URL to check `object` with `HEAD`, valid for `expires`.
    pub fn head(&self, object: &str, expires: Duration) -> Result<Presigned, CacheError> {
        self.sign_now(Operation::Head, object, expires, &BTreeMap::new())
    }

    /// A URL to upload `object` with `metadata` (sent as the provider's metadata headers),
    /// valid for `expires`.
    pub fn upload(
        &self,
        object: &str,
        expires: Duration,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Presigned, CacheError> {
        self.sign_now(Operation::Upload, object, expires, metadata)
    }

    /// [`CacheStore::presign`] now, with the credentials of the role `op` assumes when the S3
    /// store has `RoleARN`/`UploadRoleARN` (from the cache, else STS: this may wait for it).
    fn sign_now(
        &self,
        op: Operation,
        object: &str,
        expires: Duration,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Presigned, CacheError> {
        let assumed = match &self.provider {
            Provider::S3(S3Store { roles: Some(roles), creds, region, .. }) => {
                match roles.role_for(op == Operation::Upload) {
                    Some(role) => {
                        let object = object.trim_start_matches('/');
                        if object.is_empty() {
                            return Err(CacheError::EmptyObject);
                        }
                        let base = creds.load_full().ok_or_else(|| {
                            CacheError::Credentials("no S3 credentials yet to assume the role with".into())
                        })?;
                        let upload = op == Operation::Upload;
                        let assumed = roles.credentials(role, &base, &region.load(), object, upload, expires);
                        Some(assumed.map_err(|e| CacheError::Credentials(e.to_string()))?)
                    }
                    None => None,
                }
            }
            _ => None,
        };
        self.presign_with(op, object, expires, metadata, Utc::now(), assumed.as_ref())
    }

    /// The URL of `op` on `object`, signed at `now` (pure: no I/O, no clock) with the store's
    /// own credentials.
    pub fn presign(
        &self,
        op: Operation,
        object: &str,
        expires: Duration,
        metadata: &BTreeMap<String, String>,
        now: DateTime<Utc>,
    ) -> Result<Presigned, CacheError> {
        self.presign_with(op, object, expires, metadata, now, None)
    }

    /// [`CacheStore::presign`] with `assumed` (an S3 role's credentials) instead of the store's.
    fn presign_with(
        &self,
        op: Operation,
        object: &str,
        expires: Duration,
        metadata: &BTreeMap<String, String>,
        now: DateTime<Utc>,
        assumed: Option<&AwsCredentials>,
    ) -> Result<Presigned, CacheError> {
        let object = object.trim_start_matches('/');
        if object.is_empty() {
            return Err(CacheError::EmptyObject);
        }
        let capped = expires.min(MAX_URL_EXPIRY).as_secs().max(1);
        let method = op.method();
        let mut headers: Vec<(String, String)> = Vec::new();
        let url = match &self.provider {
            Provider::S3(s3) => {
                let own = s3.creds.load_full();
                let creds = assumed.map(|c| Arc::new(c.clone())).or(own).ok_or_else(|| {
                    CacheError::Credentials("no S3 credentials yet: refresh_credentials has not succeeded".into())
                })?;
                if creds.expires.is_some_and(|e| e <= now) {
                    return Err(CacheError::Credentials("the S3 credentials have expired".into()));
                }
                if op == Operation::Upload {
                    let sse = s3.encryption.header_value();
                    if !sse.is_empty() {
                        headers.push(("x-amz-server-side-encryption".into(), sse.into()));
                    }
                    let kms = matches!(s3.encryption, S3Encryption::Kms | S3Encryption::DsseKms);
                    if kms && !s3.cfg.server_side_encryption_key_id.is_empty() {
                        headers.push((
                            "x-amz-server-side-encryption-aws-kms-key-id".into(),
                            s3.cfg.server_side_encryption_key_id.clone(),
                        ));
                    }
                    headers
                        .extend(metadata.iter().map(|(k, v)| (format!("x-amz-meta-{}", k.to_lowercase()), v.clone())));
                }
                let region = s3.region.load();
                let loc = sigv4::location(&s3.cfg, &region, object);
                sigv4::presign(method, &loc, &region, &creds, &headers, capped, now)
            }
            Provider::Gcs(g) => {
                let signer = g.signer.load_full().ok_or_else(|| {
                    CacheError::Credentials(
                        "no GCS key yet: refresh_credentials has not read the credentials file".into(),
                    )
                })?;
                if op == Operation::Upload {
                    headers.push(("content-type".into(), "application/octet-stream".into()));
                    if self.max_uploaded_archive_size > 0 {
                        headers.push((
                            "x-goog-content-length-range".into(),
                            format!("0,{}", self.max_uploaded_archive_size),
                        ));
                    }
                    headers
                        .extend(metadata.iter().map(|(k, v)| (format!("x-goog-meta-{}", k.to_lowercase()), v.clone())));
                }
                let path =
                    format!("/{}/{}", canonical::uri_encode(&g.bucket, false), canonical::uri_encode(object, true));
                gcs::presign(&signer, method, g.scheme, &g.host, &path, &headers, capped, now)
                    .map_err(|e| CacheError::Credentials(e.to_string()))?
            }
            Provider::Azure(a) => {
                let expiry = chrono::Duration::from_std(expires)
                    .ok()
                    .and_then(|d| now.checked_add_signed(d))
                    .unwrap_or(DateTime::<Utc>::MAX_UTC);
                let mut sas = azure::BlobSas {
                    account: &a.account,
                    container: &a.container,
                    blob: object,
                    permissions: if op == Operation::Upload { "w" } else { "r" },
                    start: now - chrono::Duration::hours(1),
                    expiry,
                    protocol: if a.scheme == "https" { "https" } else { "https,http" },
                };
                let query = match &a.key {
                    Some(key) => sas.query(key),
                    None => {
                        let key = a.delegation_key.load_full().filter(|k| k.expires > now).ok_or_else(|| {
                            CacheError::Credentials(
                                "no Azure user delegation key yet: refresh_credentials has not succeeded".into(),
                            )
                        })?;
                        // A user delegation SAS is valid only while its key is.
                        sas.start = sas.start.max(key.starts);
                        sas.expiry = sas.expiry.min(key.expires);
                        sas.delegated_query(&key)
                    }
                };
                if op == Operation::Upload {
                    headers.push(("x-ms-blob-type".into(), "BlockBlob".into()));
                    headers.extend(metadata.iter().map(|(k, v)| (format!("x-ms-meta-{k}"), v.clone())));
                }
                format!(
                    "{}://{}{}/{}/{}?{}",
                    a.scheme,
                    a.host,
                    a.base_path,
                    canonical::uri_encode(&a.container, false),
                    canonical::uri_encode(object, true),
                    query
                )
            }
        };
        Ok(Presigned { method: method.into(), url, headers })
    }
}

fn s3_store(cfg: &CacheConfig, env: &dyn Fn(&str) -> Option<String>) -> Result<S3Store, CacheError> {
    let s3 = cfg.s3.clone().ok_or_else(|| config_error("s3", "Type = \"s3\" needs a [runners.cache.s3] section"))?;
    if s3.bucket_name.is_empty() {
        return Err(config_error("s3.BucketName", "must name the bucket"));
    }
    if s3.server_address.contains('/') {
        return Err(config_error("s3.ServerAddress", "must be host[:port], without a scheme or path"));
    }
    let auth = s3.auth_type().map_err(|m| config_error("s3.AuthenticationType", m.0))?;
    let encryption = s3.encryption().map_err(|m| config_error("s3.ServerSideEncryption", m.0))?;
    let creds = ArcSwapOption::empty();
    if auth == S3AuthType::AccessKey {
        if s3.access_key.is_empty() || s3.secret_key.is_empty() {
            return Err(config_error(
                "s3.AccessKey",
                "AuthenticationType = \"access-key\" needs AccessKey and SecretKey",
            ));
        }
        creds.store(Some(Arc::new(AwsCredentials {
            access_key_id: s3.access_key.clone(),
            secret_access_key: s3.secret_key.clone(),
            session_token: Some(s3.session_token.clone()).filter(|t| !t.is_empty()),
            expires: None,
        })));
    }
    let region = if s3.bucket_location.is_empty() { DEFAULT_S3_REGION.to_string() } else { s3.bucket_location.clone() };
    let kms = matches!(encryption, S3Encryption::Kms | S3Encryption::DsseKms);
    let roles = roles::RoleAssumer::from_config(&s3, kms, env).map(Box::new);
    Ok(S3Store {
        cfg: s3,
        region: arc_swap::ArcSwap::from_pointee(region),
        region_asked: std::sync::atomic::AtomicBool::new(false),
        auth,
        encryption,
        creds,
        roles,
    })
}

fn gcs_store(cfg: &CacheConfig, env: &dyn Fn(&str) -> Option<String>) -> Result<GcsStore, CacheError> {
    let g =
        cfg.gcs.as_ref().ok_or_else(|| config_error("gcs", "Type = \"gcs\" needs a [runners.cache.gcs] section"))?;
    if g.bucket_name.is_empty() {
        return Err(config_error("gcs.BucketName", "must name the bucket"));
    }
    let endpoint = if !g.endpoint.is_empty() {
        g.endpoint.clone()
    } else if !g.universe_domain.is_empty() {
        format!("https://storage.{}", g.universe_domain)
    } else {
        "https://storage.googleapis.com".to_string()
    };
    let (scheme, host, _) = canonical::split_endpoint(&endpoint)
        .ok_or_else(|| config_error("gcs.Endpoint", format!("{endpoint:?} must be an http:// or https:// URL")))?;
    let signer = ArcSwapOption::empty();
    let mut credentials_file = None;
    if !g.access_id.is_empty() || !g.private_key.is_empty() {
        if g.access_id.is_empty() {
            return Err(config_error(
                "gcs.AccessID",
                "PrivateKey needs the AccessID (service account e-mail) it belongs to",
            ));
        }
        let loaded =
            GcsSigner::new(&g.access_id, &g.private_key).map_err(|m| config_error("gcs.PrivateKey", m.to_string()))?;
        signer.store(Some(Arc::new(loaded)));
    } else if !g.credentials_file.is_empty() {
        credentials_file = Some(g.credentials_file.clone());
    } else if let Some(file) = env("GOOGLE_APPLICATION_CREDENTIALS").filter(|f| !f.is_empty()) {
        credentials_file = Some(file);
    } else {
        return Err(config_error(
            "gcs.CredentialsFile",
            "Runway signs GCS URLs with a service account key: set CredentialsFile (or GOOGLE_APPLICATION_CREDENTIALS), or AccessID and PrivateKey",
        ));
    }
    Ok(GcsStore { bucket: g.bucket_name.clone(), scheme, host, credentials_file, signer })
}

fn azure_store(cfg: &CacheConfig) -> Result<AzureStore, CacheError> {
    let a = cfg
        .azure
        .as_ref()
        .ok_or_else(|| config_error("azure", "Type = \"azure\" needs a [runners.cache.azure] section"))?;
    for (key, value) in [("azure.AccountName", &a.account_name), ("azure.ContainerName", &a.container_name)] {
        if value.is_empty() {
            return Err(config_error(key, "must be set"));
        }
    }
    // No AccountKey: user delegation SAS through the Azure identity of the environment.
    let key = Some(a.account_key.trim())
        .filter(|k| !k.is_empty())
        .map(|k| base64::engine::general_purpose::STANDARD.decode(k))
        .transpose()
        .map_err(|e| config_error("azure.AccountKey", format!("not base64 (as the Azure portal shows it): {e}")))?;
    let endpoint = if a.endpoint.is_empty() {
        let domain = if a.storage_domain.is_empty() { "blob.core.windows.net" } else { a.storage_domain.as_str() };
        format!("https://{}.{domain}", a.account_name)
    } else {
        a.endpoint.clone()
    };
    let (scheme, host, base_path) = canonical::split_endpoint(&endpoint)
        .ok_or_else(|| config_error("azure.Endpoint", format!("{endpoint:?} must be an http:// or https:// URL")))?;
    Ok(AzureStore {
        account: a.account_name.clone(),
        key,
        delegation: azure_identity::Delegation::default(),
        delegation_key: ArcSwapOption::empty(),
        container: a.container_name.clone(),
        scheme,
        host,
        base_path,
    })
}

/// Go's `path.Join`: the non-empty parts joined with `/`, then cleaned (`.`, `..` and double
/// slashes resolved; `..` never climbs above a leading `/`).
fn join(parts: &[&str]) -> String {
    let joined = parts.iter().filter(|p| !p.is_empty()).copied().collect::<Vec<_>>().join("/");
    if joined.is_empty() {
        return String::new();
    }
    let rooted = joined.starts_with('/');
    let mut out: Vec<&str> = Vec::new();
    for segment in joined.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                if out.last().is_some_and(|s| *s != "..") {
                    out.pop();
                } else if !rooted {
                    out.push("..");
                }
            }
            s => out.push(s),
        }
    }
    let body = out.join("/");
    match (rooted, body.is_empty()) {
        (true, _) => format!("/{body}"),
        (false, true) => ".".into(),
        (false, false) => body,
    }
}

#[cfg(test)]
mod tests;
