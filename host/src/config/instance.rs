//! gitlab-runner's `[runners.instance]` keys whose meaning depends on the runner's fleet
//! (`[runners.autoscaler]`), which the instance executor plugin never sees, so the host
//! decides them from the config alone, as gitlab-runner's instance executor does in its
//! `Prepare`:
//!
//! - `use_common_build_dir`: with one job per instance (`max_use_count = 1`) the builds
//!   directory is not namespaced by runner token and slot ([`common_build_dir`]); otherwise it
//!   has no effect and each job's log says so ([`NO_EFFECT_WARNING`]). gitlab-runner also
//!   honours it with `vm_isolation`, which Runway does not support (warned as unsupported at
//!   load), so it counts as off here.
//! - `allowed_images`: checked by gitlab-runner only with `vm_isolation` (the image then picks
//!   the VM); Runway accepts the key and warns about it by name at load ([`warnings`]).
//!
//! The plugin accepts and type-checks both keys and reads neither. Owns: those two decisions.
//! Must not touch: the builds-dir layout (the script module plans it from the verdict) or the
//! job's trace (the job module writes the warning).

use std::path::Path;

use crate::config::fidelity::{ConfigWarning, WarningKind};
use crate::config::lines::line_of_key;
use crate::config::RunnerConfig;

/// The line each job's log gets when `use_common_build_dir` cannot apply (gitlab-runner's words).
pub const NO_EFFECT_WARNING: &str = "use_common_build_dir has no effect: requires vm isolation or max_use_count = 1";

/// What `[runners.instance] use_common_build_dir` does for a runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommonBuildDir {
    /// Not asked for (or not the instance executor): the usual namespaced layout.
    NotAsked,
    /// Asked for, and each instance runs one job: `<builds_dir>/<namespace>/<project>`.
    Applies,
    /// Asked for, but instances are reused: nothing changes, and each job's log warns
    /// ([`NO_EFFECT_WARNING`]).
    NoEffect,
}

/// The verdict on `use_common_build_dir` for `runner` (only the instance executor reads it),
/// whose fleet runs with `max_use_count` (`None`: no fleet). The caller passes the running
/// fleet's value: a live edit of `[runners.autoscaler]` waits for a restart, and so must this.
pub fn common_build_dir(runner: &RunnerConfig, max_use_count: Option<u32>) -> CommonBuildDir {
    let asked = runner.executor_plugin() == "instance"
        && runner
            .sections
            .get("instance")
            .and_then(|section| section.get("use_common_build_dir"))
            .and_then(toml::Value::as_bool)
            .unwrap_or(false);
    if !asked {
        return CommonBuildDir::NotAsked;
    }
    match max_use_count {
        Some(1) => CommonBuildDir::Applies,
        _ => CommonBuildDir::NoEffect,
    }
}

