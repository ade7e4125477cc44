//! Configuration: the kubelet's own `KubeletConfiguration` file (`kubelet.config.k8s.io/v1beta1`), with the
//! kubelet's defaults and validation, and nodewarden's settings in a `nodewarden:` block.
//!
//! Loading is two steps: the YAML is read into a generic tree, whose top-level keys are sorted into implemented,
//! accepted-but-ignored (real kubelet fields nodewarden does not implement) and unknown (an error naming the field
//! and the nearest known name); then the implemented fields are deserialized and validated into [`Config`].

pub mod duration;
mod fields;
mod kubelet_fields;
mod raw;
mod reload;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nodewarden_eviction::Thresholds;
use nodewarden_resources::{
    CgroupDriver, CgroupPath, EvictionReserve, Reserved, ResourceConfig, parse_millicores, parse_non_negative,
};

pub use raw::{KubeletConfiguration, QuantityMap};
pub use reload::{LIVE, Reloaded, reload, restart_only};

/// The only `apiVersion` accepted.
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// The only `kind` accepted.
pub const KIND: &str = "KubeletConfiguration";
/// Config files larger than this are refused before parsing.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Why a config was refused. `field` is the kubelet field name (dotted for nested keys) where one applies.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The file is not YAML (or JSON) of the expected shape.
    #[error("invalid YAML: {0}")]
    Syntax(String),
    /// A field is unknown or has an invalid value.
    #[error("field {field}: {reason}")]
    Field {
        /// The field, such as `evictionHard.memory.available`.
        field: String,
        /// What is wrong.
        reason: String,
    },
}

impl ConfigError {
    fn field(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Field { field: field.into(), reason: reason.into() }
    }
}

/// The validated, typed configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The effective kubelet configuration, every field set: what `check-config` prints and `/configz` serves.
    pub effective: KubeletConfiguration,
    /// Real kubelet fields present in the file that nodewarden ignores.
    pub ignored: Vec<String>,
    /// Accepted settings that nodewarden does not honour as the kubelet would (said once at start).
    pub warnings: Vec<String>,
    /// What the resources crate needs. `memory_qos` is the request; the daemon also checks the kernel.
    pub resources: ResourceConfig,
    /// Eviction thresholds.
    pub thresholds: Thresholds,
    /// `evictionPressureTransitionPeriod`.
    pub pressure_transition_period: Duration,
    /// `evictionMaxPodGracePeriod` in seconds.
    pub max_pod_grace_period: u32,
    /// Where the read-only HTTP endpoints listen; `None` when `healthzPort` is 0.
    pub healthz: Option<SocketAddr>,
    /// `staticPodPath`, if set.
    pub static_pod_path: Option<PathBuf>,
    /// `containerRuntimeEndpoint`, if set (otherwise the embedded process runtime).
    pub container_runtime_endpoint: Option<String>,
    /// `runtimeRequestTimeout` (`0s` means the default, 2m).
    pub runtime_request_timeout: Duration,
    /// `serializeImagePulls`.
    pub serialize_image_pulls: bool,
    /// `nodeStatusUpdateFrequency`.
    pub node_status_update_frequency: Duration,
    /// `nodeStatusReportFrequency`.
    pub node_status_report_frequency: Duration,
    /// `nodeLeaseDurationSeconds`.
    pub node_lease_duration: Duration,
    /// `registerNode`.
    pub register_node: bool,
    /// `registerWithTaints`.
    pub register_with_taints: Vec<k8s_openapi::api::core::v1::Taint>,
    /// `nodeLabels`, each checked against the labels NodeRestriction lets a node set.
    pub node_labels: BTreeMap<String, String>,
    /// `providerID`, if set.
    pub provider_id: Option<String>,
    /// `nodeStatusMaxImages`: the most images the Node's status lists; `None` (-1) for all.
    pub node_status_max_images: Option<usize>,
    /// The node's graceful shutdown: the groups of pods by lowest priority, ascending, each with its share of the
    /// shutdown (from `shutdownGracePeriodByPodPriority`, or `shutdownGracePeriod` and
    /// `shutdownGracePeriodCriticalPods`); empty when graceful shutdown is off.
    pub shutdown_groups: Vec<(i32, Duration)>,
    /// `kubeAPIQPS` and `kubeAPIBurst`: the main apiserver client's rate limit.
    pub kube_api_qps: f64,
    /// `kubeAPIBurst`.
    pub kube_api_burst: u32,
    /// The cgroup2 mount.
    pub cgroup_mount: PathBuf,
    /// A path on nodefs.
    pub nodefs_path: PathBuf,
    /// A path on imagefs.
    pub imagefs_path: PathBuf,
    /// The longest period between two observations of the node (`nodewarden.housekeepingInterval`).
    pub housekeeping_interval: Duration,
    /// The shortest period between two eviction passes (`nodewarden.evictionPollMin`).
    pub eviction_poll_min: Duration,
    /// The eviction thread's `SCHED_FIFO` priority, 0 for none (`nodewarden.evictionRealtimePriority`).
    pub eviction_realtime_priority: u8,
    /// Wake the eviction loop on PSI triggers and `memory.events` (`nodewarden.pressureEvents`).
    pub pressure_events: bool,
    /// The daemon's own cgroup below `cgroupRoot`, if any (`nodewarden.daemonCgroup`).
    pub daemon_cgroup: Option<String>,
    /// `maxOpenFiles`: the open-file limit the daemon raises itself to at start (`RLIMIT_NOFILE`).
    pub max_open_files: u64,
    /// `protectKernelDefaults`: refuse to start on kernel tunables that differ from the kubelet's, instead of
    /// setting them.
    pub protect_kernel_defaults: bool,
    /// `failSwapOn`: refuse to start on a node with swap on.
    pub fail_swap_on: bool,
    /// `containerLogMaxSize`, `containerLogMaxFiles`, `containerLogMonitorInterval`.
    pub log_rotation: nodewarden_sync::LogRotation,
    /// The daemon cgroup's `memory.min` in bytes (`nodewarden.daemonMemoryMin`).
    pub daemon_memory_min: u64,
    /// `fileCheckFrequency`.
    pub file_check_frequency: Duration,
    /// `podLogsDir`.
    pub pod_logs_dir: PathBuf,
    /// `nodewarden.rootDir`.
    pub root_dir: PathBuf,
    /// `nodewarden.nodeName`.
    pub node_name: String,
}

