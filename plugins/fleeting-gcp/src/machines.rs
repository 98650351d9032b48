//! The `docker+machine` mode: individual Compute Engine instances, as docker-machine's `google`
//! driver creates them for gitlab-runner — no managed instance group. The host hands the
//! plugin the machine name template (`runner-<short token>-<MachineName>`, `%s` still in it),
//! the manager's identity and the runner's `MachineOptions`.
//!
//! - `init`: projects.get (the project exists and the credentials reach it, as the driver's
//!   pre-create check); the manager's SSH key from the plugin's `kv` (made once: an ed25519
//!   key, so a restarted manager still reaches the machines it made).
//! - `increase`: one instances.insert per machine (the driver's instance: machine type, boot
//!   disk from the image with its size and type, network and subnetwork, external NAT unless
//!   internal-only, network tags `docker-machine` + `google-tags`, service account and
//!   scopes, preemptible), named from the template (`%s` = `<unix time>-<8 hex>`), labelled
//!   and with metadata `runway-machine` (the template) and `runway-manager`, and the manager's
//!   public key in metadata `ssh-keys` for the login user; the zone operation is followed, so
//!   a creation failing for capacity is a capacity error. A `requestId` makes a retried
//!   insert one machine.
//! - `update`: instances.list filtered by both labels (each page), then the exact metadata
//!   values checked: a restarted manager finds its machines (the host adopts them from its
//!   fleet state) and never another manager's.
//! - `decrease`: instances.delete (the boot disk goes with it: `autoDelete`).
//!
//! Owns: the machine mode's requests and its key. Must not touch: flag parsing
//! (`machine_options`), REST mechanics (`compute`), the managed group mode (`lib.rs`).

use cloud_common::group_state::GroupState;
pub use cloud_common::machine::MachineConfig;
use runway_sdk::fleeting::*;
use serde_json::{json, Value};
use ssh_key::private::{Ed25519Keypair, KeypairData};
use ssh_key::{LineEnding, PrivateKey};

use crate::compute::{CallError, Compute};
use crate::machine_options::MachineOptions;

/// The label and metadata key naming the machine template (the runner's machine "group").
pub const GROUP_LABEL: &str = "runway-machine";
/// The label and metadata key naming the manager that created the machine.
pub const MANAGER_LABEL: &str = "runway-manager";
/// The network tag docker-machine gives its machines (its firewall rule's target).
const DOCKER_MACHINE_TAG: &str = "docker-machine";
/// The `kv` entry (under the machines' identity) holding the manager's private key.
const KEY_ENTRY: &str = "ssh-key";

/// The manager's key: the private half the host connects with (OpenSSH), the public half
/// (`ssh-ed25519 AAAA…`, no comment) put in each machine's metadata.
struct Key {
    private_pem: Vec<u8>,
    public: String,
}

/// The machines of one runner's template, created by one manager.
pub struct Machines {
    template: String,
    manager: String,
    options: MachineOptions,
    /// `{endpoint}/compute/v1/projects/{project}/zones/{zone}`.
    zone_url: String,
    /// The login user (`google-username`, the connector's).
    user: String,
    key: Key,
}

/// A machine as instances.list describes it.
pub struct Listed {
    pub name: String,
    pub status: String,
    pub preemptible: bool,
}

/// Random bytes from WASI's random source; a failure only makes a name or request id less
/// unique (the time is in names too).
fn random<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    let _ = getrandom::fill(&mut bytes);
    bytes
}

/// A label value as Compute Engine allows it (lowercase letters, digits, `_` and `-`, at most
/// 63 characters); the exact value is in the metadata.
fn label(value: &str) -> String {
    value
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_' { c } else { '_' })
        .take(63)
        .collect()
}

/// Is `name` a Compute Engine resource name (RFC 1035: `[a-z]([-a-z0-9]*[a-z0-9])?`, at most
/// 63 characters)?
fn valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_lowercase()
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.last() != Some(&b'-')
}

