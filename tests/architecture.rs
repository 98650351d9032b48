//! The house rules of `host/src`, checked on every test run (DESIGN.md §2 and §10).
//!
//! - [`ALLOWED`] is the module graph, written once: which top-level modules each module may
//!   name through `crate::…` in its non-test code. A module not in the table, or an import
//!   not on its line, fails the test with the file, the line and the rule it breaks.
//! - Every module file starts with a `//!` doc (what it owns, what it must not touch).
//! - No source file is over 800 lines, test files (`tests.rs`, `*_tests.rs`) excepted.
//! - The released WIT packages are byte-identical to `wit/RELEASED.sha256`.
//! - No production files of `host/src` or of a plugin crate (`plugins/*/src`) import each other
//!   round (a file-level import circle), whatever the path's form (`crate::`, `super::`,
//!   `self::`, a child module, a `use` group, a name re-exported by a `mod.rs`).
//! - docs/architecture.md's module table has one row per module of [`ALLOWED`], and its import
//!   graph block is [`ALLOWED`] line by line (the test prints the block it should be).
//!
//! Test code (`#[cfg(test)]` items, `tests.rs`, `*_tests.rs`) may import anything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The allowed import graph of `host/src`. Read it top-down: a module may import the modules
/// on its line and nothing else. The job path of DESIGN.md — gitlab → job → script → executor
/// → plugin → capability → trace → gitlab — runs down this table: `job` names `executor`,
/// `script` and `trace`; `executor` names `plugin`; `plugin` names `capability`; `capability`
/// names `trace`; `trace` names only `gitlab::api` (the `JobApi` trait it uploads through).
/// Nothing names a module above it on the path.
const ALLOWED: &[(&str, &[&str])] = &[
    // Leaves: read by everyone who needs them, importing nothing of the crate.
    ("buildinfo", &[]),
    ("stop", &[]),
    ("bindings", &[]),
    ("payload", &[]),
    // Artifact and cache archives: selection, zip/gzip/raw, extraction, provenance (no network).
    ("archive", &[]),
    // Files that must survive a crash: atomic writes, the fleet state (the job store lands here).
    ("store", &[]),
    // The model of config.toml. Variable expansion in `url`/`token` is GitLab's rule (payload).
    ("config", &["payload", "store"]),
    // `[runners.cache]` pre-signed URLs: signs with what config says, moves no bytes.
    ("cache", &["config", "script"]),
    // The runner API client: the wire, retries, the job payload it decodes.
    ("gitlab", &["payload", "buildinfo"]),
    // The job log: masking, limits, checksum, upload through `gitlab::api::JobApi`.
    ("trace", &["gitlab", "buildinfo", "stop"]),
    // SSH to instances: streams into a trace sink, obeys a stop signal; no WIT types.
    ("connector", &["stop", "trace"]),
    // The host side of each WIT import, one context per interface; never the plugin registry.
    ("capability", &["bindings", "stop", "trace", "connector", "config", "store"]),
    // Wasmtime, the registry, hot reload, sandbox limits; links the capabilities.
    ("plugin", &["bindings", "capability", "config", "stop", "store", "trace", "buildinfo"]),
    // The executor boundary: prepare with retries, the fleet instance, the session, stages.
    ("executor", &["plugin", "bindings", "capability", "connector", "config", "stop", "trace", "payload"]),
    // Stage scripts from the payload and the runner's settings.
    ("script", &["payload", "config", "buildinfo"]),
    // The job's `secrets:` read from secret stores (Vault, OpenBao, AWS, GCP, Azure); AWS's
    // requests are signed with the cache's SigV4 signer.
    ("secrets", &["payload", "cache"]),
    // The web terminal's session server: HTTPS, sessions, the terminal pump, the local pty.
    ("session", &["config"]),
    // One job's lifecycle over the executor boundary.
    ("job", &["executor", "script", "secrets", "trace", "payload", "stop", "buildinfo"]),
    // The taskscaler engine, its simulator, the provider over a fleeting plugin.
    ("autoscaler", &["config", "plugin", "store", "stop"]),
    // In the job environment: the cache and artifacts helper commands (archives, GitLab's
    // artifacts calls, Go-style durations, `$VAR` expansion).
    ("helper", &["archive", "gitlab", "config", "payload"]),
    // `runway exec`: .gitlab-ci.yml to payloads, terminal rendering.
    ("local", &["payload", "trace", "config"]),
    // Pollers, capacity, two-phase commit, fleets, signals.
    (
        "manager",
        &[
            "autoscaler",
            "buildinfo",
            "config",
            "connector",
            "executor",
            "gitlab",
            "job",
            "payload",
            "plugin",
            "script",
            "session",
            "stop",
            "store",
            "trace",
        ],
    ),
    // `runway router`: polls GitLab, serves the runner API downstream, keeps its queue in the
    // job store; runs no job (never the manager or the job path).
    ("router", &["config", "gitlab", "payload", "store"]),
    // Prometheus text and health endpoints: observes the manager (its `Observer` events, the
    // job info and runner identity they carry), its fleets, the router and the API client's
    // requests.
    ("metrics", &["autoscaler", "buildinfo", "config", "gitlab", "manager", "payload", "router", "trace"]),
    // The verbs: wires everything together.
    (
        "cli",
        &[
            "archive",
            "autoscaler",
            "buildinfo",
            "cache",
            "config",
            "connector",
            "executor",
            "gitlab",
            "helper",
            "job",
            "local",
            "manager",
            "metrics",
            "payload",
            "plugin",
            "router",
            "script",
            "session",
            "stop",
            "store",
            "trace",
        ],
    ),
];

