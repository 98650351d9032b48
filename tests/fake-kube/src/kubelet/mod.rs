//! The kubelet: runs every pod of the store on the Docker Engine (one worker task per pod,
//! see `pod.rs`), writes the pod's status and the kubelet's and scheduler's events, and
//! carries deletion (grace period), eviction and shutdown to the workers. Does not serve
//! HTTP; the API asks it for container ids (logs, exec, attach) and sends it commands.

mod lifecycle;
mod pod;
mod probe;
mod projected;
pub(crate) mod spec;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::sync::watch;

use crate::docker::Docker;
use crate::faults::Faults;
use crate::resources::{EVENTS, PODS};
use crate::store::{now_rfc3339, ChangeType, Store};

/// The node every pod runs on.
pub(crate) const NODE: &str = "fake-kube-node";

/// What a pod's worker is told to do.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Command {
    Run,
    /// Stop the containers (SIGTERM, SIGKILL after the grace seconds), remove everything, and
    /// remove the pod from the store.
    Delete {
        grace: u64,
    },
    /// Kill the containers and mark the pod Failed/Evicted (it stays until deleted).
    Evict,
}

/// The containers of a running pod, for logs, exec and attach.
#[derive(Debug, Clone, Default)]
pub(crate) struct Running {
    /// Container name → current Docker id.
    pub current: HashMap<String, String>,
    /// Container name → the id of the instance before the last restart.
    pub previous: HashMap<String, String>,
}

struct Worker {
    commands: watch::Sender<Command>,
    running: Arc<Mutex<Running>>,
}

/// Settings of the kubelet.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub pause_image: String,
    /// Every pod in the host's network namespace (`--pod-network host`).
    pub host_network: bool,
    /// Where secret/configMap files and `/etc/hosts` of pods live.
    pub state_dir: PathBuf,
    /// The API server's address: `KUBERNETES_SERVICE_HOST`/`_PORT` of every container.
    pub api: std::net::SocketAddr,
    /// Where projected service-account tokens are minted.
    pub tokens: Arc<crate::auth::Tokens>,
}

/// The kubelet.
pub(crate) struct Kubelet {
    pub store: Arc<Store>,
    pub docker: Docker,
    pub faults: Arc<Faults>,
    pub settings: Settings,
    workers: Mutex<HashMap<String, Worker>>,
    /// (pod uid, reason, message) → event name, so repeats count up as the kubelet's do.
    events: Mutex<HashMap<(String, String, String), String>>,
}

impl Kubelet {
    pub(crate) fn new(store: Arc<Store>, docker: Docker, faults: Arc<Faults>, settings: Settings) -> Arc<Kubelet> {
        Arc::new(Kubelet { store, docker, faults, settings, workers: Mutex::default(), events: Mutex::default() })
    }

