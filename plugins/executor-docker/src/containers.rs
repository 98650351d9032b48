//! The job's containers and cleanup. A job has one long-lived build container (the job's
//! image, entrypoint, user, mounts and network, host name `build`), created by `prepare`, and —
//! only once a predefined stage needs it — one long-lived helper container (the helper image);
//! both idle ([`spec::idle_command`]) until cleanup. A stage runs detached in the right one by
//! `exec` (`runway:host/docker-stages`), its output in a log file there that the host follows
//! into the job log, so a resumed job attaches to a stage still running instead of starting it
//! again. The setup stages that call only what the build container has (`prepare_script`,
//! `get_sources` with `GIT_STRATEGY: none`, `cleanup_file_variables` without git;
//! [`programs::runs_without_helper`]) run in it when its user may write the builds directory: a
//! job without git, cache or artifacts makes one container. The web terminal `exec`s its shell in the
//! build container.
//!
//! An image without the programs detached stages need ([`programs::DETACHED_PROGRAMS`]) runs
//! each of the job's own stages in a container of its own instead, as before: created
//! stopped, the script uploaded into it, started, followed, waited for, removed; one of that
//! name that already ran (the job was resumed) is followed and waited for instead (unless this
//! instance ran that stage itself: then it is a leftover, and is replaced). Cleanup removes
//! every container and volume labelled with the job, and its network.

use docker_logic::archive::script_archive;
use docker_logic::names;
use docker_logic::programs;
use docker_logic::spec::{self, ContainerSpec, Role};
use remote_stages::working_dir;
use runway_sdk::docker::DockerError;
use runway_sdk::docker_stages;
use runway_sdk::executor::{ExecutorError, StageScript};

use crate::api::executor_error;
use crate::DockerEnv;

/// The name of the job's long-lived build container.
pub fn build_name(prefix: &str) -> String {
    names::stage_container(prefix, "build")
}

/// The name of the job's long-lived helper container.
pub fn helper_name(prefix: &str) -> String {
    names::stage_container(prefix, "helper")
}

/// The spec of a long-lived container: the build container (the job's image, entrypoint and
/// user, GitLab's `build` host name on the job's own network) or the helper container.
fn long_lived_spec(env: &DockerEnv, role: Role) -> ContainerSpec {
    let state = &env.state;
    let build = role == Role::Build;
    ContainerSpec {
        image: if build { state.image.clone() } else { state.helper_image.clone() },
        cmd: spec::idle_command(),
        entrypoint: if build { state.entrypoint.clone() } else { None },
        env: Vec::new(),
        user: if build { state.user.clone() } else { String::new() },
        working_dir: state.builds_dir.clone(),
        labels: names::job_labels(state.job_id, &state.suffix, if build { "build" } else { "helper" }),
        binds: state.binds.clone(),
        network: state.network_mode.clone(),
        aliases: if build && state.network.is_some() { vec!["build".into()] } else { Vec::new() },
        links: state.links.clone(),
        role,
    }
}

/// The running long-lived container `name` (created and started when missing, replaced when
/// it stopped); its ID.
fn ensure_running(env: &DockerEnv, name: &str, role: Role) -> Result<String, ExecutorError> {
    let what = format!("container {name}");
    if let Some(found) = env.api.inspect_container(name).map_err(|e| executor_error(e, &what))? {
        let id = found["Id"].as_str().unwrap_or(name).to_string();
        if found["State"]["Running"].as_bool() == Some(true) {
            return Ok(id);
        }
        env.api.remove_container(&id).map_err(|e| executor_error(e, &what))?;
    }
    let body = spec::terminal_body(&long_lived_spec(env, role), &env.config);
    let id = env.api.create_container(name, &body).map_err(|e| executor_error(e, &what))?;
    env.api.start(&id).map_err(|e| executor_error(e, &what))?;
    Ok(id)
}

