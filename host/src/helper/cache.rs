//! `runway cache-archiver` and `runway cache-extractor`: gitlab-runner's helper commands of
//! the same names and flags (`commands/helpers/cache_*.go`).
//!
//! The archiver zips the selected files into `--file` (gitlab-runner's local cache layout,
//! `<cache_dir>/<project>/<key>/cache.zip`), skipped when no selected file is newer than
//! the archive, and PUTs it to the pre-signed `--url` (with the `--header`s the manager
//! signed) when there is a distributed cache. The extractor GETs the pre-signed `--url` into
//! `--file` (unless the local file is as new as the object) and extracts it into the working
//! directory. Neither ever sees storage credentials: the URLs carry their own signature.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use super::artifacts::{archive_selection, compression_level};
use super::transfer::{
    clean_url, get_to_file, head_modified, put_file, retry_storage, storage_client, with_retries, Fetched, StorageError,
};
use super::{error, info, warning, HelperError};
use crate::archive::{self, Format, Selection};

/// `runway cache-archiver`.
#[derive(Debug, Clone, clap::Args)]
pub struct ArchiverArgs {
    /// The local archive (`…/<key>/cache.zip`).
    #[arg(long)]
    pub file: PathBuf,
    /// A path or glob to cache; repeatable.
    #[arg(long = "path")]
    pub paths: Vec<String>,
    /// Add the files git does not track.
    #[arg(long)]
    pub untracked: bool,
    /// A pre-signed PUT URL of the distributed cache.
    #[arg(long)]
    pub url: Option<String>,
    /// A header the PUT must carry (`Name: value`); repeatable.
    #[arg(long = "header")]
    pub headers: Vec<String>,
    /// A pre-signed HEAD URL of the same object.
    #[arg(long = "check-url")]
    pub check_url: Option<String>,
    /// Time limit of each request, minutes (`CACHE_REQUEST_TIMEOUT`).
    #[arg(long, default_value_t = 10)]
    pub timeout: u64,
    /// Do not upload archives larger than this many bytes (0: no limit).
    #[arg(long = "max-uploaded-archive-size", default_value_t = 0)]
    pub max_uploaded_archive_size: u64,
    /// fastest, fast, default, slow or slowest.
    #[arg(long = "compression-level", env = "CACHE_COMPRESSION_LEVEL")]
    pub compression_level: Option<String>,
}

/// `runway cache-extractor`.
#[derive(Debug, Clone, clap::Args)]
pub struct ExtractorArgs {
    /// The local archive (`…/<key>/cache.zip`).
    #[arg(long)]
    pub file: PathBuf,
    /// A pre-signed GET URL of the distributed cache.
    #[arg(long)]
    pub url: Option<String>,
    /// A pre-signed HEAD URL of the same object (accepted; the GET says all).
    #[arg(long = "head-url")]
    pub head_url: Option<String>,
    /// Time limit of each request, minutes (`CACHE_REQUEST_TIMEOUT`).
    #[arg(long, default_value_t = 10)]
    pub timeout: u64,
    /// Retries after the first try.
    #[arg(long, default_value_t = 2)]
    pub retry: u32,
}

fn exit(result: Result<(), HelperError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error(&e.0);
            ExitCode::FAILURE
        }
    }
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| path.display().to_string())
}

/// Run `runway cache-archiver`.
pub async fn archive_cache(args: ArchiverArgs) -> ExitCode {
    exit(archive_inner(args).await)
}

/// Is any selected file newer than the archive (or is there no archive)?
fn changed(cwd: &Path, entries: &[PathBuf], archive_file: &Path) -> bool {
    let Ok(made) = std::fs::metadata(archive_file).and_then(|m| m.modified()) else { return true };
    entries.iter().any(|e| std::fs::symlink_metadata(cwd.join(e)).and_then(|m| m.modified()).map_or(true, |t| t > made))
}

