//! `runway exec`: `.gitlab-ci.yml` to the job payloads GitLab would send (protocol reference
//! §2), the job list, `--isolate`, and the terminal rendering of the job log.
//!
//! Covers what gitlab-ci-local users rely on: stages (with `.pre`/`.post`), `default:`,
//! `workflow:rules`, variables (plain and `{value, description}`), scripts as strings or
//! nested lists, `extends` (deep merge), anchors and merge keys, `!reference`, local
//! `include:` (with wildcards), `rules` (`if`, `exists`, `when`, `variables`,
//! `allow_failure`), `when`, `allow_failure` with `exit_codes`, `timeout`, `needs`,
//! `dependencies`, `parallel: N` and `parallel: matrix`. Errors name file, line and key
//! ([`ConfigError`], the type config.toml errors use too).
//!
//! The YAML files themselves (includes, references, extends) are read in `source`; this file
//! turns the resolved document into jobs. Must not run jobs (that is `cli::exec`'s business
//! with the job module) or talk to GitLab.

mod images;
pub mod isolate;
mod parallel;
pub mod rules;
mod source;
pub mod terminal;
mod transfer;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_yaml::{Mapping, Value};

use crate::config::ConfigError;
use crate::payload::{GitInfo, JobFeatures, JobInfo, JobResponse, JobVariable, RunnerInfo, Step, StepWhen};
use parallel::expand_parallel;
pub use parallel::PARALLEL_LIMIT;
use source::{
    list_of_strings, load_includes, parse_yaml, resolve_extends, resolve_references, scalar_string, script_lines,
    str_key, Sources, SCRIPT_SHAPE,
};

/// The script keys GitLab reads as commands.
const SCRIPT_KEYS: &[&str] = &["before_script", "script", "after_script"];

/// Keys at the top level that are not jobs.
const RESERVED: &[&str] = &[
    "stages",
    "types",
    "variables",
    "default",
    "include",
    "workflow",
    "image",
    "services",
    "cache",
    "before_script",
    "after_script",
    "spec",
];
/// Keys a job inherits from `default:` when it does not set them.
const DEFAULTABLE: &[&str] = &[
    "before_script",
    "after_script",
    "image",
    "services",
    "cache",
    "timeout",
    "tags",
    "interruptible",
    "retry",
    "artifacts",
];

/// One job ready to run.
#[derive(Debug, Clone)]
pub struct PlannedJob {
    /// Job name (with the `parallel` suffix, e.g. `test 1/3`).
    pub name: String,
    /// Stage the job runs in.
    pub stage: String,
    /// `on_success`, `on_failure`, `always`, `manual`, `delayed`.
    pub when: String,
    /// Whether the pipeline goes on when the job fails.
    pub allow_failure: bool,
    /// `allow_failure: exit_codes`; when non-empty only these codes are allowed.
    pub allow_failure_exit_codes: Vec<i32>,
    /// Jobs this one needs (`needs:`), by name.
    pub needs: Vec<String>,
    /// The payload GitLab would send for the job.
    pub payload: JobResponse,
    /// The job's name in the file (without the `parallel` suffix).
    pub base: String,
}

/// The jobs of a `.gitlab-ci.yml`, in stage order.
#[derive(Debug, Clone)]
pub struct Pipeline {
    /// Stages in order (with `.pre` first and `.post` last).
    pub stages: Vec<String>,
    jobs: Vec<PlannedJob>,
    /// Set when `workflow:rules` keep the pipeline from running.
    pub workflow_blocked: bool,
    /// The pipeline file, for errors found after loading.
    file: PathBuf,
}

fn variables_of(value: Option<&Value>) -> Vec<(String, String)> {
    let Some(Value::Mapping(map)) = value else { return Vec::new() };
    map.iter()
        .filter_map(|(k, v)| {
            let key = str_key(k)?.to_string();
            let value = match v {
                Value::Mapping(m) => m.get("value").and_then(scalar_string).unwrap_or_default(),
                other => scalar_string(other)?,
            };
            Some((key, value))
        })
        .collect()
}

