//! Path patterns with doublestar semantics (gitlab-runner matches `artifacts:paths`,
//! `artifacts:exclude` and `cache:paths` with `github.com/bmatcuk/doublestar/v4`): `*` and `?`
//! never cross `/`, `**` alone as a path component matches zero or more directories (`a/**`
//! also matches `a` itself), `**` inside a component is a plain `*`, `[...]` and `[!...]`/`[^...]`
//! classes, `{a,b}` alternatives (nested), `\` escapes the next character. Dot files are not
//! special. A pattern is translated once into an anchored [`regex::Regex`].
//!
//! Owns: the pattern language. Must not touch: the file system (see `select`).

use regex::Regex;

/// A compiled doublestar pattern, matched against slash-separated relative paths.
#[derive(Debug, Clone)]
pub struct Pattern {
    regex: Regex,
    /// The number of path components the pattern can match at most; `None` when it contains a
    /// `**` component (any depth).
    max_depth: Option<usize>,
}

/// The characters that make a path a pattern (doublestar's `SplitPattern` looks for these).
pub(crate) const META: &[char] = &['*', '?', '[', '{', '\\'];

/// A pattern that does not compile (doublestar's `ErrBadPattern`): what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadPattern(pub String);

impl Pattern {
    /// Compiles `pattern`; the error says what is wrong with it (doublestar's `ErrBadPattern`).
    pub fn new(pattern: &str) -> Result<Pattern, BadPattern> {
        let mut out = String::from("(?s)^");
        translate(pattern, &mut out)?;
        out.push('$');
        let regex = Regex::new(&out).map_err(|e| BadPattern(format!("syntax error in pattern {pattern:?}: {e}")))?;
        let max_depth = if pattern.split('/').any(|c| c == "**") { None } else { Some(pattern.split('/').count()) };
        Ok(Pattern { regex, max_depth })
    }

    /// Whether the slash-separated relative `path` matches the whole pattern.
    pub fn matches(&self, path: &str) -> bool {
        self.regex.is_match(path)
    }

    /// The deepest path (in components) this pattern can match; `None` for any depth.
    pub fn max_depth(&self) -> Option<usize> {
        self.max_depth
    }
}

/// Splits a pattern into its literal directory prefix and the rest, as doublestar's
/// `SplitPattern`: the prefix ends at the last `/` before the first meta character.
pub(super) fn split_pattern(pattern: &str) -> (&str, &str) {
    let first_meta = pattern.find(META).unwrap_or(pattern.len());
    match pattern[..first_meta].rfind('/') {
        None => (".", pattern),
        Some(0) => ("/", &pattern[1..]),
        Some(i) => (&pattern[..i], &pattern[i + 1..]),
    }
}

fn translate(pattern: &str, out: &mut String) -> Result<(), BadPattern> {
    let chars: Vec<char> = pattern.chars().collect();
    translate_chars(&chars, pattern, out)
}

fn translate_chars(chars: &[char], whole: &str, out: &mut String) -> Result<(), BadPattern> {
    let mut i = 0;
    let n = chars.len();
    while i < n {
        let c = chars[i];
        match c {
            '*' => {
                let start_of_component = i == 0 || chars[i - 1] == '/';
                if i + 1 < n && chars[i + 1] == '*' {
                    let end_of_component = i + 2 == n || chars[i + 2] == '/';
                    if start_of_component && end_of_component {
                        if i + 2 == n {
                            // `**` at the end: everything below, and (after a `/`) the
                            // directory itself: `a/**` matches `a`.
                            if i > 0 {
                                // Remove the `/` just emitted and make it part of the group.
                                out.truncate(out.len() - 1);
                                out.push_str("(?:/.*)?");
                            } else {
                                out.push_str(".*");
                            }
                            i += 2;
                        } else {
                            // `**/`: zero or more whole directories.
                            out.push_str("(?:[^/]*/)*");
                            i += 3;
                        }
                        continue;
                    }
                    // `**` inside a component behaves like `*`.
                    while i < n && chars[i] == '*' {
                        i += 1;
                    }
                    out.push_str("[^/]*");
                    continue;
                }
                out.push_str("[^/]*");
                i += 1;
            }
            '?' => {
                out.push_str("[^/]");
                i += 1;
            }
            '[' => {
                let mut j = i + 1;
                let mut class = String::from("[");
                if j < n && (chars[j] == '!' || chars[j] == '^') {
                    class.push('^');
                    j += 1;
                }
                if j >= n || chars[j] == ']' {
                    return Err(BadPattern(format!(
                        "syntax error in pattern {whole:?}: empty or unterminated character class"
                    )));
                }
                let mut closed = false;
                while j < n {
                    match chars[j] {
                        ']' => {
                            closed = true;
                            j += 1;
                            break;
                        }
                        '\\' if j + 1 < n => {
                            push_class_char(&mut class, chars[j + 1]);
                            j += 2;
                        }
                        '-' => {
                            class.push('-');
                            j += 1;
                        }
                        other => {
                            push_class_char(&mut class, other);
                            j += 1;
                        }
                    }
                }
                if !closed {
                    return Err(BadPattern(format!("syntax error in pattern {whole:?}: unterminated character class")));
                }
                class.push(']');
                out.push_str(&class);
                i = j;
            }
            '{' => {
                let close = matching_brace(chars, i + 1)
                    .ok_or_else(|| BadPattern(format!("syntax error in pattern {whole:?}: unterminated '{{'")))?;
                out.push_str("(?:");
                for (k, alt) in split_alternatives(&chars[i + 1..close]).into_iter().enumerate() {
                    if k > 0 {
                        out.push('|');
                    }
                    translate_chars(alt, whole, out)?;
                }
                out.push(')');
                i = close + 1;
            }
            '\\' => {
                if i + 1 >= n {
                    return Err(BadPattern(format!("syntax error in pattern {whole:?}: trailing '\\'")));
                }
                push_literal(out, chars[i + 1]);
                i += 2;
            }
            other => {
                push_literal(out, other);
                i += 1;
            }
        }
    }
    Ok(())
}

