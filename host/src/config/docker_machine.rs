//! `executor = "docker+machine"`: gitlab-runner's Docker Machine executor, read as the docker
//! executor on a fleet whose provider follows `[runners.machine] MachineDriver` — the fleet
//! section gitlab-runner never had is derived here from `MachineDriver`, `MachineName` and the
//! driver's connection flags in `MachineOptions`, so the file runs as it is. The policy keys
//! (`IdleCount`, `MaxBuilds`, the periods, ...) stay in `[runners.machine]`, which the engine
//! reads with docker+machine's semantics; the launch flags go to the provider plugin
//! unparsed (it owns them, and warns about the ones it does not use).
//!
//! Owns: the derived `[runners.autoscaler]`, the grant a docker+machine provider is given when
//! `[plugins.NAME]` is absent. Must not touch: the engine's mapping of the policy keys
//! (`autoscaler::from_config`), the providers' reading of their flags.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::autoscaler::{AutoscalerConfig, DockerMachine, MachineConfig};
use super::fidelity::{ConfigWarning, WarningKind};
use super::grant::PluginGrant;
use super::{ConfigError, Invalid, RunnerConfig};

/// docker-machine drivers Runway drives, with the built-in provider that launches their
/// machines.
pub const DRIVERS: [(&str, &str); 3] = [("amazonec2", "aws"), ("google", "googlecompute"), ("azure", "azure")];

/// docker-machine's `azure-environment` names, with each cloud's Resource Manager and
/// Microsoft Entra ID hosts.
const AZURE_ENVIRONMENTS: [(&str, &str, &str); 4] = [
    ("AzurePublicCloud", "management.azure.com:443", "login.microsoftonline.com:443"),
    ("AzureUSGovernmentCloud", "management.usgovcloudapi.net:443", "login.microsoftonline.us:443"),
    ("AzureChinaCloud", "management.chinacloudapi.cn:443", "login.chinacloudapi.cn:443"),
    ("AzureGermanCloud", "management.microsoftazure.de:443", "login.microsoftonline.de:443"),
];

/// Reading the driver flags (the data is [`DockerMachine`]'s, in `super::autoscaler`, which
/// the derived fleet carries).
impl DockerMachine {
    /// The value of flag `name` (`name=value`; a bare `name` is `"true"`), the last one given.
    pub fn option(&self, name: &str) -> Option<&str> {
        self.options.iter().rev().find_map(|o| {
            let o = o.trim().trim_start_matches("--");
            match o.split_once('=') {
                Some((n, v)) if n.trim() == name => Some(v.trim()),
                None if o == name => Some("true"),
                _ => None,
            }
        })
    }

    fn flag(&self, name: &str) -> bool {
        self.option(name).is_some_and(|v| !matches!(v.to_ascii_lowercase().as_str(), "false" | "0"))
    }