/// Longest source file outside tests.
const MAX_LINES: usize = 800;

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> =
        std::fs::read_dir(dir).expect("read src dir").map(|e| e.expect("dir entry").path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The roots of the binaries beside a crate's library (`[[bin]]` paths under `src/`): each
/// is a crate of its own that names the library by its name.
const BINARIES: &[&str] = &["main.rs", "helper_main.rs"];

/// The top-level module a file belongs to (`None` for the crate roots).
fn module_of(relative: &Path) -> Option<String> {
    let mut parts = relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned());
    let first = parts.next()?;
    match first.strip_suffix(".rs") {
        Some("lib") => None,
        Some(stem) if BINARIES.contains(&format!("{stem}.rs").as_str()) => None,
        Some(stem) => Some(stem.to_string()),
        None => Some(first),
    }
}

fn is_test_file(path: &Path) -> bool {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    name == "tests.rs" || name.ends_with("_tests.rs")
}

/// The source with `#[cfg(test)]` items and comments blanked out (line numbers kept).
fn production_code(source: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut lines = source.lines().enumerate().peekable();
    while let Some((number, line)) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            // Skip the annotated item: through its balanced braces, or to its `;`.
            let mut depth = 0i32;
            let mut opened = false;
            for (_, item) in lines.by_ref() {
                for c in item.chars() {
                    match c {
                        '{' => {
                            depth += 1;
                            opened = true;
                        }
                        '}' => depth -= 1,
                        _ => {}
                    }
                }
                if (opened && depth <= 0) || (!opened && item.trim_end().ends_with(';')) {
                    break;
                }
            }
            continue;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        let code = match line.find("//") {
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        };
        out.push((number + 1, code.to_string()));
    }
    out
}

/// Every top-level module named through `crate::` on one line, including the members of
/// `crate::{a::…, b}` groups.
fn crate_imports(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().last();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `runway_crate::`, not ours
        }
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level names of the group: split at commas outside nested braces.
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        found.push(first_ident(&group[start..i]));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.push(first_ident(&group[start..i]));
                        start = i + 1;
                    }
                    _ => {}
                }
            }
        } else {
            found.push(first_ident(rest));
        }
    }
    found.retain(|m| !m.is_empty() && m != "self");
    found
}

fn first_ident(text: &str) -> String {
    text.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

/// Every breach of the graph in `source`, a file of `module`, as readable lines.
fn check_imports(module: &str, file: &str, source: &str, allowed: &BTreeMap<&str, &[&str]>) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(may) = allowed.get(module) else {
        return vec![format!(
            "{file}: module `{module}` is not in the graph: add its line to ALLOWED in tests/architecture.rs"
        )];
    };
    for (line, code) in production_code(source) {
        for target in crate_imports(&code) {
            if target == module {
                continue;
            }
            if !allowed.contains_key(target.as_str()) {
                problems.push(format!(
                    "{file}:{line}: `{module}` names `crate::{target}`, which is no module of the graph"
                ));
            } else if !may.contains(&target.as_str()) {
                problems.push(format!(
                    "{file}:{line}: `{module}` must not import `{target}` (allowed: {})",
                    if may.is_empty() { "nothing, it is a leaf".to_string() } else { may.join(", ") }
                ));
            }
        }
        if code.contains("super::super::") {
            problems.push(format!("{file}:{line}: `super::super::` hides a cross-module import; name it `crate::…`"));
        }
    }
    problems
}

fn graph() -> BTreeMap<&'static str, &'static [&'static str]> {
    ALLOWED.iter().copied().collect()
}