/// `prepare`: the build container, started. Stages run detached in it when its image has the
/// programs for that; otherwise it stays only for a web terminal. The terminal, when the job
/// can have one, execs its shell there.
pub fn start_build(env: &mut DockerEnv) -> Result<(), ExecutorError> {
    let name = build_name(&env.prefix);
    let id = ensure_running(env, &name, Role::Build)?;
    // One exec: can stages run detached here, and may its user write the builds directory
    // (then the setup stages that need only a shell run here too, no helper container)?
    let probe = programs::build_probe(&env.state.builds_dir);
    let answer = match docker_stages::run_captured(env.api.engine(), &id, &probe, None, 4096) {
        Ok(output) => String::from_utf8_lossy(&output.stdout).into_owned(),
        Err(e) => {
            runway_sdk::log::warn(&format!("probing container {name}: {}", crate::api::message(&e)));
            String::new()
        }
    };
    let probe = programs::parse_build_probe(&answer);
    let terminal = runway_sdk::terminal::wanted();
    if probe.detached {
        env.state.build_container = name;
        env.state.build_runs_setup = probe.writable;
        env.state.build_programs = probe.programs;
    } else {
        runway_sdk::log::info(&format!(
            "image {} lacks a program detached stages need ({}): each of the job's stages runs in a container of its own",
            env.state.image,
            programs::DETACHED_PROGRAMS.join(", ")
        ));
        if !terminal {
            let _ = env.api.remove_container(&id);
            return Ok(());
        }
    }
    if terminal {
        runway_sdk::terminal::docker_exec(env.api.engine(), &id, &env.state.user);
    }
    Ok(())
}

/// Run `stage`; its exit code.
pub fn run(env: &DockerEnv, stage: &StageScript) -> Result<i32, ExecutorError> {
    let build = &env.state.build_container;
    let in_build = !build.is_empty() && (!stage.predefined || setup_in_build(env, stage));
    let result = if in_build {
        run_detached(env, stage, build, &format!("stage {} (container {build})", stage.name))
    } else if stage.predefined {
        let name = helper_name(&env.prefix);
        let id = {
            let known = env.helper.borrow().clone();
            match known {
                Some(id) => id,
                None => {
                    let id = ensure_running(env, &name, Role::Helper)?;
                    *env.helper.borrow_mut() = Some(id.clone());
                    id
                }
            }
        };
        run_detached(env, stage, &id, &format!("stage {} (container {name})", stage.name))
    } else {
        run_in_own_container(env, stage)
    };
    crate::services::debug_logs(env);
    result
}

/// Whether predefined stage `stage` runs in the build container (see
/// [`programs::runs_without_helper`]); says why not in the runner's log.
fn setup_in_build(env: &DockerEnv, stage: &StageScript) -> bool {
    if !env.state.build_runs_setup
        || !programs::runs_without_helper(&stage.name, &stage.script, &env.state.build_programs)
    {
        let missing = programs::missing_programs(&stage.script, &env.state.build_programs);
        runway_sdk::log::info(&format!(
            "stage {} runs in the helper container (the build container may write {}: {}; its script calls {})",
            stage.name,
            env.state.builds_dir,
            env.state.build_runs_setup,
            missing.join(", ")
        ));
        return false;
    }
    true
}

/// Run `stage` detached in the running `container` and follow it (only follow it when a
/// runner before this one started it).
fn run_detached(env: &DockerEnv, stage: &StageScript, container: &str, what: &str) -> Result<i32, ExecutorError> {
    let engine = env.api.engine();
    let error = |e: DockerError| executor_error(e, what);
    let files = env.stages.next_checked(&stage.name, |log| {
        let probe = docker_stages::run_captured(
            engine,
            container,
            &format!("[ -e {} ]", runway_sdk::remote::quote(log)),
            None,
            64,
        )
        .map_err(error)?;
        Ok(probe.status.code == 0)
    })?;
    if !files.started {
        let cwd = working_dir(&stage.name, &env.state.project_dir, &env.state.builds_dir);
        docker_stages::start_detached(
            engine,
            container,
            &spec::stage_exec_command(cwd),
            stage.script.as_bytes(),
            &files.log,
            &files.exit,
        )
        .map_err(error)?;
    }
    let status = docker_stages::attach(engine, container, &files.log, &files.exit, 0).map_err(error)?;
    Ok(status.code)
}

/// Run `stage` in a container of its own (an image without the programs detached stages
/// need).
fn run_in_own_container(env: &DockerEnv, stage: &StageScript) -> Result<i32, ExecutorError> {
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

/// Create the container of the job's own stage `stage` with its script in it, and start it;
/// its ID.
fn create(env: &DockerEnv, stage: &StageScript, name: &str, what: &str) -> Result<String, ExecutorError> {
    let state = &env.state;
    let spec = ContainerSpec {
        image: state.image.clone(),
        cmd: spec::stage_command(),
        entrypoint: state.entrypoint.clone(),
        env: Vec::new(),
        user: state.user.clone(),
        working_dir: state.builds_dir.clone(),
        labels: names::job_labels(state.job_id, &state.suffix, "stage"),
        binds: state.binds.clone(),
        network: state.network_mode.clone(),
        // GitLab's `build` host name, on the job's own network only.
        aliases: if state.network.is_some() { vec!["build".into()] } else { Vec::new() },
        links: state.links.clone(),
        role: Role::Build,
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
