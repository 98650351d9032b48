//! Plain command lines run without a shell: `cd DIR && exec PROGRAM ARGS…`, the way
//! executors start a stage's shell, becomes the command `sh` would end up running (PROGRAM
//! found in `PATH`, in DIR, with the `PWD` and `OLDPWD` that `sh`'s `cd` exports), so the
//! stage reaper ([`super::reaper`]) spawns it with one `exec` instead of two. Anything a
//! shell would expand, redirect or run otherwise, and anything `sh` would fail at itself (its
//! messages and exit codes are kept), is left to `sh`.
//!
//! Owns: [`launch`] and its word splitting. Must not touch: processes (it only reads the
//! file system to decide), WIT types.

use std::path::Path;

use crate::connector::process::{environment, resolve_program, LocalCommand};

/// A word of a command line ([`plain_words`]).
#[derive(Debug, PartialEq)]
enum Word {
    /// A word, its quotes removed.
    Text(String),
    /// `&&`.
    And,
}

/// The words of `command` when it is made of nothing but plain words (letters, digits and
/// `_@%+=:,./-`), single-quoted strings (as [`runway_shell_quote::quote`] writes them), backslash
/// escapes and `&&`; `None` when a shell would expand, redirect or run anything else.
fn plain_words(command: &str) -> Option<Vec<Word>> {
    let mut words = Vec::new();
    let mut current: Option<String> = None;
    let mut chars = command.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => words.extend(current.take().map(Word::Text)),
            '\'' => {
                let word = current.get_or_insert_with(String::new);
                loop {
                    match chars.next()? {
                        '\'' => break,
                        quoted => word.push(quoted),
                    }
                }
            }
            '\\' => match chars.next()? {
                '\n' => return None,
                escaped => current.get_or_insert_with(String::new).push(escaped),
            },
            '&' if current.is_none() && chars.next_if_eq(&'&').is_some() => {
                if !matches!(chars.peek(), Some(' ' | '\t')) {
                    return None;
                }
                words.push(Word::And);
            }
            c if c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c) => {
                current.get_or_insert_with(String::new).push(c)
            }
            _ => return None,
        }
    }
    words.extend(current.map(Word::Text));
    Some(words)
}

/// `cd DIR && exec PROGRAM ARGS…` (how executors start a stage's shell) as the command `sh`
/// would end up running: PROGRAM found in `PATH`, in DIR, with the `PWD` and `OLDPWD` that
/// `sh`'s `cd` exports — one `exec` instead of two. `None` for anything else, and whenever
/// `sh` would fail instead (DIR not a directory, PROGRAM not found): those keep `sh`, its
/// messages and exit codes.
pub fn launch(command: &str) -> Option<LocalCommand> {
    let words = plain_words(command)?;
    let [Word::Text(cd), Word::Text(dir), Word::And, Word::Text(exec), Word::Text(program), rest @ ..] =
        words.as_slice()
    else {
        return None;
    };
    let args: Vec<String> =
        rest.iter().map(|w| if let Word::Text(t) = w { Some(t.clone()) } else { None }).collect::<Option<_>>()?;
    if cd != "cd" || exec != "exec" || program.starts_with('-') || program.contains('=') {
        return None;
    }
    // The logical path `cd` sets as PWD is the path itself only when it has nothing to resolve.
    let dir = if dir.len() > 1 { dir.trim_end_matches('/') } else { dir.as_str() };
    let plain_path = dir.starts_with('/') && !dir.contains("//") && !dir.split('/').any(|c| c == "." || c == "..");
    if !plain_path || !Path::new(dir).is_dir() {
        return None;
    }
    let oldpwd = std::env::current_dir().ok()?.to_str()?.to_string();
    let cmd = LocalCommand {
        program: program.clone(),
        args,
        env: vec![("PWD".into(), dir.to_string()), ("OLDPWD".into(), oldpwd)],
        cwd: Some(dir.to_string()),
        stdin: None,
    };
    resolve_program(&cmd, &environment(&cmd)).filter(|p| p.is_absolute() && p.is_file())?;
    Some(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_words_are_split_as_sh_would_and_anything_else_is_left_to_sh() {
        use Word::{And, Text};
        let text = |w: &str| Text(w.to_string());
        assert_eq!(
            plain_words(r"cd '/b/it'\''s dir' && exec su -s '/bin/bash' 'u' -c 'bash --login'"),
            Some(vec![
                text("cd"),
                text("/b/it's dir"),
                And,
                text("exec"),
                text("su"),
                text("-s"),
                text("/bin/bash"),
                text("u"),
                text("-c"),
                text("bash --login")
            ])
        );
        assert_eq!(plain_words("a\\ b  c"), Some(vec![text("a b"), text("c")]));
        for shell_work in [
            "cd $HOME && exec bash",
            "cd /b && exec bash > x",
            "cd /b; exec bash",
            "cd /b&&exec bash",
            "cd '/b",
            "a \"b\"",
        ] {
            assert_eq!(plain_words(shell_work), None, "{shell_work}");
        }
    }

    #[test]
    fn a_plain_cd_and_exec_runs_the_program_itself_as_sh_would_have() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().display().to_string();
        let cmd = launch(&format!("cd {}/ && exec bash --login", runway_shell_quote::quote(&path))).expect("direct");
        assert_eq!((cmd.program.as_str(), cmd.args.as_slice()), ("bash", &["--login".to_string()][..]));
        assert_eq!(cmd.cwd.as_deref(), Some(path.as_str()));
        let pwd = cmd.env.iter().find(|(k, _)| k == "PWD").map(|(_, v)| v.as_str());
        assert_eq!(pwd, Some(path.as_str()), "PWD without the trailing slash, as `cd` sets it");
        assert!(cmd.env.iter().any(|(k, _)| k == "OLDPWD"));
        // Whatever sh would report itself stays with sh: a missing directory or program,
        // paths with something to resolve, other commands.
        for left in [
            format!("cd {path}/missing && exec bash"),
            format!("cd {path} && exec runway-no-such-program"),
            format!("cd {path}/. && exec bash"),
            format!("cd {path} && exec ./bash"),
            format!("cd {path} && exec bash && true"),
            format!("cd {path} && bash"),
            "cd relative && exec bash".to_string(),
        ] {
            assert!(launch(&left).is_none(), "{left}");
        }
    }
}