#[test]
fn modules_import_only_what_the_graph_allows() {
    let src = src_dir();
    let allowed = graph();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut problems = Vec::new();
    for path in &files {
        let relative = path.strip_prefix(&src).expect("under src");
        let Some(module) = module_of(relative) else { continue };
        if is_test_file(path) {
            continue;
        }
        let source = std::fs::read_to_string(path).expect("read source");
        problems.extend(check_imports(&module, &relative.display().to_string(), &source, &allowed));
    }
    assert!(problems.is_empty(), "imports that break the module graph:\n  {}", problems.join("\n  "));
}

#[test]
fn every_module_in_the_graph_exists_and_no_edge_is_redundant_with_itself() {
    let src = src_dir();
    for (module, may) in ALLOWED {
        assert!(
            src.join(module).join("mod.rs").exists() || src.join(format!("{module}.rs")).exists(),
            "ALLOWED names `{module}`, which has no file under host/src"
        );
        assert!(!may.contains(module), "`{module}` lists itself");
        for target in *may {
            assert!(graph().contains_key(target), "`{module}` may import `{target}`, which is not in the graph");
        }
    }
}

#[test]
fn the_graph_has_no_cycles() {
    fn visit(
        module: &'static str,
        graph: &BTreeMap<&'static str, &'static [&'static str]>,
        path: &mut Vec<&'static str>,
    ) -> Option<String> {
        if let Some(at) = path.iter().position(|m| *m == module) {
            let mut cycle = path[at..].to_vec();
            cycle.push(module);
            return Some(cycle.join(" → "));
        }
        path.push(module);
        for next in graph.get(module).copied().unwrap_or_default() {
            if let Some(cycle) = visit(next, graph, path) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let graph = graph();
    for module in graph.keys() {
        // `trace` → `gitlab` closes the job path's loop on purpose: it names only the `JobApi`
        // trait, and `gitlab` names no module of the path, so there is no cycle to find.
        assert_eq!(visit(module, &graph, &mut Vec::new()), None, "the allowed graph has a cycle");
    }
}

#[test]
fn the_checker_catches_forbidden_imports() {
    let allowed = graph();
    let bad = "//! doc\nuse crate::trace::TraceSink;\nuse crate::{stop::StopSignal, plugin::PluginHost};\n";
    let problems = check_imports("connector", "connector/x.rs", bad, &allowed);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("connector/x.rs:3") && problems[0].contains("must not import `plugin`"),
        "{problems:?}"
    );
    // Inline paths count too; test items and comments do not.
    let inline = "fn f() { let _ = crate::job::run_job; }\n// crate::job in a comment\n#[cfg(test)]\nmod tests {\n    use crate::job::x;\n}\n";
    let problems = check_imports("trace", "trace/y.rs", inline, &allowed);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("trace/y.rs:1"), "{problems:?}");
    // A module missing from the graph is reported.
    assert_eq!(check_imports("newthing", "newthing/mod.rs", "", &allowed).len(), 1);
}

/// Every non-test source file under `host/src`: its path relative to `src` and its text.
fn production_sources() -> Vec<(String, String)> {
    let src = src_dir();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files
        .iter()
        .filter(|p| !is_test_file(p))
        .map(|p| {
            let relative = p.strip_prefix(&src).expect("under src").display().to_string();
            (relative, std::fs::read_to_string(p).expect("read source"))
        })
        .collect()
}

#[test]
fn every_module_file_says_what_it_owns() {
    let missing: Vec<String> = production_sources()
        .into_iter()
        .filter(|(_, text)| !text.trim_start().starts_with("//!"))
        .map(|(path, _)| path)
        .collect();
    assert!(missing.is_empty(), "module files without a `//!` doc: {missing:?}");
}

#[test]
fn no_source_file_is_over_the_limit() {
    let long: Vec<String> = production_sources()
        .into_iter()
        .filter_map(|(path, text)| {
            let lines = text.lines().count();
            (lines > MAX_LINES).then(|| format!("{path} ({lines} lines)"))
        })
        .collect();
    assert!(long.is_empty(), "files over {MAX_LINES} lines, split them along their seams: {long:?}");
}

#[test]
fn released_wit_packages_never_change() {
    let wit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit");
    let list = std::fs::read_to_string(wit.join("RELEASED.sha256")).expect("wit/RELEASED.sha256");
    let mut checked = 0;
    for line in list.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
        let (sum, file) = line.split_once("  ").expect("`<sha256>  <path>` lines");
        let bytes = std::fs::read(wit.join(file)).unwrap_or_else(|e| panic!("released WIT file {file}: {e}"));
        let actual = hex::encode(Sha256::digest(&bytes));
        assert_eq!(actual, sum, "released WIT file {file} changed: add a new package version instead");
        checked += 1;
    }
    assert!(checked > 0, "wit/RELEASED.sha256 lists no file");
}

