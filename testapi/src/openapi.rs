//! The OpenAPI v3 documents kubectl reads before a create, apply or patch: it asks the server to validate fields
//! (`fieldValidation`) when the document of the object's group version lists that parameter for the kind's
//! PATCH, and otherwise downloads schemas to validate on its side. The documents carry paths and parameters
//! only, no schemas: the fields are checked on the server, as kubectl asks (`fieldValidation=Strict` refuses a
//! field the kind does not have, see `typed`).

use serde_json::{Map, Value, json};

use crate::route::{RESOURCES, Resource};

/// The URL path of a group version as the documents name it: `api/v1`, `apis/coordination.k8s.io/v1`.
fn gv_path(r: &Resource) -> String {
    if r.group.is_empty() { format!("api/{}", r.version) } else { format!("apis/{}/{}", r.group, r.version) }
}

/// `/openapi/v3`: the group versions served, each with the URL of its document.
pub fn root() -> Value {
    let mut paths = Map::new();
    for r in RESOURCES {
        let gv = gv_path(r);
        paths.insert(gv.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash=0")}));
    }
    json!({"paths": paths})
}

/// `/openapi/v3/<group version>`: its object paths, each with a PATCH that names the kind and takes the
/// write parameters; `None` for a group version not served.
pub fn document(gv: &str) -> Option<Value> {
    let served: Vec<&Resource> = RESOURCES.iter().filter(|r| gv_path(r) == gv).collect();
    if served.is_empty() {
        return None;
    }
    let query = |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}});
    let mut paths = Map::new();
    for r in served {
        let scope = if r.namespaced { "namespaces/{namespace}/" } else { "" };
        let kind = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let operation = json!({
            "operationId": format!("patch{}", r.kind),
            "parameters": [query("dryRun"), query("fieldManager"), query("fieldValidation"), query("force")],
            "responses": {"200": {"description": "OK"}},
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": kind,
        });
        paths.insert(format!("/{gv}/{scope}{}/{{name}}", r.plural), json!({"patch": operation}));
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.34.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}
