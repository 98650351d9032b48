//! `secrets:` end to end: `runway run` as a real process against the fake GitLab (which signs
//! the job's `id_tokens:` with its key) and a real OpenBao dev server (started once for this
//! binary, stopped by PID), whose JWT auth methods check those tokens with the fake's public
//! key and roles bound to the project's claims. The shell executor runs the jobs: resolving
//! happens before any executor is prepared, so it is the same on every executor.
//!
//! One docker-executor job shows the same inside a container (file variables in the build
//! volume). Shows: the `vault` resolver on KV v1 and v2 with JWT auth and the `gitlab_secrets_manager`
//! resolver with OpenBao's inline auth, each value reaching the job as a file and as a
//! variable, masked in the trace; a wrong role, a missing path, a missing field and an
//! unreachable server each failing the job before its script, with the secret, the server and
//! its reason in the trace, the failure reason gitlab-runner gives, and no value or token.

#[path = "support/dockerd.rs"]
mod dockerd;
#[path = "support/openbao.rs"]
mod openbao;
#[path = "support/runway_process.rs"]
mod runway_process;

use std::time::Duration;

use fake_gitlab::{FakeGitLab, JobRecord, JobSpec};
use openbao::OpenBao;
use runway_process::RunwayProcess;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const WAIT: Duration = Duration::from_secs(120);
const V2_VALUE: &str = "v2-Pa55w0rd-zebra";
const V1_VALUE: &str = "v1-Pa55w0rd-yak";
const GSM_VALUE: &str = "gsm-Pa55w0rd-gnu";
/// The same path in namespace [`NAMESPACE`] holds this.
const NS_VALUE: &str = "ns-Pa55w0rd-ibex";
/// A Vault/OpenBao namespace.
const NAMESPACE: &str = "team-a";
/// The audience the roles accept (`id_tokens: VAULT_ID_TOKEN: aud:`).
const AUD: &str = "openbao";
/// Printed by every script: a job failed by its secrets must not get this far.
const SCRIPT_RAN: &str = "SCRIPT-RAN-MARKER";
/// The job store's sealing key.
const STORE_KEY: &str = "5e1f0c2a9d1e4f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8";

/// The OpenBao of this binary, configured as a GitLab admin would for `group/project`.
fn bao() -> &'static OpenBao {
    openbao::shared(|bao| {
        let key = fake_gitlab::id_tokens::public_key_pem();
        bao.run(&["secrets", "enable", "-path=kv1", "-version=1", "kv"]);
        bao.run(&["secrets", "enable", "-path=gsm", "-version=2", "kv"]);
        bao.run(&["kv", "put", "-mount=secret", "ci/db", &format!("password={V2_VALUE}")]);
        bao.run(&["kv", "put", "-mount=kv1", "ci/db", &format!("password={V1_VALUE}")]);
        bao.run(&["kv", "put", "-mount=gsm", "project_42/DEPLOY_KEY", &format!("value={GSM_VALUE}")]);
        let policy = r#"path "secret/data/ci/*" { capabilities = ["read"] }
path "kv1/ci/*" { capabilities = ["read"] }
path "gsm/data/project_42/*" { capabilities = ["read"] }
"#;
        bao.policy("", "ci-read", policy);
        // A namespace of its own (`X-Vault-Namespace`), with its own JWT auth, KV and policy.
        bao.run(&["namespace", "create", NAMESPACE]);
        let ns = format!("-namespace={NAMESPACE}");
        bao.run(&["secrets", "enable", &ns, "-path=secret", "-version=2", "kv"]);
        bao.run(&["kv", "put", &ns, "-mount=secret", "ci/db", &format!("password={NS_VALUE}")]);
        bao.policy(NAMESPACE, "ci-read", policy);
        for (namespace, mount) in [("", "jwt"), ("", "pipeline_jwt"), (NAMESPACE, "jwt")] {
            let ns = format!("-namespace={namespace}");
            bao.run(&["auth", "enable", &ns, &format!("-path={mount}"), "jwt"]);
            bao.run(&["write", &ns, &format!("auth/{mount}/config"), &format!("jwt_validation_pubkeys={key}")]);
        }
        let role = |namespace: &str, mount: &str, name: &str, claims: Value| {
            let body = json!({
                "role_type": "jwt",
                "user_claim": "user_login",
                "bound_audiences": [AUD],
                "bound_claims": claims,
                "token_policies": ["ci-read"],
                "token_ttl": "5m",
            });
            let file = std::env::temp_dir().join(format!("runway-bao-role-{}-{mount}-{name}.json", std::process::id()));
            std::fs::write(&file, body.to_string()).expect("role file");
            let path = format!("auth/{mount}/role/{name}");
            bao.run(&["write", &format!("-namespace={namespace}"), &path, &format!("@{}", file.display())]);
            let _ = std::fs::remove_file(&file);
        };
        role("", "jwt", "ci", json!({"project_path": "group/project", "ref_type": "branch", "ref": "main"}));
        role("", "jwt", "other-project", json!({"project_path": "group/other"}));
        role("", "pipeline_jwt", "project_42", json!({"project_id": "42", "project_path": "group/project"}));
        role("", "pipeline_jwt", "project_7", json!({"project_id": "7"}));
        role(NAMESPACE, "jwt", "ci", json!({"project_path": "group/project"}));
    })
}