/// One production source file of a crate: where it is, its module path (`a::b` for `a/b.rs`
/// and `a/b/mod.rs`), and its code with tests and comments blanked.
struct CrateFile {
    relative: String,
    module: Vec<String>,
    code: Vec<(usize, String)>,
}

/// A path named in a file: the module it was named in (the file's, or an inline `mod`
/// inside it), its segments, and whether it is a `pub use` (a re-export).
struct Named {
    context: Vec<String>,
    segments: Vec<String>,
    line: usize,
    reexport: bool,
}

/// The module path of `relative` (a path under a crate's `src`).
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs").to_string();
        if !matches!(stem.as_str(), "mod" | "lib" | "main") {
            parts.push(stem);
        }
    }
    parts
}

/// The production files of the crate whose sources are in `src`.
fn crate_files(src: &Path) -> Vec<CrateFile> {
    let mut paths = Vec::new();
    rust_files(src, &mut paths);
    // A binary beside the library is another crate (it names the library by its name).
    let has_lib = src.join("lib.rs").exists();
    paths
        .iter()
        .filter(|p| !is_test_file(p))
        .filter(|p| !(has_lib && p.strip_prefix(src).is_ok_and(|r| BINARIES.iter().any(|b| r == Path::new(b)))))
        .map(|p| {
            let relative = p.strip_prefix(src).expect("under src");
            let source = std::fs::read_to_string(p).expect("read source");
            CrateFile {
                relative: relative.display().to_string(),
                module: module_path(relative),
                code: production_code(&source),
            }
        })
        .collect()
}

/// `line` with the contents of its string literals removed (braces and `::` in strings are
/// no code).
fn without_strings(line: &str) -> String {
    let mut out = String::new();
    let mut in_string = false;
    let mut escaped = false;
    for c in line.chars() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => {
                    in_string = false;
                    out.push('"');
                }
                _ => {}
            }
        } else {
            if c == '"' {
                in_string = true;
            }
            out.push(c);
        }
    }
    out
}

/// The leading `pub`/`pub(crate)`/... of an item, and the rest.
fn strip_visibility(text: &str) -> (bool, &str) {
    let Some(rest) = text.strip_prefix("pub") else { return (false, text) };
    let rest = match rest.trim_start().strip_prefix('(') {
        Some(inner) => inner.split_once(')').map_or(rest, |(_, after)| after),
        None => rest,
    };
    (true, rest.trim_start())
}

/// Expand a `use` tree (`a::{b,c::{d,e#f}}`: no blanks, `as` written `#`) into its paths; a
/// path ending in `self` is its prefix, one ending in `*` is the module, an alias is dropped.
fn expand_use(tree: &str, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let Some(open) = tree.find('{') else {
        let mut path = prefix.to_vec();
        let tree = tree.split('#').next().unwrap_or(tree);
        path.extend(tree.split("::").filter(|s| !s.is_empty() && *s != "*" && *s != "self").map(str::to_string));
        if !path.is_empty() {
            out.push(path);
        }
        return;
    };
    let mut head = prefix.to_vec();
    head.extend(tree[..open].split("::").filter(|s| !s.is_empty()).map(str::to_string));
    let (mut depth, mut start) = (0, open + 1);
    for (i, c) in tree.char_indices().skip(open) {
        match c {
            '{' => depth += 1,
            '}' | ',' if depth == 1 => {
                let part = tree[start..i].trim();
                if part == "self" {
                    out.push(head.clone());
                } else if !part.is_empty() {
                    expand_use(part, &head, out);
                }
                start = i + 1;
                if c == '}' {
                    return;
                }
            }
            '}' => depth -= 1,
            _ => {}
        }
    }
}

