//! The predefined stages that move files in and out of the job (protocol §4.7):
//! `restore_cache`, `download_artifacts`, `archive_cache[_on_failure]` and
//! `upload_artifacts_on_{success,failure}`, written as calls of the helper commands
//! (`runway cache-extractor|cache-archiver|artifacts-downloader|artifacts-uploader`) the way
//! gitlab-runner's `AbstractShell` writes them: one guarded block per cache or artifact,
//! fallback cache keys tried in order, pre-signed URLs of the distributed cache from the
//! manager's [`CacheSigner`].
//!
//! Owns: cache keys (default, expansion, sanitising, `FF_HASH_CACHE_KEYS`, fallbacks),
//! policies and `when`, the local cache layout, which artifacts a stage uploads. Must not
//! touch: signing (the manager's signer), archiving and transfers (the helper commands).

use std::fmt;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::shell::{echo_info, echo_warning, quote};
use super::{JobPlan, PlanError};
use crate::payload::variables;
use crate::payload::{Artifact, Cache};

/// Pre-signed requests of the distributed cache for one object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheUrls {
    /// GET URL (restore).
    pub get: Option<String>,
    /// HEAD URL (does the object exist).
    pub head: Option<String>,
    /// PUT URL and the headers it must carry (`Name: value`).
    pub put: Option<(String, Vec<String>)>,
}

/// Why a [`CacheSigner`] made no URLs: its own error, kept whole (printed as the job's
/// warning; the cache is then local only).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct SignError(Box<dyn std::error::Error + Send + Sync>);

impl SignError {
    /// The signer's own error.
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        SignError(Box::new(error))
    }
}

/// Makes pre-signed URLs of the distributed cache (`[runners.cache]`); the manager owns the
/// credentials, the job only ever sees the URLs.
pub trait CacheSigner: Send + Sync {
    /// URLs for `key` of the project `project_id`, valid for at least `valid_for`; `push`
    /// asks for the PUT (and HEAD) too. An error is printed as a warning and the cache is
    /// then local only.
    fn urls(&self, project_id: i64, key: &str, push: bool, valid_for: Duration) -> Result<CacheUrls, SignError>;
    /// `MaxUploadedArchiveSize` (0: no limit).
    fn max_uploaded_archive_size(&self) -> u64 {
        0
    }
}

impl fmt::Debug for dyn CacheSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CacheSigner")
    }
}

/// gitlab-runner's `cachekey.Sanitize`: `%2F`/`%2E` and `\` normalised, the path cleaned,
/// trailing blanks of the last parts dropped; `None` when nothing is left.
pub fn sanitize_cache_key(key: &str) -> Option<String> {
    let normalised =
        key.replace("%2f", "/").replace("%2F", "/").replace("%2e", ".").replace("%2E", ".").replace('\\', "/");
    let mut parts: Vec<&str> = Vec::new();
    for part in normalised.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    while let Some(last) = parts.last_mut() {
        *last = last.trim_end();
        if last.is_empty() {
            parts.pop();
        } else {
            break;
        }
    }
    let key = parts.join("/");
    (!key.is_empty()).then_some(key)
}

/// Does `job` move files through the helper (caches, artifacts, dependencies' artifacts)?
pub fn uses_helper(job: &crate::payload::JobResponse) -> bool {
    job.cache.iter().any(|c| !c.paths.is_empty() || c.untracked)
        || job.artifacts.iter().any(|a| !a.paths.is_empty() || a.untracked)
        || job.dependencies.iter().any(|d| d.artifacts_file.as_ref().is_some_and(|f| !f.filename.is_empty()))
}

/// A cache key ready for use: as people see it and as files and objects are named.
struct Key {
    human: String,
    stored: String,
}

/// A `cache:policy` that is none of GitLab's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown cache policy {0:?} (pull, push, pull-push)")]
struct UnknownPolicy(String);

/// Whether a policy allows pulling/pushing; an unknown policy is an error of the job.
fn policy_allows(policy: &str, pull: bool) -> Result<bool, UnknownPolicy> {
    match policy {
        "" | "pull-push" => Ok(true),
        "pull" => Ok(pull),
        "push" => Ok(!pull),
        other => Err(UnknownPolicy(other.to_string())),
    }
}

/// Does `when` (on_success, on_failure, always) apply to a job that failed or not?
fn when_applies(when: &str, failed: bool) -> bool {
    match when {
        "always" => true,
        "on_failure" => failed,
        _ => !failed,
    }
}

impl JobPlan {
    fn expand(&self, text: &str) -> String {
        variables::expand(text, &|k| self.get(k))
    }

