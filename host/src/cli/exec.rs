//! `runway exec JOB...`: run `.gitlab-ci.yml` jobs locally through the same job path,
//! script generation and executor plugins as GitLab jobs, with a GitLab-like terminal log.
//!
//! Owns: the `exec` command. Must not touch: job or executor internals (it builds a
//! `JobEnvironment` and calls `run_job` like the manager does).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use crate::archive::Format;
use crate::config::{Loaded, RunnerConfig};
use crate::executor::{ResolvedExecutor, TerminalPlace};
use crate::helper::artifacts::artifact_filename;
use crate::job::{run_job, AcceptError, JobControl, JobEnvironment, JobHooks, NoHooks};
use crate::local::terminal::{TerminalOptions, TerminalSink};
use crate::local::{self, Pipeline, PlannedJob};
use crate::manager::identity;
use crate::payload::{ArtifactsFile, Dependency};
use crate::plugin::{builtin_plugins, HostSettings, PluginHost, StageOutput};
use crate::script::ScriptSettings;
use crate::session::pty::LocalShell;

/// `runway exec` flags.
#[derive(Args, Debug)]
pub struct ExecArgs {
    /// Jobs to run (as named in .gitlab-ci.yml; parallel jobs as `name 1/3` or `name: [a]`).
    pub jobs: Vec<String>,
    /// List the jobs with their stage, when and needs, and exit.
    #[arg(long)]
    pub list: bool,
    /// Also run the jobs the named jobs need, first, in stage order.
    #[arg(long)]
    pub needs: bool,
    /// Set a variable (overrides YAML and predefined ones); repeatable.
    #[arg(long = "var", value_name = "KEY=VALUE")]
    pub vars: Vec<String>,
    /// The pipeline file (default: .gitlab-ci.yml in the project directory).
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Executor plugin to run the jobs with (`shell`; `docker`: each job in its `image:`
    /// with its `services:`, on the engine `DOCKER_HOST` names, else the default socket;
    /// `kubernetes`: each job in a pod on the cluster of `[runners.kubernetes]` or the
    /// kubeconfig, the project mounted from the node, so a cluster on this machine).
    /// Default: the executor of the first `[[runners]]` of `--config`, else `shell`.
    #[arg(long)]
    pub executor: Option<String>,
    /// With `--executor docker` or `kubernetes`: the image of jobs that name none.
    #[arg(long, value_name = "IMAGE")]
    pub docker_image: Option<String>,
    /// Project directory (default: the current directory).
    #[arg(long)]
    pub cwd: Option<PathBuf>,
    /// Copy the tracked files into a scratch directory and run there.
    #[arg(long)]
    pub isolate: bool,
    /// Expand collapsed sections.
    #[arg(long, short = 'v')]
    pub verbose: bool,
    /// After each job's script, open the job's shell here (its directory, its variables, as
    /// GitLab's web terminal has it); the job finishes when the shell exits (shell executor).
    #[arg(long)]
    pub terminal: bool,
}

/// `--terminal`: the job's terminal, opened in this one once the stages are over.
#[derive(Default)]
struct TerminalAfterScript {
    place: std::sync::Mutex<Option<TerminalPlace>>,
}

#[async_trait::async_trait]
impl JobHooks for TerminalAfterScript {
    async fn prepared(&self) -> Result<(), AcceptError> {
        Ok(())
    }

    fn terminal(&self, place: TerminalPlace) {
        if let Ok(mut slot) = self.place.lock() {
            *slot = Some(place);
        }
    }

    async fn stages_over(&self, _left: Duration) {
        let place = self.place.lock().ok().and_then(|mut p| p.take());
        let Some(TerminalPlace::Local { shell, dir, env, user }) = place else {
            eprintln!("runway exec --terminal: this job's environment has no terminal");
            return;
        };
        eprintln!(
            "runway exec --terminal: a shell in the job's environment, in {}; exit it to finish the job",
            dir.display()
        );
        let shell = LocalShell { shell, dir, env, user };
        match tokio::process::Command::from(shell.command()).status().await {
            Ok(status) => eprintln!("runway exec --terminal: the shell ended ({status})"),
            Err(e) => eprintln!("runway exec --terminal: the shell did not start: {e}"),
        }
    }
}

fn cache_dir() -> Option<PathBuf> {
    crate::config::plugin_cache_from_env().or_else(|| {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|d| d.join("runway").join("plugins"))
    })
}

