//! A writer that counts the bytes it passes on: the gzip writer's total and the zip writer's
//! offsets (local headers, the central directory) come from it.
//!
//! Owns: the count. Must not touch: what is written (the formats are `gzip`'s and `zip_write`'s).

use std::io::{self, Write};

/// Passes every write on to `inner` and counts the bytes it took.
pub(super) struct Counting<W: Write> {
    inner: W,
    count: u64,
}

impl<W: Write> Counting<W> {
    /// Nothing counted yet.
    pub(super) fn new(inner: W) -> Counting<W> {
        Counting { inner, count: 0 }
    }

    /// Bytes written through it so far.
    pub(super) fn count(&self) -> u64 {
        self.count
    }
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