    fn helper(&self) -> Option<String> {
        self.settings.runner_command.as_deref().filter(|c| !c.is_empty()).map(quote)
    }

    /// `if <helper> --version; then <body> else <warning> fi`, or the warning alone when the
    /// executor has no helper.
    fn guarded(&self, action: &str, body: impl FnOnce(&str) -> String) -> String {
        match self.helper() {
            None => echo_warning(&format!("{action} is not supported by this executor.")),
            Some(helper) => format!(
                "if {helper} --version >/dev/null 2>&1; then\n{}else\n{}fi\n",
                body(&helper),
                echo_warning(&format!(
                    "Missing {}. {action} is disabled.",
                    self.settings.runner_command.as_deref().unwrap_or_default()
                ))
            ),
        }
    }

    /// The key of `raw` (default `<job name>/<ref>`), expanded and sanitised, with the
    /// warning sanitising gave, if any.
    fn cache_key(&self, raw: &str, out: &mut String) -> Option<Key> {
        let raw = if raw.is_empty() {
            format!("{}/{}", self.job.job_info.name, self.job.git_info.git_ref)
        } else {
            self.expand(raw)
        };
        let hashed = self.value("FF_HASH_CACHE_KEYS") == Some("true");
        let human = if hashed { Some(raw.clone()).filter(|k| !k.is_empty()) } else { sanitize_cache_key(&raw) };
        let Some(human) = human else {
            out.push_str(&echo_warning(&format!("cache key {raw:?} could not be sanitized")));
            return None;
        };
        if !hashed && human != raw {
            out.push_str(&echo_warning(&format!("cache key {raw:?} sanitized to {human:?}")));
        }
        let stored = if hashed { hex::encode(Sha256::digest(human.as_bytes())) } else { human.clone() };
        Some(Key { human, stored })
    }

    /// `<cache_dir>/<project>/<key>/cache.zip`: gitlab-runner's layout, so a switch keeps
    /// the caches.
    fn cache_file(&self, key: &Key) -> String {
        format!("{}/{}/{}/cache.zip", self.settings.cache_dir.display(), self.slug, key.stored)
    }

    fn cache_timeout_minutes(&self) -> u64 {
        self.value("CACHE_REQUEST_TIMEOUT").and_then(|v| v.trim().parse().ok()).filter(|m| *m > 0).unwrap_or(10)
    }

    fn signed(&self, key: &Key, push: bool, out: &mut String) -> CacheUrls {
        let Some(signer) = &self.settings.cache_signer else { return CacheUrls::default() };
        // Valid for the whole job and the margin gitlab-runner gives (an hour).
        let valid_for = self.job_timeout() + Duration::from_secs(3600);
        match signer.urls(self.job.job_info.project_id, &key.stored, push, valid_for) {
            Ok(urls) => urls,
            Err(e) => {
                out.push_str(&echo_warning(&format!("Failed to obtain URLs for cache {}: {e}", key.human)));
                CacheUrls::default()
            }
        }
    }

    fn cache_paths_args(cache: &Cache) -> Vec<String> {
        let mut args = Vec::new();
        for path in &cache.paths {
            args.push("--path".to_string());
            args.push(quote(path));
        }
        if cache.untracked {
            args.push("--untracked".to_string());
        }
        args
    }

    /// Does any cache have something to restore or save?
    pub(super) fn has_cache(&self) -> bool {
        self.job.cache.iter().any(|c| !c.paths.is_empty() || c.untracked)
    }

    /// Does any dependency have artifacts to download?
    pub(super) fn has_dependency_artifacts(&self) -> bool {
        self.job.dependencies.iter().any(|d| d.artifacts_file.as_ref().is_some_and(|f| !f.filename.is_empty()))
    }

    fn uploads(&self, failed: bool) -> impl Iterator<Item = &Artifact> {
        self.job
            .artifacts
            .iter()
            .filter(move |a| (!a.paths.is_empty() || a.untracked) && when_applies(&self.expand(&a.when), failed))
    }

    /// Are there artifacts to upload after a job that failed (or not)?
    pub(super) fn has_uploads(&self, failed: bool) -> bool {
        self.uploads(failed).next().is_some()
    }

    /// Are there caches to save after a job that failed (or not)?
    pub(super) fn has_cache_archive(&self, failed: bool) -> bool {
        self.job
            .cache
            .iter()
            .any(|c| (!c.paths.is_empty() || c.untracked) && when_applies(&self.expand(&c.when), failed))
    }

