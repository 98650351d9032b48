//! What the helper commands share: gitlab-runner's retry loop (a fixed number of tries,
//! backoff from 1 s doubling to at most 5 s) and plain HTTP transfers to pre-signed object
//! storage URLs (GET into a file, PUT from a file, HEAD), which carry no credentials of
//! their own beyond the URL and the headers the manager signed.

use std::future::Future;
use std::path::Path;
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderName, HeaderValue, CONTENT_LENGTH, LAST_MODIFIED};
use reqwest::{Body, Client, StatusCode};
use tokio::io::AsyncWriteExt;
use tokio_util::io::ReaderStream;

use super::HelperError;

/// Whether a failed attempt may be tried again.
pub(super) enum Attempt<T, E> {
    /// Done (successfully or not): stop.
    Done(Result<T, E>),
    /// Failed in a way worth another try, with what to say.
    Retry(E),
}

/// Run `attempt` up to `tries` times (≥ 1), waiting 1 s, 2 s, 4 s, 5 s, … between tries and
/// printing `what` with the error before each retry. `attempt` gets the try number (0-based).
pub(super) async fn with_retries<T, E: std::fmt::Display, F, Fut>(
    what: &str,
    tries: u32,
    mut attempt: F,
) -> Result<T, E>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Attempt<T, E>>,
{
    let mut backoff = Duration::from_secs(1);
    let mut n = 0;
    loop {
        match attempt(n).await {
            Attempt::Done(result) => return result,
            Attempt::Retry(e) if n + 1 >= tries.max(1) => return Err(e),
            Attempt::Retry(e) => {
                super::warning(&format!("Retrying {what}... {e}"));
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                n += 1;
            }
        }
    }
}

/// The URL without its query (the signature): safe to print.
pub(super) fn clean_url(url: &str) -> String {
    match url.split_once('?') {
        Some((base, _)) => base.to_string(),
        None => url.to_string(),
    }
}

/// An HTTP client for object storage with an overall `timeout` per request.
pub(super) fn storage_client(timeout: Duration) -> Result<Client, HelperError> {
    Client::builder()
        .connect_timeout(Duration::from_secs(30))
        .timeout(timeout)
        .build()
        .map_err(|e| HelperError(format!("cannot set up the HTTP client: {e}")))
}

/// What a storage request came to.
pub(super) enum StorageError {
    /// 404: no such object.
    NotFound,
    /// A 5xx or no response: worth another try.
    Retryable(String),
    /// Anything else.
    Failed(String),
}

impl std::fmt::Display for StorageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StorageError::NotFound => f.write_str("not found (404)"),
            StorageError::Retryable(m) | StorageError::Failed(m) => f.write_str(m),
        }
    }
}

fn status_error(status: StatusCode, body: &str) -> StorageError {
    let snippet: String = body.chars().take(300).collect();
    let message = format!("HTTP {status}: {}", snippet.trim());
    if status == StatusCode::NOT_FOUND {
        StorageError::NotFound
    } else if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
        StorageError::Retryable(message)
    } else {
        StorageError::Failed(message)
    }
}

/// `Last-Modified` of the object behind `url` (a HEAD request).
pub(super) async fn head_modified(client: &Client, url: &str) -> Result<Option<SystemTime>, StorageError> {
    let response = client.head(url).send().await.map_err(|e| StorageError::Retryable(e.to_string()))?;
    if !response.status().is_success() {
        return Err(status_error(response.status(), ""));
    }
    Ok(last_modified(response.headers()))
}

fn last_modified(headers: &reqwest::header::HeaderMap) -> Option<SystemTime> {
    let text = headers.get(LAST_MODIFIED)?.to_str().ok()?;
    chrono::DateTime::parse_from_rfc2822(text).ok().map(SystemTime::from)
}

/// What a GET brought.
pub(super) enum Fetched {
    /// The local file is at least as new as the remote object: nothing was written.
    UpToDate,
    /// Written to the file: its size.
    Written(u64),
}

/// GET `url` into `file` (through a temporary file beside it, renamed when complete), unless
/// `file` already exists and is not older than the object.
pub(super) async fn get_to_file(client: &Client, url: &str, file: &Path) -> Result<Fetched, StorageError> {
    let mut response = client.get(url).send().await.map_err(|e| StorageError::Retryable(e.to_string()))?;
    if !response.status().is_success() {
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        return Err(status_error(status, &body));
    }
    let modified = last_modified(response.headers());
    let local = std::fs::metadata(file).and_then(|m| m.modified()).ok();
    if let (Some(remote), Some(local)) = (modified, local) {
        if remote <= local {
            return Ok(Fetched::UpToDate);
        }
    }
    let io = |e: std::io::Error| StorageError::Failed(format!("{}: {e}", file.display()));
    let dir = file.parent().unwrap_or(Path::new("."));
    tokio::fs::create_dir_all(dir).await.map_err(io)?;
    let tmp = tempfile::Builder::new().prefix(".cache_download").tempfile_in(dir).map_err(io)?;
    let (std_file, tmp_path) = tmp.into_parts();
    let mut out = tokio::fs::File::from_std(std_file);
    let mut written = 0u64;
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                out.write_all(&chunk).await.map_err(io)?;
                written += chunk.len() as u64;
            }
            Ok(None) => break,
            Err(e) => return Err(StorageError::Retryable(e.to_string())),
        }
    }
    out.flush().await.map_err(io)?;
    drop(out);
    tmp_path.persist(file).map_err(|e| io(e.error))?;
    if let Some(remote) = modified {
        // The local copy carries the object's time, so the next job sees it is up to date.
        if let Ok(f) = std::fs::File::options().write(true).open(file) {
            let _ = f.set_modified(remote);
        }
    }
    Ok(Fetched::Written(written))
}

/// PUT `file` to `url` with `headers` (`Name: value`, as the manager signed them).
pub(super) async fn put_file(client: &Client, url: &str, headers: &[String], file: &Path) -> Result<u64, StorageError> {
    let io = |e: std::io::Error| StorageError::Failed(format!("{}: {e}", file.display()));
    let f = tokio::fs::File::open(file).await.map_err(io)?;
    let size = f.metadata().await.map_err(io)?.len();
    let mut request = client
        .put(url)
        .header(CONTENT_LENGTH, size)
        .body(Body::wrap_stream(ReaderStream::with_capacity(f, 256 * 1024)));
    for header in headers {
        let Some((name, value)) = header.split_once(':') else {
            return Err(StorageError::Failed(format!("header {header:?} is not `Name: value`")));
        };
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|e| StorageError::Failed(format!("header {name:?}: {e}")))?;
        let value =
            HeaderValue::from_str(value.trim()).map_err(|e| StorageError::Failed(format!("header {name}: {e}")))?;
        request = request.header(name, value);
    }
    let response = request.send().await.map_err(|e| StorageError::Retryable(e.to_string()))?;
    if !response.status().is_success() {
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        return Err(status_error(status, &body));
    }
    Ok(size)
}

/// Whether a storage error is worth another try.
pub(super) fn retry_storage<T>(result: Result<T, StorageError>) -> Attempt<T, StorageError> {
    match result {
        Err(e @ StorageError::Retryable(_)) => Attempt::Retry(e),
        other => Attempt::Done(other),
    }
}
