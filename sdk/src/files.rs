//! Directories on the machine the current job runs on — the same machine as [`crate::remote`]
//! (the job's fleet instance, or the runner's own machine with the `allow_process` grant) —
//! without starting a process where the host can do the work itself (API 0.4).

pub use crate::bindings::executor::runway::host0_1_0::remote::RemoteError;
use crate::bindings::executor::runway::host0_4_0::files as wit;

/// Create the directory `path` with exactly the permission bits `mode`. It must not exist
/// yet and its parent must (`mkdir -m MODE`): a directory nobody else can have prepared.
pub fn make_private_dir(path: &str, mode: u32) -> Result<(), RemoteError> {
    wit::make_dir(path, mode, false)
}

/// Create the directory `path` and its missing parents; an existing directory is no error
/// and keeps its mode (`mkdir -p -m MODE`).
pub fn make_dir_all(path: &str, mode: u32) -> Result<(), RemoteError> {
    wit::make_dir(path, mode, true)
}

/// Remove `path` and everything under it without following symbolic links (`rm -rf`); a
/// missing path is no error.
pub fn remove_all(path: &str) -> Result<(), RemoteError> {
    wit::remove_all(path)
}
