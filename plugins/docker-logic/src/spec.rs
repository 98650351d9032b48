//! Engine API request bodies: container create (build, helper, service and health-check
//! containers, each with the `[runners.docker]` settings that apply to it), network and volume
//! create, the shell-detection command stage containers run, and the health-check script.
//! Builds JSON only; sends nothing.

use std::collections::BTreeMap;

use runway_shell_quote::quote;
use serde_json::{json, Map, Value};

use crate::config::DockerConfig;

/// Where the stage script is uploaded in a stage container.
pub const SCRIPT_PATH: &str = "/.runway/script";

/// What a container is for; decides which settings of the config apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A user stage in the job's image: every setting.
    Build,
    /// A predefined stage in the helper image: every setting but `user` and the entrypoint.
    Helper,
    /// A service: `privileged`, `services_tmpfs`, DNS and hosts.
    Service,
    /// A service health check: DNS and hosts only.
    Wait,
}

/// One container to create.
#[derive(Debug, Clone)]
pub struct ContainerSpec {
    /// Image reference or ID.
    pub image: String,
    /// Command.
    pub cmd: Vec<String>,
    /// Entrypoint override (`None`: the image's).
    pub entrypoint: Option<Vec<String>>,
    /// `KEY=value` environment.
    pub env: Vec<String>,
    /// User (empty: the image's).
    pub user: String,
    /// Working directory (empty: the image's).
    pub working_dir: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// `source:target[:mode]` mounts.
    pub binds: Vec<String>,
    /// The network to join (`HostConfig.NetworkMode`); empty: the engine's default.
    pub network: String,
    /// Host names on `network` (user-defined networks only).
    pub aliases: Vec<String>,
    /// Legacy links `container:alias` (default bridge network only).
    pub links: Vec<String>,
    /// What the container is for.
    pub role: Role,
}

/// Whether `mode` names a user-defined network (one where aliases resolve).
pub fn is_user_defined_network(mode: &str) -> bool {
    !matches!(mode, "" | "bridge" | "host" | "none" | "default") && !mode.starts_with("container:")
}

fn strings(v: &[String]) -> Value {
    Value::Array(v.iter().cloned().map(Value::String).collect())
}

