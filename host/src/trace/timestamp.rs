//! Per-line timestamps in the job log (`FF_TIMESTAMPS`, on by default in gitlab-runner 19):
//! every line starts with `<RFC 3339 UTC, microseconds> <stream id><stream type><append flag>`,
//! e.g. `2026-11-23T17:40:47.123456Z 01O echo hi`, as gitlab-runner's timestamper writes it and
//! GitLab reads it (the log page shows the time of each line and hides the prefix).
//!
//! Streams: `00` the runner's own lines (headers, sections, warnings, plugin messages), `01`
//! the job's output. The append flag `+` marks a line that continues the previous line of its
//! stream: when output of the other stream arrives in the middle of a line, that line is ended
//! and its stream's next line is a continuation. A header is written when a line's first byte
//! arrives, so the time is the line's start.
//!
//! Owns the prefixing state machine only; runs after masking (a header never splits a secret)
//! and before the output limit. Must not touch masking, limits or uploads.

use std::io::Write as _;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Which stream bytes belong to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Stream {
    /// The runner's own lines: stream `00`.
    Runner,
    /// The job's output: stream `01`.
    Output,
}

impl Stream {
    fn id(self) -> &'static [u8; 3] {
        match self {
            Stream::Runner => b"00O",
            Stream::Output => b"01O",
        }
    }

    fn index(self) -> usize {
        match self {
            Stream::Runner => 0,
            Stream::Output => 1,
        }
    }
}

/// Where the timestamper stands; kept in trace checkpoints so a resumed job's log goes on
/// mid-line exactly as it would have.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timestamper {
    /// The stream whose line is open (its header written, no newline yet).
    open: Option<Stream>,
    /// Per stream: its next line continues one that was cut.
    continues: [bool; 2],
}

impl Timestamper {
    /// Append `data` of `stream` to `out`, a header at the start of every line.
    ///
    /// The time is formatted once per call (every line of one write starts at `now`), and
    /// line ends are found with `memchr`: a 100-byte line costs a header copy, not a clock
    /// formatting.
    pub fn stamp(&mut self, stream: Stream, data: &[u8], now: DateTime<Utc>, out: &mut Vec<u8>) {
        if data.is_empty() {
            return;
        }
        if let Some(open) = self.open.filter(|open| *open != stream) {
            // Another stream's line is open: end it here; that stream goes on with `+`.
            out.push(b'\n');
            self.continues[open.index()] = true;
            self.open = None;
        }
        let mut time: Option<Time> = None;
        let mut rest = data;
        while !rest.is_empty() {
            if self.open.is_none() {
                let time = time.get_or_insert_with(|| Time::of(now));
                out.extend_from_slice(&time.0);
                out.extend_from_slice(stream.id());
                out.push(if self.continues[stream.index()] { b'+' } else { b' ' });
                self.continues[stream.index()] = false;
                self.open = Some(stream);
            }
            match memchr::memchr(b'\n', rest) {
                Some(end) => {
                    out.extend_from_slice(&rest[..=end]);
                    rest = &rest[end + 1..];
                    self.open = None;
                }
                None => {
                    out.extend_from_slice(rest);
                    rest = &[];
                }
            }
        }
    }
}

/// `YYYY-MM-DDTHH:MM:SS.uuuuuuZ ` (28 bytes): the part of a header before the stream id.
struct Time([u8; 28]);

impl Time {
    fn of(now: DateTime<Utc>) -> Self {
        let mut text = [b' '; 28];
        let mut cursor = std::io::Cursor::new(&mut text[..]);
        // Years past 9999 do not fit; such a clock gets the spaces it leaves.
        let _ = write!(cursor, "{}", now.format("%Y-%m-%dT%H:%M:%S%.6fZ"));
        Time(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(micros: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_micros(1_795_000_000_000_000 + micros).unwrap_or_default()
    }

    fn stamp(t: &mut Timestamper, stream: Stream, data: &str, micros: i64) -> String {
        let mut out = Vec::new();
        t.stamp(stream, data.as_bytes(), at(micros), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    #[test]
    fn every_line_gets_the_time_of_its_first_byte() {
        let mut t = Timestamper::default();
        let out = stamp(&mut t, Stream::Output, "one\ntw", 7) + &stamp(&mut t, Stream::Output, "o\nthree\n", 9);
        assert_eq!(
            out,
            "2026-11-18T11:06:40.000007Z 01O one\n2026-11-18T11:06:40.000007Z 01O two\n2026-11-18T11:06:40.000009Z 01O three\n"
        );
    }

    #[test]
    fn a_line_cut_by_the_other_stream_goes_on_with_a_plus() {
        let mut t = Timestamper::default();
        let out = stamp(&mut t, Stream::Output, "50%", 1)
            + &stamp(&mut t, Stream::Runner, "WARNING: x\n", 2)
            + &stamp(&mut t, Stream::Output, " 100%\n", 3);
        assert_eq!(
            out,
            "2026-11-18T11:06:40.000001Z 01O 50%\n2026-11-18T11:06:40.000002Z 00O WARNING: x\n2026-11-18T11:06:40.000003Z 01O+ 100%\n"
        );
        assert_eq!(t, Timestamper::default(), "no line open, nothing pending");
    }
}
