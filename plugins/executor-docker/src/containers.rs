//! Stage containers and cleanup. A stage runs in a container named after the job and the stage
//! (predefined stages in the helper image, user stages in the job's image): created stopped,
//! the script uploaded into it, started, followed into the job log, waited for, removed. A
//! container of that name that already ran (the job was resumed) is followed and waited for
//! instead (unless this instance ran that stage itself before: then it is a leftover, and is
//! replaced). Cleanup removes every container and volume labelled with the job, and its network.

use docker_logic::archive::script_archive;
use docker_logic::names;
use docker_logic::spec::{self, ContainerSpec, Role};
use runway_sdk::docker::DockerError;
use runway_sdk::executor::{ExecutorError, StageScript};

use crate::api::executor_error;
use crate::DockerEnv;

/// Run `stage`; its exit code.
pub fn run(env: &DockerEnv, stage: &StageScript) -> Result<i32, ExecutorError> {
    let name = names::stage_container(&env.prefix, &stage.name);
    let what = format!("stage {} (container {name})", stage.name);
    let stale = env.finished.borrow().contains(&name);
    let id = match env.api.inspect_container(&name).map_err(|e| executor_error(e, &what))? {
        // Created but never started (the script may be missing), or left over from an earlier
        // run of this stage by this instance (a retried get_sources): start over.
        Some(found) if stale || found["State"]["Status"].as_str() == Some("created") => {
            let id = found["Id"].as_str().unwrap_or(&name).to_string();
            env.api.remove_container(&id).map_err(|e| executor_error(e, &what))?;
            create(env, stage, &name, &what)?
        }
        Some(found) => found["Id"].as_str().unwrap_or(&name).to_string(),
        None => create(env, stage, &name, &what)?,
    };
    let result = follow_and_wait(env, &id);
    env.finished.borrow_mut().push(name.clone());
    crate::services::debug_logs(env);
    match result {
        Ok(code) => {
            if let Err(e) = env.api.remove_container(&id) {
                runway_sdk::log::warn(&format!("removing container {name}: {}", crate::api::message(&e)));
            }
            Ok(code)
        }
        Err(e) => {
            // Cancelled, timed out, or the engine failed: the stage must not go on running.
            env.api.kill(&id);
            let _ = env.api.remove_container(&id);
            Err(executor_error(e, &what))
        }
    }
}

fn follow_and_wait(env: &DockerEnv, id: &str) -> Result<i32, DockerError> {
    env.api.engine().follow(id, 0)?;
    env.api.wait(id)
}

/// Create stage `stage`'s container with its script in it, and start it; its ID.
fn create(env: &DockerEnv, stage: &StageScript, name: &str, what: &str) -> Result<String, ExecutorError> {
    let state = &env.state;
    let (image, role, entrypoint, user) = if stage.predefined {
        (state.helper_image.clone(), Role::Helper, None, String::new())
    } else {
        (state.image.clone(), Role::Build, state.entrypoint.clone(), state.user.clone())
    };
    let spec = ContainerSpec {
        image,
        cmd: spec::stage_command(),
        entrypoint,
        env: Vec::new(),
        user,
        working_dir: state.builds_dir.clone(),
        labels: names::job_labels(state.job_id, &state.suffix, "stage"),
        binds: state.binds.clone(),
        network: state.network_mode.clone(),
        // GitLab's `build` host name, on the job's own network only.
        aliases: if state.network.is_some() { vec!["build".into()] } else { Vec::new() },
        links: state.links.clone(),
        role,
    };
    let body = spec::create_body(&spec, &env.config);
    let id = env.api.create_container(name, &body).map_err(|e| executor_error(e, what))?;
    let archive = script_archive(stage.script.as_bytes()).map_err(ExecutorError::Other)?;
    let started = env.api.upload(&id, &archive).and_then(|()| env.api.start(&id));
    if let Err(e) = started {
        let _ = env.api.remove_container(&id);
        return Err(executor_error(e, what));
    }
    Ok(id)
}

/// When the job can have a web terminal: a build container (the job's image, user, mounts and
/// network) that idles until cleanup, named to the host as where terminals `exec` a shell.
/// gitlab-runner's terminal attaches to its build container, which lives until cleanup; stage
/// containers here end with their stage, so this one stands in for it.
pub fn keep_for_terminal(env: &DockerEnv) -> Result<(), ExecutorError> {
    if !runway_sdk::terminal::wanted() {
        return Ok(());
    }
    let state = &env.state;
    let name = names::stage_container(&env.prefix, "terminal");
    let what = format!("the web terminal's container {name}");
    let spec = ContainerSpec {
        image: state.image.clone(),
        cmd: spec::terminal_command(),
        entrypoint: state.entrypoint.clone(),
        env: Vec::new(),
        user: state.user.clone(),
        working_dir: state.builds_dir.clone(),
        labels: names::job_labels(state.job_id, &state.suffix, "terminal"),
        binds: state.binds.clone(),
        network: state.network_mode.clone(),
        // Not `build`: that name is the stage container's.
        aliases: Vec::new(),
        links: state.links.clone(),
        role: Role::Build,
    };
    let body = spec::terminal_body(&spec, &env.config);
    let id = env.api.create_container(&name, &body).map_err(|e| executor_error(e, &what))?;
    env.api.start(&id).map_err(|e| executor_error(e, &what))?;
    runway_sdk::terminal::docker_exec(env.api.engine(), &id, &state.user);
    Ok(())
}

/// Remove everything of the job but the cache volumes; tolerant of what is gone already.
pub fn cleanup(env: &DockerEnv) {
    let state = &env.state;
    let filter = names::job_filter(state.job_id, &state.suffix);
    let warn =
        |what: &str, e: DockerError| runway_sdk::log::warn(&format!("cleanup: {what}: {}", crate::api::message(&e)));
    let mut containers = match env.api.list_containers(&filter) {
        Ok(ids) => ids,
        Err(e) => {
            warn("listing the job's containers", e);
            Vec::new()
        }
    };
    // Named ones too, in case labels were lost (a container created by a foreign engine API).
    containers.extend(state.services.iter().map(|s| s.container.clone()));
    for id in &containers {
        if let Err(e) = env.api.remove_container(id) {
            warn(&format!("removing container {id}"), e);
        }
    }
    if let Some(network) = &state.network {
        if let Err(e) = env.api.remove_network(network) {
            warn(&format!("removing network {network}"), e);
        }
    }
    let mut volumes = env.api.list_volumes(&filter).unwrap_or_default();
    if !volumes.contains(&state.build_volume) {
        volumes.push(state.build_volume.clone());
    }
    for volume in &volumes {
        if let Err(e) = env.api.remove_volume(volume) {
            warn(&format!("removing volume {volume}"), e);
        }
    }
}