/// Reads and validates a config file.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let read_err = |reason: String| ConfigError::Read { path: path.display().to_string(), reason };
    let bytes = nodewarden_resources::read_bounded(path, MAX_CONFIG_BYTES).map_err(|e| read_err(e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|_| read_err("the file is not UTF-8".into()))?;
    parse(&text)
}

/// Parses and validates config text.
pub fn parse(text: &str) -> Result<Config, ConfigError> {
    let tree: serde_json::Value = serde_saphyr::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))?;
    let serde_json::Value::Object(mut map) = tree else {
        return Err(ConfigError::Syntax("the document is not a mapping of fields".into()));
    };
    let implemented = fields::of::<KubeletConfiguration>();
    let mut ignored = Vec::new();
    for key in map.keys().cloned().collect::<Vec<_>>() {
        if implemented.contains(&key.as_str()) {
            continue;
        }
        if kubelet_fields::IGNORED.contains(&key.as_str()) {
            map.remove(&key);
            ignored.push(key);
            continue;
        }
        let known = implemented.iter().chain(kubelet_fields::IGNORED.iter()).copied();
        let hint = kubelet_fields::suggest(&key, known).map(|s| format!(" (did you mean {s}?)")).unwrap_or_default();
        return Err(ConfigError::field(key, format!("unknown field: not a KubeletConfiguration field{hint}")));
    }
    let raw: KubeletConfiguration = serde_path_to_error::deserialize(serde_json::Value::Object(map)).map_err(|e| {
        let field = e.path().to_string();
        ConfigError::field(field, e.into_inner().to_string())
    })?;
    let mut config = validate(raw.with_defaults())?;
    config.ignored = ignored;
    Ok(config)
}

