//! The kubernetes executor's orphans, swept by the runner's store watcher at start and on each
//! of its passes: pods, secrets and configmaps labelled with this runner whose job is in no
//! entry of the job store (nor running here), older than `orphan_cleanup_grace_period_seconds`,
//! are deleted — what gitlab-runner-pod-cleanup does as a deployment of its own. The objects
//! of a manager that died with its store would otherwise stay forever.
//!
//! Owns: listing and deleting those objects over `connector::kube`. The executor plugin owns
//! what the objects are and how they are labelled; `kube_logic` (shared with it) owns the
//! section's keys, the selector and which object is an orphan. Must not touch: the store (the
//! watcher hands the job ids it listed), jobs, the plugin.

use std::collections::BTreeSet;

use kube_logic::orphans::{self, Orphan};

use super::{ActiveJobs, Runner};
use crate::connector::kube::{ClusterSettings, KubeClient, KubeError};
use crate::stop::StopSignal;
use crate::store::jobs::Listed;

/// Most bytes of one list answer.
const MAX_LIST: usize = 32 << 20;

/// Delete the orphans of the runner with `short_token` and `[runners.kubernetes]` JSON
/// `config_json`: its objects whose job is not in `stored`. Returns what was deleted; failures
/// are logged (the next pass tries again).
pub(super) async fn sweep(
    config_json: &str,
    short_token: &str,
    stored: &BTreeSet<u64>,
    stop: &StopSignal,
) -> Vec<Orphan> {
    match try_sweep(config_json, short_token, stored, stop).await {
        Ok(deleted) => deleted,
        Err(e) => {
            tracing::warn!(runner = %short_token, "kubernetes orphan cleanup: {e}");
            Vec::new()
        }
    }
}

async fn try_sweep(
    config_json: &str,
    short_token: &str,
    stored: &BTreeSet<u64>,
    stop: &StopSignal,
) -> Result<Vec<Orphan>, KubeError> {
    let config = kube_logic::config::parse(config_json).map_err(KubeError::Config)?.config;
    let grace = config.orphan_cleanup_grace_period_seconds;
    if grace == 0 {
        return Ok(Vec::new());
    }
    let settings = ClusterSettings {
        host: config.host.clone(),
        bearer_token: config.bearer_token.clone(),
        cert_file: config.cert_file.clone(),
        key_file: config.key_file.clone(),
        ca_file: config.ca_file.clone(),
        context: config.context.clone(),
    };
    let client = KubeClient::connect(&settings, stop).await?;
    let namespace = config.namespace_or_default();
    let selector = orphans::selector(short_token);
    let now = chrono::Utc::now();
    let age = |created: &str| {
        let created = chrono::DateTime::parse_from_rfc3339(created).ok()?;
        u64::try_from((now - created.with_timezone(&chrono::Utc)).num_seconds()).ok().or(Some(0))
    };
    let mut deleted = Vec::new();
    for kind in orphans::KINDS {
        // The selector's values are sanitized labels: nothing in it needs escaping.
        let path = format!("/api/v1/namespaces/{namespace}/{kind}?labelSelector={selector}");
        let (status, body) = client.request("GET", &path, None, None, MAX_LIST, stop).await?;
        if status >= 300 {
            return Err(KubeError::from_status(status, &body));
        }
        let list: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| KubeError::Other(format!("listing {kind}: {e}")))?;
        for orphan in orphans::orphans(kind, &list, stored, grace, age) {
            let path = format!("/api/v1/namespaces/{}/{}/{}", orphan.namespace, orphan.kind, orphan.name);
            match client.request("DELETE", &path, None, None, 1 << 20, stop).await {
                Ok((status, _)) if status < 300 || status == 404 => {
                    tracing::warn!(
                        runner = %short_token, kind = %orphan.kind, namespace = %orphan.namespace,
                        name = %orphan.name, job = ?orphan.job, age_seconds = orphan.age_seconds,
                        "deleted an orphaned Kubernetes object (its job is in no job store entry)"
                    );
                    deleted.push(orphan);
                }
                Ok((status, body)) => tracing::warn!(
                    name = %orphan.name, "kubernetes orphan cleanup: deleting {}: {}", orphan.kind,
                    KubeError::from_status(status, &body)
                ),
                Err(e) => {
                    tracing::warn!(name = %orphan.name, "kubernetes orphan cleanup: deleting {}: {e}", orphan.kind)
                }
            }
        }
    }
    Ok(deleted)
}

/// The job ids a store pass listed, and those running here (their entries may be newer).
pub(super) fn stored_ids(listing: &[Listed], active: &ActiveJobs) -> BTreeSet<u64> {
    let mut ids: BTreeSet<u64> = listing
        .iter()
        .filter_map(|l| match l {
            Listed::Entry(meta) => Some(meta.job_id),
            Listed::Corrupt { job_id, .. } => *job_id,
        })
        .collect();
    if let Ok(active) = active.lock() {
        ids.extend(active.iter().filter_map(|id| u64::try_from(*id).ok()));
    }
    ids
}

/// [`sweep`] for `runner` when its executor is `kubernetes`.
pub(super) async fn sweep_runner(runner: &Runner, stored: &BTreeSet<u64>) {
    let executor = &runner.settings.env.executor;
    if executor.name() != "kubernetes" {
        return;
    }
    sweep(&executor.config_json, &runner.settings.env.settings.short_token, stored, &StopSignal::new()).await;
}
