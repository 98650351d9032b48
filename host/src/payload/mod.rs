//! The job payload GitLab sends in a `POST /jobs/request` 201 response (protocol reference §2).
//!
//! Decoding is lenient the way GitLab's own runner is: unknown keys are ignored, `null` is
//! accepted wherever Rails may emit it, and `entrypoint`/`command` may be a string or a list.
//! `runway exec` builds the same type from `.gitlab-ci.yml`, so everything downstream of the
//! API sees one shape.
//!
//! A leaf: every stage of the job path reads this type, and it imports nothing of the crate.
//! [`variables`] holds GitLab's variable rules (dedup, `$VAR` expansion) over it.

pub mod flags;
pub mod secrets;
pub mod variables;

use serde::{Deserialize, Deserializer, Serialize};

/// Decode `null` as the type's default.
fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Decode a string or a list of strings as a list (`"a b"` stays one element).
fn string_or_list<'de, D>(d: D) -> Result<Vec<String>, D::Error>
where
    D: Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum StringOrList {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Option::<StringOrList>::deserialize(d)? {
        None => Vec::new(),
        Some(StringOrList::One(s)) => vec![s],
        Some(StringOrList::Many(v)) => v,
    })
}

/// A job as GitLab sends it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct JobResponse {
    /// The job ID.
    pub id: i64,
    /// The correlation ID of the job request that handed the job out (GitLab's `X-Request-Id`
    /// answer); not part of the payload. Sent to Gitaly with the job's clone
    /// (`FF_USE_GITALY_CORRELATION_ID`).
    #[serde(skip)]
    pub request_correlation_id: String,
    /// The job token: authenticates trace, update, artifact and git calls for this job.
    pub token: String,
    /// May the runner fetch into an existing checkout (`GIT_STRATEGY: fetch`)?
    #[serde(default, deserialize_with = "null_default")]
    pub allow_git_fetch: bool,
    /// Names and IDs of the job, its pipeline and project.
    #[serde(default, deserialize_with = "null_default")]
    pub job_info: JobInfo,
    /// What to check out.
    #[serde(default, deserialize_with = "null_default")]
    pub git_info: GitInfo,
    /// Runner-side settings GitLab decided (the timeout).
    #[serde(default, deserialize_with = "null_default")]
    pub runner_info: RunnerInfo,
    /// The job's variables, in GitLab's order (later duplicates win).
    #[serde(default, deserialize_with = "null_default")]
    pub variables: Vec<JobVariable>,
    /// The scripts to run: `script` (with before_script), `after_script`, `release`.
    #[serde(default, deserialize_with = "null_default")]
    pub steps: Vec<Step>,
    /// Hooks such as `pre_get_sources_script`.
    #[serde(default, deserialize_with = "null_default")]
    pub hooks: Vec<Hook>,
    /// `image:` of the job, for container executors.
    #[serde(default)]
    pub image: Option<Image>,
    /// `services:` of the job, for container executors.
    #[serde(default, deserialize_with = "null_default")]
    pub services: Vec<Image>,
    /// Credentials GitLab hands the runner (registry logins for container images).
    #[serde(default, deserialize_with = "null_default")]
    pub credentials: Vec<Credential>,
    /// `secrets:`: CI variables whose values the runner reads from a secret store before the
    /// job's first stage.
    #[serde(default, deserialize_with = "null_default")]
    pub secrets: secrets::Secrets,
    /// `artifacts:` entries (one per type).
    #[serde(default, deserialize_with = "null_default")]
    pub artifacts: Vec<Artifact>,
    /// `cache:` entries.
    #[serde(default, deserialize_with = "null_default")]
    pub cache: Vec<Cache>,
    /// Jobs whose artifacts this job downloads.
    #[serde(default, deserialize_with = "null_default")]
    pub dependencies: Vec<Dependency>,
    /// What GitLab supports for this job.
    #[serde(default, deserialize_with = "null_default")]
    pub features: JobFeatures,
    /// `run:` (CI Steps), JSON-encoded; Runway does not run native steps and fails such jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
}

