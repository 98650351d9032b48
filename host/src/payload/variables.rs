//! The job's variable list as GitLab builds it (protocol reference §4.2): feature flags from
//! config.toml, the runner's base variables, the job's variables, the runner's trailing
//! variables; later duplicates win ([`dedup`]); then [`expand_all`], in GitLab's two passes:
//!
//! 1. GitLab's own (`Ci::Variables::Collection#sort_and_expand_all`, as Rails does it for the
//!    payload): references to other variables expand to any depth in dependency order;
//!    `$$`/`%%`, undefined names, and references to file and raw variables are kept for the
//!    runner; a cycle between variables is an error.
//! 2. The runner's (`Variables.ExpandWith`, Go's `os.Expand`): one pass over every non-raw
//!    value, `$$` becomes `$`, a file variable's name becomes the path of its file, a raw
//!    variable's name its value as is, an undefined name nothing.
//!
//! Raw variables (`expand: false`, `raw: true` in the payload) are never expanded themselves.
//! One deliberate difference: a variable that names itself (`PATH: "$PATH:/x"`) takes the
//! outer value from the runner's environment, where GitLab would repeat its own value.
//!
//! Owns: the variable rules. Must not touch: anything beyond the list (a leaf of `payload`).

use std::collections::{BTreeMap, HashMap};

use crate::payload::JobVariable;

/// The variable whose value is the directory file variables are written to.
pub const TEMP_PROJECT_DIR: &str = "RUNNER_TEMP_PROJECT_DIR";

/// Keep the last definition of every key, at the position of that last definition.
pub fn dedup(vars: Vec<JobVariable>) -> Vec<JobVariable> {
    let mut last: BTreeMap<String, usize> = BTreeMap::new();
    for (i, v) in vars.iter().enumerate() {
        last.insert(v.key.clone(), i);
    }
    vars.into_iter().enumerate().filter(|(i, v)| last.get(&v.key) == Some(i)).map(|(_, v)| v).collect()
}

fn is_name_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

fn is_name_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Go's `getShellName`: the name after a `$` and how many bytes it took.
fn shell_name(s: &[u8]) -> (&[u8], usize) {
    let special = |c: u8| matches!(c, b'*' | b'#' | b'$' | b'@' | b'!' | b'?' | b'-' | b'0'..=b'9');
    if s[0] == b'{' {
        if s.len() > 2 && special(s[1]) && s[2] == b'}' {
            return (&s[1..2], 3);
        }
        return match s.iter().skip(1).position(|c| *c == b'}') {
            Some(0) => (&[], 2),
            Some(end) => (&s[1..=end], end + 2),
            None => (&[], 1),
        };
    }
    if special(s[0]) {
        return (&s[..1], 1);
    }
    let len = s.iter().take_while(|c| is_name_char(**c)).count();
    (&s[..len], len)
}

/// Expand `$VAR`, `${VAR}` and `$$` in `value` from `lookup`, as Go's `os.Expand` with
/// gitlab-runner's lookup does: `$$` is `$`, the shell's special parameters (`$1`, `$*`, ...)
/// and unknown names are empty, `${}` and an unclosed `${` are dropped, a `$` before anything
/// else stays.
pub fn expand(value: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let bytes = value.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(value.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'$' || i + 1 == bytes.len() {
            out.push(bytes[i]);
            i += 1;
            continue;
        }
        let (name, width) = shell_name(&bytes[i + 1..]);
        if name.is_empty() && width == 0 {
            out.push(b'$');
        } else if !name.is_empty() {
            let name = String::from_utf8_lossy(name);
            match name.as_ref() {
                "$" => out.push(b'$'),
                "*" | "#" | "@" | "!" | "?" | "0" | "1" | "2" | "3" | "4" | "5" | "6" | "7" | "8" | "9" => {}
                name => out.extend_from_slice(lookup(name).unwrap_or_default().as_bytes()),
            }
        }
        i += 1 + width;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A reference GitLab's pass sees in a value: its byte range and the name (`None` for the
/// escapes `$$`, `%%` and `${}`).
struct Reference<'a> {
    start: usize,
    end: usize,
    name: Option<&'a str>,
}

/// GitLab's `VARIABLES_REGEXP`: `$$`, `%%`, `$NAME`, `${NAME}`, `${}`, `%NAME%`.
fn references(value: &str) -> Vec<Reference<'_>> {
    let bytes = value.as_bytes();
    let name_len = |from: usize| {
        if from < bytes.len() && is_name_start(bytes[from]) {
            bytes[from..].iter().take_while(|c| is_name_char(**c)).count()
        } else {
            0
        }
    };
    let mut found = Vec::new();
    let mut i = 0;
    while i + 1 < bytes.len() {
        let (c, next) = (bytes[i], bytes[i + 1]);
        let reference = match (c, next) {
            (b'$', b'$') | (b'%', b'%') => Some((i + 2, None)),
            (b'$', b'{') => {
                let len = name_len(i + 2);
                (bytes.get(i + 2 + len) == Some(&b'}'))
                    .then(|| (i + 3 + len, (len > 0).then(|| &value[i + 2..i + 2 + len])))
            }
            (b'$', _) => {
                let len = name_len(i + 1);
                (len > 0).then(|| (i + 1 + len, Some(&value[i + 1..i + 1 + len])))
            }
            (b'%', _) => {
                let len = name_len(i + 1);
                (len > 0 && bytes.get(i + 1 + len) == Some(&b'%'))
                    .then(|| (i + 2 + len, Some(&value[i + 1..i + 1 + len])))
            }
            _ => None,
        };
        match reference {
            Some((end, name)) => {
                found.push(Reference { start: i, end, name });
                i = end;
            }
            None => i += 1,
        }
    }
    found
}