struct Harness {
    fake: FakeGitLab,
    root: tempfile::TempDir,
    process: RunwayProcess,
}

impl Harness {
    /// A fake GitLab with `group/project`, `runway run` with one shell runner taking 4 jobs.
    async fn shell() -> Harness {
        Self::shell_with("").await
    }

    /// As [`Harness::shell`], with `extra` lines at the end of the `[[runners]]` entry.
    async fn shell_with(extra: &str) -> Harness {
        let fake =
            FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(1), trace_update_interval: 1 })
                .await;
        let runner = fake.create_runner("secrets");
        fake.create_repo("group/project");
        fake.commit_files("group/project", "main", &[("README.md", "hi\n")], "init");
        let root = tempfile::tempdir().expect("tempdir");
        let config = format!(
            r#"concurrent = 4
check_interval = 1
shutdown_timeout = 5

[plugins.shell]
allow_process = true

[[runners]]
name = "secrets"
url = "{url}"
token = "{token}"
executor = "shell"
limit = 4
builds_dir = "{builds}"
cache_dir = "{cache}"
  [runners.shell]
  login = false
{extra}
"#,
            url = fake.url(),
            token = runner.token,
            builds = root.path().join("builds").display(),
            cache = root.path().join("cache").display(),
        );
        std::fs::write(root.path().join("config.toml"), config).expect("config.toml");
        let mut process = RunwayProcess::new(root.path().to_path_buf()).env("RUNWAY_STORE_KEY", STORE_KEY);
        process.start();
        Harness { fake, root, process }
    }

    fn enqueue(&self, spec: JobSpec) -> i64 {
        self.fake.enqueue(self.fake.job_payload(&spec))
    }

    async fn finished(&self, id: i64) -> JobRecord {
        match self.fake.wait_for_job_state(id, |j| j.final_state.is_some(), WAIT).await {
            Some(record) => record,
            None => panic!(
                "job {id} did not finish; trace:\n{}\nrunway log:\n{}\nbao log:\n{}",
                self.fake.job(id).map(|j| j.trace_text()).unwrap_or_default(),
                self.process.log(),
                bao().log()
            ),
        }
    }
}

/// A `vault:` secret of `engine` mounted at `mount`, logging in with `$VAULT_ID_TOKEN`.
fn vault(url: &str, engine: &str, mount: &str, path: &str, field: &str, role: &str) -> Value {
    json!({"vault": {
        "server": {"url": url, "auth": {"name": "jwt", "path": "jwt", "data": {"jwt": "$VAULT_ID_TOKEN", "role": role}}},
        "engine": {"name": engine, "path": mount},
        "path": path,
        "field": field
    }})
}

/// A `gitlab_secrets_manager:` secret as Rails sends it: the JWT inline, signed by GitLab.
fn gsm(url: &str, path: &str, field: &str, role: &str) -> Value {
    json!({"gitlab_secrets_manager": {
        "server": {"url": url, "inline_auth": {
            "auth_mount": "pipeline_jwt",
            "jwt": format!("{}{AUD}", fake_gitlab::id_tokens::ID_TOKEN_PLACEHOLDER),
            "role": role
        }},
        "engine": {"name": "kv-v2", "path": "gsm"},
        "path": path,
        "field": field
    }})
}

