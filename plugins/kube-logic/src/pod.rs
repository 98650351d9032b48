//! The job's Pod object, whole: metadata (name, namespace, gitlab-runner's and Runway's labels
//! and annotations) and spec (the `build`, `helper` and `svc-N` containers with their images,
//! pull policies, commands, environment, resources, mounts and security contexts; volumes,
//! host aliases for the services, node selection, tolerations, affinity, DNS, service
//! account, grace period, scheduler, runtime and priority classes, pull secrets). Checks the
//! allow-lists and pull policies on the way. Builds JSON only, in the Pod API's spelling;
//! sends nothing.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::config::{KubeConfig, ResourceValues};
use crate::names::{self, JobMeta, BUILD_CONTAINER, HELPER_CONTAINER};
use crate::overwrites::{self, Overwrites, Resources};
use crate::pull;
use crate::security::{container_security_context, pod_security_context};
use crate::volumes::{self, Dirs};

/// An image the job (or the config) asks for, with GitLab's per-image options.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageInput {
    /// Image reference (`$VARS` are expanded).
    pub name: String,
    /// `entrypoint:` (services: the container's `command`).
    pub entrypoint: Vec<String>,
    /// `command:` (services: the container's `args`).
    pub command: Vec<String>,
    /// `alias:` host names (services).
    pub aliases: Vec<String>,
    /// `variables:` (services: added to the container's environment).
    pub variables: Vec<(String, String)>,
    /// `pull_policy:` in GitLab's spelling.
    pub pull_policies: Vec<String>,
}

/// Everything about the job the pod depends on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInputs {
    /// Job, project and runner identity (names and labels).
    pub meta: JobMeta,
    /// Random number for the pod name's suffix.
    pub random: u64,
    /// The job's image (`name` empty: `[runners.kubernetes] image`).
    pub image: ImageInput,
    /// Runway's helper image (used unless `helper_image` is configured).
    pub helper_image: String,
    /// The job's services (the config's come first, from the config).
    pub services: Vec<ImageInput>,
    /// Builds directory in the containers.
    pub builds_dir: String,
    /// Cache directory in the containers (empty: none).
    pub cache_dir: String,
    /// Directory for the stage scripts in `build` and `helper`.
    pub stages_dir: String,
    /// The job's shell (`bash`, `sh`, `pwsh`).
    pub shell: String,
    /// The job's public variables (environment of `build` and services, `$VAR` expansion).
    pub variables: Vec<(String, String)>,
    /// Secrets the plugin created for the job's registry credentials (after the config's).
    pub image_pull_secrets: Vec<String>,
    /// Pod attempt (0 first): which of several pull policies applies.
    pub pull_attempt: usize,
}

/// What `build` and `helper` run: nothing but staying alive; exits 0 promptly on SIGTERM.
pub fn keep_alive_command(shell: &str) -> Vec<String> {
    match shell {
        "pwsh" | "powershell" => vec![
            shell.to_string(),
            "-NoLogo".into(),
            "-NoProfile".into(),
            "-Command".into(),
            "while ($true) { Start-Sleep -Seconds 1 }".into(),
        ],
        _ => vec!["sh".into(), "-c".into(), "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done".into()],
    }
}

/// The job's services, config services first, image names (and the config's aliases) `$VARS` expanded.
pub fn services(config: &KubeConfig, inputs: &PodInputs) -> Vec<ImageInput> {
    let expand = expander(&inputs.variables);
    // gitlab-runner expands the name and alias of configured services per job.
    let configured = config.services.iter().map(|s| ImageInput {
        name: s.name.clone(),
        entrypoint: s.entrypoint.clone(),
        command: s.command.clone(),
        aliases: s.aliases.iter().flat_map(|a| docker_logic::config::split_aliases(&expand(a))).collect(),
        variables: s.variables.clone(),
        pull_policies: Vec::new(),
    });
    configured
        .chain(inputs.services.iter().cloned())
        .map(|mut s| {
            s.name = expand(&s.name);
            s
        })
        .collect()
}

