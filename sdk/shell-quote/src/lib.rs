//! Shell quoting shared by the host (stage scripts, detached commands, SSH file operations)
//! and the plugin SDK (`runway_sdk::remote::quote`, for paths in remote commands): one word
//! a shell reads back as exactly the given text. No dependencies, so the SDK (a guest crate,
//! built for wasm32-wasip2) and the host each take it without taking the other.
//!
//! Owns: the quoting rules. Must not touch: what the quoted words are used for.

/// `'…'` POSIX single-quoted word (safe for any bytes but NUL): every `'` becomes `'\''`.
pub fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// `$'…'` ANSI-C quoted word (bash), with control characters escaped.
pub fn ansi_c_quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 3);
    out.push_str("$'");
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// The text of an ANSI-C quoted word's inside (between `$'` and `'`): the escapes
/// [`ansi_c_quote`] writes, and bash's other single-character ones, decoded.
pub fn ansi_c_unquote(inner: &str) -> String {
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('t') => out.push('\t'),
            Some('e' | 'E') => out.push('\x1b'),
            Some('a') => out.push('\x07'),
            Some('x') => {
                let mut digits = String::new();
                while digits.len() < 2 && chars.peek().is_some_and(char::is_ascii_hexdigit) {
                    digits.extend(chars.next());
                }
                match u32::from_str_radix(&digits, 16).ok().and_then(char::from_u32) {
                    Some(decoded) => out.push(decoded),
                    None => out.push_str("\\x"),
                }
            }
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_quotes_close_and_reopen_around_a_quote() {
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote(""), "''");
    }

    #[test]
    fn ansi_c_quotes_escape_control_characters() {
        assert_eq!(ansi_c_quote("a'b\\c\n\t\x1b"), r"$'a\'b\\c\n\t\x1b'");
    }

    #[test]
    fn ansi_c_unquote_reads_back_what_ansi_c_quote_wrote() {
        for text in ["a'b\\c\n\t\x1b[0;m\r\x7f", "", "plain", "\\x", "tail\\"] {
            let quoted = ansi_c_quote(text);
            assert_eq!(ansi_c_unquote(&quoted[2..quoted.len() - 1]), text, "{quoted}");
        }
        assert_eq!(ansi_c_unquote(r"\e[1m\\q\xzz"), "\x1b[1m\\q\\xzz");
    }
}
