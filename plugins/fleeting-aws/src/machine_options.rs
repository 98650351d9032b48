//! docker-machine's `amazonec2` driver flags, as gitlab-runner's `[runners.machine]
//! MachineOptions` lists them (`"amazonec2-region=eu-central-1"`, a bare `"amazonec2-monitoring"`
//! for a true boolean), read into what the `docker+machine` mode launches. Defaults are the
//! driver's; a flag Runway has no use for is named in [`MachineOptions::ignored`] (the plugin
//! logs it), a flag of another driver is an error.
//!
//! Owns: parsing the flags. Must not touch: requests (`machines`), the Auto Scaling mode.

use cloud_common::machine::{boolean, number, required};

use crate::credentials::Credentials;

/// What the driver flags ask for.
#[derive(Debug, Clone)]
pub struct MachineOptions {
    /// `amazonec2-region` (default `us-east-1`).
    pub region: String,
    /// `amazonec2-zone`: the zone's letter (default `a`); the availability zone is
    /// `region` + `zone`.
    pub zone: String,
    /// `amazonec2-ami`: required (docker-machine's per-region defaults are Ubuntu 16.04 images
    /// long gone).
    pub ami: String,
    /// `amazonec2-instance-type` (default `t2.micro`).
    pub instance_type: String,
    /// `amazonec2-vpc-id`.
    pub vpc_id: Option<String>,
    /// `amazonec2-subnet-id`.
    pub subnet_id: Option<String>,
    /// `amazonec2-security-group`, repeatable (default `docker-machine`): group names in the VPC.
    pub security_groups: Vec<String>,
    /// `amazonec2-security-group-readonly`: never create or change the groups.
    pub security_group_readonly: bool,
    /// `amazonec2-open-port`, repeatable: TCP ports opened besides SSH when a group is created.
    pub open_ports: Vec<u16>,
    /// `amazonec2-tags`: `key1,value1,key2,value2`.
    pub tags: Vec<(String, String)>,
    /// `amazonec2-device-name` (default `/dev/sda1`).
    pub device_name: String,
    /// `amazonec2-root-size` in GB (default 16).
    pub root_size: u32,
    /// `amazonec2-volume-type` (default `gp2`).
    pub volume_type: String,
    /// `amazonec2-iam-instance-profile`.
    pub iam_instance_profile: Option<String>,
    /// `amazonec2-request-spot-instance`.
    pub spot: bool,
    /// `amazonec2-spot-price` (default `0.50`), the spot maximum price.
    pub spot_price: String,
    /// `amazonec2-private-address-only`: no public address.
    pub private_address_only: bool,
    /// `amazonec2-monitoring`: detailed monitoring.
    pub monitoring: bool,
    /// `amazonec2-use-ebs-optimized-instance`.
    pub ebs_optimized: bool,
    /// `amazonec2-keypair-name`: an existing key pair (its private key is `amazonec2-ssh-keypath`,
    /// which the host reads as the connector's key).
    pub keypair_name: Option<String>,
    /// `amazonec2-userdata`: a file whose content is the instances' user data.
    pub userdata_file: Option<String>,
    /// `amazonec2-endpoint`: one endpoint for the EC2 API.
    pub endpoint: Option<String>,
    /// `amazonec2-ssh-port` (default 22): opened in a group this plugin creates.
    pub ssh_port: u16,
    /// `amazonec2-access-key` / `-secret-key` / `-session-token`.
    pub credentials: Option<Credentials>,
    /// Flags Runway accepts and does not use, by name.
    pub ignored: Vec<String>,
}

impl Default for MachineOptions {
    fn default() -> Self {
        MachineOptions {
            region: "us-east-1".into(),
            zone: "a".into(),
            ami: String::new(),
            instance_type: "t2.micro".into(),
            vpc_id: None,
            subnet_id: None,
            security_groups: Vec::new(),
            security_group_readonly: false,
            open_ports: Vec::new(),
            tags: Vec::new(),
            device_name: "/dev/sda1".into(),
            root_size: 16,
            volume_type: "gp2".into(),
            iam_instance_profile: None,
            spot: false,
            spot_price: "0.50".into(),
            private_address_only: false,
            monitoring: false,
            ebs_optimized: false,
            keypair_name: None,
            userdata_file: None,
            endpoint: None,
            ssh_port: 22,
            credentials: None,
            ignored: Vec::new(),
        }
    }
}

/// The security group docker-machine uses when none is named.
pub const DEFAULT_SECURITY_GROUP: &str = "docker-machine";

/// Flags the host reads (the connector's user, port, key and address choice): accepted here
/// without a word.
const READ_BY_THE_HOST: [&str; 3] = ["amazonec2-ssh-user", "amazonec2-ssh-keypath", "amazonec2-use-private-address"];

