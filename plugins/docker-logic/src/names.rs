//! Names and labels of what a job creates on the engine: network, build volume, stage, service
//! and health-check containers. Deterministic from the job ID and the job's suffix, so a
//! resumed job finds its containers again and cleanup finds everything by label.

use std::collections::BTreeMap;

/// Label with the job's ID, on every container, network and build volume of the job.
pub const LABEL_JOB_ID: &str = "runway.job.id";
/// Label with the job's suffix (one job ID may be retried on the same engine).
pub const LABEL_JOB_SUFFIX: &str = "runway.job.suffix";
/// Label on everything Runway creates (`true`).
pub const LABEL_MANAGED: &str = "runway.managed";
/// Label saying what a container is: `stage`, `service`, `wait`.
pub const LABEL_ROLE: &str = "runway.role";
/// Label on cache volumes: the project they belong to.
pub const LABEL_CACHE_PROJECT: &str = "runway.cache.project";

/// The per-job suffix from a random number: 8 hex digits.
pub fn suffix(random: u64) -> String {
    format!("{:08x}", (random ^ (random >> 32)) as u32)
}

/// `runway-job-<id>-<suffix>`: the job's network, and the prefix of everything else it creates.
pub fn job_prefix(job_id: u64, suffix: &str) -> String {
    format!("runway-job-{job_id}-{suffix}")
}

/// The build volume, shared by the helper and build containers.
pub fn build_volume(prefix: &str) -> String {
    format!("{prefix}-builds")
}

/// The container of stage `stage`.
pub fn stage_container(prefix: &str, stage: &str) -> String {
    format!("{prefix}-{}", sanitize(stage))
}

/// The container of service number `index` (its first host name makes it readable).
pub fn service_container(prefix: &str, index: usize, alias: &str) -> String {
    let alias = sanitize(alias);
    if alias.is_empty() {
        format!("{prefix}-svc{index}")
    } else {
        format!("{prefix}-svc{index}-{alias}")
    }
}

/// The health-check container of a service container.
pub fn wait_container(service_container: &str) -> String {
    format!("{service_container}-wait")
}

/// Characters Docker accepts in container names (`[a-zA-Z0-9_.-]`), others replaced with `-`,
/// at most 48 of them.
pub fn sanitize(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-' { c } else { '-' })
        .take(48)
        .collect::<String>()
        .trim_matches(|c| c == '-' || c == '.')
        .to_string()
}

/// The labels of a job's container (or, with `role` empty, network and build volume).
pub fn job_labels(job_id: u64, suffix: &str, role: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    labels.insert(LABEL_JOB_ID.to_string(), job_id.to_string());
    labels.insert(LABEL_JOB_SUFFIX.to_string(), suffix.to_string());
    labels.insert(LABEL_MANAGED.to_string(), "true".to_string());
    if !role.is_empty() {
        labels.insert(LABEL_ROLE.to_string(), role.to_string());
    }
    labels
}

/// The labels of a cache volume (no job labels: it outlives the job).
pub fn cache_labels(project: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    labels.insert(LABEL_MANAGED.to_string(), "true".to_string());
    labels.insert(LABEL_CACHE_PROJECT.to_string(), project.to_string());
    labels
}

/// The `filters` query value selecting every container of the job (`GET /containers/json`).
pub fn job_filter(job_id: u64, suffix: &str) -> String {
    serde_json::json!({ "label": [format!("{LABEL_JOB_ID}={job_id}"), format!("{LABEL_JOB_SUFFIX}={suffix}")] })
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_deterministic() {
        let prefix = job_prefix(42, "0badcafe");
        assert_eq!(prefix, "runway-job-42-0badcafe");
        assert_eq!(build_volume(&prefix), "runway-job-42-0badcafe-builds");
        assert_eq!(stage_container(&prefix, "step_script"), "runway-job-42-0badcafe-step_script");
        assert_eq!(stage_container(&prefix, "step release/x"), "runway-job-42-0badcafe-step-release-x");
        assert_eq!(service_container(&prefix, 0, "tutum__wordpress"), "runway-job-42-0badcafe-svc0-tutum__wordpress");
        assert_eq!(service_container(&prefix, 1, ""), "runway-job-42-0badcafe-svc1");
        assert_eq!(wait_container("x-svc0"), "x-svc0-wait");
        assert_eq!(suffix(0x1234_5678_0000_0000).len(), 8);
        assert_eq!(sanitize("--a b--"), "a-b");
    }

    #[test]
    fn labels_and_filters() {
        let labels = job_labels(7, "abc", "stage");
        assert_eq!(labels[LABEL_JOB_ID], "7");
        assert_eq!(labels[LABEL_MANAGED], "true");
        assert_eq!(labels[LABEL_ROLE], "stage");
        assert!(!job_labels(7, "abc", "").contains_key(LABEL_ROLE));
        assert!(!cache_labels("g/p").contains_key(LABEL_JOB_ID));
        assert_eq!(job_filter(7, "abc"), r#"{"label":["runway.job.id=7","runway.job.suffix=abc"]}"#);
    }
}
