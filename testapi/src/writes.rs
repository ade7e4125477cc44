//! Writes to an existing object: updates, the four patch types (server-side apply included, creating what does
//! not exist), bindings and evictions.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::route::{Resource, Target};
use crate::server::{Request, success};
use crate::store::{self, ApiError, Propagation};
use crate::{State, admission, patch, restriction, typed};

/// The media type of an RFC 6902 JSON patch.
pub const JSON_PATCH: &str = "application/json-patch+json";
const MERGE_PATCH: &str = "application/merge-patch+json";
const STRATEGIC_PATCH: &str = "application/strategic-merge-patch+json";
const APPLY_PATCH: &str = "application/apply-patch+yaml";

/// An update (PUT) or a patch of the object `target` names.
pub fn write(state: &Arc<State>, verb: &str, target: &Target, mut req: Request<'_>) -> Result<Value, ApiError> {
    let r = &target.resource;
    let ns = target.namespace.as_deref();
    let name = target.name.as_deref().unwrap_or("");
    let status = target.subresource.as_deref() == Some("status");
    let validation = req.query.get("fieldValidation").map(String::as_str);
    let body = req.body.take().ok_or_else(|| ApiError::new(400, "BadRequest", format!("an {verb} needs a body")))?;
    // What a write would make of the object is checked under the store's lock: a node's (a PUT that drops a
    // taint, a patch that nulls a label) and the update rules of the kind.
    let guard = |old: &Value, new: &Value| {
        if let Some(node) = req.who {
            restriction::check_result(node, target, old, new)?;
        }
        admission::on_update(r, old, new, status)
    };
    if verb == "update" {
        return state.store.replace(r, ns, name, body, status, &guard);
    }
    let media = req.content_type.split(';').next().unwrap_or("").trim();
    if media == APPLY_PATCH {
        return apply(state, target, &req, body, &guard);
    }
    state.store.update(
        r,
        ns,
        name,
        |old| {
            let mut new = old.clone();
            match media {
                MERGE_PATCH => patch::merge(&mut new, &body),
                STRATEGIC_PATCH => patch::strategic(r.kind, &mut new, &body).map_err(strategic_error)?,
                JSON_PATCH if !body.is_array() => {
                    return Err(ApiError::new(400, "BadRequest", "a JSON patch must be a list of operations"));
                }
                JSON_PATCH if body.as_array().is_some_and(|ops| ops.len() > patch::MAX_OPERATIONS) => {
                    return Err(ApiError::new(
                        413,
                        "RequestEntityTooLarge",
                        format!("the JSON patch has more than {} operations", patch::MAX_OPERATIONS),
                    ));
                }
                JSON_PATCH => patch::json_patch(&mut new, &body).map_err(|e| {
                    if e.starts_with(patch::TOO_MUCH_COPIED) {
                        ApiError::new(413, "RequestEntityTooLarge", e)
                    } else {
                        ApiError::new(422, "Invalid", e)
                    }
                })?,
                other => {
                    return Err(ApiError::new(
                        415,
                        "UnsupportedMediaType",
                        format!("the body of the request was in an unknown format - accepted media types include: {JSON_PATCH}, {MERGE_PATCH}, {APPLY_PATCH}, {STRATEGIC_PATCH} (got {other:?})"),
                    ));
                }
            }
            // A resourceVersion in the patch is a precondition.
            if let Some(rv) = body["metadata"]["resourceVersion"].as_str()
                && Some(rv) != old["metadata"]["resourceVersion"].as_str()
            {
                return Err(store::conflict(r, name));
            }
            if !new.is_object() || !(new["metadata"].is_object() || new["metadata"].is_null()) {
                return Err(ApiError::new(422, "Invalid", "the patch does not leave an object with metadata"));
            }
            // What the patch made must still be the kind's type.
            let unknown =
                typed::check(r.kind, &r.api_version(), &mut new).map_err(|e| ApiError::new(422, "Invalid", e.message))?;
            typed::validate_fields(r.kind, &r.api_version(), validation, &unknown)?;
            guard(old, &new)?;
            Ok(new)
        },
        status,
    )
}

/// A strategic merge patch that does not apply, with the apiserver's status for it: 400 for a malformed patch
/// or directive, 422 for lists of lists, 500 for the rest (a missing merge key, an unknown `$patch`).
fn strategic_error(e: String) -> ApiError {
    if e.starts_with("invalid JSON document") || e.starts_with("invalid patch format") {
        ApiError::new(400, "BadRequest", e)
    } else if e.contains("lists of lists") {
        ApiError::new(422, "Invalid", e)
    } else {
        ApiError::new(500, "InternalError", e)
    }
}

