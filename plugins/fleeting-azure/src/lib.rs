//! A fleeting provider over an Azure virtual machine scale set (Uniform orchestration), as
//! GitLab's fleeting-plugin-azure: `plugin_config` keys `subscription_id`,
//! `resource_group_name` and `name`, plus `endpoint` (another ARM endpoint: sovereign clouds,
//! test servers). Authentication by client secret or managed identity (see `auth`), only
//! through what the grant lets the plugin see and reach.
//!
//! - `update`: the scale set's VMs with their instance view (`$expand=instanceView`, every
//!   page); provisioning and power states mapped to fleeting's. A Spot VM evicted
//!   (deallocated, stopped or deleted without this plugin asking) is an interruption notice.
//! - `increase`: PATCH `sku.capacity`, following the long-running operation; allocation and
//!   quota failures are capacity errors with a retry-after.
//! - `decrease`: `POST .../delete` with the instance IDs (the capacity goes down with them).
//! - `get-connect-info`: the VM's primary NIC's private address and, when it has one, its
//!   public address.
//!
//! With `plugin_config.machine` (written by the host for `executor = "docker+machine"` with
//! `MachineDriver = "azure"`), the plugin manages individual virtual machines as
//! docker-machine's driver does instead of a scale set: see `machines`.

mod arm;
mod auth;
mod machine_options;
mod machines;

use cloud_common::group_state::GroupState;
use runway_sdk::fleeting::*;
use serde_json::{json, Value};

use arm::{Arm, CallError, Lro};
use auth::Auth;
use cloud_common::machine::MachineConfig;
use machine_options::MachineOptions;
use machines::Machines;

/// Group-state list of the instances this plugin asked to delete (their going away is no
/// interruption).
const DELETED: &str = "deleted";

/// `[runners.autoscaler.plugin_config]`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    subscription_id: String,
    #[serde(default)]
    resource_group_name: String,
    /// The scale set.
    #[serde(default)]
    name: String,
    /// docker+machine's individual VMs instead of a scale set.
    #[serde(default)]
    machine: Option<MachineConfig>,
    /// Azure Resource Manager endpoint (default the public cloud's).
    #[serde(default)]
    endpoint: Option<String>,
}

const COMPUTE_API: &str = "2024-07-01";
/// The API version of the scale set VMs' network interfaces (Microsoft.Network's).
const NETWORK_API: &str = "2018-10-01";
const ARM: &str = "https://management.azure.com";
/// Uniform scale sets hold at most 1,000 VMs.
const MAX_SIZE: u32 = 1000;

struct AzureGroup {
    arm: Arm,
    /// `{endpoint}/subscriptions/…/virtualMachineScaleSets/{name}`.
    base: String,
    endpoint: String,
    name: String,
    connector: ConnectorConfig,
    /// What it remembers between calls, under this group's identity.
    state: GroupState,
    /// docker+machine's individual VMs instead of the scale set `name`.
    machines: Option<Machines>,
}

/// One VM of the scale set as listed.
struct Vm {
    id: String,
    provisioning: String,
    power: Option<String>,
    spot: bool,
}

fn vm_of(value: &Value, set_spot: bool) -> Option<Vm> {
    let id = value.get("instanceId")?.as_str()?.to_string();
    let props = value.get("properties").cloned().unwrap_or_default();
    let provisioning = props.get("provisioningState").and_then(|p| p.as_str()).unwrap_or("").to_string();
    let power = props
        .pointer("/instanceView/statuses")
        .and_then(|s| s.as_array())
        .and_then(|statuses| {
            statuses.iter().filter_map(|s| s.get("code")?.as_str()).find_map(|c| c.strip_prefix("PowerState/"))
        })
        .map(str::to_string);
    let spot = props.pointer("/priority").and_then(|p| p.as_str()).map_or(set_spot, |p| p == "Spot" || p == "Low");
    Some(Vm { id, provisioning, power, spot })
}

/// Fleeting's state of a VM.
/// Does a VM's instance view say it is running (`PowerState/running`)?
pub(crate) fn powered_on(instance_view: &Value) -> bool {
    instance_view
        .get("statuses")
        .and_then(|s| s.as_array())
        .is_some_and(|s| s.iter().any(|s| s.get("code").and_then(|c| c.as_str()) == Some("PowerState/running")))
}

