//! The kubelet's runtime operation metrics, so that dashboards of CRI calls carry over.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, exponential_buckets};

/// `kubelet_runtime_operations_*`, by `operation_type`.
#[derive(Debug, Clone)]
pub struct RuntimeMetrics {
    operations: IntCounterVec,
    errors: IntCounterVec,
    duration: HistogramVec,
}

impl RuntimeMetrics {
    /// Creates the metrics and registers them.
    pub fn new(r: &Registry) -> Result<Self, prometheus::Error> {
        let label = &["operation_type"];
        let m = Self {
            operations: IntCounterVec::new(
                Opts::new(
                    "kubelet_runtime_operations_total",
                    "Cumulative number of runtime operations by operation type",
                ),
                label,
            )?,
            errors: IntCounterVec::new(
                Opts::new(
                    "kubelet_runtime_operations_errors_total",
                    "Cumulative number of runtime operation errors by operation type",
                ),
                label,
            )?,
            duration: HistogramVec::new(
                HistogramOpts::new(
                    "kubelet_runtime_operations_duration_seconds",
                    "Duration in seconds of runtime operations, by operation type",
                )
                .buckets(exponential_buckets(0.005, 2.5, 14)?),
                label,
            )?,
        };
        r.register(Box::new(m.operations.clone()))?;
        r.register(Box::new(m.errors.clone()))?;
        r.register(Box::new(m.duration.clone()))?;
        Ok(m)
    }

    /// Records one call of `rpc` (a CRI method name) that took `seconds`.
    pub(crate) fn record(&self, rpc: &str, seconds: f64, failed: bool) {
        let op = operation_type(rpc);
        self.operations.with_label_values(&[op]).inc();
        self.duration.with_label_values(&[op]).observe(seconds);
        if failed {
            self.errors.with_label_values(&[op]).inc();
        }
    }
}

/// The kubelet's `operation_type` of a CRI method.
fn operation_type(rpc: &str) -> &'static str {
    match rpc {
        "Version" => "version",
        "RunPodSandbox" => "run_podsandbox",
        "StopPodSandbox" => "stop_podsandbox",
        "RemovePodSandbox" => "remove_podsandbox",
        "PodSandboxStatus" => "podsandbox_status",
        "ListPodSandbox" => "list_podsandbox",
        "CreateContainer" => "create_container",
        "StartContainer" => "start_container",
        "StopContainer" => "stop_container",
        "RemoveContainer" => "remove_container",
        "ListContainers" => "list_containers",
        "ContainerStatus" => "container_status",
        "ExecSync" => "exec_sync",
        "ImageStatus" => "image_status",
        "ListImages" => "list_images",
        "PullImage" => "pull_image",
        "ImageFsInfo" => "image_fs_info",
        "ListContainerStats" => "list_container_stats",
        _ => "other",
    }
}
