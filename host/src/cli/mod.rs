//! The `runway` command line: verbs and flags as gitlab-runner has them, plus `exec`,
//! `plugins`, `simulate` and `store`. Each verb lives in its own file, parses its flags and calls
//! into the library; what every verb builds from config.toml is `setup`'s.

mod exec;
mod logrus;
mod manager_image;
mod plugins;
mod register;
mod register_flags;
mod rotation;
mod router;
mod run;
pub(crate) mod runners;
mod service;
mod setup;
pub mod simulate_import;
mod store;
mod syslog;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// A GitLab-compatible CI runner with WebAssembly executor and fleet plugins.
#[derive(Parser, Debug)]
#[command(name = "runway", version, about)]
pub struct Cli {
    /// config.toml to use (default ./config.toml, then ~/.runway/config.toml; also
    /// `CONFIG_FILE`, as gitlab-runner reads it).
    #[arg(short = 'c', long = "config", global = true, env = "RUNWAY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log level: debug, info, warn, error, fatal, panic (over config.toml's `log_level`).
    #[arg(short = 'l', long = "log-level", global = true, env = "LOG_LEVEL")]
    pub log_level: Option<String>,
    /// Debug mode: log level debug (gitlab-runner's `--debug`).
    #[arg(long, global = true, env = "RUNNER_DEBUG")]
    pub debug: bool,
    /// Log format: runner, text, json (over config.toml's `log_format`).
    #[arg(long = "log-format", global = true, env = "LOG_FORMAT")]
    pub log_format: Option<String>,
    /// The verb.
    #[command(subcommand)]
    pub command: Command,
}

/// The verbs of `runway`.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the runner manager: poll GitLab and run jobs until stopped.
    Run(run::RunArgs),
    /// Route jobs: poll GitLab once for a fleet of runners and serve them the runner API
    /// (`-c router.toml`, default ./router.toml).
    Router,
    /// Run .gitlab-ci.yml jobs locally through the same job path and plugins.
    Exec(exec::ExecArgs),
    /// Register a runner with GitLab and add it to config.toml.
    Register(register::RegisterArgs),
    /// Check that the runners in config.toml are known to GitLab.
    Verify(runners::VerifyArgs),
    /// Remove runners from GitLab and config.toml.
    Unregister(runners::UnregisterArgs),
    /// Reset runners' authentication tokens at GitLab and write the new ones to config.toml.
    ResetToken(runners::ResetTokenArgs),
    /// List the runners in config.toml.
    List,
    /// Validate config.toml: errors and unknown keys fail; unsupported keys are listed.
    Lint,
    /// Replay a job trace against the autoscaler policy of config.toml on a virtual clock:
    /// queue wait percentiles, instance-hours, idle share, creations per job. Every
    /// `[[runners]]` entry on the same fleeting plugin is simulated together on one cloud.
    #[command(args_conflicts_with_subcommands = true)]
    Simulate {
        /// `import`: turn a project's job history from GitLab's jobs API into a trace.
        #[command(subcommand)]
        action: Option<SimulateAction>,
        /// Job trace: JSONL, one job per line (arrival offset and duration in seconds, and
        /// optionally the `runner` name that takes it).
        #[arg(long)]
        trace: Option<PathBuf>,
        /// Simulated provider (provisioning delays, failure rates, quota, spot interruptions,
        /// launch rate limit) as TOML.
        #[arg(long)]
        provider: Option<PathBuf>,
        /// Write an SVG chart of busy and idle instances and queued jobs over time.
        #[arg(long)]
        svg: Option<PathBuf>,
        /// Print the results as JSON (`summary`, `oracle`, `infinite`, `hours`, `report`, and
        /// `runners` with several runners).
        #[arg(long)]
        json: bool,
        /// Add the per-hour-of-week table to the text report.
        #[arg(long)]
        per_hour: bool,
        /// Simulate these configs side by side on the trace instead of `--config`.
        #[arg(long, num_args = 1..)]
        compare: Vec<PathBuf>,
    },
    /// Inspect the job store: running jobs kept so a restarted manager can resume them.
    Store {
        /// `list`, `show JOB_ID` or `forget JOB_ID`.
        #[command(subcommand)]
        command: store::StoreCommand,
    },
    /// Archive and upload job artifacts (internal: run by job scripts in the job environment).
    ArtifactsUploader(crate::helper::artifacts::UploaderArgs),
    /// Download and extract a dependency's artifacts (internal: run by job scripts).
    ArtifactsDownloader(crate::helper::artifacts::DownloaderArgs),
    /// Archive a cache and upload it to the distributed cache (internal: run by job scripts).
    CacheArchiver(crate::helper::cache::ArchiverArgs),
    /// Download a cache from the distributed cache and extract it (internal: run by job scripts).
    CacheExtractor(crate::helper::cache::ExtractorArgs),
    /// Install the runner as a systemd service (the unit gitlab-runner writes, stopping gracefully).
    Install(service::InstallArgs),
    /// Disable and remove the systemd service.
    Uninstall(service::ServiceArgs),
    /// Start the systemd service.
    Start(service::ServiceArgs),
    /// Stop the systemd service (gracefully: running jobs finish).
    Stop(service::ServiceArgs),
    /// Restart the systemd service.
    Restart(service::ServiceArgs),
    /// Say whether the systemd service runs (exit 0 only when it does).
    Status(service::ServiceArgs),
    /// Write Runway's helper image (built from this machine's files) as a root filesystem tar
    /// for `docker import`, and print the reference to import it as: how the helper image
    /// reaches a cluster's registry for the kubernetes executor (`helper_image`).
    HelperImage(HelperImageArgs),
    /// Write the image of the Runway manager (built from this machine's files, the kubernetes
    /// executor precompiled; entrypoint `runway run`, a non-root user, stop signal SIGQUIT) as
    /// an archive for `docker load`, and print its reference: how the manager runs in a
    /// cluster (deploy/kubernetes/).
    ManagerImage(manager_image::ManagerImageArgs),
    /// Inspect executor and fleeting plugins.
    Plugins {
        /// `list` or `check FILE`.
        #[command(subcommand)]
        command: plugins::PluginsCommand,
    },
}

