//! Connections to fleet instances. [`ssh`] is the SSH connector (russh): key and password
//! authentication, keepalive, connect timeouts, commands with streamed output, file upload
//! and download, and detached commands that survive the connection. It backs the
//! `runway:host/remote` capability of instance executors. [`spec`] turns what a provider
//! says about an instance (plus the configured defaults) into a [`ConnectSpec`]; [`probe`]
//! runs the autoscaler's `instance_ready_command`, health probes and the `$HOME` lookup.
//!
//! `connector` imports only `stop` and `trace`: never plugin, capability or WIT types; the
//! manager converts the fleeting plugin's records into [`InstanceConnectInfo`].
//!
//! Owns: connections and remote operations ([`remote`] has the domain types). Must not touch:
//! WIT bindings, capabilities or plugins (the `remote` capability maps our types to WIT).

pub mod probe;
pub mod remote;
pub mod spec;
pub mod ssh;

pub use probe::ProbeError;
pub use remote::{ExitStatus, RemoteError, RemoteSession};
pub use spec::{ConnectorDefaults, InstanceConnectInfo, SpecError};
pub use ssh::{ConnectError, ConnectSpec, SshAuth, SshSession};
