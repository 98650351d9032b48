//! Where a Kubernetes API server is and how to authenticate to it, resolved as gitlab-runner's
//! client resolves `[runners.kubernetes]`: an explicit `host` (with `bearer_token`, or
//! `cert_file`/`key_file`/`ca_file`), else the in-cluster service account of a runner running
//! in a pod, else the kubeconfig files (`KUBECONFIG`, a colon-separated list merged first-wins,
//! or `~/.kube/config`) at their current context or `context`.
//!
//! Owns: [`ClusterSettings`], [`Endpoint`] (server URL, TLS configuration, bearer token, where
//! it came from) and the kubeconfig reading. Must not touch: connections (`client`), WIT types.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine as _;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use tokio_rustls::rustls;

use super::KubeError;

/// Where the in-cluster service account is mounted in every pod.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// `[runners.kubernetes]`'s connection keys; empty strings are keys not set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterSettings {
    /// API server URL.
    pub host: String,
    /// Bearer token.
    pub bearer_token: String,
    /// Client certificate file.
    pub cert_file: String,
    /// Client key file.
    pub key_file: String,
    /// CA bundle file.
    pub ca_file: String,
    /// kubeconfig context.
    pub context: String,
}

/// A resolved API server: where it is, how its certificate is checked and how we present
/// ourselves.
#[derive(Clone)]
pub struct Endpoint {
    /// `https://host:port` (or `http://` for a local proxy), no trailing slash.
    pub server: String,
    /// TLS client configuration (roots, client certificate).
    pub tls: Arc<rustls::ClientConfig>,
    /// `Authorization: Bearer` token, if any (as read when resolved; see [`Endpoint::bearer`]).
    pub token: Option<String>,
    /// The file the token is read from again on each call (the in-cluster service account's
    /// projected token, which the kubelet rotates), as client-go's file token source does.
    pub token_file: Option<PathBuf>,
    /// The namespace of the in-cluster service account (its `namespace` file), if any.
    pub namespace: Option<String>,
    /// Where the configuration came from, for the job log.
    pub source: String,
}

impl Endpoint {
    /// The bearer token to send now: the token file read again when there is one (a rotated
    /// token replaces the old one; a file that cannot be read keeps the last token, as
    /// client-go does), else the resolved token.
    pub fn bearer(&self) -> Option<String> {
        let Some(file) = &self.token_file else {
            return self.token.clone();
        };
        match std::fs::read_to_string(file) {
            Ok(token) if !token.trim().is_empty() => Some(token.trim().to_string()),
            Ok(_) => self.token.clone(),
            Err(e) => {
                tracing::warn!(file = %file.display(), "reading the service account token again: {e}; using the last one");
                self.token.clone()
            }
        }
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("server", &self.server).field("source", &self.source).finish_non_exhaustive()
    }
}

/// What the resolution may read of the runner's environment (tests pass their own).
pub struct Environment<'a> {
    /// An environment variable.
    pub var: &'a dyn Fn(&str) -> Option<String>,
    /// The user's home directory.
    pub home: Option<PathBuf>,
    /// The service account directory ([`SERVICE_ACCOUNT_DIR`] in production).
    pub service_account_dir: PathBuf,
}

impl Environment<'_> {
    /// The runner's own environment.
    pub fn process() -> Environment<'static> {
        fn var(key: &str) -> Option<String> {
            std::env::var(key).ok().filter(|v| !v.is_empty())
        }
        Environment {
            var: &var,
            home: std::env::var_os("HOME").map(PathBuf::from),
            service_account_dir: PathBuf::from(SERVICE_ACCOUNT_DIR),
        }
    }
}

/// Resolve `settings` as gitlab-runner does.
pub fn resolve(settings: &ClusterSettings, env: &Environment<'_>) -> Result<Endpoint, KubeError> {
    if !settings.host.trim().is_empty() {
        return explicit(settings);
    }
    let not_in_cluster = match in_cluster(env) {
        InCluster::Yes(endpoint) => return Ok(*endpoint),
        InCluster::Broken(error) => return Err(error),
        InCluster::No(why) => why,
    };
    kubeconfig(settings, env, &not_in_cluster)
}

