//! Services: the config's and the job's, pulled per policy, created on the job's network with
//! their host names (explicit aliases and GitLab's derived ones), started, then waited for: a
//! health-check container in the helper image per service tries its exposed TCP ports until
//! one answers or `wait_for_services_timeout` passes, and a service that does not answer gets
//! GitLab's warning block in the job log (the job goes on). With `CI_DEBUG_SERVICES`, the
//! services' output is copied into the job log, each line prefixed `[service:<aliases>]`, after
//! they start and after every stage (the plugin cannot follow them while a stage runs).

use docker_logic::names;
use docker_logic::policy::check_allowed;
use docker_logic::reference::assign_aliases;
use docker_logic::spec::{self, ContainerSpec, Role};
use docker_logic::state::ServiceState;
use runway_sdk::docker::DockerError;
use runway_sdk::executor::ExecutorError;
use runway_sdk::trace;

use crate::api::{executor_error, message};
use crate::images;
use crate::job::JobContext;
use crate::DockerEnv;

const YELLOW: &str = "\x1b[0;33m";
const GREY: &str = "\x1b[0;37m";
const RESET: &str = "\x1b[0;m";
/// Lines of a service's output shown when it did not start properly.
const LOG_TAIL_LINES: u32 = 100;

/// One service to start.
struct Definition {
    image: String,
    aliases: Vec<String>,
    command: Vec<String>,
    entrypoint: Vec<String>,
    variables: Vec<(String, String)>,
    pull_policies: Vec<String>,
    user: String,
    platform: String,
}

/// The config's services, then the job's (checked against `allowed_services`).
fn definitions(env: &DockerEnv, ctx: &JobContext) -> Result<Vec<Definition>, ExecutorError> {
    let mut out = Vec::new();
    let mut internal = Vec::new();
    for s in &env.config.services {
        let image = ctx.expand(&s.name);
        internal.push(image.clone());
        out.push(Definition {
            image,
            aliases: s.aliases.clone(),
            command: s.command.clone(),
            entrypoint: s.entrypoint.clone(),
            variables: s.variables.clone(),
            pull_policies: Vec::new(),
            user: String::new(),
            platform: String::new(),
        });
    }
    for s in &ctx.services {
        let image = ctx.expand(&s.name);
        check_allowed(&image, "allowed_services", &env.config.allowed_services, &internal)
            .map_err(ExecutorError::InvalidConfig)?;
        out.push(Definition {
            image,
            aliases: s.aliases.iter().flat_map(|a| docker_logic::config::split_aliases(a)).collect(),
            command: s.command.clone(),
            entrypoint: s.entrypoint.clone(),
            variables: s.variables.iter().map(|v| (v.key.clone(), v.value.clone())).collect(),
            pull_policies: s.pull_policies.clone(),
            user: s.user.clone(),
            platform: s.platform.clone(),
        });
    }
    Ok(out)
}

/// Start the job's services and wait for them.
pub fn start(env: &mut DockerEnv, ctx: &JobContext) -> Result<(), ExecutorError> {
    let definitions = definitions(env, ctx)?;
    if let Some(limit) = env.config.services_limit.filter(|limit| definitions.len() > *limit) {
        return Err(ExecutorError::InvalidConfig(format!(
            "too many services requested: {}, only {limit} allowed (services_limit)",
            definitions.len()
        )));
    }
    let named: Vec<(String, Vec<String>)> = definitions.iter().map(|d| (d.image.clone(), d.aliases.clone())).collect();
    let (aliases, warnings) = assign_aliases(&named);
    for warning in &warnings {
        images::warn(warning);
    }
    for ((index, def), mine) in definitions.iter().enumerate().zip(aliases) {
        trace::write_str(&format!("Starting service {} ...\n", def.image));
        let image = images::ensure(&env.api, ctx, &env.config, &def.image, &def.pull_policies, &def.platform)?;
        let name = names::service_container(&env.prefix, index, mine.first().map_or("", String::as_str));
        let mut environment = ctx.service_environment();
        environment.extend(def.variables.iter().map(|(k, v)| format!("{k}={v}")));
        let spec = ContainerSpec {
            image,
            cmd: def.command.clone(),
            entrypoint: (!def.entrypoint.is_empty() && !env.config.disable_entrypoint_overwrite)
                .then(|| def.entrypoint.clone()),
            env: environment,
            user: def.user.clone(),
            working_dir: String::new(),
            labels: names::job_labels(env.state.job_id, &env.state.suffix, "service"),
            binds: env.state.binds.clone(),
            network: env.state.network_mode.clone(),
            aliases: mine.clone(),
            links: Vec::new(),
            role: Role::Service,
        };
        let what = format!("service {} (container {name})", def.image);
        let body = spec::create_body(&spec, &env.config);
        env.api.create_container(&name, &body).map_err(|e| executor_error(e, &what))?;
        env.state.services.push(ServiceState {
            image: def.image.clone(),
            container: name.clone(),
            aliases: mine.clone(),
        });
        env.api.start(&name).map_err(|e| executor_error(e, &what))?;
        if env.state.network_mode == "bridge" {
            env.state.links.extend(mine.iter().map(|alias| format!("{name}:{alias}")));
        }
    }
    let waited = wait(env);
    debug_logs(env);
    waited
}