/// Every path `file` names in its code: `use` trees (expanded, also across lines) and inline
/// paths (`crate::a::b`, `super::x`, `self::x`, `child::x`), each with the module it is named
/// in (inline `mod name { … }` blocks nest it).
fn named_paths(file: &CrateFile) -> Vec<Named> {
    let mut found = Vec::new();
    let mut inline: Vec<(String, i32)> = Vec::new();
    let mut depth = 0i32;
    // A `use` not ended yet: its line, whether it re-exports, its module, its text so far.
    let mut pending: Option<(usize, bool, Vec<String>, String)> = None;
    for (line, raw) in &file.code {
        let code = without_strings(raw);
        let mut context = file.module.clone();
        context.extend(inline.iter().map(|(name, _)| name.clone()));
        let (public, item) = strip_visibility(code.trim_start());
        let rest: Option<&str> = match pending.take() {
            Some((at, reexport, used_in, mut text)) => match code.find(';') {
                Some(end) => {
                    text.push_str(&code[..end]);
                    found.extend(use_paths(&text, &used_in, at, reexport));
                    Some(&code[end + 1..])
                }
                None => {
                    text.push_str(&code);
                    pending = Some((at, reexport, used_in, text));
                    None
                }
            },
            None => match item.strip_prefix("use ") {
                Some(tree) => match tree.find(';') {
                    Some(end) => {
                        found.extend(use_paths(&tree[..end], &context, *line, public));
                        Some(&tree[end + 1..])
                    }
                    None => {
                        pending = Some((*line, public, context.clone(), tree.to_string()));
                        None
                    }
                },
                None => Some(code.as_str()),
            },
        };
        if let Some(rest) = rest {
            found.extend(inline_paths(rest).into_iter().map(|segments| Named {
                context: context.clone(),
                segments,
                line: *line,
                reexport: false,
            }));
        }
        let opens_mod = item
            .strip_prefix("mod ")
            .and_then(|m| m.split_once('{'))
            .map(|(name, _)| name.trim().to_string())
            .filter(|name| !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_'));
        if let Some(name) = opens_mod {
            inline.push((name, depth));
        }
        for c in code.chars() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if inline.last().is_some_and(|(_, at)| *at == depth) {
                        inline.pop();
                    }
                }
                _ => {}
            }
        }
    }
    found
}

/// The paths of one `use` tree (the text between `use` and `;`) named in `context`.
fn use_paths(tree: &str, context: &[String], line: usize, reexport: bool) -> Vec<Named> {
    let compact = tree.split_whitespace().collect::<Vec<_>>().join(" ").replace(" as ", "#").replace(' ', "");
    let mut paths = Vec::new();
    expand_use(&compact, &[], &mut paths);
    paths.into_iter().map(|segments| Named { context: context.to_vec(), segments, line, reexport }).collect()
}

/// The `a::b::c` paths in one line of code (not `use` lines): each run of identifiers joined
/// by `::` that does not follow another `::` or identifier character.
fn inline_paths(code: &str) -> Vec<Vec<String>> {
    let bytes: Vec<char> = code.chars().collect();
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts = ident(bytes[i]) && (i == 0 || !(ident(bytes[i - 1]) || bytes[i - 1] == ':'));
        if !starts {
            i += 1;
            continue;
        }
        let mut segments = Vec::new();
        let mut j = i;
        loop {
            let begin = j;
            while j < bytes.len() && ident(bytes[j]) {
                j += 1;
            }
            segments.push(bytes[begin..j].iter().collect::<String>());
            if j + 2 < bytes.len() && bytes[j] == ':' && bytes[j + 1] == ':' && ident(bytes[j + 2]) {
                j += 2;
            } else {
                break;
            }
        }
        if segments.len() > 1 {
            out.push(segments);
        }
        i = j.max(i + 1);
    }
    out
}

/// Names a file's `use` items bring in, each to (the module it was named in, its path).
type NameMap = BTreeMap<String, (Vec<String>, Vec<String>)>;

/// The crate's files as a module tree, and what each file imports from which file.
struct CrateGraph {
    files: Vec<CrateFile>,
    by_module: BTreeMap<Vec<String>, usize>,
    /// Per file: `pub use` names (last segment) to the path they re-export.
    reexports: Vec<NameMap>,
    /// Per file: names its `use` items bring in, to their paths (to read `name::x` later).
    aliases: Vec<NameMap>,
    named: Vec<Vec<Named>>,
}

impl CrateGraph {
    fn new(files: Vec<CrateFile>) -> Self {
        let by_module = files.iter().enumerate().map(|(i, f)| (f.module.clone(), i)).collect();
        let named: Vec<Vec<Named>> = files.iter().map(named_paths).collect();
        let mut reexports = Vec::new();
        let mut aliases = Vec::new();
        for (file, paths) in files.iter().zip(&named) {
            let mut exported = BTreeMap::new();
            let mut imported = BTreeMap::new();
            for n in paths.iter().filter(|n| n.context == file.module) {
                let Some(last) = n.segments.last() else { continue };
                let entry = (n.context.clone(), n.segments.clone());
                if n.reexport {
                    exported.insert(last.clone(), entry.clone());
                }
                imported.insert(last.clone(), entry);
            }
            reexports.push(exported);
            aliases.push(imported);
        }
        CrateGraph { files, by_module, reexports, aliases, named }
    }

