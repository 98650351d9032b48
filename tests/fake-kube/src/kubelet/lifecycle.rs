//! The order of a pod's life on the kubelet: scheduled (or held Unschedulable by a fault),
//! volumes, the pause container, init containers one by one to completion, the containers
//! with restarts by `restartPolicy` and back-off, the terminal phase; and, on command,
//! eviction or deletion (SIGTERM, SIGKILL after the grace period, every container and volume
//! removed, then the pod leaves the store). The steps themselves are in `pod.rs`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

use super::pod::{backoff, host_network, pod_ref, set_waiting, Ctx, PodState, StartFailure};
use super::spec;
use super::{Command, Kubelet, Running, NODE};
use crate::resources::PODS;
use crate::store::now_rfc3339;

/// Run `pod` until it is deleted.
pub(super) async fn run(
    k: Arc<Kubelet>,
    pod: Value,
    mut commands: watch::Receiver<Command>,
    running: Arc<Mutex<Running>>,
) {
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default().to_string();
    let cx = Ctx {
        k: k.clone(),
        running,
        host_network: k.settings.host_network || host_network(&pod),
        dir: k.settings.state_dir.join(&uid),
    };
    let mut st = PodState::new(&pod);
    let mut next = {
        let drive = drive(&cx, &mut st);
        tokio::pin!(drive);
        loop {
            tokio::select! {
                _ = &mut drive => break None,
                changed = commands.changed() => {
                    if changed.is_err() {
                        break Some(Command::Delete { grace: 0 });
                    }
                    let command = commands.borrow_and_update().clone();
                    if command != Command::Run {
                        break Some(command);
                    }
                }
            }
        }
    };
    loop {
        let command = match next.take() {
            Some(command) => command,
            None => match commands.changed().await {
                Ok(()) => commands.borrow_and_update().clone(),
                Err(_) => Command::Delete { grace: 0 },
            },
        };
        match command {
            Command::Run => {}
            Command::Evict => evict(&cx, &mut st).await,
            Command::Delete { grace } => {
                terminate(&cx, &mut st, grace).await;
                return;
            }
        }
    }
}

fn restart_policy(pod: &Value) -> &str {
    pod["spec"]["restartPolicy"].as_str().unwrap_or("Always")
}

async fn schedule(cx: &Ctx, st: &mut PodState) {
    if let Some(hold) = cx.k.faults.unschedulable(&st.pod) {
        let message = "0/1 nodes are available: 1 node(s) were unschedulable. preemption: 0/1 nodes are available: \
                       1 Preemption is not helpful for scheduling.";
        st.condition("PodScheduled", false, Some("Unschedulable"), Some(message));
        cx.publish(st);
        cx.k.event(&st.pod, "Warning", "FailedScheduling", message, None, "default-scheduler");
        tokio::time::sleep(hold).await;
    }
    st.condition("PodScheduled", true, None, None);
    cx.publish(st);
    let m = &st.pod["metadata"];
    let message = format!(
        "Successfully assigned {}/{} to {NODE}",
        m["namespace"].as_str().unwrap_or(""),
        m["name"].as_str().unwrap_or("")
    );
    cx.k.event(&st.pod, "Normal", "Scheduled", &message, None, "default-scheduler");
}

