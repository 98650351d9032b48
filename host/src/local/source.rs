//! The YAML side of `runway exec`'s pipeline reading: the files read (for errors that name
//! file, line and key), YAML parsing with merge keys, local `include:`, `!reference` and
//! `extends` resolution, and the deep merge they share.
//!
//! Owns turning files into one resolved YAML document; what the keys mean (jobs, rules,
//! payloads) is the parent module's. Must not build payloads or evaluate rules.

use std::path::{Path, PathBuf};

use serde_yaml::{Mapping, Value};

use crate::config::ConfigError;

pub(super) struct Sources {
    /// Files read so far, `(path, text)`; the last read first when locating keys.
    pub(super) files: Vec<(PathBuf, String)>,
}

impl Sources {
    /// File and line where top-level key `key` (and optionally its child `child`) is written.
    pub(super) fn locate(&self, key: &str, child: Option<&str>) -> (PathBuf, Option<usize>) {
        for (file, text) in self.files.iter().rev() {
            let lines: Vec<&str> = text.lines().collect();
            let top = lines.iter().position(|l| {
                l.strip_prefix(key).is_some_and(|r| r.starts_with(':'))
                    || l.strip_prefix(&format!("\"{key}\"")).is_some_and(|r| r.starts_with(':'))
            });
            if let Some(top) = top {
                if let Some(child) = child {
                    let found = lines
                        .iter()
                        .enumerate()
                        .skip(top + 1)
                        .take_while(|(_, l)| l.is_empty() || l.starts_with(' ') || l.starts_with('#'))
                        .find(|(_, l)| l.trim_start().strip_prefix(child).is_some_and(|r| r.starts_with(':')));
                    if let Some((n, _)) = found {
                        return (file.clone(), Some(n + 1));
                    }
                }
                return (file.clone(), Some(top + 1));
            }
        }
        (self.files.first().map(|f| f.0.clone()).unwrap_or_default(), None)
    }

    pub(super) fn error(&self, key: &str, child: Option<&str>, message: impl Into<String>) -> ConfigError {
        let (file, line) = self.locate(key, child);
        let key = match child {
            Some(c) => format!("{key}.{c}"),
            None => key.to_string(),
        };
        ConfigError::new(file, message).at_line(line).with_key(key)
    }
}

pub(super) fn parse_yaml(file: &Path, text: &str) -> Result<Value, ConfigError> {
    let mut value: Value = serde_yaml::from_str(text).map_err(|e| {
        ConfigError::new(file, format!("YAML syntax error: {e}")).at_line(e.location().map(|l| l.line()))
    })?;
    value.apply_merge().map_err(|e| ConfigError::new(file, format!("merge key: {e}")).with_key("<<"))?;
    Ok(value)
}

/// Hashes merge, everything else is replaced (GitLab's `extends`/`include` merge).
pub(super) fn deep_merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Mapping(b), Value::Mapping(o)) => {
            for (k, v) in o {
                match b.get_mut(k) {
                    Some(existing) if existing.is_mapping() && v.is_mapping() => deep_merge(existing, v),
                    _ => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, o) => *b = o.clone(),
    }
}

pub(super) fn str_key(k: &Value) -> Option<&str> {
    k.as_str()
}

pub(super) fn scalar_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null => Some(String::new()),
        _ => None,
    }
}

pub(super) fn list_of_strings(v: &Value) -> Vec<String> {
    match v {
        Value::Sequence(items) => items.iter().flat_map(list_of_strings).collect(),
        other => scalar_string(other).map(|s| vec![s]).unwrap_or_default(),
    }
}

/// How deep GitLab lets script lists nest (`Entry::Commands::MAX_NESTING_LEVEL`).
pub(super) const MAX_SCRIPT_NESTING: usize = 10;

/// The error GitLab gives for a script key that is not a string or a nested list of strings.
pub(super) const SCRIPT_SHAPE: &str = "config should be a string or a nested array of strings up to 10 levels deep";

/// A `script`/`before_script`/`after_script` value as GitLab reads it: a string, or a list of
/// strings and lists (nested up to [`MAX_SCRIPT_NESTING`] levels, flattened). `None` for any
/// other shape (`script: 123`, `script: [1, {a: b}]`).
pub(super) fn script_lines(v: &Value) -> Option<Vec<String>> {
    fn walk(v: &Value, depth: usize, out: &mut Vec<String>) -> bool {
        match v {
            Value::String(s) => {
                out.push(s.clone());
                true
            }
            Value::Sequence(items) if depth < MAX_SCRIPT_NESTING => items.iter().all(|i| walk(i, depth + 1, out)),
            _ => false,
        }
    }
    let mut out = Vec::new();
    walk(v, 0, &mut out).then_some(out)
}

/// Most `!reference` tags one pipeline may resolve: references that point at lists of
/// references multiply, so the total is bounded, not only the nesting.
const MAX_REFERENCES: usize = 10_000;

/// Replace `!reference [a, b, ...]` tags by what they point at (nested up to 10 levels, as on
/// GitLab, and at most [`MAX_REFERENCES`] in all).
pub(super) fn resolve_references(value: &mut Value, root: &Value, sources: &Sources) -> Result<(), ConfigError> {
    resolve(value, root, sources, 0, &mut { MAX_REFERENCES })
}

