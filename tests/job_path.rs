//! The job path end to end: the fake GitLab, real git over smart HTTP, real bash through the
//! shell plugin, the manager's pollers, the trace uploader and two-phase commit.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fake_gitlab::{Endpoint, FakeGitLab, InjectedResponse, JobRecord, JobSpec, JobStatus};
use runway::executor::ResolvedExecutor;
use runway::gitlab::client::{ClientOptions, GitLabClient, RunnerCredentials};
use runway::gitlab::retry::RetryPolicy;
use runway::job::JobEnvironment;
use runway::manager::{identity, Manager, ManagerSettings, RunnerSettings, Shutdown};
use runway::plugin::{builtin_plugins, HostSettings, PluginHost};
use runway::script::ScriptSettings;
use runway::trace::upload::UploadConfig;

const WAIT: Duration = Duration::from_secs(60);

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
    let runner = fake.create_runner("job-path test");
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "hello\n"), ("data.txt", "v1\n")], "first");
    let plugins = PluginHost::new(HostSettings {
        builtins: builtin_plugins(),
        // Compiled once for every test binary (keyed by plugin content and engine).
        cache_dir: Some(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")),
        ..HostSettings::default()
    })
    .await
    .expect("plugins");
    World { fake, token: runner.token, root: tempfile::tempdir().expect("tempdir"), plugins }
}

impl World {
    async fn runner(&self, limit: usize, output_limit_kib: u64) -> RunnerSettings {
        let executor = ResolvedExecutor::resolve(&self.plugins, "shell", "{}").await.expect("shell executor");
        let short_token: String = self.token.trim_start_matches("glrt-").chars().take(9).collect();
        let settings = ScriptSettings {
            builds_dir: self.root.path().join("builds"),
            cache_dir: self.root.path().join("cache"),
            shared_builds_dir: true,
            short_token: short_token.clone(),
            executor: "shell".into(),
            shell: "bash".into(),
            runner_version: "0.1.0".into(),
            runner_revision: "test".into(),
            shared_environment: true,
            // The cache stages run this build's runway as their helper, as `runway run` does.
            runner_command: Some(env!("CARGO_BIN_EXE_runway").into()),
            gitlab_url: self.fake.url(),
            ..ScriptSettings::default()
        };
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
            limit,
            request_concurrency: 2,
            output_limit_kib,
            unhealthy_requests_limit: 3,
            unhealthy_interval: Duration::from_secs(3600),
            final_update_retry_limit: 10,
            strict_check_interval: false,
            fleet: None,
            store: None,
            labels: Default::default(),
        }
    }

    fn manager(&self, concurrent: usize, runner: RunnerSettings, shutdown: Shutdown) -> Manager {
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
            concurrent,
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
        Manager::new(settings, vec![runner], Arc::new(client), shutdown)
    }

    async fn finished(&self, id: i64) -> JobRecord {
        self.fake.wait_for_job_state(id, |j| j.final_state.is_some() && j.status.is_final(), WAIT).await.unwrap_or_else(
            || panic!("job {id} did not finish: {:?}", self.fake.job(id).map(|j| (j.status, j.trace_text()))),
        )
    }
}

