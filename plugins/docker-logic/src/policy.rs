//! Pull policies (which ones apply to an image, in what order) and the allow-lists of images
//! and services (`allowed_images`, `allowed_services`: GitLab's doublestar globs). Decides only;
//! never pulls.

use std::fmt;

/// When to pull an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PullPolicy {
    /// Pull every time (the default).
    #[serde(rename = "always")]
    Always,
    /// Pull only when the engine does not have the image.
    #[serde(rename = "if-not-present")]
    IfNotPresent,
    /// Never pull: the engine must have the image.
    #[serde(rename = "never")]
    Never,
}

impl PullPolicy {
    /// Parse `always`, `if-not-present` or `never`.
    pub fn parse(text: &str) -> Result<PullPolicy, String> {
        match text.trim() {
            "always" => Ok(PullPolicy::Always),
            "if-not-present" => Ok(PullPolicy::IfNotPresent),
            "never" => Ok(PullPolicy::Never),
            other => Err(format!("unsupported pull policy {other:?} (always, if-not-present, never)")),
        }
    }

    /// The policy's name as written in config.toml and `.gitlab-ci.yml`.
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "always",
            PullPolicy::IfNotPresent => "if-not-present",
            PullPolicy::Never => "never",
        }
    }
}

impl fmt::Display for PullPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn list(policies: &[PullPolicy]) -> String {
    format!("[{}]", policies.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(" "))
}

/// The policies to try for one image, in order, as GitLab computes them: the job's
/// `pull_policy:` if it has one, else the runner's `pull_policy` (default `always`), limited to
/// `allowed_pull_policies` (default: the runner's `pull_policy`). An error when none of the
/// requested policies is allowed; it names both lists and where the request came from.
pub fn effective_pull_policies(
    image: &str,
    job: &[String],
    config: &[PullPolicy],
    allowed: &[PullPolicy],
) -> Result<Vec<PullPolicy>, String> {
    let job: Vec<PullPolicy> = job
        .iter()
        .filter(|p| !p.trim().is_empty())
        .map(|p| PullPolicy::parse(p).map_err(|e| format!("image {image:?}: pull_policy: {e}")))
        .collect::<Result<_, _>>()?;
    let runner = if config.is_empty() { vec![PullPolicy::Always] } else { config.to_vec() };
    let allowed = if allowed.is_empty() { runner.clone() } else { allowed.to_vec() };
    let (requested, source) = if !job.is_empty() {
        (job, "GitLab pipeline config")
    } else if !config.is_empty() {
        (runner, "Runner config")
    } else {
        (runner, "Runner config (default)")
    };
    let effective: Vec<PullPolicy> = requested.iter().copied().filter(|p| allowed.contains(p)).collect();
    if effective.is_empty() {
        return Err(format!(
            "invalid pull policy for image {image:?}: pull_policy ({}) defined in {source} is not one of the allowed_pull_policies ({})",
            list(&requested),
            list(&allowed)
        ));
    }
    Ok(effective)
}

/// Whether `name` matches `pattern`: `*` any run of characters but `/`, `**` any run of
/// characters, `?` one character but `/` (GitLab's doublestar matching of image names).
pub fn glob_match(pattern: &str, name: &str) -> bool {
    fn go(p: &[u8], n: &[u8]) -> bool {
        match p.first() {
            None => n.is_empty(),
            Some(b'*') if p.get(1) == Some(&b'*') => {
                let mut rest = &p[2..];
                // `**/` also matches nothing at all (`a/**/b` matches `a/b`).
                if rest.first() == Some(&b'/') && go(&rest[1..], n) {
                    return true;
                }
                while rest.first() == Some(&b'*') {
                    rest = &rest[1..];
                }
                (0..=n.len()).any(|i| go(rest, &n[i..]))
            }
            Some(b'*') => {
                let rest = &p[1..];
                for i in 0..=n.len() {
                    if go(rest, &n[i..]) {
                        return true;
                    }
                    if n.get(i) == Some(&b'/') {
                        break;
                    }
                }
                false
            }
            Some(b'?') => n.first().is_some_and(|c| *c != b'/') && go(&p[1..], &n[1..]),
            Some(c) => n.first() == Some(c) && go(&p[1..], &n[1..]),
        }
    }
    go(pattern.as_bytes(), name.as_bytes())
}

