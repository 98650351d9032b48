//! The `docker+machine` mode: individual EC2 instances, as docker-machine's `amazonec2` driver
//! creates them for gitlab-runner — no Auto Scaling group. The host hands the plugin the
//! machine name template (`runner-<short token>-<MachineName>`, `%s` still in it), the
//! manager's identity and the runner's `MachineOptions`.
//!
//! - `increase`: one RunInstances per machine (docker-machine's launch: the AMI, type, zone,
//!   subnet, security groups, root volume, IAM profile, key pair, spot market, user data), named
//!   from the template (`%s` = `<unix time>-<8 hex>`, as gitlab-runner names machines), tagged
//!   with the template and the manager (`runway-machine`, `runway-manager`) plus
//!   `amazonec2-tags`; the name is the client token, so a retried launch is one machine.
//! - `update`: DescribeInstances filtered by both tags: a restarted manager finds its machines
//!   (the host adopts them from its fleet state) and never another manager's.
//! - `decrease`: TerminateInstances.
//! - Security groups are named (`amazonec2-security-group`, default `docker-machine`) and
//!   looked up in the VPC; a missing one is created with the SSH port (and `open-port`s) open,
//!   unless `amazonec2-security-group-readonly`. The Docker Engine's TLS port is not opened:
//!   the host reaches the engine over SSH.
//!
//! Owns: the machine mode's requests. Must not touch: flag parsing (`machine_options`),
//! signing (`api`), the Auto Scaling mode (`lib.rs`).

use std::collections::BTreeMap;

use base64::Engine as _;
use runway_sdk::fleeting::*;

pub use cloud_common::machine::{machine_name, MachineConfig};

use crate::api::{CallError, Client, Service};
use crate::machine_options::MachineOptions;
use crate::xml::{self, Ec2Instance};

/// The tag naming the machine template (the runner's machine "group").
pub const GROUP_TAG: &str = "runway-machine";
/// The tag naming the manager that launched the machine.
pub const MANAGER_TAG: &str = "runway-manager";

/// EC2 error codes that mean "no capacity now", not "wrong request".
const CAPACITY_CODES: [&str; 6] = [
    "InsufficientInstanceCapacity",
    "InstanceLimitExceeded",
    "VcpuLimitExceeded",
    "MaxSpotInstanceCountExceeded",
    "SpotMaxPriceTooLow",
    "InsufficientCapacity",
];
/// After a launch refused for capacity: when to ask again.
const CAPACITY_RETRY_SECONDS: u32 = 60;

/// The machines of one runner's template, launched by one manager.
pub struct Machines {
    template: String,
    manager: String,
    options: MachineOptions,
    /// Security group ids, resolved at `init`.
    security_group_ids: Vec<String>,
    subnet_id: String,
    user_data: Option<String>,
}

/// The EC2 API as the machine mode calls it.
pub struct Ec2<'a> {
    pub client: &'a mut Client,
    pub service: &'a Service,
}

impl Ec2<'_> {
    fn call(&mut self, action: &str, params: &[(String, String)]) -> Result<String, ProviderError> {
        self.client.call(self.service, action, params).map_err(|e| e.into_provider(action))
    }
}

fn param(key: impl Into<String>, value: impl Into<String>) -> (String, String) {
    (key.into(), value.into())
}

/// Filter `n` of a Describe call.
fn filter(params: &mut Vec<(String, String)>, n: usize, name: &str, values: &[&str]) {
    params.push(param(format!("Filter.{n}.Name"), name));
    for (i, value) in values.iter().enumerate() {
        params.push(param(format!("Filter.{n}.Value.{}", i + 1), *value));
    }
}

fn first_text(body: &str, element: &str) -> Option<String> {
    let doc = roxmltree::Document::parse(body).ok()?;
    doc.descendants().find(|n| n.tag_name().name() == element).and_then(|n| n.text()).map(|t| t.trim().to_string())
}

