//! A realistic job payload (the `POST /jobs/request` 201 body, protocol §2) for a job spec,
//! shaped like `job-response-example.json` plus the parts GitLab adds (`features`, CI variables).

use serde_json::{json, Value};

use crate::{JOB_ID_PLACEHOLDER, JOB_TOKEN_PLACEHOLDER};

/// What a test says about a job; everything else gets GitLab-like defaults.
#[derive(Debug, Clone)]
pub struct JobSpec {
    /// `group/project`, served by the fake's git server.
    pub project: String,
    pub name: String,
    pub stage: String,
    pub git_ref: String,
    /// before_script + script lines.
    pub script: Vec<String>,
    pub after_script: Vec<String>,
    /// Extra public variables (key, value).
    pub variables: Vec<(String, String)>,
    /// Extra masked variables (key, value).
    pub masked_variables: Vec<(String, String)>,
    /// `runner_info.timeout` and step timeouts, seconds.
    pub timeout: i64,
    /// `image.name`, if any.
    pub image: Option<String>,
    /// `artifacts[]` entries as Rails sends them (see [`JobSpec::artifacts`]).
    pub artifacts: Vec<Value>,
    /// `cache[]` entries as Rails sends them.
    pub cache: Vec<Value>,
    /// IDs of the jobs whose artifacts this one gets; the fake fills in the rest when it
    /// hands the job out.
    pub dependencies: Vec<i64>,
    /// `id_tokens:` (variable name, `aud`): each a masked variable holding an ID token.
    pub id_tokens: Vec<(String, String)>,
    /// `secrets:` as Rails sends it (variable name → `{vault: …}`, …); `Null` for none.
    pub secrets: Value,
}

impl JobSpec {
    /// A job `name` on `main` of `project` running `script`.
    pub fn new(project: &str, name: &str, script: &[&str]) -> Self {
        JobSpec {
            project: project.to_string(),
            name: name.to_string(),
            stage: "test".to_string(),
            git_ref: "main".to_string(),
            script: script.iter().map(|s| s.to_string()).collect(),
            after_script: Vec::new(),
            variables: Vec::new(),
            masked_variables: Vec::new(),
            timeout: 3600,
            image: None,
            artifacts: Vec::new(),
            cache: Vec::new(),
            dependencies: Vec::new(),
            id_tokens: Vec::new(),
            secrets: Value::Null,
        }
    }

    pub fn after_script(mut self, lines: &[&str]) -> Self {
        self.after_script = lines.iter().map(|s| s.to_string()).collect();
        self
    }

    pub fn variable(mut self, key: &str, value: &str) -> Self {
        self.variables.push((key.to_string(), value.to_string()));
        self
    }

    /// Adds an `artifacts[]` entry; missing keys get Rails' defaults (`archive`, `zip`,
    /// `on_success`).
    pub fn artifacts(mut self, entry: Value) -> Self {
        let mut full = json!({
            "name": "artifacts", "untracked": false, "paths": [], "exclude": [], "when": "on_success",
            "expire_in": Value::Null, "artifact_type": "archive", "artifact_format": "zip"
        });
        if let (Some(full), Some(entry)) = (full.as_object_mut(), entry.as_object()) {
            for (k, v) in entry {
                full.insert(k.clone(), v.clone());
            }
        }
        self.artifacts.push(full);
        self
    }

    /// Adds a `cache[]` entry; missing keys get Rails' defaults (`pull-push`, `on_success`).
    pub fn cache(mut self, entry: Value) -> Self {
        let mut full = json!({
            "key": "default", "untracked": false, "paths": [], "policy": "pull-push", "when": "on_success",
            "fallback_keys": []
        });
        if let (Some(full), Some(entry)) = (full.as_object_mut(), entry.as_object()) {
            for (k, v) in entry {
                full.insert(k.clone(), v.clone());
            }
        }
        self.cache.push(full);
        self
    }

    /// This job gets the artifacts of job `id` (`dependencies` / `needs:artifacts`).
    pub fn dependency(mut self, id: i64) -> Self {
        self.dependencies.push(id);
        self
    }

    /// An `id_tokens:` entry: variable `name` holds an ID token for audience `aud`.
    pub fn id_token(mut self, name: &str, aud: &str) -> Self {
        self.id_tokens.push((name.to_string(), aud.to_string()));
        self
    }

    /// The job's `secrets:` as Rails sends them in the payload.
    pub fn secrets(mut self, secrets: Value) -> Self {
        self.secrets = secrets;
        self
    }

    pub fn masked_variable(mut self, key: &str, value: &str) -> Self {
        self.masked_variables.push((key.to_string(), value.to_string()));
        self
    }
}

fn var(key: &str, value: &str, public: bool, masked: bool) -> Value {
    json!({ "key": key, "value": value, "public": public, "masked": masked })
}

