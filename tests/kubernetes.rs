//! The `kubernetes` executor end to end (issue 31): `runway run` as a real process takes jobs
//! from the fake GitLab and runs each in a pod on `fake-kube` (tests/fake-kube: a Kubernetes
//! API server and kubelet on the shared test dockerd, started by PID; its pods share the node's
//! network, the fake's stand-in for a CNI, so the helper reaches the fake GitLab on 127.0.0.1).
//!
//! Runway's helper image is written by `runway helper-image` and `docker import`ed into the
//! engine, as an administrator would push it to the cluster's registry. Every test works in a
//! namespace of its own, and checks that no pod, secret or container is left after its jobs;
//! every object Runway sent is checked against the official Kubernetes models
//! (tests/support/kube_models.py, PyPI `kubernetes`).

#[path = "support/dockerd.rs"]
mod dockerd;
#[path = "support/fake_kube.rs"]
mod fake_kube;
#[path = "support/redis_server.rs"]
mod redis_server;
#[path = "support/runway_process.rs"]
mod runway_process;
#[path = "support/wait.rs"]
mod wait;
#[path = "support/workhorse.rs"]
mod workhorse;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicI64, AtomicU16, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use fake_gitlab::{FakeGitLab, JobRecord, JobSpec, JobStatus};
use fake_kube::Kube;
use redis_server::RedisServer;
use runway_process::RunwayProcess;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(180);

/// Job ids of each test start here, apart from other tests'.
static NEXT_BASE: AtomicI64 = AtomicI64::new(0);
/// Service ports: pods share the node's network, so every service of every test listens on
/// its own port.
static NEXT_PORT: AtomicU16 = AtomicU16::new(0);

fn job_id_base() -> i64 {
    300_000 + (std::process::id() as i64 % 1000) * 10_000 + NEXT_BASE.fetch_add(100, Ordering::SeqCst)
}

fn service_port() -> u16 {
    20_000 + (std::process::id() % 200) as u16 * 100 + NEXT_PORT.fetch_add(1, Ordering::SeqCst)
}

/// Runway's helper image in the engine the kubelet pulls from (`runway helper-image`, then
/// `docker import`): its reference.
fn helper_image(kube: &Kube) -> &'static str {
    static HELPER: OnceLock<String> = OnceLock::new();
    HELPER.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let tar = dir.path().join("helper.tar");
        let out = Command::new(env!("CARGO_BIN_EXE_runway"))
            .args(["helper-image", "--output"])
            .arg(&tar)
            .output()
            .expect("runway helper-image runs");
        assert!(out.status.success(), "runway helper-image: {}", String::from_utf8_lossy(&out.stderr));
        let reference = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let imported =
            kube.docker.docker_cmd().arg("import").arg(&tar).arg(&reference).output().expect("docker import runs");
        assert!(imported.status.success(), "docker import: {}", String::from_utf8_lossy(&imported.stderr));
        reference
    })
}

/// A fake GitLab with a project and a runner, the shared fake-kube, a namespace.
struct World {
    fake: FakeGitLab,
    token: String,
    root: tempfile::TempDir,
    kube: &'static Kube,
    namespace: String,
}

async fn world(name: &str) -> World {
    let kube = tokio::task::spawn_blocking(fake_kube::kube).await.expect("fake-kube");
    let namespace = tokio::task::block_in_place(|| {
        helper_image(kube);
        kube.docker.service_image();
        kube.namespace(name)
    });
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(1), trace_update_interval: 1 })
            .await;
    fake.set_next_job_id(job_id_base());
    let runner = fake.create_runner("kubernetes test");
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "hello from the repository\n")], "first");
    World { fake, token: runner.token, root: tempfile::tempdir().expect("tempdir"), kube, namespace }
}

impl World {
    /// A manager whose runner runs jobs on fake-kube in the world's namespace; `kubernetes`
    /// lines go into `[runners.kubernetes]`, `tail` after it.
    fn manager(&self, name: &str, kubernetes: &str, tail: &str) -> RunwayProcess {
        let dir = self.root.path().join(name);
        std::fs::create_dir_all(&dir).expect("manager dir");
        let ca = dir.join("kube-ca.pem");
        std::fs::write(&ca, &self.kube.ca_pem).expect("CA file");
        let config = format!(
            r#"concurrent = 4
check_interval = 1
shutdown_timeout = 5

[[runners]]
name = "{name}"
url = "{url}"
token = "{token}"
executor = "kubernetes"
  [runners.kubernetes]
  host = "{server}"
  bearer_token = "{kube_token}"
  ca_file = "{ca}"
  namespace = "{namespace}"
  image = "{image}"
  helper_image = "{helper}"
  pull_policy = "if-not-present"
  poll_interval = 1
{poll_timeout}{kubernetes}
{tail}
"#,
            url = self.fake.url(),
            token = self.token,
            server = self.kube.server,
            kube_token = self.kube.token,
            ca = ca.display(),
            namespace = self.namespace,
            image = self.kube.docker.job_image(),
            helper = helper_image(self.kube),
            poll_timeout = if kubernetes.contains("poll_timeout") { "" } else { "  poll_timeout = 60\n" },
        );
        std::fs::write(dir.join("config.toml"), config).expect("config");
        RunwayProcess::new(dir).quit_on_drop()
    }

    fn job(&self, name: &str, script: &[&str]) -> JobSpec {
        JobSpec::new("group/project", name, script)
    }

    fn enqueue(&self, spec: JobSpec, edit: impl FnOnce(&mut Value)) -> i64 {
        let mut payload = self.fake.job_payload(&spec);
        edit(&mut payload);
        self.fake.enqueue(payload)
    }

    async fn wait_for(
        &self,
        job: i64,
        what: &str,
        manager: &RunwayProcess,
        f: impl Fn(&JobRecord) -> bool,
    ) -> JobRecord {
        match self.fake.wait_for_job_state(job, f, WAIT).await {
            Some(record) => record,
            None => panic!(
                "job {job}: {what} did not happen; trace:\n{}\nrunway log:\n{}\nfake-kube log (tail):\n{}",
                self.fake.job(job).map(|j| j.trace_text()).unwrap_or_default(),
                manager.log(),
                tail(&self.kube.log(), 60)
            ),
        }
    }

    async fn finished(&self, job: i64, manager: &RunwayProcess) -> JobRecord {
        self.wait_for(job, "the final update", manager, |j| j.final_state.is_some()).await
    }