/// `job_info`: names and IDs of the job, its pipeline and project.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct JobInfo {
    /// The job ID.
    #[serde(default, deserialize_with = "null_default")]
    pub id: i64,
    /// The job name.
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    /// The stage name.
    #[serde(default, deserialize_with = "null_default")]
    pub stage: String,
    /// The pipeline ID.
    #[serde(default, deserialize_with = "null_default")]
    pub pipeline_id: i64,
    /// The project ID.
    #[serde(default, deserialize_with = "null_default")]
    pub project_id: i64,
    /// The project name.
    #[serde(default, deserialize_with = "null_default")]
    pub project_name: String,
    /// `group/subgroup/project`.
    #[serde(default, deserialize_with = "null_default")]
    pub project_full_path: String,
    /// How long the job waited in GitLab's queue.
    #[serde(default, deserialize_with = "null_default")]
    pub time_in_queue_seconds: f64,
    /// How many jobs of the project run on instance runners (`"0"`, `"1"`, ... or `"+Inf"`;
    /// a label of `gitlab_runner_job_queue_duration_seconds`).
    #[serde(default, deserialize_with = "null_default")]
    pub project_jobs_running_on_instance_runners_count: String,
    /// Jobs in the runner's queue when this one was picked.
    #[serde(default, deserialize_with = "null_default")]
    pub queue_size: i64,
    /// How deep in the queue GitLab searched for this job.
    #[serde(default, deserialize_with = "null_default")]
    pub queue_depth: i64,
}

/// `git_info`: what to check out.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GitInfo {
    /// Clone URL with the job token as credentials.
    #[serde(default, deserialize_with = "null_default")]
    pub repo_url: String,
    /// Branch or tag name (`ref`).
    #[serde(default, rename = "ref", deserialize_with = "null_default")]
    pub git_ref: String,
    /// The commit to check out.
    #[serde(default, deserialize_with = "null_default")]
    pub sha: String,
    /// The previous head of the ref.
    #[serde(default, deserialize_with = "null_default")]
    pub before_sha: String,
    /// `branch` or `tag`.
    #[serde(default, deserialize_with = "null_default")]
    pub ref_type: String,
    /// Refspecs to fetch.
    #[serde(default, deserialize_with = "null_default")]
    pub refspecs: Vec<String>,
    /// Shallow clone depth (0: full).
    #[serde(default, deserialize_with = "null_default")]
    pub depth: i64,
    /// `sha1` or `sha256`.
    #[serde(default, deserialize_with = "null_default")]
    pub repo_object_format: String,
}

/// `runner_info`: runner-side settings GitLab decided.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RunnerInfo {
    /// Job timeout in seconds (≤ 0 means the default, 7200).
    #[serde(default, deserialize_with = "null_default")]
    pub timeout: i64,
}

/// One job variable (§2.3).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct JobVariable {
    /// The name.
    pub key: String,
    /// The value (for a file variable, the file's content).
    #[serde(default, deserialize_with = "null_default")]
    pub value: String,
    /// May it appear in logs unmasked?
    #[serde(default, deserialize_with = "null_default")]
    pub public: bool,
    /// Must its value be masked in the job log?
    #[serde(default, deserialize_with = "null_default")]
    pub masked: bool,
    /// Is it a file variable (the value is written to a file, the variable holds its path)?
    #[serde(default, deserialize_with = "null_default")]
    pub file: bool,
    /// Is it exempt from `$VAR` expansion (`expand: false`)?
    #[serde(default, deserialize_with = "null_default")]
    pub raw: bool,
}

impl JobVariable {
    /// A plain public variable.
    pub fn public(key: &str, value: &str) -> Self {
        JobVariable { key: key.into(), value: value.into(), public: true, ..Default::default() }
    }
}

/// When a step runs.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StepWhen {
    /// Only while nothing has failed (the default).
    #[default]
    #[serde(alias = "")]
    OnSuccess,
    /// Only after a failure.
    OnFailure,
    /// Whatever happened before.
    Always,
}

