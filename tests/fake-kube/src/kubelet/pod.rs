//! One pod's state and the kubelet's steps for it (the order lives in `lifecycle.rs`): scheduling (and the Unschedulable fault), volumes, the pause container,
//! image pulls by `imagePullPolicy` with `imagePullSecrets` and back-off, init containers in
//! order, the containers with `restartPolicy` and back-off, the pod's phase, conditions and
//! container states, and its end: eviction, or deletion with the grace period and removal of
//! every container and volume. Writes only this pod's status and events.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

use super::spec::{self, Source};
use super::{Kubelet, Running, NODE};
use crate::resources::{CONFIGMAPS, PODS, SECRETS};
use crate::store::now_rfc3339;

/// One container's status as the kubelet reports it.
#[derive(Debug, Clone)]
pub(super) struct CState {
    pub(super) name: String,
    pub(super) image: String,
    pub(super) id: Option<String>,
    pub(super) state: Value,
    pub(super) last_state: Value,
    pub(super) restarts: u64,
    /// Exited and will not run again.
    pub(super) done: bool,
    /// What its readiness probe says (`None`: no probe the kubelet runs).
    pub(super) probe: Option<bool>,
}

impl CState {
    pub(super) fn new(container: &Value, waiting: &str) -> CState {
        CState {
            name: container["name"].as_str().unwrap_or_default().to_string(),
            image: container["image"].as_str().unwrap_or_default().to_string(),
            id: None,
            state: json!({"waiting": {"reason": waiting}}),
            last_state: json!({}),
            restarts: 0,
            done: false,
            probe: None,
        }
    }

    pub(super) fn running(&self) -> bool {
        self.state.get("running").is_some()
    }

    /// Running, and its readiness probe (if any) succeeded.
    pub(super) fn ready(&self) -> bool {
        self.running() && self.probe.unwrap_or(true)
    }

    pub(super) fn status(&self) -> Value {
        let mut status = json!({
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "state": self.state,
            "lastState": self.last_state,
            "ready": self.ready(),
            "restartCount": self.restarts,
            "started": self.running(),
        });
        if let Some(id) = &self.id {
            status["containerID"] = json!(format!("docker://{id}"));
        }
        status
    }
}

/// A condition: status, reason, message, last transition time.
pub(super) type Condition = (bool, Option<String>, Option<String>, String);

/// What the worker knows of its pod.
pub(super) struct PodState {
    pub(super) pod: Value,
    pub(super) init: Vec<CState>,
    pub(super) app: Vec<CState>,
    pub(super) phase: &'static str,
    pub(super) reason: Option<String>,
    pub(super) message: Option<String>,
    /// Condition type → (status, reason, message, last transition).
    pub(super) conditions: BTreeMap<&'static str, Condition>,
    pub(super) start_time: Option<String>,
}

impl PodState {
    pub(super) fn new(pod: &Value) -> PodState {
        let has_init = pod["spec"]["initContainers"].as_array().is_some_and(|a| !a.is_empty());
        let waiting = if has_init { "PodInitializing" } else { "ContainerCreating" };
        let list = |key: &str, waiting: &str| -> Vec<CState> {
            pod["spec"][key].as_array().into_iter().flatten().map(|c| CState::new(c, waiting)).collect()
        };
        PodState {
            pod: pod.clone(),
            init: list("initContainers", "PodInitializing"),
            app: list("containers", waiting),
            phase: "Pending",
            reason: None,
            message: None,
            conditions: BTreeMap::new(),
            start_time: None,
        }
    }

    pub(super) fn condition(&mut self, kind: &'static str, status: bool, reason: Option<&str>, message: Option<&str>) {
        let changed = self.conditions.get(kind).is_none_or(|(s, r, _, _)| *s != status || r.as_deref() != reason);
        if changed {
            self.conditions.insert(kind, (status, reason.map(String::from), message.map(String::from), now_rfc3339()));
        }
    }

