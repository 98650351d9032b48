//! A fleeting provider over an AWS EC2 Auto Scaling group, as GitLab's fleeting-plugin-aws:
//! the same `plugin_config` keys (`name`, `region`, `profile`, `config_file`,
//! `credentials_file`, `endpoint`), run as a sandboxed component that reaches only the hosts
//! its grant's `allow_hosts` names and sees only the environment variables and directories
//! granted.
//!
//! - `update`: DescribeAutoScalingGroups, then DescribeInstances for the group's instances;
//!   Auto Scaling lifecycle states and EC2 states are mapped to fleeting's. An instance that
//!   is `Terminating*` (or shutting down) without this plugin having asked is an interruption
//!   notice (spot reclaim for spot instances, rebalance otherwise). When launches the plugin
//!   asked for fail for lack of capacity (a failed scaling activity naming
//!   InsufficientInstanceCapacity, a spot or vCPU limit, ...), the desired capacity goes back
//!   to the instances that exist and `increase` reports a capacity error with a retry-after.
//! - `increase`: SetDesiredCapacity (never past MaxSize; at MaxSize, a capacity error).
//! - `decrease`: TerminateInstanceInAutoScalingGroup with ShouldDecrementDesiredCapacity.
//! - `get-connect-info`: the instance's private and public addresses from DescribeInstances;
//!   unless `connector_config` `use_static_credentials` is true, a key pushed for the login
//!   user with EC2 Instance Connect (valid 60 s; see `instance_connect`).
//!
//! What must survive a reload (instances this plugin asked to terminate, the capacity
//! back-off) is kept in `kv` under the group's identity.
//!
//! With `plugin_config.machine` (written by the host for `executor = "docker+machine"` with
//! `MachineDriver = "amazonec2"`), the plugin manages individual EC2 instances as
//! docker-machine's driver does instead of a group: see `machines`.

mod api;
mod credentials;
mod instance_connect;
mod machine_options;
mod machines;
mod xml;

use std::collections::BTreeMap;

use runway_sdk::fleeting::*;

use api::{CallError, Client, Service};
use cloud_common::group_state::GroupState;
use credentials::Sources;
use machine_options::MachineOptions;
use machines::{Ec2, MachineConfig, Machines};
use xml::{AsgInstance, Ec2Instance, Group};

/// `[runners.autoscaler.plugin_config]`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    /// The Auto Scaling group (not with `machine`).
    #[serde(default)]
    name: String,
    /// docker+machine's individual instances instead of a group.
    #[serde(default)]
    machine: Option<MachineConfig>,
    /// Its region (else `AWS_REGION`, `AWS_DEFAULT_REGION` or the profile's `region`).
    #[serde(default)]
    region: Option<String>,
    /// Shared config profile.
    #[serde(default)]
    profile: Option<String>,
    /// Shared config file.
    #[serde(default)]
    config_file: Option<String>,
    /// Shared credentials file.
    #[serde(default)]
    credentials_file: Option<String>,
    /// One endpoint for every API (private endpoints, local test servers).
    #[serde(default)]
    endpoint: Option<String>,
}

/// An instance as the group lists it, with EC2's description when EC2 knows it.
type Listed = (AsgInstance, Option<Ec2Instance>);

/// How long `increase` refuses after launches failed for lack of capacity.
const CAPACITY_BACKOFF_SECONDS: u64 = 120;
/// Group-state list of the instances this plugin asked to terminate (their `Terminating` is
/// no interruption).
const DECREASED: &str = "decreased";
/// At MaxSize: when to ask again.
const FULL_RETRY_SECONDS: u32 = 60;

struct AwsGroup {
    name: String,
    client: Client,
    autoscaling: Service,
    ec2: Service,
    instance_connect: Service,
    connector: ConnectorConfig,
    /// What it remembers between calls, under this group's identity.
    state: GroupState,
    /// Addresses and states from the last DescribeInstances.
    known: BTreeMap<String, Ec2Instance>,
    /// docker+machine's individual instances instead of the group `name`.
    machines: Option<Machines>,
}

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