/// The field paths an applied configuration sets: map keys, down to scalars and lists (a list is owned whole).
fn fields(v: &Value, at: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let Value::Object(o) = v else {
        out.push(at.clone());
        return;
    };
    for (k, child) in o {
        if at.is_empty() && matches!(k.as_str(), "apiVersion" | "kind") {
            continue;
        }
        if at.len() == 1 && at[0] == "metadata" && !matches!(k.as_str(), "labels" | "annotations" | "finalizers") {
            continue;
        }
        at.push(k.clone());
        fields(child, at, out);
        at.pop();
    }
}

/// Paths as `fieldsV1` writes them: `{"f:spec": {"f:replicas": {}}}`.
fn fields_v1(paths: &[Vec<String>]) -> Value {
    let mut root = Map::new();
    for path in paths {
        let mut node = &mut root;
        for segment in path {
            let next = node.entry(format!("f:{segment}")).or_insert_with(|| json!({}));
            let Value::Object(m) = next else { break };
            node = m;
        }
    }
    Value::Object(root)
}

/// The paths a `fieldsV1` lists (the leaves).
fn paths_of(fields: &Value) -> Vec<Vec<String>> {
    fn walk(v: &Value, at: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        let Some(o) = v.as_object() else { return };
        if o.is_empty() && !at.is_empty() {
            out.push(at.clone());
        }
        for (k, child) in o {
            let Some(segment) = k.strip_prefix("f:") else { continue };
            at.push(segment.to_owned());
            walk(child, at, out);
            at.pop();
        }
    }
    let mut out = Vec::new();
    walk(fields, &mut Vec::new(), &mut out);
    out
}

fn at_path<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(k))
}

fn remove_path(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else { return };
    let mut node = v;
    for k in parents {
        match node.get_mut(k) {
            Some(n) => node = n,
            None => return,
        }
    }
    if let Value::Object(o) = node {
        o.remove(last);
    }
}

/// Server-side apply, basic: `fieldManager` is required; a missing object is created from the configuration;
/// an existing one gets the configuration merged in (strategically), loses the fields this manager applied
/// before and applies no longer (unless another manager applied them too), and refuses with 409 a field another
/// manager applied with another value unless `force=true`. Each manager's fields are kept in `managedFields`.
fn apply(
    state: &Arc<State>,
    target: &Target,
    req: &Request<'_>,
    mut config: Value,
    guard: &dyn Fn(&Value, &Value) -> Result<(), ApiError>,
) -> Result<Value, ApiError> {
    let r: &Resource = &target.resource;
    let ns = target.namespace.as_deref();
    let name = target.name.as_deref().unwrap_or("");
    let q = req.query;
    let Some(manager) = q.get("fieldManager").filter(|m| !m.is_empty()).cloned() else {
        return Err(ApiError::new(
            422,
            "Invalid",
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
        ));
    };
    if config["apiVersion"].as_str().is_none_or(str::is_empty) || config["kind"].as_str().is_none_or(str::is_empty) {
        return Err(ApiError::new(400, "BadRequest", "apiVersion and kind must be set in an applied configuration"));
    }
    if config["metadata"]["name"].as_str().is_some_and(|n| n != name) {
        return Err(ApiError::new(400, "BadRequest", "the name of the object does not match the name on the URL"));
    }
    let force = q.get("force").is_some_and(|f| f == "true");
    let status = target.subresource.as_deref() == Some("status");
    // Decoded first: the fields the kind does not have are refused or dropped before anyone owns them.
    let unknown = typed::check(r.kind, &r.api_version(), &mut config)?;
    typed::validate_fields(r.kind, &r.api_version(), q.get("fieldValidation").map(String::as_str), &unknown)?;
    let mut paths = Vec::new();
    fields(&config, &mut Vec::new(), &mut paths);
    let entry = json!({
        "manager": manager, "operation": "Apply", "apiVersion": r.api_version(),
        "time": store::now(), "fieldsType": "FieldsV1", "fieldsV1": fields_v1(&paths),
    });
    if state.store.get(r, ns, name).is_err() {
        // A missing object is created, with the create's rules; through a subresource it is not found.
        if status {
            return state.store.get(r, ns, name);
        }
        let mut object = config.clone();
        object["metadata"]["name"] = json!(name);
        object["metadata"]["managedFields"] = json!([entry]);
        if let Some(node) = req.who {
            let ask =
                restriction::Ask { verb: "create", target, body: Some(&object), stored: None, field_selector: None };
            restriction::check(&state.store, node, &ask)?;
        }
        return state.create(r, ns, object);
    }
    state.store.update(
        r,
        ns,
        name,
        |old| {
            let managed = old["metadata"]["managedFields"].as_array().cloned().unwrap_or_default();
            let (mine, others): (Vec<Value>, Vec<Value>) =
                managed.into_iter().partition(|m| m["manager"] == manager.as_str() && m["operation"] == "Apply");
            let theirs: Vec<(String, Vec<String>)> = others
                .iter()
                .filter(|m| m["operation"] == "Apply")
                .flat_map(|m| {
                    let who = m["manager"].as_str().unwrap_or("").to_owned();
                    paths_of(&m["fieldsV1"]).into_iter().map(move |p| (who.clone(), p))
                })
                .collect();
            if !force {
                let conflicts: Vec<String> = paths
                    .iter()
                    .filter_map(|p| {
                        let (who, _) = theirs.iter().find(|(_, q)| q == p)?;
                        (at_path(old, p) != at_path(&config, p))
                            .then(|| format!("conflict with \"{who}\": .{}", p.join(".")))
                    })
                    .collect();
                if !conflicts.is_empty() {
                    return Err(ApiError::new(
                        409,
                        "Conflict",
                        format!(
                            "Apply failed with {} conflict{}: {}",
                            conflicts.len(),
                            if conflicts.len() == 1 { "" } else { "s" },
                            conflicts.join(", ")
                        ),
                    ));
                }
            }
            let mut new = old.clone();
            let before: Vec<Vec<String>> = mine.iter().flat_map(|m| paths_of(&m["fieldsV1"])).collect();
            for gone in before.iter().filter(|p| !paths.contains(p) && !theirs.iter().any(|(_, q)| q == *p)) {
                remove_path(&mut new, gone);
            }
            patch::strategic(r.kind, &mut new, &config).map_err(strategic_error)?;
            // With force, the fields taken over leave their former managers.
            let mut kept: Vec<Value> = others;
            if force {
                for m in &mut kept {
                    let left: Vec<Vec<String>> =
                        paths_of(&m["fieldsV1"]).into_iter().filter(|p| !paths.contains(p)).collect();
                    m["fieldsV1"] = fields_v1(&left);
                }
            }
            kept.push(entry.clone());
            new["metadata"]["managedFields"] = json!(kept);
            guard(old, &new)?;
            Ok(new)
        },
        status,
    )
}

