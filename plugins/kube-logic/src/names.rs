//! Names and labels of what a job creates in the cluster: the pod and secret names
//! (gitlab-runner's `runner-<short token>-project-<id>-concurrent-<n>-<suffix>`, a DNS-1123
//! name of at most 63 characters), the container names, and the labels and annotations every
//! object carries (gitlab-runner's `*.runner.gitlab.com/*` ones plus Runway's, so a later
//! manager finds the objects of its runner and job). Pure string work; creates nothing.

use std::collections::BTreeMap;

/// The job's image container.
pub const BUILD_CONTAINER: &str = "build";
/// The helper image container.
pub const HELPER_CONTAINER: &str = "helper";

/// Runway's label on everything it creates (`true`).
pub const LABEL_MANAGED: &str = "runway/managed";
/// Runway's label naming the runner (its short token, sanitized).
pub const LABEL_RUNNER: &str = "runway/runner";
/// Runway's label with the job's ID.
pub const LABEL_JOB: &str = "runway/job";
/// gitlab-runner's label namespace, which pod labels from config or jobs may not use.
pub const GITLAB_LABEL_NAMESPACE: &str = "runner.gitlab.com";

/// Longest DNS-1123 name / label value.
const MAX_NAME: usize = 63;
/// Length of the random suffix of pod and secret names.
const SUFFIX_LEN: usize = 8;

/// The container of service number `index` (config services first, then the job's).
pub fn service_container(index: usize) -> String {
    format!("svc-{index}")
}

/// What a job's objects are named after.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobMeta {
    /// GitLab's job ID.
    pub job_id: u64,
    /// GitLab's project ID.
    pub project_id: u64,
    /// The project's full path (`group/sub/project`).
    pub project_path: String,
    /// The runner's short token (first 8 characters of its token, as gitlab-runner shows it).
    pub short_token: String,
    /// The runner's `name` in config.toml.
    pub runner_name: String,
    /// The slot this job runs in on this runner (gitlab-runner's `concurrent` id).
    pub concurrent: u64,
}

impl JobMeta {
    /// gitlab-runner's `ProjectUniqueName`: `runner-<token>-project-<id>-concurrent-<n>`,
    /// lowered to DNS-1123 characters.
    pub fn project_unique_name(&self) -> String {
        dns_name(&format!("runner-{}-project-{}-concurrent-{}", self.short_token, self.project_id, self.concurrent))
    }
}

/// Lower-case, every character outside `[a-z0-9-]` as `-`, no leading or trailing `-`.
fn dns_name(text: &str) -> String {
    text.chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect::<String>()
        .trim_matches('-')
        .to_string()
}

/// Eight characters of `[a-z0-9]` from a random number.
pub fn random_suffix(random: u64) -> String {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut n = random;
    (0..SUFFIX_LEN)
        .map(|_| {
            let c = CHARS[(n % CHARS.len() as u64) as usize];
            n /= CHARS.len() as u64;
            c as char
        })
        .collect()
}

/// gitlab-runner's `generateNameForK8sResources`: the pattern cut so that `-` and the suffix
/// fit into 63 characters, then `-<suffix>`.
pub fn generated_name(pattern: &str, random: u64) -> String {
    let mut base: String = dns_name(pattern).chars().take(MAX_NAME - SUFFIX_LEN - 1).collect();
    while base.ends_with('-') {
        base.pop();
    }
    format!("{base}-{}", random_suffix(random))
}

/// The job's pod name.
pub fn pod_name(meta: &JobMeta, random: u64) -> String {
    generated_name(&meta.project_unique_name(), random)
}

/// The name of the job's registry-credentials secret (its own suffix, as gitlab-runner's).
pub fn secret_name(meta: &JobMeta, random: u64) -> String {
    generated_name(&meta.project_unique_name(), random.rotate_left(32) ^ 0x5bd1_e995)
}

/// gitlab-runner's `sanitizeLabel`: `[A-Za-z0-9_.-]` kept, others `_`, no leading or trailing
/// `-_.`, at most 63 characters.
pub fn sanitize_label(value: &str) -> String {
    let mapped: String = value
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' })
        .collect();
    let trimmed = mapped.trim_matches(|c| matches!(c, '-' | '_' | '.'));
    let cut: String = trimmed.chars().take(MAX_NAME).collect();
    cut.trim_matches(|c| matches!(c, '-' | '_' | '.')).to_string()
}

/// Whether a label key is in gitlab-runner's reserved `runner.gitlab.com` namespace
/// (`runner.gitlab.com/x`, `job.runner.gitlab.com/x`, any case).
pub fn is_reserved_label(key: &str) -> bool {
    let prefix = key.split('/').next().unwrap_or_default().to_ascii_lowercase();
    prefix == GITLAB_LABEL_NAMESPACE || prefix.ends_with(&format!(".{GITLAB_LABEL_NAMESPACE}"))
}

