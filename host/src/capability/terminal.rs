//! `runway:host/terminal@0.6.0`: where a job's web terminal attaches, as its executor says
//! while the job is prepared. The job side puts a [`TerminalSlot`] in the call context of a
//! job that can have a terminal; `docker-exec` and `kube-exec` fill it with the engine's or the
//! cluster's client (the one the plugin's own calls use — on a fleet instance, through the
//! instance's connection) and the container, for the session server to `exec` a shell in.
//!
//! Owns: [`TerminalSlot`], [`AttachPoint`], [`TerminalView`] and the `terminal` host trait on
//! it. Must not touch: the session server or the terminal's bytes (the manager opens the
//! shell), plugins.

use std::sync::{Arc, Mutex};

use wasmtime::component::{HasData, Resource, ResourceTable};

use crate::bindings::executor::runway::host0_2_0::docker::Engine;
use crate::bindings::executor::runway::host0_5_0::kube::{Cluster, Target};
use crate::bindings::executor::runway::host0_6_0::terminal::Host;
use crate::capability::call::CallContext;
use crate::capability::docker::EngineHandle;
use crate::capability::kube::ClusterHandle;
use crate::connector::docker::DockerClient;
use crate::connector::kube::exec::ContainerRef;
use crate::connector::kube::KubeClient;

/// A running container a terminal can `exec` a shell in.
#[derive(Clone)]
pub enum AttachPoint {
    /// A container of a Docker engine.
    Docker {
        /// The engine (its transport: local, TCP, or a fleet instance's socket).
        client: DockerClient,
        /// The container's ID or name.
        container: String,
        /// The user the shell runs as (empty: the container's).
        user: String,
    },
    /// A container of a pod.
    Kube {
        /// The API server.
        client: KubeClient,
        /// The container.
        target: ContainerRef,
    },
}

impl std::fmt::Debug for AttachPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttachPoint::Docker { container, user, .. } => {
                f.debug_struct("Docker").field("container", container).field("user", user).finish()
            }
            AttachPoint::Kube { target, .. } => f.debug_struct("Kube").field("target", target).finish(),
        }
    }
}

/// Where one job's terminal attaches, once its executor said so.
#[derive(Default)]
pub struct TerminalSlot {
    point: Mutex<Option<AttachPoint>>,
}

impl TerminalSlot {
    /// An empty slot, for a job that can have a terminal.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// What the executor said last.
    pub fn get(&self) -> Option<AttachPoint> {
        self.point.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn set(&self, point: AttachPoint) {
        *self.point.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(point);
    }
}

/// The `terminal` capability as one call sees it.
pub struct TerminalView<'a> {
    /// The job the call works for (its slot).
    pub call: &'a CallContext,
    /// Where engine and cluster handles live.
    pub table: &'a mut ResourceTable,
}

/// [`HasData`] marker linking `terminal` to a [`TerminalView`].
pub struct HasTerminal;

impl HasData for HasTerminal {
    type Data<'a> = TerminalView<'a>;
}

impl Host for TerminalView<'_> {
    async fn wanted(&mut self) -> wasmtime::Result<bool> {
        Ok(self.call.terminal.is_some())
    }

    async fn docker_exec(&mut self, engine: Resource<Engine>, container: String, user: String) -> wasmtime::Result<()> {
        let Some(slot) = &self.call.terminal else { return Ok(()) };
        let handle: Resource<EngineHandle> = Resource::new_borrow(engine.rep());
        let client = self.table.get(&handle)?.client().clone();
        slot.set(AttachPoint::Docker { client, container, user });
        Ok(())
    }

    async fn kube_exec(&mut self, cluster: Resource<Cluster>, target: Target) -> wasmtime::Result<()> {
        let Some(slot) = &self.call.terminal else { return Ok(()) };
        let handle: Resource<ClusterHandle> = Resource::new_borrow(cluster.rep());
        let client = self.table.get(&handle)?.client().clone();
        let Target { namespace, pod, container } = target;
        slot.set(AttachPoint::Kube { client, target: ContainerRef { namespace, pod, container } });
        Ok(())
    }
}
