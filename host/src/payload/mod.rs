//! The job payload GitLab sends in a `POST /jobs/request` 201 response (protocol reference §2).
//!
//! Decoding is lenient the way GitLab's own runner is: unknown keys are ignored, `null` is
//! accepted wherever Rails may emit it, and `entrypoint`/`command` may be a string or a list.
//! `runway exec` builds the same type from `.gitlab-ci.yml`, so everything downstream of the
//! API sees one shape.
//!
//! A leaf: every stage of the job path reads this type, and it imports nothing of the crate.
//! [`variables`] holds GitLab's variable rules (dedup, `$VAR` expansion) over it.

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
    pub id: i64,
    pub token: String,
    #[serde(default, deserialize_with = "null_default")]
    pub allow_git_fetch: bool,
    #[serde(default, deserialize_with = "null_default")]
    pub job_info: JobInfo,
    #[serde(default, deserialize_with = "null_default")]
    pub git_info: GitInfo,
    #[serde(default, deserialize_with = "null_default")]
    pub runner_info: RunnerInfo,
    #[serde(default, deserialize_with = "null_default")]
    pub variables: Vec<JobVariable>,
    #[serde(default, deserialize_with = "null_default")]
    pub steps: Vec<Step>,
    #[serde(default, deserialize_with = "null_default")]
    pub hooks: Vec<Hook>,
    #[serde(default)]
    pub image: Option<Image>,
    #[serde(default, deserialize_with = "null_default")]
    pub services: Vec<Image>,
    #[serde(default, deserialize_with = "null_default")]
    pub artifacts: Vec<Artifact>,
    #[serde(default, deserialize_with = "null_default")]
    pub cache: Vec<Cache>,
    #[serde(default, deserialize_with = "null_default")]
    pub dependencies: Vec<Dependency>,
    #[serde(default, deserialize_with = "null_default")]
    pub features: JobFeatures,
    /// `run:` (CI Steps), JSON-encoded; Runway does not run native steps and fails such jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct JobInfo {
    #[serde(default, deserialize_with = "null_default")]
    pub id: i64,
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    #[serde(default, deserialize_with = "null_default")]
    pub stage: String,
    #[serde(default, deserialize_with = "null_default")]
    pub pipeline_id: i64,
    #[serde(default, deserialize_with = "null_default")]
    pub project_id: i64,
    #[serde(default, deserialize_with = "null_default")]
    pub project_name: String,
    #[serde(default, deserialize_with = "null_default")]
    pub project_full_path: String,
    #[serde(default, deserialize_with = "null_default")]
    pub time_in_queue_seconds: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GitInfo {
    #[serde(default, deserialize_with = "null_default")]
    pub repo_url: String,
    #[serde(default, rename = "ref", deserialize_with = "null_default")]
    pub git_ref: String,
    #[serde(default, deserialize_with = "null_default")]
    pub sha: String,
    #[serde(default, deserialize_with = "null_default")]
    pub before_sha: String,
    #[serde(default, deserialize_with = "null_default")]
    pub ref_type: String,
    #[serde(default, deserialize_with = "null_default")]
    pub refspecs: Vec<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub depth: i64,
    #[serde(default, deserialize_with = "null_default")]
    pub repo_object_format: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RunnerInfo {
    /// Job timeout in seconds (≤ 0 means the default, 7200).
    #[serde(default, deserialize_with = "null_default")]
    pub timeout: i64,
}

/// One job variable (§2.3).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct JobVariable {
    pub key: String,
    #[serde(default, deserialize_with = "null_default")]
    pub value: String,
    #[serde(default, deserialize_with = "null_default")]
    pub public: bool,
    #[serde(default, deserialize_with = "null_default")]
    pub masked: bool,
    #[serde(default, deserialize_with = "null_default")]
    pub file: bool,
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
    #[default]
    #[serde(alias = "")]
    OnSuccess,
    OnFailure,
    Always,
}

/// One step (§2.5): `script` (before_script + script), `after_script`, `release`, ...
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Step {
    pub name: String,
    #[serde(default, deserialize_with = "null_default")]
    pub script: Vec<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub timeout: i64,
    #[serde(default, deserialize_with = "null_default")]
    pub when: StepWhen,
    #[serde(default, deserialize_with = "null_default")]
    pub allow_failure: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Hook {
    pub name: String,
    #[serde(default, deserialize_with = "null_default")]
    pub script: Vec<String>,
}

/// `image:` or one entry of `services:`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Image {
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    #[serde(default, deserialize_with = "string_or_list")]
    pub entrypoint: Vec<String>,
    #[serde(default, deserialize_with = "string_or_list")]
    pub command: Vec<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub alias: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Artifact {
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    #[serde(default, deserialize_with = "null_default")]
    pub untracked: bool,
    #[serde(default, deserialize_with = "null_default")]
    pub paths: Vec<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub exclude: Vec<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub when: String,
    #[serde(default, deserialize_with = "null_default")]
    pub expire_in: String,
    #[serde(default, deserialize_with = "null_default")]
    pub artifact_type: String,
    #[serde(default, deserialize_with = "null_default")]
    pub artifact_format: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Cache {
    #[serde(default, deserialize_with = "null_default")]
    pub key: String,
    #[serde(default, deserialize_with = "null_default")]
    pub untracked: bool,
    #[serde(default, deserialize_with = "null_default")]
    pub paths: Vec<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub policy: String,
    #[serde(default, deserialize_with = "null_default")]
    pub when: String,
    #[serde(default, deserialize_with = "null_default")]
    pub fallback_keys: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Dependency {
    pub id: i64,
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    #[serde(default, deserialize_with = "null_default")]
    pub token: String,
    #[serde(default)]
    pub artifacts_file: Option<ArtifactsFile>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ArtifactsFile {
    #[serde(default, deserialize_with = "null_default")]
    pub filename: String,
    #[serde(default, deserialize_with = "null_default")]
    pub size: i64,
}

/// `features` of the job payload (what GitLab supports for this job).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct JobFeatures {
    #[serde(default, deserialize_with = "null_default")]
    pub trace_sections: bool,
    #[serde(default, deserialize_with = "null_default")]
    pub token_mask_prefixes: Vec<String>,
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