    /// The provider plugin for the driver.
    pub fn provider(&self) -> Option<&'static str> {
        DRIVERS.iter().find(|(driver, _)| *driver == self.driver).map(|(_, provider)| *provider)
    }

    /// The grant the provider gets when config.toml has no `[plugins.NAME]` for it: the
    /// driver's API endpoints (`amazonec2-endpoint`, else EC2's and EC2 Instance Connect's in
    /// `amazonec2-region`; `google-endpoint`, else Compute Engine's; `azure-environment`'s
    /// Resource Manager, or Runway's `azure-endpoint`, its Entra ID and the instance metadata
    /// service for a managed identity) and the credentials docker-machine's driver reads (for
    /// `google`, see [`google_grant`]).
    pub fn implied_grant(&self) -> Result<PluginGrant, Invalid> {
        let mut grant = PluginGrant::default();
        match self.driver.as_str() {
            "amazonec2" => {
                grant.allow_hosts = match self.option("amazonec2-endpoint") {
                    Some(endpoint) => vec![host_of("amazonec2-endpoint", endpoint)?],
                    None => {
                        let region = self.option("amazonec2-region").unwrap_or("us-east-1");
                        vec![
                            format!("ec2.{region}.amazonaws.com:443"),
                            format!("ec2-instance-connect.{region}.amazonaws.com:443"),
                        ]
                    }
                };
                grant.env = [
                    "AWS_ACCESS_KEY_ID",
                    "AWS_SECRET_ACCESS_KEY",
                    "AWS_SESSION_TOKEN",
                    "AWS_REGION",
                    "AWS_DEFAULT_REGION",
                ]
                .map(String::from)
                .to_vec();
            }
            "google" => {
                let credentials = std::env::var("GOOGLE_APPLICATION_CREDENTIALS").ok().filter(|v| !v.is_empty());
                grant = google_grant(self, credentials.as_deref())?;
            }
            "azure" => {
                let name = self.option("azure-environment").unwrap_or("AzurePublicCloud");
                let Some((_, arm, login)) = AZURE_ENVIRONMENTS.iter().find(|(n, _, _)| *n == name) else {
                    let names: Vec<&str> = AZURE_ENVIRONMENTS.iter().map(|(n, _, _)| *n).collect();
                    return Err(Invalid(format!(
                        "MachineOptions azure-environment={name}: not an Azure environment ({})",
                        names.join(", ")
                    )));
                };
                let arm = match self.option("azure-endpoint") {
                    Some(endpoint) => host_of("azure-endpoint", endpoint)?,
                    None => arm.to_string(),
                };
                let mut hosts = vec![arm, login.to_string(), "169.254.169.254:80".to_string()];
                hosts.dedup();
                grant.allow_hosts = hosts;
                grant.env = [
                    "AZURE_TENANT_ID",
                    "AZURE_CLIENT_ID",
                    "AZURE_CLIENT_SECRET",
                    "AZURE_AUTHORITY_HOST",
                    "AZURE_SUBSCRIPTION_ID",
                ]
                .map(String::from)
                .to_vec();
            }
            other => return Err(Invalid(format!("MachineDriver {other:?} has no provider"))),
        }
        Ok(grant)
    }
}

impl super::Loaded {
    /// The plugins' grants: the `[plugins.NAME]` sections, and for a docker+machine provider
    /// without one the grant its driver flags imply ([`implied_grants`]).
    pub fn grants(&self) -> BTreeMap<String, PluginGrant> {
        let fleets = self.config.runners.iter().filter_map(|r| r.autoscaler.as_ref());
        let mut grants = self.config.plugins.clone();
        grants.extend(implied_grants(fleets, &self.config.plugins));
        grants
    }
}

/// `host:port` of an endpoint URL given as flag `flag` (the port defaulted from the scheme).
fn host_of(flag: &str, endpoint: &str) -> Result<String, Invalid> {
    let url = reqwest::Url::parse(endpoint).map_err(|e| Invalid(format!("MachineOptions {flag}={endpoint}: {e}")))?;
    match (url.host_str(), url.port_or_known_default()) {
        (Some(host), Some(port)) => Ok(format!("{host}:{port}")),
        _ => Err(Invalid(format!("MachineOptions {flag}={endpoint}: no host"))),
    }
}

/// The `google` driver's grant with `credentials` the value of `GOOGLE_APPLICATION_CREDENTIALS`
/// (docker-machine's driver takes Google's default credentials: that key file, else the
/// metadata server of the VM it runs on): Compute Engine (`google-endpoint`, Runway's flag
/// for private endpoints and test servers, else `compute.googleapis.com`); with a key file,
/// the variable, the key file's directory read-only at the same path (the plugin reads the
/// file there) and its `token_uri`'s host (default `oauth2.googleapis.com`); without one, the
/// metadata server.
fn google_grant(dm: &DockerMachine, credentials: Option<&str>) -> Result<PluginGrant, Invalid> {
    let mut grant = PluginGrant::default();
    grant.allow_hosts.push(match dm.option("google-endpoint") {
        Some(endpoint) => host_of("google-endpoint", endpoint)?,
        None => "compute.googleapis.com:443".into(),
    });
    match credentials {
        Some(path) => {
            grant.env.push("GOOGLE_APPLICATION_CREDENTIALS".into());
            if let Some(dir) = std::path::Path::new(path).parent().filter(|d| !d.as_os_str().is_empty()) {
                grant.dirs.push(format!("{0}:{0}:ro", dir.display()));
            }
            // The key file names its token endpoint; an unreadable file is the plugin's
            // error to report (at `init`, naming the file).
            let token_uri = std::fs::read_to_string(path)
                .ok()
                .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
                .and_then(|key| key.get("token_uri").and_then(|u| u.as_str()).map(str::to_string));
            grant.allow_hosts.push(match token_uri {
                Some(uri) => host_of("GOOGLE_APPLICATION_CREDENTIALS token_uri", &uri)?,
                None => "oauth2.googleapis.com:443".into(),
            });
        }
        None => grant.allow_hosts.push("metadata.google.internal:80".into()),
    }
    Ok(grant)
}

