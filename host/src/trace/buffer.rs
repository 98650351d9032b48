//! [`JobTrace`]: the GitLab job log of one job — masking, the output limit, the kept bytes and
//! their CRC32. The uploader reads from it; writers never wait on I/O.

use std::sync::{Arc, Mutex, MutexGuard};

use super::format::ansi;
use super::mask::{MaskError, Masker, MaskerState};
use super::timestamp::{Stream, Timestamper};
use super::TraceSink;

/// GitLab Runner's default `output_limit` in KiB (4 MiB).
pub const DEFAULT_OUTPUT_LIMIT_KIB: u64 = 4096;

/// Room kept beyond the output limit for the job's footer (`ERROR: Job failed: ...`), so
/// output can never push it out. Plugin messages in it are cut to 4 KiB before they get here.
pub const FOOTER_RESERVE: usize = 8 * 1024;

/// What a job's trace masks and how much it keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceOptions {
    /// Values of `masked` variables.
    pub masked_phrases: Vec<String>,
    /// The job's `features.token_mask_prefixes` (defaults are always added).
    pub token_prefixes: Vec<String>,
    /// `output_limit` in KiB; 0 means the default 4096.
    pub output_limit_kib: u64,
    /// Per-line timestamps (`FF_TIMESTAMPS`).
    pub timestamps: bool,
    /// Only `glpat-` among the default token prefixes (`FF_MASK_ALL_DEFAULT_TOKENS` off).
    pub only_personal_tokens: bool,
}

impl TraceOptions {
    /// The limit in bytes.
    pub fn limit_bytes(&self) -> u64 {
        let kib = if self.output_limit_kib == 0 { DEFAULT_OUTPUT_LIMIT_KIB } else { self.output_limit_kib };
        kib.saturating_mul(1024)
    }
}

/// The message GitLab Runner appends once when the log reaches its limit.
pub fn limit_exceeded_message(limit_bytes: u64) -> String {
    format!(
        "\n{}Job's log exceeded limit of {} bytes.\nJob execution will continue but no more output will be collected.{}\n",
        ansi::BOLD_YELLOW,
        limit_bytes,
        ansi::RESET
    )
}

struct TraceState {
    masker: Masker,
    /// Masker output of the current write, reused between writes.
    masked: Vec<u8>,
    /// Per-line timestamps, when on.
    stamper: Option<Timestamper>,
    /// Timestamper output of the current write, reused between writes.
    stamped: Vec<u8>,
    bytes: Vec<u8>,
    crc: crc32fast::Hasher,
    limit: u64,
    limit_reached: bool,
    /// Where the footer's room ends, once the footer started.
    footer_end: Option<usize>,
    /// The detached log last followed into the trace, and how much of it the trace holds.
    follow: Option<(String, u64)>,
}

impl TraceState {
    /// Append to the kept log, enforcing the output limit.
    fn keep(&mut self, data: &[u8]) {
        if self.limit_reached || data.is_empty() {
            return;
        }
        let room = usize::try_from(self.limit.saturating_sub(self.bytes.len() as u64)).unwrap_or(usize::MAX);
        if data.len() <= room {
            self.append(data);
            return;
        }
        let cut = utf8_safe_cut(data, room);
        self.append(&data[..cut]);
        let message = limit_exceeded_message(self.limit);
        self.append(message.as_bytes());
        self.limit_reached = true;
    }

    /// Append the footer, past the limit if need be, within [`FOOTER_RESERVE`].
    fn keep_footer(&mut self, data: &[u8]) {
        let len = self.bytes.len();
        let end = *self.footer_end.get_or_insert(len.saturating_add(FOOTER_RESERVE));
        let cut = utf8_safe_cut(data, end.saturating_sub(len));
        self.append(&data[..cut]);
    }

    fn append(&mut self, data: &[u8]) {
        self.crc.update(data);
        self.bytes.extend_from_slice(data);
    }
}

/// The largest `cut <= room` such that `data[..cut]` does not end inside a UTF-8 character
/// (the first dropped byte is not a continuation byte), stepping back at most 3 bytes.
fn utf8_safe_cut(data: &[u8], room: usize) -> usize {
    let mut cut = room.min(data.len());
    let floor = cut.saturating_sub(3);
    while cut > floor && cut < data.len() && (data[cut] & 0b1100_0000) == 0b1000_0000 {
        cut -= 1;
    }
    cut
}

