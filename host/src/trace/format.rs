//! GitLab's job-log format (§3.6): ANSI colours, collapsible section markers, the header the
//! runner prints first and the footer it prints last. Pure string builders plus
//! [`TraceLog`], which writes them to any [`TraceSink`].

use super::TraceSink;

/// The ANSI sequences GitLab Runner uses.
pub mod ansi {
    /// Errors and the failure footer.
    pub const BOLD_RED: &str = "\x1b[31;1m";
    /// The success footer.
    pub const BOLD_GREEN: &str = "\x1b[32;1m";
    /// Warnings.
    pub const BOLD_YELLOW: &str = "\x1b[33;1m";
    /// Section headers (`$ command` lines, "Preparing the executor").
    pub const BOLD_CYAN: &str = "\x1b[36;1m";
    /// Notices.
    pub const YELLOW: &str = "\x1b[0;33m";
    /// Back to the default colour.
    pub const RESET: &str = "\x1b[0;m";
    /// Clear to the end of the line (after section markers).
    pub const CLEAR: &str = "\x1b[0K";
}

/// Options of a `section_start` marker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SectionOptions {
    /// Rendered collapsed in the job page.
    pub collapsed: bool,
    /// The job page shows no duration for the section.
    pub hide_duration: bool,
}

impl SectionOptions {
    /// A section rendered collapsed.
    pub fn collapsed() -> Self {
        SectionOptions { collapsed: true, hide_duration: false }
    }
}

/// `section_start:<unix ts>:<name>[options]\r\e[0K`.
pub fn section_start(unix_ts: i64, name: &str, options: SectionOptions) -> String {
    let mut flags = Vec::new();
    if options.collapsed {
        flags.push("collapsed=true");
    }
    if options.hide_duration {
        flags.push("hide_duration=true");
    }
    let flags = if flags.is_empty() { String::new() } else { format!("[{}]", flags.join(",")) };
    format!("section_start:{unix_ts}:{name}{flags}\r{}", ansi::CLEAR)
}

/// `section_end:<unix ts>:<name>\r\e[0K`.
pub fn section_end(unix_ts: i64, name: &str) -> String {
    format!("section_end:{unix_ts}:{name}\r{}", ansi::CLEAR)
}

/// `<colour><text>\e[0;m\n`: a line in one of the [`ansi`] colours.
pub fn colored_line(color: &str, text: &str) -> String {
    format!("{color}{text}{}\n", ansi::RESET)
}

/// A plain runner message (GitLab's `Println`): `\e[0K<text>\e[0;m\n`.
pub fn plain_line(text: &str) -> String {
    colored_line(ansi::CLEAR, text)
}

/// A bold-green message (GitLab's `Infoln`).
pub fn info_line(text: &str) -> String {
    colored_line(ansi::BOLD_GREEN, text)
}

/// A yellow `WARNING: ` message.
pub fn warning_line(text: &str) -> String {
    colored_line(ansi::YELLOW, &format!("WARNING: {text}"))
}

/// A bold-red `ERROR: ` message.
pub fn error_line(text: &str) -> String {
    colored_line(ansi::BOLD_RED, &format!("ERROR: {text}"))
}

/// The bold-cyan description line printed after a stage's `section_start`.
pub fn section_header_line(text: &str) -> String {
    colored_line(&format!("{}{}", ansi::CLEAR, ansi::BOLD_CYAN), text)
}

/// Who is running the job, for the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerIdentity {
    /// Runway's version.
    pub version: String,
    /// The git revision of the build.
    pub revision: String,
    /// The `[[runners]] name`.
    pub name: String,
    /// The shortened runner token shown in logs.
    pub short_token: String,
    /// The manager's system ID (`s_…`).
    pub system_id: String,
}

/// `Running with runway <version> (<revision>)` and `  on <name> <short token>, system ID: <id>`.
pub fn header(identity: &RunnerIdentity) -> String {
    let mut out = plain_line(&format!("Running with runway {} ({})", identity.version, identity.revision));
    out.push_str(&plain_line(&format!(
        "  on {} {}, system ID: {}",
        identity.name, identity.short_token, identity.system_id
    )));
    out
}

/// Bold-green `Job succeeded`.
pub fn job_succeeded() -> String {
    info_line("Job succeeded")
}

