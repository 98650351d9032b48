//! `runway register`, `verify`, `unregister`, `reset-token` and `list`: managing `[[runners]]`
//! entries the way gitlab-runner does (glrt- authentication tokens through `POST
//! /runners/verify`, legacy registration tokens through `POST /runners`, token resets through
//! `POST /runners/reset_authentication_token`). config.toml is edited in place
//! (`config::edit`): every other key and comment stays.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use super::setup;
use crate::config::fidelity::{ConfigWarning, WarningKind};
use crate::config::{self, Config, Loaded, RunnerConfig};
use crate::gitlab::client::{ApiError, RegisterParams, RunnerCredentials, VersionInfo};

/// `runway register` flags (gitlab-runner's names).
#[derive(Args, Debug)]
pub struct RegisterArgs {
    /// GitLab instance URL.
    #[arg(long, env = "CI_SERVER_URL")]
    pub url: String,
    /// Runner authentication token (glrt-...) or a legacy registration token.
    #[arg(long, alias = "registration-token", env = "REGISTRATION_TOKEN")]
    pub token: String,
    /// Runner name (local name for glrt- runners).
    #[arg(long, alias = "description", env = "RUNNER_NAME", default_value = "runway")]
    pub name: String,
    /// Executor plugin.
    #[arg(long, env = "RUNNER_EXECUTOR", default_value = "shell")]
    pub executor: String,
    /// Legacy tokens only: comma-separated tags.
    #[arg(long, env = "RUNNER_TAG_LIST")]
    pub tag_list: Option<String>,
    /// Legacy tokens only: run jobs without tags.
    #[arg(long, env = "REGISTER_RUN_UNTAGGED")]
    pub run_untagged: bool,
    /// Legacy tokens only: lock the runner to its project.
    #[arg(long, env = "REGISTER_LOCKED")]
    pub locked: Option<bool>,
    /// Legacy tokens only: not_protected or ref_protected.
    #[arg(long, env = "REGISTER_ACCESS_LEVEL")]
    pub access_level: Option<String>,
    /// Legacy tokens only: maximum job timeout in seconds.
    #[arg(long, env = "REGISTER_MAXIMUM_TIMEOUT")]
    pub maximum_timeout: Option<i64>,
    /// Legacy tokens only: register paused.
    #[arg(long, env = "REGISTER_PAUSED")]
    pub paused: bool,
    /// Legacy tokens only: maintenance note.
    #[arg(long, env = "REGISTER_MAINTENANCE_NOTE")]
    pub maintenance_note: Option<String>,
    /// CA certificates (PEM) to trust for GitLab beside the system's; written to the entry.
    #[arg(long = "tls-ca-file", env = "CI_SERVER_TLS_CA_FILE")]
    pub tls_ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for GitLab; written to the entry.
    #[arg(long = "tls-cert-file", env = "CI_SERVER_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// Key of the client certificate (PEM); written to the entry.
    #[arg(long = "tls-key-file", env = "CI_SERVER_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// Accepted for compatibility; registration never prompts.
    #[arg(long, short = 'n')]
    pub non_interactive: bool,
}

/// `runway reset-token` flags (gitlab-runner's).
#[derive(Args, Debug)]
pub struct ResetTokenArgs {
    /// Name of the runner whose token to reset (as in config.toml).
    #[arg(long, short = 'n')]
    pub name: Option<String>,
    /// URL of the runner whose token to reset (with --id).
    #[arg(long, short = 'u')]
    pub url: Option<String>,
    /// ID of the runner whose token to reset (with --url).
    #[arg(long, short = 'i')]
    pub id: Option<i64>,
    /// Reset the token of every runner in config.toml.
    #[arg(long)]
    pub all_runners: bool,
}

/// `runway unregister` flags.
#[derive(Args, Debug)]
pub struct UnregisterArgs {
    /// Runner name in config.toml.
    #[arg(long)]
    pub name: Option<String>,
    /// Runner URL (with --token).
    #[arg(long)]
    pub url: Option<String>,
    /// Runner token (with --url).
    #[arg(long)]
    pub token: Option<String>,
    /// Unregister every runner in config.toml.
    #[arg(long)]
    pub all_runners: bool,
}

