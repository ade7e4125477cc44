//! The cgroup values of a pod and its containers, computed from its resources and the node configuration. Pure
//! functions: writing them is the ledger's job.

use crate::parse::{CpuMax, Limit};
use crate::qos::{self, ContainerResources, PodResources, QosClass};

/// Node-wide settings that shape the limits.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct LimitSettings {
    /// `podPidsLimit`; `None` for no limit (the kubelet's -1).
    pub pod_pids_limit: Option<u64>,
    /// `cpuCFSQuota`: enforce CPU limits with a CFS quota.
    pub cpu_cfs_quota: bool,
    /// `cpuCFSQuotaPeriod` in microseconds.
    pub cpu_cfs_period_us: u64,
    /// Memory QoS (KEP-2570) on: set `memory.min` from requests and `memory.high` for non-Guaranteed containers.
    pub memory_qos: bool,
    /// `memoryThrottlingFactor`.
    pub memory_throttling_factor: f64,
    /// Node memory capacity, for `oom_score_adj`.
    pub memory_capacity: u64,
    /// Enforced allocatable memory, the throttling base for containers without a memory limit.
    pub allocatable_memory: u64,
}

/// The values written to one cgroup.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CgroupLimits {
    /// `memory.max`.
    pub memory_max: Limit,
    /// `memory.min`, written only with Memory QoS.
    pub memory_min: Option<u64>,
    /// `memory.high`, written only with Memory QoS.
    pub memory_high: Option<Limit>,
    /// `pids.max`.
    pub pids_max: Limit,
    /// `cpu.weight`.
    pub cpu_weight: u64,
    /// `cpu.max`.
    pub cpu_max: CpuMax,
}

fn quota(millis: Option<u64>, s: &LimitSettings) -> CpuMax {
    let quota = millis.filter(|_| s.cpu_cfs_quota).map(|m| qos::cpu_quota(m, s.cpu_cfs_period_us));
    CpuMax { quota, period: s.cpu_cfs_period_us }
}

/// A limit in bytes or a count; a total that saturated at `u64::MAX` is no limit at all.
fn limit(v: Option<u64>) -> Limit {
    v.filter(|v| *v != u64::MAX).map_or(Limit::Max, Limit::Value)
}

/// The pod-level cgroup's values (the kubelet's pod resource config).
pub fn pod_limits(r: &PodResources, qos: QosClass, s: &LimitSettings) -> CgroupLimits {
    let shares = if qos == QosClass::BestEffort { qos::MIN_SHARES } else { qos::cpu_shares(r.cpu_request()) };
    let memory_min = (s.memory_qos && qos != QosClass::BestEffort).then(|| r.memory_request()).filter(|m| *m > 0);
    CgroupLimits {
        memory_max: limit(r.memory_limit()),
        memory_min,
        memory_high: None,
        pids_max: limit(s.pod_pids_limit),
        cpu_weight: qos::shares_to_weight(shares),
        cpu_max: quota(r.cpu_limit(), s),
    }
}

