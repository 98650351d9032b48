//! GitLab Runner's feature flags (`FF_*`): every flag of gitlab-runner 19.x with its default,
//! what Runway does with it, and how a job's value is decided.
//!
//! Owns the table ([`FLAGS`]), the resolution rule ([`is_on`]: the runner's
//! `[runners.feature_flags]` first, then the job's variable, then the default — gitlab-runner's
//! order) and the "not supported" notice, written once per process and flag
//! ([`notice_unsupported`]). Must not import anything of the crate (payload is a leaf): callers
//! hand it the runner's flags and the job.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use super::JobResponse;

/// `FF_TIMESTAMPS`: every job log line starts with its time, stream and type.
pub const TIMESTAMPS: &str = "FF_TIMESTAMPS";
/// `FF_EXPORT_HIGH_CARDINALITY_METRICS`: `gitlab_runner_job_stage_duration_seconds`.
pub const EXPORT_HIGH_CARDINALITY_METRICS: &str = "FF_EXPORT_HIGH_CARDINALITY_METRICS";
/// `FF_USE_EXPONENTIAL_BACKOFF_STAGE_RETRY`: stage retries wait 5 s doubling to 5 min.
pub const EXPONENTIAL_BACKOFF_STAGE_RETRY: &str = "FF_USE_EXPONENTIAL_BACKOFF_STAGE_RETRY";
/// `FF_USE_ADAPTIVE_REQUEST_CONCURRENCY`: job requests in flight adapt between 1 and
/// `request_concurrency`.
pub const ADAPTIVE_REQUEST_CONCURRENCY: &str = "FF_USE_ADAPTIVE_REQUEST_CONCURRENCY";
/// `FF_USE_GITALY_CORRELATION_ID`: clones send the job request's correlation ID to Gitaly.
pub const GITALY_CORRELATION_ID: &str = "FF_USE_GITALY_CORRELATION_ID";
/// `FF_USE_GIT_BUNDLE_URIS`: clones may start from bundles GitLab advertises.
pub const GIT_BUNDLE_URIS: &str = "FF_USE_GIT_BUNDLE_URIS";
/// `FF_MASK_ALL_DEFAULT_TOKENS`: GitLab's token prefixes are masked in every job log.
pub const MASK_ALL_DEFAULT_TOKENS: &str = "FF_MASK_ALL_DEFAULT_TOKENS";

/// What Runway does with a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Both values behave as in gitlab-runner.
    Honoured,
    /// Runway always behaves as gitlab-runner does with the flag at its default; the other
    /// value is not supported.
    DefaultOnly,
    /// The flag belongs to something Runway does not have (an executor, a platform, a
    /// subsystem): accepted, without effect.
    NotApplicable,
    /// Runway reaches the same result another way, whatever the value; setting it is
    /// accepted, without effect.
    Differs,
}

/// One flag.
#[derive(Debug, Clone, Copy)]
pub struct Flag {
    /// `FF_...`.
    pub name: &'static str,
    /// gitlab-runner 19.x's default.
    pub default: bool,
    /// What Runway does with it.
    pub support: Support,
    /// Where Runway differs, or what the flag belongs to.
    pub note: &'static str,
}

const fn flag(name: &'static str, default: bool, support: Support, note: &'static str) -> Flag {
    Flag { name, default, support, note }
}

use Support::{DefaultOnly, Differs, Honoured, NotApplicable};