impl AwsGroup {
    fn describe_group(&mut self) -> Result<Group, ProviderError> {
        let params = vec![("AutoScalingGroupNames.member.1".to_string(), self.name.clone())];
        let body = self
            .client
            .call(&self.autoscaling, "DescribeAutoScalingGroups", &params)
            .map_err(|e| e.into_provider("DescribeAutoScalingGroups"))?;
        xml::parse_group(&body, &self.name)
            .map_err(|e| ProviderError::Other(format!("DescribeAutoScalingGroups: {e}")))?
            .ok_or_else(|| {
                ProviderError::InvalidConfig(format!(
                    "Auto Scaling group {:?} does not exist in {}",
                    self.name, self.client.region
                ))
            })
    }

    /// DescribeInstances for `ids` (100 at a time). Instances EC2 does not know yet (its API
    /// is eventually consistent) are simply missing.
    fn describe_instances(&mut self, ids: &[String]) -> Result<Vec<Ec2Instance>, ProviderError> {
        let mut out = Vec::new();
        for chunk in ids.chunks(100) {
            let params: Vec<(String, String)> =
                chunk.iter().enumerate().map(|(i, id)| (format!("InstanceId.{}", i + 1), id.clone())).collect();
            match self.client.call(&self.ec2, "DescribeInstances", &params) {
                Ok(body) => out.extend(
                    xml::parse_instances(&body).map_err(|e| ProviderError::Other(format!("DescribeInstances: {e}")))?,
                ),
                Err(e) if e.code() == Some("InvalidInstanceID.NotFound") && chunk.len() > 1 => {
                    // One unknown ID fails the whole call: ask one by one.
                    for id in chunk {
                        out.extend(self.describe_instances(std::slice::from_ref(id))?);
                    }
                }
                Err(e) if e.code() == Some("InvalidInstanceID.NotFound") => {}
                Err(e) => return Err(e.into_provider("DescribeInstances")),
            }
        }
        Ok(out)
    }

    fn set_desired(&mut self, desired: u32) -> Result<(), CallError> {
        let params = vec![
            ("AutoScalingGroupName".to_string(), self.name.clone()),
            ("DesiredCapacity".to_string(), desired.to_string()),
            ("HonorCooldown".to_string(), "false".to_string()),
        ];
        self.client.call(&self.autoscaling, "SetDesiredCapacity", &params).map(|_| ())
    }

    /// After an increase whose launches are still outstanding: did the latest scaling
    /// activity fail for lack of capacity? Then take the desired capacity back to what
    /// exists and refuse increases for a while.
    fn check_capacity(&mut self, group: &Group, live: u32) -> Result<(), ProviderError> {
        let Ok(increased_at) = self.state.get("increased-at")?.parse::<u64>() else { return Ok(()) };
        if group.desired <= live {
            return Ok(());
        }
        let params =
            vec![("AutoScalingGroupName".to_string(), self.name.clone()), ("MaxRecords".to_string(), "5".to_string())];
        let body = self
            .client
            .call(&self.autoscaling, "DescribeScalingActivities", &params)
            .map_err(|e| e.into_provider("DescribeScalingActivities"))?;
        let activities = xml::parse_activities(&body).map_err(ProviderError::Other)?;
        let failed = activities.iter().find(|a| {
            a.start.is_some_and(|t| t + 5 >= increased_at)
                && matches!(a.status.as_str(), "Failed" | "Cancelled")
                && xml::is_capacity_failure(&a.message)
        });
        if let Some(activity) = failed {
            runway_sdk::log::warn(&format!(
                "group {}: launches failed for lack of capacity ({}); desired capacity back to {live}, no increase for {CAPACITY_BACKOFF_SECONDS}s",
                self.name, activity.message
            ));
            self.set_desired(live).map_err(|e| e.into_provider("SetDesiredCapacity"))?;
            self.state.back_off(CAPACITY_BACKOFF_SECONDS, &activity.message)?;
            self.state.set("increased-at", "")?;
        }
        Ok(())
    }

