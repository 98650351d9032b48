//! RBAC for service-account tokens: the rules of a pod's service account are those of the
//! Roles (rbac.authorization.k8s.io/v1) bound to it by RoleBindings of the same namespace, read
//! from the store at each request, so a verb no Role grants is `403 Forbidden` as on a cluster
//! with the RBAC authorizer. ClusterRoles and ClusterRoleBindings are not served: a service
//! account may do nothing at the cluster scope (besides discovery, which is not authorized).
//! Also the `kube-root-ca.crt` ConfigMap every namespace holds (the projected token volume's
//! CA). Knows nothing of HTTP or Docker.

use serde_json::{json, Value};

use crate::auth::{Rule, User};
use crate::resources::{ROLEBINDINGS, ROLES};
use crate::store::Store;

/// `user` with its rules when it is a service account: every rule of every Role a RoleBinding
/// of its namespace binds to it, limited to that namespace.
pub(crate) fn resolve(store: &Store, mut user: User) -> User {
    let Some((namespace, account)) = user.service_account.clone() else {
        return user;
    };
    let mut rules = Vec::new();
    for binding in store.list(ROLEBINDINGS, Some(&namespace)).0 {
        let bound = binding["subjects"].as_array().into_iter().flatten().any(|s| {
            s["kind"] == "ServiceAccount"
                && s["name"].as_str() == Some(account.as_str())
                && s["namespace"].as_str().unwrap_or(&namespace) == namespace
        });
        if !bound || binding["roleRef"]["kind"] != "Role" {
            continue;
        }
        let Some(role) = store.get(ROLES, &namespace, binding["roleRef"]["name"].as_str().unwrap_or_default()) else {
            continue;
        };
        for rule in role["rules"].as_array().into_iter().flatten() {
            let strings = |key: &str| -> Vec<String> {
                rule[key].as_array().into_iter().flatten().filter_map(Value::as_str).map(String::from).collect()
            };
            rules.push(Rule {
                verbs: strings("verbs"),
                resources: strings("resources"),
                namespaces: vec![namespace.clone()],
                groups: strings("apiGroups"),
                names: strings("resourceNames"),
            });
        }
    }
    user.rules = Some(rules);
    user
}

/// The `kube-root-ca.crt` ConfigMap of a namespace (as the root CA publisher writes it).
pub(crate) fn root_ca_config_map(ca_pem: &str) -> Value {
    json!({"metadata": {"name": "kube-root-ca.crt", "annotations": {
        "kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
        "data": {"ca.crt": ca_pem}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Attributes;

    #[test]
    fn a_service_account_may_do_what_its_roles_grant_in_their_namespace() {
        let store = Store::new(100);
        store.create(crate::resources::NAMESPACES, "", json!({"metadata": {"name": "ci"}})).unwrap();
        store
            .create(
                ROLES,
                "ci",
                json!({"metadata": {"name": "r"}, "rules": [
                    {"apiGroups": [""], "resources": ["pods", "pods/exec"], "verbs": ["get", "create"]}]}),
            )
            .unwrap();
        store
            .create(
                ROLEBINDINGS,
                "ci",
                json!({"metadata": {"name": "b"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
                    "subjects": [{"kind": "ServiceAccount", "name": "runner", "namespace": "ci"}]}),
            )
            .unwrap();
        let user = User {
            name: "system:serviceaccount:ci:runner".into(),
            rules: Some(Vec::new()),
            service_account: Some(("ci".into(), "runner".into())),
        };
        let user = resolve(&store, user);
        let ask = |verb: &str, resource: &str, group: &str, ns: &str| Attributes {
            verb: verb.into(),
            resource: resource.into(),
            group: group.into(),
            namespace: Some(ns.into()),
            name: None,
        };
        assert!(user.allows(&ask("create", "pods/exec", "", "ci")));
        assert!(!user.allows(&ask("delete", "pods", "", "ci")), "delete not granted");
        assert!(!user.allows(&ask("get", "pods", "", "other")), "another namespace");
        assert!(!user.allows(&ask("get", "pods", "apps", "ci")), "another group");
        let other = User { service_account: Some(("ci".into(), "default".into())), ..user };
        assert!(!resolve(&store, other).allows(&ask("get", "pods", "", "ci")), "not bound");
    }
}
