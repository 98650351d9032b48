//! Executor plugins: implement [`Executor`] and [`Environment`], then call
//! [`export_executor!`](crate::export_executor).

use crate::export::{Component, Named};

use crate::bindings::executor::exports::runway::executor0_1_0::executor as wit;
pub use crate::bindings::executor::exports::runway::executor0_1_0::executor::{
    ExecutorError, ExitStatus, Job, ProviderInfo, StageScript,
};
pub use crate::bindings::executor::runway::executor0_1_0::types::{Features, Image};
use crate::bindings::executor::runway::host0_1_0::plugin as wit_plugin;

/// An executor: how jobs are run. One value of the plugin's type is never created; the
/// functions are associated, and per-job state lives in [`Executor::Environment`].
pub trait Executor: 'static {
    /// The environment a job runs in.
    type Environment: Environment;

    /// Describe the executor and validate its config.toml section (`config` is JSON).
    fn info(config: &str) -> Result<ProviderInfo, ExecutorError>;

    /// Prepare the environment for one job.
    fn prepare(job: Job) -> Result<Self::Environment, ExecutorError>;

    /// Rebuild an environment from [`Environment::state`] after a runner restart (or in
    /// another runner manager that took the job over). What `resume` must guarantee:
    ///
    /// - the environment it returns behaves as the one `state` was taken from: the same
    ///   directories, the same stage files, and [`Environment::cleanup`] releases what the
    ///   previous runner created — including stopping a stage it started that still runs (a
    ///   job that cannot go on is cleaned up through `resume` + `cleanup`);
    /// - [`Environment::run`] of a stage that was already started when the state was taken
    ///   (or after) reattaches to it instead of starting it again: no stage runs twice;
    /// - output already in the job log is not repeated. The host takes care of that when the
    ///   plugin follows the stage through [`crate::remote::attach`]: it starts past what the
    ///   restored log holds of that stage's log file.
    ///
    /// Stages that must survive the runner therefore run detached
    /// ([`crate::remote::start_detached`]); an executor whose stages die with the runner
    /// keeps this default, and the host fails its interrupted jobs instead.
    fn resume(job: Job, state: String) -> Result<Self::Environment, ExecutorError> {
        let _ = (job, state);
        Err(ExecutorError::Other("this executor cannot resume jobs".into()))
    }
}

/// A prepared job environment.
pub trait Environment: 'static {
    /// Run one stage script; a non-zero exit code is a normal result. After
    /// [`Executor::resume`], a stage already started reattaches instead (see there).
    fn run(&self, stage: StageScript) -> Result<ExitStatus, ExecutorError>;

    /// Release what `prepare` created.
    fn cleanup(&self) {}

    /// State from which [`Executor::resume`] can rebuild this environment (any string; JSON
    /// is usual). The host stores it at every stage boundary, so it must name what a later
    /// `resume` needs to find the stages already started; `None` means the environment cannot
    /// be resumed.
    fn state(&self) -> Option<String> {
        None
    }
}

impl ProviderInfo {
    /// Provider info with the features every script-running executor has (`variables`,
    /// `shared`), builds in `builds` and cache in `cache` relative to the working directory.
    pub fn new(name: &str, default_shell: &str) -> Self {
        ProviderInfo {
            name: name.to_string(),
            default_shell: default_shell.to_string(),
            features: Features::VARIABLES | Features::SHARED,
            default_builds_dir: "builds".to_string(),
            default_cache_dir: "cache".to_string(),
        }
    }
}

#[doc(hidden)]
pub struct EnvironmentHandle<E>(E);

impl<T: Executor + Named> wit::Guest for Component<T> {
    fn metadata() -> wit_plugin::PluginMetadata {
        crate::export::metadata::<T>(wit_plugin::PluginKind::Executor)
    }

    type Environment = EnvironmentHandle<T::Environment>;

    fn info(config: String) -> Result<ProviderInfo, ExecutorError> {
        T::info(&config)
    }

    fn prepare(job: Job) -> Result<wit::Environment, ExecutorError> {
        T::prepare(job).map(|env| wit::Environment::new(EnvironmentHandle(env)))
    }

    fn resume(job: Job, state: String) -> Result<wit::Environment, ExecutorError> {
        T::resume(job, state).map(|env| wit::Environment::new(EnvironmentHandle(env)))
    }
}

impl<E: Environment> wit::GuestEnvironment for EnvironmentHandle<E> {
    fn run(&self, stage: StageScript) -> Result<ExitStatus, ExecutorError> {
        self.0.run(stage)
    }

    fn cleanup(&self) {
        self.0.cleanup()
    }

    fn state(&self) -> Option<String> {
        self.0.state()
    }
}
