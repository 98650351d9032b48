//! `runway artifacts-uploader` and `runway artifacts-downloader`: gitlab-runner's helper
//! commands of the same names and flags (`commands/helpers/artifacts_*.go`).
//!
//! The uploader selects the files (`--path`, `--exclude`, `--untracked`) in the working
//! directory, archives them into a temporary file (zip, gzip or raw) and uploads it with
//! gitlab-runner's retries: 3 tries, 6 while GitLab answers 503, a 307/308 moves to the new
//! GitLab URL, 403 and 413 end at once. The archive is made once and re-sent as is on
//! every try. The downloader fetches a dependency's archive with its token (a direct
//! download from object storage on the first try only, as gitlab-runner does) and extracts
//! it into the working directory.
//!
//! `runway exec` has no GitLab: `--local-dir` keeps the archive in a directory instead of
//! uploading it, and `--local-file` extracts one instead of downloading it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use super::transfer::{with_retries, Attempt};
use super::{error, info, warning, HelperError};
use crate::archive::{self, Format, Level, Selection};
use crate::config::duration::parse_duration;
use crate::gitlab::client::{ArtifactUpload, ClientOptions, DownloadOutcome, GitLabClient, UploadOutcome};
use crate::payload::variables::expand;

/// The job the helper talks to GitLab for (gitlab-runner's `JobCredentials`): flags both
/// commands share.
#[derive(Debug, Clone, clap::Args)]
pub struct JobCredentials {
    /// The GitLab URL (the runner's `url`).
    #[arg(long)]
    pub url: Option<String>,
    /// The job token (the uploader's own; the downloader's dependency's).
    #[arg(long)]
    pub token: Option<String>,
    /// The job ID (the uploader's own; the downloader's dependency's).
    #[arg(long)]
    pub id: Option<i64>,
    /// Extra CA certificates (PEM) for a GitLab with a private CA.
    #[arg(long = "tls-ca-file", env = "CI_SERVER_TLS_CA_FILE")]
    pub tls_ca_file: Option<PathBuf>,
}

impl JobCredentials {
    /// URL, token and ID, all given, or what is missing.
    fn required(&self) -> Result<(String, String, i64), HelperError> {
        match (&self.url, &self.token, self.id) {
            (Some(url), Some(token), Some(id)) if !url.is_empty() && !token.is_empty() && id > 0 => {
                Ok((url.clone(), token.clone(), id))
            }
            (Some(_), Some(_), _) => Err(HelperError("Missing build ID (--id)".into())),
            _ => Err(HelperError("Missing runner credentials (--url and --token)".into())),
        }
    }

    /// A GitLab client trusting `--tls-ca-file` too.
    fn client(&self) -> Result<GitLabClient, HelperError> {
        let options = ClientOptions { tls_ca_file: self.tls_ca_file.clone(), ..ClientOptions::default() };
        GitLabClient::new(options).map_err(|e| HelperError(e.to_string()))
    }
}

/// `runway artifacts-uploader`.
#[derive(Debug, Clone, clap::Args)]
pub struct UploaderArgs {
    /// Which job, with which token.
    #[command(flatten)]
    pub job: JobCredentials,
    /// A path or glob (`**` included) to archive; repeatable.
    #[arg(long = "path")]
    pub paths: Vec<String>,
    /// A path or glob to leave out; repeatable.
    #[arg(long)]
    pub exclude: Vec<String>,
    /// Add the files git does not track.
    #[arg(long)]
    pub untracked: bool,
    /// The archive's name (`artifacts:name`).
    #[arg(long, default_value = "artifacts")]
    pub name: String,
    /// `artifacts:expire_in`.
    #[arg(long = "expire-in")]
    pub expire_in: Option<String>,
    /// zip, gzip or raw.
    #[arg(long = "artifact-format")]
    pub format: Option<String>,
    /// archive, junit, dotenv, ... (what GitLab files it as).
    #[arg(long = "artifact-type")]
    pub artifact_type: Option<String>,
    /// fastest, fast, default, slow or slowest.
    #[arg(long = "compression-level", env = "ARTIFACT_COMPRESSION_LEVEL")]
    pub compression_level: Option<String>,
    /// The whole upload's time limit (`1h`, `30m0s`).
    #[arg(long, default_value = "1h")]
    pub timeout: String,
    /// Accepted for gitlab-runner compatibility; the upload's time limit covers it.
    #[arg(long = "response-header-timeout")]
    pub response_header_timeout: Option<String>,
    /// Keep the archive in this directory instead of uploading it (`runway exec`).
    #[arg(long = "local-dir")]
    pub local_dir: Option<PathBuf>,
}

