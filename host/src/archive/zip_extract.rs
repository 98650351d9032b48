//! Zip extraction for downloaded artifacts and caches (`cache.zip`), as gitlab-runner's
//! extractor, with zip-slip protection.
//!
//! An entry's name must be relative and may not contain `..` or NUL; every directory on the
//! way to it inside the destination must be a real directory or a symbolic link that resolves
//! inside the destination, so nothing is ever written through a link that points out (the link
//! itself may point anywhere: it is extracted as a link). Existing files and links are replaced
//! (removed, then created anew, as gitlab-runner); existing directories are kept. Modes (the
//! permission bits; set-id bits dropped), modification times (the extended timestamp field,
//! else the MS-DOS time) and, when running as root, the unix uid/gid field are applied in a
//! second pass, so directories keep their times after their files are written. Errors name the
//! archive and the entry; failures to set mode, time or owner are warnings, once per kind.
//!
//! Owns: writing an archive's entries under a destination. Must not touch: selection, the
//! network, anything outside the destination.

use std::collections::HashSet;
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use chrono::{Local, TimeZone};
use zip::extra_fields::ExtraField;

use super::{git_warning, is_git_path, ArchiveError, Extracted};

const S_IFMT: u32 = 0o170000;
const S_IFLNK: u32 = 0o120000;
const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;

#[derive(PartialEq, Eq, Clone, Copy)]
enum Kind {
    File,
    Dir,
    Link,
}

/// What the second pass applies to one extracted entry.
struct Applied {
    path: PathBuf,
    entry: String,
    kind: Kind,
    perm: u32,
    mtime: Option<i64>,
    owner: Option<(u32, u32)>,
}

/// Extracts the zip file `archive` under `dest` (created if missing).
pub fn extract_zip(archive: &Path, dest: &Path) -> Result<Extracted, ArchiveError> {
    let zip_err = |source| ArchiveError::Zip { archive: archive.to_path_buf(), source };
    let file = File::open(archive).map_err(|e| zip_err(zip::result::ZipError::Io(e)))?;
    let mut zip = zip::ZipArchive::new(file).map_err(zip_err)?;
    std::fs::create_dir_all(dest).map_err(|e| ArchiveError::Io {
        path: dest.to_path_buf(),
        op: "create destination",
        source: e,
    })?;
    let dest_real = std::fs::canonicalize(dest).map_err(|e| ArchiveError::Io {
        path: dest.to_path_buf(),
        op: "resolve destination",
        source: e,
    })?;
    let mut out = Extracted::default();
    let mut warned: HashSet<&'static str> = HashSet::new();
    let mut applied = Vec::with_capacity(zip.len());
    let as_root = geteuid() == 0;

    for index in 0..zip.len() {
        let mut entry = zip.by_index(index).map_err(zip_err)?;
        let name = String::from_utf8_lossy(entry.name_raw()).into_owned();
        let unsafe_entry =
            |reason: String| ArchiveError::UnsafeEntry { archive: archive.to_path_buf(), entry: name.clone(), reason };
        let rel = safe_relative(&name).map_err(|e| unsafe_entry(e.to_string()))?;
        if rel.as_os_str().is_empty() {
            continue;
        }
        if is_git_path(&rel.to_string_lossy()) && warned.insert("git") {
            out.warnings.extend(git_warning("extract"));
        }
        let mode = entry.unix_mode();
        let kind = match mode.map(|m| m & S_IFMT) {
            Some(S_IFLNK) => Kind::Link,
            Some(S_IFDIR) => Kind::Dir,
            _ if entry.is_dir() => Kind::Dir,
            Some(S_IFREG) | Some(0) | None => Kind::File,
            Some(_) => {
                out.warnings.push(format!("File ignored: {name:?}"));
                continue;
            }
        };
        let entry_err =
            |op, source| ArchiveError::Entry { archive: archive.to_path_buf(), entry: name.clone(), op, source };
        let path = dest.join(&rel);
        prepare_parents(dest, &dest_real, &rel).map_err(|e| match e {
            ParentError::Unsafe(reason) => unsafe_entry(reason),
            ParentError::Io(e) => entry_err("create parent directories", e),
        })?;
        match kind {
            Kind::Dir => match std::fs::create_dir(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(entry_err("mkdir", e)),
            },
            Kind::Link => {
                let mut target = Vec::new();
                io::copy(&mut entry, &mut target).map_err(|e| entry_err("read", e))?;
                remove_existing(&path);
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&target), &path)
                    .map_err(|e| entry_err("symlink", e))?;
            }
            Kind::File => {
                remove_existing(&path);
                let perm = mode.map(|m| m & 0o777).unwrap_or(0o644);
                // create_new (O_EXCL) never follows a link that appeared at this path.
                let mut f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(perm)
                    .open(&path)
                    .map_err(|e| entry_err("create", e))?;
                out.bytes += io::copy(&mut entry, &mut f).map_err(|e| entry_err("write", e))?;
            }
        }
        out.entries += 1;
        let mtime = entry
            .extra_data_fields()
            .find_map(|f| match f {
                ExtraField::ExtendedTimestamp(ts) => ts.mod_time().map(i64::from),
                _ => None,
            })
            .or_else(|| {
                let t = entry.last_modified()?;
                Local
                    .with_ymd_and_hms(
                        t.year().into(),
                        t.month().into(),
                        t.day().into(),
                        t.hour().into(),
                        t.minute().into(),
                        t.second().into(),
                    )
                    .earliest()
                    .map(|d| d.timestamp())
            });
        let owner = entry.extra_data_fields().find_map(|f| match f {
            ExtraField::Custom(c) if c.header_id == 0x7875 => parse_uid_gid(&c.data),
            _ => None,
        });
        let default_perm = if kind == Kind::Dir { 0o755 } else { 0o644 };
        applied.push(Applied {
            path,
            entry: name.clone(),
            kind,
            perm: mode.map(|m| m & 0o777).unwrap_or(default_perm),
            mtime,
            owner,
        });
    }

    for a in &applied {
        // A later entry may have replaced this path: never chmod or chown through a link.
        let Ok(meta) = std::fs::symlink_metadata(&a.path) else { continue };
        let is_link = meta.file_type().is_symlink();
        if a.kind != Kind::Link && !is_link {
            if let Err(e) = std::fs::set_permissions(&a.path, std::fs::Permissions::from_mode(a.perm)) {
                if warned.insert("chmod") {
                    out.warnings.push(format!("{}: chmod: {e} (suppressing repeats)", a.entry));
                }
            }
        }
        if as_root {
            if let Some((uid, gid)) = a.owner {
                if let Err(e) = std::os::unix::fs::lchown(&a.path, Some(uid), Some(gid)) {
                    if warned.insert("lchown") {
                        out.warnings.push(format!("{}: lchown: {e} (suppressing repeats)", a.entry));
                    }
                }
            }
        }
        if let (Some(mtime), false) = (a.mtime, a.kind == Kind::Link || is_link) {
            if let Err(e) = set_mtime(&a.path, mtime) {
                if warned.insert("chtimes") {
                    out.warnings.push(format!("{}: chtimes: {e} (suppressing repeats)", a.entry));
                }
            }
        }
    }
    Ok(out)
}

