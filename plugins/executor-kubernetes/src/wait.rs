//! Waiting for the job's pod to run, as gitlab-runner waits: up to `poll_timeout`, saying every
//! `poll_interval` what the pod waits for, the pod's events in the job log as they arrive. The
//! pod is watched, so a change is seen at once; an image that cannot be pulled, a container
//! that cannot be created, or a pod that ended fails the job at once with the kubelet's reason;
//! a pod still not running at `poll_timeout` (say, `Unschedulable` while the cluster scales up)
//! fails it with the pod's events.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kube_logic::config::KubeConfig;
use kube_logic::names::{BUILD_CONTAINER, HELPER_CONTAINER};
use runway_sdk::executor::ExecutorError;
use runway_sdk::kube::query_escape;
use runway_sdk::trace;
use serde_json::Value;

use crate::api::{executor_error, Api};

/// Waiting reasons that will not go away by themselves.
const FATAL_WAITING: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
];

/// Why the pod did not come to run.
pub enum NotRunning {
    /// An image could not be pulled (the kubelet's reason): another pull policy may help.
    Pull(String),
    /// Anything else: the job fails.
    Failed(ExecutorError),
}

impl From<ExecutorError> for NotRunning {
    fn from(error: ExecutorError) -> Self {
        NotRunning::Failed(error)
    }
}

/// Waiting reasons of a failed pull.
const PULL_FAILURES: &[&str] = &["ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull"];

/// Where the pod is.
enum Phase {
    /// `build` and `helper` run.
    Ready,
    /// Still coming up: what it waits for.
    Pending(String),
    /// It will never run (the reason).
    Failed(String),
    /// An image cannot be pulled (the reason).
    Pull(String),
}

/// The statuses of the pod's containers, init containers first.
fn statuses(pod: &Value) -> Vec<&Value> {
    let status = &pod["status"];
    let list = |key: &str| status[key].as_array().map(|a| a.iter().collect::<Vec<_>>()).unwrap_or_default();
    let mut all = list("initContainerStatuses");
    all.extend(list("containerStatuses"));
    all
}

fn phase(pod: &Value) -> Phase {
    let status = &pod["status"];
    let phase = status["phase"].as_str().unwrap_or("Pending");
    let mut waiting = Vec::new();
    for container in statuses(pod) {
        let name = container["name"].as_str().unwrap_or_default();
        let state = &container["state"];
        if let Some(reason) = state["waiting"]["reason"].as_str() {
            let message = state["waiting"]["message"].as_str().unwrap_or_default();
            if FATAL_WAITING.contains(&reason) {
                let image = container["image"].as_str().unwrap_or_default();
                let text = format!("container {name:?} (image {image}): {reason}: {message}");
                return if PULL_FAILURES.contains(&reason) { Phase::Pull(text) } else { Phase::Failed(text) };
            }
            waiting.push(format!(
                "\t{name}: {reason}{}",
                if message.is_empty() { String::new() } else { format!(" ({message})") }
            ));
        }
    }
    match phase {
        "Running" => {
            let running = |want: &str| {
                statuses(pod).iter().any(|c| c["name"].as_str() == Some(want) && c["state"]["running"].is_object())
            };
            if running(BUILD_CONTAINER) && running(HELPER_CONTAINER) {
                return Phase::Ready;
            }
        }
        "Failed" | "Succeeded" => {
            let mut ended: Vec<String> = statuses(pod)
                .iter()
                .filter_map(|c| {
                    let t = &c["state"]["terminated"];
                    t.is_object().then(|| {
                        format!(
                            "container {:?} exited with code {} ({})",
                            c["name"].as_str().unwrap_or_default(),
                            t["exitCode"].as_i64().unwrap_or_default(),
                            t["reason"].as_str().unwrap_or_default()
                        )
                    })
                })
                .collect();
            if let Some(reason) = status["reason"].as_str() {
                ended.insert(0, format!("{reason}: {}", status["message"].as_str().unwrap_or_default()));
            }
            return Phase::Failed(format!("pod status is {phase}: {}", ended.join("; ")));
        }
        _ => {}
    }
    for condition in status["conditions"].as_array().into_iter().flatten() {
        if condition["status"].as_str() == Some("False") {
            if let Some(reason) = condition["reason"].as_str() {
                waiting.push(format!(
                    "\t{}: {reason} ({})",
                    condition["type"].as_str().unwrap_or_default(),
                    condition["message"].as_str().unwrap_or_default()
                ));
            }
        }
    }
    Phase::Pending(format!("status is {phase}{}", waiting.iter().map(|w| format!("\n{w}")).collect::<String>()))
}

/// The pod's events not shown yet, written to the job log; the lines.
fn show_events(api: &Api, namespace: &str, pod: &str, shown: &mut BTreeSet<String>) -> Vec<String> {
    let selector = query_escape(&format!("involvedObject.name={pod}"));
    let path = format!("/api/v1/namespaces/{namespace}/events?fieldSelector={selector}");
    let Ok(Some(list)) = api.get(&path, "the pod's events") else { return Vec::new() };
    let mut lines = Vec::new();
    for event in list["items"].as_array().into_iter().flatten() {
        let key = format!(
            "{}/{}",
            event["metadata"]["uid"].as_str().unwrap_or_default(),
            event["count"].as_i64().unwrap_or_default()
        );
        if !shown.insert(key) {
            continue;
        }
        let line = format!(
            "Event retrieved from the cluster: {} {} {}",
            event["type"].as_str().unwrap_or_default(),
            event["reason"].as_str().unwrap_or_default(),
            event["message"].as_str().unwrap_or_default()
        );
        trace::write_str(&format!("{line}\n"));
        lines.push(line);
    }
    lines
}

