//! Rendering the GitLab-format job log on a terminal: section headers with durations,
//! collapsed sections, colours only on a TTY (and never with `NO_COLOR`), and a notice while
//! a long command is silent.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::trace::TraceSink;

/// How to render.
#[derive(Debug, Clone)]
pub struct TerminalOptions {
    /// Keep ANSI colours.
    pub color: bool,
    /// Show the content of collapsed sections.
    pub verbose: bool,
    /// Print `… still running (1m05s)` after this much silence.
    pub silence_notice_after: Option<Duration>,
}

struct State {
    out: Box<dyn Write + Send>,
    pending: Vec<u8>,
    /// What one `write` renders, written to `out` at once (one system call for many lines).
    rendered: Vec<u8>,
    sections: Vec<(String, Instant, bool)>,
    last_output: Instant,
    started: Instant,
    notices: u32,
}

/// A [`TraceSink`] that writes a readable log to a terminal (or any writer).
pub struct TerminalSink {
    state: Arc<Mutex<State>>,
    options: TerminalOptions,
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// The detached log last followed and how far it was shown.
    shown: Mutex<Option<(String, u64)>>,
}

fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' && chars.peek() == Some(&'[') {
            chars.next();
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn human(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 60 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{:.2}s", d.as_secs_f64())
    }
}

impl TerminalSink {
    /// Render into `out`.
    pub fn new(out: Box<dyn Write + Send>, options: TerminalOptions) -> Self {
        let now = Instant::now();
        let state = Arc::new(Mutex::new(State {
            out,
            pending: Vec::new(),
            rendered: Vec::new(),
            sections: Vec::new(),
            last_output: now,
            started: now,
            notices: 0,
        }));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        if let Some(after) = options.silence_notice_after {
            let (state, stop) = (state.clone(), stop.clone());
            let color = options.color;
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(250));
                    let Ok(mut s) = state.lock() else { return };
                    let quiet = s.last_output.elapsed();
                    if quiet >= after * (s.notices + 1) {
                        s.notices += 1;
                        let text = format!("… still running ({})", human(s.started.elapsed()));
                        let line = if color { format!("\x1b[2m{text}\x1b[0m\n") } else { format!("{text}\n") };
                        let _ = s.out.write_all(line.as_bytes());
                        let _ = s.out.flush();
                    }
                }
            });
        }
        TerminalSink { state, options, stop, shown: Mutex::new(None) }
    }

    /// Whether a collapsed section hides what is printed now.
    fn hidden(&self, s: &State) -> bool {
        s.sections.iter().any(|(_, _, collapsed)| *collapsed) && !self.options.verbose
    }

    fn emit(&self, s: &mut State, text: &str) {
        if self.hidden(s) || text.is_empty() {
            return;
        }
        if self.options.color || !text.contains('\x1b') {
            s.rendered.extend_from_slice(text.as_bytes());
        } else {
            s.rendered.extend_from_slice(strip_ansi(text).as_bytes());
        }
    }

    /// Render `block`, complete lines only. A block without section markers (almost all job
    /// output) is emitted whole, as its lines would be one by one; one with markers line by line.
    fn handle_lines(&self, s: &mut State, block: &[u8]) {
        let marker = |b: &[u8]| SECTION_START.find(b).is_some() || SECTION_END.find(b).is_some();
        // Without colours an escape sequence is stripped within its line: such blocks go line
        // by line too.
        if !marker(block) && (self.options.color || memchr::memchr(0x1b, block).is_none()) {
            match std::str::from_utf8(block) {
                Ok(text) => self.emit(s, text),
                // Lossy conversion replaces within a line only: the same per block as per line.
                Err(_) => self.emit(s, &String::from_utf8_lossy(block)),
            }
            return;
        }
        for line in block.split_inclusive(|b| *b == b'\n') {
            let text = String::from_utf8_lossy(line);
            self.handle_line(s, &text);
        }
    }

    fn handle_line(&self, s: &mut State, line: &str) {
        // A line may hold several markers: `section_end:..\r\e[0Ksection_start:..\r\e[0K`.
        let mut rest = line;
        loop {
            let start = rest.find("section_start:");
            let end = rest.find("section_end:");
            let next = match (start, end) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let Some(pos) = next else { break };
            self.emit(s, &rest[..pos]);
            let marker_end = rest[pos..].find("\r\x1b[0K").map(|e| pos + e + "\r\x1b[0K".len()).unwrap_or(rest.len());
            let marker = &rest[pos..marker_end.min(rest.len())];
            let fields: Vec<&str> = marker.trim_end_matches("\r\x1b[0K").splitn(3, ':').collect();
            let name_opts = fields.get(2).copied().unwrap_or("");
            let (name, opts) = match name_opts.split_once('[') {
                Some((n, o)) => (n.to_string(), o.trim_end_matches(']').to_string()),
                None => (name_opts.to_string(), String::new()),
            };
            if marker.starts_with("section_start:") {
                let collapsed = opts.contains("collapsed=true");
                s.sections.push((name, Instant::now(), collapsed));
            } else if let Some(index) = s.sections.iter().rposition(|(n, _, _)| *n == name) {
                let (name, started, collapsed) = s.sections.remove(index);
                let took = human(started.elapsed());
                let line = if collapsed && !self.options.verbose {
                    format!("  {name} (collapsed) {took}\n")
                } else {
                    format!("  {name} {took}\n")
                };
                let line = if self.options.color { format!("\x1b[2m{line}\x1b[0m") } else { line };
                s.rendered.extend_from_slice(line.as_bytes());
            }
            rest = &rest[marker_end.min(rest.len())..];
        }
        self.emit(s, rest);
    }

    /// Write what was rendered to `out`, in one piece.
    fn flush_rendered(s: &mut State) {
        if !s.rendered.is_empty() {
            let _ = s.out.write_all(&s.rendered);
            s.rendered.clear();
        }
        let _ = s.out.flush();
    }
}

