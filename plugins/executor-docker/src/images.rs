//! Getting an image onto the engine as the pull policies say (GitLab's order and messages):
//! `never` inspects only, `if-not-present` inspects then pulls, `always` pulls; a failed
//! policy falls back to the next one. Chooses the registry credentials for the pull. With
//! `docker: platform:` a local image of another platform counts as absent and the pull asks
//! the engine for that platform (`platform` query of `POST /images/create`). Does not create
//! containers.

use docker_logic::auth::{self, JobCredential};
use docker_logic::platform::{self, Platform};
use docker_logic::policy::{effective_pull_policies, PullPolicy};
use docker_logic::reference::{pull_reference, validate_reference};
use runway_sdk::docker::{query_escape, DockerError, RegistryAuth};
use runway_sdk::executor::ExecutorError;
use runway_sdk::trace;
use serde_json::Value;

use crate::api::{executor_error, message, Api};
use crate::job::JobContext;

const YELLOW: &str = "\x1b[0;33m";
const RESET: &str = "\x1b[0;m";

/// A warning line in the job log, as GitLab colours it.
pub fn warn(text: &str) {
    trace::write_str(&format!("{YELLOW}WARNING: {text}{RESET}\n"));
}

/// Why one policy did not give the image.
enum Failure {
    /// Try the next policy.
    Next(String),
    /// Stop: the engine is gone, the job was cancelled, the grant is missing.
    Stop(ExecutorError),
}

fn stop_or_next(e: DockerError, what: &str) -> Failure {
    match e {
        DockerError::Api(_) | DockerError::Other(_) | DockerError::TooLarge(_) => Failure::Next(message(&e)),
        other => Failure::Stop(executor_error(other, what)),
    }
}

/// Make sure the engine has `image` (as the job or config names it), following `policies`
/// (already effective). Returns the image's ID.
pub fn ensure_with(
    api: &Api,
    job: &JobContext,
    image: &str,
    policies: &[PullPolicy],
    platform: Option<&Platform>,
) -> Result<String, ExecutorError> {
    validate_reference(image).map_err(ExecutorError::InvalidConfig)?;
    let mut last = String::new();
    for (index, policy) in policies.iter().enumerate() {
        if index > 0 {
            trace::write_str(&format!("Attempt #{}: Trying \"{policy}\" pull policy\n", index + 1));
        }
        match with_policy(api, job, image, *policy, platform) {
            Ok(inspect) => {
                let id = inspect["Id"].as_str().unwrap_or(image).to_string();
                let seen = job.used_images.borrow_mut().insert(image.to_string(), id.clone());
                if id != image && seen.as_deref() != Some(id.as_str()) {
                    match inspect["RepoDigests"].as_array().and_then(|d| d.first()).and_then(Value::as_str) {
                        Some(digest) => {
                            trace::write_str(&format!("Using docker image {id} for {image} with digest {digest} ...\n"))
                        }
                        None => trace::write_str(&format!("Using docker image {id} for {image} ...\n")),
                    }
                }
                return Ok(id);
            }
            Err(Failure::Stop(e)) => return Err(e),
            Err(Failure::Next(e)) => {
                warn(&format!("Failed to pull image with policy \"{policy}\": {e}"));
                last = e;
            }
        }
    }
    let names: Vec<&str> = policies.iter().map(|p| p.as_str()).collect();
    Err(ExecutorError::Other(format!(
        "failed to pull image \"{image}\" with specified policies [{}]: {last}",
        names.join(" ")
    )))
}

/// [`ensure_with`] the policies the job (`job_policies`) and the runner's config allow, for
/// the job's `docker: platform:` (`platform`, empty: the engine's own).
pub fn ensure(
    api: &Api,
    job: &JobContext,
    config: &docker_logic::config::DockerConfig,
    image: &str,
    job_policies: &[String],
    platform: &str,
) -> Result<String, ExecutorError> {
    let platform = match platform.trim() {
        "" => None,
        raw => Some(platform::parse(raw).map_err(ExecutorError::InvalidConfig)?),
    };
    let policies = effective_pull_policies(image, job_policies, &config.pull_policy, &config.allowed_pull_policies)
        .map_err(ExecutorError::InvalidConfig)?;
    let names: Vec<&str> = policies.iter().map(|p| p.as_str()).collect();
    trace::write_str(&format!("Using effective pull policy of [{}] for container {image}\n", names.join(" ")));
    ensure_with(api, job, image, &policies, platform.as_ref())
}

