//! `runway install`, `uninstall`, `start`, `stop`, `restart` and `status`: the runner as a
//! systemd service, with gitlab-runner's flags and the unit gitlab-runner writes (through
//! kardianos/service's systemd template), plus what a graceful stop of Runway needs
//! (`KillSignal=SIGQUIT`, `KillMode=mixed`, a long `TimeoutStopSec`). Owns the unit text and
//! the `systemctl` calls; it must not touch the manager, and reads config.toml only to check it
//! (or to write the empty file gitlab-runner writes when there is none).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::config;

/// gitlab-runner's default service name: an administrator swapping the binary keeps the unit.
pub(super) const DEFAULT_SERVICE: &str = "gitlab-runner";
/// The unit's `Description=`, as gitlab-runner writes it.
const DESCRIPTION: &str = "GitLab Runner";
/// How long systemd waits for a graceful stop (running jobs finishing) before SIGKILL: the
/// two hours gitlab-runner's documentation sets in its graceful-stop override.
const TIMEOUT_STOP_SEC: u32 = 7200;
/// What `install` writes when config.toml does not exist yet (gitlab-runner saves its defaults).
const EMPTY_CONFIG: &str = "concurrent = 1\ncheck_interval = 0\n";

/// Where the units live and how systemd is asked: hidden, so tests can run unprivileged
/// against `systemctl --root=DIR`.
#[derive(clap::Args, Debug, Clone)]
pub struct Systemd {
    /// Directory the unit path `/etc/systemd/system/NAME.service` is taken under.
    #[arg(long = "systemd-root", env = "RUNWAY_SYSTEMD_ROOT", hide = true, default_value = "/")]
    pub root: PathBuf,
    /// The `systemctl` program and its leading arguments (shell words).
    #[arg(long = "systemctl", env = "RUNWAY_SYSTEMCTL", hide = true, default_value = "systemctl")]
    pub systemctl: String,
}

/// The flags of `uninstall`, `start`, `stop`, `restart` and `status` (gitlab-runner's).
#[derive(clap::Args, Debug)]
pub struct ServiceArgs {
    /// The service's name (its unit is NAME.service).
    #[arg(long = "service", short = 'n', default_value = DEFAULT_SERVICE)]
    pub service: String,
    #[command(flatten)]
    pub systemd: Systemd,
}

/// The flags of `install` (gitlab-runner's; the config file is the global `-c/--config`).
#[derive(clap::Args, Debug)]
pub struct InstallArgs {
    #[command(flatten)]
    pub common: ServiceArgs,
    /// The directory the service works in (default: the current one).
    #[arg(long = "working-directory", short = 'd')]
    pub working_directory: Option<PathBuf>,
    /// Log to the system logger (on systemd the journal has the output without it).
    #[arg(long)]
    pub syslog: bool,
    /// Run shell executor jobs as this user (`run --user`; root only).
    #[arg(long, short = 'u')]
    pub user: Option<String>,
    /// Run the service itself as this user (the unit's `User=`; root only).
    #[arg(long = "init-user", short = 'i')]
    pub init_user: Option<String>,
}