/// `runway helper-image`.
#[derive(clap::Args, Debug)]
pub struct HelperImageArgs {
    /// Where to write the tar (`-`: standard output).
    #[arg(long, short = 'o')]
    pub output: PathBuf,
}

/// Write the helper image's root filesystem tar to `args.output`; print its reference.
fn helper_image(args: &HelperImageArgs) -> anyhow::Result<ExitCode> {
    let helper = crate::connector::rootfs::helper_rootfs()?;
    if args.output.as_os_str() == "-" {
        use std::io::Write as _;
        std::io::stdout().lock().write_all(&helper.rootfs.tar)?;
        eprintln!("{}", helper.reference);
    } else {
        std::fs::write(&args.output, &helper.rootfs.tar)
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", args.output.display()))?;
        println!("{}", helper.reference);
    }
    Ok(ExitCode::SUCCESS)
}

/// Sub-verbs of `runway simulate`.
#[derive(Subcommand, Debug)]
pub enum SimulateAction {
    /// Fetch a project's job history from GitLab's jobs API and write it as a JSONL trace.
    Import(simulate_import::ImportArgs),
}

/// The tracing level of a gitlab-runner `log_level` (`fatal` and `panic` log errors only).
fn tracing_level(level: &str) -> &str {
    match level {
        "warning" => "warn",
        "fatal" | "panic" => "error",
        other => other,
    }
}

/// The output layer (standard error in a format, or the system logger).
type Output = Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>;
/// The subscriber under the level filter.
type UnderFilter = tracing_subscriber::layer::Layered<
    tracing_subscriber::reload::Layer<Output, tracing_subscriber::Registry>,
    tracing_subscriber::Registry,
>;

/// What a config reload may change in logging, and what it must leave alone (the flags and
/// `RUST_LOG` win over config.toml).
struct Logging {
    filter: tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, UnderFilter>,
    /// `None` with `--syslog` (the format is the system logger's).
    output: Option<tracing_subscriber::reload::Handle<Output, tracing_subscriber::Registry>>,
    /// `--log-level`/`LOG_LEVEL` given, or `RUST_LOG` set: the level is not config.toml's.
    level_fixed: bool,
    /// `--log-format`/`LOG_FORMAT` given.
    format_fixed: bool,
    /// The level and format in use.
    current: std::sync::Mutex<(String, String)>,
}

