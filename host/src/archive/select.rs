//! Which files of the project directory go into an artifact or a cache: gitlab-runner's
//! `file_archiver` (`--path`, `--exclude`, `--untracked`), with its warnings and its counts.
//!
//! Each path is made relative to the project directory (absolute paths inside it are allowed;
//! anything that resolves outside it is refused with gitlab-runner's warning), globbed with
//! doublestar semantics (see `pattern`; `**` does not descend through symbolic links), and every
//! match is walked: a directory adds its whole tree, symbolic links are entries of their own and
//! are never followed. Each walked path is checked against every `exclude` pattern (also relative
//! to the project directory); an excluded directory is still walked, as gitlab-runner does, so
//! `build/tmp` excludes the directory entry and `build/tmp/**` the tree. `untracked` adds what
//! `git ls-files -o -z` lists in the project directory (gitlab-runner passes no
//! `--exclude-standard`: ignored files count as untracked too).
//!
//! Owns: the selection rules and their messages. Must not touch: archive formats, the network.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};

use super::pattern::{split_pattern, BadPattern, Pattern, META};

/// What to put into an archive, as the helper's `--path`, `--exclude` and `--untracked` flags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// Paths or doublestar patterns, relative to the project directory (or absolute inside it).
    pub paths: Vec<String>,
    /// Doublestar patterns of paths to leave out, relative to the project directory.
    pub exclude: Vec<String>,
    /// Also add the files git does not track (`git ls-files -o`).
    pub untracked: bool,
}

/// The outcome of [`select`]: the entries, and the messages gitlab-runner would log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selected {
    /// Paths relative to the project directory, sorted (byte order, as Go's `sort.Strings`) and
    /// unique: regular files, directories and symbolic links (as links).
    pub entries: Vec<PathBuf>,
    /// Warnings for the job log (gitlab-runner's texts): no matching files, paths outside the
    /// project directory, git failures.
    pub warnings: Vec<String>,
    /// Informational lines for the job log: "found N matching artifact files and directories",
    /// "untracked: found N files", "<pattern>: excluded N files".
    pub infos: Vec<String>,
}

/// Selects the entries of `project_dir` that `sel` names, as gitlab-runner's file archiver.
/// Only a failure to read `project_dir` itself is an error; everything else is a warning.
pub fn select(project_dir: &Path, sel: &Selection) -> io::Result<Selected> {
    let meta = std::fs::metadata(project_dir)
        .map_err(|e| io::Error::new(e.kind(), format!("project directory {}: {e}", project_dir.display())))?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!("project directory {} is not a directory", project_dir.display())));
    }
    let mut s = Selector {
        wd: normalize(project_dir),
        files: BTreeSet::new(),
        excluded: BTreeMap::new(),
        exclude: Vec::new(),
        out: Selected::default(),
    };
    s.compile_excludes(&sel.exclude);
    for path in &sel.paths {
        s.process_path(path);
    }
    if sel.untracked {
        s.process_untracked();
    }
    for (rule, count) in &s.excluded {
        s.out.infos.push(format!("{rule}: excluded {count} files"));
    }
    s.out.entries = s.files.iter().map(PathBuf::from).collect();
    Ok(s.out)
}

struct Selector {
    /// The project directory, absolute and lexically clean.
    wd: PathBuf,
    /// Relative slash paths (sorted as bytes, like Go's sort.Strings).
    files: BTreeSet<String>,
    /// Per exclude rule (as written), how many walked paths it excluded.
    excluded: BTreeMap<String, u64>,
    /// The compiled exclude rules; `Err` holds the warning for a rule outside the project.
    exclude: Vec<(String, Result<Pattern, ExcludeError>)>,
    out: Selected,
}

/// A path or pattern that names something outside the project directory.
#[derive(Debug, thiserror::Error)]
#[error("artifact path is not a subpath of project directory: {0}")]
struct OutsideProject(String);

/// An exclude rule that excludes nothing, with gitlab-runner's warning (`isExcluded: …`).
#[derive(Debug, thiserror::Error)]
enum ExcludeError {
    #[error("isExcluded: {0}")]
    Pattern(BadPattern),
    #[error("isExcluded: {0}")]
    Outside(OutsideProject),
}

