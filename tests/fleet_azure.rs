//! The `azure` fleeting plugin against a fake Azure written here from the REST documentation
//! (Microsoft Entra ID's client-credentials token endpoint; ARM's Virtual Machine Scale Sets
//! Get / Update, Virtual Machine Scale Set VMs List with `$expand=instanceView` and `nextLink`
//! pages, Delete Instances, the VMs' network interfaces; long-running operations through
//! `Azure-AsyncOperation` and `Location`; ARM's `{"error": {"code", "message"}}` bodies;
//! 429 with `Retry-After`), served on 127.0.0.1 by the test. The plugin runs sandboxed in the
//! plugin host as `runway run` runs it, reaching the fake only because the grant names it.
//!
//! Not run against the real Azure.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

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

#[derive(Clone, Debug)]
struct Vm {
    id: u32,
    provisioning: String,
    power: String,
    /// Lists seen in the current state (a VM moves on after one).
    seen: u32,
    ip: Ipv4Addr,
}

/// A long-running operation: polls left before it ends, and how it ends.
struct Operation {
    polls_left: u32,
    error: Option<(String, String)>,
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
        self.operations.insert(id.clone(), Operation { polls_left: 1, error });
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
        return arm_error(StatusCode::UNAUTHORIZED, "InvalidAuthenticationToken", "The access token is invalid.");
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
        return match (&operation.error, query.get("kind").map(String::as_str)) {
            (None, Some("location")) => StatusCode::OK.into_response(),
            (None, _) => axum::Json(json!({"status": "Succeeded"})).into_response(),
            (Some((code, message)), _) => {
                axum::Json(json!({"status": "Failed", "error": {"code": code, "message": message}})).into_response()
            }
        };
    }
    let prefix =
        format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachineScaleSets/{SET}");
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