fn expander(variables: &[(String, String)]) -> impl Fn(&str) -> String + '_ {
    move |text: &str| {
        docker_logic::reference::expand(text, |name| {
            variables.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
    }
}

/// Build the Pod object. Errors (a configuration error of the job): an image or service not
/// allowed, a pull policy not allowed, an invalid service alias, a service overwrite beyond
/// the config's limits, two volumes with one name.
pub fn build(config: &KubeConfig, overwrites: &Overwrites, inputs: &PodInputs) -> Result<Value, String> {
    let expand = expander(&inputs.variables);
    let image = match inputs.image.name.trim() {
        "" => expand(&config.image),
        name => expand(name),
    };
    if image.is_empty() {
        return Err("the job has no image and [runners.kubernetes] image is not set".into());
    }
    let helper_image =
        if config.helper_image.is_empty() { inputs.helper_image.clone() } else { expand(&config.helper_image) };
    let internal = [expand(&config.image), helper_image.clone()];
    docker_logic::policy::check_allowed(&image, "allowed_images", &config.allowed_images, &internal)?;
    let services = services(config, inputs);
    for service in services.iter().skip(config.services.len()) {
        docker_logic::policy::check_allowed(&service.name, "allowed_services", &config.allowed_services, &internal)?;
    }

    let volume_plan = volumes::plan(
        config,
        Dirs { builds_dir: &inputs.builds_dir, cache_dir: &inputs.cache_dir, stages_dir: &inputs.stages_dir },
        &expand,
    )?;
    let lifecycle = serde_json::to_value(&config.container_lifecycle).unwrap_or_default();
    let lifecycle = (lifecycle != json!({})).then_some(lifecycle);
    let job_policies = pull::effective(config, BUILD_CONTAINER, &inputs.image.pull_policies)?;
    let helper_policies = pull::effective(config, HELPER_CONTAINER, &inputs.image.pull_policies)?;
    let env = env_vars(&inputs.variables);
    let common = Common { mounts: &volume_plan.mounts, lifecycle: &lifecycle, attempt: inputs.pull_attempt };

    let mut containers = vec![
        common.container(
            BUILD_CONTAINER,
            &image,
            &job_policies,
            (keep_alive_command(&inputs.shell), Vec::new()),
            env,
            &overwrites.build,
            container_security_context(config, &config.build_container_security_context),
        ),
        common.container(
            HELPER_CONTAINER,
            &helper_image,
            &helper_policies,
            (keep_alive_command("sh"), Vec::new()),
            Vec::new(),
            &overwrites.helper,
            container_security_context(config, &config.helper_container_security_context),
        ),
    ];
    for (index, service) in services.iter().enumerate() {
        let name = names::service_container(index);
        let policies = pull::effective(config, &name, &service.pull_policies)?;
        let resources = overwrites::service_resources(config, overwrites, &service.name, &service.variables)?;
        let mut variables = inputs.variables.clone();
        variables.extend(service.variables.iter().cloned());
        let expanded: Vec<(String, String)> = {
            let expand = expander(&variables);
            variables.iter().map(|(k, v)| (k.clone(), expand(v))).collect()
        };
        containers.push(common.container(
            &name,
            &service.name,
            &policies,
            (service.entrypoint.clone(), service.command.clone()),
            env_vars(&expanded),
            &resources,
            container_security_context(config, &config.service_container_security_context),
        ));
    }

    let mut spec = Map::new();
    spec.insert("containers".into(), Value::Array(containers));
    spec.insert("restartPolicy".into(), json!("Never"));
    spec.insert("volumes".into(), Value::Array(volume_plan.volumes));
    let host_aliases = host_aliases(config, &services)?;
    if !host_aliases.is_empty() {
        spec.insert("hostAliases".into(), Value::Array(host_aliases));
    }
    spec.insert("dnsPolicy".into(), json!(config.dns_policy.unwrap_or("ClusterFirst")));
    let dns_config = serde_json::to_value(&config.dns_config).unwrap_or_default();
    if dns_config != json!({}) {
        spec.insert("dnsConfig".into(), dns_config);
    }
    if !overwrites.node_selector.is_empty() {
        spec.insert("nodeSelector".into(), json!(overwrites.node_selector));
    }
    let tolerations = tolerations(&overwrites.node_tolerations);
    if !tolerations.is_empty() {
        spec.insert("tolerations".into(), Value::Array(tolerations));
    }
    let affinity = serde_json::to_value(&config.affinity).unwrap_or_default();
    if affinity != json!({}) {
        spec.insert("affinity".into(), affinity);
    }
    if let Some(context) = pod_security_context(&config.pod_security_context) {
        spec.insert("securityContext".into(), context);
    }
    for (key, value) in [
        ("serviceAccountName", &overwrites.service_account),
        ("schedulerName", &config.scheduler_name),
        ("runtimeClassName", &config.runtime_class_name),
        ("priorityClassName", &config.priority_class_name),
    ] {
        if !value.is_empty() {
            spec.insert(key.into(), json!(value));
        }
    }
    if let Some(automount) = config.automount_service_account_token {
        spec.insert("automountServiceAccountToken".into(), json!(automount));
    }
    if let Some(grace) = config.pod_termination_grace_period_seconds {
        spec.insert("terminationGracePeriodSeconds".into(), json!(grace));
    }
    if let Some(resources) = resources_json(&overwrites.pod) {
        spec.insert("resources".into(), resources);
    }
    if !config.use_service_account_image_pull_secrets {
        let secrets: Vec<Value> = config
            .image_pull_secrets
            .iter()
            .chain(&inputs.image_pull_secrets)
            .map(|name| json!({ "name": name }))
            .collect();
        if !secrets.is_empty() {
            spec.insert("imagePullSecrets".into(), Value::Array(secrets));
        }
    }

    Ok(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": names::pod_name(&inputs.meta, inputs.random),
            "namespace": overwrites.namespace,
            "labels": labels(overwrites, inputs, &expand),
            "annotations": annotations(overwrites, inputs, &expand),
        },
        "spec": Value::Object(spec),
    }))
}

