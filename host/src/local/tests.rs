//! The fixture corpus under tests/fixtures/ci, expanded and checked job by job.

use std::path::{Path, PathBuf};

use super::*;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/ci")
}

/// A git project with `fixture` as its .gitlab-ci.yml (and the included files).
fn project(fixture: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(fixtures().join(fixture), dir.path().join(".gitlab-ci.yml")).expect("copy fixture");
    std::fs::create_dir_all(dir.path().join("included")).expect("mkdir");
    for name in ["one.yml", "two.yml"] {
        std::fs::copy(fixtures().join("included").join(name), dir.path().join("included").join(name))
            .expect("copy include");
    }
    std::fs::write(dir.path().join("README.md"), "hi\n").expect("readme");
    let git = |args: &[&str]| {
        std::process::Command::new("git").arg("-C").arg(dir.path()).args(args).output().expect("git");
    };
    git(&["init", "-q", "-b", "main"]);
    git(&["-c", "user.email=t@example.com", "-c", "user.name=t", "add", "."]);
    git(&["-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-q", "-m", "first commit\n\nbody"]);
    dir
}

fn load(fixture: &str) -> (tempfile::TempDir, Result<Pipeline, ConfigError>) {
    let dir = project(fixture);
    let file = dir.path().join(".gitlab-ci.yml");
    let result = Pipeline::load(dir.path(), &file, &[("CLI".into(), "over".into())]);
    (dir, result)
}

fn var<'a>(job: &'a PlannedJob, key: &str) -> Option<&'a str> {
    job.payload.variable(key)
}

fn script(job: &PlannedJob, step: &str) -> Vec<String> {
    job.payload.steps.iter().find(|s| s.name == step).map(|s| s.script.clone()).unwrap_or_default()
}

#[test]
fn basic_stages_variables_defaults_and_scripts() {
    let (_dir, p) = load("basic.yml");
    let p = p.expect("loads");
    assert_eq!(p.jobs().iter().map(|j| j.name.as_str()).collect::<Vec<_>>(), vec!["build", "test"]);
    let build = p.job("build").expect("build");
    assert_eq!(script(build, "script"), vec!["echo default-before", "echo build", "echo nested", "echo list"]);
    assert_eq!(script(build, "after_script"), vec!["echo default-after"]);
    assert_eq!(build.payload.runner_info.timeout, 5400);
    assert_eq!(var(build, "DESCRIBED"), Some("dv"));
    assert_eq!(var(build, "PRICE"), Some("$$5"), "`$$` is left for the runner's expansion");
    assert_eq!(var(build, "GIT_STRATEGY"), Some("none"));
    assert_eq!(var(build, "CI_COMMIT_BRANCH"), Some("main"));
    assert_eq!(var(build, "CI_COMMIT_TITLE"), Some("first commit"));
    assert_eq!(var(build, "CI_JOB_STAGE"), Some("build"));
    assert_eq!(var(build, "CLI"), Some("over"));
    assert_eq!(var(build, "CI_COMMIT_SHA").map(str::len), Some(40));
    let test = p.job("test").expect("test");
    assert_eq!(script(test, "script"), vec!["echo own-before", "echo test"]);
    assert!(script(test, "after_script").is_empty());
    assert_eq!(var(test, "GLOBAL"), Some("overridden"));
    assert_eq!(var(test, "LOCAL"), Some("${GLOBAL}-l"), "expansion happens in the job path, as with GitLab");
    assert_eq!((test.allow_failure, test.allow_failure_exit_codes.clone()), (true, vec![3, 4]));
    assert_eq!(test.needs, vec!["build"]);
    assert_eq!(
        p.with_needs(&["test".into()]).expect("needs").iter().map(|j| j.name.as_str()).collect::<Vec<_>>(),
        vec!["build", "test"]
    );
    assert!(list_table(&p).contains("test   test   on_success  exit codes [3, 4]  build"), "{}", list_table(&p));
}

