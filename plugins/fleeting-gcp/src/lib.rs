//! A fleeting provider over a Google Compute Engine zonal managed instance group, as GitLab's
//! fleeting-plugin-googlecompute: `plugin_config` keys `project`, `zone`, `name` (the group),
//! `credentials_file` and `endpoint`. Credentials and hosts only through the grant (see
//! `auth`).
//!
//! - `update`: listManagedInstances (every page); current actions and instance statuses
//!   mapped to fleeting's. Creations failing for lack of capacity or quota (the managed
//!   instance's last attempt) are reported as timed out and make `increase` answer with a
//!   capacity error for a while.
//! - `increase`: resize to the target size plus `n`, the zone operation followed.
//! - `decrease`: deleteInstances (the target size goes down with them).
//! - `get-connect-info`: the instance's internal IP and its external (NAT) IP.
//! - `interruptions`: instances preempted or stopped without the plugin asking (recreating,
//!   stopping, terminated): `spot-reclaim` for preemptible and Spot VMs.
//!
//! With `plugin_config.machine` (written by the host for `executor = "docker+machine"` with
//! `MachineDriver = "google"`), the plugin manages individual instances as docker-machine's
//! driver does instead of a group: see `machines`.

mod auth;
mod compute;
mod machine_options;
mod machines;

use cloud_common::group_state::GroupState;
use runway_sdk::fleeting::*;
use serde_json::{json, Value};

use compute::Compute;
use machine_options::MachineOptions;
use machines::{MachineConfig, Machines};

/// Group-state list of the instances this plugin asked to delete (their going away is no
/// interruption).
const DELETED: &str = "deleted";

/// `[runners.autoscaler.plugin_config]`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    project: String,
    #[serde(default)]
    zone: String,
    /// The managed instance group (not with `machine`).
    #[serde(default)]
    name: String,
    /// docker+machine's individual instances instead of a group.
    #[serde(default)]
    machine: Option<MachineConfig>,
    /// Service account key file (as the plugin sees it: a `dirs` grant).
    #[serde(default)]
    credentials_file: Option<String>,
    /// Compute API endpoint (default `https://compute.googleapis.com`).
    #[serde(default)]
    endpoint: Option<String>,
}

/// A zonal managed instance group holds at most 1,000 VMs.
const MAX_SIZE: u32 = 1000;

struct GcpGroup {
    compute: Compute,
    /// `{endpoint}/compute/v1/projects/{project}/zones/{zone}`.
    zone_url: String,
    zone: String,
    name: String,
    connector: ConnectorConfig,
    /// What it remembers between calls, under this group's identity.
    state: GroupState,
    /// docker+machine's individual instances instead of the group `name`.
    machines: Option<Machines>,
}

/// One managed instance.
struct Managed {
    name: String,
    status: String,
    action: String,
    /// Error codes of its last creation attempt.
    errors: Vec<String>,
}

