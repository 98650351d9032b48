//! The custom executor: GitLab Runner's `[runners.custom]` drivers, run unchanged. Per job:
//!
//! 1. `config_exec` (optional): its standard output is JSON (`builds_dir`, `cache_dir`,
//!    `builds_dir_is_shared`, `hostname`, `driver {name, version}`, `job_env`, `shell`); the
//!    directories, host name and shell move the job (`runway:host/job-config`), `job_env` is
//!    added to the environment of every later driver call;
//! 2. `prepare_exec` (optional);
//! 3. `run_exec <run_args...> <script path> <stage name>` once per stage (`step_script` is
//!    passed as `build_script`, as GitLab does);
//! 4. `cleanup_exec` (optional), whatever happened before.
//!
//! Every driver runs in a temporary directory of the job (also its `TMPDIR`) with
//! `BUILD_FAILURE_EXIT_CODE`, `SYSTEM_FAILURE_EXIT_CODE`, `BUILD_EXIT_CODE_FILE`,
//! `JOB_RESPONSE_FILE` (the job's JSON, mode 0600) and every job
//! variable as `CUSTOM_ENV_<name>` (`CUSTOM_ENV_CI_JOB_SERVICES` included). Exit code
//! `BUILD_FAILURE_EXIT_CODE` (1) is a script failure (with the code written to
//! `BUILD_EXIT_CODE_FILE` when there is one), `SYSTEM_FAILURE_EXIT_CODE` (2) a system failure,
//! anything else an unknown failure (a system failure too). A driver that outlives its
//! `*_exec_timeout`, the job's timeout or a cancel gets SIGTERM, then SIGKILL after
//! `graceful_kill_timeout`, and is given up after `force_kill_timeout`
//! (`runway:host/supervisor`).

use std::cell::Cell;

use runway_sdk::executor::*;
use runway_sdk::job_config::{self, Overrides};
use runway_sdk::process::{Command, ProcessError as PlainProcessError};
use runway_sdk::remote::{self, quote};
use runway_sdk::supervisor::{Outcome, ProcessError, Supervised};

struct Custom;

/// GitLab Runner's exit codes of the driver protocol.
const BUILD_FAILURE_EXIT_CODE: i32 = 1;
const SYSTEM_FAILURE_EXIT_CODE: i32 = 2;
/// Defaults of `*_exec_timeout` (GitLab: one hour), `graceful_kill_timeout` (ten minutes)
/// and `force_kill_timeout` (ten seconds).
const DEFAULT_EXEC_TIMEOUT: u32 = 3600;
const DEFAULT_GRACEFUL_KILL: u32 = 600;
const DEFAULT_FORCE_KILL: u32 = 10;
/// Most bytes of `config_exec` output read.
const CONFIG_OUTPUT_MAX: u32 = 1 << 20;

/// `[runners.custom]`, as GitLab Runner's `CustomConfig`.
#[derive(serde::Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    config_exec: String,
    #[serde(default)]
    config_args: Vec<String>,
    #[serde(default)]
    config_exec_timeout: Option<i64>,
    #[serde(default)]
    prepare_exec: String,
    #[serde(default)]
    prepare_args: Vec<String>,
    #[serde(default)]
    prepare_exec_timeout: Option<i64>,
    #[serde(default)]
    run_exec: String,
    #[serde(default)]
    run_args: Vec<String>,
    #[serde(default)]
    cleanup_exec: String,
    #[serde(default)]
    cleanup_args: Vec<String>,
    #[serde(default)]
    cleanup_exec_timeout: Option<i64>,
    #[serde(default)]
    graceful_kill_timeout: Option<i64>,
    #[serde(default)]
    force_kill_timeout: Option<i64>,
}

/// A configured timeout in seconds: unset or ≤ 0 means the default (as GitLab reads them).
fn seconds(value: Option<i64>, default: u32) -> u32 {
    match value {
        Some(s) if s > 0 => u32::try_from(s).unwrap_or(u32::MAX),
        _ => default,
    }
}

fn parse_config(config: &str) -> Result<Config, ExecutorError> {
    let config: Config = if config.trim().is_empty() {
        Config::default()
    } else {
        serde_json::from_str(config).map_err(|e| ExecutorError::InvalidConfig(format!("[runners.custom]: {e}")))?
    };
    if config.run_exec.is_empty() {
        return Err(ExecutorError::InvalidConfig(
            "custom executor is missing RunExec ([runners.custom] run_exec)".into(),
        ));
    }
    Ok(config)
}

/// What `config_exec` may print (GitLab's `ConfigExecOutput`).
#[derive(serde::Deserialize, Default)]
struct ConfigOutput {
    driver: Option<Driver>,
    hostname: Option<String>,
    builds_dir: Option<String>,
    cache_dir: Option<String>,
    builds_dir_is_shared: Option<bool>,
    job_env: Option<std::collections::BTreeMap<String, String>>,
    shell: Option<String>,
}

