//! Watch streams (`?watch=1`): newline-delimited `{"type": …, "object": …}` events over a
//! chunked answer, from `resourceVersion` (replayed from the store's window; `410 Expired`
//! as an ERROR event when older), with label/field selectors, `allowWatchBookmarks`
//! (BOOKMARK events), `sendInitialEvents` (watch-list: ADDED events, then the
//! `k8s.io/initial-events-end` bookmark), `timeoutSeconds`, Table objects when asked, and the fault knob that cuts
//! every open watch.

use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use serde_json::{json, Value};

use super::{table, Query, Target};
use crate::app::Shared;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::Change;

fn line(kind: &str, object: &Value) -> Bytes {
    let mut text = json!({"type": kind, "object": object}).to_string();
    text.push('\n');
    Bytes::from(text)
}

/// Answer a watch request.
pub(super) fn serve(app: Shared, target: Target, query: Query, accept: &str) -> Result<Response, ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or(""))?;
    let fields = FieldSelector::parse(query.get("fieldSelector").unwrap_or(""))?;
    // `sendInitialEvents=true` (client-go's watch-list): the current objects as ADDED, then a
    // BOOKMARK annotated `k8s.io/initial-events-end`.
    let initial_events = query.flag("sendInitialEvents");
    let from = match query.get("resourceVersion").filter(|_| !initial_events) {
        None | Some("") | Some("0") => None,
        Some(v) => Some(v.parse::<u64>().map_err(|_| ApiError::bad_request(format!("invalid resource version: {v}")))?),
    };
    let bookmarks = query.flag("allowWatchBookmarks");
    let timeout = query.get("timeoutSeconds").and_then(|t| t.parse::<u64>().ok()).map(Duration::from_secs);
    let as_table = table::wants_table(accept);
    let include = query.get("includeObject").unwrap_or("Metadata").to_string();
    let resource = target.resource;
    let namespace = target.namespace.clone();
    let selects = move |change: &Change| {
        namespace.as_deref().is_none_or(|n| change.namespace() == n)
            && labels.matches(&change.object)
            && fields.matches(&change.object)
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(256);
    let start = app.store.watch(resource, from);
    let cuts = app.faults.watch_cuts(target.namespace.clone());
    tokio::spawn(async move {
        let mut first_table = true;
        let mut render = |change: &Change| -> Bytes {
            if as_table {
                let t = table::table(resource, std::slice::from_ref(&change.object), change.rv, &include, first_table);
                first_table = false;
                line(change.change.as_str(), &t)
            } else {
                line(change.change.as_str(), &change.object)
            }
        };
        let start = match start {
            Ok(start) => start,
            Err(current) => {
                let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": format!("too old resource version: {} ({current})", from.unwrap_or(0)),
                    "reason": "Expired", "code": 410});
                let _ = tx.send(Ok(line("ERROR", &status))).await;
                return;
            }
        };
        let mut last = start.current;
        for change in start.backlog.iter().filter(|c| selects(c)) {
            if tx.send(Ok(render(change))).await.is_err() {
                return;
            }
        }
        if initial_events {
            let bookmark = json!({"kind": resource.kind, "apiVersion": resource.api_version(), "metadata": {
                "resourceVersion": start.current.to_string(),
                "annotations": {"k8s.io/initial-events-end": "true"}}});
            if tx.send(Ok(line("BOOKMARK", &bookmark))).await.is_err() {
                return;
            }
        }
        let mut live = start.live;
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut ticker = tokio::time::interval(Duration::from_secs(1));
        ticker.tick().await;
        loop {
            let expired = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                change = live.recv() => match change {
                    Ok(change) => {
                        if change.resource != resource || change.rv <= last {
                            continue;
                        }
                        last = change.rv;
                        if selects(&change) && tx.send(Ok(render(&change))).await.is_err() {
                            return;
                        }
                    }
                    // Fell behind the store: end the watch, the client re-lists (as on a real apiserver).
                    Err(_) => return,
                },
                _ = ticker.tick(), if bookmarks => {
                    let current = app.store.current();
                    let bookmark = json!({"kind": resource.kind, "apiVersion": resource.api_version(), "metadata": {"resourceVersion": current.to_string()}});
                    if tx.send(Ok(line("BOOKMARK", &bookmark))).await.is_err() {
                        return;
                    }
                }
                _ = cuts.cut() => return,
                _ = expired => return,
                _ = tx.closed() => return,
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .header("cache-control", "no-cache, private")
        .body(Body::from_stream(stream))
        .map_err(|e| ApiError::new(500, "InternalError", e.to_string()))
}
