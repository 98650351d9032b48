//! Planning a job again while its executor is prepared: a custom executor's `config_exec`
//! moves the builds or cache directory, shares the builds directory, names the host or the
//! shell (`runway:host/job-config`). [`Replanner`] is the job's side of
//! [`crate::executor::Reconfigure`]: it plans with the overrides, keeps the last plan, and is
//! closed once the executor is prepared.
//!
//! Owns: [`Replanner`]. Must not touch: how plans are made (`crate::script`), executors.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::executor::{JobOverrides, Reconfigure, ReconfigureError, Replanned};
use crate::payload::JobResponse;
use crate::script::{JobPlan, ScriptSettings};

/// Plans one job again with an executor's overrides until [`Replanner::close`].
pub struct Replanner {
    job: JobResponse,
    settings: ScriptSettings,
    plan: Mutex<Option<JobPlan>>,
    closed: AtomicBool,
}

impl Replanner {
    /// A replanner for `job`, planned so far under `settings`.
    pub fn new(job: &JobResponse, settings: &ScriptSettings) -> Self {
        Replanner {
            job: job.clone(),
            settings: settings.clone(),
            plan: Mutex::new(None),
            closed: AtomicBool::new(false),
        }
    }

    /// The executor is prepared: no more replanning; the last plan made, if any.
    pub fn close(&self) -> Option<JobPlan> {
        self.closed.store(true, Ordering::SeqCst);
        self.plan.lock().ok().and_then(|mut p| p.take())
    }
}

/// `dir` as an absolute path: relative ones are the runner's working directory's, as the
/// custom executor's drivers run there.
fn absolute(dir: &str) -> PathBuf {
    let path = Path::new(dir);
    if path.is_absolute() {
        return path.to_path_buf();
    }
    std::env::current_dir().map(|cwd| cwd.join(path)).unwrap_or_else(|_| path.to_path_buf())
}

impl Reconfigure for Replanner {
    fn reconfigure(&self, overrides: JobOverrides) -> Result<Replanned, ReconfigureError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(ReconfigureError::NotPreparing);
        }
        let mut settings = self.settings.clone();
        if let Some(dir) = overrides.builds_dir.as_deref().filter(|d| !d.is_empty()) {
            settings.builds_dir = absolute(dir);
        }
        if let Some(dir) = overrides.cache_dir.as_deref().filter(|d| !d.is_empty()) {
            settings.cache_dir = absolute(dir);
        }
        if let Some(shared) = overrides.builds_dir_is_shared {
            settings.shared_builds_dir = shared;
        }
        if let Some(name) = overrides.hostname.filter(|h| !h.is_empty()) {
            settings.hostname = Some(name);
        }
        if let Some(shell) = overrides.shell.filter(|s| !s.is_empty()) {
            if shell != "bash" && shell != "sh" {
                return Err(ReconfigureError::UnsupportedShell(shell));
            }
            settings.shell = shell;
        }
        let plan = JobPlan::new(&self.job, &settings).map_err(|e| ReconfigureError::Plan(e.to_string()))?;
        let replanned = Replanned {
            builds_dir: plan.builds_dir().display().to_string(),
            project_dir: plan.project_dir().display().to_string(),
            cache_dir: plan.cache_dir().display().to_string(),
            variables: plan.variables().iter().map(|v| (v.key.clone(), v.value.clone())).collect(),
        };
        if let Ok(mut slot) = self.plan.lock() {
            *slot = Some(plan);
        }
        Ok(replanned)
    }

    fn response(&self) -> Option<String> {
        serde_json::to_string(&self.job).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> JobResponse {
        serde_json::from_str(include_str!("../../../tests/fixtures/job-response-example.json")).expect("fixture")
    }

    fn settings() -> ScriptSettings {
        ScriptSettings {
            builds_dir: PathBuf::from("/runner/builds"),
            cache_dir: PathBuf::from("/runner/cache"),
            shell: "bash".into(),
            ..ScriptSettings::default()
        }
    }

    #[test]
    fn overrides_move_the_plan_and_its_variables_until_closed() {
        let replanner = Replanner::new(&job(), &settings());
        let overrides = JobOverrides {
            builds_dir: Some("/driver/builds".into()),
            cache_dir: Some("/driver/cache".into()),
            hostname: Some("vm-1".into()),
            ..JobOverrides::default()
        };
        let planned = replanner.reconfigure(overrides.clone()).expect("replanned");
        assert_eq!((planned.builds_dir.as_str(), planned.cache_dir.as_str()), ("/driver/builds", "/driver/cache"));
        assert!(planned.project_dir.starts_with("/driver/builds/"), "{}", planned.project_dir);
        let value = |key: &str| planned.variables.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        assert_eq!(value("CI_PROJECT_DIR").as_deref(), Some(planned.project_dir.as_str()));
        assert_eq!(value("CI_BUILDS_DIR").as_deref(), Some("/driver/builds"));
        let shell = JobOverrides { shell: Some("fish".into()), ..JobOverrides::default() };
        assert!(replanner.reconfigure(shell).expect_err("unsupported shell").to_string().contains("fish"));
        let plan = replanner.close().expect("the last good plan");
        assert_eq!(plan.builds_dir(), Path::new("/driver/builds"));
        assert_eq!(plan.settings().hostname.as_deref(), Some("vm-1"));
        assert!(replanner.reconfigure(overrides).is_err(), "closed once the executor is prepared");
        let response: serde_json::Value = serde_json::from_str(&replanner.response().expect("json")).expect("parses");
        assert_eq!(response["id"], serde_json::json!(job().id));
    }
}