fn lookup<'a>(variables: &'a [(String, String)], key: &str) -> &'a str {
    variables.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str()).unwrap_or_default()
}

/// The labels of everything the job creates (pod, secrets): gitlab-runner's and Runway's.
/// `variables` are the job's (for `CI_PROJECT_NAMESPACE*`).
pub fn job_labels(meta: &JobMeta, variables: &[(String, String)]) -> BTreeMap<String, String> {
    let (namespace, name) = meta.project_path.rsplit_once('/').unwrap_or(("", meta.project_path.as_str()));
    let namespace = match lookup(variables, "CI_PROJECT_NAMESPACE") {
        "" => namespace,
        v => v,
    };
    let root = match lookup(variables, "CI_PROJECT_ROOT_NAMESPACE") {
        "" => namespace.split('/').next().unwrap_or_default(),
        v => v,
    };
    let unique = sanitize_label(&meta.project_unique_name());
    let g = GITLAB_LABEL_NAMESPACE;
    let mut labels = BTreeMap::new();
    let mut put = |key: String, value: String| {
        labels.insert(key, value);
    };
    put("pod".into(), unique.clone());
    put(format!("project.{g}/id"), meta.project_id.to_string());
    put(format!("project.{g}/namespace-id"), sanitize_label(lookup(variables, "CI_PROJECT_NAMESPACE_ID")));
    put(format!("project.{g}/name"), sanitize_label(name));
    put(format!("project.{g}/namespace"), sanitize_label(namespace));
    put(format!("project.{g}/root-namespace"), sanitize_label(root));
    put(format!("job.{g}/pod"), unique);
    put(format!("manager.{g}/name"), sanitize_label(&meta.runner_name));
    put(format!("manager.{g}/id-short"), sanitize_label(&meta.short_token));
    put(LABEL_MANAGED.into(), "true".into());
    put(LABEL_RUNNER.into(), sanitize_label(&meta.short_token));
    put(LABEL_JOB.into(), meta.job_id.to_string());
    labels
}

/// The label selector (`?labelSelector=`) for every object of one job of this runner.
pub fn job_selector(short_token: &str, job_id: u64) -> String {
    format!("{LABEL_MANAGED}=true,{LABEL_RUNNER}={},{LABEL_JOB}={job_id}", sanitize_label(short_token))
}

/// The label selector for every object of this runner (cleanup of jobs an earlier manager left).
pub fn runner_selector(short_token: &str) -> String {
    format!("{LABEL_MANAGED}=true,{LABEL_RUNNER}={}", sanitize_label(short_token))
}

