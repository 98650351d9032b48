//! GitLab's web terminal: whether the job being prepared can have one, and where its
//! terminal opens a shell (`exec` with a tty in a running container). The host carries the
//! terminal's bytes; call these from `prepare`.

use crate::bindings::executor::runway::host0_6_0::terminal as wit;
use crate::docker::Engine;
use crate::kube::{Cluster, Target};

/// Whether the current job can have a web terminal: keep something to attach to only then.
pub fn wanted() -> bool {
    wit::wanted()
}

/// Terminals into the job open by `exec` in the running `container` of `engine`, as `user`
/// (empty: the container's).
pub fn docker_exec(engine: &Engine, container: &str, user: &str) {
    wit::docker_exec(engine.wit(), container, user);
}

/// Terminals into the job open by `exec` in `target` of `cluster`.
pub fn kube_exec(cluster: &Cluster, target: &Target) {
    wit::kube_exec(cluster.wit(), target);
}
