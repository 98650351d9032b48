//! What every verb builds from config.toml, in one place (gitlab-runner keeps this in
//! `commands/config.go`): the process sealed at start, the config file loaded and its
//! warnings reported, the plugin host and its settings (with the helper image), a runner's
//! GitLab client, labels, helper command and distributed cache, and a runner's token reset
//! written back into the file.
//!
//! Owns: building these from a loaded config. Must not touch: a verb's flags or its
//! output (each verb file parses its own and calls in here), the manager's lifecycle.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::edit::TokenUpdate;
use crate::config::{self, Config, Loaded, RunnerConfig};
use crate::executor::ResolvedExecutor;
use crate::gitlab::client::{ClientOptions, GitLabClient, RequestHook, RunnerCredentials};
use crate::plugin::{builtin_plugins, HelperImageError, HelperImageSource, HostSettings, PluginHost, StageOutput};

/// Make the runner non-dumpable (Linux `PR_SET_DUMPABLE = 0`), first thing at startup: a
/// process the runner starts (a job script, a plugin's granted process) runs as the same
/// user, and could otherwise read `/proc/<runner pid>/environ` (the runner's whole
/// environment), `mem`, `fd/` or attach with ptrace. Children get their own dumpable flag
/// back at exec, so they are unaffected. The price: no core dumps of the runner, no debugger
/// or `strace -p` attaching as the same user (root with CAP_SYS_PTRACE still can), and the
/// runner itself cannot read its own `/proc/self/environ` or `io` (it never does).
pub(super) fn seal_process() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: prctl(PR_SET_DUMPABLE, 0) only changes this process's dumpable flag.
        let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
        if rc != 0 {
            tracing::warn!("cannot make the runner non-dumpable: {}", std::io::Error::last_os_error());
        }
    }
}

/// Load and report a config file.
pub(super) fn load_config(path: &Path) -> anyhow::Result<Loaded> {
    let loaded = config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    for warning in &loaded.warnings {
        tracing::warn!("{warning}");
    }
    for runner in &loaded.config.runners {
        let set = runner.feature_flags.iter().map(|(name, value)| (name.as_str(), *value));
        for message in crate::payload::flags::notice_unsupported(set) {
            tracing::warn!("{}: runner {:?}: feature_flags: {message}", path.display(), runner.name);
        }
    }
    Ok(loaded)
}

/// Runway's helper image for the `docker` capability, built from this machine's files once per
/// process (on the first job that needs it).
pub(super) fn helper_image() -> HelperImageSource {
    static BUILT: std::sync::OnceLock<Result<(String, bytes::Bytes), HelperImageError>> = std::sync::OnceLock::new();
    HelperImageSource::new(|| {
        BUILT
            .get_or_init(|| {
                crate::connector::rootfs::helper_rootfs()
                    .map(|h| (h.reference, bytes::Bytes::from(h.rootfs.tar)))
                    .map_err(HelperImageError::new)
            })
            .clone()
    })
}

/// The plugin host for a config.
pub(super) async fn plugin_host(loaded: &Loaded) -> anyhow::Result<PluginHost> {
    PluginHost::new(host_settings(loaded)).await
}

/// The plugin host's settings from the loaded config.
pub(super) fn host_settings(loaded: &Loaded) -> HostSettings {
    HostSettings {
        plugins_dir: Some(loaded.plugins_dir()),
        cache_dir: Some(loaded.plugin_cache_dir()),
        state_dir: Some(loaded.state_dir()),
        grants: loaded.grants(),
        builtins: builtin_plugins(),
        helper_image: Some(helper_image()),
        stage_output: StageOutput::LogFiles,
    }
}

/// The plugin host `runway run` would load from the config file at `config` (default path
/// when `None`), with `plugins_dir` over its directory; without a config file, the built-ins
/// and `plugins_dir` with no grants.
pub(super) async fn plugin_host_of_file(
    config: Option<&Path>,
    plugins_dir: Option<PathBuf>,
) -> anyhow::Result<PluginHost> {
    let path = config.map(Path::to_path_buf).unwrap_or_else(crate::config::default_path);
    if path.exists() {
        let mut loaded = load_config(&path)?;
        if let Some(dir) = plugins_dir {
            loaded.config.plugins_dir = Some(dir);
        }
        return plugin_host(&loaded).await;
    }
    PluginHost::new(HostSettings {
        plugins_dir,
        cache_dir: None,
        state_dir: None,
        grants: Default::default(),
        builtins: builtin_plugins(),
        helper_image: Some(helper_image()),
        stage_output: StageOutput::LogFiles,
    })
    .await
}

