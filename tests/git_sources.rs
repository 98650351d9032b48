//! get_sources, GITLAB_ENV and variables end to end, as gitlab-runner does them: the fake
//! GitLab serving real git over smart HTTP and Git LFS (batch API, job-token auth), real
//! `git` and `git-lfs`, real bash through the shell plugin, the manager's pollers.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fake_gitlab::{FakeGitLab, JobRecord, JobSpec};
use runway::executor::ResolvedExecutor;
use runway::gitlab::client::{ClientOptions, GitLabClient, RunnerCredentials};
use runway::gitlab::retry::RetryPolicy;
use runway::job::JobEnvironment;
use runway::manager::{identity, Manager, ManagerSettings, RunnerSettings, Shutdown};
use runway::plugin::{builtin_plugins, HostSettings, PluginHost};
use runway::script::ScriptSettings;
use runway::trace::upload::UploadConfig;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);

/// The fake GitLab, one runner of it, the shell plugin and a builds directory.
struct World {
    fake: FakeGitLab,
    token: String,
    root: tempfile::TempDir,
    plugins: PluginHost,
}

async fn world() -> World {
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_millis(500), trace_update_interval: 1 })
            .await;
    let runner = fake.create_runner("git-sources test");
    let plugins = PluginHost::new(HostSettings {
        builtins: builtin_plugins(),
        // Compiled once for every test binary (keyed by plugin content and engine).
        cache_dir: Some(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")),
        ..HostSettings::default()
    })
    .await
    .expect("plugins");
    let w = World { fake, token: runner.token, root: tempfile::tempdir().expect("tempdir"), plugins };
    // What gitlab-runner's docs ask of a shell runner's host: Git LFS initialised for the
    // user jobs run as (its filters in that user's global config).
    let out = std::process::Command::new("git")
        .args(["lfs", "install", "--skip-repo"])
        .env("HOME", w.home())
        .output()
        .expect("git lfs (Debian git-lfs) is installed");
    assert!(out.status.success(), "git lfs install: {}", String::from_utf8_lossy(&out.stderr));
    w
}

impl World {
    fn builds_dir(&self) -> PathBuf {
        self.root.path().join("builds")
    }

    /// Where the shell runner checks `project` out (not shared: `<builds>/<project>`).
    fn project_dir(&self, project: &str) -> PathBuf {
        self.builds_dir().join(project)
    }

    /// A job's `HOME`: `git config --global` writes land in the test's directory.
    fn home(&self) -> PathBuf {
        let home = self.root.path().join("home");
        std::fs::create_dir_all(&home).expect("home");
        home
    }

    async fn runner(&self, tune: impl FnOnce(&mut ScriptSettings)) -> RunnerSettings {
        let executor = ResolvedExecutor::resolve(&self.plugins, "shell", "{}").await.expect("shell executor");
        let short_token: String = self.token.trim_start_matches("glrt-").chars().take(9).collect();
        let mut settings = ScriptSettings {
            builds_dir: self.builds_dir(),
            cache_dir: self.root.path().join("cache"),
            shared_builds_dir: false,
            short_token: short_token.clone(),
            executor: "shell".into(),
            shell: "bash".into(),
            runner_version: "0.1.0".into(),
            runner_revision: "test".into(),
            shared_environment: true,
            gitlab_url: self.fake.url(),
            environment: vec![format!("HOME={}", self.home().display())],
            ..ScriptSettings::default()
        };
        tune(&mut settings);
        RunnerSettings {
            client: None,
            credentials: RunnerCredentials {
                url: self.fake.url(),
                token: self.token.clone(),
                system_id: "s_0123456789ab".into(),
            },
            env: JobEnvironment {
                executor,
                settings,
                identity: identity("test runner", &short_token, "s_0123456789ab"),
                instance: None,
            },
            limit: 0,
            request_concurrency: 1,
            output_limit_kib: 4096,
            unhealthy_requests_limit: 3,
            unhealthy_interval: Duration::from_secs(3600),
            final_update_retry_limit: 10,
            strict_check_interval: false,
            fleet: None,
            store: None,
            labels: Default::default(),
        }
    }

