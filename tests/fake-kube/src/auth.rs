//! Bearer-token authentication and per-token authorization rules (verbs × resources ×
//! namespaces), with the apiserver's 401 and 403 messages, and the answer of a
//! `SelfSubjectAccessReview`. The admin token of the kubeconfig may do everything; more
//! tokens come from the control API (`/fake-kube/tokens`). Knows nothing of the store.

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

impl Tokens {
    pub(crate) fn new(admin_token: &str) -> Tokens {
        let mut tokens = BTreeMap::new();
        tokens.insert(admin_token.to_string(), User { name: "fake-kube-admin".to_string(), rules: None });
        Tokens { tokens: Mutex::new(tokens) }
    }

    pub(crate) fn add(&self, token: String, user: User) {
        self.tokens.lock().unwrap_or_else(|e| e.into_inner()).insert(token, user);
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
            }]),
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
