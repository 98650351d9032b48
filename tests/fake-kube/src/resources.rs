//! The resources fake-kube serves under `/api/v1` (and the authorization group): plural
//! name, kind, scope, short names and verbs, as discovery (`APIResourceList`) lists them.
//! Owns the table only; routes and the store look resources up here.

use serde_json::{json, Value};

/// One resource of the core group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Resource {
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
}

const OBJECT_VERBS: &[&str] = &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

pub(crate) const PODS: Resource =
    Resource { plural: "pods", singular: "pod", kind: "Pod", namespaced: true, short_names: &["po"] };
pub(crate) const NAMESPACES: Resource = Resource {
    plural: "namespaces",
    singular: "namespace",
    kind: "Namespace",
    namespaced: false,
    short_names: &["ns"],
};
pub(crate) const SECRETS: Resource =
    Resource { plural: "secrets", singular: "secret", kind: "Secret", namespaced: true, short_names: &[] };
pub(crate) const CONFIGMAPS: Resource =
    Resource { plural: "configmaps", singular: "configmap", kind: "ConfigMap", namespaced: true, short_names: &["cm"] };
pub(crate) const SERVICEACCOUNTS: Resource = Resource {
    plural: "serviceaccounts",
    singular: "serviceaccount",
    kind: "ServiceAccount",
    namespaced: true,
    short_names: &["sa"],
};
pub(crate) const EVENTS: Resource =
    Resource { plural: "events", singular: "event", kind: "Event", namespaced: true, short_names: &["ev"] };

/// Every stored resource.
pub(crate) const ALL: &[Resource] = &[PODS, NAMESPACES, SECRETS, CONFIGMAPS, SERVICEACCOUNTS, EVENTS];

/// `/api/v1`: the APIResourceList.
pub(crate) fn core_resource_list() -> Value {
    let mut resources: Vec<Value> = Vec::new();
    for r in ALL {
        resources.push(json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": OBJECT_VERBS,
            "shortNames": r.short_names,
            "storageVersionHash": "",
        }));
    }
    let sub = |name: &str, kind: &str, verbs: &[&str]| json!({"name": name, "singularName": "", "namespaced": true, "kind": kind, "verbs": verbs});
    resources.push(sub("pods/attach", "PodAttachOptions", &["create", "get"]));
    resources.push(sub("pods/exec", "PodExecOptions", &["create", "get"]));
    resources.push(sub("pods/log", "Pod", &["get"]));
    resources.push(sub("pods/status", "Pod", &["get", "patch", "update"]));
    json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": resources})
}

/// `/apis/authorization.k8s.io/v1`.
pub(crate) fn authorization_resource_list() -> Value {
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "authorization.k8s.io/v1",
        "resources": [
            {"name": "selfsubjectaccessreviews", "singularName": "selfsubjectaccessreview", "namespaced": false,
             "kind": "SelfSubjectAccessReview", "verbs": ["create"]},
            {"name": "selfsubjectrulesreviews", "singularName": "selfsubjectrulesreview", "namespaced": false,
             "kind": "SelfSubjectRulesReview", "verbs": ["create"]}
        ]
    })
}

/// `/apis`: the APIGroupList (the authorization group only; core is under `/api`).
pub(crate) fn group_list() -> Value {
    json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [authorization_group()]
    })
}

pub(crate) fn authorization_group() -> Value {
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": "authorization.k8s.io",
        "versions": [{"groupVersion": "authorization.k8s.io/v1", "version": "v1"}],
        "preferredVersion": {"groupVersion": "authorization.k8s.io/v1", "version": "v1"}
    })
}