/// The namespace of the in-cluster service account (the `namespace` file next to its token),
/// when the runner runs in a pod: the namespace jobs run in when `[runners.kubernetes]` sets
/// neither `host` nor `namespace`.
pub fn in_cluster_namespace(env: &Environment<'_>) -> Option<String> {
    (env.var)("KUBERNETES_SERVICE_HOST")?;
    let text = std::fs::read_to_string(env.service_account_dir.join("namespace")).ok()?;
    Some(text.trim().to_string()).filter(|n| !n.is_empty())
}

fn config_error(text: impl Into<String>) -> KubeError {
    KubeError::Config(text.into())
}

/// `host` with `bearer_token` or the certificate files.
fn explicit(settings: &ClusterSettings) -> Result<Endpoint, KubeError> {
    let server = normalize_server(&settings.host)?;
    if !settings.cert_file.is_empty() && (settings.key_file.is_empty() || settings.ca_file.is_empty()) {
        return Err(config_error(
            "[runners.kubernetes] cert_file: ca_file, cert_file and key_file must be specified when using file based auth",
        ));
    }
    let roots = match settings.ca_file.as_str() {
        "" => Roots::System,
        file => Roots::Pem(read_file("ca_file", Path::new(file))?),
    };
    let client = match settings.cert_file.as_str() {
        "" => None,
        cert => Some((read_file("cert_file", Path::new(cert))?, read_file("key_file", Path::new(&settings.key_file))?)),
    };
    let token = Some(settings.bearer_token.trim().to_string()).filter(|t| !t.is_empty());
    Ok(Endpoint {
        tls: tls_config(&roots, client.as_ref())?,
        token,
        token_file: None,
        namespace: None,
        source: format!("host {server}"),
        server,
    })
}

/// What the in-cluster configuration found.
enum InCluster {
    /// The runner runs in a pod with a service account.
    Yes(Box<Endpoint>),
    /// It does not (why not, for the error when nothing else is configured either).
    No(String),
    /// It runs in a pod whose service account cannot be used (an error naming what).
    Broken(KubeError),
}

/// The in-cluster service account, when the runner runs in a pod, as client-go's
/// `rest.InClusterConfig`: `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT` name the
/// API server; the service account directory holds `token` and `ca.crt`. Without both
/// variables (or without the token file, which a pod with `automountServiceAccountToken:
/// false` lacks) the runner is not in a cluster and the kubeconfig is next, as in
/// gitlab-runner; with them, an unreadable CA or a half-set pair is an error naming it.
fn in_cluster(env: &Environment<'_>) -> InCluster {
    let dir = &env.service_account_dir;
    let token_file = dir.join("token");
    let (host, port) = match ((env.var)("KUBERNETES_SERVICE_HOST"), (env.var)("KUBERNETES_SERVICE_PORT")) {
        (Some(host), Some(port)) => (host, port),
        (None, None) => {
            return InCluster::No("not in a pod (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT not set)".into())
        }
        (Some(_), None) => {
            return InCluster::Broken(config_error(
                "in-cluster configuration: KUBERNETES_SERVICE_HOST is set but KUBERNETES_SERVICE_PORT is not",
            ))
        }
        (None, Some(_)) => {
            return InCluster::Broken(config_error(
                "in-cluster configuration: KUBERNETES_SERVICE_PORT is set but KUBERNETES_SERVICE_HOST is not",
            ))
        }
    };
    let token = match std::fs::read_to_string(&token_file) {
        Ok(token) if !token.trim().is_empty() => token.trim().to_string(),
        Ok(_) => {
            return InCluster::No(format!("in a pod, but the service account token {} is empty", token_file.display()))
        }
        Err(e) => {
            return InCluster::No(format!(
                "in a pod, but without a service account token ({}: {e}; is automountServiceAccountToken false?)",
                token_file.display()
            ))
        }
    };
    let host = if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host };
    let server = format!("https://{host}:{port}");
    let roots = match read_file("in-cluster configuration: the service account's CA", &dir.join("ca.crt")) {
        Ok(ca) => Roots::Pem(ca),
        Err(e) => return InCluster::Broken(e),
    };
    let tls = match tls_config(&roots, None) {
        Ok(tls) => tls,
        Err(e) => return InCluster::Broken(config_error(format!("in-cluster configuration: {e}"))),
    };
    let namespace = in_cluster_namespace(env);
    InCluster::Yes(Box::new(Endpoint {
        tls,
        token: Some(token),
        token_file: Some(token_file),
        namespace,
        source: format!("in-cluster service account ({server})"),
        server,
    }))
}

