//! Glue from a job to an executor plugin: resolving the plugin and its provider info
//! (default shell, builds and cache directories, features), turning a job plan into the
//! WIT `job` record, and running one stage under a stop signal with the job's deadlines.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::bindings::executor::exports::runway::executor::executor::{Job, ProviderInfo, StageScript};
use crate::payload::JobResponse;
use crate::plugin::executor::Image;
use crate::plugin::{ExecutorFailure, ExecutorSession, LoadedPlugin, PluginHost};
use crate::stop::{StopReason, StopSignal};

/// An executor plugin resolved for a runner, with what it said about itself.
#[derive(Clone)]
pub struct ResolvedExecutor {
    pub plugin: Arc<LoadedPlugin>,
    pub info: ProviderInfo,
    /// `[runners.<executor>]` as JSON.
    pub config_json: String,
}

impl ResolvedExecutor {
    /// Resolve executor `name` in `host` and validate its config section.
    pub async fn resolve(host: &PluginHost, name: &str, config_json: &str) -> Result<Self, ExecutorFailure> {
        let plugin = host.executor(name).map_err(ExecutorFailure::Plugin)?;
        let info = host.executor_info(&plugin, config_json).await?;
        Ok(ResolvedExecutor { plugin, info, config_json: config_json.to_string() })
    }

    /// The builds directory: config.toml's, else the executor's default resolved against
    /// `base` (the runner's working directory).
    pub fn builds_dir(&self, configured: Option<&str>, base: &Path) -> PathBuf {
        resolve_dir(configured.unwrap_or(&self.info.default_builds_dir), base)
    }

    /// The cache directory, likewise.
    pub fn cache_dir(&self, configured: Option<&str>, base: &Path) -> PathBuf {
        resolve_dir(configured.unwrap_or(&self.info.default_cache_dir), base)
    }

    /// Does the executor share machines between jobs (namespaced builds dirs)?
    pub fn shared(&self) -> bool {
        self.info.features.contains(crate::plugin::executor::Features::SHARED)
    }
}

fn resolve_dir(dir: &str, base: &Path) -> PathBuf {
    if let Some(rest) = dir.strip_prefix("~/") {
        if let Some(home) = std::env::var_os("HOME") {
            return PathBuf::from(home).join(rest);
        }
    }
    let path = PathBuf::from(dir);
    if path.is_absolute() {
        path
    } else {
        base.join(path)
    }
}

fn image(img: &crate::payload::Image) -> Image {
    Image {
        name: img.name.clone(),
        entrypoint: img.entrypoint.clone(),
        command: img.command.clone(),
        aliases: img.alias.split([',', ' ']).filter(|a| !a.is_empty()).map(str::to_string).collect(),
    }
}

/// The WIT job record for a plan.
pub fn wit_job(
    job: &JobResponse,
    executor: &ResolvedExecutor,
    shell: &str,
    builds_dir: &Path,
    project_dir: &Path,
    cache_dir: &Path,
    timeout: Duration,
) -> Job {
    Job {
        id: u64::try_from(job.id).unwrap_or_default(),
        name: job.job_info.name.clone(),
        project_path: job.job_info.project_full_path.clone(),
        shell: shell.to_string(),
        builds_dir: builds_dir.display().to_string(),
        project_dir: project_dir.display().to_string(),
        cache_dir: cache_dir.display().to_string(),
        config: executor.config_json.clone(),
        timeout_seconds: u32::try_from(timeout.as_secs()).unwrap_or(u32::MAX),
        image: job.image.as_ref().filter(|i| !i.name.is_empty()).map(image),
        services: job.services.iter().map(image).collect(),
    }
}

/// How one stage ended.
#[derive(Debug)]
pub enum StageOutcome {
    /// The script exited with this code.
    Exited(i32),
    /// The stage was stopped (cancel, abort, timeout) and its processes killed.
    Stopped(StopReason),
    /// The executor or plugin failed.
    Failed(ExecutorFailure),
}

/// Run `stage` in `session`; `stop` is fired by the caller's controls, and additionally
/// with `TimedOut` once `timeout` elapses.
pub async fn run_stage(
    session: &mut ExecutorSession,
    stage: StageScript,
    stop: StopSignal,
    timeout: Duration,
) -> StageOutcome {
    let timer = {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            stop.stop(StopReason::TimedOut);
        })
    };
    let result = session.run(&stage, stop.clone()).await;
    timer.abort();
    match (result, stop.reason()) {
        (_, Some(reason)) => StageOutcome::Stopped(reason),
        (Ok(code), None) => StageOutcome::Exited(code),
        (
            Err(ExecutorFailure::Executor(crate::bindings::executor::runway::executor::types::ExecutorError::Canceled)),
            None,
        ) => StageOutcome::Stopped(StopReason::Canceled),
        (Err(e), None) => StageOutcome::Failed(e),
    }
}
