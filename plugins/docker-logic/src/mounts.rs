//! A job's mount plan: from `[runners.docker]` (its `volumes`, `cache_dir`, `disable_cache`)
//! to the bind strings of its containers and the volumes to create first. Uses the parsed
//! entries and bind strings of [`crate::volumes`] and the config of [`crate::config`]; neither
//! of those uses this module. Never creates a volume or talks to an engine.

use crate::config::DockerConfig;
use crate::volumes::{bind, cache_bind, VolumeSpec};

/// Who a volume of a [`MountPlan`] belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The job: labelled with it, removed by cleanup.
    Job,
    /// The project's cache: kept across jobs.
    Cache,
}

/// The mounts of a job's containers and the volumes to create for them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountPlan {
    /// `source:target[:mode]`, the build volume first.
    pub binds: Vec<String>,
    /// Volumes to create before the first container, with their owner.
    pub volumes: Vec<(String, Owner)>,
}

/// Where a job's containers mount what: `volumes` entries first (a bare `/path` is a cache
/// volume, or a per-job volume with `disable_cache`), then the build volume at `builds_dir` and
/// the cache at `cache_dir` (unless `disable_cache`), each skipped when an entry already
/// mounts its path. `prefix` names the job's own volumes, `project` the cache volumes.
pub fn plan_mounts(config: &DockerConfig, prefix: &str, project: &str, builds_dir: &str, cache_dir: &str) -> MountPlan {
    let mut plan = MountPlan::default();
    let mut targets: Vec<String> = Vec::new();
    let cache = |plan: &mut MountPlan, target: &str| {
        let (bind, name) = cache_bind(&config.cache_dir, project, target);
        if let Some(name) = name {
            plan.volumes.push((name, Owner::Cache));
        }
        bind
    };
    for (index, volume) in config.volumes.iter().enumerate() {
        let (bind, target) = match volume {
            VolumeSpec::Bind { source, target, mode } => (bind(source, target, mode), target),
            VolumeSpec::Named { name, target, mode } => (bind(name, target, mode), target),
            VolumeSpec::Cache { target } if targets.contains(target) => continue,
            VolumeSpec::Cache { target } if config.disable_cache => {
                let name = format!("{prefix}-vol{index}");
                plan.volumes.push((name.clone(), Owner::Job));
                (bind(&name, target, ""), target)
            }
            VolumeSpec::Cache { target } => (cache(&mut plan, target), target),
        };
        if !targets.contains(target) {
            targets.push(target.clone());
            plan.binds.push(bind);
        }
    }
    if !targets.iter().any(|t| t == builds_dir) {
        let name = crate::names::build_volume(prefix);
        plan.volumes.insert(0, (name.clone(), Owner::Job));
        plan.binds.insert(0, bind(&name, builds_dir, ""));
    }
    if !config.disable_cache && !targets.iter().any(|t| t == cache_dir) {
        let bind = cache(&mut plan, cache_dir);
        plan.binds.push(bind);
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volumes::cache_volume_name;

    fn config(json: &str) -> DockerConfig {
        crate::config::parse(json).unwrap().config
    }

    #[test]
    fn default_mounts_are_build_and_cache_volumes() {
        let plan = plan_mounts(&config("{}"), "runway-job-1-s", "g/p", "/builds", "/cache");
        let cache = cache_volume_name("g/p", "/cache");
        assert_eq!(plan.binds, vec!["runway-job-1-s-builds:/builds".to_string(), format!("{cache}:/cache")]);
        assert_eq!(plan.volumes, vec![("runway-job-1-s-builds".to_string(), Owner::Job), (cache, Owner::Cache)]);
    }

    #[test]
    fn volumes_entries_come_first_and_win() {
        let c = config(
            r#"{"volumes": ["/srv/cache:/cache", "/data", "/data", "m2:/root/.m2:ro", "/var/run/docker.sock:/var/run/docker.sock"]}"#,
        );
        let plan = plan_mounts(&c, "p", "g/p", "/builds", "/cache");
        let data = cache_volume_name("g/p", "/data");
        assert_eq!(
            plan.binds,
            vec![
                "p-builds:/builds".to_string(),
                "/srv/cache:/cache".to_string(),
                format!("{data}:/data"),
                "m2:/root/.m2:ro".to_string(),
                "/var/run/docker.sock:/var/run/docker.sock".to_string(),
            ]
        );
        assert_eq!(plan.volumes, vec![("p-builds".to_string(), Owner::Job), (data, Owner::Cache)]);
    }

    #[test]
    fn disable_cache_makes_per_job_volumes() {
        let c = config(r#"{"disable_cache": true, "volumes": ["/data"]}"#);
        let plan = plan_mounts(&c, "p", "g/p", "/builds", "/cache");
        assert_eq!(plan.binds, vec!["p-builds:/builds".to_string(), "p-vol0:/data".to_string()]);
        assert_eq!(plan.volumes, vec![("p-builds".to_string(), Owner::Job), ("p-vol0".to_string(), Owner::Job)]);
    }

    #[test]
    fn cache_dir_binds_directories() {
        let c = config(r#"{"cache_dir": "/srv/runway-cache"}"#);
        let plan = plan_mounts(&c, "p", "g/p", "/builds", "/cache");
        assert_eq!(plan.binds[1], format!("/srv/runway-cache/{}:/cache", cache_volume_name("g/p", "/cache")));
        assert_eq!(plan.volumes, vec![("p-builds".to_string(), Owner::Job)]);
    }
}
