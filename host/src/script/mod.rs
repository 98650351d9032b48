//! Shell script generation: a job payload plus runner settings become the ordered stage
//! scripts GitLab Runner would run (protocol reference §4), as bash text.
//!
//! Owns the builds-dir layout (§4.3), the variable list (§4.2, [`variables`]), get_sources
//! for every `GIT_STRATEGY` (§4.4, [`git`]), user scripts with their `$ command` echo (§4.5),
//! file variables (§4.6), `GITLAB_ENV` (the file every stage sources, so what one stage
//! appends reaches every later one) and a local cache. It runs nothing: the job module hands
//! each script to the executor.

mod git;
pub mod shell;
pub mod transfer;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::duration::parse_duration;
use crate::payload::variables;
use crate::payload::{JobResponse, JobVariable, Step};
use shell::{echo_command, echo_raw, echo_warning, make_dir_unless_present, quote, remove_if_present, wrap};
pub use transfer::{CacheSigner, CacheUrls, SignError};

/// GitLab's `DefaultTimeout`: used when the payload's timeout is ≤ 0.
pub const DEFAULT_JOB_TIMEOUT: Duration = Duration::from_secs(7200);
/// GitLab's `AfterScriptTimeout`.
pub const DEFAULT_AFTER_SCRIPT_TIMEOUT: Duration = Duration::from_secs(300);

/// Runner-side settings that shape the scripts (config.toml `[[runners]]` + executor info).
#[derive(Debug, Clone, Default)]
pub struct ScriptSettings {
    /// Absolute builds root.
    pub builds_dir: PathBuf,
    /// Absolute cache root.
    pub cache_dir: PathBuf,
    /// Builds share a machine: `<builds_dir>/<short token>/<concurrent project id>/<slug>`.
    pub shared_builds_dir: bool,
    /// The runner's short token (builds-dir layout, `CI_RUNNER_SHORT_TOKEN`).
    pub short_token: String,
    /// Index of this job among the runner's running jobs (`CI_CONCURRENT_ID`).
    pub concurrent_id: u32,
    /// Index among the runner's running jobs of this project (`CI_CONCURRENT_PROJECT_ID`).
    pub concurrent_project_id: u32,
    /// The executor name (`CI_RUNNER_EXECUTOR`).
    pub executor: String,
    /// The shell the scripts are written for (`bash`).
    pub shell: String,
    /// `clone_url` from config.toml: replaces the scheme and host of the repository URL.
    pub clone_url: Option<String>,
    /// `["K=V"]` from config.toml.
    pub environment: Vec<String>,
    /// `pre_get_sources_script` from config.toml.
    pub pre_get_sources_script: Option<String>,
    /// `post_get_sources_script` from config.toml.
    pub post_get_sources_script: Option<String>,
    /// `pre_build_script` from config.toml.
    pub pre_build_script: Option<String>,
    /// `post_build_script` from config.toml.
    pub post_build_script: Option<String>,
    /// `FF_*` from config.toml; they win over job variables.
    pub feature_flags: BTreeMap<String, bool>,
    /// `debug_trace_disabled`: ignore `CI_DEBUG_TRACE`.
    pub debug_trace_disabled: bool,
    /// `CI_RUNNER_VERSION`.
    pub runner_version: String,
    /// `CI_RUNNER_REVISION`.
    pub runner_revision: String,
    /// `runway exec`: run in this directory instead of a builds-dir checkout.
    pub project_dir_override: Option<PathBuf>,
    /// `CI_SHARED_ENVIRONMENT` (shell, ssh, instance) vs `CI_DISPOSABLE_ENVIRONMENT`.
    pub shared_environment: bool,
    /// The helper command in the job environment (`runway` there: the cache and artifacts
    /// commands); `None` when the executor has none (those stages then only warn).
    pub runner_command: Option<String>,
    /// The GitLab URL the helper uploads and downloads artifacts at (the runner's `url`).
    pub gitlab_url: String,
    /// The CA chain (PEM) the runner trusts for GitLab (`tls-ca-file` or `<config
    /// dir>/certs/<host>.crt`): the job's `CI_SERVER_TLS_CA_FILE`, and git's `http.sslCAInfo`.
    pub server_tls_ca_chain: Option<String>,
    /// Pre-signed URLs of the distributed cache (`[runners.cache]`); `None`: local caches only.
    pub cache_signer: Option<std::sync::Arc<dyn CacheSigner>>,
    /// `runway exec`: artifacts are kept in `<dir>/<job name>/` instead of uploaded, and
    /// dependencies' are read from there.
    pub local_artifacts_dir: Option<PathBuf>,
    /// `clean_git_config` from config.toml; `None`: gitlab-runner's default (on, except for
    /// the shell executor and `GIT_STRATEGY: none`).
    pub clean_git_config: Option<bool>,
    /// `safe_directory_checkout` from config.toml; `None`: gitlab-runner's default (on for
    /// the container and VM executors).
    pub safe_directory_checkout: Option<bool>,
    /// The host name the job reports ("Running on <machine> via <hostname>..."), as a custom
    /// executor's `config_exec` sets it; `None`: the machine's only.
    pub hostname: Option<String>,
    /// Warning lines every job of this runner writes as its executor is prepared: a runner
    /// setting that has no effect there (as gitlab-runner's executor `Prepare` warns).
    pub prepare_warnings: Vec<String>,
}