#[derive(serde::Deserialize)]
struct Driver {
    name: Option<String>,
    version: Option<String>,
}

/// One job's environment: the drivers' temporary directory and what every driver call gets.
/// Drivers die with the runner, so it cannot be resumed (no `state`).
struct CustomEnvironment {
    config: Config,
    temp_dir: String,
    /// `job_env` of `config_exec`, then `CUSTOM_ENV_*`.
    env: Vec<(String, String)>,
    /// Stage scripts written so far (names the next one's directory).
    scripts: Cell<u32>,
    /// `JOB_RESPONSE_FILE`, when the host gave the job's JSON.
    response_file: Option<String>,
}

fn plain_error(e: PlainProcessError) -> ExecutorError {
    match e {
        PlainProcessError::Canceled | PlainProcessError::TimedOut => ExecutorError::Canceled,
        PlainProcessError::NotPermitted(m) => ExecutorError::InvalidConfig(format!("{GRANT_NEEDED}: {m}")),
        PlainProcessError::SpawnFailed(m) => ExecutorError::Unavailable(m),
        PlainProcessError::Other(m) => ExecutorError::Other(m),
    }
}

const GRANT_NEEDED: &str = "the custom executor needs `allow_process = true` in its [plugins.custom] grant";

/// The `CUSTOM_ENV_CI_JOB_SERVICES` value: the job's services as GitLab serializes them, or
/// empty without services.
fn services_json(details: &runway_sdk::job::JobDetails) -> String {
    if details.services.is_empty() {
        return String::new();
    }
    let list = |v: &Vec<String>| if v.is_empty() { serde_json::Value::Null } else { serde_json::json!(v) };
    let services: Vec<serde_json::Value> = details
        .services
        .iter()
        .map(|s| {
            let mut service = serde_json::json!({
                "name": s.name,
                "alias": s.aliases.first().cloned().unwrap_or_default(),
                "entrypoint": list(&s.entrypoint),
                "command": list(&s.command),
            });
            if !s.variables.is_empty() {
                let vars: serde_json::Map<String, serde_json::Value> =
                    s.variables.iter().map(|v| (v.key.clone(), serde_json::Value::String(v.value.clone()))).collect();
                service["variables"] = serde_json::Value::Object(vars);
            }
            service
        })
        .collect();
    serde_json::to_string(&services).unwrap_or_default()
}

/// `CUSTOM_ENV_<key>` for every variable, then `CUSTOM_ENV_CI_JOB_SERVICES`.
fn custom_env(variables: &[(String, String)], services: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> =
        variables.iter().map(|(k, v)| (format!("CUSTOM_ENV_{k}"), v.clone())).collect();
    env.push(("CUSTOM_ENV_CI_JOB_SERVICES".into(), services.to_string()));
    env
}

impl CustomEnvironment {
    fn exit_code_file(&self) -> String {
        format!("{}/build_exit_code", self.temp_dir)
    }

    /// A driver call: in the temporary directory, with GitLab's variables.
    fn driver(&self, program: &str, args: &[String]) -> Supervised {
        let graceful = seconds(self.config.graceful_kill_timeout, DEFAULT_GRACEFUL_KILL);
        let force = seconds(self.config.force_kill_timeout, DEFAULT_FORCE_KILL);
        Supervised::new(program, graceful, force)
            .args(args.iter().cloned())
            .current_dir(self.temp_dir.clone())
            .envs([
                ("TMPDIR".to_string(), self.temp_dir.clone()),
                ("BUILD_FAILURE_EXIT_CODE".into(), BUILD_FAILURE_EXIT_CODE.to_string()),
                ("SYSTEM_FAILURE_EXIT_CODE".into(), SYSTEM_FAILURE_EXIT_CODE.to_string()),
                ("BUILD_EXIT_CODE_FILE".into(), self.exit_code_file()),
            ])
            .envs(self.response_file.iter().map(|f| ("JOB_RESPONSE_FILE".to_string(), f.clone())))
            .envs(self.env.iter().cloned())
    }