    /// Follow the store: a worker for every new pod, deletions carried to it.
    pub(crate) async fn run(self: Arc<Self>) {
        let mut changes = self.store.subscribe();
        loop {
            let change = match changes.recv().await {
                Ok(change) => change,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!("kubelet missed {n} changes; resyncing");
                    self.resync();
                    continue;
                }
                Err(_) => return,
            };
            if change.resource != PODS {
                continue;
            }
            let uid = change.object["metadata"]["uid"].as_str().unwrap_or_default().to_string();
            match change.change {
                ChangeType::Added => self.start_worker(&change.object),
                ChangeType::Modified => {
                    if change.object["metadata"]["deletionTimestamp"].is_string() {
                        let grace = change.object["metadata"]["deletionGracePeriodSeconds"].as_u64().unwrap_or(30);
                        self.command(&uid, Command::Delete { grace });
                    }
                }
                ChangeType::Deleted => self.command(&uid, Command::Delete { grace: 0 }),
            }
        }
    }

    fn resync(self: &Arc<Self>) {
        let (pods, _) = self.store.list(PODS, None);
        for pod in pods {
            self.start_worker(&pod);
        }
    }

    fn start_worker(self: &Arc<Self>, pod: &Value) {
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default().to_string();
        let mut workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        if workers.contains_key(&uid) {
            return;
        }
        let (commands, receiver) = watch::channel(Command::Run);
        let running = Arc::new(Mutex::new(Running::default()));
        workers.insert(uid.clone(), Worker { commands, running: running.clone() });
        let kubelet = self.clone();
        let pod = pod.clone();
        tokio::spawn(async move {
            lifecycle::run(kubelet.clone(), pod, receiver, running).await;
            kubelet.workers.lock().unwrap_or_else(|e| e.into_inner()).remove(&uid);
        });
    }

    fn command(&self, uid: &str, command: Command) {
        let workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(worker) = workers.get(uid) {
            worker.commands.send_if_modified(|current| {
                // A delete never turns back into less; a shorter grace period wins.
                let replace = match (&*current, &command) {
                    (Command::Delete { grace: old }, Command::Delete { grace: new }) => new < old,
                    (Command::Delete { .. }, _) => false,
                    _ => *current != command,
                };
                if replace {
                    *current = command.clone();
                }
                replace
            });
        }
    }

    /// Evict the pod with `uid`; false when no worker runs it.
    pub(crate) fn evict(&self, uid: &str) -> bool {
        let known = self.workers.lock().unwrap_or_else(|e| e.into_inner()).contains_key(uid);
        self.command(uid, Command::Evict);
        known
    }

    /// The containers of the pod with `uid`.
    pub(crate) fn running(&self, uid: &str) -> Option<Running> {
        let workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        workers.get(uid).map(|w| w.running.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// Stop and remove every container and volume fake-kube made (SIGTERM shutdown).
    pub(crate) async fn shutdown(&self) {
        let label = spec::LABEL.to_string();
        if let Ok(ids) = self.docker.containers_labelled(&label).await {
            let stops = ids.iter().map(|id| self.docker.stop(id, 2));
            futures::future::join_all(stops).await;
            for id in &ids {
                let _ = self.docker.remove(id).await;
            }
        }
        if let Ok(volumes) = self.docker.volumes_labelled(&label).await {
            for volume in volumes {
                let _ = self.docker.remove_volume(&volume).await;
            }
        }
        let _ = std::fs::remove_dir_all(&self.settings.state_dir);
    }

    /// Write an event about `pod` (counting up a repeat of the same reason and message).
    pub(crate) fn event(
        &self,
        pod: &Value,
        kind: &str,
        reason: &str,
        message: &str,
        field: Option<&str>,
        component: &str,
    ) {
        let meta = &pod["metadata"];
        let namespace = meta["namespace"].as_str().unwrap_or("default");
        let uid = meta["uid"].as_str().unwrap_or_default().to_string();
        let key = (uid.clone(), reason.to_string(), message.to_string());
        let now = now_rfc3339();
        let existing = self.events.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned();
        if let Some(name) = existing {
            let updated = self.store.update(EVENTS, namespace, &name, |event| {
                let count = event["count"].as_u64().unwrap_or(1) + 1;
                event["count"] = json!(count);
                event["lastTimestamp"] = json!(now);
                Ok(())
            });
            if updated.is_ok() {
                return;
            }
        }
        let mut involved = json!({
            "kind": "Pod",
            "namespace": namespace,
            "name": meta["name"],
            "uid": uid,
            "apiVersion": "v1",
            "resourceVersion": meta["resourceVersion"],
        });
        if let Some(field) = field {
            involved["fieldPath"] = json!(field);
        }
        let name = format!("{}.{:016x}", meta["name"].as_str().unwrap_or("pod"), rand::random::<u64>());
        let event = json!({
            "metadata": {"name": name},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "source": {"component": component, "host": if component == "kubelet" { Some(NODE) } else { None }},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "type": kind,
            "eventTime": null,
            "reportingComponent": component,
            "reportingInstance": if component == "kubelet" { NODE } else { "" },
        });
        if self.store.create(EVENTS, namespace, event).is_ok() {
            self.events.lock().unwrap_or_else(|e| e.into_inner()).insert(key, name);
        }
    }
}
