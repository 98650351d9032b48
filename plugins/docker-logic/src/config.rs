//! `[runners.docker]`: parsing and validating the section (JSON of the TOML table) into
//! [`DockerConfig`]. Owns key names, defaults, size and CPU parsing, and the list of GitLab keys
//! Runway accepts but ignores. Does not touch the engine or the job.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::policy::PullPolicy;
use crate::volumes::{parse_device, parse_volume, Device, VolumeSpec};

/// Seconds to wait for services when `wait_for_services_timeout` is unset or 0 (GitLab's).
pub const DEFAULT_WAIT_FOR_SERVICES_TIMEOUT: i64 = 30;

/// The parsed `[runners.docker]` section.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DockerConfig {
    /// Engine address (`unix://…`, `tcp://…`); empty: the runner's default.
    pub host: String,
    /// Verify the engine's TLS certificate and present a client certificate.
    pub tls_verify: bool,
    /// Directory with `ca.pem`, `cert.pem`, `key.pem`.
    pub tls_cert_path: String,
    /// Default image for jobs without `image:`.
    pub image: String,
    /// Pull policies in fallback order; empty: `always`.
    pub pull_policy: Vec<PullPolicy>,
    /// Images jobs may ask for (globs); empty: any.
    pub allowed_images: Vec<String>,
    /// Pull policies jobs may ask for; empty: those of `pull_policy`.
    pub allowed_pull_policies: Vec<PullPolicy>,
    /// Services every job gets.
    pub services: Vec<ServiceConfig>,
    /// Services jobs may ask for (globs); empty: any.
    pub allowed_services: Vec<String>,
    /// Extra mounts (`host:container[:mode]`, `name:container[:mode]`, or `/path` for a cache volume).
    pub volumes: Vec<VolumeSpec>,
    /// Directory on the engine's machine for cache volumes as binds; empty: named volumes.
    pub cache_dir: String,
    /// No cache volume for the job's cache directory (nor for bare `/path` volumes).
    pub disable_cache: bool,
    /// Privileged containers (build, helper and service containers).
    pub privileged: bool,
    /// Capabilities added.
    pub cap_add: Vec<String>,
    /// Capabilities dropped.
    pub cap_drop: Vec<String>,
    /// `--security-opt` values.
    pub security_opt: Vec<String>,
    /// Devices (`host[:container[:permissions]]`).
    pub devices: Vec<Device>,
    /// Memory limit in bytes (0: none).
    pub memory: i64,
    /// Memory plus swap limit in bytes (0: none, -1: unlimited swap).
    pub memory_swap: i64,
    /// Memory soft limit in bytes (0: none).
    pub memory_reservation: i64,
    /// CPU quota in units of 10⁻⁹ CPUs (0: none).
    pub nano_cpus: i64,
    /// CPUs the containers may use (`0-3`, `0,1`).
    pub cpuset_cpus: String,
    /// Network the containers join instead of a per-job network.
    pub network_mode: String,
    /// `host:ip` entries for `/etc/hosts`.
    pub extra_hosts: Vec<String>,
    /// DNS servers.
    pub dns: Vec<String>,
    /// DNS search domains.
    pub dns_search: Vec<String>,
    /// `/dev/shm` size in bytes (0: the engine's default).
    pub shm_size: i64,
    /// User the build containers run as.
    pub user: String,
    /// Image for the predefined stages and service health checks; empty: Runway's own.
    pub helper_image: String,
    /// Seconds to wait for services (negative: do not wait).
    pub wait_for_services_timeout: i64,
    /// Do not kill processes when out of memory.
    pub oom_kill_disable: bool,
    /// Kernel parameters.
    pub sysctls: BTreeMap<String, String>,
    /// tmpfs mounts of build and helper containers (path → options).
    pub tmpfs: BTreeMap<String, String>,
    /// tmpfs mounts of service containers (path → options).
    pub services_tmpfs: BTreeMap<String, String>,
    /// Host name of the build and helper containers (empty: the engine's).
    pub hostname: String,
    /// OCI runtime (`runc`, `runsc`, …; empty: the engine's default).
    pub runtime: String,
    /// Parent cgroup of every container.
    pub cgroup_parent: String,
    /// Memory nodes the containers may use.
    pub cpuset_mems: String,
    /// Relative CPU weight (0: the engine's default).
    pub cpu_shares: i64,
    /// Extra groups of the build user.
    pub group_add: Vec<String>,
    /// User namespace mode (`host`).
    pub userns_mode: String,
    /// PID namespace (`host`, `container:<name>`).
    pub pid_mode: String,
    /// IPC namespace (`host`, `shareable`, `private`, …).
    pub ipc_mode: String,
    /// OOM score adjustment.
    pub oom_score_adjust: i64,
    /// Privileged service containers; `None`: as `privileged`.
    pub services_privileged: Option<bool>,
    /// Ignore the job's entrypoint override.
    pub disable_entrypoint_overwrite: bool,
    /// Labels added to every container (Runway's `runway.*` labels win).
    pub container_labels: BTreeMap<String, String>,
    /// Most services a job may have (`None`: no limit; the key's negative values).
    pub services_limit: Option<usize>,
    /// Resource limits (`nofile` → `1024` or `1024:2048`).
    pub ulimits: Vec<Ulimit>,
}

