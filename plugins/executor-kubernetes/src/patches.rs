//! `[[runners.kubernetes.pod_spec]]` for one job: whether `FF_USE_ADVANCED_POD_SPEC_CONFIGURATION`
//! is on, the patches read (a `patch_path` through the plugin's granted directories), and the
//! job log lines saying so. The patch algorithms live in `kube_logic::patch`; this file owns no
//! pod and no API call.

use kube_logic::config::KubeConfig;
use kube_logic::patch::{self, Patch};
use runway_sdk::executor::ExecutorError;
use runway_sdk::trace;

/// gitlab-runner's reading of a feature flag's value (Go's `strconv.ParseBool`).
fn flag_on(value: &str) -> bool {
    matches!(value, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

/// The patches to apply to this job's pod, in order: none when the config has none or the
/// feature flag is off (then the job log says they are ignored). A patch that cannot be read
/// or parsed fails the job as a configuration error naming it.
pub fn load(config: &KubeConfig, variables: &[(String, String)]) -> Result<Vec<Patch>, ExecutorError> {
    if config.pod_spec.is_empty() {
        return Ok(Vec::new());
    }
    let on = variables.iter().rev().find(|(k, _)| k == patch::FEATURE_FLAG).is_some_and(|(_, v)| flag_on(v));
    if !on {
        trace::write_str(&format!(
            "WARNING: [runners.kubernetes] pod_spec is ignored: {} is off\n",
            patch::FEATURE_FLAG
        ));
        return Ok(Vec::new());
    }
    trace::write_str(
        "WARNING: Advanced Pod Spec configuration enabled, merging the provided PodSpec to the generated one.\n",
    );
    let read = |path: &str| {
        std::fs::read_to_string(path).map_err(|e| {
            format!("{e} (the kubernetes executor reads only directories granted by `dirs` in [plugins.kubernetes])")
        })
    };
    config
        .pod_spec
        .iter()
        .map(|entry| {
            entry.document(read).map_err(|e| ExecutorError::InvalidConfig(format!("[runners.kubernetes] {e}")))
        })
        .collect()
}