/// The file behind `GITLAB_ENV`, in the job's temporary directory (gitlab-runner's name).
pub const GITLAB_ENV_FILE: &str = "gitlab_runner_env";

/// A stage of a job, in GitLab's vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildStage {
    /// Checks the shell and prints the host.
    PrepareScript,
    /// Clone or fetch the repository, submodules, hooks.
    GetSources,
    /// Extract the caches.
    RestoreCache,
    /// Download the dependencies' artifacts.
    DownloadArtifacts,
    /// A user step (`script`, `release`, ...).
    Step(String),
    /// `after_script`, whatever happened.
    AfterScript,
    /// Archive the caches after success.
    ArchiveCache,
    /// Archive the caches after a failure (`when: on_failure`/`always`).
    ArchiveCacheOnFailure,
    /// Upload artifacts after success.
    UploadArtifactsOnSuccess,
    /// Upload artifacts after a failure.
    UploadArtifactsOnFailure,
    /// Remove the files of file variables.
    CleanupFileVariables,
    /// Between a failed get_sources and its retry: delete tracked and untracked files (not
    /// in [`JobPlan::stages`]; the job runs it before get_sources' second attempt).
    ClearWorktree,
}

impl BuildStage {
    /// The section name (`step_script`, `get_sources`, ...).
    pub fn name(&self) -> String {
        match self {
            BuildStage::PrepareScript => "prepare_script".into(),
            BuildStage::GetSources => "get_sources".into(),
            BuildStage::RestoreCache => "restore_cache".into(),
            BuildStage::DownloadArtifacts => "download_artifacts".into(),
            BuildStage::Step(name) => format!("step_{}", name.to_lowercase()),
            BuildStage::AfterScript => "after_script".into(),
            BuildStage::ArchiveCache => "archive_cache".into(),
            BuildStage::ArchiveCacheOnFailure => "archive_cache_on_failure".into(),
            BuildStage::UploadArtifactsOnSuccess => "upload_artifacts_on_success".into(),
            BuildStage::UploadArtifactsOnFailure => "upload_artifacts_on_failure".into(),
            BuildStage::CleanupFileVariables => "cleanup_file_variables".into(),
            BuildStage::ClearWorktree => "clear_worktree".into(),
        }
    }

    /// The bold-cyan line GitLab prints under the section start.
    pub fn description(&self) -> String {
        match self {
            BuildStage::PrepareScript => "Preparing environment".into(),
            BuildStage::GetSources => "Getting source from Git repository".into(),
            BuildStage::RestoreCache => "Restoring cache".into(),
            BuildStage::DownloadArtifacts => "Downloading artifacts".into(),
            BuildStage::Step(name) => format!("Executing \"step_{}\" stage of the job script", name.to_lowercase()),
            BuildStage::AfterScript => "Running after_script".into(),
            BuildStage::ArchiveCache => "Saving cache for successful job".into(),
            BuildStage::ArchiveCacheOnFailure => "Saving cache for failed job".into(),
            BuildStage::UploadArtifactsOnSuccess => "Uploading artifacts for successful job".into(),
            BuildStage::UploadArtifactsOnFailure => "Uploading artifacts for failed job".into(),
            BuildStage::CleanupFileVariables => "Cleaning up project directory and file based variables".into(),
            BuildStage::ClearWorktree => "Deleting all tracked and untracked files due to source fetch failure".into(),
        }
    }

