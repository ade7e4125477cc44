//! Which labels a node may give itself: valid label syntax, and the NodeRestriction rule (a kubelet may set labels
//! outside `kubernetes.io` and `k8s.io`, the well-known kubelet labels, and anything under
//! `kubelet.kubernetes.io/` or `node.kubernetes.io/`; never `node-restriction.kubernetes.io/`). Checked when the
//! config is loaded, so a refused label fails the start instead of every registration.

/// The kubelet labels under `kubernetes.io` a node may set on itself.
const KUBELET_LABELS: &[&str] = &[
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

fn in_namespace(prefix: &str, namespace: &str) -> bool {
    prefix == namespace || prefix.strip_suffix(namespace).is_some_and(|p| p.ends_with('.'))
}

/// A name part or a value: at most 63 characters of `[A-Za-z0-9_.-]`, starting and ending alphanumeric.
fn valid_segment(s: &str) -> bool {
    s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

/// A DNS subdomain prefix: at most 253 characters of lower-case labels.
fn valid_prefix(p: &str) -> bool {
    p.len() <= 253
        && p.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// Checks the syntax of a label (or taint) key and value: `[prefix/]name`, the value empty or like a name.
pub fn check_label_syntax(key: &str, value: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if prefix.is_some_and(|p| !valid_prefix(p)) || !valid_segment(name) {
        return Err(format!("{key:?} is not a valid label key"));
    }
    if !value.is_empty() && !valid_segment(value) {
        return Err(format!("{value:?} is not a valid label value"));
    }
    Ok(())
}

/// Checks one of `nodeLabels`: its syntax, and that NodeRestriction lets a node set it; the error says what is
/// wrong.
pub fn check_node_label(key: &str, value: &str) -> Result<(), String> {
    check_label_syntax(key, value)?;
    let Some((prefix, _)) = key.split_once('/') else { return Ok(()) };
    if in_namespace(prefix, "node-restriction.kubernetes.io") {
        return Err(format!(
            "{key}: the node-restriction.kubernetes.io/ prefix is reserved for the cluster's administrators"
        ));
    }
    let kube = in_namespace(prefix, "kubernetes.io") || in_namespace(prefix, "k8s.io");
    let allowed = KUBELET_LABELS.contains(&key)
        || in_namespace(prefix, "kubelet.kubernetes.io")
        || in_namespace(prefix, "node.kubernetes.io");
    if kube && !allowed {
        return Err(format!(
            "{key}: a node may not set labels in the kubernetes.io or k8s.io namespaces other than the kubelet's \
             (NodeRestriction refuses them); use another prefix, or label the Node as an administrator"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_a_node_may_and_may_not_set() {
        for (k, v) in [
            ("rack", "r1"),
            ("example.com/team", ""),
            ("kubernetes.io/hostname", "h"),
            ("node.kubernetes.io/exclude-from-external-load-balancers", "true"),
            ("kubelet.kubernetes.io/x", "y"),
            ("topology.kubernetes.io/zone", "z1"),
        ] {
            assert_eq!(check_node_label(k, v), Ok(()), "{k}");
        }
        for (k, v, why) in [
            ("node-role.kubernetes.io/worker", "", "kubernetes.io or k8s.io"),
            ("foo.k8s.io/x", "", "kubernetes.io or k8s.io"),
            ("node-restriction.kubernetes.io/x", "", "reserved"),
            ("Bad_Prefix/x", "", "valid label key"),
            ("x", "-bad", "valid label value"),
            ("", "", "valid label key"),
        ] {
            let e = check_node_label(k, v).unwrap_err();
            assert!(e.contains(why), "{k}: {e}");
        }
    }
}
