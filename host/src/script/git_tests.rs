use std::path::PathBuf;

use super::*;
use crate::payload::{JobResponse, JobVariable};
use crate::script::{BuildStage, ScriptSettings};

fn plan(vars: &[(&str, &str)], tune: impl FnOnce(&mut ScriptSettings)) -> JobPlan {
    let mut job: JobResponse =
        serde_json::from_str(include_str!("../../../tests/fixtures/job-response-example.json")).expect("fixture");
    job.token = "tok3n".into();
    job.git_info.repo_url = "https://gitlab-ci-token:tok3n@gitlab.example.com/group/project.git".into();
    job.variables.extend(vars.iter().map(|(k, v)| JobVariable::public(k, v)));
    let mut settings = ScriptSettings {
        builds_dir: PathBuf::from("/builds"),
        cache_dir: PathBuf::from("/cache"),
        executor: "shell".into(),
        gitlab_url: "https://gitlab.example.com/".into(),
        ..ScriptSettings::default()
    };
    tune(&mut settings);
    JobPlan::new(&job, &settings).expect("plan")
}

#[test]
fn the_remote_has_no_token_and_the_rewrites_carry_it_for_the_repo_and_its_host() {
    let p = plan(&[], |_| {});
    assert_eq!(p.remote_url(), "https://gitlab.example.com/group/project.git");
    assert_eq!(
        p.instead_ofs(),
        vec![
            (
                "https://gitlab-ci-token:tok3n@gitlab.example.com/group/project.git".to_string(),
                "https://gitlab.example.com/group/project.git".to_string()
            ),
            ("https://gitlab-ci-token:tok3n@gitlab.example.com".to_string(), "https://gitlab.example.com".to_string()),
        ],
        "the repository's host is the runner's url: one rewrite for both"
    );
    let script = p.get_sources();
    assert!(script.contains("git remote add origin 'https://gitlab.example.com/group/project.git'"), "{script}");
    let ext = format!("git config --file '{}/.gitlab-runner.ext.conf' ", p.tmp_dir().display());
    for line in script.lines().filter(|l| l.contains("tok3n")) {
        assert!(
            line.starts_with(&ext) && line.contains("insteadOf"),
            "the token only goes to the external config: {line}"
        );
    }
}

#[test]
fn clone_url_and_forced_https_for_ssh_submodules() {
    let p = plan(
        &[
            ("GIT_SUBMODULE_FORCE_HTTPS", "true"),
            ("CI_PROJECT_PATH", "group/project"),
            ("CI_SERVER_HOST", "gitlab.example.com"),
            ("CI_SERVER_SHELL_SSH_PORT", "2222"),
        ],
        |s| s.clone_url = Some("http://mirror.internal:8080/git".into()),
    );
    assert_eq!(p.remote_url(), "http://mirror.internal:8080/git/group/project.git");
    let rewrites = p.instead_ofs();
    let authed = "http://gitlab-ci-token:tok3n@mirror.internal:8080/git".to_string();
    assert!(rewrites.contains(&(authed.clone(), "http://mirror.internal:8080/git".into())), "{rewrites:?}");
    assert!(rewrites.contains(&(authed, "ssh://git@gitlab.example.com:2222".into())), "{rewrites:?}");
    assert!(
        rewrites.contains(&(
            "https://gitlab-ci-token:tok3n@gitlab.example.com".into(),
            "https://gitlab.example.com".into()
        )),
        "the repository's own host too: {rewrites:?}"
    );

    let p = plan(&[("GIT_SUBMODULE_FORCE_HTTPS", "1"), ("CI_SERVER_HOST", "gitlab.example.com")], |_| {});
    let rewrites = p.instead_ofs();
    let authed = "https://gitlab-ci-token:tok3n@gitlab.example.com".to_string();
    assert!(rewrites.contains(&(format!("{authed}/"), "git@gitlab.example.com:".into())), "{rewrites:?}");
    assert!(rewrites.contains(&(authed, "ssh://git@gitlab.example.com".into())), "{rewrites:?}");
}

#[test]
fn defaults_of_clean_git_config_and_safe_directory_follow_the_executor() {
    assert!(!plan(&[], |_| {}).clean_git_config(), "off for shell");
    assert!(!plan(&[], |_| {}).safe_directory_checkout());
    let docker = |s: &mut ScriptSettings| s.executor = "docker".into();
    assert!(plan(&[], docker).clean_git_config());
    assert!(plan(&[], docker).safe_directory_checkout());
    assert!(!plan(&[("GIT_STRATEGY", "none")], docker).clean_git_config(), "off for GIT_STRATEGY none");
    assert!(plan(&[("GIT_STRATEGY", "none")], |s| s.clean_git_config = Some(true)).clean_git_config(), "config wins");
    assert!(!plan(&[], |s| {
        s.executor = "docker".into();
        s.safe_directory_checkout = Some(false);
    })
    .safe_directory_checkout());
}

#[test]
fn lfs_pull_unless_the_job_skips_smudging() {
    let script = plan(&[], |_| {}).script(&BuildStage::GetSources, "running").expect("script");
    assert!(script.contains("export GIT_LFS_SKIP_SMUDGE=1") && script.contains("git lfs pull"), "{script}");
    let script =
        plan(&[("GIT_LFS_SKIP_SMUDGE", "true")], |_| {}).script(&BuildStage::GetSources, "running").expect("script");
    assert!(!script.contains("git lfs pull"), "{script}");
}

#[test]
fn go_booleans() {
    for yes in ["1", "t", "T", "TRUE", "true", "True"] {
        assert_eq!(crate::payload::flags::parse_bool(yes), Some(true));
    }
    for no in ["0", "f", "F", "FALSE", "false", "False"] {
        assert_eq!(crate::payload::flags::parse_bool(no), Some(false));
    }
    assert_eq!(crate::payload::flags::parse_bool("yes"), None);
}

#[test]
fn the_token_is_rejected_at_cleanup_only_when_git_was_given_it() {
    let cleanup = |strategy: &str| plan(&[("GIT_STRATEGY", strategy)], |_| {}).git_cleanup_stage();
    for strategy in ["fetch", "clone"] {
        let script = cleanup(strategy);
        assert!(script.contains("| git credential reject"), "{strategy}: {script}");
        assert!(script.contains("'https://gitlab.example.com' gitlab-ci-token"), "{strategy}: {script}");
    }
    for strategy in ["none", "empty"] {
        assert!(!cleanup(strategy).contains("credential"), "{strategy}: no git process for a token never given");
    }
}

#[test]
fn the_prepare_stage_names_the_machine_as_hostname_does_without_starting_it() {
    let script = plan(&[], |_| {}).script(&BuildStage::PrepareScript, "running").expect("script");
    let lines: String = script.lines().filter(|l| l.contains("RUNWAY_MACHINE")).map(|l| format!("{l}\n")).collect();
    assert!(!lines.contains("$(hostname") || lines.contains("|| RUNWAY_MACHINE=$(hostname"), "{lines}");
    let out = std::process::Command::new("bash").args(["-c", &lines]).output().expect("bash");
    let name = std::process::Command::new("hostname").output().expect("hostname");
    let expected = format!("Running on {}...\n", String::from_utf8_lossy(&name.stdout).trim());
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
}
