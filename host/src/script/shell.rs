//! Bash quoting and the outer script wrapper GitLab uses.
//!
//! The script reaches bash on standard input, so the stage body is one word of one line,
//! `eval $'…' < /dev/null`: bash reads the whole body before running any of it, and commands
//! in it read an empty standard input instead of the rest of the script. gitlab-runner writes
//! `: | eval $'…'`; the pipeline costs two forks per stage (≈1 ms on a 2-core machine, a
//! tenth of a trivial job) and changes nothing the job sees but `$BASH_SUBSHELL`: the body's
//! last status is still the stage's exit code (errexit stops at a failing command either way,
//! and `exit $?` covers a body that turned errexit off).

/// The quoting rules are shared with the plugin SDK (one crate, no copies).
pub use runway_shell_quote::{ansi_c_quote, quote};

/// The complete stage script: strict mode, then the body parsed as a whole.
pub fn wrap(body: &str) -> String {
    format!(
        "set -eo pipefail\nset +o noclobber\ntrap 'exit 1' TERM\neval {} < /dev/null\nexit $?\n",
        ansi_c_quote(body)
    )
}

/// `rm -f` (`rm -rf` when `recursive`) of the already quoted `path`, run only when something
/// is there: the same effect and output as the bare command, without starting a process for
/// a path that does not exist (most of them, on most jobs).
pub fn remove_if_present(quoted_path: &str, recursive: bool) -> String {
    let flags = if recursive { "-rf" } else { "-f" };
    format!("if [ -e {quoted_path} ] || [ -L {quoted_path} ]; then rm {flags} {quoted_path}; fi\n")
}

/// `mkdir -p` of the already quoted `dir`, run only when it is not a directory yet.
pub fn make_dir_unless_present(quoted_dir: &str) -> String {
    format!("[ -d {quoted_dir} ] || mkdir -p {quoted_dir}\n")
}

/// A line that prints `text` as is (colours included).
pub fn echo_raw(text: &str) -> String {
    format!("printf '%s\\n' {}\n", quote(text))
}

/// Bold green `$ command` echo, as GitLab prints user commands.
pub fn echo_command(command: &str) -> String {
    let mut lines = command.lines();
    let first = lines.next().unwrap_or("");
    let shown =
        if lines.next().is_some() { format!("{first} # collapsed multi-line command") } else { first.to_string() };
    echo_raw(&format!("\x1b[32;1m$ {shown}\x1b[0;m"))
}

/// Bold green informational line.
pub fn echo_info(text: &str) -> String {
    echo_raw(&format!("\x1b[32;1m{text}\x1b[0;m"))
}

/// Yellow warning line.
pub fn echo_warning(text: &str) -> String {
    echo_raw(&format!("\x1b[0;33m{text}\x1b[0;m"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bash(script: &str) -> (i32, String) {
        let out = std::process::Command::new("bash")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                if let Some(mut stdin) = child.stdin.take() {
                    stdin.write_all(script.as_bytes())?;
                }
                child.wait_with_output()
            })
            .expect("bash runs");
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
    }

    #[test]
    fn quoting_survives_bash() {
        let nasty = "it's \"quoted\" $HOME `x` \\ \n\ttab\x1b[0m";
        let (code, out) = bash(&wrap(&format!("printf '%s' {}\nprintf '|%s' {}", quote(nasty), ansi_c_quote(nasty))));
        assert_eq!(code, 0);
        assert_eq!(out, format!("{nasty}|{nasty}"));
    }

    #[test]
    fn commands_cannot_eat_the_script_and_errors_stop_it() {
        let (code, out) = bash(&wrap("echo one\ncat\necho two\nfalse\necho never"));
        assert_eq!((code, out.as_str()), (1, "one\ntwo\n"));
    }
}