/// A machine name part as DNS allows it (RFC 1123: lowercase letters, digits and `-`), as
/// gitlab-runner makes the runner's short description one.
fn rfc1123(text: &str) -> String {
    let name: String =
        text.to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    name.trim_matches('-').to_string()
}

/// The fleet of a docker+machine runner with token short form `short_token`: the built-in
/// provider of `MachineDriver`, one job per machine, the connection from the driver's SSH
/// flags (user, port, key file, private address).
pub fn fleet(machine: &MachineConfig, short_token: &str) -> Result<AutoscalerConfig, Invalid> {
    if machine.machine_driver.is_empty() {
        return Err(Invalid("docker+machine needs MachineDriver in [runners.machine]".into()));
    }
    let dm = DockerMachine {
        driver: machine.machine_driver.clone(),
        name_template: format!("runner-{}-{}", rfc1123(short_token), machine.machine_name),
        options: machine.machine_options.clone(),
    };
    let Some(provider) = dm.provider() else {
        let drivers: Vec<&str> = DRIVERS.iter().map(|(d, _)| *d).collect();
        return Err(Invalid(format!(
            "MachineDriver {:?}: Runway launches machines with {}",
            dm.driver,
            drivers.join(", ")
        )));
    };
    if !machine.machine_name.contains("%s") {
        return Err(Invalid(format!(
            "MachineName {:?} must contain %s (where each machine's unique part goes)",
            machine.machine_name
        )));
    }
    let mut fleet = AutoscalerConfig::deserialize(toml::Value::Table(toml::Table::new()))
        .map_err(|e| Invalid(format!("the derived [runners.autoscaler]: {e}")))?;
    fleet.plugin = provider.to_string();
    fleet.capacity_per_instance = 1;
    let c = &mut fleet.connector_config;
    c.protocol = "ssh".into();
    match dm.driver.as_str() {
        "amazonec2" => {
            c.username = dm.option("amazonec2-ssh-user").unwrap_or("ubuntu").to_string();
            c.protocol_port = port(&dm, "amazonec2-ssh-port")?;
            c.key_path = dm.option("amazonec2-ssh-keypath").map(Into::into);
            // A key of the machines' key pair is used as it is; without one, EC2 Instance
            // Connect pushes a key for each connection.
            c.use_static_credentials = c.key_path.is_some();
            // docker-machine reaches a machine at its public address unless told otherwise.
            c.use_external_addr =
                !(dm.flag("amazonec2-use-private-address") || dm.flag("amazonec2-private-address-only"));
        }
        "google" => {
            // The driver's user and port 22 (`google-ssh-port` is Runway's, for images whose
            // sshd listens elsewhere); the key is the plugin's (one per manager, put in each
            // machine's `ssh-keys` metadata and handed back with the address).
            c.username = dm.option("google-username").unwrap_or("docker-user").to_string();
            c.protocol_port = port(&dm, "google-ssh-port")?;
            c.use_static_credentials = true;
            c.use_external_addr = !(dm.flag("google-use-internal-ip") || dm.flag("google-use-internal-ip-only"));
        }
        "azure" => {
            c.username = dm.option("azure-ssh-user").unwrap_or("docker-user").to_string();
            // The driver's machines listen on 22; `azure-ssh-port` is Runway's (images whose
            // sshd listens elsewhere).
            c.protocol_port = port(&dm, "azure-ssh-port")?;
            // The plugin makes the manager's key, gives the machines its public half and hands
            // the private half with each machine's connect info.
            c.key_path = None;
            c.use_static_credentials = true;
            c.use_external_addr = !(dm.flag("azure-use-private-ip") || dm.flag("azure-no-public-ip"));
        }
        // `provider()` answered: the driver is one of DRIVERS.
        _ => {}
    }
    dm.implied_grant()?;
    fleet.docker_machine = Some(dm);
    Ok(fleet)
}