fn read_file(what: &str, path: &Path) -> Result<Vec<u8>, KubeError> {
    std::fs::read(path).map_err(|e| config_error(format!("{what} {}: {e}", path.display())))
}

/// An API server URL without a trailing slash; a bare `host:port` is https.
fn normalize_server(host: &str) -> Result<String, KubeError> {
    let host = host.trim().trim_end_matches('/');
    let url = if host.contains("://") { host.to_string() } else { format!("https://{host}") };
    let parsed = url::Url::parse(&url).map_err(|e| config_error(format!("API server {host:?}: {e}")))?;
    if !matches!(parsed.scheme(), "https" | "http") || parsed.host_str().is_none() {
        return Err(config_error(format!("API server {host:?}: not an http(s) URL")));
    }
    Ok(url)
}

/// Which certificates the server's must chain to.
enum Roots {
    /// The machine's trusted roots.
    System,
    /// A PEM bundle.
    Pem(Vec<u8>),
}

fn tls_config(roots: &Roots, client: Option<&(Vec<u8>, Vec<u8>)>) -> Result<Arc<rustls::ClientConfig>, KubeError> {
    let mut store = rustls::RootCertStore::empty();
    match roots {
        Roots::System => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                let _ = store.add(cert);
            }
        }
        Roots::Pem(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| config_error(format!("CA certificate: {e}")))?;
                store.add(cert).map_err(|e| config_error(format!("CA certificate: {e}")))?;
            }
            if store.is_empty() {
                return Err(config_error("CA certificate: no certificate in the PEM data"));
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| config_error(format!("TLS: {e}")))?
        .with_root_certificates(store);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let certs = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| config_error(format!("client certificate: {e}")))?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| config_error(format!("client key: {e}")))?;
            builder.with_client_auth_cert(certs, key).map_err(|e| config_error(format!("client certificate: {e}")))?
        }
    };
    Ok(Arc::new(config))
}

/// One kubeconfig file, as far as a client reads it.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct KubeconfigFile {
    #[serde(default)]
    clusters: Vec<Named<ClusterEntry>>,
    #[serde(default)]
    users: Vec<Named<UserEntry>>,
    #[serde(default)]
    contexts: Vec<Named<ContextEntry>>,
    #[serde(default)]
    current_context: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "cluster", alias = "user", alias = "context")]
    value: T,
}

#[derive(Debug, Default, Deserialize, Clone)]
#[serde(rename_all = "kebab-case")]
struct ClusterEntry {
    server: String,
    #[serde(default)]
    certificate_authority: Option<String>,
    #[serde(default)]
    certificate_authority_data: Option<String>,
    #[serde(default)]
    insecure_skip_tls_verify: bool,
}

#[derive(Debug, Default, Deserialize, Clone)]
#[serde(rename_all = "kebab-case")]
struct UserEntry {
    #[serde(default)]
    token: Option<String>,
    #[serde(default, rename = "tokenFile")]
    token_file: Option<String>,
    #[serde(default)]
    client_certificate: Option<String>,
    #[serde(default)]
    client_certificate_data: Option<String>,
    #[serde(default)]
    client_key: Option<String>,
    #[serde(default)]
    client_key_data: Option<String>,
    #[serde(default)]
    exec: Option<serde_yaml::Value>,
    #[serde(default, rename = "auth-provider")]
    auth_provider: Option<serde_yaml::Value>,
}

#[derive(Debug, Default, Deserialize, Clone)]
struct ContextEntry {
    cluster: String,
    #[serde(default)]
    user: String,
}

/// An entry found in a kubeconfig file, with that file's directory (relative paths in it are
/// relative to it).
struct Found<T> {
    value: T,
    dir: PathBuf,
}

