//! Which programs a stage's script calls, and whether the job's build container can run it:
//! the build container's probe (one `exec`: can stages run detached there, may its user write
//! the builds directory, which common programs it has), a reader of the generated `sh` scripts
//! that finds every command word (quotes, `$(…)` and `eval`'d ANSI-C words understood), and the
//! rule that sends a setup stage to the build container or to the helper. Reads text only;
//! runs nothing.

use runway_shell_quote::quote;

/// The programs a container needs for stages to run detached in it (`runway:host/docker-stages`).
pub const DETACHED_PROGRAMS: &[&str] = &["setsid", "tail", "mkdir", "rm", "mv", "cat", "wc", "sleep"];

/// Programs a setup stage's script may call beyond the shell and [`DETACHED_PROGRAMS`]; the
/// build container's probe says which of them its image has ([`build_probe`]).
pub const PROBED_PROGRAMS: &[&str] = &[
    "find", "uname", "chmod", "chown", "cp", "ln", "touch", "dirname", "basename", "env", "head", "sort", "tr", "cut",
    "date", "id", "mktemp", "stat", "readlink", "realpath", "tee", "expr", "seq", "timeout", "sed", "grep", "xargs",
    "rmdir", "ls", "sync",
];

/// Words that start a command in POSIX `sh` without being a program: builtins and keywords.
const SHELL_WORDS: &[&str] = &[
    "echo", "printf", "read", "export", "cd", "test", "[", "true", "false", ":", "set", "unset", "exit", "return",
    "eval", "exec", "shift", "trap", "wait", "kill", "umask", "type", "command", ".", "break", "continue", "readonly",
    "pwd", "if", "then", "else", "elif", "fi", "do", "done", "while", "until", "for", "case", "esac", "in", "!",
    "local", "trap", "eval", "set",
];

/// A program a generated setup script only falls back on (`prepare_script` asks `hostname`
/// when `/proc` does not say the machine's name, and `uname -n` after it): its absence does
/// not fail the stage.
const FALLBACK_PROGRAMS: &[&str] = &["hostname"];

/// Predefined stages that may run in the build container when their script needs nothing of
/// the helper's (gitlab-runner runs `prepare_script` there too): with `GIT_STRATEGY: none` and
/// no cache or artifacts, a job then needs no helper container at all.
const SETUP_STAGES: &[&str] = &["prepare_script", "get_sources", "cleanup_file_variables"];

/// The build container's probe, one `exec`: `detached` when stages can run detached in it
/// ([`DETACHED_PROGRAMS`]), `writable` when its user may write `builds_dir`, and `have P` for
/// each program of [`PROBED_PROGRAMS`] it has.
pub fn build_probe(builds_dir: &str) -> String {
    let detached: Vec<String> = DETACHED_PROGRAMS.iter().map(|p| format!("command -v {p} >/dev/null 2>&1")).collect();
    format!(
        "if {}; then echo detached; fi; if [ -w {} ]; then echo writable; fi; \
         for p in {}; do if command -v \"$p\" >/dev/null 2>&1; then echo \"have $p\"; fi; done",
        detached.join(" && "),
        quote(builds_dir),
        PROBED_PROGRAMS.join(" ")
    )
}

/// What [`build_probe`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuildProbe {
    /// Stages can run detached in the container.
    pub detached: bool,
    /// Its user may write the builds directory.
    pub writable: bool,
    /// The programs of [`PROBED_PROGRAMS`] it has.
    pub programs: Vec<String>,
}

/// Read [`build_probe`]'s output.
pub fn parse_build_probe(output: &str) -> BuildProbe {
    let mut probe = BuildProbe::default();
    for line in output.lines().map(str::trim) {
        match line {
            "detached" => probe.detached = true,
            "writable" => probe.writable = true,
            _ => {
                if let Some(program) = line.strip_prefix("have ") {
                    probe.programs.push(program.to_string());
                }
            }
        }
    }
    probe
}