/// gitlab-runner's labels, then the configured and overwritten ones (expanded, sanitized; keys
/// in gitlab-runner's namespace or Runway's are not overwritten).
fn labels(overwrites: &Overwrites, inputs: &PodInputs, expand: &dyn Fn(&str) -> String) -> BTreeMap<String, String> {
    let mut labels = names::job_labels(&inputs.meta, &inputs.variables);
    for (key, value) in &overwrites.pod_labels {
        if names::is_reserved_label(key) || key.starts_with("runway/") {
            continue;
        }
        labels.insert(key.clone(), names::sanitize_label(&expand(value)));
    }
    labels
}

fn annotations(
    overwrites: &Overwrites,
    inputs: &PodInputs,
    expand: &dyn Fn(&str) -> String,
) -> BTreeMap<String, String> {
    let mut annotations = names::job_annotations(&inputs.meta, &inputs.variables);
    for (key, value) in &overwrites.pod_annotations {
        annotations.insert(key.clone(), expand(value));
    }
    annotations
}

/// Settings shared by every container.
struct Common<'a> {
    mounts: &'a [Value],
    lifecycle: &'a Option<Value>,
    attempt: usize,
}

impl Common<'_> {
    #[allow(clippy::too_many_arguments)]
    fn container(
        &self,
        name: &str,
        image: &str,
        policies: &[pull::Policy],
        (command, args): (Vec<String>, Vec<String>),
        env: Vec<Value>,
        resources: &Resources,
        security_context: Value,
    ) -> Value {
        let mut c = Map::new();
        c.insert("name".into(), json!(name));
        c.insert("image".into(), json!(image));
        if let Some(policy) = pull::for_attempt(policies, self.attempt) {
            c.insert("imagePullPolicy".into(), json!(policy.as_api()));
        }
        if !command.is_empty() {
            c.insert("command".into(), json!(command));
        }
        if !args.is_empty() {
            c.insert("args".into(), json!(args));
        }
        if !env.is_empty() {
            c.insert("env".into(), Value::Array(env));
        }
        if let Some(resources) = resources_json(resources) {
            c.insert("resources".into(), resources);
        }
        c.insert("volumeMounts".into(), Value::Array(self.mounts.to_vec()));
        c.insert("securityContext".into(), security_context);
        if let Some(lifecycle) = self.lifecycle {
            c.insert("lifecycle".into(), lifecycle.clone());
        }
        Value::Object(c)
    }
}