/// One `ulimit` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ulimit {
    /// Resource name (`nofile`, `nproc`, …).
    pub name: String,
    /// Soft limit.
    pub soft: i64,
    /// Hard limit.
    pub hard: i64,
}

/// One entry of `services` / `[[runners.docker.services]]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServiceConfig {
    /// Image reference.
    pub name: String,
    /// Host names, from `alias` (space or comma separated).
    pub aliases: Vec<String>,
    /// Command override.
    pub command: Vec<String>,
    /// Entrypoint override.
    pub entrypoint: Vec<String>,
    /// Variables (`variables` table or `KEY=value` list, and `environment` list).
    pub variables: Vec<(String, String)>,
}

impl DockerConfig {
    /// Seconds to wait for services; `None`: do not wait.
    pub fn services_timeout(&self) -> Option<u64> {
        match self.wait_for_services_timeout {
            0 => Some(DEFAULT_WAIT_FOR_SERVICES_TIMEOUT as u64),
            t if t < 0 => None,
            t => Some(t as u64),
        }
    }
}

/// Keys Runway reads.
pub const SUPPORTED_KEYS: &[&str] = &[
    "host",
    "tls_verify",
    "tls_cert_path",
    "image",
    "pull_policy",
    "allowed_images",
    "allowed_pull_policies",
    "services",
    "allowed_services",
    "volumes",
    "cache_dir",
    "disable_cache",
    "privileged",
    "cap_add",
    "cap_drop",
    "security_opt",
    "devices",
    "memory",
    "memory_swap",
    "memory_reservation",
    "cpus",
    "cpuset_cpus",
    "network_mode",
    "extra_hosts",
    "dns",
    "dns_search",
    "shm_size",
    "user",
    "helper_image",
    "wait_for_services_timeout",
    "oom_kill_disable",
    "sysctls",
    "tmpfs",
    "services_tmpfs",
    "hostname",
    "runtime",
    "cgroup_parent",
    "cpuset_mems",
    "cpu_shares",
    "group_add",
    "userns_mode",
    "pid_mode",
    "ipcmode",
    "oom_score_adjust",
    "services_privileged",
    "disable_entrypoint_overwrite",
    "container_labels",
    "services_limit",
    "ulimit",
];

/// GitLab's `[runners.docker]` keys Runway accepts and ignores (warned about by name).
pub const UNSUPPORTED_GITLAB_KEYS: &[&str] = &[
    "allowed_users",
    "services_security_opt",
    "device_cgroup_rules",
    "gpus",
    "services_devices",
    "volume_keep",
    "volume_driver",
    "volume_driver_ops",
    "volumes_from",
    "mac_address",
    "links",
    "service_memory",
    "service_memory_swap",
    "service_memory_reservation",
    "service_cgroup_parent",
    "service_slot_cgroup_template",
    "service_cpuset_cpus",
    "service_cpus",
    "service_cpu_shares",
    "service_gpus",
    "allowed_privileged_images",
    "allowed_privileged_services",
    "isolation",
    "helper_image_flavor",
    "enable_ipv6",
    "network_mtu",
    "log_options",
    "use_common_build_dir",
    "helper_image_autoset_arch_and_os",
    "allowed_runtimes",
];

