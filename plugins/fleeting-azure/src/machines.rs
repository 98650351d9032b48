//! The `docker+machine` mode: individual virtual machines, as docker-machine's `azure` driver
//! creates them for gitlab-runner — no scale set. The host hands the plugin the machine name
//! template (`runner-<short token>-<MachineName>`, `%s` still in it), the manager's identity and
//! the runner's `MachineOptions`.
//!
//! - `init`: the resource group, the availability set, the virtual network and its subnet are
//!   created when missing (as the driver does); the manager's SSH key is made once and kept in
//!   the plugin's state (a restarted manager still reaches its machines).
//! - `increase`: per machine, named from the template (`%s` = `<unix time>-<8 hex>`, as
//!   gitlab-runner names machines) with the driver's resource names: a network security group
//!   `<name>-firewall` (SSH and the `azure-open-port`s; no Docker TLS port: the engine is reached
//!   over SSH), a public address `<name>-ip` (Standard SKU, static; none with
//!   `azure-no-public-ip`), a network interface `<name>-nic`, each followed to `Succeeded`
//!   (`Azure-AsyncOperation`) before the next refers to it, then the VM with the key in
//!   `osProfile`, its OS disk deleted with it. Every resource is tagged with the template and the
//!   manager (`runway-machine`, `runway-manager`).
//! - `update`: the resource group's VMs carrying both tags: a restarted manager finds its
//!   machines and never another manager's.
//! - `decrease`: the VM is deleted, then (once ARM says the VM is gone) its interface, address
//!   and security group; what could not be deleted yet is retried on later updates.
//!
//! Owns: the machine mode's requests. Must not touch: flag parsing (`machine_options`), the
//! REST mechanics (`arm`), the scale set mode (`lib.rs`).

use base64::Engine as _;
use cloud_common::group_state::GroupState;
use cloud_common::machine::{machine_name, MachineConfig};
use runway_sdk::fleeting::*;
use serde_json::{json, Value};
use ssh_key::private::{Ed25519Keypair, KeypairData};
use ssh_key::{LineEnding, PrivateKey};

use crate::arm::{Arm, CallError, Lro};
use crate::machine_options::{image_reference, MachineOptions};

/// The tag naming the machine template (the runner's machine "group").
pub const GROUP_TAG: &str = "runway-machine";
/// The tag naming the manager that created the machine.
pub const MANAGER_TAG: &str = "runway-manager";

const COMPUTE_API: &str = "2024-07-01";
const NETWORK_API: &str = "2024-05-01";
const RESOURCES_API: &str = "2021-04-01";

/// Group-state keys: the manager's SSH key, machines asked to be deleted, machines whose
/// network resources are still to be deleted.
const KEY: &str = "ssh-key";
const DELETED: &str = "deleted";
const CLEANUP: &str = "cleanup";

/// The machines of one runner's template, created by one manager.
pub struct Machines {
    template: String,
    manager: String,
    options: MachineOptions,
    /// `{arm}/subscriptions/{id}`.
    subscription: String,
    subnet_id: String,
    availability_set_id: String,
    custom_data: Option<String>,
    /// The manager's key: OpenSSH private key, and the public line given to the machines.
    private_pem: Vec<u8>,
    public_key: String,
    pub state: GroupState,
}

/// Fleeting's state of a VM from its provisioning state.
pub fn machine_state(provisioning: &str) -> InstanceState {
    match provisioning {
        "Succeeded" | "Updating" => InstanceState::Running,
        "Deleting" => InstanceState::Deleting,
        "Failed" | "Canceled" => InstanceState::Timeout,
        _ => InstanceState::Creating,
    }
}

fn tag(value: &Value, key: &str) -> Option<String> {
    value.pointer(&format!("/tags/{key}")).and_then(|v| v.as_str()).map(str::to_string)
}

/// A new ed25519 key for the manager's machines.
fn new_key() -> Result<String, String> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| format!("no randomness for the machines' key: {e}"))?;
    let key = PrivateKey::new(KeypairData::Ed25519(Ed25519Keypair::from_seed(&seed)), "runway-docker-machine")
        .map_err(|e| format!("making the machines' key: {e}"))?;
    Ok(key.to_openssh(LineEnding::LF).map_err(|e| format!("encoding the machines' key: {e}"))?.to_string())
}

