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
use crate::gitlab::client::{ApiError, RunnerCredentials, VersionInfo};

/// `runway verify` flags (gitlab-runner's; URL and token have no variable, as there).
#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// Verify only the runner of this name.
    #[arg(short = 'n', long)]
    pub name: Option<String>,
    /// Verify only runners of this GitLab URL.
    #[arg(short = 'u', long)]
    pub url: Option<String>,
    /// Verify only the runner with this token.
    #[arg(short = 't', long)]
    pub token: Option<String>,
    /// Remove runners GitLab no longer knows from config.toml.
    #[arg(long)]
    pub delete: bool,
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
    /// Personal access token to use in lieu of the runner's old authentication token.
    #[arg(long)]
    pub pat: Option<String>,
}

/// `runway unregister` flags (gitlab-runner's, with its variables for URL and token).
#[derive(Args, Debug)]
pub struct UnregisterArgs {
    /// Runner name in config.toml.
    #[arg(short = 'n', long)]
    pub name: Option<String>,
    /// Runner URL (with --token).
    #[arg(short = 'u', long, env = "CI_SERVER_URL")]
    pub url: Option<String>,
    /// Runner token (with --url).
    #[arg(short = 't', long, env = "CI_SERVER_TOKEN")]
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
        session_server: Default::default(),
        runners: Vec::new(),
    }
}

pub(crate) fn load_or_new(path: &Path) -> anyhow::Result<Loaded> {
    if path.exists() {
        Ok(config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?)
    } else {
        Ok(Loaded { config: new_config(), warnings: Vec::new(), path: path.to_path_buf() })
    }
}

pub(crate) fn config_dir(path: &Path) -> PathBuf {
    path.parent().filter(|p| !p.as_os_str().is_empty()).map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."))
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
        match setup::reset_runner_token(path, i, runner, &system_id, args.pat.as_deref()).await {
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

/// `runway verify [--delete] [-n NAME] [-u URL] [-t TOKEN]`.
pub(crate) async fn verify(args: VerifyArgs, path: &Path) -> anyhow::Result<ExitCode> {
    let delete = args.delete;
    let loaded = config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let system_id = config::system_id(&loaded.dir())?;
    let mut failed = false;
    let mut removed = Vec::new();
    let selected = |r: &RunnerConfig| {
        args.name.as_deref().is_none_or(|n| n == r.name)
            && args.url.as_deref().is_none_or(|u| u.trim_end_matches('/') == r.resolved_url())
            && args.token.as_deref().is_none_or(|t| t == r.resolved_token())
    };
    for (i, runner) in loaded.config.runners.iter().enumerate().filter(|(_, r)| selected(r)) {
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
