//! Pod priority and criticality.
//!
//! The kubelet treats every static pod as critical. Static pods are nodewarden's main workload source, so here a
//! pod is critical by its priority alone (at least [`SYSTEM_CRITICAL_PRIORITY`], or one of the two system
//! priority classes), unless the operator restores the kubelet's rule.

use k8s_openapi::api::core::v1::Pod;

/// The priority from which a pod is critical (the kubelet's `SystemCriticalPriority`).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// The priority class of the pods a node cannot do without (the kubelet's `system-node-critical`).
pub const SYSTEM_NODE_CRITICAL: &str = "system-node-critical";

/// The priority class of the pods a cluster cannot do without (`system-cluster-critical`).
pub const SYSTEM_CLUSTER_CRITICAL: &str = "system-cluster-critical";

/// The priority the apiserver's admission gives a system priority class: `system-node-critical` 2000001000,
/// `system-cluster-critical` 2000000000.
fn system_class_priority(class: &str) -> Option<i32> {
    match class {
        SYSTEM_NODE_CRITICAL => Some(SYSTEM_CRITICAL_PRIORITY + 1000),
        SYSTEM_CLUSTER_CRITICAL => Some(SYSTEM_CRITICAL_PRIORITY),
        _ => None,
    }
}

/// `spec.priorityClassName`.
fn priority_class(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.priority_class_name.as_deref())
}

/// The annotation that names a pod's source; `file` for static pods.
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";

/// `spec.priority`, 0 when unset.
pub fn pod_priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// The pod's priority as the apiserver's admission would resolve it: `spec.priority`, else that of the two
/// system priority classes, else 0. Static pods never pass that admission, so the node's shutdown orders them by
/// this.
pub fn resolved_priority(pod: &Pod) -> i32 {
    pod.spec
        .as_ref()
        .and_then(|s| s.priority)
        .unwrap_or_else(|| priority_class(pod).and_then(system_class_priority).unwrap_or(0))
}

/// True for a pod of priority class `system-node-critical`.
pub fn is_node_critical(pod: &Pod) -> bool {
    priority_class(pod) == Some(SYSTEM_NODE_CRITICAL)
}

/// True for a pod that came from a manifest file or URL rather than an API server.
pub fn is_static_pod(pod: &Pod) -> bool {
    let source = pod.metadata.annotations.as_ref().and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION));
    source.is_some_and(|s| s != "api")
}

/// True for a pod that is never evicted and is admitted under any pressure: priority at least
/// [`SYSTEM_CRITICAL_PRIORITY`], or priority class `system-node-critical` or `system-cluster-critical`; and, when
/// `static_pods_critical` (the kubelet's rule), every static pod.
pub fn is_critical(pod: &Pod, static_pods_critical: bool) -> bool {
    pod_priority(pod) >= SYSTEM_CRITICAL_PRIORITY
        || priority_class(pod).and_then(system_class_priority).is_some()
        || (static_pods_critical && is_static_pod(pod))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    fn pod(priority: Option<i32>, class: Option<&str>, source: Option<&str>) -> Pod {
        let mut p = Pod {
            spec: Some(PodSpec { priority, priority_class_name: class.map(Into::into), ..PodSpec::default() }),
            ..Pod::default()
        };
        if let Some(s) = source {
            p.metadata.annotations = Some([(CONFIG_SOURCE_ANNOTATION.to_owned(), s.to_owned())].into());
        }
        p
    }

    #[test]
    fn criticality() {
        assert!(!is_critical(&pod(None, None, None), false));
        assert!(!is_critical(&pod(Some(SYSTEM_CRITICAL_PRIORITY - 1), None, None), false));
        assert!(is_critical(&pod(Some(SYSTEM_CRITICAL_PRIORITY), None, None), false));
        assert!(is_critical(&pod(None, Some("system-node-critical"), None), false));
        assert_eq!(resolved_priority(&pod(None, Some("system-node-critical"), None)), 2_000_001_000);
        assert_eq!(resolved_priority(&pod(None, Some("system-cluster-critical"), None)), 2_000_000_000);
        assert_eq!(resolved_priority(&pod(Some(7), Some("system-node-critical"), None)), 7);
        assert_eq!(resolved_priority(&pod(None, Some("high"), None)), 0);
        assert!(is_critical(&pod(None, Some("system-cluster-critical"), None), false));
        assert!(!is_critical(&pod(None, Some("high"), None), false));
        // Static pods: only under the kubelet's rule.
        assert!(!is_critical(&pod(None, None, Some("file")), false));
        assert!(is_critical(&pod(None, None, Some("file")), true));
        assert!(!is_critical(&pod(None, None, Some("api")), true));
    }
}