    /// Runs the manager with `runner` until `jobs` are done (one at a time, in order).
    async fn run(&self, runner: RunnerSettings, jobs: Vec<serde_json::Value>) -> Vec<JobRecord> {
        let client = GitLabClient::new(ClientOptions {
            retry: RetryPolicy {
                backoff_base: Duration::from_millis(20),
                backoff_max: Duration::from_millis(200),
                ..RetryPolicy::default()
            },
            hook: None,
            ..ClientOptions::default()
        })
        .expect("client");
        let settings = ManagerSettings {
            concurrent: 1,
            check_interval: Duration::from_millis(200),
            shutdown_timeout: Duration::from_secs(10),
            pending_keepalive: Duration::from_millis(200),
            upload: UploadConfig {
                update_interval: Duration::from_millis(200),
                force_send_interval: Duration::from_secs(30),
                final_backoff_base: Duration::from_millis(50),
                final_backoff_max: Duration::from_millis(500),
                ..UploadConfig::default()
            },
            ..ManagerSettings::default()
        };
        let shutdown = Shutdown::default();
        let manager = Manager::new(settings, vec![runner], Arc::new(client), shutdown.clone());
        let running = tokio::spawn(manager.run());
        let mut done = Vec::new();
        for payload in jobs {
            let id = self.fake.enqueue(payload);
            let job = self
                .fake
                .wait_for_job_state(id, |j| j.final_state.is_some() && j.status.is_final(), WAIT)
                .await
                .unwrap_or_else(|| panic!("job {id} did not finish: {:?}", self.fake.job(id).map(|j| j.trace_text())));
            done.push(job);
        }
        shutdown.graceful.cancel();
        running.await.expect("manager stops");
        done
    }
}

fn succeeded(job: &JobRecord) -> String {
    let text = job.trace_text();
    assert_eq!(job.final_state.as_deref(), Some("success"), "{text}");
    text
}

/// The job token must not be in any git config of the checkout.
fn assert_no_token_in_git_configs(project_dir: &Path, token: &str) {
    let mut configs = vec![project_dir.join(".git/config")];
    let modules = project_dir.join(".git/modules");
    if modules.is_dir() {
        for entry in std::fs::read_dir(&modules).expect("modules") {
            configs.push(entry.expect("entry").path().join("config"));
        }
    }
    for config in configs {
        let text = std::fs::read_to_string(&config).unwrap_or_else(|e| panic!("{}: {e}", config.display()));
        assert!(!text.contains(token), "the job token is in {}:\n{text}", config.display());
        assert!(text.contains(".gitlab-runner.ext.conf"), "{} includes the external config:\n{text}", config.display());
    }
}