/// Parse `timeout:` ("1h 30m", "90 minutes", "3600").
pub fn parse_timeout(text: &str) -> Option<u64> {
    let text = text.trim().to_lowercase();
    if let Ok(secs) = text.parse::<u64>() {
        return Some(secs);
    }
    let mut total = 0u64;
    let mut number: Option<u64> = None;
    for word in text.replace(',', " ").split_whitespace().flat_map(split_number_unit) {
        if let Ok(n) = word.parse::<u64>() {
            number = Some(n);
            continue;
        }
        if word == "and" {
            continue;
        }
        let n = number.take()?;
        let unit = match word.as_str() {
            "s" | "sec" | "secs" | "second" | "seconds" => 1,
            "m" | "min" | "mins" | "minute" | "minutes" => 60,
            "h" | "hr" | "hrs" | "hour" | "hours" => 3600,
            "d" | "day" | "days" => 86400,
            _ => return None,
        };
        total += n * unit;
    }
    if number.is_some() {
        return None;
    }
    (total > 0).then_some(total)
}

fn split_number_unit(word: &str) -> Vec<String> {
    let digits: String = word.chars().take_while(|c| c.is_ascii_digit()).collect();
    if digits.is_empty() || digits.len() == word.len() {
        vec![word.to_string()]
    } else {
        vec![digits.clone(), word[digits.len()..].to_string()]
    }
}

struct GitFacts {
    sha: String,
    branch: String,
    message: String,
}

fn git_facts(project_dir: &Path) -> GitFacts {
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(project_dir)
            .args(args)
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
    };
    // One `git` for all three: the commit, its ref names (`%D`) and its message.
    let log = run(&["log", "-1", "--format=%H%n%D%n%B"]).unwrap_or_default();
    let mut parts = log.splitn(3, '\n');
    let sha = parts.next().unwrap_or_default().trim().to_string();
    let branch = checked_out_branch(parts.next().unwrap_or_default()).unwrap_or_else(|| "main".into());
    let message = parts.next().unwrap_or_default().trim_end().to_string();
    let sha = if sha.is_empty() { "0000000000000000000000000000000000000000".to_string() } else { sha };
    GitFacts { sha, branch, message }
}

/// The branch checked out, from `git log --format=%D`'s ref names (`HEAD -> main, origin/main,
/// tag: v1`); `None` on a detached HEAD. Ref names never hold a space, so `, ` separates them.
fn checked_out_branch(ref_names: &str) -> Option<String> {
    ref_names
        .split(", ")
        .find_map(|name| name.trim().strip_prefix("HEAD -> "))
        .filter(|branch| !branch.is_empty())
        .map(str::to_string)
}

fn slug(name: &str) -> String {
    let mut out: String =
        name.to_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    out.truncate(63);
    out.trim_matches('-').to_string()
}

/// Outcome of `rules:` for a job.
struct RuleResult {
    when: String,
    allow_failure: Option<Value>,
    variables: Vec<(String, String)>,
}

fn apply_rules(
    rules: &Value,
    vars: &BTreeMap<String, String>,
    project_dir: &Path,
    sources: &Sources,
    job: &str,
) -> Result<Option<RuleResult>, ConfigError> {
    let Value::Sequence(rules) = rules else { return Err(sources.error(job, Some("rules"), "must be a list")) };
    for rule in rules {
        let Value::Mapping(rule) = rule else {
            return Err(sources.error(job, Some("rules"), "each rule must be a map"));
        };
        let mut matched = true;
        if let Some(cond) = rule.get("if") {
            let expr = cond.as_str().ok_or_else(|| sources.error(job, Some("rules"), "`if` must be a string"))?;
            matched = rules::evaluate(expr, vars)
                .map_err(|e| sources.error(job, Some("rules"), format!("invalid `if: {expr}`: {e}")))?;
        }
        if matched {
            if let Some(exists) = rule.get("exists") {
                let patterns = match exists {
                    Value::Mapping(m) => m.get("paths").map(list_of_strings).unwrap_or_default(),
                    other => list_of_strings(other),
                };
                matched = patterns.iter().any(|p| {
                    glob::glob(&project_dir.join(p).display().to_string())
                        .map(|mut g| g.any(|e| e.is_ok()))
                        .unwrap_or(false)
                });
            }
        }
        if matched {
            return Ok(Some(RuleResult {
                when: rule.get("when").and_then(Value::as_str).unwrap_or("on_success").to_string(),
                allow_failure: rule.get("allow_failure").cloned(),
                variables: variables_of(rule.get("variables")),
            }));
        }
    }
    Ok(None)
}