impl Machines {
    /// Check the options, find the subnet and the security groups (creating missing groups
    /// unless read-only), read the user data.
    pub fn init(config: MachineConfig, options: MachineOptions, api: &mut Ec2) -> Result<Machines, ProviderError> {
        if config.name.trim().is_empty() || config.manager.trim().is_empty() {
            return Err(ProviderError::InvalidConfig("plugin_config.machine: name and manager are required".into()));
        }
        for flag in &options.ignored {
            runway_sdk::log::warn(&format!("MachineOptions {flag}: not used by Runway (ignored)"));
        }
        let user_data = match &options.userdata_file {
            Some(path) => {
                Some(std::fs::read(path).map(|bytes| base64::engine::general_purpose::STANDARD.encode(bytes)).map_err(
                    |e| {
                        ProviderError::InvalidConfig(format!(
                    "MachineOptions amazonec2-userdata={path}: {e} (is its directory granted to the plugin in `dirs`?)"
                ))
                    },
                )?)
            }
            None => None,
        };
        let mut machines = Machines {
            template: config.name,
            manager: config.manager,
            options,
            security_group_ids: Vec::new(),
            subnet_id: String::new(),
            user_data,
        };
        machines.subnet_id = machines.find_subnet(api)?;
        machines.security_group_ids = machines.find_security_groups(api)?;
        Ok(machines)
    }

    /// The provider's identity for the manager's logs and metrics.
    pub fn id(&self, region: &str) -> String {
        format!("aws/{region}/{}", self.template)
    }

    /// `amazonec2-subnet-id`, else the VPC's subnet in the machines' zone (as docker-machine
    /// picks it).
    fn find_subnet(&self, api: &mut Ec2) -> Result<String, ProviderError> {
        if let Some(subnet) = &self.options.subnet_id {
            return Ok(subnet.clone());
        }
        let Some(vpc) = self.options.vpc_id.clone() else {
            return Err(ProviderError::InvalidConfig(
                "MachineOptions: set amazonec2-subnet-id or amazonec2-vpc-id (Runway does not guess the default VPC)"
                    .into(),
            ));
        };
        let zone = self.options.availability_zone();
        let mut params = Vec::new();
        filter(&mut params, 1, "vpc-id", &[&vpc]);
        filter(&mut params, 2, "availability-zone", &[&zone]);
        let body = api.call("DescribeSubnets", &params)?;
        first_text(&body, "subnetId").ok_or_else(|| {
            ProviderError::InvalidConfig(format!("MachineOptions: VPC {vpc} has no subnet in zone {zone}"))
        })
    }

    /// The ids of the named security groups in the machines' VPC; a missing group is created
    /// (SSH and the `open-port`s from anywhere) unless the groups are read-only.
    fn find_security_groups(&self, api: &mut Ec2) -> Result<Vec<String>, ProviderError> {
        let vpc = match self.options.vpc_id.clone() {
            Some(vpc) => vpc,
            None => {
                let mut params = Vec::new();
                filter(&mut params, 1, "subnet-id", &[&self.subnet_id]);
                let body = api.call("DescribeSubnets", &params)?;
                first_text(&body, "vpcId").ok_or_else(|| {
                    ProviderError::InvalidConfig(format!("MachineOptions: subnet {} does not exist", self.subnet_id))
                })?
            }
        };
        let mut ids = Vec::new();
        for name in self.options.security_groups.clone() {
            let mut params = Vec::new();
            filter(&mut params, 1, "group-name", &[&name]);
            filter(&mut params, 2, "vpc-id", &[&vpc]);
            let body = api.call("DescribeSecurityGroups", &params)?;
            if let Some(id) = first_text(&body, "groupId") {
                ids.push(id);
                continue;
            }
            if self.options.security_group_readonly {
                return Err(ProviderError::InvalidConfig(format!(
                    "MachineOptions: security group {name:?} does not exist in {vpc} (amazonec2-security-group-readonly)"
                )));
            }
            ids.push(self.create_security_group(api, &name, &vpc)?);
        }
        Ok(ids)
    }