static SECTION_START: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"section_start:"));
static SECTION_END: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"section_end:"));

impl TraceSink for TerminalSink {
    /// Shown and never read again (`runway exec` does not resume): released.
    fn write_followed(&self, source: &str, end: u64, data: &[u8]) {
        self.write(data);
        if let Ok(mut shown) = self.shown.lock() {
            *shown = Some((source.to_string(), end));
        }
    }

    fn released(&self, source: &str) -> u64 {
        match self.shown.lock().as_deref() {
            Ok(Some((shown, end))) if shown == source => *end,
            _ => 0,
        }
    }

    fn write(&self, data: &[u8]) {
        let Ok(mut guard) = self.state.lock() else { return };
        let s = &mut *guard;
        s.last_output = Instant::now();
        s.notices = 0;
        // Render complete lines: the held partial line completed by the first newline, then
        // every complete line of `data` as one block; hold what follows the last newline.
        let mut rest = data;
        if !s.pending.is_empty() {
            match memchr::memchr(b'\n', rest) {
                Some(pos) => {
                    let mut line = std::mem::take(&mut s.pending);
                    line.extend_from_slice(&rest[..=pos]);
                    self.handle_lines(s, &line);
                    line.clear();
                    s.pending = line;
                    rest = &rest[pos + 1..];
                }
                None => {
                    s.pending.extend_from_slice(rest);
                    rest = &[];
                }
            }
        }
        if let Some(last) = memchr::memrchr(b'\n', rest) {
            self.handle_lines(s, &rest[..=last]);
            rest = &rest[last + 1..];
        }
        s.pending.extend_from_slice(rest);
        // A trailing marker once its terminator arrived.
        if s.pending.ends_with(b"\r\x1b[0K")
            && (s.pending.starts_with(b"section_start:") || s.pending.starts_with(b"section_end:"))
        {
            let tail = String::from_utf8_lossy(&s.pending).into_owned();
            s.pending.clear();
            self.handle_line(s, &tail);
        }
        Self::flush_rendered(s);
    }
}

impl Drop for TerminalSink {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut guard) = self.state.lock() {
            let s = &mut *guard;
            let tail = String::from_utf8_lossy(&std::mem::take(&mut s.pending)).into_owned();
            if !tail.is_empty() {
                self.handle_line(s, &tail);
                s.rendered.push(b'\n');
            }
            Self::flush_rendered(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);
    impl Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if let Ok(mut v) = self.0.lock() {
                v.extend_from_slice(b);
            }
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn render(chunks: &[&str], color: bool, verbose: bool) -> String {
        let buffer = Buffer::default();
        let sink =
            TerminalSink::new(Box::new(buffer.clone()), TerminalOptions { color, verbose, silence_notice_after: None });
        for c in chunks {
            sink.write(c.as_bytes());
        }
        drop(sink);
        let bytes = buffer.0.lock().map(|b| b.clone()).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[test]
    fn sections_get_durations_and_colours_can_be_stripped() {
        let out = render(
            &[
                "section_start:1:step_script\r\x1b[0K",
                "\x1b[0K\x1b[36;1mExecuting\x1b[0;m\n\x1b[32;1m$ echo hi\x1b[0;m\nh",
                "i\n",
                "section_end:2:step_script\r\x1b[0K",
            ],
            false,
            false,
        );
        assert!(out.starts_with("Executing\n$ echo hi\nhi\n  step_script "), "{out:?}");
        assert!(!out.contains('\x1b'));
    }

    #[test]
    fn collapsed_sections_show_one_line_unless_verbose() {
        let chunks =
            ["section_start:1:deps[collapsed=true]\r\x1b[0K", "noise\n", "section_end:2:deps\r\x1b[0K", "after\n"];
        let out = render(&chunks, false, false);
        assert!(!out.contains("noise") && out.contains("deps (collapsed)") && out.contains("after"), "{out:?}");
        assert!(render(&chunks, false, true).contains("noise"));
    }

    #[test]
    fn output_renders_the_same_however_it_is_split() {
        let text = "section_start:1:a\r\x1b[0Kone\ntwo \x1b[31mred\x1b[0m\n\u{e9} bad\nsection_end:2:a\r\x1b[0K\
                    section_start:3:b[collapsed=true]\r\x1b[0Khidden\nsection_end:4:b\r\x1b[0Klast\nno newline";
        let durations = regex::Regex::new(r"[0-9]+\.[0-9]{2}s").expect("regex");
        let strip_durations = |out: String| durations.replace_all(&out, "T").into_owned();
        for color in [false, true] {
            let whole = strip_durations(render(&[text], color, false));
            assert!(whole.contains("one\ntwo") && whole.contains("last\nno newline") && !whole.contains("hidden"));
            for cut in 1..text.len() {
                if !text.is_char_boundary(cut) {
                    continue;
                }
                let split = strip_durations(render(&[&text[..cut], &text[cut..]], color, false));
                assert_eq!(split, whole, "cut at {cut}, color {color}");
            }
        }
    }

    #[test]
    fn a_silent_command_gets_a_notice() {
        let buffer = Buffer::default();
        let sink = TerminalSink::new(
            Box::new(buffer.clone()),
            TerminalOptions { color: false, verbose: false, silence_notice_after: Some(Duration::from_millis(300)) },
        );
        sink.write(b"start\n");
        let mut seen = false;
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(50));
            if String::from_utf8_lossy(&buffer.0.lock().map(|b| b.clone()).unwrap_or_default())
                .contains("still running")
            {
                seen = true;
                break;
            }
        }
        assert!(seen, "no notice after silence");
    }
}