/// `runway artifacts-downloader`.
#[derive(Debug, Clone, clap::Args)]
pub struct DownloaderArgs {
    /// Which dependency, with which token.
    #[command(flatten)]
    pub job: JobCredentials,
    /// Let GitLab redirect to object storage (`FF_USE_DIRECT_DOWNLOAD`, on by default).
    #[arg(long = "direct-download", env = "FF_USE_DIRECT_DOWNLOAD", default_value_t = true, action = clap::ArgAction::Set)]
    pub direct_download: bool,
    /// Retries after the first try.
    #[arg(long, default_value_t = 2)]
    pub retry: u32,
    /// Extract this archive instead of downloading one (`runway exec`).
    #[arg(long = "local-file")]
    pub local_file: Option<PathBuf>,
}

fn env_expand(text: &str) -> String {
    expand(text, &|key| std::env::var(key).ok())
}

/// The multipart file name: the base of `name`, with the format's extension.
pub fn artifact_filename(name: &str, format: Format) -> String {
    format.file_name(name)
}

/// The compression level of `ARTIFACT_COMPRESSION_LEVEL`/`CACHE_COMPRESSION_LEVEL`, with a
/// warning for a value that is not one.
pub(super) fn compression_level(value: Option<&str>) -> Level {
    let (level, warn) = Level::from_variable(value.unwrap_or(""));
    if let Some(w) = warn {
        warning(&w);
    }
    level
}

/// Select and archive `selection` of the working directory into a temporary file; `None`
/// when nothing matched (said in the log).
pub(super) async fn archive_selection(
    selection: Selection,
    format: Format,
    level: Level,
    what: &str,
) -> Result<Option<(tempfile::NamedTempFile, u64)>, HelperError> {
    let cwd = std::env::current_dir().map_err(|e| HelperError(format!("the working directory: {e}")))?;
    let what = what.to_string();
    tokio::task::spawn_blocking(move || {
        let selected = archive::select(&cwd, &selection).map_err(|e| HelperError(e.to_string()))?;
        for line in &selected.warnings {
            warning(line);
        }
        for line in &selected.infos {
            info(line);
        }
        if selected.entries.is_empty() {
            return Ok(None);
        }
        let mut file = tempfile::Builder::new()
            .prefix(&format!("runway-{what}"))
            .tempfile()
            .map_err(|e| HelperError(e.to_string()))?;
        let written = archive::write(format, level, &cwd, &selected.entries, file.as_file_mut())
            .map_err(|e| HelperError(format!("creating the archive: {e}")))?;
        for line in &written.warnings {
            warning(line);
        }
        Ok(Some((file, written.bytes_out)))
    })
    .await
    .map_err(|e| HelperError(format!("archiving: {e}")))?
}

/// Run `runway artifacts-uploader`.
pub async fn upload(args: UploaderArgs) -> ExitCode {
    match upload_inner(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error(&e.0);
            ExitCode::FAILURE
        }
    }
}

