//! `[[runners.kubernetes.pod_spec]]`: patches of the generated pod's `spec`, applied in order as
//! gitlab-runner applies them with `FF_USE_ADVANCED_POD_SPEC_CONFIGURATION` on — `strategic`
//! (Kubernetes' strategic merge patch with the PodSpec's merge keys, the default), `json`
//! (RFC 6902) or `merge` (RFC 7386). A patch is JSON or YAML text, inline (`patch`) or in a
//! file (`patch_path`, read by the caller). Owns the entries' validation and the three patch
//! algorithms; does not read files, build the pod or touch the cluster.

use serde::Deserialize;
use serde_json::{Map, Value};

/// The feature flag that turns patches on (off by default, as in gitlab-runner).
pub const FEATURE_FLAG: &str = "FF_USE_ADVANCED_POD_SPEC_CONFIGURATION";

/// How a patch is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PatchType {
    /// Kubernetes' strategic merge patch (lists of containers, volumes, env... merged by name).
    #[default]
    Strategic,
    /// RFC 6902 JSON Patch: a list of operations.
    Json,
    /// RFC 7386 JSON Merge Patch.
    Merge,
}

impl PatchType {
    /// `patch_type`'s value (empty: strategic).
    pub fn parse(text: &str) -> Result<PatchType, String> {
        match text {
            "" | "strategic" => Ok(PatchType::Strategic),
            "json" => Ok(PatchType::Json),
            "merge" => Ok(PatchType::Merge),
            other => Err(format!("unsupported patch type {other:?} (strategic, json, merge)")),
        }
    }
}

/// One `[[runners.kubernetes.pod_spec]]` entry.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodSpecPatch {
    /// The entry's name (in errors).
    #[serde(default)]
    pub name: String,
    /// File holding the patch (exclusive with `patch`).
    #[serde(default)]
    pub patch_path: String,
    /// The patch itself, JSON or YAML.
    #[serde(default)]
    pub patch: String,
    /// `strategic` (default), `json` or `merge`.
    #[serde(default)]
    pub patch_type: String,
}

impl PodSpecPatch {
    /// Check the entry (type known, not both `patch` and `patch_path`); the error names it.
    pub fn validate(&self) -> Result<PatchType, String> {
        if !self.patch_path.is_empty() && !self.patch.is_empty() {
            return Err(format!("{}: set either patch or patch_path, not both", self.label()));
        }
        PatchType::parse(&self.patch_type).map_err(|e| format!("{}: {e}", self.label()))
    }

    fn label(&self) -> String {
        format!("pod_spec {:?}", self.name)
    }

    /// The patch document, its text read through `read` when it lives in `patch_path`.
    pub fn document(&self, read: impl FnOnce(&str) -> Result<String, String>) -> Result<Patch, String> {
        let kind = self.validate()?;
        let text = if self.patch_path.is_empty() {
            self.patch.clone()
        } else {
            read(&self.patch_path).map_err(|e| format!("{}: patch_path {:?}: {e}", self.label(), self.patch_path))?
        };
        let document = parse_document(&text).map_err(|e| format!("{}: {e}", self.label()))?;
        Ok(Patch { name: self.name.clone(), kind, document })
    }
}

/// A patch ready to apply.
#[derive(Debug, Clone, PartialEq)]
pub struct Patch {
    /// The entry's name.
    pub name: String,
    /// How it applies.
    pub kind: PatchType,
    /// The document (JSON).
    pub document: Value,
}

/// JSON or YAML text as JSON (YAML is a superset of JSON; an empty text is an empty object).
fn parse_document(text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    match serde_json::from_str(text) {
        Ok(value) => Ok(value),
        Err(_) => serde_yaml::from_str(text).map_err(|e| format!("the patch is neither JSON nor YAML: {e}")),
    }
}

/// Apply `patches` to `spec` in order; the error names the patch.
pub fn apply_all(mut spec: Value, patches: &[Patch]) -> Result<Value, String> {
    for patch in patches {
        spec = apply(spec, patch).map_err(|e| format!("pod_spec {:?}: {e}", patch.name))?;
    }
    Ok(spec)
}