/// With `CI_DEBUG_SERVICES`: each service's output since the last copy, into the job log,
/// each line prefixed as gitlab-runner does (`[service:<aliases joined by ->] `, in grey).
pub fn debug_logs(env: &DockerEnv) {
    if !env.state.debug_services {
        return;
    }
    let mut copied = env.service_lines.borrow_mut();
    copied.resize(env.state.services.len(), 0);
    for (service, done) in env.state.services.iter().zip(copied.iter_mut()) {
        let logs = match env.api.logs_all(&service.container) {
            Ok(logs) => logs,
            Err(e) => {
                images::warn(&format!("reading the output of service {}: {}", service.container, message(&e)));
                continue;
            }
        };
        let name = service.aliases.join("-");
        let mut block = String::new();
        for line in logs.lines().skip(*done) {
            block.push_str(&format!("{GREY}[service:{name}] {line}{RESET}\n"));
            *done += 1;
        }
        if !block.is_empty() {
            trace::write_str(&block);
        }
    }
}

/// Wait for every service with exposed TCP ports, all at once, up to the timeout.
fn wait(env: &DockerEnv) -> Result<(), ExecutorError> {
    let Some(timeout) = env.config.services_timeout() else { return Ok(()) };
    if env.state.services.is_empty() {
        return Ok(());
    }
    trace::write_str(&format!("Waiting for services to be up and running (timeout {timeout} seconds)...\n"));
    let mut checks = Vec::new();
    for service in &env.state.services {
        match start_check(env, service, timeout) {
            Ok(Some(id)) => checks.push((service, id)),
            Ok(None) => {}
            Err(DockerError::Canceled) => return Err(ExecutorError::Canceled),
            Err(e) => {
                warning(env, service, &format!("service \"{}\" health check: {}", service.container, message(&e)), None)
            }
        }
    }
    let mut canceled = false;
    for (service, id) in &checks {
        let check = names::wait_container(&service.container);
        match env.api.wait(id) {
            Ok(0) => {}
            Ok(_) => warning(env, service, &format!("service \"{check}\" timeout"), Some(id)),
            Err(DockerError::Canceled) => canceled = true,
            Err(e) => warning(env, service, &format!("service \"{check}\" health check: {}", message(&e)), Some(id)),
        }
        let _ = env.api.remove_container(id);
        if canceled {
            return Err(ExecutorError::Canceled);
        }
    }
    Ok(())
}

/// Create and start the health check of `service`; `None` when it exposes no TCP port.
fn start_check(env: &DockerEnv, service: &ServiceState, timeout: u64) -> Result<Option<String>, DockerError> {
    let Some(inspect) = env.api.inspect_container(&service.container)? else {
        return Err(DockerError::Other(format!("container {} is gone", service.container)));
    };
    let ports = spec::exposed_tcp_ports(&inspect);
    if ports.is_empty() {
        return Ok(None);
    }
    let host = match env.state.network_mode.as_str() {
        "host" => "127.0.0.1".to_string(),
        _ => service.aliases.first().cloned().unwrap_or_else(|| service.container.clone()),
    };
    let links = if env.state.network_mode == "bridge" {
        service.aliases.iter().map(|a| format!("{}:{a}", service.container)).collect()
    } else {
        Vec::new()
    };
    let (cmd, environment) = spec::wait_command(&host, &ports, timeout);
    let spec = ContainerSpec {
        image: env.state.helper_image.clone(),
        cmd,
        entrypoint: None,
        env: environment,
        user: String::new(),
        working_dir: String::new(),
        labels: names::job_labels(env.state.job_id, &env.state.suffix, "wait"),
        binds: Vec::new(),
        network: env.state.network_mode.clone(),
        aliases: Vec::new(),
        links,
        role: Role::Wait,
    };
    let id =
        env.api.create_container(&names::wait_container(&service.container), &spec::create_body(&spec, &env.config))?;
    env.api.start(&id)?;
    Ok(Some(id))
}

/// GitLab's block for a service that probably did not start, with its output's tail.
fn warning(env: &DockerEnv, service: &ServiceState, error: &str, check: Option<&String>) {
    let mut block = format!(
        "\n{YELLOW}*** WARNING:{RESET} Service {} probably didn't start properly.\n\nHealth check error:\n{}\n",
        service.container,
        error.trim()
    );
    if let Some(id) = check {
        let logs = env.api.logs_tail(id, LOG_TAIL_LINES).unwrap_or_default();
        block.push_str(&format!("\nHealth check container logs:\n{}\n", logs.trim_end()));
    }
    let logs = env.api.logs_tail(&service.container, LOG_TAIL_LINES).unwrap_or_else(|e| message(&e));
    block.push_str(&format!("\nService container logs:\n{}\n\n{YELLOW}*********{RESET}\n\n", logs.trim_end()));
    trace::write_str(&block);
}
