//! The archives of artifacts and caches, made and read inside the job environment by the
//! `runway` helper commands (gitlab-runner's `artifacts-uploader`, `cache-archiver`,
//! `cache-extractor`, …): which files ([`select`]), the zip format with gitlab-runner's metadata
//! ([`write`] with [`Format::Zip`], compressed in parallel), its extraction with zip-slip
//! protection ([`extract_zip`]), gitlab-runner's `gzip` (one gzip member per file) and `raw`
//! (one file's bytes) report formats, and the SLSA provenance statement of an artifact
//! ([`metadata`], `RUNNER_GENERATE_ARTIFACTS_METADATA`).
//!
//! Everything here is synchronous file work: callers run it from `tokio::task::spawn_blocking`.
//! `zipzstd` and `tarzstd` are not supported (no zstd in the build); they parse to an error.
//!
//! Owns: file selection, archive bytes, extraction. Must not touch: the network (uploads and
//! downloads are the caller's), GitLab's API, job variables (the caller passes plain values), any
//! other module of the crate (a leaf).

mod counting;
mod gzip;
pub mod metadata;
mod pattern;
mod select;
mod zip_extract;
mod zip_write;

#[cfg(test)]
mod tests;

use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;

pub use pattern::{BadPattern, Pattern};
pub use select::{select, Selected, Selection};
pub use zip_extract::extract_zip;

/// An archive format of gitlab-runner's `artifacts:reports`/`artifact_format` (`zip`, `gzip`,
/// `raw`); caches are always zip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A zip archive of every entry (deflate), gitlab-runner's default.
    Zip,
    /// gitlab-runner's "gzip legacy": one gzip member per regular file, concatenated.
    Gzip,
    /// Exactly one regular file's bytes.
    Raw,
}

impl FromStr for Format {
    type Err = ArchiveError;

    fn from_str(s: &str) -> Result<Format, ArchiveError> {
        match s {
            "zip" => Ok(Format::Zip),
            "gzip" => Ok(Format::Gzip),
            "raw" => Ok(Format::Raw),
            other => Err(ArchiveError::UnsupportedFormat(other.to_string())),
        }
    }
}

impl Format {
    /// The upload's file name, as gitlab-runner's `artifactFilename`: the base name of `name`
    /// (`default` when empty) with `.zip` for zip, `.gz` for gzip, nothing for raw.
    pub fn file_name(self, name: &str) -> String {
        let base = Path::new(name).file_name().map(|b| b.to_string_lossy().into_owned()).unwrap_or_default();
        let base = if base.is_empty() || base == "." { "default".to_string() } else { base };
        match self {
            Format::Zip => format!("{base}.zip"),
            Format::Gzip => format!("{base}.gz"),
            Format::Raw => base,
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Zip => "zip",
            Format::Gzip => "gzip",
            Format::Raw => "raw",
        })
    }
}

/// A compression level, the value of `ARTIFACT_COMPRESSION_LEVEL` / `CACHE_COMPRESSION_LEVEL`.
/// The deflate levels are fastzip's: fastest stores, then 1, 5, 7 and 9.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Level {
    /// No compression (stored entries).
    Fastest,
    /// Deflate level 1.
    Fast,
    /// Deflate level 5.
    #[default]
    Default,
    /// Deflate level 7.
    Slow,
    /// Deflate level 9.
    Slowest,
}

impl Level {
    /// gitlab-runner's `GetCompressionLevel`: an empty or unknown value is the default level;
    /// an unknown one also gives the warning gitlab-runner logs.
    pub fn from_variable(value: &str) -> (Level, Option<String>) {
        match value.parse() {
            Ok(level) => (level, None),
            Err(_) => {
                (Level::Default, Some(format!("compression level {value:?} is invalid, falling back to default")))
            }
        }
    }

    /// The deflate level, `None` for stored entries.
    pub fn deflate(self) -> Option<u32> {
        match self {
            Level::Fastest => None,
            Level::Fast => Some(1),
            Level::Default => Some(5),
            Level::Slow => Some(7),
            Level::Slowest => Some(9),
        }
    }
}

/// A compression level name that is none of gitlab-runner's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("compression level {0:?} is invalid (expected fastest, fast, default, slow or slowest)")]
pub struct UnknownLevel(pub String);

impl FromStr for Level {
    type Err = UnknownLevel;

