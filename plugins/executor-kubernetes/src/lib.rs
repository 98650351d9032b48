//! The kubernetes executor (GitLab's Kubernetes executor, attach strategy) as a WebAssembly
//! component: each job runs in a pod of its own on a Kubernetes cluster reached through the
//! host's `kube` capability (the host resolves the cluster, holds the credentials, carries the
//! API calls and streams the pod's output into the job log).
//!
//! `prepare` reads `[runners.kubernetes]` and the job's `KUBERNETES_*` overwrites, connects,
//! creates a Secret for the job's registry credentials, creates the pod (`build` in the job's
//! image, `helper` in the helper image, `svc-N` for services) and waits until it runs
//! ([`wait`]); for a job that can have a web terminal it names the build container, which the
//! host `exec`s the terminal's shell in (`runway:host/terminal`). `run` starts each stage's script detached in the pod — predefined stages in
//! `helper`, the job's own in `build` — with its output in a log file on a volume of the pod,
//! and follows that log into the job trace: the stage outlives a lost stream or a dead runner,
//! and `resume` attaches to it again. `cleanup` deletes the pod and the job's Secrets.
//!
//! The decisions that need no API server (config keys, overwrites, names, labels, the Pod and
//! Secret objects, the saved state) live in the `kube-logic` crate, tested natively.

use std::hash::BuildHasher;
use std::time::Duration;

use kube_logic::config::{self, KubeConfig};
use kube_logic::names::{self, JobMeta, BUILD_CONTAINER, HELPER_CONTAINER};
use kube_logic::overwrites::{self, Overwrites};
use kube_logic::pod::{self, ImageInput, PodInputs};
use kube_logic::pull;
use kube_logic::secret::{self, RegistryCredential};
use kube_logic::state::{Connection, State};
use remote_stages::{check_shell, working_dir, StageFiles};
use runway_sdk::executor::*;
use runway_sdk::kube::{Cluster, ClusterConfig, KubeError, Target};
use runway_sdk::remote::quote;
use runway_sdk::trace;

mod api;
mod patches;
mod wait;

use api::{executor_error, Api};

/// Where the stages' scripts, logs and exit codes live in `build` and `helper` (an emptyDir).
const STAGES_DIR: &str = "/runway/stages";
/// How long a stage whose stream failed gives its pod to show that it ended (see `explain`).
const SETTLE: Duration = Duration::from_secs(10);
/// The exit code of a stage killed by SIGKILL (`128 + 9`), as the kubelet kills containers.
const KILLED: i32 = 137;

struct Kubernetes;

/// What `state` saves: the pod and its connection (`kube-logic`'s), the stages started so far,
/// and where they run.
#[derive(serde::Serialize, serde::Deserialize)]
struct Saved {
    #[serde(flatten)]
    state: State,
    stages: StageFiles,
    project_dir: String,
    shell: String,
}

/// One job's pod.
pub struct KubeEnv {
    api: Api,
    saved: Saved,
    /// Why the pod cannot run stages any more, when `resume` found it gone or ended: every
    /// stage then fails at once with it (a system failure), and cleanup still runs.
    gone: Option<String>,
}

fn parse_config(json: &str) -> Result<config::Parsed, ExecutorError> {
    config::parse(json).map_err(ExecutorError::InvalidConfig)
}

/// The job's variables as `(key, value)`, in GitLab's order.
fn variables(details: Option<&runway_sdk::job::JobDetails>) -> Vec<(String, String)> {
    details.map(|d| d.variables.iter().map(|v| (v.key.clone(), v.value.clone())).collect()).unwrap_or_default()
}

fn variable<'a>(variables: &'a [(String, String)], key: &str) -> &'a str {
    variables.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str()).unwrap_or_default()
}

fn image_input(image: &runway_sdk::job::ImageDetails) -> ImageInput {
    ImageInput {
        name: image.name.clone(),
        entrypoint: image.entrypoint.clone(),
        command: image.command.clone(),
        aliases: image.aliases.clone(),
        variables: image.variables.iter().map(|v| (v.key.clone(), v.value.clone())).collect(),
        pull_policies: image.pull_policies.clone(),
    }
}

/// How to reach the cluster: the config's keys, the job's bearer token when allowed.
fn cluster_config(config: &KubeConfig, overwrites: &Overwrites) -> ClusterConfig {
    let token = if overwrites.bearer_token.is_empty() { &config.bearer_token } else { &overwrites.bearer_token };
    ClusterConfig {
        host: config.host.clone(),
        bearer_token: token.clone(),
        cert_file: config.cert_file.clone(),
        key_file: config.key_file.clone(),
        ca_file: config.ca_file.clone(),
        context: config.context.clone(),
    }
}

