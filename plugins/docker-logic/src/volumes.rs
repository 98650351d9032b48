//! Mounts and devices: parsing `volumes` and `devices` entries, cache volume names and the
//! bind strings (`source:target[:mode]`) containers are created with. Never creates a volume.

use sha2::{Digest, Sha256};

use crate::config::DockerConfig;

/// One `volumes` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeSpec {
    /// `/host/path:/container/path[:mode]`: a directory of the engine's machine.
    Bind {
        /// Path on the engine's machine.
        source: String,
        /// Path in the container.
        target: String,
        /// Mount options (`ro`, `rw`, `z`, …), empty for none.
        mode: String,
    },
    /// `name:/container/path[:mode]`: a named volume (created by the engine when missing).
    Named {
        /// Volume name.
        name: String,
        /// Path in the container.
        target: String,
        /// Mount options, empty for none.
        mode: String,
    },
    /// `/container/path`: a cache volume, kept across jobs of the project (GitLab's behaviour).
    Cache {
        /// Path in the container.
        target: String,
    },
}

const MODES: &[&str] = &[
    "ro",
    "rw",
    "z",
    "Z",
    "shared",
    "rshared",
    "slave",
    "rslave",
    "private",
    "rprivate",
    "nocopy",
    "delegated",
    "cached",
    "consistent",
];

/// Parse a `volumes` entry.
pub fn parse_volume(entry: &str) -> Result<VolumeSpec, String> {
    let parts: Vec<&str> = entry.split(':').collect();
    let check_target = |target: &str| {
        if target.starts_with('/') {
            Ok(())
        } else {
            Err(format!("{entry:?}: the container path {target:?} is not absolute"))
        }
    };
    let check_mode = |mode: &str| {
        if mode.split(',').all(|m| MODES.contains(&m)) {
            Ok(())
        } else {
            Err(format!("{entry:?}: unknown mount mode {mode:?}"))
        }
    };
    match parts.as_slice() {
        [target] => {
            check_target(target)?;
            Ok(VolumeSpec::Cache { target: target.to_string() })
        }
        [source, target] | [source, target, _] => {
            let mode = parts.get(2).copied().unwrap_or_default();
            if source.is_empty() {
                return Err(format!("{entry:?}: empty source"));
            }
            check_target(target)?;
            if !mode.is_empty() {
                check_mode(mode)?;
            }
            let (target, mode) = (target.to_string(), mode.to_string());
            if source.starts_with('/') {
                Ok(VolumeSpec::Bind { source: source.to_string(), target, mode })
            } else if source.bytes().all(|c| c.is_ascii_alphanumeric() || b"_.-".contains(&c)) {
                Ok(VolumeSpec::Named { name: source.to_string(), target, mode })
            } else {
                Err(format!("{entry:?}: {source:?} is neither an absolute path nor a volume name"))
            }
        }
        _ => Err(format!("{entry:?} is not /path, source:/path or source:/path:mode")),
    }
}

/// The name of the cache volume for `target` in the jobs of `project` (GitLab keeps one per
/// runner, project and path; the executor passes `<runner short token>/<project path>`):
/// `runway-cache-<first 16 hex digits of sha256(project NUL target)>`.
pub fn cache_volume_name(project: &str, target: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(project.as_bytes());
    hash.update([0]);
    hash.update(target.as_bytes());
    let digest = hash.finalize();
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("runway-cache-{hex}")
}

/// `source:target[:mode]` for `HostConfig.Binds`.
pub fn bind(source: &str, target: &str, mode: &str) -> String {
    if mode.is_empty() {
        format!("{source}:{target}")
    } else {
        format!("{source}:{target}:{mode}")
    }
}

/// A cache mount: a named cache volume, or with `cache_dir` set a directory
/// `<cache_dir>/<volume name>` of the engine's machine. Returns the bind string and the volume
/// to create (none for a directory; the engine creates missing bind sources).
pub fn cache_bind(cache_dir: &str, project: &str, target: &str) -> (String, Option<String>) {
    let name = cache_volume_name(project, target);
    if cache_dir.is_empty() {
        (bind(&name, target, ""), Some(name))
    } else {
        (bind(&format!("{}/{name}", cache_dir.trim_end_matches('/')), target, ""), None)
    }
}

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