fn allow_failure_of(value: Option<&Value>, when: &str) -> (bool, Vec<i32>) {
    match value {
        Some(Value::Bool(b)) => (*b, Vec::new()),
        Some(Value::Mapping(m)) => {
            let codes = m
                .get("exit_codes")
                .map(|c| list_of_strings(c).iter().filter_map(|s| s.parse().ok()).collect())
                .unwrap_or_default();
            (true, codes)
        }
        // Manual jobs may fail by default.
        _ => (when == "manual", Vec::new()),
    }
}

impl Pipeline {
    /// Read `file` (with its includes) for the project in `project_dir`; `overrides` are
    /// `--var` values, which win over everything.
    pub fn load(project_dir: &Path, file: &Path, overrides: &[(String, String)]) -> Result<Pipeline, ConfigError> {
        let text = std::fs::read_to_string(file).map_err(|e| ConfigError::new(file, e.to_string()))?;
        let mut root = parse_yaml(file, &text)?;
        let mut sources = Sources { files: vec![(file.to_path_buf(), text)] };
        if !root.is_mapping() {
            return Err(ConfigError::new(file, "the pipeline file must be a map of keys to jobs").at_line(Some(1)));
        }
        load_includes(project_dir, &mut root, &mut sources, 0)?;
        let snapshot = root.clone();
        resolve_references(&mut root, &snapshot, &sources)?;
        let Value::Mapping(top) = &root else { return Err(sources.error("", None, "not a map")) };

        let mut stages: Vec<String> = top
            .get("stages")
            .or_else(|| top.get("types"))
            .map(list_of_strings)
            .unwrap_or_else(|| vec!["build".into(), "test".into(), "deploy".into()]);
        stages.retain(|s| s != ".pre" && s != ".post");
        stages.insert(0, ".pre".into());
        stages.push(".post".into());

        let facts = git_facts(project_dir);
        let project_name =
            project_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "project".into());
        let project_path = format!("local/{project_name}");
        let title = facts.message.lines().next().unwrap_or("").to_string();
        let predefined: Vec<(String, String)> = vec![
            ("CI".into(), "true".into()),
            ("GITLAB_CI".into(), "true".into()),
            ("CI_SERVER_NAME".into(), "GitLab".into()),
            ("CI_SERVER_URL".into(), "https://gitlab.example.com".into()),
            ("CI_PIPELINE_ID".into(), "1".into()),
            ("CI_PIPELINE_IID".into(), "1".into()),
            ("CI_PIPELINE_SOURCE".into(), "push".into()),
            ("CI_COMMIT_SHA".into(), facts.sha.clone()),
            ("CI_COMMIT_SHORT_SHA".into(), facts.sha.chars().take(8).collect()),
            ("CI_COMMIT_REF_NAME".into(), facts.branch.clone()),
            ("CI_COMMIT_REF_SLUG".into(), slug(&facts.branch)),
            ("CI_COMMIT_BRANCH".into(), facts.branch.clone()),
            ("CI_COMMIT_MESSAGE".into(), facts.message.clone()),
            ("CI_COMMIT_TITLE".into(), title),
            ("CI_DEFAULT_BRANCH".into(), "main".into()),
            ("CI_PROJECT_DIR".into(), project_dir.display().to_string()),
            ("CI_PROJECT_NAME".into(), project_name.clone()),
            ("CI_PROJECT_NAMESPACE".into(), "local".into()),
            ("CI_PROJECT_PATH".into(), project_path.clone()),
            ("CI_PROJECT_PATH_SLUG".into(), slug(&project_path)),
        ];
        let global_vars = variables_of(top.get("variables"));
        let mut base_vars: BTreeMap<String, String> = predefined.iter().cloned().collect();
        base_vars.extend(global_vars.iter().cloned());
        base_vars.extend(overrides.iter().cloned());

