//! Docker engines: the data plane of the container executors. [`endpoint`] parses where an
//! engine is (`[runners.docker] host`, `DOCKER_HOST`, TLS files); [`client`] speaks HTTP/1.1 to
//! its API over a unix socket, TCP (with TLS) or — for `docker-autoscaler` — a unix socket on a
//! fleet instance through the instance's SSH session, passes requests through as the plugin wrote
//! them, reads pull and import progress, and streams container output into the job's trace
//! ([`frames`] demultiplexes it), and runs scripts in a running container by `exec`
//! ([`exec`]; [`shell`] puts a container behind the detached stages' `ShellHost`). The executor plugin decides every request; nothing here knows
//! what a job needs.
//!
//! Owns: engine addresses, transports, the API version, output streams. Must not touch: WIT
//! types, grants or plugins (`capability::docker` maps these types and checks grants).

pub mod client;
pub mod endpoint;
pub mod exec;
pub mod frames;
pub mod shell;

pub use client::{Body, DockerClient, Transport};
pub use endpoint::{Address, EngineAddress};
pub use shell::{ContainerShell, StageStreams};

/// Why an engine call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DockerError {
    /// The engine could not be reached, or the connection dropped.
    #[error("cannot reach the Docker engine: {0}")]
    Connection(String),
    /// The engine answered with an error.
    #[error("{message} (HTTP {status})")]
    Api {
        /// HTTP status.
        status: u16,
        /// The engine's message.
        message: String,
    },
    /// The job was cancelled or ran out of time.
    #[error("canceled")]
    Canceled,
    /// A body was larger than allowed (the payload is the limit in bytes).
    #[error("larger than the {0}-byte limit")]
    TooLarge(u32),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}
