//! Label selectors (`a=b`, `a==b`, `a!=b`, `a`, `!a`, `a in (x,y)`, `a notin (x)`) and field
//! selectors (`metadata.name=x`, `status.phase!=Running`, `involvedObject.name=x`, any dotted
//! path of the object) as list and watch calls take them. Pure functions over JSON.

use serde_json::Value;

use crate::status::ApiError;

#[derive(Debug, Clone)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed label selector.
#[derive(Debug, Clone, Default)]
pub(crate) struct LabelSelector(Vec<Requirement>);

/// Split at commas outside parentheses.
fn split_top(text: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut current = String::new();
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    parts.push(current);
    parts.into_iter().map(|p| p.trim().to_string()).filter(|p| !p.is_empty()).collect()
}

fn set_values(text: &str) -> Option<Vec<String>> {
    let inner = text.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(inner.split(',').map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).collect())
}

impl LabelSelector {
    pub(crate) fn parse(text: &str) -> Result<LabelSelector, ApiError> {
        let bad = |part: &str| ApiError::bad_request(format!("unable to parse requirement: found '{part}'"));
        let mut requirements = Vec::new();
        for part in split_top(text) {
            let requirement = if let Some((key, value)) = part.split_once("!=") {
                Requirement::NotEquals(key.trim().into(), value.trim().into())
            } else if let Some((key, value)) = part.split_once("==") {
                Requirement::Equals(key.trim().into(), value.trim().into())
            } else if let Some((key, value)) = part.split_once('=') {
                Requirement::Equals(key.trim().into(), value.trim().into())
            } else if let Some((key, values)) = part.split_once(" notin ") {
                Requirement::NotIn(key.trim().into(), set_values(values).ok_or_else(|| bad(&part))?)
            } else if let Some((key, values)) = part.split_once(" in ") {
                Requirement::In(key.trim().into(), set_values(values).ok_or_else(|| bad(&part))?)
            } else if let Some(key) = part.strip_prefix('!') {
                Requirement::NotExists(key.trim().into())
            } else if part.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c)) {
                Requirement::Exists(part.clone())
            } else {
                return Err(bad(&part));
            };
            requirements.push(requirement);
        }
        Ok(LabelSelector(requirements))
    }

    /// Whether `object`'s `metadata.labels` match.
    pub(crate) fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        let get = |key: &str| labels.get(key).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
            Requirement::In(k, vs) => get(k).is_some_and(|v| vs.iter().any(|x| x == v)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|v| !vs.iter().any(|x| x == v)),
        })
    }
}

/// A parsed field selector: `(path, value, equal?)` terms.
#[derive(Debug, Clone, Default)]
pub(crate) struct FieldSelector(Vec<(String, String, bool)>);

impl FieldSelector {
    pub(crate) fn parse(text: &str) -> Result<FieldSelector, ApiError> {
        let mut terms = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let term = if let Some((k, v)) = part.split_once("!=") {
                (k.to_string(), v.to_string(), false)
            } else if let Some((k, v)) = part.split_once("==") {
                (k.to_string(), v.to_string(), true)
            } else if let Some((k, v)) = part.split_once('=') {
                (k.to_string(), v.to_string(), true)
            } else {
                return Err(ApiError::bad_request(format!("invalid selector: '{part}'; can't understand '{part}'")));
            };
            terms.push(term);
        }
        Ok(FieldSelector(terms))
    }

    pub(crate) fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(path, value, equal)| {
            let mut current = object;
            for segment in path.split('.') {
                current = &current[segment];
            }
            let actual = match current {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                Value::Bool(b) => b.to_string(),
                other => other.to_string(),
            };
            (actual == *value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let pod = json!({"metadata": {"labels": {"app": "web", "tier": "front"}}});
        for (selector, expected) in [
            ("app=web", true),
            ("app==web,tier=front", true),
            ("app!=web", false),
            ("app in (db, web)", true),
            ("app notin (web)", false),
            ("tier", true),
            ("!tier", false),
            ("missing", false),
        ] {
            assert_eq!(LabelSelector::parse(selector).unwrap().matches(&pod), expected, "{selector}");
        }
    }

    #[test]
    fn field_selectors() {
        let pod = json!({"metadata": {"name": "a"}, "status": {"phase": "Running"}});
        assert!(FieldSelector::parse("metadata.name=a,status.phase!=Failed").unwrap().matches(&pod));
        assert!(!FieldSelector::parse("status.phase=Pending").unwrap().matches(&pod));
        assert!(FieldSelector::parse("spec.nodeName=").unwrap().matches(&pod));
        assert!(FieldSelector::parse("bogus").is_err());
    }
}