impl Selector {
    fn compile_excludes(&mut self, rules: &[String]) {
        for rule in rules {
            let compiled = match self.relative_in_project(rule) {
                Ok(rel) => Pattern::new(&rel).map_err(ExcludeError::Pattern),
                Err(e) => Err(ExcludeError::Outside(e)),
            };
            self.exclude.push((rule.clone(), compiled));
        }
    }

    /// gitlab-runner's `findRelativePathInProject`: the path (or the pattern's literal prefix)
    /// made relative to the project directory, the pattern part appended.
    fn relative_in_project(&self, path: &str) -> Result<String, OutsideProject> {
        if normalize(Path::new(path)) == self.wd && Path::new(path).is_absolute() {
            return Ok(".".into());
        }
        let (base, patt) = if path.contains(META) { split_pattern(path) } else { (path, "") };
        let abs = normalize(&self.wd.join(base));
        let rel = match abs.strip_prefix(&self.wd) {
            Ok(rel) => rel.to_path_buf(),
            Err(_) => return Err(OutsideProject(path.to_string())),
        };
        let rel = rel.to_string_lossy().into_owned();
        let joined = match (rel.is_empty(), patt.is_empty()) {
            (true, true) => ".".to_string(),
            (true, false) => patt.to_string(),
            (false, true) => rel,
            (false, false) => format!("{rel}/{patt}"),
        };
        Ok(joined)
    }

    fn process_path(&mut self, path: &str) {
        if path.is_empty() {
            self.out.warnings.push("No matching files. Path is empty.".into());
            return;
        }
        let rel = match self.relative_in_project(path) {
            Ok(rel) => rel,
            Err(e) => {
                self.out.warnings.push(format!("processPath: {e}"));
                return;
            }
        };
        let matches = match self.glob(&rel) {
            Ok(m) => m,
            Err(e) => {
                self.out.warnings.push(format!("{path}: {e}"));
                return;
            }
        };
        let mut found = 0u64;
        for m in matches {
            self.walk(&m, &mut found);
        }
        if found == 0 {
            self.out.warnings.push(format!(
                "{path}: no matching files. Ensure that the artifact path is relative to the working directory ({})",
                self.wd.display()
            ));
        } else {
            self.out.infos.push(format!("{path}: found {found} matching artifact files and directories"));
        }
    }

    /// The existing paths (relative, slash-separated) that `rel` names: itself when literal,
    /// the matches of the pattern otherwise (doublestar's `FilepathGlob` with `WithNoFollow`).
    fn glob(&self, rel: &str) -> Result<Vec<String>, BadPattern> {
        if !rel.contains(META) {
            return Ok(match std::fs::symlink_metadata(self.wd.join(rel)) {
                Ok(_) => vec![rel.to_string()],
                Err(_) => Vec::new(),
            });
        }
        // A pattern ending in `/` matches directories only (doublestar).
        let (rel, dirs_only) = match rel.strip_suffix('/') {
            Some(stripped) => (stripped, true),
            None => (rel, false),
        };
        let pattern = Pattern::new(rel)?;
        let (base, _) = split_pattern(rel);
        let mut out = Vec::new();
        let base_rel = if base == "." { String::new() } else { base.to_string() };
        let base_depth = if base_rel.is_empty() { 0 } else { base_rel.split('/').count() };
        // `dir/**` matches `dir` itself.
        if !base_rel.is_empty() && pattern.matches(&base_rel) && std::fs::symlink_metadata(self.wd.join(base)).is_ok() {
            out.push(base_rel.clone());
        }
        self.glob_dir(&base_rel, base_depth, &pattern, &mut out);
        if dirs_only {
            out.retain(|m| self.wd.join(m).is_dir());
        }
        Ok(out)
    }

