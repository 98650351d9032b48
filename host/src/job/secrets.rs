//! The job's `resolve_secrets` stage, before the executor is prepared, as gitlab-runner's
//! build does it: each entry of `secrets:` has its variables expanded from the job's, is read
//! by the first resolver of `crate::secrets` that supports it, and becomes a masked, raw job
//! variable (a file variable unless `file: false`). The trace says which secret and which
//! resolver; the job log's masker learns each value the moment it is read.
//!
//! A secret that cannot be read fails the job before anything runs, with a line naming the
//! secret, the server and the server's reason (never a value or a token), and the failure
//! reason gitlab-runner gives it. A secret the store says is missing fails the job only with
//! `FF_SECRET_RESOLVING_FAILS_IF_MISSING` on (the default); off, it is an empty variable.
//!
//! The step is tried `SECRETS_RETRIEVAL_ATTEMPTS` times (1–10, default 1) before it fails.
//!
//! Owns: the resolution step and its trace lines. Must not touch: secret stores' protocols
//! (`crate::secrets`), executors, stores (the job's progress carries the values to the store).

use std::collections::BTreeMap;

use super::progress::StoredSecret;
use super::JobOutcome;
use crate::payload::{flags, JobResponse, JobVariable};
use crate::secrets::{resolver_for, FailureClass, SecretError};
use crate::trace::format::{ansi, colored_line, SectionOptions};
use crate::trace::{FailureReason, TraceLog, TraceSink};

/// gitlab-runner's section name of the step.
const SECTION: &str = "resolve_secrets";

/// How many times the step is tried (1–10, default 1), as gitlab-runner reads it.
const ATTEMPTS: &str = "SECRETS_RETRIEVAL_ATTEMPTS";

/// gitlab-runner's feature flag: does a missing secret fail the job?
const FAILS_IF_MISSING: &str = "FF_SECRET_RESOLVING_FAILS_IF_MISSING";

/// Resolve `job`'s `secrets:` into variables; `runner_flags` are the runner's
/// `feature_flags`. No `secrets:`: no step, no lines. An error is the failed job's outcome,
/// already written to the trace.
pub(super) async fn resolve(
    job: &JobResponse,
    runner_flags: &BTreeMap<String, bool>,
    trace: &dyn TraceSink,
) -> Result<Vec<JobVariable>, JobOutcome> {
    if job.secrets.is_empty() {
        return Ok(Vec::new());
    }
    // gitlab-runner runs the whole section again, up to SECRETS_RETRIEVAL_ATTEMPTS times.
    let attempts = job.variable(ATTEMPTS).and_then(|v| v.trim().parse::<u32>().ok()).unwrap_or(1).clamp(1, 10);
    let mut attempt = 1;
    loop {
        trace.section_start(SECTION, SectionOptions::default());
        let result = resolve_all(job, runner_flags, trace).await;
        if let Err(outcome) = &result {
            trace.error(&outcome.message);
        }
        trace.section_end(SECTION);
        if result.is_ok() || attempt >= attempts {
            return result;
        }
        attempt += 1;
    }
}

async fn resolve_all(
    job: &JobResponse,
    runner_flags: &BTreeMap<String, bool>,
    trace: &dyn TraceSink,
) -> Result<Vec<JobVariable>, JobOutcome> {
    trace.write_str(&colored_line(ansi::BOLD_CYAN, "Resolving secrets"));
    let http = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(30))
        .timeout(std::time::Duration::from_secs(60))
        .build()
        .map_err(|e| failed(FailureReason::RunnerSystemFailure, format!("resolving secrets: an HTTP client: {e}")))?;
    let lookup = |key: &str| job.variable(key).map(str::to_string);
    let mut variables = Vec::new();
    for (key, secret) in &job.secrets {
        trace.write_str(&format!("Resolving secret {key:?}...\n"));
        let Some(resolver) = resolver_for(secret) else {
            trace.warning("Not resolved: no resolver that can handle the secret");
            continue;
        };
        trace.write_str(&format!("Using {:?} secret resolver...\n", resolver.name()));
        let mut secret = secret.clone();
        secret.expand_variables(&lookup);
        let value = match resolver.resolve(&secret, &http).await {
            Ok(value) => value,
            Err(e) if e.is_not_found() && !flags::is_on(FAILS_IF_MISSING, runner_flags, job) => String::new(),
            Err(e) => return Err(failed(reason(&e), format!("resolving secret {key:?}: {e}"))),
        };
        if !value.is_empty() {
            trace.mask_also(std::slice::from_ref(&value));
        }
        variables.push(secret_variable(key, value, secret.is_file()));
    }
    Ok(variables)
}

