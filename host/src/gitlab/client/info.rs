//! What a runner says about itself: the `info` object (version, platform, executor,
//! features) sent with verify, job request and job update, and the credentials and
//! registration parameters of the runner-token calls.

use serde::{Deserialize, Serialize};

use crate::buildinfo;

/// `features` of the runner `info` (§1.6). Every key is always serialized, in GitLab Runner's
/// order; the caller sets only what the job path really supports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FeaturesInfo {
    /// Job variables.
    pub variables: bool,
    /// Job images.
    pub image: bool,
    /// Services beside the job.
    pub services: bool,
    /// Artifact uploads.
    pub artifacts: bool,
    /// Caches.
    pub cache: bool,
    /// `cache:fallback_keys`.
    pub fallback_cache_keys: bool,
    /// Builds directories shared between jobs.
    pub shared: bool,
    /// More than one artifact upload per job.
    pub upload_multiple_artifacts: bool,
    /// Raw (uncompressed) artifact uploads.
    pub upload_raw_artifacts: bool,
    /// The interactive web session server.
    pub session: bool,
    /// Web terminals.
    pub terminal: bool,
    /// Git refspecs from the payload.
    pub refspecs: bool,
    /// Masking of masked variables in the log.
    pub masking: bool,
    /// Proxying to services.
    pub proxy: bool,
    /// Variables that are not expanded.
    pub raw_variables: bool,
    /// `artifacts:exclude`.
    pub artifacts_exclude: bool,
    /// Several build steps.
    pub multi_build_steps: bool,
    /// Re-uploading the trace from 0 after a 412.
    pub trace_reset: bool,
    /// The trace checksum on the final update.
    pub trace_checksum: bool,
    /// The trace size on the final update.
    pub trace_size: bool,
    /// HashiCorp Vault secrets.
    pub vault_secrets: bool,
    /// Cancelation through `Job-Status`.
    pub cancelable: bool,
    /// Exit codes on failed jobs.
    pub return_exit_code: bool,
    /// Variables of services.
    pub service_variables: bool,
    /// Several aliases per service.
    pub service_multiple_aliases: bool,
    /// `image:docker` options.
    pub image_executor_opts: bool,
    /// `services:docker` options.
    pub service_executor_opts: bool,
    /// Graceful cancelation (`canceling`, after_script still runs).
    pub cancel_gracefully: bool,
    /// CI steps run natively.
    pub native_steps_integration: bool,
    /// Two-phase job commit (`pending`, then `running`).
    pub two_phase_job_commit: bool,
    /// Job inputs.
    pub job_inputs: bool,
}

/// `info.config`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ConfigInfo {
    /// `gpus` of the executor config.
    pub gpus: String,
}

/// The runner `info` object sent with verify, job request and job update (§1.6).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VersionInfo {
    /// Always `runway`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Release version.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// Git revision of the build.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub revision: String,
    /// OS (`linux`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub platform: String,
    /// Go architecture name (`amd64`, `arm64`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub architecture: String,
    /// Executor name.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub executor: String,
    /// Shell name.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub shell: String,
    /// What the runner supports.
    pub features: FeaturesInfo,
    /// Selected executor settings.
    pub config: ConfigInfo,
    /// Runner labels.
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
    /// The runner authentication token (`glrt-…`) or a legacy token.
    pub token: String,
    /// `s_…`/`r_…`; empty means "not sent".
    pub system_id: String,
}

/// `POST /runners` body apart from `token` and `info` (§1.1).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegisterParams {
    /// Runner description.
    pub description: String,
    /// Maintenance note; empty = not sent.
    pub maintenance_note: String,
    /// Tags (sent as `tag_list`).
    pub tags: Vec<String>,
    /// Whether untagged jobs run.
    pub run_untagged: bool,
    /// Locked to the project it registered with.
    pub locked: bool,
    /// `not_protected` / `ref_protected`; empty = not sent.
    pub access_level: String,
    /// Seconds; 0 = not sent.
    pub maximum_timeout: i64,
    /// Registered paused.
    pub paused: bool,
}

/// `{id, token, token_expires_at}` from register and verify.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct RunnerDetails {
    /// Runner id (0 when GitLab did not say).
    #[serde(default)]
    pub id: i64,
    /// The runner token.
    #[serde(default)]
    pub token: String,
    /// When the token expires, if it does.
    #[serde(default)]
    pub token_expires_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// `{token, token_expires_at}` from `POST /runners/reset_authentication_token` (§1.5).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ResetTokenResponse {
    /// The new runner token (the old one is revoked).
    pub token: String,
    /// When the new token expires, if it does.
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
