//! The subset of `KubeletConfiguration` that nodewarden implements, in the kubelet's field names, plus
//! nodewarden's own `nodewarden:` block. After [`KubeletConfiguration::with_defaults`] every field is set, and the
//! struct is what `check-config` prints and `/configz` serves.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A quantity written as a string (`"100Mi"`) or a bare YAML number (`1000`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum QuantityValue {
    /// A string.
    Text(String),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
}

impl QuantityValue {
    /// The value as the quantity text.
    pub fn text(&self) -> String {
        match self {
            QuantityValue::Text(s) => s.clone(),
            QuantityValue::Int(i) => i.to_string(),
            QuantityValue::Float(f) => f.to_string(),
        }
    }
}

/// A per-resource or per-signal map of quantities.
pub type QuantityMap = BTreeMap<String, QuantityValue>;

/// The implemented kubelet fields. `None` means "not given"; defaults are applied by `with_defaults`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(missing_docs)]
pub struct KubeletConfiguration {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub static_pod_path: Option<String>,
    /// `fileCheckFrequency`: how often the static pod directory is rescanned besides inotify events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_check_frequency: Option<String>,
    /// `staticPodURL`: a URL serving a pod manifest or a `v1.PodList`, the third source of static pods.
    #[serde(rename = "staticPodURL", skip_serializing_if = "Option::is_none")]
    pub static_pod_url: Option<String>,
    /// `staticPodURLHeader`: the headers of each request to `staticPodURL`.
    #[serde(rename = "staticPodURLHeader", skip_serializing_if = "Option::is_none")]
    pub static_pod_url_header: Option<BTreeMap<String, Vec<String>>>,
    /// `httpCheckFrequency`: how often `staticPodURL` is fetched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_check_frequency: Option<String>,
    /// `syncFrequency`: how often the files of volumes made from ConfigMaps, Secrets, tokens and the pod's
    /// metadata are made again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_frequency: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_logs_dir: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_runtime_endpoint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serialize_image_pulls: Option<bool>,
    /// `maxParallelImagePulls`: unset means no limit (with `serializeImagePulls: false`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_parallel_image_pulls: Option<i64>,
    /// `localStorageCapacityIsolation`: ephemeral-storage limits and `emptyDir` size limits enforced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_storage_capacity_isolation: Option<bool>,
    /// `runtimeRequestTimeout`: the deadline of CRI calls other than image pulls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_request_timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub healthz_bind_address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub healthz_port: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_status_update_frequency: Option<String>,
    /// `nodeStatusReportFrequency`: the longest time between two reports of an unchanged node status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_status_report_frequency: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_lease_duration_seconds: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub register_node: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub register_with_taints: Option<Vec<k8s_openapi::api::core::v1::Taint>>,
    /// `nodeLabels`: labels a newly registered Node gets (the kubelet's `--node-labels`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_labels: Option<BTreeMap<String, String>>,
    #[serde(rename = "providerID", skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_status_max_images: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown_grace_period: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown_grace_period_critical_pods: Option<String>,
    #[serde(rename = "shutdownGracePeriodByPodPriority", skip_serializing_if = "Option::is_none")]
    pub shutdown_grace_period_by_pod_priority: Option<Vec<GracePeriodByPriority>>,
    #[serde(rename = "kubeAPIQPS", skip_serializing_if = "Option::is_none")]
    pub kube_api_qps: Option<i64>,
    #[serde(rename = "kubeAPIBurst", skip_serializing_if = "Option::is_none")]
    pub kube_api_burst: Option<i64>,
    #[serde(rename = "eventRecordQPS", skip_serializing_if = "Option::is_none")]
    pub event_record_qps: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_burst: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup_root: Option<String>,
    #[serde(rename = "cgroupsPerQOS", skip_serializing_if = "Option::is_none")]
    pub cgroups_per_qos: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup_driver: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enforce_node_allocatable: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_reserved: Option<QuantityMap>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kube_reserved: Option<QuantityMap>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_pods: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_pids_limit: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_open_files: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protect_kernel_defaults: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fail_swap_on: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_swap: Option<MemorySwap>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_log_max_size: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_log_max_files: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_log_monitor_interval: Option<String>,
    #[serde(rename = "cpuCFSQuota", skip_serializing_if = "Option::is_none")]
    pub cpu_cfs_quota: Option<bool>,
    #[serde(rename = "cpuCFSQuotaPeriod", skip_serializing_if = "Option::is_none")]
    pub cpu_cfs_quota_period: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_throttling_factor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub feature_gates: Option<BTreeMap<String, bool>>,
    #[serde(rename = "imageGCHighThresholdPercent", skip_serializing_if = "Option::is_none")]
    pub image_gc_high_threshold_percent: Option<i64>,
    #[serde(rename = "imageGCLowThresholdPercent", skip_serializing_if = "Option::is_none")]
    pub image_gc_low_threshold_percent: Option<i64>,
    #[serde(rename = "imageMinimumGCAge", skip_serializing_if = "Option::is_none")]
    pub image_minimum_gc_age: Option<String>,
    #[serde(rename = "imageMaximumGCAge", skip_serializing_if = "Option::is_none")]
    pub image_maximum_gc_age: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_hard: Option<QuantityMap>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_soft: Option<QuantityMap>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_soft_grace_period: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_pressure_transition_period: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_max_pod_grace_period: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_minimum_reclaim: Option<QuantityMap>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub merge_default_eviction_settings: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodewarden: Option<NodewardenSettings>,
}

