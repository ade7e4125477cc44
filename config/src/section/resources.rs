//! The resources section: the [`ResourceConfig`] the resource manager takes (the cgroup tree, what is reserved,
//! kubepods' limits, admission), from `cgroupRoot`, `cgroupsPerQOS`, `cgroupDriver`, `enforceNodeAllocatable`,
//! `systemReserved`, `kubeReserved`, `maxPods`, `podPidsLimit`, `cpuCFSQuota`, `cpuCFSQuotaPeriod`,
//! `memoryThrottlingFactor`, the `MemoryQoS` feature gate and `nodewarden.staticPodsCritical`.

use std::time::Duration;

use nodewarden_resources::{
    CgroupDriver, CgroupPath, EvictionReserve, Reserved, ResourceConfig, parse_millicores, parse_non_negative,
};

use super::{duration_field, nodewarden, required};
use crate::{ConfigError, KubeletConfiguration, QuantityMap};

/// Whether `enforceNodeAllocatable` enforces allocatable on pods (kubepods limited to it, and the eviction
/// loop's `allocatableMemory.available`); the values nodewarden accepts but does not enforce are warned about.
pub fn enforces_pods(c: &KubeletConfiguration, warnings: &mut Vec<String>) -> Result<bool, ConfigError> {
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
    Ok(enforce.iter().any(|v| v == "pods"))
}

/// The resources section. What it takes from the other sections comes in: whether pods are enforced
/// ([`enforces_pods`]), the hard eviction thresholds allocatable subtracts (the eviction section's), and whether
/// containers get cgroups of their own (only under the embedded process runtime, the runtime section's).
pub fn validate(
    c: &KubeletConfiguration,
    enforce_pods: bool,
    eviction_reserve: EvictionReserve,
    container_cgroups: bool,
    warnings: &mut Vec<String>,
) -> Result<ResourceConfig, ConfigError> {
    let (cgroup_driver, cgroup_root) = cgroup_root(c)?;
    let system_reserved = reserved("systemReserved", required(&c.system_reserved, "systemReserved")?, warnings)?;
    let kube_reserved = reserved("kubeReserved", required(&c.kube_reserved, "kubeReserved")?, warnings)?;
    let max_pods = *required(&c.max_pods, "maxPods")?;
    let max_pods =
        u32::try_from(max_pods).map_err(|_| ConfigError::field("maxPods", format!("{max_pods} is out of range")))?;
    let pod_pids_limit = match *required(&c.pod_pids_limit, "podPidsLimit")? {
        -1 | 0 => None,
        n if n > 0 => Some(n.unsigned_abs()),
        n => return Err(ConfigError::field("podPidsLimit", format!("{n} is negative (use -1 for no limit)"))),
    };
    let period = duration_field("cpuCFSQuotaPeriod", &c.cpu_cfs_quota_period)?;
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
    Ok(ResourceConfig {
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
        static_pods_critical: *required(&nodewarden(c)?.static_pods_critical, "nodewarden.staticPodsCritical")?,
        container_cgroups,
        cgroup_driver,
    })
}

/// The cgroup driver and the cgroup root as it reads the root: under systemd, `cgroupRoot` names a slice.
fn cgroup_root(c: &KubeletConfiguration) -> Result<(CgroupDriver, CgroupPath), ConfigError> {
    let root_text = required(&c.cgroup_root, "cgroupRoot")?;
    let cgroup_root = CgroupPath::parse(root_text).map_err(|e| ConfigError::field("cgroupRoot", e.to_string()))?;
    if !*required(&c.cgroups_per_qos, "cgroupsPerQOS")? {
        return Err(ConfigError::field(
            "cgroupsPerQOS",
            "false is not supported: nodewarden always creates the kubepods tree",
        ));
    }
    match required(&c.cgroup_driver, "cgroupDriver")?.as_str() {
        "cgroupfs" => Ok((CgroupDriver::Cgroupfs, cgroup_root)),
        // As the kubelet reads it under systemd: `cgroupRoot` names a slice (`/nodewarden` is nodewarden.slice).
        "systemd" => {
            let root = nodewarden_resources::systemd::root_path(&cgroup_root)
                .map_err(|e| ConfigError::field("cgroupRoot", e.to_string()))?;
            Ok((CgroupDriver::Systemd, root))
        }
        other => Err(ConfigError::field("cgroupDriver", format!("must be cgroupfs or systemd, found {other:?}"))),
    }
}

