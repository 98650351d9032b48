//! `artifacts:` and `cache:` of a `.gitlab-ci.yml` job as the payload GitLab would send:
//! `artifacts:paths/exclude/untracked/name/when/expire_in` as the `archive` entry and one
//! entry per `artifacts:reports:<type>` with GitLab's file name, format and `when: always`;
//! `cache:` (one mapping or a list) with `key` (a string, or `files:`/`prefix:` hashed from
//! the files' contents), `paths`, `untracked`, `policy`, `when`, `fallback_keys`.
//!
//! Owns: reading those two keys. Must not touch: anything else of the job.

use std::path::Path;

use serde_yaml::Value;
use sha2::{Digest, Sha256};

use super::images::{scalar, strings};
use crate::config::Invalid;
use crate::payload::{Artifact, Cache};

/// GitLab's file name and format of each report type (Rails' `Ci::JobArtifact`
/// `DEFAULT_FILE_NAMES` and `TYPE_AND_FORMAT_PAIRS`).
const REPORTS: &[(&str, &str, &str)] = &[
    ("junit", "junit.xml", "gzip"),
    ("metrics", "metrics.txt", "gzip"),
    ("dotenv", ".env", "gzip"),
    ("cobertura", "cobertura-coverage.xml", "gzip"),
    ("coverage_report", "", "gzip"),
    ("jacoco", "jacoco.xml", "gzip"),
    ("cyclonedx", "gl-sbom.cdx.json", "gzip"),
    ("annotations", "gl-annotations.json", "gzip"),
    ("repository_xray", "gl-repository-xray.json", "gzip"),
    ("lsif", "lsif.json", "zip"),
    ("sast", "gl-sast-report.json", "raw"),
    ("secret_detection", "gl-secret-detection-report.json", "raw"),
    ("dependency_scanning", "gl-dependency-scanning-report.json", "raw"),
    ("container_scanning", "gl-container-scanning-report.json", "raw"),
    ("cluster_image_scanning", "gl-cluster-image-scanning-report.json", "raw"),
    ("dast", "gl-dast-report.json", "raw"),
    ("license_scanning", "gl-license-scanning-report.json", "raw"),
    ("performance", "performance.json", "raw"),
    ("browser_performance", "browser-performance.json", "raw"),
    ("load_performance", "load-performance.json", "raw"),
    ("terraform", "tfplan.json", "raw"),
    ("accessibility", "gl-accessibility.json", "raw"),
    ("requirements", "requirements.json", "raw"),
    ("requirements_v2", "requirements_v2.json", "raw"),
    ("coverage_fuzzing", "gl-coverage-fuzzing.json", "raw"),
    ("api_fuzzing", "gl-api-fuzzing-report.json", "raw"),
    ("codequality", "gl-code-quality-report.json", "raw"),
];

fn text(map: &Value, key: &str) -> String {
    map.get(key).and_then(scalar).unwrap_or_default()
}

fn one_of(map: &Value, key: &str, allowed: &[&str]) -> Result<String, Invalid> {
    let value = text(map, key);
    if value.is_empty() || allowed.contains(&value.as_str()) {
        Ok(value)
    } else {
        Err(Invalid(format!("{key} {value:?} is not one of {}", allowed.join(", "))))
    }
}

/// The payload's `artifacts` of a job's `artifacts:` value.
pub(super) fn artifacts(value: Option<&Value>) -> Result<Vec<Artifact>, Invalid> {
    let Some(map) = value else { return Ok(Vec::new()) };
    if !map.is_mapping() {
        return Err(Invalid(
            "artifacts must be a mapping (paths, exclude, untracked, name, when, expire_in, reports)".into(),
        ));
    }
    let when = one_of(map, "when", &["on_success", "on_failure", "always"])?;
    let expire_in = text(map, "expire_in");
    let mut out = Vec::new();
    let paths = strings(map.get("paths"));
    let untracked = map.get("untracked").and_then(Value::as_bool).unwrap_or(false);
    if !paths.is_empty() || untracked {
        out.push(Artifact {
            name: text(map, "name"),
            untracked,
            paths,
            exclude: strings(map.get("exclude")),
            when: if when.is_empty() { "on_success".into() } else { when.clone() },
            expire_in: expire_in.clone(),
            artifact_type: "archive".into(),
            artifact_format: "zip".into(),
        });
    }
    if let Some(reports) = map.get("reports") {
        let Some(reports) = reports.as_mapping() else {
            return Err(Invalid("artifacts:reports must be a mapping".into()));
        };
        for (kind, paths) in reports {
            let kind = scalar(kind).unwrap_or_default();
            let Some((_, name, format)) = REPORTS.iter().find(|(k, _, _)| *k == kind) else {
                return Err(Invalid(format!("artifacts:reports:{kind} is not a report type GitLab knows")));
            };
            let paths = match paths {
                // coverage_report: {coverage_format, path}
                Value::Mapping(_) => strings(paths.get("path")),
                other => strings(Some(other)),
            };
            let (artifact_type, name) = match kind.as_str() {
                "coverage_report" => ("cobertura".to_string(), "cobertura-coverage.xml"),
                _ => (kind.clone(), *name),
            };
            out.push(Artifact {
                name: name.to_string(),
                paths,
                when: "always".into(),
                expire_in: expire_in.clone(),
                artifact_type,
                artifact_format: format.to_string(),
                ..Artifact::default()
            });
        }
    }
    Ok(out)
}