/// Why the pod `namespace/pod` can no longer run stages, if it cannot: it is gone (deleted by
/// someone else, or its node was lost and the node controller removed it), being deleted, or
/// ended (evicted, a container killed): the kubelet's reason. `None` while it runs.
pub fn ended(api: &Api, namespace: &str, pod: &str) -> Result<Option<String>, ExecutorError> {
    let path = format!("/api/v1/namespaces/{namespace}/pods/{pod}");
    let Some(object) = api.get(&path, &format!("pod {namespace}/{pod}"))? else {
        return Ok(Some(format!(
            "pod {namespace}/{pod} no longer exists (deleted outside this job, or its node was lost)"
        )));
    };
    if object["metadata"]["deletionTimestamp"].is_string() {
        return Ok(Some(format!("pod {namespace}/{pod} is being deleted")));
    }
    Ok(match phase(&object) {
        Phase::Failed(reason) => Some(format!("pod {namespace}/{pod} ended: {reason}")),
        _ => None,
    })
}

/// Why the pod's end as [`ended`] says, but a pod that still looks alive is watched for up to
/// `within` first: a kubelet evicting a pod kills its containers before it marks the pod
/// `Failed`, so a stage cut by an eviction sees the cut a moment before the reason.
pub fn ended_within(api: &Api, namespace: &str, pod: &str, within: Duration) -> Result<Option<String>, ExecutorError> {
    if let Some(why) = ended(api, namespace, pod)? {
        return Ok(Some(why));
    }
    if within.is_zero() {
        return Ok(None);
    }
    let deadline = Instant::now() + within;
    let selector = query_escape(&format!("metadata.name={pod}"));
    let path = format!("/api/v1/namespaces/{namespace}/pods?fieldSelector={selector}");
    let what = format!("watching pod {namespace}/{pod}");
    let mut watch = api.cluster.watch(&path, "").map_err(|e| executor_error(e, &what))?;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        let millis = u32::try_from(left.as_millis()).unwrap_or(u32::MAX).max(1);
        let Some(text) = watch.next(millis).map_err(|e| executor_error(e, &what))? else { continue };
        let event: Value = serde_json::from_str(&text).unwrap_or_default();
        match event["type"].as_str() {
            Some("ERROR") => watch = api.cluster.watch(&path, "").map_err(|e| executor_error(e, &what))?,
            Some("DELETED") => return ended(api, namespace, pod),
            Some("BOOKMARK") | None => {}
            Some(_) if event["object"]["metadata"]["deletionTimestamp"].is_string() => {
                return Ok(Some(format!("pod {namespace}/{pod} is being deleted")));
            }
            Some(_) => {
                if let Phase::Failed(reason) = phase(&event["object"]) {
                    return Ok(Some(format!("pod {namespace}/{pod} ended: {reason}")));
                }
            }
        }
    }
}

/// Wait until the pod `namespace/pod` runs `build` and `helper`.
pub fn running(api: &Api, namespace: &str, pod: &str, config: &KubeConfig) -> Result<(), NotRunning> {
    let deadline = Instant::now() + Duration::from_secs(config.poll_timeout.max(1));
    let interval = Duration::from_secs(config.poll_interval.max(1));
    let selector = query_escape(&format!("metadata.name={pod}"));
    let path = format!("/api/v1/namespaces/{namespace}/pods?fieldSelector={selector}");
    let what = format!("waiting for pod {namespace}/{pod}");
    let mut watch = api.cluster.watch(&path, "").map_err(|e| executor_error(e, &what))?;
    let mut shown = BTreeSet::new();
    let mut last = String::from("status is Pending");
    let mut next_report = Instant::now();
    loop {
        let now = Instant::now();
        if now >= deadline {
            let events = show_events(api, namespace, pod, &mut shown);
            let mut text =
                format!("timed out waiting for pod {namespace}/{pod} to start after {}s: {last}", config.poll_timeout);
            if !events.is_empty() {
                text.push_str(&format!("\n{}", events.join("\n")));
            }
            return Err(ExecutorError::Other(text).into());
        }
        if now >= next_report {
            trace::write_str(&format!("Waiting for pod {namespace}/{pod} to be running, {last}\n"));
            show_events(api, namespace, pod, &mut shown);
            next_report = now + interval;
        }
        let wait = deadline.min(next_report).saturating_duration_since(now);
        let millis = u32::try_from(wait.as_millis()).unwrap_or(u32::MAX).max(1);
        let Some(text) = watch.next(millis).map_err(|e| executor_error(e, &what))? else { continue };
        let event: Value = serde_json::from_str(&text).unwrap_or_default();
        match event["type"].as_str() {
            Some("ERROR") => {
                // The watch expired (410) or failed: watch again from the current state.
                watch = api.cluster.watch(&path, "").map_err(|e| executor_error(e, &what))?;
                continue;
            }
            Some("DELETED") => {
                return Err(ExecutorError::Other(format!("pod {namespace}/{pod} was deleted before it ran")).into());
            }
            Some("BOOKMARK") | None => continue,
            Some(_) => {}
        }
        match phase(&event["object"]) {
            Phase::Ready => return Ok(()),
            Phase::Failed(reason) => {
                show_events(api, namespace, pod, &mut shown);
                return Err(ExecutorError::Other(format!("pod {namespace}/{pod} will not run: {reason}")).into());
            }
            Phase::Pull(reason) => {
                show_events(api, namespace, pod, &mut shown);
                return Err(NotRunning::Pull(format!("pod {namespace}/{pod} will not run: {reason}")));
            }
            Phase::Pending(now_waiting) => last = now_waiting,
        }
    }
}
