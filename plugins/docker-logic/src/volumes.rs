//! Mounts and devices: parsing `volumes` and `devices` entries, cache volume names and the
//! bind strings (`source:target[:mode]`) containers are created with. Never creates a volume,
//! and never reads the whole config: [`crate::config`] parses its entries with this module,
//! and the job's mount plan from the config is [`crate::mounts`]'s.

use sha2::{Digest, Sha256};

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