#[test]
fn extends_anchors_merge_keys_and_references() {
    let (_dir, p) = load("extends.yml");
    let p = p.expect("loads");
    let job = p.job("job").expect("job");
    assert_eq!(script(job, "script"), vec!["echo setup-1", "echo setup-2", "echo job"]);
    assert_eq!(
        (var(job, "A"), var(job, "B"), var(job, "C"), var(job, "D")),
        (Some("1"), Some("middle"), Some("3"), Some("4"))
    );
    assert_eq!(script(job, "after_script"), vec!["echo other-after"]);
    let image = job.payload.image.as_ref().map(|i| i.name.as_str());
    assert_eq!(image, Some("alpine"), "image: is inherited through extends, for the docker executor");
    assert!(job.payload.services.is_empty());
    let anchored = p.job("anchored").expect("anchored");
    assert_eq!(script(anchored, "script"), vec!["echo anchored"]);
    assert_eq!(var(anchored, "B"), Some("base"));
    assert!(p.job(".base").is_none(), "hidden jobs are templates");
}

#[test]
fn rules_when_and_workflow() {
    let (_dir, p) = load("rules.yml");
    let p = p.expect("loads");
    let names: Vec<&str> = p.jobs().iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, vec!["on-main", "manual", "with-file", "null-check"]);
    assert_eq!(var(p.job("on-main").expect("on-main"), "FROM_RULE"), Some("yes"));
    let manual = p.job("manual").expect("manual");
    assert_eq!((manual.when.as_str(), manual.allow_failure), ("manual", true));
    let with_file = p.job("with-file").expect("with-file");
    assert_eq!((with_file.when.as_str(), with_file.allow_failure), ("always", true));

    let dir = project("rules.yml");
    let blocked = Pipeline::load(
        dir.path(),
        &dir.path().join(".gitlab-ci.yml"),
        &[("CI_PIPELINE_SOURCE".into(), "schedule".into())],
    )
    .expect("loads");
    assert!(blocked.workflow_blocked && blocked.jobs().is_empty());
}

#[test]
fn parallel_and_matrix_names() {
    let (_dir, p) = load("parallel.yml");
    let p = p.expect("loads");
    let names: Vec<&str> = p.jobs().iter().map(|j| j.name.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "numbered 1/3",
            "numbered 2/3",
            "numbered 3/3",
            "matrix: [aws, monitoring]",
            "matrix: [aws, app]",
            "matrix: [gcp, data]",
            "uses-artifacts"
        ]
    );
    let ordered: Vec<&str> =
        p.with_needs(&["uses-artifacts".into()]).expect("dependencies order").iter().map(|j| j.name.as_str()).collect();
    assert_eq!(ordered, vec!["numbered 1/3", "numbered 2/3", "numbered 3/3", "uses-artifacts"]);
    let gcp = p.job("matrix: [gcp, data]").expect("gcp");
    assert_eq!(
        (var(gcp, "PROVIDER"), var(gcp, "STACK"), var(gcp, "CI_NODE_TOTAL")),
        (Some("gcp"), Some("data"), Some("3"))
    );
    assert_eq!(var(p.job("numbered 2/3").expect("n2"), "CI_NODE_INDEX"), Some("2"));
    assert_eq!(p.with_needs(&["matrix".into()]).expect("all matrix jobs").len(), 3);
}

#[test]
fn local_includes_with_wildcards() {
    let (_dir, p) = load("include.yml");
    let p = p.expect("loads");
    assert_eq!(var(p.job("from-main").expect("main"), "ONE"), Some("1"));
    assert!(p.job("from-two").is_some());
}

fn error_for(yaml: &str) -> ConfigError {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join(".gitlab-ci.yml");
    std::fs::write(&file, yaml).expect("write");
    Pipeline::load(dir.path(), &file, &[]).expect_err("must fail")
}

