//! PATCH bodies: JSON merge patch (RFC 7386), strategic merge patch (lists of objects merged
//! by their `name`, the `$patch`, `$setElementOrder/…`, `$retainKeys` and
//! `$deleteFromPrimitiveList/…` directives kubectl sends), and JSON patch (RFC 6902).
//! Pure functions over JSON.

use serde_json::Value;

use crate::status::ApiError;

/// RFC 7386.
pub(crate) fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(map) = target {
        for (key, value) in patch {
            if value.is_null() {
                map.remove(key);
            } else {
                merge(map.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

fn merge_key(list: &[Value]) -> Option<&'static str> {
    ["name", "mountPath", "containerPort", "devicePath", "ip", "topologyKey"]
        .into_iter()
        .find(|key| !list.is_empty() && list.iter().all(|item| item.get(*key).is_some()))
}

/// A strategic merge patch, as far as the core types need it.
pub(crate) fn strategic(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut clean = patch.clone();
        clean.remove("$patch");
        *target = Value::Object(clean);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    let Value::Object(map) = target else { return };
    for (key, value) in patch {
        if key.starts_with('$') {
            if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
                if let (Some(Value::Array(items)), Value::Array(gone)) = (map.get_mut(field), value) {
                    items.retain(|i| !gone.contains(i));
                }
            }
            continue;
        }
        if value.is_null() {
            map.remove(key);
            continue;
        }
        let current = map.entry(key.clone()).or_insert(Value::Null);
        match (current, value) {
            (Value::Array(items), Value::Array(patches)) if patches.iter().all(Value::is_object) => {
                let Some(k) = merge_key(patches).or_else(|| merge_key(items)) else {
                    *items = patches.clone();
                    continue;
                };
                for p in patches {
                    let id = &p[k];
                    let position = items.iter().position(|i| &i[k] == id);
                    match (position, p.get("$patch").and_then(Value::as_str)) {
                        (Some(i), Some("delete")) => {
                            items.remove(i);
                        }
                        (None, Some("delete")) => {}
                        (Some(i), _) => strategic(&mut items[i], p),
                        (None, _) => {
                            let mut fresh = Value::Null;
                            strategic(&mut fresh, p);
                            items.push(fresh);
                        }
                    }
                }
            }
            (current, value) if value.is_object() => strategic(current, value),
            (current, value) => *current = value.clone(),
        }
    }
}

fn pointer_parts(path: &str) -> Vec<String> {
    path.split('/').skip(1).map(|p| p.replace("~1", "/").replace("~0", "~")).collect()
}

/// RFC 6902 (add, remove, replace, test, copy, move).
pub(crate) fn json_patch(target: &mut Value, ops: &Value) -> Result<(), ApiError> {
    let bad = |m: String| ApiError::new(422, "Invalid", m);
    for op in ops.as_array().ok_or_else(|| ApiError::bad_request("a JSON patch must be a list of operations"))? {
        let path = op["path"].as_str().unwrap_or("");
        let kind = op["op"].as_str().unwrap_or("");
        let value = match kind {
            "copy" | "move" => {
                let from = op["from"].as_str().unwrap_or("");
                let v = target.pointer(from).cloned().ok_or_else(|| bad(format!("missing path {from}")))?;
                if kind == "move" {
                    remove(target, from).ok_or_else(|| bad(format!("missing path {from}")))?;
                }
                v
            }
            _ => op["value"].clone(),
        };
        match kind {
            "test" => {
                if target.pointer(path) != Some(&value) {
                    return Err(bad(format!("test failed at {path}")));
                }
            }
            "remove" => {
                remove(target, path).ok_or_else(|| bad(format!("unable to remove nonexistent key at {path}")))?;
            }
            "add" | "replace" | "copy" | "move" => {
                let parts = pointer_parts(path);
                let Some((last, parents)) = parts.split_last() else {
                    *target = value;
                    continue;
                };
                let mut parent = &mut *target;
                for p in parents {
                    parent = match parent {
                        Value::Object(m) => m.get_mut(p),
                        Value::Array(a) => p.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
                        _ => None,
                    }
                    .ok_or_else(|| bad(format!("missing path {path}")))?;
                }
                match parent {
                    Value::Object(m) => {
                        if kind == "replace" && !m.contains_key(last) {
                            return Err(bad(format!("replace operation does not apply: doc is missing key: {path}")));
                        }
                        m.insert(last.clone(), value);
                    }
                    Value::Array(a) => {
                        if last == "-" {
                            a.push(value);
                        } else {
                            let i: usize = last.parse().map_err(|_| bad(format!("bad index at {path}")))?;
                            if kind == "replace" && i < a.len() {
                                a[i] = value;
                            } else if i <= a.len() {
                                a.insert(i, value);
                            } else {
                                return Err(bad(format!("index out of range at {path}")));
                            }
                        }
                    }
                    _ => return Err(bad(format!("missing path {path}"))),
                }
            }
            other => return Err(bad(format!("unknown JSON patch operation {other:?}"))),
        }
    }
    Ok(())
}

fn remove(target: &mut Value, path: &str) -> Option<Value> {
    let parts = pointer_parts(path);
    let (last, parents) = parts.split_last()?;
    let mut parent = target;
    for p in parents {
        parent = match parent {
            Value::Object(m) => m.get_mut(p)?,
            Value::Array(a) => a.get_mut(p.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    match parent {
        Value::Object(m) => m.remove(last),
        Value::Array(a) => {
            let i = last.parse::<usize>().ok()?;
            (i < a.len()).then(|| a.remove(i))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merges_lists_by_name() {
        let mut pod = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}});
        strategic(
            &mut pod,
            &json!({"spec": {"$setElementOrder/containers": [{"name": "a"}], "containers": [{"name": "a", "image": "z"}, {"name": "b", "$patch": "delete"}]}}),
        );
        assert_eq!(pod, json!({"spec": {"containers": [{"name": "a", "image": "z"}]}}));
    }

    #[test]
    fn merge_and_json_patch() {
        let mut v = json!({"metadata": {"labels": {"a": "1", "b": "2"}}});
        merge(&mut v, &json!({"metadata": {"labels": {"a": null, "c": "3"}}}));
        assert_eq!(v, json!({"metadata": {"labels": {"b": "2", "c": "3"}}}));
        json_patch(&mut v, &json!([{"op": "replace", "path": "/metadata/labels/b", "value": "x"}, {"op": "remove", "path": "/metadata/labels/c"}])).unwrap();
        assert_eq!(v, json!({"metadata": {"labels": {"b": "x"}}}));
    }
}
