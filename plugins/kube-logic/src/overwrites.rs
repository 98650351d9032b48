//! gitlab-runner's overwrites: the job variables `KUBERNETES_NAMESPACE_OVERWRITE`,
//! `KUBERNETES_SERVICE_ACCOUNT_OVERWRITE`, `KUBERNETES_BEARER_TOKEN`, `KUBERNETES_POD_LABELS_*`,
//! `KUBERNETES_POD_ANNOTATIONS_*`, `KUBERNETES_NODE_SELECTOR_*`, `KUBERNETES_NODE_TOLERATIONS_*`
//! and the resource ones (`KUBERNETES_[HELPER_|SERVICE_|POD_]{CPU,MEMORY,EPHEMERAL_STORAGE}_{LIMIT,REQUEST}`),
//! each checked against what `[runners.kubernetes]` allows. Unlike gitlab-runner (which
//! ignores an overwrite the config does not enable), a set variable the config does not allow
//! is an error naming the variable, its value and what the config allows: the job asked for
//! something it would not get. Decides values only; builds no objects.

use std::collections::BTreeMap;

use regex::Regex;

use crate::config::{KubeConfig, ResourceConfig, ResourceValues};
use crate::quantity::Quantity;

/// Variable overwriting the namespace.
pub const NAMESPACE_VARIABLE: &str = "KUBERNETES_NAMESPACE_OVERWRITE";
/// Variable overwriting the service account.
pub const SERVICE_ACCOUNT_VARIABLE: &str = "KUBERNETES_SERVICE_ACCOUNT_OVERWRITE";
/// Variable overwriting the bearer token.
pub const BEARER_TOKEN_VARIABLE: &str = "KUBERNETES_BEARER_TOKEN";
/// Prefix of variables adding pod labels (`key=value`).
pub const POD_LABELS_PREFIX: &str = "KUBERNETES_POD_LABELS_";
/// Prefix of variables adding pod annotations (`key=value`).
pub const POD_ANNOTATIONS_PREFIX: &str = "KUBERNETES_POD_ANNOTATIONS_";
/// Prefix of variables adding node selectors (`key=value`).
pub const NODE_SELECTOR_PREFIX: &str = "KUBERNETES_NODE_SELECTOR_";
/// Prefix of variables adding tolerations (`key[=value]:effect`).
pub const NODE_TOLERATIONS_PREFIX: &str = "KUBERNETES_NODE_TOLERATIONS_";

/// Limits and requests of one kind of container (or of the pod); empty values: not set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    /// `resources.limits`.
    pub limits: ResourceValues,
    /// `resources.requests`.
    pub requests: ResourceValues,
}

/// The values the job's pod gets, config and overwrites combined.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overwrites {
    /// Namespace.
    pub namespace: String,
    /// Service account (empty: the namespace's default).
    pub service_account: String,
    /// Bearer token for the API (empty: the configured credentials).
    pub bearer_token: String,
    /// Pod labels (config and job; values not yet expanded or sanitized).
    pub pod_labels: BTreeMap<String, String>,
    /// Pod annotations (config and job; values not yet expanded).
    pub pod_annotations: BTreeMap<String, String>,
    /// Node selector.
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations: `key[=value]` → effect.
    pub node_tolerations: BTreeMap<String, String>,
    /// Build container.
    pub build: Resources,
    /// Helper container.
    pub helper: Resources,
    /// Service containers without their own overwrites.
    pub service: Resources,
    /// The pod (`spec.resources`; cpu and memory).
    pub pod: Resources,
    /// What was overwritten, gitlab-runner's wording (`"Namespace" overwritten with "ci"`), for the job log.
    pub notes: Vec<String>,
}

/// Variables after gitlab-runner's `Expand()`: every value with `$VAR` / `${VAR}` replaced.
fn expand_all(variables: &[(String, String)]) -> Vec<(String, String)> {
    let lookup = |name: &str| variables.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    variables.iter().map(|(k, v)| (k.clone(), docker_logic::reference::expand(v, lookup))).collect()
}

fn value<'a>(variables: &'a [(String, String)], key: &str) -> &'a str {
    variables.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str()).unwrap_or_default()
}