#[test]
fn errors_name_file_line_and_key() {
    let e = error_for("stages: [build]\n\njob:\n  stage: test\n  script: echo\n");
    assert_eq!((e.line, e.key.as_deref()), (Some(4), Some("job.stage")), "{e}");
    assert!(
        e.to_string().ends_with(".gitlab-ci.yml:4: job.stage: stage \"test\" is not in stages (.pre, build, .post)"),
        "{e}"
    );
    let e = error_for("a:\n  extends: b\n  script: x\nb:\n  extends: a\n  script: y\n");
    assert!(e.message.contains("circular extends"), "{e}");
    assert_eq!(e.line, Some(2));
    let e = error_for("include: missing.yml\njob:\n  script: x\n");
    assert!(e.message.contains("missing.yml") && e.key.as_deref() == Some("include") && e.line == Some(1), "{e}");
    let e = error_for("job:\n  script: x\n  rules:\n    - if: $A = \"b\"\n");
    assert!(e.message.contains("invalid `if") && e.line == Some(3), "{e}");
    let e = error_for("first:\n  script: x\nnoscript:\n  stage: test\n");
    assert_eq!((e.line, e.key.as_deref(), e.message.as_str()), (Some(3), Some("noscript"), "job has no script"));
    let e = error_for("job:\n  script: [unclosed\n");
    assert!(e.message.starts_with("YAML syntax error") && e.line.is_some(), "{e}");
    let e = error_for("job:\n  extends: .nope\n  script: x\n");
    assert!(e.message.contains(".nope"), "{e}");
}

#[test]
fn timeouts_parse_like_gitlab() {
    assert_eq!(parse_timeout("1h 30m"), Some(5400));
    assert_eq!(parse_timeout("90 minutes"), Some(5400));
    assert_eq!(parse_timeout("3600"), Some(3600));
    assert_eq!(parse_timeout("2 hours and 10 minutes"), Some(7800));
    assert_eq!(parse_timeout("soon"), None);
}

/// Every file of tests/fixtures/ci/bad starts with `# expect: LINE KEY: TEXT` (LINE `-` for
/// none): as a project's
/// .gitlab-ci.yml it must be refused, quickly and without panicking, with
/// `<project>/.gitlab-ci.yml:LINE: KEY: ...TEXT...`.
#[test]
fn malformed_pipeline_corpus_is_refused_with_file_line_and_key() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(fixtures().join("bad"))
        .expect("corpus")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yml"))
        .collect();
    files.sort();
    assert!(files.len() >= 20, "{} fixtures", files.len());
    let mut failures = Vec::new();
    for fixture in &files {
        let text = std::fs::read_to_string(fixture).expect("read");
        let expect = text.lines().next().and_then(|l| l.strip_prefix("# expect: ")).expect("expect line");
        let (line, rest) = expect.split_once(' ').expect("line");
        let (key, message) = rest.split_once(": ").expect("key");
        let line: Option<usize> = (line != "-").then(|| line.parse().expect("line number"));
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join(".gitlab-ci.yml");
        std::fs::write(&file, &text).expect("write");
        let started = std::time::Instant::now();
        let result = std::panic::catch_unwind(|| Pipeline::load(dir.path(), &file, &[]));
        let name = fixture.file_name().expect("name").to_string_lossy().into_owned();
        if started.elapsed() > std::time::Duration::from_secs(5) {
            failures.push(format!("{name}: took {:?}", started.elapsed()));
        }
        let err = match result {
            Err(_) => {
                failures.push(format!("{name}: panicked"));
                continue;
            }
            Ok(Ok(p)) => {
                failures.push(format!("{name}: loaded {} jobs", p.jobs().len()));
                continue;
            }
            Ok(Err(e)) => e,
        };
        let prefix = match line {
            Some(line) => format!("{}:{line}: {key}: ", file.display()),
            None => format!("{}: {key}: ", file.display()),
        };
        let shown = err.to_string();
        if err.path != file || err.line != line || !shown.starts_with(&prefix) || !err.message.contains(message) {
            failures.push(format!("{name}: got {shown:?}, want {prefix}...{message}..."));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn scripts_nest_up_to_ten_levels_and_are_flattened() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join(".gitlab-ci.yml");
    let mut deep = "echo deep".to_string();
    for _ in 0..9 {
        deep = format!("[{deep}]");
    }
    let yaml = format!(
        ".setup: &setup\n  - echo one\n  - [echo two]\njob:\n  before_script: echo before\n  script:\n    - *setup\n    - {deep}\n  after_script: [[echo after]]\n"
    );
    std::fs::write(&file, yaml).expect("write");
    let p = Pipeline::load(dir.path(), &file, &[]).expect("loads");
    let job = p.job("job").expect("job");
    assert_eq!(script(job, "script"), vec!["echo before", "echo one", "echo two", "echo deep"]);
    assert_eq!(script(job, "after_script"), vec!["echo after"]);
}

#[test]
fn a_matrix_of_exactly_200_jobs_is_accepted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join(".gitlab-ci.yml");
    let values = |p: &str, n: usize| (0..n).map(|i| format!("{p}{i}")).collect::<Vec<_>>().join(", ");
    let yaml = format!(
        "job:\n  script: echo\n  parallel:\n    matrix:\n      - A: [{}]\n        B: [{}]\n      - C: [{}]\n",
        values("a", 10),
        values("b", 10),
        values("c", 100)
    );
    std::fs::write(&file, yaml).expect("write");
    let p = Pipeline::load(dir.path(), &file, &[]).expect("200 jobs load");
    assert_eq!(p.jobs().len(), 200, "GitLab's PARALLEL_LIMIT");
    assert_eq!(var(p.jobs().last().expect("last"), "CI_NODE_TOTAL"), Some("200"));
}