impl Machines {
    /// Check the options, make sure the resource group, availability set and subnet exist,
    /// load (or make) the manager's key, read the custom data.
    pub fn init(config: MachineConfig, options: MachineOptions, arm: &mut Arm) -> Result<Machines, ProviderError> {
        if config.name.trim().is_empty() || config.manager.trim().is_empty() {
            return Err(ProviderError::InvalidConfig("plugin_config.machine: name and manager are required".into()));
        }
        for flag in &options.ignored {
            runway_sdk::log::warn(&format!("MachineOptions {flag}: not used by Runway (ignored)"));
        }
        let custom_data = match &options.custom_data_file {
            Some(path) => {
                Some(std::fs::read(path).map(|b| base64::engine::general_purpose::STANDARD.encode(b)).map_err(|e| {
                    ProviderError::InvalidConfig(format!(
                    "MachineOptions azure-custom-data={path}: {e} (is its directory granted to the plugin in `dirs`?)"
                ))
                })?)
            }
            None => None,
        };
        let subscription = format!(
            "{}/subscriptions/{}",
            options.resource_manager(),
            cloud_common::percent_encode(&options.subscription_id)
        );
        let state =
            GroupState::new(format!("azure/{}/{}/{}", options.subscription_id, options.resource_group, config.name));
        let mut pem = state.get(KEY)?;
        if pem.is_empty() {
            pem = new_key().map_err(ProviderError::Other)?;
            state.set(KEY, &pem)?;
        }
        let key = PrivateKey::from_openssh(&pem)
            .map_err(|e| ProviderError::Other(format!("the machines' key in the plugin state: {e}")))?;
        let public_key = key
            .public_key()
            .to_openssh()
            .map_err(|e| ProviderError::Other(format!("the machines' public key: {e}")))?;
        let mut machines = Machines {
            template: config.name,
            manager: config.manager,
            options,
            subscription,
            subnet_id: String::new(),
            availability_set_id: String::new(),
            custom_data,
            private_pem: pem.into_bytes(),
            public_key,
            state,
        };
        machines.ensure_resource_group(arm)?;
        machines.availability_set_id = machines.ensure_availability_set(arm)?;
        machines.subnet_id = machines.ensure_subnet(arm)?;
        Ok(machines)
    }

    /// The provider's identity for the manager's logs and metrics.
    pub fn id(&self) -> String {
        format!("azure/{}/{}/{}", self.options.subscription_id, self.options.resource_group, self.template)
    }

    /// The private key the machines accept.
    pub fn private_key(&self) -> Vec<u8> {
        self.private_pem.clone()
    }

    /// `{subscription}/resourceGroups/{group}` (of `group`, default the machines').
    fn group_path(&self, group: Option<&str>) -> String {
        let group = group.unwrap_or(&self.options.resource_group);
        format!("{}/resourceGroups/{}", self.subscription, cloud_common::percent_encode(group))
    }

    /// A resource of the machines' group: `provider` like `Microsoft.Network/networkInterfaces`.
    fn resource(&self, provider: &str, name: &str) -> String {
        format!("{}/providers/{provider}/{}", self.group_path(None), cloud_common::percent_encode(name))
    }

    fn url(path: &str, api: &str) -> String {
        format!("{path}?api-version={api}")
    }

    /// GET `path`; `None` when ARM does not know it.
    fn find(arm: &mut Arm, path: &str, api: &str, what: &str) -> Result<Option<Value>, ProviderError> {
        match arm.get(&Self::url(path, api)) {
            Ok(value) => Ok(Some(value)),
            Err(e) if e.status() == Some(404) => Ok(None),
            Err(e) => Err(e.into_provider(what)),
        }
    }

