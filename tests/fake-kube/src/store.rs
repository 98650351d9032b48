//! The object store and its watch history: every object by (resource, namespace, name), one
//! global `resourceVersion` counter, `uid`/`creationTimestamp`/`generateName` on create, and
//! a bounded window of changes that watches replay from (older versions are `410 Expired`,
//! as after an etcd compaction). Knows nothing of HTTP, auth or Docker.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use rand::Rng;
use serde_json::{json, Value};
use tokio::sync::broadcast;

use crate::resources::Resource;
use crate::status::ApiError;

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChangeType {
    Added,
    Modified,
    Deleted,
}

impl ChangeType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ChangeType::Added => "ADDED",
            ChangeType::Modified => "MODIFIED",
            ChangeType::Deleted => "DELETED",
        }
    }
}

/// One change, as a watch sends it.
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub rv: u64,
    pub resource: Resource,
    pub change: ChangeType,
    pub object: Value,
}

impl Change {
    pub(crate) fn namespace(&self) -> &str {
        self.object["metadata"]["namespace"].as_str().unwrap_or_default()
    }
}

type Key = (&'static str, String, String);

struct Inner {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Change>,
    /// Versions at or below this are gone from the history (compacted).
    compacted: u64,
}

/// The store.
pub(crate) struct Store {
    inner: Mutex<Inner>,
    changes: broadcast::Sender<Change>,
    window: usize,
}

/// A watch's start: the changes after its version, and the stream of later ones.
pub(crate) struct WatchStart {
    pub backlog: Vec<Change>,
    pub live: broadcast::Receiver<Change>,
    pub current: u64,
}

pub(crate) fn now_rfc3339() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

pub(crate) fn random_suffix() -> String {
    // The apiserver's generateName alphabet (no vowels, no confusable digits).
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect()
}

impl Store {
    pub(crate) fn new(window: usize) -> Store {
        let (changes, _) = broadcast::channel(4096);
        Store {
            inner: Mutex::new(Inner { rv: 1, objects: BTreeMap::new(), history: VecDeque::new(), compacted: 1 }),
            changes,
            window: window.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, inner: &mut Inner, resource: Resource, change: ChangeType, object: Value) {
        let entry = Change { rv: inner.rv, resource, change, object };
        inner.history.push_back(entry.clone());
        while inner.history.len() > self.window {
            if let Some(old) = inner.history.pop_front() {
                inner.compacted = old.rv;
            }
        }
        let _ = self.changes.send(entry);
    }

    /// The current resourceVersion.
    pub(crate) fn current(&self) -> u64 {
        self.lock().rv
    }

    /// Forget the history up to now (an etcd compaction): older watches get 410.
    pub(crate) fn compact(&self) -> u64 {
        let mut inner = self.lock();
        inner.history.clear();
        inner.compacted = inner.rv;
        inner.rv
    }

    /// Create `object` (its metadata completed); 409 when the name is taken.
    pub(crate) fn create(&self, resource: Resource, namespace: &str, mut object: Value) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        let meta = &mut object["metadata"];
        if !meta.is_object() {
            *meta = json!({});
        }
        let name = match meta["name"].as_str().filter(|n| !n.is_empty()) {
            Some(name) => name.to_string(),
            None => match meta["generateName"].as_str().filter(|n| !n.is_empty()) {
                Some(prefix) => loop {
                    let candidate = format!("{prefix}{}", random_suffix());
                    if !inner.objects.contains_key(&(resource.plural, namespace.to_string(), candidate.clone())) {
                        break candidate;
                    }
                },
                None => {
                    return Err(ApiError::invalid(
                        resource.kind,
                        "",
                        &[("metadata.name".into(), "Required value: name or generateName is required".into())],
                    ))
                }
            },
        };
        let key = (resource.plural, namespace.to_string(), name.clone());
        if inner.objects.contains_key(&key) {
            return Err(ApiError::already_exists(resource.plural, &name));
        }
        inner.rv += 1;
        let rv = inner.rv;
        meta["name"] = json!(name);
        if resource.namespaced {
            meta["namespace"] = json!(namespace);
        } else if let Some(map) = meta.as_object_mut() {
            map.remove("namespace");
        }
        meta["uid"] = json!(uuid::Uuid::new_v4().to_string());
        meta["resourceVersion"] = json!(rv.to_string());
        meta["creationTimestamp"] = json!(now_rfc3339());
        if let Some(map) = meta.as_object_mut() {
            map.remove("deletionTimestamp");
            map.remove("selfLink");
        }
        object["apiVersion"] = json!(resource.api_version());
        object["kind"] = json!(resource.kind);
        inner.objects.insert(key, object.clone());
        self.record(&mut inner, resource, ChangeType::Added, object.clone());
        Ok(object)
    }

    pub(crate) fn get(&self, resource: Resource, namespace: &str, name: &str) -> Option<Value> {
        self.lock().objects.get(&(resource.plural, namespace.to_string(), name.to_string())).cloned()
    }

    /// Objects of `resource` (in `namespace`, or all), and the list's resourceVersion.
    pub(crate) fn list(&self, resource: Resource, namespace: Option<&str>) -> (Vec<Value>, u64) {
        let inner = self.lock();
        let items = inner
            .objects
            .iter()
            .filter(|((plural, ns, _), _)| *plural == resource.plural && namespace.is_none_or(|n| n == ns))
            .map(|(_, v)| v.clone())
            .collect();
        (items, inner.rv)
    }

    /// Change an object in place (a new resourceVersion, a MODIFIED event); the closure may
    /// refuse with an error. Returns the new object.
    pub(crate) fn update(
        &self,
        resource: Resource,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&mut Value) -> Result<(), ApiError>,
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        let key = (resource.plural, namespace.to_string(), name.to_string());
        let Some(current) = inner.objects.get(&key) else {
            return Err(ApiError::not_found(resource.plural, name));
        };
        let mut object = current.clone();
        change(&mut object)?;
        if object == *current {
            return Ok(object);
        }
        inner.rv += 1;
        object["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
        inner.objects.insert(key, object.clone());
        self.record(&mut inner, resource, ChangeType::Modified, object.clone());
        Ok(object)
    }

    /// Remove an object (a DELETED event carrying the deletion's version).
    pub(crate) fn delete(&self, resource: Resource, namespace: &str, name: &str) -> Option<Value> {
        let mut inner = self.lock();
        let key = (resource.plural, namespace.to_string(), name.to_string());
        let mut object = inner.objects.remove(&key)?;
        inner.rv += 1;
        object["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
        self.record(&mut inner, resource, ChangeType::Deleted, object.clone());
        Some(object)
    }

    /// Start a watch after version `from` (`None`: the current objects as ADDED first).
    /// `Err(current)` when `from` is older than the kept history.
    pub(crate) fn watch(&self, resource: Resource, from: Option<u64>) -> Result<WatchStart, u64> {
        let inner = self.lock();
        let live = self.changes.subscribe();
        let backlog = match from {
            None => inner
                .objects
                .iter()
                .filter(|((plural, _, _), _)| *plural == resource.plural)
                .map(|(_, object)| Change { rv: inner.rv, resource, change: ChangeType::Added, object: object.clone() })
                .collect(),
            Some(from) => {
                if from < inner.compacted {
                    return Err(inner.rv);
                }
                inner.history.iter().filter(|c| c.rv > from && c.resource == resource).cloned().collect()
            }
        };
        Ok(WatchStart { backlog, live, current: inner.rv })
    }

    /// Every change from now on (the kubelet's feed).
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }
}