    pub(super) fn refresh_conditions(&mut self) {
        let initialized = self.init.iter().all(|c| c.done && c.state["terminated"]["exitCode"] == 0);
        let (reason, message) = if initialized {
            (None, None)
        } else {
            let pending: Vec<&str> = self.init.iter().filter(|c| !c.done).map(|c| c.name.as_str()).collect();
            (
                Some("ContainersNotInitialized"),
                Some(format!("containers with incomplete status: [{}]", pending.join(" "))),
            )
        };
        if self.conditions.contains_key("PodScheduled") && self.conditions["PodScheduled"].0 {
            self.condition("Initialized", initialized, reason, message.as_deref());
            let not_ready: Vec<&str> = self.app.iter().filter(|c| !c.ready()).map(|c| c.name.as_str()).collect();
            let ready = not_ready.is_empty() && !matches!(self.phase, "Succeeded" | "Failed");
            let message = format!("containers with unready status: [{}]", not_ready.join(" "));
            let (reason, message) =
                if ready { (None, None) } else { (Some("ContainersNotReady"), Some(message.as_str())) };
            self.condition("ContainersReady", ready, reason, message);
            self.condition("Ready", ready, reason, message);
        }
    }

    pub(super) fn status(&mut self) -> Value {
        self.refresh_conditions();
        let order = [
            "DisruptionTarget",
            "PodReadyToStartContainers",
            "Initialized",
            "Ready",
            "ContainersReady",
            "PodScheduled",
        ];
        let conditions: Vec<Value> = order
            .iter()
            .filter_map(|kind| {
                let (status, reason, message, at) = self.conditions.get(kind)?;
                let mut c = json!({"type": kind, "status": if *status { "True" } else { "False" },
                    "lastProbeTime": null, "lastTransitionTime": at});
                if let Some(reason) = reason {
                    c["reason"] = json!(reason);
                }
                if let Some(message) = message {
                    c["message"] = json!(message);
                }
                Some(c)
            })
            .collect();
        let mut status = json!({
            "phase": self.phase,
            "conditions": conditions,
            "qosClass": spec::qos_class(&self.pod),
        });
        if let Some(reason) = &self.reason {
            status["reason"] = json!(reason);
        }
        if let Some(message) = &self.message {
            status["message"] = json!(message);
        }
        if let Some(start) = &self.start_time {
            status["startTime"] = json!(start);
            status["hostIP"] = json!("127.0.0.1");
            status["hostIPs"] = json!([{"ip": "127.0.0.1"}]);
            if host_network(&self.pod) {
                status["podIP"] = json!("127.0.0.1");
                status["podIPs"] = json!([{"ip": "127.0.0.1"}]);
            }
            if !self.init.is_empty() {
                status["initContainerStatuses"] = json!(self.init.iter().map(CState::status).collect::<Vec<_>>());
            }
            status["containerStatuses"] = json!(self.app.iter().map(CState::status).collect::<Vec<_>>());
        }
        status
    }
}

pub(super) fn host_network(pod: &Value) -> bool {
    pod["spec"]["hostNetwork"].as_bool().unwrap_or(false)
}

pub(super) fn backoff(attempt: u32) -> Duration {
    Duration::from_secs((10u64 << attempt.min(5)).min(300))
}

pub(super) fn pod_ref(pod: &Value) -> String {
    let m = &pod["metadata"];
    format!(
        "{}_{}({})",
        m["name"].as_str().unwrap_or(""),
        m["namespace"].as_str().unwrap_or(""),
        m["uid"].as_str().unwrap_or("")
    )
}

pub(super) struct Ctx {
    pub(super) k: Arc<Kubelet>,
    pub(super) running: Arc<Mutex<Running>>,
    pub(super) host_network: bool,
    pub(super) dir: std::path::PathBuf,
}

impl Ctx {
    pub(super) fn ns(pod: &Value) -> String {
        pod["metadata"]["namespace"].as_str().unwrap_or("default").to_string()
    }

    pub(super) fn publish(&self, st: &mut PodState) {
        let status = st.status();
        let uid = st.pod["metadata"]["uid"].clone();
        let scheduled = st.conditions.get("PodScheduled").is_some_and(|c| c.0);
        let name = st.pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let result = self.k.store.update(PODS, &Self::ns(&st.pod), &name, |pod| {
            if pod["metadata"]["uid"] == uid {
                pod["status"] = status;
                if scheduled {
                    pod["spec"]["nodeName"] = json!(NODE);
                }
            }
            Ok(())
        });
        if let Ok(pod) = result {
            st.pod["metadata"]["resourceVersion"] = pod["metadata"]["resourceVersion"].clone();
        }
    }