/// nodewarden's own settings, under the `nodewarden:` key.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodewardenSettings {
    /// Where the cgroup2 hierarchy is mounted. Default `/sys/fs/cgroup`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup_mount: Option<String>,
    /// A path on the node file system (nodefs). Default `/var/lib/kubelet` (or its nearest existing parent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodefs_path: Option<String>,
    /// A path on the image file system (imagefs). Default `/var/lib/containerd` (or its nearest existing parent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub imagefs_path: Option<String>,
    /// The longest period between two observations of the node (eviction passes, metrics, readiness), used
    /// while headroom above every threshold is ample. Default `1s`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub housekeeping_interval: Option<String>,
    /// The shortest period between two eviction passes, used in the last moment before a threshold is crossed
    /// (the period shrinks geometrically on a ramp, so only a few passes come this close). Default `1ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_poll_min: Option<String>,
    /// The `SCHED_FIFO` priority of the eviction thread (1 to 99), so that a pass woken on a busy node runs at once;
    /// `0` leaves it under the normal scheduler. Default `1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_realtime_priority: Option<i64>,
    /// Wake the eviction loop on PSI triggers and `memory.events` changes. Default `true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pressure_events: Option<bool>,
    /// The cgroup below `cgroupRoot` that the daemon moves itself into, with `memory.min` protection; empty to
    /// stay where it was started. Default `nodewarden`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daemon_cgroup: Option<String>,
    /// The daemon's `memory.min`. Default `16Mi`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daemon_memory_min: Option<String>,
    /// Treat every static pod as critical (never evicted), as the kubelet does. Default `false`: criticality
    /// comes from the pod's priority.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub static_pods_critical: Option<bool>,
    /// Where pod volumes and pod state live (the kubelet's `--root-dir`). Default `/var/lib/nodewarden`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub root_dir: Option<String>,
    /// The node name, appended to static pod names. Default: the host name (the kubelet's default too).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// How long an exited container is kept at least (the kubelet's `--minimum-container-ttl-duration`).
    /// Default `0s`.
    #[serde(rename = "minimumContainerTTLDuration", skip_serializing_if = "Option::is_none")]
    pub minimum_container_ttl_duration: Option<String>,
    /// Exited containers kept per container of a pod, the newest (the kubelet's
    /// `--maximum-dead-containers-per-container`); negative: no limit. Default `1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maximum_dead_containers_per_container: Option<i64>,
    /// Exited containers kept on the node (the kubelet's `--maximum-dead-containers`); negative: no limit.
    /// Default `-1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maximum_dead_containers: Option<i64>,
}

