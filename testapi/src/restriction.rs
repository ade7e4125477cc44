//! What the Node authorizer and the NodeRestriction admission plugin allow a `system:node:<name>` identity:
//! its own Node (listed only by name; no labels outside the kubelet's set, no taint changes once created), its own
//! Lease, pods bound to it (listed only with the `spec.nodeName` selector; status writes, evictions and deletes;
//! mirror pods the only creates), the secrets, configmaps and service accounts its pods reference (the
//! authorizer's graph; listed only by name), tokens for those accounts bound to its pods, services, and writes of
//! core events.

use serde_json::Value;

use crate::route::Target;

use crate::store::{ApiError, Store};

/// True for a label a kubelet may set on its own Node (the kubelet label rule of NodeRestriction): outside the
/// `kubernetes.io` and `k8s.io` namespaces, or one of the well-known kubelet labels, or under
/// `kubelet.kubernetes.io/` or `node.kubernetes.io/`; never under `node-restriction.kubernetes.io/`.
pub fn kubelet_may_set(label: &str) -> bool {
    const ALLOWED: &[&str] = &[
        "kubernetes.io/hostname",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "failure-domain.beta.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
    ];
    let Some((prefix, _)) = label.split_once('/') else { return true };
    if prefix == "node-restriction.kubernetes.io" || prefix.ends_with(".node-restriction.kubernetes.io") {
        return false;
    }
    let reserved = |ns: &str| prefix == ns || prefix.ends_with(&format!(".{ns}"));
    if !reserved("kubernetes.io") && !reserved("k8s.io") {
        return true;
    }
    ALLOWED.contains(&label) || reserved("kubelet.kubernetes.io") || reserved("node.kubernetes.io")
}

fn forbidden(node: &str, message: String) -> ApiError {
    ApiError::new(403, "Forbidden", format!("User \"system:node:{node}\" is forbidden: {message}"))
}

/// The Node authorizer's refusal: no RBAC rule or graph edge lets the node do this.
fn not_authorized(node: &str, verb: &str, target: &Target, why: &str) -> ApiError {
    let r = &target.resource;
    let resource = target.subresource.as_ref().map_or_else(|| r.plural.to_owned(), |sub| format!("{}/{sub}", r.plural));
    let scope = target
        .namespace
        .as_ref()
        .map_or_else(|| "at the cluster scope".to_owned(), |ns| format!("in the namespace \"{ns}\""));
    forbidden(
        node,
        format!(
            "User \"system:node:{node}\" cannot {verb} resource \"{resource}\" in API group \"{}\" {scope}: {why}",
            r.group
        ),
    )
}

/// The names of the objects of `kind` (`Secret`, `ConfigMap`, `ServiceAccount`) a pod references: volumes,
/// projected sources, env and envFrom of every container, image pull secrets, its service account.
pub fn references(pod: &Value, kind: &str) -> Vec<String> {
    let spec = &pod["spec"];
    let mut out: Vec<String> = Vec::new();
    let mut add = |v: &Value| {
        if let Some(n) = v.as_str().filter(|n| !n.is_empty()) {
            out.push(n.to_owned());
        }
    };
    if kind == "ServiceAccount" {
        add(&spec["serviceAccountName"]);
        return out;
    }
    let (volume_field, volume_name, key_ref, from_ref) = match kind {
        "Secret" => ("secret", "secretName", "secretKeyRef", "secretRef"),
        "ConfigMap" => ("configMap", "name", "configMapKeyRef", "configMapRef"),
        _ => return out,
    };
    for v in spec["volumes"].as_array().into_iter().flatten() {
        add(&v[volume_field][volume_name]);
        for source in v["projected"]["sources"].as_array().into_iter().flatten() {
            add(&source[volume_field]["name"]);
        }
    }
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for c in spec[list].as_array().into_iter().flatten() {
            for e in c["env"].as_array().into_iter().flatten() {
                add(&e["valueFrom"][key_ref]["name"]);
            }
            for e in c["envFrom"].as_array().into_iter().flatten() {
                add(&e[from_ref]["name"]);
            }
        }
    }
    if kind == "Secret" {
        for s in spec["imagePullSecrets"].as_array().into_iter().flatten() {
            add(&s["name"]);
        }
    }
    out
}

