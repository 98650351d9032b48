//! The `googlecompute` fleeting plugin (plugins/fleeting-gcp) against a fake Google Cloud written here from the REST
//! documentation (OAuth 2.0 for service accounts: the JWT-bearer grant, its RS256 signature
//! checked with the key's public half; Compute Engine's instanceGroupManagers get, resize,
//! listManagedInstances with `maxResults`/`pageToken`, deleteInstances, zone operations
//! RUNNING → DONE, instances get; Google's error bodies; 429 `rateLimitExceeded`), served on
//! 127.0.0.1 by the test. The plugin runs sandboxed in the plugin host as `runway run` runs
//! it: it reaches the fake only because the grant names it, and reads its key file only
//! through a read-only `dirs` grant.
//!
//! `runway run` drives the same fake with real `sshd`s on the addresses it hands out: a Spot VM
//! preempted under a running job drains it (a log line in the job), and the job fails with
//! `runner_system_failure` when the VM is gone.
//!
//! docker+machine with `MachineDriver = "google"` drives the fake's individual instances
//! (projects get; instances insert, list with a label filter, get and delete; zone
//! operations): the fake installs the `ssh-keys` metadata of the login user into the loopback
//! sshd's authorized keys, as Google's guest agent does on a VM, so a job reaches Docker on its
//! machine only with the key the plugin put there.
//!
//! Not run against the real Google Cloud.

#[path = "support/dockerd.rs"]
mod dockerd;
#[path = "support/runway_process.rs"]
mod runway_process;
#[path = "support/sshd.rs"]
mod sshd;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use runway::config::grant::PluginGrant;
use runway::plugin::fleeting::{
    ConnectorConfig, FleetingFailure, FleetingGroup, InstanceState, InterruptionKind, Protocol, ProviderError,
};
use runway::plugin::{HostSettings, PluginHost};
use serde_json::{json, Value};

const PROJECT: &str = "runway-test";
const ZONE: &str = "europe-west1-b";
const GROUP: &str = "runners";
const EMAIL: &str = "fleeting@runway-test.iam.gserviceaccount.com";

#[derive(Clone, Debug)]
struct Managed {
    name: String,
    index: u8,
    status: String,
    action: String,
    errors: Vec<String>,
    seen: u32,
}

#[derive(Default)]
struct Cloud {
    port: u16,
    /// The service account key's public half (PKCS#1 DER).
    public_key: Vec<u8>,
    target: u32,
    next: u8,
    instances: Vec<Managed>,
    tokens: Vec<String>,
    /// Operation name → polls left before DONE.
    operations: BTreeMap<String, u32>,
    throttle_next: bool,
    no_capacity: bool,
    log: Vec<String>,
    /// docker+machine's individual VMs.
    vms: Vec<Vm>,
    /// Names of the VMs deleted (gone from the zone).
    deleted_vms: Vec<String>,
    /// instances.insert `requestId`s answered, with their operation.
    requests: BTreeMap<String, Value>,
    /// The VMs' guest agent: the `ssh-keys` of user `.0` go into file `.1` (the sshd's
    /// authorized keys).
    agent: Option<(String, std::path::PathBuf)>,
}

/// The third octet of the VMs' internal addresses (127.0.VM_NET.4 on).
const VM_NET: u8 = 44;

/// One VM made with instances.insert.
#[derive(Clone, Debug)]
struct Vm {
    /// The insert request's body, as the VM was asked for.
    request: Value,
    index: u8,
    status: String,
    seen: u32,
}

type Shared = Arc<Mutex<Cloud>>;

fn google_error(status: StatusCode, reason: &str, message: &str) -> Response {
    let body = json!({"error": {
        "code": status.as_u16(),
        "message": message,
        "errors": [{"message": message, "domain": "global", "reason": reason}]
    }});
    (status, axum::Json(body)).into_response()
}

impl Cloud {
    fn operation(&mut self, kind: &str) -> Value {
        let name = format!("operation-{}", self.operations.len() + 1);
        self.operations.insert(name.clone(), 1);
        json!({
            "kind": "compute#operation",
            "name": name,
            "operationType": kind,
            "status": "RUNNING",
            "zone": format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}"),
            "selfLink": format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}/operations/{name}")
        })
    }

    /// One listing moves every instance one step: created → running, deleting → gone.
    fn advance(&mut self) {
        for m in &mut self.instances {
            m.seen += 1;
        }
        self.instances.retain(|m| !(m.action == "DELETING" && m.seen > 1));
        for m in &mut self.instances {
            if m.action == "CREATING" && m.errors.is_empty() && m.seen > 1 {
                m.action = "NONE".into();
                m.status = "RUNNING".into();
            }
        }
    }

    fn managed_json(&self, m: &Managed) -> Value {
        let mut value = json!({
            "instance": format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/{}", m.name),
            "id": format!("{}", 1000 + u32::from(m.index)),
            "currentAction": m.action,
        });
        if !m.status.is_empty() {
            value["instanceStatus"] = json!(m.status);
        }
        if !m.errors.is_empty() {
            let errors: Vec<Value> = m
                .errors
                .iter()
                .map(|c| json!({"code": c, "message": format!("The zone '{ZONE}' does not have enough resources available to fulfill the request.")}))
                .collect();
            value["lastAttempt"] = json!({"errors": {"errors": errors}});
        }
        value
    }
}