fn resource_list(values: &ResourceValues) -> Option<Value> {
    let mut list = Map::new();
    for (key, value) in
        [("cpu", &values.cpu), ("memory", &values.memory), ("ephemeral-storage", &values.ephemeral_storage)]
    {
        if !value.is_empty() {
            list.insert(key.into(), json!(value));
        }
    }
    (!list.is_empty()).then_some(Value::Object(list))
}

fn resources_json(resources: &Resources) -> Option<Value> {
    let mut out = Map::new();
    if let Some(limits) = resource_list(&resources.limits) {
        out.insert("limits".into(), limits);
    }
    if let Some(requests) = resource_list(&resources.requests) {
        out.insert("requests".into(), requests);
    }
    (!out.is_empty()).then_some(Value::Object(out))
}

/// gitlab-runner's `buildVariables`: one entry per name (the last wins, at the first's place),
/// `$` doubled so the kubelet does not apply `$(VAR)` substitution.
fn env_vars(variables: &[(String, String)]) -> Vec<Value> {
    let mut order: Vec<&str> = Vec::new();
    let mut values: BTreeMap<&str, &str> = BTreeMap::new();
    for (key, value) in variables {
        if !values.contains_key(key.as_str()) {
            order.push(key);
        }
        values.insert(key, value);
    }
    order.iter().map(|k| json!({ "name": k, "value": values[k].replace('$', "$$") })).collect()
}

/// gitlab-runner's tolerations from `key[=value]` → effect.
fn tolerations(map: &BTreeMap<String, String>) -> Vec<Value> {
    map.iter()
        .map(|(key_value, effect)| {
            let mut t = Map::new();
            match key_value.split_once('=') {
                Some((key, value)) => {
                    t.insert("key".into(), json!(key));
                    t.insert("operator".into(), json!("Equal"));
                    t.insert("value".into(), json!(value));
                }
                None => {
                    if !key_value.is_empty() {
                        t.insert("key".into(), json!(key_value));
                    }
                    t.insert("operator".into(), json!("Exists"));
                }
            }
            if !effect.is_empty() {
                t.insert("effect".into(), json!(effect));
            }
            Value::Object(t)
        })
        .collect()
}

/// Whether `name` is a DNS-1123 subdomain (what the Pod API accepts as a host alias).
pub fn is_dns1123_subdomain(name: &str) -> bool {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    !name.is_empty() && name.len() <= 253 && name.split('.').all(label_ok)
}

/// gitlab-runner's host aliases: one 127.0.0.1 entry with every service's names (the
/// image-derived ones that are valid DNS names, then the explicit aliases, which must be),
/// then `host_aliases` from the config.
fn host_aliases(config: &KubeConfig, services: &[ImageInput]) -> Result<Vec<Value>, String> {
    let mut hostnames: Vec<String> = Vec::new();
    for service in services {
        hostnames.extend(
            docker_logic::reference::service_aliases(&service.name).into_iter().filter(|a| is_dns1123_subdomain(a)),
        );
        for alias in &service.aliases {
            if !is_dns1123_subdomain(alias) {
                return Err(format!(
                    "provided host alias {alias} for service {} is invalid DNS. a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
                    service.name
                ));
            }
            hostnames.push(alias.clone());
        }
    }
    let mut out = Vec::new();
    if !hostnames.is_empty() {
        out.push(json!({ "ip": "127.0.0.1", "hostnames": hostnames }));
    }
    out.extend(config.host_aliases.iter().map(|a| serde_json::to_value(a).unwrap_or_default()));
    Ok(out)
}

#[cfg(test)]
#[path = "pod_tests.rs"]
mod tests;
