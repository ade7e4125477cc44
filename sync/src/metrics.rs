//! Pod sync's metrics, under the kubelet's names so that existing dashboards work.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, exponential_buckets,
};

/// The metrics pod sync updates.
#[derive(Debug, Clone)]
pub struct SyncMetrics {
    /// `kubelet_started_containers_total{container_type}`.
    pub started_containers: IntCounterVec,
    /// `kubelet_started_containers_errors_total{code,container_type}`.
    pub started_container_errors: IntCounterVec,
    /// `kubelet_pod_start_duration_seconds`: first seen to all containers running.
    pub pod_start_duration: Histogram,
    /// `kubelet_pod_worker_duration_seconds{operation}`: one sync pass of a pod worker.
    pub pod_worker_duration: HistogramVec,
    /// `kubelet_running_pods`.
    pub running_pods: IntGauge,
    /// `kubelet_running_containers{container_state}`.
    pub running_containers: IntGaugeVec,
    /// `prober_probe_total{probe_type,result,container,pod,namespace,pod_uid}`.
    pub probes: IntCounterVec,
    /// `nodewarden_static_pod_manifest_errors`: manifests currently refused.
    pub invalid_manifests: IntGauge,
    /// `kubelet_image_garbage_collected_total{reason}`: images the image garbage collector removed.
    pub images_collected: IntCounterVec,
}

/// The pod labels of a per-pod series.
#[derive(Debug, Clone, Copy)]
pub struct PodLabels<'a> {
    /// The pod's name.
    pub name: &'a str,
    /// Its namespace.
    pub namespace: &'a str,
    /// Its UID.
    pub uid: &'a str,
}

impl SyncMetrics {
    /// Creates the metrics and registers them.
    pub fn new(r: &Registry) -> Result<Self, prometheus::Error> {
        let m = Self {
            started_containers: IntCounterVec::new(
                Opts::new("kubelet_started_containers_total", "Cumulative number of containers started"),
                &["container_type"],
            )?,
            started_container_errors: IntCounterVec::new(
                Opts::new(
                    "kubelet_started_containers_errors_total",
                    "Cumulative number of errors when starting containers",
                ),
                &["code", "container_type"],
            )?,
            pod_start_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "kubelet_pod_start_duration_seconds",
                    "Duration in seconds from nodewarden seeing a pod for the first time to the pod starting to run",
                )
                .buckets(vec![0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0]),
            )?,
            pod_worker_duration: HistogramVec::new(
                HistogramOpts::new(
                    "kubelet_pod_worker_duration_seconds",
                    "Duration in seconds to sync a single pod, by operation type: create, update or sync",
                )
                .buckets(exponential_buckets(0.001, 4.0, 9)?),
                &["operation"],
            )?,
            running_pods: IntGauge::new("kubelet_running_pods", "Number of pods that have a running pod sandbox")?,
            running_containers: IntGaugeVec::new(
                Opts::new("kubelet_running_containers", "Number of containers currently running"),
                &["container_state"],
            )?,
            probes: IntCounterVec::new(
                Opts::new(
                    "prober_probe_total",
                    "Cumulative number of a liveness, readiness or startup probe for a container by result",
                ),
                &["probe_type", "result", "container", "pod", "namespace", "pod_uid"],
            )?,
            invalid_manifests: IntGauge::new(
                "nodewarden_static_pod_manifest_errors",
                "Static pod manifests currently refused (see /pods for the reasons)",
            )?,
            images_collected: IntCounterVec::new(
                Opts::new(
                    "kubelet_image_garbage_collected_total",
                    "Images removed by the image garbage collector, by reason (age: unused past imageMaximumGCAge; \
                     space: to free space on the image file system)",
                ),
                &["reason"],
            )?,
        };
        r.register(Box::new(m.started_containers.clone()))?;
        r.register(Box::new(m.started_container_errors.clone()))?;
        r.register(Box::new(m.pod_start_duration.clone()))?;
        r.register(Box::new(m.pod_worker_duration.clone()))?;
        r.register(Box::new(m.running_pods.clone()))?;
        r.register(Box::new(m.running_containers.clone()))?;
        r.register(Box::new(m.probes.clone()))?;
        r.register(Box::new(m.invalid_manifests.clone()))?;
        r.register(Box::new(m.images_collected.clone()))?;
        Ok(m)
    }

    /// Counts a probe's result, labelled as the kubelet labels it.
    pub fn probed(&self, kind: crate::probe::ProbeKind, ok: bool, container: &str, pod: &PodLabels<'_>) {
        let result = if ok { "successful" } else { "failed" };
        self.probes.with_label_values(&[kind.as_str(), result, container, pod.name, pod.namespace, pod.uid]).inc();
    }

    /// Removes every `prober_probe_total` series of a pod that is gone (its containers named in `containers`), so
    /// that the series of deleted pods do not pile up.
    pub fn forget_probes<'a>(&self, containers: impl IntoIterator<Item = &'a str>, pod: &PodLabels<'_>) {
        use crate::probe::ProbeKind;
        for container in containers {
            for kind in [ProbeKind::Startup, ProbeKind::Liveness, ProbeKind::Readiness] {
                for result in ["successful", "failed"] {
                    let labels = [kind.as_str(), result, container, pod.name, pod.namespace, pod.uid];
                    let _ = self.probes.remove_label_values(&labels);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::ProbeKind;

    #[test]
    fn a_pods_probe_series_go_with_it() {
        let m = SyncMetrics::new(&Registry::new()).unwrap();
        let (a, b) =
            (PodLabels { name: "a", namespace: "ns", uid: "ua" }, PodLabels { name: "b", namespace: "ns", uid: "ub" });
        m.probed(ProbeKind::Liveness, true, "app", &a);
        m.probed(ProbeKind::Readiness, false, "side", &a);
        m.probed(ProbeKind::Liveness, true, "app", &b);
        let uids = || -> Vec<String> {
            let family = prometheus::core::Collector::collect(&m.probes).remove(0);
            family
                .get_metric()
                .iter()
                .map(|s| s.get_label().iter().find(|l| l.name() == "pod_uid").unwrap().value().to_owned())
                .collect()
        };
        assert_eq!(uids(), ["ua", "ua", "ub"]);
        m.forget_probes(["app", "side"], &a);
        assert_eq!(uids(), ["ub"]);
    }
}
