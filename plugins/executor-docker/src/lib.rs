//! The docker executor (GitLab's Docker executor semantics) as a WebAssembly component: each
//! job gets its own build volume, services (and with them a network of its own) and long-lived containers on a Docker
//! Engine (or Podman's Docker-compatible API), reached through the host's `docker` capability
//! (the host carries the Engine API and streams container output into the job log).
//!
//! `prepare` pulls the job's image (for its `docker: platform:`), picks the helper image, creates the job's network
//! (`runway-job-<id>-<suffix>`, when the job has services or `FF_NETWORK_PER_BUILD` and
//! `network_mode` is not set), its build volume and cache
//! volumes, starts and waits for the services, and starts the job's long-lived build container
//! (the job's image). `run` starts each stage detached by `exec` (`runway:host/docker-stages`)
//! in a long-lived container — the job's own stages in the build container, predefined stages
//! in one helper container (the helper image) created when the first of them runs — and the
//! host follows its log into the job log; after `resume` a stage already started is only
//! followed again (see [`containers`]). The web terminal (`runway:host/terminal`) `exec`s its
//! shell in the build container. `cleanup` removes every container, the network and the job's
//! volumes, never the cache volumes.
//!
//! The decisions that need no engine (config, pull policies, names, request bodies, state)
//! live in the `docker-logic` crate, tested natively.

use std::cell::RefCell;
use std::hash::BuildHasher;

use docker_logic::config::{self, DockerConfig};
use docker_logic::mounts::{self, Owner};
use docker_logic::names;
use docker_logic::policy::{check_allowed, PullPolicy};
use docker_logic::state::State;
use remote_stages::StageFiles;
use runway_sdk::executor::*;
use runway_sdk::trace;

mod api;
mod containers;
mod images;
mod job;
mod services;

use api::{executor_error, Api};
use job::JobContext;

struct Docker;

/// One job's environment on the engine.
pub struct DockerEnv {
    api: Api,
    config: DockerConfig,
    state: State,
    prefix: String,
    /// The stages started so far in the long-lived containers (saved with the state).
    stages: StageFiles,
    /// The helper container's ID, once a predefined stage made it.
    helper: RefCell<Option<String>>,
    /// Stage containers this instance ran to the end: one still found under such a name (its
    /// removal failed) is stale, not a stage to reattach to.
    finished: RefCell<Vec<String>>,
    /// Lines of each service's output already copied into the job log (`CI_DEBUG_SERVICES`).
    service_lines: RefCell<Vec<usize>>,
}

/// What `state` saves: `docker-logic`'s state and the stages started (flattened: an older
/// plugin's state, without stages, still reads).
#[derive(serde::Serialize)]
struct SavedRef<'a> {
    #[serde(flatten)]
    state: &'a State,
    stages: &'a StageFiles,
}

/// What `resume` reads (see [`SavedRef`]).
#[derive(serde::Deserialize)]
struct Saved {
    #[serde(flatten)]
    state: State,
    #[serde(default)]
    stages: Option<StageFiles>,
}

impl DockerEnv {
    fn new(api: Api, config: DockerConfig, state: State, prefix: String, stages: StageFiles) -> DockerEnv {
        DockerEnv {
            api,
            config,
            state,
            prefix,
            stages,
            helper: RefCell::default(),
            finished: RefCell::default(),
            service_lines: RefCell::default(),
        }
    }
}

fn parse_config(json: &str) -> Result<config::Parsed, ExecutorError> {
    config::parse(json).map_err(ExecutorError::InvalidConfig)
}