fn state(vm: &Vm) -> InstanceState {
    match (vm.provisioning.as_str(), vm.power.as_deref()) {
        ("Deleting", _) => InstanceState::Deleting,
        ("Failed", _) => InstanceState::Timeout,
        (_, Some("deallocating" | "deallocated" | "stopping" | "stopped")) => InstanceState::Deleting,
        ("Succeeded" | "Updating", Some("running")) => InstanceState::Running,
        _ => InstanceState::Creating,
    }
}

/// Evicted (or being evicted) without this plugin asking.
fn evicted(vm: &Vm) -> bool {
    vm.provisioning == "Deleting"
        || matches!(vm.power.as_deref(), Some("deallocating" | "deallocated" | "stopping" | "stopped"))
}

impl AzureGroup {
    fn url(&self, path: &str, api: &str) -> String {
        let sep = if path.contains('?') { '&' } else { '?' };
        format!("{}{path}{sep}api-version={api}", self.base)
    }

    fn scale_set(&mut self) -> Result<Value, ProviderError> {
        let url = self.url("", COMPUTE_API);
        self.arm.get(&url).map_err(|e| match e.status() {
            Some(404) => ProviderError::InvalidConfig(format!("scale set {:?} not found ({url})", self.name)),
            _ => e.into_provider("reading the scale set"),
        })
    }

    fn vms(&mut self) -> Result<Vec<Vm>, ProviderError> {
        let set = self.scale_set()?;
        let set_spot = set
            .pointer("/properties/virtualMachineProfile/priority")
            .and_then(|p| p.as_str())
            .is_some_and(|p| p == "Spot" || p == "Low");
        let url = self.url("/virtualMachines?$expand=instanceView", COMPUTE_API);
        let listed = self.arm.list(&url).map_err(|e| e.into_provider("listing the scale set's VMs"))?;
        Ok(listed.iter().filter_map(|v| vm_of(v, set_spot)).collect())
    }
}

impl AzureGroup {
    /// docker+machine's mode: the driver's flags choose the subscription, the endpoints and
    /// the service principal.
    fn init_machines(
        connector: ConnectorConfig,
        machine: MachineConfig,
    ) -> Result<(Self, ProviderInfo), ProviderError> {
        let env = |key: &str| std::env::var(key).ok().filter(|v| !v.is_empty());
        let options = MachineOptions::parse(&machine.options, &env).map_err(ProviderError::InvalidConfig)?;
        let endpoint = options.resource_manager();
        cloud_common::http::parse_url(&endpoint)
            .map_err(|e| ProviderError::InvalidConfig(format!("MachineOptions azure-endpoint: {e}")))?;
        let subscription_url = format!(
            "{endpoint}/subscriptions/{}?api-version=2022-12-01",
            cloud_common::percent_encode(&options.subscription_id)
        );
        let auth = Auth::for_machines(
            &format!("{endpoint}/"),
            options.environment.authority(),
            options.client.clone(),
            subscription_url,
        );
        let mut arm = Arm::new(auth);
        let machines = Machines::init(machine, options, &mut arm)?;
        let info = ProviderInfo {
            id: machines.id(),
            // Machines are limited by the runner's `limit` and max_instances, not by Azure.
            max_size: u32::MAX,
            version: env!("CARGO_PKG_VERSION").into(),
            capabilities: vec!["interruptions".into()],
        };
        let group = AzureGroup {
            arm,
            base: String::new(),
            endpoint,
            name: info.id.clone(),
            connector,
            state: machines.state.clone(),
            machines: Some(machines),
        };
        Ok((group, info))
    }
}

