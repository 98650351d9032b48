//! The artifacts calls (protocol §1.11–§1.12): `POST /jobs/:id/artifacts` (one upload of one
//! archive, streamed from a file as the multipart `file` part) and `GET /jobs/:id/artifacts`
//! (a dependency's archive, following a `direct_download` redirect to object storage without
//! the job token).
//!
//! Each call is ONE attempt mapped to gitlab-runner's upload/download states; the helper
//! commands that run inside the job environment (`crate::helper`) own the retries, as
//! gitlab-runner's `artifacts-uploader`/`artifacts-downloader` do.

use std::path::Path;

use reqwest::header::{ACCEPT, LOCATION, USER_AGENT};
use reqwest::multipart::{Form, Part};
use reqwest::{Body, StatusCode};
use tokio::io::AsyncWriteExt;
use tokio_util::io::ReaderStream;

use super::http::error_message;
use super::{api_base_url, describe_reqwest_error, ApiError, Endpoint, GitLabClient, RequestRecord};

/// One artifact upload: which job, with which token, which file, and how GitLab should file it.
#[derive(Debug, Clone)]
pub struct ArtifactUpload<'a> {
    /// The runner URL (`url` of config.toml, or what the redirect said).
    pub url: &'a str,
    /// The job's ID.
    pub job_id: i64,
    /// The job's token.
    pub token: &'a str,
    /// The archive on disk.
    pub file: &'a Path,
    /// The multipart file name (`artifacts.zip`, `junit.xml.gz`, ...).
    pub filename: &'a str,
    /// `artifact_format` (zip, gzip, raw); empty leaves GitLab's default.
    pub format: &'a str,
    /// `artifact_type` (archive, junit, dotenv, ...); empty leaves GitLab's default.
    pub artifact_type: &'a str,
    /// `expire_in`; empty leaves the project's default.
    pub expire_in: &'a str,
}

/// What one upload attempt came to (gitlab-runner's `UploadState`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UploadOutcome {
    /// 201.
    Succeeded,
    /// 307/308 to another GitLab URL: upload there instead.
    Redirected(String),
    /// 403: the job token is not (or no longer) valid.
    Forbidden(String),
    /// 413: the archive is larger than the project allows.
    TooLarge(String),
    /// 503: GitLab is unavailable (retried longer).
    ServiceUnavailable(String),
    /// Another status, or no response at all (retried).
    Failed(String),
}

/// What one download attempt came to (gitlab-runner's `DownloadState`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DownloadOutcome {
    /// The archive is in the file; its size.
    Succeeded(u64),
    /// 401/403 (GitLab or object storage).
    Forbidden(String),
    /// 404: the job has no artifacts (expired, erased, never uploaded).
    NotFound(String),
    /// Anything else (retried).
    Failed(String),
}

impl GitLabClient {
    /// One `POST /jobs/:id/artifacts` with `upload.file` streamed as the multipart `file` part.
    pub async fn upload_artifact(&self, upload: &ArtifactUpload<'_>) -> Result<UploadOutcome, ApiError> {
        let base = api_base_url(upload.url)?;
        let mut url = Self::endpoint_url(&base, &format!("jobs/{}/artifacts", upload.job_id))?;
        {
            let mut query = url.query_pairs_mut();
            for (key, value) in [
                ("artifact_format", upload.format),
                ("artifact_type", upload.artifact_type),
                ("expire_in", upload.expire_in),
            ] {
                if !value.is_empty() {
                    query.append_pair(key, value);
                }
            }
        }
        let file = tokio::fs::File::open(upload.file)
            .await
            .map_err(|e| ApiError::File(format!("{}: {e}", upload.file.display())))?;
        let size = file.metadata().await.map_err(|e| ApiError::File(format!("{}: {e}", upload.file.display())))?.len();
        let part = Part::stream_with_length(Body::wrap_stream(ReaderStream::with_capacity(file, 256 * 1024)), size)
            .file_name(upload.filename.to_string())
            .mime_str("application/octet-stream")
            .map_err(|e| ApiError::ClientSetup(describe_reqwest_error(&e)))?;
        let form = Form::new().part("file", part);
        let path = url.path().to_string();
        let started = std::time::Instant::now();
        let result = self
            .http
            .post(url)
            .header(USER_AGENT, &self.user_agent)
            .header(ACCEPT, "application/json")
            .header("JOB-TOKEN", upload.token)
            .multipart(form)
            .send()
            .await;
        if let Some(hook) = &self.hook {
            hook(&RequestRecord {
                endpoint: Endpoint::UploadArtifacts,
                method: "POST",
                path: &path,
                status: result.as_ref().ok().map(|r| r.status().as_u16()),
                duration: started.elapsed(),
                attempt: 1,
            });
        }
        let response = match result {
            Ok(r) => r,
            Err(e) => return Ok(UploadOutcome::Failed(describe_reqwest_error(&e))),
        };
        let status = response.status();
        let location = response.headers().get(LOCATION).and_then(|v| v.to_str().ok()).map(str::to_string);
        let message = format!("{} {}", status.as_u16(), error_message(response).await);
        Ok(match status {
            StatusCode::CREATED => UploadOutcome::Succeeded,
            StatusCode::TEMPORARY_REDIRECT | StatusCode::PERMANENT_REDIRECT => match location {
                Some(location) => UploadOutcome::Redirected(location),
                None => UploadOutcome::Failed(format!("{message} (redirect without Location)")),
            },
            StatusCode::FORBIDDEN => UploadOutcome::Forbidden(message),
            StatusCode::PAYLOAD_TOO_LARGE => UploadOutcome::TooLarge(message),
            StatusCode::SERVICE_UNAVAILABLE => UploadOutcome::ServiceUnavailable(message),
            _ => UploadOutcome::Failed(message),
        })
    }