/// The payload; the job id and token are placeholders [`crate::FakeGitLab::enqueue`] fills in.
pub(crate) fn build(spec: &JobSpec, server_url: &str, sha: &str) -> Value {
    let host_port = server_url.trim_start_matches("http://");
    let project_name = spec.project.rsplit('/').next().unwrap_or(&spec.project);
    let namespace = spec.project.rsplit_once('/').map(|(ns, _)| ns).unwrap_or("");
    let repo_url = format!("http://gitlab-ci-token:{JOB_TOKEN_PLACEHOLDER}@{host_port}/{}.git", spec.project);
    let project_url = format!("{server_url}/{}", spec.project);
    let mut variables = vec![
        var("CI_PIPELINE_ID", "77", true, false),
        var("CI_PIPELINE_SOURCE", "push", true, false),
        var("CI_JOB_ID", JOB_ID_PLACEHOLDER, true, false),
        var("CI_JOB_URL", &format!("{project_url}/-/jobs/{JOB_ID_PLACEHOLDER}"), true, false),
        var("CI_JOB_TOKEN", JOB_TOKEN_PLACEHOLDER, false, true),
        var("CI_JOB_NAME", &spec.name, true, false),
        var("CI_JOB_STAGE", &spec.stage, true, false),
        var("CI_COMMIT_SHA", sha, true, false),
        var("CI_COMMIT_SHORT_SHA", &sha[..sha.len().min(8)], true, false),
        var("CI_COMMIT_REF_NAME", &spec.git_ref, true, false),
        var("CI_COMMIT_BRANCH", &spec.git_ref, true, false),
        var("CI_DEFAULT_BRANCH", "main", true, false),
        var("CI_PROJECT_ID", "42", true, false),
        var("CI_PROJECT_NAME", project_name, true, false),
        var("CI_PROJECT_NAMESPACE", namespace, true, false),
        var("CI_PROJECT_PATH", &spec.project, true, false),
        var("CI_PROJECT_URL", &project_url, true, false),
        var("CI_REPOSITORY_URL", &repo_url, false, false),
        var("CI_SERVER_URL", server_url, true, false),
        var("CI_SERVER_HOST", host_port.split(':').next().unwrap_or(host_port), true, false),
        var("CI_SERVER_NAME", "GitLab", true, false),
        var("CI_API_V4_URL", &format!("{server_url}/api/v4"), true, false),
        var("CI", "true", true, false),
        var("GITLAB_CI", "true", true, false),
    ];
    variables.extend(spec.variables.iter().map(|(k, v)| var(k, v, true, false)));
    variables.extend(spec.masked_variables.iter().map(|(k, v)| var(k, v, false, true)));
    // Rails adds ID tokens after the other variables, masked; the fake signs them at enqueue.
    variables.extend(
        spec.id_tokens
            .iter()
            .map(|(k, aud)| var(k, &format!("{}{aud}", crate::id_tokens::ID_TOKEN_PLACEHOLDER), false, true)),
    );
    let mut steps = vec![json!({
        "name": "script", "script": spec.script, "timeout": spec.timeout, "when": "on_success", "allow_failure": false
    })];
    if !spec.after_script.is_empty() {
        steps.push(json!({
            "name": "after_script", "script": spec.after_script, "timeout": spec.timeout, "when": "always", "allow_failure": true
        }));
    }
    json!({
        "id": 0,
        "token": JOB_TOKEN_PLACEHOLDER,
        "allow_git_fetch": true,
        "job_info": {
            "id": 0,
            "name": spec.name,
            "stage": spec.stage,
            "pipeline_id": 77,
            "project_id": 42,
            "project_name": project_name,
            "project_full_path": spec.project,
            "time_in_queue_seconds": 0.5,
            "project_jobs_running_on_instance_runners_count": "0",
            "queue_size": 1,
            "queue_depth": 1
        },
        "git_info": {
            "repo_url": repo_url,
            "ref": spec.git_ref,
            "sha": sha,
            "before_sha": "0000000000000000000000000000000000000000",
            "ref_type": "branch",
            "refspecs": [format!("+refs/heads/{0}:refs/remotes/origin/{0}", spec.git_ref)],
            "depth": 20,
            "repo_object_format": "sha1"
        },
        "runner_info": { "timeout": spec.timeout, "runner_session_url": Value::Null },
        "variables": variables,
        "steps": steps,
        "image": spec.image.as_ref().map(|name| json!({ "name": name, "entrypoint": Value::Null, "ports": [] })),
        "services": [],
        "artifacts": spec.artifacts,
        "cache": spec.cache,
        "credentials": [{
            "type": "registry",
            "url": host_port,
            "username": "gitlab-ci-token",
            "password": JOB_TOKEN_PLACEHOLDER
        }],
        "dependencies": spec.dependencies.iter().map(|id| json!({ "id": id })).collect::<Vec<_>>(),
        "features": {
            "trace_sections": true,
            "token_mask_prefixes": ["glpat-", "glcbt-", "glrt-"],
            "failure_reasons": [
                "unknown_failure", "script_failure", "api_failure", "stuck_or_timeout_failure",
                "runner_system_failure", "missing_dependency_failure", "runner_unsupported",
                "stale_schedule", "job_execution_timeout", "archived_failure", "unmet_prerequisites",
                "scheduler_failure", "data_integrity_failure", "forward_deployment_failure",
                "user_blocked", "project_deleted", "ci_quota_exceeded", "pipeline_loop_detected",
                "no_matching_runner", "trace_size_exceeded", "builds_disabled",
                "environment_creation_failure", "deployment_rejected",
                "failed_outdated_deployment_job", "protected_environment_failure",
                "insufficient_bridge_permissions", "downstream_bridge_project_not_found",
                "invalid_bridge_trigger", "upstream_bridge_project_not_found",
                "insufficient_upstream_permissions", "bridge_pipeline_is_child_pipeline",
                "downstream_pipeline_creation_failed", "secrets_provider_not_found",
                "reached_max_descendant_pipelines_depth", "ip_restriction_failure",
                "reached_max_pipeline_hierarchy_size", "runner_configuration_error",
                "runner_external_dependency_failure", "runner_interrupted", "image_pull_failure"
            ]
        },
        "hooks": [],
        "secrets": spec.secrets
    })
}