/// The node's shutdown groups, as the kubelet derives them: `shutdownGracePeriodByPodPriority` sorted by
/// priority, or, from the two periods, the pods below system-critical priority with the period less the critical
/// pods' share, then the critical pods with theirs. Setting both forms is refused, as by the kubelet.
fn shutdown_groups(c: &KubeletConfiguration) -> Result<Vec<(i32, Duration)>, ConfigError> {
    let total = duration_field("shutdownGracePeriod", required(&c.shutdown_grace_period, "shutdownGracePeriod")?)?;
    let critical = duration_field(
        "shutdownGracePeriodCriticalPods",
        required(&c.shutdown_grace_period_critical_pods, "shutdownGracePeriodCriticalPods")?,
    )?;
    let by_priority = required(&c.shutdown_grace_period_by_pod_priority, "shutdownGracePeriodByPodPriority")?;
    if !by_priority.is_empty() {
        if !total.is_zero() || !critical.is_zero() {
            return Err(ConfigError::field(
                "shutdownGracePeriodByPodPriority",
                "cannot be set with shutdownGracePeriod or shutdownGracePeriodCriticalPods",
            ));
        }
        let mut groups = Vec::new();
        for (i, g) in by_priority.iter().enumerate() {
            let secs = u64::try_from(g.shutdown_grace_period_seconds).map_err(|_| {
                ConfigError::field(
                    format!("shutdownGracePeriodByPodPriority[{i}].shutdownGracePeriodSeconds"),
                    "is negative",
                )
            })?;
            groups.push((g.priority, Duration::from_secs(secs)));
        }
        groups.sort_by_key(|g| g.0);
        return Ok(groups);
    }
    if critical > total {
        return Err(ConfigError::field(
            "shutdownGracePeriodCriticalPods",
            format!("{critical:?} is longer than shutdownGracePeriod ({total:?})"),
        ));
    }
    if total.is_zero() {
        return Ok(Vec::new());
    }
    Ok(vec![(0, total - critical), (nodewarden_resources::SYSTEM_CRITICAL_PRIORITY, critical)])
}

fn duration_field(field: &str, value: &str) -> Result<Duration, ConfigError> {
    duration::parse(value).map_err(|e| ConfigError::field(field, e))
}

fn reserved(field: &str, map: &QuantityMap, warnings: &mut Vec<String>) -> Result<Reserved, ConfigError> {
    let mut r = Reserved::default();
    for (key, value) in map {
        let name = format!("{field}.{key}");
        let text = value.text();
        let bad = |e: nodewarden_resources::QuantityError| ConfigError::field(&name, e.to_string());
        match key.as_str() {
            "cpu" => r.cpu_millis = parse_millicores(&text).map_err(bad)?,
            "memory" => r.memory = parse_non_negative(&text).map_err(bad)?,
            "pid" => r.pids = parse_non_negative(&text).map_err(bad)?,
            "ephemeral-storage" => r.ephemeral_storage = parse_non_negative(&text).map_err(bad)?,
            k if k.starts_with("hugepages-") => {
                parse_non_negative(&text).map_err(bad)?;
                warnings.push(format!("{name}: huge page reservations are not enforced by nodewarden"));
            }
            _ => {
                return Err(ConfigError::field(
                    name,
                    "unknown resource (expected cpu, memory, pid, ephemeral-storage)",
                ));
            }
        }
    }
    Ok(r)
}

fn text_map(map: &QuantityMap) -> BTreeMap<String, String> {
    map.iter().map(|(k, v)| (k.clone(), v.text())).collect()
}

fn required<'a, T>(v: &'a Option<T>, field: &str) -> Result<&'a T, ConfigError> {
    v.as_ref().ok_or_else(|| ConfigError::field(field, "missing after defaulting"))
}