fn push_literal(out: &mut String, c: char) {
    let mut buf = [0u8; 4];
    out.push_str(&regex::escape(c.encode_utf8(&mut buf)));
}

fn push_class_char(class: &mut String, c: char) {
    if matches!(c, '\\' | '[' | ']' | '^' | '-' | '&' | '~') {
        class.push('\\');
    }
    class.push(c);
}

/// The index of the `}` closing the `{` just before `from`, skipping nested braces and escapes.
fn matching_brace(chars: &[char], from: usize) -> Option<usize> {
    let mut depth = 1;
    let mut j = from;
    while j < chars.len() {
        match chars[j] {
            '\\' => j += 1,
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(j);
                }
            }
            _ => {}
        }
        j += 1;
    }
    None
}

/// Splits the inside of `{...}` at its top-level commas.
fn split_alternatives(chars: &[char]) -> Vec<&[char]> {
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    let mut j = 0;
    while j < chars.len() {
        match chars[j] {
            '\\' => j += 1,
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&chars[start..j]);
                start = j + 1;
            }
            _ => {}
        }
        j += 1;
    }
    parts.push(&chars[start.min(chars.len())..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, path: &str) -> bool {
        Pattern::new(p).unwrap().matches(path)
    }

    #[test]
    fn stars_stay_in_their_component() {
        assert!(m("*.txt", "a.txt"));
        assert!(m("*.txt", ".hidden.txt"));
        assert!(!m("*.txt", "d/a.txt"));
        assert!(m("d/?.txt", "d/a.txt"));
        assert!(!m("?", "/"));
        assert!(m("d/**.txt", "d/a.txt"), "** inside a component is *");
        assert!(!m("d/**.txt", "d/e/a.txt"));
    }

    #[test]
    fn doublestar_components() {
        assert!(m("**", "a/b/c"));
        assert!(m("**/c", "c"));
        assert!(m("**/c", "a/b/c"));
        assert!(!m("**/c", "a/bc"));
        assert!(m("a/**/c", "a/c"));
        assert!(m("a/**/c", "a/x/y/c"));
        assert!(m("a/**", "a"), "a/** matches the directory itself");
        assert!(m("a/**", "a/b/c"));
        assert!(!m("a/**", "ab"));
        assert!(m("a/**/*.log", "a/x/y.log"));
    }

    #[test]
    fn classes_alternatives_escapes() {
        assert!(m("[ab].txt", "a.txt"));
        assert!(!m("[!ab].txt", "a.txt"));
        assert!(m("[^ab].txt", "c.txt"));
        assert!(m("[a-c]x", "bx"));
        assert!(m("{foo,bar}/*.xml", "bar/r.xml"));
        assert!(m("{foo,b{a,u}r}.xml", "bur.xml"));
        assert!(m("x\\*y", "x*y"));
        assert!(!m("x\\*y", "xzy"));
        assert!(m("a+b(c).txt", "a+b(c).txt"));
        assert!(Pattern::new("[").is_err());
        assert!(Pattern::new("{a,b").is_err());
    }

    #[test]
    fn split_like_doublestar() {
        assert_eq!(split_pattern("a/b/*.txt"), ("a/b", "*.txt"));
        assert_eq!(split_pattern("*.txt"), (".", "*.txt"));
        assert_eq!(split_pattern("a/b*/c"), ("a", "b*/c"));
        assert_eq!(split_pattern("/abs/**"), ("/abs", "**"));
        assert_eq!(split_pattern("/*"), ("/", "*"));
    }
}
