//! Acquiring a fleet instance for a job: where instances come from ([`InstanceSource`], the
//! manager's fleet implements it), a job's claim on one ([`InstanceLease`]), the connected
//! instance ([`ConnectedInstance`]) and how a job's relative directories resolve on it.
//!
//! Owns: the instance seam between jobs and fleets. Must not touch: how a fleet scales or
//! connects (manager, autoscaler, connector), plugins, jobs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::connector::RemoteSession;
use crate::trace::TraceSink;

/// Why no instance could be connected for a job (the job fails with `runner_system_failure`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstanceError {
    /// No slot became free within `instance_acquire_timeout`.
    #[error("no instance became available within instance_acquire_timeout ({}s)", .0.as_secs())]
    AcquireTimedOut(Duration),
    /// The fleet could not give the job an instance.
    #[error("{0}")]
    Acquire(String),
    /// The job was aborted while waiting for an instance.
    #[error("the job was aborted while waiting for an instance")]
    AbortedWaiting,
    /// The job was aborted while connecting to its instance.
    #[error("the job was aborted while connecting to its instance")]
    AbortedConnecting,
    /// The instance was acquired but could not be connected to.
    #[error("connecting to instance {instance}: {message}")]
    Connect {
        /// The provider's instance ID.
        instance: String,
        /// What the connector said.
        message: String,
    },
}

/// An instance of an autoscaled fleet, connected for one job.
pub struct ConnectedInstance {
    /// The provider's instance ID.
    pub id: String,
    /// Commands and files on it, for the executor plugin's `remote` capability.
    pub remote: Arc<dyn RemoteSession>,
    /// The login user's home directory there; relative builds and cache directories are
    /// resolved against it.
    pub home: Option<String>,
}

impl ConnectedInstance {
    /// `dir` as it is on this instance: relative directories (and `~/...`) are the login
    /// user's (`~/builds`), as SSH sessions start in the home directory. Unchanged when the
    /// home directory is unknown or `dir` is absolute.
    pub fn resolve_dir(&self, dir: &Path) -> PathBuf {
        match &self.home {
            Some(home) => resolve_in_home(dir, Path::new(home)),
            None => dir.to_path_buf(),
        }
    }
}

/// Does `dir` depend on the instance's home directory (relative, or `~/...`)?
pub fn depends_on_home(dir: &Path) -> bool {
    dir.strip_prefix("~").map(Path::to_path_buf).unwrap_or_else(|_| dir.to_path_buf()).is_relative()
}

/// `dir` resolved against `home` when it [`depends_on_home`]; else unchanged.
pub fn resolve_in_home(dir: &Path, home: &Path) -> PathBuf {
    let relative = dir.strip_prefix("~").map(Path::to_path_buf).unwrap_or_else(|_| dir.to_path_buf());
    if relative.is_relative() {
        home.join(relative)
    } else {
        dir.to_path_buf()
    }
}

/// Where jobs of a fleet runner get their instance (the manager's fleet).
#[async_trait]
pub trait InstanceSource: Send + Sync {
    /// Wait for the slot reserved under `key` (bounded by `instance_acquire_timeout`) and
    /// connect to its instance, writing progress to `trace`. An error fails the job with
    /// `runner_system_failure`.
    async fn connect(
        &self,
        key: &str,
        trace: &dyn TraceSink,
        abort: &CancellationToken,
    ) -> Result<ConnectedInstance, InstanceError>;
}

/// A job's claim on a fleet slot: where to connect and under which reservation key.
#[derive(Clone)]
pub struct InstanceLease {
    /// The fleet.
    pub source: Arc<dyn InstanceSource>,
    /// The reservation key the manager made before asking GitLab for the job.
    pub key: String,
}

impl InstanceLease {
    /// Acquire and connect the leased instance.
    pub async fn connect(
        &self,
        trace: &dyn TraceSink,
        abort: &CancellationToken,
    ) -> Result<ConnectedInstance, InstanceError> {
        self.source.connect(&self.key, trace, abort).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nothing;

    #[async_trait]
    impl RemoteSession for Nothing {
        async fn run(
            &self,
            _: &str,
            _: Option<&[u8]>,
            _: &dyn TraceSink,
            _: &crate::stop::StopSignal,
        ) -> Result<crate::connector::ExitStatus, crate::connector::RemoteError> {
            Err(crate::connector::RemoteError::Canceled)
        }
        async fn start_detached(
            &self,
            _: &str,
            _: Option<&[u8]>,
            _: &str,
            _: &str,
        ) -> Result<(), crate::connector::RemoteError> {
            Ok(())
        }
        async fn attach(
            &self,
            _: &str,
            _: &str,
            _: u64,
            _: &dyn TraceSink,
            _: &crate::stop::StopSignal,
        ) -> Result<crate::connector::ExitStatus, crate::connector::RemoteError> {
            Err(crate::connector::RemoteError::Canceled)
        }
        async fn upload(&self, _: &str, _: &[u8], _: u32) -> Result<(), crate::connector::RemoteError> {
            Ok(())
        }
        async fn download(&self, _: &str, _: usize) -> Result<Vec<u8>, crate::connector::RemoteError> {
            Ok(Vec::new())
        }
        async fn connect_unix(
            &self,
            _: &str,
        ) -> Result<Box<dyn crate::connector::SocketStream>, crate::connector::RemoteError> {
            Err(crate::connector::RemoteError::Canceled)
        }
    }

    #[test]
    fn relative_dirs_resolve_against_the_instance_home() {
        let instance = ConnectedInstance { id: "i".into(), remote: Arc::new(Nothing), home: Some("/home/u".into()) };
        assert_eq!(instance.resolve_dir(Path::new("builds")), Path::new("/home/u/builds"));
        assert_eq!(instance.resolve_dir(Path::new("~/cache")), Path::new("/home/u/cache"));
        assert_eq!(instance.resolve_dir(Path::new("/srv/builds")), Path::new("/srv/builds"));
        let homeless = ConnectedInstance { home: None, ..instance };
        assert_eq!(homeless.resolve_dir(Path::new("builds")), Path::new("builds"));
    }
}