/// True when a pod bound to `node` in `namespace` references the `kind` object `name` (the authorizer's graph).
fn related(store: &Store, node: &str, namespace: &str, kind: &str, name: &str) -> bool {
    let on_node = |p: &Value| p["spec"]["nodeName"].as_str() == Some(node);
    let (found, _) = store.scan(crate::resource("pods"), Some(namespace), |p| {
        (on_node(p) && references(p, kind).iter().any(|r| r == name)).then_some(())
    });
    !found.is_empty()
}

/// The one object a list or watch names with a `metadata.name=` field selector.
fn single_name(field_selector: Option<&str>) -> Option<&str> {
    field_selector?.split(',').find_map(|t| t.trim().strip_prefix("metadata.name="))
}

/// What a request asks, as the authorizer and NodeRestriction see it.
pub struct Ask<'a> {
    /// The verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`).
    pub verb: &'a str,
    /// What it is about.
    pub target: &'a Target,
    /// Its body, if any.
    pub body: Option<&'a Value>,
    /// The stored object it names, if any.
    pub stored: Option<&'a Value>,
    /// Its field selector.
    pub field_selector: Option<&'a str>,
}

/// Checks a request by node `node`, as the Node authorizer (with its field-selector rules) and the
/// NodeRestriction admission plugin would.
pub fn check(store: &Store, node: &str, ask: &Ask<'_>) -> Result<(), ApiError> {
    let Ask { verb, target, body, stored, field_selector } = *ask;
    let sub = target.subresource.as_deref();
    let refuse = |why: &str| Err(not_authorized(node, verb, target, why));
    let listing = matches!(verb, "list" | "watch");
    match (target.resource.kind, target.resource.group) {
        ("Node", _) => {
            if verb == "delete" || (verb == "get" && sub.is_some()) {
                return refuse("nodes may not delete their Node or read its subresources");
            }
            if listing && single_name(field_selector) != Some(node) {
                return refuse("can only list or watch its own Node (fieldSelector metadata.name)");
            }
            let name = target.name.as_deref().or_else(|| body.and_then(|b| b["metadata"]["name"].as_str()));
            if let Some(name) = name
                && name != node
            {
                return Err(forbidden(node, format!("node \"{node}\" is not allowed to modify node \"{name}\"")));
            }
            if verb == "create"
                && let Some(b) = body
            {
                check_labels(node, &Value::Null, b)?;
            }
            Ok(())
        }
        ("Lease", _) => {
            let name = target.name.as_deref().or_else(|| body.and_then(|b| b["metadata"]["name"].as_str()));
            if target.namespace.as_deref() != Some("kube-node-lease") || name != Some(node) {
                return Err(forbidden(
                    node,
                    "can only access node lease with the same name as the requesting node".into(),
                ));
            }
            Ok(())
        }
        ("Pod", _) => pod(store, node, ask),
        ("Event", "") => match verb {
            "create" | "update" | "patch" => Ok(()),
            _ => refuse("nodes may only write events"),
        },
        ("ServiceAccount", _) if sub == Some("token") => {
            let account = target.name.as_deref().unwrap_or("");
            let ns = target.namespace.as_deref().unwrap_or("");
            if verb != "create" || !related(store, node, ns, "ServiceAccount", account) {
                return refuse(&format!("no relationship found between node '{node}' and this object"));
            }
            token_binding(store, node, ns, body)
        }
        (kind @ ("Secret" | "ConfigMap"), _) => {
            let ns = target.namespace.as_deref().unwrap_or("");
            let name = match (verb, target.name.as_deref()) {
                ("get", Some(n)) => n,
                (v, None) if v == "list" || v == "watch" => match single_name(field_selector) {
                    Some(n) => n,
                    None => return refuse("can only list or watch one object, by a metadata.name field selector"),
                },
                _ => return refuse("nodes may only read these"),
            };
            if related(store, node, ns, kind, name) {
                Ok(())
            } else {
                refuse(&format!("no relationship found between node '{node}' and this object"))
            }
        }
        ("Service", _) if matches!(verb, "get" | "list" | "watch") && sub.is_none() => Ok(()),
        _ => {
            let _ = stored;
            refuse("nodes are not allowed this")
        }
    }
}