fn with_policy(
    api: &Api,
    job: &JobContext,
    image: &str,
    policy: PullPolicy,
    platform: Option<&Platform>,
) -> Result<Value, Failure> {
    let what = format!("inspecting image {image}");
    let mut existing = api.inspect_image(image).map_err(|e| stop_or_next(e, &what))?;
    let mut other_platform = None;
    if let (Some(wanted), Some(found)) = (platform, existing.as_ref()) {
        if !wanted.matches(found) {
            other_platform = Some(platform::of_image(found));
            existing = None;
        }
    }
    // Already made present for this job (a second service of the same image): not pulled again.
    if let Some(found) = existing.as_ref().filter(|f| {
        f["Id"].as_str().is_some_and(|id| job.used_images.borrow().get(image).is_some_and(|used| used == id))
    }) {
        return Ok(found.clone());
    }
    match (policy, existing) {
        (PullPolicy::Never, Some(found)) => return Ok(found),
        (PullPolicy::Never, None) => {
            return Err(Failure::Next(match (other_platform, platform) {
                (Some(found), Some(wanted)) => format!(
                    "image \"{image}\" is present on the Docker engine for {found}, not for platform {}, and pull_policy is never",
                    wanted.as_query()
                ),
                _ => format!("image \"{image}\" is not present on the Docker engine and pull_policy is never"),
            }))
        }
        (PullPolicy::IfNotPresent, Some(found)) => {
            trace::write_str("Using locally found image version due to \"if-not-present\" pull policy\n");
            return Ok(found);
        }
        // An image named by its ID is never pulled.
        (PullPolicy::Always, Some(found)) if found["Id"].as_str() == Some(image) => return Ok(found),
        _ => {}
    }
    let credential = credential_for(job, image);
    trace::write_str(&format!("Pulling docker image {image} ...\n"));
    let reference = pull_reference(image);
    let pulling = format!("pulling image {image}");
    match platform {
        None => api.pull(&reference, credential.as_ref()).map_err(|e| stop_or_next(e, &pulling))?,
        Some(wanted) if credential.is_some() => {
            return Err(Failure::Stop(ExecutorError::InvalidConfig(format!(
                "image \"{image}\" with docker: platform: {} needs registry credentials, which this runner \
                 cannot send with a platform-specific pull; make the image present on the engine \
                 (pull_policy if-not-present) or remove platform:",
                wanted.as_query()
            ))))
        }
        Some(wanted) => pull_platform(api, &reference, wanted).map_err(|e| stop_or_next(e, &pulling))?,
    }
    match api.inspect_image(image).map_err(|e| stop_or_next(e, &what))? {
        Some(found) if platform.is_some_and(|wanted| !wanted.matches(&found)) => Err(Failure::Next(format!(
            "image \"{image}\" pulled for platform {} is for {}",
            platform.map(Platform::as_query).unwrap_or_default(),
            platform::of_image(&found)
        ))),
        Some(found) => Ok(found),
        None => Err(Failure::Next(format!("image \"{image}\" is not on the engine after pulling it"))),
    }
}

/// `POST /images/create?fromImage=…&tag=…&platform=…` read to its end: an error in the
/// progress stream (the engine answers 200 and reports failures inside it) is an error.
fn pull_platform(api: &Api, reference: &str, platform: &Platform) -> Result<(), DockerError> {
    let (name, tag, digest) = docker_logic::reference::split_reference(reference);
    let mut path = if digest.is_empty() {
        format!("/images/create?fromImage={}&tag={}", query_escape(name), query_escape(tag))
    } else {
        format!("/images/create?fromImage={}", query_escape(reference))
    };
    path.push_str(&format!("&platform={}", query_escape(&platform.as_query())));
    let body = api.post_raw(&path)?;
    for line in String::from_utf8_lossy(&body).lines() {
        let Ok(event) = serde_json::from_str::<Value>(line) else { continue };
        if let Some(error) = event["error"].as_str().or_else(|| event["errorDetail"]["message"].as_str()) {
            return Err(DockerError::Other(error.to_string()));
        }
    }
    Ok(())
}

/// The credentials to pull `image` with, announcing their source in the job log.
fn credential_for(job: &JobContext, image: &str) -> Option<RegistryAuth> {
    let credentials: Vec<JobCredential<'_>> = job
        .credentials
        .iter()
        .map(|c| JobCredential { url: &c.url, username: &c.username, password: &c.password })
        .collect();
    let resolved = auth::resolve(image, job.variable("DOCKER_AUTH_CONFIG"), &credentials);
    for warning in &resolved.warnings {
        warn(warning);
    }
    let credential = resolved.credential?;
    trace::write_str(&format!("Authenticating with credentials from {}\n", credential.source));
    Some(RegistryAuth {
        username: credential.username,
        password: credential.password,
        server_address: credential.server_address,
    })
}