/// The result of [`parse`]: the config and the keys it ignored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parsed {
    /// The config.
    pub config: DockerConfig,
    /// GitLab keys Runway does not support, in the order of the section.
    pub unsupported: Vec<String>,
    /// Keys neither Runway nor GitLab knows.
    pub unknown: Vec<String>,
}

impl Parsed {
    /// One warning naming every ignored key, or `None` when nothing was ignored.
    pub fn warning(&self) -> Option<String> {
        let mut parts = Vec::new();
        if !self.unsupported.is_empty() {
            parts.push(format!("unsupported keys ignored: {}", self.unsupported.join(", ")));
        }
        if !self.unknown.is_empty() {
            parts.push(format!("unknown keys ignored: {}", self.unknown.join(", ")));
        }
        (!parts.is_empty()).then(|| format!("[runners.docker]: {}", parts.join("; ")))
    }
}

/// Parse the `[runners.docker]` section (JSON; empty or `{}` for none). Errors name the key.
pub fn parse(json: &str) -> Result<Parsed, String> {
    let json = json.trim();
    let map: Map<String, Value> = if json.is_empty() || json == "null" {
        Map::new()
    } else {
        serde_json::from_str(json).map_err(|e| format!("[runners.docker] is not a table: {e}"))?
    };
    let mut parsed = Parsed::default();
    for key in map.keys() {
        if SUPPORTED_KEYS.contains(&key.as_str()) {
            continue;
        }
        if UNSUPPORTED_GITLAB_KEYS.contains(&key.as_str()) {
            // `false`, `0`, `""`, `[]` ask for nothing (gitlab-runner register writes some).
            if !is_zero(&map[key]) {
                parsed.unsupported.push(key.clone());
            }
        } else {
            parsed.unknown.push(key.clone());
        }
    }
    let f = Fields(&map);
    let c = &mut parsed.config;
    c.host = f.get("host")?.unwrap_or_default();
    c.tls_verify = f.get("tls_verify")?.unwrap_or_default();
    c.tls_cert_path = f.get("tls_cert_path")?.unwrap_or_default();
    c.image = f.get("image")?.unwrap_or_default();
    c.pull_policy = f.policies("pull_policy")?;
    c.allowed_images = f.strings("allowed_images")?;
    c.allowed_pull_policies = f.policies("allowed_pull_policies")?;
    c.services = f.services()?;
    c.allowed_services = f.strings("allowed_services")?;
    c.volumes = f
        .strings("volumes")?
        .iter()
        .map(|v| parse_volume(v).map_err(|e| format!("[runners.docker] volumes: {e}")))
        .collect::<Result<_, _>>()?;
    c.cache_dir = f.get("cache_dir")?.unwrap_or_default();
    c.disable_cache = f.get("disable_cache")?.unwrap_or_default();
    c.privileged = f.get("privileged")?.unwrap_or_default();
    c.cap_add = f.strings("cap_add")?;
    c.cap_drop = f.strings("cap_drop")?;
    c.security_opt = f.strings("security_opt")?;
    c.devices = f
        .strings("devices")?
        .iter()
        .map(|d| parse_device(d).map_err(|e| format!("[runners.docker] devices: {e}")))
        .collect::<Result<_, _>>()?;
    c.memory = f.size("memory")?;
    c.memory_swap = f.size("memory_swap")?;
    c.memory_reservation = f.size("memory_reservation")?;
    c.nano_cpus = f.cpus("cpus")?;
    c.cpuset_cpus = f.get("cpuset_cpus")?.unwrap_or_default();
    c.network_mode = f.get("network_mode")?.unwrap_or_default();
    c.extra_hosts = f.strings("extra_hosts")?;
    c.dns = f.strings("dns")?;
    c.dns_search = f.strings("dns_search")?;
    c.shm_size = f.size("shm_size")?;
    c.user = f.get("user")?.unwrap_or_default();
    c.helper_image = f.get("helper_image")?.unwrap_or_default();
    c.wait_for_services_timeout = f.get("wait_for_services_timeout")?.unwrap_or_default();
    c.oom_kill_disable = f.get("oom_kill_disable")?.unwrap_or_default();
    c.sysctls = f.string_map("sysctls")?;
    c.tmpfs = f.string_map("tmpfs")?;
    c.services_tmpfs = f.string_map("services_tmpfs")?;
    c.hostname = f.get("hostname")?.unwrap_or_default();
    c.runtime = f.get("runtime")?.unwrap_or_default();
    c.cgroup_parent = f.get("cgroup_parent")?.unwrap_or_default();
    c.cpuset_mems = f.get("cpuset_mems")?.unwrap_or_default();
    c.cpu_shares = f.get("cpu_shares")?.unwrap_or_default();
    c.group_add = f.strings("group_add")?;
    c.userns_mode = f.get("userns_mode")?.unwrap_or_default();
    c.pid_mode = f.get("pid_mode")?.unwrap_or_default();
    c.ipc_mode = f.get("ipcmode")?.unwrap_or_default();
    c.oom_score_adjust = f.get("oom_score_adjust")?.unwrap_or_default();
    c.services_privileged = f.get("services_privileged")?;
    c.disable_entrypoint_overwrite = f.get("disable_entrypoint_overwrite")?.unwrap_or_default();
    c.container_labels = f.string_map("container_labels")?;
    c.services_limit = f.get::<i64>("services_limit")?.and_then(|n| usize::try_from(n).ok());
    c.ulimits = f
        .string_map("ulimit")?
        .iter()
        .map(|(name, value)| parse_ulimit(name, value).map_err(|e| format!("[runners.docker] ulimit: {e}")))
        .collect::<Result<_, _>>()?;
    if c.memory_swap > 0 && c.memory > 0 && c.memory_swap < c.memory {
        return Err("[runners.docker] memory_swap must be at least memory".into());
    }
    if !c.host.is_empty() && !c.host.starts_with("unix://") && !c.host.starts_with("tcp://") {
        return Err(format!(
            "[runners.docker] host {:?} is not an engine address (unix:///path/docker.sock or tcp://host:port)",
            c.host
        ));
    }
    Ok(parsed)
}