    /// Pods and secrets left in the namespace, and containers fake-kube made for its pods.
    fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        for kind in ["pods", "secrets"] {
            let (status, list) =
                self.kube.call_blocking("GET", &format!("/api/v1/namespaces/{}/{kind}", self.namespace), None);
            assert_eq!(status, 200, "{list}");
            for item in list["items"].as_array().into_iter().flatten() {
                left.push(format!("{kind}/{}", item["metadata"]["name"].as_str().unwrap_or_default()));
            }
        }
        left.extend(self.kube.containers_of_namespace(&self.namespace));
        left
    }

    /// Wait until the namespace holds nothing of the jobs (deletion takes the grace period).
    async fn assert_nothing_left(&self, manager: &RunwayProcess) {
        let mut last = Vec::new();
        for _ in 0..600 {
            last = tokio::task::block_in_place(|| self.leftovers());
            if last.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "left after the jobs: {last:?}\nrunway log:\n{}\nfake-kube log:\n{}",
            manager.log(),
            tail(&self.kube.log(), 40)
        );
    }

    /// Every object the runner sent to the API in this namespace, checked against the
    /// official Kubernetes models.
    fn assert_objects_pass_the_models(&self) {
        let sent = self.kube.objects_sent(&self.namespace);
        assert!(!sent.is_empty(), "no object was sent in namespace {}", self.namespace);
        let (code, stderr) = fake_kube::check_models(&Value::Array(sent));
        assert_eq!(code, Some(0), "the official models refuse what Runway sent:\n{stderr}");
    }

    /// The name of the pod of `job` now in the namespace (by Runway's `runway/job` label).
    fn pod_of(&self, job: i64) -> String {
        let path = format!("/api/v1/namespaces/{}/pods?labelSelector=runway%2Fjob%3D{job}", self.namespace);
        let (status, list) = self.kube.call_blocking("GET", &path, None);
        assert_eq!(status, 200, "{list}");
        list["items"][0]["metadata"]["name"]
            .as_str()
            .unwrap_or_else(|| panic!("no pod of job {job}: {list}"))
            .to_string()
    }

    /// The pod spec the runner created for `job` (from what fake-kube received).
    fn pod_sent_for(&self, job: i64) -> Value {
        self.kube
            .objects_sent(&self.namespace)
            .into_iter()
            .find(|o| {
                o["kind"] == "Pod"
                    && o["metadata"]["labels"]
                        .as_object()
                        .is_some_and(|l| l.values().any(|v| v == &json!(job.to_string())))
            })
            .unwrap_or_else(|| panic!("no pod of job {job} was sent"))
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn assert_state(record: &JobRecord, want: JobStatus, manager: &RunwayProcess) {
    assert_eq!(record.status, want, "trace:\n{}\nrunway log:\n{}", record.trace_text(), manager.log());
}

fn service(image: &str, alias: &str, port: u16) -> Value {
    json!({ "name": image, "alias": alias, "entrypoint": null, "command": ["nc", "-lk", port.to_string()] })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_in_a_pod_with_two_services_reachable_by_alias_and_nothing_is_left() {
    let w = world("pod").await;
    let mut manager = w.manager("pod", "", "");
    manager.start();
    let (a, b) = (service_port(), service_port());
    // A service listens a moment after its container starts: try for up to ten seconds.
    let reach = |alias: &str, port: u16| {
        format!(
            "for i in $(seq 100); do nc -z -w 1 {alias} {port} && break; sleep 0.1; done; nc -z -w 1 {alias} {port}"
        )
    };
    let script =
        format!("cat README.md && {} && {} && echo both-services-reachable", reach("svc-a", a), reach("svc-b", b));
    let image = w.kube.docker.service_image();
    let job = w.enqueue(w.job("pod", &[&script]), |p| {
        p["services"] = json!([service(image, "svc-a", a), service(image, "svc-b", b)]);
    });
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    let trace = record.trace_text();
    assert!(trace.contains("hello from the repository"), "the helper cloned the project: {trace}");
    assert!(trace.contains("both-services-reachable"), "{trace}");
    assert!(trace.contains(&format!("Using Kubernetes namespace: {}", w.namespace)), "{trace}");
    w.assert_nothing_left(&manager).await;
    w.assert_objects_pass_the_models();
    let pod = w.pod_sent_for(job);
    let containers: Vec<&str> =
        pod["spec"]["containers"].as_array().expect("containers").iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(containers, ["build", "helper", "svc-0", "svc-1"], "{pod:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifacts_a_cache_and_a_dependency_pass_between_jobs() {
    let w = world("artifacts").await;
    let cache_dir = w.root.path().join("node-cache");
    std::fs::create_dir_all(&cache_dir).expect("cache dir");
    let volume = format!(
        "  [[runners.kubernetes.volumes.host_path]]\n  name = \"cache\"\n  host_path = \"{}\"\n  mount_path = \"/cache\"",
        cache_dir.display()
    );
    let mut manager = w.manager("artifacts", &volume, "");
    manager.start();
    let first = w
        .job(
            "build",
            &[
                "mkdir -p out vendor",
                "echo built-by-the-first-job > out/result.txt",
                "echo cached-by-the-first-job > vendor/lib.txt",
            ],
        )
        .artifacts(json!({ "paths": ["out/"] }))
        .cache(json!({ "key": "deps", "paths": ["vendor/"] }));
    let first = w.enqueue(first, |_| {});
    let record = w.finished(first, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    assert!(!w.fake.artifacts(first).is_empty(), "artifacts were uploaded: {}", record.trace_text());
    let second = w
        .job("test", &["cat out/result.txt", "cat vendor/lib.txt"])
        .dependency(first)
        .cache(json!({ "key": "deps", "paths": ["vendor/"], "policy": "pull" }));
    let second = w.enqueue(second, |_| {});
    let record = w.finished(second, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    let trace = record.trace_text();
    assert!(trace.contains("built-by-the-first-job"), "the dependency's artifacts: {trace}");
    assert!(trace.contains("cached-by-the-first-job"), "the cache: {trace}");
    w.assert_nothing_left(&manager).await;
    w.assert_objects_pass_the_models();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overwrites_within_the_limits_are_honoured_and_beyond_them_refused() {
    let w = world("overwrites").await;
    let limits = "  cpu_limit = \"1\"\n  cpu_limit_overwrite_max_allowed = \"2\"\n  memory_request_overwrite_max_allowed = \"1Gi\"\n  pod_labels_overwrite_allowed = \"team.*\"";
    let mut manager = w.manager("overwrites", limits, "");
    manager.start();
    let within = w
        .job("within", &["echo within-the-limits"])
        .variable("GIT_STRATEGY", "none")
        .variable("KUBERNETES_CPU_LIMIT", "1500m")
        .variable("KUBERNETES_MEMORY_REQUEST", "256Mi")
        .variable("KUBERNETES_POD_LABELS_1", "team=runners");
    let within = w.enqueue(within, |_| {});
    let record = w.finished(within, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    let pod = w.pod_sent_for(within);
    let build = pod["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .find(|c| c["name"] == "build")
        .expect("build")
        .clone();
    assert_eq!(build["resources"]["limits"]["cpu"], "1500m", "{pod:#}");
    assert_eq!(build["resources"]["requests"]["memory"], "256Mi", "{pod:#}");
    assert_eq!(pod["metadata"]["labels"]["team"], "runners", "{pod:#}");

    let beyond =
        w.job("beyond", &["echo must-not-run"]).variable("GIT_STRATEGY", "none").variable("KUBERNETES_CPU_LIMIT", "3");
    let beyond = w.enqueue(beyond, |_| {});
    let record = w.finished(beyond, &manager).await;
    assert_state(&record, JobStatus::Failed, &manager);
    let trace = record.trace_text();
    assert!(!trace.contains("must-not-run\n"), "{trace}");
    assert!(
        trace.contains("KUBERNETES_CPU_LIMIT") || trace.contains("cpu_limit_overwrite_max_allowed"),
        "the refusal names the overwrite: {trace}"
    );
    assert!(
        w.kube.objects_sent(&w.namespace).iter().all(|o| o["metadata"]["labels"]
            .as_object()
            .is_none_or(|l| !l.values().any(|v| v == &json!(beyond.to_string())))),
        "no pod was created for the refused job"
    );
    w.assert_nothing_left(&manager).await;
    w.assert_objects_pass_the_models();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_timeout_delete_the_pod() {
    let w = world("cancel").await;
    let mut manager = w.manager("cancel", "", "");
    manager.start();
    let job = w.enqueue(
        w.job("cancel", &["echo started-the-long-stage", "sleep 300"]).variable("GIT_STRATEGY", "none"),
        |_| {},
    );
    w.wait_for(job, "the stage starting", &manager, |j| j.trace_text().contains("started-the-long-stage")).await;
    assert!(!tokio::task::block_in_place(|| w.leftovers()).is_empty(), "the job's pod runs");
    w.fake.cancel(job);
    let record = w.wait_for(job, "the cancel", &manager, |j| j.status.is_final()).await;
    assert_state(&record, JobStatus::Canceled, &manager);
    w.assert_nothing_left(&manager).await;

    let mut spec = w.job("timeout", &["echo started-sleeping", "sleep 300"]).variable("GIT_STRATEGY", "none");
    spec.timeout = 8;
    let job = w.enqueue(spec, |_| {});
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Failed, &manager);
    assert_eq!(record.failure_reason.as_deref(), Some("job_execution_timeout"), "{}", record.trace_text());
    w.assert_nothing_left(&manager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_that_cannot_be_pulled_fails_with_the_kubelets_reason() {
    let w = world("pull").await;
    let mut manager = w.manager("pull", "", "");
    manager.start();
    let mut spec = w.job("pull", &["echo must-not-run"]).variable("GIT_STRATEGY", "none");
    spec.image = Some("127.0.0.1:1/runway-test/missing:1".into());
    let job = w.enqueue(spec, |_| {});
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Failed, &manager);
    assert_eq!(record.failure_reason.as_deref(), Some("runner_system_failure"), "{}", record.trace_text());
    let trace = record.trace_text();
    assert!(trace.contains("ErrImagePull") || trace.contains("ImagePullBackOff"), "{trace}");
    w.assert_nothing_left(&manager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_never_schedules_fails_after_poll_timeout_with_its_events() {
    let w = world("unschedulable").await;
    w.kube.keep_unschedulable(&w.namespace, 600);
    let mut manager = w.manager("unschedulable", "  poll_timeout = 4", "");
    manager.start();
    let job = w.enqueue(w.job("never", &["echo must-not-run"]).variable("GIT_STRATEGY", "none"), |_| {});
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Failed, &manager);
    let trace = record.trace_text();
    assert!(trace.contains("timed out waiting for pod"), "{trace}");
    assert!(trace.contains("FailedScheduling"), "the pod's events are in the trace: {trace}");
    assert!(trace.contains("Unschedulable"), "{trace}");
    w.assert_nothing_left(&manager).await;
}

/// `[[runners.kubernetes.pod_spec]]` with `FF_USE_ADVANCED_POD_SPEC_CONFIGURATION`: a
/// strategic patch (an env var merged into `build` by name), a JSON patch read from a granted
/// `patch_path` (an env var appended to `build`) and a merge patch (the pod's `hostname`) are all
/// in the pod kubectl reads back while the job runs, and the job sees both variables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_spec_patches_of_each_type_are_in_the_created_pod() {
    let w = world("pod-spec").await;
    let patches = w.root.path().join("patches");
    std::fs::create_dir_all(&patches).expect("patches dir");
    let json_patch = patches.join("env.json");
    std::fs::write(
        &json_patch,
        r#"[{"op": "add", "path": "/containers/0/env/-", "value": {"name": "PATCHED_JSON", "value": "by-json"}}]"#,
    )
    .expect("patch file");
    let kubernetes = format!(
        r#"  [[runners.kubernetes.pod_spec]]
  name = "strategic-env"
  patch = '''
    containers:
      - name: build
        env:
          - name: PATCHED_STRATEGIC
            value: by-strategic
  '''
  [[runners.kubernetes.pod_spec]]
  name = "json-env"
  patch_path = "{}"
  patch_type = "json"
  [[runners.kubernetes.pod_spec]]
  name = "merge-hostname"
  patch = '{{"hostname": "patched-by-merge"}}'
  patch_type = "merge"
  [runners.feature_flags]
  FF_USE_ADVANCED_POD_SPEC_CONFIGURATION = true"#,
        json_patch.display()
    );
    let grant = format!("[plugins.kubernetes]\nallow_kubernetes = true\ndirs = [\"{}:ro\"]", patches.display());
    let mut manager = w.manager("pod-spec", &kubernetes, &grant);
    manager.start();
    let script = "echo \"seen: $PATCHED_STRATEGIC $PATCHED_JSON\"; for i in $(seq 1200); do [ -e /tmp/go ] && break; sleep 0.1; done";
    let job = w.enqueue(w.job("patched", &[script]).variable("GIT_STRATEGY", "none"), |_| {});
    w.wait_for(job, "the stage starting", &manager, |j| j.trace_text().contains("seen: ")).await;
    let pod_name = w.pod_sent_for(job)["metadata"]["name"].as_str().expect("pod name").to_string();
    let pod: Value = tokio::task::block_in_place(|| {
        let text = w.kube.kubectl_ok(&["get", "pod", "-n", &w.namespace, &pod_name, "-o", "json"]);
        w.kube.kubectl_ok(&["exec", "-n", &w.namespace, &pod_name, "-c", "build", "--", "touch", "/tmp/go"]);
        serde_json::from_str(&text).expect("kubectl's JSON")
    });
    let containers = pod["spec"]["containers"].as_array().expect("containers");
    let build = containers.iter().find(|c| c["name"] == "build").expect("build");
    let env: Vec<(&str, &str)> = build["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| (e["name"].as_str().unwrap_or_default(), e["value"].as_str().unwrap_or_default()))
        .collect();
    assert!(env.contains(&("PATCHED_STRATEGIC", "by-strategic")), "{pod:#}");
    assert_eq!(env.last(), Some(&("PATCHED_JSON", "by-json")), "the JSON patch appended last: {pod:#}");
    assert_eq!(pod["spec"]["hostname"], "patched-by-merge", "{pod:#}");
    assert_eq!(containers.len(), 2, "the strategic patch merged into build, adding no container: {pod:#}");
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    let trace = record.trace_text();
    assert!(trace.contains("seen: by-strategic by-json"), "{trace}");
    assert!(trace.contains("Advanced Pod Spec configuration enabled"), "{trace}");
    w.assert_nothing_left(&manager).await;
    w.assert_objects_pass_the_models();
}

/// Without the feature flag, `pod_spec` is ignored with a warning (gitlab-runner ignores it);
/// a patch that does not apply fails the job as a configuration error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_spec_patches_need_the_feature_flag_and_a_bad_one_fails_the_job() {
    let w = world("pod-spec-off").await;
    let patch = "  [[runners.kubernetes.pod_spec]]\n  name = \"bad\"\n  patch = '[{\"op\": \"remove\", \"path\": \"/nothing\"}]'\n  patch_type = \"json\"";
    let mut off = w.manager("pod-spec-off", patch, "");
    off.start();
    let job = w.enqueue(w.job("off", &["echo ran-unpatched"]).variable("GIT_STRATEGY", "none"), |_| {});
    let record = w.finished(job, &off).await;
    assert_state(&record, JobStatus::Success, &off);
    let trace = record.trace_text();
    assert!(trace.contains("pod_spec is ignored: FF_USE_ADVANCED_POD_SPEC_CONFIGURATION is off"), "{trace}");
    drop(off);
    let on = format!("{patch}\n  [runners.feature_flags]\n  FF_USE_ADVANCED_POD_SPEC_CONFIGURATION = true");
    let mut manager = w.manager("pod-spec-on", &on, "");
    manager.start();
    let job = w.enqueue(w.job("bad", &["echo must-not-run"]).variable("GIT_STRATEGY", "none"), |_| {});
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Failed, &manager);
    let trace = record.trace_text();
    assert!(trace.contains("pod_spec \"bad\": operation 0: no member \"nothing\""), "{trace}");
    assert!(!trace.contains("must-not-run\n"), "{trace}");
    w.assert_nothing_left(&manager).await;
}

/// No orphans: a manager SIGKILLed mid-job whose job store is then lost leaves its pod, and a
/// secret and a configmap of its runner; the next manager deletes all three once they are older
/// than `orphan_cleanup_grace_period_seconds`, and leaves another runner's labelled objects
/// alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_of_a_manager_that_lost_its_store_are_deleted_by_the_next_one() {
    let w = world("orphans").await;
    let mut manager =
        w.manager("orphans", "  orphan_cleanup_grace_period_seconds = 3", "  [runners.store]\n  cleanup_interval = 1");
    manager.start();
    let job = w.enqueue(
        w.job("orphan", &["echo started-the-long-stage", "sleep 300"]).variable("GIT_STRATEGY", "none"),
        |_| {},
    );
    w.wait_for(job, "the stage starting", &manager, |j| j.trace_text().contains("started-the-long-stage")).await;
    manager.kill9();
    let store = w.root.path().join("orphans").join(".runway").join("store");
    assert!(store.is_dir(), "the file store is at {}", store.display());
    std::fs::remove_dir_all(&store).expect("the store is lost");
    let pod = w.pod_sent_for(job);
    let ours = pod["metadata"]["labels"].clone();
    let token = ours["runway/runner"].as_str().expect("runner label").to_string();
    let mut theirs = ours.clone();
    theirs["runway/runner"] = json!("another-runner");
    let ns = &w.namespace;
    tokio::task::block_in_place(|| {
        for (name, labels) in [("ours", &ours), ("theirs", &theirs)] {
            let meta = json!({"name": format!("{name}-left"), "labels": labels});
            let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta, "stringData": {"k": "v"}});
            let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": "v"}});
            assert_eq!(w.kube.call_blocking("POST", &format!("/api/v1/namespaces/{ns}/secrets"), Some(secret)).0, 201);
            assert_eq!(
                w.kube.call_blocking("POST", &format!("/api/v1/namespaces/{ns}/configmaps"), Some(config_map)).0,
                201
            );
        }
        let their_pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "theirs-left", "labels": theirs},
            "spec": {"containers": [{"name": "c", "image": w.kube.docker.job_image(), "command": ["sleep", "300"]}]}});
        assert_eq!(w.kube.call_blocking("POST", &format!("/api/v1/namespaces/{ns}/pods"), Some(their_pod)).0, 201);
    });
    let names = |selector: &str| -> Vec<String> {
        let mut found = Vec::new();
        for kind in ["pods", "secrets", "configmaps"] {
            let (status, list) =
                w.kube.call_blocking("GET", &format!("/api/v1/namespaces/{ns}/{kind}?labelSelector={selector}"), None);
            assert_eq!(status, 200, "{list}");
            for item in list["items"].as_array().into_iter().flatten() {
                found.push(format!("{kind}/{}", item["metadata"]["name"].as_str().unwrap_or_default()));
            }
        }
        found
    };
    let ours_selector = format!("runway/runner={token}");
    // The crashed manager's pod (and its job's registry secret), the secret and configmap above.
    let orphaned = tokio::task::block_in_place(|| names(&ours_selector));
    let pod_name = format!("pods/{}", pod["metadata"]["name"].as_str().unwrap_or_default());
    for want in [pod_name.as_str(), "secrets/ours-left", "configmaps/ours-left"] {
        assert!(orphaned.iter().any(|o| o == want), "{want} in {orphaned:?}");
    }

    manager.start();
    let mut left = Vec::new();
    for _ in 0..600 {
        left = tokio::task::block_in_place(|| names(&ours_selector));
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(left.is_empty(), "orphans left: {left:?}\nrunway log:\n{}", manager.log());
    let log = manager.log();
    let deletions: Vec<&str> = log.lines().filter(|l| l.contains("deleted an orphaned Kubernetes object")).collect();
    assert_eq!(deletions.len(), orphaned.len(), "one deletion per orphan: {log}");
    for line in &deletions {
        let age: u64 = line
            .split("age_seconds=")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no age in {line}"));
        assert!(age >= 3, "deleted only after the grace period: {line}");
    }
    let theirs_left = tokio::task::block_in_place(|| names("runway/runner=another-runner"));
    assert_eq!(theirs_left, ["pods/theirs-left", "secrets/theirs-left", "configmaps/theirs-left"], "{log}");
    tokio::task::block_in_place(|| {
        for kind in ["pods", "secrets", "configmaps"] {
            let path = format!("/api/v1/namespaces/{ns}/{kind}/theirs-left?gracePeriodSeconds=0");
            let status = w.kube.call_blocking("DELETE", &path, None).0;
            assert!((200..300).contains(&status), "deleting {path}: {status}");
        }
    });
    w.assert_nothing_left(&manager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_api_fails_the_job_with_the_servers_message() {
    let w = world("forbidden").await;
    let token = w.kube.add_token("runway-readonly", &["get", "list", "watch"], &["pods"], &w.namespace);
    let mut manager = w.manager("forbidden", "", "");
    let config = std::fs::read_to_string(manager.dir().join("config.toml")).expect("config");
    std::fs::write(manager.dir().join("config.toml"), config.replace(&w.kube.token, &token)).expect("config");
    manager.start();
    let job = w.enqueue(w.job("forbidden", &["echo must-not-run"]).variable("GIT_STRATEGY", "none"), |_| {});
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Failed, &manager);
    let trace = record.trace_text();
    // The API server's own words, whichever object came first (the registry secret, the pod).
    assert!(trace.contains("is forbidden: User \"runway-readonly\" cannot create resource"), "{trace}");
    w.assert_nothing_left(&manager).await;
}

/// `runway exec --executor kubernetes` on the cluster of a kubeconfig: the project is mounted
/// from the node (fake-kube's node is this machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runway_exec_runs_a_local_job_on_the_cluster_of_a_kubeconfig() {
    let w = world("exec").await;
    let project = w.root.path().join("local-project");
    std::fs::create_dir_all(&project).expect("project");
    std::fs::write(
        project.join(".gitlab-ci.yml"),
        "hello:\n  script:\n    - cat greeting.txt\n    - cat /etc/runway-image\n",
    )
    .expect("ci file");
    std::fs::write(project.join("greeting.txt"), "greetings-from-the-local-project\n").expect("file");
    let config = w.root.path().join("exec-config.toml");
    std::fs::write(
        &config,
        format!(
            "[[runners]]\nname = \"local\"\nurl = \"https://gitlab.invalid\"\ntoken = \"x\"\nexecutor = \"kubernetes\"\n  [runners.kubernetes]\n  namespace = \"{ns}\"\n  image = \"{image}\"\n  helper_image = \"{helper}\"\n  pull_policy = \"if-not-present\"\n  poll_interval = 1\n",
            ns = w.namespace,
            image = w.kube.docker.job_image(),
            helper = helper_image(w.kube),
        ),
    )
    .expect("config");
    let out = tokio::task::block_in_place(|| {
        Command::new(env!("CARGO_BIN_EXE_runway"))
            .args(["exec", "--executor", "kubernetes", "--config"])
            .arg(&config)
            .arg("hello")
            .current_dir(&project)
            .env("KUBECONFIG", &w.kube.kubeconfig)
            .env("HOME", w.root.path())
            .env("RUNWAY_PLUGIN_CACHE_DIR", std::env::var("RUNWAY_PLUGIN_CACHE_DIR").unwrap_or_default())
            .output()
            .expect("runway exec runs")
    });
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}\nfake-kube log:\n{}", tail(&w.kube.log(), 40));
    assert!(text.contains("greetings-from-the-local-project"), "{text}");
    assert!(text.contains(&format!("kubeconfig {}", w.kube.kubeconfig.display())), "the kubeconfig was used: {text}");
    assert!(Path::new(&project).join("greeting.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jobs_registry_credentials_become_an_image_pull_secret_the_kubelet_uses() {
    let w = world("pull-secret").await;
    let (image, registry) = tokio::task::block_in_place(|| {
        let docker = w.kube.docker;
        let pushed = docker.push_to_registry(docker.job_image(), &format!("pulls/secret-{}:1", std::process::id()));
        let registry = docker.auth_registry().address();
        (pushed.replacen(&docker.registry().address(), &registry, 1), registry)
    });
    let mut manager = w.manager("pull-secret", "", "");
    manager.start();
    let mut spec = w.job("private", &["echo pulled-with-the-secret"]).variable("GIT_STRATEGY", "none");
    spec.image = Some(image.clone());
    let job = w.enqueue(spec, |p| {
        p["credentials"] = json!([{
            "type": "registry", "url": registry, "username": dockerd::AUTH_USER, "password": dockerd::AUTH_PASSWORD
        }]);
    });
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    assert!(record.trace_text().contains("pulled-with-the-secret"), "{}", record.trace_text());
    let pod = w.pod_sent_for(job);
    let secret = pod["spec"]["imagePullSecrets"][0]["name"].as_str().expect("an image pull secret").to_string();
    let sent = w.kube.objects_sent(&w.namespace);
    let object = sent
        .iter()
        .find(|o| o["kind"] == "Secret" && o["metadata"]["name"] == secret.as_str())
        .expect("the secret was created");
    assert_eq!(object["type"], "kubernetes.io/dockerconfigjson", "{object:#}");
    // The registry asks for credentials: it only answers a pull that brought them.
    let log = w.kube.docker.auth_registry().log();
    assert!(log.contains("authorized request"), "the registry saw the credentials:\n{log}");
    w.assert_nothing_left(&manager).await;
    w.assert_objects_pass_the_models();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_api_server_fails_the_job_with_a_system_failure() {
    let w = world("unreachable").await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let mut manager = w.manager("unreachable", "", "");
    let config = std::fs::read_to_string(manager.dir().join("config.toml")).expect("config");
    let config = config.replace(&w.kube.server, &format!("https://127.0.0.1:{closed}"));
    std::fs::write(manager.dir().join("config.toml"), config).expect("config");
    manager.start();
    let job = w.enqueue(w.job("unreachable", &["echo must-not-run"]).variable("GIT_STRATEGY", "none"), |_| {});
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Failed, &manager);
    assert_eq!(record.failure_reason.as_deref(), Some("runner_system_failure"), "{}", record.trace_text());
    let trace = record.trace_text();
    assert!(trace.contains(&format!("Kubernetes API server https://127.0.0.1:{closed}")), "{trace}");
    assert!(!trace.contains("must-not-run\n"), "{trace}");
}

/// The numbered lines (`line N of M`) of a trace, in order.
fn numbered_lines(trace: &str) -> Vec<u32> {
    trace
        .lines()
        .filter_map(|l| l.strip_prefix("line ").and_then(|rest| rest.split_once(" of ")))
        .filter_map(|(n, _)| n.trim().parse().ok())
        .collect()
}

/// Seed 003 on Kubernetes, with the file store (on by default): the attach strategy's stage
/// output and exit code live in the pod, so a manager SIGKILLed mid-stage three times is
/// restarted each time and follows the stage on from where GitLab's log ends (every line once,
/// in order), reads the stage's exit code from the pod and runs the later stages
/// (`after_script`). A second job whose pod is deleted while no manager runs fails at once
/// with `runner_system_failure` and the reason. No pod is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_survive_kill_9_of_their_manager_mid_stage_and_a_vanished_pod_fails_its_job() {
    let w = world("resume").await;
    let mut manager = w.manager("resume", "", "");
    manager.start();
    let script = "for i in $(seq 1 200); do echo \"line $i of 200\"; sleep 0.1; done";
    let spec = w
        .job("resume", &[script, "echo the-stage-ends-with-3; exit 3"])
        .after_script(&["echo after-script-ran"])
        .variable("GIT_STRATEGY", "none");
    let job = w.enqueue(spec, |_| {});
    let doomed =
        w.enqueue(w.job("doomed", &["echo doomed-started", "sleep 300"]).variable("GIT_STRATEGY", "none"), |_| {});
    w.wait_for(doomed, "the doomed job's stage", &manager, |j| j.trace_text().contains("doomed-started\n")).await;
    for (round, line) in [20, 70, 120].into_iter().enumerate() {
        let needle = format!("line {line} of 200");
        w.wait_for(job, &needle, &manager, |j| j.trace_text().contains(&needle)).await;
        manager.kill9();
        eprintln!("round {round}: kill -9 at line {line}");
        if round == 0 {
            // The doomed job's pod vanishes while no manager runs.
            let pod = tokio::task::block_in_place(|| {
                let pod = w.pod_of(doomed);
                let path = format!("/api/v1/namespaces/{}/pods/{pod}?gracePeriodSeconds=0", w.namespace);
                let (status, answer) = w.kube.call_blocking("DELETE", &path, None);
                assert_eq!(status, 200, "{answer}");
                pod
            });
            eprintln!("deleted pod {pod} of job {doomed}");
        }
        manager.start();
    }
    let gone = w.finished(doomed, &manager).await;
    assert_state(&gone, JobStatus::Failed, &manager);
    assert_eq!(gone.failure_reason.as_deref(), Some("runner_system_failure"), "{}", gone.trace_text());
    let trace = gone.trace_text();
    assert!(trace.contains("no longer exists") || trace.contains("is being deleted"), "the reason: {trace}");
    // GitLab took the line before the kill, so the store had it (a stored job's trace goes to
    // GitLab only once the store has it): the failure lines come after it, never in its place.
    assert_eq!(trace.matches("doomed-started\n").count(), 1, "every line exactly once: {trace}");
    let failed = trace.find("no longer exists").or(trace.find("is being deleted"));
    assert!(trace.find("doomed-started\n") < failed, "the failure lines follow what GitLab had: {trace}");

    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Failed, &manager);
    let trace = record.trace_text();
    assert_eq!(record.failure_reason.as_deref(), Some("script_failure"), "{trace}");
    assert_eq!(record.exit_code, Some(3), "the stage's exit code, read from the pod: {trace}");
    assert_eq!(numbered_lines(&trace), (1..=200).collect::<Vec<u32>>(), "every line once, in order:\n{trace}");
    assert_eq!(trace.matches("the-stage-ends-with-3\n").count(), 1, "{trace}");
    assert!(trace.contains("after-script-ran"), "the later stage ran: {trace}");
    let log = manager.log();
    assert!(log.matches("resuming a stored job").count() >= 3, "{log}");
    w.assert_nothing_left(&manager).await;
}

/// Seed 003's Redis store: two managers share it; the one running the job is SIGKILLed and
/// the live one takes the job over once its lease expires, following the stage on in the pod
/// from GitLab's offset; the pod is deleted after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_redis_store_a_live_manager_takes_over_a_dead_ones_job() {
    let w = world("takeover").await;
    let redis = RedisServer::start();
    let store = format!(
        "  [runners.store]\n  name = \"redis\"\n  health_interval = 1\n  health_timeout = 3\n  [runners.store.redis]\n  url = \"{}\"",
        redis.url()
    );
    let key = "5e1d7c3b9a2f4e6081726354a5b6c7d8e9f0a1b2c3d4e5f60718293a4b5c6d7e";
    let mut managers = Vec::new();
    for (name, id) in [("a", "s_cccccccccccc"), ("b", "s_dddddddddddd")] {
        let manager = w.manager(name, "", &store).env("RUNWAY_STORE_KEY", key);
        std::fs::write(manager.dir().join(".runner_system_id"), format!("{id}\n")).expect("system id");
        managers.push((id, manager));
    }
    for (_, manager) in &mut managers {
        manager.start();
    }
    let script = "for i in $(seq 1 100); do echo \"line $i of 100\"; sleep 0.1; done";
    let job = w.enqueue(w.job("takeover", &[script]).variable("GIT_STRATEGY", "none"), |_| {});
    let first = &managers[0].1;
    w.wait_for(job, "line 10", first, |j| j.trace_text().contains("line 10 of 100")).await;
    let Some(owner) = redis.job_owner(job).await else {
        panic!("no entry for job {job} in Redis; logs:\n{}\n----\n{}", managers[0].1.log(), managers[1].1.log());
    };
    let dead = managers
        .iter()
        .position(|(id, _)| *id == owner)
        .unwrap_or_else(|| panic!("the owner {owner} is one of the two managers"));
    managers[dead].1.kill9();
    let live = &managers[1 - dead].1;
    let record = w.finished(job, live).await;
    assert_state(&record, JobStatus::Success, live);
    let trace = record.trace_text();
    assert_eq!(numbered_lines(&trace), (1..=100).collect::<Vec<u32>>(), "every line once, in order:\n{trace}");
    assert!(live.log().contains("taking over a job"), "{}", live.log());
    w.assert_nothing_left(live).await;
}

/// gitlab-runner's pull policy fallback: the job's `pull_policy: [never, if-not-present]` fails
/// with `never` (the image is only in the registry), and a second pod pulls it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_pull_tries_the_next_pull_policy_in_a_new_pod() {
    let w = world("pull-fallback").await;
    let image = tokio::task::block_in_place(|| {
        let docker = w.kube.docker;
        docker.push_to_registry(docker.job_image(), &format!("pulls/fallback-{}:1", std::process::id()))
    });
    let mut manager = w.manager("pull-fallback", "  allowed_pull_policies = [\"never\", \"if-not-present\"]", "");
    manager.start();
    let job =
        w.enqueue(w.job("fallback", &["echo pulled-on-the-second-attempt"]).variable("GIT_STRATEGY", "none"), |p| {
            p["image"] = json!({ "name": image, "pull_policy": ["never", "if-not-present"] });
        });
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    let trace = record.trace_text();
    assert!(trace.contains("ErrImageNeverPull") && trace.contains("trying the next pull policy"), "{trace}");
    assert!(trace.contains("pulled-on-the-second-attempt"), "{trace}");
    let pods: Vec<Value> = w.kube.objects_sent(&w.namespace).into_iter().filter(|o| o["kind"] == "Pod").collect();
    let policies: Vec<&str> =
        pods.iter().filter_map(|p| p["spec"]["containers"][0]["imagePullPolicy"].as_str()).collect();
    assert_eq!(policies, ["Never", "IfNotPresent"], "one pod per policy");
    w.assert_nothing_left(&manager).await;
}

