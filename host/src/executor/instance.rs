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
    /// What reaches it again without its fleet's provider (the source's own encoding, kept
    /// sealed with the job in the store): a manager that takes the job over reconnects with it.
    pub reconnect: Option<String>,
}

/// Why the runner's helper could not be put on an instance (the job goes on with whatever
/// `runway` the instance has on its `PATH`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelperError {
    /// The instance is another OS or architecture than the runner's binary.
    #[error("the instance is {0}, the runner's binary is for {1}")]
    Platform(String, String),
    /// Reading the binary here or writing it there failed.
    #[error("{0}")]
    Transfer(String),
}

impl ConnectedInstance {
    /// Put the runner's own binary `local` on the instance as the job's helper (the cache and
    /// artifacts commands run there, as gitlab-runner's helper does) and return its path
    /// there, in `<builds_dir>/.runway-helper/`. The file is named by the binary's version,
    /// size and modification time, so it is copied once per instance and build, and jobs of
    /// two runner versions never share one.
    pub async fn install_helper(&self, local: &Path, builds_dir: &Path) -> Result<String, HelperError> {
        let meta =
            tokio::fs::metadata(local).await.map_err(|e| HelperError::Transfer(format!("{}: {e}", local.display())))?;
        let stamp =
            meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_secs());
        let dir = format!("{}/.runway-helper", builds_dir.display().to_string().trim_end_matches('/'));
        let path = format!("{dir}/runway-{}-{}-{stamp}", env!("CARGO_PKG_VERSION"), meta.len());
        let platform = format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH);
        let probe = format!(
            "p=$(uname -s | tr A-Z a-z)-$(uname -m); [ \"$p\" = '{platform}' ] || {{ echo \"$p\"; exit 3; }}; [ -x '{path}' ] || exit 4"
        );
        let sink = crate::trace::MemorySink::default();
        let stop = crate::stop::StopSignal::new();
        match self.remote.run(&probe, None, &sink, &stop).await {
            Ok(status) if status.code == 0 => return Ok(path),
            Ok(status) if status.code == 3 => {
                return Err(HelperError::Platform(sink.text().trim().to_string(), platform))
            }
            Ok(_) => {}
            Err(e) => return Err(HelperError::Transfer(format!("checking for the helper: {e}"))),
        }
        let bytes =
            tokio::fs::read(local).await.map_err(|e| HelperError::Transfer(format!("{}: {e}", local.display())))?;
        self.remote
            .upload(&path, &bytes, 0o755)
            .await
            .map_err(|e| HelperError::Transfer(format!("copying the helper to {path}: {e}")))?;
        Ok(path)
    }

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
        async fn make_dir(&self, _: &str, _: u32, _: bool) -> Result<(), crate::connector::RemoteError> {
            Ok(())
        }
        async fn remove_all(&self, _: &str) -> Result<(), crate::connector::RemoteError> {
            Ok(())
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
        let instance = ConnectedInstance {
            id: "i".into(),
            remote: Arc::new(Nothing),
            home: Some("/home/u".into()),
            reconnect: None,
        };
        assert_eq!(instance.resolve_dir(Path::new("builds")), Path::new("/home/u/builds"));
        assert_eq!(instance.resolve_dir(Path::new("~/cache")), Path::new("/home/u/cache"));
        assert_eq!(instance.resolve_dir(Path::new("/srv/builds")), Path::new("/srv/builds"));
        let homeless = ConnectedInstance { home: None, ..instance };
        assert_eq!(homeless.resolve_dir(Path::new("builds")), Path::new("builds"));
    }
}