/// `secret` as a plain variable (`file: false`).
fn not_a_file(mut secret: Value) -> Value {
    secret["file"] = json!(false);
    secret
}

fn sha256(value: &str) -> String {
    format!("{:x}", Sha256::digest(value.as_bytes()))
}

/// Every ID token the job was given (its payload's variables and inline JWTs).
fn tokens(record: &JobRecord) -> Vec<String> {
    let text = record.payload.to_string();
    text.split('"').filter(|s| s.starts_with("eyJ") && s.matches('.').count() == 2).map(str::to_string).collect()
}

/// Nothing secret in the trace: no value, no ID token.
fn leaks_nothing(record: &JobRecord) {
    let trace = record.trace_text();
    for value in [V2_VALUE, V1_VALUE, GSM_VALUE, NS_VALUE] {
        assert!(!trace.contains(value), "the trace shows {value}:\n{trace}");
    }
    let tokens = tokens(record);
    assert!(!tokens.is_empty(), "the job was given ID tokens");
    for token in tokens {
        assert!(!trace.contains(&token), "the trace shows an ID token:\n{trace}");
        assert!(
            !trace.contains(token.split('.').nth(2).unwrap_or("x")),
            "the trace shows a token's signature:\n{trace}"
        );
    }
}

/// A job that reads its secrets and proves it got them without printing them (each through
/// `digest`, a filter of its stdin), then prints them (to be masked).
fn reading_job(name: &str, secrets: Value, file_var: &str, plain_var: &str, digest: &str) -> JobSpec {
    JobSpec::new(
        "group/project",
        name,
        &[
            &format!("test -f \"${file_var}\" && echo \"a file: ${file_var}\""),
            &format!("printf '%s' \"$(cat \"${file_var}\")\" | {digest}"),
            &format!("printf '%s' \"${plain_var}\" | {digest}"),
            &format!("echo \"file says $(cat \"${file_var}\"), variable says ${plain_var}\""),
        ],
    )
    .id_token("VAULT_ID_TOKEN", AUD)
    .secrets(secrets)
}

/// A job expected to fail while resolving: its script must never run.
fn failing_job(name: &str, secrets: Value) -> JobSpec {
    JobSpec::new("group/project", name, &[&format!("echo {SCRIPT_RAN}")])
        .id_token("VAULT_ID_TOKEN", AUD)
        .secrets(secrets)
}

/// `record` failed for `reason` before its script, naming `secret`, the server and `said`.
fn failed_resolving(record: &JobRecord, reason: &str, secret: &str, server: &str, said: &str) {
    let trace = record.trace_text();
    assert_eq!(record.final_state.as_deref(), Some("failed"), "trace:\n{trace}");
    assert_eq!(record.failure_reason.as_deref(), Some(reason), "trace:\n{trace}");
    assert!(!trace.contains(SCRIPT_RAN), "the script ran:\n{trace}");
    assert!(!trace.contains("Preparing the \"shell\" executor"), "the executor was prepared:\n{trace}");
    let line = trace
        .lines()
        .find(|l| l.contains(&format!("resolving secret \"{secret}\"")))
        .unwrap_or_else(|| panic!("no line names secret {secret}:\n{trace}"));
    assert!(line.contains(server), "the line does not name the server {server}: {line}");
    assert!(line.contains(said), "the line does not give the server's reason ({said}): {line}");
    leaks_nothing(record);
}

fn unreachable_url() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
    format!("http://127.0.0.1:{port}")
}

