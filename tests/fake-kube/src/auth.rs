//! Bearer-token authentication and per-token authorization rules (verbs × resources ×
//! namespaces), with the apiserver's 401 and 403 messages, and the answer of a
//! `SelfSubjectAccessReview`. The admin token of the kubeconfig may do everything; more
//! tokens come from the control API (`/fake-kube/tokens`) and from the kubelet, which mints
//! one for every pod's projected service-account token (its rules are the RBAC objects'
//! of the moment, `rbac.rs`). Knows nothing of the store.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::Deserialize;

use crate::status::ApiError;

/// One rule: each list may hold `*`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Rule {
    pub verbs: Vec<String>,
    pub resources: Vec<String>,
    #[serde(default = "everywhere")]
    pub namespaces: Vec<String>,
    /// API groups (`""` the core group); `*` when not given.
    #[serde(default = "everywhere", rename = "apiGroups")]
    pub groups: Vec<String>,
    /// Object names the rule is limited to (`resourceNames`); empty: any.
    #[serde(default, rename = "resourceNames")]
    pub names: Vec<String>,
}

fn everywhere() -> Vec<String> {
    vec!["*".to_string()]
}

/// Who a token is.
#[derive(Debug, Clone)]
pub(crate) struct User {
    pub name: String,
    /// `None`: allowed everything (the admin).
    pub rules: Option<Vec<Rule>>,
    /// A pod's service account token: (namespace, service account); its rules come from the
    /// Roles bound to it when a request is made.
    pub service_account: Option<(String, String)>,
}

/// What a request does, as authorization sees it.
#[derive(Debug, Clone)]
pub(crate) struct Attributes {
    pub verb: String,
    /// `pods`, `pods/exec`, …
    pub resource: String,
    pub group: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

fn listed(list: &[String], value: &str) -> bool {
    list.iter().any(|item| item == "*" || item == value)
}

impl User {
    pub(crate) fn allows(&self, attributes: &Attributes) -> bool {
        let Some(rules) = &self.rules else {
            return true;
        };
        rules.iter().any(|rule| {
            listed(&rule.verbs, &attributes.verb)
                && listed(&rule.resources, &attributes.resource)
                && listed(&rule.groups, &attributes.group)
                && (rule.names.is_empty() || attributes.name.as_ref().is_some_and(|n| rule.names.contains(n)))
                && match &attributes.namespace {
                    Some(ns) => listed(&rule.namespaces, ns),
                    None => rule.namespaces.iter().any(|n| n == "*"),
                }
        })
    }

    /// The apiserver's 403: `pods "x" is forbidden: User "u" cannot get resource "pods" in
    /// API group "" in the namespace "ns"`.
    pub(crate) fn forbidden(&self, a: &Attributes) -> ApiError {
        let (base, sub) = match a.resource.split_once('/') {
            Some((base, sub)) => (base.to_string(), Some(sub.to_string())),
            None => (a.resource.clone(), None),
        };
        let subject = match &a.name {
            Some(name) => format!("{base} \"{name}\""),
            None => base.clone(),
        };
        let scope = match &a.namespace {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_string(),
        };
        let what = match &sub {
            Some(sub) => format!("resource \"{base}/{sub}\""),
            None => format!("resource \"{base}\""),
        };
        let message = format!(
            "{subject} is forbidden: User \"{}\" cannot {} {what} in API group \"{}\" {scope}",
            self.name, a.verb, a.group
        );
        let mut details = serde_json::json!({"kind": base});
        if let Some(name) = &a.name {
            details["name"] = serde_json::json!(name);
        }
        ApiError::new(403, "Forbidden", message).with_details(details)
    }
}

/// Every known token.
pub(crate) struct Tokens {
    tokens: Mutex<BTreeMap<String, User>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tokens")
    }
}

impl Tokens {
    pub(crate) fn new(admin_token: &str) -> Tokens {
        let mut tokens = BTreeMap::new();
        tokens.insert(
            admin_token.to_string(),
            User { name: "fake-kube-admin".to_string(), rules: None, service_account: None },
        );
        Tokens { tokens: Mutex::new(tokens) }
    }

    pub(crate) fn add(&self, token: String, user: User) {
        self.tokens.lock().unwrap_or_else(|e| e.into_inner()).insert(token, user);
    }

    /// A new token for service account `name` of `namespace` (a pod's projected token).
    pub(crate) fn mint_service_account(&self, namespace: &str, name: &str) -> String {
        use rand::Rng;
        let mut rng = rand::rng();
        let token: String =
            (0..48).map(|_| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.random_range(0..36)])).collect();
        let user = User {
            name: format!("system:serviceaccount:{namespace}:{name}"),
            rules: Some(Vec::new()),
            service_account: Some((namespace.to_string(), name.to_string())),
        };
        self.add(token.clone(), user);
        token
    }

    /// The user of an `Authorization: Bearer …` header; 401 otherwise.
    pub(crate) fn authenticate(&self, header: Option<&str>) -> Result<User, ApiError> {
        let token = header.and_then(|h| h.strip_prefix("Bearer ")).map(str::trim).ok_or_else(ApiError::unauthorized)?;
        self.tokens.lock().unwrap_or_else(|e| e.into_inner()).get(token).cloned().ok_or_else(ApiError::unauthorized)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_and_forbidden_message() {
        let user = User {
            name: "ci".into(),
            rules: Some(vec![Rule {
                verbs: vec!["get".into()],
                resources: vec!["pods".into()],
                namespaces: vec!["a".into()],
                groups: vec!["".into()],
                names: Vec::new(),
            }]),
            service_account: None,
        };
        let mut attrs = Attributes {
            verb: "get".into(),
            resource: "pods".into(),
            group: String::new(),
            namespace: Some("a".into()),
            name: None,
        };
        assert!(user.allows(&attrs));
        attrs.verb = "create".into();
        assert!(!user.allows(&attrs));
        assert_eq!(
            user.forbidden(&attrs).message,
            "pods is forbidden: User \"ci\" cannot create resource \"pods\" in API group \"\" in the namespace \"a\""
        );
    }
}