    /// Runs with the runner's helper tooling rather than in the user's image.
    pub fn predefined(&self) -> bool {
        !matches!(self, BuildStage::Step(_) | BuildStage::AfterScript)
    }
}

/// A job that cannot be turned into scripts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanError {
    /// What is wrong, for the job log.
    pub message: String,
    /// The runner's configuration is at fault (`runner_configuration_error`), not the
    /// payload (`runner_system_failure`).
    pub configuration: bool,
}

impl PlanError {
    fn payload(message: impl Into<String>) -> Self {
        PlanError { message: message.into(), configuration: false }
    }
    fn config(message: impl Into<String>) -> Self {
        PlanError { message: message.into(), configuration: true }
    }
    /// Is the runner's configuration at fault?
    pub fn is_configuration_error(&self) -> bool {
        self.configuration
    }
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PlanError {}

/// `GIT_STRATEGY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GitStrategy {
    /// A fresh clone.
    Clone,
    /// Fetch into the existing checkout (the default).
    Fetch,
    /// Use the directory as it is.
    None,
    /// An empty project directory.
    Empty,
}

/// Everything needed to write a job's stage scripts.
#[derive(Debug, Clone)]
pub struct JobPlan {
    job: JobResponse,
    settings: ScriptSettings,
    project_dir: PathBuf,
    tmp_dir: PathBuf,
    slug: String,
    variables: Vec<JobVariable>,
    strategy: GitStrategy,
    warnings: Vec<String>,
}

fn project_slug(job: &JobResponse) -> String {
    let url = job.git_info.repo_url.trim();
    let path = url
        .split_once("://")
        .map(|(_, rest)| rest)
        .and_then(|rest| rest.split_once('/'))
        .map(|(_, path)| path.trim_end_matches('/').trim_end_matches(".git").to_string())
        .unwrap_or_default();
    if path.is_empty() || path.split('/').any(|c| c == ".." || c.is_empty()) {
        format!("project-{}", job.job_info.project_id)
    } else {
        path
    }
}

fn var(key: &str, value: impl Into<String>) -> JobVariable {
    JobVariable { key: key.into(), value: value.into(), public: true, ..Default::default() }
}