/// The body of `POST /containers/create`.
pub fn create_body(spec: &ContainerSpec, config: &DockerConfig) -> Value {
    let mut body = Map::new();
    body.insert("Image".into(), json!(spec.image));
    body.insert("Cmd".into(), strings(&spec.cmd));
    if let Some(entrypoint) = &spec.entrypoint {
        body.insert("Entrypoint".into(), strings(entrypoint));
    }
    body.insert("Env".into(), strings(&spec.env));
    if !spec.user.is_empty() {
        body.insert("User".into(), json!(spec.user));
    }
    if !spec.working_dir.is_empty() {
        body.insert("WorkingDir".into(), json!(spec.working_dir));
    }
    let mut labels = config.container_labels.clone();
    labels.extend(spec.labels.clone());
    body.insert("Labels".into(), json!(labels));
    if matches!(spec.role, Role::Build | Role::Helper) && !config.hostname.is_empty() {
        body.insert("Hostname".into(), json!(config.hostname));
    }
    body.insert("Tty".into(), json!(false));
    body.insert("OpenStdin".into(), json!(false));
    body.insert("AttachStdin".into(), json!(false));
    body.insert("AttachStdout".into(), json!(true));
    body.insert("AttachStderr".into(), json!(true));

    let mut host = Map::new();
    host.insert("Binds".into(), strings(&spec.binds));
    if !spec.network.is_empty() {
        host.insert("NetworkMode".into(), json!(spec.network));
    }
    if !spec.links.is_empty() {
        host.insert("Links".into(), strings(&spec.links));
    }
    if !config.dns.is_empty() {
        host.insert("Dns".into(), strings(&config.dns));
    }
    if !config.dns_search.is_empty() {
        host.insert("DnsSearch".into(), strings(&config.dns_search));
    }
    if !config.extra_hosts.is_empty() {
        host.insert("ExtraHosts".into(), strings(&config.extra_hosts));
    }
    if spec.role != Role::Wait {
        insert_string(&mut host, "Runtime", &config.runtime);
        insert_string(&mut host, "UsernsMode", &config.userns_mode);
    }
    match spec.role {
        Role::Build | Role::Helper => {
            host.insert("Privileged".into(), json!(config.privileged));
            insert_string(&mut host, "CgroupParent", &config.cgroup_parent);
            insert_string(&mut host, "CpusetMems", &config.cpuset_mems);
            insert_string(&mut host, "PidMode", &config.pid_mode);
            insert_string(&mut host, "IpcMode", &config.ipc_mode);
            insert_nonempty(&mut host, "GroupAdd", &config.group_add);
            if config.cpu_shares != 0 {
                host.insert("CpuShares".into(), json!(config.cpu_shares));
            }
            if config.oom_score_adjust != 0 {
                host.insert("OomScoreAdj".into(), json!(config.oom_score_adjust));
            }
            if !config.ulimits.is_empty() {
                let ulimits: Vec<Value> =
                    config.ulimits.iter().map(|u| json!({ "Name": u.name, "Soft": u.soft, "Hard": u.hard })).collect();
                host.insert("Ulimits".into(), Value::Array(ulimits));
            }
            insert_nonempty(&mut host, "CapAdd", &config.cap_add);
            insert_nonempty(&mut host, "CapDrop", &config.cap_drop);
            insert_nonempty(&mut host, "SecurityOpt", &config.security_opt);
            if !config.devices.is_empty() {
                let devices: Vec<Value> = config
                    .devices
                    .iter()
                    .map(|d| {
                        json!({
                            "PathOnHost": d.path_on_host,
                            "PathInContainer": d.path_in_container,
                            "CgroupPermissions": d.permissions,
                        })
                    })
                    .collect();
                host.insert("Devices".into(), Value::Array(devices));
            }
            for (key, value) in [
                ("Memory", config.memory),
                ("MemorySwap", config.memory_swap),
                ("MemoryReservation", config.memory_reservation),
                ("NanoCpus", config.nano_cpus),
                ("ShmSize", config.shm_size),
            ] {
                if value != 0 {
                    host.insert(key.into(), json!(value));
                }
            }
            if !config.cpuset_cpus.is_empty() {
                host.insert("CpusetCpus".into(), json!(config.cpuset_cpus));
            }
            if config.oom_kill_disable {
                host.insert("OomKillDisable".into(), json!(true));
            }
            if !config.sysctls.is_empty() {
                host.insert("Sysctls".into(), json!(config.sysctls));
            }
            if !config.tmpfs.is_empty() {
                host.insert("Tmpfs".into(), json!(config.tmpfs));
            }
        }
        Role::Service => {
            host.insert("Privileged".into(), json!(config.services_privileged.unwrap_or(config.privileged)));
            if !config.services_tmpfs.is_empty() {
                host.insert("Tmpfs".into(), json!(config.services_tmpfs));
            }
        }
        Role::Wait => {}
    }
    body.insert("HostConfig".into(), Value::Object(host));

    if is_user_defined_network(&spec.network) && !spec.aliases.is_empty() {
        body.insert(
            "NetworkingConfig".into(),
            json!({ "EndpointsConfig": { spec.network.clone(): { "Aliases": spec.aliases } } }),
        );
    }
    Value::Object(body)
}

fn insert_string(map: &mut Map<String, Value>, key: &str, value: &str) {
    if !value.is_empty() {
        map.insert(key.into(), json!(value));
    }
}

fn insert_nonempty(map: &mut Map<String, Value>, key: &str, values: &[String]) {
    if !values.is_empty() {
        map.insert(key.into(), strings(values));
    }
}

/// The body of `POST /networks/create` for a job's network.
pub fn network_body(name: &str, labels: &BTreeMap<String, String>) -> Value {
    json!({ "Name": name, "Driver": "bridge", "CheckDuplicate": true, "Labels": labels })
}

/// The body of `POST /volumes/create`.
pub fn volume_body(name: &str, labels: &BTreeMap<String, String>) -> Value {
    json!({ "Name": name, "Driver": "local", "Labels": labels })
}

/// The command of a stage container: run [`SCRIPT_PATH`] with bash if the image has it, else
/// with sh (GitLab's shell detection), the script on standard input.
pub fn stage_command() -> Vec<String> {
    vec!["sh".into(), "-c".into(), detect_shell(&format!(" < {SCRIPT_PATH}"))]
}

/// The command of the container a job's web terminal attaches to: the image's first shell,
/// reading a standard input that stays open, so it idles until the container is removed
/// (gitlab-runner's build container waits on its shell the same way).
pub fn terminal_command() -> Vec<String> {
    vec!["sh".into(), "-c".into(), detect_shell("")]
}

