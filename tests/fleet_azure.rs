//! The `azure` fleeting plugin against a fake Azure written here from the REST documentation
//! (Microsoft Entra ID's client-credentials token endpoint; ARM's Virtual Machine Scale Sets
//! Get / Update, Virtual Machine Scale Set VMs List with `$expand=instanceView` and `nextLink`
//! pages, Delete Instances, the VMs' network interfaces; long-running operations through
//! `Azure-AsyncOperation` and `Location`; ARM's `{"error": {"code", "message"}}` bodies;
//! 429 with `Retry-After`), served on 127.0.0.1 by the test. The plugin runs sandboxed in the
//! plugin host as `runway run` runs it, reaching the fake only because the grant names it.
//!
//! The docker+machine mode (`MachineDriver = "azure"`) runs as `runway run` runs it: the fake
//! creates the VMs' resources (see `machines` below), its VM agent installs the key the plugin
//! put in `osProfile` for one real `sshd` listening on the public addresses it hands out, and
//! jobs from the fake GitLab run in Docker (the shared test daemon) reached over SSH.
//!
//! Not run against the real Azure.

#[path = "support/dockerd.rs"]
mod dockerd;
#[path = "support/runway_process.rs"]
mod runway_process;
#[path = "support/sshd.rs"]
mod sshd;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fake_gitlab::{FakeGitLab, JobRecord, JobSpec, JobStatus};
use runway_process::RunwayProcess;
use sshd::{ClientKey, SshServer};

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use runway::config::grant::PluginGrant;
use runway::plugin::fleeting::{
    ConnectorConfig, FleetingFailure, FleetingGroup, InstanceState, InterruptionKind, Protocol, ProviderError,
};
use runway::plugin::{HostSettings, PluginHost};
use serde_json::{json, Value};

const SUB: &str = "00000000-0000-0000-0000-000000000001";
const RG: &str = "runners-rg";
const SET: &str = "runners";
const SECRET: &str = "s3cret";
const API: &str = "2024-07-01";
/// The subscription's tenant, found by the docker+machine mode from ARM's challenge.
const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";

#[derive(Clone, Debug)]
struct Vm {
    id: u32,
    provisioning: String,
    power: String,
    /// Lists seen in the current state (a VM moves on after one).
    seen: u32,
    ip: Ipv4Addr,
}

/// A long-running operation: polls left before it ends, how it ends, and what its end does
/// to a resource of the docker+machine resource group.
struct Operation {
    polls_left: u32,
    error: Option<(String, String)>,
    effect: Effect,
}

/// What ends with an operation.
#[derive(Clone)]
enum Effect {
    None,
    /// The resource (key: its lower-cased ID) is provisioned.
    Provisioned(String),
    /// The resource is gone.
    Removed(String),
}

#[derive(Default)]
struct Cloud {
    capacity: u32,
    next_id: u32,
    vms: Vec<Vm>,
    tokens: Vec<String>,
    operations: BTreeMap<String, Operation>,
    /// Answer the next ARM call with 429.
    throttle_next: bool,
    /// Scale-outs fail with AllocationFailed.
    no_capacity: bool,
    /// Every request: method and path with query.
    log: Vec<String>,
    port: u16,
    /// docker+machine's resources: lower-cased resource ID → the resource as ARM shows it.
    resources: BTreeMap<String, Value>,
    /// IDs of the resources deleted, in order.
    deleted: Vec<String>,
    /// Addresses handed out so far.
    addresses: u8,
    /// Where the VM agent installs the `osProfile` keys: one file per admin user, read by the
    /// machines' sshd (`AuthorizedKeysCommand`).
    keys_dir: Option<std::path::PathBuf>,
}

type Shared = Arc<Mutex<Cloud>>;

fn arm_error(status: StatusCode, code: &str, message: &str) -> Response {
    (status, axum::Json(json!({"error": {"code": code, "message": message}}))).into_response()
}

fn vm_json(vm: &Vm) -> Value {
    json!({
        "instanceId": vm.id.to_string(),
        "name": format!("{SET}_{}", vm.id),
        "properties": {
            "provisioningState": vm.provisioning,
            "instanceView": {"statuses": [
                {"code": format!("ProvisioningState/{}", vm.provisioning.to_lowercase())},
                {"code": format!("PowerState/{}", vm.power)}
            ]}
        }
    })
}

impl Cloud {
    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn operation(&mut self, error: Option<(String, String)>) -> String {
        let id = format!("op-{}", self.operations.len() + 1);
        self.operations.insert(id.clone(), Operation { polls_left: 1, error, effect: Effect::None });
        id
    }

    /// One listing moves every VM one step: Creating → Succeeded/running, Deleting → gone.
    fn advance(&mut self) {
        for vm in &mut self.vms {
            vm.seen += 1;
        }
        self.vms.retain(|vm| !(vm.provisioning == "Deleting" && vm.seen > 1));
        for vm in &mut self.vms {
            if vm.provisioning == "Creating" && vm.seen > 1 {
                vm.provisioning = "Succeeded".into();
                vm.power = "running".into();
                vm.seen = 0;
            }
        }
    }

    fn scale_set(&self) -> Value {
        json!({
            "name": SET,
            "location": "westeurope",
            "sku": {"name": "Standard_D2s_v5", "tier": "Standard", "capacity": self.capacity},
            "properties": {
                "orchestrationMode": "Uniform",
                "provisioningState": "Succeeded",
                "virtualMachineProfile": {"priority": "Spot", "evictionPolicy": "Deallocate"}
            }
        })
    }
}