    fn glob_dir(&self, dir_rel: &str, depth: usize, pattern: &Pattern, out: &mut Vec<String>) {
        let dir = if dir_rel.is_empty() { self.wd.clone() } else { self.wd.join(dir_rel) };
        let Ok(read) = std::fs::read_dir(&dir) else { return };
        let mut names: Vec<(String, bool)> = read
            .filter_map(|e| e.ok())
            .map(|e| {
                let is_dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
                (e.file_name().to_string_lossy().into_owned(), is_dir)
            })
            .collect();
        names.sort();
        for (name, is_dir) in names {
            let rel = if dir_rel.is_empty() { name } else { format!("{dir_rel}/{name}") };
            if pattern.matches(&rel) {
                out.push(rel.clone());
            }
            // Descend into real directories only (never through a symbolic link), and only as
            // deep as the pattern can reach.
            if is_dir && pattern.max_depth().is_none_or(|max| depth + 1 < max) {
                self.glob_dir(&rel, depth + 1, pattern, out);
            }
        }
    }

    /// `filepath.Walk` from `rel`: the path itself, then (for a real directory) its tree in
    /// lexical order; symbolic links are not followed.
    fn walk(&mut self, rel: &str, found: &mut u64) {
        let full = self.wd.join(rel);
        let Ok(meta) = std::fs::symlink_metadata(&full) else { return };
        if self.process(rel) {
            *found += 1;
        }
        if !meta.is_dir() {
            return;
        }
        let mut names: Vec<String> = match std::fs::read_dir(&full) {
            Ok(read) => read.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect(),
            Err(e) => {
                self.out.warnings.push(format!("{rel}: {e}"));
                return;
            }
        };
        names.sort();
        for name in names {
            let child = if rel == "." { name } else { format!("{rel}/{name}") };
            self.walk(&child, found);
        }
    }

    /// gitlab-runner's `process`: refuses paths outside the project, applies the exclude rules,
    /// adds the path if it exists. True when added.
    fn process(&mut self, path: &str) -> bool {
        let abs = normalize(&self.wd.join(path));
        let rel = match abs.strip_prefix(&self.wd) {
            Ok(r) => r.to_string_lossy().into_owned(),
            Err(_) => {
                self.out.warnings.push(format!("{path}: not supported: outside build directory"));
                return false;
            }
        };
        let rel = if rel.is_empty() { ".".to_string() } else { rel };
        for (rule, compiled) in &self.exclude {
            match compiled {
                Ok(p) => {
                    if p.matches(&rel) {
                        *self.excluded.entry(rule.clone()).or_insert(0) += 1;
                        return false;
                    }
                }
                Err(e) => {
                    // gitlab-runner stops checking the remaining rules at a bad one.
                    let warning = e.to_string();
                    if !self.out.warnings.contains(&warning) {
                        self.out.warnings.push(warning);
                    }
                    break;
                }
            }
        }
        match std::fs::symlink_metadata(&abs) {
            Ok(_) => {
                // The project directory itself is no entry of an archive.
                if rel != "." {
                    self.files.insert(rel);
                }
                true
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => {
                self.out.warnings.push(format!("{path}: {e}"));
                false
            }
        }
    }

    fn process_untracked(&mut self) {
        let output = Command::new("git")
            .args(["ls-files", "-o", "-z"])
            .current_dir(&self.wd)
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .output();
        let output = match output {
            Ok(o) if o.status.success() => o,
            Ok(o) => {
                let stderr = String::from_utf8_lossy(&o.stderr);
                self.out.warnings.push(format!("untracked: {} ({})", o.status, stderr.trim()));
                return;
            }
            Err(e) => {
                self.out.warnings.push(format!("untracked: git ls-files: {e}"));
                return;
            }
        };
        let mut found = 0u64;
        for name in output.stdout.split(|b| *b == 0).filter(|n| !n.is_empty()) {
            let name = String::from_utf8_lossy(name).into_owned();
            if self.process(&name) {
                found += 1;
            }
        }
        if found == 0 {
            self.out.warnings.push("untracked: no files".into());
        } else {
            self.out.infos.push(format!("untracked: found {found} files"));
        }
    }
}

/// Makes `path` absolute (against the current directory) and lexically clean, as Go's
/// `filepath.Abs`: `.` dropped, `..` removes the previous component; symlinks not resolved.
fn normalize(path: &Path) -> PathBuf {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")).join(path)
    };
    let mut out = PathBuf::from("/");
    for c in abs.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}
