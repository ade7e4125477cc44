//! Kubernetes' protobuf encoding, read: kubectl's typed clients (`create namespace`, `create configmap`,
//! `create secret`, `create serviceaccount`, `create service`, `create token`, `drain`'s evictions) send their
//! bodies as `application/vnd.kubernetes.protobuf`, and a real apiserver reads them. The envelope (`k8s\0`, then a
//! `runtime.Unknown` naming the kind) and the messages of those kinds are decoded to the JSON the rest of the
//! server works with, by field numbers taken from the API's `generated.proto`. Fields not listed are skipped; a
//! kind not listed is a 415.

use serde_json::{Map, Value, json};

use crate::store::ApiError;

/// The four bytes every protobuf-encoded object starts with.
const MAGIC: &[u8] = b"k8s\0";

/// How a field is read.
#[derive(Debug, Clone, Copy)]
enum Field {
    Str,
    Int,
    /// A plain (non-pointer) Go int with `omitempty`: Go writes its zero, JSON leaves it out.
    IntOmitZero,
    Bool,
    Msg(&'static str),
    /// `map<string, string>`.
    MapStr,
    /// `map<string, bytes>`.
    MapBytes,
    RepStr,
    RepMsg(&'static str),
    /// `intstr.IntOrString`: a number or a string in JSON.
    IntOrStr,
}

use Field::{Bool, Int, IntOmitZero, IntOrStr, MapBytes, MapStr, Msg, RepMsg, RepStr, Str};

/// The fields of each message read, by number.
fn schema(message: &str) -> Option<&'static [(u64, &'static str, Field)]> {
    Some(match message {
        // runtime.TypeMeta, the envelope's (not meta/v1's, whose numbers are the other way round).
        "TypeMeta" => &[(1, "apiVersion", Str), (2, "kind", Str)],
        "ObjectMeta" => &[
            (1, "name", Str),
            (2, "generateName", Str),
            (3, "namespace", Str),
            (5, "uid", Str),
            (6, "resourceVersion", Str),
            (11, "labels", MapStr),
            (12, "annotations", MapStr),
            (13, "ownerReferences", RepMsg("OwnerReference")),
            (14, "finalizers", RepStr),
        ],
        "OwnerReference" => &[
            (1, "kind", Str),
            (3, "name", Str),
            (4, "uid", Str),
            (5, "apiVersion", Str),
            (6, "controller", Bool),
            (7, "blockOwnerDeletion", Bool),
        ],
        "Namespace" => &[(1, "metadata", Msg("ObjectMeta")), (2, "spec", Msg("NamespaceSpec"))],
        "NamespaceSpec" => &[(1, "finalizers", RepStr)],
        "ConfigMap" => &[
            (1, "metadata", Msg("ObjectMeta")),
            (2, "data", MapStr),
            (3, "binaryData", MapBytes),
            (4, "immutable", Bool),
        ],
        "Secret" => &[
            (1, "metadata", Msg("ObjectMeta")),
            (2, "data", MapBytes),
            (3, "type", Str),
            (4, "stringData", MapStr),
            (5, "immutable", Bool),
        ],
        "ServiceAccount" => &[
            (1, "metadata", Msg("ObjectMeta")),
            (2, "secrets", RepMsg("ObjectReference")),
            (3, "imagePullSecrets", RepMsg("LocalObjectReference")),
            (4, "automountServiceAccountToken", Bool),
        ],
        "ObjectReference" => &[
            (1, "kind", Str),
            (2, "namespace", Str),
            (3, "name", Str),
            (4, "uid", Str),
            (5, "apiVersion", Str),
            (6, "resourceVersion", Str),
            (7, "fieldPath", Str),
        ],
        "LocalObjectReference" => &[(1, "name", Str)],
        "Binding" => &[(1, "metadata", Msg("ObjectMeta")), (2, "target", Msg("ObjectReference"))],
        "TokenRequest" => &[(1, "metadata", Msg("ObjectMeta")), (2, "spec", Msg("TokenRequestSpec"))],
        "TokenRequestSpec" => &[
            (1, "audiences", RepStr),
            (3, "boundObjectRef", Msg("BoundObjectReference")),
            (4, "expirationSeconds", Int),
        ],
        "BoundObjectReference" => &[(1, "kind", Str), (2, "apiVersion", Str), (3, "name", Str), (4, "uid", Str)],
        "Eviction" => &[(1, "metadata", Msg("ObjectMeta")), (2, "deleteOptions", Msg("DeleteOptions"))],
        "DeleteOptions" => &[
            (1, "gracePeriodSeconds", Int),
            (2, "preconditions", Msg("Preconditions")),
            (3, "orphanDependents", Bool),
            (4, "propagationPolicy", Str),
            (5, "dryRun", RepStr),
        ],
        "Preconditions" => &[(1, "uid", Str), (2, "resourceVersion", Str)],
        // `kubectl create service`.
        "Service" => &[(1, "metadata", Msg("ObjectMeta")), (2, "spec", Msg("ServiceSpec"))],
        "ServiceSpec" => &[
            (1, "ports", RepMsg("ServicePort")),
            (2, "selector", MapStr),
            (3, "clusterIP", Str),
            (4, "type", Str),
            (5, "externalIPs", RepStr),
            (7, "sessionAffinity", Str),
            (10, "externalName", Str),
            (11, "externalTrafficPolicy", Str),
            (17, "ipFamilyPolicy", Str),
            (18, "clusterIPs", RepStr),
            (19, "ipFamilies", RepStr),
            (22, "internalTrafficPolicy", Str),
        ],
        "ServicePort" => &[
            (1, "name", Str),
            (2, "protocol", Str),
            (3, "port", Int),
            (4, "targetPort", IntOrStr),
            (5, "nodePort", IntOmitZero),
            (6, "appProtocol", Str),
        ],
        _ => return None,
    })
}