/// Flags accepted and not used: Runway retries by itself, reaches the Docker Engine over SSH
/// (no TLS engine port, no engine installation: the AMI brings Docker) and has no Swarm.
const NOT_USED_PREFIXES: [&str; 2] = ["engine-", "swarm"];
const NOT_USED: [&str; 3] = ["amazonec2-retries", "amazonec2-insecure-transport", "amazonec2-block-duration-minutes"];

impl MachineOptions {
    /// Read `options` (each `flag=value`, or a bare boolean flag; a leading `--` is allowed).
    pub fn parse(options: &[String]) -> Result<MachineOptions, String> {
        let mut out = MachineOptions::default();
        let (mut key, mut secret, mut token) = (None, None, None);
        for option in options {
            let (name, value) = cloud_common::machine::split(option);
            let text = |v: Option<&str>| required(name, v).map(str::to_string);
            match name {
                "" => continue,
                "amazonec2-region" => out.region = text(value)?,
                "amazonec2-zone" => out.zone = text(value)?,
                "amazonec2-ami" => out.ami = text(value)?,
                "amazonec2-instance-type" => out.instance_type = text(value)?,
                "amazonec2-vpc-id" => out.vpc_id = Some(text(value)?),
                "amazonec2-subnet-id" => out.subnet_id = Some(text(value)?),
                "amazonec2-security-group" => out.security_groups.push(text(value)?),
                "amazonec2-security-group-readonly" => out.security_group_readonly = boolean(name, value)?,
                "amazonec2-open-port" => out.open_ports.push(number(name, value)?),
                "amazonec2-tags" => out.tags = tags(&text(value)?)?,
                "amazonec2-device-name" => out.device_name = text(value)?,
                "amazonec2-root-size" => out.root_size = number(name, value)?,
                "amazonec2-volume-type" => out.volume_type = text(value)?,
                "amazonec2-iam-instance-profile" => out.iam_instance_profile = Some(text(value)?),
                "amazonec2-request-spot-instance" => out.spot = boolean(name, value)?,
                "amazonec2-spot-price" => out.spot_price = text(value)?,
                "amazonec2-private-address-only" => out.private_address_only = boolean(name, value)?,
                "amazonec2-monitoring" => out.monitoring = boolean(name, value)?,
                "amazonec2-use-ebs-optimized-instance" => out.ebs_optimized = boolean(name, value)?,
                "amazonec2-keypair-name" => out.keypair_name = Some(text(value)?),
                "amazonec2-userdata" => out.userdata_file = Some(text(value)?),
                "amazonec2-endpoint" => out.endpoint = Some(text(value)?),
                "amazonec2-ssh-port" => out.ssh_port = number(name, value)?,
                "amazonec2-access-key" => key = Some(text(value)?),
                "amazonec2-secret-key" => secret = Some(text(value)?),
                "amazonec2-session-token" => token = Some(text(value)?),
                n if READ_BY_THE_HOST.contains(&n) => {}
                n if NOT_USED.contains(&n) || NOT_USED_PREFIXES.iter().any(|p| n.starts_with(p)) => {
                    out.ignored.push(n.to_string())
                }
                n if n.starts_with("amazonec2-") => out.ignored.push(n.to_string()),
                n => {
                    return Err(format!(
                        "MachineOptions {n}: not a flag of the amazonec2 driver (MachineDriver = \"amazonec2\")"
                    ))
                }
            }
        }
        if out.ami.is_empty() {
            return Err(
                "MachineOptions amazonec2-ami: required (the image the machines boot, with Docker and sshd)".into()
            );
        }
        if out.security_groups.is_empty() {
            out.security_groups.push(DEFAULT_SECURITY_GROUP.into());
        }
        out.credentials = match (key, secret) {
            (Some(access_key_id), Some(secret_access_key)) => Some(Credentials {
                access_key_id,
                secret_access_key,
                session_token: token,
                expires_at: None,
                source: "MachineOptions amazonec2-access-key".into(),
            }),
            (None, None) => None,
            _ => return Err("MachineOptions amazonec2-access-key and amazonec2-secret-key go together".into()),
        };
        Ok(out)
    }

    /// The availability zone the machines are placed in.
    pub fn availability_zone(&self) -> String {
        format!("{}{}", self.region, self.zone)
    }
}

/// `key1,value1,key2,value2` as pairs (docker-machine drops an odd last element with a
/// warning; here it is an error, as the tag would be silently lost).
fn tags(text: &str) -> Result<Vec<(String, String)>, String> {
    let parts: Vec<&str> = text.split(',').collect();
    if !parts.len().is_multiple_of(2) {
        return Err(format!("MachineOptions amazonec2-tags={text}: not key,value pairs"));
    }
    Ok(parts.chunks(2).map(|kv| (kv[0].trim().to_string(), kv[1].trim().to_string())).collect())
}
