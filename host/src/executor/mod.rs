//! The executor boundary: everything between a planned job and an executor plugin. A job
//! resolves its executor ([`ResolvedExecutor`]: the plugin and what it says about itself),
//! acquires a fleet instance when its runner has one ([`instance`]), prepares a session with
//! retries ([`prepare`]), and runs its stages in that session ([`stage`], [`session`]). Jobs see
//! only the domain types here ([`Stage`], [`StageOutcome`], [`ExecutorFailure`],
//! [`PrepareError`], [`InstanceError`]), never WIT bindings, plugins or capabilities.
//!
//! - [`instance`]: where fleet instances come from, and directories on them;
//! - [`prepare`]: the WIT job record, preparation attempts and their trace lines;
//! - [`session`]: one job's plugin instance and environment;
//! - [`stage`]: stages, their outcomes and deadlines;
//! - [`failure`]: why an executor step failed.
//!
//! Owns: the executor boundary. Must not touch: which stages run and what outcomes mean for
//! the job (`crate::job`), script generation (`crate::script`), the plugin sandbox itself
//! (`crate::plugin`).

pub mod failure;
pub mod instance;
pub mod prepare;
pub mod session;
pub mod stage;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::bindings::executor::exports::runway::executor0_1_0::executor::ProviderInfo;
use crate::bindings::executor::runway::executor0_1_0::types::Features;
use crate::capability::CallContext;
use crate::plugin::{LoadedPlugin, PluginHost};

pub use crate::capability::replan::{JobOverrides, Reconfigure, ReplanError, Replanned};
pub use crate::capability::terminal::{AttachPoint, TerminalSlot};
pub use failure::ExecutorFailure;
pub use instance::{depends_on_home, resolve_in_home, ConnectedInstance, InstanceError, InstanceLease, InstanceSource};
pub use prepare::{prepare, resume, PrepareError, PrepareRequest, PREPARATION_ATTEMPTS, PREPARATION_RETRY_INTERVAL};
pub use session::{run_stage, ExecutorSession};
pub use stage::{Stage, StageOutcome};

/// An executor plugin resolved for a runner, with what it said about itself.
#[derive(Clone)]
pub struct ResolvedExecutor {
    /// The plugin host sessions are started in.
    pub host: PluginHost,
    /// The plugin (the version resolved; a reload does not change it).
    pub plugin: Arc<LoadedPlugin>,
    /// What the plugin said about itself for this configuration.
    pub info: ProviderInfo,
    /// `[runners.<executor>]` as JSON.
    pub config_json: String,
}

impl ResolvedExecutor {
    /// Resolve executor `name` in `host` and validate its config section.
    pub async fn resolve(host: &PluginHost, name: &str, config_json: &str) -> Result<Self, ExecutorFailure> {
        let plugin = host.executor(name)?;
        let mut instance = host.instantiate_executor(&plugin, CallContext::default()).await?;
        let info = instance.info(config_json).await??;
        Ok(ResolvedExecutor { host: host.clone(), plugin, info, config_json: config_json.to_string() })
    }

    /// The executor's name, as its provider info gives it.
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// The executor's default shell.
    pub fn default_shell(&self) -> &str {
        &self.info.default_shell
    }

    /// The builds directory: config.toml's, else the executor's default resolved against
    /// `base` (the runner's working directory).
    pub fn builds_dir(&self, configured: Option<&str>, base: &Path) -> PathBuf {
        resolve_dir(configured.unwrap_or(&self.info.default_builds_dir), base)
    }

    /// The cache directory, likewise.
    pub fn cache_dir(&self, configured: Option<&str>, base: &Path) -> PathBuf {
        resolve_dir(configured.unwrap_or(&self.info.default_cache_dir), base)
    }

    /// Does the executor share machines between jobs (namespaced builds dirs)?
    pub fn shared(&self) -> bool {
        self.info.features.contains(Features::SHARED)
    }

