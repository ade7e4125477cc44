//! Which fields a running daemon can take from an edited config file ([`LIVE`]): the eviction settings
//! (thresholds, grace periods, minimum reclaim, transition period, poll bounds), reserved resources and
//! `enforceNodeAllocatable`, `maxPods`, `podPidsLimit`, `staticPodsCritical`, the image GC thresholds. Everything
//! else needs a restart ([`restart_only`]): such a change is reported and the running value kept. A reload says
//! which sections of the config changed, so that each consumer is handed only a section of its own that did.

use super::{Config, ConfigError, KubeletConfiguration, Section, parse, validate};
use crate::raw::NodewardenSettings;

/// The outcome of a reload: the config to run with, the sections of it that changed, and the changed fields that
/// need a restart.
#[derive(Debug)]
pub struct Reloaded {
    /// The new running config: the file's reloadable fields, the running values of the others.
    pub config: Config,
    /// The sections of `config` that differ from the running config's, in [`Section`] order. Only sections with
    /// a [`LIVE`] field can be here; an edit that changes no section (an image GC threshold, an ignored field)
    /// leaves it empty while `config.effective` still changes.
    pub changed: Vec<Section>,
    /// Fields whose change was not applied.
    pub needs_restart: Vec<&'static str>,
}

/// The fields a running daemon takes from an edited file, as the file names them: the eviction manager's, the
/// resource manager's (reserved resources, kubepods' limits, admission) and the image GC thresholds. Every other
/// field is in [`restart_only`]; a test holds every field of the file to exactly one of the two.
pub const LIVE: &[&str] = &[
    "enforceNodeAllocatable",
    "systemReserved",
    "kubeReserved",
    "maxPods",
    "podPidsLimit",
    "imageGCHighThresholdPercent",
    "imageGCLowThresholdPercent",
    "imageMinimumGCAge",
    "imageMaximumGCAge",
    "serializeImagePulls",
    "maxParallelImagePulls",
    "evictionHard",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "evictionPressureTransitionPeriod",
    "evictionMaxPodGracePeriod",
    "evictionMinimumReclaim",
    "mergeDefaultEvictionSettings",
    "nodewarden.housekeepingInterval",
    "nodewarden.evictionPollMin",
    "nodewarden.staticPodsCritical",
];

/// Defines, from one list, the names of a struct's restart-only fields and the function that keeps their running
/// values in an edited config, noting the ones that changed.
macro_rules! restart_only {
    ($names:ident, $keep:ident, $ty:ty; $($field:ident => $name:literal),* $(,)?) => {
        const $names: &[&str] = &[$($name),*];

        fn $keep(new: &mut $ty, old: &$ty, changed: &mut Vec<&'static str>) {
            $(
                if new.$field != old.$field {
                    changed.push($name);
                    new.$field = old.$field.clone();
                }
            )*
        }
    };
}

restart_only!(KUBELET_RESTART_ONLY, keep_kubelet, KubeletConfiguration;
    static_pod_path => "staticPodPath",
    file_check_frequency => "fileCheckFrequency",
    static_pod_url => "staticPodURL",
    static_pod_url_header => "staticPodURLHeader",
    http_check_frequency => "httpCheckFrequency",
    sync_frequency => "syncFrequency",
    protect_kernel_defaults => "protectKernelDefaults",
    fail_swap_on => "failSwapOn",
    memory_swap => "memorySwap",
    max_open_files => "maxOpenFiles",
    container_log_max_size => "containerLogMaxSize",
    container_log_max_files => "containerLogMaxFiles",
    container_log_monitor_interval => "containerLogMonitorInterval",
    pod_logs_dir => "podLogsDir",
    container_runtime_endpoint => "containerRuntimeEndpoint",
    runtime_request_timeout => "runtimeRequestTimeout",
    local_storage_capacity_isolation => "localStorageCapacityIsolation",
    healthz_bind_address => "healthzBindAddress",
    healthz_port => "healthzPort",
    node_status_update_frequency => "nodeStatusUpdateFrequency",
    node_status_report_frequency => "nodeStatusReportFrequency",
    node_lease_duration_seconds => "nodeLeaseDurationSeconds",
    register_node => "registerNode",
    register_with_taints => "registerWithTaints",
    node_labels => "nodeLabels",
    provider_id => "providerID",
    node_status_max_images => "nodeStatusMaxImages",
    shutdown_grace_period => "shutdownGracePeriod",
    shutdown_grace_period_critical_pods => "shutdownGracePeriodCriticalPods",
    shutdown_grace_period_by_pod_priority => "shutdownGracePeriodByPodPriority",
    kube_api_qps => "kubeAPIQPS",
    kube_api_burst => "kubeAPIBurst",
    event_record_qps => "eventRecordQPS",
    event_burst => "eventBurst",
    cgroup_root => "cgroupRoot",
    cgroups_per_qos => "cgroupsPerQOS",
    cgroup_driver => "cgroupDriver",
    cpu_cfs_quota => "cpuCFSQuota",
    cpu_cfs_quota_period => "cpuCFSQuotaPeriod",
    memory_throttling_factor => "memoryThrottlingFactor",
    feature_gates => "featureGates",
);