/// The plugin host of an exec: the loaded config's plugins and grants, else the built-ins. A
/// stage on this machine writes into a pipe that exec follows (exec never resumes a job, so
/// there is no log to read again).
async fn plugins(loaded: Option<&Loaded>) -> anyhow::Result<PluginHost> {
    let settings = match loaded {
        Some(loaded) => super::setup::host_settings(loaded),
        None => HostSettings {
            cache_dir: cache_dir(),
            builtins: builtin_plugins(),
            helper_image: Some(super::setup::helper_image()),
            ..HostSettings::default()
        },
    };
    PluginHost::new(HostSettings { stage_output: StageOutput::Pipes, ..settings }).await
}

/// Where a local job's files are, as the executor sees them.
struct Layout {
    /// `[runners.<executor>]` as JSON.
    executor_config: String,
    builds_dir: PathBuf,
    project_dir: PathBuf,
    cache_dir: PathBuf,
    /// Where the job sees the kept artifacts (`<project>/.runway/artifacts` here).
    artifacts_dir: PathBuf,
}

/// Where a docker job's helper container sees the project's kept artifacts (bind-mounted).
const CONTAINER_ARTIFACTS_DIR: &str = "/runway-artifacts";

impl Layout {
    /// The shell executor works in the project (or its `--isolate` copy) itself; the docker
    /// executor bind-mounts it at `/builds/<name>` in the job's containers, pulls only images
    /// the engine lacks (`if-not-present`) and keeps caches in its cache volume. Either way the user's environment is already loaded: no login shell.
    /// The kept artifacts (`artifacts_root`) are bind-mounted into the containers too.
    fn new(
        args: &ExecArgs,
        executor: &str,
        runner: Option<&RunnerConfig>,
        run_dir: &Path,
        artifacts_root: &Path,
    ) -> Layout {
        // The runner's own section of `--config` (its docker keys), when it is this executor's.
        let configured = runner
            .filter(|r| r.executor_plugin() == executor)
            .and_then(|r| serde_json::from_str::<serde_json::Value>(&r.executor_config_json()).ok())
            .filter(serde_json::Value::is_object);
        if executor == "docker" || executor == "kubernetes" {
            let name =
                run_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "project".into());
            let project_dir = PathBuf::from("/builds").join(&name);
            // Local images are the point of a local run: pull only what is missing.
            let mut config = configured.unwrap_or_else(|| serde_json::json!({ "pull_policy": ["if-not-present"] }));
            let mounts = [(run_dir, project_dir.as_path()), (artifacts_root, Path::new(CONTAINER_ARTIFACTS_DIR))];
            if executor == "docker" {
                let binds =
                    mounts.map(|(from, to)| serde_json::Value::String(format!("{}:{}", from.display(), to.display())));
                match config.get_mut("volumes").and_then(serde_json::Value::as_array_mut) {
                    Some(volumes) => volumes.extend(binds),
                    None => config["volumes"] = serde_json::Value::Array(binds.to_vec()),
                }
            } else {
                // The pod mounts them from the node: a cluster whose node sees this machine's
                // files (a local cluster), as `docker` binds them from the engine's machine.
                let volumes = mounts.iter().zip(["runway-project", "runway-artifacts"]).map(|((from, to), name)| {
                    serde_json::json!({ "name": name, "host_path": from.display().to_string(), "mount_path": to.display().to_string() })
                });
                let list = &mut config["volumes"]["host_path"];
                match list.as_array_mut() {
                    Some(existing) => existing.extend(volumes),
                    None => *list = serde_json::Value::Array(volumes.collect()),
                }
            }
            if let Some(image) = &args.docker_image {
                config["image"] = serde_json::Value::String(image.clone());
            }
            return Layout {
                executor_config: config.to_string(),
                builds_dir: PathBuf::from("/builds"),
                project_dir,
                cache_dir: PathBuf::from("/cache"),
                artifacts_dir: PathBuf::from(CONTAINER_ARTIFACTS_DIR),
            };
        }
        let config = match configured {
            Some(config) => config.to_string(),
            None if executor == "shell" => r#"{"login":false}"#.to_string(),
            None => "{}".to_string(),
        };
        Layout {
            executor_config: config,
            builds_dir: run_dir.parent().map(Path::to_path_buf).unwrap_or_else(|| run_dir.to_path_buf()),
            project_dir: run_dir.to_path_buf(),
            cache_dir: run_dir.join(".runway-cache"),
            artifacts_dir: artifacts_root.to_path_buf(),
        }
    }
}

