//! `runway register` as gitlab-runner's `commands/register.go` runs it: every `[[runners]]`
//! flag and environment variable of gitlab-runner (`register_flags`), its own flags
//! (`--registration-token`, `--tag-list`, `--template-config`, `--leave-runner`, `-n` …),
//! prompts on a terminal, and the entry written with the values gitlab-runner writes.
//!
//! Owns: the order of questions, the GitLab calls of registration and the new entry. Must
//! not touch: other entries of config.toml (appended through `config::edit`).

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use toml::{Table, Value};

use super::register_flags::{self as flags, RunnerFlags};
use super::{runners, setup};
use crate::config::{self, RunnerConfig};
use crate::gitlab::client::{RegisterParams, RunnerCredentials};

/// `runway register` flags: gitlab-runner's `RegisterCommand` ones here, the entry's in
/// [`RunnerFlags`].
#[derive(Args, Debug)]
pub struct RegisterArgs {
    /// Configuration template merged into the entry (fills what flags left empty).
    #[arg(long = "template-config", env = "TEMPLATE_CONFIG_FILE")]
    pub template_config: Option<PathBuf>,
    /// Legacy tokens only: comma-separated tags.
    #[arg(long, env = "RUNNER_TAG_LIST")]
    pub tag_list: Option<String>,
    /// Run registration unattended (never prompt).
    #[arg(short = 'n', long, env = "REGISTER_NON_INTERACTIVE", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub non_interactive: Option<String>,
    /// Don't remove the runner from GitLab if registration fails.
    #[arg(long, env = "REGISTER_LEAVE_RUNNER", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub leave_runner: Option<String>,
    /// Runner's registration token (deprecated, use --token).
    #[arg(short = 'r', long, env = "REGISTRATION_TOKEN")]
    pub registration_token: Option<String>,
    /// Legacy tokens only: run jobs without tags (true when --tag-list is empty).
    #[arg(long, env = "REGISTER_RUN_UNTAGGED", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub run_untagged: Option<String>,
    /// Legacy tokens only: lock the runner to its project (default true).
    #[arg(long, env = "REGISTER_LOCKED", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub locked: Option<String>,
    /// Legacy tokens only: not_protected or ref_protected.
    #[arg(long, env = "REGISTER_ACCESS_LEVEL")]
    pub access_level: Option<String>,
    /// Legacy tokens only: maximum job timeout in seconds.
    #[arg(long, env = "REGISTER_MAXIMUM_TIMEOUT")]
    pub maximum_timeout: Option<i64>,
    /// Legacy tokens only: register paused.
    #[arg(long, env = "REGISTER_PAUSED", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub paused: Option<String>,
    /// Legacy tokens only: maintenance note.
    #[arg(long, env = "REGISTER_MAINTENANCE_NOTE")]
    pub maintenance_note: Option<String>,
    /// Every `[[runners]]` flag of gitlab-runner (`--url`, `--token`, `--executor`,
    /// `--docker-*`, `--kubernetes-*`, `--cache-*`, `--ssh-*` …).
    #[command(flatten)]
    pub runner: RunnerFlags,
}

fn bool_flag(name: &str, value: Option<&str>, default: bool) -> anyhow::Result<bool> {
    match value {
        None => Ok(default),
        Some(v) => flags::go_bool(v).ok_or_else(|| anyhow::anyhow!("--{name}: {v:?} is not a bool")),
    }
}

/// gitlab-runner's `ask`: the current value, or a prompt on a terminal (unless -n).
struct Asker {
    interactive: bool,
}

impl Asker {
    fn ask(&self, key: &str, prompt: &str, current: &str, allow_empty: bool) -> anyhow::Result<String> {
        let current = current.trim().to_string();
        if !self.interactive {
            if current.is_empty() && !allow_empty {
                anyhow::bail!("The {key} needs to be entered");
            }
            return Ok(current);
        }
        let stdin = std::io::stdin();
        loop {
            println!("{prompt}");
            if !current.is_empty() {
                print!("[{current}]: ");
            }
            let _ = std::io::stdout().flush();
            let mut line = String::new();
            if stdin.lock().read_line(&mut line)? == 0 {
                anyhow::bail!("Unexpected EOF. Did you mean to use --non-interactive?");
            }
            let line = line.trim();
            if !line.is_empty() {
                return Ok(line.to_string());
            }
            if allow_empty || !current.is_empty() {
                return Ok(current);
            }
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "runway".into())
}

fn get_str<'a>(entry: &'a Table, path: &str) -> &'a str {
    path.split('.')
        .try_fold(None::<&Value>, |at, key| match at {
            None => entry.get(key).map(Some),
            Some(v) => v.get(key).map(Some),
        })
        .flatten()
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn set_str(entry: &mut Table, path: &str, value: String) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let Some(leaf) = parts.pop() else { return };
    let mut table = entry;
    for key in parts {
        let Some(t) = table.entry(key).or_insert_with(|| Value::Table(Table::new())).as_table_mut() else { return };
        table = t;
    }
    table.insert(leaf.to_string(), Value::String(value));
}