fn validate(c: KubeletConfiguration) -> Result<Config, ConfigError> {
    let mut warnings = Vec::new();
    match c.api_version.as_deref() {
        Some(API_VERSION) => {}
        other => return Err(ConfigError::field("apiVersion", format!("must be {API_VERSION}, found {other:?}"))),
    }
    match c.kind.as_deref() {
        Some(KIND) => {}
        other => return Err(ConfigError::field("kind", format!("must be {KIND}, found {other:?}"))),
    }
    let root_text = required(&c.cgroup_root, "cgroupRoot")?;
    let cgroup_root = CgroupPath::parse(root_text).map_err(|e| ConfigError::field("cgroupRoot", e.to_string()))?;
    if !*required(&c.cgroups_per_qos, "cgroupsPerQOS")? {
        return Err(ConfigError::field(
            "cgroupsPerQOS",
            "false is not supported: nodewarden always creates the kubepods tree",
        ));
    }
    let (cgroup_driver, cgroup_root) = match required(&c.cgroup_driver, "cgroupDriver")?.as_str() {
        "cgroupfs" => (CgroupDriver::Cgroupfs, cgroup_root),
        // As the kubelet reads it under systemd: `cgroupRoot` names a slice (`/nodewarden` is nodewarden.slice).
        "systemd" => {
            let root = nodewarden_resources::systemd::root_path(&cgroup_root)
                .map_err(|e| ConfigError::field("cgroupRoot", e.to_string()))?;
            (CgroupDriver::Systemd, root)
        }
        other => {
            return Err(ConfigError::field("cgroupDriver", format!("must be cgroupfs or systemd, found {other:?}")));
        }
    };
    let enforce = required(&c.enforce_node_allocatable, "enforceNodeAllocatable")?;
    for v in enforce {
        match v.as_str() {
            "pods" => {}
            "none" if enforce.len() == 1 => {}
            "none" => {
                return Err(ConfigError::field("enforceNodeAllocatable", "none cannot be combined with other values"));
            }
            "system-reserved" | "kube-reserved" | "system-reserved-compressible" | "kube-reserved-compressible" => {
                warnings.push(format!(
                    "enforceNodeAllocatable: {v} is not enforced: its cgroup lies outside nodewarden's cgroup root"
                ))
            }
            other => return Err(ConfigError::field("enforceNodeAllocatable", format!("unknown value {other:?}"))),
        }
    }
    let system_reserved = reserved("systemReserved", required(&c.system_reserved, "systemReserved")?, &mut warnings)?;
    let kube_reserved = reserved("kubeReserved", required(&c.kube_reserved, "kubeReserved")?, &mut warnings)?;

    let max_pods = *required(&c.max_pods, "maxPods")?;
    let max_pods =
        u32::try_from(max_pods).map_err(|_| ConfigError::field("maxPods", format!("{max_pods} is out of range")))?;
    let max_open_files = match *required(&c.max_open_files, "maxOpenFiles")? {
        n if n > 0 => u64::try_from(n).unwrap_or(u64::MAX),
        n => return Err(ConfigError::field("maxOpenFiles", format!("{n} is not a positive number of files"))),
    };
    let log_max_size = parse_non_negative(required(&c.container_log_max_size, "containerLogMaxSize")?)
        .map_err(|e| ConfigError::field("containerLogMaxSize", e.to_string()))?;
    if log_max_size == 0 {
        return Err(ConfigError::field("containerLogMaxSize", "must be more than 0"));
    }
    let log_max_files = match *required(&c.container_log_max_files, "containerLogMaxFiles")? {
        n if n >= 2 => u32::try_from(n).unwrap_or(u32::MAX),
        n => {
            return Err(ConfigError::field(
                "containerLogMaxFiles",
                format!("{n} is less than 2 (the kubelet's minimum)"),
            ));
        }
    };
    let log_interval = match duration_field(
        "containerLogMonitorInterval",
        required(&c.container_log_monitor_interval, "containerLogMonitorInterval")?,
    )? {
        d if d < Duration::from_secs(1) => {
            return Err(ConfigError::field("containerLogMonitorInterval", "must be at least 1s"));
        }
        d => d,
    };
    let pod_pids_limit = match *required(&c.pod_pids_limit, "podPidsLimit")? {
        -1 | 0 => None,
        n if n > 0 => Some(n.unsigned_abs()),
        n => return Err(ConfigError::field("podPidsLimit", format!("{n} is negative (use -1 for no limit)"))),
    };
    let period = duration_field("cpuCFSQuotaPeriod", required(&c.cpu_cfs_quota_period, "cpuCFSQuotaPeriod")?)?;
    if !(Duration::from_millis(1)..=Duration::from_secs(1)).contains(&period) {
        return Err(ConfigError::field("cpuCFSQuotaPeriod", "must be between 1ms and 1s"));
    }
    let factor = *required(&c.memory_throttling_factor, "memoryThrottlingFactor")?;
    if !(factor > 0.0 && factor <= 1.0) {
        return Err(ConfigError::field(
            "memoryThrottlingFactor",
            format!("{factor} must be greater than 0 and at most 1"),
        ));
    }
    let memory_qos = required(&c.feature_gates, "featureGates")?.get("MemoryQoS").copied().unwrap_or(false);
    let high = *required(&c.image_gc_high_threshold_percent, "imageGCHighThresholdPercent")?;
    let low = *required(&c.image_gc_low_threshold_percent, "imageGCLowThresholdPercent")?;
    for (field, v) in [("imageGCHighThresholdPercent", high), ("imageGCLowThresholdPercent", low)] {
        if !(0..=100).contains(&v) {
            return Err(ConfigError::field(field, format!("{v} is not between 0 and 100")));
        }
    }
    if low >= high && high != 100 {
        return Err(ConfigError::field(
            "imageGCLowThresholdPercent",
            format!("{low} must be less than imageGCHighThresholdPercent ({high})"),
        ));
    }

    let grace: BTreeMap<String, Duration> = required(&c.eviction_soft_grace_period, "evictionSoftGracePeriod")?
        .iter()
        .map(|(k, v)| duration_field(&format!("evictionSoftGracePeriod.{k}"), v).map(|d| (k.clone(), d)))
        .collect::<Result<_, _>>()?;
    let thresholds = Thresholds::from_config(
        &text_map(required(&c.eviction_hard, "evictionHard")?),
        &text_map(required(&c.eviction_soft, "evictionSoft")?),
        &grace,
        &text_map(required(&c.eviction_minimum_reclaim, "evictionMinimumReclaim")?),
    )
    .map_err(|e| ConfigError::field(e.field, e.reason))?;
    let enforce_pods = enforce.iter().any(|v| v == "pods");
    let thresholds = if enforce_pods { thresholds.with_allocatable_memory() } else { thresholds };
    let pressure_transition_period = duration_field(
        "evictionPressureTransitionPeriod",
        required(&c.eviction_pressure_transition_period, "evictionPressureTransitionPeriod")?,
    )?;
    let mpg = *required(&c.eviction_max_pod_grace_period, "evictionMaxPodGracePeriod")?;
    let max_pod_grace_period = u32::try_from(mpg)
        .map_err(|_| ConfigError::field("evictionMaxPodGracePeriod", format!("{mpg} is negative or too large")))?;

    let port = *required(&c.healthz_port, "healthzPort")?;
    let port = u16::try_from(port)
        .map_err(|_| ConfigError::field("healthzPort", format!("{port} is not a port (0..65535)")))?;
    let addr_text = required(&c.healthz_bind_address, "healthzBindAddress")?;
    let addr: IpAddr = addr_text
        .parse()
        .map_err(|_| ConfigError::field("healthzBindAddress", format!("{addr_text:?} is not an IP address")))?;
    let healthz = (port != 0).then_some(SocketAddr::new(addr, port));
    if healthz.is_some() && !addr.is_loopback() {
        warnings.push(format!(
            "healthzBindAddress {addr} is not a loopback address: /pods (every pod's spec, env values redacted), \
             /configz and /evictions are served unauthenticated to whoever reaches {addr}:{port}"
        ));
    }

    let behavior = required(&c.memory_swap, "memorySwap")?.swap_behavior.as_deref().unwrap_or(raw::NO_SWAP);
    match behavior {
        raw::NO_SWAP => {}
        "LimitedSwap" => warnings.push(
            "memorySwap.swapBehavior: LimitedSwap is not implemented; pods get memory.swap.max 0, as with NoSwap"
                .into(),
        ),
        other => {
            return Err(ConfigError::field(
                "memorySwap.swapBehavior",
                format!("{other:?} is not a swap behavior (NoSwap or LimitedSwap)"),
            ));
        }
    }

    let endpoint = required(&c.container_runtime_endpoint, "containerRuntimeEndpoint")?;
    if !endpoint.is_empty() && !endpoint.starts_with("unix://") {
        return Err(ConfigError::field("containerRuntimeEndpoint", format!("{endpoint:?} must be a unix:// socket")));
    }
    let runtime_request_timeout = match duration_field(
        "runtimeRequestTimeout",
        required(&c.runtime_request_timeout, "runtimeRequestTimeout")?,
    )? {
        Duration::ZERO => Duration::from_secs(120),
        d => d,
    };
    let non_empty = |s: &String| (!s.is_empty()).then(|| PathBuf::from(s));
    let node_status_update_frequency = duration_field(
        "nodeStatusUpdateFrequency",
        required(&c.node_status_update_frequency, "nodeStatusUpdateFrequency")?,
    )?;

    if node_status_update_frequency.is_zero() {
        return Err(ConfigError::field("nodeStatusUpdateFrequency", "must be more than 0"));
    }
    let node_status_report_frequency = duration_field(
        "nodeStatusReportFrequency",
        required(&c.node_status_report_frequency, "nodeStatusReportFrequency")?,
    )?;
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
    let provider_id = required(&c.provider_id, "providerID")?;
    let shutdown_groups = shutdown_groups(&c)?;
    let max_images = *required(&c.node_status_max_images, "nodeStatusMaxImages")?;
    let node_status_max_images =
        match max_images {
            -1 => None,
            n => Some(usize::try_from(n).map_err(|_| {
                ConfigError::field("nodeStatusMaxImages", format!("{n} must be -1 (no limit) or greater"))
            })?),
        };

    let nw = required(&c.nodewarden, "nodewarden")?;
    let housekeeping_interval = duration_field(
        "nodewarden.housekeepingInterval",
        required(&nw.housekeeping_interval, "nodewarden.housekeepingInterval")?,
    )?;
    if housekeeping_interval < Duration::from_millis(10) {
        return Err(ConfigError::field("nodewarden.housekeepingInterval", "must be at least 10ms"));
    }
    let eviction_poll_min =
        duration_field("nodewarden.evictionPollMin", required(&nw.eviction_poll_min, "nodewarden.evictionPollMin")?)?;
    if eviction_poll_min < Duration::from_millis(1) || eviction_poll_min > housekeeping_interval {
        return Err(ConfigError::field(
            "nodewarden.evictionPollMin",
            "must be at least 1ms and at most nodewarden.housekeepingInterval",
        ));
    }
    let eviction_realtime_priority =
        u8::try_from(*required(&nw.eviction_realtime_priority, "nodewarden.evictionRealtimePriority")?)
            .ok()
            .filter(|p| *p <= nodewarden_eviction::MAX_REALTIME_PRIORITY)
            .ok_or_else(|| ConfigError::field("nodewarden.evictionRealtimePriority", "must be from 0 to 99"))?;
    let daemon_cgroup = required(&nw.daemon_cgroup, "nodewarden.daemonCgroup")?;
    if !daemon_cgroup.is_empty() {
        nodewarden_resources::validate_container_name(daemon_cgroup)
            .map_err(|e| ConfigError::field("nodewarden.daemonCgroup", e.to_string()))?;
        if daemon_cgroup == "kubepods" {
            return Err(ConfigError::field("nodewarden.daemonCgroup", "must not be the kubepods cgroup"));
        }
    }
    let memory_min_text = required(&nw.daemon_memory_min, "nodewarden.daemonMemoryMin")?;
    let daemon_memory_min = parse_non_negative(memory_min_text)
        .map_err(|e| ConfigError::field("nodewarden.daemonMemoryMin", e.to_string()))?;
    // As in the kubelet, zero (kubeadm writes `0s`) means the default.
    let file_check_frequency =
        match duration_field("fileCheckFrequency", required(&c.file_check_frequency, "fileCheckFrequency")?)? {
            d if d.is_zero() => Duration::from_secs(20),
            d if d < Duration::from_secs(1) => {
                return Err(ConfigError::field("fileCheckFrequency", "must be at least 1s"));
            }
            d => d,
        };
    let absolute = |field: &str, v: &str| -> Result<PathBuf, ConfigError> {
        if v.starts_with('/') {
            Ok(PathBuf::from(v))
        } else {
            Err(ConfigError::field(field, "must be an absolute path"))
        }
    };
    let pod_logs_dir = absolute("podLogsDir", required(&c.pod_logs_dir, "podLogsDir")?)?;
    let root_dir = absolute("nodewarden.rootDir", required(&nw.root_dir, "nodewarden.rootDir")?)?;
    let node_name = required(&nw.node_name, "nodewarden.nodeName")?.clone();
    if node_name.is_empty()
        || node_name.len() > 63
        || !node_name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    {
        return Err(ConfigError::field("nodewarden.nodeName", format!("{node_name:?} is not a valid node name")));
    }
    let eviction_reserve = EvictionReserve {
        memory_available: thresholds.hard_for(nodewarden_eviction::Signal::MemoryAvailable).map(|t| t.amount),
        nodefs_available: thresholds.hard_for(nodewarden_eviction::Signal::NodeFsAvailable).map(|t| t.amount),
    };
    let resources = ResourceConfig {
        cgroup_root,
        enforce_pods,
        system_reserved,
        kube_reserved,
        eviction_reserve,
        max_pods,
        pod_pids_limit,
        cpu_cfs_quota: *required(&c.cpu_cfs_quota, "cpuCFSQuota")?,
        cpu_cfs_period_us: u64::try_from(period.as_micros()).unwrap_or(nodewarden_resources::DEFAULT_CFS_PERIOD_US),
        memory_qos,
        memory_throttling_factor: factor,
        static_pods_critical: *required(&nw.static_pods_critical, "nodewarden.staticPodsCritical")?,
        container_cgroups: endpoint.is_empty(),
        cgroup_driver,
    };
    Ok(Config {
        ignored: Vec::new(),
        warnings,
        resources,
        thresholds,
        pressure_transition_period,
        max_pod_grace_period,
        healthz,
        max_open_files,
        protect_kernel_defaults: *required(&c.protect_kernel_defaults, "protectKernelDefaults")?,
        fail_swap_on: *required(&c.fail_swap_on, "failSwapOn")?,
        log_rotation: nodewarden_sync::LogRotation {
            max_size: log_max_size,
            max_files: log_max_files,
            interval: log_interval,
        },
        static_pod_path: non_empty(required(&c.static_pod_path, "staticPodPath")?),
        container_runtime_endpoint: (!endpoint.is_empty()).then(|| endpoint.clone()),
        runtime_request_timeout,
        serialize_image_pulls: *required(&c.serialize_image_pulls, "serializeImagePulls")?,
        node_status_update_frequency,
        node_status_report_frequency,
        node_lease_duration,
        register_node: *required(&c.register_node, "registerNode")?,
        register_with_taints,
        node_labels,
        provider_id: (!provider_id.is_empty()).then(|| provider_id.clone()),
        kube_api_qps: qps as f64,
        kube_api_burst,
        node_status_max_images,
        shutdown_groups,
        cgroup_mount: PathBuf::from(required(&nw.cgroup_mount, "nodewarden.cgroupMount")?),
        nodefs_path: PathBuf::from(required(&nw.nodefs_path, "nodewarden.nodefsPath")?),
        imagefs_path: PathBuf::from(required(&nw.imagefs_path, "nodewarden.imagefsPath")?),
        housekeeping_interval,
        eviction_poll_min,
        eviction_realtime_priority,
        pressure_events: *required(&nw.pressure_events, "nodewarden.pressureEvents")?,
        daemon_cgroup: (!daemon_cgroup.is_empty()).then(|| daemon_cgroup.clone()),
        daemon_memory_min,
        file_check_frequency,
        pod_logs_dir,
        root_dir,
        node_name,
        effective: c,
    })
}

impl Config {
    /// The effective configuration as YAML, as `check-config` prints it.
    pub fn to_yaml(&self) -> String {
        serde_saphyr::to_string(&self.effective).unwrap_or_else(|e| format!("# cannot render the config: {e}\n"))
    }
}

#[cfg(test)]
mod tests;
