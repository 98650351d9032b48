//! The job log: where every byte a job prints goes.
//!
//! Owns masking, the output limit, section markers, the CRC32 checksum and incremental
//! upload. Plugins and the process capability only see [`TraceSink`].
//!
//! - [`mask`]: the streaming sanitizer chain (phrases → URL parameters → token prefixes);
//! - [`buffer`]: [`JobTrace`], the masked, limited, checksummed log of one job;
//! - [`format`]: GitLab's log format (sections, colours, header, footer);
//! - [`timestamp`]: per-line timestamps (`FF_TIMESTAMPS`), after masking;
//! - [`upload`]: [`TraceUploader`], incremental PATCH upload and the final job update;
//! - [`failure`]: failure reasons and their mapping onto what GitLab supports.

pub mod buffer;
pub mod failure;
pub mod format;
pub mod mask;
pub mod timestamp;
pub mod upload;

pub use buffer::{JobTrace, RestoreError, TraceCheckpoint, TraceOptions};
pub use failure::{wire_reason, FailureReason};
pub use format::TraceLog;
pub use upload::{FinalUpdateError, RemoteSignals, TraceUploader, UploadConfig};

/// Something that accepts job log bytes: the GitLab trace, the terminal of `runway exec`, a
/// buffer in tests. Implementations mask and limit as they need; writers never block on I/O.
pub trait TraceSink: Send + Sync {
    /// Append the runner's own bytes to the log (headers, sections, messages).
    fn write(&self, data: &[u8]);

    /// Append bytes the job printed (its processes' output). Only the per-line timestamps
    /// tell them apart (stream `01` instead of `00`); by default, the same as
    /// [`TraceSink::write`].
    fn write_output(&self, data: &[u8]) {
        self.write(data)
    }

    /// Append the job's footer (`Job succeeded`, `ERROR: Job failed: ...`), the last thing a
    /// job writes. A sink with an output limit keeps it even when the limit was reached, so
    /// the log always says how the job ended. By default, the same as [`TraceSink::write`].
    fn write_footer(&self, data: &[u8]) {
        self.write(data)
    }

    /// Append job output read from the detached command log `source` (a path on the job's
    /// instance), after which the log holds bytes up to `end` that are in this trace. A sink
    /// that can survive a restart remembers `(source, end)` so that a resumed job follows the
    /// log on from there ([`TraceSink::followed`]). By default, the same as [`TraceSink::write`].
    fn write_followed(&self, source: &str, end: u64, data: &[u8]) {
        let _ = (source, end);
        self.write(data)
    }

    /// How many bytes of the detached command log `source` this trace already holds, when it
    /// knows (the last log followed, also after a restart). Followers start past them, so no
    /// byte of a log is written twice.
    fn followed(&self, source: &str) -> Option<u64> {
        let _ = source;
        None
    }

    /// Mask `values` too from now on, like the job's masked variables (its `secrets:`,
    /// resolved after the log began). A sink that masks must override this; the default is
    /// for sinks that mask nothing (tests, `runway exec`'s terminal).
    fn mask_also(&self, values: &[String]) {
        let _ = values;
    }

    /// How many bytes of the detached command log `source` nothing will read again, not even
    /// after a restart: the follower may free them on disk as it goes (a sink that cannot
    /// resume, such as `runway exec`'s terminal, releases everything it was given). By
    /// default none.
    fn released(&self, source: &str) -> u64 {
        let _ = source;
        0
    }
}

/// A sink that keeps everything in memory (tests, benchmarks).
#[derive(Default)]
pub struct MemorySink {
    bytes: std::sync::Mutex<Vec<u8>>,
}

impl MemorySink {
    /// Everything written so far.
    pub fn contents(&self) -> Vec<u8> {
        self.bytes.lock().map(|b| b.clone()).unwrap_or_default()
    }
    /// Everything written so far, as lossy UTF-8.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.contents()).into_owned()
    }
}

impl TraceSink for MemorySink {
    fn write(&self, data: &[u8]) {
        if let Ok(mut b) = self.bytes.lock() {
            b.extend_from_slice(data);
        }
    }
}