/// The kubeconfig files, in the order their entries win.
fn kubeconfig_files(env: &Environment<'_>) -> Vec<PathBuf> {
    match (env.var)("KUBECONFIG") {
        Some(list) => list.split(':').filter(|p| !p.is_empty()).map(PathBuf::from).collect(),
        None => env.home.iter().map(|h| h.join(".kube").join("config")).collect(),
    }
}

fn kubeconfig(settings: &ClusterSettings, env: &Environment<'_>, not_in_cluster: &str) -> Result<Endpoint, KubeError> {
    let mut files = Vec::new();
    for path in kubeconfig_files(env) {
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(config_error(format!("kubeconfig {}: {e}", path.display()))),
        };
        let parsed: KubeconfigFile =
            serde_yaml::from_str(&text).map_err(|e| config_error(format!("kubeconfig {}: {e}", path.display())))?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        files.push((path, dir, parsed));
    }
    if files.is_empty() {
        return Err(config_error(format!(
            "no Kubernetes API server configured: set host in [runners.kubernetes], run the runner in a pod, or provide a kubeconfig (KUBECONFIG or ~/.kube/config); in-cluster: {not_in_cluster}",
        )));
    }
    let context_name = if settings.context.is_empty() {
        files
            .iter()
            .find_map(|(_, _, f)| f.current_context.clone().filter(|c| !c.is_empty()))
            .ok_or_else(|| config_error("kubeconfig: no current-context set (set context in [runners.kubernetes])"))?
    } else {
        settings.context.clone()
    };
    let context = first(&files, |f| &f.contexts, &context_name)
        .ok_or_else(|| config_error(format!("kubeconfig: context {context_name:?} not found")))?;
    let cluster = first(&files, |f| &f.clusters, &context.value.cluster).ok_or_else(|| {
        config_error(format!("kubeconfig: cluster {:?} of context {context_name:?} not found", context.value.cluster))
    })?;
    let user =
        match context.value.user.as_str() {
            "" => None,
            name => Some(first(&files, |f| &f.users, name).ok_or_else(|| {
                config_error(format!("kubeconfig: user {name:?} of context {context_name:?} not found"))
            })?),
        };
    let server = normalize_server(&cluster.value.server)?;
    if cluster.value.insecure_skip_tls_verify {
        return Err(config_error(format!(
            "kubeconfig: cluster {:?} sets insecure-skip-tls-verify, which Runway does not honour: give it certificate-authority(-data)",
            context.value.cluster
        )));
    }
    let roots = match (&cluster.value.certificate_authority_data, &cluster.value.certificate_authority) {
        (Some(data), _) => Roots::Pem(decode("certificate-authority-data", data)?),
        (None, Some(file)) => Roots::Pem(read_file("certificate-authority", &cluster.dir.join(file))?),
        (None, None) => Roots::System,
    };
    let mut token = None;
    let mut client = None;
    if let Some(user) = user {
        let u = &user.value;
        if u.exec.is_some() || u.auth_provider.is_some() {
            return Err(config_error(format!(
                "kubeconfig: user {:?} authenticates with an exec or auth-provider plugin, which Runway does not run: use a token or a client certificate",
                context.value.user
            )));
        }
        token = match (&u.token, &u.token_file) {
            (Some(t), _) => Some(t.trim().to_string()),
            (None, Some(file)) => {
                Some(String::from_utf8_lossy(&read_file("tokenFile", &user.dir.join(file))?).trim().to_string())
            }
            (None, None) => None,
        };
        let cert = match (&u.client_certificate_data, &u.client_certificate) {
            (Some(data), _) => Some(decode("client-certificate-data", data)?),
            (None, Some(file)) => Some(read_file("client-certificate", &user.dir.join(file))?),
            (None, None) => None,
        };
        let key = match (&u.client_key_data, &u.client_key) {
            (Some(data), _) => Some(decode("client-key-data", data)?),
            (None, Some(file)) => Some(read_file("client-key", &user.dir.join(file))?),
            (None, None) => None,
        };
        client = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err(config_error("kubeconfig: a client certificate needs both certificate and key")),
        };
    }
    if !settings.bearer_token.trim().is_empty() {
        token = Some(settings.bearer_token.trim().to_string());
    }
    let file = files.first().map(|(p, _, _)| p.display().to_string()).unwrap_or_default();
    Ok(Endpoint {
        tls: tls_config(&roots, client.as_ref())?,
        token: token.filter(|t| !t.is_empty()),
        token_file: None,
        namespace: None,
        source: format!("kubeconfig {file} (context {context_name})"),
        server,
    })
}