    /// PUT `body` at `path` and follow the operation to its end (as far as one call may wait).
    fn put(arm: &mut Arm, path: &str, api: &str, body: &Value, what: &str) -> Result<Value, ProviderError> {
        let response = arm.send("PUT", &Self::url(path, api), Some(body)).map_err(|e| e.into_provider(what))?;
        let created: Value = serde_json::from_slice(&response.body).unwrap_or_default();
        let tracked = response.header("azure-asyncoperation").is_some() || response.header("location").is_some();
        if !tracked {
            // Created synchronously (resource groups, availability sets): the body says how far.
            return match created.pointer("/properties/provisioningState").and_then(|s| s.as_str()) {
                None | Some("Succeeded") => Ok(created),
                Some(state) => Err(ProviderError::Transient(format!("{what}: {state}; retrying later"))),
            };
        }
        match arm.follow(&response).map_err(|e| e.into_provider(what))? {
            Lro::Succeeded => Ok(created),
            Lro::Running => Err(ProviderError::Transient(format!("{what}: still being created; retrying later"))),
        }
    }

    fn ensure_resource_group(&self, arm: &mut Arm) -> Result<(), ProviderError> {
        let path = self.group_path(None);
        if Self::find(arm, &path, RESOURCES_API, "reading the resource group")?.is_none() {
            let body = json!({"location": self.options.location});
            Self::put(arm, &path, RESOURCES_API, &body, "creating the resource group")?;
            runway_sdk::log::info(&format!("created resource group {}", self.options.resource_group));
        }
        Ok(())
    }

    fn ensure_availability_set(&self, arm: &mut Arm) -> Result<String, ProviderError> {
        let path = self.resource("Microsoft.Compute/availabilitySets", &self.options.availability_set);
        if Self::find(arm, &path, COMPUTE_API, "reading the availability set")?.is_none() {
            // Aligned: what VMs with managed disks need.
            let body = json!({"location": self.options.location, "sku": {"name": "Aligned"},
                "properties": {"platformFaultDomainCount": 2, "platformUpdateDomainCount": 5}});
            Self::put(arm, &path, COMPUTE_API, &body, "creating the availability set")?;
        }
        Ok(arm_id(&path))
    }

    /// The subnet's ID; the virtual network and the subnet are created when missing.
    fn ensure_subnet(&self, arm: &mut Arm) -> Result<String, ProviderError> {
        let (group, vnet) = self.options.vnet_group_and_name();
        let vnet_path = format!(
            "{}/providers/Microsoft.Network/virtualNetworks/{}",
            self.group_path(Some(group)),
            cloud_common::percent_encode(vnet)
        );
        let subnet_path = format!("{vnet_path}/subnets/{}", cloud_common::percent_encode(&self.options.subnet));
        if Self::find(arm, &subnet_path, NETWORK_API, "reading the subnet")?.is_some() {
            return Ok(arm_id(&subnet_path));
        }
        if Self::find(arm, &vnet_path, NETWORK_API, "reading the virtual network")?.is_none() {
            let body = json!({"location": self.options.location,
                "properties": {"addressSpace": {"addressPrefixes": [self.options.subnet_prefix]}}});
            Self::put(arm, &vnet_path, NETWORK_API, &body, "creating the virtual network")?;
        }
        let body = json!({"properties": {"addressPrefix": self.options.subnet_prefix}});
        Self::put(arm, &subnet_path, NETWORK_API, &body, "creating the subnet")?;
        runway_sdk::log::info(&format!(
            "created subnet {} ({}) in {vnet}",
            self.options.subnet, self.options.subnet_prefix
        ));
        Ok(arm_id(&subnet_path))
    }

    fn tags(&self) -> Value {
        json!({GROUP_TAG: self.template, MANAGER_TAG: self.manager})
    }