/// Check a JWT-bearer assertion: RS256 signature by the known key, issuer, audience, scope.
fn assertion_ok(cloud: &Cloud, assertion: &str) -> bool {
    let parts: Vec<&str> = assertion.split('.').collect();
    if parts.len() != 3 {
        return false;
    }
    let Ok(signature) = URL_SAFE_NO_PAD.decode(parts[2]) else { return false };
    let key = ring::signature::UnparsedPublicKey::new(&ring::signature::RSA_PKCS1_2048_8192_SHA256, &cloud.public_key);
    if key.verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &signature).is_err() {
        return false;
    }
    let claims: Value =
        URL_SAFE_NO_PAD.decode(parts[1]).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
    claims["iss"] == EMAIL
        && claims["aud"] == format!("http://127.0.0.1:{}/token", cloud.port)
        && claims["scope"].as_str().is_some_and(|s| s.contains("auth/compute"))
}

async fn serve(State(cloud): State<Shared>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body: Bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap_or_default();
    let path = parts.uri.path().to_string();
    let query: BTreeMap<String, String> =
        parts.uri.query().map(|q| url::form_urlencoded::parse(q.as_bytes()).into_owned().collect()).unwrap_or_default();
    let mut cloud = cloud.lock().expect("cloud");
    cloud.log.push(format!("{} {}", parts.method, parts.uri));
    if path == "/token" {
        let form: BTreeMap<String, String> = url::form_urlencoded::parse(&body).into_owned().collect();
        let grant_ok =
            form.get("grant_type").map(String::as_str) == Some("urn:ietf:params:oauth:grant-type:jwt-bearer");
        if !grant_ok || !form.get("assertion").is_some_and(|a| assertion_ok(&cloud, a)) {
            let body = json!({"error": "invalid_grant", "error_description": "Invalid JWT Signature."});
            return (StatusCode::BAD_REQUEST, axum::Json(body)).into_response();
        }
        let token = format!("ya29.token-{}", cloud.tokens.len() + 1);
        cloud.tokens.push(token.clone());
        return axum::Json(json!({"access_token": token, "expires_in": 3599, "token_type": "Bearer"})).into_response();
    }
    compute(&mut cloud, parts.method.as_str(), &path, &query, &parts.headers, &body)
}

/// A Compute Engine resource name (RFC 1035, at most 63 characters).
fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && !name.ends_with('-')
}

/// A label value: lowercase letters, digits, `_`, `-`, at most 63 characters.
fn valid_label(value: &str) -> bool {
    value.len() <= 63 && value.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-')
}

/// The `(labels.KEY = "VALUE") (...)` expressions of an instances.list filter; `None` when it
/// is not that form.
fn label_filter(filter: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    for expression in filter.split(')').map(str::trim).filter(|e| !e.is_empty()) {
        let (key, value) = expression.strip_prefix('(')?.split_once('=')?;
        let key = key.trim().strip_prefix("labels.")?.to_string();
        let value = value.trim().strip_prefix('"')?.strip_suffix('"')?.to_string();
        out.push((key, value));
    }
    Some(out)
}