/// Whether a value asks for nothing: null, false, 0, an empty string, list or table.
fn is_zero(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// Typed access to the section's keys, with errors naming the key.
struct Fields<'a>(&'a Map<String, Value>);

/// A string or a list of strings.
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) if s.is_empty() => Vec::new(),
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// A string or a number (sizes, CPUs).
#[derive(Deserialize)]
#[serde(untagged)]
enum StringOrNumber {
    Number(f64),
    String(String),
}

impl Fields<'_> {
    fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, String> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => serde_json::from_value(v.clone()).map(Some).map_err(|e| format!("[runners.docker] {key}: {e}")),
        }
    }

    fn strings(&self, key: &str) -> Result<Vec<String>, String> {
        Ok(self.get::<OneOrMany>(key)?.map(OneOrMany::into_vec).unwrap_or_default())
    }

    fn policies(&self, key: &str) -> Result<Vec<PullPolicy>, String> {
        self.strings(key)?
            .iter()
            .map(|p| PullPolicy::parse(p).map_err(|e| format!("[runners.docker] {key}: {e}")))
            .collect()
    }

    fn string_map(&self, key: &str) -> Result<BTreeMap<String, String>, String> {
        Ok(self.get(key)?.unwrap_or_default())
    }

    fn size(&self, key: &str) -> Result<i64, String> {
        match self.get::<StringOrNumber>(key)? {
            None => Ok(0),
            Some(StringOrNumber::Number(n)) if n.fract() == 0.0 => Ok(n as i64),
            Some(StringOrNumber::Number(n)) => {
                Err(format!("[runners.docker] {key}: {n} is not a whole number of bytes"))
            }
            Some(StringOrNumber::String(s)) => parse_size(&s).map_err(|e| format!("[runners.docker] {key}: {e}")),
        }
    }

    fn cpus(&self, key: &str) -> Result<i64, String> {
        let value = match self.get::<StringOrNumber>(key)? {
            None => return Ok(0),
            Some(StringOrNumber::Number(n)) => n,
            Some(StringOrNumber::String(s)) if s.trim().is_empty() => return Ok(0),
            Some(StringOrNumber::String(s)) => {
                s.trim().parse::<f64>().map_err(|_| format!("[runners.docker] {key}: {s:?} is not a number of CPUs"))?
            }
        };
        if !(value.is_finite() && value >= 0.0) {
            return Err(format!("[runners.docker] {key}: {value} is not a number of CPUs"));
        }
        Ok((value * 1e9).round() as i64)
    }

    fn services(&self) -> Result<Vec<ServiceConfig>, String> {
        let Some(value) = self.0.get("services") else { return Ok(Vec::new()) };
        let entries = match value {
            Value::Null => return Ok(Vec::new()),
            Value::Array(entries) => entries.clone(),
            other => vec![other.clone()],
        };
        entries
            .iter()
            .enumerate()
            .map(|(i, entry)| service(entry).map_err(|e| format!("[runners.docker] services[{i}]: {e}")))
            .collect()
    }
}