    /// The file a path named in `context` (by file `from`) lands in: the deepest module file
    /// on the path, followed through that file's `pub use` of the next name.
    fn resolve(&self, from: usize, context: &[String], segments: &[String], hops: usize) -> Option<usize> {
        let (base, rest): (Vec<String>, &[String]) = match segments.first().map(String::as_str) {
            Some("crate") => (Vec::new(), &segments[1..]),
            Some("self") => (context.to_vec(), &segments[1..]),
            Some("super") => {
                let supers = segments.iter().take_while(|s| *s == "super").count();
                (context[..context.len().saturating_sub(supers)].to_vec(), &segments[supers..])
            }
            Some(first) => {
                let mut child = context.to_vec();
                child.push(first.to_string());
                if self.by_module.contains_key(&child) {
                    (context.to_vec(), segments)
                } else if let Some((alias_context, path)) = self.aliases[from].get(first) {
                    if hops == 0 || path.len() < 2 {
                        return None;
                    }
                    let mut whole = path.clone();
                    whole.extend_from_slice(&segments[1..]);
                    return self.resolve(from, alias_context, &whole, hops - 1);
                } else {
                    return None;
                }
            }
            None => return None,
        };
        // The module the path starts from, or (inside an inline `mod`) the file holding it.
        let mut file = (0..=base.len()).rev().find_map(|n| self.by_module.get(&base[..n]).copied());
        let mut module = base;
        let mut used = 0;
        for segment in rest {
            module.push(segment.clone());
            match self.by_module.get(&module) {
                Some(deeper) => {
                    file = Some(*deeper);
                    used += 1;
                }
                None => break,
            }
        }
        let file = file?;
        if let (Some(next), true) = (rest.get(used), hops > 0) {
            if let Some((export_context, path)) = self.reexports[file].get(next) {
                let mut whole = path.clone();
                whole.extend_from_slice(&rest[used + 1..]);
                if let Some(target) = self.resolve(file, export_context, &whole, hops - 1) {
                    return Some(target);
                }
            }
        }
        Some(file)
    }

    /// Every file-level import: (from, to) with the first line and name that makes it. A
    /// file's own descendants (the `mod` children it declares) are its tree, not imports; a
    /// child naming its parent's items is an import.
    fn edges(&self) -> BTreeMap<(usize, usize), (usize, String)> {
        let mut edges = BTreeMap::new();
        for (from, paths) in self.named.iter().enumerate() {
            let own = &self.files[from].module;
            for n in paths {
                let Some(to) = self.resolve(from, &n.context, &n.segments, 4) else { continue };
                let target = &self.files[to].module;
                if to == from || (target.len() > own.len() && target.starts_with(own)) {
                    continue;
                }
                edges.entry((from, to)).or_insert_with(|| (n.line, n.segments.join("::")));
            }
        }
        edges
    }

    /// The circles: every set of two or more files that import each other round (Tarjan's
    /// strongly connected components), each as its files' paths, sorted, with the imports
    /// that tie it (`a.rs:12 -> b.rs (crate::x::Y)`).
    fn circles(&self) -> Vec<(Vec<String>, Vec<String>)> {
        let edges = self.edges();
        let n = self.files.len();
        let mut next: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (from, to) in edges.keys() {
            next[*from].push(*to);
        }
        struct Tarjan<'a> {
            next: &'a [Vec<usize>],
            index: Vec<Option<usize>>,
            low: Vec<usize>,
            stack: Vec<usize>,
            on_stack: Vec<bool>,
            counter: usize,
            found: Vec<Vec<usize>>,
        }
        impl Tarjan<'_> {
            fn visit(&mut self, v: usize) {
                self.index[v] = Some(self.counter);
                self.low[v] = self.counter;
                self.counter += 1;
                self.stack.push(v);
                self.on_stack[v] = true;
                for &w in &self.next[v] {
                    match self.index[w] {
                        None => {
                            self.visit(w);
                            self.low[v] = self.low[v].min(self.low[w]);
                        }
                        Some(iw) if self.on_stack[w] => self.low[v] = self.low[v].min(iw),
                        Some(_) => {}
                    }
                }
                if Some(self.low[v]) == self.index[v] {
                    let mut component = Vec::new();
                    while let Some(w) = self.stack.pop() {
                        self.on_stack[w] = false;
                        component.push(w);
                        if w == v {
                            break;
                        }
                    }
                    if component.len() > 1 {
                        self.found.push(component);
                    }
                }
            }
        }
        let mut tarjan = Tarjan {
            next: &next,
            index: vec![None; n],
            low: vec![0; n],
            stack: Vec::new(),
            on_stack: vec![false; n],
            counter: 0,
            found: Vec::new(),
        };
        for v in 0..n {
            if tarjan.index[v].is_none() {
                tarjan.visit(v);
            }
        }
        let mut circles: Vec<(Vec<String>, Vec<String>)> = tarjan
            .found
            .iter()
            .map(|component| {
                let mut names: Vec<String> = component.iter().map(|&i| self.files[i].relative.clone()).collect();
                names.sort();
                let ties = edges
                    .iter()
                    .filter(|((from, to), _)| component.contains(from) && component.contains(to))
                    .map(|((from, to), (line, name))| {
                        format!("{}:{line} -> {} ({name})", self.files[*from].relative, self.files[*to].relative)
                    })
                    .collect();
                (names, ties)
            })
            .collect();
        circles.sort();
        circles
    }
}

