//! `runway router -c router.toml`: load the router's file, open its store, start the router,
//! serve the runner API to downstream runners (plain or TLS) and the metrics, and stop on
//! SIGINT/SIGTERM/SIGQUIT — held jobs stay in the store for the next start.
//!
//! Wiring only: the router is `crate::router`, the file `config::router`, the metrics
//! `metrics::router`.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use tokio::signal::unix::{signal, SignalKind};

use crate::config;
use crate::router::tls::{server_config, TlsListener};
use crate::router::{Router, RouterSettings};
use crate::store::jobs::seal::StoreKey;

/// Run the router until a stop signal.
pub(super) async fn run(path: &Path) -> anyhow::Result<ExitCode> {
    let loaded = config::router::load(path)?;
    let router_id = config::router_id(&loaded.dir())?;
    let store_settings = loaded.store_settings();
    let store = match &store_settings.backend {
        None => None,
        Some(_) => {
            let key = StoreKey::load_or_create(&loaded.dir().join(".runway-store.key"))?;
            crate::store::jobs::open(&store_settings, key).await.context("opening [router.store]")?
        }
    };
    if let Some(store) = &store {
        tracing::info!(store = %store.describe(), "router store");
    }
    let settings = RouterSettings::from_config(&loaded, router_id.clone(), store)?;
    let r = &loaded.file.router;
    let listener = tokio::net::TcpListener::bind(&r.listen)
        .await
        .with_context(|| format!("{}: router.listen {}", path.display(), r.listen))?;
    let tls = match (&r.tls_cert_file, &r.tls_key_file) {
        (Some(cert), Some(key)) => Some(server_config(&loaded.dir().join(cert), &loaded.dir().join(key))?),
        _ => None,
    };
    let router = Router::start(settings).await;
    let _metrics = match &loaded.file.listen_address {
        Some(address) => Some(crate::metrics::router::serve(address, router.clone()).await?),
        None => None,
    };
    let local = listener.local_addr().context("router.listen")?;
    tracing::info!(address = %local, tls = tls.is_some(), id = %router_id, held = router.held(), "router serving the runner API");
    let stopping = {
        let router = router.clone();
        async move {
            let (Ok(mut term), Ok(mut quit)) = (signal(SignalKind::terminate()), signal(SignalKind::quit())) else {
                let _ = tokio::signal::ctrl_c().await;
                router.shutdown();
                return;
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
                _ = quit.recv() => {}
            }
            tracing::info!("stopping the router; held jobs stay in its store");
            router.shutdown();
        }
    };
    let app = router.app();
    let served = match tls {
        Some(config) => {
            let listener = TlsListener::new(listener, config).context("router.listen")?;
            axum::serve(listener, app).with_graceful_shutdown(stopping).await
        }
        None => axum::serve(listener, app).with_graceful_shutdown(stopping).await,
    };
    served.context("serving the runner API")?;
    Ok(ExitCode::SUCCESS)
}