/// A random (version 4) UUID: instances.insert's and delete's `requestId`.
fn request_id() -> String {
    let mut b: [u8; 16] = random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

/// The manager's key from `state`, made and stored the first time.
fn manager_key(state: &GroupState) -> Result<Key, ProviderError> {
    let stored = state.get(KEY_ENTRY)?;
    let private = if stored.is_empty() {
        let key = PrivateKey::new(KeypairData::Ed25519(Ed25519Keypair::from_seed(&random())), "runway-machine")
            .map_err(|e| ProviderError::Other(format!("making the machines' SSH key: {e}")))?;
        let pem = key.to_openssh(LineEnding::LF).map_err(|e| ProviderError::Other(format!("encoding the key: {e}")))?;
        state.set(KEY_ENTRY, &pem)?;
        runway_sdk::log::info("made the SSH key this manager's machines authorize");
        key
    } else {
        PrivateKey::from_openssh(&stored)
            .map_err(|e| ProviderError::Other(format!("the stored machine SSH key does not read: {e}")))?
    };
    let public = private.public_key().to_openssh().map_err(|e| ProviderError::Other(format!("public key: {e}")))?;
    let public = public.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
    let pem = private.to_openssh(LineEnding::LF).map_err(|e| ProviderError::Other(format!("encoding the key: {e}")))?;
    Ok(Key { private_pem: pem.as_bytes().to_vec(), public })
}

impl Machines {
    /// Check the template and the project, and take the manager's key from `state`.
    pub fn init(
        config: MachineConfig,
        options: MachineOptions,
        endpoint: &str,
        user: &str,
        compute: &mut Compute,
        state: &GroupState,
    ) -> Result<Machines, ProviderError> {
        if config.name.trim().is_empty() || config.manager.trim().is_empty() {
            return Err(ProviderError::InvalidConfig("plugin_config.machine: name and manager are required".into()));
        }
        let sample = cloud_common::machine::machine_name(&config.name, cloud_common::now_unix(), [0; 4]);
        if !valid_name(&sample) {
            return Err(ProviderError::InvalidConfig(format!(
                "MachineName: machines would be named like {sample:?}, which Compute Engine refuses (lowercase \
                 letters, digits and '-', starting with a letter, at most 63 characters)"
            )));
        }
        for flag in &options.ignored {
            runway_sdk::log::warn(&format!("MachineOptions {flag}: not used by Runway (ignored)"));
        }
        let project_url = format!("{endpoint}/compute/v1/projects/{}", cloud_common::percent_encode(&options.project));
        compute.send("GET", &project_url, None).map_err(|e| match e.status() {
            Some(403) | Some(404) => ProviderError::InvalidConfig(format!(
                "MachineOptions google-project={}: project not found or not reachable with these credentials ({})",
                options.project,
                e.into_provider("projects.get")
            )),
            _ => e.into_provider("reading the project"),
        })?;
        Ok(Machines {
            zone_url: format!("{project_url}/zones/{}", cloud_common::percent_encode(&options.zone)),
            template: config.name,
            manager: config.manager,
            user: if user.is_empty() { "docker-user".into() } else { user.to_string() },
            key: manager_key(state)?,
            options,
        })
    }

    /// The provider's identity for the manager's logs and metrics.
    pub fn id(options: &MachineOptions, template: &str) -> String {
        format!("googlecompute/{}/{}/{template}", options.project, options.zone)
    }

    /// `{endpoint}/compute/v1/projects/{project}/zones/{zone}`.
    pub fn zone_url(&self) -> &str {
        &self.zone_url
    }

    /// The private key the host connects to the machines with.
    pub fn private_key(&self) -> Vec<u8> {
        self.key.private_pem.clone()
    }

    /// instances.insert's body for machine `name`.
    pub fn instance(&self, name: &str) -> Value {
        let o = &self.options;
        let mut tags = vec![DOCKER_MACHINE_TAG.to_string()];
        tags.extend(o.tags.iter().cloned());
        let mut nic = json!({ "network": o.network_url() });
        if let Some(subnetwork) = o.subnetwork_url() {
            nic["subnetwork"] = json!(subnetwork);
        }
        if !o.internal_ip_only {
            let mut access = json!({"type": "ONE_TO_ONE_NAT", "name": "External NAT"});
            if let Some(address) = &o.address {
                access["natIP"] = json!(address);
            }
            nic["accessConfigs"] = json!([access]);
        }
        json!({
            "name": name,
            "description": "docker host vm (Runway docker+machine)",
            "machineType": format!("zones/{}/machineTypes/{}", o.zone, o.machine_type),
            "disks": [{
                "boot": true,
                "autoDelete": true,
                "type": "PERSISTENT",
                "mode": "READ_WRITE",
                "initializeParams": {
                    "diskName": format!("{name}-disk"),
                    "sourceImage": o.image_url(),
                    "diskSizeGb": o.disk_size.to_string(),
                    "diskType": format!("zones/{}/diskTypes/{}", o.zone, o.disk_type)
                }
            }],
            "networkInterfaces": [nic],
            "tags": {"items": tags},
            "serviceAccounts": [{"email": o.service_account, "scopes": o.scopes}],
            "scheduling": {"preemptible": o.preemptible},
            "labels": {GROUP_LABEL: label(&self.template), MANAGER_LABEL: label(&self.manager)},
            "metadata": {"items": [
                {"key": "ssh-keys", "value": format!("{0}:{1} {0}", self.user, self.key.public)},
                {"key": GROUP_LABEL, "value": self.template},
                {"key": MANAGER_LABEL, "value": self.manager}
            ]}
        })
    }

    /// Every machine of this template and manager that Compute Engine lists.
    pub fn list(&self, compute: &mut Compute) -> Result<Vec<Listed>, ProviderError> {
        let filter = format!(
            "(labels.{GROUP_LABEL} = \"{}\") (labels.{MANAGER_LABEL} = \"{}\")",
            label(&self.template),
            label(&self.manager)
        );
        let url =
            format!("{}/instances?maxResults=500&filter={}", self.zone_url, cloud_common::percent_encode(&filter));
        let items = compute.list("GET", &url, "items").map_err(|e| e.into_provider("instances.list"))?;
        Ok(items.iter().filter(|i| self.ours(i)).filter_map(listed).collect())
    }

    /// Does the instance's metadata name this template and manager exactly (labels are cut)?
    fn ours(&self, instance: &Value) -> bool {
        let items = instance.pointer("/metadata/items").and_then(|i| i.as_array());
        let value = |key: &str| {
            items?.iter().find(|i| i.get("key").and_then(|k| k.as_str()) == Some(key))?.get("value")?.as_str()
        };
        value(GROUP_LABEL) == Some(self.template.as_str()) && value(MANAGER_LABEL) == Some(self.manager.as_str())
    }

    /// Create `n` machines, one at a time; how many Compute Engine created.
    pub fn increase(&self, compute: &mut Compute, n: u32) -> Result<u32, ProviderError> {
        let mut created = 0;
        let operations = format!("{}/operations", self.zone_url);
        for _ in 0..n {
            let name = cloud_common::machine::machine_name(&self.template, cloud_common::now_unix(), random());
            let url = format!("{}/instances?requestId={}", self.zone_url, request_id());
            let body = self.instance(&name);
            let result = compute.send("POST", &url, Some(&body)).and_then(|op| compute.follow(&operations, op));
            match result {
                Ok(()) => {
                    created += 1;
                    runway_sdk::log::info(&format!("machine {name} created"));
                }
                Err(e) => {
                    let error = e.into_provider(&format!("instances.insert {name}"));
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

    /// Delete `ids`; those Compute Engine accepted (or no longer knows). The deletion goes on
    /// at Google (an operation); `update` sees the machines go.
    pub fn decrease(&self, compute: &mut Compute, ids: Vec<String>) -> Result<Vec<String>, ProviderError> {
        let mut accepted = Vec::new();
        let mut first_error = None;
        for id in ids {
            let url =
                format!("{}/instances/{}?requestId={}", self.zone_url, cloud_common::percent_encode(&id), request_id());
            match compute.send("DELETE", &url, None) {
                Ok(_) => accepted.push(id),
                Err(CallError::Api(e)) if e.status == 404 => accepted.push(id),
                Err(e) => {
                    let error = e.into_provider(&format!("instances.delete {id}"));
                    runway_sdk::log::warn(&format!("cannot delete machine {id}: {error}"));
                    first_error.get_or_insert(error);
                }
            }
        }
        match first_error {
            Some(e) if accepted.is_empty() => Err(e),
            _ => Ok(accepted),
        }
    }
}

fn listed(instance: &Value) -> Option<Listed> {
    Some(Listed {
        name: instance.get("name")?.as_str()?.to_string(),
        status: instance.get("status").and_then(|s| s.as_str()).unwrap_or("").to_string(),
        preemptible: instance.pointer("/scheduling/preemptible").and_then(|p| p.as_bool()) == Some(true)
            || instance.pointer("/scheduling/provisioningModel").and_then(|p| p.as_str()) == Some("SPOT"),
    })
}

/// Fleeting's state of a machine from its Compute Engine status.
pub fn machine_state(status: &str) -> InstanceState {
    match status {
        "RUNNING" => InstanceState::Running,
        // Stopped or suspended (preempted, or by hand): leaving service.
        "STOPPING" | "STOPPED" | "TERMINATED" | "SUSPENDING" | "SUSPENDED" => InstanceState::Deleting,
        // PROVISIONING, STAGING, REPAIRING.
        _ => InstanceState::Creating,
    }
}

/// Has the machine stopped (preempted, or stopped by hand)?
pub fn stopped(status: &str) -> bool {
    machine_state(status) == InstanceState::Deleting
}