/// Resolve the overwrites for a job from its variables (`KEY`, `value`, in the job's order).
pub fn resolve(config: &KubeConfig, variables: &[(String, String)]) -> Result<Overwrites, String> {
    let variables = expand_all(variables);
    let vars = variables.as_slice();
    let mut o = Overwrites { notes: Vec::new(), ..Default::default() };
    o.namespace = o.regex_overwrite(
        "Namespace",
        config.namespace_or_default(),
        &config.namespace_overwrite_allowed,
        "namespace_overwrite_allowed",
        NAMESPACE_VARIABLE,
        value(vars, NAMESPACE_VARIABLE),
    )?;
    o.service_account = o.regex_overwrite(
        "ServiceAccount",
        &config.service_account,
        &config.service_account_overwrite_allowed,
        "service_account_overwrite_allowed",
        SERVICE_ACCOUNT_VARIABLE,
        value(vars, SERVICE_ACCOUNT_VARIABLE),
    )?;
    let token = value(vars, BEARER_TOKEN_VARIABLE);
    o.bearer_token = if token.is_empty() {
        config.bearer_token.clone()
    } else if config.bearer_token_overwrite_allowed {
        o.notes.push("\"BearerToken\" overwritten with \"XXXXXXXX...\"".into());
        token.to_string()
    } else {
        return Err(format!(
            "{BEARER_TOKEN_VARIABLE} is set but [runners.kubernetes] bearer_token_overwrite_allowed is not true"
        ));
    };
    o.pod_labels = o.map_overwrite("PodLabels", config, vars, MapKind::PodLabels)?;
    o.pod_annotations = o.map_overwrite("PodAnnotations", config, vars, MapKind::PodAnnotations)?;
    o.node_selector = o.map_overwrite("NodeSelector", config, vars, MapKind::NodeSelector)?;
    o.node_tolerations = o.map_overwrite("NodeTolerations", config, vars, MapKind::NodeTolerations)?;
    o.build = o.resources("", "", &config.build, vars).map_err(|e| format!("invalid build {e}"))?;
    o.service =
        o.resources("SERVICE_", "Service", &config.service, vars).map_err(|e| format!("invalid service {e}"))?;
    o.helper = o.resources("HELPER_", "Helper", &config.helper, vars).map_err(|e| format!("invalid helper {e}"))?;
    o.pod = o.resources("POD_", "Pod", &config.pod, vars).map_err(|e| format!("invalid Pod {e}"))?;
    Ok(o)
}

/// The resources of one service that sets `KUBERNETES_SERVICE_*` in its own `variables:`
/// (gitlab-runner's explicit service overwrites): the job-wide service resources, overwritten
/// within the same `service_*_overwrite_max_allowed` limits.
pub fn service_resources(
    config: &KubeConfig,
    overwrites: &Overwrites,
    service: &str,
    service_variables: &[(String, String)],
) -> Result<Resources, String> {
    let mut scratch = Overwrites::default();
    let base = ResourceConfig {
        limits: overwrites.service.limits.clone(),
        requests: overwrites.service.requests.clone(),
        ..config.service.clone()
    };
    scratch
        .resources("SERVICE_", "Service", &base, service_variables)
        .map_err(|e| format!("service {service:?}: invalid service {e}"))
}

#[derive(Clone, Copy)]
enum MapKind {
    PodLabels,
    PodAnnotations,
    NodeSelector,
    NodeTolerations,
}

impl Overwrites {
    fn regex_overwrite(
        &mut self,
        field: &str,
        current: &str,
        allowed: &str,
        allowed_key: &str,
        variable: &str,
        overwrite: &str,
    ) -> Result<String, String> {
        if overwrite.is_empty() {
            return Ok(current.to_string());
        }
        if allowed.is_empty() {
            return Err(format!(
                "{variable}: overwrite to {overwrite:?} is not allowed ([runners.kubernetes] {allowed_key} is not set)"
            ));
        }
        check_regex(variable, overwrite, allowed, allowed_key)?;
        self.notes.push(format!("{field:?} overwritten with {overwrite:?}"));
        Ok(overwrite.to_string())
    }

    fn map_overwrite(
        &mut self,
        field: &str,
        config: &KubeConfig,
        variables: &[(String, String)],
        kind: MapKind,
    ) -> Result<BTreeMap<String, String>, String> {
        let (values, allowed, allowed_key, prefix) = match kind {
            MapKind::PodLabels => (
                &config.pod_labels,
                &config.pod_labels_overwrite_allowed,
                "pod_labels_overwrite_allowed",
                POD_LABELS_PREFIX,
            ),
            MapKind::PodAnnotations => (
                &config.pod_annotations,
                &config.pod_annotations_overwrite_allowed,
                "pod_annotations_overwrite_allowed",
                POD_ANNOTATIONS_PREFIX,
            ),
            MapKind::NodeSelector => (
                &config.node_selector,
                &config.node_selector_overwrite_allowed,
                "node_selector_overwrite_allowed",
                NODE_SELECTOR_PREFIX,
            ),
            MapKind::NodeTolerations => (
                &config.node_tolerations,
                &config.node_tolerations_overwrite_allowed,
                "node_tolerations_overwrite_allowed",
                NODE_TOLERATIONS_PREFIX,
            ),
        };
        let mut out = values.clone();
        for (key, value) in variables.iter().filter(|(k, _)| k.starts_with(prefix)) {
            if allowed.is_empty() {
                return Err(format!(
                    "{key}: overwrite to {value:?} is not allowed ([runners.kubernetes] {allowed_key} is not set)"
                ));
            }
            check_regex(key, value, allowed, allowed_key)?;
            let (k, v) = match kind {
                // `key[=value]:effect`; no `:` means no effect.
                MapKind::NodeTolerations => match value.split_once(':') {
                    Some((kv, effect)) => (kv.to_string(), effect.to_string()),
                    None => (value.clone(), String::new()),
                },
                _ => match value.split_once('=') {
                    Some((k, v)) => (k.to_string(), v.to_string()),
                    None => return Err(format!("{key}: provided value {value:?} does not match \"k=v\"")),
                },
            };
            self.notes.push(format!("{field:?} {k:?} overwritten with {v:?}"));
            out.insert(k, v);
        }
        Ok(out)
    }