impl InstanceGroup for AzureGroup {
    fn init(connector: ConnectorConfig, plugin_config: &str) -> Result<(Self, ProviderInfo), ProviderError> {
        let mut config: Config = serde_json::from_str(plugin_config)
            .map_err(|e| ProviderError::InvalidConfig(format!("plugin_config: {e}")))?;
        if let Some(machine) = config.machine.take() {
            return Self::init_machines(connector, machine);
        }
        for (key, value) in [
            ("subscription_id", &config.subscription_id),
            ("resource_group_name", &config.resource_group_name),
            ("name", &config.name),
        ] {
            if value.trim().is_empty() {
                return Err(ProviderError::InvalidConfig(format!("plugin_config.{key} is empty")));
            }
        }
        let endpoint = config.endpoint.clone().unwrap_or_else(|| ARM.to_string()).trim_end_matches('/').to_string();
        cloud_common::http::parse_url(&endpoint)
            .map_err(|e| ProviderError::InvalidConfig(format!("plugin_config.endpoint: {e}")))?;
        let base = format!(
            "{endpoint}/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachineScaleSets/{}",
            cloud_common::percent_encode(&config.subscription_id),
            cloud_common::percent_encode(&config.resource_group_name),
            cloud_common::percent_encode(&config.name)
        );
        let resource = if config.endpoint.is_none() { format!("{ARM}/") } else { format!("{endpoint}/") };
        let mut group = AzureGroup {
            arm: Arm::new(Auth::new(&resource)),
            base,
            endpoint,
            name: config.name.clone(),
            connector,
            state: GroupState::new(format!(
                "{}/{}/{}",
                config.subscription_id, config.resource_group_name, config.name
            )),
            machines: None,
        };
        let set = group.scale_set()?;
        if set.pointer("/properties/orchestrationMode").and_then(|m| m.as_str()) == Some("Flexible") {
            return Err(ProviderError::InvalidConfig(format!(
                "scale set {:?} uses Flexible orchestration; only Uniform scale sets are supported",
                config.name
            )));
        }
        let info = ProviderInfo {
            id: format!("azure/{}/{}/{}", config.subscription_id, config.resource_group_name, config.name),
            max_size: MAX_SIZE,
            version: env!("CARGO_PKG_VERSION").into(),
            capabilities: vec!["interruptions".into()],
        };
        Ok((group, info))
    }

    fn update(&mut self) -> Result<Vec<Instance>, ProviderError> {
        if let Some(machines) = &self.machines {
            return machines.update(&mut self.arm);
        }
        let vms = self.vms()?;
        self.state.retain_ids(DELETED, |id| vms.iter().any(|v| v.id == id))?;
        Ok(vms.iter().map(|vm| Instance { id: vm.id.clone(), state: state(vm) }).collect())
    }

    fn increase(&mut self, n: u32) -> Result<u32, ProviderError> {
        if n == 0 {
            return Ok(0);
        }
        if let Some(machines) = &self.machines {
            return machines.increase(&mut self.arm, n);
        }
        self.state.check_capacity(&format!("scale set {}", self.name))?;
        let set = self.scale_set()?;
        let current = set.pointer("/sku/capacity").and_then(|c| c.as_u64()).unwrap_or(0);
        let current = u32::try_from(current).unwrap_or(MAX_SIZE);
        if current >= MAX_SIZE {
            return Err(ProviderError::Capacity(CapacityError {
                message: format!("scale set {} holds {MAX_SIZE} VMs", self.name),
                retry_after_seconds: 60,
            }));
        }
        let target = current.saturating_add(n).min(MAX_SIZE);
        let url = self.url("", COMPUTE_API);
        let result = self
            .arm
            .send("PATCH", &url, Some(&json!({"sku": {"capacity": target}})))
            .and_then(|response| self.arm.follow(&response));
        match result {
            Ok(Lro::Succeeded | Lro::Running) => {
                runway_sdk::log::info(&format!("scale set {}: capacity {current} -> {target}", self.name));
                Ok(target - current)
            }
            Err(CallError::Api(e)) if e.is_capacity() => {
                let message = format!("{}: {}", e.code, e.message);
                runway_sdk::log::warn(&format!(
                    "scale set {}: no capacity ({message}); capacity back to {current}",
                    self.name
                ));
                // The failed VMs would be retried behind the manager's back: give them up.
                let _ = self.arm.send("PATCH", &url, Some(&json!({"sku": {"capacity": current}})));
                self.state.back_off(u64::from(arm::CAPACITY_RETRY_SECONDS), &message)?;
                Err(CallError::Api(e).into_provider("scaling out"))
            }
            Err(e) => Err(e.into_provider("scaling out")),
        }
    }

