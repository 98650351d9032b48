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

/// The programs a container needs for stages to run detached in it (`runway:host/docker-stages`).
pub const DETACHED_PROGRAMS: &[&str] = &["setsid", "tail", "mkdir", "rm", "mv", "cat", "wc", "sleep"];

/// Programs a setup stage's script may call beyond the shell and [`DETACHED_PROGRAMS`]; the
/// build container's probe says which of them its image has ([`build_probe`]).
pub const PROBED_PROGRAMS: &[&str] = &[
    "find", "uname", "chmod", "chown", "cp", "ln", "touch", "dirname", "basename", "env", "head", "sort", "tr", "cut",
    "date", "id", "mktemp", "stat", "readlink", "realpath", "tee", "expr", "seq", "timeout", "sed", "grep", "xargs",
    "rmdir", "ls", "sync",
];

/// Words that start a command in POSIX `sh` without being a program: builtins and keywords.
const SHELL_WORDS: &[&str] = &[
    "echo", "printf", "read", "export", "cd", "test", "[", "true", "false", ":", "set", "unset", "exit", "return",
    "eval", "exec", "shift", "trap", "wait", "kill", "umask", "type", "command", ".", "break", "continue", "readonly",
    "pwd", "if", "then", "else", "elif", "fi", "do", "done", "while", "until", "for", "case", "esac", "in", "!",
    "local", "trap", "eval", "set",
];

/// A program a generated setup script only falls back on (`prepare_script` asks `hostname`
/// when `/proc` does not say the machine's name, and `uname -n` after it): its absence does
/// not fail the stage.
const FALLBACK_PROGRAMS: &[&str] = &["hostname"];

/// Predefined stages that may run in the build container when their script needs nothing of
/// the helper's (gitlab-runner runs `prepare_script` there too): with `GIT_STRATEGY: none` and
/// no cache or artifacts, a job then needs no helper container at all.
const SETUP_STAGES: &[&str] = &["prepare_script", "get_sources", "cleanup_file_variables"];

/// The build container's probe, one `exec`: `detached` when stages can run detached in it
/// ([`DETACHED_PROGRAMS`]), `writable` when its user may write `builds_dir`, and `have P` for
/// each program of [`PROBED_PROGRAMS`] it has.
pub fn build_probe(builds_dir: &str) -> String {
    let detached: Vec<String> = DETACHED_PROGRAMS.iter().map(|p| format!("command -v {p} >/dev/null 2>&1")).collect();
    format!(
        "if {}; then echo detached; fi; if [ -w {} ]; then echo writable; fi; \
         for p in {}; do if command -v \"$p\" >/dev/null 2>&1; then echo \"have $p\"; fi; done",
        detached.join(" && "),
        quote(builds_dir),
        PROBED_PROGRAMS.join(" ")
    )
}

/// What [`build_probe`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuildProbe {
    /// Stages can run detached in the container.
    pub detached: bool,
    /// Its user may write the builds directory.
    pub writable: bool,
    /// The programs of [`PROBED_PROGRAMS`] it has.
    pub programs: Vec<String>,
}

/// Read [`build_probe`]'s output.
pub fn parse_build_probe(output: &str) -> BuildProbe {
    let mut probe = BuildProbe::default();
    for line in output.lines().map(str::trim) {
        match line {
            "detached" => probe.detached = true,
            "writable" => probe.writable = true,
            _ => {
                if let Some(program) = line.strip_prefix("have ") {
                    probe.programs.push(program.to_string());
                }
            }
        }
    }
    probe
}

