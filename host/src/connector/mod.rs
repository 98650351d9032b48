//! Connections to fleet instances. [`ssh`] is the SSH connector (russh): key and password
//! authentication, keepalive, connect timeouts, commands with streamed output, file upload
//! and download, and detached commands that survive the connection. It backs the
//! `runway:host/remote` capability of instance executors and the autoscaler's
//! `instance_ready_command` and health probes.

//!
//! Owns: connections and remote operations ([`remote`] has the domain types). Must not touch:
//! WIT bindings, capabilities or plugins (the `remote` capability maps our types to WIT).

pub mod remote;
pub mod ssh;

pub use remote::{ExitStatus, RemoteError, RemoteSession};
pub use ssh::{ConnectError, ConnectSpec, SshAuth, SshSession};