fn resolve(
    value: &mut Value,
    root: &Value,
    sources: &Sources,
    depth: usize,
    budget: &mut usize,
) -> Result<(), ConfigError> {
    if depth > 10 {
        return Err(sources.error("!reference", None, "references nest more than 10 levels deep"));
    }
    match value {
        Value::Tagged(tagged) if tagged.tag == "reference" => {
            *budget = budget.checked_sub(1).ok_or_else(|| {
                sources.error("!reference", None, format!("more than {MAX_REFERENCES} references to resolve"))
            })?;
            let path = list_of_strings(&tagged.value);
            let mut target = root;
            for part in &path {
                target = target.get(part.as_str()).ok_or_else(|| {
                    sources.error(
                        path.first().map(String::as_str).unwrap_or(""),
                        None,
                        format!("!reference {path:?} points at nothing"),
                    )
                })?;
            }
            let mut resolved = target.clone();
            resolve(&mut resolved, root, sources, depth + 1, budget)?;
            *value = resolved;
        }
        Value::Sequence(items) => {
            let mut out = Vec::new();
            for mut item in std::mem::take(items) {
                let was_reference = matches!(&item, Value::Tagged(t) if t.tag == "reference");
                resolve(&mut item, root, sources, depth, budget)?;
                // A referenced list inside a script list is spliced in.
                match item {
                    Value::Sequence(inner) if was_reference => out.extend(inner),
                    other => out.push(other),
                }
            }
            *items = out;
        }
        Value::Mapping(map) => {
            for (_, v) in map.iter_mut() {
                resolve(v, root, sources, depth, budget)?;
            }
        }
        _ => {}
    }
    Ok(())
}

pub(super) fn load_includes(
    project_dir: &Path,
    root: &mut Value,
    sources: &mut Sources,
    depth: usize,
) -> Result<(), ConfigError> {
    let Some(include) = root.as_mapping_mut().and_then(|m| m.remove("include")) else { return Ok(()) };
    if depth > 10 {
        return Err(sources.error("include", None, "includes nest more than 10 levels deep"));
    }
    let entries: Vec<Value> = match include {
        Value::Sequence(items) => items,
        other => vec![other],
    };
    let mut merged = Value::Mapping(Mapping::new());
    for entry in entries {
        let pattern =
            match &entry {
                Value::String(s) => s.clone(),
                Value::Mapping(m) => match m.get("local").and_then(Value::as_str) {
                    Some(s) => s.to_string(),
                    None => return Err(sources.error(
                        "include",
                        None,
                        "only `local:` includes can be run locally (remote, project and template includes need GitLab)",
                    )),
                },
                _ => return Err(sources.error("include", None, "an include must be a path or {local: path}")),
            };
        if pattern.starts_with("http://") || pattern.starts_with("https://") {
            return Err(sources.error(
                "include",
                None,
                format!("{pattern}: remote includes need the network; Runway's exec only includes local files"),
            ));
        }
        let root = project_dir
            .canonicalize()
            .map_err(|e| sources.error("include", None, format!("project directory {}: {e}", project_dir.display())))?;
        let full = root.join(pattern.trim_start_matches('/'));
        let full_text = full.display().to_string();
        let mut paths: Vec<PathBuf> = if full_text.contains(['*', '?', '[']) {
            glob::glob(&full_text)
                .map_err(|e| sources.error("include", None, format!("{pattern}: {e}")))?
                .filter_map(Result::ok)
                .collect()
        } else {
            vec![full.clone()]
        };
        paths.sort();
        if paths.is_empty() || paths.iter().any(|p| !p.is_file()) {
            return Err(sources.error("include", None, format!("included file {pattern} does not exist")));
        }
        for path in paths {
            // Symlinks and `..` resolved: an include must stay inside the project, as on GitLab
            // (a local include names a file of the project's repository).
            let real = path.canonicalize().map_err(|e| sources.error("include", None, format!("{pattern}: {e}")))?;
            if !real.starts_with(&root) {
                return Err(sources.error(
                    "include",
                    None,
                    format!(
                        "{pattern}: {} is outside the project directory {}; a local include must be a file of the project",
                        real.display(),
                        root.display()
                    ),
                ));
            }
            let path = real;
            let text = std::fs::read_to_string(&path)
                .map_err(|e| sources.error("include", None, format!("{}: {e}", path.display())))?;
            let mut included = parse_yaml(&path, &text)?;
            sources.files.insert(0, (path.clone(), text));
            load_includes(project_dir, &mut included, sources, depth + 1)?;
            deep_merge(&mut merged, &included);
        }
    }
    // The including file wins over what it includes.
    deep_merge(&mut merged, root);
    *root = merged;
    Ok(())
}

pub(super) fn resolve_extends(
    top: &Mapping,
    name: &str,
    sources: &Sources,
    chain: &mut Vec<String>,
) -> Result<Mapping, ConfigError> {
    if chain.iter().any(|c| c == name) {
        return Err(sources.error(
            chain.first().map(String::as_str).unwrap_or(name),
            Some("extends"),
            format!("circular extends: {} -> {name}", chain.join(" -> ")),
        ));
    }
    if chain.len() > 11 {
        return Err(sources.error(name, Some("extends"), "extends nests more than 11 levels"));
    }
    let Some(Value::Mapping(job)) = top.get(name) else {
        let from = chain.last().cloned().unwrap_or_default();
        return Err(sources.error(&from, Some("extends"), format!("extends unknown job or template {name:?}")));
    };
    let parents = job.get("extends").map(list_of_strings).unwrap_or_default();
    let mut merged = Value::Mapping(Mapping::new());
    chain.push(name.to_string());
    for parent in parents {
        let resolved = resolve_extends(top, &parent, sources, chain)?;
        deep_merge(&mut merged, &Value::Mapping(resolved));
    }
    chain.pop();
    deep_merge(&mut merged, &Value::Mapping(job.clone()));
    match merged {
        Value::Mapping(m) => Ok(m),
        _ => Ok(Mapping::new()),
    }
}