impl Cloud {
    fn vm_json(&self, vm: &Vm) -> Value {
        let zone = format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}");
        let mut nic = json!({
            "network": vm.request["networkInterfaces"][0]["network"],
            "networkIP": format!("127.0.{VM_NET}.{}", 4 + vm.index),
        });
        if let Some(access) = vm.request["networkInterfaces"][0]["accessConfigs"].as_array() {
            let configs: Vec<Value> = access
                .iter()
                .map(|a| json!({"type": a["type"], "name": a["name"], "natIP": format!("127.0.{}.{}", VM_NET + 1, 4 + vm.index)}))
                .collect();
            nic["accessConfigs"] = json!(configs);
        }
        json!({
            "kind": "compute#instance",
            "id": format!("{}", 5000 + u32::from(vm.index)),
            "name": vm.request["name"],
            "status": vm.status,
            "zone": zone,
            "machineType": format!("{zone}/machineTypes/{}", vm.request["machineType"].as_str().unwrap_or("").rsplit('/').next().unwrap_or("")),
            "labels": vm.request["labels"],
            "tags": vm.request["tags"],
            "metadata": {"kind": "compute#metadata", "fingerprint": "cHJvdmlkZWQ=", "items": vm.request["metadata"]["items"]},
            "scheduling": vm.request["scheduling"],
            "serviceAccounts": vm.request["serviceAccounts"],
            "networkInterfaces": [nic],
            "selfLink": format!("{zone}/instances/{}", vm.request["name"].as_str().unwrap_or(""))
        })
    }

    /// instances.insert: the request checked as the API checks it, the VM provisioning, the
    /// login user's `ssh-keys` installed as the guest agent installs them.
    fn insert(&mut self, query: &BTreeMap<String, String>, body: &[u8]) -> Response {
        if let Some(op) = query.get("requestId").and_then(|id| self.requests.get(id)) {
            return axum::Json(op.clone()).into_response();
        }
        let request: Value = match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => {
                return google_error(StatusCode::BAD_REQUEST, "parseError", &format!("Invalid JSON payload: {e}"))
            }
        };
        let invalid = |field: &str| {
            google_error(StatusCode::BAD_REQUEST, "invalid", &format!("Invalid value for field 'resource.{field}'"))
        };
        let name = request["name"].as_str().unwrap_or("").to_string();
        if !valid_name(&name) {
            return invalid("name");
        }
        if self.vms.iter().any(|v| v.request["name"] == name.as_str()) {
            return google_error(
                StatusCode::CONFLICT,
                "alreadyExists",
                &format!("The resource 'projects/{PROJECT}/zones/{ZONE}/instances/{name}' already exists"),
            );
        }
        if !request["machineType"].as_str().is_some_and(|t| t.contains(&format!("zones/{ZONE}/machineTypes/"))) {
            return invalid("machineType");
        }
        let disk = &request["disks"][0];
        if disk["boot"] != true
            || !disk["initializeParams"]["sourceImage"].as_str().is_some_and(|i| i.starts_with("projects/"))
        {
            return invalid("disks[0]");
        }
        if !request["networkInterfaces"][0]["network"].is_string() {
            return invalid("networkInterfaces[0].network");
        }
        if !request["labels"].as_object().is_some_and(|l| l.values().all(|v| v.as_str().is_some_and(valid_label))) {
            return invalid("labels");
        }
        if let Some((user, file)) = &self.agent {
            let items = request["metadata"]["items"].as_array().cloned().unwrap_or_default();
            let keys = items.iter().find(|i| i["key"] == "ssh-keys").and_then(|i| i["value"].as_str()).unwrap_or("");
            for line in keys.lines() {
                if let Some(key) = line.strip_prefix(&format!("{user}:")) {
                    let mut text = std::fs::read_to_string(file).unwrap_or_default();
                    text.push_str(&format!("{}\n", key.trim()));
                    std::fs::write(file, text).expect("authorized keys");
                }
            }
        }
        let index = self.next;
        self.next += 1;
        self.vms.push(Vm { request, index, status: "PROVISIONING".into(), seen: 0 });
        let op = self.operation("insert");
        if let Some(id) = query.get("requestId") {
            self.requests.insert(id.clone(), op.clone());
        }
        axum::Json(op).into_response()
    }

    /// instances.list: one listing moves every VM one step (provisioning → running,
    /// stopping → gone).
    fn list_vms(&mut self, query: &BTreeMap<String, String>) -> Response {
        let Some(filter) = label_filter(query.get("filter").map(String::as_str).unwrap_or("")) else {
            return google_error(StatusCode::BAD_REQUEST, "invalid", "Invalid value for field 'filter'");
        };
        for vm in &mut self.vms {
            vm.seen += 1;
        }
        let gone: Vec<String> = self
            .vms
            .iter()
            .filter(|v| v.status == "STOPPING" && v.seen > 1)
            .map(|v| v.request["name"].as_str().unwrap_or("").to_string())
            .collect();
        self.deleted_vms.extend(gone);
        self.vms.retain(|v| !(v.status == "STOPPING" && v.seen > 1));
        for vm in &mut self.vms {
            if vm.status == "PROVISIONING" && vm.seen > 1 {
                vm.status = "RUNNING".into();
            }
        }
        let items: Vec<Value> = self
            .vms
            .iter()
            .filter(|v| filter.iter().all(|(k, value)| v.request["labels"][k] == value.as_str()))
            .map(|v| self.vm_json(v))
            .collect();
        let mut answer =
            json!({"kind": "compute#instanceList", "id": format!("projects/{PROJECT}/zones/{ZONE}/instances")});
        if !items.is_empty() {
            answer["items"] = json!(items);
        }
        axum::Json(answer).into_response()
    }
}