#[tokio::test(flavor = "multi_thread")]
async fn vault_kv_v1_and_v2_with_jwt_auth_reach_the_job_as_file_and_variable_masked() {
    let bao = bao();
    let h = Harness::shell().await;
    let secrets = json!({
        "DB_FILE": vault(&bao.url, "kv-v2", "secret", "ci/db", "password", "ci"),
        "DB_V1": not_a_file(vault(&bao.url, "kv-v1", "kv1", "ci/db", "password", "ci")),
    });
    let mut secrets = secrets;
    let mut namespaced = not_a_file(vault(&bao.url, "kv-v2", "secret", "ci/db", "password", "ci"));
    namespaced["vault"]["server"]["namespace"] = json!("$VAULT_NAMESPACE");
    secrets["DB_NS"] = namespaced;
    let mut spec =
        reading_job("vault", secrets, "DB_FILE", "DB_V1", "sha256sum").variable("VAULT_NAMESPACE", NAMESPACE);
    spec.script.push("printf '%s' \"$DB_NS\" | sha256sum".to_string());
    let id = h.enqueue(spec);
    let record = h.finished(id).await;
    let trace = record.trace_text();
    assert!(trace.contains(&sha256(NS_VALUE)), "the namespace's value did not reach the job:\n{trace}");
    assert_eq!(record.final_state.as_deref(), Some("success"), "trace:\n{trace}\nbao:\n{}", bao.log());
    assert!(trace.contains(&sha256(V2_VALUE)), "the kv-v2 value did not reach the file:\n{trace}");
    assert!(trace.contains(&sha256(V1_VALUE)), "the kv-v1 value did not reach the variable:\n{trace}");
    assert!(trace.contains("file says [MASKED], variable says [MASKED]"), "not masked:\n{trace}");
    for line in [
        "Resolving secrets",
        "Resolving secret \"DB_FILE\"...",
        "Resolving secret \"DB_V1\"...",
        "Using \"vault\" secret resolver...",
    ] {
        assert!(trace.contains(line), "no {line:?} in:\n{trace}");
    }
    let resolved = trace.find("Resolving secrets").unwrap_or(usize::MAX);
    let prepared = trace.find("Preparing the \"shell\" executor").unwrap_or(0);
    assert!(resolved < prepared, "secrets are resolved before the executor is prepared:\n{trace}");
    leaks_nothing(&record);
    // GitLab hands out jobs with `secrets:` only to runners that say they resolve them.
    let asked = h.fake.requests_to("POST", "/api/v4/jobs/request");
    let features = asked.last().and_then(|r| r.json()).map(|b| b["info"]["features"]["vault_secrets"].clone());
    assert_eq!(features, Some(json!(true)));
}

#[tokio::test(flavor = "multi_thread")]
async fn vault_failures_fail_the_job_before_its_script_with_the_servers_reason() {
    let bao = bao();
    let h = Harness::shell().await;
    let down = unreachable_url();
    let ids = [
        h.enqueue(failing_job(
            "role",
            json!({"DB": vault(&bao.url, "kv-v2", "secret", "ci/db", "password", "other-project")}),
        )),
        h.enqueue(failing_job("path", json!({"DB": vault(&bao.url, "kv-v2", "secret", "ci/nope", "password", "ci")}))),
        h.enqueue(failing_job("field", json!({"DB": vault(&bao.url, "kv-v1", "kv1", "ci/db", "nope", "ci")}))),
        h.enqueue(failing_job("down", json!({"DB": vault(&down, "kv-v2", "secret", "ci/db", "password", "ci")}))),
    ];
    let role = h.finished(ids[0]).await;
    failed_resolving(&role, "runner_configuration_error", "DB", &bao.url, "claim \"project_path\" does not match");
    let path = h.finished(ids[1]).await;
    failed_resolving(&path, "runner_system_failure", "DB", &bao.url, "secret not found: secret/data/ci/nope");
    let field = h.finished(ids[2]).await;
    failed_resolving(&field, "runner_system_failure", "DB", &bao.url, "field \"nope\" of kv1/ci/db");
    let unreachable = h.finished(ids[3]).await;
    failed_resolving(&unreachable, "runner_system_failure", "DB", &down, "Connection refused");

    // With FF_SECRET_RESOLVING_FAILS_IF_MISSING off, a missing secret is an empty variable.
    let lenient = JobSpec::new("group/project", "lenient", &["test -z \"$DB\" && echo DB-IS-EMPTY"])
        .id_token("VAULT_ID_TOKEN", AUD)
        .variable("FF_SECRET_RESOLVING_FAILS_IF_MISSING", "false")
        .secrets(json!({"DB": not_a_file(vault(&bao.url, "kv-v2", "secret", "ci/nope", "password", "ci"))}));
    let record = h.finished(h.enqueue(lenient)).await;
    assert_eq!(record.final_state.as_deref(), Some("success"), "trace:\n{}", record.trace_text());
    assert!(record.trace_text().contains("DB-IS-EMPTY"));
}

