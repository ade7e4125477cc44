//! The decode step of a write: the apiserver turns a body into the kind's Go type before anything else looks at
//! it, so a field of the wrong type (`"containers": [1]`, `"spec": "x"`) is a 400 and never reaches admission,
//! the strategies or the store. Here the body is decoded into the kind's Rust type (k8s-openapi) and dropped;
//! the JSON goes on.

use serde::de::DeserializeOwned;
use serde_json::Value;

use k8s_openapi::api::{authentication, coordination, core, events, policy};

use crate::store::ApiError;

fn decodes<T: DeserializeOwned>(kind: &str, api_version: &str, object: &Value) -> Result<(), ApiError> {
    // apiVersion and kind are the request's to leave out; the type insists on them.
    let mut v = object.clone();
    if let Value::Object(o) = &mut v {
        o.insert("apiVersion".into(), Value::from(api_version));
        o.insert("kind".into(), Value::from(kind));
    }
    serde_json::from_value::<T>(v).map(drop).map_err(|e| {
        ApiError::new(400, "BadRequest", format!("{kind} in version \"{api_version}\" cannot be decoded: {e}"))
    })
}

/// Checks that `object` decodes as a `kind` of `api_version`; kinds not known here pass.
pub fn check(kind: &str, api_version: &str, object: &Value) -> Result<(), ApiError> {
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
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wrong_types_are_a_400() {
        assert!(
            check("Pod", "v1", &json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}})).is_ok()
        );
        for bad in [
            json!({"spec": {"containers": [1]}}),
            json!({"spec": "x"}),
            json!({"metadata": {"labels": "x"}}),
            json!({"spec": {"containers": [{"name": "c", "resources": {"requests": "x"}}]}}),
        ] {
            assert_eq!(check("Pod", "v1", &bad).unwrap_err().code, 400, "{bad}");
        }
        assert_eq!(check("Node", "v1", &json!({"status": "x"})).unwrap_err().code, 400);
        assert_eq!(check("TokenRequest", "authentication.k8s.io/v1", &json!({"spec": "x"})).unwrap_err().code, 400);
        assert!(check("Widget", "v1", &json!({"spec": "x"})).is_ok());
    }
}