/// gitlab-runner's `configTemplate.MergeTo`: exactly one `[[runners]]` entry, its token dropped.
fn template_entry(path: &Path) -> anyhow::Result<Table> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("couldn't load configuration template file {}: {e}", path.display()))?;
    let doc: Table = text
        .parse()
        .map_err(|e| anyhow::anyhow!("couldn't load configuration template file {}: {e}", path.display()))?;
    let runners = doc.get("runners").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let [Value::Table(entry)] = runners else {
        anyhow::bail!("configuration template must contain exactly one [[runners]] entry");
    };
    let mut entry = entry.clone();
    entry.remove("token");
    Ok(entry)
}

/// The Docker volumes gitlab-runner's `askDocker` adds: `/cache` unless a volume already
/// mounts it or `disable_cache` is set.
fn add_cache_volume(entry: &mut Table) {
    let Some(docker) = entry.get_mut("docker").and_then(Value::as_table_mut) else { return };
    let volumes = docker.get("volumes").and_then(Value::as_array).cloned().unwrap_or_default();
    let mounted = volumes.iter().filter_map(Value::as_str).any(|v| v.rsplit(':').next() == Some("/cache"));
    let disabled = docker.get("disable_cache").and_then(Value::as_bool).unwrap_or(false);
    if !mounted && !disabled {
        let mut volumes = volumes;
        volumes.push(Value::String("/cache".into()));
        docker.insert("volumes".into(), Value::Array(volumes));
    }
}