    fn decrease(&mut self, ids: Vec<String>) -> Result<Vec<String>, ProviderError> {
        if ids.is_empty() {
            return Ok(ids);
        }
        if let Some(machines) = &self.machines {
            return machines.decrease(&mut self.arm, ids);
        }
        let url = self.url("/delete", COMPUTE_API);
        // The deletion goes on at Azure (a long-running operation); update sees the VMs go.
        self.arm.send("POST", &url, Some(&json!({"instanceIds": ids}))).map_err(|e| e.into_provider("deleting VMs"))?;
        let mut deleted = self.state.ids(DELETED)?;
        deleted.extend(ids.iter().cloned());
        self.state.set_ids(DELETED, &deleted)?;
        Ok(ids)
    }

    fn connect_info(&mut self, id: &str) -> Result<ConnectInfo, ProviderError> {
        if let Some(machines) = &self.machines {
            let (internal_addr, external_addr) = machines.addresses(&mut self.arm, id)?;
            let mut connector = self.connector.clone();
            // The manager's key, which every machine was created with.
            connector.key = Some(machines.private_key());
            connector.password = None;
            connector.use_static_credentials = true;
            return Ok(ConnectInfo { id: id.to_string(), external_addr, internal_addr, connector, expires_at: None });
        }
        let url =
            self.url(&format!("/virtualMachines/{}/networkInterfaces", cloud_common::percent_encode(id)), NETWORK_API);
        let nics = self.arm.list(&url).map_err(|e| e.into_provider(&format!("network interfaces of VM {id}")))?;
        let primary = nics
            .iter()
            .find(|n| n.pointer("/properties/primary").and_then(|p| p.as_bool()) == Some(true))
            .or_else(|| nics.first())
            .ok_or_else(|| ProviderError::NotFound(format!("VM {id} has no network interface")))?;
        let configs =
            primary.pointer("/properties/ipConfigurations").and_then(|c| c.as_array()).cloned().unwrap_or_default();
        let config = configs
            .iter()
            .find(|c| c.pointer("/properties/primary").and_then(|p| p.as_bool()) == Some(true))
            .or_else(|| configs.first())
            .cloned()
            .unwrap_or_default();
        let private = config.pointer("/properties/privateIPAddress").and_then(|a| a.as_str()).map(str::to_string);
        let public = match config.pointer("/properties/publicIPAddress/id").and_then(|i| i.as_str()) {
            Some(resource) => {
                let url = format!("{}{resource}?api-version={NETWORK_API}", self.endpoint);
                self.arm
                    .get(&url)
                    .ok()
                    .and_then(|p| p.pointer("/properties/ipAddress").and_then(|a| a.as_str()).map(str::to_string))
            }
            None => None,
        };
        if private.is_none() && public.is_none() {
            return Err(ProviderError::NotFound(format!("VM {id} has no address")));
        }
        Ok(ConnectInfo {
            id: id.to_string(),
            external_addr: public,
            internal_addr: private,
            connector: self.connector.clone(),
            expires_at: None,
        })
    }

    fn heartbeat(&mut self, id: &str) -> Result<(), ProviderError> {
        if let Some(machines) = &self.machines {
            return machines.heartbeat(&mut self.arm, id);
        }
        let url = self.url(&format!("/virtualMachines/{}/instanceView", cloud_common::percent_encode(id)), COMPUTE_API);
        let view = self.arm.get(&url).map_err(|e| e.into_provider(&format!("VM {id}")))?;
        if powered_on(&view) {
            Ok(())
        } else {
            Err(ProviderError::NotFound(format!("VM {id} is not running")))
        }
    }

    fn interruptions(&mut self) -> Result<Vec<Interruption>, ProviderError> {
        if let Some(machines) = &self.machines {
            return machines.interruptions(&mut self.arm);
        }
        let vms = self.vms()?;
        let deleted = self.state.ids(DELETED)?;
        Ok(vms
            .iter()
            .filter(|vm| evicted(vm) && !deleted.contains(&vm.id))
            .map(|vm| Interruption {
                id: vm.id.clone(),
                kind: if vm.spot { InterruptionKind::SpotReclaim } else { InterruptionKind::Maintenance },
                deadline: None,
            })
            .collect())
    }
}

runway_sdk::export_fleeting!(AzureGroup, name: "azure", description: "an Azure virtual machine scale set");
