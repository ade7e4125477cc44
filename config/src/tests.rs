use super::*;
use nodewarden_eviction::Signal;
use nodewarden_resources::Amount;

const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

/// A kubelet config as kubeadm writes it, with a few eviction settings added.
const KUBEADM: &str = r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: systemd
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cpuManagerReconcilePeriod: 0s
evictionPressureTransitionPeriod: 0s
fileCheckFrequency: 0s
healthzBindAddress: 127.0.0.1
healthzPort: 10248
httpCheckFrequency: 0s
imageMinimumGCAge: 0s
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
  verbosity: 0
memorySwap: {}
nodeStatusReportFrequency: 0s
nodeStatusUpdateFrequency: 0s
rotateCertificates: true
runtimeRequestTimeout: 0s
shutdownGracePeriod: 0s
shutdownGracePeriodCriticalPods: 0s
staticPodPath: /etc/kubernetes/manifests
streamingConnectionIdleTimeout: 0s
syncFrequency: 0s
volumeStatsAggPeriod: 0s
systemReserved:
  cpu: 500m
  memory: 512Mi
  pid: 1000
evictionHard:
  memory.available: 200Mi
  nodefs.available: "5%"
"#;

fn field_error(yaml: &str) -> (String, String) {
    match parse(yaml) {
        Err(ConfigError::Field { field, reason }) => (field, reason),
        other => panic!("expected a field error for\n{yaml}\ngot {other:?}"),
    }
}

#[test]
fn minimal_config_gets_kubelet_defaults() {
    let c = parse(HEAD).unwrap();
    assert_eq!(c.healthz, Some("127.0.0.1:10248".parse().unwrap()));
    assert_eq!(c.resources.max_pods, 110);
    assert_eq!(c.max_open_files, 1_000_000);
    assert_eq!(c.log_rotation, nodewarden_sync::LogRotation::default());
    assert_eq!((c.log_rotation.max_size, c.log_rotation.max_files), (10 << 20, 5));
    assert_eq!(c.resources.pod_pids_limit, None);
    assert_eq!(c.resources.cgroup_root.as_str(), "/");
    assert!(c.resources.enforce_pods);
    assert!(!c.resources.memory_qos, "off by default, as in the kubelet");
    assert_eq!(c.resources.cpu_cfs_period_us, 100_000);
    assert_eq!(c.pressure_transition_period, Duration::from_secs(300));
    // The kubelet's five, and allocatableMemory.available derived from memory.available (pods are enforced).
    assert_eq!(c.thresholds.hard.len(), 6);
    assert_eq!(c.resources.eviction_reserve.memory_available, Some(Amount::Quantity(100 << 20)));
    assert_eq!(c.static_pod_path, None);
    assert_eq!(c.container_runtime_endpoint, None);
    assert_eq!(c.cgroup_mount, PathBuf::from("/sys/fs/cgroup"));
    assert_eq!(c.eviction_realtime_priority, 1);
    assert!(c.ignored.is_empty() && c.warnings.is_empty());
    let off = parse(&format!("{HEAD}nodewarden:\n  evictionRealtimePriority: 0\n")).unwrap();
    assert_eq!(off.eviction_realtime_priority, 0);
}

#[test]
fn shutdown_grace_periods_become_the_kubelets_priority_groups() {
    assert!(parse(HEAD).unwrap().shutdown_groups.is_empty(), "off by default");
    let c = parse(&format!("{HEAD}shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\n")).unwrap();
    assert_eq!(c.shutdown_groups, [(0, Duration::from_secs(20)), (2_000_000_000, Duration::from_secs(10))]);
    let c = parse(&format!(
        "{HEAD}shutdownGracePeriodByPodPriority:\n- {{priority: 100000, shutdownGracePeriodSeconds: 5}}\n\
         - {{priority: 0, shutdownGracePeriodSeconds: 3}}\n"
    ))
    .unwrap();
    assert_eq!(c.shutdown_groups, [(0, Duration::from_secs(3)), (100_000, Duration::from_secs(5))], "sorted");
    for (text, field) in [
        ("shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 20s\n", "shutdownGracePeriodCriticalPods"),
        (
            "shutdownGracePeriod: 10s\nshutdownGracePeriodByPodPriority:\n- {priority: 0, shutdownGracePeriodSeconds: 3}\n",
            "shutdownGracePeriodByPodPriority",
        ),
    ] {
        let (f, reason) = field_error(&format!("{HEAD}{text}"));
        assert_eq!(f, field, "{text}: {reason}");
    }
}