/// Where a job's long-lived containers keep their stages' logs, exit codes and scripts' inputs
/// (in each container's own filesystem: `/tmp` is writable by any user).
pub const STAGES_DIR: &str = "/tmp/.runway-stages";

/// Where the build container's idle command saves the environment its entrypoint exported,
/// for every stage to start from (gitlab-runner's stages run in the shell the entrypoint ran).
pub const ENTRYPOINT_ENV: &str = "/tmp/.runway-entrypoint-env";

/// The command of a job's long-lived build or helper container: save what the environment
/// holds after the entrypoint ([`ENTRYPOINT_ENV`], private to the container's user; best
/// effort), then idle as [`terminal_command`] does until the container is removed. Stages
/// run in it by `exec`.
pub fn idle_command() -> Vec<String> {
    let save = format!("(umask 077 && export -p > {ENTRYPOINT_ENV}) 2>/dev/null; ");
    vec!["sh".into(), "-c".into(), format!("{save}{}", detect_shell(""))]
}

/// The detached command of a stage in a long-lived container: the entrypoint's environment
/// (when saved), then the image's first shell in `dir`, the script on its standard input.
pub fn stage_exec_command(dir: &str) -> String {
    format!("if [ -r {ENTRYPOINT_ENV} ]; then . {ENTRYPOINT_ENV}; fi; cd {} && {}", quote(dir), detect_shell(""))
}

/// The create body of a job's long-lived build or helper container (the web terminal's too): a
/// container ([`create_body`] of `spec`) whose standard input is kept open, unattached.
pub fn terminal_body(spec: &ContainerSpec, config: &DockerConfig) -> Value {
    let mut body = create_body(spec, config);
    if let Some(map) = body.as_object_mut() {
        map.insert("OpenStdin".into(), json!(true));
        map.insert("StdinOnce".into(), json!(false));
    }
    body
}

/// A POSIX `sh` line that `exec`s the first shell the image has, bash before sh (GitLab's
/// shell detection), with `redirect` after it (`" < /path"`, or empty to keep standard input).
pub fn detect_shell(redirect: &str) -> String {
    let mut script = String::new();
    let shells = [
        "/usr/local/bin/bash",
        "/usr/bin/bash",
        "/bin/bash",
        "/usr/local/bin/sh",
        "/usr/bin/sh",
        "/bin/sh",
        "/busybox/sh",
    ];
    for (i, shell) in shells.iter().enumerate() {
        let keyword = if i == 0 { "if" } else { "elif" };
        script.push_str(&format!("{keyword} [ -x {shell} ]; then exec {shell}{redirect}; "));
    }
    script.push_str("else echo shell not found >&2; exit 1; fi");
    script
}

/// The command and environment of a health-check container: bash tries to open a TCP
/// connection to any of `ports` of `host` once a second, exiting 0 on the first success and 1
/// after `timeout` seconds. Host and ports travel in the environment (`RUNWAY_SERVICE_HOST`,
/// `RUNWAY_SERVICE_PORTS`), never in the script text: a job's alias cannot inject commands.
pub fn wait_command(host: &str, ports: &[u16], timeout: u64) -> (Vec<String>, Vec<String>) {
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    let script = format!(
        "while :; do for p in $RUNWAY_SERVICE_PORTS; do (exec 3<>\"/dev/tcp/$RUNWAY_SERVICE_HOST/$p\") 2>/dev/null && exit 0; done; \
         if [ $SECONDS -ge {timeout} ]; then echo \"no answer on $RUNWAY_SERVICE_HOST port(s) $RUNWAY_SERVICE_PORTS within {timeout}s\"; exit 1; fi; \
         sleep 1; done"
    );
    let env = vec![format!("RUNWAY_SERVICE_HOST={host}"), format!("RUNWAY_SERVICE_PORTS={}", ports.join(" "))];
    (vec!["bash".into(), "-c".into(), script], env)
}