async fn upload_inner(args: UploaderArgs) -> Result<(), HelperError> {
    let format = match args.format.as_deref().filter(|f| !f.is_empty()) {
        None => Format::Zip,
        Some(f) => f.parse::<Format>().map_err(|e| HelperError(e.to_string()))?,
    };
    let level = compression_level(args.compression_level.as_deref());
    let timeout = parse_duration(&args.timeout).map_err(|e| HelperError(format!("--timeout: {e}")))?;
    let (url, token, id) = match &args.local_dir {
        Some(_) => (String::new(), String::new(), 0),
        None => args.job.required()?,
    };
    let name = env_expand(&args.name);
    let selection = Selection {
        paths: args.paths.iter().map(|p| env_expand(p)).collect(),
        exclude: args.exclude.iter().map(|p| env_expand(p)).collect(),
        untracked: args.untracked,
    };
    let Some((file, size)) = archive_selection(selection, format, level, "artifacts").await? else {
        error("No files to upload");
        return Ok(());
    };
    let filename = artifact_filename(&name, format);
    let artifact_type = args.artifact_type.clone().unwrap_or_default();
    let kind = if artifact_type.is_empty() { "archive" } else { artifact_type.as_str() };
    if let Some(dir) = &args.local_dir {
        std::fs::create_dir_all(dir).map_err(|e| HelperError(format!("{}: {e}", dir.display())))?;
        let target = dir.join(&filename);
        std::fs::copy(file.path(), &target).map_err(|e| HelperError(format!("{}: {e}", target.display())))?;
        info(&format!("Saved artifacts as {kind:?} to {} ({size} bytes)", target.display()));
        return Ok(());
    }
    let client = Arc::new(args.job.client()?);
    let expire_in = args.expire_in.clone().unwrap_or_default();
    let format_name = args.format.clone().unwrap_or_default();
    let mut url = url;
    let work = async {
        let mut tries = 0u32;
        let mut unavailable = 0u32;
        let mut backoff = Duration::from_secs(1);
        loop {
            tries += 1;
            let upload = ArtifactUpload {
                url: &url,
                job_id: id,
                token: &token,
                file: file.path(),
                filename: &filename,
                format: &format_name,
                artifact_type: &artifact_type,
                expire_in: &expire_in,
            };
            let outcome = client.upload_artifact(&upload).await.map_err(|e| HelperError(e.to_string()))?;
            let prefix = format!("Uploading artifacts as {kind:?} to coordinator...");
            let retry_reason = match outcome {
                UploadOutcome::Succeeded => {
                    info(&format!("{prefix} 201 Created  id={id} responseStatus=201 Created ({size} bytes)"));
                    return Ok(());
                }
                UploadOutcome::Forbidden(m) => return Err(HelperError(format!("{prefix} forbidden: {m}"))),
                UploadOutcome::TooLarge(m) => return Err(HelperError(format!("{prefix} too large archive: {m}"))),
                UploadOutcome::Redirected(location) => {
                    let mut moved = reqwest::Url::parse(&location)
                        .map_err(|e| HelperError(format!("{prefix} redirected to an invalid URL {location:?}: {e}")))?;
                    moved.set_path("");
                    moved.set_query(None);
                    let moved = moved.as_str().trim_end_matches('/').to_string();
                    info(&format!("{prefix} redirected  location={location} new-url={moved}"));
                    url = moved;
                    "request redirected".to_string()
                }
                UploadOutcome::ServiceUnavailable(m) => {
                    unavailable += 1;
                    warning(&format!("{prefix} service unavailable: {m}"));
                    "service unavailable".to_string()
                }
                UploadOutcome::Failed(m) => {
                    warning(&format!("{prefix} failed: {m}"));
                    m
                }
            };
            let max = if unavailable > 0 { 6 } else { 3 };
            if tries >= max {
                return Err(HelperError(format!("uploading artifacts failed after {tries} tries: {retry_reason}")));
            }
            warning(&format!("Retrying... error={retry_reason}"));
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(result) => result,
        Err(_) => Err(HelperError(format!("uploading artifacts timed out after {}", args.timeout))),
    }
}

/// Run `runway artifacts-downloader`.
pub async fn download(args: DownloaderArgs) -> ExitCode {
    match download_inner(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error(&e.0);
            ExitCode::FAILURE
        }
    }
}

async fn download_inner(args: DownloaderArgs) -> Result<(), HelperError> {
    let cwd = std::env::current_dir().map_err(|e| HelperError(format!("the working directory: {e}")))?;
    if let Some(local) = &args.local_file {
        return extract(local.clone(), cwd).await;
    }
    let (url, token, id) = args.job.required()?;
    let client = args.job.client()?;
    let file =
        tempfile::Builder::new().prefix("runway-artifacts").tempfile().map_err(|e| HelperError(e.to_string()))?;
    let path = file.path().to_path_buf();
    let direct = args.direct_download;
    with_retries("downloading artifacts", args.retry + 1, |attempt| {
        let (client, url, token, path) = (&client, &url, &token, &path);
        async move {
            // Object storage on the first try only; later tries go through GitLab itself.
            let direct = direct && attempt == 0;
            let prefix = "Downloading artifacts from coordinator...";
            match client.download_artifact(url, id, token, direct, path).await {
                Err(e) => Attempt::Done(Err(HelperError(format!("{prefix} {e}")))),
                Ok(DownloadOutcome::Succeeded(size)) => {
                    info(&format!("{prefix} ok  id={id} responseStatus=200 OK ({size} bytes)"));
                    Attempt::Done(Ok(()))
                }
                Ok(DownloadOutcome::Forbidden(m)) => {
                    Attempt::Done(Err(HelperError(format!("{prefix} forbidden  id={id}: {m}"))))
                }
                Ok(DownloadOutcome::NotFound(m)) => {
                    Attempt::Done(Err(HelperError(format!("{prefix} not found  id={id}: {m}"))))
                }
                Ok(DownloadOutcome::Failed(m)) => Attempt::Retry(HelperError(format!("{prefix} failed  id={id}: {m}"))),
            }
        }
    })
    .await?;
    let result = extract(path, cwd).await;
    drop(file);
    result
}

async fn extract(archive_file: PathBuf, into: PathBuf) -> Result<(), HelperError> {
    tokio::task::spawn_blocking(move || {
        archive::extract_zip(&archive_file, &into)
            .map(|done| {
                for line in &done.warnings {
                    warning(line);
                }
            })
            .map_err(|e| HelperError(format!("extracting {}: {e}", archive_file.display())))
    })
    .await
    .map_err(|e| HelperError(format!("extracting: {e}")))?
}