#[test]
fn node_status_and_registration_fields_follow_the_kubelet() {
    let c = parse(HEAD).unwrap();
    assert_eq!(c.node_status_update_frequency, Duration::from_secs(10));
    assert_eq!(c.node_status_report_frequency, Duration::from_secs(300));
    assert_eq!(c.node_lease_duration, Duration::from_secs(40));
    assert!(c.register_node);
    assert_eq!((c.kube_api_qps, c.kube_api_burst), (50.0, 100));
    assert_eq!(c.node_status_max_images, Some(50));
    assert_eq!(parse(&format!("{HEAD}nodeStatusMaxImages: -1\n")).unwrap().node_status_max_images, None);
    assert_eq!(parse(&format!("{HEAD}nodeStatusMaxImages: 0\n")).unwrap().node_status_max_images, Some(0));
    // Only the update frequency given: the report frequency follows it.
    let c = parse(&format!("{HEAD}nodeStatusUpdateFrequency: 4s\n")).unwrap();
    assert_eq!(c.node_status_report_frequency, Duration::from_secs(4));
    let c = parse(&format!("{HEAD}nodeStatusUpdateFrequency: 4s\nnodeStatusReportFrequency: 1m\n")).unwrap();
    assert_eq!(c.node_status_report_frequency, Duration::from_secs(60));
    // kubeadm's zeros mean the defaults.
    let c = parse(KUBEADM).unwrap();
    assert_eq!(
        (c.node_status_update_frequency, c.node_status_report_frequency),
        (Duration::from_secs(10), Duration::from_secs(300))
    );
    let c = parse(&format!(
        "{HEAD}nodeLabels:\n  example.com/rack: r1\nregisterWithTaints:\n- {{key: dedicated, value: infra, effect: NoSchedule}}\nproviderID: x://1\n"
    ))
    .unwrap();
    assert_eq!(c.node_labels.get("example.com/rack").map(String::as_str), Some("r1"));
    assert_eq!(c.register_with_taints[0].key, "dedicated");
    assert_eq!(c.provider_id.as_deref(), Some("x://1"));
    for (text, field) in [
        ("nodeLabels:\n  node-role.kubernetes.io/worker: \"\"\n", "nodeLabels.node-role.kubernetes.io/worker"),
        ("nodeLabels:\n  example.com/x: -bad\n", "nodeLabels.example.com/x"),
        ("registerWithTaints:\n- {key: a, effect: Sometimes}\n", "registerWithTaints[0].effect"),
        ("nodeLeaseDurationSeconds: -1\n", "nodeLeaseDurationSeconds"),
        ("kubeAPIQPS: -5\n", "kubeAPIQPS"),
        ("nodeStatusMaxImages: -2\n", "nodeStatusMaxImages"),
    ] {
        let (f, reason) = field_error(&format!("{HEAD}{text}"));
        assert_eq!(f, field, "{text}: {reason}");
    }
    let (_, reason) = field_error(&format!("{HEAD}nodeLabels:\n  node-role.kubernetes.io/worker: \"\"\n"));
    assert!(reason.contains("NodeRestriction"), "{reason}");
}

#[test]
fn a_non_loopback_healthz_address_is_warned_about() {
    let c = parse(&format!("{HEAD}healthzBindAddress: 0.0.0.0\n")).unwrap();
    assert!(c.warnings.iter().any(|w| w.contains("not a loopback address")), "{:?}", c.warnings);
    let c = parse(&format!("{HEAD}healthzBindAddress: 0.0.0.0\nhealthzPort: 0\n")).unwrap();
    assert!(c.warnings.is_empty(), "nothing is served: {:?}", c.warnings);
    assert!(parse(&format!("{HEAD}healthzBindAddress: \"::1\"\n")).unwrap().warnings.is_empty());
}