/// Apply one patch to `spec`.
pub fn apply(spec: Value, patch: &Patch) -> Result<Value, String> {
    match patch.kind {
        PatchType::Strategic => strategic(spec, &patch.document),
        PatchType::Json => json_patch(spec, &patch.document),
        PatchType::Merge => Ok(merge_patch(spec, &patch.document)),
    }
}

// ---- RFC 7386 ----

/// RFC 7386: objects merge key by key, `null` deletes, anything else replaces.
pub fn merge_patch(target: Value, patch: &Value) -> Value {
    let Value::Object(patch) = patch else { return patch.clone() };
    let mut target = match target {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    for (key, value) in patch {
        if value.is_null() {
            target.remove(key);
        } else {
            let old = target.remove(key).unwrap_or(Value::Null);
            target.insert(key.clone(), merge_patch(old, value));
        }
    }
    Value::Object(target)
}

// ---- RFC 6902 ----

/// RFC 6902: the operations in order; any failing operation fails the whole patch.
pub fn json_patch(mut doc: Value, ops: &Value) -> Result<Value, String> {
    let ops = ops.as_array().ok_or("a json patch is a list of operations")?;
    for (i, op) in ops.iter().enumerate() {
        apply_op(&mut doc, op).map_err(|e| format!("operation {i}: {e}"))?;
    }
    Ok(doc)
}

fn apply_op(doc: &mut Value, op: &Value) -> Result<(), String> {
    let field = |key: &str| -> Result<&str, String> {
        op.get(key).and_then(Value::as_str).ok_or_else(|| format!("missing {key:?}"))
    };
    let value = || op.get("value").cloned().ok_or_else(|| "missing \"value\"".to_string());
    let path = pointer(field("path")?)?;
    match field("op")? {
        "add" => add(doc, &path, value()?),
        "remove" => remove(doc, &path).map(drop),
        "replace" => {
            let target = lookup_mut(doc, &path)?;
            *target = value()?;
            Ok(())
        }
        "move" => {
            let from = pointer(field("from")?)?;
            if path.len() > from.len() && path.starts_with(&from) {
                return Err("cannot move a value into itself".into());
            }
            let moved = remove(doc, &from)?;
            add(doc, &path, moved)
        }
        "copy" => {
            let copied = lookup_mut(doc, &pointer(field("from")?)?)?.clone();
            add(doc, &path, copied)
        }
        "test" => {
            if *lookup_mut(doc, &path)? == value()? {
                Ok(())
            } else {
                Err(format!("test failed at {:?}", field("path")?))
            }
        }
        other => Err(format!("unknown op {other:?}")),
    }
}

/// The reference tokens of a JSON pointer (RFC 6901).
fn pointer(text: &str) -> Result<Vec<String>, String> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let rest = text.strip_prefix('/').ok_or_else(|| format!("{text:?} is not a JSON pointer"))?;
    Ok(rest.split('/').map(|t| t.replace("~1", "/").replace("~0", "~")).collect())
}

fn index(token: &str, len: usize, allow_end: bool) -> Result<usize, String> {
    if token == "-" && allow_end {
        return Ok(len);
    }
    let valid =
        !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit()) && (token == "0" || !token.starts_with('0'));
    let i: usize = if valid { token.parse().map_err(|_| format!("bad index {token:?}"))? } else { usize::MAX };
    if i == usize::MAX || i > len || (i == len && !allow_end) {
        return Err(format!("index {token:?} out of range (length {len})"));
    }
    Ok(i)
}

fn lookup_mut<'a>(doc: &'a mut Value, path: &[String]) -> Result<&'a mut Value, String> {
    let mut here = doc;
    for token in path {
        here = match here {
            Value::Object(map) => map.get_mut(token).ok_or_else(|| format!("no member {token:?}"))?,
            Value::Array(list) => {
                let i = index(token, list.len(), false)?;
                &mut list[i]
            }
            _ => return Err(format!("{token:?}: not in an object or list")),
        };
    }
    Ok(here)
}

