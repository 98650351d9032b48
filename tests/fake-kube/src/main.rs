//! `fake-kube`: a Kubernetes API server and kubelet on a real Docker Engine, for tests.
//! Parses the flags, makes the certificates and the kubeconfig, creates the `default`
//! namespace, starts the kubelet and serves HTTPS until SIGTERM/SIGINT, then stops and
//! removes every container and volume it made. See README.md.

mod api;
mod app;
mod auth;
mod control;
mod controller;
mod docker;
mod faults;
mod kubelet;
mod proto;
mod rbac;
mod resets;
mod resources;
mod selectors;
mod status;
mod store;
mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use serde_json::json;

/// A Kubernetes API server and kubelet on a real Docker Engine, for tests.
#[derive(Debug, Parser)]
#[command(name = "fake-kube", version)]
struct Args {
    /// Address to serve HTTPS on (127.0.0.1:PORT; port 0 picks one, the kubeconfig names it).
    #[arg(long)]
    listen: SocketAddr,
    /// The Docker Engine the kubelet runs pods on: unix:///path/docker.sock.
    #[arg(long)]
    docker_host: String,
    /// Where to write the kubeconfig (CA, admin bearer token, context `fake-kube`).
    #[arg(long)]
    kubeconfig_out: PathBuf,
    /// `none`: each pod gets a loopback-only network namespace of its own (containers of a
    /// pod reach each other on localhost); `host`: every pod shares the host's network (the
    /// fake's stand-in for a CNI, so pods reach servers on 127.0.0.1).
    #[arg(long, default_value = "none", value_parser = ["none", "host"])]
    pod_network: String,
    /// The image of every pod's pause container (it runs `sleep infinity`).
    #[arg(long, default_value = "runway-test/job:1")]
    pause_image: String,
    /// How many changes watches can resume from; older resourceVersions get 410 Expired.
    #[arg(long, default_value_t = 1000)]
    watch_window: usize,
    /// Where pods' secret/configMap files and /etc/hosts live (default: a temp directory).
    #[arg(long)]
    state_dir: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(serve(args))
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let docker = docker::Docker::new(&args.docker_host)?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let local = listener.local_addr()?;
    let certificates = tls::make_certificates(local.ip())?;
    let admin_token: String = {
        use rand::Rng;
        let mut rng = rand::rng();
        (0..40).map(|_| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.random_range(0..36)])).collect()
    };
    let state_dir = match args.state_dir {
        Some(dir) => dir,
        None => std::env::temp_dir().join(format!("fake-kube-{}", std::process::id())),
    };
    std::fs::create_dir_all(&state_dir)?;
    let store = Arc::new(store::Store::new(args.watch_window));
    for name in ["default", "kube-system", "kube-public"] {
        let namespace = json!({"metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}});
        store.create(resources::NAMESPACES, "", namespace).map_err(|e| anyhow::anyhow!("{e}"))?;
        store
            .create(resources::SERVICEACCOUNTS, name, json!({"metadata": {"name": "default"}}))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        store
            .create(resources::CONFIGMAPS, name, rbac::root_ca_config_map(&certificates.ca_pem))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let tokens = Arc::new(auth::Tokens::new(&admin_token));
    let faults = Arc::new(faults::Faults::new());
    let settings = kubelet::Settings {
        pause_image: args.pause_image,
        host_network: args.pod_network == "host",
        state_dir: state_dir.clone(),
        api: local,
        tokens: tokens.clone(),
    };
    let kubelet = kubelet::Kubelet::new(store.clone(), docker, faults.clone(), settings);
    tokio::spawn(kubelet.clone().run());
    tokio::spawn(controller::run(store.clone()));
    let ca_pem = certificates.ca_pem.clone();
    let app = Arc::new(app::App { store, tokens, ca_pem, kubelet: kubelet.clone(), faults: faults.clone() });
    tls::write_kubeconfig(&args.kubeconfig_out, local, &certificates.ca_pem, &admin_token)?;
    let listener = tls::TlsListener::new(listener, certificates.server, faults.connections())?;
    tracing::info!("fake-kube serving https://{local}, kubeconfig {}", args.kubeconfig_out.display());
    eprintln!("fake-kube: serving https://{local} (kubeconfig {})", args.kubeconfig_out.display());
    let server = axum::serve(listener, api::router(app).into_make_service_with_connect_info::<tls::Peer>());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = server => result?,
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    eprintln!("fake-kube: stopping; removing its containers and volumes");
    kubelet.shutdown().await;
    let _ = std::fs::remove_dir_all(&state_dir);
    Ok(())
}