/// The `info` a runner sends on register and verify: the same features, executor, shell and
/// labels (global ones overlaid by the runner's) as the manager sends on job requests. The
/// features come from the executor plugin; when it cannot be resolved, only the runner's own.
pub(crate) async fn runner_info(loaded: &Loaded, runner: &RunnerConfig) -> VersionInfo {
    let executor = async {
        let plugins = setup::plugin_host(loaded).await?;
        crate::executor::ResolvedExecutor::resolve(&plugins, runner.executor_plugin(), &runner.executor_config_json())
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))
    };
    let (features, shell) = match executor.await {
        Ok(executor) => (
            crate::manager::features(executor.features()),
            runner.shell.clone().unwrap_or_else(|| executor.default_shell().to_string()),
        ),
        Err(e) => {
            eprintln!(
                "WARNING: executor {:?} of runner {:?}: {e:#}; sending only the runner's own features",
                runner.executor, runner.name
            );
            (crate::manager::features(Default::default()), runner.shell.clone().unwrap_or_default())
        }
    };
    let mut info = VersionInfo::this_runner(&runner.executor, &shell, features);
    info.labels = setup::labels(&loaded.config, runner);
    info
}

fn new_config() -> Config {
    Config {
        concurrent: 1,
        check_interval: 0,
        log_level: "info".into(),
        log_format: "runner".into(),
        listen_address: None,
        shutdown_timeout: 0,
        connection_max_age: None,
        plugins_dir: None,
        plugin_cache_dir: None,
        state_dir: None,
        user: None,
        labels: Default::default(),
        plugins: Default::default(),
        runners: Vec::new(),
    }
}

fn load_or_new(path: &Path) -> anyhow::Result<Loaded> {
    if path.exists() {
        Ok(config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?)
    } else {
        Ok(Loaded { config: new_config(), warnings: Vec::new(), path: path.to_path_buf() })
    }
}

fn config_dir(path: &Path) -> PathBuf {
    path.parent().filter(|p| !p.as_os_str().is_empty()).map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."))
}

/// `runway register`: verify a glrt- token (or register with a legacy token) and append the
/// runner to config.toml.
pub(crate) async fn register(args: RegisterArgs, path: &Path) -> anyhow::Result<ExitCode> {
    let loaded = load_or_new(path)?;
    let system_id = config::system_id(&config_dir(path))?;
    let url = args.url.trim_end_matches('/').to_string();
    let mut runner = RunnerConfig::new(&args.name, &url, &args.token, &args.executor);
    runner.tls_ca_file = args.tls_ca_file.clone();
    runner.tls_cert_file = args.tls_cert_file.clone();
    runner.tls_key_file = args.tls_key_file.clone();
    let client = setup::client_for(&runner, &config::tls::certs_dir(path), None)?;
    let info = runner_info(&loaded, &runner).await;
    let details = if args.token.starts_with("glrt-") {
        if args.tag_list.is_some()
            || args.locked.is_some()
            || args.access_level.is_some()
            || args.maximum_timeout.is_some()
            || args.paused
            || args.run_untagged
        {
            anyhow::bail!("runner authentication tokens (glrt-) keep tags, locked, access level, maximum timeout and paused on the server: set them in GitLab, not here");
        }
        let creds = RunnerCredentials { url: url.clone(), token: args.token.clone(), system_id: system_id.clone() };
        let details = client.verify(&creds, &info).await?;
        if details.id == 0 {
            anyhow::bail!("GitLab did not return a runner ID for this token");
        }
        details
    } else {
        eprintln!("WARNING: registration tokens are deprecated; create the runner in GitLab and use its glrt- token");
        let params = RegisterParams {
            description: args.name.clone(),
            maintenance_note: args.maintenance_note.unwrap_or_default(),
            tags: args
                .tag_list
                .as_deref()
                .unwrap_or("")
                .split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_string)
                .collect(),
            run_untagged: args.run_untagged || args.tag_list.as_deref().unwrap_or("").trim().is_empty(),
            locked: args.locked.unwrap_or(true),
            access_level: args.access_level.unwrap_or_default(),
            maximum_timeout: args.maximum_timeout.unwrap_or(0),
            paused: args.paused,
        };
        client.register_legacy(&url, &args.token, &params, &info).await?
    };
    if !details.token.is_empty() {
        runner.token = details.token.clone();
    }
    runner.id = details.id;
    runner.token_obtained_at = Some(setup::now_in_seconds());
    runner.token_expires_at = details.token_expires_at;
    config::edit::add_runner(path, &runner)?;
    println!("Runner registered successfully (id {}). Config written to {}", details.id, path.display());
    Ok(ExitCode::SUCCESS)
}