    /// What a driver's end means: `Ok(code)` for success (0) or a build failure (the code the
    /// driver wrote to `BUILD_EXIT_CODE_FILE`, else 1); `Err` for a system or unknown failure.
    fn settle(&self, what: &str, result: Result<Outcome, ProcessError>) -> Result<i32, ExecutorError> {
        let outcome = result.map_err(|e| match e {
            ProcessError::Canceled | ProcessError::TimedOut => ExecutorError::Canceled,
            ProcessError::NotPermitted(m) => ExecutorError::InvalidConfig(format!("{GRANT_NEEDED}: {m}")),
            ProcessError::SpawnFailed(m) => ExecutorError::Unavailable(format!("{what}: {m}")),
            ProcessError::Other(m) => ExecutorError::Other(format!("{what}: {m}")),
        })?;
        match outcome.status.code {
            0 => Ok(0),
            BUILD_FAILURE_EXIT_CODE => self.build_failure_code(),
            SYSTEM_FAILURE_EXIT_CODE => {
                Err(ExecutorError::Other(format!("{what}: exit status {SYSTEM_FAILURE_EXIT_CODE} (system failure)")))
            }
            code => Err(ExecutorError::Other(format!(
                "{what}: unknown Custom executor executable exit code {code}; executable execution terminated with: exit status {code}"
            ))),
        }
    }

    /// The job's exit code after a build failure: the first line of `BUILD_EXIT_CODE_FILE`
    /// (read once: the file is removed), else 1; an unreadable number is a system failure.
    fn build_failure_code(&self) -> Result<i32, ExecutorError> {
        let path = self.exit_code_file();
        let Ok(bytes) = remote::download(&path, 64) else { return Ok(BUILD_FAILURE_EXIT_CODE) };
        let _ = remote::run(&format!("rm -f {}", quote(&path)), None);
        let text = String::from_utf8_lossy(&bytes);
        let first = text.lines().next().unwrap_or("").trim().to_string();
        first.parse::<i32>().map_err(|_| {
            ExecutorError::Other(format!(
                "unknown Custom executor executable exit code {SYSTEM_FAILURE_EXIT_CODE}; {path} holds {first:?}, not an exit code"
            ))
        })
    }

    /// A failed prepare step: the message GitLab's prepare shows, as a failure to prepare.
    fn prepare_failed(&self, code: i32, what: &str) -> ExecutorError {
        ExecutorError::Other(format!("{what}: exit status {code}"))
    }
}

/// Environment variables or job variables, in order.
type Pairs = Vec<(String, String)>;

/// Apply `config_exec`'s output: move the job, and return `job_env` and the variables as the
/// job now sees them.
fn apply_config(output: ConfigOutput, variables: Pairs) -> Result<(Pairs, Pairs), ExecutorError> {
    let startup = match &output.driver {
        Some(Driver { name: Some(name), version: Some(version) }) => {
            format!("Using Custom executor with driver {name} {version}...")
        }
        Some(Driver { name: Some(name), version: None }) => format!("Using Custom executor with driver {name}..."),
        _ => "Using Custom executor...".to_string(),
    };
    runway_sdk::trace::write_str(&format!("{startup}\n"));
    let overrides = Overrides {
        builds_dir: output.builds_dir,
        cache_dir: output.cache_dir,
        builds_dir_is_shared: output.builds_dir_is_shared,
        hostname: output.hostname,
        shell: output.shell,
    };
    let moved = overrides.builds_dir.is_some()
        || overrides.cache_dir.is_some()
        || overrides.builds_dir_is_shared.is_some()
        || overrides.hostname.is_some()
        || overrides.shell.is_some();
    let variables = if moved {
        job_config::reconfigure(&overrides)
            .map_err(|e| ExecutorError::InvalidConfig(format!("config_exec output: {e}")))?
            .variables
    } else {
        variables
    };
    let job_env = output.job_env.unwrap_or_default().into_iter().collect();
    Ok((job_env, variables))
}

impl Executor for Custom {
    type Environment = CustomEnvironment;

    fn info(config: &str) -> Result<ProviderInfo, ExecutorError> {
        parse_config(config)?;
        Ok(ProviderInfo::new("custom", "bash"))
    }