/// Why an entry's name is not extracted.
#[derive(Debug, thiserror::Error)]
enum UnsafeName {
    #[error("the name contains a NUL byte")]
    Nul,
    #[error("absolute names are not extracted (the entry would land outside the destination)")]
    Absolute,
    #[error("'..' in the name (the entry would land outside the destination)")]
    Parent,
}

/// The entry's name as a relative path of normal components; refuses absolute names, `..`,
/// NUL. An empty result (`./`) is no entry.
fn safe_relative(name: &str) -> Result<PathBuf, UnsafeName> {
    if name.contains('\0') {
        return Err(UnsafeName::Nul);
    }
    if name.starts_with('/') {
        return Err(UnsafeName::Absolute);
    }
    let mut rel = PathBuf::new();
    for c in name.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(UnsafeName::Parent),
            normal => rel.push(normal),
        }
    }
    Ok(rel)
}

enum ParentError {
    Unsafe(String),
    Io(io::Error),
}

/// Creates the directories between `dest` and the entry; refuses a component that is a link
/// resolving outside the destination or that is not a directory.
fn prepare_parents(dest: &Path, dest_real: &Path, rel: &Path) -> Result<(), ParentError> {
    let Some(parent) = rel.parent() else { return Ok(()) };
    let mut current = dest.to_path_buf();
    let mut shown = PathBuf::new();
    for c in parent.components() {
        current.push(c);
        shown.push(c);
        match std::fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let resolved = std::fs::canonicalize(&current).map_err(|e| {
                    ParentError::Unsafe(format!(
                        "its parent {} is a symbolic link that does not resolve: {e}",
                        shown.display()
                    ))
                })?;
                if !resolved.starts_with(dest_real) {
                    return Err(ParentError::Unsafe(format!(
                        "its parent {} is a symbolic link to {} outside the destination",
                        shown.display(),
                        resolved.display()
                    )));
                }
                if !resolved.is_dir() {
                    return Err(ParentError::Io(io::Error::other(format!("{} is not a directory", shown.display()))));
                }
            }
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(ParentError::Io(io::Error::other(format!("{} is not a directory", shown.display())))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => match std::fs::create_dir(&current) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(ParentError::Io(e)),
            },
            Err(e) => return Err(ParentError::Io(e)),
        }
    }
    Ok(())
}

/// Removes a file or link (or an empty directory) at `path`, as Go's `os.Remove`.
fn remove_existing(path: &Path) {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if meta.is_dir() {
            let _ = std::fs::remove_dir(path);
        } else {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn parse_uid_gid(data: &[u8]) -> Option<(u32, u32)> {
    // version 1, uid size 4, uid, gid size 4, gid (gitlab-runner refuses anything else)
    if data.len() != 11 || data[0] != 1 || data[1] != 4 || data[6] != 4 {
        return None;
    }
    let uid = u32::from_le_bytes([data[2], data[3], data[4], data[5]]);
    let gid = u32::from_le_bytes([data[7], data[8], data[9], data[10]]);
    Some((uid, gid))
}

/// Sets the modification time (access time: now) without following a link.
fn set_mtime(path: &Path, mtime: i64) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let times = [
        libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
        libc::timespec { tv_sec: mtime as libc::time_t, tv_nsec: 0 },
    ];
    // SAFETY: `c` is a valid NUL-terminated path and `times` two initialised timespecs.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}