restart_only!(NODEWARDEN_RESTART_ONLY, keep_nodewarden, NodewardenSettings;
    cgroup_mount => "nodewarden.cgroupMount",
    nodefs_path => "nodewarden.nodefsPath",
    imagefs_path => "nodewarden.imagefsPath",
    eviction_realtime_priority => "nodewarden.evictionRealtimePriority",
    pressure_events => "nodewarden.pressureEvents",
    daemon_cgroup => "nodewarden.daemonCgroup",
    daemon_memory_min => "nodewarden.daemonMemoryMin",
    root_dir => "nodewarden.rootDir",
    node_name => "nodewarden.nodeName",
    minimum_container_ttl_duration => "nodewarden.minimumContainerTTLDuration",
    maximum_dead_containers_per_container => "nodewarden.maximumDeadContainersPerContainer",
    maximum_dead_containers => "nodewarden.maximumDeadContainers",
);

/// The fields whose change needs a restart, as the file names them: an edit is reported and the running value
/// kept.
pub fn restart_only() -> impl Iterator<Item = &'static str> {
    KUBELET_RESTART_ONLY.iter().chain(NODEWARDEN_RESTART_ONLY).copied()
}

/// Parses and validates an edited config and merges it into the running one. An invalid file is an error and
/// changes nothing.
pub fn reload(running: &Config, text: &str) -> Result<Reloaded, ConfigError> {
    let fresh = parse(text)?;
    let old: &KubeletConfiguration = &running.effective;
    let mut raw = fresh.effective.clone();
    let mut needs_restart = Vec::new();
    keep_kubelet(&mut raw, old, &mut needs_restart);
    if let (Some(new), Some(old)) = (raw.nodewarden.as_mut(), old.nodewarden.as_ref()) {
        keep_nodewarden(new, old, &mut needs_restart);
    }
    let mut config = validate(raw)?;
    config.ignored = fresh.ignored;
    // The kernel check at start may have turned Memory QoS off; that stays.
    config.resources.memory_qos = running.resources.memory_qos;
    let changed = changed(running, &config);
    Ok(Reloaded { config, changed, needs_restart })
}