    /// Instances this plugin asked to terminate: their shutting down is no interruption.
    fn remember_decreased(&mut self, accepted: &[String]) -> Result<(), ProviderError> {
        if !accepted.is_empty() {
            let mut decreased = self.state.ids(DECREASED)?;
            decreased.extend(accepted.iter().cloned());
            self.state.set_ids(DECREASED, &decreased)?;
        }
        Ok(())
    }

    fn interruption_kind(instance: Option<&Ec2Instance>) -> InterruptionKind {
        match instance {
            Some(i) if i.lifecycle.as_deref() == Some("spot") => InterruptionKind::SpotReclaim,
            _ => InterruptionKind::Rebalance,
        }
    }

    /// The group's instances with EC2's view of them.
    fn listed(&mut self) -> Result<(Group, Vec<Listed>), ProviderError> {
        let group = self.describe_group()?;
        let ids: Vec<String> = group.instances.iter().map(|i| i.id.clone()).collect();
        let described = self.describe_instances(&ids)?;
        self.known = described.into_iter().map(|i| (i.id.clone(), i)).collect();
        let listed = group.instances.iter().map(|i| (i.clone(), self.known.get(&i.id).cloned())).collect();
        Ok((group, listed))
    }
}

impl InstanceGroup for AwsGroup {
    fn init(connector: ConnectorConfig, plugin_config: &str) -> Result<(Self, ProviderInfo), ProviderError> {
        let mut config: Config = serde_json::from_str(plugin_config)
            .map_err(|e| ProviderError::InvalidConfig(format!("plugin_config: {e}")))?;
        // docker+machine: the driver's flags choose the region, the endpoint and the keys.
        let machine = match config.machine.take() {
            Some(machine) => {
                let options = MachineOptions::parse(&machine.options).map_err(ProviderError::InvalidConfig)?;
                config.region = Some(options.region.clone());
                config.endpoint = options.endpoint.clone().or(config.endpoint);
                Some((machine, options))
            }
            None if config.name.trim().is_empty() => {
                return Err(ProviderError::InvalidConfig("plugin_config.name (the Auto Scaling group) is empty".into()))
            }
            None => None,
        };
        let sources = Sources {
            configured: machine.as_ref().and_then(|(_, options)| options.credentials.clone()),
            profile: config.profile.clone(),
            config_file: config.config_file.clone(),
            credentials_file: config.credentials_file.clone(),
        };
        let region = match config.region.clone().or_else(|| env("AWS_REGION")).or_else(|| env("AWS_DEFAULT_REGION")) {
            Some(r) => r,
            None => sources.config_section().map_err(ProviderError::InvalidConfig)?.get("region").cloned().ok_or_else(
                || ProviderError::InvalidConfig("no region: set plugin_config.region (or grant AWS_REGION)".into()),
            )?,
        };
        let url = |service: &str| match &config.endpoint {
            Some(endpoint) => endpoint.trim_end_matches('/').to_string() + "/",
            None if region.starts_with("cn-") => format!("https://{service}.{region}.amazonaws.com.cn/"),
            None => format!("https://{service}.{region}.amazonaws.com/"),
        };
        if let Some(endpoint) = &config.endpoint {
            cloud_common::http::parse_url(endpoint)
                .map_err(|e| ProviderError::InvalidConfig(format!("plugin_config.endpoint: {e}")))?;
        }
        let mut group = AwsGroup {
            name: config.name.clone(),
            autoscaling: Service { name: "autoscaling", version: "2011-01-01", url: url("autoscaling") },
            ec2: Service { name: "ec2", version: "2016-11-15", url: url("ec2") },
            instance_connect: Service { name: "ec2-instance-connect", version: "", url: url("ec2-instance-connect") },
            client: Client::new(region.clone(), sources),
            connector,
            state: GroupState::new(format!("{region}/{}", config.name)),
            known: BTreeMap::new(),
            machines: None,
        };
        if let Some((machine, options)) = machine {
            let mut api = Ec2 { client: &mut group.client, service: &group.ec2 };
            let machines = Machines::init(machine, options, &mut api)?;
            let info = ProviderInfo {
                id: machines.id(&region),
                // Machines are limited by the runner's `limit` and max_instances, not by EC2.
                max_size: u32::MAX,
                version: env!("CARGO_PKG_VERSION").into(),
                capabilities: vec!["interruptions".into()],
            };
            group.state = GroupState::new(info.id.clone());
            group.machines = Some(machines);
            return Ok((group, info));
        }
        let described = group.describe_group()?;
        let info = ProviderInfo {
            id: format!("aws/{region}/{}", config.name),
            max_size: described.max_size,
            version: env!("CARGO_PKG_VERSION").into(),
            // The group replaces unhealthy instances and rebalances zones by itself: the
            // manager adopts those instances instead of removing them as unknown.
            capabilities: vec!["interruptions".into(), "self-launching".into()],
        };
        Ok((group, info))
    }