/// The TCP ports of `Config.ExposedPorts` (`{"5432/tcp": {}}`) of a container or image
/// inspection, sorted.
pub fn exposed_tcp_ports(inspect: &Value) -> Vec<u16> {
    let mut ports: Vec<u16> = inspect["Config"]["ExposedPorts"]
        .as_object()
        .map(|ports| {
            ports
                .keys()
                .filter_map(|k| match k.split_once('/') {
                    Some((port, "tcp")) => port.parse().ok(),
                    None => k.parse().ok(),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    ports.sort_unstable();
    ports.dedup();
    ports
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

    fn spec(role: Role) -> ContainerSpec {
        ContainerSpec {
            image: "alpine:3".into(),
            cmd: vec!["true".into()],
            entrypoint: None,
            env: vec!["A=1".into()],
            user: String::new(),
            working_dir: "/builds".into(),
            labels: BTreeMap::from([("runway.managed".to_string(), "true".to_string())]),
            binds: vec!["vol:/builds".into()],
            network: "runway-job-1-x".into(),
            aliases: vec!["db".into()],
            links: Vec::new(),
            role,
        }
    }

    #[test]
    fn build_containers_get_every_setting() {
        let config = parse(
            r#"{"privileged": true, "cap_add": ["NET_ADMIN"], "devices": ["/dev/fuse"], "memory": "1g",
                "cpus": 2, "shm_size": "64m", "dns": ["10.0.0.2"], "tmpfs": {"/tmp": "rw"}, "oom_kill_disable": true,
                "sysctls": {"a.b": "1"}, "services_tmpfs": {"/s": ""}}"#,
        )
        .unwrap()
        .config;
        let body = create_body(&spec(Role::Build), &config);
        let host = &body["HostConfig"];
        assert_eq!(body["Image"], "alpine:3");
        assert_eq!(body["WorkingDir"], "/builds");
        assert!(body.get("Entrypoint").is_none());
        assert!(body.get("User").is_none());
        assert_eq!(host["Privileged"], true);
        assert_eq!(host["CapAdd"], json!(["NET_ADMIN"]));
        assert_eq!(host["Devices"][0]["PathOnHost"], "/dev/fuse");
        assert_eq!(host["Memory"], 1i64 << 30);
        assert_eq!(host["NanoCpus"], 2_000_000_000i64);
        assert_eq!(host["ShmSize"], 64i64 << 20);
        assert_eq!(host["Dns"], json!(["10.0.0.2"]));
        assert_eq!(host["Tmpfs"], json!({"/tmp": "rw"}));
        assert_eq!(host["OomKillDisable"], true);
        assert_eq!(host["Sysctls"], json!({"a.b": "1"}));
        assert_eq!(host["NetworkMode"], "runway-job-1-x");
        assert_eq!(body["NetworkingConfig"]["EndpointsConfig"]["runway-job-1-x"]["Aliases"], json!(["db"]));

        let service = create_body(&spec(Role::Service), &config);
        assert_eq!(service["HostConfig"]["Privileged"], true);
        assert_eq!(service["HostConfig"]["Tmpfs"], json!({"/s": ""}));
        assert!(service["HostConfig"].get("Memory").is_none());
        let wait = create_body(&spec(Role::Wait), &config);
        assert!(wait["HostConfig"].get("Privileged").is_none());
        assert_eq!(wait["HostConfig"]["Dns"], json!(["10.0.0.2"]));
    }

    #[test]
    fn gitlab_extras_go_where_gitlab_puts_them() {
        let config = parse(
            r#"{"hostname": "ci", "runtime": "runsc", "cpu_shares": 512, "pid_mode": "host", "group_add": ["docker"],
                "ulimit": {"nofile": "1024:2048"}, "privileged": true, "services_privileged": false,
                "container_labels": {"team": "a", "runway.managed": "false"}}"#,
        )
        .unwrap()
        .config;
        let build = create_body(&spec(Role::Build), &config);
        assert_eq!(build["Hostname"], "ci");
        assert_eq!(build["HostConfig"]["Runtime"], "runsc");
        assert_eq!(build["HostConfig"]["CpuShares"], 512);
        assert_eq!(build["HostConfig"]["PidMode"], "host");
        assert_eq!(build["HostConfig"]["GroupAdd"], json!(["docker"]));
        assert_eq!(build["HostConfig"]["Ulimits"], json!([{"Name": "nofile", "Soft": 1024, "Hard": 2048}]));
        assert_eq!(build["Labels"]["team"], "a");
        assert_eq!(build["Labels"]["runway.managed"], "true");
        let service = create_body(&spec(Role::Service), &config);
        assert_eq!(service["HostConfig"]["Privileged"], false);
        assert_eq!(service["HostConfig"]["Runtime"], "runsc");
        assert!(service.get("Hostname").is_none());
        assert!(service["HostConfig"].get("PidMode").is_none());
        let wait = create_body(&spec(Role::Wait), &config);
        assert!(wait["HostConfig"].get("Runtime").is_none());
    }

    #[test]
    fn no_aliases_on_builtin_networks() {
        let mut s = spec(Role::Build);
        s.network = "bridge".into();
        s.links = vec!["svc:db".into()];
        s.entrypoint = Some(vec![]);
        s.user = "1000".into();
        let body = create_body(&s, &DockerConfig::default());
        assert!(body.get("NetworkingConfig").is_none());
        assert_eq!(body["HostConfig"]["Links"], json!(["svc:db"]));
        assert_eq!(body["Entrypoint"], json!([]));
        assert_eq!(body["User"], "1000");
        assert!(!is_user_defined_network("host"));
        assert!(!is_user_defined_network("container:abc"));
        assert!(is_user_defined_network("mynet"));
    }

    #[test]
    fn network_and_volume_bodies() {
        let labels = BTreeMap::from([("k".to_string(), "v".to_string())]);
        assert_eq!(network_body("n", &labels)["Labels"]["k"], "v");
        assert_eq!(volume_body("v", &labels)["Name"], "v");
    }

    #[test]
    fn terminal_container_idles_on_an_open_standard_input() {
        let cmd = terminal_command();
        assert!(cmd[2].starts_with("if [ -x /usr/local/bin/bash ]; then exec /usr/local/bin/bash;"));
        let spec = ContainerSpec {
            image: "alpine".into(),
            cmd,
            entrypoint: None,
            env: Vec::new(),
            user: String::new(),
            working_dir: "/builds".into(),
            labels: BTreeMap::new(),
            binds: Vec::new(),
            network: String::new(),
            aliases: Vec::new(),
            links: Vec::new(),
            role: Role::Build,
        };
        let body = terminal_body(&spec, &DockerConfig::default());
        assert_eq!(body["OpenStdin"], json!(true));
        assert_eq!(body["StdinOnce"], json!(false));
        assert_eq!(body["AttachStdin"], json!(false));
        assert_eq!(body["Tty"], json!(false));
    }

    #[test]
    fn long_lived_containers_save_the_entrypoints_environment_and_idle() {
        let cmd = idle_command();
        assert_eq!(&cmd[..2], &["sh".to_string(), "-c".to_string()]);
        assert!(cmd[2].starts_with("(umask 077 && export -p > /tmp/.runway-entrypoint-env) 2>/dev/null; if [ -x"));
        assert!(cmd[2].ends_with(&detect_shell("")));
        let stage = stage_exec_command("/builds/it's");
        assert!(stage.starts_with("if [ -r /tmp/.runway-entrypoint-env ]; then . /tmp/.runway-entrypoint-env; fi; cd '/builds/it'\\''s' && if [ -x"));
    }

    #[test]
    fn stage_command_prefers_bash() {
        let cmd = stage_command();
        assert_eq!(&cmd[..2], &["sh".to_string(), "-c".to_string()]);
        assert!(cmd[2].starts_with("if [ -x /usr/local/bin/bash ]; then exec /usr/local/bin/bash < /.runway/script;"));
        assert!(cmd[2].contains("elif [ -x /bin/sh ]; then exec /bin/sh < /.runway/script;"));
        assert!(cmd[2].ends_with("fi"));
    }

    #[test]
    fn wait_command_and_ports() {
        let (cmd, env) = wait_command("db;reboot", &[5432, 8080], 30);
        assert_eq!(cmd[0], "bash");
        assert!(cmd[2].contains("for p in $RUNWAY_SERVICE_PORTS;"));
        assert!(cmd[2].contains("\"/dev/tcp/$RUNWAY_SERVICE_HOST/$p\""));
        assert!(cmd[2].contains("-ge 30"));
        assert!(!cmd[2].contains("reboot"));
        assert_eq!(env, vec!["RUNWAY_SERVICE_HOST=db;reboot", "RUNWAY_SERVICE_PORTS=5432 8080"]);
        let inspect = json!({"Config": {"ExposedPorts": {"8080/tcp": {}, "53/udp": {}, "5432/tcp": {}, "80": {}}}});
        assert_eq!(exposed_tcp_ports(&inspect), vec![80, 5432, 8080]);
        assert_eq!(exposed_tcp_ports(&json!({"Config": {"ExposedPorts": null}})), Vec::<u16>::new());
    }
}