#[test]
fn a_real_kubelet_config_loads() {
    let c = parse(KUBEADM).unwrap();
    for f in ["authentication", "authorization", "clusterDNS", "logging", "rotateCertificates"] {
        assert!(c.ignored.iter().any(|i| i == f), "{f} not reported as ignored: {:?}", c.ignored);
    }
    // kubeadm's `memorySwap: {}` is the default: no swap for pods, and a node with swap refused.
    assert!(c.fail_swap_on);
    assert_eq!(c.effective.memory_swap.as_ref().and_then(|s| s.swap_behavior.as_deref()), Some("NoSwap"));
    // kubeadm's driver, with its default root: the kubelet's kubepods.slice.
    assert_eq!(c.resources.cgroup_driver, CgroupDriver::Systemd);
    assert_eq!(c.resources.cgroup_root, CgroupPath::root());
    assert_eq!(c.static_pod_path, Some(PathBuf::from("/etc/kubernetes/manifests")));
    assert_eq!(
        c.resources.system_reserved,
        Reserved { cpu_millis: 500, memory: 512 << 20, pids: 1000, ephemeral_storage: 0 }
    );
    // A given evictionHard replaces the defaults, as in the kubelet.
    let signals: Vec<Signal> = c.thresholds.hard.iter().map(|t| t.signal).collect();
    assert_eq!(signals, [Signal::MemoryAvailable, Signal::NodeFsAvailable, Signal::AllocatableMemoryAvailable]);
    assert_eq!(c.pressure_transition_period, Duration::ZERO);
    assert_eq!(c.container_runtime_endpoint.as_deref(), Some("unix:///run/containerd/containerd.sock"));
    assert_eq!(c.runtime_request_timeout, Duration::from_secs(120), "0s is the kubelet's default");
    assert!(c.serialize_image_pulls);
}

#[test]
fn merge_default_eviction_settings_keeps_the_other_defaults() {
    let c =
        parse(&format!("{HEAD}mergeDefaultEvictionSettings: true\nevictionHard:\n  memory.available: 1Gi\n")).unwrap();
    assert_eq!(c.thresholds.hard.len(), 6);
    assert_eq!(c.thresholds.hard_for(Signal::MemoryAvailable).map(|t| t.amount), Some(Amount::Quantity(1 << 30)));
}

#[test]
fn misspelled_fields_are_errors_with_a_suggestion() {
    let (field, reason) = field_error(&format!("{HEAD}evictonHard:\n  memory.available: 1Gi\n"));
    assert_eq!(field, "evictonHard");
    assert!(reason.contains("did you mean evictionHard?"), "{reason}");
    let (field, reason) = field_error(&format!("{HEAD}nodewarden:\n  cgroupMont: /x\n"));
    assert_eq!(field, "nodewarden.cgroupMont");
    assert!(reason.contains("cgroupMount"), "{reason}");
}

#[test]
fn invalid_values_name_the_field() {
    let cases: &[(&str, &str)] = &[
        ("evictionHard:\n  memory.available: -1Mi\n", "evictionHard.memory.available"),
        ("evictionHard:\n  nodefs.available: 110%\n", "evictionHard.nodefs.available"),
        ("evictionHard:\n  memory.availble: 1Mi\n", "evictionHard.memory.availble"),
        ("evictionSoft:\n  memory.available: 1Gi\n", "evictionSoftGracePeriod.memory.available"),
        ("evictionSoftGracePeriod:\n  memory.available: soon\n", "evictionSoftGracePeriod.memory.available"),
        ("maxPods: -1\n", "maxPods"),
        ("maxOpenFiles: 0\n", "maxOpenFiles"),
        ("containerLogMaxSize: 0\n", "containerLogMaxSize"),
        ("containerLogMaxSize: lots\n", "containerLogMaxSize"),
        ("containerLogMaxFiles: 1\n", "containerLogMaxFiles"),
        ("containerLogMonitorInterval: 10ms\n", "containerLogMonitorInterval"),
        ("maxPods: many\n", "maxPods"),
        ("healthzPort: 70000\n", "healthzPort"),
        ("healthzBindAddress: localhost\n", "healthzBindAddress"),
        ("systemReserved:\n  memory: lots\n", "systemReserved.memory"),
        ("kubeReserved:\n  gpu: 1\n", "kubeReserved.gpu"),
        ("podPidsLimit: -5\n", "podPidsLimit"),
        ("cgroupRoot: /a/../b\n", "cgroupRoot"),
        ("cgroupDriver: lxc\n", "cgroupDriver"),
        ("cpuCFSQuotaPeriod: 5s\n", "cpuCFSQuotaPeriod"),
        ("memoryThrottlingFactor: 1.5\n", "memoryThrottlingFactor"),
        ("enforceNodeAllocatable: [pods, none]\n", "enforceNodeAllocatable"),
        ("imageGCLowThresholdPercent: 90\n", "imageGCLowThresholdPercent"),
        ("containerRuntimeEndpoint: tcp://1.2.3.4:1\n", "containerRuntimeEndpoint"),
        ("evictionMaxPodGracePeriod: -3\n", "evictionMaxPodGracePeriod"),
        ("nodewarden:\n  housekeepingInterval: 1us\n", "nodewarden.housekeepingInterval"),
        ("nodewarden:\n  evictionRealtimePriority: 100\n", "nodewarden.evictionRealtimePriority"),
        ("nodewarden:\n  evictionRealtimePriority: -1\n", "nodewarden.evictionRealtimePriority"),
    ];
    for (body, want) in cases {
        let (field, reason) = field_error(&format!("{HEAD}{body}"));
        assert_eq!(&field, want, "for {body:?}: {reason}");
    }
}