fn managed_of(value: &Value) -> Option<Managed> {
    let name = value.get("instance")?.as_str()?.rsplit('/').next()?.to_string();
    let text = |key: &str| value.get(key).and_then(|v| v.as_str()).unwrap_or("").to_string();
    let errors = value
        .pointer("/lastAttempt/errors/errors")
        .and_then(|e| e.as_array())
        .map(|a| a.iter().filter_map(|e| e.get("code")?.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    Some(Managed { name, status: text("instanceStatus"), action: text("currentAction"), errors })
}

/// Fleeting's state of a managed instance.
fn state(m: &Managed) -> InstanceState {
    match m.action.as_str() {
        "DELETING" | "ABANDONING" | "RECREATING" => return InstanceState::Deleting,
        "CREATING" | "CREATING_WITHOUT_RETRIES" if m.errors.iter().any(|c| compute::is_capacity(c)) => {
            return InstanceState::Timeout
        }
        "CREATING"
        | "CREATING_WITHOUT_RETRIES"
        | "VERIFYING"
        | "STARTING"
        | "RESUMING"
        | "RESTARTING"
        | "REFRESHING" => return InstanceState::Creating,
        _ => {}
    }
    match m.status.as_str() {
        "RUNNING" => InstanceState::Running,
        "STOPPING" | "STOPPED" | "TERMINATED" | "SUSPENDING" | "SUSPENDED" => InstanceState::Deleting,
        _ => InstanceState::Creating,
    }
}

impl GcpGroup {
    fn group_url(&self, suffix: &str) -> String {
        format!("{}/instanceGroupManagers/{}{suffix}", self.zone_url, cloud_common::percent_encode(&self.name))
    }

    fn operations_url(&self) -> String {
        format!("{}/operations", self.zone_url)
    }

    fn group(&mut self) -> Result<Value, ProviderError> {
        let url = self.group_url("");
        self.compute.send("GET", &url, None).map_err(|e| match e.status() {
            Some(404) => {
                ProviderError::InvalidConfig(format!("managed instance group {:?} not found ({url})", self.name))
            }
            _ => e.into_provider("reading the managed instance group"),
        })
    }

    fn managed(&mut self) -> Result<Vec<Managed>, ProviderError> {
        let url = self.group_url("/listManagedInstances?maxResults=500");
        let listed =
            self.compute.list("POST", &url, "managedInstances").map_err(|e| e.into_provider("listManagedInstances"))?;
        Ok(listed.iter().filter_map(managed_of).collect())
    }

    /// deleteInstances (the target size goes down with them); the deletion goes on at Google
    /// (an operation), update sees the instances go.
    fn delete_from_group(&mut self, ids: Vec<String>) -> Result<Vec<String>, ProviderError> {
        let instances: Vec<String> = ids.iter().map(|id| format!("zones/{}/instances/{id}", self.zone)).collect();
        let body = json!({"instances": instances, "skipInstancesOnValidationError": true});
        let url = self.group_url("/deleteInstances");
        self.compute.send("POST", &url, Some(&body)).map_err(|e| e.into_provider("deleteInstances"))?;
        Ok(ids)
    }

    fn instance(&mut self, name: &str) -> Result<Value, ProviderError> {
        let url = format!("{}/instances/{}", self.zone_url, cloud_common::percent_encode(name));
        self.compute.send("GET", &url, None).map_err(|e| e.into_provider(&format!("instance {name}")))
    }
}

impl InstanceGroup for GcpGroup {
    fn init(connector: ConnectorConfig, plugin_config: &str) -> Result<(Self, ProviderInfo), ProviderError> {
        let mut config: Config = serde_json::from_str(plugin_config)
            .map_err(|e| ProviderError::InvalidConfig(format!("plugin_config: {e}")))?;
        // docker+machine: the driver's flags choose the project, the zone and the endpoint.
        let machine = match config.machine.take() {
            Some(machine) => {
                let options = MachineOptions::parse(&machine.options).map_err(ProviderError::InvalidConfig)?;
                config.project = options.project.clone();
                config.zone = options.zone.clone();
                config.name = machine.name.clone();
                config.endpoint = options.endpoint.clone().or(config.endpoint);
                Some((machine, options))
            }
            None => None,
        };
        for (key, value) in [("project", &config.project), ("zone", &config.zone), ("name", &config.name)] {
            if value.trim().is_empty() {
                return Err(ProviderError::InvalidConfig(format!("plugin_config.{key} is empty")));
            }
        }
        let endpoint = config.endpoint.clone().unwrap_or_else(|| "https://compute.googleapis.com".into());
        let endpoint = endpoint.trim_end_matches('/').to_string();
        cloud_common::http::parse_url(&endpoint)
            .map_err(|e| ProviderError::InvalidConfig(format!("plugin_config.endpoint: {e}")))?;
        let auth = auth::Auth::new(config.credentials_file.as_deref()).map_err(ProviderError::InvalidConfig)?;
        let mut group = GcpGroup {
            compute: Compute::new(auth),
            zone_url: format!(
                "{endpoint}/compute/v1/projects/{}/zones/{}",
                cloud_common::percent_encode(&config.project),
                cloud_common::percent_encode(&config.zone)
            ),
            zone: config.zone.clone(),
            name: config.name.clone(),
            connector,
            state: GroupState::new(format!("{}/{}/{}", config.project, config.zone, config.name)),
            machines: None,
        };
        group.compute.check_auth().map_err(|e| e.into_provider("authenticating"))?;
        if let Some((machine, options)) = machine {
            let id = Machines::id(&options, &machine.name);
            group.state = GroupState::new(id.clone());
            let user = group.connector.username.clone();
            let machines = Machines::init(machine, options, &endpoint, &user, &mut group.compute, &group.state)?;
            group.zone_url = machines.zone_url().to_string();
            group.machines = Some(machines);
            let info = ProviderInfo {
                id,
                // Machines are limited by the runner's `limit` and max_instances, not by Google.
                max_size: u32::MAX,
                version: env!("CARGO_PKG_VERSION").into(),
                capabilities: vec!["interruptions".into()],
            };
            return Ok((group, info));
        }
        group.group()?;
        let info = ProviderInfo {
            id: format!("googlecompute/{}/{}/{}", config.project, config.zone, config.name),
            max_size: MAX_SIZE,
            version: env!("CARGO_PKG_VERSION").into(),
            capabilities: vec!["interruptions".into()],
        };
        Ok((group, info))
    }

    fn update(&mut self) -> Result<Vec<Instance>, ProviderError> {
        if let Some(machines) = &self.machines {
            let listed = machines.list(&mut self.compute)?;
            self.state.retain_ids(DELETED, |id| listed.iter().any(|m| m.name == id))?;
            return Ok(listed
                .iter()
                .map(|m| Instance { id: m.name.clone(), state: machines::machine_state(&m.status) })
                .collect());
        }
        let managed = self.managed()?;
        if let Some(m) = managed.iter().find(|m| state(m) == InstanceState::Timeout) {
            if !self.state.backing_off()? {
                let message = format!("creating {} failed: {}", m.name, m.errors.join(", "));
                runway_sdk::log::warn(&format!("group {}: {message}", self.name));
                self.state.back_off(u64::from(compute::CAPACITY_RETRY_SECONDS), &message)?;
            }
        }
        self.state.retain_ids(DELETED, |id| managed.iter().any(|m| m.name == id))?;
        Ok(managed.iter().map(|m| Instance { id: m.name.clone(), state: state(m) }).collect())
    }

    fn increase(&mut self, n: u32) -> Result<u32, ProviderError> {
        if n == 0 {
            return Ok(0);
        }
        if let Some(machines) = &self.machines {
            self.state.check_capacity(&format!("machines {}", self.name))?;
            return machines.increase(&mut self.compute, n).inspect_err(|e| {
                if let ProviderError::Capacity(c) = e {
                    // Ask Google again only when the retry time is over.
                    let _ = self.state.back_off(u64::from(c.retry_after_seconds), &c.message);
                }
            });
        }
        self.state.check_capacity(&format!("group {}", self.name))?;
        let group = self.group()?;
        let current = group.get("targetSize").and_then(|t| t.as_u64()).unwrap_or(0);
        let current = u32::try_from(current).unwrap_or(MAX_SIZE);
        if current >= MAX_SIZE {
            return Err(ProviderError::Capacity(CapacityError {
                message: format!("group {} holds {MAX_SIZE} instances", self.name),
                retry_after_seconds: 60,
            }));
        }
        let target = current.saturating_add(n).min(MAX_SIZE);
        let url = self.group_url(&format!("/resize?size={target}"));
        let operations = self.operations_url();
        let result = self.compute.send("POST", &url, None).and_then(|op| self.compute.follow(&operations, op));
        match result {
            Ok(()) => {
                runway_sdk::log::info(&format!("group {}: target size {current} -> {target}", self.name));
                Ok(target - current)
            }
            Err(e) => Err(e.into_provider("resize")),
        }
    }

    fn decrease(&mut self, ids: Vec<String>) -> Result<Vec<String>, ProviderError> {
        if ids.is_empty() {
            return Ok(ids);
        }
        let ids = match &self.machines {
            Some(machines) => machines.decrease(&mut self.compute, ids)?,
            None => self.delete_from_group(ids)?,
        };
        let mut deleted = self.state.ids(DELETED)?;
        deleted.extend(ids.iter().cloned());
        self.state.set_ids(DELETED, &deleted)?;
        Ok(ids)
    }

    fn connect_info(&mut self, id: &str) -> Result<ConnectInfo, ProviderError> {
        let instance = self.instance(id)?;
        let nic = instance.pointer("/networkInterfaces/0").cloned().unwrap_or_default();
        let internal = nic.get("networkIP").and_then(|a| a.as_str()).map(str::to_string);
        let external = nic.pointer("/accessConfigs/0/natIP").and_then(|a| a.as_str()).map(str::to_string);
        if internal.is_none() && external.is_none() {
            return Err(ProviderError::NotFound(format!("instance {id} has no address")));
        }
        let mut connector = self.connector.clone();
        if let Some(machines) = &self.machines {
            // The manager's key, in every machine's `ssh-keys` metadata.
            connector.key = Some(machines.private_key());
            connector.password = None;
        }
        Ok(ConnectInfo {
            id: id.to_string(),
            external_addr: external,
            internal_addr: internal,
            connector,
            expires_at: None,
        })
    }

    fn heartbeat(&mut self, id: &str) -> Result<(), ProviderError> {
        let instance = self.instance(id)?;
        match instance.get("status").and_then(|s| s.as_str()) {
            Some("RUNNING") => Ok(()),
            other => Err(ProviderError::NotFound(format!("instance {id} is {}", other.unwrap_or("gone")))),
        }
    }

    fn interruptions(&mut self) -> Result<Vec<Interruption>, ProviderError> {
        let deleted = self.state.ids(DELETED)?;
        if let Some(machines) = &self.machines {
            let listed = machines.list(&mut self.compute)?;
            return Ok(listed
                .into_iter()
                .filter(|m| machines::stopped(&m.status) && !deleted.contains(&m.name))
                .map(|m| Interruption {
                    kind: if m.preemptible { InterruptionKind::SpotReclaim } else { InterruptionKind::Maintenance },
                    id: m.name,
                    deadline: None,
                })
                .collect());
        }
        let managed = self.managed()?;
        let mut out = Vec::new();
        for m in managed {
            let lost = m.action == "RECREATING" || matches!(m.status.as_str(), "STOPPING" | "STOPPED" | "TERMINATED");
            if !lost || deleted.contains(&m.name) {
                continue;
            }
            let spot = match self.instance(&m.name) {
                Ok(instance) => {
                    instance.pointer("/scheduling/preemptible").and_then(|p| p.as_bool()) == Some(true)
                        || instance.pointer("/scheduling/provisioningModel").and_then(|p| p.as_str()) == Some("SPOT")
                }
                Err(_) => false,
            };
            out.push(Interruption {
                id: m.name,
                kind: if spot { InterruptionKind::SpotReclaim } else { InterruptionKind::Maintenance },
                deadline: None,
            });
        }
        Ok(out)
    }
}

runway_sdk::export_fleeting!(GcpGroup, name: "googlecompute", description: "a Google Compute Engine managed instance group");