    fn create_security_group(&self, api: &mut Ec2, name: &str, vpc: &str) -> Result<String, ProviderError> {
        let params = vec![
            param("GroupName", name),
            param("GroupDescription", "Runway docker+machine machines: SSH from the runner manager"),
            param("VpcId", vpc),
        ];
        let body = api.call("CreateSecurityGroup", &params)?;
        let id = first_text(&body, "groupId")
            .ok_or_else(|| ProviderError::Other(format!("CreateSecurityGroup {name}: no groupId in the answer")))?;
        let mut ports = vec![self.options.ssh_port];
        ports.extend(self.options.open_ports.iter().copied());
        ports.dedup();
        let mut params = vec![param("GroupId", id.clone())];
        for (i, port) in ports.iter().enumerate() {
            let p = format!("IpPermissions.{}", i + 1);
            params.push(param(format!("{p}.IpProtocol"), "tcp"));
            params.push(param(format!("{p}.FromPort"), port.to_string()));
            params.push(param(format!("{p}.ToPort"), port.to_string()));
            params.push(param(format!("{p}.IpRanges.1.CidrIp"), "0.0.0.0/0"));
        }
        api.call("AuthorizeSecurityGroupIngress", &params)?;
        runway_sdk::log::info(&format!("created security group {name} ({id}) in {vpc} with tcp {ports:?} open"));
        Ok(id)
    }

    /// The RunInstances parameters of machine `name`.
    pub fn launch_params(&self, name: &str) -> Vec<(String, String)> {
        let o = &self.options;
        let mut params = vec![
            param("ImageId", &o.ami),
            param("MinCount", "1"),
            param("MaxCount", "1"),
            param("ClientToken", name),
            param("InstanceType", &o.instance_type),
            param("Placement.AvailabilityZone", o.availability_zone()),
            param("Monitoring.Enabled", o.monitoring.to_string()),
            param("EbsOptimized", o.ebs_optimized.to_string()),
            param("NetworkInterface.1.DeviceIndex", "0"),
            param("NetworkInterface.1.SubnetId", &self.subnet_id),
            param("NetworkInterface.1.AssociatePublicIpAddress", (!o.private_address_only).to_string()),
            param("BlockDeviceMapping.1.DeviceName", &o.device_name),
            param("BlockDeviceMapping.1.Ebs.VolumeSize", o.root_size.to_string()),
            param("BlockDeviceMapping.1.Ebs.VolumeType", &o.volume_type),
            param("BlockDeviceMapping.1.Ebs.DeleteOnTermination", "true"),
            param("TagSpecification.1.ResourceType", "instance"),
        ];
        for (i, id) in self.security_group_ids.iter().enumerate() {
            params.push(param(format!("NetworkInterface.1.SecurityGroupId.{}", i + 1), id));
        }
        let mut tags = vec![
            ("Name".to_string(), name.to_string()),
            (GROUP_TAG.to_string(), self.template.clone()),
            (MANAGER_TAG.to_string(), self.manager.clone()),
        ];
        tags.extend(o.tags.iter().cloned());
        for (i, (key, value)) in tags.iter().enumerate() {
            params.push(param(format!("TagSpecification.1.Tag.{}.Key", i + 1), key));
            params.push(param(format!("TagSpecification.1.Tag.{}.Value", i + 1), value));
        }
        if let Some(profile) = &o.iam_instance_profile {
            params.push(param("IamInstanceProfile.Name", profile));
        }
        if let Some(key) = &o.keypair_name {
            params.push(param("KeyName", key));
        }
        if let Some(data) = &self.user_data {
            params.push(param("UserData", data));
        }
        if o.spot {
            params.push(param("InstanceMarketOptions.MarketType", "spot"));
            params.push(param("InstanceMarketOptions.SpotOptions.MaxPrice", &o.spot_price));
            params.push(param("InstanceMarketOptions.SpotOptions.SpotInstanceType", "one-time"));
        }
        params
    }