/// The programs `script` may run: the first word of every command — at the start, after a
/// newline, `;`, `&`, `|`, `(`, `)`, `{`, `}`, a backtick or `$(` (in double quotes too), past
/// keywords, variable assignments and redirections — unquoted, its last path part. An ANSI-C
/// quoted word (`$'…'`, what the generated scripts `eval`) is read as code too. Words of
/// here-documents and `case` patterns may count as programs: that errs towards more
/// programs, never fewer.
pub fn command_words(script: &str) -> std::collections::BTreeSet<String> {
    let mut words = std::collections::BTreeSet::new();
    let mut lexer = Lexer {
        words: &mut words,
        word: String::new(),
        at_start: true,
        started: false,
        program: String::new(),
        redirect_target: false,
    };
    lexer.code(&script.chars().collect::<Vec<_>>(), false);
    words
}

/// [`command_words`]' reader.
struct Lexer<'a> {
    words: &'a mut std::collections::BTreeSet<String>,
    word: String,
    at_start: bool,
    started: bool,
    /// The current command's program.
    program: String,
    /// The next word is a redirection's target (`<`, `>` and the like stood alone).
    redirect_target: bool,
}

impl Lexer<'_> {
    /// The end of a word: a command's first one is its program.
    fn end_word(&mut self) {
        let word = std::mem::take(&mut self.word);
        let started = std::mem::replace(&mut self.started, false);
        if !self.at_start || !started {
            return;
        }
        if std::mem::replace(&mut self.redirect_target, false) {
            return;
        }
        let assignment = word
            .split_once('=')
            .is_some_and(|(name, _)| !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        let redirect = word.trim_start_matches(|c: char| c.is_ascii_digit()).starts_with(['<', '>']);
        let prefix = matches!(
            word.as_str(),
            "if" | "then" | "else" | "elif" | "do" | "while" | "until" | "!" | "exec" | "command" | "time"
        );
        if assignment || redirect || prefix {
            self.redirect_target = redirect
                && word.trim_start_matches(|c: char| c.is_ascii_digit() || c == '<' || c == '>' || c == '&').is_empty();
            return;
        }
        self.at_start = false;
        let program = word.rsplit('/').next().unwrap_or(&word);
        self.program = program.to_string();
        let name = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '+' | '-' | '[' | ':');
        if program.chars().next().is_some_and(|c| !c.is_ascii_digit()) && program.chars().all(name) {
            self.words.insert(program.to_string());
        }
    }

    /// A command boundary.
    fn boundary(&mut self) {
        self.end_word();
        self.at_start = true;
        self.redirect_target = false;
        self.program.clear();
    }

    fn push(&mut self, c: char) {
        self.word.push(c);
        self.started = true;
    }

    /// Read `chars` as shell code; returns at its end or, when `nested` (in a `$(`), at the
    /// `)` closing it, whose index after it it returns.
    fn code(&mut self, chars: &[char], nested: bool) -> usize {
        let mut i = 0;
        let mut depth = 0usize;
        while i < chars.len() {
            let c = chars[i];
            let next = chars.get(i + 1).copied();
            match c {
                '\\' => {
                    if let Some(n) = next.filter(|n| *n != '\n') {
                        self.push(n);
                    }
                    i += 2;
                    continue;
                }
                '\'' => {
                    let end = chars[i + 1..].iter().position(|c| *c == '\'').map_or(chars.len(), |p| i + 1 + p);
                    self.word.extend(&chars[i + 1..end.min(chars.len())]);
                    self.started = true;
                    i = end + 1;
                    continue;
                }
                '"' => {
                    i = self.double_quoted(chars, i + 1);
                    continue;
                }
                '$' if next == Some('\'') => {
                    // `$'…'`: decoded; an argument of `eval` (how the scripts run their body)
                    // is read as code.
                    let mut end = i + 2;
                    while end < chars.len() && chars[end] != '\'' {
                        end += if chars[end] == '\\' { 2 } else { 1 };
                    }
                    let inner: String = chars[i + 2..end.min(chars.len())].iter().collect();
                    let decoded = runway_shell_quote::ansi_c_unquote(&inner);
                    if !self.at_start && self.program == "eval" {
                        self.boundary();
                        self.code(&decoded.chars().collect::<Vec<_>>(), false);
                        self.boundary();
                    } else {
                        self.word.push_str(&decoded);
                        self.started = true;
                    }
                    i = end + 1;
                    continue;
                }
                '$' if next == Some('(') && chars.get(i + 2) == Some(&'(') => {
                    // Arithmetic: no command in it.
                    let end = chars[i..].windows(2).position(|w| w == [')', ')']).map_or(chars.len(), |p| i + p + 2);
                    self.word.extend(&chars[i..end.min(chars.len())]);
                    self.started = true;
                    i = end;
                    continue;
                }
                '$' if next == Some('(') => {
                    self.boundary();
                    i += 2 + self.code(&chars[i + 2..], true);
                    self.boundary();
                    continue;
                }
                '$' if next == Some('{') => {
                    let end = chars[i..].iter().position(|c| *c == '}').map_or(chars.len(), |p| i + p);
                    self.word.extend(&chars[i..(end + 1).min(chars.len())]);
                    self.started = true;
                    i = end + 1;
                    continue;
                }
                ')' if depth == 0 && nested => {
                    self.boundary();
                    return i + 1;
                }
                ')' => {
                    depth = depth.saturating_sub(1);
                    self.boundary();
                }
                '(' => {
                    depth += 1;
                    self.boundary();
                }
                '#' if !self.started => {
                    while i < chars.len() && chars[i] != '\n' {
                        i += 1;
                    }
                    continue;
                }
                ' ' | '\t' => self.end_word(),
                '\n' | ';' | '&' | '|' | '{' | '}' | '`' => self.boundary(),
                _ => self.push(c),
            }
            i += 1;
        }
        self.end_word();
        chars.len()
    }

    /// Read a double-quoted word's rest from `start`; the index after its closing quote.
    /// Command substitutions in it are code.
    fn double_quoted(&mut self, chars: &[char], start: usize) -> usize {
        let mut i = start;
        self.started = true;
        while i < chars.len() {
            match chars[i] {
                '"' => return i + 1,
                '\\' => {
                    self.word.extend(chars.get(i + 1));
                    i += 2;
                }
                '$' if chars.get(i + 1) == Some(&'(') => {
                    // The quoted word so far belongs to the outer command.
                    let (word, started, at_start) =
                        (std::mem::take(&mut self.word), self.started, std::mem::replace(&mut self.at_start, true));
                    self.started = false;
                    i += 2 + self.code(&chars[i + 2..], true);
                    self.word = word;
                    self.started = started;
                    self.at_start = at_start;
                }
                c => {
                    self.word.push(c);
                    i += 1;
                }
            }
        }
        i
    }
}