/// The file circles of the crate whose sources are in `src`, as readable lines.
fn file_circles(src: &Path) -> Vec<(Vec<String>, Vec<String>)> {
    CrateGraph::new(crate_files(src)).circles()
}

#[test]
fn no_file_imports_run_in_a_circle() {
    let mut problems = Vec::new();
    for (names, ties) in file_circles(&src_dir()) {
        problems.push(format!("host/src: {}\n      {}", names.join(", "), ties.join("\n      ")));
    }
    let plugins = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins");
    let mut crates: Vec<PathBuf> = std::fs::read_dir(&plugins)
        .expect("read plugins/")
        .map(|e| e.expect("dir entry").path().join("src"))
        .filter(|src| src.is_dir())
        .collect();
    crates.sort();
    assert!(!crates.is_empty(), "no plugin crate found under {}", plugins.display());
    for src in &crates {
        let name =
            src.parent().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        for (names, ties) in file_circles(src) {
            let names: Vec<String> = names.iter().map(|f| format!("plugins/{name}/src/{f}")).collect();
            let ties: Vec<String> = ties.iter().map(|t| format!("plugins/{name}/src/{t}")).collect();
            problems.push(format!("{}\n      {}", names.join(", "), ties.join("\n      ")));
        }
    }
    assert!(
        problems.is_empty(),
        "files that import each other round (move what ties them to the lower file or a small shared one):\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn the_circle_checker_resolves_every_kind_of_path() {
    let file = |relative: &str, source: &str| CrateFile {
        relative: relative.to_string(),
        module: module_path(Path::new(relative)),
        code: production_code(source),
    };
    let circles = |files: Vec<CrateFile>| {
        CrateGraph::new(files).circles().into_iter().map(|(names, _)| names.join(" ")).collect::<Vec<_>>()
    };
    // `crate::` paths and `use` groups, across lines.
    let a = file("a.rs", "//! a\nuse crate::{\n    b::B,\n    c,\n};\n");
    let b = file("b.rs", "//! b\npub fn f() { crate::a::g(); }\n");
    assert_eq!(circles(vec![a, b, file("c.rs", "")]), ["a.rs b.rs"]);
    // `super::` from a child to its sibling, `self::` and children named plainly.
    let m = file("m/mod.rs", "//! m\nmod x;\nmod y;\npub use x::X;\nfn f() { y::g(); }\n");
    let x = file("m/x.rs", "//! x\nuse super::y::Y;\n");
    let y = file("m/y.rs", "//! y\nfn g() { self::h(); super::x::X::new(); }\n");
    assert_eq!(circles(vec![m, x, y]), ["m/x.rs m/y.rs"]);
    // A child naming its parent's items is an import; the parent naming its children is its
    // tree. A name the parent re-exports is followed to the file that defines it.
    let m = file("m/mod.rs", "//! m\nmod x;\nmod y;\npub use y::Y;\npub struct Inner;\nfn f() { x::g(); }\n");
    let x = file("m/x.rs", "//! x\nuse super::Inner;\nuse super::Y;\n");
    let y = file("m/y.rs", "//! y\nuse crate::m::x::g;\n");
    assert_eq!(circles(vec![m, x, y]), ["m/x.rs m/y.rs"]);
    // A parent's own items named by its child and the parent importing from a third file that
    // names the child close a circle.
    let m = file("m/mod.rs", "//! m\nmod x;\npub struct Inner;\nuse crate::z::Z;\n");
    let x = file("m/x.rs", "//! x\nfn f(_: super::Inner) {}\n");
    let z = file("z.rs", "//! z\npub struct Z;\nfn g() { crate::m::x::f; }\n");
    assert_eq!(circles(vec![m, x, z]), ["m/mod.rs m/x.rs z.rs"]);
    // Tests, comments, strings and inline modules' `super` do not mislead it.
    let a = file(
        "a.rs",
        "//! a\n// crate::b::B\nconst S: &str = \"crate::b::B\";\n#[cfg(test)]\nmod tests {\n    use crate::b::B;\n}\npub mod inner {\n    use super::super_thing;\n}\n",
    );
    let b = file("b.rs", "//! b\nuse crate::a::inner;\n");
    assert!(circles(vec![a, b]).is_empty());
    // A name brought in by `use` and used as a path prefix later resolves through it.
    let a = file("a.rs", "//! a\nuse crate::m;\nfn f() { m::x::g(); }\n");
    let m = file("m/mod.rs", "//! m\nmod x;\n");
    let x = file("m/x.rs", "//! x\nuse crate::a;\n");
    assert_eq!(circles(vec![a, m, x]), ["a.rs m/x.rs"]);
}

/// docs/architecture.md.
fn architecture_doc() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/architecture.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The modules of the doc's module table (the first cell of each row under `## Modules`).
fn doc_table_modules(doc: &str) -> Vec<String> {
    let section = doc.split("\n## Modules").nth(1).unwrap_or_default();
    let section = section.split("\n## ").next().unwrap_or_default();
    section
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once('`').map(|(module, _)| module.to_string()))
        .collect()
}