/// Transient API failures are retried: 429 (with `Retry-After`) on creating the pod,
/// `etcdserver: request timed out` on reading its events, 503 on deleting it; the job goes on
/// to success and nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_api_failures_are_retried() {
    let w = world("faults").await;
    let pods = format!("^/api/v1/namespaces/{}/pods", w.namespace);
    tokio::task::block_in_place(|| {
        w.kube.fail_next("POST", &format!("{pods}$"), 2, 429, false);
        w.kube.fail_next("GET", &format!("^/api/v1/namespaces/{}/events\\?", w.namespace), 2, 500, true);
        w.kube.fail_next("DELETE", &format!("{pods}/[^/]+$"), 1, 503, false);
    });
    let mut manager = w.manager("faults", "", "");
    manager.start();
    let job = w.enqueue(w.job("faults", &["echo through-the-faults"]).variable("GIT_STRATEGY", "none"), |_| {});
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    assert!(record.trace_text().contains("through-the-faults"), "{}", record.trace_text());
    w.assert_nothing_left(&manager).await;
    // Every injected failure was met by the runner (none is left for these calls).
    tokio::task::block_in_place(|| {
        let events = format!("/api/v1/namespaces/{}/events?fieldSelector=involvedObject.name%3Dx", w.namespace);
        assert_eq!(w.kube.call_blocking("GET", &events, None).0, 200);
        assert_eq!(
            w.kube.call_blocking("DELETE", &format!("/api/v1/namespaces/{}/pods/none", w.namespace), None).0,
            404
        );
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "canary"}, "spec": {"containers": [{"name": "c", "image": w.kube.docker.job_image()}]}});
        let path = format!("/api/v1/namespaces/{}/pods", w.namespace);
        assert_eq!(w.kube.call_blocking("POST", &path, Some(pod)).0, 201);
        w.kube.call_blocking("DELETE", &format!("{path}/canary?gracePeriodSeconds=0"), None);
    });
}

