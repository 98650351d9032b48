//! The report formats of gitlab-runner that are not zip: "gzip legacy" (one gzip member per
//! regular file, concatenated; the member's header carries the file's base name, its path as
//! the comment — both escaped as gitlab-runner's `sanitizePath` when not plain ASCII — and its
//! modification time) and "raw" (exactly one file's bytes).
//!
//! Owns: those two byte formats. Must not touch: selection, zip, the network.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use flate2::{Compression, GzBuilder};

use super::counting::Counting;
use super::{ArchiveError, Written};

/// Writes one gzip member per entry (all must be regular files; vanished ones are skipped
/// with a warning), in the given order, at gzip's default level (gitlab-runner ignores the
/// compression level for this format).
pub(crate) fn write_gzip<W: Write>(
    project_dir: &Path,
    entries: &[PathBuf],
    out: &mut W,
) -> Result<Written, ArchiveError> {
    let mut written = Written::default();
    let mut counting = Counting::new(out);
    for rel in entries {
        let full = project_dir.join(rel);
        let meta = match std::fs::symlink_metadata(&full) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                written.warnings.push(format!("File ignored: lstat {}: {e}", rel.display()));
                continue;
            }
            Err(e) => return Err(ArchiveError::Io { path: rel.clone(), op: "lstat", source: e }),
        };
        if !meta.file_type().is_file() {
            return Err(ArchiveError::NotRegular(rel.clone()));
        }
        let base = rel.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let path = rel.to_string_lossy().into_owned();
        let mut input = File::open(&full).map_err(|e| ArchiveError::Io { path: rel.clone(), op: "open", source: e })?;
        let mut gz = GzBuilder::new()
            .filename(sanitize_path(&base))
            .comment(sanitize_path(&path))
            .mtime(meta.mtime().clamp(0, u32::MAX as i64) as u32)
            .write(&mut counting, Compression::default());
        let n =
            io::copy(&mut input, &mut gz).map_err(|e| ArchiveError::Io { path: rel.clone(), op: "read", source: e })?;
        gz.finish().map_err(ArchiveError::Output)?;
        written.entries += 1;
        written.bytes_in += n;
    }
    counting.flush().map_err(ArchiveError::Output)?;
    written.bytes_out = counting.count();
    Ok(written)
}

/// Writes the one entry's bytes; more than one entry is an error, none writes nothing. The
/// entry must be a regular file (a link to one is followed, as gitlab-runner opens it).
pub(crate) fn write_raw<W: Write>(
    project_dir: &Path,
    entries: &[PathBuf],
    out: &mut W,
) -> Result<Written, ArchiveError> {
    let mut written = Written::default();
    if entries.len() > 1 {
        return Err(ArchiveError::TooManyRawFiles(entries.len()));
    }
    let Some(rel) = entries.first() else { return Ok(written) };
    let full = project_dir.join(rel);
    let meta = std::fs::metadata(&full).map_err(|e| ArchiveError::Io { path: rel.clone(), op: "stat", source: e })?;
    if !meta.is_file() {
        return Err(ArchiveError::NotRegular(rel.clone()));
    }
    let mut input = File::open(&full).map_err(|e| ArchiveError::Io { path: rel.clone(), op: "open", source: e })?;
    let n = io::copy(&mut input, out).map_err(|e| ArchiveError::Io { path: rel.clone(), op: "copy", source: e })?;
    out.flush().map_err(ArchiveError::Output)?;
    written.entries = 1;
    written.bytes_in = n;
    written.bytes_out = n;
    Ok(written)
}

/// gitlab-runner's `sanitizePath`: a name with a non-ASCII character or `%` becomes
/// `e:` + Go's `url.PathEscape` of it; others stay as they are.
pub(crate) fn sanitize_path(s: &str) -> String {
    if !s.chars().any(|c| !c.is_ascii() || c == '%') {
        return s.to_string();
    }
    let mut out = String::from("e:");
    for b in s.bytes() {
        let keep = b.is_ascii_alphanumeric() || b"-_.~$&+:=@".contains(&b);
        if keep {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
