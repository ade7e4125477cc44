//! The decode step of a write: the apiserver turns a body into the kind's Go type before anything else looks at
//! it, so a field of the wrong type (`"containers": [1]`, `"spec": "x"`) is a 400 and never reaches admission,
//! the strategies or the store. Here the body is decoded into the kind's Rust type (k8s-openapi) and dropped;
//! the JSON goes on.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use k8s_openapi::api::{authentication, coordination, core, events, policy};

use crate::store::ApiError;

/// Decodes `object` as the kind's type; the fields the type does not have, as the apiserver names them
/// (`spec.containers[0].imagee`) in the body's order, are taken out of `object`, as the apiserver's decode drops
/// them.
fn decodes<T: DeserializeOwned + Serialize>(
    kind: &str,
    api_version: &str,
    object: &mut Value,
) -> Result<Vec<String>, ApiError> {
    // apiVersion and kind are the request's to leave out; the type insists on them.
    let mut v = object.clone();
    if let Value::Object(o) = &mut v {
        o.insert("apiVersion".into(), Value::from(api_version));
        o.insert("kind".into(), Value::from(kind));
    }
    let typed = serde_json::from_value::<T>(v).map_err(|e| {
        ApiError::new(400, "BadRequest", format!("{kind} in version \"{api_version}\" cannot be decoded: {e}"))
    })?;
    // What the type keeps of the body: a field the body has and the type dropped is unknown to it.
    let kept = serde_json::to_value(typed).unwrap_or(Value::Null);
    let mut unknown = Vec::new();
    drop_unknown(object, &kept, &mut String::new(), &mut unknown);
    Ok(unknown)
}