static LOGGING: std::sync::OnceLock<Logging> = std::sync::OnceLock::new();

/// Start logging at `level` in `format` (`runner`: coloured text on a terminal, `text`: plain
/// text, `json`: one JSON object a line). `RUST_LOG` still wins for the level. `fixed`: level
/// and format came from flags, so a config reload leaves them.
fn init_logging(level: &str, format: &str, syslog: Option<&str>, fixed: (bool, bool)) {
    let from_env = tracing_subscriber::EnvFilter::try_from_default_env().ok();
    let rust_log = from_env.is_some();
    let filter = from_env.unwrap_or_else(|| tracing_subscriber::EnvFilter::new(tracing_level(level)));
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;
    let output: Output = match syslog {
        // The system logger stamps time and ident itself.
        Some(ident) => tracing_subscriber::fmt::layer()
            .with_writer(syslog::Syslog::open(ident))
            .with_ansi(false)
            .without_time()
            .boxed(),
        None => stderr_layer(format),
    };
    let (output, output_handle) = tracing_subscriber::reload::Layer::new(output);
    let (filter, filter_handle) = tracing_subscriber::reload::Layer::new(filter);
    let installed =
        tracing_subscriber::registry().with(output).with(filter).with(crate::metrics::ErrorCounter).try_init().is_ok();
    if installed {
        let _ = LOGGING.set(Logging {
            filter: filter_handle,
            output: syslog.is_none().then_some(output_handle),
            level_fixed: fixed.0 || rust_log,
            format_fixed: fixed.1,
            current: std::sync::Mutex::new((level.to_string(), format.to_string())),
        });
    }
}

/// Apply a reloaded config.toml's `log_level` and `log_format` (unless flags or `RUST_LOG`
/// fixed them): gitlab-runner applies both on reload.
pub(crate) fn reload_logging(level: &str, format: &str) {
    let Some(logging) = LOGGING.get() else { return };
    let Ok(mut current) = logging.current.lock() else { return };
    if !logging.level_fixed && current.0 != level {
        match logging.filter.reload(tracing_subscriber::EnvFilter::new(tracing_level(level))) {
            Ok(()) => {
                current.0 = level.to_string();
                tracing::info!(log_level = level, "log level changed");
            }
            Err(e) => tracing::warn!("cannot change the log level: {e}"),
        }
    }
    if let (false, Some(output)) = (logging.format_fixed, &logging.output) {
        if current.1 != format {
            match output.reload(stderr_layer(format)) {
                Ok(()) => {
                    current.1 = format.to_string();
                    tracing::info!(log_format = format, "log format changed");
                }
                Err(e) => tracing::warn!("cannot change the log format: {e}"),
            }
        }
    }
}

fn stderr_layer<S>(format: &str) -> Box<dyn tracing_subscriber::Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    match format {
        "json" => layer.event_format(logrus::LogrusJson).boxed(),
        "text" => layer.with_ansi(false).boxed(),
        _ => layer.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).boxed(),
    }
}

/// `log_level` and `log_format` of the config file at `path`, when it has them (a file that
/// does not load yet is reported by the verb).
fn configured_logging(path: &std::path::Path) -> (Option<String>, Option<String>) {
    let Ok(text) = std::fs::read_to_string(path) else { return (None, None) };
    let Ok(table) = text.parse::<toml::Table>() else { return (None, None) };
    let get = |key: &str| table.get(key).and_then(toml::Value::as_str).map(str::to_string);
    (get("log_level"), get("log_format"))
}

/// The config file: `--config`/`RUNWAY_CONFIG`, else `CONFIG_FILE` (gitlab-runner's
/// variable), else the default path.
fn config_path(cli: &Cli) -> PathBuf {
    cli.config
        .clone()
        .or_else(|| std::env::var_os("CONFIG_FILE").filter(|v| !v.is_empty()).map(PathBuf::from))
        .unwrap_or_else(crate::config::default_path)
}

