//! What the Node authorizer and the NodeRestriction admission plugin allow a `system:node:<name>` identity:
//! its own Node (no labels outside the kubelet's set, no taint changes once created), its own Lease, pods bound
//! to it (listed only with the `spec.nodeName` selector), events.

use serde_json::Value;

use crate::route::Target;
use crate::store::ApiError;

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

/// Checks a request by node `node` on `target` (`verb` as the authorizer names it) with its body, if any, and
/// the stored object, if any. `field_selector` is the request's.
pub fn check(
    node: &str,
    verb: &str,
    target: &Target,
    body: Option<&Value>,
    stored: Option<&Value>,
    field_selector: Option<&str>,
) -> Result<(), ApiError> {
    match target.resource.kind {
        "Node" => {
            if let Some(name) = &target.name
                && name != node
            {
                return Err(forbidden(node, format!("node \"{node}\" is not allowed to modify node \"{name}\"")));
            }
            if verb == "create"
                && let Some(name) = body.and_then(|b| b["metadata"]["name"].as_str())
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
        "Lease" => {
            let name = target.name.as_deref().or_else(|| body.and_then(|b| b["metadata"]["name"].as_str()));
            if target.namespace.as_deref() != Some("kube-node-lease") || name != Some(node) {
                return Err(forbidden(
                    node,
                    "can only access node lease with the same name as the requesting node".into(),
                ));
            }
            Ok(())
        }
        "Pod" => {
            if target.name.is_none() && matches!(verb, "list" | "watch") {
                let own = format!("spec.nodeName={node}");
                if !field_selector.unwrap_or("").split(',').any(|t| t == own) {
                    return Err(forbidden(
                        node,
                        "can only list or watch pods bound to it (fieldSelector spec.nodeName)".into(),
                    ));
                }
            }
            if let Some(p) = stored.or(body)
                && p["spec"]["nodeName"].as_str().is_some_and(|n| n != node)
            {
                return Err(forbidden(node, "can only access pods bound to it".into()));
            }
            Ok(())
        }
        "Event" => Ok(()),
        _ if verb == "get" || verb == "list" || verb == "watch" => Ok(()),
        other => Err(forbidden(node, format!("cannot {verb} {other} objects"))),
    }
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

/// Checks what a node's update or patch would make of its Node: only kubelet labels change, and (outside the
/// status subresource) the taints stay as they are.
pub fn check_result(node: &str, target: &Target, old: &Value, new: &Value) -> Result<(), ApiError> {
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