/// Every flag of gitlab-runner 19.x (`helpers/featureflags/flags.go`), in its order.
pub const FLAGS: &[Flag] = &[
    flag(
        "FF_NETWORK_PER_BUILD",
        false,
        Differs,
        "the docker executor makes a per-job network for a job with services even with the flag off (services are reached by name there, never by legacy links); `network_mode = \"bridge\"` gives the flag-off legacy links",
    ),
    flag("FF_USE_LEGACY_KUBERNETES_EXECUTION_STRATEGY", false, NotApplicable, "kubernetes executor"),
    flag("FF_USE_DIRECT_DOWNLOAD", true, Honoured, "artifacts-downloader follows object storage redirects"),
    flag("FF_USE_FASTZIP", true, DefaultOnly, "Runway's archiver is always the parallel one"),
    flag(
        "FF_DISABLE_UMASK_FOR_DOCKER_EXECUTOR",
        false,
        DefaultOnly,
        "docker executor: as gitlab-runner with the flag off",
    ),
    flag(
        "FF_ENABLE_BASH_EXIT_CODE_CHECK",
        false,
        DefaultOnly,
        "scripts rely on errexit, as gitlab-runner with the flag off",
    ),
    flag("FF_USE_WINDOWS_LEGACY_PROCESS_STRATEGY", false, NotApplicable, "Windows"),
    flag("FF_USE_LEGACY_BASH_EVAL", false, DefaultOnly, "scripts are fed to bash through stdin"),
    flag("FF_USE_POWERSHELL_PATH_RESOLVER", false, NotApplicable, "PowerShell"),
    flag(
        "FF_USE_DYNAMIC_TRACE_FORCE_SEND_INTERVAL",
        false,
        DefaultOnly,
        "the trace is sent at GitLab's fixed interval",
    ),
    flag("FF_SCRIPT_SECTIONS", false, DefaultOnly, "script lines are not wrapped in their own sections"),
    flag("FF_ENABLE_JOB_CLEANUP", false, DefaultOnly, "the build directory is kept after the job"),
    flag("FF_KUBERNETES_HONOR_ENTRYPOINT", false, NotApplicable, "kubernetes executor"),
    flag("FF_POSIXLY_CORRECT_ESCAPES", false, DefaultOnly, "variables are quoted for bash"),
    flag("FF_RESOLVE_FULL_TLS_CHAIN", false, DefaultOnly, "the CA chain is passed on as configured"),
    flag("FF_DISABLE_POWERSHELL_STDIN", false, NotApplicable, "PowerShell"),
    flag("FF_USE_POD_ACTIVE_DEADLINE_SECONDS", true, NotApplicable, "kubernetes executor"),
    flag(
        "FF_USE_ADVANCED_POD_SPEC_CONFIGURATION",
        false,
        Honoured,
        "kubernetes executor: `[[runners.kubernetes.pod_spec]]` patches apply only with it on",
    ),
    flag(
        "FF_SECRET_RESOLVING_FAILS_IF_MISSING",
        true,
        Honoured,
        "a secret the store says is missing fails the job; off, the variable is empty",
    ),
    flag("FF_PRINT_POD_EVENTS", false, NotApplicable, "kubernetes executor"),
    flag(GIT_BUNDLE_URIS, true, Honoured, "git fetches with transfer.bundleURI"),
    flag("FF_USE_GIT_NATIVE_CLONE", false, DefaultOnly, "sources are always fetched with init + fetch"),
    flag("FF_USE_DUMB_INIT_WITH_KUBERNETES_EXECUTOR", false, NotApplicable, "kubernetes executor"),
    flag("FF_USE_INIT_WITH_DOCKER_EXECUTOR", false, DefaultOnly, "docker executor: containers run without --init"),
    flag("FF_LOG_IMAGES_CONFIGURED_FOR_JOB", false, DefaultOnly, "images are not logged by the manager"),
    flag(
        "FF_USE_DOCKER_AUTOSCALER_DIAL_STDIO",
        true,
        Differs,
        "docker-autoscaler forwards the engine's socket over SSH, as gitlab-runner with the flag off: the same engine is reached",
    ),
    flag("FF_CLEAN_UP_FAILED_CACHE_EXTRACT", false, Honoured, "a cache that fails to extract is removed"),
    flag("FF_USE_WINDOWS_JOB_OBJECT", false, NotApplicable, "Windows"),
    flag(TIMESTAMPS, true, Honoured, "per-line timestamps in the job log"),
    flag("FF_DISABLE_AUTOMATIC_TOKEN_ROTATION", false, Honoured, "turns off the rotation before token_expires_at"),
    flag("FF_USE_LEGACY_GCS_CACHE_ADAPTER", false, DefaultOnly, "one GCS adapter"),
    flag("FF_DISABLE_UMASK_FOR_KUBERNETES_EXECUTOR", false, NotApplicable, "kubernetes executor"),
    flag("FF_USE_LEGACY_S3_CACHE_ADAPTER", false, DefaultOnly, "one S3 adapter"),
    flag("FF_GIT_URLS_WITHOUT_TOKENS", false, DefaultOnly, "as gitlab-runner with the flag off"),
    flag("FF_WAIT_FOR_POD_TO_BE_REACHABLE", false, NotApplicable, "kubernetes executor"),
    flag(MASK_ALL_DEFAULT_TOKENS, true, Honoured, "GitLab's token prefixes masked in every job"),
    flag(EXPORT_HIGH_CARDINALITY_METRICS, false, Honoured, "gitlab_runner_job_stage_duration_seconds"),
    flag(
        "FF_USE_FLEETING_ACQUIRE_HEARTBEATS",
        false,
        DefaultOnly,
        "instances are checked on acquire by the taskscaler",
    ),
    flag(EXPONENTIAL_BACKOFF_STAGE_RETRY, true, Honoured, "stage retries wait 5 s doubling to 5 min (off: 1 s to 5 s)"),
    flag(
        ADAPTIVE_REQUEST_CONCURRENCY,
        true,
        Honoured,
        "requests in flight adapt between 1 and request_concurrency (+10 % on a job, -5 % on none, halved on failure)",
    ),
    flag(
        GITALY_CORRELATION_ID,
        true,
        Honoured,
        "git sends X-Gitaly-Correlation-ID with the job request's correlation ID",
    ),
    flag("FF_USE_GIT_PROACTIVE_AUTH", false, DefaultOnly, "git authenticates when asked"),
    flag("FF_HASH_CACHE_KEYS", false, Honoured, "cache keys hashed (SHA-256) in paths and object names"),
    flag(
        "FF_ENABLE_JOB_INPUTS_INTERPOLATION",
        true,
        NotApplicable,
        "Runway does not advertise job_inputs, so GitLab sends a job no inputs to interpolate",
    ),
    flag("FF_USE_JOB_ROUTER", false, DefaultOnly, "jobs are requested from GitLab directly"),
    flag("FF_SCRIPT_TO_STEP_MIGRATION", false, NotApplicable, "steps"),
    flag("FF_USE_PARALLEL_CACHE_TRANSFER", false, DefaultOnly, "caches move in one stream"),
    flag("FF_USE_PARALLEL_ARTIFACT_TRANSFER", false, DefaultOnly, "artifacts move in one stream"),
    flag("FF_CONCRETE", false, NotApplicable, "gitlab-runner's step-based job engine"),
    flag("FF_SUSPENDABLE_ENVIRONMENTS", false, NotApplicable, "suspendable environments"),
    flag("FF_USE_NATIVE_CONTAINER_STOP", false, DefaultOnly, "docker executor: containers are killed"),
];