impl JobPlan {
    /// Plan `job` under `settings`.
    pub fn new(job: &JobResponse, settings: &ScriptSettings) -> Result<JobPlan, PlanError> {
        if settings.project_dir_override.is_none() && !settings.builds_dir.is_absolute() {
            return Err(PlanError::config(format!("builds_dir {:?} must be an absolute path", settings.builds_dir)));
        }
        let mut warnings = Vec::new();
        let lookup = |key: &str| job.variable(key).map(str::to_string);
        let default_strategy = if job.allow_git_fetch { GitStrategy::Fetch } else { GitStrategy::Clone };
        let strategy = match lookup("GIT_STRATEGY").as_deref() {
            None | Some("") => default_strategy,
            Some("clone") => GitStrategy::Clone,
            Some("fetch") => GitStrategy::Fetch,
            Some("none") => GitStrategy::None,
            Some("empty") => GitStrategy::Empty,
            Some(other) => {
                warnings.push(format!(
                    "WARNING: GIT_STRATEGY {other:?} is not valid (clone, fetch, none, empty); using the default"
                ));
                default_strategy
            }
        };
        let slug = project_slug(job);
        let project_dir = match &settings.project_dir_override {
            Some(dir) => dir.clone(),
            None => {
                let mut dir = if settings.shared_builds_dir {
                    settings
                        .builds_dir
                        .join(&settings.short_token)
                        .join(settings.concurrent_project_id.to_string())
                        .join(&slug)
                } else {
                    settings.builds_dir.join(&slug)
                };
                if strategy == GitStrategy::Empty {
                    let mut name = dir.clone().into_os_string();
                    name.push("-empty");
                    dir = PathBuf::from(name);
                }
                if let Some(clone_path) = lookup("GIT_CLONE_PATH").filter(|p| !p.is_empty()) {
                    let expanded = PathBuf::from(variables::expand(&clone_path, &|k| {
                        if k == "CI_BUILDS_DIR" {
                            Some(settings.builds_dir.display().to_string())
                        } else {
                            lookup(k)
                        }
                    }));
                    if !expanded.starts_with(&settings.builds_dir)
                        || expanded.components().any(|c| c == std::path::Component::ParentDir)
                    {
                        return Err(PlanError::config(format!(
                            "GIT_CLONE_PATH {} is not inside builds_dir {}",
                            expanded.display(),
                            settings.builds_dir.display()
                        )));
                    }
                    dir = expanded;
                }
                dir
            }
        };
        let tmp_dir = PathBuf::from(format!("{}.tmp", project_dir.display()));
        let timeout = if job.runner_info.timeout > 0 {
            Duration::from_secs(job.runner_info.timeout as u64)
        } else {
            DEFAULT_JOB_TIMEOUT
        };

        // §4.2 order: feature flags, base, job (minus config-owned FF_*), trailing.
        let mut list: Vec<JobVariable> = settings.feature_flags.iter().map(|(k, v)| var(k, v.to_string())).collect();
        list.push(var("CI_RUNNER_SHORT_TOKEN", &settings.short_token));
        for entry in &settings.environment {
            match entry.split_once('=') {
                Some((k, v)) => list.push(var(k, v)),
                None => warnings.push(format!("WARNING: environment entry {entry:?} is not KEY=VALUE; ignored")),
            }
        }
        let builds_dir =
            settings.project_dir_override.as_ref().and_then(|p| p.parent()).unwrap_or(&settings.builds_dir);
        list.push(var("CI_BUILDS_DIR", builds_dir.display().to_string()));
        list.push(var("CI_PROJECT_DIR", project_dir.display().to_string()));
        list.push(var("CI_CONCURRENT_ID", settings.concurrent_id.to_string()));
        list.push(var("CI_CONCURRENT_PROJECT_ID", settings.concurrent_project_id.to_string()));
        list.push(var("CI_SERVER", "yes"));
        list.push(var("CI_JOB_STATUS", "running"));
        list.push(var("CI_JOB_TIMEOUT", timeout.as_secs().to_string()));
        if let Some(image) = job.image.as_ref().filter(|i| !i.name.is_empty()) {
            list.push(var("CI_JOB_IMAGE", &image.name));
        }
        list.extend(job.variables.iter().filter(|v| !settings.feature_flags.contains_key(&v.key)).cloned());
        if settings.shared_environment {
            list.push(var("CI_SHARED_ENVIRONMENT", "true"));
        } else {
            list.push(var("CI_DISPOSABLE_ENVIRONMENT", "true"));
        }
        list.push(var("CI_RUNNER_VERSION", &settings.runner_version));
        list.push(var("CI_RUNNER_REVISION", &settings.runner_revision));
        list.push(var(
            "CI_RUNNER_EXECUTABLE_ARCH",
            format!("{}/{}", crate::buildinfo::OS, crate::buildinfo::go_arch()),
        ));
        list.push(var("RUNNER_TEMP_PROJECT_DIR", tmp_dir.display().to_string()));
        if let Some(chain) = settings.server_tls_ca_chain.as_ref().filter(|c| !c.is_empty()) {
            list.push(JobVariable { file: true, ..var("CI_SERVER_TLS_CA_FILE", chain) });
        }
        let variables =
            variables::expand_all(&variables::dedup(list)).map_err(|e| PlanError::payload(e.to_string()))?;

        if job.variable("CI_DEBUG_TRACE") == Some("true") && settings.debug_trace_disabled {
            warnings.push("WARNING: CI_DEBUG_TRACE is disabled on this runner (debug_trace_disabled = true)".into());
        }
        Ok(JobPlan {
            job: job.clone(),
            settings: settings.clone(),
            project_dir,
            tmp_dir,
            slug,
            variables,
            strategy,
            warnings,
        })
    }