/// A table of `[[runners.docker.services]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceTable {
    name: String,
    #[serde(default)]
    alias: String,
    #[serde(default)]
    command: Option<OneOrMany>,
    #[serde(default)]
    entrypoint: Option<OneOrMany>,
    #[serde(default)]
    variables: Option<Variables>,
    #[serde(default)]
    environment: Vec<String>,
}

/// `variables` of a service: a table or a `KEY=value` list.
#[derive(Deserialize)]
#[serde(untagged)]
enum Variables {
    Table(BTreeMap<String, String>),
    List(Vec<String>),
}

fn service(entry: &Value) -> Result<ServiceConfig, String> {
    if let Value::String(name) = entry {
        if name.trim().is_empty() {
            return Err("empty service name".into());
        }
        return Ok(ServiceConfig { name: name.clone(), ..Default::default() });
    }
    let table: ServiceTable = serde_json::from_value(entry.clone()).map_err(|e| e.to_string())?;
    if table.name.trim().is_empty() {
        return Err("empty service name".into());
    }
    let mut variables = Vec::new();
    let list = match table.variables {
        Some(Variables::Table(t)) => {
            variables.extend(t);
            Vec::new()
        }
        Some(Variables::List(l)) => l,
        None => Vec::new(),
    };
    for item in list.iter().chain(&table.environment) {
        let (k, v) = item.split_once('=').ok_or_else(|| format!("variable {item:?} is not KEY=value"))?;
        variables.push((k.to_string(), v.to_string()));
    }
    Ok(ServiceConfig {
        name: table.name,
        aliases: split_aliases(&table.alias),
        command: table.command.map(OneOrMany::into_vec).unwrap_or_default(),
        entrypoint: table.entrypoint.map(OneOrMany::into_vec).unwrap_or_default(),
        variables,
    })
}

/// A `ulimit` entry: `name = "soft"` or `name = "soft:hard"` (`-1`: unlimited).
pub fn parse_ulimit(name: &str, value: &str) -> Result<Ulimit, String> {
    let number = |v: &str| v.trim().parse::<i64>().map_err(|_| format!("{name} = {value:?} is not soft[:hard]"));
    let (soft, hard) = match value.split_once(':') {
        Some((soft, hard)) => (number(soft)?, number(hard)?),
        None => {
            let n = number(value)?;
            (n, n)
        }
    };
    if soft > hard && hard >= 0 {
        return Err(format!("{name} = {value:?}: the soft limit is above the hard limit"));
    }
    Ok(Ulimit { name: name.to_string(), soft, hard })
}