/// The sections that differ between two configs.
fn changed(old: &Config, new: &Config) -> Vec<Section> {
    let Config {
        effective: _,
        ignored: _,
        warnings: _,
        resources,
        eviction,
        cluster,
        runtime,
        pods,
        shutdown,
        host,
        endpoints,
        images,
    } = new;
    [
        (Section::Resources, *resources != old.resources),
        (Section::Eviction, *eviction != old.eviction),
        (Section::Cluster, *cluster != old.cluster),
        (Section::Runtime, *runtime != old.runtime),
        (Section::Pods, *pods != old.pods),
        (Section::Shutdown, *shutdown != old.shutdown),
        (Section::Host, *host != old.host),
        (Section::Endpoints, *endpoints != old.endpoints),
        (Section::Images, *images != old.images),
    ]
    .into_iter()
    .filter_map(|(section, differs)| differs.then_some(section))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::section::HEAD;

    #[test]
    fn thresholds_reload_and_restart_fields_keep_their_running_value() {
        let running = parse(&format!("{HEAD}cgroupRoot: /a\nevictionHard:\n  memory.available: 100Mi\n")).unwrap();
        let edited = format!(
            "{HEAD}cgroupRoot: /b\nmaxPods: 20\nevictionHard:\n  memory.available: 300Mi\nnodewarden:\n  rootDir: /x\n"
        );
        let r = reload(&running, &edited).unwrap();
        assert_eq!(r.needs_restart, ["cgroupRoot", "nodewarden.rootDir"]);
        assert_eq!(r.config.resources.cgroup_root.as_str(), "/a");
        assert_eq!(r.config.pods.root_dir, running.pods.root_dir);
        assert_eq!(r.config.resources.max_pods, 20);
        let mem = r.config.eviction.thresholds.hard_for(nodewarden_eviction::Signal::MemoryAvailable).unwrap();
        assert_eq!(mem.amount, nodewarden_resources::Amount::Quantity(300 << 20));
    }

    #[test]
    fn an_edit_of_one_live_section_changes_that_section_only() {
        let running = parse(HEAD).unwrap();
        let edit = |text: &str| reload(&running, &format!("{HEAD}{text}")).unwrap();
        for text in [
            "evictionPressureTransitionPeriod: 1m\n",
            "evictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: 30s\n",
            "evictionHard:\n  imagefs.available: 10%\n  memory.available: 100Mi\n  nodefs.available: 10%\n",
            "nodewarden:\n  housekeepingInterval: 2s\n",
        ] {
            let r = edit(text);
            assert_eq!(r.changed, [Section::Eviction], "{text}");
            assert_eq!(r.config.resources, running.resources, "{text}: the ledger has nothing to take");
        }
        for text in ["maxPods: 20\n", "systemReserved:\n  cpu: 100m\n", "nodewarden:\n  staticPodsCritical: true\n"] {
            let r = edit(text);
            assert_eq!(r.changed, [Section::Resources], "{text}");
            assert_eq!(r.config.eviction, running.eviction, "{text}: the eviction loop has nothing to take");
        }
        // Allocatable subtracts the hard memory.available threshold, so both take it; without pods enforced, the
        // eviction loop's allocatable threshold goes and kubepods' limit with it.
        let r = edit("evictionHard:\n  memory.available: 300Mi\n");
        assert_eq!(r.changed, [Section::Resources, Section::Eviction]);
        assert_eq!(edit("enforceNodeAllocatable: [none]\n").changed, [Section::Resources, Section::Eviction]);
        // The image garbage collector's settings are a section of their own.
        for text in [
            "imageGCHighThresholdPercent: 90\n",
            "imageMinimumGCAge: 5m\n",
            "imageMaximumGCAge: 24h\n",
            "serializeImagePulls: false\n",
        ] {
            assert_eq!(edit(text).changed, [Section::Images], "{text}");
        }
        // A restart-only field changes no section.
        let r = edit("maxOpenFiles: 4096\n");
        assert!(r.changed.is_empty() && r.config == running, "{:?}", r.changed);
    }

    #[test]
    fn every_field_is_live_or_restart_only_and_not_both() {
        let nodewarden = crate::fields::of::<NodewardenSettings>().iter().map(|f| format!("nodewarden.{f}"));
        let all: Vec<String> = crate::fields::of::<KubeletConfiguration>()
            .iter()
            .filter(|f| !["apiVersion", "kind", "nodewarden"].contains(f))
            .map(|f| (*f).to_owned())
            .chain(nodewarden)
            .collect();
        assert!(all.len() > 60 && all.contains(&"nodewarden.rootDir".to_owned()), "{all:?}");
        let restart: Vec<&str> = restart_only().collect();
        for field in &all {
            let (live, restart) = (LIVE.contains(&field.as_str()), restart.contains(&field.as_str()));
            assert!(live != restart, "{field}: live {live}, restart-only {restart}; it must be exactly one");
        }
        for name in LIVE.iter().chain(&restart) {
            assert!(all.iter().any(|f| f == name), "{name} is classified but is no field of the file");
        }
    }

    #[test]
    fn a_restart_only_edit_is_reported_and_the_running_value_kept() {
        let running = parse(HEAD).unwrap();
        for (text, field) in [
            ("maxOpenFiles: 4096\n", "maxOpenFiles"),
            ("localStorageCapacityIsolation: false\n", "localStorageCapacityIsolation"),
            ("nodewarden:\n  pressureEvents: false\n", "nodewarden.pressureEvents"),
        ] {
            let r = reload(&running, &format!("{HEAD}{text}")).unwrap();
            assert_eq!(r.needs_restart, [field], "{text}");
            assert_eq!(r.config, running, "{text}: the running value is kept");
        }
    }

    #[test]
    fn an_invalid_edit_is_refused_with_the_field() {
        let running = parse(HEAD).unwrap();
        for (text, field) in [
            ("evictionHard:\n  memory.available: -5Mi\n", "evictionHard.memory.available"),
            ("evictionHard:\n  nodefs.available: 101%\n", "evictionHard.nodefs.available"),
            ("evictionSoft:\n  memory.typo: 1Gi\n", "evictionSoft.memory.typo"),
            ("evictionHard:\n  pid.available: lots\n", "evictionHard.pid.available"),
        ] {
            match reload(&running, &format!("{HEAD}{text}")) {
                Err(ConfigError::Field { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{text}: {other:?}"),
            }
        }
        assert!(matches!(reload(&running, "evictionHard: [oops"), Err(ConfigError::Syntax(_))));
    }
}
