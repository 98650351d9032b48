//! `runway manager-image`: the container image of the Runway manager itself, for running it in
//! a Kubernetes cluster (deploy/kubernetes/), built from this machine's files as the helper
//! image is (`connector::rootfs`, no registry, no Dockerfile): the running `runway` binary with
//! its libraries, the CA certificates, `/etc/passwd` with the non-root user `runway`
//! ([`USER_ID`]), a writable `/var/lib/runway`, and the built-in plugins compiled for this
//! engine in a read-only plugin cache (so a new pod starts without compiling them). Written
//! as an image archive for `docker load` (Docker's `manifest.json`, the image config, one layer)
//! because the image needs settings a root filesystem tar for `docker import` cannot carry —
//! `docker import --change` refuses `STOPSIGNAL` — see [`image_config`].
//!
//! Owns: the manager image's content and settings. Must not touch: Docker (the user loads the
//! archive), the helper image (`connector::rootfs::helper_rootfs`), config files.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::connector::rootfs::{RootfsBuilder, HELPER_BINARY, MTIME};

/// The image's repository name.
const REPOSITORY: &str = "runway";
/// The uid and gid of the `runway` user the manager runs as.
const USER_ID: u32 = 10001;
/// Where the manager reads its config: the Deployment mounts the ConfigMap there.
const CONFIG: &str = "/etc/runway/config.toml";
/// The compiled plugins the image carries (`RUNWAY_PLUGIN_CACHE_DIR`).
const PLUGIN_CACHE: &str = "/usr/lib/runway/plugin-cache";

/// `runway manager-image`.
#[derive(clap::Args, Debug)]
pub struct ManagerImageArgs {
    /// Where to write the image archive (for `docker load -i`).
    #[arg(long, short = 'o')]
    pub output: PathBuf,
}

/// Write the image archive; print the reference it loads as.
pub(super) fn run(args: &ManagerImageArgs) -> anyhow::Result<std::process::ExitCode> {
    let (rootfs, reference) = build()?;
    let archive = image_archive(&rootfs, &reference)?;
    std::fs::write(&args.output, &archive).map_err(|e| anyhow::anyhow!("writing {}: {e}", args.output.display()))?;
    println!("{reference}");
    Ok(std::process::ExitCode::SUCCESS)
}

/// The image config (Docker image spec v1.2): the entrypoint runs the manager on [`CONFIG`]
/// as the `runway` user; `StopSignal` SIGQUIT makes a pod's termination a graceful shutdown
/// (running jobs finish, as gitlab-runner on SIGQUIT); the plugin cache is the image's.
fn image_config(layer_sha256: &str) -> serde_json::Value {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    serde_json::json!({
        "architecture": arch,
        "os": "linux",
        "created": "2000-01-01T00:00:00Z",
        "config": {
            "Entrypoint": [HELPER_BINARY, "run", "--config", CONFIG],
            "User": format!("{USER_ID}:{USER_ID}"),
            "StopSignal": "SIGQUIT",
            "WorkingDir": "/var/lib/runway",
            "Env": [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME=/var/lib/runway",
                format!("{}={PLUGIN_CACHE}", crate::config::PLUGIN_CACHE_ENV),
            ],
            "ExposedPorts": {"9252/tcp": {}},
        },
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_sha256}")]},
        "history": [{"created": "2000-01-01T00:00:00Z", "created_by": "runway manager-image"}],
    })
}

/// The `docker load` archive of one layer (`rootfs`, uncompressed) tagged `reference`.
fn image_archive(rootfs: &crate::connector::rootfs::Rootfs, reference: &str) -> anyhow::Result<Vec<u8>> {
    let config = serde_json::to_vec(&image_config(&rootfs.sha256))?;
    let config_name = format!("{}.json", hex::encode(Sha256::digest(&config)));
    let layer_name = format!("{}/layer.tar", rootfs.sha256);
    let manifest = serde_json::to_vec(&serde_json::json!([
        {"Config": config_name, "RepoTags": [reference], "Layers": [layer_name]}
    ]))?;
    let mut archive = tar::Builder::new(Vec::new());
    for (name, data) in
        [(config_name.as_str(), &config), (layer_name.as_str(), &rootfs.tar), ("manifest.json", &manifest)]
    {
        let mut header = tar::Header::new_ustar();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(MTIME);
        header.set_entry_type(tar::EntryType::Regular);
        archive.append_data(&mut header, name, data.as_slice())?;
    }
    Ok(archive.into_inner()?)
}