/// Parse arguments and run the verb; the exit code is the verb's.
pub fn main() -> ExitCode {
    if std::env::args_os().nth(1).is_some_and(|a| a == crate::connector::reaper::ARG) {
        return crate::connector::reaper::serve();
    }
    let cli = Cli::parse();
    let mut syslog = None;
    if let Command::Run(args) = &cli.command {
        // gitlab-runner's `run -d`: the directory the runner works in, before anything is read.
        if let Some(dir) = &args.working_directory {
            if let Err(e) = std::env::set_current_dir(dir) {
                eprintln!("runway: --working-directory {}: {e}", dir.display());
                return ExitCode::from(2);
            }
        }
        syslog = args.syslog.then_some(args.service.as_str());
    }
    let config_path = config_path(&cli);
    let (level, format) = configured_logging(&config_path);
    let fixed = (cli.log_level.is_some() || cli.debug, cli.log_format.is_some());
    let level = cli
        .debug
        .then(|| "debug".to_string())
        .or_else(|| cli.log_level.clone())
        .or(level)
        .unwrap_or_else(|| "info".into());
    let format = cli.log_format.clone().or(format).unwrap_or_else(|| "runner".into());
    init_logging(&level, &format, syslog, fixed);
    setup::seal_process();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runway: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let explicit_config =
        cli.config.clone().or_else(|| std::env::var_os("CONFIG_FILE").filter(|v| !v.is_empty()).map(PathBuf::from));
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => run::run(config_path, args).await,
            Command::Router => {
                router::run(explicit_config.as_deref().unwrap_or(std::path::Path::new("router.toml"))).await
            }
            Command::Exec(args) => exec::run(args, explicit_config.as_deref()).await,
            Command::Register(args) => register::register(args, &config_path).await,
            Command::Verify(args) => runners::verify(args, &config_path).await,
            Command::Unregister(args) => runners::unregister(args, &config_path).await,
            Command::ResetToken(args) => runners::reset_token(args, &config_path).await,
            Command::List => runners::list(&config_path),
            Command::Lint => runners::lint(&config_path).await,
            Command::Simulate { action: Some(SimulateAction::Import(args)), .. } => simulate_import::run(args).await,
            Command::Simulate { action: None, trace, provider, svg, json, per_hour, compare } => {
                let trace = trace.ok_or_else(|| anyhow::anyhow!("runway simulate: --trace is required"))?;
                let configs = if compare.is_empty() { vec![config_path.clone()] } else { compare };
                let report =
                    crate::autoscaler::simulate::simulate_command(&crate::autoscaler::simulate::SimulateOptions {
                        configs,
                        trace,
                        provider,
                        svg,
                        json,
                        per_hour,
                    })?;
                print!("{report}");
                Ok(ExitCode::SUCCESS)
            }
            Command::Install(args) => {
                let default = config_path.clone();
                Ok(service::install(args, explicit_config.as_deref(), &default)?)
            }
            Command::Uninstall(args) => Ok(service::uninstall(&args)?),
            Command::Start(args) => Ok(service::control("start", &args)?),
            Command::Stop(args) => Ok(service::control("stop", &args)?),
            Command::Restart(args) => Ok(service::control("restart", &args)?),
            Command::Status(args) => Ok(service::status(&args)?),
            Command::HelperImage(args) => helper_image(&args),
            Command::ManagerImage(args) => manager_image::run(&args),
            Command::Plugins { command } => plugins::run(command, explicit_config.as_deref()).await,
            Command::Store { command } => store::run(command, &config_path).await,
            Command::ArtifactsUploader(args) => Ok(crate::helper::artifacts::upload(args).await),
            Command::ArtifactsDownloader(args) => Ok(crate::helper::artifacts::download(args).await),
            Command::CacheArchiver(args) => Ok(crate::helper::cache::archive_cache(args).await),
            Command::CacheExtractor(args) => Ok(crate::helper::cache::extract_cache(args).await),
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("runway: {e:#}");
            ExitCode::from(1)
        }
    }
}