#[tokio::test(flavor = "multi_thread")]
async fn gitlab_secrets_manager_reads_openbao_with_inline_auth() {
    let bao = bao();
    let h = Harness::shell().await;
    let secrets = json!({
        "DEPLOY_FILE": gsm(&bao.url, "project_42/DEPLOY_KEY", "value", "project_42"),
        "DEPLOY_VAR": not_a_file(gsm(&bao.url, "project_42/DEPLOY_KEY", "value", "project_42")),
    });
    let id = h.enqueue(reading_job("gsm", secrets, "DEPLOY_FILE", "DEPLOY_VAR", "sha256sum"));
    let record = h.finished(id).await;
    let trace = record.trace_text();
    assert_eq!(record.final_state.as_deref(), Some("success"), "trace:\n{trace}\nbao:\n{}", bao.log());
    assert!(trace.contains(&sha256(GSM_VALUE)), "the value did not reach the job:\n{trace}");
    assert!(trace.contains("file says [MASKED], variable says [MASKED]"), "not masked:\n{trace}");
    assert!(trace.contains("Using \"gitlab_secrets_manager\" secret resolver..."), "{trace}");
    leaks_nothing(&record);

    let down = unreachable_url();
    let ids = [
        h.enqueue(failing_job("role", json!({"K": gsm(&bao.url, "project_42/DEPLOY_KEY", "value", "project_7")}))),
        h.enqueue(failing_job("path", json!({"K": gsm(&bao.url, "project_42/NOPE", "value", "project_42")}))),
        h.enqueue(failing_job("field", json!({"K": gsm(&bao.url, "project_42/DEPLOY_KEY", "nope", "project_42")}))),
        h.enqueue(failing_job("down", json!({"K": gsm(&down, "project_42/DEPLOY_KEY", "value", "project_42")}))),
    ];
    let role = h.finished(ids[0]).await;
    failed_resolving(&role, "runner_configuration_error", "K", &bao.url, "claim \"project_id\" does not match");
    let path = h.finished(ids[1]).await;
    failed_resolving(&path, "runner_system_failure", "K", &bao.url, "secret not found: gsm/data/project_42/NOPE");
    let field = h.finished(ids[2]).await;
    failed_resolving(&field, "runner_system_failure", "K", &bao.url, "field \"nope\" not found in secret");
    let unreachable = h.finished(ids[3]).await;
    failed_resolving(&unreachable, "runner_system_failure", "K", &down, "Connection refused");
}

