//! The Node object the kubelet builds: default labels, taints, capacity and allocatable, addresses, nodeInfo and
//! daemonEndpoints; and what a status report compares.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ContainerImage, DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use crate::host::HostInfo;
use crate::{ClusterSettings, NodeFacts};

/// The Kubernetes release whose kubelet nodewarden follows; `kubeletVersion` is `v<this>.0+nodewarden.<version>`
/// (build metadata, so it sorts as the release itself, not below it as a pre-release would).
pub const KUBERNETES_VERSION: &str = "1.34";

/// The `kubeletVersion` reported.
pub fn kubelet_version() -> String {
    format!("v{KUBERNETES_VERSION}.0+nodewarden.{}", env!("CARGO_PKG_VERSION"))
}

/// Go's name for the CPU architecture (`GOARCH`), as the `kubernetes.io/arch` label carries it.
pub fn go_arch(rust_arch: &str) -> &str {
    match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        "arm" => "arm",
        "loongarch64" => "loong64",
        other => other,
    }
}

/// The labels the kubelet sets on its Node (and sets again when they drift): hostname, os, arch, and the beta os
/// and arch.
pub fn default_labels(hostname: &str) -> BTreeMap<String, String> {
    let arch = go_arch(std::env::consts::ARCH).to_owned();
    BTreeMap::from([
        ("kubernetes.io/hostname".to_owned(), hostname.to_owned()),
        ("kubernetes.io/os".to_owned(), "linux".to_owned()),
        ("kubernetes.io/arch".to_owned(), arch.clone()),
        ("beta.kubernetes.io/os".to_owned(), "linux".to_owned()),
        ("beta.kubernetes.io/arch".to_owned(), arch),
    ])
}

/// A byte count as the kubelet prints it (binary SI): the largest of Ki, Mi, Gi, ... that divides it, else bytes.
pub fn binary_si(bytes: u64) -> String {
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let mut value = bytes;
    let mut suffix = "";
    for s in SUFFIXES {
        if value == 0 || !value.is_multiple_of(1024) {
            break;
        }
        value /= 1024;
        suffix = s;
    }
    format!("{value}{suffix}")
}

/// Millicores as a quantity: whole cores bare, else `<n>m`.
pub fn cpu(millis: u64) -> String {
    if millis.is_multiple_of(1000) { (millis / 1000).to_string() } else { format!("{millis}m") }
}

fn quantities(m: &BTreeMap<String, String>) -> BTreeMap<String, Quantity> {
    m.iter().map(|(k, v)| (k.clone(), Quantity(v.clone()))).collect()
}

/// The node's status from `facts` and `conditions`.
pub fn status(
    settings: &ClusterSettings,
    host: &HostInfo,
    facts: &NodeFacts,
    conditions: Vec<NodeCondition>,
) -> NodeStatus {
    let mut addresses = Vec::new();
    if let Some(ip) = &host.internal_ip {
        addresses.push(NodeAddress { type_: "InternalIP".into(), address: ip.clone() });
    }
    addresses.push(NodeAddress { type_: "Hostname".into(), address: host.hostname.clone() });
    NodeStatus {
        addresses: Some(addresses),
        capacity: Some(quantities(&facts.capacity)),
        allocatable: Some(quantities(&facts.allocatable)),
        conditions: Some(conditions),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint { port: i32::from(settings.daemon_port) }),
        }),
        node_info: Some(NodeSystemInfo {
            architecture: go_arch(std::env::consts::ARCH).to_owned(),
            boot_id: host.boot_id.clone(),
            container_runtime_version: facts.runtime_version.clone(),
            kernel_version: host.kernel_version.clone(),
            kube_proxy_version: String::new(),
            kubelet_version: kubelet_version(),
            machine_id: host.machine_id.clone(),
            operating_system: "linux".into(),
            os_image: host.os_image.clone(),
            swap: None,
            system_uuid: host.system_uuid.clone(),
        }),
        images: Some(images(&facts.images, settings.max_images)),
        ..NodeStatus::default()
    }
}

/// The most names one image shows (the kubelet's `maxNamesPerImageInNodeStatus`).
const MAX_NAMES_PER_IMAGE: usize = 5;