fn or<T>(v: &mut Option<T>, default: T) {
    if v.is_none() {
        *v = Some(default);
    }
}

impl KubeletConfiguration {
    /// Fills every field that was not given with the kubelet's default (nodewarden's for its own block).
    pub fn with_defaults(mut self) -> Self {
        or(&mut self.pod_logs_dir, "/var/log/pods".into());
        or(&mut self.container_runtime_endpoint, String::new());
        or(&mut self.static_pod_path, String::new());
        or(&mut self.file_check_frequency, "20s".into());
        or(&mut self.static_pod_url, String::new());
        or(&mut self.static_pod_url_header, BTreeMap::new());
        or(&mut self.http_check_frequency, "20s".into());
        or(&mut self.sync_frequency, "1m".into());
        // The kubelet's: parallel pulls asked for (2 or more) turn the serial default off.
        let serial = self.max_parallel_image_pulls.is_none_or(|n| n < 2);
        or(&mut self.serialize_image_pulls, serial);
        or(&mut self.local_storage_capacity_isolation, true);
        or(&mut self.runtime_request_timeout, "2m".into());
        or(&mut self.healthz_bind_address, "127.0.0.1".into());
        or(&mut self.healthz_port, 10248);
        // As in the kubelet, an absent or zero (kubeadm writes `0s`) frequency means the default; the report
        // frequency defaults to the update frequency when only that was set, else to 5m.
        let zero_or_absent = |v: &Option<String>| {
            v.as_deref().is_none_or(|t| super::duration::parse(t) == Ok(std::time::Duration::ZERO))
        };
        let update_given = !zero_or_absent(&self.node_status_update_frequency);
        if !update_given {
            self.node_status_update_frequency = Some("10s".into());
        }
        if zero_or_absent(&self.node_status_report_frequency) {
            self.node_status_report_frequency = Some(if update_given {
                self.node_status_update_frequency.clone().unwrap_or_default()
            } else {
                "5m0s".into()
            });
        }
        if self.node_lease_duration_seconds.is_none_or(|d| d == 0) {
            self.node_lease_duration_seconds = Some(40);
        }
        or(&mut self.register_node, true);
        or(&mut self.register_with_taints, Vec::new());
        or(&mut self.node_labels, BTreeMap::new());
        or(&mut self.provider_id, String::new());
        or(&mut self.node_status_max_images, 50);
        or(&mut self.shutdown_grace_period, "0s".into());
        or(&mut self.shutdown_grace_period_critical_pods, "0s".into());
        or(&mut self.shutdown_grace_period_by_pod_priority, Vec::new());
        if self.kube_api_qps.is_none_or(|q| q == 0) {
            self.kube_api_qps = Some(50);
        }
        if self.kube_api_burst.is_none_or(|b| b == 0) {
            self.kube_api_burst = Some(100);
        }
        // An explicit 0 is the kubelet's "no limit"; an unset or 0 burst is its default.
        or(&mut self.event_record_qps, 50);
        if self.event_burst.is_none_or(|b| b == 0) {
            self.event_burst = Some(100);
        }
        or(&mut self.cgroup_root, "/".into());
        or(&mut self.cgroups_per_qos, true);
        or(&mut self.cgroup_driver, "cgroupfs".into());
        or(&mut self.enforce_node_allocatable, vec!["pods".into()]);
        or(&mut self.system_reserved, BTreeMap::new());
        or(&mut self.kube_reserved, BTreeMap::new());
        or(&mut self.max_pods, 110);
        or(&mut self.pod_pids_limit, -1);
        or(&mut self.max_open_files, 1_000_000);
        or(&mut self.protect_kernel_defaults, false);
        or(&mut self.fail_swap_on, true);
        let swap = self.memory_swap.get_or_insert_with(MemorySwap::default);
        if swap.swap_behavior.as_deref().is_none_or(str::is_empty) {
            swap.swap_behavior = Some(NO_SWAP.into());
        }
        or(&mut self.container_log_max_size, "10Mi".into());
        or(&mut self.container_log_max_files, 5);
        or(&mut self.container_log_monitor_interval, "10s".into());
        or(&mut self.cpu_cfs_quota, true);
        or(&mut self.cpu_cfs_quota_period, "100ms".into());
        or(&mut self.memory_throttling_factor, 0.9);
        or(&mut self.feature_gates, BTreeMap::new());
        or(&mut self.image_gc_high_threshold_percent, 85);
        or(&mut self.image_gc_low_threshold_percent, 80);
        or(&mut self.image_minimum_gc_age, "2m0s".into());
        or(&mut self.image_maximum_gc_age, "0s".into());
        let defaults: QuantityMap = nodewarden_eviction::default_hard_thresholds()
            .into_iter()
            .map(|(k, v)| (k, QuantityValue::Text(v)))
            .collect();
        self.eviction_hard = Some(match (self.eviction_hard.take(), self.merge_default_eviction_settings) {
            (None, _) => defaults,
            (Some(given), Some(true)) => defaults.into_iter().chain(given).collect(),
            // As in the kubelet: a given evictionHard replaces the defaults entirely.
            (Some(given), _) => given,
        });
        or(&mut self.merge_default_eviction_settings, false);
        or(&mut self.eviction_soft, BTreeMap::new());
        or(&mut self.eviction_soft_grace_period, BTreeMap::new());
        or(&mut self.eviction_pressure_transition_period, "5m0s".into());
        or(&mut self.eviction_max_pod_grace_period, 0);
        or(&mut self.eviction_minimum_reclaim, BTreeMap::new());
        let mut nw = self.nodewarden.take().unwrap_or_default();
        or(&mut nw.cgroup_mount, "/sys/fs/cgroup".into());
        or(&mut nw.nodefs_path, "/var/lib/kubelet".into());
        or(&mut nw.imagefs_path, "/var/lib/containerd".into());
        or(&mut nw.housekeeping_interval, "1s".into());
        or(&mut nw.eviction_poll_min, "1ms".into());
        or(&mut nw.eviction_realtime_priority, 1);
        or(&mut nw.pressure_events, true);
        or(&mut nw.daemon_cgroup, "nodewarden".into());
        or(&mut nw.daemon_memory_min, "16Mi".into());
        or(&mut nw.static_pods_critical, false);
        or(&mut nw.root_dir, "/var/lib/nodewarden".into());
        or(&mut nw.minimum_container_ttl_duration, "0s".into());
        or(&mut nw.maximum_dead_containers_per_container, 1);
        or(&mut nw.maximum_dead_containers, -1);
        if nw.node_name.as_deref().is_none_or(str::is_empty) {
            nw.node_name = Some(rustix::system::uname().nodename().to_string_lossy().to_lowercase());
        }
        self.nodewarden = Some(nw);
        self
    }
}

/// `memorySwap.swapBehavior` when none is set: pods do not use swap.
pub const NO_SWAP: &str = "NoSwap";

/// `memorySwap`: how pods may use swap on a node that has it (with `failSwapOn: false`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemorySwap {
    /// `NoSwap` (the default) or `LimitedSwap`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap_behavior: Option<String>,
}

/// One entry of `shutdownGracePeriodByPodPriority`: pods of at least `priority` (and below the next entry's) get
/// `shutdownGracePeriodSeconds` at a node shutdown.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GracePeriodByPriority {
    /// The lowest priority of the group.
    pub priority: i32,
    /// The group's share of the shutdown, in seconds.
    pub shutdown_grace_period_seconds: i64,
}