    /// The `restore_cache` body.
    pub(super) fn restore_cache(&self) -> Result<String, PlanError> {
        let mut out = self.cd_project();
        for cache in self.job.cache.iter().filter(|c| !c.paths.is_empty() || c.untracked) {
            let Some(key) = self.cache_key(&cache.key, &mut out) else {
                out.push_str(&echo_info("Skipping cache extraction due to empty cache key"));
                continue;
            };
            let policy = self.expand(&cache.policy);
            if !policy_allows(&policy, true).map_err(|e| PlanError::payload(format!("{e} for {}", key.human)))? {
                out.push_str(&echo_info(&format!("Not downloading cache {} due to policy", key.human)));
                continue;
            }
            let mut keys = vec![key];
            let mut fallback_out = String::new();
            for fallback in &cache.fallback_keys {
                if let Some(k) = self.cache_key(fallback, &mut fallback_out) {
                    keys.push(k);
                }
            }
            if let Some(fallback) = self.value("CACHE_FALLBACK_KEY").filter(|k| !k.is_empty()) {
                if fallback.trim_end_matches(['.', ' ']).ends_with("-protected") {
                    fallback_out.push_str(&echo_warning(&format!(
                        "CACHE_FALLBACK_KEY {fallback:?} not allowed to end in \"-protected\""
                    )));
                } else if let Some(k) = self.cache_key(fallback, &mut fallback_out) {
                    keys.push(k);
                }
            }
            out.push_str(&fallback_out);
            let mut signing_out = String::new();
            let urls: Vec<CacheUrls> = keys.iter().map(|k| self.signed(k, false, &mut signing_out)).collect();
            out.push_str(&signing_out);
            let clean_up = self.value("FF_CLEAN_UP_FAILED_CACHE_EXTRACT") == Some("true");
            let block =
                self.guarded("Extracting cache", |helper| self.extract_chain(helper, &keys, &urls, cache, clean_up));
            out.push_str(&block);
        }
        Ok(out)
    }

    /// `if extract key 1; then ok; else warn; [clean]; <same for key 2> fi`.
    fn extract_chain(&self, helper: &str, keys: &[Key], urls: &[CacheUrls], cache: &Cache, clean_up: bool) -> String {
        let (Some(key), Some(url)) = (keys.first(), urls.first()) else { return String::new() };
        let mut command = format!(
            "{helper} cache-extractor --file {} --timeout {}",
            quote(&self.cache_file(key)),
            self.cache_timeout_minutes()
        );
        if let Some(get) = &url.get {
            command.push_str(&format!(" --url {}", quote(get)));
        }
        if let Some(head) = &url.head {
            command.push_str(&format!(" --head-url {}", quote(head)));
        }
        let mut out = echo_info(&format!("Checking cache for {}...", key.human));
        out.push_str(&format!("if {command}; then\n"));
        out.push_str(&echo_info("Successfully extracted cache"));
        out.push_str("else\n");
        out.push_str(&echo_warning("Failed to extract cache"));
        if clean_up {
            for path in &cache.paths {
                out.push_str(&format!("echo {}\nrm -rf -- {}\n", quote(&format!("Removing {path}")), quote(path)));
            }
        }
        out.push_str(&self.extract_chain(helper, &keys[1..], &urls[1..], cache, clean_up));
        out.push_str("fi\n");
        out
    }

    /// The `archive_cache` / `archive_cache_on_failure` body.
    pub(super) fn archive_cache(&self, failed: bool) -> Result<String, PlanError> {
        let mut out = self.cd_project();
        for cache in &self.job.cache {
            if !when_applies(&self.expand(&cache.when), failed) {
                continue;
            }
            let paths = Self::cache_paths_args(cache);
            if paths.is_empty() {
                continue;
            }
            let Some(key) = self.cache_key(&cache.key, &mut out) else {
                out.push_str(&echo_info("Skipping cache archiving due to empty cache key"));
                continue;
            };
            let policy = self.expand(&cache.policy);
            if !policy_allows(&policy, false).map_err(|e| PlanError::payload(format!("{e} for {}", key.human)))? {
                out.push_str(&echo_info(&format!("Not uploading cache {} due to policy", key.human)));
                continue;
            }
            let urls = self.signed(&key, true, &mut out);
            let mut command = format!(
                "cache-archiver --file {} --timeout {} {}",
                quote(&self.cache_file(&key)),
                self.cache_timeout_minutes(),
                paths.join(" ")
            );
            if let Some((put, headers)) = &urls.put {
                command.push_str(&format!(" --url {}", quote(put)));
                for header in headers {
                    command.push_str(&format!(" --header {}", quote(header)));
                }
                if let Some(head) = &urls.head {
                    command.push_str(&format!(" --check-url {}", quote(head)));
                }
            }
            if let Some(max) =
                self.settings.cache_signer.as_ref().map(|s| s.max_uploaded_archive_size()).filter(|m| *m > 0)
            {
                command.push_str(&format!(" --max-uploaded-archive-size {max}"));
            }
            let block = self.guarded("Creating cache", |helper| {
                let mut b = echo_info(&format!("Creating cache {}...", key.human));
                b.push_str(&format!("if {helper} {command}; then\n"));
                b.push_str(&echo_info("Created cache"));
                b.push_str("else\n");
                b.push_str(&echo_warning("Failed to create cache"));
                b.push_str("fi\n");
                b
            });
            out.push_str(&block);
        }
        Ok(out)
    }

