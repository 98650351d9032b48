//! The instance executor: runs each stage script on the instance the autoscaler acquired for
//! the job, through the host's `remote` capability (SSH). The plugin never sees the
//! instance's address or credentials. How stages run, survive a dropped connection and are
//! reattached after a restart is the `remote-stages` crate's (shared with the `ssh` and
//! `shell` executors).
//!
//! Config (`[runners.instance]`, optional): `login = true|false` (default true) runs
//! `bash --login`, as the shell executor does. gitlab-runner's own keys are accepted and
//! type-checked here but acted on by the host, which alone knows the runner's fleet:
//! `use_common_build_dir` (a builds directory not namespaced by runner and slot when every
//! instance runs one job, `max_use_count = 1`) and `allowed_images` (warned at load: it
//! applies only with vm_isolation, which Runway does not support).

use runway_sdk::executor::*;

use remote_stages::remote_env::RemoteEnvironment;

struct Instance;

const NO_INSTANCE: &str = "the instance executor needs an instance: configure [runners.autoscaler] for this runner";

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_login")]
    login: bool,
    /// gitlab-runner's key, honoured by the host (it plans the builds directory).
    #[serde(default, rename = "use_common_build_dir")]
    _use_common_build_dir: bool,
    /// gitlab-runner's key, warned about by the host (vm_isolation only).
    #[serde(default, rename = "allowed_images")]
    _allowed_images: Vec<String>,
}

fn default_login() -> bool {
    true
}

fn parse_config(config: &str) -> Result<Config, ExecutorError> {
    if config.trim().is_empty() {
        return Ok(Config { login: true, ..Config::default() });
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