/// GitLab's alias list: space or comma separated.
pub fn split_aliases(alias: &str) -> Vec<String> {
    alias.split([' ', ',']).filter(|a| !a.is_empty()).map(str::to_string).collect()
}

/// A size as Docker's `RAMInBytes` reads it: `512m`, `1.5g`, `2GiB`, `1024` (bytes); binary units.
pub fn parse_size(text: &str) -> Result<i64, String> {
    let s = text.trim();
    let digits_end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, unit) = s.split_at(digits_end);
    let number: f64 = number.parse().map_err(|_| format!("{text:?} is not a size (e.g. 512m, 2g)"))?;
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit.strip_suffix('b').unwrap_or(&unit);
    let unit = unit.strip_suffix('i').unwrap_or(unit);
    let shift = match unit {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        "p" => 50,
        _ => return Err(format!("{text:?} is not a size (e.g. 512m, 2g)")),
    };
    Ok((number * (1u64 << shift) as f64) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_section_gives_defaults() {
        let parsed = parse("{}").unwrap();
        assert_eq!(parsed.config, DockerConfig::default());
        assert_eq!(parsed.warning(), None);
        assert_eq!(parse("").unwrap().config, DockerConfig::default());
        assert_eq!(parsed.config.services_timeout(), Some(30));
    }

    #[test]
    fn every_supported_key_is_read() {
        let json = r#"{
            "host": "tcp://127.0.0.1:2376", "tls_verify": true, "tls_cert_path": "/certs",
            "image": "alpine:3", "pull_policy": ["if-not-present", "always"],
            "allowed_images": ["alpine:*"], "allowed_pull_policies": "if-not-present",
            "services": ["postgres:14", {"name": "redis", "alias": "cache, kv", "command": ["redis-server"],
                         "entrypoint": "/x", "variables": {"A": "1"}, "environment": ["B=2"]}],
            "allowed_services": ["**"], "volumes": ["/data", "/srv:/srv:ro"], "cache_dir": "/var/cache/runway",
            "disable_cache": true, "privileged": true, "cap_add": ["NET_ADMIN"], "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"], "devices": ["/dev/fuse"], "memory": "512m",
            "memory_swap": "1g", "memory_reservation": 1048576, "cpus": "1.5", "cpuset_cpus": "0-1",
            "network_mode": "mynet", "extra_hosts": ["db:10.0.0.1"], "dns": ["10.0.0.2"],
            "dns_search": ["example"], "shm_size": 67108864, "user": "build", "helper_image": "helper:1",
            "wait_for_services_timeout": -1, "oom_kill_disable": true, "sysctls": {"net.ipv4.ip_forward": "1"},
            "tmpfs": {"/tmp": "rw"}, "services_tmpfs": {"/var/lib/postgresql": "rw"}
        }"#;
        let parsed = parse(json).unwrap();
        let c = &parsed.config;
        assert_eq!(parsed.warning(), None);
        assert!(c.tls_verify);
        assert_eq!(c.pull_policy, vec![PullPolicy::IfNotPresent, PullPolicy::Always]);
        assert_eq!(c.allowed_pull_policies, vec![PullPolicy::IfNotPresent]);
        assert_eq!(c.services.len(), 2);
        assert_eq!(c.services[0].name, "postgres:14");
        let redis = &c.services[1];
        assert_eq!(redis.aliases, vec!["cache", "kv"]);
        assert_eq!(redis.entrypoint, vec!["/x"]);
        assert_eq!(redis.variables, vec![("A".into(), "1".into()), ("B".into(), "2".into())]);
        assert_eq!(c.volumes.len(), 2);
        assert_eq!(c.memory, 512 << 20);
        assert_eq!(c.memory_swap, 1 << 30);
        assert_eq!(c.memory_reservation, 1 << 20);
        assert_eq!(c.nano_cpus, 1_500_000_000);
        assert_eq!(c.shm_size, 64 << 20);
        assert_eq!(c.services_timeout(), None);
        assert_eq!(c.devices[0].path_in_container, "/dev/fuse");
        assert_eq!(c.sysctls["net.ipv4.ip_forward"], "1");
    }

    #[test]
    fn ignored_keys_are_named_once() {
        let parsed = parse(r#"{"image": "a", "gpus": "all", "volume_driver": "x", "frobnicate": 1}"#).unwrap();
        assert_eq!(parsed.unsupported, vec!["gpus", "volume_driver"]);
        assert_eq!(parsed.unknown, vec!["frobnicate"]);
        assert_eq!(
            parsed.warning().unwrap(),
            "[runners.docker]: unsupported keys ignored: gpus, volume_driver; unknown keys ignored: frobnicate"
        );
    }

    #[test]
    fn zero_values_of_unsupported_keys_are_not_warned_about() {
        let parsed =
            parse(r#"{"network_mtu": 0, "gpus": "", "volumes_from": [], "enable_ipv6": false, "log_options": {}}"#)
                .unwrap();
        assert_eq!(parsed.warning(), None);
    }

    #[test]
    fn gitlab_extras_are_read() {
        let c = parse(
            r#"{"hostname": "ci", "runtime": "runsc", "cgroup_parent": "/ci", "cpuset_mems": "0", "cpu_shares": 512,
                "group_add": ["docker"], "userns_mode": "host", "pid_mode": "host", "ipcmode": "private",
                "oom_score_adjust": 100, "services_privileged": false, "disable_entrypoint_overwrite": true,
                "container_labels": {"team": "a"}, "services_limit": 2, "ulimit": {"nofile": "1024:2048", "nproc": "-1"}}"#,
        )
        .unwrap();
        assert_eq!(c.warning(), None);
        let c = c.config;
        assert_eq!((c.hostname.as_str(), c.runtime.as_str(), c.ipc_mode.as_str()), ("ci", "runsc", "private"));
        assert_eq!((c.cpu_shares, c.oom_score_adjust, c.services_limit), (512, 100, Some(2)));
        assert_eq!(c.services_privileged, Some(false));
        assert!(c.disable_entrypoint_overwrite);
        assert_eq!(c.ulimits[0], Ulimit { name: "nofile".into(), soft: 1024, hard: 2048 });
        assert_eq!(c.ulimits[1], Ulimit { name: "nproc".into(), soft: -1, hard: -1 });
        assert_eq!(parse(r#"{"services_limit": -1}"#).unwrap().config.services_limit, None);
        assert!(parse(r#"{"ulimit": {"nofile": "a:b"}}"#).unwrap_err().contains("ulimit"));
        assert!(parse(r#"{"ulimit": {"nofile": "10:5"}}"#).unwrap_err().contains("above the hard limit"));
    }

    #[test]
    fn bad_values_name_the_key() {
        for (json, key) in [
            (r#"{"privileged": "yes"}"#, "privileged"),
            (r#"{"pull_policy": "sometimes"}"#, "pull_policy"),
            (r#"{"allowed_pull_policies": ["never", "later"]}"#, "allowed_pull_policies"),
            (r#"{"memory": "lots"}"#, "memory"),
            (r#"{"cpus": "many"}"#, "cpus"),
            (r#"{"volumes": [":/x"]}"#, "volumes"),
            (r#"{"services": [{"alias": "x"}]}"#, "services[0]"),
            (r#"{"services": [{"name": "x", "bogus": 1}]}"#, "services[0]"),
            (r#"{"wait_for_services_timeout": "soon"}"#, "wait_for_services_timeout"),
            (r#"{"host": "ssh://x"}"#, "host"),
            (r#"{"sysctls": ["a"]}"#, "sysctls"),
        ] {
            let err = parse(json).unwrap_err();
            assert!(err.contains(key), "{json}: {err}");
        }
        assert!(parse("[1]").unwrap_err().contains("not a table"));
    }

    #[test]
    fn sizes_use_binary_units() {
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("2k").unwrap(), 2048);
        assert_eq!(parse_size("1.5g").unwrap(), 3 << 29);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("64MB").unwrap(), 64 << 20);
        assert!(parse_size("12x").is_err());
        assert!(parse_size("").is_err());
    }
}