/// `runway reset-token`: new tokens for the selected runners, written into config.toml.
pub(crate) async fn reset_token(args: ResetTokenArgs, path: &Path) -> anyhow::Result<ExitCode> {
    let loaded = config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let system_id = config::system_id(&loaded.dir())?;
    let selected: Vec<usize> = loaded
        .config
        .runners
        .iter()
        .enumerate()
        .filter(|(_, r)| {
            args.all_runners
                || args.name.as_deref() == Some(r.name.as_str())
                || (args.name.is_none()
                    && args.url.as_deref().map(|u| u.trim_end_matches('/')) == Some(r.resolved_url().as_str())
                    && args.id == Some(r.id))
        })
        .map(|(i, _)| i)
        .collect();
    if selected.is_empty() {
        anyhow::bail!("no runner in {} matches (use --name, --url with --id, or --all-runners)", path.display());
    }
    let mut failed = false;
    for i in selected {
        let runner = &loaded.config.runners[i];
        let short = config::short_token(&runner.resolved_token());
        match setup::reset_runner_token(path, i, runner, &system_id).await {
            Ok(update) => println!(
                "Resetting runner authentication token... succeeded  runner={short} name={:?} new={}{}",
                runner.name,
                config::short_token(&update.token),
                update.expires_at.map(|at| format!(" expires_at={}", at.to_rfc3339())).unwrap_or_default()
            ),
            Err(e) => {
                eprintln!(
                    "Resetting runner authentication token... failed  runner={short} name={:?}: {e:#}",
                    runner.name
                );
                failed = true;
            }
        }
    }
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// `runway verify [--delete]`.
pub(crate) async fn verify(path: &Path, delete: bool) -> anyhow::Result<ExitCode> {
    let loaded = config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let system_id = config::system_id(&loaded.dir())?;
    let mut failed = false;
    let mut removed = Vec::new();
    for (i, runner) in loaded.config.runners.iter().enumerate() {
        let creds = RunnerCredentials {
            url: runner.resolved_url(),
            token: runner.resolved_token(),
            system_id: system_id.clone(),
        };
        let client = setup::client_for(runner, &config::tls::certs_dir(path), None)?;
        match client.verify(&creds, &runner_info(&loaded, runner).await).await {
            Ok(_) => {
                println!("Verifying runner... is valid  runner={}", config::short_token(&runner.resolved_token()));
            }
            Err(ApiError::Forbidden { .. }) => {
                println!("Verifying runner... is removed  runner={}", config::short_token(&runner.resolved_token()));
                failed = true;
                removed.push(i);
            }
            Err(e) => {
                println!("Verifying runner... failed  runner={}: {e}", config::short_token(&runner.resolved_token()));
                failed = true;
            }
        }
    }
    if delete && !removed.is_empty() {
        config::edit::remove_runners(path, &removed)?;
        println!("Removed invalid runners from {}", path.display());
        failed = false;
    }
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// `runway unregister`.
pub(crate) async fn unregister(args: UnregisterArgs, path: &Path) -> anyhow::Result<ExitCode> {
    let loaded = config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let system_id = config::system_id(&loaded.dir())?;
    let cfg = loaded.config.clone();
    let selected: Vec<usize> = cfg
        .runners
        .iter()
        .enumerate()
        .filter(|(_, r)| {
            args.all_runners
                || args.name.as_deref() == Some(r.name.as_str())
                || (args.url.as_deref().map(|u| u.trim_end_matches('/')) == Some(r.resolved_url().as_str())
                    && args.token.as_deref() == Some(r.resolved_token().as_str()))
        })
        .map(|(i, _)| i)
        .collect();
    if selected.is_empty() {
        anyhow::bail!("no runner in {} matches (use --name, --url with --token, or --all-runners)", path.display());
    }
    let mut removed = Vec::new();
    for i in selected {
        let runner = &cfg.runners[i];
        let creds = RunnerCredentials {
            url: runner.resolved_url(),
            token: runner.resolved_token(),
            system_id: system_id.clone(),
        };
        let client = setup::client_for(runner, &config::tls::certs_dir(path), None)?;
        let result = if runner.resolved_token().starts_with("glrt-") {
            client.unregister_manager(&creds).await
        } else {
            client.unregister_runner(&creds).await
        };
        match result {
            Ok(()) => {
                println!(
                    "Unregistering runner from GitLab succeeded  runner={}",
                    config::short_token(&runner.resolved_token())
                );
                removed.push(i);
            }
            Err(e) => eprintln!("Unregistering runner {} failed: {e}", runner.name),
        }
    }
    let failed = removed.is_empty();
    config::edit::remove_runners(path, &removed)?;
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// `runway lint`: load the config file as `runway run` would and say what is wrong with it,
/// as `gitlab-runner lint` does: an error (file, line, key) or keys nobody knows fail (exit 1);
/// keys gitlab-runner knows that Runway does not support are listed and the file is valid.
pub(crate) async fn lint(path: &Path) -> anyhow::Result<ExitCode> {
    if !path.exists() {
        anyhow::bail!("config file not found: {}", path.display());
    }
    let loaded = config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    // What `run` says when it starts each runner: its executor plugin exists and takes its
    // section (the plugin logs the keys it ignores, as at run).
    let plugins = setup::plugin_host(&loaded).await?;
    let (unknown, other): (Vec<&ConfigWarning>, Vec<&ConfigWarning>) =
        loaded.warnings.iter().partition(|w| w.kind == WarningKind::UnknownKey);
    for warning in &other {
        eprintln!("{warning}");
    }
    // A runner `run` leaves out (no usable url, token, executor or fleeting plugin) was
    // named among the warnings; it fails the lint as an unusable executor does.
    let mut unusable = loaded.config.runners.iter().filter(|r| r.unusable.is_some()).count();
    for runner in loaded.config.runners.iter().filter(|r| r.unusable.is_none()) {
        let resolved = crate::executor::ResolvedExecutor::resolve(
            &plugins,
            runner.executor_plugin(),
            &runner.executor_config_json(),
        )
        .await;
        if let Err(e) = resolved {
            eprintln!("{}: runner {:?}: executor {:?}: {e}", path.display(), runner.name, runner.executor);
            unusable += 1;
        }
    }
    if unusable > 0 {
        return Ok(ExitCode::FAILURE);
    }
    if !unknown.is_empty() {
        eprintln!("{} unknown key(s) found in {}:", unknown.len(), path.display());
        for warning in &unknown {
            eprintln!("  {warning}");
        }
        return Ok(ExitCode::FAILURE);
    }
    println!("Configuration file is valid.");
    Ok(ExitCode::SUCCESS)
}

/// `runway list`: the runners of the config file.
pub(crate) fn list(path: &Path) -> anyhow::Result<ExitCode> {
    let loaded = config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    eprintln!("Listing configured runners  ConfigFile={}", path.display());
    for runner in &loaded.config.runners {
        println!(
            "{:<20} Executor={} Token={} URL={}",
            runner.name,
            runner.executor,
            config::short_token(&runner.resolved_token()),
            runner.resolved_url()
        );
    }
    Ok(ExitCode::SUCCESS)
}
