//! The Engine API's multiplexed output stream (a container without a TTY): frames of an 8-byte
//! header — stream (0 stdin, 1 stdout, 2 stderr), three zero bytes, the payload's length as a
//! big-endian u32 — then the payload. [`Demux`] turns arbitrary chunks of it back into
//! payloads, stdout and stderr in arrival order; a TTY container's stream is raw and passes as it
//! is.
//!
//! Owns: frame parsing. Must not touch: connections, the trace.

/// Demultiplexes one stream, chunk by chunk.
pub struct Demux {
    raw: bool,
    header: Vec<u8>,
    remaining: usize,
    /// The stream of the frame being read (1 stdout, 2 stderr).
    stream: u8,
}

impl Demux {
    /// A demultiplexer; `raw` for a TTY container's stream.
    pub fn new(raw: bool) -> Demux {
        Demux { raw, header: Vec::with_capacity(8), remaining: 0, stream: 1 }
    }

    /// Feed a chunk; `payload` gets every piece of payload it completes or continues.
    pub fn push(&mut self, chunk: &[u8], mut payload: impl FnMut(&[u8])) {
        self.push_tagged(chunk, |_, bytes| payload(bytes));
    }

    /// [`Demux::push`] with each piece's stream (1 stdout, 2 stderr; 1 for a raw stream).
    pub fn push_tagged(&mut self, mut chunk: &[u8], mut payload: impl FnMut(u8, &[u8])) {
        if self.raw {
            if !chunk.is_empty() {
                payload(1, chunk);
            }
            return;
        }
        while !chunk.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(chunk.len());
                payload(self.stream, &chunk[..n]);
                self.remaining -= n;
                chunk = &chunk[n..];
                continue;
            }
            let need = 8 - self.header.len();
            let n = need.min(chunk.len());
            self.header.extend_from_slice(&chunk[..n]);
            chunk = &chunk[n..];
            if self.header.len() == 8 {
                let size = u32::from_be_bytes([self.header[4], self.header[5], self.header[6], self.header[7]]);
                self.remaining = usize::try_from(size).unwrap_or(usize::MAX);
                self.stream = self.header[0];
                self.header.clear();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(stream: u8, data: &[u8]) -> Vec<u8> {
        let mut out = vec![stream, 0, 0, 0];
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn frames_split_anywhere_come_out_whole() {
        let mut stream = frame(1, b"hello ");
        stream.extend(frame(2, b"from stderr\n"));
        stream.extend(frame(1, b""));
        stream.extend(frame(1, b"bye\n"));
        for split in 1..stream.len() {
            let mut demux = Demux::new(false);
            let mut out = Vec::new();
            for chunk in stream.chunks(split) {
                demux.push(chunk, |p| out.extend_from_slice(p));
            }
            assert_eq!(out, b"hello from stderr\nbye\n", "chunks of {split}");
        }
        let mut tagged = Demux::new(false);
        let mut streams = Vec::new();
        tagged.push_tagged(&stream, |s, p| streams.push((s, p.to_vec())));
        assert_eq!(streams[0], (1, b"hello ".to_vec()));
        assert_eq!(streams[1], (2, b"from stderr\n".to_vec()));
        let mut raw = Demux::new(true);
        let mut out = Vec::new();
        raw.push(b"\x01\x00raw", |p| out.extend_from_slice(p));
        assert_eq!(out, b"\x01\x00raw");
    }
}
