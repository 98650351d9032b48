//! What `state()` saves and `resume()` reads: the API connection the job used, its namespace,
//! pod and the secrets it created, so a restarted manager reattaches to the pod or cleans up
//! after it. Serialized as JSON; fields added later must default, so a state saved by an
//! older plugin still reads. Never holds the bearer token itself (only where it came from).

use serde::{Deserialize, Serialize};

/// How the plugin reached the API server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connection {
    /// API server URL.
    pub host: String,
    /// kubeconfig file used (empty: none).
    #[serde(default)]
    pub kubeconfig: String,
    /// kubeconfig context used (empty: the current one).
    #[serde(default)]
    pub context: String,
    /// In-cluster service account.
    #[serde(default)]
    pub in_cluster: bool,
    /// CA certificate file.
    #[serde(default)]
    pub ca_file: String,
    /// Client certificate file.
    #[serde(default)]
    pub cert_file: String,
    /// Client key file.
    #[serde(default)]
    pub key_file: String,
    /// The job overwrote the bearer token (`KUBERNETES_BEARER_TOKEN`): a resume needs the
    /// job's variables again to reach the API.
    #[serde(default)]
    pub token_from_job: bool,
}

/// The environment of one job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// The API connection.
    pub connection: Connection,
    /// GitLab's job ID.
    pub job_id: u64,
    /// Namespace of the job's objects.
    pub namespace: String,
    /// The job's pod.
    pub pod: String,
    /// Secrets created for the job (deleted with it).
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Builds directory in the pod.
    #[serde(default)]
    pub builds_dir: String,
    /// Stage scripts directory in the pod.
    #[serde(default)]
    pub stages_dir: String,
    /// Grace period for deleting the pod (`None`: the cluster's).
    #[serde(default)]
    pub cleanup_grace_period_seconds: Option<i64>,
}

impl State {
    /// The JSON form.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Read a state saved by [`State::to_json`].
    pub fn from_json(json: &str) -> Result<State, String> {
        serde_json::from_str(json).map_err(|e| format!("unreadable kubernetes executor state: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let state = State {
            connection: Connection {
                host: "https://127.0.0.1:6443".into(),
                kubeconfig: "/home/r/.kube/config".into(),
                context: "ci".into(),
                ca_file: "/ca.pem".into(),
                token_from_job: true,
                ..Default::default()
            },
            job_id: 9,
            namespace: "ci".into(),
            pod: "runner-abc-project-1-concurrent-0-x1y2z3w4".into(),
            secrets: vec!["runner-abc-project-1-concurrent-0-q9r8s7t6".into()],
            builds_dir: "/builds".into(),
            stages_dir: "/runway/stages".into(),
            cleanup_grace_period_seconds: Some(5),
        };
        assert_eq!(State::from_json(&state.to_json()).unwrap(), state);
    }

    #[test]
    fn old_states_read_and_garbage_is_an_error() {
        let minimal = r#"{"connection":{"host":"https://h"},"job_id":1,"namespace":"n","pod":"p"}"#;
        let state = State::from_json(minimal).unwrap();
        assert!(state.secrets.is_empty());
        assert_eq!(state.cleanup_grace_period_seconds, None);
        assert!(!state.connection.in_cluster);
        assert!(State::from_json("{").unwrap_err().contains("unreadable kubernetes executor state"));
    }
}