    /// Where the job's checkout lives (`CI_PROJECT_DIR`).
    pub fn project_dir(&self) -> &Path {
        &self.project_dir
    }
    /// The settings the job was planned under.
    pub fn settings(&self) -> &ScriptSettings {
        &self.settings
    }
    /// The builds root (`CI_BUILDS_DIR`).
    pub fn builds_dir(&self) -> &Path {
        match &self.settings.project_dir_override {
            Some(dir) => dir.parent().unwrap_or(dir),
            None => &self.settings.builds_dir,
        }
    }
    /// The cache root.
    pub fn cache_dir(&self) -> &Path {
        &self.settings.cache_dir
    }
    /// `<project_dir>.tmp`: file variables and helper files.
    pub fn tmp_dir(&self) -> &Path {
        &self.tmp_dir
    }
    /// The final variable list (§4.2 order, deduplicated, expanded).
    pub fn variables(&self) -> &[JobVariable] {
        &self.variables
    }
    /// The job's variables as a terminal's environment: every one with a shell name, a file
    /// variable as the path of its file (which the stages wrote), later ones winning.
    pub fn terminal_env(&self) -> Vec<(String, String)> {
        self.variables
            .iter()
            .filter(|v| is_env_name(&v.key))
            .filter_map(|v| Some((v.key.clone(), self.get(&v.key)?)))
            .collect()
    }
    fn value(&self, key: &str) -> Option<&str> {
        self.variables.iter().rev().find(|v| v.key == key).map(|v| v.value.as_str())
    }
    /// gitlab-runner's `Variables.Get`: a variable's value, or the path of a file variable's
    /// file (what `$NAME` means in cache keys, policies and paths).
    fn get(&self, key: &str) -> Option<String> {
        let var = self.variables.iter().rev().find(|v| v.key == key)?;
        Some(if var.file {
            variables::file_path(&self.tmp_dir.display().to_string(), &var.key)
        } else {
            var.value.clone()
        })
    }
    /// Whether feature flag `name` is on for this job (the runner's `feature_flags`, then the
    /// job's variable, then gitlab-runner's default).
    pub fn feature_flag(&self, name: &str) -> bool {
        crate::payload::flags::resolve(name, &self.settings.feature_flags, self.value(name))
    }
    /// How long to wait before attempt `attempt + 1` of a stage that failed `attempt` times,
    /// as gitlab-runner: 5 s doubling to 5 min with `FF_USE_EXPONENTIAL_BACKOFF_STAGE_RETRY`
    /// (its default), 1 s doubling to 5 s without.
    pub fn stage_retry_backoff(&self, attempt: u32) -> Duration {
        let (min, max) = if self.feature_flag(crate::payload::flags::EXPONENTIAL_BACKOFF_STAGE_RETRY) {
            (Duration::from_secs(5), Duration::from_secs(300))
        } else {
            (Duration::from_secs(1), Duration::from_secs(5))
        };
        min.saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1))).min(max)
    }
    /// Token prefixes the job asks to mask.
    pub fn token_mask_prefixes(&self) -> Vec<String> {
        self.job.features.token_mask_prefixes.clone()
    }
    /// `GIT_STRATEGY` in effect.
    pub fn strategy(&self) -> GitStrategy {
        self.strategy
    }
    /// Job timeout (`runner_info.timeout`, default 7200 s).
    pub fn job_timeout(&self) -> Duration {
        if self.job.runner_info.timeout > 0 {
            Duration::from_secs(self.job.runner_info.timeout as u64)
        } else {
            DEFAULT_JOB_TIMEOUT
        }
    }
    /// `RUNNER_SCRIPT_TIMEOUT`, capped by the job timeout.
    pub fn script_timeout(&self) -> Duration {
        self.value("RUNNER_SCRIPT_TIMEOUT")
            .and_then(|v| parse_duration(v).ok())
            .map_or(self.job_timeout(), |d| d.min(self.job_timeout()))
    }
    /// `RUNNER_AFTER_SCRIPT_TIMEOUT` (default 5 min).
    pub fn after_script_timeout(&self) -> Duration {
        self.value("RUNNER_AFTER_SCRIPT_TIMEOUT")
            .and_then(|v| parse_duration(v).ok())
            .unwrap_or(DEFAULT_AFTER_SCRIPT_TIMEOUT)
    }
    /// How many times `stage` is tried: `GET_SOURCES_ATTEMPTS`, `RESTORE_CACHE_ATTEMPTS`,
    /// `ARTIFACT_DOWNLOAD_ATTEMPTS` (1–10, default 1); other stages once.
    pub fn attempts(&self, stage: &BuildStage) -> u32 {
        let variable = match stage {
            BuildStage::GetSources => "GET_SOURCES_ATTEMPTS",
            BuildStage::RestoreCache => "RESTORE_CACHE_ATTEMPTS",
            BuildStage::DownloadArtifacts => "ARTIFACT_DOWNLOAD_ATTEMPTS",
            _ => return 1,
        };
        self.value(variable).and_then(|v| v.trim().parse().ok()).unwrap_or(1).clamp(1, 10)
    }
    /// A step of the payload by name.
    pub fn step(&self, name: &str) -> Option<&Step> {
        self.job.steps.iter().find(|s| s.name == name)
    }

    /// The stages of this job in GitLab's order (§4.1); a stage with nothing to do for this
    /// job is left out (no section), as gitlab-runner skips it.
    pub fn stages(&self) -> Vec<BuildStage> {
        let mut stages = vec![BuildStage::PrepareScript, BuildStage::GetSources];
        if self.has_cache() {
            stages.push(BuildStage::RestoreCache);
        }
        if self.has_dependency_artifacts() {
            stages.push(BuildStage::DownloadArtifacts);
        }
        for step in &self.job.steps {
            if step.name != "after_script" {
                stages.push(BuildStage::Step(step.name.clone()));
            }
        }
        if self.step("after_script").is_some_and(|s| !s.script.is_empty()) {
            stages.push(BuildStage::AfterScript);
        }
        if self.has_cache_archive(false) {
            stages.push(BuildStage::ArchiveCache);
        }
        if self.has_cache_archive(true) {
            stages.push(BuildStage::ArchiveCacheOnFailure);
        }
        if self.has_uploads(false) {
            stages.push(BuildStage::UploadArtifactsOnSuccess);
        }
        if self.has_uploads(true) {
            stages.push(BuildStage::UploadArtifactsOnFailure);
        }
        stages.push(BuildStage::CleanupFileVariables);
        stages
    }

    /// The bash script of `stage`; `job_status` becomes `CI_JOB_STATUS`.
    pub fn script(&self, stage: &BuildStage, job_status: &str) -> Result<String, PlanError> {
        let mut body = self.prelude(stage, job_status);
        match stage {
            BuildStage::PrepareScript => {
                for warning in &self.warnings {
                    body.push_str(&echo_warning(warning));
                }
                // The machine's name as `hostname` prints it (the kernel's node name), read by
                // the shell itself where /proc has it: no process.
                body.push_str(
                    "read -r RUNWAY_MACHINE 2>/dev/null < /proc/sys/kernel/hostname || \
                     RUNWAY_MACHINE=$(hostname 2>/dev/null || uname -n)\n",
                );
                match &self.settings.hostname {
                    Some(name) => {
                        body.push_str(&format!("echo \"Running on $RUNWAY_MACHINE via \"{}\"...\"\n", quote(name)))
                    }
                    None => body.push_str("echo \"Running on $RUNWAY_MACHINE...\"\n"),
                }
            }
            BuildStage::GetSources => body.push_str(&self.get_sources()),
            BuildStage::ClearWorktree => body.push_str(&self.clear_worktree()),
            BuildStage::RestoreCache => body.push_str(&self.restore_cache()?),
            BuildStage::DownloadArtifacts => body.push_str(&self.download_artifacts()),
            BuildStage::ArchiveCache => body.push_str(&self.archive_cache(false)?),
            BuildStage::ArchiveCacheOnFailure => body.push_str(&self.archive_cache(true)?),
            BuildStage::UploadArtifactsOnSuccess => body.push_str(&self.upload_artifacts(false)),
            BuildStage::UploadArtifactsOnFailure => body.push_str(&self.upload_artifacts(true)),
            BuildStage::Step(name) => {
                let step = self.step(name).ok_or_else(|| PlanError::payload(format!("job has no step {name:?}")))?;
                body.push_str(&format!("cd {}\n", quote(&self.project_dir.display().to_string())));
                if let Some(pre) = &self.settings.pre_build_script {
                    body.push_str(&user_lines(pre.lines().map(str::to_string)));
                }
                body.push_str(&user_lines(step.script.iter().cloned()));
                if let Some(post) = &self.settings.post_build_script {
                    body.push_str(&user_lines(post.lines().map(str::to_string)));
                }
            }
            BuildStage::AfterScript => {
                let step = self.step("after_script").ok_or_else(|| PlanError::payload("job has no after_script"))?;
                body.push_str(&format!("cd {}\n", quote(&self.project_dir.display().to_string())));
                body.push_str(&user_lines(step.script.iter().cloned()));
            }
            BuildStage::CleanupFileVariables => {
                body.push_str(&self.git_cleanup_stage());
                body.push_str(&self.cleanup_file_variables());
            }
        }
        Ok(wrap(&body))
    }

    /// The end of the cleanup stage. As gitlab-runner's: the file variables' files are removed
    /// (those that exist: no `rm` for a job without any) and so is what the job wrote to
    /// `GITLAB_ENV` (the file is emptied, by the shell itself), while the temporary directory
    /// stays for the project directory's next job, which then needs no `mkdir` either. For
    /// `runway exec`, whose project is the user's own checkout, the whole directory goes: it
    /// sits beside that checkout.
    fn cleanup_file_variables(&self) -> String {
        let tmp = self.tmp_dir.display().to_string();
        if self.settings.project_dir_override.is_some() {
            return format!("rm -rf {}\n", quote(&tmp));
        }
        let mut out = String::new();
        for v in self.variables.iter().filter(|v| v.file && is_env_name(&v.key)) {
            out.push_str(&remove_if_present(&quote(&variables::file_path(&tmp, &v.key)), false));
        }
        let env_file = quote(&self.gitlab_env_file().display().to_string());
        out.push_str(&format!("if [ -f {env_file} ]; then : > {env_file}; fi\n"));
        out
    }

    /// Where `GITLAB_ENV` points.
    pub fn gitlab_env_file(&self) -> PathBuf {
        self.tmp_dir.join(GITLAB_ENV_FILE)
    }

    /// Variable exports and file variables, at the top of every stage; then `GITLAB_ENV`
    /// and what earlier stages appended to it (gitlab-runner's `writeExports`). The prepare
    /// stage first empties it: a file left by an earlier job of this directory is not read.
    fn prelude(&self, stage: &BuildStage, job_status: &str) -> String {
        let mut out = String::new();
        let tmp = self.tmp_dir.display().to_string();
        out.push_str(&make_dir_unless_present(&quote(&tmp)));
        for v in &self.variables {
            if !is_env_name(&v.key) {
                continue;
            }
            if v.file {
                let path = variables::file_path(&tmp, &v.key);
                out.push_str(&format!("printf '%s' {} > {}\n", quote(&v.value), quote(&path)));
                out.push_str(&format!("export {}={}\n", v.key, quote(&path)));
            } else if v.key == "CI_JOB_STATUS" {
                out.push_str(&format!("export CI_JOB_STATUS={}\n", quote(job_status)));
            } else {
                out.push_str(&format!("export {}={}\n", v.key, quote(&v.value)));
            }
        }
        let env_file = quote(&self.gitlab_env_file().display().to_string());
        // `: >` and `: >>` rather than `rm` and `touch`: no process, and user stages run in the
        // job's image, which may have no coreutils. The prepare stage starts it empty.
        let open = if *stage == BuildStage::PrepareScript { ">" } else { ">>" };
        out.push_str(&format!("export GITLAB_ENV={env_file}\n: {open} {env_file}\n"));
        out.push_str(&format!("while read -r line; do export \"$line\"; done < {env_file}\n"));
        out.push_str("export GIT_TERMINAL_PROMPT=0 GCM_INTERACTIVE=Never\n");
        if self.value("CI_DEBUG_TRACE") == Some("true") && !self.settings.debug_trace_disabled {
            out.push_str("set -x\n");
        }
        out
    }
}

