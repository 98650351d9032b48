//! Hot reload: a `notify` watcher on `plugins_dir`, debounced, that rescans the directory.
//!
//! A new or replaced file serves new calls once loaded (well within 2 s); calls already
//! running keep the version they started with (they hold its `Arc`); a removed file stops
//! new calls; a corrupt, incompatible or half-written file is rejected with a log line and
//! the previous version keeps serving (a partial file fails the full-binary parse).

use std::sync::Weak;
use std::time::Duration;

use notify::{RecursiveMode, Watcher as _};

use crate::plugin::registry::Registry;

/// Quiet time after the last event before rescanning (editors and `cp` make several).
pub const DEBOUNCE: Duration = Duration::from_millis(200);

/// Keeps the watcher alive; dropping it stops watching.
pub struct DirWatcher {
    _watcher: notify::RecommendedWatcher,
    _task: tokio::task::JoinHandle<()>,
}

/// Watch `registry`'s plugins_dir and rescan on changes.
pub(crate) fn watch(registry: Weak<Registry>, dir: &std::path::Path) -> anyhow::Result<DirWatcher> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event {
            if !matches!(event.kind, notify::EventKind::Access(_)) {
                let _ = tx.send(());
            }
        }
    })?;
    watcher.watch(dir, RecursiveMode::NonRecursive)?;
    let task = tokio::spawn(async move {
        while rx.recv().await.is_some() {
            // Debounce: wait until no event arrived for DEBOUNCE.
            loop {
                match tokio::time::timeout(DEBOUNCE, rx.recv()).await {
                    Ok(Some(())) => continue,
                    Ok(None) => return,
                    Err(_) => break,
                }
            }
            let Some(registry) = registry.upgrade() else { return };
            registry.rescan().await;
        }
    });
    Ok(DirWatcher { _watcher: watcher, _task: task })
}
