//! docker-machine's `google` driver flags, as gitlab-runner's `[runners.machine]
//! MachineOptions` lists them (`"google-zone=europe-west1-b"`, a bare `"google-preemptible"`
//! for a true boolean), read into what the `docker+machine` mode creates. Defaults are the
//! driver's; a flag Runway has no use for is named in [`MachineOptions::ignored`] (the plugin
//! logs it), a flag of another driver is an error.
//!
//! Owns: parsing the flags. Must not touch: requests (`machines`), the managed group mode.

use cloud_common::machine::{boolean, number, required, split};

/// What the driver flags ask for.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineOptions {
    /// `google-project`: required.
    pub project: String,
    /// `google-zone` (default `us-central1-a`).
    pub zone: String,
    /// `google-machine-type` (default `n1-standard-1`).
    pub machine_type: String,
    /// `google-machine-image`: `<project>/global/images/<image>` (or `.../images/family/<family>`),
    /// its `https://www.googleapis.com/compute/v1/projects/` prefix dropped. Required
    /// (docker-machine's default is an Ubuntu 16.04 image long gone).
    pub machine_image: String,
    /// `google-disk-size` in GB (default 10).
    pub disk_size: u32,
    /// `google-disk-type` (default `pd-standard`).
    pub disk_type: String,
    /// `google-network` (default `default`): a name, or a URL with `/networks/` in it.
    pub network: String,
    /// `google-subnetwork`: a name in the zone's region, or a URL with `/subnetworks/`.
    pub subnetwork: Option<String>,
    /// `google-tags`: network tags besides `docker-machine`.
    pub tags: Vec<String>,
    /// `google-preemptible`.
    pub preemptible: bool,
    /// `google-use-internal-ip-only`: no external address.
    pub internal_ip_only: bool,
    /// `google-address`: the external address (an IP).
    pub address: Option<String>,
    /// `google-service-account` (default `default`).
    pub service_account: String,
    /// `google-scopes` (default docker-machine's three), comma-separated.
    pub scopes: Vec<String>,
    /// `google-endpoint` (Runway's, not docker-machine's): the Compute Engine API endpoint
    /// (private endpoints, test servers).
    pub endpoint: Option<String>,
    /// Flags Runway accepts and does not use, by name.
    pub ignored: Vec<String>,
}

/// docker-machine's default scopes for the machines' service account.
const DEFAULT_SCOPES: &str = "https://www.googleapis.com/auth/devstorage.read_only,\
https://www.googleapis.com/auth/logging.write,https://www.googleapis.com/auth/monitoring.write";

impl Default for MachineOptions {
    fn default() -> Self {
        MachineOptions {
            project: String::new(),
            zone: "us-central1-a".into(),
            machine_type: "n1-standard-1".into(),
            machine_image: String::new(),
            disk_size: 10,
            disk_type: "pd-standard".into(),
            network: "default".into(),
            subnetwork: None,
            tags: Vec::new(),
            preemptible: false,
            internal_ip_only: false,
            address: None,
            service_account: "default".into(),
            scopes: DEFAULT_SCOPES.split(',').map(str::to_string).collect(),
            endpoint: None,
            ignored: Vec::new(),
        }
    }
}

/// Flags the host reads (the connector's user, port and address choice): accepted without a
/// word. `google-ssh-port` is Runway's (docker-machine's driver always uses 22).
const READ_BY_THE_HOST: [&str; 3] = ["google-username", "google-use-internal-ip", "google-ssh-port"];

/// Flags accepted and not used: Runway reaches the Docker Engine over SSH (no TLS engine
/// port, so no firewall rule, no engine installation: the image brings Docker) and has no
/// Swarm.
const NOT_USED_PREFIXES: [&str; 2] = ["engine-", "swarm"];
const NOT_USED: [&str; 1] = ["google-open-port"];

/// The prefix docker-machine drops from `google-machine-image`.
const IMAGE_URL_PREFIXES: [&str; 2] =
    ["https://www.googleapis.com/compute/v1/projects/", "https://compute.googleapis.com/compute/v1/projects/"];