/// Where a job's log stands, for resuming it after a restart: with the first `len` bytes of
/// the log, [`JobTrace::restore`] builds a trace that goes on exactly as this one would have.
/// `masker` holds fragments of secrets: keep a checkpoint sealed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TraceCheckpoint {
    /// Bytes kept so far.
    pub len: u64,
    /// What the maskers held back.
    pub masker: MaskerState,
    /// The detached log last followed and how much of it is in the trace.
    pub follow: Option<(String, u64)>,
    /// The output limit was reached (later output is dropped).
    pub limit_reached: bool,
    /// Where the per-line timestamps stand (a line open, continuations pending).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamper: Option<Timestamper>,
}

/// Why a trace could not be restored from a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The masker could not be built.
    #[error(transparent)]
    Mask(#[from] MaskError),
    /// The bytes given are not the checkpoint's.
    #[error("the stored trace has {got} bytes, its checkpoint says {expected}")]
    Length {
        /// Bytes given.
        got: u64,
        /// Bytes the checkpoint says.
        expected: u64,
    },
}

/// One job's log. Cheap to clone (shared); every clone writes to and reads from the same log.
#[derive(Clone)]
pub struct JobTrace {
    state: Arc<Mutex<TraceState>>,
}

impl JobTrace {
    /// A trace masking and limiting per `options`.
    pub fn new(options: &TraceOptions) -> Result<Self, MaskError> {
        let masker =
            Masker::for_job(options.masked_phrases.iter(), &options.token_prefixes, !options.only_personal_tokens)?;
        Ok(JobTrace {
            state: Arc::new(Mutex::new(TraceState {
                masker,
                masked: Vec::new(),
                stamper: options.timestamps.then(Timestamper::default),
                stamped: Vec::new(),
                bytes: Vec::new(),
                crc: crc32fast::Hasher::new(),
                limit: options.limit_bytes(),
                limit_reached: false,
                footer_end: None,
                follow: None,
            })),
        })
    }

    /// A trace that goes on from a [`TraceCheckpoint`]: `bytes` are the first
    /// `checkpoint.len` bytes of the checkpointed trace, `options` the ones it was made with.
    pub fn restore(options: &TraceOptions, bytes: Vec<u8>, checkpoint: TraceCheckpoint) -> Result<Self, RestoreError> {
        if bytes.len() as u64 != checkpoint.len {
            return Err(RestoreError::Length { got: bytes.len() as u64, expected: checkpoint.len });
        }
        let trace = JobTrace::new(options)?;
        {
            let mut state = trace.lock();
            state.masker.restore(checkpoint.masker);
            state.crc.update(&bytes);
            state.bytes = bytes;
            state.limit_reached = checkpoint.limit_reached;
            state.follow = checkpoint.follow;
            if let (Some(stamper), Some(saved)) = (&mut state.stamper, checkpoint.timestamper) {
                *stamper = saved;
            }
        }
        Ok(trace)
    }

    /// Where the trace stands, and the kept bytes from `from` on (those a store does not have
    /// yet), read in one step.
    pub fn checkpoint(&self, from: u64) -> (TraceCheckpoint, Vec<u8>) {
        let state = self.lock();
        let start = usize::try_from(from).unwrap_or(usize::MAX).min(state.bytes.len());
        let checkpoint = TraceCheckpoint {
            len: state.bytes.len() as u64,
            masker: state.masker.state(),
            follow: state.follow.clone(),
            limit_reached: state.limit_reached,
            timestamper: state.stamper,
        };
        (checkpoint, state.bytes[start..].to_vec())
    }

    fn lock(&self) -> MutexGuard<'_, TraceState> {
        // A panic while holding the lock leaves consistent bytes behind; keep going.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `crc32:xxxxxxxx` (IEEE) of every byte kept so far.
    pub fn checksum(&self) -> String {
        format!("crc32:{:08x}", self.lock().crc.clone().finalize())
    }

    /// Checksum and length read together (for `output` of a job update).
    pub fn output_info(&self) -> (String, u64) {
        let state = self.lock();
        (format!("crc32:{:08x}", state.crc.clone().finalize()), state.bytes.len() as u64)
    }

    /// Number of bytes kept so far.
    pub fn len(&self) -> u64 {
        self.lock().bytes.len() as u64
    }

    /// Whether nothing was kept yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Up to `max` kept bytes starting at `offset` (empty past the end).
    pub fn read_from(&self, offset: u64, max: usize) -> Vec<u8> {
        let state = self.lock();
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(state.bytes.len());
        let end = start.saturating_add(max).min(state.bytes.len());
        state.bytes[start..end].to_vec()
    }