    fn update(&mut self) -> Result<Vec<Instance>, ProviderError> {
        if let Some(machines) = &self.machines {
            let (instances, known) = machines.update(&mut Ec2 { client: &mut self.client, service: &self.ec2 })?;
            self.known = known;
            self.state.retain_ids(DECREASED, |id| self.known.contains_key(id))?;
            return Ok(instances);
        }
        let (group, listed) = self.listed()?;
        let instances: Vec<Instance> = listed
            .iter()
            .filter_map(|(asg, ec2)| {
                xml::fleeting_state(&asg.lifecycle, ec2.as_ref().map(|e| e.state.as_str()))
                    .map(|state| Instance { id: asg.id.clone(), state })
            })
            .collect();
        let live =
            instances.iter().filter(|i| matches!(i.state, InstanceState::Creating | InstanceState::Running)).count();
        self.check_capacity(&group, u32::try_from(live).unwrap_or(u32::MAX))?;
        // Forget terminations that are over.
        self.state.retain_ids(DECREASED, |id| group.instances.iter().any(|i| i.id == id))?;
        Ok(instances)
    }

    fn increase(&mut self, n: u32) -> Result<u32, ProviderError> {
        if n == 0 {
            return Ok(0);
        }
        if let Some(machines) = &self.machines {
            let mut random = || {
                let mut bytes = [0u8; 4];
                // WASI's random source; a failure only makes the name less unique (the time
                // is in it too).
                let _ = getrandom::fill(&mut bytes);
                bytes
            };
            return machines.increase(&mut Ec2 { client: &mut self.client, service: &self.ec2 }, n, &mut random);
        }
        let now = cloud_common::now_unix();
        self.state.check_capacity(&format!("group {}", self.name))?;
        let group = self.describe_group()?;
        if group.desired >= group.max_size {
            return Err(ProviderError::Capacity(CapacityError {
                message: format!("group {} is at its MaxSize {}", self.name, group.max_size),
                retry_after_seconds: FULL_RETRY_SECONDS,
            }));
        }
        let target = group.desired.saturating_add(n).min(group.max_size);
        self.set_desired(target).map_err(|e| e.into_provider("SetDesiredCapacity"))?;
        self.state.set("increased-at", &now.to_string())?;
        runway_sdk::log::info(&format!("group {}: desired capacity {} -> {target}", self.name, group.desired));
        Ok(target - group.desired)
    }

