use std::path::PathBuf;
use std::time::Duration;

use nodewarden_eviction::Signal;
use nodewarden_resources::{Amount, CgroupDriver, CgroupPath, Reserved};

use super::*;

use crate::section::HEAD;

/// A kubelet config as kubeadm writes it, with a few eviction settings added.
pub(crate) const KUBEADM: &str = r#"apiVersion: kubelet.config.k8s.io/v1beta1
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

pub(crate) fn field_error(yaml: &str) -> (String, String) {
    match parse(yaml) {
        Err(ConfigError::Field { field, reason }) => (field, reason),
        other => panic!("expected a field error for\n{yaml}\ngot {other:?}"),
    }
}

#[test]
fn minimal_config_gets_kubelet_defaults() {
    let c = parse(HEAD).unwrap();
    assert_eq!(c.endpoints.healthz, Some("127.0.0.1:10248".parse().unwrap()));
    assert_eq!(c.resources.max_pods, 110);
    assert_eq!(c.host.max_open_files, 1_000_000);
    assert_eq!(c.pods.log_rotation, nodewarden_sync::LogRotation::default());
    assert_eq!((c.pods.log_rotation.max_size, c.pods.log_rotation.max_files), (10 << 20, 5));
    assert_eq!(c.resources.pod_pids_limit, None);
    assert_eq!(c.resources.cgroup_root.as_str(), "/");
    assert!(c.resources.enforce_pods);
    assert!(!c.resources.memory_qos, "off by default, as in the kubelet");
    assert_eq!(c.resources.cpu_cfs_period_us, 100_000);
    assert_eq!(c.eviction.pressure_transition_period, Duration::from_secs(300));
    // The kubelet's five, and allocatableMemory.available derived from memory.available (pods are enforced).
    assert_eq!(c.eviction.thresholds.hard.len(), 6);
    assert_eq!(c.resources.eviction_reserve.memory_available, Some(Amount::Quantity(100 << 20)));
    assert_eq!(c.pods.static_pod_path, None);
    assert_eq!(c.runtime.endpoint, None);
    assert_eq!(c.host.cgroup_mount, PathBuf::from("/sys/fs/cgroup"));
    assert_eq!(c.eviction.realtime_priority, 1);
    assert!(c.ignored.is_empty() && c.warnings.is_empty());
    let off = parse(&format!("{HEAD}nodewarden:\n  evictionRealtimePriority: 0\n")).unwrap();
    assert_eq!(off.eviction.realtime_priority, 0);
}

#[test]
fn a_real_kubelet_config_loads() {
    let c = parse(KUBEADM).unwrap();
    for f in ["authentication", "authorization", "clusterDNS", "logging", "rotateCertificates"] {
        assert!(c.ignored.iter().any(|i| i == f), "{f} not reported as ignored: {:?}", c.ignored);
    }
    // kubeadm's `memorySwap: {}` is the default: no swap for pods, and a node with swap refused.
    assert!(c.host.fail_swap_on);
    assert_eq!(c.effective.memory_swap.as_ref().and_then(|s| s.swap_behavior.as_deref()), Some("NoSwap"));
    // kubeadm's driver, with its default root: the kubelet's kubepods.slice.
    assert_eq!(c.resources.cgroup_driver, CgroupDriver::Systemd);
    assert_eq!(c.resources.cgroup_root, CgroupPath::root());
    assert_eq!(c.pods.static_pod_path, Some(PathBuf::from("/etc/kubernetes/manifests")));
    assert_eq!(
        c.resources.system_reserved,
        Reserved { cpu_millis: 500, memory: 512 << 20, pids: 1000, ephemeral_storage: 0 }
    );
    // A given evictionHard replaces the defaults, as in the kubelet.
    let signals: Vec<Signal> = c.eviction.thresholds.hard.iter().map(|t| t.signal).collect();
    assert_eq!(signals, [Signal::MemoryAvailable, Signal::NodeFsAvailable, Signal::AllocatableMemoryAvailable]);
    assert_eq!(c.eviction.pressure_transition_period, Duration::ZERO);
    assert_eq!(c.runtime.endpoint.as_deref(), Some("unix:///run/containerd/containerd.sock"));
    assert_eq!(c.runtime.request_timeout, Duration::from_secs(120), "0s is the kubelet's default");
    assert_eq!(c.images.parallel_pulls, Some(1), "serializeImagePulls: one pull at a time");
}

#[test]
fn merge_default_eviction_settings_keeps_the_other_defaults() {
    let c =
        parse(&format!("{HEAD}mergeDefaultEvictionSettings: true\nevictionHard:\n  memory.available: 1Gi\n")).unwrap();
    assert_eq!(c.eviction.thresholds.hard.len(), 6);
    assert_eq!(
        c.eviction.thresholds.hard_for(Signal::MemoryAvailable).map(|t| t.amount),
        Some(Amount::Quantity(1 << 30))
    );
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
    assert_eq!(again.eviction.thresholds, c.eviction.thresholds);
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
fn a_config_reloads_unchanged_and_prints_as_a_file_that_loads_as_itself() {
    let shipped = include_str!("../../deploy/config.yaml");
    for text in [KUBEADM, shipped, HEAD] {
        let c = parse(text).unwrap();
        let r = reload(&c, text).unwrap();
        assert!(r.needs_restart.is_empty() && r.changed.is_empty(), "{:?} {:?}", r.needs_restart, r.changed);
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
