//! The house rules of `host/src`, checked on every test run (DESIGN.md §2 and §10).
//!
//! - [`ALLOWED`] is the module graph, written once: which top-level modules each module may
//!   name through `crate::…` in its non-test code. A module not in the table, or an import
//!   not on its line, fails the test with the file, the line and the rule it breaks.
//! - Every module file starts with a `//!` doc (what it owns, what it must not touch).
//! - No source file is over 800 lines, test files (`tests.rs`, `*_tests.rs`) excepted.
//! - The released WIT packages are byte-identical to `wit/RELEASED.sha256`.
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
    // One job's lifecycle over the executor boundary.
    ("job", &["executor", "script", "trace", "payload", "stop", "buildinfo"]),
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

/// The top-level module a file belongs to (`None` for the crate roots).
fn module_of(relative: &Path) -> Option<String> {
    let mut parts = relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned());
    let first = parts.next()?;
    match first.strip_suffix(".rs") {
        Some("lib" | "main") => None,
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