/// The SSH port flag `flag` (default 22).
fn port(dm: &DockerMachine, flag: &str) -> Result<u16, Invalid> {
    match dm.option(flag) {
        Some(port) => port.parse().map_err(|_| Invalid(format!("MachineOptions {flag}={port}: not a port"))),
        None => Ok(22),
    }
}

/// The implied grants of docker+machine runners whose provider has no `[plugins.NAME]`
/// section in `explicit`: one per provider, reaching every endpoint its runners name.
pub fn implied_grants<'a>(
    fleets: impl Iterator<Item = &'a AutoscalerConfig>,
    explicit: &BTreeMap<String, PluginGrant>,
) -> BTreeMap<String, PluginGrant> {
    let mut implied: BTreeMap<String, PluginGrant> = BTreeMap::new();
    for fleet in fleets {
        let Some(dm) = &fleet.docker_machine else { continue };
        if explicit.contains_key(&fleet.plugin) {
            continue;
        }
        // A flag the grant cannot be made from refused the runner at load (see [`fleet`]).
        let Ok(grant) = dm.implied_grant() else { continue };
        match implied.get_mut(&fleet.plugin) {
            Some(known) => {
                for host in grant.allow_hosts {
                    if !known.allow_hosts.contains(&host) {
                        known.allow_hosts.push(host);
                    }
                }
            }
            None => {
                implied.insert(fleet.plugin.clone(), grant);
            }
        }
    }
    implied
}