/// `systemReserved` or `kubeReserved` (named `field`); huge page reservations are accepted and warned about.
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

#[cfg(test)]
mod tests {
    use super::super::{HEAD, assert_refused, raw};
    use super::*;
    use crate::parse;

    fn section(c: &KubeletConfiguration) -> Result<ResourceConfig, ConfigError> {
        let mut warnings = Vec::new();
        let pods = enforces_pods(c, &mut warnings)?;
        validate(c, pods, EvictionReserve::default(), true, &mut warnings)
    }

    #[test]
    fn the_kubelets_defaults() {
        let r = section(&raw("")).unwrap();
        assert_eq!((r.max_pods, r.pod_pids_limit, r.cpu_cfs_period_us), (110, None, 100_000));
        assert_eq!((r.cgroup_driver, r.cgroup_root.as_str()), (CgroupDriver::Cgroupfs, "/"));
        assert!(r.enforce_pods && r.cpu_cfs_quota && !r.memory_qos && !r.static_pods_critical);
        assert_eq!(r.memory_throttling_factor, 0.9);
        let r = section(&raw("podPidsLimit: 0\nfeatureGates:\n  MemoryQoS: true\n")).unwrap();
        assert_eq!((r.pod_pids_limit, r.memory_qos), (None, true));
    }

    #[test]
    fn what_is_taken_from_the_other_sections_is_passed_through() {
        let reserve =
            EvictionReserve { memory_available: Some(nodewarden_resources::Amount::Quantity(7)), ..Default::default() };
        let r = validate(&raw(""), false, reserve, false, &mut Vec::new()).unwrap();
        assert_eq!((r.enforce_pods, r.eviction_reserve, r.container_cgroups), (false, reserve, false));
    }

    #[test]
    fn enforcement_other_than_on_pods_is_warned_about_or_refused() {
        let mut warnings = Vec::new();
        assert!(!enforces_pods(&raw("enforceNodeAllocatable: [none]\n"), &mut warnings).unwrap());
        assert!(enforces_pods(&raw("enforceNodeAllocatable: [pods, kube-reserved]\n"), &mut warnings).unwrap());
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("kube-reserved is not enforced"), "{warnings:?}");
        assert_refused(
            section,
            &[
                ("enforceNodeAllocatable: [pods, none]\n", "enforceNodeAllocatable"),
                ("enforceNodeAllocatable: [everything]\n", "enforceNodeAllocatable"),
            ],
        );
    }

    #[test]
    fn reservations_are_parsed_and_huge_pages_warned_about() {
        let mut warnings = Vec::new();
        let c = raw("systemReserved:\n  cpu: 500m\n  hugepages-2Mi: 1Gi\nkubeReserved:\n  ephemeral-storage: 1Gi\n");
        let r = validate(&c, true, EvictionReserve::default(), true, &mut warnings).unwrap();
        assert_eq!(r.system_reserved, Reserved { cpu_millis: 500, ..Reserved::default() });
        assert_eq!(r.kube_reserved, Reserved { ephemeral_storage: 1 << 30, ..Reserved::default() });
        assert_eq!(warnings, ["systemReserved.hugepages-2Mi: huge page reservations are not enforced by nodewarden"]);
    }

    #[test]
    fn invalid_values_name_the_field() {
        assert_refused(
            section,
            &[
                ("maxPods: -1\n", "maxPods"),
                ("systemReserved:\n  memory: lots\n", "systemReserved.memory"),
                ("kubeReserved:\n  gpu: 1\n", "kubeReserved.gpu"),
                ("podPidsLimit: -5\n", "podPidsLimit"),
                ("cgroupRoot: /a/../b\n", "cgroupRoot"),
                ("cgroupsPerQOS: false\n", "cgroupsPerQOS"),
                ("cgroupDriver: lxc\n", "cgroupDriver"),
                ("cgroupDriver: systemd\ncgroupRoot: /a-b.slice\n", "cgroupRoot"),
                ("cpuCFSQuotaPeriod: 5s\n", "cpuCFSQuotaPeriod"),
                ("memoryThrottlingFactor: 1.5\n", "memoryThrottlingFactor"),
                ("memoryThrottlingFactor: 0\n", "memoryThrottlingFactor"),
            ],
        );
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
        assert_eq!(
            (c.resources.cgroup_driver, c.resources.cgroup_root.as_str()),
            (CgroupDriver::Cgroupfs, "/nodewarden")
        );
    }
}
