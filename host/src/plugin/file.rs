//! Reading a plugin file without trusting it: only regular files on a real filesystem, read
//! with a hard byte cap that does not believe `stat`, in a bounded time.
//!
//! A `.wasm` in `plugins_dir` (or the FILE of `runway plugins check`) may be a FIFO that never
//! delivers, a symlink to `/dev/zero` or to `/proc/self/pagemap` (size 0 in `stat`, gigabytes
//! when read). The file is opened with `O_NONBLOCK` (opening a FIFO never waits for a writer)
//! and `O_NOCTTY`, its type is checked on the opened descriptor (no race with a rename), files
//! on kernel pseudo-filesystems (`/proc`, `/sys`, debugfs, ...) are refused, and at most
//! [`MAX_PLUGIN_FILE`] + 1 bytes are read, under a deadline, on a blocking thread.
//!
//! Owns: [`read_plugin_file`], [`FileError`]. Must not touch: what the bytes mean (metadata,
//! compiling: the registry's).

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Largest plugin file accepted (64 MiB; the first-party plugins are well under 2 MiB).
pub const MAX_PLUGIN_FILE: u64 = 64 << 20;

/// Longest time reading one plugin file may take.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a plugin file was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    /// Opening or reading failed.
    #[error("cannot read: {0}")]
    Io(String),
    /// A FIFO, socket, device or directory (after following symlinks).
    #[error("not a regular file (a {0}): only regular files are loaded as plugins")]
    NotRegular(&'static str),
    /// A file of a kernel pseudo-filesystem: its size means nothing and reading may not end.
    #[error("is on {0}, not a real filesystem: only regular files are loaded as plugins")]
    PseudoFile(&'static str),
    /// More than [`MAX_PLUGIN_FILE`] bytes (whatever `stat` says).
    #[error("larger than the {MAX_PLUGIN_FILE}-byte limit")]
    TooLarge,
    /// Reading did not finish within [`READ_TIMEOUT`].
    #[error("reading took longer than {0:?}")]
    TimedOut(Duration),
}

/// Read the plugin file at `path` (following symlinks) under every bound above.
pub async fn read_plugin_file(path: &Path) -> Result<Vec<u8>, FileError> {
    read_bounded(path.to_path_buf(), MAX_PLUGIN_FILE, READ_TIMEOUT).await
}

/// [`read_plugin_file`] with explicit bounds.
pub async fn read_bounded(path: PathBuf, cap: u64, timeout: Duration) -> Result<Vec<u8>, FileError> {
    let deadline = Instant::now() + timeout;
    let task = tokio::task::spawn_blocking(move || read_blocking(&path, cap, deadline, timeout));
    // The blocking read checks the deadline between chunks; this covers a read that blocks
    // inside one (a hung network filesystem): the thread is abandoned, the runner goes on.
    match tokio::time::timeout(timeout + Duration::from_secs(1), task).await {
        Ok(Ok(result)) => result,
        Ok(Err(e)) => Err(FileError::Io(format!("reader task failed: {e}"))),
        Err(_) => Err(FileError::TimedOut(timeout)),
    }
}

fn read_blocking(path: &Path, cap: u64, deadline: Instant, timeout: Duration) -> Result<Vec<u8>, FileError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| FileError::Io(e.to_string()))?;
    let meta = file.metadata().map_err(|e| FileError::Io(e.to_string()))?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let what = if kind.is_fifo() {
            "FIFO"
        } else if kind.is_socket() {
            "socket"
        } else if kind.is_char_device() {
            "character device"
        } else if kind.is_block_device() {
            "block device"
        } else if kind.is_dir() {
            "directory"
        } else {
            "special file"
        };
        return Err(FileError::NotRegular(what));
    }
    check_filesystem(&file)?;
    if meta.len() > cap {
        return Err(FileError::TooLarge);
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    let mut chunk = vec![0u8; 1 << 20];
    let mut file = file;
    loop {
        if Instant::now() > deadline {
            return Err(FileError::TimedOut(timeout));
        }
        // Never ask for more than one byte past the cap.
        let want = usize::try_from((cap + 1).saturating_sub(bytes.len() as u64)).unwrap_or(usize::MAX).min(chunk.len());
        let n = match file.read(&mut chunk[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(FileError::Io(e.to_string())),
        };
        bytes.extend_from_slice(&chunk[..n]);
        // Read up to cap + 1: a file that grew (or lied in `stat`) is refused, never trusted.
        if bytes.len() as u64 > cap {
            return Err(FileError::TooLarge);
        }
    }
    Ok(bytes)
}

/// Refuse files of kernel pseudo-filesystems (`/proc`, `/sys`, ...).
#[cfg(target_os = "linux")]
fn check_filesystem(file: &std::fs::File) -> Result<(), FileError> {
    use std::os::fd::AsRawFd;
    const PSEUDO: &[(u32, &str)] = &[
        (0x0000_9fa0, "/proc"),
        (0x6265_6572, "/sys (sysfs)"),
        (0x6462_6720, "debugfs"),
        (0x7472_6163, "tracefs"),
        (0x7363_6673, "securityfs"),
        (0x6367_7270, "cgroup2"),
        (0x0027_e0eb, "cgroupfs"),
        (0xcafe_4a11, "bpffs"),
        (0x6e73_6673, "nsfs"),
        (0x0000_1cd1, "devpts"),
    ];
    let mut stat = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: fstatfs writes a statfs into the buffer we own, on a descriptor we hold open.
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), stat.as_mut_ptr()) };
    if rc != 0 {
        return Err(FileError::Io(format!("fstatfs: {}", std::io::Error::last_os_error())));
    }
    // SAFETY: fstatfs succeeded, so the struct is initialised.
    let stat = unsafe { stat.assume_init() };
    // f_type's integer type differs between targets; the magic numbers are 32-bit.
    #[allow(clippy::unnecessary_cast)]
    let magic = stat.f_type as u32;
    match PSEUDO.iter().find(|(m, _)| *m == magic) {
        Some((_, name)) => Err(FileError::PseudoFile(name)),
        None => Ok(()),
    }
}

/// Other Unixes: the regular-file check and the byte cap are the bounds.
#[cfg(not(target_os = "linux"))]
fn check_filesystem(_file: &std::fs::File) -> Result<(), FileError> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_a_regular_file_and_refuses_one_over_the_cap() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.wasm");
        std::fs::write(&path, vec![1u8; 100]).expect("write");
        assert_eq!(read_bounded(path.clone(), 100, READ_TIMEOUT).await.expect("at the cap").len(), 100);
        assert_eq!(read_bounded(path, 99, READ_TIMEOUT).await, Err(FileError::TooLarge));
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_proc_file_is_refused_whatever_its_size() {
        let err = read_bounded("/proc/self/status".into(), MAX_PLUGIN_FILE, READ_TIMEOUT).await;
        assert_eq!(err, Err(FileError::PseudoFile("/proc")));
    }
}