fn compute(
    cloud: &mut Cloud,
    method: &str,
    path: &str,
    query: &BTreeMap<String, String>,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let bearer = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    if !bearer.is_some_and(|t| cloud.tokens.iter().any(|k| k == t)) {
        return google_error(
            StatusCode::UNAUTHORIZED,
            "authError",
            "Request had invalid authentication credentials. Expected OAuth 2 access token.",
        );
    }
    if std::mem::take(&mut cloud.throttle_next) {
        return google_error(
            StatusCode::TOO_MANY_REQUESTS,
            "rateLimitExceeded",
            "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute'.",
        );
    }
    if method == "GET" && path == format!("/compute/v1/projects/{PROJECT}") {
        return axum::Json(json!({"kind": "compute#project", "name": PROJECT, "id": "4242"})).into_response();
    }
    let zone = format!("/compute/v1/projects/{PROJECT}/zones/{ZONE}");
    let Some(rest) = path.strip_prefix(&zone) else {
        return google_error(StatusCode::NOT_FOUND, "notFound", &format!("The resource '{path}' was not found"));
    };
    let segments: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    match (method, segments.as_slice()) {
        ("GET", ["instanceGroupManagers", GROUP]) => axum::Json(json!({
            "kind": "compute#instanceGroupManager",
            "name": GROUP,
            "baseInstanceName": GROUP,
            "targetSize": cloud.target,
            "zone": format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}")
        }))
        .into_response(),
        ("POST", ["instanceGroupManagers", GROUP, "resize"]) => {
            let Some(size) = query.get("size").and_then(|s| s.parse::<u32>().ok()) else {
                return google_error(StatusCode::BAD_REQUEST, "required", "Required parameter: size");
            };
            while cloud.target < size {
                let index = cloud.next;
                cloud.next += 1;
                let errors =
                    if cloud.no_capacity { vec!["ZONE_RESOURCE_POOL_EXHAUSTED".to_string()] } else { Vec::new() };
                cloud.instances.push(Managed {
                    name: format!("{GROUP}-{index:04x}"),
                    index,
                    status: String::new(),
                    action: "CREATING".into(),
                    errors,
                    seen: 0,
                });
                cloud.target += 1;
            }
            axum::Json(cloud.operation("compute.instanceGroupManagers.resize")).into_response()
        }
        ("POST", ["instanceGroupManagers", GROUP, "listManagedInstances"]) => {
            let start: usize = query.get("pageToken").and_then(|t| t.strip_prefix("page-")?.parse().ok()).unwrap_or(0);
            if start == 0 {
                cloud.advance();
            }
            // The server may return fewer than maxResults: two a page.
            let max: usize = query.get("maxResults").and_then(|m| m.parse().ok()).unwrap_or(500).min(2);
            let page: Vec<Value> =
                cloud.instances.iter().skip(start).take(max).map(|m| cloud.managed_json(m)).collect();
            let mut answer = json!({"managedInstances": page});
            if start + max < cloud.instances.len() {
                answer["nextPageToken"] = json!(format!("page-{}", start + max));
            }
            axum::Json(answer).into_response()
        }
        ("POST", ["instanceGroupManagers", GROUP, "deleteInstances"]) => {
            let request: Value = serde_json::from_slice(body).unwrap_or_default();
            let urls: Vec<String> = request["instances"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
                .unwrap_or_default();
            for url in &urls {
                let name = url.rsplit('/').next().unwrap_or_default();
                if let Some(m) = cloud.instances.iter_mut().find(|m| m.name == name && m.action != "DELETING") {
                    m.action = "DELETING".into();
                    m.seen = 0;
                    cloud.target -= 1;
                }
            }
            axum::Json(cloud.operation("compute.instanceGroupManagers.deleteInstances")).into_response()
        }
        ("GET", ["operations", name]) => match cloud.operations.get_mut(*name) {
            Some(left) => {
                let status = if *left == 0 { "DONE" } else { "RUNNING" };
                *left = left.saturating_sub(1);
                axum::Json(json!({"kind": "compute#operation", "name": name, "status": status})).into_response()
            }
            None => google_error(
                StatusCode::NOT_FOUND,
                "notFound",
                &format!("The resource 'operations/{name}' was not found"),
            ),
        },
        ("POST", ["instances"]) => cloud.insert(query, body),
        ("GET", ["instances"]) => cloud.list_vms(query),
        ("GET", ["instances", name]) if cloud.vms.iter().any(|v| v.request["name"] == *name) => {
            let vm = cloud.vms.iter().find(|v| v.request["name"] == *name).cloned().expect("vm");
            axum::Json(cloud.vm_json(&vm)).into_response()
        }
        ("DELETE", ["instances", name]) => match cloud.vms.iter_mut().find(|v| v.request["name"] == *name) {
            Some(vm) => {
                vm.status = "STOPPING".into();
                vm.seen = 0;
                axum::Json(cloud.operation("delete")).into_response()
            }
            None => google_error(
                StatusCode::NOT_FOUND,
                "notFound",
                &format!("The resource 'projects/{PROJECT}/zones/{ZONE}/instances/{name}' was not found"),
            ),
        },
        ("GET", ["instances", name]) => {
            match cloud.instances.iter().find(|m| m.name == *name && !m.status.is_empty()) {
                Some(m) => axum::Json(json!({
                    "name": m.name,
                    "status": m.status,
                    "scheduling": {"preemptible": false, "provisioningModel": "SPOT"},
                    "networkInterfaces": [{
                        "networkIP": format!("127.0.40.{}", 4 + m.index),
                        "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "natIP": format!("127.0.41.{}", 4 + m.index)}]
                    }]
                }))
                .into_response(),
                None => google_error(
                    StatusCode::NOT_FOUND,
                    "notFound",
                    &format!("The resource 'projects/{PROJECT}/zones/{ZONE}/instances/{name}' was not found"),
                ),
            }
        }
        _ => google_error(StatusCode::NOT_FOUND, "notFound", &format!("no route {method} {path}")),
    }
}

/// A fake GitLab with runner `name` and the project its jobs clone.
async fn gitlab(name: &str) -> (fake_gitlab::FakeGitLab, fake_gitlab::CreatedRunner) {
    let fake = fake_gitlab::FakeGitLab::start_with(fake_gitlab::Config {
        long_poll: Duration::from_secs(1),
        trace_update_interval: 1,
    })
    .await;
    let runner = fake.create_runner(name);
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "hi\n")], "init");
    (fake, runner)
}

async fn start_cloud(public_key: Vec<u8>) -> Shared {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let cloud: Shared = Arc::new(Mutex::new(Cloud { port, public_key, ..Cloud::default() }));
    let app = axum::Router::new().fallback(serve).with_state(cloud.clone());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    cloud
}