fn parse_vars(vars: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    vars.iter()
        .map(|v| match v.split_once('=') {
            Some((k, val)) if !k.is_empty() => Ok((k.to_string(), val.to_string())),
            _ => Err(anyhow::anyhow!("--var {v:?}: expected KEY=VALUE")),
        })
        .collect()
}

/// The dependencies of `job` whose artifacts a local run kept (`.runway/artifacts/<job>/`).
fn local_dependencies(pipeline: &Pipeline, job: &PlannedJob, root: &Path) -> Vec<Dependency> {
    pipeline
        .dependencies_of(job)
        .into_iter()
        .filter_map(|dep| {
            let archive = dep.payload.artifacts.iter().find(|a| a.artifact_type == "archive")?;
            let name = if archive.name.is_empty() { "artifacts" } else { archive.name.as_str() };
            let filename = artifact_filename(name, Format::Zip);
            let size = std::fs::metadata(root.join(&dep.payload.job_info.name).join(&filename)).ok()?.len();
            Some(Dependency {
                id: dep.payload.id,
                name: dep.payload.job_info.name.clone(),
                token: "local".into(),
                artifacts_file: Some(ArtifactsFile { filename, size: i64::try_from(size).unwrap_or(i64::MAX) }),
            })
        })
        .collect()
}

/// Did this failure count as allowed (`allow_failure: true` or a listed exit code)?
fn failure_allowed(job: &PlannedJob, exit_code: Option<i32>) -> bool {
    if job.allow_failure_exit_codes.is_empty() {
        job.allow_failure
    } else {
        exit_code.is_some_and(|c| job.allow_failure_exit_codes.contains(&c))
    }
}

