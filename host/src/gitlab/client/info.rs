//! What a runner says about itself: the `info` object (version, platform, executor,
//! features) sent with verify, job request and job update, and the credentials and
//! registration parameters of the runner-token calls.

use serde::{Deserialize, Serialize};

use crate::buildinfo;

/// `features` of the runner `info` (§1.6). Every key is always serialized, in GitLab Runner's
/// order; the caller sets only what the job path really supports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FeaturesInfo {
    pub variables: bool,
    pub image: bool,
    pub services: bool,
    pub artifacts: bool,
    pub cache: bool,
    pub fallback_cache_keys: bool,
    pub shared: bool,
    pub upload_multiple_artifacts: bool,
    pub upload_raw_artifacts: bool,
    pub session: bool,
    pub terminal: bool,
    pub refspecs: bool,
    pub masking: bool,
    pub proxy: bool,
    pub raw_variables: bool,
    pub artifacts_exclude: bool,
    pub multi_build_steps: bool,
    pub trace_reset: bool,
    pub trace_checksum: bool,
    pub trace_size: bool,
    pub vault_secrets: bool,
    pub cancelable: bool,
    pub return_exit_code: bool,
    pub service_variables: bool,
    pub service_multiple_aliases: bool,
    pub image_executor_opts: bool,
    pub service_executor_opts: bool,
    pub cancel_gracefully: bool,
    pub native_steps_integration: bool,
    pub two_phase_job_commit: bool,
    pub job_inputs: bool,
}

/// `info.config`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ConfigInfo {
    pub gpus: String,
}

/// The runner `info` object sent with verify, job request and job update (§1.6).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VersionInfo {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub revision: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub platform: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub architecture: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub executor: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub shell: String,
    pub features: FeaturesInfo,
    pub config: ConfigInfo,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
}

impl VersionInfo {
    /// Name, version, platform and architecture of this build (Go spellings: `amd64`,
    /// `arm64`), with the given executor, shell and features.
    pub fn this_runner(executor: &str, shell: &str, features: FeaturesInfo) -> Self {
        VersionInfo {
            name: "runway".into(),
            version: buildinfo::VERSION.into(),
            revision: buildinfo::REVISION.into(),
            platform: buildinfo::OS.into(),
            architecture: buildinfo::go_arch().into(),
            executor: executor.into(),
            shell: shell.into(),
            features,
            config: ConfigInfo::default(),
            labels: Default::default(),
        }
    }
}

/// A runner's identity towards one GitLab.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerCredentials {
    /// The runner `url` from config.toml (without `/api/v4`).
    pub url: String,
    pub token: String,
    /// `s_…`/`r_…`; empty means "not sent".
    pub system_id: String,
}

/// `POST /runners` body apart from `token` and `info` (§1.1).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegisterParams {
    pub description: String,
    pub maintenance_note: String,
    pub tags: Vec<String>,
    pub run_untagged: bool,
    pub locked: bool,
    /// `not_protected` / `ref_protected`; empty = not sent.
    pub access_level: String,
    /// Seconds; 0 = not sent.
    pub maximum_timeout: i64,
    pub paused: bool,
}

/// `{id, token, token_expires_at}` from register and verify.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct RunnerDetails {
    #[serde(default)]
    pub id: i64,
    #[serde(default)]
    pub token: String,
    #[serde(default)]
    pub token_expires_at: Option<chrono::DateTime<chrono::Utc>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_serialize_every_key_in_gitlab_order() {
        let value = serde_json::to_value(FeaturesInfo { cancelable: true, ..Default::default() }).expect("serializes");
        let keys: Vec<&str> = value.as_object().expect("object").keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 31);
        assert_eq!(value["cancelable"], true);
        assert_eq!(value["two_phase_job_commit"], false);
        let text = serde_json::to_string(&FeaturesInfo::default()).expect("serializes");
        assert!(
            text.starts_with(r#"{"variables":false,"image":false,"services""#)
                && text.ends_with(r#""two_phase_job_commit":false,"job_inputs":false}"#)
        );
    }
}