fn add(doc: &mut Value, path: &[String], value: Value) -> Result<(), String> {
    let Some((last, parent)) = path.split_last() else {
        *doc = value;
        return Ok(());
    };
    match lookup_mut(doc, parent)? {
        Value::Object(map) => {
            map.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(list) => {
            let i = index(last, list.len(), true)?;
            list.insert(i, value);
            Ok(())
        }
        _ => Err(format!("{last:?}: the parent is neither an object nor a list")),
    }
}

fn remove(doc: &mut Value, path: &[String]) -> Result<Value, String> {
    let (last, parent) = path.split_last().ok_or("cannot remove the whole document")?;
    match lookup_mut(doc, parent)? {
        Value::Object(map) => map.remove(last).ok_or_else(|| format!("no member {last:?}")),
        Value::Array(list) => {
            let i = index(last, list.len(), false)?;
            Ok(list.remove(i))
        }
        _ => Err(format!("{last:?}: the parent is neither an object nor a list")),
    }
}

// ---- strategic merge patch ----

const PATCH: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";

/// The merge key of the list at `path` (field names from the PodSpec, list positions left out),
/// from the PodSpec's `patchMergeKey` tags; `None`: the list is replaced whole.
fn merge_key(path: &[String]) -> Option<&'static str> {
    let path: Vec<&str> = path.iter().map(String::as_str).collect();
    let container = |c: &str| matches!(c, "containers" | "initContainers" | "ephemeralContainers");
    match path.as_slice() {
        [c] if container(c) => Some("name"),
        ["volumes" | "imagePullSecrets" | "resourceClaims" | "schedulingGates"] => Some("name"),
        ["hostAliases"] => Some("ip"),
        ["topologySpreadConstraints"] => Some("topologyKey"),
        [c, "env"] if container(c) => Some("name"),
        [c, "ports"] if container(c) => Some("containerPort"),
        [c, "volumeMounts"] if container(c) => Some("mountPath"),
        [c, "volumeDevices"] if container(c) => Some("devicePath"),
        _ => None,
    }
}

/// Kubernetes' strategic merge patch of a PodSpec: maps merge, `null` deletes, lists with a
/// merge key merge element by element (new ones appended), other lists are replaced; the
/// directives `$patch` (`replace`, `delete`, `merge`), `$retainKeys`,
/// `$deleteFromPrimitiveList/<field>` and `$setElementOrder/<field>` are honoured.
pub fn strategic(original: Value, patch: &Value) -> Result<Value, String> {
    let Value::Object(patch) = patch else { return Err("a strategic merge patch is an object".into()) };
    let original = match original {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    merge_map(original, patch, &mut Vec::new()).map(|m| m.map(Value::Object).unwrap_or(Value::Null))
}

/// `patch` merged into `original`; `None` when the patch deletes the map.
fn merge_map(
    mut original: Map<String, Value>,
    patch: &Map<String, Value>,
    path: &mut Vec<String>,
) -> Result<Option<Map<String, Value>>, String> {
    match patch.get(PATCH).map(|d| d.as_str().unwrap_or_default()) {
        None | Some("merge") => {}
        Some("delete") => return Ok(None),
        Some("replace") => return merge_map(Map::new(), &without_directives(patch), path),
        Some(other) => return Err(format!("{}: unknown $patch directive {other:?}", at(path))),
    }
    for (key, value) in patch {
        if let Some(field) = key.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) {
            let gone = value.as_array().cloned().unwrap_or_default();
            if let Some(Value::Array(list)) = original.get_mut(field) {
                list.retain(|v| !gone.contains(v));
            }
            continue;
        }
        if key.starts_with('$') {
            continue;
        }
        if value.is_null() {
            original.remove(key);
            continue;
        }
        path.push(key.clone());
        let merged = merge_value(original.remove(key), value, path);
        path.pop();
        if let Some(merged) = merged? {
            original.insert(key.clone(), merged);
        }
    }
    for (key, order) in patch {
        if let (Some(field), Value::Array(order)) = (key.strip_prefix(SET_ELEMENT_ORDER), order) {
            if let Some(Value::Array(list)) = original.get_mut(field) {
                path.push(field.to_string());
                set_order(list, order, merge_key(path));
                path.pop();
            }
        }
    }
    if let Some(keep) = patch.get(RETAIN_KEYS) {
        let keep = keep.as_array().ok_or_else(|| format!("{}: $retainKeys is not a list", at(path)))?;
        original.retain(|k, _| keep.iter().any(|kept| kept.as_str() == Some(k)));
    }
    Ok(Some(original))
}