/// The programs `script` may run: the first word of every command — at the start, after a
/// newline, `;`, `&`, `|`, `(`, `)`, `{`, `}`, a backtick or `$(` (in double quotes too), past
/// keywords, variable assignments and redirections — unquoted, its last path part. An ANSI-C
/// quoted word (`$'…'`, what the generated scripts `eval`) is read as code too. Words of
/// here-documents and `case` patterns may count as programs: that errs towards more
/// programs, never fewer.
pub fn command_words(script: &str) -> std::collections::BTreeSet<String> {
    let mut words = std::collections::BTreeSet::new();
    let mut lexer = Lexer {
        words: &mut words,
        word: String::new(),
        at_start: true,
        started: false,
        program: String::new(),
        redirect_target: false,
    };
    lexer.code(&script.chars().collect::<Vec<_>>(), false);
    words
}

/// [`command_words`]' reader.
struct Lexer<'a> {
    words: &'a mut std::collections::BTreeSet<String>,
    word: String,
    at_start: bool,
    started: bool,
    /// The current command's program.
    program: String,
    /// The next word is a redirection's target (`<`, `>` and the like stood alone).
    redirect_target: bool,
}

impl Lexer<'_> {
    /// The end of a word: a command's first one is its program.
    fn end_word(&mut self) {
        let word = std::mem::take(&mut self.word);
        let started = std::mem::replace(&mut self.started, false);
        if !self.at_start || !started {
            return;
        }
        if std::mem::replace(&mut self.redirect_target, false) {
            return;
        }
        let assignment = word
            .split_once('=')
            .is_some_and(|(name, _)| !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        let redirect = word.trim_start_matches(|c: char| c.is_ascii_digit()).starts_with(['<', '>']);
        let prefix = matches!(
            word.as_str(),
            "if" | "then" | "else" | "elif" | "do" | "while" | "until" | "!" | "exec" | "command" | "time"
        );
        if assignment || redirect || prefix {
            self.redirect_target = redirect
                && word.trim_start_matches(|c: char| c.is_ascii_digit() || c == '<' || c == '>' || c == '&').is_empty();
            return;
        }
        self.at_start = false;
        let program = word.rsplit('/').next().unwrap_or(&word);
        self.program = program.to_string();
        let name = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '+' | '-' | '[' | ':');
        if program.chars().next().is_some_and(|c| !c.is_ascii_digit()) && program.chars().all(name) {
            self.words.insert(program.to_string());
        }
    }

    /// A command boundary.
    fn boundary(&mut self) {
        self.end_word();
        self.at_start = true;
        self.redirect_target = false;
        self.program.clear();
    }

    fn push(&mut self, c: char) {
        self.word.push(c);
        self.started = true;
    }

    /// Read `chars` as shell code; returns at its end or, when `nested` (in a `$(`), at the
    /// `)` closing it, whose index after it it returns.
    fn code(&mut self, chars: &[char], nested: bool) -> usize {
        let mut i = 0;
        let mut depth = 0usize;
        while i < chars.len() {
            let c = chars[i];
            let next = chars.get(i + 1).copied();
            match c {
                '\\' => {
                    if let Some(n) = next.filter(|n| *n != '\n') {
                        self.push(n);
                    }
                    i += 2;
                    continue;
                }
                '\'' => {
                    let end = chars[i + 1..].iter().position(|c| *c == '\'').map_or(chars.len(), |p| i + 1 + p);
                    self.word.extend(&chars[i + 1..end.min(chars.len())]);
                    self.started = true;
                    i = end + 1;
                    continue;
                }
                '"' => {
                    i = self.double_quoted(chars, i + 1);
                    continue;
                }
                '$' if next == Some('\'') => {
                    // `$'…'`: decoded; an argument of `eval` (how the scripts run their body)
                    // is read as code.
                    let mut end = i + 2;
                    while end < chars.len() && chars[end] != '\'' {
                        end += if chars[end] == '\\' { 2 } else { 1 };
                    }
                    let inner: String = chars[i + 2..end.min(chars.len())].iter().collect();
                    let decoded = runway_shell_quote::ansi_c_unquote(&inner);
                    if !self.at_start && self.program == "eval" {
                        self.boundary();
                        self.code(&decoded.chars().collect::<Vec<_>>(), false);
                        self.boundary();
                    } else {
                        self.word.push_str(&decoded);
                        self.started = true;
                    }
                    i = end + 1;
                    continue;
                }
                '$' if next == Some('(') && chars.get(i + 2) == Some(&'(') => {
                    // Arithmetic: no command in it.
                    let end = chars[i..].windows(2).position(|w| w == [')', ')']).map_or(chars.len(), |p| i + p + 2);
                    self.word.extend(&chars[i..end.min(chars.len())]);
                    self.started = true;
                    i = end;
                    continue;
                }
                '$' if next == Some('(') => {
                    self.boundary();
                    i += 2 + self.code(&chars[i + 2..], true);
                    self.boundary();
                    continue;
                }
                '$' if next == Some('{') => {
                    let end = chars[i..].iter().position(|c| *c == '}').map_or(chars.len(), |p| i + p);
                    self.word.extend(&chars[i..(end + 1).min(chars.len())]);
                    self.started = true;
                    i = end + 1;
                    continue;
                }
                ')' if depth == 0 && nested => {
                    self.boundary();
                    return i + 1;
                }
                ')' => {
                    depth = depth.saturating_sub(1);
                    self.boundary();
                }
                '(' => {
                    depth += 1;
                    self.boundary();
                }
                '#' if !self.started => {
                    while i < chars.len() && chars[i] != '\n' {
                        i += 1;
                    }
                    continue;
                }
                ' ' | '\t' => self.end_word(),
                '\n' | ';' | '&' | '|' | '{' | '}' | '`' => self.boundary(),
                _ => self.push(c),
            }
            i += 1;
        }
        self.end_word();
        chars.len()
    }

    /// Read a double-quoted word's rest from `start`; the index after its closing quote.
    /// Command substitutions in it are code.
    fn double_quoted(&mut self, chars: &[char], start: usize) -> usize {
        let mut i = start;
        self.started = true;
        while i < chars.len() {
            match chars[i] {
                '"' => return i + 1,
                '\\' => {
                    self.word.extend(chars.get(i + 1));
                    i += 2;
                }
                '$' if chars.get(i + 1) == Some(&'(') => {
                    // The quoted word so far belongs to the outer command.
                    let (word, started, at_start) =
                        (std::mem::take(&mut self.word), self.started, std::mem::replace(&mut self.at_start, true));
                    self.started = false;
                    i += 2 + self.code(&chars[i + 2..], true);
                    self.word = word;
                    self.started = started;
                    self.at_start = at_start;
                }
                c => {
                    self.word.push(c);
                    i += 1;
                }
            }
        }
        i
    }
}