    fn from_str(s: &str) -> Result<Level, UnknownLevel> {
        match s {
            "fastest" => Ok(Level::Fastest),
            "fast" => Ok(Level::Fast),
            "default" | "" => Ok(Level::Default),
            "slow" => Ok(Level::Slow),
            "slowest" => Ok(Level::Slowest),
            other => Err(UnknownLevel(other.to_string())),
        }
    }
}

/// What [`write`] put into the archive.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Written {
    /// Entries written (files, directories, symbolic links).
    pub entries: u64,
    /// Bytes of file content read (uncompressed).
    pub bytes_in: u64,
    /// Bytes of archive written to the output.
    pub bytes_out: u64,
    /// Warnings for the job log: files that vanished or are not archivable ("File ignored: …"),
    /// parts of `.git` in the archive.
    pub warnings: Vec<String>,
}

/// What [`extract_zip`] created.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extracted {
    /// Entries extracted (files, directories, symbolic links).
    pub entries: u64,
    /// Bytes of file content written.
    pub bytes: u64,
    /// Warnings for the job log: ignored entry types, ownership or mode that could not be set,
    /// parts of `.git` in the archive.
    pub warnings: Vec<String>,
}

/// Why an archive could not be written or extracted. Every variant names the path or entry.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// Reading a file of the project failed.
    #[error("{path}: {op}: {source}")]
    Io {
        /// The file (as given: relative to the project directory, or absolute).
        path: PathBuf,
        /// What was being done ("open", "read", …).
        op: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
    /// Writing the archive to its output failed.
    #[error("writing the archive: {0}")]
    Output(#[source] io::Error),
    /// The `raw` format got more than one entry.
    #[error("only one file can be sent as raw (got {0} entries)")]
    TooManyRawFiles(usize),
    /// The `gzip` and `raw` formats take regular files only.
    #[error("the {0:?} is not a regular file")]
    NotRegular(PathBuf),
    /// A format this build does not write or read (`zipzstd`, `tarzstd`, a typo).
    #[error("{0:?} format: unsupported archive format (supported: zip, gzip, raw)")]
    UnsupportedFormat(String),
    /// The zip archive could not be read.
    #[error("{archive}: {source}")]
    Zip {
        /// The archive file.
        archive: PathBuf,
        /// What the zip reader said.
        source: zip::result::ZipError,
    },
    /// An entry would land outside the destination (zip slip) or has an unusable name.
    #[error("{archive}: entry {entry:?}: {reason}")]
    UnsafeEntry {
        /// The archive file.
        archive: PathBuf,
        /// The entry's name as stored.
        entry: String,
        /// Why it is refused.
        reason: String,
    },
    /// Extracting an entry failed.
    #[error("{archive}: entry {entry:?}: {op}: {source}")]
    Entry {
        /// The archive file.
        archive: PathBuf,
        /// The entry's name as stored.
        entry: String,
        /// What was being done ("create", "write", "symlink", …).
        op: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
    /// The artifact metadata could not be made (bad timestamps, unreadable file).
    #[error("artifacts metadata: {0}")]
    Metadata(String),
}

/// Writes `entries` (relative to `project_dir`, as [`select`] returns them) in `format` to
/// `out`. For zip the files are compressed in parallel (one thread per core) and written in
/// order; `out` only needs to be written forward (a temp file, a pipe). `level` applies to zip;
/// gzip uses gzip's default level as gitlab-runner does, raw copies.
pub fn write<W: Write>(
    format: Format,
    level: Level,
    project_dir: &Path,
    entries: &[PathBuf],
    out: &mut W,
) -> Result<Written, ArchiveError> {
    match format {
        Format::Zip => zip_write::write_zip(level, project_dir, entries, out),
        Format::Gzip => gzip::write_gzip(project_dir, entries, out),
        Format::Raw => gzip::write_raw(project_dir, entries, out),
    }
}

/// gitlab-runner's check for `.git` in an archive: the first component is `.git`.
fn is_git_path(rel: &str) -> bool {
    rel.split('/').find(|c| !c.is_empty() && *c != ".") == Some(".git")
}

/// gitlab-runner's two warning lines when part of `.git` is archived or extracted.
fn git_warning(operation: &str) -> [String; 2] {
    [
        format!("Part of .git directory is on the list of files to {operation}"),
        "This may introduce unexpected problems".to_string(),
    ]
}
