//! The artifacts metadata of `RUNNER_GENERATE_ARTIFACTS_METADATA`: an in-toto statement with a
//! SLSA v1 provenance predicate, as gitlab-runner's `artifact_metadata.go` writes it — one
//! subject per regular file of the artifact (its path relative to the project directory and
//! its SHA-256), the job as the build's entry point, the runner as the builder. The file is
//! `<artifact name>-metadata.json` in the project directory and goes into the artifact too.
//!
//! Owns: the statement's shape and the digests. Must not touch: job variables (the caller
//! passes [`Provenance`]), the network.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

use chrono::{DateTime, SecondsFormat};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use super::ArchiveError;

/// in-toto's statement type (gitlab-runner's `in_toto.StatementInTotoV01`).
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v0.1";
/// SLSA provenance v1's predicate type.
pub const PREDICATE_TYPE: &str = "https://slsa.dev/provenance/v1";

/// The runner and job fields of the statement: the artifacts uploader's
/// `--runner-id/--repo-url/--repo-digest/--job-name/--executor-name/--runner-name/
/// --metadata-parameter/--started-at/--ended-at/--schema-version` and the job id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Provenance {
    /// The runner's id in GitLab.
    pub runner_id: i64,
    /// The project's URL (`CI_PROJECT_URL`).
    pub repo_url: String,
    /// The commit (`CI_COMMIT_SHA`).
    pub repo_digest: String,
    /// The job's name: the build's entry point.
    pub job_name: String,
    /// The executor's name.
    pub executor_name: String,
    /// The runner's name.
    pub runner_name: String,
    /// Names of the job's variables listed as external parameters (values left empty).
    pub parameters: Vec<String>,
    /// When the job started, RFC 3339.
    pub started_at: String,
    /// When the job ended, RFC 3339.
    pub ended_at: String,
    /// `SLSA_PROVENANCE_SCHEMA_VERSION`; only `v1` exists (anything else warns and uses v1).
    pub schema_version: String,
    /// The job's id.
    pub job_id: i64,
    /// The runner's version; used when it starts with `v`, else [`Provenance::revision`].
    pub version: String,
    /// The runner's source revision.
    pub revision: String,
    /// The runner's architecture (`amd64`, `arm64`, …).
    pub architecture: String,
}

/// The statement's file name for an artifact named `artifact_name`: `<name>-metadata.json`.
pub fn file_name(artifact_name: &str) -> String {
    format!("{artifact_name}-metadata.json")
}

/// Builds the statement for `entries` (relative to `project_dir`; only regular files become
/// subjects, sorted by path). Also returns the warnings gitlab-runner logs (an unknown schema
/// version).
pub fn statement(
    p: &Provenance,
    project_dir: &Path,
    entries: &[PathBuf],
) -> Result<(Value, Vec<String>), ArchiveError> {
    let mut warnings = Vec::new();
    if p.schema_version != "v1" {
        warnings.push(format!("Unknown SLSA provenance version {}, defaulting to v1", p.schema_version));
    }
    let started = timestamp("started-at", &p.started_at)?;
    let ended = timestamp("ended-at", &p.ended_at)?;
    let version = if p.version.starts_with('v') { p.version.clone() } else { p.revision.clone() };

    let mut subjects = Vec::new();
    let mut sorted: Vec<&PathBuf> = entries.iter().collect();
    sorted.sort();
    for rel in sorted {
        let full = project_dir.join(rel);
        let meta =
            std::fs::symlink_metadata(&full).map_err(|e| ArchiveError::Metadata(format!("{}: {e}", rel.display())))?;
        if !meta.file_type().is_file() {
            continue;
        }
        let digest = sha256_file(&full).map_err(|e| ArchiveError::Metadata(format!("{}: {e}", rel.display())))?;
        subjects.push(json!({ "name": rel.to_string_lossy(), "digest": { "sha256": digest } }));
    }

    let mut external = Map::new();
    for param in &p.parameters {
        external.insert(param.clone(), Value::String(String::new()));
    }
    external.insert("entryPoint".into(), Value::String(p.job_name.clone()));
    external.insert("source".into(), Value::String(p.repo_url.clone()));

    let statement = json!({
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": format!("https://gitlab.com/gitlab-org/gitlab-runner/-/blob/{version}/PROVENANCE.md"),
                "externalParameters": external,
                "internalParameters": {
                    "architecture": p.architecture,
                    "executor": p.executor_name,
                    "job": p.job_id.to_string(),
                    "name": p.runner_name,
                },
                "resolvedDependencies": [{ "uri": p.repo_url, "digest": { "sha256": p.repo_digest } }],
            },
            "runDetails": {
                "builder": {
                    "id": format!("{}/-/runners/{}", p.repo_url, p.runner_id),
                    "version": { "gitlab-runner": version },
                },
                "metadata": {
                    "invocationId": p.job_id.to_string(),
                    "startedOn": started,
                    "finishedOn": ended,
                },
            },
        },
    });
    Ok((statement, warnings))
}

/// Writes the statement to `<project_dir>/<artifact name>-metadata.json` (indented JSON) and
/// returns that file's path relative to `project_dir` (for the caller to add to the archive)
/// and the warnings.
pub fn write_statement(
    p: &Provenance,
    artifact_name: &str,
    project_dir: &Path,
    entries: &[PathBuf],
) -> Result<(PathBuf, Vec<String>), ArchiveError> {
    let (value, warnings) = statement(p, project_dir, entries)?;
    let rel = PathBuf::from(file_name(artifact_name));
    let mut bytes = Vec::new();
    let mut ser =
        serde_json::Serializer::with_formatter(&mut bytes, serde_json::ser::PrettyFormatter::with_indent(b" "));
    serde::Serialize::serialize(&value, &mut ser).map_err(|e| ArchiveError::Metadata(e.to_string()))?;
    std::fs::write(project_dir.join(&rel), &bytes).map_err(|e| ArchiveError::Io {
        path: rel.clone(),
        op: "write",
        source: e,
    })?;
    Ok((rel, warnings))
}

fn timestamp(flag: &str, value: &str) -> Result<String, ArchiveError> {
    let t = DateTime::parse_from_rfc3339(value)
        .map_err(|e| ArchiveError::Metadata(format!("--{flag} {value:?} is not an RFC 3339 time: {e}")))?;
    Ok(t.to_utc().to_rfc3339_opts(SecondsFormat::AutoSi, true))
}

fn sha256_file(path: &Path) -> io::Result<String> {
    let mut r = BufReader::with_capacity(256 << 10, File::open(path)?);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 256 << 10];
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}