/// Create and start the pause container: its id.
async fn pause(cx: &Ctx, st: &PodState) -> String {
    let image = cx.k.settings.pause_image.clone();
    loop {
        let attempt = async {
            if !cx.k.docker.image_exists(&image).await? {
                cx.k.docker.pull(&image, None).await?;
            }
            let uid = st.pod["metadata"]["uid"].as_str().unwrap_or_default();
            let name =
                format!("k8s_POD_{}_{}_{uid}_0", st.pod["metadata"]["name"].as_str().unwrap_or(""), Ctx::ns(&st.pod));
            let id = cx.k.docker.create_container(&name, &spec::pause_config(&st.pod, &image, cx.host_network)).await?;
            cx.k.docker.start(&id).await?;
            Ok::<String, crate::docker::DockerError>(id)
        };
        match attempt.await {
            Ok(id) => return id,
            Err(e) => {
                let message = format!("Failed to create pod sandbox: {e}");
                cx.event(st, "Warning", "FailedCreatePodSandBox", &message, None);
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    }
}

/// Start container `index` until it starts or the runtime fails it (`Err(exit state)`).
async fn start_until(
    cx: &Ctx,
    st: &mut PodState,
    init: bool,
    index: usize,
    pause_id: &str,
    hosts: &str,
    volumes: &std::collections::BTreeMap<String, spec::Source>,
) -> Result<String, Value> {
    let container = st.pod["spec"][if init { "initContainers" } else { "containers" }][index].clone();
    cx.pull(st, init, index, &container).await;
    loop {
        let env = cx.env(&st.pod, &container);
        let ctx = spec::Context { pause_id, hosts_file: hosts, volumes, env };
        match cx.start(st, init, index, &ctx).await {
            Ok(id) => {
                cx.publish(st);
                return Ok(id);
            }
            Err(StartFailure::Start { id, message }) => {
                return Err(json!({"terminated": {"exitCode": 128, "reason": "StartError", "message": message,
                    "startedAt": "1970-01-01T00:00:00Z", "finishedAt": now_rfc3339(), "containerID": format!("docker://{id}")}}));
            }
            Err(StartFailure::Config(message)) | Err(StartFailure::Create(message)) => {
                let reason = "CreateContainerConfigError";
                set_waiting(st, init, index, reason, Some(&message));
                let name = container["name"].as_str().unwrap_or_default().to_string();
                cx.event(st, "Warning", "Failed", &format!("Error: {message}"), Some(&name));
                cx.publish(st);
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    }
}

/// The back-off before restart number `attempt` (0: at once).
fn restart_delay(attempt: u32) -> Duration {
    if attempt == 0 {
        Duration::ZERO
    } else {
        backoff(attempt - 1)
    }
}

fn crash_loop(cx: &Ctx, st: &mut PodState, init: bool, index: usize, delay: Duration) {
    let name = if init { st.init[index].name.clone() } else { st.app[index].name.clone() };
    let message = format!("back-off {}s restarting failed container={name} pod={}", delay.as_secs(), pod_ref(&st.pod));
    set_waiting(st, init, index, "CrashLoopBackOff", Some(&message));
    let event = format!("Back-off restarting failed container {name} in pod {}", pod_ref(&st.pod));
    cx.event(st, "Warning", "BackOff", &event, Some(&name));
}

enum Message {
    Exited(usize, String, i64),
    Restart(usize),
    /// The readiness probe of container instance (index, id) changed its verdict.
    Ready(usize, String, bool),
}

async fn drive(cx: &Ctx, st: &mut PodState) {
    schedule(cx, st).await;
    st.start_time = Some(now_rfc3339());
    st.condition("PodReadyToStartContainers", false, None, None);
    cx.publish(st);
    let hosts = cx.dir.join("etc-hosts");
    let written = std::fs::create_dir_all(&cx.dir)
        .and_then(|()| std::fs::write(&hosts, spec::etc_hosts(&st.pod, cx.host_network)));
    if let Err(e) = written {
        cx.event(st, "Warning", "FailedCreatePodSandBox", &format!("Failed to write the pod's hosts file: {e}"), None);
    }
    let hosts = hosts.display().to_string();
    let volumes = loop {
        match cx.volumes(st).await {
            Ok(volumes) => break volumes,
            Err(message) => {
                cx.event(st, "Warning", "FailedMount", &message, None);
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    };
    let pause_id = pause(cx, st).await;
    st.condition("PodReadyToStartContainers", true, None, None);
    cx.publish(st);

    for i in 0..st.init.len() {
        let mut attempt = 0;
        loop {
            let state = match start_until(cx, st, true, i, &pause_id, &hosts, &volumes).await {
                Ok(id) => {
                    let exit = cx.k.docker.wait(&id).await.unwrap_or(-1);
                    cx.terminated(&id, exit).await
                }
                Err(state) => state,
            };
            let failed = state["terminated"]["exitCode"] != 0;
            st.init[i].state = state;
            if !failed {
                st.init[i].done = true;
                cx.publish(st);
                break;
            }
            if restart_policy(&st.pod) == "Never" {
                st.init[i].done = true;
                st.phase = "Failed";
                cx.publish(st);
                let _ = cx.k.docker.kill(&pause_id).await;
                return;
            }
            st.init[i].last_state = st.init[i].state.clone();
            st.init[i].restarts += 1;
            let delay = restart_delay(attempt);
            if !delay.is_zero() {
                crash_loop(cx, st, true, i, delay);
                cx.publish(st);
                tokio::time::sleep(delay).await;
            }
            attempt += 1;
        }
    }

    let (tx, mut rx) = mpsc::unbounded_channel::<Message>();
    let probes: Vec<Option<super::probe::HttpProbe>> = st.pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| super::probe::HttpProbe::of(c).filter(|_| cx.host_network))
        .collect();
    let wait_for = |id: String, index: usize| {
        let docker = cx.k.docker.clone();
        let tx = tx.clone();
        if let Some(probe) = probes.get(index).cloned().flatten() {
            let (tx, id) = (tx.clone(), id.clone());
            tokio::spawn(probe.run(move |change| match change {
                Some(ready) => tx.send(Message::Ready(index, id.clone(), ready)).is_ok(),
                None => !tx.is_closed(),
            }));
        }
        tokio::spawn(async move {
            let exit = docker.wait(&id).await.unwrap_or(-1);
            let _ = tx.send(Message::Exited(index, id, exit));
        });
    };
    for (i, probe) in probes.iter().enumerate() {
        if probe.is_some() {
            st.app[i].probe = Some(false);
        }
    }
    for i in 0..st.app.len() {
        match start_until(cx, st, false, i, &pause_id, &hosts, &volumes).await {
            Ok(id) => wait_for(id, i),
            Err(state) => {
                st.app[i].state = state;
                let _ = tx.send(Message::Exited(i, st.app[i].id.clone().unwrap_or_default(), 128));
            }
        }
    }
    st.phase = "Running";
    cx.publish(st);
    let mut attempts = vec![0u32; st.app.len()];
    while let Some(message) = rx.recv().await {
        match message {
            Message::Exited(i, id, exit) => {
                if st.app[i].id.as_deref().unwrap_or_default() != id {
                    continue;
                }
                if st.app[i].state.get("terminated").is_none() || exit != 128 {
                    st.app[i].state = cx.terminated(&id, exit).await;
                }
                let restart = match restart_policy(&st.pod) {
                    "Always" => true,
                    "OnFailure" => exit != 0,
                    _ => false,
                };
                if !restart {
                    st.app[i].done = true;
                } else {
                    st.app[i].last_state = st.app[i].state.clone();
                    let delay = restart_delay(attempts[i]);
                    attempts[i] += 1;
                    if !delay.is_zero() {
                        crash_loop(cx, st, false, i, delay);
                    }
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        let _ = tx.send(Message::Restart(i));
                    });
                }
            }
            Message::Ready(i, id, ready) => {
                if st.app[i].id.as_deref() != Some(id.as_str()) || !st.app[i].running() {
                    continue;
                }
                st.app[i].probe = Some(ready);
            }
            Message::Restart(i) => {
                st.app[i].restarts += 1;
                if st.app[i].probe.is_some() {
                    st.app[i].probe = Some(false);
                }
                match start_until(cx, st, false, i, &pause_id, &hosts, &volumes).await {
                    Ok(id) => wait_for(id, i),
                    Err(state) => {
                        st.app[i].state = state;
                        let _ = tx.send(Message::Exited(i, st.app[i].id.clone().unwrap_or_default(), 128));
                    }
                }
            }
        }
        if st.app.iter().all(|c| c.done) {
            let failed = st.app.iter().any(|c| c.state["terminated"]["exitCode"] != 0);
            st.phase = if failed { "Failed" } else { "Succeeded" };
            cx.publish(st);
            let _ = cx.k.docker.kill(&pause_id).await;
            return;
        }
        cx.publish(st);
    }
}

/// Kill the containers, then the pod is Failed with reason Evicted (it stays until deleted).
async fn evict(cx: &Ctx, st: &mut PodState) {
    let message = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 0.";
    cx.event(st, "Warning", "Evicted", message, None);
    stop_all(cx, st, 0).await;
    st.phase = "Failed";
    st.reason = Some("Evicted".into());
    st.message = Some(message.into());
    st.condition("DisruptionTarget", true, Some("TerminationByKubelet"), Some(message));
    cx.publish(st);
}

/// Stop every container of the pod (Killing events), recording their terminated states.
async fn stop_all(cx: &Ctx, st: &mut PodState, grace: u64) {
    let docker = &cx.k.docker;
    let mut stops = Vec::new();
    for (init, index) in (0..st.init.len()).map(|i| (true, i)).chain((0..st.app.len()).map(|i| (false, i))) {
        let c = if init { &st.init[index] } else { &st.app[index] };
        if let (true, Some(id)) = (c.running(), c.id.clone()) {
            cx.event(st, "Normal", "Killing", &format!("Stopping container {}", c.name), Some(&c.name.clone()));
            stops.push(async move {
                let _ = docker.stop(&id, grace).await;
                let exit = docker.inspect(&id).await.ok().and_then(|i| i["State"]["ExitCode"].as_i64()).unwrap_or(137);
                (init, index, id, exit)
            });
        }
    }
    for (init, index, id, exit) in futures::future::join_all(stops).await {
        let state = cx.terminated(&id, exit).await;
        let c = if init { &mut st.init[index] } else { &mut st.app[index] };
        c.state = state;
        c.done = true;
    }
}

/// Deletion: stop with the grace period, remove every Docker object of the pod, then the
/// pod leaves the store (the DELETED event).
async fn terminate(cx: &Ctx, st: &mut PodState, grace: u64) {
    stop_all(cx, st, grace).await;
    if st.start_time.is_some() {
        cx.publish(st);
    }
    let uid = st.pod["metadata"]["uid"].as_str().unwrap_or_default().to_string();
    let label = format!("{}={uid}", spec::POD_UID_LABEL);
    if let Ok(ids) = cx.k.docker.containers_labelled(&label).await {
        for id in ids {
            let _ = cx.k.docker.remove(&id).await;
        }
    }
    if let Ok(volumes) = cx.k.docker.volumes_labelled(&label).await {
        for volume in volumes {
            let _ = cx.k.docker.remove_volume(&volume).await;
        }
    }
    let _ = std::fs::remove_dir_all(&cx.dir);
    let name = st.pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let ns = Ctx::ns(&st.pod);
    if cx.k.store.get(PODS, &ns, &name).is_some_and(|p| p["metadata"]["uid"] == json!(uid)) {
        cx.k.store.delete(PODS, &ns, &name);
    }
}
