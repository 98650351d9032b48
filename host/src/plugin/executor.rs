//! The plugin side of executors, kept small: look an executor plugin up by name, instantiate
//! it with a call context, and make its typed calls under the sandbox, each failure
//! classified into a [`PluginError`]. The session built on it (environment, poisoning after a
//! trap, domain types) is `crate::executor`'s.
//!
//! Owns: [`ExecutorInstance`] and [`PluginHost::executor`]. Must not touch: jobs, executors'
//! domain types, instances or connectors.

use std::sync::Arc;

use wasmtime::component::ResourceAny;
use wasmtime::Store;

use crate::bindings::executor::exports::runway::executor0_1_0::executor::{
    ExecutorError, Job, ProviderInfo, StageScript,
};
use crate::bindings::executor::runway::executor0_1_0::types::ExitStatus;
use crate::bindings::executor::ExecutorPlugin;
use crate::capability::CallContext;
use crate::plugin::call::{classify, guarded, PluginError, PluginErrorKind, RawFailure};
use crate::plugin::registry::{LoadedPlugin, PluginPre};
use crate::plugin::state::PluginState;
use crate::plugin::PluginHost;
use crate::stop::StopSignal;

/// What a call into an executor plugin returns: the plugin's own answer (a value or its
/// error value), or the [`PluginError`] of a call that failed in the sandbox.
pub type ExecutorCall<T> = Result<Result<T, ExecutorError>, PluginError>;

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

    /// A fresh instance of executor `plugin` whose calls work for `call`.
    pub async fn instantiate_executor(
        &self,
        plugin: &Arc<LoadedPlugin>,
        call: CallContext,
    ) -> Result<ExecutorInstance, PluginError> {
        let PluginPre::Executor(pre) = &plugin.pre else {
            return Err(plugin.error(PluginErrorKind::Incompatible, "not an executor plugin"));
        };
        let mut store = plugin.new_store(&self.registry.engine.engine, call)?;
        let bindings = pre
            .instantiate_async(&mut store)
            .await
            .map_err(|e| plugin.error(PluginErrorKind::Incompatible, format!("instantiation failed: {e:#}")))?;
        Ok(ExecutorInstance { plugin: plugin.clone(), store, bindings })
    }
}

/// One instance of an executor plugin (one store): its typed calls, each under the plugin's
/// call budget. An environment is the resource `prepare` or `resume` returned.
pub struct ExecutorInstance {
    plugin: Arc<LoadedPlugin>,
    store: Store<PluginState>,
    bindings: ExecutorPlugin,
}

impl ExecutorInstance {
    /// The plugin (and version) this instance runs.
    pub fn plugin(&self) -> &Arc<LoadedPlugin> {
        &self.plugin
    }

    fn classify(&self, failure: RawFailure) -> PluginError {
        classify(&self.plugin.meta.name, failure, self.store.data())
    }

    /// `info`: describe the executor and validate `config_json`.
    pub async fn info(&mut self, config_json: &str) -> ExecutorCall<ProviderInfo> {
        let budget = self.store.data().budget.clone();
        let call = self.bindings.runway_executor0_1_0_executor().call_info(&mut self.store, config_json);
        guarded(budget, call).await.map_err(|f| self.classify(f))
    }

    /// `prepare`: create the job's environment.
    pub async fn prepare(&mut self, job: &Job) -> ExecutorCall<ResourceAny> {
        let budget = self.store.data().budget.clone();
        let call = self.bindings.runway_executor0_1_0_executor().call_prepare(&mut self.store, job);
        guarded(budget, call).await.map_err(|f| self.classify(f))
    }

    /// `resume`: rebuild the environment from saved state after a runner restart.
    pub async fn resume(&mut self, job: &Job, state: &str) -> ExecutorCall<ResourceAny> {
        let budget = self.store.data().budget.clone();
        let call = self.bindings.runway_executor0_1_0_executor().call_resume(&mut self.store, job, state);
        guarded(budget, call).await.map_err(|f| self.classify(f))
    }

    /// `environment.run`: run one stage; `stop` ends its processes and remote commands.
    pub async fn run(&mut self, env: ResourceAny, stage: &StageScript, stop: StopSignal) -> ExecutorCall<ExitStatus> {
        self.store.data_mut().call.stop = stop;
        let budget = self.store.data().budget.clone();
        let environment = self.bindings.runway_executor0_1_0_executor().environment();
        let call = environment.call_run(&mut self.store, env, stage);
        guarded(budget, call).await.map_err(|f| self.classify(f))
    }

    /// `environment.state`: opaque state for `resume`, when the executor supports it.
    pub async fn state(&mut self, env: ResourceAny) -> Result<Option<String>, PluginError> {
        let budget = self.store.data().budget.clone();
        let environment = self.bindings.runway_executor0_1_0_executor().environment();
        let call = environment.call_state(&mut self.store, env);
        guarded(budget, call).await.map_err(|f| self.classify(f))
    }

    /// `environment.cleanup`, then drop the environment resource.
    pub async fn cleanup(&mut self, env: ResourceAny) -> Result<(), PluginError> {
        self.store.data_mut().call.stop = StopSignal::new();
        let budget = self.store.data().budget.clone();
        let environment = self.bindings.runway_executor0_1_0_executor().environment();
        let call = environment.call_cleanup(&mut self.store, env);
        guarded(budget, call).await.map_err(|f| self.classify(f))?;
        let _ = env.resource_drop_async(&mut self.store).await;
        Ok(())
    }
}