async fn token(cloud: &Shared, path: &str, body: &[u8]) -> Response {
    let form: BTreeMap<String, String> = url::form_urlencoded::parse(body).into_owned().collect();
    if !path.ends_with("/oauth2/v2.0/token") || form.get("grant_type").map(String::as_str) != Some("client_credentials")
    {
        return (StatusCode::BAD_REQUEST, axum::Json(json!({"error": "invalid_request"}))).into_response();
    }
    if form.get("client_secret").map(String::as_str) != Some(SECRET) {
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({
                "error": "invalid_client",
                "error_description": "AADSTS7000215: Invalid client secret provided. Ensure the secret being sent in the request is the client secret value, not the client secret ID."
            })),
        )
            .into_response();
    }
    let mut cloud = cloud.lock().expect("cloud");
    let token = format!("token-{}", cloud.tokens.len() + 1);
    cloud.tokens.push(token.clone());
    axum::Json(json!({"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": token}))
        .into_response()
}

async fn serve(State(cloud): State<Shared>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body: Bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap_or_default();
    let path = parts.uri.path().to_string();
    let query: BTreeMap<String, String> =
        parts.uri.query().map(|q| url::form_urlencoded::parse(q.as_bytes()).into_owned().collect()).unwrap_or_default();
    cloud.lock().expect("cloud").log.push(format!("{} {}", parts.method, parts.uri));
    if !path.starts_with("/subscriptions/") && !path.starts_with("/operations/") {
        return token(&cloud, &path, &body).await;
    }
    arm(&cloud, &parts.method, &path, &query, &parts.headers, &body)
}

fn arm(
    cloud: &Shared,
    method: &Method,
    path: &str,
    query: &BTreeMap<String, String>,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let mut cloud = cloud.lock().expect("cloud");
    let bearer = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    if !bearer.is_some_and(|t| cloud.tokens.iter().any(|k| k == t)) {
        // ARM names the subscription's tenant in its challenge (how docker-machine finds it).
        let mut response =
            arm_error(StatusCode::UNAUTHORIZED, "InvalidAuthenticationToken", "The access token is invalid.");
        let challenge = format!(
            "Bearer authorization_uri=\"https://login.windows.net/{TENANT}\", error=\"invalid_token\", \
             error_description=\"The authentication failed because of missing 'Authorization' header.\""
        );
        response.headers_mut().insert("www-authenticate", challenge.parse().expect("header"));
        return response;
    }
    if !query.contains_key("api-version") {
        return arm_error(
            StatusCode::BAD_REQUEST,
            "MissingApiVersionParameter",
            "The api-version query parameter (?api-version=) is required for all requests.",
        );
    }
    if std::mem::take(&mut cloud.throttle_next) {
        let mut response =
            arm_error(StatusCode::TOO_MANY_REQUESTS, "TooManyRequests", "The request is being throttled.");
        response.headers_mut().insert("retry-after", "1".parse().expect("header"));
        return response;
    }
    if let Some(op) = path.strip_prefix("/operations/") {
        let Some(operation) = cloud.operations.get_mut(op) else {
            return arm_error(StatusCode::NOT_FOUND, "NotFound", "no such operation");
        };
        if operation.polls_left > 0 {
            operation.polls_left -= 1;
            return match query.get("kind").map(String::as_str) {
                Some("location") => StatusCode::ACCEPTED.into_response(),
                _ => axum::Json(json!({"status": "InProgress"})).into_response(),
            };
        }
        let effect = std::mem::replace(&mut operation.effect, Effect::None);
        let error = operation.error.clone();
        cloud.finish(effect);
        return match (error, query.get("kind").map(String::as_str)) {
            (None, Some("location")) => StatusCode::OK.into_response(),
            (None, _) => axum::Json(json!({"status": "Succeeded"})).into_response(),
            (Some((code, message)), _) => {
                axum::Json(json!({"status": "Failed", "error": {"code": code, "message": message}})).into_response()
            }
        };
    }
    let prefix =
        format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachineScaleSets/{SET}");
    if !path.starts_with(&prefix) {
        return machines::arm(&mut cloud, method, path, body);
    }
    let Some(rest) = path.strip_prefix(&prefix) else {
        return arm_error(
            StatusCode::NOT_FOUND,
            "ResourceNotFound",
            &format!("The Resource '{path}' under resource group '{RG}' was not found."),
        );
    };
    let segments: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    match (method.as_str(), segments.as_slice()) {
        ("GET", []) => axum::Json(cloud.scale_set()).into_response(),
        ("PATCH", []) => {
            let patch: Value = serde_json::from_slice(body).unwrap_or_default();
            let Some(target) = patch.pointer("/sku/capacity").and_then(|c| c.as_u64()) else {
                return arm_error(StatusCode::BAD_REQUEST, "InvalidParameter", "sku.capacity is required here");
            };
            let target = u32::try_from(target).unwrap_or(u32::MAX);
            let error = if cloud.no_capacity && target > cloud.capacity {
                Some((
                    "AllocationFailed".to_string(),
                    "Allocation failed. We do not have sufficient capacity for the requested VM size in this region."
                        .to_string(),
                ))
            } else {
                while cloud.capacity < target {
                    let id = cloud.next_id;
                    cloud.next_id += 1;
                    let ip = Ipv4Addr::new(127, 0, 30, 4 + u8::try_from(id).unwrap_or(0));
                    cloud.vms.push(Vm { id, provisioning: "Creating".into(), power: "starting".into(), seen: 0, ip });
                    cloud.capacity += 1;
                }
                None
            };
            let op = cloud.operation(error);
            let mut response = (StatusCode::ACCEPTED, axum::Json(cloud.scale_set())).into_response();
            let url = format!("{}/operations/{op}?api-version={API}", cloud.base());
            response.headers_mut().insert("azure-asyncoperation", url.parse().expect("header"));
            response
        }
        ("GET", ["virtualMachines"]) => {
            if query.get("$expand").map(String::as_str) != Some("instanceView") {
                return arm_error(StatusCode::BAD_REQUEST, "InvalidParameter", "the plugin must expand instanceView");
            }
            let skip: usize = query.get("$skiptoken").and_then(|s| s.parse().ok()).unwrap_or(0);
            if skip == 0 {
                cloud.advance();
            }
            // Two VMs a page.
            let page: Vec<Value> = cloud.vms.iter().skip(skip).take(2).map(vm_json).collect();
            let mut answer = json!({"value": page});
            if skip + 2 < cloud.vms.len() {
                answer["nextLink"] = json!(format!(
                    "{}{path}?api-version={API}&$expand=instanceView&$skiptoken={}",
                    cloud.base(),
                    skip + 2
                ));
            }
            axum::Json(answer).into_response()
        }
        ("POST", ["delete"]) => {
            let request: Value = serde_json::from_slice(body).unwrap_or_default();
            let ids: Vec<String> = request
                .get("instanceIds")
                .and_then(|i| i.as_array())
                .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
                .unwrap_or_default();
            for id in &ids {
                let Some(vm) = cloud.vms.iter_mut().find(|v| v.id.to_string() == *id) else {
                    return arm_error(StatusCode::BAD_REQUEST, "InvalidParameter", &format!("instance {id} not found"));
                };
                vm.provisioning = "Deleting".into();
                vm.seen = 0;
            }
            cloud.capacity -= u32::try_from(ids.len()).unwrap_or(0);
            let op = cloud.operation(None);
            let mut response = StatusCode::ACCEPTED.into_response();
            let url = format!("{}/operations/{op}?api-version={API}&kind=location", cloud.base());
            response.headers_mut().insert("location", url.parse().expect("header"));
            response
        }
        ("GET", ["virtualMachines", id, "networkInterfaces"]) => {
            let Some(vm) = cloud.vms.iter().find(|v| v.id.to_string() == *id) else {
                return arm_error(StatusCode::NOT_FOUND, "NotFound", &format!("VM {id} not found"));
            };
            axum::Json(json!({"value": [{
                "name": "nic",
                "properties": {"primary": true, "ipConfigurations": [
                    {"name": "ipconfig", "properties": {"primary": true, "privateIPAddress": vm.ip.to_string()}}
                ]}
            }]}))
            .into_response()
        }
        ("GET", ["virtualMachines", id, "instanceView"]) => {
            let Some(vm) = cloud.vms.iter().find(|v| v.id.to_string() == *id) else {
                return arm_error(StatusCode::NOT_FOUND, "NotFound", &format!("VM {id} not found"));
            };
            axum::Json(vm_json(vm)["properties"]["instanceView"].clone()).into_response()
        }
        _ => arm_error(StatusCode::NOT_FOUND, "NotFound", &format!("no route {method} {path}")),
    }
}