/// Warnings about runner `index`'s `[runners.instance]` keys Runway does not act on
/// (`allowed_images`), naming file, line and key.
pub(super) fn warnings(index: usize, runner: &RunnerConfig, text: &str, path: &Path) -> Vec<ConfigWarning> {
    let Some(section) = runner.sections.get("instance") else { return Vec::new() };
    if section.get("allowed_images").is_none() {
        return Vec::new();
    }
    let key = format!("runners.{index}.instance.allowed_images");
    let what = "applies only with vm_isolation, which Runway does not support (ignored)";
    let text = match line_of_key(text, &key) {
        Some(line) => format!("{}:{line}: {key}: {what}", path.display()),
        None => format!("{}: {key}: {what}", path.display()),
    };
    vec![ConfigWarning::new(WarningKind::Unsupported, text)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse_for, Purpose};

    fn load(text: &str) -> crate::config::Loaded {
        parse_for(text, Path::new("/etc/gitlab-runner/config.toml"), Purpose::Run).expect("loads")
    }

    fn runner(executor: &str, autoscaler: &str, instance: &str) -> String {
        format!(
            "concurrent = 1\n[[runners]]\n  url = \"https://gitlab.example.com\"\n  token = \"glrt-x\"\n  executor = \"{executor}\"\n  [runners.autoscaler]\n    plugin = \"aws\"\n{autoscaler}  [runners.instance]\n{instance}"
        )
    }

    #[test]
    fn a_common_build_dir_applies_only_with_one_job_per_instance() {
        let asked = "    use_common_build_dir = true\n";
        let verdict = |executor: &str, autoscaler: &str, instance: &str| {
            let loaded = load(&runner(executor, autoscaler, instance));
            let runner = &loaded.config.runners[0];
            common_build_dir(runner, runner.autoscaler.as_ref().map(|a| a.max_use_count))
        };
        assert_eq!(verdict("instance", "    max_use_count = 1\n", asked), CommonBuildDir::Applies);
        // Instances reused (or unlimited): gitlab-runner warns in the job log and keeps the layout.
        assert_eq!(verdict("instance", "    max_use_count = 2\n", asked), CommonBuildDir::NoEffect);
        assert_eq!(verdict("instance", "", asked), CommonBuildDir::NoEffect);
        // vm_isolation is not supported by Runway: it does not make the key apply.
        let isolated = "    max_use_count = 3\n    [runners.autoscaler.vm_isolation]\n      enabled = true\n";
        assert_eq!(verdict("instance", isolated, asked), CommonBuildDir::NoEffect);
        // Off, absent, or another executor: nothing to decide.
        assert_eq!(
            verdict("instance", "    max_use_count = 1\n", "    use_common_build_dir = false\n"),
            CommonBuildDir::NotAsked
        );
        assert_eq!(verdict("instance", "    max_use_count = 1\n", ""), CommonBuildDir::NotAsked);
        assert_eq!(verdict("docker-autoscaler", "    max_use_count = 1\n", asked), CommonBuildDir::NotAsked);
        // The running fleet's value decides, not an edit waiting for a restart; no fleet: no effect.
        let loaded = load(&runner("instance", "    max_use_count = 1\n", asked));
        assert_eq!(common_build_dir(&loaded.config.runners[0], Some(2)), CommonBuildDir::NoEffect);
        assert_eq!(common_build_dir(&loaded.config.runners[0], None), CommonBuildDir::NoEffect);
    }

    #[test]
    fn allowed_images_is_accepted_and_warned_by_name_and_line() {
        let text = runner(
            "instance",
            "    max_use_count = 1\n",
            "    use_common_build_dir = true\n    allowed_images = [\"ruby:*\"]\n",
        );
        let loaded = load(&text);
        assert_eq!(
            loaded.warnings.iter().map(|w| (w.kind, w.to_string())).collect::<Vec<_>>(),
            vec![(
                WarningKind::Unsupported,
                "/etc/gitlab-runner/config.toml:11: runners.0.instance.allowed_images: applies only with vm_isolation, which Runway does not support (ignored)".to_string()
            )]
        );
        // Both keys reach the plugin untouched (it accepts them).
        let json: serde_json::Value =
            serde_json::from_str(&loaded.config.runners[0].executor_config_json()).expect("json");
        assert_eq!(json, serde_json::json!({"use_common_build_dir": true, "allowed_images": ["ruby:*"]}));
        // vm_isolation keeps its own unsupported warning, next to this one.
        let isolated = runner(
            "instance",
            "    [runners.autoscaler.vm_isolation]\n      enabled = true\n",
            "    allowed_images = [\"ruby:*\"]\n",
        );
        let warnings: Vec<String> = load(&isolated).warnings.iter().map(|w| w.to_string()).collect();
        assert_eq!(warnings.len(), 2, "{warnings:#?}");
        assert!(
            warnings.iter().any(|w| w.contains(":8: runners.0.autoscaler.") && w.contains("vm_isolation: not supported by Runway")),
            "{warnings:#?}"
        );
        assert!(warnings
            .iter()
            .any(|w| w.contains(":11: runners.0.instance.allowed_images: applies only with vm_isolation")));
        // Without the key: nothing to say.
        assert!(load(&runner("instance", "", "    use_common_build_dir = true\n")).warnings.is_empty());
    }
}