/// Every file under `dir`, recursively.
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resumed_job_goes_on_with_the_secrets_it_read_sealed_in_the_store() {
    let bao = bao();
    const FIRST: &str = "resume-first-Value-3141";
    const CHANGED: &str = "resume-changed-Value-2718";
    bao.run(&["kv", "put", "-mount=kv1", "ci/resume", &format!("password={FIRST}")]);
    let mut h = Harness::shell_with("  [runners.store]\n  health_interval = 1").await;
    let spec = JobSpec::new(
        "group/project",
        "resume",
        &[
            "printf 'before %s\\n' \"$(printf '%s' \"$DB\" | sha256sum | cut -c1-64)\"",
            "for i in $(seq 1 60); do echo \"line $i\"; sleep 0.1; done",
        ],
    )
    .after_script(&["printf 'after %s\\n' \"$(printf '%s' \"$DB\" | sha256sum | cut -c1-64)\"", "echo \"now $DB\""])
    .id_token("VAULT_ID_TOKEN", AUD)
    .secrets(json!({"DB": not_a_file(vault(&bao.url, "kv-v1", "kv1", "ci/resume", "password", "ci"))}));
    let id = h.enqueue(spec);
    h.fake.wait_for_job_state(id, |j| j.trace_text().contains("line 5"), WAIT).await.expect("the job runs");
    // Killed mid-stage; the store has the job, sealed: the value is nowhere in clear.
    h.process.kill9();
    let store = h.root.path().join(".runway/store");
    let files = files_under(&store);
    // An entry file, or the journal holding writes not yet in the files (its header is
    // `runway::store::jobs::journal::MAGIC`; a longer journal holds writes).
    let magic = runway::store::jobs::journal::MAGIC.len() as u64;
    let holds_entry = |f: &std::path::PathBuf| {
        f.extension().is_some_and(|e| e == "json")
            || (f.file_name().is_some_and(|n| n == "journal") && std::fs::metadata(f).is_ok_and(|m| m.len() > magic))
    };
    assert!(files.iter().any(holds_entry), "no store entry in {files:?}");
    for file in &files {
        let bytes = std::fs::read(file).unwrap_or_default();
        assert!(!bytes.windows(FIRST.len()).any(|w| w == FIRST.as_bytes()), "{} holds the secret", file.display());
    }
    // The secret changes meanwhile: a second read would see it.
    bao.run(&["kv", "put", "-mount=kv1", "ci/resume", &format!("password={CHANGED}")]);
    h.process.start();
    let record = h.finished(id).await;
    let trace = record.trace_text();
    assert_eq!(record.final_state.as_deref(), Some("success"), "trace:\n{trace}\nrunway:\n{}", h.process.log());
    assert_eq!(trace.matches("Resolving secrets").count(), 1, "resolved again:\n{trace}");
    assert!(trace.contains(&format!("before {}", sha256(FIRST))), "{trace}");
    assert!(trace.contains(&format!("after {}", sha256(FIRST))), "the resumed job lost its secret:\n{trace}");
    assert!(trace.contains("now [MASKED]"), "the resumed job's log does not mask it:\n{trace}");
    assert!(!trace.contains(FIRST) && !trace.contains(CHANGED), "{trace}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_docker_job_gets_its_secrets_as_a_file_and_a_variable_in_its_container() {
    let bao = bao();
    let docker = tokio::task::spawn_blocking(dockerd::shared).await.expect("daemon");
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(1), trace_update_interval: 1 })
            .await;
    let runner = fake.create_runner("secrets on docker");
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "hi\n")], "init");
    let root = tempfile::tempdir().expect("tempdir");
    let config = format!(
        r#"concurrent = 1
check_interval = 1
shutdown_timeout = 5

[plugins.docker]
allow_docker = ["{host}"]

[[runners]]
name = "docker"
url = "{url}"
token = "{token}"
executor = "docker"
  [runners.docker]
  host = "{host}"
  image = "{image}"
  pull_policy = ["if-not-present"]
"#,
        url = fake.url(),
        token = runner.token,
        host = docker.host(),
        image = docker.job_image(),
    );
    std::fs::write(root.path().join("config.toml"), config).expect("config.toml");
    let mut process = RunwayProcess::new(root.path().to_path_buf()).env_remove("DOCKER_HOST").quit_on_drop();
    process.start();
    let secrets = json!({
        "DB_FILE": vault(&bao.url, "kv-v2", "secret", "ci/db", "password", "ci"),
        "DB_V1": not_a_file(vault(&bao.url, "kv-v1", "kv1", "ci/db", "password", "ci")),
    });
    // The job network cannot reach the fake's git server on the runner's loopback. The job
    // image has no hashing program: the values show upper-cased (not what the masker masks).
    let spec = reading_job("docker", secrets, "DB_FILE", "DB_V1", "tr a-z A-Z; echo").variable("GIT_STRATEGY", "none");
    let id = fake.enqueue(fake.job_payload(&spec));
    let Some(record) = fake.wait_for_job_state(id, |j| j.final_state.is_some(), Duration::from_secs(240)).await else {
        panic!(
            "the docker job did not finish:\n{}\n{}",
            fake.job(id).map(|j| j.trace_text()).unwrap_or_default(),
            process.log()
        );
    };
    let trace = record.trace_text();
    assert_eq!(record.final_state.as_deref(), Some("success"), "trace:\n{trace}\nrunway:\n{}", process.log());
    assert!(trace.contains(&V2_VALUE.to_uppercase()) && trace.contains(&V1_VALUE.to_uppercase()), "{trace}");
    assert!(trace.contains("a file: /builds/"), "not a file in the container:\n{trace}");
    assert!(trace.contains("file says [MASKED], variable says [MASKED]"), "not masked:\n{trace}");
    leaks_nothing(&record);
}