/// Why a service verb failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum ServiceError {
    /// `--user` and `--init-user` together.
    #[error("only one of --user or --init-user can be given")]
    UserAndInitUser,
    /// Root installing without saying who the service runs as.
    #[error("name the user the service runs as: --user or --init-user")]
    NoUser,
    /// A root-only flag given by another user.
    #[error("--{0} is supported for root only")]
    RootOnly(&'static str),
    /// A user not in the password database.
    #[error("user {0:?} does not exist")]
    UnknownUser(String),
    /// `install` over an existing unit.
    #[error("the unit {} already exists (runway uninstall first)", .0.display())]
    AlreadyInstalled(PathBuf),
    /// `uninstall` of a unit that is not there.
    #[error("the unit {} does not exist", .0.display())]
    NotInstalled(PathBuf),
    /// `start`, `stop`, `restart` or `status` on a host where systemd is not the running init.
    #[error("systemd is not running on this host (systemctl is-system-running: {state}); start `runway run` from the init system in use")]
    SystemdNotRunning {
        /// What `systemctl is-system-running` said.
        state: String,
    },
    /// `systemctl` could not be run or failed.
    #[error("{command}: {detail}")]
    Systemctl {
        /// The command line.
        command: String,
        /// Its exit status and error output, or why it could not start.
        detail: String,
    },
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// config.toml does not load.
    #[error("{0}")]
    Config(#[from] config::ConfigError),
}

/// The unit's path for service `name` under `root`.
pub(super) fn unit_path(root: &Path, name: &str) -> PathBuf {
    root.join("etc/systemd/system").join(format!("{name}.service"))
}

/// `run` and what gitlab-runner's `GetServiceArguments` (and its Linux `--user`) builds:
/// `run --config C [--working-directory D] [--service N] [--syslog] [--user U]`.
pub(super) fn service_arguments(
    config: &Path,
    working_directory: Option<&Path>,
    service: &str,
    syslog: bool,
    user: Option<&str>,
) -> Vec<String> {
    let mut args = vec!["run".to_string(), "--config".into(), config.display().to_string()];
    if let Some(dir) = working_directory.filter(|d| !d.as_os_str().is_empty()) {
        args.extend(["--working-directory".into(), dir.display().to_string()]);
    }
    if !service.is_empty() {
        args.extend(["--service".into(), service.to_string()]);
    }
    if syslog {
        args.push("--syslog".into());
    }
    if let Some(user) = user.filter(|u| !u.is_empty()) {
        args.extend(["--user".into(), user.to_string()]);
    }
    args
}

/// A path as kardianos' `cmdEscape` writes it (spaces as `\x20`), with systemd's specifier `%`
/// escaped too.
fn path_escape(path: &Path) -> String {
    path.display().to_string().replace('%', "%%").replace(' ', "\\x20")
}

/// An argument as kardianos' `cmd` writes it (double-quoted), with what systemd would still
/// expand inside quotes (`\`, `%`, `$`) escaped.
fn quote(arg: &str) -> String {
    let escaped = arg.replace('\\', "\\\\").replace('"', "\\\"").replace('%', "%%").replace('$', "$$");
    format!("\"{escaped}\"")
}

/// The unit for service `name` running `exec` with `arguments`, as user `user_name` when given.
pub(super) fn unit_text(name: &str, exec: &Path, arguments: &[String], user_name: Option<&str>) -> String {
    let exec = path_escape(exec);
    let args: String = arguments.iter().map(|a| format!(" {}", quote(a))).collect();
    let user = user_name.map(|u| format!("User={u}\n")).unwrap_or_default();
    format!(
        "[Unit]\n\
         Description={DESCRIPTION}\n\
         ConditionFileIsExecutable={exec}\n\
         After=network.target\n\
         \n\
         [Service]\n\
         StartLimitInterval=5\n\
         StartLimitBurst=10\n\
         ExecStart={exec}{args}\n\
         {user}\
         Restart=always\n\
         RestartSec=120\n\
         EnvironmentFile=-/etc/sysconfig/{name}\n\
         # Runway: SIGQUIT to the manager only stops it gracefully (running jobs finish); what\n\
         # is still running after TimeoutStopSec is killed.\n\
         KillSignal=SIGQUIT\n\
         KillMode=mixed\n\
         TimeoutStopSec={TIMEOUT_STOP_SEC}\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n"
    )
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The home directory of `user` from the password database.
fn home_of(user: &str) -> Result<PathBuf, ServiceError> {
    let path = Path::new("/etc/passwd");
    let passwd = std::fs::read_to_string(path).map_err(|source| ServiceError::Io { path: path.into(), source })?;
    passwd
        .lines()
        .map(|line| line.split(':').collect::<Vec<_>>())
        .find(|fields| fields.first() == Some(&user) && fields.len() >= 6)
        .map(|fields| PathBuf::from(fields[5]))
        .ok_or_else(|| ServiceError::UnknownUser(user.into()))
}

/// What one `systemctl` call printed.
struct Called {
    ok: bool,
    stdout: String,
    /// The command line.
    command: String,
    /// Its exit status and error output.
    detail: String,
}

impl Systemd {
    /// Run `systemctl ARGS`.
    fn call(&self, args: &[&str]) -> Result<Called, ServiceError> {
        let mut words = shell_words::split(&self.systemctl).unwrap_or_else(|_| vec![self.systemctl.clone()]);
        words.extend(args.iter().map(|a| a.to_string()));
        let command = words.join(" ");
        let Some((program, rest)) = words.split_first() else {
            return Err(ServiceError::Systemctl { command, detail: "no program".into() });
        };
        let output = std::process::Command::new(program)
            .args(rest)
            .output()
            .map_err(|e| ServiceError::Systemctl { command: command.clone(), detail: e.to_string() })?;
        Ok(Called {
            ok: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout).trim().to_string(),
            detail: format!("{}: {}", output.status, String::from_utf8_lossy(&output.stderr).trim()),
            command,
        })
    }

    /// Run `systemctl ARGS`, failing when it fails.
    fn run(&self, args: &[&str]) -> Result<(), ServiceError> {
        let called = self.call(args)?;
        match called.ok {
            true => Ok(()),
            false => Err(ServiceError::Systemctl { command: called.command, detail: called.detail }),
        }
    }

    /// `Err(SystemdNotRunning)` unless systemd is the running init (`offline`: not booted).
    fn running(&self) -> Result<(), ServiceError> {
        let state = self.call(&["is-system-running"])?.stdout;
        match state.as_str() {
            "offline" | "" => Err(ServiceError::SystemdNotRunning { state }),
            _ => Ok(()),
        }
    }
}

/// `runway install`: write the unit, enable it, and have a running systemd read it.
pub(super) fn install(
    args: InstallArgs,
    config_arg: Option<&Path>,
    config_default: &Path,
) -> Result<ExitCode, ServiceError> {
    let (user, init_user) = (args.user.as_deref(), args.init_user.as_deref());
    if user.is_some() && init_user.is_some() {
        return Err(ServiceError::UserAndInitUser);
    }
    let root = is_root();
    if root && user.is_none() && init_user.is_none() {
        return Err(ServiceError::NoUser);
    }
    if !root {
        if user.is_some() {
            return Err(ServiceError::RootOnly("user"));
        }
        if init_user.is_some() {
            return Err(ServiceError::RootOnly("init-user"));
        }
    }
    let config = match (config_arg, init_user) {
        (Some(path), _) => path.to_path_buf(),
        (None, Some(init_user)) => home_of(init_user)?.join("config.toml"),
        (None, None) => config_default.to_path_buf(),
    };
    let cwd = std::env::current_dir().map_err(|source| ServiceError::Io { path: ".".into(), source })?;
    // Absolute, so the service finds it whatever its working directory.
    let config = cwd.join(config);
    prepare_config(&config)?;
    let working_directory = args.working_directory.map(|d| cwd.join(d)).unwrap_or(cwd);
    let name = &args.common.service;
    let arguments = service_arguments(&config, Some(&working_directory), name, args.syslog, user);
    let exec = std::env::current_exe().map_err(|source| ServiceError::Io { path: "/proc/self/exe".into(), source })?;
    let path = unit_path(&args.common.systemd.root, name);
    if path.exists() {
        return Err(ServiceError::AlreadyInstalled(path));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| ServiceError::Io { path: dir.into(), source })?;
    }
    let text = unit_text(name, &exec, &arguments, init_user);
    std::fs::write(&path, text).map_err(|source| ServiceError::Io { path: path.clone(), source })?;
    let systemd = &args.common.systemd;
    if let Err(e) = systemd.run(&["enable", &format!("{name}.service")]) {
        // Nothing half-installed: the unit goes again.
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    match systemd.running() {
        Ok(()) => systemd.run(&["daemon-reload"])?,
        Err(ServiceError::SystemdNotRunning { state }) => {
            tracing::warn!(state, "systemd is not running: the unit is enabled and is read when systemd starts")
        }
        Err(e) => return Err(e),
    }
    println!("{name}: installed {}", path.display());
    Ok(ExitCode::SUCCESS)
}

/// config.toml must load; a missing one is written empty, as gitlab-runner does.
fn prepare_config(config: &Path) -> Result<(), ServiceError> {
    if config.exists() {
        config::load(config)?;
        return Ok(());
    }
    if let Some(dir) = config.parent() {
        std::fs::create_dir_all(dir).map_err(|source| ServiceError::Io { path: dir.into(), source })?;
    }
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(config)
        .and_then(|mut f| f.write_all(EMPTY_CONFIG.as_bytes()))
        .map_err(|source| ServiceError::Io { path: config.into(), source })
}

/// `runway uninstall`: disable the unit and remove it.
pub(super) fn uninstall(args: &ServiceArgs) -> Result<ExitCode, ServiceError> {
    let path = unit_path(&args.systemd.root, &args.service);
    if !path.exists() {
        return Err(ServiceError::NotInstalled(path));
    }
    args.systemd.run(&["disable", &format!("{}.service", args.service)])?;
    std::fs::remove_file(&path).map_err(|source| ServiceError::Io { path: path.clone(), source })?;
    if args.systemd.running().is_ok() {
        args.systemd.run(&["daemon-reload"])?;
    }
    println!("{}: uninstalled {}", args.service, path.display());
    Ok(ExitCode::SUCCESS)
}

/// `runway start`, `stop` or `restart` (`verb`): systemctl's, once systemd is known to run.
pub(super) fn control(verb: &str, args: &ServiceArgs) -> Result<ExitCode, ServiceError> {
    args.systemd.running()?;
    args.systemd.run(&[verb, &format!("{}.service", args.service)])?;
    Ok(ExitCode::SUCCESS)
}

/// `runway status`: gitlab-runner's lines (`NAME: Service is running` on standard output and
/// exit 0; otherwise why not on standard error and exit 1).
pub(super) fn status(args: &ServiceArgs) -> Result<ExitCode, ServiceError> {
    let name = &args.service;
    let path = unit_path(&args.systemd.root, name);
    let installed = match path.exists() {
        true => format!("the unit {} is installed", path.display()),
        false => format!("the unit {} is not installed", path.display()),
    };
    if let Err(e) = args.systemd.running() {
        eprintln!("{name}: {e}; {installed}");
        return Ok(ExitCode::from(1));
    }
    let state = args.systemd.call(&["is-active", name])?.stdout;
    let description = match state.as_str() {
        s if s.starts_with("active") || s.starts_with("activating") => {
            println!("{name}: Service is running");
            return Ok(ExitCode::SUCCESS);
        }
        s if s.starts_with("inactive") => {
            let units = args.systemd.call(&["list-unit-files", "-t", "service", name])?.stdout;
            match units.contains(name.as_str()) {
                true => "Service has stopped".to_string(),
                false => format!("Service is not installed; {installed}"),
            }
        }
        s if s.starts_with("failed") => "service in failed state".to_string(),
        other => format!("Service status unknown ({other}); {installed}"),
    };
    eprintln!("{name}: {description}");
    Ok(ExitCode::from(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_gitlab_runners() {
        let args =
            service_arguments(Path::new("/etc/c.toml"), Some(Path::new("/home/g")), "gitlab-runner", false, None);
        assert_eq!(
            args,
            ["run", "--config", "/etc/c.toml", "--working-directory", "/home/g", "--service", "gitlab-runner"]
        );
        let args = service_arguments(Path::new("c.toml"), None, "", true, Some("u"));
        assert_eq!(args, ["run", "--config", "c.toml", "--syslog", "--user", "u"]);
    }

    #[test]
    fn the_unit_quotes_what_systemd_would_expand() {
        let unit = unit_text("svc", Path::new("/opt/my dir/runway"), &["a\"b".into(), "50%$HOME".into()], Some("gl"));
        assert!(unit.contains("ConditionFileIsExecutable=/opt/my\\x20dir/runway\n"), "{unit}");
        assert!(unit.contains("ExecStart=/opt/my\\x20dir/runway \"a\\\"b\" \"50%%$$HOME\"\n"), "{unit}");
        assert!(unit.contains("\nUser=gl\n") && unit.contains("EnvironmentFile=-/etc/sysconfig/svc\n"), "{unit}");
        assert!(!unit_text("svc", Path::new("/r"), &[], None).contains("User="));
    }
}