/// The flag called `name`.
pub fn find(name: &str) -> Option<&'static Flag> {
    FLAGS.iter().find(|f| f.name == name)
}

/// Go's `strconv.ParseBool`, which gitlab-runner reads job variables with.
pub fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// Whether flag `name` is on for `job` on a runner with `runner_flags`: the runner's value,
/// else the job's variable (when it parses as a boolean), else gitlab-runner's default
/// (`false` for a name not in [`FLAGS`]).
pub fn is_on(name: &str, runner_flags: &BTreeMap<String, bool>, job: &JobResponse) -> bool {
    resolve(name, runner_flags, job.variable(name))
}

/// [`is_on`] with the job's value already looked up.
pub fn resolve(name: &str, runner_flags: &BTreeMap<String, bool>, job_value: Option<&str>) -> bool {
    if let Some(value) = runner_flags.get(name) {
        return *value;
    }
    if let Some(value) = job_value.and_then(parse_bool) {
        return value;
    }
    find(name).is_some_and(|f| f.default)
}

/// Flags already reported by [`notice_unsupported`].
static NOTICED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// The flags among `set` (name and value as the runner or job sets them) Runway does not
/// honour at that value, each returned with its message the first time this process sees it
/// and never again: `FF_X=true is not supported by Runway (...)`. Unknown `FF_` names are
/// reported too. Callers log the messages (a warning at config load, a job log line).
pub fn notice_unsupported<'a>(set: impl IntoIterator<Item = (&'a str, bool)>) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(mut noticed) = NOTICED.lock() else { return out };
    for (name, value) in set {
        let message = match find(name) {
            None => format!("{name} is not a feature flag of gitlab-runner 19 (ignored)"),
            Some(f) if f.support == Honoured => continue,
            Some(f) if f.support == DefaultOnly && value == f.default => continue,
            Some(f) if f.support == NotApplicable && value == f.default => continue,
            Some(f) if f.support == Differs => {
                format!("{name}={value} has no effect in Runway ({})", f.note)
            }
            Some(f) => format!("{name}={value} is not supported by Runway ({}): ignored", f.note),
        };
        if noticed.insert(name.to_string()) {
            out.push(message);
        }
    }
    out
}

