//! Where things are in config.toml's text: the line of a byte offset, of a key path
//! (`runners[1].limit`, dotted tables, arrays of tables), of a runner's header and its
//! sub-tables, and the key written on a line — so errors and warnings name file, line and key.
//!
//! Owns text positions only; must not parse values or know what a key means.

pub(super) fn line_of_offset(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Best-effort line of a key path like `runners[1].limit`, `runners.1.foo` or
/// `plugins.shell.call_timeout` (dotted table headers such as `[plugins.shell]` and nested
/// arrays of tables such as `[[runners.autoscaler.policy]]` included).
pub(super) fn line_of_key(text: &str, path: &str) -> Option<usize> {
    let parts: Vec<String> = path
        .replace('[', ".")
        .replace(']', "")
        .split('.')
        .filter(|p| !p.is_empty() && *p != "?")
        .map(str::to_string)
        .collect();
    let lines: Vec<&str> = text.lines().collect();
    let is_header = |l: &str| l.trim_start().starts_with('[');
    let assigns = |l: &str, key: &str| {
        let t = l.trim_start();
        t.strip_prefix(key)
            .or_else(|| t.strip_prefix(&format!("\"{key}\"")))
            .is_some_and(|rest| rest.trim_start().starts_with('='))
    };
    let mut prefix: Vec<&str> = Vec::new();
    let mut start = 0;
    // The line of the innermost table (or inline key) found so far.
    let mut found: Option<usize> = None;
    let mut i = 0;
    while i < parts.len() {
        let part = parts[i].as_str();
        let full = if prefix.is_empty() { part.to_string() } else { format!("{}.{part}", prefix.join(".")) };
        if let Some(Ok(index)) = parts.get(i + 1).map(|n| n.parse::<usize>()) {
            let header = format!("[[{full}]]");
            let (n, _) = lines.iter().enumerate().skip(start).filter(|(_, l)| l.trim() == header).nth(index)?;
            start = n + 1;
            found = Some(n + 1);
            prefix.push(part);
            i += 2;
            continue;
        }
        let is_last = i == parts.len() - 1;
        // A key of the current table: between its header and the next one.
        let key_line =
            lines.iter().enumerate().skip(start).take_while(|(_, l)| !is_header(l)).find(|(_, l)| assigns(l, part));
        if let Some((n, _)) = key_line {
            if is_last {
                return Some(n + 1);
            }
            found = Some(n + 1); // an inline table: the best line there is
        }
        let table = format!("[{full}]");
        let array = format!("[[{full}]]");
        if let Some((n, _)) = lines.iter().enumerate().skip(start).find(|(_, l)| l.trim() == table || l.trim() == array)
        {
            if is_last {
                return Some(n + 1);
            }
            start = n + 1;
            found = Some(n + 1);
        }
        prefix.push(part);
        i += 1;
    }
    found
}

/// The key written on `line` (`key = value`) as a path (`runners[1].limit`), for errors the
/// TOML reader reports with a position but no path (an integer too large for TOML).
pub(super) fn key_at_line(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let (key, _) = lines.get(line.checked_sub(1)?)?.split_once('=')?;
    let key = key.trim().trim_matches('"');
    if key.is_empty() || key.starts_with('[') {
        return None;
    }
    let header = lines[..line - 1].iter().rev().map(|l| l.trim()).find(|l| l.starts_with('['));
    let Some(header) = header else { return Some(key.to_string()) };
    if let Some(array) = header.strip_prefix("[[").and_then(|h| h.strip_suffix("]]")) {
        let index = lines[..line - 1].iter().filter(|l| l.trim() == header).count().saturating_sub(1);
        return Some(format!("{array}[{index}].{key}"));
    }
    let table = header.trim_start_matches('[').trim_end_matches(']');
    Some(format!("{table}.{key}"))
}

/// Does the `index`-th `[[runners]]` entry have a `[runners.shell]` table?
pub(super) fn text_has_shell_section(text: &str, index: usize) -> bool {
    let mut current: Option<usize> = None;
    let mut count = 0;
    for line in text.lines() {
        let t = line.trim();
        if t == "[[runners]]" {
            current = Some(count);
            count += 1;
        } else if t == "[runners.shell]" && current == Some(index) {
            return true;
        }
    }
    false
}

/// Line of the `index`-th `[[runners]]` header.
pub(super) fn runner_header_line(text: &str, index: usize) -> Option<usize> {
    text.lines().enumerate().filter(|(_, l)| l.trim() == "[[runners]]").nth(index).map(|(n, _)| n + 1)
}

/// Line of the `header` table (e.g. `[runners.autoscaler]`) of the runner whose `[[runners]]` is on `from`.
pub(super) fn sub_table_line(text: &str, from: usize, header: &str) -> Option<usize> {
    text.lines()
        .enumerate()
        .skip(from)
        .take_while(|(_, l)| l.trim() != "[[runners]]")
        .find(|(_, l)| l.trim() == header)
        .map(|(n, _)| n + 1)
}
