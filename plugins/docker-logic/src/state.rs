//! What `state()` saves and `resume()` reads: everything cleanup and a resumed job need to find
//! the job's engine, network, volumes, containers and images again. Serialized as JSON; fields
//! added later must default, so a state saved by an older plugin still reads.

use serde::{Deserialize, Serialize};

/// A service container of the job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceState {
    /// The image as the job or config named it.
    pub image: String,
    /// Container name.
    pub container: String,
    /// Host names on the job's network.
    pub aliases: Vec<String>,
}

/// The environment of one job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// Engine address (as configured; empty: the default).
    pub host: String,
    /// TLS verification.
    #[serde(default)]
    pub tls_verify: bool,
    /// TLS certificate directory.
    #[serde(default)]
    pub tls_cert_path: String,
    /// GitLab's job ID.
    pub job_id: u64,
    /// The job's suffix (names and labels).
    pub suffix: String,
    /// The network the job created, if any (none with `network_mode`).
    #[serde(default)]
    pub network: Option<String>,
    /// The network stage containers join (`HostConfig.NetworkMode`).
    #[serde(default)]
    pub network_mode: String,
    /// The job's build volume.
    pub build_volume: String,
    /// Mounts of stage containers (`source:target[:mode]`), the build volume first.
    #[serde(default)]
    pub binds: Vec<String>,
    /// Legacy links of stage containers (default bridge network).
    #[serde(default)]
    pub links: Vec<String>,
    /// The job's image, resolved.
    pub image: String,
    /// The job image's entrypoint override.
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    /// User of the build containers.
    #[serde(default)]
    pub user: String,
    /// The helper image.
    pub helper_image: String,
    /// Builds directory (working directory of stage containers).
    pub builds_dir: String,
    /// The job's service containers.
    #[serde(default)]
    pub services: Vec<ServiceState>,
    /// `CI_DEBUG_SERVICES` (or `CI_DEBUG_TRACE`): services' output goes into the job log.
    #[serde(default)]
    pub debug_services: bool,
    /// The job's long-lived build container (its name), where the job's own stages run
    /// detached; empty: none (a state of an older plugin, or an image without the programs
    /// detached stages need: then each of those stages gets a container of its own).
    #[serde(default)]
    pub build_container: String,
    /// The build container may run the setup stages (`programs::runs_without_helper`): its user
    /// may write the builds directory.
    #[serde(default)]
    pub build_runs_setup: bool,
    /// The programs of `programs::PROBED_PROGRAMS` the build container has.
    #[serde(default)]
    pub build_programs: Vec<String>,
    /// The job's project directory (the job's own steps and `after_script` run there).
    #[serde(default)]
    pub project_dir: String,
}

impl State {
    /// The JSON form.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Read a state saved by [`State::to_json`].
    pub fn from_json(json: &str) -> Result<State, String> {
        serde_json::from_str(json).map_err(|e| format!("unreadable docker executor state: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let state = State {
            host: "unix:///run/d.sock".into(),
            job_id: 9,
            suffix: "abcd0123".into(),
            network: Some("runway-job-9-abcd0123".into()),
            network_mode: "runway-job-9-abcd0123".into(),
            build_volume: "runway-job-9-abcd0123-builds".into(),
            binds: vec!["runway-job-9-abcd0123-builds:/builds".into()],
            image: "alpine:3".into(),
            entrypoint: Some(vec![]),
            helper_image: "runway-helper:1".into(),
            builds_dir: "/builds".into(),
            services: vec![ServiceState {
                image: "postgres:14".into(),
                container: "c".into(),
                aliases: vec!["postgres".into()],
            }],
            ..Default::default()
        };
        assert_eq!(State::from_json(&state.to_json()).unwrap(), state);
    }

    #[test]
    fn old_states_read_and_garbage_is_an_error() {
        let minimal = r#"{"host":"","job_id":1,"suffix":"s","build_volume":"v","image":"i","helper_image":"h","builds_dir":"/b"}"#;
        let state = State::from_json(minimal).unwrap();
        assert_eq!(state.network, None);
        assert!(state.services.is_empty());
        assert!(State::from_json("{").unwrap_err().contains("unreadable docker executor state"));
    }
}