/// Runway's manager image (`runway manager-image`, then `docker load`) in the engine the
/// kubelet pulls from: its reference.
fn manager_image(kube: &Kube) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let archive = dir.path().join("runway.tar");
    let out = Command::new(env!("CARGO_BIN_EXE_runway"))
        .args(["manager-image", "--output"])
        .arg(&archive)
        .output()
        .expect("runway manager-image runs");
    assert!(out.status.success(), "runway manager-image: {}", String::from_utf8_lossy(&out.stderr));
    let reference = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let loaded = kube.docker.docker_cmd().arg("load").arg("-i").arg(&archive).output().expect("docker load runs");
    assert!(loaded.status.success(), "docker load: {}", String::from_utf8_lossy(&loaded.stderr));
    let inspect = kube
        .docker
        .docker_cmd()
        .args(["image", "inspect", "--format", "{{.Config.StopSignal}}", &reference])
        .output()
        .expect("docker inspect");
    assert_eq!(String::from_utf8_lossy(&inspect.stdout).trim(), "SIGQUIT", "{reference}");
    reference
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifests_run_the_manager_in_a_pod_that_runs_jobs_with_in_cluster_configuration() {
    let w = world("incluster").await;
    let image = tokio::task::block_in_place(|| manager_image(w.kube));
    // deploy/kubernetes/ with only what a user edits replaced: GitLab's URL, the runner token,
    // the images (the cluster pulls from this engine, not a registry).
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes");
    let manifests = w.root.path().join("deploy");
    std::fs::create_dir_all(&manifests).expect("dir");
    for entry in std::fs::read_dir(&source).expect("deploy/kubernetes") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path)
            .expect("manifest")
            .replace("https://gitlab.example.com", &w.fake.url())
            .replace("glrt-REPLACE-ME", &w.token)
            .replace("alpine:3.20", w.kube.docker.job_image())
            .replace("registry.example.com/runway-helper:REPLACE-ME", helper_image(w.kube))
            .replace("registry.example.com/runway:REPLACE-ME", &image);
        std::fs::write(manifests.join(path.file_name().expect("name")), text).expect("write");
    }
    let dir = manifests.display().to_string();
    let ns = w.namespace.clone();
    tokio::task::block_in_place(|| w.kube.kubectl_ok(&["apply", "-n", &ns, "-f", &dir]));
    let manager_log = || {
        let out = w.kube.kubectl(&["logs", "-n", &ns, "deployment/runway", "--tail=60"]);
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    };
    // The Deployment's pod becomes Ready once /health/ready answers (its readiness probe).
    let selector = "app.kubernetes.io/name=runway";
    let mut ready = false;
    for _ in 0..1200 {
        let out = tokio::task::block_in_place(|| {
            w.kube.kubectl_ok(&["get", "pods", "-n", &ns, "-l", selector, "-o", "json"])
        });
        let pods: Value = serde_json::from_str(&out).expect("pods");
        ready = pods["items"].as_array().into_iter().flatten().any(|p| {
            p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        if ready {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        ready,
        "the manager's pod never became Ready:\n{}\n{}",
        tokio::task::block_in_place(manager_log),
        tail(&w.kube.log(), 40)
    );
    let job = w.enqueue(w.job("in-cluster", &["echo job-ran-in-a-pod-of-the-in-cluster-manager"]), |_| {});
    let Some(record) = w.fake.wait_for_job_state(job, |j| j.final_state.is_some(), WAIT).await else {
        panic!(
            "job {job} did not finish:\nmanager log:\n{}\n{}",
            tokio::task::block_in_place(manager_log),
            tail(&w.kube.log(), 40)
        );
    };
    let trace = record.trace_text();
    assert_eq!(
        record.status,
        JobStatus::Success,
        "trace:\n{trace}\nmanager log:\n{}",
        tokio::task::block_in_place(manager_log)
    );
    assert!(trace.contains("job-ran-in-a-pod-of-the-in-cluster-manager"), "{trace}");
    assert!(trace.contains("Using Kubernetes cluster of in-cluster service account"), "{trace}");
    assert!(trace.contains(&format!("Using Kubernetes namespace: {ns}")), "the service account's namespace: {trace}");
    // The job ran with the manager's service account, which fake-kube holds to the Role of
    // 02-role.yaml (a verb it does not grant is 403). Deleting the manifests stops the manager (SIGQUIT) and collects its pod.
    tokio::task::block_in_place(|| w.kube.kubectl_ok(&["delete", "-n", &ns, "-f", &dir, "--wait=true"]));
    let mut left = Vec::new();
    for _ in 0..600 {
        left = tokio::task::block_in_place(|| w.leftovers());
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(left.is_empty(), "left after deleting the manifests: {left:?}\n{}", tail(&w.kube.log(), 40));
}

/// One kind of API fault the soak injects into namespace `ns`: the key fake-kube counts it
/// under (`/fake-kube/injected`), and its failure rule (`/fake-kube/failures`, one call).
fn soak_fault(kind: usize, ns: &str) -> (&'static str, Value) {
    let pods = format!("^/api/v1/namespaces/{ns}/pods");
    match kind {
        0 => (
            "429 Too many requests, please try again later.",
            json!({"method": "POST", "path": format!("{pods}$"), "status": 429, "retryAfterSeconds": 1}),
        ),
        1 => (
            "500 etcdserver: request timed out",
            json!({"method": "POST", "path": format!("{pods}$"), "etcdTimeout": true}),
        ),
        2 => (
            "500 etcdserver: leader changed",
            json!({"method": "GET", "path": format!("^/api/v1/namespaces/{ns}/events"), "status": 500, "message": "etcdserver: leader changed"}),
        ),
        3 => (
            "503 the server is currently unable to handle the request",
            json!({"method": "GET", "path": format!("{pods}/[^/]+/exec"), "status": 503}),
        ),
        4 => (
            "504 Timeout: request did not complete within the allotted timeout",
            json!({"method": "DELETE", "path": format!("{pods}/[^/?]+(\\?|$)"), "status": 504, "message": "Timeout: request did not complete within the allotted timeout"}),
        ),
        _ => (
            "connection reset (mid-request)",
            json!({"method": "GET", "path": format!("{pods}\\?.*watch="), "reset": true}),
        ),
    }
}

/// Issue 32's soak: 30 jobs, 8 at a time, on fake-kube while its API answers calls of each
/// kind with 429 (`Retry-After`), `etcdserver: request timed out`, `leader changed`, 503 and
/// 504, resets a watch's connection before answering, and the open watches, exec streams and
/// TCP connections of the namespace are cut or reset again and again; one pod is held
/// `Unschedulable` for half its `poll_timeout`. Every job ends in its right state (successes
/// with every line once, three script failures with their exit codes), the held pod's events
/// are in its trace, the faults fake-kube injected are printed by kind, and nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soak_of_30_jobs_ends_right_through_api_faults_resets_and_cut_streams() {
    let w = world("soak").await;
    let ns = w.namespace.clone();
    let manager_dir = w.root.path().join("soak");
    let mut manager = w.manager("soak", "  poll_timeout = 60", "");
    let config = std::fs::read_to_string(manager_dir.join("config.toml")).expect("config");
    std::fs::write(manager_dir.join("config.toml"), config.replace("concurrent = 4", "concurrent = 8"))
        .expect("config");
    let count = "for i in $(seq 1 6); do echo \"line $i of 6\"; sleep 0.2; done";
    let exits = [(7, 3), (17, 7), (27, 42)];
    let mut jobs = Vec::new();
    for n in 0..30 {
        let exit = exits.iter().find(|(at, _)| *at == n).map(|(_, code)| *code);
        let last = exit.map(|code| format!("exit {code}"));
        let script: Vec<&str> = std::iter::once(count).chain(last.as_deref()).collect();
        jobs.push((w.enqueue(w.job(&format!("soak-{n}"), &script).variable("GIT_STRATEGY", "none"), |_| {}), exit));
    }
    let held = jobs[0].0;
    tokio::task::block_in_place(|| {
        let hold = json!({ "labelSelector": format!("runway/job={held}"), "seconds": 30.0 });
        let (status, answer) = w.kube.call_blocking("POST", "/fake-kube/unschedulable", Some(hold));
        assert_eq!(status, 200, "{answer}");
    });
    let injected = |w: &World| {
        let (status, counts) = w.kube.call_blocking("GET", &format!("/fake-kube/injected?namespace={ns}"), None);
        assert_eq!(status, 200, "{counts}");
        counts
    };
    manager.start();
    let started = std::time::Instant::now();
    // A kind's next rule goes in once fake-kube met its last one (rules never pile up).
    let mut added = [0u64; 6];
    let mut tick = 0usize;
    let all_final = |w: &World| jobs.iter().all(|(job, _)| w.fake.job(*job).is_some_and(|j| j.final_state.is_some()));
    while !all_final(&w) {
        assert!(started.elapsed() < Duration::from_secs(400), "the soak did not end:\n{}", tail(&manager.log(), 80));
        tokio::task::block_in_place(|| {
            let counts = injected(&w);
            for (kind, added) in added.iter_mut().enumerate() {
                // A pod's creation fails as a whole after prepare's three attempts (a POST with
                // generateName is not repeated by the client, and a 429 is retried after its
                // Retry-After): its two faults go in every fifth tick (3 s), so one job meets
                // them now and then, as on a cluster, not on every try.
                if kind <= 1 && !tick.is_multiple_of(5) {
                    continue;
                }
                let (key, rule) = soak_fault(kind, &ns);
                if counts[key].as_u64().unwrap_or(0) >= *added {
                    let (status, answer) = w.kube.call_blocking("POST", "/fake-kube/failures", Some(rule));
                    assert_eq!(status, 200, "{answer}");
                    *added += 1;
                }
            }
            let cut = match tick % 4 {
                0 => Some("/fake-kube/cut-watches"),
                1 => Some("/fake-kube/cut-streams"),
                3 => Some("/fake-kube/reset-connections"),
                _ => None,
            };
            if let Some(path) = cut {
                let (status, answer) = w.kube.call_blocking("POST", path, Some(json!({ "namespace": ns })));
                assert_eq!(status, 200, "{answer}");
            }
        });
        tick += 1;
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    eprintln!("the soak's 30 jobs ended after {:?}", started.elapsed());

    for (job, exit) in &jobs {
        let record = w.finished(*job, &manager).await;
        let trace = record.trace_text();
        assert_eq!(numbered_lines(&trace), (1..=6).collect::<Vec<u32>>(), "job {job}: every line once:\n{trace}");
        match exit {
            None => assert_state(&record, JobStatus::Success, &manager),
            Some(code) => {
                assert_state(&record, JobStatus::Failed, &manager);
                assert_eq!(record.failure_reason.as_deref(), Some("script_failure"), "{trace}");
                assert_eq!(record.exit_code, Some(*code), "job {job}: {trace}");
            }
        }
    }
    let trace = w.fake.job(held).map(|j| j.trace_text()).unwrap_or_default();
    assert!(trace.contains("FailedScheduling") && trace.contains("Unschedulable"), "the held pod's events: {trace}");

    let counts = tokio::task::block_in_place(|| injected(&w));
    eprintln!("faults fake-kube injected into the soak, by kind:");
    for (kind, n) in counts.as_object().into_iter().flatten() {
        eprintln!("  {:>5}  {kind}", n.as_u64().unwrap_or(0));
    }
    let kinds = (0..6).map(|kind| soak_fault(kind, &ns).0).chain([
        "watch cut",
        "exec/attach stream cut",
        "connection reset (open connection)",
        "pod held Unschedulable",
    ]);
    for kind in kinds {
        assert!(
            counts[kind].as_u64().unwrap_or(0) > 0,
            "no {kind} was injected: {counts}\n{}",
            tail(&manager.log(), 60)
        );
    }
    w.assert_nothing_left(&manager).await;
}

/// Item 3 of issue 32: a pod evicted mid-stage (the kubelet's `Evicted`), and a pod whose node
/// was lost (the node controller force-deletes it, grace period 0) fail their jobs at once
/// with `runner_system_failure` — the reason GitLab's `retry: when: runner_system_failure`
/// retries — naming what happened; nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_pod_or_a_lost_nodes_pod_fails_its_job_with_a_system_failure() {
    let w = world("evicted").await;
    let mut manager = w.manager("evicted", "", "");
    manager.start();
    let evicted =
        w.enqueue(w.job("evicted", &["echo evict-me-now", "sleep 300"]).variable("GIT_STRATEGY", "none"), |_| {});
    let lost =
        w.enqueue(w.job("lost", &["echo my-node-goes-now", "sleep 300"]).variable("GIT_STRATEGY", "none"), |_| {});
    w.wait_for(evicted, "the stage", &manager, |j| j.trace_text().contains("evict-me-now\n")).await;
    w.wait_for(lost, "the stage", &manager, |j| j.trace_text().contains("my-node-goes-now\n")).await;
    tokio::task::block_in_place(|| {
        let body = json!({ "namespace": w.namespace, "name": w.pod_of(evicted) });
        let (status, answer) = w.kube.call_blocking("POST", "/fake-kube/evict", Some(body));
        assert_eq!(status, 200, "{answer}");
        let path = format!("/api/v1/namespaces/{}/pods/{}?gracePeriodSeconds=0", w.namespace, w.pod_of(lost));
        let (status, answer) = w.kube.call_blocking("DELETE", &path, None);
        assert_eq!(status, 200, "{answer}");
    });
    let record = w.finished(evicted, &manager).await;
    let trace = record.trace_text();
    assert_state(&record, JobStatus::Failed, &manager);
    assert_eq!(record.failure_reason.as_deref(), Some("runner_system_failure"), "{trace}");
    assert!(trace.contains("Evicted"), "the eviction is the reason: {trace}");
    let record = w.finished(lost, &manager).await;
    let trace = record.trace_text();
    assert_state(&record, JobStatus::Failed, &manager);
    assert_eq!(record.failure_reason.as_deref(), Some("runner_system_failure"), "{trace}");
    assert!(trace.contains("no longer exists") || trace.contains("is being deleted"), "the reason: {trace}");
    w.assert_nothing_left(&manager).await;
}

/// GitLab's web terminal on a Kubernetes job, played as Workhorse plays it: a shell `exec`ed
/// with a tty (`pods/exec` with `tty=true`) in the pod's build container — the job's image, its
/// project directory on the pod's build volume, its variables — resized over channel 4; the
/// job waits for the connected terminal after its script and finishes once it disconnects;
/// no pod is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workhorse_types_into_a_kubernetes_jobs_terminal() {
    use workhorse::{status_of, type_and_read, Session};

    let w = world("terminal").await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let session_server = format!("[session_server]\n  listen_address = \"127.0.0.1:{port}\"\n  session_timeout = 60\n");
    let mut manager = w.manager("terminal", "", &session_server);
    manager.start();
    let script = "while [ ! -f released ]; do sleep 0.1; done; echo script-over";
    let job = w.enqueue(w.job("debug-me", &[script]).variable("TERMINAL_MARK", "from-the-job"), |_| {});
    let record =
        w.wait_for(job, "the script", &manager, |j| j.trace_text().contains("Executing \"step_script\"")).await;
    let session = Session::of(&record);
    assert_eq!(status_of(workhorse::connect(&session, "wrong-token", "terminal.gitlab.com").await), 401);
    let mut ws = workhorse::connect(&session, &session.authorization, "terminal.gitlab.com").await.expect("connects");
    let (dir, project_dir) = workhorse::container_shell(&mut ws).await;
    assert!(dir.ends_with("/group/project"), "{dir}");
    assert_eq!(dir, project_dir, "the terminal starts in the project directory");
    type_and_read(&mut ws, "touch released && echo released-$((1+1))", "released-2").await;
    w.wait_for(job, "the wait for the terminal", &manager, |j| {
        j.trace_text().contains("Terminal is connected, will time out in")
    })
    .await;
    ws.close(None).await.expect("closed");
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    let trace = record.trace_text();
    assert!(trace.contains("script-over") && trace.contains("Terminal disconnected"), "{trace}");
    w.assert_nothing_left(&manager).await;
}
