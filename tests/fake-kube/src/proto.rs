//! Request bodies in Kubernetes' protobuf encoding (`application/vnd.kubernetes.protobuf`),
//! which kubectl's typed clients send (`create namespace`, `create secret`, `auth can-i`):
//! the `k8s\0` + `runtime.Unknown` envelope and the wire format, decoded to the JSON the rest
//! of the server works on, for the kinds those commands create (field numbers from
//! k8s.io/api's generated.proto). Any other kind is a clear 415. Pure functions.

use base64::Engine;
use serde_json::{json, Map, Value};

use crate::status::ApiError;

#[derive(Clone, Copy)]
enum Kind {
    Str,
    Bytes,
    Int,
    Bool,
    Time,
    Msg(&'static [Field]),
    RepeatedStr,
    RepeatedMsg(&'static [Field]),
    MapStr,
    MapBytes,
}

type Field = (u32, &'static str, Kind);

const OWNER: &[Field] = &[
    (1, "kind", Kind::Str),
    (3, "name", Kind::Str),
    (4, "uid", Kind::Str),
    (5, "apiVersion", Kind::Str),
    (6, "controller", Kind::Bool),
    (7, "blockOwnerDeletion", Kind::Bool),
];
const META: &[Field] = &[
    (1, "name", Kind::Str),
    (2, "generateName", Kind::Str),
    (3, "namespace", Kind::Str),
    (5, "uid", Kind::Str),
    (6, "resourceVersion", Kind::Str),
    (7, "generation", Kind::Int),
    (8, "creationTimestamp", Kind::Time),
    (11, "labels", Kind::MapStr),
    (12, "annotations", Kind::MapStr),
    (13, "ownerReferences", Kind::RepeatedMsg(OWNER)),
    (14, "finalizers", Kind::RepeatedStr),
];
const NAMESPACE: &[Field] = &[
    (1, "metadata", Kind::Msg(META)),
    (2, "spec", Kind::Msg(&[(1, "finalizers", Kind::RepeatedStr)])),
    (3, "status", Kind::Msg(&[(1, "phase", Kind::Str)])),
];
const SECRET: &[Field] = &[
    (1, "metadata", Kind::Msg(META)),
    (2, "data", Kind::MapBytes),
    (3, "type", Kind::Str),
    (4, "stringData", Kind::MapStr),
    (5, "immutable", Kind::Bool),
];
const CONFIGMAP: &[Field] = &[
    (1, "metadata", Kind::Msg(META)),
    (2, "data", Kind::MapStr),
    (3, "binaryData", Kind::MapBytes),
    (4, "immutable", Kind::Bool),
];
const LOCAL_REF: &[Field] = &[(1, "name", Kind::Str)];
const SERVICEACCOUNT: &[Field] = &[
    (1, "metadata", Kind::Msg(META)),
    (3, "imagePullSecrets", Kind::RepeatedMsg(LOCAL_REF)),
    (4, "automountServiceAccountToken", Kind::Bool),
];
const RESOURCE_ATTRIBUTES: &[Field] = &[
    (1, "namespace", Kind::Str),
    (2, "verb", Kind::Str),
    (3, "group", Kind::Str),
    (4, "version", Kind::Str),
    (5, "resource", Kind::Str),
    (6, "subresource", Kind::Str),
    (7, "name", Kind::Str),
];
const ACCESS_REVIEW: &[Field] = &[
    (1, "metadata", Kind::Msg(META)),
    (
        2,
        "spec",
        Kind::Msg(&[
            (1, "resourceAttributes", Kind::Msg(RESOURCE_ATTRIBUTES)),
            (2, "nonResourceAttributes", Kind::Msg(&[(1, "path", Kind::Str), (2, "verb", Kind::Str)])),
        ]),
    ),
];

/// A field read: its number, its varint value, its bytes (length-delimited).
type WireField<'a> = (u32, u64, &'a [u8]);

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

fn bad(what: &str) -> ApiError {
    ApiError::bad_request(format!("the protobuf body could not be decoded: {what}"))
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, ApiError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.data.get(self.at).ok_or_else(|| bad("truncated varint"))?;
            self.at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(bad("varint too long"))
    }

    /// The next field: number, wire type, and its varint or bytes.
    fn field(&mut self) -> Result<Option<WireField<'a>>, ApiError> {
        if self.at >= self.data.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let (number, wire) = ((key >> 3) as u32, key & 7);
        match wire {
            0 => Ok(Some((number, self.varint()?, &[]))),
            2 => {
                let len = self.varint()? as usize;
                let end =
                    self.at.checked_add(len).filter(|e| *e <= self.data.len()).ok_or_else(|| bad("truncated field"))?;
                let bytes = &self.data[self.at..end];
                self.at = end;
                Ok(Some((number, 0, bytes)))
            }
            1 => {
                self.at += 8;
                Ok(Some((number, 0, &[])))
            }
            5 => {
                self.at += 4;
                Ok(Some((number, 0, &[])))
            }
            _ => Err(bad("unsupported wire type")),
        }
    }
}