fn with_variable(mut payload: serde_json::Value, variable: serde_json::Value) -> serde_json::Value {
    payload["variables"].as_array_mut().expect("variables").push(variable);
    payload
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lfs_objects_are_pulled_with_the_job_token_and_the_token_stays_out_of_git_config() {
    let w = world().await;
    w.fake.create_repo("group/assets");
    w.fake.commit_files("group/assets", "main", &[("README.md", "assets\n")], "first");
    let model: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
    w.fake.commit_lfs_files("group/assets", "main", &[("model.bin", &model), ("notes.txt", b"large notes\n")], "lfs");
    let expected_sum = {
        use sha2::Digest;
        use std::fmt::Write;
        sha2::Sha256::digest(&model).iter().fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
    };

    let pulled = w.fake.job_payload(&JobSpec::new(
        "group/assets",
        "pull",
        &["cat notes.txt", "sha256sum model.bin", "git lfs ls-files"],
    ));
    let skipped = w.fake.job_payload(
        &JobSpec::new("group/assets", "skip", &["cat notes.txt"])
            .variable("GIT_LFS_SKIP_SMUDGE", "1")
            .variable("GIT_STRATEGY", "clone"),
    );
    let jobs = w.run(w.runner(|_| {}).await, vec![pulled, skipped]).await;

    let text = succeeded(&jobs[0]);
    assert!(text.contains("\nlarge notes\n"), "the LFS content, not the pointer:\n{text}");
    assert!(text.contains(&format!("{expected_sum}  model.bin")), "{text}");
    assert!(!text.contains("oid sha256:"), "{text}");
    let batches: Vec<_> = w
        .fake
        .requests_to("POST", "/group/assets.git/info/lfs/objects/batch")
        .into_iter()
        .filter(|r| r.status == 200)
        .collect();
    assert!(!batches.is_empty(), "git-lfs asked the batch API");
    assert!(batches.iter().all(|r| r.header("authorization").is_some_and(|a| a.starts_with("Basic "))));
    let downloads =
        w.fake.requests().into_iter().filter(|r| r.path.starts_with("/group/assets.git/gitlab-lfs/objects/")).count();
    assert!(downloads >= 2, "both objects downloaded");
    let job_token = jobs[0].token.clone();
    assert_no_token_in_git_configs(&w.project_dir("group/assets"), &job_token);

    // GIT_LFS_SKIP_SMUDGE set by the job: the pointer stays, as gitlab-runner leaves it.
    let text = succeeded(&jobs[1]);
    assert!(text.contains("version https://git-lfs.github.com/spec/v1") && text.contains("oid sha256:"), "{text}");
    assert_no_token_in_git_configs(&w.project_dir("group/assets"), &jobs[1].token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submodules_on_the_same_host_get_credentials_and_ssh_urls_are_forced_to_https() {
    let w = world().await;
    for (repo, content) in [("group/sub-http", "over http\n"), ("group/sub-ssh", "over ssh url\n")] {
        w.fake.create_repo(repo);
        w.fake.commit_files(repo, "main", &[("content.txt", content)], "sub");
    }
    let http_sha = w.fake.commit_files("group/sub-http", "main", &[("content.txt", "over http v2\n")], "v2");
    let ssh_sha = w.fake.commit_files("group/sub-ssh", "main", &[("content.txt", "over ssh url v2\n")], "v2");
    w.fake.create_repo("group/super");
    w.fake.commit_files("group/super", "main", &[("README.md", "super\n")], "first");
    // A private submodule by absolute URL on the same host, without credentials, and one
    // by the SSH form of the same host (rewritten to HTTPS with GIT_SUBMODULE_FORCE_HTTPS).
    let host = w.fake.url().trim_start_matches("http://").split(':').next().unwrap_or("").to_string();
    w.fake.commit_submodule(
        "group/super",
        "main",
        "sub-http",
        &format!("{}/group/sub-http.git", w.fake.url()),
        &http_sha,
    );
    w.fake.commit_submodule("group/super", "main", "sub-ssh", &format!("git@{host}:group/sub-ssh.git"), &ssh_sha);
    // commit_submodule writes the whole .gitmodules: list both.
    let gitmodules = format!(
        "[submodule \"sub-http\"]\n\tpath = sub-http\n\turl = {}/group/sub-http.git\n[submodule \"sub-ssh\"]\n\tpath = sub-ssh\n\turl = git@{host}:group/sub-ssh.git\n",
        w.fake.url()
    );
    w.fake.commit_files("group/super", "main", &[(".gitmodules", &gitmodules)], "both submodules");

    let job = w.fake.job_payload(
        &JobSpec::new(
            "group/super",
            "subs",
            &["cat sub-http/content.txt sub-ssh/content.txt", "git -C sub-http config --get-all include.path"],
        )
        .variable("GIT_SUBMODULE_STRATEGY", "recursive")
        .variable("GIT_SUBMODULE_FORCE_HTTPS", "true"),
    );
    let jobs = w.run(w.runner(|_| {}).await, vec![job]).await;
    let text = succeeded(&jobs[0]);
    assert!(text.contains("over http v2\nover ssh url v2\n"), "{text}");
    assert!(text.contains("Configuring submodules to use parent git credentials"), "{text}");
    assert_no_token_in_git_configs(&w.project_dir("group/super"), &jobs[0].token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_worktree_runs_between_get_sources_attempts_and_git_config_is_cleaned() {
    let w = world().await;
    w.fake.create_repo("group/project");
    w.fake.commit_files("group/project", "main", &[("README.md", "hello\n")], "first");
    let marker = w.root.path().join("failed-once");

    // Leaves an untracked file, a hook and a repository setting behind.
    let dirty = w.fake.job_payload(&JobSpec::new(
        "group/project",
        "dirty",
        &[
            "echo junk > junk.txt",
            "mkdir -p .git/hooks && echo 'exit 1' > .git/hooks/pre-commit",
            "git config user.name planted",
        ],
    ));
    // Its first get_sources attempt fails before the fetch; the retry follows clear_worktree.
    let mut retried = w.fake.job_payload(
        &JobSpec::new(
            "group/project",
            "retried",
            &[
                "test ! -e junk.txt && echo junk-gone",
                "test ! -e .git/hooks/pre-commit && echo hook-gone",
                "test -z \"$(git config user.name)\" && echo setting-gone",
                "git config --global --get-all safe.directory",
            ],
        )
        .variable("GET_SOURCES_ATTEMPTS", "2")
        .variable("GIT_CLEAN_FLAGS", "none"),
    );
    retried["hooks"] = json!([{
        "name": "pre_get_sources_script",
        "script": [format!("if [ ! -e '{0}' ]; then touch '{0}'; echo failing-first-attempt; exit 3; fi", marker.display())]
    }]);
    let first = w.run(w.runner(|_| {}).await, vec![dirty]).await;
    succeeded(&first[0]);
    let project = w.project_dir("group/project");
    assert!(project.join("junk.txt").exists() && project.join(".git/hooks/pre-commit").exists());

    let runner = w
        .runner(|s| {
            s.clean_git_config = Some(true);
            s.safe_directory_checkout = Some(true);
        })
        .await;
    let second = w.run(runner, vec![retried]).await;
    let text = succeeded(&second[0]);
    assert!(text.contains("failing-first-attempt"), "{text}");
    let clear = text.find("Deleting tracked and untracked files...").unwrap_or_else(|| panic!("{text}"));
    assert!(text.contains("section_start:") && text.contains(":clear_worktree"), "its own section:\n{text}");
    assert!(clear > text.find("failing-first-attempt").unwrap_or(usize::MAX), "{text}");
    for line in ["junk-gone", "hook-gone", "setting-gone"] {
        assert!(text.contains(&format!("\n{line}\n")), "{line}:\n{text}");
    }
    assert!(text.contains(&format!("\n{}\n", project.display())), "safe.directory is the project:\n{text}");
    let global = std::fs::read_to_string(w.home().join(".gitconfig")).expect("the job's global git config");
    assert!(global.contains(&format!("directory = {}", project.display())), "{global}");
    // clean_git_config also removes the config and hooks when the job ends.
    assert!(!project.join(".git/config").exists() && !project.join(".git/hooks").exists());
    assert!(project.join(".git/HEAD").exists() && project.join("README.md").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitlab_env_reaches_every_later_stage_and_variables_expand_like_gitlab() {
    let w = world().await;
    w.fake.create_repo("group/project");
    w.fake.commit_files("group/project", "main", &[("README.md", "hello\n")], "first");

    let mut job = w.fake.job_payload(
        &JobSpec::new(
            "group/project",
            "env",
            &[
                "echo \"from hook: $FROM_HOOK\"",
                "echo 'FROM_SCRIPT=script value with spaces' >> \"$GITLAB_ENV\"",
                "echo \"A=$A\"",
                "echo \"ESCAPED=$ESCAPED\"",
                "echo \"RAW=$RAW\"",
                "echo \"CONFIG_PATH=$CONFIG_PATH\"",
                "cat \"$CONFIG_PATH\"",
            ],
        )
        .after_script(&[
            "echo \"after: $FROM_HOOK / $FROM_SCRIPT\"",
            "test \"$GITLAB_ENV\" = \"$CI_PROJECT_DIR.tmp/gitlab_runner_env\" && echo env-file-in-tmp",
        ]),
    );
    job["hooks"] = json!([{ "name": "pre_get_sources_script", "script": ["echo FROM_HOOK=hook >> \"$GITLAB_ENV\""] }]);
    // References in any order and depth, `$$`, a raw variable and a file variable.
    for variable in [
        json!({"key": "A", "value": "a:$B", "public": true}),
        json!({"key": "B", "value": "b:${C}", "public": true}),
        json!({"key": "C", "value": "c:$CI_PROJECT_NAME", "public": true}),
        json!({"key": "ESCAPED", "value": "$$A-$A", "public": true}),
        json!({"key": "RAW", "value": "$A", "public": true, "raw": true}),
        json!({"key": "SETTINGS", "value": "file content $C", "public": true, "file": true}),
        json!({"key": "CONFIG_PATH", "value": "$SETTINGS", "public": true}),
    ] {
        job = with_variable(job, variable);
    }
    let cycle = with_variable(
        with_variable(
            w.fake.job_payload(&JobSpec::new("group/project", "cycle", &["echo never"])),
            json!({"key": "X", "value": "$Y", "public": true}),
        ),
        json!({"key": "Y", "value": "$X", "public": true}),
    );
    let jobs = w.run(w.runner(|_| {}).await, vec![job, cycle]).await;

    let text = succeeded(&jobs[0]);
    let tmp = format!("{}.tmp", w.project_dir("group/project").display());
    for line in [
        "from hook: hook".to_string(),
        "A=a:b:c:project".into(),
        "ESCAPED=$A-a:b:c:project".into(),
        "RAW=$A".into(),
        format!("CONFIG_PATH={tmp}/SETTINGS"),
        "file content c:project".into(),
        "after: hook / script value with spaces".into(),
        "env-file-in-tmp".into(),
    ] {
        assert!(text.contains(&format!("\n{line}\n")) || text.contains(&format!("\n{line}")), "{line:?}:\n{text}");
    }

    let text = jobs[1].trace_text();
    assert_eq!(jobs[1].final_state.as_deref(), Some("failed"), "{text}");
    assert!(text.contains("circular variable reference detected"), "{text}");
    assert!(!text.contains("\nnever"), "{text}");
}