/// The programs `script` may run that a build container with the programs `have` lacks
/// (besides a POSIX shell and [`DETACHED_PROGRAMS`]; git, git-lfs and Runway's helper commands
/// are never the build container's): empty when it can run there.
pub fn missing_programs(script: &str, have: &[String]) -> Vec<String> {
    command_words(script)
        .into_iter()
        .filter(|w| {
            let w = w.as_str();
            !(SHELL_WORDS.contains(&w)
                || DETACHED_PROGRAMS.contains(&w)
                || FALLBACK_PROGRAMS.contains(&w)
                || (PROBED_PROGRAMS.contains(&w) && have.iter().any(|h| h == w)))
        })
        .collect()
}

/// Whether predefined stage `name` with `script` can run in a build container with the
/// programs `have` (besides a POSIX shell and [`DETACHED_PROGRAMS`]): it is one of
/// [`SETUP_STAGES`] and every program its script may run is there (git, git-lfs and Runway's
/// helper commands never are: they are the helper's).
pub fn runs_without_helper(name: &str, script: &str, have: &[String]) -> bool {
    SETUP_STAGES.contains(&name) && missing_programs(script, have).is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_stages_run_in_the_build_container_when_it_has_what_they_call() {
        let prepare = "export CI_REPOSITORY_URL='http://x/group/project.git'\nread -r RUNWAY_MACHINE 2>/dev/null < /proc/sys/kernel/hostname || RUNWAY_MACHINE=$(hostname 2>/dev/null || uname -n)\necho \"Running on $RUNWAY_MACHINE...\"\n";
        let words = command_words(prepare);
        assert_eq!(
            words.iter().map(String::as_str).collect::<Vec<_>>(),
            ["echo", "export", "hostname", "read", "uname"]
        );
        let have = vec!["uname".to_string(), "find".to_string()];
        assert!(runs_without_helper("prepare_script", prepare, &have));
        assert!(!runs_without_helper("prepare_script", prepare, &[]), "uname is missing");
        let none = "echo 'Skipping Git repository setup'\n[ -d '/builds/g/p' ] || mkdir -p '/builds/g/p'\n";
        assert!(runs_without_helper("get_sources", none, &[]));
        assert!(!runs_without_helper("get_sources", "git init '/builds/g/p'\n", &have));
        let cleanup = "if [ -d x ]; then find x -type f -name '*.lock' -delete; fi\nif [ -f e ]; then : > e; fi\n";
        assert!(runs_without_helper("cleanup_file_variables", cleanup, &have));
        assert!(!runs_without_helper("cleanup_file_variables", cleanup, &[]), "find is missing");
        assert!(!runs_without_helper("restore_cache", "echo nothing\n", &have), "only the setup stages");
        assert!(!runs_without_helper("get_sources", "'/usr/local/bin/runway' cache-extractor\n", &have));
        assert!(!runs_without_helper("get_sources", "FOO=1 2>/dev/null git fetch\n", &have));
        assert!(!runs_without_helper("get_sources", "echo $(curl x)\n", &have), "unknown programs need the helper");
    }

    #[test]
    fn command_words_read_quotes_substitutions_and_evaluated_ansi_c_words() {
        let words = |s: &str| command_words(s).into_iter().collect::<Vec<_>>();
        assert_eq!(
            words("printf '%s\\n' $'\\e[0;m a;b'; echo \"x; y $(uname -n) z\" | tee f"),
            ["echo", "printf", "tee", "uname"]
        );
        let wrapped = format!(
            "set -eo pipefail\ntrap 'exit 1' TERM\neval {} < /dev/null\nexit $?\n",
            runway_shell_quote::ansi_c_quote(
                "export A='x;git'\nprintf '\\x1b[1mSkipping Git\\x1b[0;m\\n'\nif [ -d d ]; then find d -delete; fi\n"
            )
        );
        assert_eq!(words(&wrapped), ["[", "eval", "exit", "export", "fi", "find", "printf", "set", "trap"]);
        assert_eq!(words("${A:-x} 2>/dev/null; X=1 '/usr/local/bin/runway' cache-extractor # git\n"), ["runway"]);
        assert_eq!(words("echo $((1+2)) `date`"), ["date", "echo"]);
        assert_eq!(
            words("case $x in a|b) echo x;; esac; (cd d && ls) ; tail f"),
            ["b", "case", "cd", "echo", "esac", "ls", "tail"]
        );
    }

    #[test]
    fn the_build_probe_says_what_the_image_has() {
        let probe = build_probe("/builds");
        assert!(probe.starts_with("if command -v setsid >/dev/null 2>&1 && command -v tail"));
        assert!(probe.contains("if [ -w '/builds' ]; then echo writable; fi"));
        let parsed = parse_build_probe("detached\nwritable\nhave find\nhave uname\n");
        assert!(parsed.detached && parsed.writable);
        assert_eq!(parsed.programs, ["find", "uname"]);
        assert_eq!(parse_build_probe("have ls\n"), BuildProbe { programs: vec!["ls".into()], ..Default::default() });
    }
}
