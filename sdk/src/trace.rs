//! The job log. The host masks secrets and uploads it; plugins only append.

use crate::bindings::executor::runway::host0_1_0::trace as wit;
pub use crate::bindings::executor::runway::host0_1_0::trace::TraceError;

/// Most bytes the host accepts in one write.
pub const MAX_CHUNK: usize = 1 << 20;

/// Append bytes to the job log, split into chunks the host accepts.
pub fn write(data: &[u8]) -> Result<(), TraceError> {
    for chunk in data.chunks(MAX_CHUNK) {
        wit::write(chunk)?;
    }
    Ok(())
}

/// Append text to the job log, ignoring a refused write (for best-effort messages).
pub fn write_str(text: &str) {
    let _ = write(text.as_bytes());
}

/// The job log as a [`std::io::Write`].
pub struct TraceWriter;

impl std::io::Write for TraceWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        write(buf).map_err(|e| std::io::Error::other(format!("{e:?}")))?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
