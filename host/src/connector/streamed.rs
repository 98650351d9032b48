//! Streamed stage output: a detached command on the runner's machine whose log is a named pipe
//! (FIFO) instead of a file, for a process that follows each stage once, to its end, and never
//! resumes one (`runway exec`). The command writes into a pipe buffer that the follower empties
//! as it goes, so its output never passes through the page cache: on a 2-vCPU machine a
//! 200 MB stage writing into a followed file is about 15 % slower than into a pipe (file
//! pages allocated, zeroed and put on the LRU for every byte; docs/benchmarks.md).
//!
//! The FIFO sits at the log's path, so everything else about a detached command stays as it
//! is: the spawn opens the log by its path for writing (it opens at once, as this process holds
//! the read end open from before the start), the exit and pid files are files, and removing
//! the stage directory removes the FIFO. What changes: the log can be followed once, by the
//! process that started the command ([`Streams::take`]); a stage whose follower is gone gets
//! `SIGPIPE` on its next write (a `runway exec` that ends ends its stages); a command whose
//! output nobody reads waits when the pipe is full (1 MiB where the kernel allows it).
//!
//! Owns: [`Streams`] (the read ends by log path) and reading one ([`Stream`]). Must not touch:
//! starting or ending commands, exit codes ([`super::local`] follows them), WIT types.

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Mutex;

use tokio::io::unix::AsyncFd;

use crate::connector::detached::OutputFn;

/// The pipe buffer asked for (the default is 64 KiB; an unprivileged process may ask up to
/// `/proc/sys/fs/pipe-max-size`, 1 MiB by default): a writer is not held up by a follower
/// that was busy for a few milliseconds.
const PIPE_SIZE: i32 = 1 << 20;

/// Bytes read from a stream at a time.
const READ_SIZE: usize = 128 * 1024;

/// The read ends of the streamed logs this process made, by log path, until they are followed.
#[derive(Debug, Default)]
pub struct Streams {
    open: Mutex<HashMap<String, OwnedFd>>,
}

impl Streams {
    /// Make `log_path` a FIFO (0600; whatever was there is removed) and keep its read end.
    pub fn create(&self, log_path: &str) -> std::io::Result<()> {
        match std::fs::remove_file(log_path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let path = std::ffi::CString::new(log_path)
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
        // SAFETY: `path` is NUL-terminated; mkfifo only reads it.
        if unsafe { libc::mkfifo(path.as_ptr(), 0o600) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Non-blocking: the open does not wait for a writer, nor does a read.
        let file =
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(log_path)?;
        #[cfg(any(target_os = "linux", target_os = "android"))]
        // SAFETY: F_SETPIPE_SZ on a descriptor this function owns; a refusal (over the
        // user's pipe quota) leaves the default size, which only makes writers wait sooner.
        unsafe {
            libc::fcntl(file.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_SIZE);
        }
        if let Ok(mut open) = self.open.lock() {
            open.insert(log_path.to_string(), file.into());
        }
        Ok(())
    }

    /// The read end of the streamed log `log_path`, once; `None` when this process made no
    /// such stream, or it was taken.
    pub fn take(&self, log_path: &str) -> Option<OwnedFd> {
        self.open.lock().ok()?.remove(log_path)
    }
}

/// Whether `file` is a FIFO: a streamed log nobody holds any more, which cannot be followed.
pub fn is_stream(file: &std::fs::File) -> bool {
    use std::os::unix::fs::FileTypeExt;
    file.metadata().is_ok_and(|m| m.file_type().is_fifo())
}

/// A streamed log being followed.
pub struct Stream {
    fd: AsyncFd<std::fs::File>,
    buf: Vec<u8>,
    /// Bytes still to skip: the follower asked to start past them.
    skip: u64,
    /// Every writer closed the pipe.
    ended: bool,
}

impl Stream {
    /// Follow `fd` (a read end from [`Streams::take`]) from byte `from`. Needs a tokio runtime.
    pub fn new(fd: OwnedFd, from: u64) -> std::io::Result<Stream> {
        // SAFETY: the AsyncFd owns the file, which stays open and the same descriptor until
        // the AsyncFd is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(std::fs::File::from(fd), tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(Stream { fd, buf: vec![0; READ_SIZE], skip: from, ended: false })
    }

    /// Whether every writer has closed the pipe (nothing more can come).
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Forward what the pipe holds now to `output`, without waiting.
    pub fn drain(&mut self, output: &OutputFn<'_>) -> std::io::Result<()> {
        while !self.ended {
            match self.fd.get_ref().read(&mut self.buf) {
                Ok(0) => self.ended = true,
                Ok(n) => self.forward(n, output),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Wait until the pipe has data (or every writer closed it), then forward what it holds.
    /// Pends forever once the pipe [`ended`](Self::ended).
    pub async fn next(&mut self, output: &OutputFn<'_>) -> std::io::Result<()> {
        if self.ended {
            return std::future::pending().await;
        }
        let mut ready = self.fd.readable().await?;
        ready.clear_ready();
        drop(ready);
        self.drain(output)
    }

    fn forward(&mut self, n: usize, output: &OutputFn<'_>) {
        let skipped = usize::try_from(self.skip).unwrap_or(usize::MAX).min(n);
        self.skip -= skipped as u64;
        if skipped < n {
            output(&self.buf[skipped..n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Mutex;

    use super::*;

    #[tokio::test]
    async fn a_stream_forwards_what_its_writer_wrote_past_the_start_and_sees_the_writer_close() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("01-step.log");
        let log = log.to_str().expect("utf-8");
        std::fs::write(log, "an old log").expect("write");
        let streams = Streams::default();
        streams.create(log).expect("create the stream");
        assert!(is_stream(
            &std::fs::File::options().read(true).custom_flags(libc::O_NONBLOCK).open(log).expect("open")
        ));
        // A writer opens by the path, as the spawn does, and does not wait for a reader.
        let mut writer = std::fs::OpenOptions::new().write(true).open(log).expect("open for writing");
        writer.write_all(b"0123456789").expect("write");
        let fd = streams.take(log).expect("the read end");
        assert!(streams.take(log).is_none(), "taken once");
        let mut stream = Stream::new(fd, 4).expect("stream");
        let seen = Mutex::new(Vec::new());
        let output = |b: &[u8]| seen.lock().expect("lock").extend_from_slice(b);
        stream.drain(&output).expect("drain");
        assert_eq!(seen.lock().expect("lock").as_slice(), b"456789", "the first four bytes skipped");
        let late = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            writer.write_all(b"late").expect("write");
        });
        stream.next(&output).await.expect("next");
        late.join().expect("writer");
        stream.drain(&output).expect("drain");
        assert_eq!(seen.lock().expect("lock").as_slice(), b"456789late");
        assert!(stream.ended(), "the only writer closed");
    }

    #[test]
    fn a_path_that_is_no_place_for_a_fifo_is_an_error() {
        let streams = Streams::default();
        assert!(streams.create("/nonexistent-runway-dir/01-step.log").is_err());
        assert!(streams.take("/nonexistent-runway-dir/01-step.log").is_none());
    }
}