impl MachineOptions {
    /// Read `options` (each `flag=value`, or a bare boolean flag; a leading `--` is allowed).
    pub fn parse(options: &[String]) -> Result<MachineOptions, String> {
        let mut out = MachineOptions::default();
        for option in options {
            let (name, value) = split(option);
            let text = |v: Option<&str>| required(name, v).map(str::to_string);
            match name {
                "" => continue,
                "google-project" => out.project = text(value)?,
                "google-zone" => out.zone = text(value)?,
                "google-machine-type" => out.machine_type = text(value)?,
                "google-machine-image" => {
                    let image = text(value)?;
                    out.machine_image = IMAGE_URL_PREFIXES
                        .iter()
                        .find_map(|p| image.strip_prefix(p))
                        .unwrap_or(&image)
                        .trim_start_matches("projects/")
                        .to_string();
                }
                "google-disk-size" => out.disk_size = number(name, value)?,
                "google-disk-type" => out.disk_type = text(value)?,
                "google-network" => out.network = text(value)?,
                "google-subnetwork" => out.subnetwork = Some(text(value)?).filter(|s| !s.is_empty()),
                "google-tags" => {
                    out.tags = text(value)?.split(',').map(|t| t.trim().to_string()).filter(|t| !t.is_empty()).collect()
                }
                "google-preemptible" => out.preemptible = boolean(name, value)?,
                "google-use-internal-ip-only" => out.internal_ip_only = boolean(name, value)?,
                "google-address" => {
                    let address = text(value)?;
                    if address.parse::<std::net::IpAddr>().is_err() {
                        return Err(format!(
                            "MachineOptions google-address={address}: give the address itself (Runway does not \
                             resolve address names), or leave it out (each machine gets its own)"
                        ));
                    }
                    out.address = Some(address);
                }
                "google-service-account" => out.service_account = text(value)?,
                "google-scopes" => {
                    out.scopes =
                        text(value)?.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
                }
                "google-endpoint" => out.endpoint = Some(text(value)?),
                "google-use-existing" if boolean(name, value)? => {
                    return Err("MachineOptions google-use-existing: Runway creates every machine it uses \
                                (an existing VM is a static fleet host)"
                        .into())
                }
                "google-use-existing" => {}
                n if READ_BY_THE_HOST.contains(&n) => {}
                n if NOT_USED.contains(&n) || NOT_USED_PREFIXES.iter().any(|p| n.starts_with(p)) => {
                    out.ignored.push(n.to_string())
                }
                n if n.starts_with("google-") => out.ignored.push(n.to_string()),
                n => {
                    return Err(format!(
                        "MachineOptions {n}: not a flag of the google driver (MachineDriver = \"google\")"
                    ))
                }
            }
        }
        if out.project.is_empty() {
            return Err("MachineOptions google-project: required (the project the machines are created in)".into());
        }
        if out.machine_image.is_empty() {
            return Err("MachineOptions google-machine-image: required (the image the machines boot, with Docker \
                        and sshd, e.g. my-project/global/images/family/docker-host)"
                .into());
        }
        if out.zone.len() < 3 {
            return Err(format!("MachineOptions google-zone={}: not a zone", out.zone));
        }
        out.ignored.dedup();
        Ok(out)
    }

    /// The zone's region (`europe-west1-b` → `europe-west1`), as docker-machine derives it.
    pub fn region(&self) -> &str {
        self.zone.rsplit_once('-').map_or(self.zone.as_str(), |(region, _)| region)
    }

    /// The network as the API takes it.
    pub fn network_url(&self) -> String {
        if self.network.contains("/networks/") {
            self.network.clone()
        } else {
            format!("projects/{}/global/networks/{}", self.project, self.network)
        }
    }

    /// The subnetwork as the API takes it, if one is named.
    pub fn subnetwork_url(&self) -> Option<String> {
        self.subnetwork.as_ref().map(|s| {
            if s.contains("/subnetworks/") {
                s.clone()
            } else {
                format!("projects/{}/regions/{}/subnetworks/{s}", self.project, self.region())
            }
        })
    }

    /// The boot image as the API takes it.
    pub fn image_url(&self) -> String {
        format!("projects/{}", self.machine_image)
    }
}