/// Go's `time.Duration.String()` of whole seconds (`1h0m0s`, `5m30s`, `42s`).
fn go_duration(seconds: u64) -> String {
    let (h, m, s) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

/// gitlab-runner's pod annotations (`job.runner.gitlab.com/*`, `project.runner.gitlab.com/id`)
/// from the job's variables.
pub fn job_annotations(meta: &JobMeta, variables: &[(String, String)]) -> BTreeMap<String, String> {
    let g = GITLAB_LABEL_NAMESPACE;
    let timeout = lookup(variables, "CI_JOB_TIMEOUT").parse::<u64>().map(go_duration).unwrap_or_default();
    let mut a = BTreeMap::new();
    a.insert(format!("job.{g}/id"), meta.job_id.to_string());
    a.insert(format!("job.{g}/url"), lookup(variables, "CI_JOB_URL").to_string());
    a.insert(format!("job.{g}/sha"), lookup(variables, "CI_COMMIT_SHA").to_string());
    a.insert(format!("job.{g}/before_sha"), lookup(variables, "CI_COMMIT_BEFORE_SHA").to_string());
    a.insert(format!("job.{g}/ref"), lookup(variables, "CI_COMMIT_REF_NAME").to_string());
    a.insert(format!("job.{g}/name"), lookup(variables, "CI_JOB_NAME").to_string());
    a.insert(format!("job.{g}/timeout"), timeout);
    a.insert(format!("project.{g}/id"), meta.project_id.to_string());
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> JobMeta {
        JobMeta {
            job_id: 77,
            project_id: 12,
            project_path: "group/sub/My Project".into(),
            short_token: "glrt-AbC".into(),
            runner_name: "kube runner #1".into(),
            concurrent: 3,
        }
    }

    fn is_dns1123_label(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    }

    #[test]
    fn pod_names_follow_gitlab_runner() {
        let name = pod_name(&meta(), 12345);
        assert!(name.starts_with("runner-glrt-abc-project-12-concurrent-3-"), "{name}");
        assert_eq!(name.len(), "runner-glrt-abc-project-12-concurrent-3-".len() + 8);
        assert!(is_dns1123_label(&name), "{name}");
        assert_ne!(pod_name(&meta(), 1), pod_name(&meta(), 2));
        assert_ne!(secret_name(&meta(), 7), pod_name(&meta(), 7));
        assert_eq!(pod_name(&meta(), 9), pod_name(&meta(), 9));
    }

    #[test]
    fn long_names_are_cut_to_63() {
        let long = JobMeta { short_token: "X".repeat(80), project_id: u64::MAX, ..meta() };
        let name = pod_name(&long, u64::MAX);
        assert_eq!(name.len(), 63);
        assert!(is_dns1123_label(&name), "{name}");
        // A cut that ends on `-` does not leave `--` before the suffix.
        let name = generated_name(&format!("{}-x", "a".repeat(53)), 0);
        assert!(is_dns1123_label(&name) && !name.contains("--"), "{name}");
    }

    #[test]
    fn container_names() {
        assert_eq!((BUILD_CONTAINER, HELPER_CONTAINER), ("build", "helper"));
        assert_eq!(service_container(0), "svc-0");
        assert_eq!(service_container(11), "svc-11");
    }

    #[test]
    fn labels_sanitize_values() {
        for (input, want) in [
            ("plain", "plain"),
            ("with space", "with_space"),
            ("--trim--", "trim"),
            ("é", ""),
            ("a/b:c", "a_b_c"),
            (&"x".repeat(70), &"x".repeat(63)),
            (&format!("{}.y", "x".repeat(62)), &"x".repeat(62)),
        ] {
            assert_eq!(sanitize_label(input), want, "{input}");
        }
    }

    #[test]
    fn job_labels_carry_gitlab_and_runway_keys() {
        let vars = vec![("CI_PROJECT_NAMESPACE_ID".to_string(), "40".to_string())];
        let labels = job_labels(&meta(), &vars);
        assert_eq!(labels["project.runner.gitlab.com/id"], "12");
        assert_eq!(labels["project.runner.gitlab.com/name"], "My_Project");
        assert_eq!(labels["project.runner.gitlab.com/namespace"], "group_sub");
        assert_eq!(labels["project.runner.gitlab.com/root-namespace"], "group");
        assert_eq!(labels["project.runner.gitlab.com/namespace-id"], "40");
        assert_eq!(labels["manager.runner.gitlab.com/name"], "kube_runner__1");
        assert_eq!(labels["manager.runner.gitlab.com/id-short"], "glrt-AbC");
        assert_eq!(labels["job.runner.gitlab.com/pod"], "runner-glrt-abc-project-12-concurrent-3");
        assert_eq!(labels[LABEL_RUNNER], "glrt-AbC");
        assert_eq!(labels[LABEL_JOB], "77");
        assert_eq!(labels[LABEL_MANAGED], "true");
        assert_eq!(job_selector("glrt-AbC", 77), "runway/managed=true,runway/runner=glrt-AbC,runway/job=77");
        assert_eq!(runner_selector("glrt-AbC"), "runway/managed=true,runway/runner=glrt-AbC");
    }

    #[test]
    fn reserved_label_namespace() {
        assert!(is_reserved_label("runner.gitlab.com/x"));
        assert!(is_reserved_label("job.Runner.GitLab.com/pod"));
        assert!(is_reserved_label("runner.gitlab.com"));
        assert!(!is_reserved_label("team"));
        assert!(!is_reserved_label("myrunner.gitlab.com/x"));
        assert!(!is_reserved_label("example.com/runner.gitlab.com"));
    }

    #[test]
    fn annotations_from_variables() {
        let vars: Vec<(String, String)> = [
            ("CI_JOB_URL", "https://gl/p/-/jobs/77"),
            ("CI_COMMIT_SHA", "abc"),
            ("CI_COMMIT_BEFORE_SHA", "000"),
            ("CI_COMMIT_REF_NAME", "main"),
            ("CI_JOB_NAME", "test"),
            ("CI_JOB_TIMEOUT", "3600"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let a = job_annotations(&meta(), &vars);
        assert_eq!(a["job.runner.gitlab.com/id"], "77");
        assert_eq!(a["job.runner.gitlab.com/url"], "https://gl/p/-/jobs/77");
        assert_eq!(a["job.runner.gitlab.com/timeout"], "1h0m0s");
        assert_eq!(a["project.runner.gitlab.com/id"], "12");
        assert_eq!(go_duration(330), "5m30s");
        assert_eq!(go_duration(42), "42s");
    }
}