/// One step (§2.5): `script` (before_script + script), `after_script`, `release`, ...
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Step {
    /// `script`, `after_script`, `release`, ...
    pub name: String,
    /// The lines to run.
    #[serde(default, deserialize_with = "null_default")]
    pub script: Vec<String>,
    /// Seconds (0: the job's timeout).
    #[serde(default, deserialize_with = "null_default")]
    pub timeout: i64,
    /// When it runs.
    #[serde(default, deserialize_with = "null_default")]
    pub when: StepWhen,
    /// Does a failure of this step leave the job successful?
    #[serde(default, deserialize_with = "null_default")]
    pub allow_failure: bool,
}

/// One hook (`pre_get_sources_script`, `post_get_sources_script`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Hook {
    /// Which hook.
    pub name: String,
    /// The lines to run.
    #[serde(default, deserialize_with = "null_default")]
    pub script: Vec<String>,
}

/// `image:` or one entry of `services:`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Image {
    /// The image reference.
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    /// Overrides the image's entrypoint.
    #[serde(default, deserialize_with = "string_or_list")]
    pub entrypoint: Vec<String>,
    /// Overrides the image's command.
    #[serde(default, deserialize_with = "string_or_list")]
    pub command: Vec<String>,
    /// Host names of a service (comma or space separated).
    #[serde(default, deserialize_with = "null_default")]
    pub alias: String,
    /// `pull_policy:` (`always`, `if-not-present`, `never`), in order of preference.
    #[serde(default, deserialize_with = "string_or_list")]
    pub pull_policy: Vec<String>,
    /// `variables:` of a service.
    #[serde(default, deserialize_with = "null_default")]
    pub variables: Vec<JobVariable>,
    /// `docker:` and `kubernetes:` options.
    #[serde(default, deserialize_with = "null_default")]
    pub executor_opts: ExecutorOptions,
}

/// `image: docker:` / `kubernetes:` options.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ExecutorOptions {
    /// `docker:` options.
    #[serde(default, deserialize_with = "null_default")]
    pub docker: DockerOptions,
}

/// `image: docker: {platform, user}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DockerOptions {
    /// `platform:`, e.g. `linux/arm64`.
    #[serde(default, deserialize_with = "null_default")]
    pub platform: String,
    /// `user:` the job's containers run as.
    #[serde(default, deserialize_with = "null_default")]
    pub user: String,
}

/// One entry of `credentials`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Credential {
    /// `registry` (the only type runners use).
    #[serde(default, rename = "type", deserialize_with = "null_default")]
    pub kind: String,
    /// The registry, e.g. `registry.gitlab.example.com`.
    #[serde(default, deserialize_with = "null_default")]
    pub url: String,
    /// User name.
    #[serde(default, deserialize_with = "null_default")]
    pub username: String,
    /// Password or token.
    #[serde(default, deserialize_with = "null_default")]
    pub password: String,
}

/// One `artifacts:` entry.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Artifact {
    /// Archive name.
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    /// Include files git does not track?
    #[serde(default, deserialize_with = "null_default")]
    pub untracked: bool,
    /// Paths and globs to include.
    #[serde(default, deserialize_with = "null_default")]
    pub paths: Vec<String>,
    /// Paths and globs to leave out.
    #[serde(default, deserialize_with = "null_default")]
    pub exclude: Vec<String>,
    /// `on_success`, `on_failure` or `always`.
    #[serde(default, deserialize_with = "null_default")]
    pub when: String,
    /// How long GitLab keeps it (`"1 week"`).
    #[serde(default, deserialize_with = "null_default")]
    pub expire_in: String,
    /// `archive` or a report type (`junit`, `dotenv`, ...).
    #[serde(default, deserialize_with = "null_default")]
    pub artifact_type: String,
    /// `zip`, `gzip` or `raw`.
    #[serde(default, deserialize_with = "null_default")]
    pub artifact_format: String,
}

/// One `cache:` entry.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Cache {
    /// The cache key.
    #[serde(default, deserialize_with = "null_default")]
    pub key: String,
    /// Include files git does not track?
    #[serde(default, deserialize_with = "null_default")]
    pub untracked: bool,
    /// Paths and globs to cache.
    #[serde(default, deserialize_with = "null_default")]
    pub paths: Vec<String>,
    /// `pull-push`, `pull` or `push`.
    #[serde(default, deserialize_with = "null_default")]
    pub policy: String,
    /// `on_success`, `on_failure` or `always`.
    #[serde(default, deserialize_with = "null_default")]
    pub when: String,
    /// Keys to restore from when `key` has no cache.
    #[serde(default, deserialize_with = "null_default")]
    pub fallback_keys: Vec<String>,
}