    pub(super) fn event(&self, st: &PodState, kind: &str, reason: &str, message: &str, container: Option<&str>) {
        let field = container.map(|c| {
            let init = st.init.iter().any(|s| s.name == c);
            format!("spec.{}{{{c}}}", if init { "initContainers" } else { "containers" })
        });
        self.k.event(&st.pod, kind, reason, message, field.as_deref(), "kubelet");
    }

    /// Credentials of the pod's `imagePullSecrets` for the registry of `image`
    /// (X-Registry-Auth values, in the secrets' order).
    pub(super) fn pull_auths(&self, pod: &Value, image: &str) -> Vec<String> {
        let first = image.split('/').next().unwrap_or_default();
        let registry = if image.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost") {
            first.to_string()
        } else {
            "https://index.docker.io/v1/".to_string()
        };
        let mut auths = Vec::new();
        let b64 = base64::engine::general_purpose::STANDARD;
        for reference in pod["spec"]["imagePullSecrets"].as_array().into_iter().flatten() {
            let Some(name) = reference["name"].as_str() else { continue };
            let Some(secret) = self.k.store.get(SECRETS, &Self::ns(pod), name) else { continue };
            let raw = secret["data"][".dockerconfigjson"].as_str().or(secret["data"][".dockercfg"].as_str());
            let Some(config) =
                raw.and_then(|r| b64.decode(r).ok()).and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            else {
                continue;
            };
            let entries = if config["auths"].is_object() { &config["auths"] } else { &config };
            for (server, entry) in entries.as_object().into_iter().flatten() {
                let host = server.trim_start_matches("https://").trim_start_matches("http://").trim_end_matches('/');
                if host != registry && server != &registry {
                    continue;
                }
                let (mut user, mut password) = (
                    entry["username"].as_str().unwrap_or("").to_string(),
                    entry["password"].as_str().unwrap_or("").to_string(),
                );
                if let Some(pair) = entry["auth"].as_str().and_then(|a| b64.decode(a).ok()) {
                    if let Some((u, p)) = String::from_utf8_lossy(&pair).split_once(':') {
                        (user, password) = (u.to_string(), p.to_string());
                    }
                }
                let auth = json!({"username": user, "password": password, "serveraddress": server});
                auths.push(base64::engine::general_purpose::URL_SAFE.encode(auth.to_string()));
            }
        }
        auths
    }

    /// Pull per policy; on failure the error message.
    pub(super) async fn pull_once(&self, st: &PodState, container: &Value) -> Result<(), (String, String)> {
        let image = container["image"].as_str().unwrap_or_default();
        let name = container["name"].as_str().unwrap_or_default();
        let policy = container["imagePullPolicy"].as_str().unwrap_or("IfNotPresent");
        let present = self.k.docker.image_exists(image).await.unwrap_or(false);
        match policy {
            "Never" if !present => {
                let message = format!("Container image \"{image}\" is not present with pull policy of Never");
                self.event(st, "Warning", "ErrImageNeverPull", &message, Some(name));
                return Err(("ErrImageNeverPull".into(), message));
            }
            "Never" | "IfNotPresent" if present => {
                let message = format!("Container image \"{image}\" already present on machine");
                self.event(st, "Normal", "Pulled", &message, Some(name));
                return Ok(());
            }
            _ => {}
        }
        self.event(st, "Normal", "Pulling", &format!("Pulling image \"{image}\""), Some(name));
        let started = std::time::Instant::now();
        let mut auths: Vec<Option<String>> = self.pull_auths(&st.pod, image).into_iter().map(Some).collect();
        auths.push(None);
        let mut last = String::new();
        for auth in auths {
            match self.k.docker.pull(image, auth.as_deref()).await {
                Ok(()) => {
                    let took = started.elapsed().as_secs_f64();
                    let message = format!("Successfully pulled image \"{image}\" in {took:.3}s");
                    self.event(st, "Normal", "Pulled", &message, Some(name));
                    return Ok(());
                }
                Err(e) => last = e.to_string(),
            }
        }
        let message = format!("Failed to pull image \"{image}\": {last}");
        self.event(st, "Warning", "Failed", &message, Some(name));
        self.event(st, "Warning", "Failed", "Error: ErrImagePull", Some(name));
        Err(("ErrImagePull".into(), message))
    }

    /// Pull until it works (ErrImagePull, then ImagePullBackOff between attempts).
    pub(super) async fn pull(&self, st: &mut PodState, init: bool, index: usize, container: &Value) {
        let mut attempt = 0;
        loop {
            match self.pull_once(st, container).await {
                Ok(()) => return,
                Err((reason, message)) => {
                    let image = container["image"].as_str().unwrap_or_default().to_string();
                    let name = container["name"].as_str().unwrap_or_default().to_string();
                    set_waiting(st, init, index, &reason, Some(&message));
                    self.publish(st);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if reason == "ErrImagePull" {
                        let message = format!("Back-off pulling image \"{image}\"");
                        set_waiting(st, init, index, "ImagePullBackOff", Some(&message));
                        self.event(st, "Normal", "BackOff", &message, Some(&name));
                        self.event(st, "Warning", "Failed", "Error: ImagePullBackOff", Some(&name));
                        self.publish(st);
                    }
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                }
            }
        }
    }

    /// The pod's volumes: Docker volumes, host paths, secret/configMap files.
    pub(super) async fn volumes(&self, st: &PodState) -> Result<BTreeMap<String, Source>, String> {
        let mut volumes = BTreeMap::new();
        let uid = st.pod["metadata"]["uid"].as_str().unwrap_or_default();
        for volume in st.pod["spec"]["volumes"].as_array().into_iter().flatten() {
            let name = volume["name"].as_str().unwrap_or_default().to_string();
            let source = if volume.get("emptyDir").is_some() {
                let docker_name = format!("fake-kube-{uid}-{name}");
                self.k
                    .docker
                    .create_volume(&docker_name, &spec::labels(&st.pod, &name))
                    .await
                    .map_err(|e| format!("MountVolume.SetUp failed for volume \"{name}\" : {e}"))?;
                let info = self
                    .k
                    .docker
                    .call("GET", &format!("/volumes/{docker_name}"), None)
                    .await
                    .map_err(|e| e.to_string())?;
                let mountpoint: String = info["Mountpoint"].as_str().unwrap_or_default().into();
                // The kubelet makes an emptyDir world-writable (0777), so a non-root container
                // can write to it.
                use std::os::unix::fs::PermissionsExt;
                let _ = std::fs::set_permissions(&mountpoint, std::fs::Permissions::from_mode(0o777));
                Source::DockerVolume { name: docker_name, mountpoint }
            } else if let Some(path) = volume["hostPath"]["path"].as_str() {
                let kind = volume["hostPath"]["type"].as_str().unwrap_or("");
                if matches!(kind, "DirectoryOrCreate") {
                    std::fs::create_dir_all(path).map_err(|e| format!("hostPath {path}: {e}"))?;
                }
                Source::HostPath { path: path.to_string(), read_only: false }
            } else if volume.get("secret").is_some() || volume.get("configMap").is_some() {
                let (resource, key_name, object_name) = if volume.get("secret").is_some() {
                    (SECRETS, "secret", volume["secret"]["secretName"].as_str().unwrap_or_default())
                } else {
                    (CONFIGMAPS, "configmap", volume["configMap"]["name"].as_str().unwrap_or_default())
                };
                let spec_of = if resource == SECRETS { &volume["secret"] } else { &volume["configMap"] };
                let optional = spec_of["optional"].as_bool().unwrap_or(false);
                let object = match self.k.store.get(resource, &Ctx::ns(&st.pod), object_name) {
                    Some(o) => o,
                    None if optional => json!({}),
                    None => {
                        return Err(format!(
                            "MountVolume.SetUp failed for volume \"{name}\" : {key_name} \"{object_name}\" not found"
                        ))
                    }
                };
                let dir = self.dir.join("volumes").join(&name);
                std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
                write_files(&dir, &object, spec_of, resource == SECRETS).map_err(|e| e.to_string())?;
                Source::HostPath { path: dir.display().to_string(), read_only: true }
            } else if volume.get("projected").is_some() {
                let dir = self.dir.join("volumes").join(&name);
                std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
                super::projected::write(&self.k, &st.pod, volume, &dir)?;
                Source::HostPath { path: dir.display().to_string(), read_only: true }
            } else {
                return Err(format!(
                    "volume \"{name}\": only emptyDir, hostPath, secret, configMap and projected are supported"
                ));
            };
            volumes.insert(name, source);
        }
        Ok(volumes)
    }

    pub(super) fn env(&self, pod: &Value, container: &Value) -> Vec<(String, String)> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let ns = Ctx::ns(pod);
        let mut env: Vec<(String, String)> = super::projected::service_env(&self.k);
        let mut known: BTreeMap<String, String> = env.iter().cloned().collect();
        let push = |env: &mut Vec<(String, String)>, known: &mut BTreeMap<String, String>, k: String, v: String| {
            known.insert(k.clone(), v.clone());
            env.retain(|(name, _)| *name != k);
            env.push((k, v));
        };
        for source in container["envFrom"].as_array().into_iter().flatten() {
            let prefix = source["prefix"].as_str().unwrap_or("");
            if let Some(name) = source["configMapRef"]["name"].as_str() {
                for (k, v) in self
                    .k
                    .store
                    .get(CONFIGMAPS, &ns, name)
                    .and_then(|c| c["data"].as_object().cloned())
                    .into_iter()
                    .flatten()
                {
                    push(&mut env, &mut known, format!("{prefix}{k}"), v.as_str().unwrap_or_default().to_string());
                }
            }
            if let Some(name) = source["secretRef"]["name"].as_str() {
                for (k, v) in self
                    .k
                    .store
                    .get(SECRETS, &ns, name)
                    .and_then(|c| c["data"].as_object().cloned())
                    .into_iter()
                    .flatten()
                {
                    let value = v.as_str().and_then(|s| b64.decode(s).ok()).unwrap_or_default();
                    push(&mut env, &mut known, format!("{prefix}{k}"), String::from_utf8_lossy(&value).to_string());
                }
            }
        }
        for var in container["env"].as_array().into_iter().flatten() {
            let Some(name) = var["name"].as_str() else { continue };
            let from = &var["valueFrom"];
            let value = if let Some(v) = var["value"].as_str() {
                spec::expand(v, &known)
            } else if let Some(key) = from["secretKeyRef"]["key"].as_str() {
                let secret = self.k.store.get(SECRETS, &ns, from["secretKeyRef"]["name"].as_str().unwrap_or_default());
                let raw =
                    secret.and_then(|s| s["data"][key].as_str().and_then(|v| b64.decode(v).ok())).unwrap_or_default();
                String::from_utf8_lossy(&raw).to_string()
            } else if let Some(key) = from["configMapKeyRef"]["key"].as_str() {
                let map =
                    self.k.store.get(CONFIGMAPS, &ns, from["configMapKeyRef"]["name"].as_str().unwrap_or_default());
                map.and_then(|m| m["data"][key].as_str().map(String::from)).unwrap_or_default()
            } else if let Some(path) = from["fieldRef"]["fieldPath"].as_str() {
                match path {
                    "spec.nodeName" => NODE.to_string(),
                    "status.hostIP" | "status.podIP" => "127.0.0.1".to_string(),
                    _ => {
                        let mut current = pod;
                        for part in path.split('.') {
                            current = &current[part];
                        }
                        current.as_str().map(String::from).unwrap_or_default()
                    }
                }
            } else {
                String::new()
            };
            push(&mut env, &mut known, name.to_string(), value);
        }
        env
    }

    /// Create and start one container: its id.
    pub(super) async fn start(
        &self,
        st: &mut PodState,
        init: bool,
        index: usize,
        ctx: &spec::Context<'_>,
    ) -> Result<String, StartFailure> {
        let container = &st.pod["spec"][if init { "initContainers" } else { "containers" }][index];
        let name = container["name"].as_str().unwrap_or_default().to_string();
        let config = spec::container_config(&st.pod, container, ctx).map_err(StartFailure::Config)?;
        let restarts = if init { st.init[index].restarts } else { st.app[index].restarts };
        let uid = st.pod["metadata"]["uid"].as_str().unwrap_or_default();
        let pod_name = st.pod["metadata"]["name"].as_str().unwrap_or("");
        let docker_name = format!("k8s_{name}_{pod_name}_{}_{uid}_{restarts}", Ctx::ns(&st.pod));
        let id = self
            .k
            .docker
            .create_container(&docker_name, &config)
            .await
            .map_err(|e| StartFailure::Create(e.to_string()))?;
        {
            let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(old) = running.current.insert(name.clone(), id.clone()) {
                running.previous.insert(name.clone(), old);
            }
        }
        self.event(st, "Normal", "Created", &format!("Created container: {name}"), Some(&name));
        let c = if init { &mut st.init[index] } else { &mut st.app[index] };
        c.id = Some(id.clone());
        if let Err(e) = self.k.docker.start(&id).await {
            let message = format!("Error: failed to start container \"{name}\": {e}");
            self.event(st, "Warning", "Failed", &message, Some(&name));
            return Err(StartFailure::Start { id, message: e.to_string() });
        }
        self.event(st, "Normal", "Started", &format!("Started container {name}"), Some(&name));
        let started = self.k.docker.inspect(&id).await.ok().and_then(|i| i["State"]["StartedAt"].as_str().map(rfc3339));
        let c = if init { &mut st.init[index] } else { &mut st.app[index] };
        c.state = json!({"running": {"startedAt": started.unwrap_or_else(now_rfc3339)}});
        Ok(id)
    }

    /// The terminated state of an exited container.
    pub(super) async fn terminated(&self, id: &str, exit: i64) -> Value {
        let info = self.k.docker.inspect(id).await.unwrap_or_default();
        let oom = info["State"]["OOMKilled"].as_bool().unwrap_or(false);
        let reason = if oom {
            "OOMKilled"
        } else if exit == 0 {
            "Completed"
        } else {
            "Error"
        };
        json!({"terminated": {
            "exitCode": exit,
            "reason": reason,
            "startedAt": info["State"]["StartedAt"].as_str().map(rfc3339),
            "finishedAt": info["State"]["FinishedAt"].as_str().map(rfc3339).unwrap_or_else(now_rfc3339),
            "containerID": format!("docker://{id}"),
        }})
    }
}