    /// The `download_artifacts` body.
    pub(super) fn download_artifacts(&self) -> String {
        let mut out = self.cd_project();
        let deps: Vec<_> = self
            .job
            .dependencies
            .iter()
            .filter(|d| d.artifacts_file.as_ref().is_some_and(|f| !f.filename.is_empty()))
            .collect();
        let block = self.guarded("Artifacts downloading", |helper| {
            let mut b = String::new();
            for dep in deps {
                b.push_str(&echo_info(&format!("Downloading artifacts for {} ({})...", dep.name, dep.id)));
                match &self.settings.local_artifacts_dir {
                    Some(dir) => {
                        let filename = dep.artifacts_file.as_ref().map(|f| f.filename.as_str()).unwrap_or_default();
                        let file = dir.join(&dep.name).join(filename);
                        b.push_str(&format!(
                            "{helper} artifacts-downloader --local-file {}\n",
                            quote(&file.display().to_string())
                        ));
                    }
                    None => b.push_str(&format!(
                        "{helper} artifacts-downloader --url {} --token {} --id {}\n",
                        quote(&self.settings.gitlab_url),
                        quote(&dep.token),
                        dep.id
                    )),
                }
            }
            b
        });
        out.push_str(&block);
        out
    }

    /// The `upload_artifacts_on_success` / `_on_failure` body.
    pub(super) fn upload_artifacts(&self, failed: bool) -> String {
        let mut out = self.cd_project();
        for artifact in self.uploads(failed) {
            let mut args = match &self.settings.local_artifacts_dir {
                Some(dir) => {
                    format!("--local-dir {}", quote(&dir.join(&self.job.job_info.name).display().to_string()))
                }
                None => format!(
                    "--url {} --token {} --id {} --timeout 1h0m0s --response-header-timeout 10m0s",
                    quote(&self.settings.gitlab_url),
                    quote(&self.job.token),
                    self.job.id
                ),
            };
            for path in &artifact.paths {
                args.push_str(&format!(" --path {}", quote(path)));
            }
            for path in &artifact.exclude {
                args.push_str(&format!(" --exclude {}", quote(path)));
            }
            if artifact.untracked {
                args.push_str(" --untracked");
            }
            for (flag, value) in [
                ("--name", &artifact.name),
                ("--expire-in", &artifact.expire_in),
                ("--artifact-format", &artifact.artifact_format),
                ("--artifact-type", &artifact.artifact_type),
            ] {
                if !value.is_empty() {
                    args.push_str(&format!(" {flag} {}", quote(value)));
                }
            }
            let block = self.guarded("Uploading artifacts", |helper| {
                let mut b = echo_info("Uploading artifacts...");
                b.push_str(&format!("{helper} artifacts-uploader {args}\n"));
                b
            });
            out.push_str(&block);
        }
        out
    }

    fn cd_project(&self) -> String {
        format!("cd {}\n", quote(&self.project_dir.display().to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sanitized_as_gitlab_runner_does() {
        let cases = [
            ("main", Some("main")),
            ("feature/x", Some("feature/x")),
            ("a%2Fb", Some("a/b")),
            ("a\\b", Some("a/b")),
            ("../../etc", Some("etc")),
            ("a/./b/../c", Some("a/c")),
            ("key  ", Some("key")),
            ("key/  /", Some("key")),
            ("%2e%2E", None),
            ("", None),
            ("/", None),
        ];
        for (input, want) in cases {
            assert_eq!(sanitize_cache_key(input).as_deref(), want, "{input:?}");
        }
    }

    #[test]
    fn policies_and_when() {
        assert_eq!(policy_allows("pull", true), Ok(true));
        assert_eq!(policy_allows("pull", false), Ok(false));
        assert_eq!(policy_allows("push", true), Ok(false));
        assert_eq!(policy_allows("", false), Ok(true));
        assert!(policy_allows("pul", true).is_err());
        assert!(when_applies("", false) && !when_applies("", true));
        assert!(when_applies("on_failure", true) && !when_applies("on_failure", false));
        assert!(when_applies("always", true) && when_applies("always", false));
    }
}
