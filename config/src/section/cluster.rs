//! The cluster section: how the node registers and reports to the apiserver, from `nodeStatusUpdateFrequency`,
//! `nodeStatusReportFrequency`, `nodeLeaseDurationSeconds`, `registerNode`, `registerWithTaints`, `nodeLabels`,
//! `providerID`, `nodeStatusMaxImages`, `kubeAPIQPS`, `kubeAPIBurst`, `eventRecordQPS` and `eventBurst`.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Taint;

use super::{duration_field, required};
use crate::{ConfigError, KubeletConfiguration};

/// The cluster section.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConfig {
    /// `nodeStatusUpdateFrequency`.
    pub node_status_update_frequency: Duration,
    /// `nodeStatusReportFrequency`.
    pub node_status_report_frequency: Duration,
    /// `nodeLeaseDurationSeconds`.
    pub node_lease_duration: Duration,
    /// `registerNode`.
    pub register_node: bool,
    /// `registerWithTaints`.
    pub register_with_taints: Vec<Taint>,
    /// `nodeLabels`, each checked against the labels NodeRestriction lets a node set.
    pub node_labels: BTreeMap<String, String>,
    /// `providerID`, if set.
    pub provider_id: Option<String>,
    /// `nodeStatusMaxImages`: the most images the Node's status lists; `None` (-1) for all.
    pub node_status_max_images: Option<usize>,
    /// `kubeAPIQPS`: the main apiserver client's rate limit.
    pub kube_api_qps: f64,
    /// `kubeAPIBurst`.
    pub kube_api_burst: u32,
    /// `eventRecordQPS`: the events posted per second at most; `None` (0) for no limit.
    pub event_record_qps: Option<f64>,
    /// `eventBurst`: the events posted in a burst at most (with a limit).
    pub event_burst: u32,
}