/// The job's `FF_*` variables that parse as booleans, for [`notice_unsupported`].
pub fn job_flags(job: &JobResponse) -> Vec<(&str, bool)> {
    job.variables
        .iter()
        .filter(|v| v.key.starts_with("FF_"))
        .filter_map(|v| parse_bool(&v.value).map(|b| (v.key.as_str(), b)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runner_value_wins_over_the_job_then_the_default() {
        let mut runner = BTreeMap::new();
        assert!(resolve(TIMESTAMPS, &runner, None), "on by default");
        assert!(!resolve(TIMESTAMPS, &runner, Some("false")));
        assert!(!resolve(TIMESTAMPS, &runner, Some("0")));
        assert!(resolve(TIMESTAMPS, &runner, Some("not a bool")), "an unparsable value keeps the default");
        runner.insert(TIMESTAMPS.to_string(), true);
        assert!(resolve(TIMESTAMPS, &runner, Some("false")), "the runner's setting takes precedence");
        assert!(!resolve("FF_NOT_A_FLAG", &BTreeMap::new(), None));
        assert!(resolve("FF_NOT_A_FLAG", &BTreeMap::new(), Some("T")));
    }

    #[test]
    fn the_migration_guide_lists_every_flag_as_the_code_has_it() {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/migrating-from-gitlab-runner.md"))
                .unwrap_or_default();
        let table = doc.split("<!-- flags-table -->").nth(1).and_then(|t| t.split("<!-- /flags-table -->").next());
        let rows: Vec<String> =
            table.unwrap_or_default().lines().filter(|l| l.starts_with("| `")).map(String::from).collect();
        let expected: Vec<String> = FLAGS
            .iter()
            .map(|f| {
                let status = match f.support {
                    Honoured => "honoured",
                    DefaultOnly => "default only",
                    NotApplicable => "not applicable",
                    Differs => "differs",
                };
                format!("| `{}` | {} | {status} | {} |", f.name, f.default, f.note)
            })
            .collect();
        assert_eq!(rows, expected, "docs/migrating-from-gitlab-runner.md's flags table");
    }

    #[test]
    fn every_flag_once_and_unsupported_values_noticed_once() {
        let names: BTreeSet<&str> = FLAGS.iter().map(|f| f.name).collect();
        assert_eq!(names.len(), FLAGS.len(), "no flag twice");
        assert!(FLAGS.iter().all(|f| f.name.starts_with("FF_") && !f.note.is_empty()));
        let first = notice_unsupported([("FF_USE_GIT_NATIVE_CLONE", true), ("FF_HASH_CACHE_KEYS", true)]);
        assert_eq!(first.len(), 1, "{first:?}");
        assert!(first[0].starts_with("FF_USE_GIT_NATIVE_CLONE=true is not supported by Runway"), "{first:?}");
        assert!(notice_unsupported([("FF_USE_GIT_NATIVE_CLONE", true)]).is_empty(), "once per process");
        assert!(notice_unsupported([("FF_USE_JOB_ROUTER", false)]).is_empty(), "the default value is fine");
        assert_eq!(notice_unsupported([("FF_TYPO", true)]).len(), 1);
    }
}