/// `runway register`: verify a glrt- token (or register with a legacy token) and append the
/// entry gitlab-runner would write to config.toml.
pub(crate) async fn register(args: RegisterArgs, path: &Path) -> anyhow::Result<ExitCode> {
    let non_interactive = bool_flag("non-interactive", args.non_interactive.as_deref(), false)?;
    let asker = Asker { interactive: !non_interactive && std::io::stdin().is_terminal() };
    if let Some(level) = args.access_level.as_deref().filter(|l| !l.is_empty()) {
        if level != "not_protected" && level != "ref_protected" {
            anyhow::bail!("Given access-level is not valid. Refer to runway register -h for the correct options.");
        }
    }
    let mut entry = Table::new();
    flags::apply(&args.runner, &mut entry)?;
    if get_str(&entry, "name").is_empty() {
        entry.insert("name".into(), Value::String(hostname()));
    }
    if let Some(template) = &args.template_config {
        eprintln!("Merging configuration from template file {:?}", template.display().to_string());
        flags::merge_template(&mut entry, &template_entry(template)?);
    }
    let loaded = runners::load_or_new(path)?;
    let system_id = config::system_id(&runners::config_dir(path))?;

    let url = asker.ask(
        "url",
        "Enter the GitLab instance URL (for example, https://gitlab.com/):",
        get_str(&entry, "url"),
        false,
    )?;
    set_str(&mut entry, "url", url.clone());
    let api_url = url.trim_end_matches('/').to_string();
    let mut token = get_str(&entry, "token").to_string();
    if token.is_empty() || !token.starts_with("glrt-") {
        if token.is_empty() {
            token = args.registration_token.clone().unwrap_or_default();
        }
        token = asker.ask("registration-token", "Enter the registration token:", &token, false)?;
    }
    let legacy = !token.starts_with("glrt-");
    let locked = bool_flag("locked", args.locked.as_deref(), true)?;
    let paused = bool_flag("paused", args.paused.as_deref(), false)?;
    let mut run_untagged = bool_flag("run-untagged", args.run_untagged.as_deref(), false)?;
    let leave_runner = bool_flag("leave-runner", args.leave_runner.as_deref(), false)?;

    let mut probe = RunnerConfig::new(get_str(&entry, "name"), &api_url, &token, "shell");
    probe.tls_ca_file = Some(get_str(&entry, "tls-ca-file")).filter(|s| !s.is_empty()).map(PathBuf::from);
    probe.tls_cert_file = Some(get_str(&entry, "tls-cert-file")).filter(|s| !s.is_empty()).map(PathBuf::from);
    probe.tls_key_file = Some(get_str(&entry, "tls-key-file")).filter(|s| !s.is_empty()).map(PathBuf::from);
    let client = setup::client_for(&probe, &config::tls::certs_dir(path), None)?;
    let info = runners::runner_info(&loaded, &probe).await;
    let details = if legacy {
        let name = asker.ask("name", "Enter a description for the runner:", get_str(&entry, "name"), false)?;
        entry.insert("name".into(), Value::String(name.clone()));
        let tags = asker.ask(
            "tag-list",
            "Enter tags for the runner (comma-separated):",
            args.tag_list.as_deref().unwrap_or(""),
            true,
        )?;
        let note = asker.ask(
            "maintenance-note",
            "Enter optional maintenance note for the runner:",
            args.maintenance_note.as_deref().unwrap_or(""),
            true,
        )?;
        run_untagged |= tags.is_empty();
        eprintln!("WARNING: Support for registration tokens and runner parameters in the 'register' command has been deprecated in GitLab Runner 15.6; create the runner in GitLab and use its glrt- token");
        let params = RegisterParams {
            description: name,
            maintenance_note: note,
            tags: tags.split(',').map(str::trim).filter(|t| !t.is_empty()).map(str::to_string).collect(),
            run_untagged,
            locked,
            access_level: args.access_level.clone().unwrap_or_default(),
            maximum_timeout: args.maximum_timeout.unwrap_or(0),
            paused,
        };
        client.register_legacy(&api_url, &token, &params, &info).await?
    } else {
        let server_args = !locked
            || args.access_level.as_deref().is_some_and(|s| !s.is_empty())
            || run_untagged
            || args.maximum_timeout.is_some_and(|t| t != 0)
            || paused
            || args.tag_list.as_deref().is_some_and(|s| !s.is_empty())
            || args.maintenance_note.as_deref().is_some_and(|s| !s.is_empty());
        if server_args {
            if args.registration_token.as_deref() == Some(token.as_str()) {
                eprintln!("WARNING: You have specified an authentication token in the legacy parameter --registration-token; --locked, --access-level, --run-untagged, --maximum-timeout, --paused, --tag-list and --maintenance-note are ignored");
            } else {
                anyhow::bail!("Runner configuration other than name and executor configuration is reserved (specifically --locked, --access-level, --run-untagged, --maximum-timeout, --paused, --tag-list, and --maintenance-note) and cannot be specified when registering with a runner authentication token. This configuration is specified on the GitLab server.");
            }
        }
        let creds = RunnerCredentials { url: api_url.clone(), token: token.clone(), system_id: system_id.clone() };
        let details = client.verify(&creds, &info).await?;
        if details.id == 0 {
            anyhow::bail!("Failed to verify the runner.");
        }
        let name = asker.ask(
            "name",
            "Enter a name for the runner. This is stored only in the local config.toml file:",
            get_str(&entry, "name"),
            false,
        )?;
        entry.insert("name".into(), Value::String(name));
        details
    };
    let token = if details.token.is_empty() { token } else { details.token.clone() };
    let finish = async {
        finish_entry(&mut entry, &asker)?;
        entry.insert("id".into(), Value::Integer(details.id));
        entry.insert("token".into(), Value::String(token.clone()));
        let now = setup::now_in_seconds().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let expires = details
            .token_expires_at
            .map(|at| at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_else(|| "0001-01-01T00:00:00Z".into());
        for (key, at) in [("token_obtained_at", now), ("token_expires_at", expires)] {
            let parsed: Table = format!("v = {at}").parse()?;
            if let Some(v) = parsed.get("v") {
                entry.insert(key.into(), v.clone());
            }
        }
        config::edit::add_runner_table(path, ordered(&entry, "")?)?;
        anyhow::Ok(())
    };
    if let Err(e) = finish.await {
        if !leave_runner {
            let creds = RunnerCredentials { url: api_url.clone(), token: token.clone(), system_id };
            let _ =
                if legacy { client.unregister_runner(&creds).await } else { client.unregister_manager(&creds).await };
        }
        return Err(e);
    }
    println!("Runner registered successfully (id {}). Config written to {}", details.id, path.display());
    Ok(ExitCode::SUCCESS)
}

/// `askExecutor` and `askExecutorOptions`: the executor, its sections and their questions,
/// then the zero values gitlab-runner writes.
fn finish_entry(entry: &mut Table, asker: &Asker) -> anyhow::Result<()> {
    let executor = asker.ask(
        "executor",
        "Enter an executor: custom, shell, ssh, docker, docker-autoscaler, docker+machine, kubernetes, instance:",
        get_str(entry, "executor"),
        true,
    )?;
    // Runway's default where gitlab-runner insists on an answer.
    let executor = if executor.is_empty() { "shell".to_string() } else { executor };
    entry.insert("executor".into(), Value::String(executor.clone()));
    flags::keep_executor_sections(entry, &executor);
    match executor.as_str() {
        "docker" | "docker-autoscaler" | "docker+machine" => {
            let image = asker.ask(
                "docker-image",
                "Enter the default Docker image (for example, ruby:3.3):",
                get_str(entry, "docker.image"),
                false,
            )?;
            set_str(entry, "docker.image", image);
            add_cache_volume(entry);
        }
        "ssh" => {
            for (key, path, prompt, empty) in [
                ("ssh-host", "ssh.host", "Enter the SSH server address (for example, my.server.com):", false),
                ("ssh-port", "ssh.port", "Enter the SSH server port (for example, 22):", true),
                ("ssh-user", "ssh.user", "Enter the SSH user (for example, root):", false),
                ("ssh-password", "ssh.password", "Enter the SSH password (for example, docker.io):", true),
                (
                    "ssh-identity-file",
                    "ssh.identity_file",
                    "Enter the path to the SSH identity file (for example, /home/user/.ssh/id_rsa):",
                    true,
                ),
            ] {
                let value = asker.ask(key, prompt, get_str(entry, path), empty)?;
                if !value.is_empty() {
                    set_str(entry, path, value);
                }
            }
        }
        _ => {}
    }
    flags::fill_zero_values(entry, &executor);
    Ok(())
}

/// The entry as a `toml_edit` table with its keys in gitlab-runner's field order (the
/// generated table's), every sub-table written as a `[runners.x]` section as its encoder does.
fn ordered(entry: &Table, prefix: &str) -> anyhow::Result<toml_edit::Table> {
    let rank = |key: &str| flags::specs().iter().position(|s| s.path == format!("{prefix}{key}")).unwrap_or(usize::MAX);
    let mut items: Vec<(&String, &Value)> = entry.iter().collect();
    items.sort_by_key(|(k, v)| (matches!(v, Value::Table(_)), rank(k)));
    let mut out = toml_edit::Table::new();
    out.set_implicit(false);
    for (key, value) in items {
        let item = match value {
            Value::Table(t) => toml_edit::Item::Table(ordered(t, &format!("{prefix}{key}."))?),
            other => toml_edit::Item::Value(other.to_string().parse::<toml_edit::Value>()?),
        };
        out.insert(key, item);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use crate::cli::{Cli, Command};

    #[test]
    fn gitlab_runner_command_lines_parse() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from([
            "runway",
            "--debug",
            "-l",
            "warn",
            "register",
            "-n",
            "-u",
            "https://gitlab.example.com/",
            "-t",
            "glrt-abc",
            "-r",
            "legacy",
            "--docker-image",
            "alpine",
            "--docker-privileged",
            "--leave-runner",
            "--locked=false",
            "--template-config",
            "/etc/template.toml",
        ])
        .expect("parses");
        assert!(cli.debug);
        assert_eq!(cli.log_level.as_deref(), Some("warn"));
        let Command::Register(args) = cli.command else { panic!("register") };
        assert_eq!(args.non_interactive.as_deref(), Some("true"));
        assert_eq!(args.leave_runner.as_deref(), Some("true"));
        assert_eq!(args.locked.as_deref(), Some("false"));
        assert_eq!(args.registration_token.as_deref(), Some("legacy"));
        assert_eq!(args.template_config.as_deref(), Some(std::path::Path::new("/etc/template.toml")));
        let given: Vec<(&str, &[String])> = args.runner.given.iter().map(|(s, v)| (s.path, v.as_slice())).collect();
        for (path, value) in [
            ("url", "https://gitlab.example.com/"),
            ("token", "glrt-abc"),
            ("docker.image", "alpine"),
            ("docker.privileged", "true"),
        ] {
            assert!(given.iter().any(|(p, v)| *p == path && v.last().map(String::as_str) == Some(value)), "{path}");
        }

        let cli = Cli::try_parse_from(["runway", "verify", "--delete", "-n", "a", "-u", "https://g/", "-t", "glrt-t"])
            .expect("verify");
        let Command::Verify(v) = cli.command else { panic!("verify") };
        assert!(v.delete);
        assert_eq!(
            (v.name.as_deref(), v.url.as_deref(), v.token.as_deref()),
            (Some("a"), Some("https://g/"), Some("glrt-t"))
        );
        let cli =
            Cli::try_parse_from(["runway", "unregister", "--all-runners", "-n", "a", "-u", "https://g/", "-t", "x"])
                .expect("unregister");
        let Command::Unregister(u) = cli.command else { panic!("unregister") };
        assert!(u.all_runners);
        assert_eq!(
            (u.name.as_deref(), u.url.as_deref(), u.token.as_deref()),
            (Some("a"), Some("https://g/"), Some("x"))
        );
    }
}
