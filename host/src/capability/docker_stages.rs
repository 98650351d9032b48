//! `runway:host/docker-stages@0.7.0`: a job's stages in long-lived containers of a Docker
//! engine. Each call takes an engine handle of `runway:host/docker` (so its grant and its
//! transport, a fleet instance's socket too, hold) and a container; the connector's
//! [`ContainerShell`] runs the scripts by `exec` and `connector::detached` starts, follows and
//! stops the stage, the same code that runs stages in a pod or on an SSH instance: the stage's
//! output goes from the container into the job's trace without crossing into the plugin, and a
//! restarted runner follows it again from its offset.
//!
//! Owns: the `docker-stages` host trait on [`DockerView`]. Must not touch: plugins or stores,
//! connections (the connector owns them), grants (`capability::docker` checked them when the
//! engine was connected).

use wasmtime::component::Resource;

use crate::bindings::executor::runway::host0_1_0::process::{ExitStatus, Output};
use crate::bindings::executor::runway::host0_2_0::docker::{DockerError, Engine};
use crate::bindings::executor::runway::host0_7_0::docker_stages::Host;
use crate::capability::docker::{wit_error, DockerView};
use crate::capability::kube::captured;
use crate::capability::remote::wit_status;
use crate::connector::detached::ShellHost;
use crate::connector::docker::shell::docker_error;
use crate::connector::docker::ContainerShell;

/// Most bytes `run-captured` keeps, whatever the plugin asks.
const MAX_CAPTURE: usize = 1 << 20;

impl DockerView<'_> {
    fn shell(&self, engine: &Resource<Engine>, container: String) -> wasmtime::Result<ContainerShell> {
        let (client, streams) = self.client_and_streams(engine)?;
        Ok(ContainerShell::new(client, container, streams))
    }
}

impl Host for DockerView<'_> {
    async fn run_captured(
        &mut self,
        engine: Resource<Engine>,
        container: String,
        script: String,
        stdin: Option<Vec<u8>>,
        max_bytes: u32,
    ) -> wasmtime::Result<Result<Output, DockerError>> {
        let shell = self.shell(&engine, container)?;
        let limit = (max_bytes as usize).min(MAX_CAPTURE).min(self.ctx.max_buffer());
        let result = self.budget.in_host(shell.capture(&script, stdin.as_deref(), limit)).await;
        Ok(result.map(|(code, stdout)| captured(code, stdout, limit)).map_err(|e| wit_error(docker_error(e))))
    }

    async fn start_detached(
        &mut self,
        engine: Resource<Engine>,
        container: String,
        command: String,
        stdin: Vec<u8>,
        log_path: String,
        exit_path: String,
    ) -> wasmtime::Result<Result<(), DockerError>> {
        let shell = self.shell(&engine, container)?;
        let result = self.budget.in_host(shell.start_detached(&command, &stdin, &log_path, &exit_path)).await;
        Ok(result.map_err(|e| wit_error(docker_error(e))))
    }

    async fn attach(
        &mut self,
        engine: Resource<Engine>,
        container: String,
        log_path: String,
        exit_path: String,
        offset: u64,
    ) -> wasmtime::Result<Result<ExitStatus, DockerError>> {
        let shell = self.shell(&engine, container)?;
        let trace = self.call.trace_or_discard();
        let stop = self.call.stop.clone();
        let result = self.budget.in_host(shell.attach(&log_path, &exit_path, offset, &*trace, &stop)).await;
        Ok(result.map(wit_status).map_err(|e| wit_error(docker_error(e))))
    }
}