/// A job whose artifacts this job downloads.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Dependency {
    /// Its job ID.
    pub id: i64,
    /// Its job name.
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    /// Its job token, for the download.
    #[serde(default, deserialize_with = "null_default")]
    pub token: String,
    /// Its artifacts archive, when it has one.
    #[serde(default)]
    pub artifacts_file: Option<ArtifactsFile>,
}

/// An artifacts archive of a dependency.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ArtifactsFile {
    /// The archive's file name.
    #[serde(default, deserialize_with = "null_default")]
    pub filename: String,
    /// Its size in bytes.
    #[serde(default, deserialize_with = "null_default")]
    pub size: i64,
}

/// `features` of the job payload (what GitLab supports for this job).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct JobFeatures {
    /// Does GitLab render section markers?
    #[serde(default, deserialize_with = "null_default")]
    pub trace_sections: bool,
    /// Token prefixes whose tokens the log masks.
    #[serde(default, deserialize_with = "null_default")]
    pub token_mask_prefixes: Vec<String>,
    /// Failure reasons GitLab accepts in the final update.
    #[serde(default, deserialize_with = "null_default")]
    pub failure_reasons: Vec<String>,
}

/// A payload that does not decode as a job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid job payload at `{path}`: {message}")]
pub struct PayloadError {
    /// Where in the document the error is (`steps[0].script`; `.` for the root).
    pub path: String,
    /// What is wrong there.
    pub message: String,
}

impl JobResponse {
    /// Decode a payload; the error says which field is wrong.
    pub fn from_json(bytes: &[u8]) -> Result<Self, PayloadError> {
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        serde_path_to_error::deserialize(de)
            .map_err(|e| PayloadError { path: e.path().to_string(), message: e.inner().to_string() })
    }

    /// What the job log masks: the values of `masked` variables, non-empty, each once, in
    /// payload order. The one derivation every log sink uses.
    pub fn masked_values(&self) -> Vec<String> {
        let mut values: Vec<String> = Vec::new();
        for v in self.variables.iter().filter(|v| v.masked && !v.value.is_empty()) {
            if !values.contains(&v.value) {
                values.push(v.value.clone());
            }
        }
        values
    }

    /// The value of a job variable (last one wins, as GitLab's `Dedup`).
    pub fn variable(&self, key: &str) -> Option<&str> {
        self.variables.iter().rev().find(|v| v.key == key).map(|v| v.value.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_reference_example() {
        let bytes = include_bytes!("../../../tests/fixtures/job-response-example.json");
        let job = JobResponse::from_json(bytes).expect("example decodes");
        assert_eq!(job.id, 10);
        assert_eq!(job.git_info.git_ref, "main");
        assert_eq!(job.steps.len(), 2);
        assert_eq!(job.steps[1].when, StepWhen::Always);
        assert_eq!(job.services[0].command, vec!["sleep", "30"]);
        assert_eq!(job.services[0].alias, "db-pg");
        assert_eq!(job.dependencies[0].artifacts_file.as_ref().map(|a| a.size), Some(13631488));
    }

    #[test]
    fn accepts_nulls_and_string_entrypoints() {
        let job = JobResponse::from_json(
            br#"{"id":1,"token":"t","image":{"name":"alpine","entrypoint":"/bin/sh"},"steps":null,"variables":[{"key":"A","value":null}],"unknown":{"x":1}}"#,
        )
        .expect("decodes");
        assert!(job.steps.is_empty());
        assert_eq!(job.variable("A"), Some(""));
        assert_eq!(job.image.map(|i| i.entrypoint), Some(vec!["/bin/sh".to_string()]));
    }

    #[test]
    fn names_the_bad_field() {
        let err = JobResponse::from_json(br#"{"id":1,"token":"t","steps":[{"name":"script","script":"echo"}]}"#)
            .expect_err("must fail")
            .to_string();
        assert!(err.contains("steps[0].script"), "{err}");
    }
}