fn connect(config: &ClusterConfig) -> Result<Api, ExecutorError> {
    let cluster = Cluster::connect(config).map_err(|e| executor_error(e, "connecting to the Kubernetes API"))?;
    Ok(Api::new(cluster))
}

impl Executor for Kubernetes {
    type Environment = KubeEnv;

    fn info(config: &str) -> Result<ProviderInfo, ExecutorError> {
        let parsed = parse_config(config)?;
        for warning in &parsed.warnings {
            runway_sdk::log::warn(warning);
        }
        Ok(ProviderInfo {
            name: "kubernetes".into(),
            default_shell: "bash".into(),
            // Not `shared`: every job has its own pod and build volume.
            features: Features::VARIABLES | Features::IMAGE | Features::SERVICES,
            default_builds_dir: "/builds".into(),
            default_cache_dir: "/cache".into(),
        })
    }

    fn prepare(job: Job) -> Result<KubeEnv, ExecutorError> {
        let config = parse_config(&job.config)?.config;
        check_shell(&job.shell, "kubernetes")?;
        let details = runway_sdk::job::current();
        let vars = variables(details.as_ref());
        let overwrites = overwrites::resolve(&config, &vars).map_err(ExecutorError::InvalidConfig)?;
        for note in &overwrites.notes {
            trace::write_str(&format!("{note}\n"));
        }
        let api = connect(&cluster_config(&config, &overwrites))?;
        trace::write_str(&format!("Using Kubernetes cluster of {}\n", api.cluster.source()));
        let namespace = overwrites.namespace.clone();
        trace::write_str(&format!("Using Kubernetes namespace: {namespace}\n"));
        let random = std::collections::hash_map::RandomState::new().hash_one(job.id);
        let meta = JobMeta {
            job_id: job.id,
            project_id: variable(&vars, "CI_PROJECT_ID").parse().unwrap_or_default(),
            project_path: job.project_path.clone(),
            short_token: variable(&vars, "CI_RUNNER_SHORT_TOKEN").to_string(),
            runner_name: variable(&vars, "CI_RUNNER_DESCRIPTION").to_string(),
            concurrent: variable(&vars, "CI_CONCURRENT_PROJECT_ID").parse().unwrap_or_default(),
        };
        let state = State {
            connection: Connection {
                host: config.host.clone(),
                context: config.context.clone(),
                ca_file: config.ca_file.clone(),
                cert_file: config.cert_file.clone(),
                key_file: config.key_file.clone(),
                token_from_job: !overwrites.bearer_token.is_empty(),
                ..Connection::default()
            },
            job_id: job.id,
            namespace: namespace.clone(),
            pod: names::pod_name(&meta, random),
            secrets: Vec::new(),
            builds_dir: job.builds_dir.clone(),
            stages_dir: STAGES_DIR.to_string(),
            cleanup_grace_period_seconds: config.cleanup_grace_period_seconds,
        };
        let saved = Saved {
            state,
            stages: StageFiles::new(STAGES_DIR.to_string()),
            project_dir: job.project_dir.clone(),
            shell: job.shell.clone(),
        };
        let mut env = KubeEnv { api, saved, gone: None };
        let image = details.as_ref().and_then(|d| d.image.as_ref()).map(image_input).unwrap_or_default();
        let services: Vec<ImageInput> =
            details.as_ref().map(|d| d.services.iter().map(image_input).collect()).unwrap_or_default();
        let credentials: Vec<RegistryCredential> = details
            .as_ref()
            .map(|d| {
                d.credentials
                    .iter()
                    .map(|c| RegistryCredential {
                        registry: c.url.clone(),
                        username: c.username.clone(),
                        password: c.password.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let public: Vec<(String, String)> = details
            .as_ref()
            .map(|d| {
                d.variables.iter().filter(|v| v.public && !v.file).map(|v| (v.key.clone(), v.value.clone())).collect()
            })
            .unwrap_or_default();
        let mut inputs = PodInputs {
            meta,
            random,
            image,
            helper_image: String::new(),
            services,
            builds_dir: job.builds_dir.clone(),
            cache_dir: job.cache_dir.clone(),
            stages_dir: STAGES_DIR.to_string(),
            shell: job.shell.clone(),
            variables: public,
            image_pull_secrets: Vec::new(),
            pull_attempt: 0,
        };
        let patches = patches::load(&config, &vars)?;
        match env.setup(&config, &overwrites, &mut inputs, &credentials, &patches) {
            Ok(()) => Ok(env),
            Err(e) => {
                env.cleanup();
                Err(e)
            }
        }
    }

    fn resume(job: Job, state: String) -> Result<KubeEnv, ExecutorError> {
        let config = parse_config(&job.config)?.config;
        let mut saved: Saved = serde_json::from_str(&state)
            .map_err(|e| ExecutorError::Other(format!("unreadable kubernetes executor state: {e}")))?;
        saved.stages.mark_resumed();
        let vars = variables(runway_sdk::job::current().as_ref());
        let overwrites = overwrites::resolve(&config, &vars).map_err(ExecutorError::InvalidConfig)?;
        trace::write_str(&format!(
            "Resuming Kubernetes executor on pod {}/{} ...\n",
            saved.state.namespace, saved.state.pod
        ));
        let api = connect(&cluster_config(&config, &overwrites))?;
        // A pod that vanished or ended while no runner followed it fails the job at once.
        let gone = wait::ended(&api, &saved.state.namespace, &saved.state.pod)?;
        if let Some(why) = &gone {
            trace::write_str(&format!("ERROR: {why}\n"));
        }
        Ok(KubeEnv { api, saved, gone })
    }
}

impl KubeEnv {
    /// The Secret, the pod, and waiting for it; on error the caller cleans up.
    fn setup(
        &mut self,
        config: &KubeConfig,
        overwrites: &Overwrites,
        inputs: &mut PodInputs,
        credentials: &[RegistryCredential],
        patches: &[kube_logic::patch::Patch],
    ) -> Result<(), ExecutorError> {
        let namespace = self.saved.state.namespace.clone();
        if config.helper_image.trim().is_empty() {
            return Err(ExecutorError::InvalidConfig(
                "[runners.kubernetes] helper_image is required: push Runway's helper image (`runway helper-image -o helper.tar`, then `docker import` and `docker push`) to a registry the cluster pulls from, and name it here".into(),
            ));
        }
        let labels = names::job_labels(&inputs.meta, &inputs.variables);
        let secret_name = names::secret_name(&inputs.meta, inputs.random);
        if let Some(object) = secret::registry_secret(&secret_name, &namespace, &labels, credentials) {
            self.api.create(
                &format!("/api/v1/namespaces/{namespace}/secrets"),
                &object,
                "the registry credentials' secret",
            )?;
            self.saved.state.secrets.push(secret_name.clone());
            inputs.image_pull_secrets.push(secret_name);
        }
        // One pod attempt per pull policy (gitlab-runner's fallback): a failed pull with
        // another policy left deletes the pod and tries the next.
        let attempts = pull::effective(config, BUILD_CONTAINER, &inputs.image.pull_policies)
            .map_err(ExecutorError::InvalidConfig)?
            .len()
            .max(1);
        let first = inputs.random;
        for attempt in 0..attempts {
            inputs.pull_attempt = attempt;
            inputs.random = first.wrapping_add(attempt as u64);
            let mut object = pod::build(config, overwrites, inputs).map_err(ExecutorError::InvalidConfig)?;
            if !patches.is_empty() {
                object["spec"] = kube_logic::patch::apply_all(object["spec"].take(), patches)
                    .map_err(|e| ExecutorError::InvalidConfig(format!("[runners.kubernetes] {e}")))?;
            }
            self.saved.state.pod = object["metadata"]["name"].as_str().unwrap_or(&self.saved.state.pod).to_string();
            let image = object["spec"]["containers"][0]["image"].as_str().unwrap_or_default().to_string();
            trace::write_str(&format!("Using Kubernetes executor with image {image} ...\n"));
            self.api.create(&format!("/api/v1/namespaces/{namespace}/pods"), &object, "the job's pod")?;
            trace::write_str(&format!("Created pod {namespace}/{}\n", self.saved.state.pod));
            match wait::running(&self.api, &namespace, &self.saved.state.pod, config) {
                Ok(()) => {
                    // GitLab's web terminal: a shell `exec`ed in the build container, which
                    // lives as long as the pod (gitlab-runner's Kubernetes terminal).
                    if runway_sdk::terminal::wanted() {
                        runway_sdk::terminal::kube_exec(&self.api.cluster, &self.target(BUILD_CONTAINER));
                    }
                    return Ok(());
                }
                Err(wait::NotRunning::Pull(reason)) if attempt + 1 < attempts => {
                    trace::write_str(&format!("WARNING: {reason}: trying the next pull policy\n"));
                    self.delete_pod();
                }
                Err(wait::NotRunning::Pull(reason)) => return Err(ExecutorError::Other(reason)),
                Err(wait::NotRunning::Failed(e)) => return Err(e),
            }
        }
        Err(ExecutorError::Other("no pod attempt left".into()))
    }

    /// Delete the job's pod (best effort), with the configured grace period.
    fn delete_pod(&self) {
        let state = &self.saved.state;
        let grace = state.cleanup_grace_period_seconds.map(|g| format!("?gracePeriodSeconds={g}")).unwrap_or_default();
        self.api.delete(&format!("/api/v1/namespaces/{}/pods/{}{grace}", state.namespace, state.pod), "the job's pod");
    }

    fn target(&self, container: &str) -> Target {
        Target {
            namespace: self.saved.state.namespace.clone(),
            pod: self.saved.state.pod.clone(),
            container: container.to_string(),
        }
    }
}

impl KubeEnv {
    /// The error of a stage that failed, or that ended with a non-zero code: a system failure
    /// naming the pod's end when the pod is gone or ended (evicted, deleted, its node lost),
    /// else the stage's own result. A stage whose stream failed, or that was killed by SIGKILL
    /// (137), gives the pod [`SETTLE`] to show why: the kubelet kills an evicted pod's
    /// containers before it marks the pod.
    fn explain(&self, what: &str, result: Result<ExitStatus, ExecutorError>) -> Result<ExitStatus, ExecutorError> {
        let within = match &result {
            Err(ExecutorError::Canceled) | Ok(ExitStatus { code: 0 }) => return result,
            Ok(ExitStatus { code: KILLED }) => SETTLE,
            Ok(_) => Duration::ZERO,
            Err(_) => SETTLE,
        };
        match wait::ended_within(&self.api, &self.saved.state.namespace, &self.saved.state.pod, within) {
            Ok(Some(why)) => Err(ExecutorError::Unavailable(format!("{what}: {why}"))),
            _ => result,
        }
    }

    fn run_stage(&self, stage: &StageScript, target: &Target, what: &str) -> Result<ExitStatus, ExecutorError> {
        let error = |e: KubeError| executor_error(e, what);
        let files = self.saved.stages.next_checked(&stage.name, |log| {
            let probe =
                self.api.cluster.run_captured(target, &format!("[ -e {} ]", quote(log)), None, 64).map_err(error)?;
            Ok(probe.status.code == 0)
        })?;
        if !files.started {
            let cwd = working_dir(&stage.name, &self.saved.project_dir, &self.saved.state.builds_dir);
            let command = format!("cd {} && {}", quote(cwd), docker_logic::spec::detect_shell(""));
            self.api
                .cluster
                .start_detached(target, &command, stage.script.as_bytes(), &files.log, &files.exit)
                .map_err(error)?;
        }
        let status = self.api.cluster.attach(target, &files.log, &files.exit, 0).map_err(error)?;
        Ok(ExitStatus { code: status.code })
    }
}

impl Environment for KubeEnv {
    fn run(&self, stage: StageScript) -> Result<ExitStatus, ExecutorError> {
        let container = if stage.predefined { HELPER_CONTAINER } else { BUILD_CONTAINER };
        let target = self.target(container);
        let what = format!("stage {} (pod {} container {container})", stage.name, self.saved.state.pod);
        if let Some(why) = &self.gone {
            return Err(ExecutorError::Unavailable(format!("{what}: {why}")));
        }
        self.explain(&what, self.run_stage(&stage, &target, &what))
    }

    fn cleanup(&self) {
        self.delete_pod();
        let state = &self.saved.state;
        let ns = &state.namespace;
        for secret in &state.secrets {
            self.api.delete(&format!("/api/v1/namespaces/{ns}/secrets/{secret}"), "the job's secret");
        }
    }

    fn state(&self) -> Option<String> {
        serde_json::to_string(&self.saved).ok()
    }
}

runway_sdk::export_executor!(
    Kubernetes,
    name: "kubernetes",
    description: "runs each job in a pod on a Kubernetes cluster (GitLab's kubernetes executor, attach strategy)"
);