/// A binding (`pods/<name>/binding`, as the scheduler posts it): the pod gets its node and `PodScheduled`; a pod
/// already bound is a 409.
pub fn bind(state: &Arc<State>, target: &Target, body: Option<Value>) -> Result<Value, ApiError> {
    let r = &target.resource;
    let name = target.name.as_deref().unwrap_or("");
    let body = body.unwrap_or(Value::Null);
    let Some(node) = body["target"]["name"].as_str().filter(|n| !n.is_empty()).map(str::to_owned) else {
        return Err(admission::invalid("Binding", name, &["target.name: Required value".into()]));
    };
    if body["target"]["kind"].as_str().is_some_and(|k| !k.is_empty() && k != "Node") {
        return Err(admission::invalid("Binding", name, &["target.kind: Unsupported value: must be Node".into()]));
    }
    let bound = state.store.write(r, target.namespace.as_deref(), name, |pod| {
        if let Some(uid) = body["metadata"]["uid"].as_str()
            && pod["metadata"]["uid"].as_str() != Some(uid)
        {
            return Err(ApiError::new(409, "Conflict", format!("Precondition failed: UID in precondition: {uid}")));
        }
        if let Some(on) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
            return Err(ApiError::new(409, "Conflict", format!("pod {name} is already assigned to node \"{on}\"")));
        }
        if store::deleting(pod) {
            return Err(ApiError::new(409, "Conflict", format!("pod {name} is being deleted, cannot be assigned to a host")));
        }
        pod["spec"]["nodeName"] = json!(node);
        let scheduled = json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": store::now()});
        match pod["status"]["conditions"].as_array_mut() {
            Some(c) => {
                c.retain(|c| c["type"] != "PodScheduled");
                c.push(scheduled);
            }
            None => pod["status"]["conditions"] = json!([scheduled]),
        }
        Ok(())
    })?;
    Ok(success(r, name, bound["metadata"]["uid"].clone()))
}

/// An eviction (`pods/<name>/eviction`, policy/v1): the pod is deleted with the eviction's delete options (there
/// are no disruption budgets to refuse it).
pub fn evict(state: &Arc<State>, target: &Target, body: Option<Value>) -> Result<Value, ApiError> {
    let r = &target.resource;
    let name = target.name.as_deref().unwrap_or("");
    let body = body.unwrap_or(Value::Null);
    if body["metadata"]["name"].as_str().is_some_and(|n| n != name) {
        return Err(ApiError::new(400, "BadRequest", "name in URL does not match name in Eviction object"));
    }
    let options = &body["deleteOptions"];
    let pre = &options["preconditions"];
    let pre = (pre["uid"].as_str().map(str::to_owned), pre["resourceVersion"].as_str().map(str::to_owned));
    let (grace, propagation) = (options["gracePeriodSeconds"].as_i64(), Propagation::of(options)?);
    let deleted = state.store.delete_propagating(r, target.namespace.as_deref(), name, grace, pre, propagation)?;
    Ok(success(r, name, deleted.object["metadata"]["uid"].clone()))
}