/// The root filesystem and the reference `runway:<version>-<content hash>`.
fn build() -> anyhow::Result<(crate::connector::rootfs::Rootfs, String)> {
    let exe = std::env::current_exe().map_err(|e| anyhow::anyhow!("the running executable: {e}"))?;
    let mut builder = RootfsBuilder::new();
    builder.base_system()?;
    let id = USER_ID;
    builder.file(
        "/etc/passwd",
        format!("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\nrunway:x:{id}:{id}:Runway:/var/lib/runway:/usr/sbin/nologin\n"),
        0o644,
    )?;
    builder.file("/etc/group", format!("root:x:0:\nnogroup:x:65534:\nrunway:x:{id}:\n"), 0o644)?;
    builder.host_file(HELPER_BINARY, &exe)?;
    if Path::new("/etc/ssl/certs").is_dir() {
        builder.path(Path::new("/etc/ssl/certs"))?;
    }
    // Writable by the runway user whatever uid the tar's owner maps to: the image's tar is
    // root-owned, so the state directory is world-writable with the sticky bit, as /tmp.
    builder.dir("/var/lib/runway", 0o1777)?;
    builder.dir("/etc/runway", 0o755)?;
    builder.dir(PLUGIN_CACHE, 0o755)?;
    let temp = tempfile::tempdir().map_err(|e| anyhow::anyhow!("a temporary directory: {e}"))?;
    let cache_dir = crate::config::plugin_cache_from_env().unwrap_or_else(|| temp.path().to_path_buf());
    for (file, path) in precompiled(&cache_dir)? {
        // Readable by the runway user (the cache writes its files 0600).
        let bytes = std::fs::read(&path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        builder.file(&format!("{PLUGIN_CACHE}/{file}"), bytes, 0o644)?;
    }
    let rootfs = builder.build()?;
    drop(temp);
    let reference = format!("{REPOSITORY}:{}-{}", env!("CARGO_PKG_VERSION"), rootfs.short_hash());
    Ok((rootfs, reference))
}

/// The built-in plugins compiled for this engine: (cache file name, path of the
/// compiled file), compiled through the plugin cache in `dir` (`RUNWAY_PLUGIN_CACHE_DIR` when
/// set: a warm cache is reused; else a temporary directory).
fn precompiled(dir: &Path) -> anyhow::Result<Vec<(String, PathBuf)>> {
    use crate::plugin::cache::{content_hash, CompileCache};
    let engine = crate::plugin::engine::PluginEngine::new()?;
    let key = engine.compatibility_key();
    let cache = CompileCache::new(Some(dir.to_path_buf()), key.clone());
    let mut files = Vec::new();
    for (name, bytes) in crate::plugin::builtin_plugins() {
        let hash = content_hash(bytes);
        cache.load_or_compile(&engine.engine, bytes, &hash).map_err(|e| anyhow::anyhow!("compiling {name}: {e:#}"))?;
        let file = format!("{hash}-{key}.cwasm");
        let path = dir.join(&file);
        if !path.is_file() {
            anyhow::bail!("compiling {name}: the plugin cache {} kept no {file}", dir.display());
        }
        files.push((file, path));
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_names_its_layer_and_a_config_that_stops_with_sigquit() {
        let rootfs = crate::connector::rootfs::RootfsBuilder::new().build().expect("rootfs");
        let archive = image_archive(&rootfs, "runway:1-abc").expect("archive");
        let mut files = std::collections::BTreeMap::new();
        for entry in tar::Archive::new(archive.as_slice()).entries().expect("entries") {
            let mut entry = entry.expect("entry");
            let name = entry.path().expect("path").display().to_string();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut data).expect("read");
            files.insert(name, data);
        }
        let manifest: serde_json::Value = serde_json::from_slice(&files["manifest.json"]).expect("manifest");
        assert_eq!(manifest[0]["RepoTags"][0], "runway:1-abc");
        let layer = manifest[0]["Layers"][0].as_str().expect("layer");
        assert_eq!(files[layer], rootfs.tar);
        let config: serde_json::Value =
            serde_json::from_slice(&files[manifest[0]["Config"].as_str().expect("config")]).expect("config");
        assert_eq!(config["config"]["StopSignal"], "SIGQUIT");
        assert_eq!(config["config"]["User"], format!("{USER_ID}:{USER_ID}"));
        assert_eq!(config["config"]["Entrypoint"][1], "run");
        assert_eq!(config["rootfs"]["diff_ids"][0], format!("sha256:{}", rootfs.sha256));
    }
}