#[test]
fn wrong_document_kind_and_syntax() {
    assert_eq!(field_error("apiVersion: v1\nkind: Pod\n").0, "apiVersion");
    assert_eq!(field_error("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: Pod\n").0, "kind");
    assert!(matches!(parse("apiVersion: [unclosed\n"), Err(ConfigError::Syntax(_))));
    assert!(matches!(parse("- a list\n"), Err(ConfigError::Syntax(_))));
}

#[test]
fn effective_config_round_trips() {
    let c = parse(KUBEADM).unwrap();
    let again = parse(&c.to_yaml()).unwrap();
    assert_eq!(again.resources, c.resources);
    assert_eq!(again.thresholds, c.thresholds);
    assert!(again.ignored.is_empty());
}

#[test]
fn oversized_files_are_refused_before_parsing() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("big.yaml");
    std::fs::write(&p, vec![b'#'; usize::try_from(MAX_CONFIG_BYTES + 1).unwrap()]).unwrap();
    assert!(matches!(load(&p), Err(ConfigError::Read { .. })));
    assert!(matches!(load(&dir.path().join("missing.yaml")), Err(ConfigError::Read { .. })));
}

#[test]
fn under_the_systemd_driver_the_cgroup_root_names_a_slice() {
    let root = |extra: &str| {
        parse(&format!("{HEAD}cgroupDriver: systemd\n{extra}")).map(|c| c.resources.cgroup_root.as_str().to_owned())
    };
    assert_eq!(root("cgroupRoot: /nodewarden\n").unwrap(), "/nodewarden.slice");
    assert_eq!(root("cgroupRoot: /my-root\n").unwrap(), "/my_root.slice");
    assert_eq!(root("cgroupRoot: /a.slice/a-b.slice\n").unwrap(), "/a.slice/a-b.slice");
    let err = root("cgroupRoot: /a-b.slice\n").unwrap_err().to_string();
    assert!(err.contains("cgroupRoot"), "{err}");
    let c = parse(&format!("{HEAD}cgroupRoot: /nodewarden\n")).unwrap();
    assert_eq!((c.resources.cgroup_driver, c.resources.cgroup_root.as_str()), (CgroupDriver::Cgroupfs, "/nodewarden"));
}

#[test]
fn a_config_reloads_unchanged_and_prints_as_a_file_that_loads_as_itself() {
    let shipped = include_str!("../../deploy/config.yaml");
    for text in [KUBEADM, shipped, HEAD] {
        let c = parse(text).unwrap();
        let r = reload(&c, text).unwrap();
        assert!(r.needs_restart.is_empty(), "{:?}", r.needs_restart);
        assert!(r.config == c, "a reload of the same text changed the config");
        let printed = c.to_yaml();
        let again = parse(&printed).unwrap_or_else(|e| panic!("the printed config does not load: {e}\n{printed}"));
        // The printed form holds the implemented fields only: the ignored ones, and what was said of them, go.
        let again = Config { ignored: c.ignored.clone(), warnings: c.warnings.clone(), ..again };
        if again != c {
            let (a, b) = (format!("{c:#?}"), format!("{again:#?}"));
            let diff: Vec<(&str, &str)> = a.lines().zip(b.lines()).filter(|(x, y)| x != y).collect();
            panic!("the printed config loads as another config: {diff:#?}\n{printed}");
        }
    }
}

#[test]
fn swap_settings_are_the_kubelets() {
    let c = parse(&format!("{HEAD}failSwapOn: false\nmemorySwap:\n  swapBehavior: LimitedSwap\n")).unwrap();
    assert!(!c.fail_swap_on);
    assert!(c.warnings.iter().any(|w| w.contains("LimitedSwap is not implemented")), "{:?}", c.warnings);
    let err = parse(&format!("{HEAD}memorySwap:\n  swapBehavior: Unlimited\n")).unwrap_err();
    assert!(err.to_string().contains("memorySwap.swapBehavior"), "{err}");
    assert!(parse(&format!("{HEAD}memorySwap:\n  swapLimit: 1\n")).is_err(), "not a memorySwap field");
}