async fn start_cloud() -> Shared {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let cloud: Shared = Arc::new(Mutex::new(Cloud { port, ..Cloud::default() }));
    let app = axum::Router::new().fallback(serve).with_state(cloud.clone());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    cloud
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
async fn a_scale_set_scales_out_and_in_reports_evictions_and_refuses_bad_credentials() {
    let cloud = start_cloud().await;
    let port = cloud.lock().expect("cloud").port;
    let root = tempfile::tempdir().expect("tempdir");
    let grant = PluginGrant {
        allow_hosts: vec![format!("127.0.0.1:{port}")],
        env: ["AZURE_TENANT_ID", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_AUTHORITY_HOST"]
            .map(String::from)
            .to_vec(),
        ..PluginGrant::default()
    };
    let host = PluginHost::new(HostSettings {
        state_dir: Some(root.path().join("state")),
        grants: BTreeMap::from([("azure".to_string(), grant)]),
        builtins: runway::plugin::builtin_plugins(),
        cache_dir: Some(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")),
        ..HostSettings::default()
    })
    .await
    .expect("host");
    // The plugin sees only the granted variables, read when its instance is made.
    std::env::set_var("AZURE_TENANT_ID", "tenant-1");
    std::env::set_var("AZURE_CLIENT_ID", "client-1");
    std::env::set_var("AZURE_AUTHORITY_HOST", format!("http://127.0.0.1:{port}"));
    std::env::set_var("AZURE_CLIENT_SECRET", "not-the-secret");
    let config = json!({
        "subscription_id": SUB,
        "resource_group_name": RG,
        "name": SET,
        "endpoint": format!("http://127.0.0.1:{port}")
    })
    .to_string();

    // A wrong client secret: init fails with Entra ID's reason, as a configuration error.
    match FleetingGroup::start(&host, "azure", connector(), &config).await {
        Err(FleetingFailure::Provider(ProviderError::InvalidConfig(m))) => {
            assert!(m.contains("AADSTS7000215") && m.contains("client-1"), "{m}")
        }
        Err(other) => panic!("unexpected {other}"),
        Ok(_) => panic!("a wrong secret was accepted"),
    }
    assert!(cloud.lock().expect("cloud").tokens.is_empty());

    std::env::set_var("AZURE_CLIENT_SECRET", SECRET);
    let (group, info) = FleetingGroup::start(&host, "azure", connector(), &config).await.expect("init");
    assert_eq!(info.id, format!("azure/{SUB}/{RG}/{SET}"));

    // Scale out: PATCH sku.capacity, the Azure-AsyncOperation followed to Succeeded.
    assert_eq!(group.increase(3).await.expect("increase"), 3);
    let log = cloud.lock().expect("cloud").log.clone();
    assert!(log.iter().any(|l| l.starts_with("PATCH ")), "{log:?}");
    assert!(
        log.iter().filter(|l| l.starts_with("GET /operations/op-1")).count() >= 2,
        "the operation was polled: {log:?}"
    );
    // Creating, then running; three VMs come in two pages, and a 429 is waited out.
    let first = states(&group).await;
    assert_eq!(first.len(), 3, "{first:?}");
    assert!(first.values().all(|s| *s == InstanceState::Creating), "{first:?}");
    cloud.lock().expect("cloud").throttle_next = true;
    let running = states(&group).await;
    assert!(running.values().all(|s| *s == InstanceState::Running), "{running:?}");
    let log = cloud.lock().expect("cloud").log.clone();
    assert!(log.iter().any(|l| l.contains("skiptoken=2")), "the second page was read: {log:?}");

    let info = group.connect_info("1").await.expect("connect info");
    assert_eq!(info.internal_addr.as_deref(), Some("127.0.30.5"));
    assert!(matches!(group.connect_info("9").await, Err(FleetingFailure::Provider(ProviderError::NotFound(_)))));
    group.heartbeat("1").await.expect("heartbeat of a running VM");

    // Scale in: the chosen VM is deleted (capacity follows), then gone.
    assert_eq!(group.decrease(vec!["0".into()]).await.expect("decrease"), vec!["0".to_string()]);
    assert_eq!(cloud.lock().expect("cloud").capacity, 2);
    let after = states(&group).await;
    assert_eq!(after.get("0"), Some(&InstanceState::Deleting), "{after:?}");
    let after = states(&group).await;
    assert_eq!(after.keys().cloned().collect::<Vec<_>>(), vec!["1".to_string(), "2".to_string()]);
    assert!(group.interruptions().await.expect("interruptions").is_empty(), "a requested deletion is no interruption");

    // A Spot eviction: the VM is deallocated without the plugin asking.
    if let Some(vm) = cloud.lock().expect("cloud").vms.iter_mut().find(|v| v.id == 2) {
        vm.power = "deallocated".into();
    }
    let notices = group.interruptions().await.expect("interruptions");
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!((notices[0].id.as_str(), notices[0].kind), ("2", InterruptionKind::SpotReclaim));
    assert_eq!(states(&group).await.get("2"), Some(&InstanceState::Deleting));
    assert!(group.heartbeat("2").await.is_err(), "an evicted VM fails its heartbeat");

    // No capacity: the operation fails with AllocationFailed; a capacity error with a
    // retry-after, the capacity put back, and further increases refused without a call.
    cloud.lock().expect("cloud").no_capacity = true;
    match group.increase(1).await {
        Err(FleetingFailure::Provider(ProviderError::Capacity(c))) => {
            assert!(c.retry_after_seconds > 0 && c.message.contains("AllocationFailed"), "{c:?}")
        }
        other => panic!("expected a capacity error, got {other:?}"),
    }
    assert_eq!(cloud.lock().expect("cloud").capacity, 2);
    let patches = cloud.lock().expect("cloud").log.iter().filter(|l| l.starts_with("PATCH ")).count();
    assert!(matches!(group.increase(1).await, Err(FleetingFailure::Provider(ProviderError::Capacity(_)))));
    assert_eq!(cloud.lock().expect("cloud").log.iter().filter(|l| l.starts_with("PATCH ")).count(), patches);
}

/// docker+machine's resources in the fake ARM (Resource Groups, Availability Sets, Virtual
/// Networks and Subnets, Network Security Groups, Public IP Addresses, Network Interfaces,
/// Virtual Machines — Create Or Update, Get, List, Delete, as the REST reference describes
/// them): network resources are provisioned through an `Azure-AsyncOperation` (a resource
/// referring to one not yet `Succeeded` is refused with `ReferencedResourceNotProvisioned`),
/// deletions of resources in use are refused as ARM refuses them (`NicInUse`, ...), a VM is
/// `Creating` until listed once, then its agent installs the `osProfile` SSH key for the admin
/// user where the machines' sshd reads it.
mod machines {
    use super::*;

    fn not_found(path: &str) -> Response {
        arm_error(StatusCode::NOT_FOUND, "ResourceNotFound", &format!("The Resource '{path}' was not found."))
    }

    fn bad(code: &str, message: String) -> Response {
        arm_error(StatusCode::BAD_REQUEST, code, &message)
    }

    fn id_at(value: &Value, pointer: &str) -> Option<String> {
        value.pointer(pointer).and_then(|v| v.as_str()).map(str::to_ascii_lowercase)
    }

    impl Cloud {
        pub(super) fn finish(&mut self, effect: Effect) {
            match effect {
                Effect::None => {}
                Effect::Provisioned(key) if key.contains("/providers/microsoft.compute/virtualmachines/") => {
                    self.provision_vm(&key)
                }
                Effect::Provisioned(key) => {
                    if let Some(resource) = self.resources.get_mut(&key) {
                        resource["properties"]["provisioningState"] = json!("Succeeded");
                    }
                }
                Effect::Removed(key) => {
                    if let Some(resource) = self.resources.remove(&key) {
                        self.deleted.push(resource["id"].as_str().unwrap_or_default().to_string());
                    }
                }
            }
        }

        /// A long-running operation ending with `effect`: its header and URL.
        fn lro(&mut self, effect: Effect, location: bool) -> (&'static str, String) {
            let op = self.operation(None);
            if let Some(operation) = self.operations.get_mut(&op) {
                operation.effect = effect;
            }
            let url = format!("{}/operations/{op}?api-version={API}", self.base());
            if location {
                ("location", format!("{url}&kind=location"))
            } else {
                ("azure-asyncoperation", url)
            }
        }

        /// The referenced resource must exist and be provisioned: ARM's refusal when not.
        fn referenced(&self, id: Option<String>, by: &str) -> Option<Response> {
            let id = id?;
            match self.resources.get(&id).and_then(|r| r.pointer("/properties/provisioningState")) {
                None => Some(bad("InvalidResourceReference", format!("Resource {id} referenced by {by} was not found."))),
                Some(state) if state != "Succeeded" => Some(bad(
                    "ReferencedResourceNotProvisioned",
                    format!("Cannot proceed with operation because resource {id} used by resource {by} is not in Succeeded state."),
                )),
                Some(_) => None,
            }
        }

        /// The VM agent's provisioning: the admin user's key installed, the VM running.
        fn provision_vm(&mut self, key: &str) {
            let Some(vm) = self.resources.get_mut(key) else { return };
            if vm.pointer("/properties/provisioningState") != Some(&json!("Creating")) {
                return;
            }
            vm["properties"]["provisioningState"] = json!("Succeeded");
            let user = vm.pointer("/properties/osProfile/adminUsername").and_then(|u| u.as_str()).unwrap_or("");
            let keys: Vec<String> = vm
                .pointer("/properties/osProfile/linuxConfiguration/ssh/publicKeys")
                .and_then(|k| k.as_array())
                .map(|k| k.iter().filter_map(|k| k.get("keyData")?.as_str().map(str::to_string)).collect())
                .unwrap_or_default();
            if let Some(dir) = &self.keys_dir {
                use std::io::Write;
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(dir.join(user))
                    .expect("authorized keys");
                for line in keys {
                    writeln!(file, "{}", line.trim()).expect("key");
                }
            }
        }

        fn users(&self, kind: &str, pointer: &str, id: &str) -> Option<String> {
            self.resources.iter().find_map(|(key, r)| {
                let uses = r.pointer(pointer).and_then(|v| v.as_array()).is_some_and(|refs| {
                    refs.iter().any(|x| {
                        id_at(x, "/id").as_deref() == Some(id)
                            || id_at(x, "/properties/publicIPAddress/id").as_deref() == Some(id)
                    })
                }) || id_at(r, "/properties/networkSecurityGroup/id").as_deref() == Some(id);
                (key.contains(kind) && uses).then(|| key.clone())
            })
        }
    }

    pub(super) fn arm(cloud: &mut Cloud, method: &Method, path: &str, body: &[u8]) -> Response {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let key = path.to_ascii_lowercase();
        if segments.len() < 4 || !segments[2].eq_ignore_ascii_case("resourceGroups") || segments[1] != SUB {
            return not_found(path);
        }
        let group = format!("/subscriptions/{SUB}/resourcegroups/{}", segments[3].to_ascii_lowercase());
        let request: Value = serde_json::from_slice(body).unwrap_or_default();
        if segments.len() == 4 {
            return match method.as_str() {
                "GET" => match cloud.resources.get(&key) {
                    Some(r) => axum::Json(r.clone()).into_response(),
                    None => arm_error(
                        StatusCode::NOT_FOUND,
                        "ResourceGroupNotFound",
                        &format!("Resource group '{}' could not be found.", segments[3]),
                    ),
                },
                "PUT" => {
                    let resource = json!({"id": path, "name": segments[3], "location": request["location"],
                        "properties": {"provisioningState": "Succeeded"}});
                    cloud.resources.insert(key, resource.clone());
                    (StatusCode::CREATED, axum::Json(resource)).into_response()
                }
                _ => not_found(path),
            };
        }
        if !cloud.resources.contains_key(&group) {
            return arm_error(
                StatusCode::NOT_FOUND,
                "ResourceGroupNotFound",
                &format!("Resource group '{}' could not be found.", segments[3]),
            );
        }
        let kind = segments.get(6).map(|t| t.to_ascii_lowercase()).unwrap_or_default();
        match (method.as_str(), &segments[4..]) {
            ("GET", [_, _, "virtualMachines"]) => {
                let prefix = format!("{group}/providers/microsoft.compute/virtualmachines/");
                let vms: Vec<(String, Value)> = cloud
                    .resources
                    .iter()
                    .filter(|(k, _)| k.strip_prefix(&prefix).is_some_and(|rest| !rest.contains('/')))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                // Time passes: a VM listed while creating is provisioned by the next list.
                for (k, vm) in &vms {
                    if vm.pointer("/properties/provisioningState") == Some(&json!("Creating")) {
                        cloud.provision_vm(k);
                    }
                }
                axum::Json(json!({"value": vms.into_iter().map(|(_, v)| v).collect::<Vec<_>>()})).into_response()
            }
            ("GET", [_, _, "virtualMachines", _, "instanceView"]) => {
                let Some(vm) = cloud.resources.get(key.trim_end_matches("/instanceview")) else {
                    return not_found(path);
                };
                let state = vm["properties"]["provisioningState"].as_str().unwrap_or("").to_ascii_lowercase();
                let power = if state == "succeeded" { "running" } else { "starting" };
                axum::Json(json!({"statuses": [{"code": format!("ProvisioningState/{state}")},
                    {"code": format!("PowerState/{power}")}]}))
                .into_response()
            }
            ("GET", _) => match cloud.resources.get(&key) {
                Some(r) => axum::Json(r.clone()).into_response(),
                None => not_found(path),
            },
            ("PUT", [_, _, _, name, rest @ ..]) => {
                let name = rest.last().copied().unwrap_or(name);
                let mut resource = request.clone();
                resource["id"] = json!(path);
                resource["name"] = json!(name);
                if !resource["properties"].is_object() {
                    resource["properties"] = json!({});
                }
                let props = resource["properties"].clone();
                let nth = cloud.addresses;
                match (kind.as_str(), rest) {
                    ("availabilitysets", []) => {
                        resource["properties"]["provisioningState"] = json!("Succeeded");
                        cloud.resources.insert(key, resource.clone());
                        return axum::Json(resource).into_response();
                    }
                    ("virtualnetworks", ["subnets", _]) => {
                        let vnet = key.rsplitn(3, '/').nth(2).unwrap_or_default().to_string();
                        if !cloud.resources.contains_key(&vnet) {
                            return not_found(&vnet);
                        }
                    }
                    ("virtualnetworks", []) | ("networksecuritygroups", []) => {}
                    ("publicipaddresses", []) => {
                        if resource.pointer("/sku/name") == Some(&json!("Standard"))
                            && props["publicIPAllocationMethod"] != "Static"
                        {
                            return bad(
                                "StandardSkuPublicIPAddressesMustBeStatic",
                                format!("Standard sku publicIp {path} must be Static."),
                            );
                        }
                        cloud.addresses += 1;
                        resource["properties"]["ipAddress"] = json!(format!("127.0.31.{}", 4 + nth));
                    }
                    ("networkinterfaces", []) => {
                        let config = props.pointer("/ipConfigurations/0/properties").cloned().unwrap_or_default();
                        for id in [
                            id_at(&config, "/subnet/id"),
                            id_at(&config, "/publicIPAddress/id"),
                            id_at(&props, "/networkSecurityGroup/id"),
                        ] {
                            if let Some(refused) = cloud.referenced(id, path) {
                                return refused;
                            }
                        }
                        cloud.addresses += 1;
                        resource["properties"]["ipConfigurations"][0]["properties"]["privateIPAddress"] =
                            json!(format!("192.168.0.{}", 4 + nth));
                    }
                    ("virtualmachines", []) => {
                        let nic = id_at(&props, "/networkProfile/networkInterfaces/0/id");
                        if nic.is_none() {
                            return bad("InvalidParameter", "networkProfile.networkInterfaces is required".into());
                        }
                        for id in [nic, id_at(&props, "/availabilitySet/id")] {
                            if let Some(refused) = cloud.referenced(id, path) {
                                return refused;
                            }
                        }
                        let key_data = props.pointer("/osProfile/linuxConfiguration/ssh/publicKeys/0/keyData");
                        if !key_data.and_then(|k| k.as_str()).is_some_and(|k| k.starts_with("ssh-")) {
                            return bad(
                                "InvalidParameter",
                                "osProfile.linuxConfiguration.ssh.publicKeys needs an OpenSSH public key".into(),
                            );
                        }
                        if props.pointer("/storageProfile/imageReference").is_none() {
                            return bad("InvalidParameter", "storageProfile.imageReference is required".into());
                        }
                        resource["properties"]["provisioningState"] = json!("Creating");
                        cloud.resources.insert(key.clone(), resource.clone());
                        let (header, url) = cloud.lro(Effect::Provisioned(key), false);
                        let mut response = (StatusCode::CREATED, axum::Json(resource)).into_response();
                        response.headers_mut().insert(header, url.parse().expect("header"));
                        return response;
                    }
                    _ => return not_found(path),
                }
                resource["properties"]["provisioningState"] = json!("Updating");
                cloud.resources.insert(key.clone(), resource.clone());
                let (header, url) = cloud.lro(Effect::Provisioned(key), false);
                let mut response = (StatusCode::CREATED, axum::Json(resource)).into_response();
                response.headers_mut().insert(header, url.parse().expect("header"));
                response
            }
            ("DELETE", _) => {
                if !cloud.resources.contains_key(&key) {
                    return StatusCode::NO_CONTENT.into_response();
                }
                let in_use = match kind.as_str() {
                    "networkinterfaces" => cloud
                        .users("virtualmachines", "/properties/networkProfile/networkInterfaces", &key)
                        .map(|by| ("NicInUse", by)),
                    "publicipaddresses" => cloud
                        .users("networkinterfaces", "/properties/ipConfigurations", &key)
                        .map(|by| ("PublicIPAddressCannotBeDeleted", by)),
                    "networksecuritygroups" => cloud
                        .users("networkinterfaces", "/properties/none", &key)
                        .map(|by| ("InUseNetworkSecurityGroupCannotBeDeleted", by)),
                    _ => None,
                };
                if let Some((code, by)) = in_use {
                    return bad(code, format!("{path} is used by existing resource {by}."));
                }
                let vm = kind == "virtualmachines";
                if vm {
                    cloud.resources.get_mut(&key).expect("vm")["properties"]["provisioningState"] = json!("Deleting");
                }
                let (header, url) = cloud.lro(Effect::Removed(key), !vm);
                let mut response = StatusCode::ACCEPTED.into_response();
                response.headers_mut().insert(header, url.parse().expect("header"));
                response
            }
            _ => not_found(path),
        }
    }
}

const WAIT: Duration = Duration::from_secs(120);

/// The docker+machine VMs (name, provisioning state) and the IDs of the deleted resources.
fn machine_vms(cloud: &Shared) -> (Vec<(String, String)>, Vec<String>) {
    let cloud = cloud.lock().expect("cloud");
    let vms = cloud
        .resources
        .values()
        .filter(|r| r["id"].as_str().is_some_and(|id| id.contains("/virtualMachines/")))
        .map(|r| {
            let state = r["properties"]["provisioningState"].as_str().unwrap_or_default().to_string();
            (r["name"].as_str().unwrap_or_default().to_string(), state)
        })
        .collect();
    (vms, cloud.deleted.clone())
}

/// Wait until the fake's docker+machine VMs satisfy `check`.
async fn wait_vms(
    cloud: &Shared,
    what: &str,
    runway: &RunwayProcess,
    check: impl Fn(&[(String, String)], &[String]) -> bool,
) -> (Vec<(String, String)>, Vec<String>) {
    let deadline = Instant::now() + WAIT;
    loop {
        let (vms, deleted) = machine_vms(cloud);
        if check(&vms, &deleted) {
            return (vms, deleted);
        }
        assert!(Instant::now() < deadline, "{what}: VMs {vms:?}, deleted {deleted:?}\nrunway log:\n{}", runway.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn finished(fake: &FakeGitLab, job: i64, runway: &RunwayProcess) -> JobRecord {
    match fake.wait_for_job_state(job, |j| j.final_state.is_some(), WAIT).await {
        Some(record) => record,
        None => panic!(
            "job {job} did not finish; trace:\n{}\nrunway log:\n{}",
            fake.job(job).map(|j| j.trace_text()).unwrap_or_default(),
            runway.log()
        ),
    }
}

/// SIGQUIT `runway` and wait for it to exit.
async fn quit(runway: &mut RunwayProcess) {
    let pid = runway.pid().expect("running") as i32;
    // SAFETY: signalling and polling our own child.
    unsafe { libc::kill(pid, libc::SIGQUIT) };
    let deadline = Instant::now() + WAIT;
    while unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) } != pid {
        assert!(Instant::now() < deadline, "runway did not exit:\n{}", runway.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Wait until `runway`'s log holds `part`.
async fn logged(runway: &RunwayProcess, part: &str) {
    let deadline = Instant::now() + WAIT;
    while !runway.log().contains(part) {
        assert!(Instant::now() < deadline, "{part:?} not logged:\n{}", runway.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_machine_config_creates_azure_vms_runs_a_job_on_one_and_deletes_it() {
    let docker = tokio::task::spawn_blocking(dockerd::shared).await.expect("daemon");
    let cloud = start_cloud().await;
    let base = cloud.lock().expect("cloud").base();
    // The VM agent installs the osProfile keys here; the machines' sshd reads them for the
    // user logging in (its own authorized_keys holds a key the runner never sees).
    let keys = tempfile::tempdir().expect("keys dir");
    cloud.lock().expect("cloud").keys_dir = Some(keys.path().to_path_buf());
    let addrs: Vec<Ipv4Addr> = (4..15).map(|last| Ipv4Addr::new(127, 0, 31, last)).collect();
    let extra =
        format!("AuthorizedKeysCommand /usr/bin/cat {}/%u\nAuthorizedKeysCommandUser root\n", keys.path().display());
    let sshd = SshServer::start_on_many_with(&addrs, sshd::free_port(addrs[0]), &ClientKey::generate(), &extra);
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(1), trace_update_interval: 1 })
            .await;
    let runner = fake.create_runner("azure-machines");
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "hi\n")], "init");
    let dir = tempfile::tempdir().expect("config dir");
    // A docker+machine runner on the azure driver as an administrator has it, with what this
    // machine needs instead of Azure: the fake's endpoint, the sshd's user and port, the
    // Docker Engine's socket. No [plugins.azure]: the grant comes from the driver flags; no
    // AZURE_TENANT_ID: the tenant is found from the subscription.
    let config = format!(
        r#"concurrent = 2
check_interval = 1
shutdown_timeout = 30

[[runners]]
  name = "gitlab-azure-autoscaler"
  url = "{url}"
  token = "{token}"
  executor = "docker+machine"
  limit = 2
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
    MachineDriver = "azure"
    MachineName = "gitlab-docker-machine-%s"
    MachineOptions = [
      "azure-subscription-id={SUB}",
      "azure-client-id=client-1",
      "azure-client-secret={SECRET}",
      "azure-location=westeurope",
      "azure-resource-group=runner-machines",
      "azure-size=Standard_D2s_v5",
      "azure-image=canonical:ubuntu-24_04-lts:server:latest",
      "azure-open-port=8080",
      "azure-docker-port=2376",
      "azure-ssh-user={user}",
      "azure-ssh-port={port}",
      "azure-endpoint={base}",
    ]
"#,
        url = fake.url(),
        token = runner.token,
        image = docker.job_image(),
        host = docker.host(),
        user = sshd.user,
        port = sshd.port,
    );
    std::fs::write(dir.path().join("config.toml"), config).expect("config.toml");
    let mut first = RunwayProcess::new(dir.path().to_path_buf())
        .env("AZURE_AUTHORITY_HOST", &base)
        .env_remove("AZURE_TENANT_ID")
        .env_remove("AZURE_CLIENT_ID")
        .env_remove("AZURE_CLIENT_SECRET")
        .env_remove("AZURE_SUBSCRIPTION_ID");
    first.start();

    // IdleCount 1: one VM, created as the driver creates it, running once its agent is done.
    let (vms, _) = wait_vms(&cloud, "one idle machine", &first, |vms, _| {
        vms.len() == 1 && vms.iter().all(|(_, state)| state == "Succeeded")
    })
    .await;
    let name = vms[0].0.clone();
    assert!(name.starts_with("runner-") && name.contains("-gitlab-docker-machine-") && !name.contains("%s"), "{name}");
    {
        let cloud = cloud.lock().expect("cloud");
        let group = format!("/subscriptions/{SUB}/resourcegroups/runner-machines");
        let get = |path: &str| cloud.resources.get(&format!("{group}{path}").to_ascii_lowercase()).cloned();
        let vm = get(&format!("/providers/Microsoft.Compute/virtualMachines/{name}")).expect("vm");
        assert_eq!(vm["properties"]["hardwareProfile"]["vmSize"], "Standard_D2s_v5");
        assert_eq!(vm["location"], "westeurope");
        assert!(
            vm["tags"]["runway-machine"].as_str().is_some_and(|t| t.ends_with("-gitlab-docker-machine-%s")),
            "{vm}"
        );
        assert_eq!(vm["properties"]["osProfile"]["adminUsername"], sshd.user.as_str());
        let nsg = get(&format!("/providers/Microsoft.Network/networkSecurityGroups/{name}-firewall")).expect("nsg");
        let ports: Vec<&str> = nsg["properties"]["securityRules"]
            .as_array()
            .expect("rules")
            .iter()
            .filter_map(|r| r["properties"]["destinationPortRange"].as_str())
            .collect();
        assert_eq!(ports, [sshd.port.to_string().as_str(), "8080"], "SSH and the open port, no Docker port");
        for made in [
            format!("/providers/Microsoft.Network/publicIPAddresses/{name}-ip"),
            format!("/providers/Microsoft.Network/networkInterfaces/{name}-nic"),
            "/providers/Microsoft.Compute/availabilitySets/docker-machine".to_string(),
            "/providers/Microsoft.Network/virtualNetworks/docker-machine-vnet/subnets/docker-machine".to_string(),
        ] {
            assert!(get(&made).is_some(), "{made} was not created");
        }
        let token = format!("POST /{TENANT}/oauth2/v2.0/token");
        assert!(cloud.log.iter().any(|l| l.starts_with(&token)), "the tenant was found: {:?}", cloud.log);
    }
    logged(&first, "MachineOptions azure-docker-port: not used by Runway (ignored)").await;
    let log = first.log();
    assert!(!log.contains("fleet provider failed to start"), "the provider started at once:\n{log}");

    // A job runs in the job image, in Docker on the machine, reached over SSH with the key the
    // plugin gave the VM.
    let job = fake.enqueue(fake.job_payload(&JobSpec::new("group/project", "build", &["cat /etc/runway-image"])));
    let record = finished(&fake, job, &first).await;
    let trace = record.trace_text();
    assert_eq!(record.status, JobStatus::Success, "{trace}\nrunway log:\n{}", first.log());
    assert!(trace.lines().any(|l| l.trim() == "job"), "ran in the job image:\n{trace}");
    assert!(trace.contains(&format!("Connected to instance {name} ")), "ran on {name}:\n{trace}");

    // MaxBuilds 1: the VM is deleted, then its interface, address and security group; IdleCount
    // brings a new one.
    let (vms, deleted) = wait_vms(&cloud, "the used machine deleted and a new one idle", &first, |vms, deleted| {
        deleted.iter().any(|d| d.ends_with(&format!("/networkSecurityGroups/{name}-firewall")))
            && vms.iter().any(|(n, state)| *n != name && state == "Succeeded")
    })
    .await;
    let gone: Vec<&str> =
        deleted.iter().filter(|d| d.contains(&name)).map(|d| d.rsplit('/').next().unwrap_or("")).collect();
    assert_eq!(gone, [name.clone(), format!("{name}-nic"), format!("{name}-ip"), format!("{name}-firewall")]);
    assert_eq!(vms.len(), 1, "{vms:?}");

    quit(&mut first).await;
}