/// The programs `script` may run that a build container with the programs `have` lacks
/// (besides a POSIX shell and [`DETACHED_PROGRAMS`]; git, git-lfs and Runway's helper commands
/// are never the build container's): empty when it can run there.
pub fn missing_programs(script: &str, have: &[String]) -> Vec<String> {
    command_words(script)
        .into_iter()
        .filter(|w| {
            let w = w.as_str();
            !(SHELL_WORDS.contains(&w)
                || DETACHED_PROGRAMS.contains(&w)
                || FALLBACK_PROGRAMS.contains(&w)
                || (PROBED_PROGRAMS.contains(&w) && have.iter().any(|h| h == w)))
        })
        .collect()
}

/// Whether predefined stage `name` with `script` can run in a build container with the
/// programs `have` (besides a POSIX shell and [`DETACHED_PROGRAMS`]): it is one of
/// [`SETUP_STAGES`] and every program its script may run is there (git, git-lfs and Runway's
/// helper commands never are: they are the helper's).
pub fn runs_without_helper(name: &str, script: &str, have: &[String]) -> bool {
    SETUP_STAGES.contains(&name) && missing_programs(script, have).is_empty()
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
    fn setup_stages_run_in_the_build_container_when_it_has_what_they_call() {
        let prepare = "export CI_REPOSITORY_URL='http://x/group/project.git'\nread -r RUNWAY_MACHINE 2>/dev/null < /proc/sys/kernel/hostname || RUNWAY_MACHINE=$(hostname 2>/dev/null || uname -n)\necho \"Running on $RUNWAY_MACHINE...\"\n";
        let words = command_words(prepare);
        assert_eq!(
            words.iter().map(String::as_str).collect::<Vec<_>>(),
            ["echo", "export", "hostname", "read", "uname"]
        );
        let have = vec!["uname".to_string(), "find".to_string()];
        assert!(runs_without_helper("prepare_script", prepare, &have));
        assert!(!runs_without_helper("prepare_script", prepare, &[]), "uname is missing");
        let none = "echo 'Skipping Git repository setup'\n[ -d '/builds/g/p' ] || mkdir -p '/builds/g/p'\n";
        assert!(runs_without_helper("get_sources", none, &[]));
        assert!(!runs_without_helper("get_sources", "git init '/builds/g/p'\n", &have));
        let cleanup = "if [ -d x ]; then find x -type f -name '*.lock' -delete; fi\nif [ -f e ]; then : > e; fi\n";
        assert!(runs_without_helper("cleanup_file_variables", cleanup, &have));
        assert!(!runs_without_helper("cleanup_file_variables", cleanup, &[]), "find is missing");
        assert!(!runs_without_helper("restore_cache", "echo nothing\n", &have), "only the setup stages");
        assert!(!runs_without_helper("get_sources", "'/usr/local/bin/runway' cache-extractor\n", &have));
        assert!(!runs_without_helper("get_sources", "FOO=1 2>/dev/null git fetch\n", &have));
        assert!(!runs_without_helper("get_sources", "echo $(curl x)\n", &have), "unknown programs need the helper");
    }

    #[test]
    fn command_words_read_quotes_substitutions_and_evaluated_ansi_c_words() {
        let words = |s: &str| command_words(s).into_iter().collect::<Vec<_>>();
        assert_eq!(
            words("printf '%s\\n' $'\\e[0;m a;b'; echo \"x; y $(uname -n) z\" | tee f"),
            ["echo", "printf", "tee", "uname"]
        );
        let wrapped = format!(
            "set -eo pipefail\ntrap 'exit 1' TERM\neval {} < /dev/null\nexit $?\n",
            runway_shell_quote::ansi_c_quote(
                "export A='x;git'\nprintf '\\x1b[1mSkipping Git\\x1b[0;m\\n'\nif [ -d d ]; then find d -delete; fi\n"
            )
        );
        assert_eq!(words(&wrapped), ["[", "eval", "exit", "export", "fi", "find", "printf", "set", "trap"]);
        assert_eq!(words("${A:-x} 2>/dev/null; X=1 '/usr/local/bin/runway' cache-extractor # git\n"), ["runway"]);
        assert_eq!(words("echo $((1+2)) `date`"), ["date", "echo"]);
        assert_eq!(
            words("case $x in a|b) echo x;; esac; (cd d && ls) ; tail f"),
            ["b", "case", "cd", "echo", "esac", "ls", "tail"]
        );
    }

    #[test]
    fn the_build_probe_says_what_the_image_has() {
        let probe = build_probe("/builds");
        assert!(probe.starts_with("if command -v setsid >/dev/null 2>&1 && command -v tail"));
        assert!(probe.contains("if [ -w '/builds' ]; then echo writable; fi"));
        let parsed = parse_build_probe("detached\nwritable\nhave find\nhave uname\n");
        assert!(parsed.detached && parsed.writable);
        assert_eq!(parsed.programs, ["find", "uname"]);
        assert_eq!(parse_build_probe("have ls\n"), BuildProbe { programs: vec!["ls".into()], ..Default::default() });
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