    /// gitlab-runner's `evaluateMaxResourceListOverwrite` for one kind (`prefix` of the
    /// variables, `field` of its messages).
    fn resources(
        &mut self,
        prefix: &str,
        field: &str,
        config: &ResourceConfig,
        variables: &[(String, String)],
    ) -> Result<Resources, String> {
        let key_prefix = prefix.to_ascii_lowercase();
        let requests = self
            .values(field, "Request", &key_prefix, prefix, &config.requests, &config.requests_max, variables)
            .map_err(|e| format!("requests specified: {e}"))?;
        let limits = self
            .values(field, "Limit", &key_prefix, prefix, &config.limits, &config.limits_max, variables)
            .map_err(|e| format!("limits specified: {e}"))?;
        Ok(Resources { limits, requests })
    }

    #[allow(clippy::too_many_arguments)]
    fn values(
        &mut self,
        field: &str,
        kind: &str,
        key_prefix: &str,
        variable_prefix: &str,
        current: &ResourceValues,
        max: &ResourceValues,
        variables: &[(String, String)],
    ) -> Result<ResourceValues, String> {
        let mut one = |resource: &str, field_resource: &str, current: &str, max: &str| -> Result<String, String> {
            if variable_prefix == "POD_" && resource == "ephemeral_storage" {
                // gitlab-runner has no pod-level ephemeral storage (nor its variable).
                return Ok(current.to_string());
            }
            let upper = resource.to_ascii_uppercase();
            let variable = format!("KUBERNETES_{variable_prefix}{upper}_{}", kind.to_ascii_uppercase());
            let overwrite = value(variables, &variable);
            if overwrite.is_empty() {
                return Ok(current.to_string());
            }
            let max_key = format!("{key_prefix}{resource}_{}_overwrite_max_allowed", kind.to_ascii_lowercase());
            let field = format!("{field}{field_resource}{kind}");
            if max.is_empty() {
                return Err(format!(
                    "{variable}: overwrite to {overwrite:?} is not allowed ([runners.kubernetes] {max_key} is not set)"
                ));
            }
            let wanted = Quantity::parse(overwrite).map_err(|e| format!("{variable}: parsing resource limit: {e}"))?;
            let ceiling = Quantity::parse(max).map_err(|e| format!("{max_key}: {e}"))?;
            if wanted > ceiling {
                return Err(format!(
                    "the resource {field:?} requested {overwrite:?} is higher than limit allowed {max:?} ({variable}; [runners.kubernetes] {max_key})"
                ));
            }
            if wanted.is_negative() {
                return Err(format!("{variable}: {overwrite:?} is negative"));
            }
            self.notes.push(format!("{field:?} overwritten with {overwrite:?}"));
            Ok(overwrite.to_string())
        };
        Ok(ResourceValues {
            cpu: one("cpu", "CPU", &current.cpu, &max.cpu)?,
            memory: one("memory", "Memory", &current.memory, &max.memory)?,
            ephemeral_storage: one(
                "ephemeral_storage",
                "EphemeralStorage",
                &current.ephemeral_storage,
                &max.ephemeral_storage,
            )?,
        })
    }
}

fn check_regex(variable: &str, value: &str, pattern: &str, allowed_key: &str) -> Result<(), String> {
    let re = Regex::new(pattern).map_err(|e| format!("[runners.kubernetes] {allowed_key}: {e}"))?;
    if re.is_match(value) {
        Ok(())
    } else {
        Err(format!(
            "{variable}: provided value {value:?} does not match {pattern:?} ([runners.kubernetes] {allowed_key})"
        ))
    }
}

#[cfg(test)]
#[path = "overwrites_tests.rs"]
mod tests;
