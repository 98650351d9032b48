//! `runway exec` as a user runs it: the binary on real projects, real bash and git.

use std::path::Path;
use std::process::Command;

const RUNWAY: &str = env!("CARGO_BIN_EXE_runway");

fn exec(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(RUNWAY)
        .arg("exec")
        .arg("--cwd")
        .arg(dir)
        .args(args)
        .env_remove("NO_COLOR")
        .output()
        .expect("runway exec runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn demo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/demo")
}

fn project(yaml: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join(".gitlab-ci.yml"), yaml).expect("write");
    std::fs::write(dir.path().join("tracked.txt"), "tracked\n").expect("write");
    for args in [
        &["init", "-q", "-b", "main"][..],
        &["add", "."],
        &["-c", "user.email=t@e", "-c", "user.name=t", "commit", "-q", "-m", "init"],
    ] {
        Command::new("git").arg("-C").arg(dir.path()).args(args).output().expect("git");
    }
    dir
}

#[test]
fn the_demo_job_runs_and_the_log_reads_like_gitlab() {
    let (code, out, err) = exec(&demo(), &["test"]);
    assert_eq!(code, 0, "{out}\n{err}");
    for expected in [
        "Running with runway",
        "Preparing the \"shell\" executor",
        "$ echo \"greeting ok\"",
        "greeting ok",
        "test finished with status success",
        "Job succeeded",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
    assert!(!out.contains('\x1b'), "colour codes on a non-TTY");
    assert!(out.contains("step_script "), "section durations: {out}");
}

#[test]
fn list_needs_allow_failure_and_exit_codes() {
    let (code, out, _) = exec(&demo(), &["--list"]);
    assert_eq!(code, 0);
    assert!(out.contains("matrix: [bash]") && out.contains("lint") && out.contains("build"), "{out}");
    let (code, out, err) = exec(&demo(), &["lint"]);
    assert_eq!(code, 0, "allow_failure job: {out}{err}");
    assert!(out.contains("ERROR: Job failed: exit code 2") && err.contains("allow_failure"), "{out}{err}");
    let (code, out, _) = exec(&demo(), &["--needs", "test"]);
    assert_eq!(code, 0);
    assert!(out.find("Hello, runway!").expect("build ran") < out.find("greeting ok").expect("test ran"));

    let dir = project("fails:\n  script:\n    - echo before\n    - exit 7\n    - echo never\n");
    let (code, out, _) = exec(dir.path(), &["fails"]);
    assert_eq!(code, 7, "{out}");
    assert!(out.contains("before") && !out.contains("never"));
}

#[test]
fn vars_isolate_and_errors() {
    let yaml = "variables:\n  WHO: yaml\nwho:\n  script:\n    - echo \"who=$WHO\"\n    - touch created-by-job\n    - cat tracked.txt\n";
    let dir = project(yaml);
    let (code, out, _) = exec(dir.path(), &["--var", "WHO=cli", "who"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("who=cli"));
    assert!(dir.path().join("created-by-job").exists(), "jobs run in the project directory by default");
    std::fs::remove_file(dir.path().join("created-by-job")).expect("rm");
    let (code, out, _) = exec(dir.path(), &["--isolate", "who"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("tracked"), "{out}");
    assert!(!dir.path().join("created-by-job").exists(), "--isolate ran elsewhere");

    let (code, _, err) = exec(dir.path(), &["nope"]);
    assert_eq!(code, 1);
    assert!(err.contains(".gitlab-ci.yml") && err.contains("unknown job \"nope\""), "{err}");
    let bad = project("job:\n  stage: missing\n  script: x\n");
    let (code, _, err) = exec(bad.path(), &["job"]);
    assert_eq!(code, 1);
    assert!(err.contains(".gitlab-ci.yml:2: job.stage"), "{err}");
}

/// GitLab's limits as `runway exec` users meet them: refused at once, exit 1, file:line: key.
#[test]
fn gitlab_limits_are_refused_with_file_line_and_key() {
    let values = |p: &str| (0..1000).map(|i| format!("{p}{i}")).collect::<Vec<_>>().join(", ");
    let cases = [
        (
            format!(
                "job:\n  script: echo\n  parallel:\n    matrix:\n      - A: [{}]\n        B: [{}]\n",
                values("a"),
                values("b")
            ),
            ".gitlab-ci.yml:3: job.parallel: matrix config generates too many jobs (1000000; maximum is 200)",
        ),
        (
            "job:\n  script: 123\n".to_string(),
            ".gitlab-ci.yml:2: job.script: jobs:job:script config should be a string",
        ),
        ("job:\n  script: [1, {a: b}]\n".to_string(), ".gitlab-ci.yml:2: job.script: jobs:job:script config should be"),
        (
            "include: ../../../../../../../../../../etc/passwd\njob:\n  script: echo\n".to_string(),
            "is outside the project directory",
        ),
        (
            "a:\n  script: echo\n  needs: [b]\nb:\n  script: echo\n  needs: [a]\n".to_string(),
            ".gitlab-ci.yml:3: a.needs: needs form a cycle: a -> b -> a (jobs: a, b)",
        ),
    ];
    for (yaml, expected) in cases {
        let dir = project(&yaml);
        let started = std::time::Instant::now();
        let (code, out, err) = exec(dir.path(), &["--list"]);
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "{expected}: took {:?}", started.elapsed());
        assert_eq!(code, 1, "{expected}: {out}{err}");
        assert!(err.contains(expected) && !err.contains("panicked"), "want {expected:?} in:\n{err}");
    }
}

#[test]
fn artifacts_are_kept_locally_and_handed_to_dependants_and_caches_persist() {
    let dir = project(
        r#"
stages: [build, test]
build:
  stage: build
  script:
    - mkdir -p dist vendor
    - echo built > dist/app.txt
    - test -e vendor/lib.txt && echo "cache restored" || echo v > vendor/lib.txt
  artifacts:
    paths: [dist/]
    reports:
      junit: report.xml
  cache:
    key: deps
    paths: [vendor/]
test:
  stage: test
  needs: [build]
  script:
    - cat dist/app.txt
"#,
    );
    let (code, out, err) = exec(dir.path(), &["build"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let kept = dir.path().join(".runway/artifacts/build/artifacts.zip");
    assert!(kept.is_file(), "{out}");
    assert!(out.contains("Saved artifacts as \"archive\""), "{out}");
    assert!(out.contains("No files to upload"), "the junit report matched nothing: {out}");

    // The dependant gets build's archive before its script.
    std::fs::remove_dir_all(dir.path().join("dist")).expect("rm dist");
    let (code, out, err) = exec(dir.path(), &["test"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("Downloading artifacts for build"), "{out}");
    assert!(out.contains("\nbuilt\n"), "{out}");

    // A cache made by one run is restored by the next.
    std::fs::remove_dir_all(dir.path().join("vendor")).expect("rm vendor");
    let (code, out, err) = exec(dir.path(), &["build"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("Successfully extracted cache") && out.contains("cache restored"), "{out}");
}

/// `--terminal`: after the script, the job's shell in the job's directory with its
/// variables; here its standard input is a pipe, so it reads commands from it, then the job
/// finishes.
#[test]
fn terminal_opens_the_jobs_shell_after_the_script() {
    use std::io::Write;
    let dir = project("debug:\n  variables:\n    WHO: yaml\n  script:\n    - echo script-ran > from-script.txt\n");
    let mut child = Command::new(RUNWAY)
        .args(["exec", "--terminal", "--cwd"])
        .arg(dir.path())
        .arg("debug")
        .env_remove("NO_COLOR")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("runway exec runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"echo \"in-terminal-$((1+2)) who=$WHO dir=$(pwd) $(cat from-script.txt)\"\nexit\n")
        .expect("typed");
    let out = child.wait_with_output().expect("exits");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let line = format!("in-terminal-3 who=yaml dir={} script-ran", dir.path().display());
    assert!(stdout.contains(&line), "missing {line:?} in:\n{stdout}\n{stderr}");
    assert!(stdout.find(&line) < stdout.find("Job succeeded"), "the job waits for the shell:\n{stdout}");
    assert!(stderr.contains("a shell in the job's environment"), "{stderr}");

    let (code, _, err) = exec(dir.path(), &["--terminal", "--executor", "docker", "debug"]);
    assert_ne!(code, 0);
    assert!(err.contains("--terminal needs the shell executor"), "{err}");
}