        // workflow:rules
        let mut workflow_blocked = false;
        if let Some(rules) = top.get("workflow").and_then(|w| w.get("rules")) {
            match apply_rules(rules, &base_vars, project_dir, &sources, "workflow")? {
                Some(r) if r.when != "never" => {
                    for (k, v) in r.variables {
                        base_vars.insert(k, v);
                    }
                }
                _ => workflow_blocked = true,
            }
        }

        // Script keys of `default:` and the legacy top-level ones: GitLab's shape or an error.
        for key in SCRIPT_KEYS {
            if let Some(v) = top.get(*key) {
                if script_lines(v).is_none() {
                    return Err(sources.error(key, None, format!("{key} {SCRIPT_SHAPE}")));
                }
            }
            if let Some(v) = top.get("default").and_then(|d| d.get(*key)) {
                if script_lines(v).is_none() {
                    return Err(sources.error("default", Some(*key), format!("default:{key} {SCRIPT_SHAPE}")));
                }
            }
        }

        // default: (and the legacy top-level keys)
        let mut defaults = Mapping::new();
        for key in ["image", "services", "cache", "before_script", "after_script"] {
            if let Some(v) = top.get(key) {
                defaults.insert(key.into(), v.clone());
            }
        }
        if let Some(Value::Mapping(d)) = top.get("default") {
            for (k, v) in d {
                defaults.insert(k.clone(), v.clone());
            }
        }

