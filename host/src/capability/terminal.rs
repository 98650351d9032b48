//! `runway:host/terminal@0.6.0`: where a job's web terminal attaches, as its executor says
//! while the job is prepared. The job side puts a [`TerminalSlot`] in the call context of a
//! job that can have a terminal; `docker-exec` and `kube-exec` fill it with the engine's or the
//! cluster's client (the one the plugin's own calls use — on a fleet instance, through the
//! instance's connection) and the container, for the session server to `exec` a shell in.
//!
//! Owns: [`TerminalView`] and the `terminal` host trait on
//! it. Must not touch: the session server or the terminal's bytes (the manager opens the
//! shell), plugins.

use wasmtime::component::{HasData, Resource, ResourceTable};

use crate::bindings::executor::runway::host0_2_0::docker::Engine;
use crate::bindings::executor::runway::host0_5_0::kube::{Cluster, Target};
use crate::bindings::executor::runway::host0_6_0::terminal::Host;
use crate::capability::call::CallContext;
pub use crate::capability::call::{AttachPoint, TerminalSlot};
use crate::capability::docker::EngineHandle;
use crate::capability::kube::ClusterHandle;
use crate::connector::kube::exec::ContainerRef;

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
        slot.set_point(AttachPoint::Docker { client, container, user });
        Ok(())
    }

    async fn kube_exec(&mut self, cluster: Resource<Cluster>, target: Target) -> wasmtime::Result<()> {
        let Some(slot) = &self.call.terminal else { return Ok(()) };
        let handle: Resource<ClusterHandle> = Resource::new_borrow(cluster.rep());
        let client = self.table.get(&handle)?.client().clone();
        let Target { namespace, pod, container } = target;
        slot.set_point(AttachPoint::Kube { client, target: ContainerRef { namespace, pod, container } });
        Ok(())
    }
}