/// A container cgroup's values.
pub fn container_limits(c: &ContainerResources, qos: QosClass, s: &LimitSettings) -> CgroupLimits {
    let request = c.memory_request.unwrap_or(0);
    let (memory_min, memory_high) = if s.memory_qos && qos != QosClass::Guaranteed {
        let base = c.memory_limit.unwrap_or(s.allocatable_memory);
        let high = qos::memory_high(request, base, s.memory_throttling_factor).map_or(Limit::Max, Limit::Value);
        ((request > 0).then_some(request), Some(high))
    } else {
        (None, None)
    };
    CgroupLimits {
        memory_max: limit(c.memory_limit),
        memory_min,
        memory_high,
        pids_max: Limit::Max,
        cpu_weight: qos::shares_to_weight(qos::cpu_shares(c.cpu_request.unwrap_or(0))),
        cpu_max: quota(c.cpu_limit, s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn settings() -> LimitSettings {
        LimitSettings {
            pod_pids_limit: Some(1024),
            cpu_cfs_quota: true,
            cpu_cfs_period_us: 100_000,
            memory_qos: true,
            memory_throttling_factor: 0.9,
            memory_capacity: 1024 * MIB,
            allocatable_memory: 1000 * MIB,
        }
    }

    fn cr(name: &str, cpu: (Option<u64>, Option<u64>), mem: (Option<u64>, Option<u64>)) -> ContainerResources {
        ContainerResources {
            name: name.into(),
            cpu_request: cpu.0,
            cpu_limit: cpu.1,
            memory_request: mem.0,
            memory_limit: mem.1,
            ephemeral_storage_request: None,
        }
    }

    #[test]
    fn memory_limits_whose_sum_overflows_are_no_limit_not_zero() {
        let huge = Some(1u64 << 63);
        let r = PodResources {
            app: vec![cr("a", (None, None), (huge, huge)), cr("b", (None, None), (huge, huge))],
            ..PodResources::default()
        };
        assert_eq!(r.memory_limit(), Some(u64::MAX));
        assert_eq!(r.memory_request(), u64::MAX);
        let p = pod_limits(&r, r.qos_class(), &settings());
        assert_eq!(p.memory_max, Limit::Max);
        assert_eq!(p.memory_min, Some(u64::MAX));
        // One container's own limit is still written as given.
        assert_eq!(container_limits(&r.app[0], r.qos_class(), &settings()).memory_max, Limit::Value(1 << 63));
    }

    #[test]
    fn guaranteed_pod() {
        let r = PodResources {
            app: vec![cr("a", (Some(500), Some(500)), (Some(128 * MIB), Some(128 * MIB)))],
            ..Default::default()
        };
        let p = pod_limits(&r, QosClass::Guaranteed, &settings());
        assert_eq!(p.memory_max, Limit::Value(128 * MIB));
        assert_eq!(p.cpu_max, CpuMax { quota: Some(50_000), period: 100_000 });
        assert_eq!(p.cpu_weight, qos::shares_to_weight(512));
        assert_eq!(p.pids_max, Limit::Value(1024));
        assert_eq!(p.memory_min, Some(128 * MIB));
        let c = container_limits(&r.app[0], QosClass::Guaranteed, &settings());
        assert_eq!(c.memory_high, None, "Guaranteed containers are not throttled");
        assert_eq!(c.memory_min, None);
        assert_eq!(c.memory_max, Limit::Value(128 * MIB));
    }

    #[test]
    fn burstable_and_best_effort() {
        let r = PodResources {
            app: vec![cr("a", (Some(100), None), (Some(100 * MIB), Some(200 * MIB)))],
            ..Default::default()
        };
        let p = pod_limits(&r, QosClass::Burstable, &settings());
        assert_eq!(p.cpu_max.quota, None);
        assert_eq!(p.memory_max, Limit::Value(200 * MIB));
        let c = container_limits(&r.app[0], QosClass::Burstable, &settings());
        assert_eq!(c.memory_high, Some(Limit::Value(190 * MIB)));
        assert_eq!(c.memory_min, Some(100 * MIB));

        let be = PodResources { app: vec![cr("b", (None, None), (None, None))], ..Default::default() };
        let p = pod_limits(&be, QosClass::BestEffort, &settings());
        assert_eq!(p.cpu_weight, 1);
        assert_eq!(p.memory_max, Limit::Max);
        assert_eq!(p.memory_min, None);
        let c = container_limits(&be.app[0], QosClass::BestEffort, &settings());
        // Without a limit, memory.high throttles at 90% of allocatable.
        let expect = (1000 * MIB * 9 / 10) / qos::PAGE_SIZE * qos::PAGE_SIZE;
        assert_eq!(c.memory_high, Some(Limit::Value(expect)));
    }

    #[test]
    fn settings_switch_features_off() {
        let s = LimitSettings { memory_qos: false, cpu_cfs_quota: false, pod_pids_limit: None, ..settings() };
        let r = PodResources {
            app: vec![cr("a", (Some(100), Some(200)), (Some(MIB), Some(2 * MIB)))],
            ..Default::default()
        };
        let p = pod_limits(&r, QosClass::Burstable, &s);
        assert_eq!((p.cpu_max.quota, p.memory_min, p.pids_max), (None, None, Limit::Max));
        let c = container_limits(&r.app[0], QosClass::Burstable, &s);
        assert_eq!((c.memory_min, c.memory_high), (None, None));
    }
}