/// One `devices` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Device on the engine's machine.
    pub path_on_host: String,
    /// Device in the container.
    pub path_in_container: String,
    /// Cgroup permissions (`rwm` by default).
    pub permissions: String,
}

/// Parse a `devices` entry: `host[:container[:permissions]]`.
pub fn parse_device(entry: &str) -> Result<Device, String> {
    let parts: Vec<&str> = entry.split(':').collect();
    let (host, container, permissions) = match parts.as_slice() {
        [host] => (*host, *host, "rwm"),
        [host, container] if container.starts_with('/') => (*host, *container, "rwm"),
        [host, permissions] => (*host, *host, *permissions),
        [host, container, permissions] => (*host, *container, *permissions),
        _ => return Err(format!("{entry:?} is not host[:container[:permissions]]")),
    };
    if !host.starts_with('/') || !container.starts_with('/') {
        return Err(format!("{entry:?}: device paths must be absolute"));
    }
    if permissions.is_empty() || !permissions.bytes().all(|c| b"rwm".contains(&c)) {
        return Err(format!("{entry:?}: permissions {permissions:?} are not a combination of r, w and m"));
    }
    Ok(Device {
        path_on_host: host.to_string(),
        path_in_container: container.to_string(),
        permissions: permissions.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_volumes() {
        assert_eq!(parse_volume("/cache-extra").unwrap(), VolumeSpec::Cache { target: "/cache-extra".into() });
        assert_eq!(
            parse_volume("/srv/data:/data:ro").unwrap(),
            VolumeSpec::Bind { source: "/srv/data".into(), target: "/data".into(), mode: "ro".into() }
        );
        assert_eq!(
            parse_volume("/var/run/docker.sock:/var/run/docker.sock").unwrap(),
            VolumeSpec::Bind {
                source: "/var/run/docker.sock".into(),
                target: "/var/run/docker.sock".into(),
                mode: String::new()
            }
        );
        assert_eq!(
            parse_volume("m2:/root/.m2:rw,Z").unwrap(),
            VolumeSpec::Named { name: "m2".into(), target: "/root/.m2".into(), mode: "rw,Z".into() }
        );
        assert!(parse_volume("relative").unwrap_err().contains("not absolute"));
        assert!(parse_volume("/a:rel").unwrap_err().contains("not absolute"));
        assert!(parse_volume("/a:/b:bogus").unwrap_err().contains("bogus"));
        assert!(parse_volume(":/b").unwrap_err().contains("empty source"));
        assert!(parse_volume("/a:/b:ro:x").is_err());
        assert!(parse_volume("a b:/x").is_err());
    }

    #[test]
    fn cache_volumes_are_stable_per_project_and_path() {
        let a = cache_volume_name("group/project", "/cache");
        assert_eq!(a, cache_volume_name("group/project", "/cache"));
        assert_ne!(a, cache_volume_name("group/other", "/cache"));
        assert_ne!(a, cache_volume_name("group/project", "/data"));
        assert!(a.starts_with("runway-cache-") && a.len() == "runway-cache-".len() + 16);
        let (b, volume) = cache_bind("", "g/p", "/cache");
        assert_eq!(b, format!("{}:/cache", volume.unwrap()));
        let (b, volume) = cache_bind("/srv/cache/", "g/p", "/cache");
        assert_eq!(b, format!("/srv/cache/{}:/cache", cache_volume_name("g/p", "/cache")));
        assert_eq!(volume, None);
    }

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

    #[test]
    fn parses_devices() {
        let d = parse_device("/dev/fuse").unwrap();
        assert_eq!((d.path_in_container.as_str(), d.permissions.as_str()), ("/dev/fuse", "rwm"));
        let d = parse_device("/dev/sda:/dev/xvda:r").unwrap();
        assert_eq!(
            (d.path_on_host.as_str(), d.path_in_container.as_str(), d.permissions.as_str()),
            ("/dev/sda", "/dev/xvda", "r")
        );
        assert_eq!(parse_device("/dev/kvm:rw").unwrap().permissions, "rw");
        assert!(parse_device("dev/x").is_err());
        assert!(parse_device("/dev/x:/y:rx").is_err());
    }
}