/// Takes the fields of `body` (not null) that `kept` lacks out of it, with their paths.
fn drop_unknown(body: &mut Value, kept: &Value, path: &mut String, out: &mut Vec<String>) {
    match (body, kept) {
        (Value::Object(b), Value::Object(k)) => {
            b.retain(|key, value| {
                if value.is_null() {
                    return true;
                }
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
                let known = match k.get(key) {
                    Some(inner) => {
                        drop_unknown(value, inner, path, out);
                        true
                    }
                    None => {
                        out.push(path.clone());
                        false
                    }
                };
                path.truncate(len);
                known
            });
        }
        (Value::Array(b), Value::Array(k)) => {
            for (i, (value, inner)) in b.iter_mut().zip(k).enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                drop_unknown(value, inner, path, out);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

/// Checks that `object` decodes as a `kind` of `api_version` (kinds not known here pass), and takes out of it
/// the fields its type does not have, which it returns.
pub fn check(kind: &str, api_version: &str, object: &mut Value) -> Result<Vec<String>, ApiError> {
    match (kind, api_version) {
        ("Pod", _) => decodes::<core::v1::Pod>(kind, "v1", object),
        ("Node", _) => decodes::<core::v1::Node>(kind, "v1", object),
        ("Namespace", _) => decodes::<core::v1::Namespace>(kind, "v1", object),
        ("ConfigMap", _) => decodes::<core::v1::ConfigMap>(kind, "v1", object),
        ("Secret", _) => decodes::<core::v1::Secret>(kind, "v1", object),
        ("ServiceAccount", _) => decodes::<core::v1::ServiceAccount>(kind, "v1", object),
        ("Service", _) => decodes::<core::v1::Service>(kind, "v1", object),
        ("Binding", _) => decodes::<core::v1::Binding>(kind, "v1", object),
        ("Event", "events.k8s.io/v1") => decodes::<events::v1::Event>(kind, api_version, object),
        ("Event", _) => decodes::<core::v1::Event>(kind, "v1", object),
        ("Lease", _) => decodes::<coordination::v1::Lease>(kind, "coordination.k8s.io/v1", object),
        ("TokenRequest", _) => decodes::<authentication::v1::TokenRequest>(kind, "authentication.k8s.io/v1", object),
        ("Eviction", _) => decodes::<policy::v1::Eviction>(kind, "policy/v1", object),
        _ => Ok(Vec::new()),
    }
}

/// The write's `fieldValidation`: `Strict` refuses a body with fields its kind does not have, with the
/// apiserver's 400; `Warn` (the default) and `Ignore` take it, the unknown fields dropped by the decode.
pub fn validate_fields(
    kind: &str,
    api_version: &str,
    validation: Option<&str>,
    unknown: &[String],
) -> Result<(), ApiError> {
    if validation != Some("Strict") || unknown.is_empty() {
        return Ok(());
    }
    let fields: Vec<String> = unknown.iter().map(|f| format!("unknown field \"{f}\"")).collect();
    Err(ApiError::new(
        400,
        "BadRequest",
        format!(
            "{kind} in version \"{}\" cannot be handled as a {kind}: strict decoding error: {}",
            version_of(api_version),
            fields.join(", ")
        ),
    ))
}

/// The version part of `group/version`.
fn version_of(api_version: &str) -> &str {
    api_version.rsplit('/').next().unwrap_or(api_version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wrong_types_are_a_400() {
        assert!(
            check("Pod", "v1", &mut json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}))
                .is_ok()
        );
        for bad in [
            json!({"spec": {"containers": [1]}}),
            json!({"spec": "x"}),
            json!({"metadata": {"labels": "x"}}),
            json!({"spec": {"containers": [{"name": "c", "resources": {"requests": "x"}}]}}),
        ] {
            assert_eq!(check("Pod", "v1", &mut bad.clone()).unwrap_err().code, 400, "{bad}");
        }
        assert_eq!(check("Node", "v1", &mut json!({"status": "x"})).unwrap_err().code, 400);
        assert_eq!(check("TokenRequest", "authentication.k8s.io/v1", &mut json!({"spec": "x"})).unwrap_err().code, 400);
        assert!(check("Widget", "v1", &mut json!({"spec": "x"})).is_ok());
    }

    #[test]
    fn strict_validation_names_each_unknown_field_as_the_apiserver_does() {
        let mut pod = json!({
            "metadata": {"name": "p", "labels": {"any": "label"}, "colour": "red"},
            "spec": {"containers": [{"name": "c", "image": "i"}, {"name": "d", "imagee": "i", "resources": {}}],
                     "nodeName": null}
        });
        let unknown = check("Pod", "v1", &mut pod).unwrap();
        assert_eq!(unknown, ["metadata.colour", "spec.containers[1].imagee"]);
        // Dropped, as the decode drops them; the rest is as it was.
        assert_eq!(pod["metadata"], json!({"name": "p", "labels": {"any": "label"}}));
        assert_eq!(pod["spec"]["containers"][1], json!({"name": "d", "resources": {}}));
        assert_eq!(pod["spec"]["nodeName"], Value::Null);
        let e = validate_fields("Pod", "v1", Some("Strict"), &unknown).unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "Pod in version \"v1\" cannot be handled as a Pod: strict decoding error: unknown field \"metadata.colour\", unknown field \"spec.containers[1].imagee\""
        );
        for lax in [None, Some("Warn"), Some("Ignore")] {
            assert!(validate_fields("Pod", "v1", lax, &unknown).is_ok(), "{lax:?}");
        }
        // Maps of any keys and known fields are not unknown.
        let mut clean =
            json!({"metadata": {"name": "p", "annotations": {"x/y": "z"}}, "spec": {"containers": [{"name": "c"}]}});
        assert!(check("Pod", "v1", &mut clean).unwrap().is_empty());
        let mut lease = json!({"metadata": {"name": "n"}, "spec": {"holderIdentity": "n", "renewTime": "2026-01-01T00:00:00.000000Z"}});
        assert!(check("Lease", "coordination.k8s.io/v1", &mut lease).unwrap().is_empty());
    }
}
