//! Typed facade over executor plugins: `info` in a throwaway store, and an
//! [`ExecutorSession`] — one store for one job — for prepare, run per stage, cleanup.

use std::sync::Arc;

use wasmtime::component::ResourceAny;
use wasmtime::Store;

use crate::bindings::executor::exports::runway::executor::executor::{ExecutorError, Job, ProviderInfo, StageScript};
use crate::bindings::executor::ExecutorPlugin;
use crate::capability::CallContext;
use crate::plugin::call::{classify, guarded, PluginError, PluginErrorKind, RawFailure};
use crate::plugin::registry::{LoadedPlugin, PluginPre};
use crate::plugin::state::PluginState;
use crate::plugin::PluginHost;
use crate::stop::StopSignal;

pub use crate::bindings::executor::runway::executor::types::{Features, Image};

/// Why an executor step failed.
#[derive(Debug, Clone)]
pub enum ExecutorFailure {
    /// The plugin misbehaved (trap, timeout, memory limit): a system failure.
    Plugin(PluginError),
    /// The plugin returned an error value.
    Executor(ExecutorError),
}

impl std::fmt::Display for ExecutorFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExecutorFailure::Plugin(e) => write!(f, "{e}"),
            ExecutorFailure::Executor(ExecutorError::InvalidConfig(m)) => {
                write!(f, "invalid executor configuration: {m}")
            }
            ExecutorFailure::Executor(ExecutorError::Unavailable(m)) => write!(f, "executor unavailable: {m}"),
            ExecutorFailure::Executor(ExecutorError::Canceled) => f.write_str("canceled"),
            ExecutorFailure::Executor(ExecutorError::Other(m)) => f.write_str(m),
        }
    }
}

impl PluginHost {
    /// The current version of executor `name`. Keep the `Arc` for the whole job: a reload
    /// while the job runs does not affect it.
    pub fn executor(&self, name: &str) -> Result<Arc<LoadedPlugin>, PluginError> {
        let plugins = self.registry.plugins.load();
        match plugins.get(name) {
            Some(p) if matches!(p.pre, PluginPre::Executor(_)) => Ok(p.clone()),
            Some(p) => {
                Err(p.error(PluginErrorKind::Incompatible, format!("is a {} plugin, not an executor", p.meta.kind)))
            }
            None => Err(PluginError {
                plugin: name.to_string(),
                kind: PluginErrorKind::NotFound,
                message: format!(
                    "no executor plugin named {name:?} (loaded: {})",
                    plugins.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            }),
        }
    }

    /// Ask executor `plugin` to describe itself and validate `config_json`.
    pub async fn executor_info(
        &self,
        plugin: &Arc<LoadedPlugin>,
        config_json: &str,
    ) -> Result<ProviderInfo, ExecutorFailure> {
        let mut session = self.start_executor(plugin, CallContext::default()).await.map_err(ExecutorFailure::Plugin)?;
        let budget = session.store.data().budget.clone();
        let result =
            guarded(budget, session.bindings.runway_executor_executor().call_info(&mut session.store, config_json))
                .await;
        match result {
            Ok(Ok(info)) => Ok(info),
            Ok(Err(e)) => Err(ExecutorFailure::Executor(e)),
            Err(f) => Err(ExecutorFailure::Plugin(classify(&plugin.meta.name, f, session.store.data()))),
        }
    }

    /// A fresh instance of executor `plugin` for one job.
    pub async fn start_executor(
        &self,
        plugin: &Arc<LoadedPlugin>,
        call: CallContext,
    ) -> Result<ExecutorSession, PluginError> {
        let PluginPre::Executor(pre) = &plugin.pre else {
            return Err(plugin.error(PluginErrorKind::Incompatible, "not an executor plugin"));
        };
        let mut store = plugin.new_store(&self.registry.engine.engine, call)?;
        let bindings = pre
            .instantiate_async(&mut store)
            .await
            .map_err(|e| plugin.error(PluginErrorKind::Incompatible, format!("instantiation failed: {e:#}")))?;
        Ok(ExecutorSession { plugin: plugin.clone(), store, bindings, environment: None, poisoned: None })
    }
}

/// One job's instance of an executor plugin.
pub struct ExecutorSession {
    plugin: Arc<LoadedPlugin>,
    store: Store<PluginState>,
    bindings: ExecutorPlugin,
    environment: Option<ResourceAny>,
    /// Set after a trap: the instance cannot be entered again.
    poisoned: Option<PluginError>,
}

impl ExecutorSession {
    /// The plugin (and version) this session runs.
    pub fn plugin(&self) -> &Arc<LoadedPlugin> {
        &self.plugin
    }