/// A docker+machine runner's fleet, derived from its `[runners.machine]`; a runner whose
/// section cannot give one is left out with a warning naming the key.
pub(super) fn derive(
    runner: &mut RunnerConfig,
    i: usize,
    err: &dyn Fn(String, String) -> ConfigError,
    warnings: &mut Vec<ConfigWarning>,
) {
    let short = super::short_token(&runner.resolved_token());
    let derived = match &runner.machine {
        Some(machine) => fleet(machine, &short).map_err(|e| e.0),
        None => Err("docker+machine creates its machines from a [runners.machine] section".into()),
    };
    match derived {
        Ok(fleet) => {
            if runner.autoscaler.is_some() {
                let problem = err(
                    format!("runners[{i}].autoscaler"),
                    "docker+machine's fleet is [runners.machine]'s: this section is ignored".into(),
                );
                warnings.push(ConfigWarning::new(WarningKind::Other, problem.to_string()));
            }
            runner.autoscaler = Some(fleet);
        }
        Err(message) => {
            super::mark_unusable(runner, err(format!("runners[{i}].machine.MachineDriver"), message), warnings)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(options: &[&str]) -> MachineConfig {
        MachineConfig {
            machine_driver: "amazonec2".into(),
            machine_name: "auto-scale-%s".into(),
            machine_options: options.iter().map(|o| o.to_string()).collect(),
            ..MachineConfig::default()
        }
    }

    #[test]
    fn an_amazonec2_machine_section_becomes_the_aws_provider_with_docker_machines_connection() {
        let fleet =
            fleet(&machine(&["amazonec2-region=eu-central-1", "amazonec2-ssh-user=admin"]), "Xy_12ab").expect("fleet");
        assert_eq!((fleet.plugin.as_str(), fleet.capacity_per_instance), ("aws", 1));
        let c = &fleet.connector_config;
        assert_eq!((c.username.as_str(), c.protocol_port, c.use_external_addr), ("admin", 22, true));
        assert!(!c.use_static_credentials && c.key_path.is_none(), "EC2 Instance Connect without a key pair");
        let dm = fleet.docker_machine.as_ref().expect("docker machine");
        assert_eq!(dm.name_template, "runner-xy-12ab-auto-scale-%s");
        assert_eq!(
            dm.plugin_config("s_1"),
            serde_json::json!({"machine": {"name": "runner-xy-12ab-auto-scale-%s", "manager": "s_1",
                "options": ["amazonec2-region=eu-central-1", "amazonec2-ssh-user=admin"]}})
        );
        let grant = dm.implied_grant().expect("grant");
        assert_eq!(
            grant.allow_hosts,
            ["ec2.eu-central-1.amazonaws.com:443", "ec2-instance-connect.eu-central-1.amazonaws.com:443"]
        );
        assert!(grant.env.contains(&"AWS_SECRET_ACCESS_KEY".to_string()));
    }

    #[test]
    fn key_pair_port_private_address_and_endpoint_flags_are_the_connections() {
        let fleet = fleet(
            &machine(&[
                "amazonec2-keypair-name=ci",
                "amazonec2-ssh-keypath=/etc/gitlab-runner/ci.pem",
                "amazonec2-ssh-port=2222",
                "amazonec2-use-private-address",
                "amazonec2-endpoint=http://127.0.0.1:5000",
            ]),
            "t",
        )
        .expect("fleet");
        let c = &fleet.connector_config;
        assert_eq!(c.key_path.as_deref(), Some(std::path::Path::new("/etc/gitlab-runner/ci.pem")));
        assert!(c.use_static_credentials);
        assert_eq!((c.protocol_port, c.use_external_addr, c.username.as_str()), (2222, false, "ubuntu"));
        let grant = fleet.docker_machine.as_ref().expect("dm").implied_grant().expect("grant");
        assert_eq!(grant.allow_hosts, ["127.0.0.1:5000"]);
        // `=false` turns a flag off.
        let public = super::fleet(&machine(&["amazonec2-use-private-address=false"]), "t").expect("fleet");
        assert!(public.connector_config.use_external_addr);
    }

    fn google(options: &[&str]) -> MachineConfig {
        MachineConfig { machine_driver: "google".into(), ..machine(options) }
    }

    #[test]
    fn a_google_machine_section_becomes_the_googlecompute_provider_with_docker_machines_connection() {
        let fleet = fleet(&google(&["google-project=p", "google-zone=europe-west1-b"]), "t").expect("fleet");
        assert_eq!((fleet.plugin.as_str(), fleet.capacity_per_instance), ("googlecompute", 1));
        let c = &fleet.connector_config;
        assert_eq!((c.username.as_str(), c.protocol_port, c.use_external_addr), ("docker-user", 22, true));
        assert!(c.key_path.is_none(), "the plugin's key, not a file");
        let dm = fleet.docker_machine.as_ref().expect("docker machine");
        // Without a key file: the metadata server of the VM the runner runs on.
        let grant = google_grant(dm, None).expect("grant");
        assert_eq!(grant.allow_hosts, ["compute.googleapis.com:443", "metadata.google.internal:80"]);
        assert!(grant.env.is_empty() && grant.dirs.is_empty());

        let other = super::fleet(&google(&["google-ssh-port=2222"]), "t").expect("fleet");
        assert_eq!(other.connector_config.protocol_port, 2222);
        assert!(super::fleet(&google(&["google-ssh-port=ssh"]), "t").expect_err("port").0.contains("google-ssh-port"));
        for internal in ["google-use-internal-ip", "google-use-internal-ip-only=true"] {
            let fleet = super::fleet(&google(&["google-username=ci", internal]), "t").expect("fleet");
            let c = &fleet.connector_config;
            assert_eq!((c.username.as_str(), c.use_external_addr), ("ci", false), "{internal}");
        }
    }

    #[test]
    fn a_google_key_file_grants_its_variable_its_directory_and_its_token_endpoint() {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = dir.path().join("sa.json");
        std::fs::write(&key, r#"{"type": "service_account", "token_uri": "http://127.0.0.1:8085/token"}"#)
            .expect("key file");
        let fleet = fleet(&google(&["google-project=p", "google-endpoint=http://127.0.0.1:8086"]), "t").expect("fleet");
        let dm = fleet.docker_machine.as_ref().expect("docker machine");
        let grant = google_grant(dm, Some(&key.display().to_string())).expect("grant");
        assert_eq!(grant.allow_hosts, ["127.0.0.1:8086", "127.0.0.1:8085"]);
        assert_eq!(grant.env, ["GOOGLE_APPLICATION_CREDENTIALS"]);
        assert_eq!(grant.dirs, [format!("{0}:{0}:ro", dir.path().display())]);
        // A key file without token_uri (or not readable yet): Google's token endpoint.
        let grant = google_grant(dm, Some("/nonexistent/sa.json")).expect("grant");
        assert_eq!(grant.allow_hosts, ["127.0.0.1:8086", "oauth2.googleapis.com:443"]);
        let bad = super::fleet(&google(&["google-endpoint=not a url"]), "t").expect_err("endpoint");
        assert!(bad.0.contains("google-endpoint=not a url"), "{}", bad.0);
    }

    #[test]
    fn google_runners_share_one_implied_grant_reaching_every_endpoint_and_a_section_wins() {
        let a = fleet(&google(&["google-project=a", "google-endpoint=http://127.0.0.1:8086"]), "a").expect("a");
        let b = fleet(&google(&["google-project=b"]), "b").expect("b");
        let aws = fleet(&machine(&["amazonec2-region=eu-west-1"]), "c").expect("c");
        let implied = implied_grants([&a, &b, &aws].into_iter(), &BTreeMap::new());
        assert_eq!(implied.keys().collect::<Vec<_>>(), ["aws", "googlecompute"]);
        let hosts = &implied["googlecompute"].allow_hosts;
        for host in ["127.0.0.1:8086", "compute.googleapis.com:443"] {
            assert!(hosts.contains(&host.to_string()), "{host} in {hosts:?}");
        }
        let explicit = BTreeMap::from([("googlecompute".to_string(), PluginGrant::default())]);
        assert_eq!(implied_grants([&a, &aws].into_iter(), &explicit).keys().collect::<Vec<_>>(), ["aws"]);
    }

    #[test]
    fn drivers_runway_cannot_launch_and_names_without_a_placeholder_are_refused_by_name() {
        let mut m = machine(&[]);
        m.machine_driver = "virtualbox".into();
        let e = fleet(&m, "t").expect_err("virtualbox");
        assert!(e.0.contains("MachineDriver \"virtualbox\"") && e.0.contains("amazonec2"), "{}", e.0);
        m.machine_driver = String::new();
        assert!(fleet(&m, "t").expect_err("no driver").0.contains("MachineDriver"));
        let mut m = machine(&[]);
        m.machine_name = "fixed".into();
        assert!(fleet(&m, "t").expect_err("no %s").0.contains("%s"));
        let bad = machine(&["amazonec2-ssh-port=ssh"]);
        assert!(fleet(&bad, "t").expect_err("port").0.contains("amazonec2-ssh-port=ssh"));
    }

    #[test]
    fn an_explicit_plugins_section_wins_over_the_implied_grant() {
        let a = fleet(&machine(&["amazonec2-region=eu-west-1"]), "a").expect("a");
        let b = fleet(&machine(&["amazonec2-region=us-west-2"]), "b").expect("b");
        let implied = implied_grants([&a, &b].into_iter(), &BTreeMap::new());
        assert_eq!(implied.len(), 1);
        assert_eq!(
            implied["aws"].allow_hosts,
            [
                "ec2.eu-west-1.amazonaws.com:443",
                "ec2-instance-connect.eu-west-1.amazonaws.com:443",
                "ec2.us-west-2.amazonaws.com:443",
                "ec2-instance-connect.us-west-2.amazonaws.com:443"
            ]
        );
        let explicit = BTreeMap::from([("aws".to_string(), PluginGrant::default())]);
        assert!(implied_grants([&a].into_iter(), &explicit).is_empty());
    }

    fn azure(options: &[&str]) -> MachineConfig {
        MachineConfig { machine_driver: "azure".into(), ..machine(options) }
    }

    #[test]
    fn an_azure_machine_section_becomes_the_azure_provider_with_the_drivers_user_port_and_address() {
        let fleet = fleet(&azure(&["azure-subscription-id=sub", "azure-location=westeurope"]), "t").expect("fleet");
        assert_eq!((fleet.plugin.as_str(), fleet.capacity_per_instance), ("azure", 1));
        let c = &fleet.connector_config;
        assert_eq!((c.username.as_str(), c.protocol_port, c.use_external_addr), ("docker-user", 22, true));
        assert!(c.use_static_credentials && c.key_path.is_none(), "the plugin's key, handed with the connect info");
        let grant = fleet.docker_machine.as_ref().expect("dm").implied_grant().expect("grant");
        assert_eq!(
            grant.allow_hosts,
            ["management.azure.com:443", "login.microsoftonline.com:443", "169.254.169.254:80"]
        );
        assert!(
            grant.env.contains(&"AZURE_CLIENT_SECRET".to_string())
                && grant.env.contains(&"AZURE_TENANT_ID".to_string())
        );

        for private in [&["azure-use-private-ip"][..], &["azure-no-public-ip=true"]] {
            let fleet = super::fleet(&azure(private), "t").expect("fleet");
            assert!(!fleet.connector_config.use_external_addr, "{private:?}");
        }
        let fleet = super::fleet(
            &azure(&["azure-ssh-user=ci", "azure-ssh-port=2222", "azure-environment=AzureChinaCloud"]),
            "t",
        )
        .expect("fleet");
        assert_eq!((fleet.connector_config.username.as_str(), fleet.connector_config.protocol_port), ("ci", 2222));
        let grant = fleet.docker_machine.as_ref().expect("dm").implied_grant().expect("grant");
        assert_eq!(grant.allow_hosts[..2], ["management.chinacloudapi.cn:443", "login.chinacloudapi.cn:443"]);
        let grant = super::fleet(&azure(&["azure-endpoint=http://127.0.0.1:8443"]), "t")
            .expect("fleet")
            .docker_machine
            .expect("dm")
            .implied_grant()
            .expect("grant");
        assert_eq!(grant.allow_hosts[0], "127.0.0.1:8443");
        let e = super::fleet(&azure(&["azure-environment=Mars"]), "t").expect_err("environment");
        assert!(e.0.contains("azure-environment=Mars") && e.0.contains("AzureChinaCloud"), "{}", e.0);
        assert!(super::fleet(&azure(&["azure-ssh-port=x"]), "t").expect_err("port").0.contains("azure-ssh-port=x"));
    }

    #[test]
    fn an_azure_docker_machine_config_loads_with_its_implied_grant_or_is_left_out_by_name() {
        let text = |options: &str| {
            format!(
                "concurrent = 1\n[[runners]]\n  url = \"https://x\"\n  token = \"t\"\n  executor = \"docker+machine\"\n  \
                 [runners.machine]\n    MachineDriver = \"azure\"\n    MachineName = \"ci-%s\"\n    MachineOptions = [{options}]\n"
            )
        };
        let path = std::path::Path::new("/etc/runway/config.toml");
        let loaded =
            super::super::parse(&text("\"azure-subscription-id=s\", \"azure-use-private-ip\""), path).expect("loads");
        assert!(loaded.warnings.is_empty(), "{:#?}", loaded.warnings);
        let runner = &loaded.config.runners[0];
        assert!(runner.unusable.is_none());
        let fleet = runner.autoscaler.as_ref().expect("derived");
        assert_eq!((fleet.plugin.as_str(), fleet.connector_config.use_external_addr), ("azure", false));
        let grants = loaded.grants();
        assert_eq!(grants["azure"].allow_hosts[0], "management.azure.com:443");

        let loaded = super::super::parse(&text("\"azure-environment=AzureStackCloud\""), path).expect("loads");
        assert!(loaded.config.runners[0].unusable.is_some());
        assert!(
            loaded.warnings.iter().any(|w| w.to_string().contains("runners[0].machine.MachineDriver")
                && w.to_string().contains("azure-environment=AzureStackCloud")),
            "{:#?}",
            loaded.warnings
        );
        assert!(!loaded.grants().contains_key("azure"));
    }
}