        let names: Vec<String> = top
            .iter()
            .filter_map(|(k, v)| {
                let name = str_key(k)?;
                (!RESERVED.contains(&name) && !name.starts_with('.') && v.is_mapping()).then(|| name.to_string())
            })
            .collect();
        let mut jobs = Vec::new();
        let mut next_id = 1;
        for name in names {
            let mut config = resolve_extends(top, &name, &sources, &mut Vec::new())?;
            config.remove("extends");
            for key in DEFAULTABLE {
                if !config.contains_key(*key) {
                    if let Some(v) = defaults.get(*key) {
                        config.insert((*key).into(), v.clone());
                    }
                }
            }
            if config.get("trigger").is_some() {
                continue; // Bridge jobs trigger other pipelines; nothing runs locally.
            }
            for key in SCRIPT_KEYS {
                if config.get(*key).is_some_and(|v| script_lines(v).is_none()) {
                    return Err(sources.error(&name, Some(*key), format!("jobs:{name}:{key} {SCRIPT_SHAPE}")));
                }
            }
            let script = config.get("script").and_then(script_lines).unwrap_or_default();
            if script.is_empty() {
                return Err(sources.error(&name, None, "job has no script"));
            }
            let stage = config.get("stage").and_then(Value::as_str).unwrap_or("test").to_string();
            if !stages.contains(&stage) {
                return Err(sources.error(
                    &name,
                    Some("stage"),
                    format!("stage {stage:?} is not in stages ({})", stages.join(", ")),
                ));
            }
            for expanded in expand_parallel(&name, &config, &sources)? {
                let mut vars = base_vars.clone();
                let job_vars = variables_of(expanded.config.get("variables"));
                vars.extend(job_vars.iter().cloned());
                vars.extend(expanded.extra.iter().cloned());
                vars.insert("CI_JOB_NAME".into(), expanded.name.clone());
                vars.insert("CI_JOB_NAME_SLUG".into(), slug(&expanded.name));
                vars.insert("CI_JOB_STAGE".into(), stage.clone());
                vars.extend(overrides.iter().cloned());
                let mut when = expanded.config.get("when").and_then(Value::as_str).unwrap_or("on_success").to_string();
                let mut allow_failure_value = expanded.config.get("allow_failure").cloned();
                let mut rule_vars = Vec::new();
                if let Some(rules) = expanded.config.get("rules") {
                    match apply_rules(rules, &vars, project_dir, &sources, &name)? {
                        Some(r) => {
                            when = r.when;
                            if r.allow_failure.is_some() {
                                allow_failure_value = r.allow_failure;
                            }
                            rule_vars = r.variables;
                        }
                        None => when = "never".into(),
                    }
                }
                if !["on_success", "on_failure", "always", "manual", "delayed", "never"].contains(&when.as_str()) {
                    return Err(sources.error(&name, Some("when"), format!("unknown when: {when:?}")));
                }
                if when == "never" {
                    continue;
                }
                let (allow_failure, allow_failure_exit_codes) = allow_failure_of(allow_failure_value.as_ref(), &when);
                // `needs` orders jobs; without it, `dependencies` (jobs of earlier stages whose
                // artifacts the job uses) order them the same way for `--needs`.
                let ordering = expanded.config.get("needs").or_else(|| expanded.config.get("dependencies"));
                let needs: Vec<String> = ordering
                    .and_then(Value::as_sequence)
                    .map(|items| {
                        items
                            .iter()
                            .filter_map(|n| {
                                n.as_str()
                                    .map(str::to_string)
                                    .or_else(|| n.get("job").and_then(Value::as_str).map(str::to_string))
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let timeout = match expanded.config.get("timeout") {
                    Some(t) => {
                        let text = scalar_string(t).unwrap_or_default();
                        parse_timeout(&text).ok_or_else(|| {
                            sources.error(
                                &name,
                                Some("timeout"),
                                format!("cannot read {text:?} as a duration (e.g. \"1h 30m\")"),
                            )
                        })? as i64
                    }
                    None => 3600,
                };
                // Variables in GitLab's payload order: predefined, global, job, rules, --var.
                let mut list: Vec<JobVariable> = Vec::new();
                let mut push = |k: &str, v: &str| list.push(JobVariable::public(k, v));
                for (k, v) in &vars {
                    if !overrides.iter().any(|(o, _)| o == k) {
                        push(k, v);
                    }
                }
                for (k, v) in &rule_vars {
                    push(k, v);
                }
                if !vars.contains_key("GIT_STRATEGY") && !rule_vars.iter().any(|(k, _)| k == "GIT_STRATEGY") {
                    push("GIT_STRATEGY", "none");
                }
                push("CI_JOB_ID", &next_id.to_string());
                for (k, v) in overrides {
                    push(k, v);
                }
                let commands = |key: &str| expanded.config.get(key).and_then(script_lines).unwrap_or_default();
                let mut lines = commands("before_script");
                lines.extend(commands("script"));
                let mut steps = vec![Step {
                    name: "script".into(),
                    script: lines,
                    timeout,
                    when: StepWhen::OnSuccess,
                    allow_failure: false,
                }];
                let after = commands("after_script");
                if !after.is_empty() {
                    steps.push(Step {
                        name: "after_script".into(),
                        script: after,
                        timeout,
                        when: StepWhen::Always,
                        allow_failure: true,
                    });
                }
                let artifacts = transfer::artifacts(expanded.config.get("artifacts"))
                    .map_err(|e| sources.error(&name, Some("artifacts"), e.0))?;
                let cache = transfer::caches(expanded.config.get("cache"), project_dir)
                    .map_err(|e| sources.error(&name, Some("cache"), e.0))?;
                let payload = JobResponse {
                    id: next_id,
                    token: "local".into(),
                    allow_git_fetch: false,
                    job_info: JobInfo {
                        id: next_id,
                        name: expanded.name.clone(),
                        stage: stage.clone(),
                        pipeline_id: 1,
                        project_id: 1,
                        project_name: project_name.clone(),
                        project_full_path: project_path.clone(),
                        time_in_queue_seconds: 0.0,
                        ..JobInfo::default()
                    },
                    git_info: GitInfo {
                        repo_url: String::new(),
                        git_ref: facts.branch.clone(),
                        sha: facts.sha.clone(),
                        ref_type: "branch".into(),
                        ..GitInfo::default()
                    },
                    runner_info: RunnerInfo { timeout },
                    variables: list,
                    steps,
                    image: expanded.config.get("image").and_then(images::image),
                    services: images::services(expanded.config.get("services")),
                    artifacts,
                    cache,
                    features: JobFeatures {
                        trace_sections: true,
                        token_mask_prefixes: Vec::new(),
                        failure_reasons: [
                            "script_failure",
                            "runner_system_failure",
                            "job_execution_timeout",
                            "runner_configuration_error",
                            "job_canceled",
                        ]
                        .map(String::from)
                        .to_vec(),
                    },
                    ..JobResponse::default()
                };
                next_id += 1;
                jobs.push(PlannedJob {
                    base: expanded.base,
                    name: expanded.name,
                    stage: stage.clone(),
                    when,
                    allow_failure,
                    allow_failure_exit_codes,
                    needs,
                    payload,
                });
            }
        }
        // Stage order, file order within a stage.
        jobs.sort_by_key(|j| stages.iter().position(|s| *s == j.stage).unwrap_or(usize::MAX));
        let known: BTreeSet<String> = jobs.iter().map(|j| j.name.clone()).collect();
        for job in &jobs {
            for need in &job.needs {
                let base_known = known.contains(need)
                    || jobs
                        .iter()
                        .any(|j| j.name.starts_with(&format!("{need} ")) || j.name.starts_with(&format!("{need}: ")));
                if !base_known {
                    return Err(sources.error(
                        job.name.split([' ', ':']).next().unwrap_or(&job.name),
                        Some("needs"),
                        format!("needs unknown job {need:?}"),
                    ));
                }
            }
        }
        // GitLab refuses a pipeline whose `needs` go round in a circle.
        if let Some(cycle) = needs_cycle(&jobs) {
            let bases: Vec<&str> = cycle.iter().map(|&i| jobs[i].base.as_str()).collect();
            return Err(sources.error(
                bases[0],
                Some("needs"),
                format!("needs form a cycle: {} (jobs: {})", bases.join(" -> "), {
                    let mut names: Vec<&str> = bases[..bases.len() - 1].to_vec();
                    names.sort_unstable();
                    names.dedup();
                    names.join(", ")
                }),
            ));
        }
        Ok(Pipeline {
            stages,
            jobs: if workflow_blocked { Vec::new() } else { jobs },
            workflow_blocked,
            file: file.to_path_buf(),
        })
    }

    /// Jobs in stage order.
    pub fn jobs(&self) -> &[PlannedJob] {
        &self.jobs
    }

    /// A job by name.
    pub fn job(&self, name: &str) -> Option<&PlannedJob> {
        self.jobs.iter().find(|j| j.name == name)
    }

    /// The jobs whose artifacts `job` gets, as GitLab decides: those it `needs` (or lists
    /// in `dependencies`), else every job of an earlier stage.
    pub fn dependencies_of(&self, job: &PlannedJob) -> Vec<&PlannedJob> {
        if !job.needs.is_empty() {
            return self.jobs.iter().filter(|j| job.needs.contains(&j.base)).collect();
        }
        let stage = |name: &str| self.stages.iter().position(|s| s == name).unwrap_or(usize::MAX);
        self.jobs.iter().filter(|j| stage(&j.stage) < stage(&job.stage)).collect()
    }

    fn expand_name(&self, name: &str) -> Vec<&PlannedJob> {
        match self.job(name) {
            Some(j) => vec![j],
            None => self
                .jobs
                .iter()
                .filter(|j| j.name.starts_with(&format!("{name} ")) || j.name.starts_with(&format!("{name}: ")))
                .collect(),
        }
    }

    /// `names` plus everything they need, needed jobs first, in stage order.
    pub fn with_needs(&self, names: &[String]) -> Result<Vec<&PlannedJob>, ConfigError> {
        let mut chosen: BTreeSet<String> = BTreeSet::new();
        let mut stack: Vec<(String, Vec<String>)> = names.iter().map(|n| (n.clone(), Vec::new())).collect();
        while let Some((name, path)) = stack.pop() {
            if path.contains(&name) {
                return Err(ConfigError::new(
                    self.file.clone(),
                    format!("needs form a cycle: {} -> {name}", path.join(" -> ")),
                )
                .with_key(name.clone()));
            }
            let found = self.expand_name(&name);
            if found.is_empty() {
                return Err(ConfigError::new(self.file.clone(), "unknown job (`runway exec --list` shows them)")
                    .with_key(name.clone()));
            }
            for job in found {
                if chosen.insert(job.name.clone()) || path.is_empty() {
                    let mut next = path.clone();
                    next.push(name.clone());
                    for need in &job.needs {
                        stack.push((need.clone(), next.clone()));
                    }
                }
            }
        }
        Ok(self.jobs.iter().filter(|j| chosen.contains(&j.name)).collect())
    }
}

/// Jobs `job` needs: every job of that name, or of that `parallel` job.
fn needed<'a>(jobs: &'a [PlannedJob], job: &'a PlannedJob) -> impl Iterator<Item = usize> + 'a {
    jobs.iter().enumerate().filter(move |(_, j)| job.needs.contains(&j.base)).map(|(i, _)| i)
}

/// A cycle of `needs` as job indexes, first job repeated at the end; none when there is none.
fn needs_cycle(jobs: &[PlannedJob]) -> Option<Vec<usize>> {
    // 0 = unvisited, 1 = on the current path, 2 = done. Iterative, so no depth limit matters.
    let mut state = vec![0u8; jobs.len()];
    for start in 0..jobs.len() {
        if state[start] != 0 {
            continue;
        }
        let mut path: Vec<(usize, Vec<usize>)> = vec![(start, needed(jobs, &jobs[start]).collect())];
        state[start] = 1;
        while let Some((node, pending)) = path.last_mut() {
            let node = *node;
            match pending.pop() {
                Some(next) if state[next] == 1 => {
                    let at = path.iter().position(|(n, _)| *n == next).unwrap_or(0);
                    let mut cycle: Vec<usize> = path[at..].iter().map(|(n, _)| *n).collect();
                    // Start from the job written first, so the message does not depend on the walk.
                    let first = cycle.iter().enumerate().min_by_key(|(_, &n)| n).map_or(0, |(i, _)| i);
                    cycle.rotate_left(first);
                    cycle.push(cycle[0]);
                    return Some(cycle);
                }
                Some(next) if state[next] == 0 => {
                    state[next] = 1;
                    path.push((next, needed(jobs, &jobs[next]).collect()));
                }
                Some(_) => {}
                None => {
                    state[node] = 2;
                    path.pop();
                }
            }
        }
    }
    None
}

/// `runway exec --list`.
pub fn list_table(pipeline: &Pipeline) -> String {
    if pipeline.workflow_blocked {
        return "workflow:rules keep this pipeline from running; no jobs\n".into();
    }
    let mut rows = vec![["NAME".to_string(), "STAGE".into(), "WHEN".into(), "ALLOW FAILURE".into(), "NEEDS".into()]];
    for j in pipeline.jobs() {
        let allow = if !j.allow_failure_exit_codes.is_empty() {
            format!("exit codes {:?}", j.allow_failure_exit_codes)
        } else {
            j.allow_failure.to_string()
        };
        rows.push([j.name.clone(), j.stage.clone(), j.when.clone(), allow, j.needs.join(", ")]);
    }
    let widths: Vec<usize> = (0..5).map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    rows.iter()
        .map(|r| {
            let line: Vec<String> = r.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
            format!("{}\n", line.join("  ").trim_end())
        })
        .collect()
}

#[cfg(test)]
mod tests;