    fn prepare(job: Job) -> Result<CustomEnvironment, ExecutorError> {
        let config = parse_config(&job.config)?;
        let output =
            Command::new("mktemp").args(["-d", "-t", "custom-executorXXXXXXXXX"]).output(4096).map_err(plain_error)?;
        if output.status.code != 0 {
            return Err(ExecutorError::Unavailable(format!(
                "cannot create the custom executor's temporary directory: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        let temp_dir = String::from_utf8_lossy(&output.stdout).trim().to_string();
        let details = runway_sdk::job::current();
        let services = details.as_ref().map(services_json).unwrap_or_default();
        let variables: Vec<(String, String)> =
            details.map(|d| d.variables.into_iter().map(|v| (v.key, v.value)).collect()).unwrap_or_default();
        // The job's JSON, private to the runner's user, as gitlab-runner's response.json.
        let response_file = match job_config::response() {
            Some(json) => {
                let path = format!("{temp_dir}/response.json");
                remote::upload(&path, json.as_bytes(), 0o600)
                    .map_err(|e| ExecutorError::Unavailable(format!("writing {path}: {e:?}")))?;
                Some(path)
            }
            None => None,
        };
        let mut env = CustomEnvironment {
            config: config.clone(),
            temp_dir,
            env: custom_env(&variables, &services),
            scripts: Cell::new(0),
            response_file,
        };
        if !config.config_exec.is_empty() {
            let timeout = seconds(config.config_exec_timeout, DEFAULT_EXEC_TIMEOUT);
            let result = env
                .driver(&config.config_exec, &config.config_args)
                .timeout(timeout)
                .capture_stdout(CONFIG_OUTPUT_MAX)
                .run();
            let stdout = match &result {
                Ok(outcome) => outcome.stdout.clone(),
                Err(_) => Vec::new(),
            };
            let code = env.settle("config_exec", result)?;
            if code != 0 {
                return Err(env.prepare_failed(code, "config_exec"));
            }
            let output: ConfigOutput = if stdout.iter().all(u8::is_ascii_whitespace) {
                ConfigOutput::default()
            } else {
                serde_json::from_slice(&stdout)
                    .map_err(|e| ExecutorError::Other(format!("error while parsing JSON output: {e}")))?
            };
            let (job_env, variables) = apply_config(output, variables)?;
            let mut all = job_env;
            all.extend(custom_env(&variables, &services));
            env.env = all;
        } else {
            runway_sdk::trace::write_str("Using Custom executor...\n");
        }
        if !config.prepare_exec.is_empty() {
            let timeout = seconds(config.prepare_exec_timeout, DEFAULT_EXEC_TIMEOUT);
            let result = env.driver(&config.prepare_exec, &config.prepare_args).timeout(timeout).run();
            let code = env.settle("prepare_exec", result)?;
            if code != 0 {
                return Err(env.prepare_failed(code, "prepare_exec"));
            }
        }
        Ok(env)
    }
}

impl Environment for CustomEnvironment {
    fn run(&self, stage: StageScript) -> Result<ExitStatus, ExecutorError> {
        let index = self.scripts.get();
        self.scripts.set(index + 1);
        let dir = format!("{}/script{index:03}", self.temp_dir);
        let script = format!("{dir}/script");
        let made = remote::run(&format!("mkdir -m 700 {}", quote(&dir)), None)
            .map_err(|e| ExecutorError::Other(format!("{e:?}")))?;
        if made.code != 0 {
            return Err(ExecutorError::Unavailable(format!("cannot create {dir}")));
        }
        remote::upload(&script, stage.script.as_bytes(), 0o700)
            .map_err(|e| ExecutorError::Other(format!("writing {script}: {e:?}")))?;
        let name = if stage.name == "step_script" {
            runway_sdk::trace::write_str(
                "\x1b[0;33mWARNING: Starting with version 17.0 the 'build_script' stage will be replaced with 'step_script': https://gitlab.com/groups/gitlab-org/-/epics/6112\x1b[0;m\n",
            );
            "build_script".to_string()
        } else {
            stage.name
        };
        let mut args = self.config.run_args.clone();
        args.extend([script, name]);
        let result = self.driver(&self.config.run_exec, &args).run();
        let code = self.settle("run_exec", result)?;
        Ok(ExitStatus { code })
    }

    fn cleanup(&self) {
        if !self.config.cleanup_exec.is_empty() {
            // As GitLab: the cleanup driver's output goes to the runner's log, not the job's
            // (which is finished); standard error joins standard output for that.
            let timeout = seconds(self.config.cleanup_exec_timeout, DEFAULT_EXEC_TIMEOUT);
            let mut args =
                vec!["-c".to_string(), "exec \"$0\" \"$@\" 2>&1".to_string(), self.config.cleanup_exec.clone()];
            args.extend(self.config.cleanup_args.iter().cloned());
            let result = self.driver("sh", &args).timeout(timeout).capture_stdout(64 * 1024).run();
            let output = match &result {
                Ok(outcome) => String::from_utf8_lossy(&outcome.stdout).trim().to_string(),
                Err(_) => String::new(),
            };
            if !output.is_empty() {
                runway_sdk::log::debug(&format!("cleanup_exec: {output}"));
            }
            if let Err(e) = self.settle("cleanup_exec", result).and_then(|code| {
                if code == 0 {
                    Ok(())
                } else {
                    Err(self.prepare_failed(code, "cleanup_exec"))
                }
            }) {
                runway_sdk::log::warn(&format!("Cleanup script failed: {e:?}"));
            }
        }
        let _ = remote::run(&format!("rm -rf {}", quote(&self.temp_dir)), None);
    }
}

runway_sdk::export_executor!(Custom, name: "custom", description: "runs jobs through GitLab custom executor drivers");