/// NodeRestriction for a node's TokenRequest: bound to a pod (with its UID) that is on this node.
fn token_binding(store: &Store, node: &str, namespace: &str, body: Option<&Value>) -> Result<(), ApiError> {
    let bound = body.map_or(&Value::Null, |b| &b["spec"]["boundObjectRef"]);
    if bound["apiVersion"] != "v1" || bound["kind"] != "Pod" || bound["name"].as_str().is_none_or(str::is_empty) {
        return Err(forbidden(node, "node requested token not bound to a pod".into()));
    }
    let Some(uid) = bound["uid"].as_str().filter(|u| !u.is_empty()) else {
        return Err(forbidden(node, "node requested token with a pod binding without a uid".into()));
    };
    let pod = store.get(crate::resource("pods"), Some(namespace), bound["name"].as_str().unwrap_or(""))?;
    if pod["metadata"]["uid"].as_str() != Some(uid) {
        return Err(forbidden(node, format!("the UID in the bound object reference ({uid}) does not match the pod's")));
    }
    if pod["spec"]["nodeName"].as_str() != Some(node) {
        return Err(forbidden(node, "node requested token bound to a pod scheduled on a different node".into()));
    }
    Ok(())
}

/// The node's rules for pods: reads of its own (a list or watch only with its `spec.nodeName` selector), status
/// writes and evictions of its own, deletes of its own, and creates of mirror pods only, which reference nothing
/// and are owned by its Node alone; never a write to a pod's main resource.
fn pod(store: &Store, node: &str, ask: &Ask<'_>) -> Result<(), ApiError> {
    let Ask { verb, target, body, stored, field_selector } = *ask;
    let refuse = |why: String| Err(forbidden(node, why));
    if target.name.is_none() && matches!(verb, "list" | "watch") {
        let own = |t: &str| {
            let t = t.trim();
            let value = t.strip_prefix("spec.nodeName==").or_else(|| t.strip_prefix("spec.nodeName="));
            value == Some(node)
        };
        if !field_selector.unwrap_or("").split(',').any(own) {
            return refuse("can only list or watch pods bound to it (fieldSelector spec.nodeName)".into());
        }
        return Ok(());
    }
    // The authorizer's graph: a pod it does not know of (or on another node) is not the node's to touch.
    let creates_mirror = verb == "create" && target.subresource.is_none();
    if !creates_mirror && stored.is_none_or(|p| p["spec"]["nodeName"].as_str() != Some(node)) {
        return refuse(format!("node \"{node}\" can only access pods with spec.nodeName set to itself"));
    }
    match (verb, target.subresource.as_deref()) {
        ("get", None) | ("delete", None) | ("create", Some("eviction")) => Ok(()),
        ("update" | "patch", Some("status")) => Ok(()),
        ("create", None) => mirror_pod(store, node, body.unwrap_or(&Value::Null)),
        (v, None) => {
            refuse(format!("unexpected operation {v:?}, node \"{node}\" can only create and delete mirror pods"))
        }
        (_, Some(sub)) => {
            refuse(format!("unexpected pod subresource {sub:?}, only 'status' and 'eviction' are allowed"))
        }
    }
}

