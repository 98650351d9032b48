//! `runway register`, `verify`, `unregister` and `list`: managing `[[runners]]` entries the
//! way gitlab-runner does (glrt- authentication tokens through `POST /runners/verify`, legacy
//! registration tokens through `POST /runners`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use crate::config::{self, Config, RunnerConfig};
use crate::gitlab::client::{
    ApiError, ClientOptions, FeaturesInfo, GitLabClient, RegisterParams, RunnerCredentials, VersionInfo,
};

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
    /// Accepted for compatibility; registration never prompts.
    #[arg(long, short = 'n')]
    pub non_interactive: bool,
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

fn info() -> VersionInfo {
    VersionInfo::this_runner("", "", FeaturesInfo::default())
}

fn client() -> anyhow::Result<GitLabClient> {
    Ok(GitLabClient::new(ClientOptions::default())?)
}

/// A client honouring a runner's `tls-ca-file` and client certificate.
pub fn client_for(
    runner: &RunnerConfig,
    hook: Option<crate::gitlab::client::RequestHook>,
) -> anyhow::Result<GitLabClient> {
    let tls_client_cert = match (&runner.tls_cert_file, &runner.tls_key_file) {
        (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
        (None, None) => None,
        _ => anyhow::bail!("runner {:?}: tls-cert-file and tls-key-file go together", runner.name),
    };
    Ok(GitLabClient::new(ClientOptions {
        hook,
        tls_ca_file: runner.tls_ca_file.clone(),
        tls_client_cert,
        ..ClientOptions::default()
    })?)
}

fn load_or_new(path: &Path) -> anyhow::Result<Config> {
    if path.exists() {
        Ok(config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?.config)
    } else {
        Ok(Config {
            concurrent: 1,
            check_interval: 3,
            log_level: "info".into(),
            log_format: "runner".into(),
            listen_address: None,
            shutdown_timeout: 30,
            connection_max_age: None,
            plugins_dir: None,
            plugin_cache_dir: None,
            state_dir: None,
            user: None,
            labels: Default::default(),
            plugins: Default::default(),
            runners: Vec::new(),
        })
    }
}

fn config_dir(path: &Path) -> PathBuf {
    path.parent().filter(|p| !p.as_os_str().is_empty()).map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."))
}

pub async fn register(args: RegisterArgs, path: &Path) -> anyhow::Result<ExitCode> {
    let mut cfg = load_or_new(path)?;
    let system_id = config::system_id(&config_dir(path))?;
    let client = client()?;
    let url = args.url.trim_end_matches('/').to_string();
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
        let details = client.verify(&creds, &info()).await?;
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
        client.register_legacy(&url, &args.token, &params, &info()).await?
    };
    let mut runner = RunnerConfig::new(
        &args.name,
        &url,
        if details.token.is_empty() { &args.token } else { &details.token },
        &args.executor,
    );
    runner.id = details.id;
    runner.token_obtained_at = Some(chrono::Utc::now().with_nanosecond_truncated());
    runner.token_expires_at = details.token_expires_at;
    cfg.runners.push(runner);
    config::save(path, &cfg)?;
    println!("Runner registered successfully (id {}). Config written to {}", details.id, path.display());
    Ok(ExitCode::SUCCESS)
}

trait TruncateNanos {
    fn with_nanosecond_truncated(self) -> Self;
}

impl TruncateNanos for chrono::DateTime<chrono::Utc> {
    fn with_nanosecond_truncated(self) -> Self {
        use chrono::Timelike;
        self.with_nanosecond(0).unwrap_or(self)
    }
}

pub async fn verify(path: &Path, delete: bool) -> anyhow::Result<ExitCode> {
    let loaded = config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let system_id = config::system_id(&loaded.dir())?;
    let mut cfg = loaded.config.clone();
    let mut failed = false;
    let mut keep = Vec::new();
    for runner in &loaded.config.runners {
        let creds = RunnerCredentials {
            url: runner.resolved_url(),
            token: runner.resolved_token(),
            system_id: system_id.clone(),
        };
        let client = client_for(runner, None)?;
        match client.verify(&creds, &info()).await {
            Ok(_) => {
                println!("Verifying runner... is valid  runner={}", config::short_token(&runner.resolved_token()));
                keep.push(runner.clone());
            }
            Err(ApiError::Forbidden { .. }) => {
                println!("Verifying runner... is removed  runner={}", config::short_token(&runner.resolved_token()));
                failed = true;
                if !delete {
                    keep.push(runner.clone());
                }
            }
            Err(e) => {
                println!("Verifying runner... failed  runner={}: {e}", config::short_token(&runner.resolved_token()));
                failed = true;
                keep.push(runner.clone());
            }
        }
    }
    if delete && keep.len() != cfg.runners.len() {
        cfg.runners = keep;
        config::save(path, &cfg)?;
        println!("Removed invalid runners from {}", path.display());
        failed = false;
    }
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

pub async fn unregister(args: UnregisterArgs, path: &Path) -> anyhow::Result<ExitCode> {
    let loaded = config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let system_id = config::system_id(&loaded.dir())?;
    let mut cfg = loaded.config.clone();
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
        let client = client_for(runner, None)?;
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
    let mut index = 0;
    cfg.runners.retain(|_| {
        let keep = !removed.contains(&index);
        index += 1;
        keep
    });
    config::save(path, &cfg)?;
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// `runway lint`: load the config file as `runway run` would and say what is wrong with it,
/// as `gitlab-runner lint` does: an error (file, line, key) or keys nobody knows fail (exit 1);
/// keys gitlab-runner knows that Runway does not support are listed and the file is valid.
pub fn lint(path: &Path) -> anyhow::Result<ExitCode> {
    if !path.exists() {
        anyhow::bail!("config file not found: {}", path.display());
    }
    let loaded = config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (unknown, other): (Vec<&String>, Vec<&String>) =
        loaded.warnings.iter().partition(|w| w.ends_with("unknown key (ignored)"));
    for warning in &other {
        eprintln!("{warning}");
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
pub fn list(path: &Path) -> anyhow::Result<ExitCode> {
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