/// `status.images` as the kubelet lists them: the largest first, at most `max` of them, each with at most
/// [`MAX_NAMES_PER_IMAGE`] names.
fn images(all: &[(Vec<String>, u64)], max: Option<usize>) -> Vec<ContainerImage> {
    let mut sorted: Vec<&(Vec<String>, u64)> = all.iter().collect();
    sorted.sort_by_key(|i| std::cmp::Reverse(i.1));
    sorted
        .into_iter()
        .take(max.unwrap_or(usize::MAX))
        .map(|(names, size)| ContainerImage {
            names: Some(names.iter().take(MAX_NAMES_PER_IMAGE).cloned().collect()),
            size_bytes: Some(i64::try_from(*size).unwrap_or(i64::MAX)),
        })
        .collect()
}

/// The Node to register: labels (the defaults, then `nodeLabels`), the attach-detach annotation, taints,
/// providerID, and the full status.
pub fn initial(settings: &ClusterSettings, host: &HostInfo, status: NodeStatus) -> Node {
    let mut labels = default_labels(&host.hostname);
    labels.extend(settings.node_labels.clone());
    Node {
        metadata: ObjectMeta {
            name: Some(settings.node_name.clone()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                "volumes.kubernetes.io/controller-managed-attach-detach".to_owned(),
                "true".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            provider_id: settings.provider_id.clone(),
            taints: (!settings.register_with_taints.is_empty()).then(|| settings.register_with_taints.clone()),
            ..NodeSpec::default()
        }),
        status: Some(status),
    }
}

/// What a report compares: the status as JSON (times at second precision, as they are sent) with every
/// condition's `lastHeartbeatTime` left out.
pub fn comparable(status: &NodeStatus) -> Value {
    let mut v = serde_json::to_value(status).unwrap_or(Value::Null);
    if let Some(Value::Array(conditions)) = v.get_mut("conditions") {
        for c in conditions {
            if let Value::Object(o) = c {
                o.remove("lastHeartbeatTime");
            }
        }
    }
    v
}

/// The labels to patch onto an existing Node so its default labels are ours again (the kubelet's
/// `updateDefaultLabels`); empty when they already are. Other labels and taints are left alone.
pub fn drifted_labels(existing: &Node, hostname: &str) -> BTreeMap<String, String> {
    let have = existing.metadata.labels.clone().unwrap_or_default();
    default_labels(hostname).into_iter().filter(|(k, v)| have.get(k) != Some(v)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_as_the_kubelet_prints_them() {
        assert_eq!(binary_si(32_780_596 * 1024), "32780596Ki");
        assert_eq!(binary_si(1 << 30), "1Gi");
        assert_eq!(binary_si(1000), "1000");
        assert_eq!(binary_si(0), "0");
        assert_eq!(cpu(2000), "2");
        assert_eq!(cpu(1500), "1500m");
        assert_eq!(go_arch("x86_64"), "amd64");
        assert_eq!(go_arch("aarch64"), "arm64");
    }

    #[test]
    fn a_report_ignores_heartbeats_but_not_transitions() {
        let c = |hb: &str, tr: &str| NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            last_heartbeat_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(hb.parse().unwrap())),
            last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(tr.parse().unwrap())),
            ..NodeCondition::default()
        };
        let s = |c| NodeStatus { conditions: Some(vec![c]), ..NodeStatus::default() };
        let a = comparable(&s(c("2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z")));
        let b = comparable(&s(c("2026-01-01T00:00:10Z", "2026-01-01T00:00:00.4Z")));
        assert_eq!(a, b, "heartbeats are ignored and times compare at second precision");
        let moved = comparable(&s(c("2026-01-01T00:00:10Z", "2026-01-01T00:00:10Z")));
        assert_ne!(a, moved);
    }

    #[test]
    fn only_default_labels_that_drifted_are_patched() {
        let mut n = Node::default();
        let mut labels = default_labels("h");
        labels.insert("kubernetes.io/hostname".into(), "old".into());
        labels.insert("team".into(), "x".into());
        n.metadata.labels = Some(labels);
        assert_eq!(drifted_labels(&n, "h"), BTreeMap::from([("kubernetes.io/hostname".into(), "h".into())]));
    }
}