fn is_env_name(key: &str) -> bool {
    let mut chars = key.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// User script lines: each echoed as `$ cmd` (bold green), then run.
fn user_lines(lines: impl Iterator<Item = String>) -> String {
    let mut out = String::new();
    for line in lines {
        let command = line.trim();
        if command.is_empty() {
            continue;
        }
        out.push_str(&echo_command(command));
        out.push_str(command);
        out.push('\n');
    }
    out
}

/// For tests and `runway exec`: a raw line printed in the stage.
pub fn echo_line(text: &str) -> String {
    echo_raw(text)
}

#[cfg(test)]
mod backoff_tests {
    use super::*;

    fn plan(job_value: Option<&str>, runner_value: Option<bool>) -> JobPlan {
        let mut job: JobResponse =
            serde_json::from_str(include_str!("../../../tests/fixtures/job-response-example.json")).expect("fixture");
        if let Some(value) = job_value {
            job.variables.push(crate::payload::JobVariable {
                key: crate::payload::flags::EXPONENTIAL_BACKOFF_STAGE_RETRY.into(),
                value: value.into(),
                ..Default::default()
            });
        }
        let mut settings = ScriptSettings {
            builds_dir: PathBuf::from("/builds"),
            cache_dir: PathBuf::from("/cache"),
            ..ScriptSettings::default()
        };
        if let Some(value) = runner_value {
            settings.feature_flags.insert(crate::payload::flags::EXPONENTIAL_BACKOFF_STAGE_RETRY.into(), value);
        }
        JobPlan::new(&job, &settings).expect("plan")
    }

    #[test]
    fn stage_retries_back_off_as_gitlab_runner_does() {
        let waits = |p: &JobPlan| (1..=8).map(|a| p.stage_retry_backoff(a).as_secs()).collect::<Vec<_>>();
        assert_eq!(waits(&plan(None, None)), [5, 10, 20, 40, 80, 160, 300, 300], "the flag is on by default");
        assert_eq!(waits(&plan(Some("false"), None)), [1, 2, 4, 5, 5, 5, 5, 5]);
        assert_eq!(waits(&plan(Some("false"), Some(true))), [5, 10, 20, 40, 80, 160, 300, 300], "the runner wins");
    }
}

#[cfg(test)]
mod cleanup_tests {
    use super::*;

    /// The fixture job with a file variable, planned under `builds`; as `runway exec` plans
    /// it (the project is the checkout `builds/checkout`) when `exec`.
    fn planned(builds: &Path, exec: bool) -> JobPlan {
        let mut job: JobResponse =
            serde_json::from_str(include_str!("../../../tests/fixtures/job-response-example.json")).expect("fixture");
        job.variables.push(crate::payload::JobVariable {
            key: "SECRET_FILE".into(),
            value: "s3cr3t".into(),
            file: true,
            ..Default::default()
        });
        let settings = ScriptSettings {
            builds_dir: builds.to_path_buf(),
            cache_dir: builds.join("cache"),
            project_dir_override: exec.then(|| builds.join("checkout")),
            ..ScriptSettings::default()
        };
        JobPlan::new(&job, &settings).expect("plan")
    }

    fn run(plan: &JobPlan, stage: BuildStage) {
        let script = plan.script(&stage, "success").expect("script");
        let mut child = std::process::Command::new("bash")
            .current_dir(plan.builds_dir())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("bash");
        use std::io::Write;
        child.stdin.take().expect("stdin").write_all(script.as_bytes()).expect("write");
        assert!(child.wait().expect("wait").success(), "{stage:?}:\n{script}");
    }

    #[test]
    fn cleanup_removes_file_variables_and_empties_gitlab_env_as_gitlab_runner_does() {
        let dir = tempfile::tempdir().expect("tempdir");
        let plan = planned(dir.path(), false);
        let script = plan.script(&BuildStage::CleanupFileVariables, "success").expect("script");
        let removes_tmp = format!("rm -rf {}", quote(&plan.tmp_dir().display().to_string()));
        assert!(!script.contains(&removes_tmp), "the temporary directory stays for the next job: {script}");
        run(&plan, BuildStage::PrepareScript);
        let (tmp, env) = (plan.tmp_dir().to_path_buf(), plan.gitlab_env_file());
        let secret = PathBuf::from(variables::file_path(&tmp.display().to_string(), "SECRET_FILE"));
        assert_eq!(std::fs::read_to_string(&secret).expect("file variable"), "s3cr3t");
        std::fs::write(&env, "LEFT=over\n").expect("a stage writes GITLAB_ENV");
        run(&plan, BuildStage::CleanupFileVariables);
        assert!(!secret.exists(), "the file variable's file is removed");
        assert_eq!(std::fs::read_to_string(&env).expect("env file"), "", "what the job wrote is gone");
        assert!(tmp.is_dir());
        // The next job of this directory starts with an empty GITLAB_ENV, with no mkdir.
        std::fs::write(&env, "LEFT=over\n").expect("left behind");
        run(&plan, BuildStage::PrepareScript);
        assert_eq!(std::fs::read_to_string(&env).expect("env file"), "");

        // `runway exec` removes the directory beside the user's checkout.
        let exec = planned(dir.path(), true);
        std::fs::create_dir_all(dir.path().join("checkout")).expect("checkout");
        run(&exec, BuildStage::PrepareScript);
        assert!(exec.tmp_dir().is_dir());
        run(&exec, BuildStage::CleanupFileVariables);
        assert!(!exec.tmp_dir().exists());
    }
}