/// The distributed cache of `runner` (`[runners.cache]` with a `Type`), its credentials
/// loaded and kept fresh; `None` without one.
pub(crate) async fn runner_cache(
    runner: &RunnerConfig,
    short_token: &str,
) -> anyhow::Result<Option<Arc<dyn crate::script::CacheSigner>>> {
    let Some(cfg) = &runner.cache else { return Ok(None) };
    let Some(store) =
        crate::cache::CacheStore::from_config(cfg).map_err(|e| anyhow::anyhow!("[runners.cache]: {e}"))?
    else {
        return Ok(None);
    };
    let store = Arc::new(store);
    // The refresher ends when the runner (after a reload) lets go of the store.
    let _refresher = crate::cache::signer::RunnerCache::start_refreshing(store.clone()).await;
    Ok(Some(Arc::new(crate::cache::signer::RunnerCache::new(store, short_token))))
}

/// The helper command of jobs of `executor`: the helper executable (`runway-helper` beside
/// this binary, else this binary) for executors that run the stages on this machine or on
/// fleet instances (copied there when a job needs it); its copy in Runway's helper image for
/// the docker plugin's helper containers; none for other executors running jobs in images.
pub(crate) fn helper_command(executor: &ResolvedExecutor) -> Option<String> {
    let features = executor.features();
    if !features.helper {
        return None;
    }
    if features.image {
        return Some(crate::connector::rootfs::HELPER_BINARY.to_string());
    }
    crate::connector::rootfs::helper_executable().ok().map(|p| p.display().to_string())
}

/// The labels GitLab gets for `runner`: the global `labels`, overlaid by the runner's.
pub(crate) fn labels(config: &Config, runner: &RunnerConfig) -> std::collections::BTreeMap<String, String> {
    let mut labels = config.labels.clone();
    labels.extend(runner.labels.clone());
    labels
}

fn client_with(tls: &config::tls::TlsFiles, hook: Option<RequestHook>) -> anyhow::Result<GitLabClient> {
    let tls_client_cert = match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
        (None, None) => None,
        _ => anyhow::bail!("tls-cert-file and tls-key-file go together"),
    };
    Ok(GitLabClient::new(ClientOptions {
        hook,
        tls_ca_file: tls.ca_file.clone(),
        tls_client_cert,
        ..ClientOptions::default()
    })?)
}

/// A client honouring a runner's TLS files: `tls-ca-file`, `tls-cert-file`/`tls-key-file`,
/// or `<host>.crt`, `<host>.auth.crt`/`<host>.auth.key` in `certs_dir` (gitlab-runner's
/// discovery). The system's trusted certificates are always trusted too.
pub(super) fn client_for(
    runner: &RunnerConfig,
    certs_dir: &Path,
    hook: Option<RequestHook>,
) -> anyhow::Result<GitLabClient> {
    client_with(&runner.tls_files(certs_dir), hook).map_err(|e| anyhow::anyhow!("runner {:?}: {e:#}", runner.name))
}

/// Reset the token of `runners[index]` of the config file at `path` at GitLab and write the
/// new one (with `token_obtained_at` and `token_expires_at`) into the file in place. The
/// runner's `token` in the file must be the literal `runner.token` still.
pub(crate) async fn reset_runner_token(
    path: &Path,
    index: usize,
    runner: &RunnerConfig,
    system_id: &str,
    pat: Option<&str>,
) -> anyhow::Result<TokenUpdate> {
    let client = client_for(runner, &config::tls::certs_dir(path), None)?;
    let reset = match pat {
        // gitlab-runner's `--pat`: the runner's id and a user's access token, for a runner whose
        // own token is lost or expired.
        Some(pat) => {
            if runner.id == 0 {
                anyhow::bail!("--pat needs the runner's id in config.toml (`id`), which this entry lacks");
            }
            client.reset_token_with_pat(&runner.resolved_url(), runner.id, pat).await?
        }
        None => {
            let creds = RunnerCredentials {
                url: runner.resolved_url(),
                token: runner.resolved_token(),
                system_id: system_id.to_string(),
            };
            client.reset_token(&creds).await?
        }
    };
    let update = TokenUpdate { token: reset.token, obtained_at: now_in_seconds(), expires_at: reset.token_expires_at };
    config::edit::set_runner_token(path, index, &runner.token, &update)?;
    Ok(update)
}

/// Now, to the second (as config.toml keeps token times).
pub(crate) fn now_in_seconds() -> chrono::DateTime<chrono::Utc> {
    use chrono::Timelike;
    let now = chrono::Utc::now();
    now.with_nanosecond(0).unwrap_or(now)
}
