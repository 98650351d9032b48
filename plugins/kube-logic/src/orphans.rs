//! Orphans: objects of a runner (pods, secrets, configmaps labelled `runway/managed=true`,
//! `runway/runner=<short token>`) whose job is in no job store entry, left by a manager that
//! died with its store — what gitlab-runner-pod-cleanup deletes. Owns which objects are
//! looked at (the selector) and which are orphans (the grace period on their age); the caller
//! (the runner's store watcher) lists, deletes and knows the store. Touches no cluster.
//!
//! Every manager of one runner token must see every job of that token in its store (one
//! manager with a file store, or managers sharing a Redis store): a job of another manager
//! with a store of its own looks orphaned here once it is older than the grace period.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::names::{runner_selector, LABEL_JOB};

/// The kinds swept, as their collection names under `/api/v1/namespaces/{ns}/`.
pub const KINDS: &[&str] = &["pods", "secrets", "configmaps"];

/// Seconds an object must exist before it may be deleted as an orphan, unless configured.
pub const DEFAULT_GRACE_SECONDS: u64 = 600;

/// The label selector of the objects swept: every object of the runner.
pub fn selector(short_token: &str) -> String {
    runner_selector(short_token)
}

/// One object to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    /// `pods`, `secrets` or `configmaps`.
    pub kind: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The job its `runway/job` label names (`None`: no readable job label).
    pub job: Option<u64>,
    /// Seconds since it was created.
    pub age_seconds: u64,
}

/// The orphans in `list` (a `kind` list answer): objects not being deleted already, whose job
/// is not in `stored`, older than `grace_seconds`. `age` gives the seconds since a
/// `creationTimestamp` (`None`: unreadable, the object is kept).
pub fn orphans(
    kind: &str,
    list: &Value,
    stored: &BTreeSet<u64>,
    grace_seconds: u64,
    age: impl Fn(&str) -> Option<u64>,
) -> Vec<Orphan> {
    let items = list["items"].as_array().map(Vec::as_slice).unwrap_or_default();
    items
        .iter()
        .filter_map(|item| {
            let meta = &item["metadata"];
            if !meta["deletionTimestamp"].is_null() {
                return None;
            }
            let job = meta["labels"][LABEL_JOB].as_str().and_then(|j| j.parse::<u64>().ok());
            if job.is_some_and(|j| stored.contains(&j)) {
                return None;
            }
            let age_seconds = age(meta["creationTimestamp"].as_str()?)?;
            if age_seconds < grace_seconds {
                return None;
            }
            Some(Orphan {
                kind: kind.to_string(),
                namespace: meta["namespace"].as_str()?.to_string(),
                name: meta["name"].as_str()?.to_string(),
                job,
                age_seconds,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(name: &str, job: &str, created: &str, deleting: bool) -> Value {
        let mut o = json!({"metadata": {"name": name, "namespace": "ci", "creationTimestamp": created,
            "labels": {"runway/managed": "true", "runway/runner": "abc", "runway/job": job}}});
        if deleting {
            o["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        o
    }

    #[test]
    fn only_old_objects_of_jobs_no_store_holds_are_orphans() {
        let list = json!({"items": [
            object("stored", "1", "old", false),
            object("orphan", "2", "old", false),
            object("young", "3", "young", false),
            object("deleting", "4", "old", true),
            object("no-job-label", "x", "old", false),
            object("bad-time", "5", "garbage", false),
        ]});
        let age = |t: &str| match t {
            "old" => Some(700),
            "young" => Some(10),
            _ => None,
        };
        let stored = BTreeSet::from([1]);
        let found = orphans("pods", &list, &stored, DEFAULT_GRACE_SECONDS, age);
        let names: Vec<(&str, Option<u64>)> = found.iter().map(|o| (o.name.as_str(), o.job)).collect();
        assert_eq!(names, [("orphan", Some(2)), ("no-job-label", None)]);
        assert_eq!(
            found[0],
            Orphan {
                kind: "pods".into(),
                namespace: "ci".into(),
                name: "orphan".into(),
                job: Some(2),
                age_seconds: 700
            }
        );
        assert!(orphans("pods", &list, &stored, 701, age).is_empty(), "nothing is older than the grace period");
        assert!(orphans("pods", &json!({"kind": "Status"}), &stored, 0, age).is_empty());
    }
}