    fn decrease(&mut self, ids: Vec<String>) -> Result<Vec<String>, ProviderError> {
        if let Some(machines) = &self.machines {
            let accepted = machines.decrease(&mut Ec2 { client: &mut self.client, service: &self.ec2 }, ids)?;
            self.remember_decreased(&accepted)?;
            return Ok(accepted);
        }
        let mut accepted = Vec::new();
        let mut first_error = None;
        for id in ids {
            let params = vec![
                ("InstanceId".to_string(), id.clone()),
                ("ShouldDecrementDesiredCapacity".to_string(), "true".to_string()),
            ];
            match self.client.call(&self.autoscaling, "TerminateInstanceInAutoScalingGroup", &params) {
                Ok(_) => accepted.push(id),
                // Already gone from the group: nothing left to delete.
                Err(CallError::Api(e))
                    if e.code == "ValidationError" && e.message.to_ascii_lowercase().contains("not found") =>
                {
                    accepted.push(id)
                }
                Err(e) => {
                    runway_sdk::log::warn(&format!("group {}: cannot terminate {id}: {e}", self.name));
                    first_error.get_or_insert(e.into_provider("TerminateInstanceInAutoScalingGroup"));
                }
            }
        }
        self.remember_decreased(&accepted)?;
        match first_error {
            Some(e) if accepted.is_empty() => Err(e),
            _ => Ok(accepted),
        }
    }

    fn connect_info(&mut self, id: &str) -> Result<ConnectInfo, ProviderError> {
        let instance = self
            .describe_instances(&[id.to_string()])?
            .into_iter()
            .find(|i| i.id == id && i.state != "terminated")
            .ok_or_else(|| ProviderError::NotFound(format!("instance {id}")))?;
        let mut connector = self.connector.clone();
        let mut expires_at = None;
        if !connector.use_static_credentials && connector.protocol == Protocol::Ssh {
            if connector.username.is_empty() {
                return Err(ProviderError::InvalidConfig(
                    "EC2 Instance Connect pushes a key for the login user: set connector_config username".into(),
                ));
            }
            let pair = instance_connect::key_pair(connector.key.as_deref()).map_err(ProviderError::InvalidConfig)?;
            let body = instance_connect::request(id, &connector.username, &pair.public);
            self.client
                .call_json(&self.instance_connect, instance_connect::SEND_SSH_PUBLIC_KEY, &body)
                .map_err(|e| e.into_provider("SendSSHPublicKey"))?;
            connector.key = Some(pair.private_pem);
            connector.password = None;
            expires_at = Some(cloud_common::now_unix() + instance_connect::KEY_LIFETIME_SECONDS);
        }
        Ok(ConnectInfo {
            id: id.to_string(),
            external_addr: instance.public_ip.clone(),
            internal_addr: instance.private_ip.clone(),
            connector,
            expires_at,
        })
    }

    fn heartbeat(&mut self, id: &str) -> Result<(), ProviderError> {
        match self.describe_instances(&[id.to_string()])?.into_iter().find(|i| i.id == id) {
            Some(i) if i.state == "running" || i.state == "pending" => Ok(()),
            Some(i) => Err(ProviderError::NotFound(format!("instance {id} is {}", i.state))),
            None => Err(ProviderError::NotFound(format!("instance {id}"))),
        }
    }

    fn interruptions(&mut self) -> Result<Vec<Interruption>, ProviderError> {
        let decreased = self.state.ids(DECREASED)?;
        if let Some(machines) = &self.machines {
            let described = machines.describe(&mut Ec2 { client: &mut self.client, service: &self.ec2 })?;
            return Ok(described
                .iter()
                .filter(|i| !decreased.contains(&i.id) && matches!(i.state.as_str(), "shutting-down" | "stopping"))
                .map(|i| Interruption { id: i.id.clone(), kind: Self::interruption_kind(Some(i)), deadline: None })
                .collect());
        }
        let (_, listed) = self.listed()?;
        Ok(listed
            .iter()
            .filter(|(asg, ec2)| {
                !decreased.contains(&asg.id)
                    && (asg.lifecycle.starts_with("Terminating")
                        || ec2.as_ref().is_some_and(|e| matches!(e.state.as_str(), "shutting-down" | "stopping")))
            })
            .map(|(asg, ec2)| Interruption {
                id: asg.id.clone(),
                kind: Self::interruption_kind(ec2.as_ref()),
                deadline: None,
            })
            .collect())
    }
}

runway_sdk::export_fleeting!(AwsGroup, name: "aws", description: "an AWS EC2 Auto Scaling group");