    /// The network security group's rules: SSH, then the `azure-open-port`s (as the driver
    /// numbers them).
    fn security_rules(&self) -> Vec<Value> {
        let rule = |name: String, priority: usize, port: &str, protocol: &str| {
            json!({"name": name, "properties": {
                "protocol": protocol, "sourcePortRange": "*", "destinationPortRange": port,
                "sourceAddressPrefix": "*", "destinationAddressPrefix": "*",
                "access": "Allow", "priority": priority, "direction": "Inbound"}})
        };
        let mut rules = vec![rule("SSHAllowAny".into(), 100, &self.options.ssh_port.to_string(), "Tcp")];
        for (i, open) in self.options.open_ports.iter().enumerate() {
            let (port, protocol) = open.split_once('/').unwrap_or((open, "tcp"));
            let protocol = match protocol {
                "udp" => "Udp",
                "*" => "*",
                _ => "Tcp",
            };
            let name = format!("Port{port}-{protocol}AllowAny").replace('*', "Asterisk");
            rules.push(rule(name, 1000 + i, port, protocol));
        }
        rules
    }

    /// The VM's body.
    pub fn vm_body(&self, name: &str, nic_id: &str) -> Result<Value, ProviderError> {
        let user = &self.options.ssh_user;
        let mut os_profile = json!({
            "computerName": name.chars().take(64).collect::<String>(),
            "adminUsername": user,
            "linuxConfiguration": {"disablePasswordAuthentication": true, "ssh": {"publicKeys": [
                {"path": format!("/home/{user}/.ssh/authorized_keys"), "keyData": self.public_key}
            ]}}
        });
        if let Some(data) = &self.custom_data {
            os_profile["customData"] = json!(data);
        }
        let image = image_reference(&self.options.image).map_err(ProviderError::InvalidConfig)?;
        Ok(json!({
            "location": self.options.location,
            "tags": self.tags(),
            "properties": {
                "availabilitySet": {"id": self.availability_set_id},
                "hardwareProfile": {"vmSize": self.options.size},
                "networkProfile": {"networkInterfaces": [{"id": nic_id, "properties": {"primary": true}}]},
                "osProfile": os_profile,
                "storageProfile": {
                    "imageReference": image,
                    "osDisk": {"name": format!("{name}-os-disk"), "caching": "ReadWrite", "createOption": "FromImage",
                        "deleteOption": "Delete", "managedDisk": {"storageAccountType": self.options.storage_type}}
                }
            }
        }))
    }

    /// Create machine `name`'s resources and the VM (not waited for: `update` sees it run).
    fn create(&self, arm: &mut Arm, name: &str) -> Result<(), ProviderError> {
        let o = &self.options;
        let nsg = self.resource("Microsoft.Network/networkSecurityGroups", &format!("{name}-firewall"));
        let body = json!({"location": o.location, "tags": self.tags(), "properties": {"securityRules": self.security_rules()}});
        Self::put(arm, &nsg, NETWORK_API, &body, "creating the network security group")?;
        let mut ip_config = json!({"privateIPAllocationMethod": "Dynamic", "subnet": {"id": self.subnet_id}});
        if !o.no_public_ip {
            let ip = self.resource("Microsoft.Network/publicIPAddresses", &format!("{name}-ip"));
            let body = json!({"location": o.location, "tags": self.tags(), "sku": {"name": "Standard"},
                "properties": {"publicIPAllocationMethod": "Static"}});
            Self::put(arm, &ip, NETWORK_API, &body, "creating the public IP address")?;
            ip_config["publicIPAddress"] = json!({"id": arm_id(&ip)});
        }
        let nic = self.resource("Microsoft.Network/networkInterfaces", &format!("{name}-nic"));
        let body = json!({"location": o.location, "tags": self.tags(), "properties": {
            "networkSecurityGroup": {"id": arm_id(&nsg)},
            "ipConfigurations": [{"name": "ip", "properties": ip_config}]}});
        Self::put(arm, &nic, NETWORK_API, &body, "creating the network interface")?;
        let vm = self.resource("Microsoft.Compute/virtualMachines", name);
        let body = self.vm_body(name, &arm_id(&nic))?;
        arm.send("PUT", &Self::url(&vm, COMPUTE_API), Some(&body)).map_err(|e| match e {
            CallError::Api(ref a) if a.is_capacity() => ProviderError::Capacity(CapacityError {
                message: format!("creating VM {name}: {}: {}", a.code, a.message),
                retry_after_seconds: crate::arm::CAPACITY_RETRY_SECONDS,
            }),
            e => e.into_provider(&format!("creating VM {name}")),
        })?;
        Ok(())
    }