    /// Every byte kept so far.
    pub fn contents(&self) -> Vec<u8> {
        self.lock().bytes.clone()
    }

    /// Whether the output limit was reached (later output is dropped).
    pub fn limit_reached(&self) -> bool {
        self.lock().limit_reached
    }

    /// End of the job's output: release what the maskers held back (a partial secret at the
    /// very end). Writes after this still work and are masked as a new stream.
    pub fn finish(&self) {
        let mut state = self.lock();
        let state = &mut *state;
        state.masked.clear();
        state.masker.flush(&mut state.masked);
        let masked = std::mem::take(&mut state.masked);
        state.keep_stamped(Stream::Output, &masked);
        state.masked = masked;
    }
}

impl TraceState {
    /// Mask `data` of `stream` and keep it (nothing once the limit was reached).
    fn write(&mut self, stream: Stream, data: &[u8]) {
        if self.limit_reached {
            return;
        }
        self.masked.clear();
        self.masker.push(data, &mut self.masked);
        let masked = std::mem::take(&mut self.masked);
        self.keep_stamped(stream, &masked);
        self.masked = masked;
    }

    /// Keep masked bytes of `stream`, timestamped per line when timestamps are on.
    fn keep_stamped(&mut self, stream: Stream, masked: &[u8]) {
        let Some(stamper) = &mut self.stamper else {
            self.keep(masked);
            return;
        };
        let mut stamped = std::mem::take(&mut self.stamped);
        stamped.clear();
        stamper.stamp(stream, masked, chrono::Utc::now(), &mut stamped);
        self.keep(&stamped);
        self.stamped = stamped;
    }
}

impl TraceSink for JobTrace {
    fn write(&self, data: &[u8]) {
        self.lock().write(Stream::Runner, data);
    }

    /// The masker learns `values`. Phrases come from job variables, whose values the phrase
    /// matcher always takes: should it refuse them, every later byte is held back rather than
    /// risk one value unmasked.
    fn mask_also(&self, values: &[String]) {
        let mut state = self.lock();
        if let Err(e) = state.masker.learn(values) {
            tracing::error!("the job log cannot mask resolved secrets: {e}");
            state.limit_reached = true;
        }
    }

    fn write_output(&self, data: &[u8]) {
        self.lock().write(Stream::Output, data);
    }

    /// Written and the cursor moved in one step, so a checkpoint sees both or neither.
    fn write_followed(&self, source: &str, end: u64, data: &[u8]) {
        let mut state = self.lock();
        state.write(Stream::Output, data);
        match &mut state.follow {
            Some((followed, at)) if followed == source => *at = end,
            follow => *follow = Some((source.to_string(), end)),
        }
    }

    fn followed(&self, source: &str) -> Option<u64> {
        self.lock().follow.as_ref().filter(|(followed, _)| followed == source).map(|(_, at)| *at)
    }