/// GitLab's pass over one list: every value with its references resolved to any depth.
struct GitLabPass<'a> {
    vars: &'a [JobVariable],
    index: HashMap<&'a str, usize>,
    resolved: Vec<Option<String>>,
    stack: Vec<usize>,
}

/// Variables that refer to each other in a circle, named as GitLab names them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("circular variable reference detected: [{}]", quoted(keys))]
pub struct CircularReference {
    /// The keys of the circle, in reference order.
    pub keys: Vec<String>,
}

fn quoted(keys: &[String]) -> String {
    keys.iter().map(|k| format!("{k:?}")).collect::<Vec<_>>().join(", ")
}

impl<'a> GitLabPass<'a> {
    fn new(vars: &'a [JobVariable]) -> Self {
        let index = vars.iter().enumerate().map(|(i, v)| (v.key.as_str(), i)).collect();
        GitLabPass { vars, index, resolved: vec![None; vars.len()], stack: Vec::new() }
    }

    fn resolve(&mut self, i: usize) -> Result<String, CircularReference> {
        if let Some(done) = &self.resolved[i] {
            return Ok(done.clone());
        }
        let var = &self.vars[i];
        if var.raw {
            self.resolved[i] = Some(var.value.clone());
            return Ok(var.value.clone());
        }
        if let Some(at) = self.stack.iter().position(|s| *s == i) {
            let keys = self.stack[at..].iter().map(|s| self.vars[*s].key.clone()).collect();
            return Err(CircularReference { keys });
        }
        self.stack.push(i);
        let value = &var.value;
        let mut out = String::with_capacity(value.len());
        let mut from = 0;
        for reference in references(value) {
            out.push_str(&value[from..reference.start]);
            from = reference.end;
            let whole = &value[reference.start..reference.end];
            let target = reference.name.filter(|n| *n != var.key).and_then(|n| self.index.get(n).copied());
            match target {
                Some(j) if !self.vars[j].file && !self.vars[j].raw => out.push_str(&self.resolve(j)?),
                _ => out.push_str(whole),
            }
        }
        out.push_str(&value[from..]);
        self.stack.pop();
        self.resolved[i] = Some(out.clone());
        Ok(out)
    }
}

/// Expand every non-raw variable against the list itself, in GitLab's two passes (see the
/// module doc). The list must be deduplicated ([`dedup`]). A cycle between variables is an
/// error naming them, as GitLab reports it.
pub fn expand_all(vars: &[JobVariable]) -> Result<Vec<JobVariable>, CircularReference> {
    let mut pass = GitLabPass::new(vars);
    let mut first = Vec::with_capacity(vars.len());
    for (i, var) in vars.iter().enumerate() {
        first.push(JobVariable { value: pass.resolve(i)?, ..var.clone() });
    }
    let tmp_dir = first.iter().rev().find(|v| v.key == TEMP_PROJECT_DIR).map(|v| v.value.clone()).unwrap_or_default();
    let by_key: HashMap<&str, &JobVariable> = first.iter().map(|v| (v.key.as_str(), v)).collect();
    let get = |name: &str| -> Option<String> {
        by_key.get(name).map(|v| if v.file { file_path(&tmp_dir, &v.key) } else { v.value.clone() })
    };
    Ok(first
        .iter()
        .map(|v| {
            if v.raw {
                return v.clone();
            }
            let own = v.key.as_str();
            let lookup = |name: &str| -> Option<String> {
                if name == own {
                    // `PATH=$PATH:/x`: the outer value is the runner's environment's.
                    return std::env::var(name).ok();
                }
                get(name).or_else(|| std::env::var(name).ok().filter(|_| name == "HOME" || name == "PATH"))
            };
            JobVariable { value: expand(&v.value, &lookup), ..v.clone() }
        })
        .collect())
}

/// Where the file of file variable `key` is written: `<RUNNER_TEMP_PROJECT_DIR>/<key>`.
pub fn file_path(tmp_dir: &str, key: &str) -> String {
    format!("{}/{key}", tmp_dir.trim_end_matches('/'))
}

#[cfg(test)]
#[path = "variables_tests.rs"]
mod tests;
