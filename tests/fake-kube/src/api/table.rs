//! `Table` answers (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`), which kubectl's
//! printing asks for: the columns and cells the apiserver's printers give for pods (NAME
//! READY STATUS RESTARTS AGE, then IP NODE …), namespaces, secrets, configmaps,
//! serviceaccounts and events, with the pod STATUS column computed as kubectl users know it.

use serde_json::{json, Value};

use crate::resources::{Resource, CONFIGMAPS, EVENTS, NAMESPACES, PODS, SECRETS, SERVICEACCOUNTS};

/// Whether an Accept header asks for a Table.
pub(crate) fn wants_table(accept: &str) -> bool {
    accept.split(',').next().is_some_and(|first| first.contains("as=Table"))
}

fn column(name: &str, priority: u8, format: &str) -> Value {
    json!({"name": name, "type": "string", "format": format, "description": name, "priority": priority})
}

pub(crate) fn columns(resource: Resource) -> Vec<Value> {
    let name = column("Name", 0, "name");
    let age = column("Age", 0, "");
    match resource {
        PODS => vec![
            name,
            column("Ready", 0, ""),
            column("Status", 0, ""),
            column("Restarts", 0, ""),
            age,
            column("IP", 1, ""),
            column("Node", 1, ""),
            column("Nominated Node", 1, ""),
            column("Readiness Gates", 1, ""),
        ],
        NAMESPACES => vec![name, column("Status", 0, ""), age],
        SECRETS => vec![name, column("Type", 0, ""), column("Data", 0, ""), age],
        CONFIGMAPS => vec![name, column("Data", 0, ""), age],
        SERVICEACCOUNTS => vec![name, column("Secrets", 0, ""), age],
        EVENTS => vec![
            column("Last Seen", 0, ""),
            column("Type", 0, ""),
            column("Reason", 0, ""),
            column("Object", 0, ""),
            column("Message", 0, ""),
        ],
        _ => vec![name, age],
    }
}

/// `duration.HumanDuration` of the apimachinery.
pub(crate) fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    let s = seconds.max(0);
    let (m, h) = (s / 60, s / 3600);
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        if s % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", s % 60)
        }
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{}m", m % 60)
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        if h % 24 == 0 {
            format!("{}d", h / 24)
        } else {
            format!("{}d{}h", h / 24, h % 24)
        }
    } else if h < 24 * 365 * 2 {
        format!("{}d", h / 24)
    } else {
        format!("{}y{}d", h / 24 / 365, (h / 24) % 365)
    }
}

fn age(timestamp: &Value) -> String {
    match timestamp.as_str().and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()) {
        Some(t) => human_duration((chrono::Utc::now() - t.with_timezone(&chrono::Utc)).num_seconds()),
        None => "<unknown>".into(),
    }
}

fn count(value: &Value) -> usize {
    value.as_object().map(|m| m.len()).unwrap_or(0)
}