async fn archive_inner(args: ArchiverArgs) -> Result<(), HelperError> {
    let cwd = std::env::current_dir().map_err(|e| HelperError(format!("the working directory: {e}")))?;
    let selection = Selection { paths: args.paths.clone(), exclude: Vec::new(), untracked: args.untracked };
    let (probe_cwd, probe_sel, file) = (cwd.clone(), selection.clone(), args.file.clone());
    let up_to_date = tokio::task::spawn_blocking(move || {
        archive::select(&probe_cwd, &probe_sel)
            .map(|s| !s.entries.is_empty() && !changed(&probe_cwd, &s.entries, &file))
    })
    .await
    .map_err(|e| HelperError(e.to_string()))?
    .map_err(|e| HelperError(e.to_string()))?;
    if up_to_date {
        info("Archive is up to date!");
        // Up to date here, but maybe never uploaded (another instance's cache, a failed PUT).
        if let (Some(url), Some(check)) = (args.url.as_deref(), args.check_url.as_deref()) {
            let client = storage_client(Duration::from_secs(args.timeout.max(1) * 60))?;
            if let Err(StorageError::NotFound) = head_modified(&client, check).await {
                info("The shared cache does not have it yet, uploading the existing archive");
                return upload(&args, url, &client).await;
            }
        }
        return Ok(());
    }
    let level = compression_level(args.compression_level.as_deref());
    let Some((tmp, size)) = archive_selection(selection, Format::Zip, level, "cache").await? else {
        warning("No files to cache.");
        return Ok(());
    };
    let dir = args.file.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| HelperError(format!("{}: {e}", dir.display())))?;
    // The temporary file may be on another file system: copy beside the target, then rename.
    let staged = tempfile::Builder::new()
        .prefix("archive_")
        .tempfile_in(dir)
        .map_err(|e| HelperError(format!("{}: {e}", dir.display())))?;
    std::fs::copy(tmp.path(), staged.path()).map_err(|e| HelperError(format!("{}: {e}", staged.path().display())))?;
    staged.persist(&args.file).map_err(|e| HelperError(format!("{}: {e}", args.file.display())))?;
    drop(tmp);
    info(&format!("Created {} ({size} bytes)", args.file.display()));
    let Some(url) = args.url.as_deref().filter(|u| !u.is_empty()) else {
        info("No URL provided, cache will not be uploaded to shared cache server. Cache will be stored only locally.");
        return Ok(());
    };
    let client = storage_client(Duration::from_secs(args.timeout.max(1) * 60))?;
    upload(&args, url, &client).await
}

async fn upload(args: &ArchiverArgs, url: &str, client: &reqwest::Client) -> Result<(), HelperError> {
    let size = std::fs::metadata(&args.file).map_err(|e| HelperError(format!("{}: {e}", args.file.display())))?.len();
    if args.max_uploaded_archive_size > 0 && size > args.max_uploaded_archive_size {
        warning(&format!(
            "Cache archive size ({size} bytes) exceeds MaxUploadedArchiveSize ({} bytes); not uploaded",
            args.max_uploaded_archive_size
        ));
        return Ok(());
    }
    info(&format!("Uploading {} to {}", file_name(&args.file), clean_url(url)));
    with_retries("uploading cache", 3, |_| {
        let (file, headers) = (&args.file, &args.headers);
        async move { retry_storage(put_file(client, url, headers, file).await) }
    })
    .await
    .map_err(|e| HelperError(format!("uploading {}: {e}", file_name(&args.file))))?;
    Ok(())
}

/// Run `runway cache-extractor`.
pub async fn extract_cache(args: ExtractorArgs) -> ExitCode {
    exit(extract_inner(args).await)
}

async fn extract_inner(args: ExtractorArgs) -> Result<(), HelperError> {
    let cwd = std::env::current_dir().map_err(|e| HelperError(format!("the working directory: {e}")))?;
    match args.url.as_deref().filter(|u| !u.is_empty()) {
        Some(url) => {
            let client = storage_client(Duration::from_secs(args.timeout.max(1) * 60))?;
            info(&format!("Downloading {} from {}", file_name(&args.file), clean_url(url)));
            let fetched = with_retries("downloading cache", args.retry + 1, |_| {
                let (client, file) = (&client, &args.file);
                async move { retry_storage(get_to_file(client, url, file).await) }
            })
            .await;
            match fetched {
                Ok(Fetched::UpToDate) => info(&format!("{} is up to date", file_name(&args.file))),
                Ok(Fetched::Written(size)) => info(&format!("Downloaded {} ({size} bytes)", file_name(&args.file))),
                Err(StorageError::NotFound) => warning(&format!("{} not found in the shared cache", file_name(&args.file))),
                Err(e) => warning(&format!("downloading {}: {e}", file_name(&args.file))),
            }
        }
        None => info(
            "No URL provided, cache will not be downloaded from shared cache server. Instead a local version of cache will be extracted.",
        ),
    }
    if !args.file.exists() {
        return Err(HelperError(format!("cache file {} does not exist", args.file.display())));
    }
    let (file, into) = (args.file.clone(), cwd);
    tokio::task::spawn_blocking(move || {
        archive::extract_zip(&file, &into).map(|done| {
            for line in &done.warnings {
                warning(line);
            }
        })
    })
    .await
    .map_err(|e| HelperError(e.to_string()))?
    .map_err(|e| HelperError(format!("extracting {}: {e}", args.file.display())))?;
    info(&format!("Successfully extracted {}", file_name(&args.file)));
    Ok(())
}
