//! One job's executor session: an instance of the executor plugin (one store), the
//! environment `prepare` or `resume` created, and the rule that an instance which trapped is
//! never entered again. Speaks the executor's domain types ([`Stage`], [`ExecutorFailure`]).
//!
//! Owns: [`ExecutorSession`] and running one stage in it under its deadline ([`run_stage`]).
//! Must not touch: retries and trace lines of preparation
//! ([`super::prepare`]), instances ([`super::instance`]), jobs.

use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::ResourceAny;

use crate::bindings::executor::exports::runway::executor0_1_0::executor::{Job, StageScript};
use crate::capability::CallContext;
use crate::executor::failure::ExecutorFailure;
use crate::executor::stage::{Stage, StageOutcome};
use crate::plugin::executor::{ExecutorCall, ExecutorInstance};
use crate::plugin::{LoadedPlugin, PluginError, PluginHost};
use crate::stop::{StopReason, StopSignal};

/// One job's instance of an executor plugin.
pub struct ExecutorSession {
    instance: ExecutorInstance,
    environment: Option<ResourceAny>,
    /// Set after a trap: the instance cannot be entered again.
    poisoned: Option<PluginError>,
}

impl ExecutorSession {
    /// A fresh instance of executor `plugin` whose calls work for `call` (the job's log, stop
    /// signal and remote instance).
    pub async fn start(host: &PluginHost, plugin: &Arc<LoadedPlugin>, call: CallContext) -> Result<Self, PluginError> {
        let instance = host.instantiate_executor(plugin, call).await?;
        Ok(ExecutorSession { instance, environment: None, poisoned: None })
    }

    /// The plugin (and version) this session runs.
    pub fn plugin(&self) -> &Arc<LoadedPlugin> {
        self.instance.plugin()
    }

    fn check_usable(&self) -> Result<(), ExecutorFailure> {
        match &self.poisoned {
            Some(e) => Err(ExecutorFailure::Plugin(e.clone())),
            None => Ok(()),
        }
    }

    /// The domain result of a call; a sandbox failure poisons the session.
    fn settle<T>(&mut self, result: ExecutorCall<T>) -> Result<T, ExecutorFailure> {
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(e.into()),
            Err(e) => {
                self.poisoned = Some(e.clone());
                Err(ExecutorFailure::Plugin(e))
            }
        }
    }

    /// Prepare the job environment.
    pub async fn prepare(&mut self, job: &Job) -> Result<(), ExecutorFailure> {
        self.check_usable()?;
        let result = self.instance.prepare(job).await;
        self.environment = Some(self.settle(result)?);
        Ok(())
    }

    /// Rebuild the environment from saved state after a runner restart.
    pub async fn resume(&mut self, job: &Job, state: &str) -> Result<(), ExecutorFailure> {
        self.check_usable()?;
        let result = self.instance.resume(job, state).await;
        self.environment = Some(self.settle(result)?);
        Ok(())
    }

    /// Run one stage; `stop` ends the stage's processes (cancel, timeout). Returns the
    /// script's exit code.
    pub async fn run(&mut self, stage: &Stage, stop: StopSignal) -> Result<i32, ExecutorFailure> {
        self.check_usable()?;
        let Some(env) = self.environment else {
            return Err(ExecutorFailure::Other("run called before prepare".into()));
        };
        let script =
            StageScript { name: stage.name.clone(), script: stage.script.clone(), predefined: stage.predefined };
        let result = self.instance.run(env, &script, stop).await;
        self.settle(result).map(|status| status.code)
    }

    /// Opaque state for `resume`, when the executor supports it.
    pub async fn state(&mut self) -> Option<String> {
        self.check_usable().ok()?;
        let env = self.environment?;
        self.instance.state(env).await.ok().flatten()
    }

    /// Release the environment. Errors are logged: cleanup must never fail a job twice.
    pub async fn cleanup(mut self) {
        let Some(env) = self.environment.take() else { return };
        if self.poisoned.is_some() {
            return;
        }
        if let Err(error) = self.instance.cleanup(env).await {
            tracing::warn!("executor cleanup failed: {error}");
        }
    }
}

/// Run `stage` in `session`; `stop` is fired by the caller's controls, and additionally
/// with `TimedOut` once `timeout` elapses.
pub async fn run_stage(
    session: &mut ExecutorSession,
    stage: &Stage,
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
    let result = session.run(stage, stop.clone()).await;
    timer.abort();
    match (result, stop.reason()) {
        (_, Some(reason)) => StageOutcome::Stopped(reason),
        (Ok(code), None) => StageOutcome::Exited(code),
        (Err(ExecutorFailure::Canceled), None) => StageOutcome::Stopped(StopReason::Canceled),
        (Err(e), None) => StageOutcome::Failed(e),
    }
}