#[test]
fn includes_through_symlinks_must_stay_inside_the_project() {
    let outside = tempfile::tempdir().expect("outside");
    std::fs::write(outside.path().join("evil.yml"), "evil:\n  script: echo pwned\n").expect("write");
    let dir = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(outside.path().join("evil.yml"), dir.path().join("inc.yml")).expect("symlink");
    std::fs::create_dir(dir.path().join("ci")).expect("mkdir");
    std::fs::write(dir.path().join("ci/ok.yml"), "ok:\n  script: echo ok\n").expect("write");
    std::os::unix::fs::symlink(dir.path().join("ci/ok.yml"), dir.path().join("inside.yml")).expect("symlink");
    let file = dir.path().join(".gitlab-ci.yml");
    std::fs::write(&file, "include:\n  - local: inc.yml\njob:\n  script: echo\n").expect("write");
    let e = Pipeline::load(dir.path(), &file, &[]).expect_err("symlink out of the project");
    assert_eq!((e.path.as_path(), e.line, e.key.as_deref()), (file.as_path(), Some(1), Some("include")), "{e}");
    assert!(e.message.contains("outside the project directory"), "{e}");
    // A symlink to a file of the project, and a `..` that comes back inside, are fine.
    std::fs::write(&file, "include:\n  - local: inside.yml\n  - ci/../ci/ok.yml\njob:\n  script: echo\n")
        .expect("write");
    let p = Pipeline::load(dir.path(), &file, &[]).expect("inside includes load");
    assert!(p.job("ok").is_some());
}

#[test]
fn with_needs_errors_name_the_pipeline_file() {
    let (dir, p) = load("basic.yml");
    let e = p.expect("loads").with_needs(&["nope".into()]).expect_err("unknown job");
    assert_eq!(e.path, dir.path().join(".gitlab-ci.yml"), "{e}");
}

#[test]
fn git_facts_come_from_one_log_line_set() {
    assert_eq!(checked_out_branch("HEAD -> feat,x/y, origin/main, tag: v1"), Some("feat,x/y".into()));
    assert_eq!(checked_out_branch("HEAD, tag: v1"), None, "detached");
    assert_eq!(checked_out_branch(""), None);

    let dir = project("basic.yml");
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git").arg("-C").arg(dir.path()).args(args).output().expect("git");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    git(&["checkout", "-q", "-b", "release/2.0"]);
    let facts = git_facts(dir.path());
    assert_eq!(facts.branch, "release/2.0");
    assert_eq!(facts.sha, git(&["rev-parse", "HEAD"]));
    assert_eq!(facts.message, "first commit\n\nbody");
    // Detached: the branch falls back to `main`, as before.
    git(&["checkout", "-q", "--detach"]);
    assert_eq!(git_facts(dir.path()).branch, "main");
}
