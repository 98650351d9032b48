//! The ssh executor: runs each stage script on the one host `[runners.ssh]` names, through the
//! host's `remote` capability. The host connects (address, user, password or identity file,
//! host key checked against `known_hosts` unless `disable_strict_host_key_checking`); the
//! plugin never sees the credentials it is configured with. Stages run as the instance
//! executor's do (detached, followed, reattached after a restart): the code is shared (the
//! `remote-stages` crate).
//!
//! Config (`[runners.ssh]`): GitLab Runner's keys (`host`, `port`, `user`, `password`,
//! `identity_file`, `disable_strict_host_key_checking`, `known_hosts_file`), read by the host,
//! which hands the plugin only `login = true|false` (Runway's, default true: `bash --login`, as
//! gitlab-runner's ssh executor runs). The connection keys are still accepted here, so a
//! section passed whole (by another host) is not refused.

use runway_sdk::executor::*;

use remote_stages::remote_env::RemoteEnvironment;

struct Ssh;

const NO_INSTANCE: &str = "the ssh executor has no connection: set [runners.ssh] host for this runner";

/// `[runners.ssh]`: the connection keys are the host's; only `login` is the plugin's.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // the connection keys are only accepted here
struct Config {
    #[serde(default = "default_login")]
    login: bool,
    #[serde(default)]
    host: Option<String>,
    #[serde(default)]
    port: Option<serde_json::Value>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    identity_file: Option<String>,
    #[serde(default)]
    disable_strict_host_key_checking: Option<bool>,
    #[serde(default)]
    known_hosts_file: Option<String>,
}

fn default_login() -> bool {
    true
}

fn parse_config(config: &str) -> Result<Config, ExecutorError> {
    if config.trim().is_empty() {
        return Ok(Config { login: true, ..Config::default() });
    }
    serde_json::from_str(config).map_err(|e| ExecutorError::InvalidConfig(format!("[runners.ssh]: {e}")))
}

impl Executor for Ssh {
    type Environment = RemoteEnvironment;

    fn info(config: &str) -> Result<ProviderInfo, ExecutorError> {
        parse_config(config)?;
        // Relative directories are the login user's on the host (`~/builds`).
        Ok(ProviderInfo::new("ssh", "bash"))
    }

    fn prepare(job: Job) -> Result<RemoteEnvironment, ExecutorError> {
        let config = parse_config(&job.config)?;
        runway_sdk::trace::write_str("Using SSH executor...\n");
        RemoteEnvironment::prepare(job, config.login, "ssh", NO_INSTANCE)
    }

    fn resume(_job: Job, state: String) -> Result<RemoteEnvironment, ExecutorError> {
        RemoteEnvironment::resume(&state, "ssh", NO_INSTANCE)
    }
}

runway_sdk::export_executor!(Ssh, name: "ssh", description: "runs job scripts on one configured host over SSH");
