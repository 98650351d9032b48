//! docker-machine's `azure` driver flags, as gitlab-runner's `[runners.machine] MachineOptions`
//! lists them (`"azure-location=westeurope"`, a bare `"azure-no-public-ip"` for a true
//! boolean), read into what the `docker+machine` mode creates. Defaults are the driver's; a
//! flag Runway has no use for is named in [`MachineOptions::ignored`] (the plugin logs it), a
//! flag of another driver is an error.
//!
//! Owns: parsing the flags and the Azure environments' endpoints. Must not touch: requests
//! (`machines`), the scale set mode.

use cloud_common::machine::{boolean, required, split};

/// What the driver flags ask for.
#[derive(Debug, Clone)]
pub struct MachineOptions {
    /// `azure-subscription-id` (else `AZURE_SUBSCRIPTION_ID`, as the driver reads it).
    pub subscription_id: String,
    /// `azure-environment` (default `AzurePublicCloud`): which cloud's endpoints.
    pub environment: Environment,
    /// `azure-endpoint`: Runway's addition, an ARM endpoint instead of the environment's (a
    /// test server, Azure Stack).
    pub endpoint: Option<String>,
    /// `azure-resource-group` (default `docker-machine`), created when missing.
    pub resource_group: String,
    /// `azure-location` (default `westus`).
    pub location: String,
    /// `azure-size` (default `Standard_A2`).
    pub size: String,
    /// `azure-image`: `publisher:offer:sku:version` or an image resource ID; required (the
    /// driver's default, Ubuntu 16.04, has no Docker, and Runway installs none).
    pub image: String,
    /// `azure-vnet`, `[resourcegroup:]name` (default `docker-machine-vnet`).
    pub vnet: String,
    /// `azure-subnet` (default `docker-machine`).
    pub subnet: String,
    /// `azure-subnet-prefix` (default `192.168.0.0/16`): the subnet's range when it is created.
    pub subnet_prefix: String,
    /// `azure-availability-set` (default `docker-machine`), created when missing.
    pub availability_set: String,
    /// `azure-storage-type` (default `Standard_LRS`): the OS disk's storage type.
    pub storage_type: String,
    /// `azure-open-port`, repeatable: `port[/tcp|/udp|/*]` opened besides SSH.
    pub open_ports: Vec<String>,
    /// `azure-no-public-ip`: no public address.
    pub no_public_ip: bool,
    /// `azure-static-public-ip` (the public address is static either way: Standard SKU).
    pub static_public_ip: bool,
    /// `azure-custom-data`: a file whose content is the machines' custom data (cloud-init).
    pub custom_data_file: Option<String>,
    /// `azure-ssh-user` (default `docker-user`): the admin user given the key.
    pub ssh_user: String,
    /// `azure-ssh-port`: Runway's addition (the driver's port is 22), opened in the machine's
    /// network security group.
    pub ssh_port: u16,
    /// `azure-client-id` / `azure-client-secret` (else `AZURE_CLIENT_ID` /
    /// `AZURE_CLIENT_SECRET`): a service principal.
    pub client: Option<(String, String)>,
    /// Flags Runway accepts and does not use, by name.
    pub ignored: Vec<String>,
}

/// An Azure cloud as the driver names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Environment {
    Public,
    UsGovernment,
    China,
    German,
}

impl Environment {
    fn parse(name: &str) -> Result<Environment, String> {
        match name {
            "AzurePublicCloud" => Ok(Environment::Public),
            "AzureUSGovernmentCloud" => Ok(Environment::UsGovernment),
            "AzureChinaCloud" => Ok(Environment::China),
            "AzureGermanCloud" => Ok(Environment::German),
            other => Err(format!(
                "MachineOptions azure-environment={other}: not an Azure environment (AzurePublicCloud, \
                 AzureUSGovernmentCloud, AzureChinaCloud, AzureGermanCloud)"
            )),
        }
    }

    /// Azure Resource Manager's endpoint.
    pub fn resource_manager(self) -> &'static str {
        match self {
            Environment::Public => "https://management.azure.com",
            Environment::UsGovernment => "https://management.usgovcloudapi.net",
            Environment::China => "https://management.chinacloudapi.cn",
            Environment::German => "https://management.microsoftazure.de",
        }
    }

    /// Microsoft Entra ID's authority.
    pub fn authority(self) -> &'static str {
        match self {
            Environment::Public => "https://login.microsoftonline.com",
            Environment::UsGovernment => "https://login.microsoftonline.us",
            Environment::China => "https://login.chinacloudapi.cn",
            Environment::German => "https://login.microsoftonline.de",
        }
    }
}

/// Flags the host reads (the connector's address choice): accepted here without a word.
const READ_BY_THE_HOST: [&str; 1] = ["azure-use-private-ip"];

/// Flags accepted and not used: Runway reaches the Docker Engine over SSH (no TLS engine
/// port, no engine installation: the image brings Docker) and has no Swarm; a fixed private
/// address or DNS label would be one machine's only.
const NOT_USED_PREFIXES: [&str; 2] = ["engine-", "swarm"];
const NOT_USED: [&str; 3] = ["azure-docker-port", "azure-private-ip-address", "azure-dns"];

