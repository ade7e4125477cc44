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
    ApiError::new(403, "Forbidden", format!("User \"system:node:{node}\" cannot do this: {message}"))
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
            if let Some(b) = body {
                if let Some(labels) = b["metadata"]["labels"].as_object() {
                    let old = stored.and_then(|s| s["metadata"]["labels"].as_object());
                    for (k, v) in labels {
                        let unchanged = old.and_then(|o| o.get(k)) == Some(v);
                        if !unchanged && !kubelet_may_set(k) {
                            return Err(forbidden(node, format!("is not allowed to modify labels: {k}")));
                        }
                    }
                }
                if let Some(old) = stored
                    && target.subresource.is_none()
                    && !b["spec"]["taints"].is_null()
                    && b["spec"]["taints"] != old["spec"]["taints"]
                {
                    return Err(forbidden(node, format!("node \"{node}\" is not allowed to modify taints")));
                }
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
