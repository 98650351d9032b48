//! The resources fake-kube serves under `/api/v1` (and the authorization group): plural
//! name, kind, scope, short names and verbs, as discovery (`APIResourceList`) lists them.
//! Owns the table only; routes and the store look resources up here.

use serde_json::{json, Value};

/// One resource: of the core group (`group` empty) or of a named group (`apps`, RBAC), all
/// at version v1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Resource {
    pub group: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
}

const OBJECT_VERBS: &[&str] = &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

pub(crate) const PODS: Resource =
    Resource { group: "", plural: "pods", singular: "pod", kind: "Pod", namespaced: true, short_names: &["po"] };
pub(crate) const NAMESPACES: Resource = Resource {
    group: "",
    plural: "namespaces",
    singular: "namespace",
    kind: "Namespace",
    namespaced: false,
    short_names: &["ns"],
};
pub(crate) const SECRETS: Resource =
    Resource { group: "", plural: "secrets", singular: "secret", kind: "Secret", namespaced: true, short_names: &[] };
pub(crate) const CONFIGMAPS: Resource = Resource {
    group: "",
    plural: "configmaps",
    singular: "configmap",
    kind: "ConfigMap",
    namespaced: true,
    short_names: &["cm"],
};
pub(crate) const SERVICEACCOUNTS: Resource = Resource {
    group: "",
    plural: "serviceaccounts",
    singular: "serviceaccount",
    kind: "ServiceAccount",
    namespaced: true,
    short_names: &["sa"],
};
pub(crate) const EVENTS: Resource =
    Resource { group: "", plural: "events", singular: "event", kind: "Event", namespaced: true, short_names: &["ev"] };

pub(crate) const DEPLOYMENTS: Resource = Resource {
    group: "apps",
    plural: "deployments",
    singular: "deployment",
    kind: "Deployment",
    namespaced: true,
    short_names: &["deploy"],
};
pub(crate) const REPLICASETS: Resource = Resource {
    group: "apps",
    plural: "replicasets",
    singular: "replicaset",
    kind: "ReplicaSet",
    namespaced: true,
    short_names: &["rs"],
};
/// The RBAC group.
pub(crate) const RBAC: &str = "rbac.authorization.k8s.io";
pub(crate) const ROLES: Resource =
    Resource { group: RBAC, plural: "roles", singular: "role", kind: "Role", namespaced: true, short_names: &[] };
pub(crate) const ROLEBINDINGS: Resource = Resource {
    group: RBAC,
    plural: "rolebindings",
    singular: "rolebinding",
    kind: "RoleBinding",
    namespaced: true,
    short_names: &[],
};

/// Every stored resource.
pub(crate) const ALL: &[Resource] =
    &[PODS, NAMESPACES, SECRETS, CONFIGMAPS, SERVICEACCOUNTS, EVENTS, DEPLOYMENTS, REPLICASETS, ROLES, ROLEBINDINGS];

/// The named groups served under `/apis` besides the authorization group.
pub(crate) const GROUPS: &[&str] = &["apps", RBAC];

impl Resource {
    /// `v1` or `group/v1`.
    pub(crate) fn api_version(&self) -> String {
        if self.group.is_empty() {
            "v1".to_string()
        } else {
            format!("{}/v1", self.group)
        }
    }

    /// The path prefix of its group version: `/api/v1` or `/apis/group/v1`.
    pub(crate) fn prefix(&self) -> String {
        if self.group.is_empty() {
            "/api/v1".to_string()
        } else {
            format!("/apis/{}/v1", self.group)
        }
    }
}

/// The APIResourceList of a named group (`/apis/GROUP/v1`).
pub(crate) fn group_resource_list(group: &str) -> Value {
    let resources: Vec<Value> = ALL
        .iter()
        .filter(|r| r.group == group)
        .map(|r| {
            json!({
                "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
                "verbs": OBJECT_VERBS, "shortNames": r.short_names, "storageVersionHash": "",
            })
        })
        .collect();
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{group}/v1"), "resources": resources})
}

/// The APIGroup of a named group at v1.
pub(crate) fn named_group(group: &str) -> Value {
    let version = json!({"groupVersion": format!("{group}/v1"), "version": "v1"});
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": [version], "preferredVersion": version})
}

/// `/api/v1`: the APIResourceList.
pub(crate) fn core_resource_list() -> Value {
    let mut resources: Vec<Value> = Vec::new();
    for r in ALL.iter().filter(|r| r.group.is_empty()) {
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
        "groups": std::iter::once(authorization_group()).chain(GROUPS.iter().map(|g| named_group(g))).collect::<Vec<_>>()
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
