//! The job's variable list as GitLab Runner builds it (protocol reference §4.2): feature
//! flags from config.toml, the runner's base variables, the job's variables, the runner's
//! trailing variables; later duplicates win; `$VAR`/`${VAR}` expanded except in `raw` ones.

use std::collections::BTreeMap;

use crate::payload::JobVariable;

/// Keep the last definition of every key, at the position of that last definition.
pub fn dedup(vars: Vec<JobVariable>) -> Vec<JobVariable> {
    let mut last: BTreeMap<String, usize> = BTreeMap::new();
    for (i, v) in vars.iter().enumerate() {
        last.insert(v.key.clone(), i);
    }
    vars.into_iter().enumerate().filter(|(i, v)| last.get(&v.key) == Some(i)).map(|(_, v)| v).collect()
}

/// Expand `$VAR`, `${VAR}` and `$$` in `value` from `lookup` (unknown names expand to "").
pub fn expand(value: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let bytes = value.as_bytes();
    let mut out = String::with_capacity(value.len());
    let mut i = 0;
    while i < value.len() {
        if bytes[i] != b'$' {
            let next = value[i..].find('$').map(|p| i + p).unwrap_or(value.len());
            out.push_str(&value[i..next]);
            i = next;
            continue;
        }
        match bytes.get(i + 1) {
            Some(b'$') => {
                out.push('$');
                i += 2;
            }
            Some(b'{') => match value[i + 2..].find('}') {
                Some(end) => {
                    out.push_str(&lookup(&value[i + 2..i + 2 + end]).unwrap_or_default());
                    i += end + 3;
                }
                None => {
                    out.push_str(&value[i..]);
                    i = value.len();
                }
            },
            Some(c) if c.is_ascii_alphabetic() || *c == b'_' => {
                let len = value[i + 1..]
                    .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
                    .unwrap_or(value.len() - i - 1);
                out.push_str(&lookup(&value[i + 1..i + 1 + len]).unwrap_or_default());
                i += 1 + len;
            }
            _ => {
                out.push('$');
                i += 1;
            }
        }
    }
    out
}

/// Expand every non-raw variable against the list itself.
pub fn expand_all(vars: &[JobVariable]) -> Vec<JobVariable> {
    let raw: BTreeMap<&str, &str> = vars.iter().map(|v| (v.key.as_str(), v.value.as_str())).collect();
    vars.iter()
        .map(|v| {
            if v.raw {
                return v.clone();
            }
            let own = v.key.as_str();
            let lookup = |name: &str| -> Option<String> {
                if name == own {
                    // `PATH=$PATH:/x` style self references expand from the process environment.
                    return std::env::var(name).ok();
                }
                raw.get(name)
                    .map(|s| s.to_string())
                    .or_else(|| std::env::var(name).ok().filter(|_| name == "HOME" || name == "PATH"))
            };
            JobVariable { value: expand(&v.value, &lookup), ..v.clone() }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn var(key: &str, value: &str, raw: bool) -> JobVariable {
        JobVariable { key: key.into(), value: value.into(), raw, ..Default::default() }
    }

    #[test]
    fn expands_like_gitlab() {
        let vars = vec![var("A", "a", false), var("B", "${A}-$A-$$A-$NOPE.", false), var("C", "$A", true)];
        let out = expand_all(&vars);
        assert_eq!(out[1].value, "a-a-$A-.");
        assert_eq!(out[2].value, "$A");
    }

    #[test]
    fn last_definition_wins() {
        let out = dedup(vec![var("A", "1", false), var("B", "x", false), var("A", "2", false)]);
        assert_eq!(
            out.iter().map(|v| (v.key.as_str(), v.value.as_str())).collect::<Vec<_>>(),
            vec![("B", "x"), ("A", "2")]
        );
    }
}