    /// What the executor supports, as the runner advertises it to GitLab.
    pub fn features(&self) -> ExecutorFeatures {
        let has = |f: Features| self.info.features.contains(f);
        ExecutorFeatures {
            variables: has(Features::VARIABLES),
            image: has(Features::IMAGE),
            services: has(Features::SERVICES),
            shared: has(Features::SHARED),
            // The built-in docker plugin (`docker`, `docker-autoscaler`) and the kubernetes one
            // run the predefined stages in Runway's helper image, which carries the runner's
            // binary; any other executor running jobs in images has no helper there.
            helper: !has(Features::IMAGE) || matches!(self.info.name.as_str(), "docker" | "kubernetes"),
            // The shell executor's terminal is a pty here; the docker (and docker-autoscaler)
            // and kubernetes plugins name a container through `runway:host/terminal`.
            terminal: matches!(self.info.name.as_str(), "shell" | "docker" | "kubernetes"),
        }
    }

    /// Where a terminal into a prepared job's environment opens, for an executor that has one
    /// (see [`ExecutorFeatures::terminal`]). The built-in shell executor runs stages on this
    /// machine: a shell here in the job's directory with its variables, as the `user` of its
    /// `[runners.shell]` (the global `user`) when set; not on a fleet instance. Any other
    /// executor says where during `prepare` (`slot`, filled through `runway:host/terminal`):
    /// a running container the shell is `exec`ed in; none when it said nothing.
    pub fn terminal_place(
        &self,
        shell: &str,
        dir: &Path,
        env: Vec<(String, String)>,
        on_instance: bool,
        slot: Option<&TerminalSlot>,
    ) -> Option<TerminalPlace> {
        if !self.features().terminal {
            return None;
        }
        if self.info.name != "shell" {
            let point = slot?.get()?;
            return Some(TerminalPlace::Container { point, dir: dir.to_path_buf(), env });
        }
        if on_instance {
            return None;
        }
        #[derive(serde::Deserialize)]
        struct ShellUser {
            #[serde(default)]
            user: Option<String>,
        }
        let user = serde_json::from_str::<ShellUser>(&self.config_json)
            .ok()
            .and_then(|c| c.user)
            .filter(|u| !u.trim().is_empty());
        Some(TerminalPlace::Local { shell: shell.to_string(), dir: dir.to_path_buf(), env, user })
    }
}

/// Where a terminal into a job's environment opens (GitLab's web terminal).
#[derive(Debug, Clone)]
pub enum TerminalPlace {
    /// A shell on this machine.
    Local {
        /// The job's shell (`bash`).
        shell: String,
        /// The job's project directory.
        dir: PathBuf,
        /// The job's variables (a file variable as the path of its file).
        env: Vec<(String, String)>,
        /// The user the job's stages run as, when not the runner's.
        user: Option<String>,
    },
    /// A shell `exec`ed in a running container of the job (Docker, Kubernetes).
    Container {
        /// The container, and how to reach it.
        point: AttachPoint,
        /// The job's project directory in the container.
        dir: PathBuf,
        /// The job's variables (a file variable as the path of its file).
        env: Vec<(String, String)>,
    },
}

/// The executor's feature flags (from its provider info) in the runner's vocabulary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecutorFeatures {
    /// It passes job variables to the job.
    pub variables: bool,
    /// It runs jobs in the job's `image`.
    pub image: bool,
    /// It starts the job's `services`.
    pub services: bool,
    /// Jobs share one machine (builds directories are namespaced).
    pub shared: bool,
    /// The job environment has Runway's helper (the cache and artifacts commands): this
    /// machine, a fleet instance it is copied to, or the docker plugin's helper image.
    pub helper: bool,
    /// A terminal can attach to its jobs ([`ResolvedExecutor::terminal_place`]).
    pub terminal: bool,
}

fn resolve_dir(dir: &str, base: &Path) -> PathBuf {
    if let Some(rest) = dir.strip_prefix("~/") {
        if let Some(home) = std::env::var_os("HOME") {
            return PathBuf::from(home).join(rest);
        }
    }
    let path = PathBuf::from(dir);
    if path.is_absolute() {
        path
    } else {
        base.join(path)
    }
}
