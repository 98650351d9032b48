//! Connections to the machines jobs run on. [`ssh`] is the SSH connector (russh) to fleet
//! instances: key and password authentication, keepalive, connect timeouts, commands with
//! streamed output, file upload and download. [`local`] is the runner's own machine behind the
//! same [`RemoteSession`] trait, on [`process`] (local processes in their own group, streamed
//! or captured, killed on stop — also what the `process` capability runs). [`detached`] holds
//! the detached commands both share: started under `setsid` so they outlive the connection or
//! the runner, followed again from any byte offset without a byte twice. Together they back
//! the `runway:host/remote` capability; on the runner's machine their leaders are started in a
//! session of their own by [`spawn`] (`posix_spawn`, no `setsid` program), from the stage
//! [`reaper`], a helper process that outlives the runner and writes their exit codes (kept with
//! their pids on their logs as extended attributes: [`marks`]; a plain
//! `cd DIR && exec PROGRAM` without a shell: [`direct`]); for `runway exec`, whose stages never
//! resume, their output goes through a pipe at the log's path instead of a file ([`streamed`]). [`spec`] turns what a provider says about an instance
//! (plus the configured defaults) into a [`ConnectSpec`]; [`probe`] runs the autoscaler's
//! `instance_ready_command`, health probes and the `$HOME` lookup. [`docker`] carries the Docker
//! Engine API for the container executors, locally or through a session's unix socket forwarding;
//! [`rootfs`] makes root filesystem tars from this machine's files (Runway's helper image, test
//! images) for `docker import`. [`kube`] carries the Kubernetes API for the kubernetes executor
//! (REST, watches, and stages run detached in a pod's containers over `pods/exec`).
//!
//! `connector` imports only `stop` and `trace`: never plugin, capability or WIT types; the
//! manager converts the fleeting plugin's records into [`InstanceConnectInfo`].
//!
//! Owns: connections, local processes and remote operations ([`remote`] has the domain types).
//! Must not touch: WIT bindings, capabilities or plugins (the `remote` capability maps our types
//! to WIT).

pub mod detached;
pub mod direct;
pub mod docker;
pub mod kube;
pub mod local;
pub mod marks;
pub mod probe;
pub mod process;
pub mod reaper;
pub mod remote;
pub mod rootfs;
pub mod spawn;
pub mod spec;
pub mod ssh;
pub mod streamed;

pub use detached::ShellHost;
pub use local::{LocalSession, StageOutput};
pub use probe::ProbeError;
pub use remote::{ExitStatus, RemoteError, RemoteSession, SocketStream};
pub use spec::{ConnectorDefaults, InstanceConnectInfo, SpecError};
pub use ssh::{ConnectError, ConnectSpec, SshAuth, SshSession};