/// Check `image` against an allow-list (`allowed_images` or `allowed_services`, named by
/// `option`): allowed when the list is empty, a pattern matches, or the image is one the runner
/// configured itself (`internal`). The error lists the allowed patterns.
pub fn check_allowed(image: &str, option: &str, allowed: &[String], internal: &[String]) -> Result<(), String> {
    if allowed.is_empty() || allowed.iter().any(|p| glob_match(p, image)) || internal.iter().any(|i| i == image) {
        return Ok(());
    }
    let kind = option.trim_start_matches("allowed_");
    Err(format!("the {image:?} image is not present on the list of allowed {kind} ({option}: {})", allowed.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::PullPolicy::*;
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn default_policy_is_always() {
        assert_eq!(effective_pull_policies("a", &[], &[], &[]).unwrap(), vec![Always]);
        assert_eq!(effective_pull_policies("a", &s(&[""]), &[], &[]).unwrap(), vec![Always]);
    }

    #[test]
    fn runner_list_is_the_fallback_order() {
        assert_eq!(
            effective_pull_policies("a", &[], &[Always, IfNotPresent], &[]).unwrap(),
            vec![Always, IfNotPresent]
        );
    }

    #[test]
    fn job_policy_must_be_allowed() {
        // Allowed defaults to the runner's pull_policy.
        let err = effective_pull_policies("alpine", &s(&["never"]), &[], &[]).unwrap_err();
        assert_eq!(
            err,
            "invalid pull policy for image \"alpine\": pull_policy ([never]) defined in GitLab pipeline config \
             is not one of the allowed_pull_policies ([always])"
        );
        assert_eq!(effective_pull_policies("a", &s(&["never"]), &[], &[Never, Always]).unwrap(), vec![Never]);
        assert_eq!(
            effective_pull_policies("a", &s(&["always", "if-not-present"]), &[Always], &[IfNotPresent]).unwrap(),
            vec![IfNotPresent]
        );
        let err = effective_pull_policies("a", &[], &[Always], &[Never]).unwrap_err();
        assert!(err.contains("defined in Runner config is not"), "{err}");
        assert!(effective_pull_policies("a", &s(&["later"]), &[], &[]).unwrap_err().contains("later"));
    }

    #[test]
    fn globs_follow_doublestar() {
        assert!(glob_match("alpine:*", "alpine:3.19"));
        assert!(!glob_match("alpine:*", "alpine/x:3"));
        assert!(glob_match("registry.local/**", "registry.local/group/sub/img:1"));
        assert!(!glob_match("registry.local/*", "registry.local/group/img:1"));
        assert!(glob_match("registry.local/*/img:*", "registry.local/group/img:1"));
        assert!(glob_match("**/ruby:*", "ruby:3"));
        assert!(glob_match("ruby:?", "ruby:3"));
        assert!(!glob_match("ruby:?", "ruby:33"));
        assert!(glob_match("**", "anything/at/all"));
        assert!(!glob_match("postgres", "postgres:14"));
    }

    #[test]
    fn allow_lists() {
        assert!(check_allowed("x", "allowed_images", &[], &[]).is_ok());
        assert!(check_allowed("ruby:3", "allowed_images", &s(&["ruby:*"]), &[]).is_ok());
        assert!(check_allowed("mine:1", "allowed_images", &s(&["ruby:*"]), &s(&["mine:1"])).is_ok());
        let err = check_allowed("evil:1", "allowed_services", &s(&["postgres:*", "redis:*"]), &[]).unwrap_err();
        assert_eq!(
            err,
            "the \"evil:1\" image is not present on the list of allowed services (allowed_services: postgres:*, redis:*)"
        );
    }
}