/// A mirror pod a node may create: the mirror annotation, bound to the node, exactly one owner reference, a
/// controller reference to its own Node (with its UID, not blocking deletion), and no service account, secret,
/// configmap or claim.
fn mirror_pod(store: &Store, node: &str, pod: &Value) -> Result<(), ApiError> {
    let refuse = |why: String| Err(forbidden(node, why));
    if !pod["metadata"]["annotations"][crate::admission::MIRROR].is_string() {
        return refuse(format!(
            "pod does not have \"{}\" annotation, node \"{node}\" can only create mirror pods",
            crate::admission::MIRROR
        ));
    }
    if pod["spec"]["nodeName"].as_str() != Some(node) {
        return refuse(format!("node \"{node}\" can only create pods with spec.nodeName set to itself"));
    }
    let owners = pod["metadata"]["ownerReferences"].as_array().cloned().unwrap_or_default();
    let [owner] = owners.as_slice() else {
        return refuse(format!("node \"{node}\" can only create pods with a single owner reference set to itself"));
    };
    if owner["apiVersion"] != "v1" || owner["kind"] != "Node" || owner["name"].as_str() != Some(node) {
        return refuse(format!("node \"{node}\" can only create pods with an owner reference set to itself"));
    }
    if owner["controller"] != true {
        return refuse(format!("node \"{node}\" can only create pods with a controller owner reference set to itself"));
    }
    if owner["blockOwnerDeletion"] == true {
        return refuse(format!("node \"{node}\" must not set blockOwnerDeletion on an owner reference"));
    }
    let uid = store.get(crate::resource("nodes"), None, node)?["metadata"]["uid"].clone();
    if owner["uid"] != uid {
        return refuse(format!("node {node} UID mismatch: expected {} got {}", owner["uid"], uid));
    }
    if pod["spec"]["serviceAccountName"].as_str().is_some_and(|s| !s.is_empty()) {
        return refuse(format!("node \"{node}\" can not create pods that reference a service account"));
    }
    for (kind, what) in [("Secret", "secrets"), ("ConfigMap", "configmaps")] {
        if !references(pod, kind).is_empty() {
            return refuse(format!("node \"{node}\" can not create pods that reference {what}"));
        }
    }
    if pod["spec"]["volumes"].as_array().into_iter().flatten().any(|v| !v["persistentVolumeClaim"].is_null()) {
        return refuse(format!("node \"{node}\" can not create pods that reference persistentvolumeclaims"));
    }
    Ok(())
}

/// A node may add, change or remove only the labels a kubelet may set.
fn check_labels(node: &str, old: &Value, new: &Value) -> Result<(), ApiError> {
    let empty = serde_json::Map::new();
    let before = old["metadata"]["labels"].as_object().unwrap_or(&empty);
    let after = new["metadata"]["labels"].as_object().unwrap_or(&empty);
    let changed = after.iter().filter(|(k, v)| before.get(*k) != Some(*v)).map(|(k, _)| k);
    let removed = before.keys().filter(|k| !after.contains_key(*k));
    match changed.chain(removed).find(|k| !kubelet_may_set(k)) {
        Some(k) => Err(forbidden(node, format!("is not allowed to modify labels: {k}"))),
        None => Ok(()),
    }
}

/// Checks what a node's update or patch would make of an object: of its Node, only kubelet labels change and
/// (outside the status subresource) the taints stay as they are; a pod's labels do not change through its status.
pub fn check_result(node: &str, target: &Target, old: &Value, new: &Value) -> Result<(), ApiError> {
    if target.resource.kind == "Pod" {
        if old["metadata"]["labels"] != new["metadata"]["labels"] {
            return Err(forbidden(node, format!("node \"{node}\" cannot update labels through pod status")));
        }
        return Ok(());
    }
    if target.resource.kind != "Node" {
        return Ok(());
    }
    check_labels(node, old, new)?;
    if target.subresource.is_none() && old["spec"]["taints"] != new["spec"]["taints"] {
        return Err(forbidden(node, format!("node \"{node}\" is not allowed to modify taints")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelet_label_rule() {
        for ok in [
            "example.com/rack",
            "plain",
            "kubernetes.io/hostname",
            "node.kubernetes.io/exclude-from-external-load-balancers",
            "kubelet.kubernetes.io/x",
            "topology.kubernetes.io/zone",
        ] {
            assert!(kubelet_may_set(ok), "{ok}");
        }
        for refused in [
            "node-role.kubernetes.io/worker",
            "kubernetes.io/role",
            "foo.k8s.io/x",
            "node-restriction.kubernetes.io/x",
            "x.node-restriction.kubernetes.io/y",
        ] {
            assert!(!kubelet_may_set(refused), "{refused}");
        }
    }
}
