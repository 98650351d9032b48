//! The instance executor: runs each stage script on the instance the autoscaler acquired for
//! the job, through the host's `remote` capability (SSH). The plugin never sees the
//! instance's address or credentials. How stages run, survive a dropped connection and are
//! reattached after a restart is the `remote-stages` crate's (shared with the `ssh` and
//! `shell` executors).
//!
//! Config (`[runners.instance]`, optional): `login = true|false` (default true) runs
//! `bash --login`, as the shell executor does.

use runway_sdk::executor::*;

use remote_stages::remote_env::RemoteEnvironment;

struct Instance;

const NO_INSTANCE: &str = "the instance executor needs an instance: configure [runners.autoscaler] for this runner";

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_login")]
    login: bool,
}

fn default_login() -> bool {
    true
}

fn parse_config(config: &str) -> Result<Config, ExecutorError> {
    if config.trim().is_empty() {
        return Ok(Config { login: true });
    }
    serde_json::from_str(config).map_err(|e| ExecutorError::InvalidConfig(format!("[runners.instance]: {e}")))
}

impl Executor for Instance {
    type Environment = RemoteEnvironment;

    fn info(config: &str) -> Result<ProviderInfo, ExecutorError> {
        parse_config(config)?;
        // Relative directories are the login user's on the instance (`~/builds`).
        Ok(ProviderInfo::new("instance", "bash"))
    }

    fn prepare(job: Job) -> Result<RemoteEnvironment, ExecutorError> {
        let config = parse_config(&job.config)?;
        RemoteEnvironment::prepare(job, config.login, "instance", NO_INSTANCE)
    }

    fn resume(_job: Job, state: String) -> Result<RemoteEnvironment, ExecutorError> {
        RemoteEnvironment::resume(&state, "instance", NO_INSTANCE)
    }
}

runway_sdk::export_executor!(Instance, name: "instance", description: "runs job scripts on autoscaled instances over SSH");