pub(super) async fn run(args: ExecArgs, config: Option<&Path>) -> anyhow::Result<ExitCode> {
    let project_dir = match &args.cwd {
        Some(dir) => dir.clone(),
        None => std::env::current_dir()?,
    };
    let project_dir = project_dir.canonicalize().map_err(|e| anyhow::anyhow!("{}: {e}", project_dir.display()))?;
    let file = args.file.clone().unwrap_or_else(|| project_dir.join(".gitlab-ci.yml"));
    let overrides = parse_vars(&args.vars)?;
    let pipeline = Pipeline::load(&project_dir, &file, &overrides).map_err(|e| anyhow::anyhow!("{e}"))?;
    if args.list {
        print!("{}", local::list_table(&pipeline));
        return Ok(ExitCode::SUCCESS);
    }
    if args.jobs.is_empty() {
        anyhow::bail!("name a job to run (`runway exec --list` shows them)");
    }
    let jobs: Vec<&PlannedJob> = if args.needs {
        pipeline.with_needs(&args.jobs).map_err(|e| anyhow::anyhow!("{e}"))?
    } else {
        args.jobs
            .iter()
            .map(|name| {
                pipeline.job(name).ok_or_else(|| {
                    anyhow::anyhow!("{}: unknown job {name:?} (`runway exec --list` shows them)", file.display())
                })
            })
            .collect::<anyhow::Result<_>>()?
    };

    // `--config`: the plugins and grants of that file, and the settings of its first runner
    // (executor, its section, `[runners.cache]`), so a local run shares the fleet's cache.
    let loaded = config.map(super::setup::load_config).transpose()?;
    let runner = loaded.as_ref().and_then(|l| l.config.runners.first());
    let executor_name = match (&args.executor, runner) {
        (Some(name), _) => name.clone(),
        (None, Some(r)) => r.executor_plugin().to_string(),
        (None, None) => "shell".to_string(),
    };
    let plugins = plugins(loaded.as_ref()).await?;
    let scratch = if args.isolate {
        Some(local::isolate::copy_tracked(&project_dir).map_err(|e| anyhow::anyhow!("{e}"))?)
    } else {
        None
    };
    let run_dir = scratch.as_ref().map(|t| t.path().to_path_buf()).unwrap_or_else(|| project_dir.clone());
    // Artifacts of local runs stay in the project, one directory per job, for dependants.
    let artifacts_root = project_dir.join(".runway").join("artifacts");
    if executor_name == "docker" || executor_name == "kubernetes" {
        // Bind-mounted into the containers: it must exist (and be the user's, not the engine's).
        std::fs::create_dir_all(&artifacts_root).map_err(|e| anyhow::anyhow!("{}: {e}", artifacts_root.display()))?;
    }
    if args.terminal && executor_name != "shell" {
        anyhow::bail!("--terminal needs the shell executor: {executor_name} jobs have no terminal yet");
    }
    let layout = Layout::new(&args, &executor_name, runner, &run_dir, &artifacts_root);
    let executor = ResolvedExecutor::resolve(&plugins, &executor_name, &layout.executor_config)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;

    let color = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let control = JobControl::default();
    {
        let control = control.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                control.cancel.cancel();
                if tokio::signal::ctrl_c().await.is_ok() {
                    control.abort.cancel();
                }
            }
        });
    }
    let runner_command = super::setup::helper_command(&executor);
    // The fleet's distributed cache, under the runner's own object names.
    let (short_token, cache_signer) = match runner {
        Some(r) => {
            let short = crate::config::short_token(&r.resolved_token());
            let signer = super::setup::runner_cache(r, &short).await?;
            (short, signer)
        }
        None => ("local".to_string(), None),
    };
    let mut exit = ExitCode::SUCCESS;
    for job in jobs {
        let own = artifacts_root.join(&job.payload.job_info.name);
        if own.exists() {
            std::fs::remove_dir_all(&own).map_err(|e| anyhow::anyhow!("{}: {e}", own.display()))?;
        }
        let settings = ScriptSettings {
            builds_dir: layout.builds_dir.clone(),
            cache_dir: layout.cache_dir.clone(),
            shared_builds_dir: false,
            short_token: short_token.clone(),
            executor: executor_name.clone(),
            shell: executor.info.default_shell.clone(),
            runner_version: crate::buildinfo::VERSION.into(),
            runner_revision: crate::buildinfo::REVISION.into(),
            project_dir_override: Some(layout.project_dir.clone()),
            shared_environment: true,
            runner_command: runner_command.clone(),
            local_artifacts_dir: Some(layout.artifacts_dir.clone()),
            cache_signer: cache_signer.clone(),
            ..ScriptSettings::default()
        };
        let env = JobEnvironment {
            executor: executor.clone(),
            settings,
            identity: identity("local", "exec", "local"),
            instance: None,
        };
        let sink = Arc::new(TerminalSink::new(
            Box::new(std::io::stdout()),
            TerminalOptions {
                color,
                verbose: args.verbose,
                silence_notice_after: color.then_some(Duration::from_secs(10)),
            },
        ));
        // CI_PROJECT_DIR is where the executor sees the project (the scratch copy with
        // --isolate, /builds/<name> in a container), not where the pipeline was read.
        let mut payload = job.payload.clone();
        payload.dependencies = local_dependencies(&pipeline, job, &artifacts_root);
        for v in payload.variables.iter_mut().filter(|v| v.key == "CI_PROJECT_DIR") {
            v.value = layout.project_dir.display().to_string();
        }
        let outcome = if args.terminal {
            run_job(&payload, &env, sink.clone(), &control, &TerminalAfterScript::default()).await
        } else {
            run_job(&payload, &env, sink.clone(), &control, &NoHooks).await
        };
        drop(sink);
        if !outcome.succeeded() {
            if failure_allowed(job, outcome.exit_code) {
                eprintln!("{}: failed, but allow_failure is set", job.name);
            } else {
                let code = outcome.exit_code.and_then(|c| u8::try_from(c).ok()).filter(|c| *c != 0).unwrap_or(1);
                exit = ExitCode::from(code);
                break;
            }
        }
        if control.abort.is_cancelled() {
            exit = ExitCode::from(130);
            break;
        }
    }
    Ok(exit)
}