impl ClusterConfig {
    /// The cluster section.
    pub fn validate(c: &KubeletConfiguration) -> Result<Self, ConfigError> {
        let node_status_update_frequency =
            duration_field("nodeStatusUpdateFrequency", &c.node_status_update_frequency)?;
        if node_status_update_frequency.is_zero() {
            return Err(ConfigError::field("nodeStatusUpdateFrequency", "must be more than 0"));
        }
        let node_status_report_frequency =
            duration_field("nodeStatusReportFrequency", &c.node_status_report_frequency)?;
        let lease = *required(&c.node_lease_duration_seconds, "nodeLeaseDurationSeconds")?;
        let node_lease_duration = match u64::try_from(lease) {
            Ok(s) if (1..=i64::from(i32::MAX).unsigned_abs()).contains(&s) => Duration::from_secs(s),
            _ => {
                return Err(ConfigError::field(
                    "nodeLeaseDurationSeconds",
                    format!("{lease} must be a positive number of seconds"),
                ));
            }
        };
        let node_labels = required(&c.node_labels, "nodeLabels")?.clone();
        for (k, v) in &node_labels {
            nodewarden_cluster::check_node_label(k, v).map_err(|e| ConfigError::field(format!("nodeLabels.{k}"), e))?;
        }
        let register_with_taints = required(&c.register_with_taints, "registerWithTaints")?.clone();
        for (i, t) in register_with_taints.iter().enumerate() {
            if !matches!(t.effect.as_str(), "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
                return Err(ConfigError::field(
                    format!("registerWithTaints[{i}].effect"),
                    format!("{:?} must be NoSchedule, PreferNoSchedule or NoExecute", t.effect),
                ));
            }
            nodewarden_cluster::check_label_syntax(&t.key, t.value.as_deref().unwrap_or(""))
                .map_err(|e| ConfigError::field(format!("registerWithTaints[{i}]"), e))?;
        }
        let qps = *required(&c.kube_api_qps, "kubeAPIQPS")?;
        if qps < 0 {
            return Err(ConfigError::field("kubeAPIQPS", format!("{qps} is negative")));
        }
        let burst = *required(&c.kube_api_burst, "kubeAPIBurst")?;
        let kube_api_burst =
            u32::try_from(burst).map_err(|_| ConfigError::field("kubeAPIBurst", format!("{burst} is out of range")))?;
        let event_qps = *required(&c.event_record_qps, "eventRecordQPS")?;
        if event_qps < 0 {
            return Err(ConfigError::field("eventRecordQPS", format!("{event_qps} must not be a negative number")));
        }
        let burst = *required(&c.event_burst, "eventBurst")?;
        let event_burst = u32::try_from(burst)
            .map_err(|_| ConfigError::field("eventBurst", format!("{burst} must not be a negative number")))?;
        let provider_id = required(&c.provider_id, "providerID")?;
        let node_status_max_images = match *required(&c.node_status_max_images, "nodeStatusMaxImages")? {
            -1 => None,
            n => Some(usize::try_from(n).map_err(|_| {
                ConfigError::field("nodeStatusMaxImages", format!("{n} must be -1 (no limit) or greater"))
            })?),
        };
        Ok(ClusterConfig {
            node_status_update_frequency,
            node_status_report_frequency,
            node_lease_duration,
            register_node: *required(&c.register_node, "registerNode")?,
            register_with_taints,
            node_labels,
            provider_id: (!provider_id.is_empty()).then(|| provider_id.clone()),
            node_status_max_images,
            kube_api_qps: qps as f64,
            kube_api_burst,
            event_record_qps: (event_qps > 0).then_some(event_qps as f64),
            event_burst,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse;
    use crate::section::HEAD;
    use crate::tests::{KUBEADM, field_error};

    #[test]
    fn node_status_and_registration_fields_follow_the_kubelet() {
        let c = parse(HEAD).unwrap();
        assert_eq!(c.cluster.node_status_update_frequency, Duration::from_secs(10));
        assert_eq!(c.cluster.node_status_report_frequency, Duration::from_secs(300));
        assert_eq!(c.cluster.node_lease_duration, Duration::from_secs(40));
        assert!(c.cluster.register_node);
        assert_eq!((c.cluster.kube_api_qps, c.cluster.kube_api_burst), (50.0, 100));
        assert_eq!(c.cluster.node_status_max_images, Some(50));
        assert_eq!(parse(&format!("{HEAD}nodeStatusMaxImages: -1\n")).unwrap().cluster.node_status_max_images, None);
        assert_eq!(parse(&format!("{HEAD}nodeStatusMaxImages: 0\n")).unwrap().cluster.node_status_max_images, Some(0));
        // Only the update frequency given: the report frequency follows it.
        let c = parse(&format!("{HEAD}nodeStatusUpdateFrequency: 4s\n")).unwrap();
        assert_eq!(c.cluster.node_status_report_frequency, Duration::from_secs(4));
        let c = parse(&format!("{HEAD}nodeStatusUpdateFrequency: 4s\nnodeStatusReportFrequency: 1m\n")).unwrap();
        assert_eq!(c.cluster.node_status_report_frequency, Duration::from_secs(60));
        // kubeadm's zeros mean the defaults.
        let c = parse(KUBEADM).unwrap();
        assert_eq!(
            (c.cluster.node_status_update_frequency, c.cluster.node_status_report_frequency),
            (Duration::from_secs(10), Duration::from_secs(300))
        );
        let c = parse(&format!(
            "{HEAD}nodeLabels:\n  example.com/rack: r1\nregisterWithTaints:\n- {{key: dedicated, value: infra, effect: NoSchedule}}\nproviderID: x://1\n"
        ))
        .unwrap();
        assert_eq!(c.cluster.node_labels.get("example.com/rack").map(String::as_str), Some("r1"));
        assert_eq!(c.cluster.register_with_taints[0].key, "dedicated");
        assert_eq!(c.cluster.provider_id.as_deref(), Some("x://1"));
        for (text, field) in [
            ("nodeLabels:\n  node-role.kubernetes.io/worker: \"\"\n", "nodeLabels.node-role.kubernetes.io/worker"),
            ("nodeLabels:\n  example.com/x: -bad\n", "nodeLabels.example.com/x"),
            ("registerWithTaints:\n- {key: a, effect: Sometimes}\n", "registerWithTaints[0].effect"),
            ("nodeLeaseDurationSeconds: -1\n", "nodeLeaseDurationSeconds"),
            ("kubeAPIQPS: -5\n", "kubeAPIQPS"),
            ("eventRecordQPS: -1\n", "eventRecordQPS"),
            ("eventBurst: -1\n", "eventBurst"),
            ("nodeStatusMaxImages: -2\n", "nodeStatusMaxImages"),
        ] {
            let (f, reason) = field_error(&format!("{HEAD}{text}"));
            assert_eq!(f, field, "{text}: {reason}");
        }
        let (_, reason) = field_error(&format!("{HEAD}nodeLabels:\n  node-role.kubernetes.io/worker: \"\"\n"));
        assert!(reason.contains("NodeRestriction"), "{reason}");
    }

    #[test]
    fn event_limits_follow_the_kubelet() {
        let c = parse(HEAD).unwrap();
        assert_eq!((c.cluster.event_record_qps, c.cluster.event_burst), (Some(50.0), 100));
        // An explicit 0 is no limit; a 0 burst is the default.
        let c = parse(&format!("{HEAD}eventRecordQPS: 0\neventBurst: 0\n")).unwrap();
        assert_eq!((c.cluster.event_record_qps, c.cluster.event_burst), (None, 100));
        let c = parse(&format!("{HEAD}eventRecordQPS: 5\neventBurst: 10\n")).unwrap();
        assert_eq!((c.cluster.event_record_qps, c.cluster.event_burst), (Some(5.0), 10));
        let (_, reason) = field_error(&format!("{HEAD}eventRecordQPS: -1\n"));
        assert!(reason.contains("must not be a negative number"), "{reason}");
    }
}
