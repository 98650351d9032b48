//! The job's order of preparation: plan, then acquire the fleet instance.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::executor::{ConnectedInstance, InstanceError, InstanceSource};
use crate::payload::JobVariable;
use crate::trace::MemorySink;

/// A fleet with no instances that counts how often a job asked for one.
#[derive(Default)]
struct CountingFleet {
    asked: AtomicUsize,
}

#[async_trait]
impl InstanceSource for CountingFleet {
    async fn connect(
        &self,
        _: &str,
        _: &dyn TraceSink,
        _: &CancellationToken,
    ) -> Result<ConnectedInstance, InstanceError> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        Err(InstanceError::Acquire("no instances in this test".into()))
    }
}

fn payload(clone_path: Option<&str>) -> JobResponse {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/job-response-example.json"))
            .expect("fixture");
    let mut job: JobResponse = serde_json::from_str(&text).expect("payload");
    if let Some(path) = clone_path {
        job.variables.push(JobVariable { key: "GIT_CLONE_PATH".into(), value: path.into(), ..JobVariable::default() });
    }
    job
}

async fn environment(builds_dir: &str, cache_dir: &str, fleet: Arc<CountingFleet>) -> JobEnvironment {
    // Test setup only: the job module itself never reaches the plugin host.
    let settings = crate::plugin::HostSettings { builtins: crate::plugin::builtin_plugins(), ..Default::default() };
    let host = crate::plugin::PluginHost::new(settings).await.expect("plugin host");
    let executor = ResolvedExecutor::resolve(&host, "shell", "{}").await.expect("shell executor");
    JobEnvironment {
        executor,
        settings: ScriptSettings {
            builds_dir: builds_dir.into(),
            cache_dir: cache_dir.into(),
            shell: "bash".into(),
            ..ScriptSettings::default()
        },
        identity: RunnerIdentity {
            version: "v".into(),
            revision: "r".into(),
            name: "test".into(),
            short_token: "t".into(),
            system_id: "s".into(),
        },
        instance: Some(InstanceLease { source: fleet, key: "k".into() }),
    }
}

#[tokio::test]
async fn a_configuration_error_fails_the_job_without_touching_the_fleet() {
    let fleet = Arc::new(CountingFleet::default());
    let env = environment("/builds", "/cache", fleet.clone()).await;
    let trace = Arc::new(MemorySink::default());
    let job = payload(Some("/elsewhere/project"));
    let outcome = run_job(&job, &env, trace.clone(), &JobControl::default(), &NoHooks).await;
    assert_eq!(outcome.failure, Some(FailureReason::RunnerConfigurationError), "{}", trace.text());
    assert!(trace.text().contains("GIT_CLONE_PATH"), "{}", trace.text());
    assert_eq!(fleet.asked.load(Ordering::SeqCst), 0, "the fleet was asked for an instance");

    // A plannable job does ask the fleet (and fails with what the fleet said).
    let trace = Arc::new(MemorySink::default());
    let outcome = run_job(&payload(None), &env, trace.clone(), &JobControl::default(), &NoHooks).await;
    assert_eq!(outcome.failure, Some(FailureReason::RunnerSystemFailure));
    assert!(trace.text().contains("preparing the instance: no instances in this test"), "{}", trace.text());
    assert_eq!(fleet.asked.load(Ordering::SeqCst), 1);

    // Relative directories are the instance's: a job whose plan depends on where its home is
    // still asks for the instance, as before.
    let fleet = Arc::new(CountingFleet::default());
    let env = environment("builds", "cache", fleet.clone()).await;
    let trace = Arc::new(MemorySink::default());
    let outcome = run_job(&payload(None), &env, trace.clone(), &JobControl::default(), &NoHooks).await;
    assert_eq!(outcome.failure, Some(FailureReason::RunnerSystemFailure), "{}", trace.text());
    assert_eq!(fleet.asked.load(Ordering::SeqCst), 1);
}