    /// One `GET /jobs/:id/artifacts` into `into` (created or truncated). With
    /// `direct_download`, GitLab may answer with a redirect to object storage; it is followed
    /// (up to 10 hops) without the job token, which object storage must never see.
    pub async fn download_artifact(
        &self,
        url: &str,
        job_id: i64,
        token: &str,
        direct_download: bool,
        into: &Path,
    ) -> Result<DownloadOutcome, ApiError> {
        let base = api_base_url(url)?;
        let mut url = Self::endpoint_url(&base, &format!("jobs/{job_id}/artifacts"))?;
        url.query_pairs_mut().append_pair("direct_download", if direct_download { "true" } else { "false" });
        let started = std::time::Instant::now();
        let result = self
            .no_redirect
            .get(url.clone())
            .header(USER_AGENT, &self.user_agent)
            .header("JOB-TOKEN", token)
            .send()
            .await;
        if let Some(hook) = &self.hook {
            hook(&RequestRecord {
                endpoint: Endpoint::DownloadArtifacts,
                method: "GET",
                path: url.path(),
                status: result.as_ref().ok().map(|r| r.status().as_u16()),
                duration: started.elapsed(),
                attempt: 1,
            });
        }
        let mut response = match result {
            Ok(r) => r,
            Err(e) => return Ok(DownloadOutcome::Failed(describe_reqwest_error(&e))),
        };
        let mut hops = 0;
        while response.status().is_redirection() {
            let Some(next) = response
                .headers()
                .get(LOCATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|l| response.url().join(l).ok())
            else {
                return Ok(DownloadOutcome::Failed(format!(
                    "{} redirect without a usable Location",
                    response.status()
                )));
            };
            hops += 1;
            if hops > 10 {
                return Ok(DownloadOutcome::Failed("too many redirects".into()));
            }
            response = match self.no_redirect.get(next).header(USER_AGENT, &self.user_agent).send().await {
                Ok(r) => r,
                Err(e) => return Ok(DownloadOutcome::Failed(describe_reqwest_error(&e))),
            };
        }
        let status = response.status();
        if !status.is_success() {
            let message = format!("{} {}", status.as_u16(), error_message(response).await);
            return Ok(match status {
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => DownloadOutcome::Forbidden(message),
                StatusCode::NOT_FOUND => DownloadOutcome::NotFound(message),
                _ => DownloadOutcome::Failed(message),
            });
        }
        let io_error = |e: std::io::Error| ApiError::File(format!("{}: {e}", into.display()));
        let mut file = tokio::fs::File::create(into).await.map_err(io_error)?;
        let mut written = 0u64;
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    file.write_all(&chunk).await.map_err(io_error)?;
                    written += chunk.len() as u64;
                }
                Ok(None) => break,
                Err(e) => return Ok(DownloadOutcome::Failed(describe_reqwest_error(&e))),
            }
        }
        file.flush().await.map_err(io_error)?;
        Ok(DownloadOutcome::Succeeded(written))
    }
}