fn text(bytes: &[u8]) -> Value {
    Value::String(String::from_utf8_lossy(bytes).into_owned())
}

fn map_entry(bytes: &[u8], as_bytes: bool) -> Result<(String, Value), ApiError> {
    let mut reader = Reader { data: bytes, at: 0 };
    let (mut key, mut value) = (String::new(), Value::String(String::new()));
    while let Some((number, _, data)) = reader.field()? {
        match number {
            1 => key = String::from_utf8_lossy(data).into_owned(),
            2 if as_bytes => value = json!(base64::engine::general_purpose::STANDARD.encode(data)),
            2 => value = text(data),
            _ => {}
        }
    }
    Ok((key, value))
}

fn message(bytes: &[u8], schema: &[Field]) -> Result<Value, ApiError> {
    let mut reader = Reader { data: bytes, at: 0 };
    let mut out = Map::new();
    while let Some((number, varint, data)) = reader.field()? {
        let Some((_, name, kind)) = schema.iter().find(|(n, _, _)| *n == number) else { continue };
        let name = name.to_string();
        // The apiserver's Go types emit every scalar; empty and zero mean unset in JSON.
        let empty = match kind {
            Kind::Str | Kind::Bytes | Kind::Time => data.is_empty(),
            Kind::Int => varint == 0,
            _ => false,
        };
        if empty {
            continue;
        }
        match kind {
            Kind::Str => {
                out.insert(name, text(data));
            }
            Kind::Bytes => {
                out.insert(name, json!(base64::engine::general_purpose::STANDARD.encode(data)));
            }
            Kind::Int => {
                out.insert(name, json!(varint as i64));
            }
            Kind::Bool => {
                out.insert(name, json!(varint != 0));
            }
            Kind::Time => {
                let Some(seconds) = message(data, &[(1, "s", Kind::Int)])?["s"].as_i64() else { continue };
                let time = chrono::DateTime::from_timestamp(seconds, 0).unwrap_or_default();
                out.insert(name, json!(time.format("%Y-%m-%dT%H:%M:%SZ").to_string()));
            }
            Kind::Msg(inner) => {
                out.insert(name, message(data, inner)?);
            }
            Kind::RepeatedStr => {
                if let Some(items) = out.entry(name).or_insert_with(|| json!([])).as_array_mut() {
                    items.push(text(data));
                }
            }
            Kind::RepeatedMsg(inner) => {
                let item = message(data, inner)?;
                if let Some(items) = out.entry(name).or_insert_with(|| json!([])).as_array_mut() {
                    items.push(item);
                }
            }
            Kind::MapStr | Kind::MapBytes => {
                let (key, value) = map_entry(data, matches!(kind, Kind::MapBytes))?;
                if let Some(map) = out.entry(name).or_insert_with(|| json!({})).as_object_mut() {
                    map.insert(key, value);
                }
            }
        }
    }
    Ok(Value::Object(out))
}

/// Decode a protobuf request body into its JSON object.
pub(crate) fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let envelope = body.strip_prefix(b"k8s\0").ok_or_else(|| bad("no k8s magic prefix"))?;
    let unknown = message(
        envelope,
        &[(1, "typeMeta", Kind::Msg(&[(1, "apiVersion", Kind::Str), (2, "kind", Kind::Str)])), (2, "raw", Kind::Bytes)],
    )?;
    let kind = unknown["typeMeta"]["kind"].as_str().unwrap_or_default().to_string();
    let api_version = unknown["typeMeta"]["apiVersion"].as_str().unwrap_or_default().to_string();
    let raw = base64::engine::general_purpose::STANDARD
        .decode(unknown["raw"].as_str().unwrap_or_default())
        .map_err(|_| bad("raw"))?;
    let schema = match kind.as_str() {
        "Namespace" => NAMESPACE,
        "Secret" => SECRET,
        "ConfigMap" => CONFIGMAP,
        "ServiceAccount" => SERVICEACCOUNT,
        "SelfSubjectAccessReview" => ACCESS_REVIEW,
        other => {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!("fake-kube decodes protobuf bodies of Namespace, Secret, ConfigMap, ServiceAccount and SelfSubjectAccessReview only (got {other}); send JSON"),
            ))
        }
    };
    let mut object = message(&raw, schema)?;
    object["kind"] = json!(kind);
    object["apiVersion"] = json!(api_version);
    Ok(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(number: u32, data: &[u8]) -> Vec<u8> {
        let mut out = vec![((number << 3) | 2) as u8, data.len() as u8];
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn decodes_a_namespace() {
        let meta = [field(1, b"team"), field(11, &[field(1, b"a"), field(2, b"b")].concat())].concat();
        let namespace = field(1, &meta);
        let type_meta = [field(1, b"v1"), field(2, b"Namespace")].concat();
        let envelope = [b"k8s\0".to_vec(), field(1, &type_meta), field(2, &namespace)].concat();
        let object = decode(&envelope).unwrap();
        assert_eq!(
            object,
            json!({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": "team", "labels": {"a": "b"}}})
        );
    }
}