/// A resolved secret as a job variable: masked, raw, a file unless `file: false`.
pub fn secret_variable(key: &str, value: String, file: bool) -> JobVariable {
    StoredSecret { key: key.to_string(), value, file }.variable()
}

/// The failure reason gitlab-runner gives a failed read.
fn reason(error: &SecretError) -> FailureReason {
    match error.class() {
        FailureClass::Configuration => FailureReason::RunnerConfigurationError,
        FailureClass::ExternalDependency => FailureReason::RunnerExternalDependencyFailure,
        FailureClass::Unclassified => FailureReason::RunnerSystemFailure,
    }
}

fn failed(reason: FailureReason, message: String) -> JobOutcome {
    JobOutcome::failed(reason, None, message)
}

/// `job` with the resolved `secrets` appended to its variables (they win over a job variable
/// of the same name, as gitlab-runner's secrets variables come last).
pub(super) fn with_secrets(job: &JobResponse, secrets: Vec<JobVariable>) -> std::borrow::Cow<'_, JobResponse> {
    if secrets.is_empty() {
        return std::borrow::Cow::Borrowed(job);
    }
    let mut job = job.clone();
    job.variables.extend(secrets);
    std::borrow::Cow::Owned(job)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::MemorySink;

    fn job(secrets: &str) -> JobResponse {
        JobResponse { secrets: serde_json::from_str(secrets).unwrap(), ..Default::default() }
    }

    #[tokio::test]
    async fn no_secrets_no_step() {
        let trace = MemorySink::default();
        let vars = resolve(&job("{}"), &BTreeMap::new(), &trace).await.unwrap();
        assert!(vars.is_empty());
        assert!(trace.text().is_empty());
    }

    #[tokio::test]
    async fn a_secret_no_resolver_supports_is_left_out_with_a_warning() {
        let trace = MemorySink::default();
        let vars = resolve(&job(r#"{"X": {"file": false}}"#), &BTreeMap::new(), &trace).await.unwrap();
        assert!(vars.is_empty());
        let text = trace.text();
        assert!(text.contains("Resolving secrets"), "{text}");
        assert!(text.contains("Resolving secret \"X\"..."), "{text}");
        assert!(text.contains("Not resolved: no resolver that can handle the secret"), "{text}");
        assert!(text.contains("section_end:") && text.contains(":resolve_secrets"), "{text}");
    }

    #[tokio::test]
    async fn an_unreadable_secret_fails_the_job_after_its_attempts_naming_secret_and_server() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut job = job(&format!(
            r#"{{"DB": {{"vault": {{"server": {{"url": "http://127.0.0.1:{port}",
                "auth": {{"name": "jwt", "path": "jwt", "data": {{"jwt": "$TOKEN", "role": "ci"}}}}}},
                "engine": {{"name": "kv-v2", "path": "secret"}}, "path": "p", "field": "f"}}}}}}"#
        ));
        job.variables.push(crate::payload::JobVariable::public("SECRETS_RETRIEVAL_ATTEMPTS", "2"));
        job.variables.push(crate::payload::JobVariable::public("TOKEN", "eyJ.the-token.sig"));
        let trace = MemorySink::default();
        let outcome = resolve(&job, &BTreeMap::new(), &trace).await.unwrap_err();
        assert_eq!(outcome.failure, Some(FailureReason::RunnerSystemFailure));
        assert!(outcome.message.starts_with("resolving secret \"DB\": http://127.0.0.1:"), "{}", outcome.message);
        let text = trace.text();
        assert_eq!(text.matches("Resolving secrets").count(), 2, "{text}");
        assert_eq!(text.matches("Using \"vault\" secret resolver...").count(), 2, "{text}");
        assert!(!text.contains("the-token"), "{text}");
    }

    #[test]
    fn secret_variables_are_masked_raw_and_files_by_default() {
        let v = secret_variable("DB", "pw".into(), true);
        assert!(v.masked && v.raw && v.file && !v.public);
        let job = JobResponse::default();
        assert_eq!(with_secrets(&job, vec![v]).variable("DB"), Some("pw"));
    }

    #[test]
    fn failures_get_gitlab_runners_reasons() {
        let refused = SecretError::Refused { server: "s".into(), status: 403, reason: "permission denied".into() };
        assert_eq!(reason(&refused), FailureReason::RunnerConfigurationError);
        let down = SecretError::Refused { server: "s".into(), status: 502, reason: "bad gateway".into() };
        assert_eq!(reason(&down), FailureReason::RunnerExternalDependencyFailure);
        let gone = SecretError::Unreachable { server: "s".into(), reason: "connection refused".into() };
        assert_eq!(reason(&gone), FailureReason::RunnerSystemFailure);
    }
}