    /// Create `n` machines, one at a time; how many ARM accepted. A machine that failed
    /// half-way has its network resources deleted (now, or on later updates).
    pub fn increase(&self, arm: &mut Arm, n: u32) -> Result<u32, ProviderError> {
        self.state.check_capacity(&format!("machines {}", self.template))?;
        let mut created = 0;
        for _ in 0..n {
            let mut random = [0u8; 4];
            // WASI's random source; a failure only makes the name less unique (the time is in it).
            let _ = getrandom::fill(&mut random);
            let name = machine_name(&self.template, cloud_common::now_unix(), random);
            match self.create(arm, &name) {
                Ok(()) => {
                    created += 1;
                    runway_sdk::log::info(&format!("machine {name} created"));
                }
                Err(error) => {
                    self.add(CLEANUP, &name)?;
                    self.clean_up(arm, &name);
                    if let ProviderError::Capacity(c) = &error {
                        self.state.back_off(u64::from(c.retry_after_seconds), &c.message)?;
                    }
                    if created > 0 {
                        runway_sdk::log::warn(&format!("created {created} of {n} machines: {error}"));
                        break;
                    }
                    return Err(error);
                }
            }
        }
        Ok(created)
    }

    /// Every VM of this template and manager, with its provisioning state.
    pub fn list(&self, arm: &mut Arm) -> Result<Vec<(String, String)>, ProviderError> {
        let url =
            Self::url(&format!("{}/providers/Microsoft.Compute/virtualMachines", self.group_path(None)), COMPUTE_API);
        let vms = arm.list(&url).map_err(|e| e.into_provider("listing the VMs"))?;
        Ok(vms
            .iter()
            .filter(|vm| {
                tag(vm, GROUP_TAG).as_deref() == Some(&self.template)
                    && tag(vm, MANAGER_TAG).as_deref() == Some(&self.manager)
            })
            .filter_map(|vm| {
                let name = vm.get("name")?.as_str()?.to_string();
                let state = vm.pointer("/properties/provisioningState").and_then(|p| p.as_str()).unwrap_or("");
                Some((name, state.to_string()))
            })
            .collect())
    }

    /// Fleeting's view of the machines; the network resources of machines gone are deleted.
    pub fn update(&self, arm: &mut Arm) -> Result<Vec<Instance>, ProviderError> {
        let vms = self.list(arm)?;
        self.state.retain_ids(DELETED, |id| vms.iter().any(|(name, _)| name == id))?;
        for name in self.state.ids(CLEANUP)? {
            if !vms.iter().any(|(vm, _)| *vm == name) {
                self.clean_up(arm, &name);
            }
        }
        Ok(vms.iter().map(|(name, state)| Instance { id: name.clone(), state: machine_state(state) }).collect())
    }

    fn add(&self, list: &str, name: &str) -> Result<(), ProviderError> {
        let mut ids = self.state.ids(list)?;
        ids.insert(name.to_string());
        self.state.set_ids(list, &ids)
    }

    /// Delete machine `name`'s interface, address and security group (in that order: ARM
    /// refuses to delete what is in use); forget it once all are gone. Failures are logged and
    /// retried on later updates.
    fn clean_up(&self, arm: &mut Arm, name: &str) {
        let resources = [
            ("Microsoft.Network/networkInterfaces", format!("{name}-nic")),
            ("Microsoft.Network/publicIPAddresses", format!("{name}-ip")),
            ("Microsoft.Network/networkSecurityGroups", format!("{name}-firewall")),
        ];
        for (provider, resource) in resources {
            let url = Self::url(&self.resource(provider, &resource), NETWORK_API);
            let done = match arm.send("DELETE", &url, None) {
                Ok(response) => arm.follow(&response).map(|lro| matches!(lro, Lro::Succeeded)),
                Err(e) if e.status() == Some(404) => Ok(true),
                Err(e) => Err(e),
            };
            match done {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => {
                    runway_sdk::log::warn(&format!("machine {name}: cannot delete {resource} yet: {e:?}"));
                    return;
                }
            }
        }
        if let Ok(mut ids) = self.state.ids(CLEANUP) {
            ids.remove(name);
            let _ = self.state.set_ids(CLEANUP, &ids);
        }
    }