/// The job's image (its `image:`, else the config's `image`), checked against `allowed_images`,
/// with its entrypoint, user and pull policies.
fn resolve_image(config: &DockerConfig, ctx: &JobContext) -> Result<runway_sdk::job::ImageDetails, ExecutorError> {
    let default = ctx.expand(&config.image);
    if let Some(image) = &ctx.image {
        let mut image = image.clone();
        image.name = ctx.expand(&image.name);
        check_allowed(&image.name, "allowed_images", &config.allowed_images, std::slice::from_ref(&default))
            .map_err(ExecutorError::InvalidConfig)?;
        return Ok(image);
    }
    if default.trim().is_empty() {
        return Err(ExecutorError::InvalidConfig(
            "no Docker image specified to run the job in: set image: in .gitlab-ci.yml or image in [runners.docker]"
                .into(),
        ));
    }
    Ok(runway_sdk::job::ImageDetails {
        name: default,
        entrypoint: Vec::new(),
        command: Vec::new(),
        aliases: Vec::new(),
        pull_policies: Vec::new(),
        variables: Vec::new(),
        user: String::new(),
        platform: String::new(),
    })
}

impl Executor for Docker {
    type Environment = DockerEnv;

    fn info(config: &str) -> Result<ProviderInfo, ExecutorError> {
        let parsed = parse_config(config)?;
        if let Some(warning) = parsed.warning() {
            runway_sdk::log::warn(&warning);
        }
        Ok(ProviderInfo {
            name: "docker".into(),
            default_shell: "bash".into(),
            // Not `shared`: every job has its own build volume.
            features: Features::VARIABLES | Features::IMAGE | Features::SERVICES,
            default_builds_dir: "/builds".into(),
            default_cache_dir: "/cache".into(),
        })
    }

    fn prepare(job: Job) -> Result<DockerEnv, ExecutorError> {
        let config = parse_config(&job.config)?.config;
        if job.shell != "bash" && job.shell != "sh" {
            return Err(ExecutorError::InvalidConfig(format!(
                "shell {:?} is not supported by the docker executor (bash, sh)",
                job.shell
            )));
        }
        let ctx = JobContext::load(&job);
        let image = resolve_image(&config, &ctx)?;
        trace::write_str(&format!("Using Docker executor with image {} ...\n", image.name));
        let api = Api::connect(&config.host, config.tls_verify, &config.tls_cert_path)
            .map_err(|e| executor_error(e, "connecting to the Docker engine"))?;
        let suffix = names::suffix(std::collections::hash_map::RandomState::new().hash_one(job.id));
        let prefix = names::job_prefix(job.id, &suffix);
        let state = State {
            host: config.host.clone(),
            tls_verify: config.tls_verify,
            tls_cert_path: config.tls_cert_path.clone(),
            job_id: job.id,
            suffix,
            // Cleanup removes it by name too, even when `volumes` mounts the builds directory.
            build_volume: names::build_volume(&prefix),
            builds_dir: job.builds_dir.clone(),
            project_dir: job.project_dir.clone(),
            debug_services: ctx.debug_services(),
            ..Default::default()
        };
        let stages = StageFiles::new(docker_logic::spec::STAGES_DIR.to_string());
        let mut env = DockerEnv::new(api, config, state, prefix, stages);
        match env.setup(&job, &ctx, &image) {
            Ok(()) => Ok(env),
            Err(e) => {
                env.cleanup();
                Err(e)
            }
        }
    }

    fn resume(job: Job, state: String) -> Result<DockerEnv, ExecutorError> {
        let config = parse_config(&job.config)?.config;
        let saved: Saved = serde_json::from_str(&state)
            .map_err(|e| ExecutorError::Other(format!("unreadable docker executor state: {e}")))?;
        let state = saved.state;
        // A stage may already run in a long-lived container: it is followed, not started again.
        let mut stages = saved.stages.unwrap_or_else(|| StageFiles::new(docker_logic::spec::STAGES_DIR.to_string()));
        stages.mark_resumed();
        trace::write_str("Resuming Docker executor...\n");
        let api = Api::connect(&state.host, state.tls_verify, &state.tls_cert_path)
            .map_err(|e| executor_error(e, "connecting to the Docker engine"))?;
        let prefix = names::job_prefix(state.job_id, &state.suffix);
        Ok(DockerEnv::new(api, config, state, prefix, stages))
    }
}