/// The STATUS column of a pod (the apiserver's `printPod`).
pub(crate) fn pod_status(pod: &Value) -> (String, u64, u64, Option<String>) {
    let status = &pod["status"];
    let mut reason = status["reason"].as_str().or(status["phase"].as_str()).unwrap_or("Pending").to_string();
    let mut restarts = 0;
    let mut last_restart: Option<String> = None;
    let mut ready = 0;
    let inits: Vec<&Value> = status["initContainerStatuses"].as_array().into_iter().flatten().collect();
    let total_init = pod["spec"]["initContainers"].as_array().map(|a| a.len()).unwrap_or(0);
    let mut initializing = false;
    for (i, c) in inits.iter().enumerate() {
        restarts += c["restartCount"].as_u64().unwrap_or(0);
        let terminated = &c["state"]["terminated"];
        let waiting = &c["state"]["waiting"];
        if terminated.is_object() && terminated["exitCode"] == 0 {
            continue;
        }
        if terminated.is_object() {
            reason = match terminated["reason"].as_str() {
                Some(r) if !r.is_empty() => format!("Init:{r}"),
                _ => format!("Init:ExitCode:{}", terminated["exitCode"]),
            };
        } else if let Some(w) = waiting["reason"].as_str().filter(|r| !r.is_empty() && *r != "PodInitializing") {
            reason = format!("Init:{w}");
        } else {
            reason = format!("Init:{i}/{total_init}");
        }
        initializing = true;
        break;
    }
    if !initializing {
        restarts = 0;
        let mut has_running = false;
        for c in status["containerStatuses"].as_array().into_iter().flatten().rev() {
            restarts += c["restartCount"].as_u64().unwrap_or(0);
            if let Some(finished) = c["lastState"]["terminated"]["finishedAt"].as_str() {
                if last_restart.as_deref().is_none_or(|l| l < finished) {
                    last_restart = Some(finished.to_string());
                }
            }
            let terminated = &c["state"]["terminated"];
            if let Some(w) = c["state"]["waiting"]["reason"].as_str().filter(|r| !r.is_empty()) {
                reason = w.to_string();
            } else if let Some(t) = terminated["reason"].as_str().filter(|r| !r.is_empty()) {
                reason = t.to_string();
            } else if terminated.is_object() {
                reason = format!("ExitCode:{}", terminated["exitCode"]);
            } else if c["ready"] == true && c["state"]["running"].is_object() {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            reason = "Running".into();
        }
    }
    if pod["metadata"]["deletionTimestamp"].is_string() {
        reason = if status["reason"] == "NodeLost" { "Unknown".into() } else { "Terminating".into() };
    }
    (reason, ready, restarts, last_restart)
}

fn cells(resource: Resource, object: &Value) -> Vec<Value> {
    let meta = &object["metadata"];
    let name = meta["name"].clone();
    let created = age(&meta["creationTimestamp"]);
    match resource {
        PODS => {
            let (status, ready, restarts, last) = pod_status(object);
            let total = object["spec"]["containers"].as_array().map(|a| a.len()).unwrap_or(0);
            let restarts = match last {
                Some(last) if restarts > 0 => format!("{restarts} ({} ago)", age(&json!(last))),
                _ => restarts.to_string(),
            };
            let or_none = |v: &Value| v.as_str().map(String::from).unwrap_or_else(|| "<none>".into());
            vec![
                name,
                json!(format!("{ready}/{total}")),
                json!(status),
                json!(restarts),
                json!(created),
                json!(or_none(&object["status"]["podIP"])),
                json!(or_none(&object["spec"]["nodeName"])),
                json!("<none>"),
                json!("<none>"),
            ]
        }
        NAMESPACES => vec![name, object["status"]["phase"].clone(), json!(created)],
        SECRETS => vec![name, object["type"].clone(), json!(count(&object["data"])), json!(created)],
        CONFIGMAPS => vec![name, json!(count(&object["data"]) + count(&object["binaryData"])), json!(created)],
        SERVICEACCOUNTS => {
            vec![name, json!(object["secrets"].as_array().map(|a| a.len()).unwrap_or(0)), json!(created)]
        }
        EVENTS => {
            let involved = &object["involvedObject"];
            vec![
                json!(age(&object["lastTimestamp"])),
                object["type"].clone(),
                object["reason"].clone(),
                json!(format!(
                    "{}/{}",
                    involved["kind"].as_str().unwrap_or("").to_lowercase(),
                    involved["name"].as_str().unwrap_or("")
                )),
                object["message"].clone(),
            ]
        }
        _ => vec![name, json!(created)],
    }
}

/// One row (`includeObject`: `None`, `Metadata` (the default) or `Object`).
fn row(resource: Resource, object: &Value, include: &str) -> Value {
    let mut row = json!({"cells": cells(resource, object)});
    match include {
        "None" => {}
        "Object" => row["object"] = object.clone(),
        _ => {
            row["object"] = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": object["metadata"]});
        }
    }
    row
}

/// A Table of `objects`.
pub(crate) fn table(resource: Resource, objects: &[Value], rv: u64, include: &str, with_columns: bool) -> Value {
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv.to_string()},
        "columnDefinitions": if with_columns { columns(resource) } else { Vec::new() },
        "rows": objects.iter().map(|o| row(resource, o, include)).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(3600 * 3), "3h");
        assert_eq!(human_duration(86400 * 3 + 3600), "3d1h");
    }

    #[test]
    fn pod_status_column() {
        let pod = json!({"spec": {"containers": [{}], "initContainers": [{}]}, "status": {"phase": "Pending",
            "initContainerStatuses": [{"state": {"waiting": {"reason": "CrashLoopBackOff"}}, "restartCount": 2}]}});
        assert_eq!(pod_status(&pod).0, "Init:CrashLoopBackOff");
        let pod = json!({"spec": {"containers": [{}]}, "status": {"phase": "Succeeded",
            "containerStatuses": [{"state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}});
        assert_eq!(pod_status(&pod).0, "Completed");
        let pod = json!({"metadata": {"deletionTimestamp": "x"}, "spec": {}, "status": {"phase": "Running"}});
        assert_eq!(pod_status(&pod).0, "Terminating");
    }
}