/// The first entry named `name` across the files (kubeconfig merging: the first file wins).
fn first<T: Clone>(
    files: &[(PathBuf, PathBuf, KubeconfigFile)],
    list: impl Fn(&KubeconfigFile) -> &Vec<Named<T>>,
    name: &str,
) -> Option<Found<T>> {
    files.iter().find_map(|(_, dir, file)| {
        list(file).iter().find(|n| n.name == name).map(|n| Found { value: n.value.clone(), dir: dir.clone() })
    })
}

fn decode(what: &str, data: &str) -> Result<Vec<u8>, KubeError> {
    base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| config_error(format!("kubeconfig {what}: not base64: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CA: &str = include_str!("../../../../tests/fixtures/kube/ca.pem");

    fn env<'a>(vars: &'a dyn Fn(&str) -> Option<String>, home: &Path, sa: &Path) -> Environment<'a> {
        Environment { var: vars, home: Some(home.to_path_buf()), service_account_dir: sa.to_path_buf() }
    }

    #[test]
    fn an_explicit_host_wins_and_file_auth_needs_all_three_files() {
        let dir = tempfile::tempdir().expect("dir");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, CA).expect("ca");
        let settings = ClusterSettings {
            host: "https://127.0.0.1:6443/".into(),
            bearer_token: "tok".into(),
            ca_file: ca.display().to_string(),
            ..Default::default()
        };
        let none = |_: &str| None;
        let e = resolve(&settings, &env(&none, dir.path(), dir.path())).expect("resolved");
        assert_eq!((e.server.as_str(), e.token.as_deref()), ("https://127.0.0.1:6443", Some("tok")));
        let bad = ClusterSettings { cert_file: "/c.pem".into(), ..settings };
        let err = resolve(&bad, &env(&none, dir.path(), dir.path())).expect_err("no key").to_string();
        assert!(err.contains("must be specified when using file based auth"), "{err}");
    }

    #[test]
    fn in_cluster_comes_before_the_kubeconfig() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("token"), "sa-token\n").expect("token");
        std::fs::write(dir.path().join("ca.crt"), CA).expect("ca");
        let vars = |k: &str| match k {
            "KUBERNETES_SERVICE_HOST" => Some("10.0.0.1".to_string()),
            "KUBERNETES_SERVICE_PORT" => Some("443".to_string()),
            _ => None,
        };
        let e = resolve(&ClusterSettings::default(), &env(&vars, dir.path(), dir.path())).expect("in cluster");
        assert_eq!((e.server.as_str(), e.token.as_deref()), ("https://10.0.0.1:443", Some("sa-token")));
        assert!(e.source.starts_with("in-cluster"), "{}", e.source);
        assert_eq!(e.namespace, None, "no namespace file");
    }

    #[test]
    fn in_cluster_reads_the_rotated_token_again_and_the_namespace() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("token"), "first\n").expect("token");
        std::fs::write(dir.path().join("ca.crt"), CA).expect("ca");
        std::fs::write(dir.path().join("namespace"), "runway\n").expect("namespace");
        let vars = |k: &str| match k {
            "KUBERNETES_SERVICE_HOST" => Some("fd00::1".to_string()),
            "KUBERNETES_SERVICE_PORT" => Some("6443".to_string()),
            _ => None,
        };
        let env = env(&vars, dir.path(), dir.path());
        let e = resolve(&ClusterSettings::default(), &env).expect("in cluster");
        assert_eq!((e.server.as_str(), e.namespace.as_deref()), ("https://[fd00::1]:6443", Some("runway")));
        assert_eq!(e.bearer().as_deref(), Some("first"));
        std::fs::write(dir.path().join("token"), "second\n").expect("rotated");
        assert_eq!(e.bearer().as_deref(), Some("second"), "the projected token rotates");
        std::fs::remove_file(dir.path().join("token")).expect("gone");
        assert_eq!(e.bearer().as_deref(), Some("first"), "an unreadable file keeps the resolved token");
        assert_eq!(in_cluster_namespace(&env).as_deref(), Some("runway"));
    }

    #[test]
    fn in_cluster_errors_name_what_is_missing() {
        let dir = tempfile::tempdir().expect("dir");
        let host_only = |k: &str| (k == "KUBERNETES_SERVICE_HOST").then(|| "10.0.0.1".to_string());
        let err = resolve(&ClusterSettings::default(), &env(&host_only, dir.path(), dir.path())).expect_err("half");
        assert!(err.to_string().contains("KUBERNETES_SERVICE_PORT is not"), "{err}");
        let both = |k: &str| match k {
            "KUBERNETES_SERVICE_HOST" => Some("10.0.0.1".to_string()),
            "KUBERNETES_SERVICE_PORT" => Some("443".to_string()),
            _ => None,
        };
        let err = resolve(&ClusterSettings::default(), &env(&both, dir.path(), dir.path())).expect_err("no token");
        let token = dir.path().join("token").display().to_string();
        assert!(err.to_string().contains(&token) && err.to_string().contains("automountServiceAccountToken"), "{err}");
        std::fs::write(dir.path().join("token"), "t").expect("token");
        let err = resolve(&ClusterSettings::default(), &env(&both, dir.path(), dir.path())).expect_err("no ca");
        assert!(err.to_string().contains("service account's CA") && err.to_string().contains("ca.crt"), "{err}");
    }

    #[test]
    fn kubeconfig_files_merge_first_wins_and_context_picks_the_cluster() {
        let dir = tempfile::tempdir().expect("dir");
        let data = base64::engine::general_purpose::STANDARD.encode(CA);
        std::fs::write(dir.path().join("ca.pem"), CA).expect("ca");
        let a = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: one\nclusters:\n- name: c1\n  cluster:\n    server: https://127.0.0.1:1\n    certificate-authority-data: {data}\ncontexts:\n- name: one\n  context:\n    cluster: c1\n    user: u1\nusers:\n- name: u1\n  user:\n    token: t1\n"
        );
        let b = "clusters:\n- name: c1\n  cluster:\n    server: https://127.0.0.1:9\n- name: c2\n  cluster:\n    server: https://127.0.0.1:2\n    certificate-authority: ca.pem\ncontexts:\n- name: two\n  context:\n    cluster: c2\n    user: u2\nusers:\n- name: u2\n  user:\n    tokenFile: tok\n";
        std::fs::write(dir.path().join("a"), a).expect("a");
        std::fs::write(dir.path().join("b"), b).expect("b");
        std::fs::write(dir.path().join("tok"), "t2\n").expect("tok");
        let list = format!("{}:{}", dir.path().join("a").display(), dir.path().join("b").display());
        let vars = move |k: &str| (k == "KUBECONFIG").then(|| list.clone());
        let e = resolve(&ClusterSettings::default(), &env(&vars, dir.path(), dir.path())).expect("current");
        assert_eq!((e.server.as_str(), e.token.as_deref()), ("https://127.0.0.1:1", Some("t1")));
        let two = ClusterSettings { context: "two".into(), ..Default::default() };
        let e = resolve(&two, &env(&vars, dir.path(), dir.path())).expect("context two");
        assert_eq!((e.server.as_str(), e.token.as_deref()), ("https://127.0.0.1:2", Some("t2")));
        let missing = ClusterSettings { context: "three".into(), ..Default::default() };
        let err = resolve(&missing, &env(&vars, dir.path(), dir.path())).expect_err("missing").to_string();
        assert!(err.contains("\"three\" not found"), "{err}");
    }

    #[test]
    fn nothing_configured_says_where_it_looked() {
        let dir = tempfile::tempdir().expect("dir");
        let none = |_: &str| None;
        let err = resolve(&ClusterSettings::default(), &env(&none, dir.path(), dir.path())).expect_err("none");
        assert!(err.to_string().contains("~/.kube/config"), "{err}");
    }
}