impl MachineOptions {
    /// Read `options` (each `flag=value`, or a bare boolean flag; a leading `--` is allowed);
    /// `env` gives the variables the driver falls back to (the granted environment).
    pub fn parse(options: &[String], env: &dyn Fn(&str) -> Option<String>) -> Result<MachineOptions, String> {
        let mut out = MachineOptions {
            subscription_id: String::new(),
            environment: Environment::Public,
            endpoint: None,
            resource_group: "docker-machine".into(),
            location: "westus".into(),
            size: "Standard_A2".into(),
            image: String::new(),
            vnet: "docker-machine-vnet".into(),
            subnet: "docker-machine".into(),
            subnet_prefix: "192.168.0.0/16".into(),
            availability_set: "docker-machine".into(),
            storage_type: "Standard_LRS".into(),
            open_ports: Vec::new(),
            no_public_ip: false,
            static_public_ip: false,
            custom_data_file: None,
            ssh_user: "docker-user".into(),
            ssh_port: 22,
            client: None,
            ignored: Vec::new(),
        };
        let (mut client_id, mut client_secret, mut subscription) = (None, None, None);
        for option in options {
            let (name, value) = split(option);
            let text = |v: Option<&str>| required(name, v).map(str::to_string);
            match name {
                "" => continue,
                "azure-subscription-id" => subscription = Some(text(value)?),
                "azure-environment" => out.environment = Environment::parse(required(name, value)?)?,
                "azure-endpoint" => out.endpoint = Some(text(value)?),
                "azure-resource-group" => out.resource_group = text(value)?,
                "azure-location" => out.location = text(value)?,
                "azure-size" => out.size = text(value)?,
                "azure-image" => out.image = text(value)?,
                "azure-vnet" => out.vnet = text(value)?,
                "azure-subnet" => out.subnet = text(value)?,
                "azure-subnet-prefix" => out.subnet_prefix = text(value)?,
                "azure-availability-set" => out.availability_set = text(value)?,
                "azure-storage-type" => out.storage_type = text(value)?,
                "azure-open-port" => out.open_ports.push(port_rule(&text(value)?)?),
                "azure-no-public-ip" => out.no_public_ip = boolean(name, value)?,
                "azure-static-public-ip" => out.static_public_ip = boolean(name, value)?,
                "azure-custom-data" => out.custom_data_file = Some(text(value)?),
                "azure-ssh-user" => out.ssh_user = text(value)?,
                "azure-ssh-port" => {
                    let port = required(name, value)?;
                    out.ssh_port = port.parse().map_err(|_| format!("MachineOptions {name}={port}: not a port"))?
                }
                "azure-client-id" => client_id = Some(text(value)?),
                "azure-client-secret" => client_secret = Some(text(value)?),
                n if READ_BY_THE_HOST.contains(&n) => {
                    boolean(n, value)?;
                }
                n if NOT_USED.contains(&n) || NOT_USED_PREFIXES.iter().any(|p| n.starts_with(p)) => {
                    out.ignored.push(n.to_string())
                }
                n if n.starts_with("azure-") => out.ignored.push(n.to_string()),
                n => {
                    return Err(format!(
                        "MachineOptions {n}: not a flag of the azure driver (MachineDriver = \"azure\")"
                    ))
                }
            }
        }
        out.subscription_id = subscription.or_else(|| env("AZURE_SUBSCRIPTION_ID")).unwrap_or_default();
        if out.subscription_id.is_empty() {
            return Err("MachineOptions azure-subscription-id: required (or grant AZURE_SUBSCRIPTION_ID)".into());
        }
        if out.image.is_empty() {
            return Err(
                "MachineOptions azure-image: required (publisher:offer:sku:version or an image ID of an image \
                        with Docker and sshd; Runway installs no Docker Engine)"
                    .into(),
            );
        }
        image_reference(&out.image)?;
        out.client = match (
            client_id.or_else(|| env("AZURE_CLIENT_ID")),
            client_secret.or_else(|| env("AZURE_CLIENT_SECRET")),
        ) {
            (Some(id), Some(secret)) => Some((id, secret)),
            _ => None,
        };
        Ok(out)
    }

    /// The ARM endpoint the machines are managed through.
    pub fn resource_manager(&self) -> String {
        self.endpoint
            .clone()
            .unwrap_or_else(|| self.environment.resource_manager().to_string())
            .trim_end_matches('/')
            .to_string()
    }

    /// The virtual network's resource group and name (`[resourcegroup:]name`).
    pub fn vnet_group_and_name(&self) -> (&str, &str) {
        match self.vnet.split_once(':') {
            Some((group, name)) => (group, name),
            None => (&self.resource_group, &self.vnet),
        }
    }
}

/// `publisher:offer:sku:version` as a `storageProfile.imageReference`, or an image resource ID.
pub fn image_reference(image: &str) -> Result<serde_json::Value, String> {
    if image.starts_with('/') {
        return Ok(serde_json::json!({ "id": image }));
    }
    match image.split(':').collect::<Vec<_>>().as_slice() {
        [publisher, offer, sku, version] if [publisher, offer, sku, version].iter().all(|p| !p.is_empty()) => {
            Ok(serde_json::json!({"publisher": publisher, "offer": offer, "sku": sku, "version": version}))
        }
        _ => Err(format!(
            "MachineOptions azure-image={image}: not publisher:offer:sku:version (e.g. canonical:ubuntu-24_04-lts:server:latest) \
             or an image resource ID"
        )),
    }
}

/// `port[/protocol]` (tcp, udp or `*`; default tcp), checked as the driver checks it.
fn port_rule(text: &str) -> Result<String, String> {
    let (port, protocol) = text.split_once('/').unwrap_or((text, "tcp"));
    let ok_port = port == "*" || port.split('-').all(|p| p.parse::<u16>().is_ok());
    if !ok_port || !matches!(protocol.to_ascii_lowercase().as_str(), "tcp" | "udp" | "*") {
        return Err(format!("MachineOptions azure-open-port={text}: not port[/tcp|/udp|/*]"));
    }
    Ok(format!("{port}/{}", protocol.to_ascii_lowercase()))
}