    /// Delete the VMs `ids`; those ARM accepted (or no longer knows). Their network resources
    /// follow once the VM is gone.
    pub fn decrease(&self, arm: &mut Arm, ids: Vec<String>) -> Result<Vec<String>, ProviderError> {
        let mut accepted = Vec::new();
        let mut first_error = None;
        for id in ids {
            let url = Self::url(&self.resource("Microsoft.Compute/virtualMachines", &id), COMPUTE_API);
            let gone = match arm.send("DELETE", &url, None) {
                Ok(response) => arm.follow(&response).map(|lro| matches!(lro, Lro::Succeeded)),
                Err(e) if e.status() == Some(404) => Ok(true),
                Err(e) => Err(e),
            };
            match gone {
                Ok(gone) => {
                    self.add(DELETED, &id)?;
                    self.add(CLEANUP, &id)?;
                    if gone {
                        self.clean_up(arm, &id);
                    }
                    runway_sdk::log::info(&format!("machine {id} deleted"));
                    accepted.push(id);
                }
                Err(e) => {
                    runway_sdk::log::warn(&format!("cannot delete machine {id}: {e:?}"));
                    first_error.get_or_insert(e.into_provider("deleting a VM"));
                }
            }
        }
        match first_error {
            Some(e) if accepted.is_empty() => Err(e),
            _ => Ok(accepted),
        }
    }

    /// Machine `id`'s private and public addresses (from its interface and public address).
    pub fn addresses(&self, arm: &mut Arm, id: &str) -> Result<(Option<String>, Option<String>), ProviderError> {
        let nic_path = self.resource("Microsoft.Network/networkInterfaces", &format!("{id}-nic"));
        let nic = Self::find(arm, &nic_path, NETWORK_API, "reading the network interface")?
            .ok_or_else(|| ProviderError::NotFound(format!("machine {id} has no network interface")))?;
        let config = nic.pointer("/properties/ipConfigurations/0/properties").cloned().unwrap_or_default();
        let private = config.get("privateIPAddress").and_then(|a| a.as_str()).map(str::to_string);
        let public = match config.pointer("/publicIPAddress/id").and_then(|i| i.as_str()) {
            Some(_) => {
                let ip_path = self.resource("Microsoft.Network/publicIPAddresses", &format!("{id}-ip"));
                Self::find(arm, &ip_path, NETWORK_API, "reading the public IP address")?
                    .and_then(|ip| ip.pointer("/properties/ipAddress").and_then(|a| a.as_str()).map(str::to_string))
            }
            None => None,
        };
        Ok((private, public))
    }

    /// Is machine `id` running (its instance view's power state)?
    pub fn heartbeat(&self, arm: &mut Arm, id: &str) -> Result<(), ProviderError> {
        let path = format!("{}/instanceView", self.resource("Microsoft.Compute/virtualMachines", id));
        let view = Self::find(arm, &path, COMPUTE_API, &format!("VM {id}"))?
            .ok_or_else(|| ProviderError::NotFound(format!("machine {id}")))?;
        if crate::powered_on(&view) {
            Ok(())
        } else {
            Err(ProviderError::NotFound(format!("machine {id} is not running")))
        }
    }

    /// Machines being deleted without this plugin asking.
    pub fn interruptions(&self, arm: &mut Arm) -> Result<Vec<Interruption>, ProviderError> {
        let deleted = self.state.ids(DELETED)?;
        Ok(self
            .list(arm)?
            .into_iter()
            .filter(|(name, state)| state == "Deleting" && !deleted.contains(name))
            .map(|(id, _)| Interruption { id, kind: InterruptionKind::Maintenance, deadline: None })
            .collect())
    }
}

/// The ARM resource ID of a resource URL (the path after the endpoint).
fn arm_id(url: &str) -> String {
    match url.find("/subscriptions/") {
        Some(at) => url[at..].to_string(),
        None => url.to_string(),
    }
}