    /// The footer is kept even after the output limit was reached (within [`FOOTER_RESERVE`]),
    /// masked like everything else; the maskers are flushed after it (it ends the output).
    fn write_footer(&self, data: &[u8]) {
        let mut state = self.lock();
        let state = &mut *state;
        state.masked.clear();
        state.masker.push(data, &mut state.masked);
        state.masker.flush(&mut state.masked);
        let masked = std::mem::take(&mut state.masked);
        let footer = match &mut state.stamper {
            Some(stamper) => {
                let mut stamped = Vec::with_capacity(masked.len() + 64);
                stamper.stamp(Stream::Runner, &masked, chrono::Utc::now(), &mut stamped);
                stamped
            }
            None => masked.clone(),
        };
        state.keep_footer(&footer);
        state.masked = masked;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(phrases: &[&str], limit_kib: u64) -> JobTrace {
        JobTrace::new(&TraceOptions {
            masked_phrases: phrases.iter().map(|s| s.to_string()).collect(),
            token_prefixes: Vec::new(),
            output_limit_kib: limit_kib,
            timestamps: false,
            only_personal_tokens: false,
        })
        .expect("patterns compile")
    }

    fn crc_of(bytes: &[u8]) -> String {
        format!("crc32:{:08x}", crc32fast::hash(bytes))
    }

    #[test]
    fn a_restored_trace_goes_on_as_the_checkpointed_one_would_have() {
        let options = TraceOptions { masked_phrases: vec!["SECRET".into()], ..TraceOptions::default() };
        let original = JobTrace::new(&options).expect("trace");
        original.write(b"line 1\n");
        original.write_followed("/b/01.log", 10, b"value: SEC");
        let (checkpoint, bytes) = original.checkpoint(0);
        assert_eq!(checkpoint.len, bytes.len() as u64);
        assert_eq!(checkpoint.follow, Some(("/b/01.log".to_string(), 10)));
        let resumed = JobTrace::restore(&options, bytes.clone(), checkpoint.clone()).expect("restore");
        assert_eq!(resumed.followed("/b/01.log"), Some(10));
        assert_eq!(resumed.followed("/b/02.log"), None);
        for t in [&original, &resumed] {
            t.write_followed("/b/01.log", 15, b"RET!\n");
            t.finish();
        }
        assert_eq!(resumed.contents(), original.contents());
        assert_eq!(resumed.checksum(), original.checksum());
        assert_eq!(resumed.contents(), b"line 1\nvalue: [MASKED]!\n");
        // Only what a store does not have yet is handed out.
        let (_, tail) = original.checkpoint(7);
        assert_eq!(tail, b"value: [MASKED]!\n");
        let short = JobTrace::restore(&options, bytes[..3].to_vec(), checkpoint);
        assert!(matches!(short, Err(RestoreError::Length { got: 3, .. })));
    }

    #[test]
    fn masks_across_writes_and_tracks_checksum() {
        let t = trace(&["SECRET"], 0);
        t.write(b"value: SEC");
        t.write(b"RET!\n");
        t.finish();
        assert_eq!(t.contents(), b"value: [MASKED]!\n");
        assert_eq!(t.len(), 17);
        assert_eq!(t.checksum(), crc_of(b"value: [MASKED]!\n"));
        assert_eq!(t.read_from(7, 8), b"[MASKED]");
        assert_eq!(t.read_from(100, 8), b"");
    }

    #[test]
    fn empty_trace_checksum_is_crc_of_nothing() {
        let t = trace(&[], 0);
        assert_eq!(t.checksum(), "crc32:00000000");
        assert!(t.is_empty());
    }

    #[test]
    fn output_limit_cuts_on_utf8_boundary_with_one_message() {
        let t = trace(&[], 1);
        let filler = vec![b'a'; 1021];
        t.write(&filler);
        // "é" is 2 bytes, "€" 3: the limit (1024) falls after the first byte of "€".
        t.write("é€tail".as_bytes());
        t.write(b"more output that must be dropped");
        t.finish();
        let mut expected = filler.clone();
        expected.extend_from_slice("é".as_bytes());
        expected.extend_from_slice(limit_exceeded_message(1024).as_bytes());
        assert_eq!(t.contents(), expected);
        assert!(t.limit_reached());
        let text = String::from_utf8(t.contents()).expect("kept bytes are valid UTF-8");
        assert_eq!(text.matches("Job's log exceeded limit of 1024 bytes.").count(), 1);
        assert!(text.contains("\x1b[33;1mJob's log exceeded limit of 1024 bytes.\nJob execution will continue but no more output will be collected.\x1b[0;m\n"));
        assert_eq!(t.checksum(), crc_of(&expected));
    }

    #[test]
    fn output_exactly_at_limit_has_no_message_until_more_arrives() {
        let t = trace(&[], 1);
        t.write(&[b'x'; 1024]);
        assert!(!t.limit_reached());
        assert_eq!(t.len(), 1024);
        t.write(b"y");
        assert!(t.limit_reached());
        assert_eq!(t.len() as usize, 1024 + limit_exceeded_message(1024).len());
    }

    #[test]
    fn the_footer_is_kept_after_the_limit_and_masked() {
        let t = trace(&["SECRET"], 1);
        t.write(&[b'x'; 5000]);
        assert!(t.limit_reached());
        t.write_footer(b"ERROR: Job failed: SECRET went wrong\n");
        t.finish();
        let text = String::from_utf8(t.contents()).expect("utf-8");
        assert!(text.ends_with("ERROR: Job failed: [MASKED] went wrong\n"), "{}", &text[text.len() - 80..]);
        assert_eq!(t.checksum(), crc_of(&t.contents()));
        // A footer larger than the reserve is cut, never the limit's bytes before it.
        let t = trace(&[], 1);
        t.write(&[b'x'; 5000]);
        t.write_footer(&vec![b'f'; 3 * FOOTER_RESERVE]);
        assert_eq!(t.len() as usize, 1024 + limit_exceeded_message(1024).len() + FOOTER_RESERVE);
    }

    #[test]
    fn clones_share_one_log() {
        let t = trace(&[], 0);
        let other = t.clone();
        other.write(b"from a clone");
        assert_eq!(t.contents(), b"from a clone");
    }
}