/// One field off the wire: its number and its value (a varint, or the bytes of a length-delimited field).
enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Other,
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.buf.split_first().ok_or("a varint runs past the end")?;
            self.buf = rest;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("a varint is longer than 10 bytes".into())
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], String> {
        let n = usize::try_from(n).map_err(|_| "a length does not fit")?;
        if n > self.buf.len() {
            return Err("a field runs past the end".into());
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn next(&mut self) -> Result<Option<(u64, Wire<'a>)>, String> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let value = match key & 7 {
            0 => Wire::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Wire::Other
            }
            2 => {
                let n = self.varint()?;
                Wire::Bytes(self.take(n)?)
            }
            5 => {
                self.take(4)?;
                Wire::Other
            }
            other => return Err(format!("wire type {other} is not read")),
        };
        Ok(Some((key >> 3, value)))
    }
}

fn text(b: &[u8]) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| "a string is not UTF-8".to_owned())
}

/// A map entry: key 1, value 2.
fn entry(b: &[u8], bytes: bool) -> Result<(String, Value), String> {
    let mut r = Reader { buf: b };
    let (mut key, mut value) = (String::new(), json!(""));
    while let Some((n, w)) = r.next()? {
        match (n, w) {
            (1, Wire::Bytes(k)) => key = text(k)?,
            (2, Wire::Bytes(v)) if bytes => value = json!(crate::b64::encode(v, false)),
            (2, Wire::Bytes(v)) => value = json!(text(v)?),
            _ => {}
        }
    }
    Ok((key, value))
}

/// An `IntOrString` (its type (1: 0 for a number), `intVal` (2), `strVal` (3)) as JSON's number or string.
fn int_or_string(buf: &[u8]) -> Result<Value, String> {
    let (mut string, mut int, mut text_val) = (false, 0u64, String::new());
    let mut r = Reader { buf };
    while let Some((n, w)) = r.next()? {
        match (n, w) {
            (1, Wire::Varint(t)) => string = t == 1,
            (2, Wire::Varint(v)) => int = v,
            (3, Wire::Bytes(b)) => text_val = text(b)?,
            _ => {}
        }
    }
    Ok(if string { json!(text_val) } else { json!(int.cast_signed()) })
}