    fn fail(&mut self, failure: RawFailure) -> ExecutorFailure {
        let error = classify(&self.plugin.meta.name, failure, self.store.data());
        self.poisoned = Some(error.clone());
        ExecutorFailure::Plugin(error)
    }

    fn check_usable(&self) -> Result<(), ExecutorFailure> {
        match &self.poisoned {
            Some(e) => Err(ExecutorFailure::Plugin(e.clone())),
            None => Ok(()),
        }
    }

    /// Prepare the job environment.
    pub async fn prepare(&mut self, job: &Job) -> Result<(), ExecutorFailure> {
        self.check_usable()?;
        let budget = self.store.data().budget.clone();
        let result = guarded(budget, self.bindings.runway_executor_executor().call_prepare(&mut self.store, job)).await;
        self.adopt_environment(result)
    }

    /// Rebuild the environment from saved state after a runner restart.
    pub async fn resume(&mut self, job: &Job, state: &str) -> Result<(), ExecutorFailure> {
        self.check_usable()?;
        let budget = self.store.data().budget.clone();
        let result =
            guarded(budget, self.bindings.runway_executor_executor().call_resume(&mut self.store, job, state)).await;
        self.adopt_environment(result)
    }

    /// Keep the environment `prepare` or `resume` returned, or turn their failure into ours.
    fn adopt_environment(
        &mut self,
        result: Result<Result<ResourceAny, ExecutorError>, RawFailure>,
    ) -> Result<(), ExecutorFailure> {
        match result {
            Ok(Ok(env)) => {
                self.environment = Some(env);
                Ok(())
            }
            Ok(Err(e)) => Err(ExecutorFailure::Executor(e)),
            Err(f) => Err(self.fail(f)),
        }
    }

    /// Run one stage; `stop` ends the stage's processes (cancel, timeout). Returns the
    /// script's exit code.
    pub async fn run(&mut self, stage: &StageScript, stop: StopSignal) -> Result<i32, ExecutorFailure> {
        self.check_usable()?;
        let Some(env) = self.environment else {
            return Err(ExecutorFailure::Executor(ExecutorError::Other("run called before prepare".into())));
        };
        self.store.data_mut().call.stop = stop;
        let budget = self.store.data().budget.clone();
        let result = guarded(
            budget,
            self.bindings.runway_executor_executor().environment().call_run(&mut self.store, env, stage),
        )
        .await;
        match result {
            Ok(Ok(status)) => Ok(status.code),
            Ok(Err(e)) => Err(ExecutorFailure::Executor(e)),
            Err(f) => Err(self.fail(f)),
        }
    }

    /// Opaque state for `resume`, when the executor supports it.
    pub async fn state(&mut self) -> Option<String> {
        self.check_usable().ok()?;
        let env = self.environment?;
        let budget = self.store.data().budget.clone();
        guarded(budget, self.bindings.runway_executor_executor().environment().call_state(&mut self.store, env))
            .await
            .ok()
            .flatten()
    }

    /// Release the environment. Errors are logged: cleanup must never fail a job twice.
    pub async fn cleanup(mut self) {
        let Some(env) = self.environment.take() else { return };
        if self.poisoned.is_some() {
            return;
        }
        self.store.data_mut().call.stop = StopSignal::new();
        let budget = self.store.data().budget.clone();
        let result =
            guarded(budget, self.bindings.runway_executor_executor().environment().call_cleanup(&mut self.store, env))
                .await;
        match result {
            Ok(()) => {
                let _ = env.resource_drop_async(&mut self.store).await;
            }
            Err(f) => {
                let error = classify(&self.plugin.meta.name, f, self.store.data());
                tracing::warn!("executor cleanup failed: {error}");
            }
        }
    }
}