/// Bold-red `ERROR: Job failed: <err>` or `ERROR: Job failed (system failure): <err>`.
pub fn job_failed(error: &str, system_failure: bool) -> String {
    if system_failure {
        error_line(&format!("Job failed (system failure): {error}"))
    } else {
        error_line(&format!("Job failed: {error}"))
    }
}

fn now_unix() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Writing GitLab's log format to any sink; section markers use the current UTC time.
pub trait TraceLog: TraceSink {
    /// Text as it is.
    fn write_str(&self, text: &str) {
        self.write(text.as_bytes());
    }
    /// Open the collapsible section `name`.
    fn section_start(&self, name: &str, options: SectionOptions) {
        self.write_str(&section_start(now_unix(), name, options));
    }
    /// Close section `name`.
    fn section_end(&self, name: &str) {
        self.write_str(&section_end(now_unix(), name));
    }
    /// A plain line.
    fn println(&self, text: &str) {
        self.write_str(&plain_line(text));
    }
    /// A green notice line.
    fn info(&self, text: &str) {
        self.write_str(&info_line(text));
    }
    /// A yellow `WARNING:` line.
    fn warning(&self, text: &str) {
        self.write_str(&warning_line(text));
    }
    /// The job's footer line(s): kept even past the output limit ([`TraceSink::write_footer`]).
    fn footer(&self, text: &str) {
        self.write_footer(text.as_bytes());
    }
    /// A red `ERROR:` line.
    fn error(&self, text: &str) {
        self.write_str(&error_line(text));
    }
    /// The header every job log starts with.
    fn header(&self, identity: &RunnerIdentity) {
        self.write_str(&header(identity));
    }
}

impl<T: TraceSink + ?Sized> TraceLog for T {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::MemorySink;

    #[test]
    fn section_markers() {
        assert_eq!(
            section_start(1700000000, "get_sources", SectionOptions::default()),
            "section_start:1700000000:get_sources\r\x1b[0K"
        );
        assert_eq!(
            section_start(5, "section_script_step_0", SectionOptions::collapsed()),
            "section_start:5:section_script_step_0[collapsed=true]\r\x1b[0K"
        );
        assert_eq!(
            section_start(5, "s", SectionOptions { collapsed: true, hide_duration: true }),
            "section_start:5:s[collapsed=true,hide_duration=true]\r\x1b[0K"
        );
        assert_eq!(section_end(6, "get_sources"), "section_end:6:get_sources\r\x1b[0K");
    }

    #[test]
    fn header_and_footers() {
        let id = RunnerIdentity {
            version: "0.1.0".into(),
            revision: "abc123".into(),
            name: "box".into(),
            short_token: "t0k3n".into(),
            system_id: "s_0123".into(),
        };
        assert_eq!(
            header(&id),
            "\x1b[0KRunning with runway 0.1.0 (abc123)\x1b[0;m\n\x1b[0K  on box t0k3n, system ID: s_0123\x1b[0;m\n"
        );
        assert_eq!(job_succeeded(), "\x1b[32;1mJob succeeded\x1b[0;m\n");
        assert_eq!(job_failed("exit code 1", false), "\x1b[31;1mERROR: Job failed: exit code 1\x1b[0;m\n");
        assert_eq!(job_failed("boom", true), "\x1b[31;1mERROR: Job failed (system failure): boom\x1b[0;m\n");
        assert_eq!(warning_line("w"), "\x1b[0;33mWARNING: w\x1b[0;m\n");
        assert_eq!(section_header_line("Getting source"), "\x1b[0K\x1b[36;1mGetting source\x1b[0;m\n");
    }

    #[test]
    fn trace_log_writes_markers_with_the_current_time() {
        let sink = MemorySink::default();
        let before = chrono::Utc::now().timestamp();
        sink.section_start("step_script", SectionOptions::default());
        sink.info("$ echo hi");
        sink.section_end("step_script");
        let after = chrono::Utc::now().timestamp();
        let text = sink.text();
        let lines: Vec<&str> = text.split("\r\x1b[0K").collect();
        let ts: i64 = lines[0]
            .strip_prefix("section_start:")
            .and_then(|rest| rest.strip_suffix(":step_script"))
            .and_then(|ts| ts.parse().ok())
            .expect("section_start marker with a timestamp");
        assert!((before..=after).contains(&ts));
        assert!(lines[1].starts_with("\x1b[32;1m$ echo hi\x1b[0;m\nsection_end:"));
    }
}