fn assert_trace_consistent(job: &JobRecord) {
    assert_eq!(job.checksum.as_deref(), Some(job.trace_checksum().as_str()), "checksum of what the server stored");
    assert_eq!(job.bytesize, Some(job.trace.len() as u64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_clone_fetch_mask_and_run_after_script() {
    let w = world().await;
    let shutdown = Shutdown::default();
    let manager = w.manager(2, w.runner(0, 4096).await, shutdown.clone());
    let running = tokio::spawn(manager.run());

    let spec = JobSpec::new(
        "group/project",
        "build",
        &["cat data.txt", "echo \"secret is $MY_SECRET\"", "cat \"$MY_FILE\"", "echo token glpat-abcdefghij1234567890"],
    )
    .after_script(&["echo \"after with status $CI_JOB_STATUS\""])
    .masked_variable("MY_SECRET", "s3cr3t-v4lue-xyz");
    let mut payload = w.fake.job_payload(&spec);
    payload["variables"]
        .as_array_mut()
        .expect("variables")
        .push(serde_json::json!({"key": "MY_FILE", "value": "file content", "public": false, "file": true}));
    let first = w.fake.enqueue(payload);
    let job = w.finished(first).await;
    let text = job.trace_text();
    assert_eq!(job.final_state.as_deref(), Some("success"), "{text}");
    assert!(text.contains("v1\n"), "{text}");
    assert!(text.contains("secret is [MASKED]") && !text.contains("s3cr3t-v4lue-xyz"), "{text}");
    assert!(text.contains("file content"), "{text}");
    assert!(text.contains("glpat-[MASKED]") && !text.contains("abcdefghij1234567890"), "{text}");
    assert!(text.contains("after with status success"), "{text}");
    assert!(text.contains("section_start:") && text.contains(":step_script\r\x1b[0K"), "{text}");
    assert!(job.pending_keepalives <= 1000);
    assert_trace_consistent(&job);
    // FF_TIMESTAMPS (on by default): every line of the raw log starts with its time and stream,
    // `00` for the runner's own lines, `01` for what the job printed.
    let raw = job.raw_trace_text();
    let stamp = regex::Regex::new(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z 0[01]O[ +]").expect("regex");
    assert!(raw.lines().all(|l| stamp.is_match(l)), "{raw}");
    assert!(raw.lines().any(|l| l.contains(" 00O ") && l.contains("Running with runway")), "{raw}");
    assert!(raw.lines().any(|l| l.contains(" 01O secret is [MASKED]")), "{raw}");
    // FF_USE_GITALY_CORRELATION_ID (on by default): the clone carries the correlation ID
    // GitLab gave the job request, and the log names it.
    let clone = w.fake.requests().into_iter().find(|r| r.path.ends_with("/info/refs")).expect("a clone");
    let correlation = clone.header("x-gitaly-correlation-id").expect("correlation header").to_string();
    assert_eq!(correlation.len(), 32, "{correlation}");
    assert!(text.contains(&format!("Gitaly correlation ID: {correlation}")), "{text}");

    // A second job of the same project fetches into the same directory and sees the new commit.
    w.fake.commit_files("group/project", "main", &[("data.txt", "v2\n")], "second");
    let second = w.fake.enqueue(
        w.fake.job_payload(
            &JobSpec::new("group/project", "test", &["cat data.txt", "git log --oneline | wc -l"])
                .variable("GIT_STRATEGY", "fetch")
                .variable("FF_TIMESTAMPS", "false"),
        ),
    );
    let job = w.finished(second).await;
    let text = job.trace_text();
    assert_eq!(job.final_state.as_deref(), Some("success"), "{text}");
    assert!(text.contains("v2\n"), "{text}");
    assert_eq!(text, job.raw_trace_text(), "FF_TIMESTAMPS=false in the job: no timestamps");
    assert!(text.contains("Fetching changes") || text.contains("fetch"), "{text}");

    shutdown.graceful.cancel();
    running.await.expect("manager stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_timeouts_cancel_and_abort() {
    let w = world().await;
    let shutdown = Shutdown::default();
    let manager = w.manager(4, w.runner(0, 4096).await, shutdown.clone());
    let running = tokio::spawn(manager.run());

    let failing = w.fake.enqueue(w.fake.job_payload(&JobSpec::new(
        "group/project",
        "fail",
        &["echo before", "exit 42", "echo never"],
    )));
    let mut spec = JobSpec::new("group/project", "slow", &["sleep 30"]);
    spec.timeout = 2;
    let slow = w.fake.enqueue(w.fake.job_payload(&spec));
    let cancel_me = w.fake.enqueue(
        w.fake.job_payload(
            &JobSpec::new("group/project", "cancel", &["echo started", "sleep 60"])
                .after_script(&["echo after_script ran with $CI_JOB_STATUS"]),
        ),
    );
    // Besides its output (which the runner could no longer upload after the abort), the
    // after_script leaves a file behind, so running it cannot go unnoticed.
    let after_script_ran = w.root.path().join("abort-after-script-ran");
    let abort_me = w.fake.enqueue(
        w.fake.job_payload(
            &JobSpec::new("group/project", "abort", &["echo started", "sleep 60"])
                .after_script(&["echo after_script must not run", &format!("touch '{}'", after_script_ran.display())]),
        ),
    );

    let job = w.finished(failing).await;
    assert_eq!(
        (job.final_state.as_deref(), job.failure_reason.as_deref(), job.exit_code),
        (Some("failed"), Some("script_failure"), Some(42))
    );
    assert!(job.trace_text().contains("before") && !job.trace_text().contains("never"));
    assert!(job.trace_text().contains("ERROR: Job failed: exit code 42"), "{}", job.trace_text());

    let job = w.finished(slow).await;
    assert_eq!(job.failure_reason.as_deref(), Some("job_execution_timeout"), "{}", job.trace_text());

    for id in [cancel_me, abort_me] {
        w.fake.wait_for_job_state(id, |j| j.trace_text().contains("started"), WAIT).await.expect("job started");
    }
    w.fake.cancel(cancel_me);
    w.fake.force_cancel(abort_me);
    let job = w.finished(cancel_me).await;
    assert_eq!(job.status, JobStatus::Canceled);
    assert!(job.trace_text().contains("after_script ran with canceled"), "{}", job.trace_text());
    // The aborted job: no after_script, and its processes are gone (the job task ended). The
    // job task's last act is its final PUT (answered 403 now): once GitLab saw it, everything
    // the job was going to run has run.
    let path = format!("/api/v4/jobs/{abort_me}");
    let is_final = |r: &fake_gitlab::LoggedRequest| {
        r.method == "PUT"
            && r.path == path
            && r.json().is_some_and(|b| matches!(b["state"].as_str(), Some("success" | "failed")))
    };
    let last = w.fake.wait_for_request(is_final, WAIT).await.expect("the aborted job's task ends with a final PUT");
    assert_eq!(last.status, 403, "the job is no longer processing at GitLab");
    let job = w.fake.job(abort_me).expect("job");
    assert_eq!(job.status, JobStatus::Canceled);
    assert!(!job.trace_text().contains("after_script must not run"));
    assert!(!after_script_ran.exists(), "after_script ran after the abort");

    shutdown.graceful.cancel();
    running.await.expect("manager stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_survives_416_412_and_5xx_and_masks_across_patches() {
    let w = world().await;
    let shutdown = Shutdown::default();
    let manager = w.manager(1, w.runner(0, 2).await, shutdown.clone());
    let running = tokio::spawn(manager.run());

    // The secret is printed in two halves with a pause longer than the update interval, so
    // each half goes out in a different PATCH.
    let spec = JobSpec::new(
        "group/project",
        "mask",
        &[
            "printf 'split: %s' \"${MY_SECRET:0:6}\"; sleep 1.5; printf '%s\\n' \"${MY_SECRET:6}\"",
            "echo \"whole: $MY_SECRET\"",
            "head -c 5000 /dev/zero | tr '\\0' 'x'",
        ],
    )
    .masked_variable("MY_SECRET", "abcdef123456");
    w.fake.inject(Endpoint::PatchTrace, 2, InjectedResponse::status(502));
    w.fake.inject(Endpoint::UpdateJob, 1, InjectedResponse::status(500));
    w.fake.set_final_update_backoff(2);
    let id = w.fake.enqueue(w.fake.job_payload(&spec));
    // Once the job runs: one 416 that claims the server has nothing (the runner must resend
    // from 0 and then resync on the real 416 that overlap causes), and a 412 on the final
    // update (the runner must re-upload the whole trace).
    w.fake.wait_for_job_state(id, |j| j.trace_text().contains("split:"), WAIT).await.expect("job runs");
    w.fake.inject(Endpoint::PatchTrace, 1, InjectedResponse::status(416).header("Range", "0-0"));
    w.fake.inject(Endpoint::UpdateJob, 1, InjectedResponse::status(412));
    let job = w.finished(id).await;
    let text = job.trace_text();
    let from_zero = w
        .fake
        .requests_to("PATCH", &format!("/api/v4/jobs/{id}/trace"))
        .iter()
        .filter(|r| r.header("content-range").is_some_and(|c| c.starts_with("0-")))
        .count();
    assert!(from_zero >= 3, "expected re-uploads from offset 0 after 416 and 412, saw {from_zero}");
    assert!(!text.contains("abcdef123456"), "{text}");
    assert!(text.contains("split: [MASKED]\n") && text.contains("whole: [MASKED]"), "{text}");
    assert!(text.contains("Job's log exceeded limit of 2048 bytes."), "{text}");
    assert_trace_consistent(&job);
    assert!(job.patches.len() >= 2);

    shutdown.graceful.cancel();
    running.await.expect("manager stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_4_with_8_jobs_never_runs_more_than_4() {
    let w = world().await;
    let shutdown = Shutdown::default();
    let mut runner = w.runner(0, 4096).await;
    runner.request_concurrency = 4;
    let manager = w.manager(4, runner, shutdown.clone());
    let stats = manager.stats();
    let running = tokio::spawn(manager.run());
    let ids: Vec<i64> = (0..8)
        .map(|i| w.fake.enqueue(w.fake.job_payload(&JobSpec::new("group/project", &format!("job{i}"), &["sleep 1"]))))
        .collect();
    for id in ids {
        let job = w.finished(id).await;
        assert_eq!(job.final_state.as_deref(), Some("success"), "{}", job.trace_text());
    }
    let max = stats.max_running.load(std::sync::atomic::Ordering::SeqCst);
    assert!(max <= 4, "{max} jobs ran at once");
    assert!(max >= 2, "jobs did not run in parallel at all ({max})");
    shutdown.graceful.cancel();
    running.await.expect("manager stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_payload_fails_that_job_and_polling_goes_on() {
    let w = world().await;
    let shutdown = Shutdown::default();
    let manager = w.manager(1, w.runner(0, 4096).await, shutdown.clone());
    let running = tokio::spawn(manager.run());
    let mut bad = w.fake.job_payload(&JobSpec::new("group/project", "bad", &["true"]));
    bad["steps"][0]["script"] = serde_json::json!("not a list");
    let bad_id = w.fake.enqueue(bad);
    let mut missing = w.fake.job_payload(&JobSpec::new("group/project", "missing", &["true"]));
    missing.as_object_mut().expect("object").remove("steps");
    let missing_id = w.fake.enqueue(missing);
    let good = w.fake.enqueue(w.fake.job_payload(&JobSpec::new("group/project", "good", &["echo fine"])));
    for id in [bad_id, missing_id] {
        let job = w.finished(id).await;
        assert_eq!(job.failure_reason.as_deref(), Some("runner_system_failure"), "{}", job.trace_text());
        assert!(job.trace_text().contains("invalid job payload"), "{}", job.trace_text());
    }
    assert_eq!(w.finished(good).await.final_state.as_deref(), Some("success"));
    shutdown.graceful.cancel();
    running.await.expect("manager stops");
}

#[allow(dead_code)]
fn unused(_: &Path, _: BTreeMap<String, String>) {}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_cache_submodules_and_strategies() {
    let w = world().await;
    // A submodule served by the same fake, referenced relative to the project.
    w.fake.create_repo("group/lib");
    w.fake.commit_files("group/lib", "main", &[("lib.txt", "library\n")], "lib");
    let lib_sha = w.fake.commit_files("group/lib", "main", &[("lib.txt", "library v2\n")], "lib v2");
    w.fake.commit_files_raw(
        "group/project",
        "main",
        &[(".gitmodules", b"[submodule \"lib\"]\n\tpath = lib\n\turl = ../lib.git\n", false)],
        "add submodule config",
    );
    // Record the gitlink with plain git in the bare repository.
    let repo = w.fake.repo_path("group/project");
    let work = w.root.path().join("seed");
    let git = |dir: &Path, args: &[&str]| {
        let out = std::process::Command::new("git").arg("-C").arg(dir).args(args).output().expect("git");
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    git(w.root.path(), &["clone", "-q", repo.to_str().expect("utf8"), work.to_str().expect("utf8")]);
    git(&work, &["update-index", "--add", "--cacheinfo", &format!("160000,{lib_sha},lib")]);
    git(&work, &["-c", "user.email=t@e", "-c", "user.name=t", "commit", "-q", "-m", "gitlink"]);
    git(&work, &["push", "-q", "origin", "HEAD:main"]);

    let shutdown = Shutdown::default();
    let mut runner = w.runner(0, 4096).await;
    runner.env.settings.pre_get_sources_script = Some("echo config-pre-get-sources".into());
    runner.env.settings.post_build_script = Some("echo config-post-build".into());
    runner.env.settings.environment = vec!["FROM_CONFIG=cfg".into()];
    let manager = w.manager(1, runner, shutdown.clone());
    let running = tokio::spawn(manager.run());

    let with_cache = |name: &str, script: &[&str]| {
        let mut payload = w
            .fake
            .job_payload(&JobSpec::new("group/project", name, script).variable("GIT_SUBMODULE_STRATEGY", "normal"));
        payload["cache"] = serde_json::json!([{"key": "deps-$CI_COMMIT_REF_NAME", "paths": ["vendor/"], "policy": "pull-push", "when": "on_success"}]);
        payload
    };
    let first = w.fake.enqueue(with_cache(
        "fill",
        &["cat lib/lib.txt", "echo \"env $FROM_CONFIG\"", "mkdir -p vendor && echo cached-bytes > vendor/dep.txt"],
    ));
    let job = w.finished(first).await;
    let text = job.trace_text();
    assert_eq!(job.final_state.as_deref(), Some("success"), "{text}");
    let order = ["config-pre-get-sources", "library v2", "env cfg", "config-post-build", "Created cache"];
    let positions: Vec<usize> =
        order.iter().map(|s| text.find(s).unwrap_or_else(|| panic!("{s:?} missing:\n{text}"))).collect();
    assert!(positions.windows(2).all(|p| p[0] < p[1]), "out of order: {positions:?}\n{text}");

    // A clone starts from nothing; the cache brings vendor/ back.
    let second = w.fake.enqueue({
        let mut p = with_cache("use", &["cat vendor/dep.txt"]);
        p["variables"]
            .as_array_mut()
            .expect("vars")
            .push(serde_json::json!({"key": "GIT_STRATEGY", "value": "clone", "public": true}));
        p
    });
    let job = w.finished(second).await;
    assert!(
        job.trace_text().contains("Successfully extracted cache") && job.trace_text().contains("cached-bytes"),
        "{}",
        job.trace_text()
    );

    // GIT_STRATEGY=empty: no sources at all; GIT_CHECKOUT=false: fetched but not checked out.
    let empty =
        w.fake.enqueue(w.fake.job_payload(
            &JobSpec::new("group/project", "empty", &["ls -A | wc -l"]).variable("GIT_STRATEGY", "empty"),
        ));
    let job = w.finished(empty).await;
    assert!(
        job.trace_text().contains("creating an empty build directory") && job.trace_text().contains("\n0\n"),
        "{}",
        job.trace_text()
    );
    let no_checkout = w.fake.enqueue(
        w.fake.job_payload(
            &JobSpec::new("group/project", "nocheckout", &["test ! -e README.md && echo no-worktree"])
                .variable("GIT_CHECKOUT", "false")
                .variable("GIT_STRATEGY", "clone"),
        ),
    );
    let job = w.finished(no_checkout).await;
    assert!(
        job.trace_text().contains("Skipping Git checkout") && job.trace_text().contains("no-worktree"),
        "{}",
        job.trace_text()
    );

    shutdown.graceful.cancel();
    running.await.expect("manager stops");
}