/// A 2048-bit RSA key (PKCS#8 PEM) made by openssl, and its public half as PKCS#1 DER.
fn rsa_key(dir: &Path, name: &str) -> (String, Vec<u8>) {
    let pem = dir.join(format!("{name}.pem"));
    let der = dir.join(format!("{name}.der"));
    let ok = Command::new("openssl")
        .args(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out"])
        .arg(&pem)
        .stderr(Stdio::null())
        .status()
        .expect("openssl runs (apt-get install openssl)")
        .success();
    assert!(ok, "openssl genpkey");
    let ok = Command::new("openssl")
        .args(["rsa", "-RSAPublicKey_out", "-outform", "DER", "-in"])
        .arg(&pem)
        .arg("-out")
        .arg(&der)
        .stderr(Stdio::null())
        .status()
        .expect("openssl")
        .success();
    assert!(ok, "openssl rsa");
    (std::fs::read_to_string(&pem).expect("pem"), std::fs::read(&der).expect("der"))
}

fn key_file(private_key: &str, port: u16) -> String {
    json!({
        "type": "service_account",
        "project_id": PROJECT,
        "private_key_id": "0123456789abcdef",
        "private_key": private_key,
        "client_email": EMAIL,
        "client_id": "100000000000000000001",
        "token_uri": format!("http://127.0.0.1:{port}/token")
    })
    .to_string()
}

fn connector() -> ConnectorConfig {
    ConnectorConfig {
        os: "linux".into(),
        arch: "amd64".into(),
        protocol: Protocol::Ssh,
        protocol_port: 22,
        username: "runner".into(),
        password: None,
        key: None,
        use_static_credentials: true,
        keepalive_seconds: 30,
        timeout_seconds: 10,
    }
}

async fn states(group: &FleetingGroup) -> BTreeMap<String, InstanceState> {
    group.update().await.expect("update").into_iter().map(|i| (i.id, i.state)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managed_instance_group_resizes_deletes_reports_preemptions_and_refuses_a_bad_key() {
    let root = tempfile::tempdir().expect("tempdir");
    let keys = root.path().join("keys");
    std::fs::create_dir_all(&keys).expect("mkdir");
    let (good, public) = rsa_key(&keys, "good");
    let (other, _) = rsa_key(&keys, "other");
    let cloud = start_cloud(public).await;
    let port = cloud.lock().expect("cloud").port;
    let creds = root.path().join("gcp");
    std::fs::create_dir_all(&creds).expect("mkdir");
    std::fs::write(creds.join("good.json"), key_file(&good, port)).expect("key file");
    std::fs::write(creds.join("unknown.json"), key_file(&other, port)).expect("key file");
    let grant = PluginGrant {
        allow_hosts: vec![format!("127.0.0.1:{port}")],
        dirs: vec![format!("{}:/gcp:ro", creds.display())],
        ..PluginGrant::default()
    };
    let host = PluginHost::new(HostSettings {
        state_dir: Some(root.path().join("state")),
        grants: BTreeMap::from([("googlecompute".to_string(), grant)]),
        builtins: runway::plugin::builtin_plugins(),
        cache_dir: Some(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")),
        ..HostSettings::default()
    })
    .await
    .expect("host");
    let config = |file: &str| {
        json!({
            "project": PROJECT,
            "zone": ZONE,
            "name": GROUP,
            "credentials_file": format!("/gcp/{file}"),
            "endpoint": format!("http://127.0.0.1:{port}")
        })
        .to_string()
    };

    // A key Google does not know: the token is refused, init fails as a configuration error.
    match FleetingGroup::start(&host, "googlecompute", connector(), &config("unknown.json")).await {
        Err(FleetingFailure::Provider(ProviderError::InvalidConfig(m))) => {
            assert!(m.contains("invalid_grant") && m.contains(EMAIL), "{m}")
        }
        Err(other) => panic!("unexpected {other}"),
        Ok(_) => panic!("an unknown key was accepted"),
    }
    // A key file outside the granted directory cannot be read at all.
    let outside = root.path().join("keys").join("good.pem");
    let escaped =
        json!({"project": PROJECT, "zone": ZONE, "name": GROUP, "credentials_file": outside.display().to_string()});
    match FleetingGroup::start(&host, "googlecompute", connector(), &escaped.to_string()).await {
        Err(FleetingFailure::Provider(ProviderError::InvalidConfig(m))) => assert!(m.contains("cannot read"), "{m}"),
        Err(other) => panic!("unexpected {other}"),
        Ok(_) => panic!("a file outside the grant was read"),
    }
    assert!(cloud.lock().expect("cloud").tokens.is_empty());

    let (group, info) =
        FleetingGroup::start(&host, "googlecompute", connector(), &config("good.json")).await.expect("init");
    assert_eq!(info.id, format!("googlecompute/{PROJECT}/{ZONE}/{GROUP}"));

    // Scale up: resize, the zone operation followed to DONE through the operations URL.
    assert_eq!(group.increase(3).await.expect("increase"), 3);
    let log = cloud.lock().expect("cloud").log.clone();
    assert!(log.iter().any(|l| l.contains("/resize?size=3")), "{log:?}");
    assert!(log.iter().any(|l| l.contains("/operations/operation-1")), "the operation was followed: {log:?}");
    let first = states(&group).await;
    assert_eq!(first.len(), 3, "{first:?}");
    assert!(first.values().all(|s| *s == InstanceState::Creating), "{first:?}");
    cloud.lock().expect("cloud").throttle_next = true;
    let running = states(&group).await;
    assert!(running.values().all(|s| *s == InstanceState::Running), "{running:?}");
    assert!(
        cloud.lock().expect("cloud").log.iter().any(|l| l.contains("pageToken=page-2")),
        "the second page was read"
    );

    let info = group.connect_info("runners-0001").await.expect("connect info");
    assert_eq!(
        (info.internal_addr.as_deref(), info.external_addr.as_deref()),
        (Some("127.0.40.5"), Some("127.0.41.5"))
    );
    assert!(matches!(
        group.connect_info("runners-ffff").await,
        Err(FleetingFailure::Provider(ProviderError::NotFound(_)))
    ));
    group.heartbeat("runners-0001").await.expect("heartbeat");

    // Scale down: deleteInstances on the chosen instance; the target size follows.
    assert_eq!(group.decrease(vec!["runners-0000".into()]).await.expect("decrease"), vec!["runners-0000".to_string()]);
    assert_eq!(cloud.lock().expect("cloud").target, 2);
    assert_eq!(states(&group).await.get("runners-0000"), Some(&InstanceState::Deleting));
    let after = states(&group).await;
    assert_eq!(after.keys().cloned().collect::<Vec<_>>(), vec!["runners-0001".to_string(), "runners-0002".to_string()]);
    assert!(group.interruptions().await.expect("interruptions").is_empty());

    // A Spot VM preempted: stopping without the plugin asking.
    if let Some(m) = cloud.lock().expect("cloud").instances.iter_mut().find(|m| m.name == "runners-0002") {
        m.status = "STOPPING".into();
    }
    let notices = group.interruptions().await.expect("interruptions");
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!((notices[0].id.as_str(), notices[0].kind), ("runners-0002", InterruptionKind::SpotReclaim));
    assert_eq!(states(&group).await.get("runners-0002"), Some(&InstanceState::Deleting));
    assert!(group.heartbeat("runners-0002").await.is_err());

    // No capacity in the zone: the new instance's creation fails; it is reported timed out and
    // further increases are capacity errors with a retry-after, without calling Google.
    cloud.lock().expect("cloud").no_capacity = true;
    assert_eq!(group.increase(1).await.expect("the resize itself succeeds"), 1);
    let listed = states(&group).await;
    assert_eq!(listed.get("runners-0003"), Some(&InstanceState::Timeout), "{listed:?}");
    let resizes = cloud.lock().expect("cloud").log.iter().filter(|l| l.contains("/resize")).count();
    match group.increase(1).await {
        Err(FleetingFailure::Provider(ProviderError::Capacity(c))) => {
            assert!(c.retry_after_seconds > 0 && c.message.contains("ZONE_RESOURCE_POOL_EXHAUSTED"), "{c:?}")
        }
        other => panic!("expected a capacity error, got {other:?}"),
    }
    assert_eq!(cloud.lock().expect("cloud").log.iter().filter(|l| l.contains("/resize")).count(), resizes);
}

/// Wait until `check` holds for job `job`; its record.
async fn job_where(
    fake: &fake_gitlab::FakeGitLab,
    job: i64,
    what: &str,
    runway: &runway_process::RunwayProcess,
    check: impl Fn(&fake_gitlab::JobRecord) -> bool,
) -> fake_gitlab::JobRecord {
    match fake.wait_for_job_state(job, check, Duration::from_secs(120)).await {
        Some(record) => record,
        None => panic!(
            "job {job}: {what}; trace:\n{}\nrunway log:\n{}",
            fake.job(job).map(|j| j.trace_text()).unwrap_or_default(),
            runway.log()
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_vm_is_drained_under_its_job_which_fails_as_a_system_failure_when_it_goes() {
    let root = tempfile::tempdir().expect("tempdir");
    let (private, public) = rsa_key(root.path(), "sa");
    let cloud = start_cloud(public).await;
    let port = cloud.lock().expect("cloud").port;
    let creds = root.path().join("gcp");
    std::fs::create_dir_all(&creds).expect("mkdir");
    std::fs::write(creds.join("sa.json"), key_file(&private, port)).expect("key file");
    // The fake gives instance n the internal address 127.0.40.(4+n): one sshd listens on them.
    let key = sshd::ClientKey::generate();
    let addrs: Vec<Ipv4Addr> = (4..8).map(|last| Ipv4Addr::new(127, 0, 40, last)).collect();
    let ssh_port = sshd::free_port(addrs[0]);
    let ssh = sshd::SshServer::start_on_many(&addrs, ssh_port, &key);
    let (fake, runner) = gitlab("gcp-fleet").await;
    let dir = root.path().join("runway");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let config = format!(
        r#"concurrent = 2
check_interval = 1
shutdown_timeout = 10

[plugins.googlecompute]
allow_hosts = ["127.0.0.1:{port}"]
dirs = ["{creds}:/gcp:ro"]

[[runners]]
name = "gcp-fleet"
url = "{url}"
token = "{token}"
executor = "instance"
builds_dir = "{builds}"

[runners.autoscaler]
plugin = "googlecompute"
max_instances = 2
update_interval = "1s"
update_interval_when_expecting = "1s"
deletion_retry_interval = "2s"

[runners.autoscaler.plugin_config]
project = "{PROJECT}"
zone = "{ZONE}"
name = "{GROUP}"
credentials_file = "/gcp/sa.json"
endpoint = "http://127.0.0.1:{port}"

[runners.autoscaler.connector_config]
username = "{user}"
key_path = "{key}"
protocol_port = {ssh_port}
timeout = "10s"

[[runners.autoscaler.policy]]
idle_count = 1
idle_time = "1h"
"#,
        creds = creds.display(),
        url = fake.url(),
        token = runner.token,
        builds = dir.join("builds").display(),
        user = ssh.user,
        key = key.private_path.display(),
    );
    std::fs::write(dir.join("config.toml"), config).expect("config.toml");
    let mut runway = runway_process::RunwayProcess::new(dir.clone()).quit_on_drop();
    runway.start();

    let never = dir.join("never");
    let job = fake.enqueue(fake.job_payload(&fake_gitlab::JobSpec::new(
        "group/project",
        "on-spot",
        &["echo started", &format!("while [ ! -e {} ]; do sleep 0.2; done", never.display())],
    )));
    let record = job_where(&fake, job, "did not start", &runway, |j| j.trace_text().contains("started")).await;
    let trace = record.trace_text();
    let instance = trace
        .lines()
        .find_map(|l| l.split("Instance ").nth(1).and_then(|r| r.split_whitespace().next()))
        .unwrap_or_else(|| panic!("no instance line:\n{trace}"))
        .to_string();

    // Google preempts the Spot VM: it is stopping, the plugin reports an interruption.
    if let Some(m) = cloud.lock().expect("cloud").instances.iter_mut().find(|m| m.name == instance) {
        m.status = "STOPPING".into();
    }
    let notice = format!(
        "The googlecompute fleeting provider is reclaiming instance {instance} (spot/preemptible capacity reclaimed)"
    );
    job_where(&fake, job, "no interruption line", &runway, |j| j.trace_text().contains(&notice)).await;
    // Drained, not lost: the job still runs, and the idle slot is replaced on another VM.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !cloud.lock().expect("cloud").instances.iter().any(|m| m.name != instance && m.status == "RUNNING") {
        assert!(Instant::now() < deadline, "no replacement:\n{}", runway.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(fake.job(job).map(|j| j.final_state.is_none()), Some(true), "the job ended early");

    // The VM goes away: the job fails as a system failure, so `retry:` applies.
    {
        let mut cloud = cloud.lock().expect("cloud");
        cloud.instances.retain(|m| m.name != instance);
        cloud.target -= 1;
    }
    let record = job_where(&fake, job, "did not fail", &runway, |j| j.final_state.is_some()).await;
    let trace = record.trace_text();
    assert_eq!(record.failure_reason.as_deref(), Some("runner_system_failure"), "{trace}");
    assert!(
        trace.contains(&format!("Instance {instance} was taken away by the googlecompute fleeting provider")),
        "{trace}"
    );

    // The next job runs on the replacement.
    let next = fake.enqueue(fake.job_payload(&fake_gitlab::JobSpec::new("group/project", "after", &["echo after"])));
    let record = job_where(&fake, next, "did not finish", &runway, |j| j.final_state.is_some()).await;
    assert_eq!(record.status, fake_gitlab::JobStatus::Success, "{}", record.trace_text());
    assert!(!record.trace_text().contains(&format!("Instance {instance} ")), "{}", record.trace_text());
}

/// The VMs the fake knows, as instances.get answers.
fn vms(cloud: &Shared) -> Vec<Value> {
    let cloud = cloud.lock().expect("cloud");
    cloud.vms.iter().map(|v| cloud.vm_json(v)).collect()
}

/// Wait until `check` holds for the VMs; them.
async fn wait_vms(
    cloud: &Shared,
    what: &str,
    runway: &runway_process::RunwayProcess,
    check: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let now = vms(cloud);
        if check(&now) {
            return now;
        }
        assert!(Instant::now() < deadline, "{what}: the VMs are {now:#?}\nrunway log:\n{}", runway.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn running(vms: &[Value]) -> Vec<String> {
    vms.iter().filter(|v| v["status"] == "RUNNING").filter_map(|v| v["name"].as_str().map(str::to_string)).collect()
}

/// SIGQUIT `runway` and wait for it to exit.
async fn quit(runway: &mut runway_process::RunwayProcess) {
    let pid = runway.pid().expect("running") as i32;
    // SAFETY: signalling and polling our own child.
    unsafe {
        libc::kill(pid, libc::SIGQUIT);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) } != pid {
        assert!(Instant::now() < deadline, "runway did not exit:\n{}", runway.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_machine_config_with_the_google_driver_creates_vms_runs_a_job_in_docker_and_deletes_them() {
    let docker = tokio::task::spawn_blocking(dockerd::shared).await.expect("daemon");
    let root = tempfile::tempdir().expect("tempdir");
    let (private, public) = rsa_key(root.path(), "sa");
    let cloud = start_cloud(public).await;
    let port = cloud.lock().expect("cloud").port;
    // The key file docker-machine's driver finds through GOOGLE_APPLICATION_CREDENTIALS.
    let creds = root.path().join("gcp");
    std::fs::create_dir_all(&creds).expect("mkdir");
    let key_file_path = creds.join("sa.json");
    std::fs::write(&key_file_path, key_file(&private, port)).expect("key file");
    // One sshd on the VMs' internal addresses. Its own key is one the runner never sees; the
    // keys of the VMs' `ssh-keys` metadata reach it through the fake's guest agent.
    let own = sshd::ClientKey::generate();
    let agent_keys = root.path().join("agent-keys");
    std::fs::write(&agent_keys, "").expect("agent keys");
    let addrs: Vec<Ipv4Addr> = (4..20).map(|last| Ipv4Addr::new(127, 0, VM_NET, last)).collect();
    let ssh_port = sshd::free_port(addrs[0]);
    let extra = format!("AuthorizedKeysCommand /bin/cat {}\nAuthorizedKeysCommandUser root\n", agent_keys.display());
    let ssh = sshd::SshServer::start_on_many_with(&addrs, ssh_port, &own, &extra);
    cloud.lock().expect("cloud").agent = Some((ssh.user.clone(), agent_keys.clone()));
    let (fake, runner) = gitlab("gitlab-gcp-autoscaler").await;
    let dir = root.path().join("runway");
    std::fs::create_dir_all(&dir).expect("mkdir");
    // GitLab's docker+machine example with the google driver, with what this machine needs
    // instead of Google: the fake's endpoint, sshd's user and port (not 22), the
    // internal address (the NAT addresses are not on loopback), the Docker Engine's socket. No
    // [plugins.googlecompute]: the grant comes from the driver flags and the key file.
    let config = format!(
        r#"concurrent = 4
check_interval = 1
shutdown_timeout = 30

[[runners]]
  name = "gitlab-gcp-autoscaler"
  url = "{url}"
  token = "{token}"
  executor = "docker+machine"
  limit = 3
  [runners.docker]
    image = "{image}"
    host = "{host}"
    pull_policy = ["if-not-present"]
    network_mode = "host"
    disable_cache = true
  [runners.machine]
    IdleCount = 1
    IdleTime = 1800
    MaxBuilds = 1
    MachineDriver = "google"
    MachineName = "gitlab-docker-machine-%s"
    MachineOptions = [
      "google-project={PROJECT}",
      "google-zone={ZONE}",
      "google-machine-type=n2-standard-2",
      "google-machine-image=https://www.googleapis.com/compute/v1/projects/my-images/global/images/family/docker-host",
      "google-disk-size=50",
      "google-disk-type=pd-ssd",
      "google-tags=gitlab-runner,ci",
      "google-preemptible=true",
      "google-use-internal-ip",
      "google-username={user}",
      "google-ssh-port={ssh_port}",
      "google-endpoint=http://127.0.0.1:{port}",
      "google-open-port=8080/tcp",
      "engine-registry-mirror=https://mirror.example",
    ]
"#,
        url = fake.url(),
        token = runner.token,
        image = docker.job_image(),
        host = docker.host(),
        user = ssh.user,
    );
    std::fs::write(dir.join("config.toml"), config).expect("config.toml");
    let mut runway = runway_process::RunwayProcess::new(dir.clone())
        .env("GOOGLE_APPLICATION_CREDENTIALS", &key_file_path.display().to_string());
    runway.start();

    // IdleCount 1: one VM, created as docker-machine's driver creates it.
    let created = wait_vms(&cloud, "one idle VM", &runway, |v| running(v).len() == 1).await;
    let first = created[0].clone();
    let name = first["name"].as_str().expect("name").to_string();
    assert!(name.starts_with("runner-") && name.contains("-gitlab-docker-machine-") && !name.contains("%s"), "{name}");
    let request = cloud.lock().expect("cloud").vms[0].request.clone();
    assert_eq!(request["machineType"], format!("zones/{ZONE}/machineTypes/n2-standard-2"));
    let disk = &request["disks"][0]["initializeParams"];
    assert_eq!(
        (disk["sourceImage"].as_str(), disk["diskSizeGb"].as_str(), disk["diskType"].as_str()),
        (
            Some("projects/my-images/global/images/family/docker-host"),
            Some("50"),
            Some(format!("zones/{ZONE}/diskTypes/pd-ssd").as_str())
        ),
        "{request:#}"
    );
    assert_eq!(request["tags"]["items"], json!(["docker-machine", "gitlab-runner", "ci"]));
    assert_eq!(request["scheduling"]["preemptible"], true);
    assert_eq!(request["networkInterfaces"][0]["network"], format!("projects/{PROJECT}/global/networks/default"));
    let items = request["metadata"]["items"].as_array().cloned().unwrap_or_default();
    let meta = |key: &str| items.iter().find(|i| i["key"] == key).and_then(|i| i["value"].as_str()).map(str::to_string);
    assert!(meta("runway-machine").is_some_and(|t| t.ends_with("-gitlab-docker-machine-%s")), "{items:?}");
    let manager = meta("runway-manager").expect("the manager's identity in the metadata");
    assert_eq!(request["labels"]["runway-manager"], manager.to_lowercase().as_str());
    let ssh_keys = meta("ssh-keys").expect("ssh-keys");
    let user = &ssh.user;
    assert!(
        ssh_keys.starts_with(&format!("{user}:ssh-ed25519 AAAA")) && ssh_keys.ends_with(&format!(" {user}")),
        "{ssh_keys}"
    );
    for warned in [
        "MachineOptions google-open-port: not used by Runway (ignored)",
        "MachineOptions engine-registry-mirror: not used by Runway (ignored)",
    ] {
        assert!(runway.log().contains(warned), "{warned} not logged:\n{}", runway.log());
    }

    // A job runs in the job image, in Docker on the VM, reached over SSH with the key the
    // plugin put in the VM's metadata.
    let job = fake.enqueue(fake.job_payload(&fake_gitlab::JobSpec::new(
        "group/project",
        "build",
        &["cat /etc/runway-image", "echo done"],
    )));
    let record = job_where(&fake, job, "did not finish", &runway, |j| j.final_state.is_some()).await;
    let trace = record.trace_text();
    assert_eq!(record.status, fake_gitlab::JobStatus::Success, "{trace}\nrunway log:\n{}", runway.log());
    assert!(trace.lines().any(|l| l.trim() == "job"), "ran in the job image:\n{trace}");
    assert!(trace.contains(&format!("Connected to instance {name} over SSH")), "ran on {name}:\n{trace}");

    // MaxBuilds 1: the VM that ran it is deleted, and IdleCount brings a new one.
    let after = wait_vms(&cloud, "the used VM deleted and a new idle one", &runway, |v| {
        !v.iter().any(|x| x["name"] == name.as_str()) && running(v).len() == 1
    })
    .await;
    assert!(cloud.lock().expect("cloud").deleted_vms.contains(&name), "the fake saw {name} deleted");
    let idle = running(&after)[0].clone();

    // A restarted manager (the same system ID) adopts its idle VM from its fleet state, and its
    // plugin keeps the key that VM authorizes (no second key made).
    quit(&mut runway).await;
    let mut again = runway_process::RunwayProcess::new(dir.clone())
        .env("GOOGLE_APPLICATION_CREDENTIALS", &key_file_path.display().to_string());
    again.start();
    let deadline = Instant::now() + Duration::from_secs(60);
    while again.log().matches("fleet provider ready").count() < 2 {
        assert!(Instant::now() < deadline, "the restarted manager's provider did not start:\n{}", again.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = again.log();
    assert!(log.contains("adopting the instances recorded in the fleet state"), "{log}");
    assert_eq!(
        log.matches("made the SSH key this manager's machines authorize").count(),
        1,
        "one key per manager:\n{log}"
    );
    assert_eq!(running(&vms(&cloud)), [idle]);
    quit(&mut again).await;
}