/// The doc's import graph block (the first fenced block under `## The import graph`), as
/// (module, imports) lines; `leaves:` lists modules that import nothing, and a note in
/// parentheses after an import (`gitlab (JobApi only)`) is not part of its name.
fn doc_graph(doc: &str) -> Vec<(String, Vec<String>)> {
    let section = doc.split("\n## The import graph").nth(1).unwrap_or_default();
    let block = section.split("```").nth(1).unwrap_or_default();
    let mut lines = Vec::new();
    for line in block.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(leaves) = line.strip_prefix("leaves:") {
            lines.extend(leaves.split_whitespace().map(|m| (m.to_string(), Vec::new())));
        } else if let Some((module, imports)) = line.split_once('→') {
            let imports = imports
                .split(',')
                .map(|i| i.split('(').next().unwrap_or_default().trim().to_string())
                .filter(|i| !i.is_empty())
                .collect();
            lines.push((module.trim().to_string(), imports));
        } else {
            lines.push((line.to_string(), vec!["?".to_string()]));
        }
    }
    lines
}

/// The graph block the doc must show: [`ALLOWED`], line by line.
fn expected_graph_block() -> String {
    let leaves: Vec<&str> = ALLOWED.iter().filter(|(_, may)| may.is_empty()).map(|(m, _)| *m).collect();
    let mut block = format!("leaves:      {}\n", leaves.join("   "));
    for (module, may) in ALLOWED.iter().filter(|(_, may)| !may.is_empty()) {
        block.push_str(&format!("{module:<10} → {}\n", may.join(", ")));
    }
    block
}

#[test]
fn the_doc_table_and_graph_are_the_allowed_graph() {
    let doc = architecture_doc();
    let mut problems = Vec::new();
    let rows = doc_table_modules(&doc);
    for (module, _) in ALLOWED {
        match rows.iter().filter(|r| r == module).count() {
            0 => problems
                .push(format!("the module table has no row for `{module}`: add | `{module}` | owns | must not |")),
            1 => {}
            n => problems.push(format!("the module table lists `{module}` {n} times: keep one row")),
        }
    }
    for row in rows.iter().filter(|r| !graph().contains_key(r.as_str())) {
        problems.push(format!("the module table has a row for `{row}`, which is not in ALLOWED"));
    }
    let sorted = |list: &[String]| {
        let mut list = list.to_vec();
        list.sort();
        list
    };
    let shown: Vec<(String, Vec<String>)> = doc_graph(&doc).into_iter().map(|(m, i)| (m, sorted(&i))).collect();
    let wanted: Vec<(String, Vec<String>)> = ALLOWED
        .iter()
        .map(|(m, may)| (m.to_string(), sorted(&may.iter().map(|s| s.to_string()).collect::<Vec<_>>())))
        .collect();
    let leaves_first = |list: &[(String, Vec<String>)]| {
        let (mut leaves, rest): (Vec<_>, Vec<_>) = list.iter().cloned().partition(|(_, i)| i.is_empty());
        leaves.extend(rest);
        leaves
    };
    if leaves_first(&shown) != leaves_first(&wanted) {
        problems.push(format!(
            "the import graph in docs/architecture.md is not ALLOWED; the block should read:\n```\n{}```",
            expected_graph_block()
        ));
    }
    assert!(problems.is_empty(), "docs/architecture.md and ALLOWED differ:\n  {}", problems.join("\n  "));
}
