//! A plugin's stderr as a bounded log stream: every write succeeds, the last
//! [`STDERR_TAIL`] bytes are kept for error messages (a panic message is the last thing a
//! plugin writes), everything before them is discarded and counted.
//!
//! wasmtime-wasi's `MemoryOutputPipe` fails writes past its capacity, so a plugin that wrote
//! more than 64 KiB of stderr trapped on its next `eprintln!`. This pipe never refuses.
//!
//! Owns: [`StderrTail`] and cutting its last lines to a length. Must not touch: how the tail
//! is reported (`crate::plugin::call`).

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// Bytes of a plugin's stderr kept for error messages.
pub const STDERR_TAIL: usize = 16 * 1024;

/// Largest single write the guest is offered (it may write as often as it likes).
const WRITE_PERMIT: usize = 64 * 1024;

#[derive(Default)]
struct Tail {
    bytes: Vec<u8>,
    discarded: u64,
}

/// The tail of a plugin's stderr. Clones share one buffer.
#[derive(Clone, Default)]
pub struct StderrTail {
    inner: Arc<Mutex<Tail>>,
}

impl StderrTail {
    fn lock(&self) -> MutexGuard<'_, Tail> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn push(&self, data: &[u8]) {
        let mut tail = self.lock();
        let data = if data.len() > STDERR_TAIL {
            tail.discarded += (data.len() - STDERR_TAIL) as u64;
            &data[data.len() - STDERR_TAIL..]
        } else {
            data
        };
        tail.bytes.extend_from_slice(data);
        if tail.bytes.len() > STDERR_TAIL {
            let drop = tail.bytes.len() - STDERR_TAIL;
            tail.bytes.drain(..drop);
            tail.discarded += drop as u64;
        }
    }

    /// The bytes kept (the last [`STDERR_TAIL`] written).
    pub fn contents(&self) -> Vec<u8> {
        self.lock().bytes.clone()
    }

    /// The last three non-empty lines kept (a panic message, usually), joined with ` | `, at
    /// most `max` bytes of their end.
    pub fn last_lines(&self, max: usize) -> String {
        let bytes = self.contents();
        let text = String::from_utf8_lossy(&bytes);
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
        // Keep the end (where a panic message is), not the start.
        if tail.len() <= max {
            return tail;
        }
        let mut start = tail.len() - max;
        while !tail.is_char_boundary(start) {
            start += 1;
        }
        format!("… {}", &tail[start..])
    }

    /// How many earlier bytes were discarded.
    pub fn discarded(&self) -> u64 {
        self.lock().discarded
    }
}

impl IsTerminal for StderrTail {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for StderrTail {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for StderrTail {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }
    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for StderrTail {
    async fn ready(&mut self) {}
}

impl AsyncWrite for StderrTail {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_bytes_and_counts_the_rest() {
        let mut pipe = StderrTail::default();
        for _ in 0..100 {
            pipe.write(Bytes::from(vec![b'a'; 1000])).expect("never refuses");
        }
        pipe.write(Bytes::from_static(b"panicked at the end\n")).expect("write");
        let kept = pipe.contents();
        assert_eq!(kept.len(), STDERR_TAIL);
        assert!(kept.ends_with(b"panicked at the end\n"));
        assert_eq!(pipe.discarded(), 100_020 - STDERR_TAIL as u64);
        pipe.write(Bytes::from(vec![b'b'; 3 * STDERR_TAIL])).expect("one huge write");
        assert_eq!(pipe.contents(), vec![b'b'; STDERR_TAIL]);
    }
}