/// Decodes `message` from `buf` to JSON.
fn decode(message: &str, buf: &[u8]) -> Result<Value, String> {
    let fields = schema(message).ok_or_else(|| format!("{message} is not read"))?;
    let mut out = Map::new();
    let mut r = Reader { buf };
    while let Some((n, w)) = r.next()? {
        let Some(&(_, name, field)) = fields.iter().find(|(num, _, _)| *num == n) else { continue };
        let scalar = match (field, &w) {
            // Go writes empty strings of plain (non-pointer) fields; JSON leaves them out.
            (Str, Wire::Bytes([])) => continue,
            (Str, Wire::Bytes(b)) => Some(json!(text(b)?)),
            (IntOmitZero, Wire::Varint(0)) => continue,
            // Two's complement for negative int64s.
            (Int | IntOmitZero, Wire::Varint(v)) => Some(json!(v.cast_signed())),
            (Bool, Wire::Varint(v)) => Some(json!(*v != 0)),
            (Msg(m), Wire::Bytes(b)) => Some(decode(m, b)?),
            (IntOrStr, Wire::Bytes(b)) => Some(int_or_string(b)?),
            _ => None,
        };
        if let Some(v) = scalar {
            out.insert(name.to_owned(), v);
            continue;
        }
        let slot = out.entry(name.to_owned());
        match (field, w) {
            (MapStr | MapBytes, Wire::Bytes(b)) => {
                let (k, v) = entry(b, matches!(field, MapBytes))?;
                if let Value::Object(map) = slot.or_insert_with(|| json!({})) {
                    map.insert(k, v);
                }
            }
            (RepStr, Wire::Bytes(b)) => {
                if let Value::Array(list) = slot.or_insert_with(|| json!([])) {
                    list.push(json!(text(b)?));
                }
            }
            (RepMsg(m), Wire::Bytes(b)) => {
                let item = decode(m, b)?;
                if let Value::Array(list) = slot.or_insert_with(|| json!([])) {
                    list.push(item);
                }
            }
            (_, _) => return Err(format!("{message}.{name} has the wrong wire type")),
        }
    }
    Ok(Value::Object(out))
}

/// A protobuf-encoded object as JSON; 415 for a kind not read, 400 for a body that does not decode.
pub fn object(body: &[u8]) -> Result<Value, ApiError> {
    let bad = |why: String| ApiError::new(400, "BadRequest", format!("the protobuf body does not decode: {why}"));
    let envelope = body.strip_prefix(MAGIC).ok_or_else(|| bad("no k8s\\0 prefix".into()))?;
    // The envelope, a runtime.Unknown: the type (1) and the object's own encoding (2).
    let (mut type_meta, mut raw) = (Value::Null, &[][..]);
    let mut r = Reader { buf: envelope };
    while let Some((n, w)) = r.next().map_err(bad)? {
        match (n, w) {
            (1, Wire::Bytes(b)) => type_meta = decode("TypeMeta", b).map_err(bad)?,
            (2, Wire::Bytes(b)) => raw = b,
            _ => {}
        }
    }
    let kind = type_meta["kind"].as_str().unwrap_or("").to_owned();
    if schema(&kind).is_none() {
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the test apiserver reads {kind:?} only as JSON (kubectl create -f with a manifest sends JSON)"),
        ));
    }
    let mut object = decode(&kind, raw).map_err(bad)?;
    object["kind"] = json!(kind);
    object["apiVersion"] = type_meta["apiVersion"].clone();
    Ok(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(n: u64, wire: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![u8::try_from((n << 3) | wire).unwrap()];
        if wire == 2 {
            out.push(u8::try_from(payload.len()).unwrap());
        }
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn a_configmap_and_an_eviction_decode() {
        let meta = [field(1, 2, b"c1"), field(11, 2, &[field(1, 2, b"a"), field(2, 2, b"b")].concat())].concat();
        let cm = [field(1, 2, &meta), field(2, 2, &[field(1, 2, b"k"), field(2, 2, b"v")].concat())].concat();
        let type_meta = [field(2, 2, b"ConfigMap"), field(1, 2, b"v1")].concat();
        let body = [MAGIC.to_vec(), field(1, 2, &type_meta), field(2, 2, &cm)].concat();
        let v = object(&body).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c1", "labels": {"a": "b"}}, "data": {"k": "v"}})
        );
        let options = [field(1, 0, &[5]), field(2, 2, &field(1, 2, b"u1"))].concat();
        let eviction = [field(1, 2, &field(1, 2, b"p")), field(2, 2, &options)].concat();
        let type_meta = [field(2, 2, b"Eviction"), field(1, 2, b"policy/v1")].concat();
        let body = [MAGIC.to_vec(), field(1, 2, &type_meta), field(2, 2, &eviction)].concat();
        let v = object(&body).unwrap();
        assert_eq!(v["deleteOptions"], json!({"gracePeriodSeconds": 5, "preconditions": {"uid": "u1"}}));
        // Not protobuf, a kind not read, a truncated field.
        assert_eq!(object(b"{}").unwrap_err().code, 400);
        let type_meta = [field(2, 2, b"Pod"), field(1, 2, b"v1")].concat();
        assert_eq!(object(&[MAGIC.to_vec(), field(1, 2, &type_meta)].concat()).unwrap_err().code, 415);
        assert_eq!(object(&[MAGIC.to_vec(), vec![0x0a, 0x40, 0x01]].concat()).unwrap_err().code, 400);
    }
}
