//! `runway:host/files@0.4.0`: directories on the machine the job runs on without a process
//! where the host can do the work itself. The same machine and grant as `remote` (the job's
//! fleet instance, else the runner's own machine for the `allow_process` grant), so it is
//! implemented on the same [`RemoteView`] and linked through [`super::remote::HasRemote`]; the
//! work is the connector's ([`crate::connector::RemoteSession::make_dir`] and `remove_all`:
//! system calls on the runner's machine, `mkdir`/`rm` over SSH).
//!
//! Owns: the `files` host trait and its WIT mapping. Must not touch: plugins or stores,
//! connections or the file system itself (the connector owns them).

use crate::bindings::executor::runway::host0_4_0::files::{Host, RemoteError};
use crate::capability::remote::{wit_error, RemoteView};

impl Host for RemoteView<'_> {
    async fn make_dir(&mut self, path: String, mode: u32, parents: bool) -> wasmtime::Result<Result<(), RemoteError>> {
        let remote = match self.remote() {
            Ok(remote) => remote,
            Err(e) => return Ok(Err(e)),
        };
        Ok(self.budget.in_host(remote.make_dir(&path, mode, parents)).await.map_err(wit_error))
    }

    async fn remove_all(&mut self, path: String) -> wasmtime::Result<Result<(), RemoteError>> {
        let remote = match self.remote() {
            Ok(remote) => remote,
            Err(e) => return Ok(Err(e)),
        };
        Ok(self.budget.in_host(remote.remove_all(&path)).await.map_err(wit_error))
    }
}