fn merge_value(original: Option<Value>, patch: &Value, path: &mut Vec<String>) -> Result<Option<Value>, String> {
    match patch {
        Value::Object(patch) => {
            let original = match original {
                Some(Value::Object(map)) => map,
                _ => Map::new(),
            };
            Ok(merge_map(original, patch, path)?.map(Value::Object))
        }
        Value::Array(items) => match merge_key(path) {
            Some(key) => {
                let original = match original {
                    Some(Value::Array(list)) => list,
                    _ => Vec::new(),
                };
                merge_list(original, items, key, path).map(|l| Some(Value::Array(l)))
            }
            None => Ok(Some(Value::Array(items.iter().filter(|i| !is_directive_item(i)).cloned().collect()))),
        },
        other => Ok(Some(other.clone())),
    }
}

/// A list merged by `key`.
fn merge_list(
    mut original: Vec<Value>,
    items: &[Value],
    key: &str,
    path: &mut Vec<String>,
) -> Result<Vec<Value>, String> {
    if items.iter().any(|i| i.get(PATCH).and_then(Value::as_str) == Some("replace")) {
        original = Vec::new();
    }
    for item in items {
        let Value::Object(item) = item else {
            return Err(format!("{}: a list merged by {key:?} holds objects", at(path)));
        };
        let directive = item.get(PATCH).and_then(Value::as_str);
        if directive == Some("replace") && item.len() == 1 {
            continue;
        }
        let id = item.get(key).ok_or_else(|| format!("{}: an element without its merge key {key:?}", at(path)))?;
        let position = original.iter().position(|o| o.get(key) == Some(id));
        if directive == Some("delete") {
            original.retain(|o| o.get(key) != Some(id));
            continue;
        }
        match position {
            Some(i) => {
                let Value::Object(old) = std::mem::take(&mut original[i]) else { continue };
                match merge_map(old, item, path)? {
                    Some(merged) => original[i] = Value::Object(merged),
                    None => {
                        original.remove(i);
                    }
                }
            }
            None => {
                if let Some(new) = merge_map(Map::new(), item, path)? {
                    original.push(Value::Object(new));
                }
            }
        }
    }
    Ok(original)
}

/// Put the elements named in `order` first, in its order; the others keep theirs after them.
fn set_order(list: &mut [Value], order: &[Value], key: Option<&str>) {
    let rank = |v: &Value| {
        order
            .iter()
            .position(|o| match key {
                Some(k) => o.get(k).is_some() && o.get(k) == v.get(k),
                None => o == v,
            })
            .unwrap_or(usize::MAX)
    };
    list.sort_by_key(rank);
}

fn is_directive_item(item: &Value) -> bool {
    item.as_object().is_some_and(|m| m.len() == 1 && m.contains_key(PATCH))
}

fn without_directives(map: &Map<String, Value>) -> Map<String, Value> {
    map.iter().filter(|(k, _)| !k.starts_with('$')).map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn at(path: &[String]) -> String {
    if path.is_empty() {
        "spec".into()
    } else {
        format!("spec.{}", path.join("."))
    }
}

#[cfg(test)]
#[path = "patch_tests.rs"]
mod tests;