/// The payload's `cache` of a job's `cache:` value; `key:files` hashes those files of
/// `project_dir` (GitLab hashes the commits that last changed them; a local run has no
/// pipeline history, so the contents stand in for it).
pub(super) fn caches(value: Option<&Value>, project_dir: &Path) -> Result<Vec<Cache>, Invalid> {
    let entries: Vec<&Value> = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Sequence(items)) => items.iter().collect(),
        Some(map @ Value::Mapping(_)) => vec![map],
        Some(_) => return Err(Invalid("cache must be a mapping or a list of mappings".into())),
    };
    let mut out = Vec::new();
    for (i, entry) in entries.into_iter().enumerate() {
        if !entry.is_mapping() {
            return Err(Invalid(format!("cache entry {} must be a mapping", i + 1)));
        }
        let key = match entry.get("key") {
            None => String::new(),
            Some(Value::Mapping(_)) => {
                let key = entry.get("key").cloned().unwrap_or_default();
                let files = strings(key.get("files"));
                if files.is_empty() {
                    return Err(Invalid("cache:key:files must list one or two files".into()));
                }
                let mut hash = Sha256::new();
                for file in &files {
                    hash.update(file.as_bytes());
                    hash.update(std::fs::read(project_dir.join(file)).unwrap_or_default());
                }
                let digest = hex::encode(hash.finalize());
                let prefix = text(&key, "prefix");
                let prefix = if prefix.is_empty() { String::new() } else { format!("{prefix}-") };
                format!("{prefix}{}", &digest[..40])
            }
            Some(other) => scalar(other).unwrap_or_default(),
        };
        let unprotect = entry.get("unprotect").and_then(Value::as_bool).unwrap_or(false);
        // GitLab appends the protection suffix to every key unless `unprotect: true`;
        // local runs are unprotected.
        let suffix = |k: String| if unprotect || k.is_empty() { k } else { format!("{k}-non_protected") };
        out.push(Cache {
            key: suffix(key),
            untracked: entry.get("untracked").and_then(Value::as_bool).unwrap_or(false),
            paths: strings(entry.get("paths")),
            policy: one_of(entry, "policy", &["pull", "push", "pull-push"])?,
            when: one_of(entry, "when", &["on_success", "on_failure", "always"])?,
            fallback_keys: strings(entry.get("fallback_keys")).into_iter().map(suffix).collect(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(text: &str) -> Value {
        serde_yaml::from_str(text).expect("yaml")
    }

    #[test]
    fn artifacts_become_an_archive_and_reports() {
        let v = yaml("paths: [out/, '**/*.log']\nexclude: [out/tmp]\nname: build\nexpire_in: 1 week\nreports:\n  junit: report.xml\n  dotenv: [build.env]\n");
        let got = artifacts(Some(&v)).expect("artifacts");
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].artifact_type, "archive");
        assert_eq!(got[0].artifact_format, "zip");
        assert_eq!(got[0].when, "on_success");
        assert_eq!(got[0].paths, vec!["out/", "**/*.log"]);
        assert_eq!((got[1].artifact_type.as_str(), got[1].artifact_format.as_str()), ("junit", "gzip"));
        assert_eq!((got[1].name.as_str(), got[1].when.as_str()), ("junit.xml", "always"));
        assert_eq!(got[2].paths, vec!["build.env"]);
        assert!(artifacts(Some(&yaml("when: sometimes\npaths: [a]"))).is_err());
        assert!(artifacts(Some(&yaml("reports:\n  nonsense: a"))).is_err());
    }

    #[test]
    fn caches_get_gitlab_keys() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("Cargo.lock"), "v1").expect("write");
        let v = yaml("- key: deps\n  paths: [vendor/]\n  policy: pull\n  fallback_keys: [main]\n- key:\n    files: [Cargo.lock]\n    prefix: rust\n  paths: [target/]\n  unprotect: true\n");
        let got = caches(Some(&v), dir.path()).expect("caches");
        assert_eq!(got[0].key, "deps-non_protected");
        assert_eq!(got[0].fallback_keys, vec!["main-non_protected"]);
        assert!(got[1].key.starts_with("rust-") && got[1].key.len() == 45);
        std::fs::write(dir.path().join("Cargo.lock"), "v2").expect("write");
        let again = caches(Some(&v), dir.path()).expect("caches");
        assert_ne!(got[1].key, again[1].key, "the key follows the file");
        assert!(caches(Some(&yaml("policy: sometimes")), dir.path()).is_err());
    }
}