    /// Every machine of this template and manager that EC2 still lists.
    pub fn describe(&self, api: &mut Ec2) -> Result<Vec<Ec2Instance>, ProviderError> {
        let mut params = Vec::new();
        filter(&mut params, 1, &format!("tag:{GROUP_TAG}"), &[&self.template]);
        filter(&mut params, 2, &format!("tag:{MANAGER_TAG}"), &[&self.manager]);
        let body = api.call("DescribeInstances", &params)?;
        xml::parse_instances(&body).map_err(|e| ProviderError::Other(format!("DescribeInstances: {e}")))
    }

    /// Fleeting's view of the machines (terminated ones are gone).
    pub fn update(&self, api: &mut Ec2) -> Result<(Vec<Instance>, BTreeMap<String, Ec2Instance>), ProviderError> {
        let described = self.describe(api)?;
        let instances = described
            .iter()
            .map(|i| Instance { id: i.id.clone(), state: machine_state(&i.state) })
            .filter(|i| i.state != InstanceState::Deleted)
            .collect();
        Ok((instances, described.into_iter().map(|i| (i.id.clone(), i)).collect()))
    }

    /// Launch `n` machines, one at a time; how many EC2 accepted.
    pub fn increase(&self, api: &mut Ec2, n: u32, random: &mut dyn FnMut() -> [u8; 4]) -> Result<u32, ProviderError> {
        let mut launched = 0;
        for _ in 0..n {
            let name = machine_name(&self.template, cloud_common::now_unix(), random());
            let params = self.launch_params(&name);
            match api.client.call(api.service, "RunInstances", &params) {
                Ok(body) => {
                    launched += 1;
                    let id = first_text(&body, "instanceId").unwrap_or_default();
                    runway_sdk::log::info(&format!("machine {name} launched ({id})"));
                }
                Err(e) => {
                    let error = match e {
                        CallError::Api(ref api) if CAPACITY_CODES.contains(&api.code.as_str()) => {
                            ProviderError::Capacity(CapacityError {
                                message: format!("RunInstances: {e}"),
                                retry_after_seconds: CAPACITY_RETRY_SECONDS,
                            })
                        }
                        e => e.into_provider("RunInstances"),
                    };
                    if launched > 0 {
                        runway_sdk::log::warn(&format!("launched {launched} of {n} machines: {error}"));
                        break;
                    }
                    return Err(error);
                }
            }
        }
        Ok(launched)
    }

    /// Terminate `ids`; those EC2 accepted (or no longer knows).
    pub fn decrease(&self, api: &mut Ec2, ids: Vec<String>) -> Result<Vec<String>, ProviderError> {
        let mut accepted = Vec::new();
        let mut first_error = None;
        for id in ids {
            match api.client.call(api.service, "TerminateInstances", &[param("InstanceId.1", id.clone())]) {
                Ok(_) => accepted.push(id),
                Err(e) if e.code() == Some("InvalidInstanceID.NotFound") => accepted.push(id),
                Err(e) => {
                    runway_sdk::log::warn(&format!("cannot terminate machine {id}: {e}"));
                    first_error.get_or_insert(e.into_provider("TerminateInstances"));
                }
            }
        }
        match first_error {
            Some(e) if accepted.is_empty() => Err(e),
            _ => Ok(accepted),
        }
    }
}

/// Fleeting's state of a machine from its EC2 state.
pub fn machine_state(ec2: &str) -> InstanceState {
    match ec2 {
        "pending" => InstanceState::Creating,
        "running" => InstanceState::Running,
        "terminated" => InstanceState::Deleted,
        // shutting-down, stopping, stopped: leaving service.
        _ => InstanceState::Deleting,
    }
}