/// Why a container did not start.
#[derive(Debug)]
pub(super) enum StartFailure {
    /// Its configuration is wrong (a mount of an unknown volume): CreateContainerConfigError.
    Config(String),
    /// The engine refused to create it: CreateContainerError.
    Create(String),
    /// Created, but the runtime could not start it: terminated, exit code 128, StartError.
    Start { id: String, message: String },
}

/// Docker's nanosecond timestamps as the API's seconds.
pub(super) fn rfc3339(text: &str) -> String {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&chrono::Utc).format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|_| now_rfc3339())
}

pub(super) fn set_waiting(st: &mut PodState, init: bool, index: usize, reason: &str, message: Option<&str>) {
    let c = if init { &mut st.init[index] } else { &mut st.app[index] };
    let mut waiting = json!({"reason": reason});
    if let Some(message) = message {
        waiting["message"] = json!(message);
    }
    c.state = json!({"waiting": waiting});
}

/// Secret (base64 `data`) or configMap (`data`, `binaryData`) keys as files, `items` honoured.
pub(super) fn write_files(dir: &std::path::Path, object: &Value, spec: &Value, secret: bool) -> std::io::Result<()> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for (key, value) in object["data"].as_object().into_iter().flatten() {
        let text = value.as_str().unwrap_or_default();
        let bytes = if secret { b64.decode(text).unwrap_or_default() } else { text.as_bytes().to_vec() };
        files.push((key.clone(), bytes));
    }
    for (key, value) in object["binaryData"].as_object().into_iter().flatten() {
        files.push((key.clone(), b64.decode(value.as_str().unwrap_or_default()).unwrap_or_default()));
    }
    let mode = spec["defaultMode"].as_u64().unwrap_or(0o644) as u32;
    let items: Vec<&Value> = spec["items"].as_array().into_iter().flatten().collect();
    for (key, bytes) in files {
        let (path, item_mode) = if items.is_empty() {
            (key.clone(), None)
        } else {
            match items.iter().find(|i| i["key"].as_str() == Some(&key)) {
                Some(item) => (item["path"].as_str().unwrap_or(&key).to_string(), item["mode"].as_u64()),
                None => continue,
            }
        };
        if path.split('/').any(|p| p == "..") {
            continue;
        }
        let file = dir.join(&path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&file, bytes)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(item_mode.map(|m| m as u32).unwrap_or(mode)))?;
    }
    Ok(())
}
