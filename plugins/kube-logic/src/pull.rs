//! Image pull policies for the pod's containers, as gitlab-runner's Kubernetes executor picks
//! them: the job's `pull_policy:` if it has one, else the runner's `pull_policy` (else the
//! cluster's default), limited to `allowed_pull_policies` (default: the runner's `pull_policy`),
//! with gitlab-runner's error when nothing is left. Several policies are tried in order, one
//! pod attempt each. Decides only; pulls nothing.

use crate::config::{KubeConfig, KubePullPolicy};

/// One entry of a policy list: `None` is the cluster's default (no `imagePullPolicy`).
pub type Policy = Option<KubePullPolicy>;

/// Go's `%v` of a `[]api.PullPolicy`: `[Always IfNotPresent]`, the default printing as nothing.
fn go_list(policies: &[Policy]) -> String {
    let names: Vec<&str> = policies.iter().map(|p| p.map(KubePullPolicy::as_api).unwrap_or_default()).collect();
    format!("[{}]", names.join(" "))
}

/// The policies to try for container `container`, in order; `job` is what the job asked for
/// (`image:pull_policy` or the service's), in GitLab's spelling.
pub fn effective(config: &KubeConfig, container: &str, job: &[String]) -> Result<Vec<Policy>, String> {
    let job: Vec<Policy> = job
        .iter()
        .filter(|p| !p.trim().is_empty())
        .map(|p| KubePullPolicy::parse(p).map(Some))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("converting pull policy for container {container:?}: {e}"))?;
    let runner: Vec<Policy> =
        if config.pull_policy.is_empty() { vec![None] } else { config.pull_policy.iter().copied().map(Some).collect() };
    let allowed: Vec<Policy> = if config.allowed_pull_policies.is_empty() {
        runner.clone()
    } else {
        config.allowed_pull_policies.iter().copied().map(Some).collect()
    };
    let (requested, source) = if !job.is_empty() {
        (job, "GitLab pipeline config")
    } else if !config.pull_policy.is_empty() {
        (runner, "Runner config")
    } else {
        (runner, "Runner config (default)")
    };
    let effective: Vec<Policy> = requested.iter().copied().filter(|p| allowed.contains(p)).collect();
    if effective.is_empty() {
        return Err(format!(
            "invalid pull policy for container {container:?}: pull_policy ({}) defined in {source} is not one of the allowed_pull_policies ({})",
            go_list(&requested),
            go_list(&allowed)
        ));
    }
    Ok(effective)
}

/// The policy of pod attempt `attempt` (0 first): the next policy after each failed pull, the
/// last one once all were tried.
pub fn for_attempt(policies: &[Policy], attempt: usize) -> Policy {
    policies.get(attempt.min(policies.len().saturating_sub(1))).copied().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;
    use KubePullPolicy::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn table() {
        for (config, job, want) in [
            ("{}", vec![], Ok(vec![None])),
            (r#"{"pull_policy": "always"}"#, vec![], Ok(vec![Some(Always)])),
            (r#"{"pull_policy": ["always", "if-not-present"]}"#, vec!["if-not-present"], Ok(vec![Some(IfNotPresent)])),
            (
                r#"{"pull_policy": "always", "allowed_pull_policies": ["always", "never"]}"#,
                vec!["never", "if-not-present"],
                Ok(vec![Some(Never)]),
            ),
            (
                "{}",
                vec!["always"],
                Err("invalid pull policy for container \"build\": pull_policy ([Always]) defined in GitLab pipeline config is not one of the allowed_pull_policies ([])"),
            ),
            (
                r#"{"pull_policy": "if-not-present"}"#,
                vec!["always"],
                Err("invalid pull policy for container \"build\": pull_policy ([Always]) defined in GitLab pipeline config is not one of the allowed_pull_policies ([IfNotPresent])"),
            ),
            (
                r#"{"pull_policy": "always", "allowed_pull_policies": "never"}"#,
                vec![],
                Err("invalid pull policy for container \"build\": pull_policy ([Always]) defined in Runner config is not one of the allowed_pull_policies ([Never])"),
            ),
            (
                r#"{"allowed_pull_policies": "never"}"#,
                vec![],
                Err("invalid pull policy for container \"build\": pull_policy ([]) defined in Runner config (default) is not one of the allowed_pull_policies ([Never])"),
            ),
        ] {
            let c = parse(config).unwrap().config;
            let got = effective(&c, "build", &s(&job));
            assert_eq!(got, want.map_err(str::to_string), "{config} {job:?}");
        }
        let err = effective(&parse("{}").unwrap().config, "svc-0", &s(&["later"])).unwrap_err();
        assert!(err.contains("svc-0") && err.contains("later"), "{err}");
    }

    #[test]
    fn attempts_walk_the_list() {
        let list = vec![Some(Always), Some(IfNotPresent)];
        assert_eq!(for_attempt(&list, 0), Some(Always));
        assert_eq!(for_attempt(&list, 1), Some(IfNotPresent));
        assert_eq!(for_attempt(&list, 5), Some(IfNotPresent));
        assert_eq!(for_attempt(&[None], 0), None);
        assert_eq!(for_attempt(&[], 0), None);
    }
}
