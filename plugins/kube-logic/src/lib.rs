//! The Kubernetes executor's pure logic, kept apart from the WebAssembly glue so it is tested
//! natively (`cargo test -p kube-logic`): `[runners.kubernetes]` parsing, resource quantities,
//! the `KUBERNETES_*` overwrites, names and labels, the job's Pod and registry Secret objects
//! and the saved state. Nothing here talks to an API server, the host or the job log.
//!
//! # Contract with the plugin (`plugins/executor-kubernetes`)
//!
//! - [`config::parse`] reads the section once; its warnings go to the job log.
//! - [`overwrites::resolve`] applies the job's `KUBERNETES_*` variables; its error fails the job
//!   (configuration error), its `notes` go to the job log.
//! - [`pod::build`] returns the whole Pod object to `POST /api/v1/namespaces/{ns}/pods`. Its
//!   containers: `build` (the job's image), `helper` (the helper image) and `svc-0`, `svc-1`, …
//!   (services: the config's first, then the job's, in order). `build` and `helper` run
//!   [`pod::keep_alive_command`], which does nothing but stay alive and exits 0 promptly on
//!   SIGTERM; the plugin `exec`s each stage's script into them (predefined stages into
//!   `helper`, user stages into `build`). Both mount the builds emptyDir at `builds_dir`, an
//!   emptyDir at `stages_dir` and the cache dir (an emptyDir unless a configured volume covers
//!   it); services mount the same volumes, as gitlab-runner's do. Services are reachable
//!   through `hostAliases` (127.0.0.1) by their aliases.
//! - [`secret::registry_secret`] is the Secret for the job's registry credentials; its name goes
//!   into [`pod::PodInputs::image_pull_secrets`].
//! - [`state::State`] is what the plugin saves for resume and cleanup.

#![deny(missing_docs)]

pub mod config;
pub mod names;
pub mod orphans;
pub mod overwrites;
pub mod patch;
pub mod pod;
pub mod pull;
pub mod quantity;
pub mod secret;
pub mod security;
pub mod state;
pub mod tables;
pub mod volumes;