impl DockerEnv {
    /// Everything `prepare` creates after connecting; on error the caller cleans up.
    fn setup(
        &mut self,
        job: &Job,
        ctx: &JobContext,
        image: &runway_sdk::job::ImageDetails,
    ) -> Result<(), ExecutorError> {
        self.state.image =
            images::ensure(&self.api, ctx, &self.config, &image.name, &image.pull_policies, &image.platform)?;
        if !image.entrypoint.is_empty() && self.config.disable_entrypoint_overwrite {
            images::warn("Entrypoint override disabled");
        } else if !image.entrypoint.is_empty() {
            self.state.entrypoint = Some(image.entrypoint.clone());
        }
        self.state.user = if image.user.is_empty() { self.config.user.clone() } else { image.user.clone() };
        self.state.helper_image = self.helper_image(ctx)?;

        // A network of the job's own where something needs it, as gitlab-runner: services (they
        // reach the build container and each other by name) or `FF_NETWORK_PER_BUILD`. Else the
        // engine's default network: joining a user-defined one costs every container start.
        let wants_network =
            !ctx.services.is_empty() || !self.config.services.is_empty() || ctx.truthy("FF_NETWORK_PER_BUILD");
        if self.config.network_mode.is_empty() && wants_network {
            let labels = names::job_labels(self.state.job_id, &self.state.suffix, "");
            self.api
                .create_network(&self.prefix, &labels)
                .map_err(|e| executor_error(e, "creating the job's network"))?;
            self.state.network = Some(self.prefix.clone());
            self.state.network_mode = self.prefix.clone();
        } else {
            self.state.network_mode = self.config.network_mode.clone();
        }
        self.create_volumes(job, ctx)?;
        services::start(self, ctx)?;
        containers::start_build(self)
    }

    /// The configured helper image (pulled if missing), else Runway's own.
    fn helper_image(&self, ctx: &JobContext) -> Result<String, ExecutorError> {
        if self.config.helper_image.is_empty() {
            let image =
                self.api.engine().helper_image().map_err(|e| executor_error(e, "providing Runway's helper image"))?;
            trace::write_str(&format!("Using helper image {image} ...\n"));
            return Ok(image);
        }
        let name = ctx.expand(&self.config.helper_image);
        trace::write_str(&format!("Using helper image {name} (overridden) ...\n"));
        images::ensure_with(&self.api, ctx, &name, &[PullPolicy::IfNotPresent], None)
    }

    /// The build volume, cache volumes and `volumes` binds of the job's containers.
    /// Cache volumes belong to one runner and project (GitLab names them after both): jobs of
    /// another runner on the same engine never see them.
    fn create_volumes(&mut self, job: &Job, ctx: &JobContext) -> Result<(), ExecutorError> {
        let runner = ctx.variable("CI_RUNNER_SHORT_TOKEN").unwrap_or_default();
        let scope = format!("{runner}/{}", job.project_path);
        let plan = mounts::plan_mounts(&self.config, &self.prefix, &scope, &job.builds_dir, &job.cache_dir);
        let job_labels = names::job_labels(self.state.job_id, &self.state.suffix, "");
        let cache_labels = names::cache_labels(&job.project_path);
        for (name, owner) in &plan.volumes {
            let labels = if *owner == Owner::Job { &job_labels } else { &cache_labels };
            self.api.create_volume(name, labels).map_err(|e| executor_error(e, &format!("creating volume {name}")))?;
        }
        self.state.binds = plan.binds;
        Ok(())
    }
}

impl Environment for DockerEnv {
    fn run(&self, stage: StageScript) -> Result<ExitStatus, ExecutorError> {
        containers::run(self, &stage).map(|code| ExitStatus { code })
    }

    fn cleanup(&self) {
        containers::cleanup(self)
    }

    fn state(&self) -> Option<String> {
        serde_json::to_string(&SavedRef { state: &self.state, stages: &self.stages }).ok()
    }
}

runway_sdk::export_executor!(
    Docker,
    name: "docker",
    description: "runs job stages in containers on a Docker Engine (GitLab's docker executor)"
);
