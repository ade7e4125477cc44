//! Quality of service: a pod's QoS class and the cgroup values the kubelet derives from requests and limits
//! (cpu shares and their cgroup v2 weight, CFS quota, `memory.max`, Memory QoS' `memory.min`/`memory.high`, and
//! `oom_score_adj`).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

use crate::error::NameError;
use crate::names::validate_container_name;
use crate::quantity::{QuantityError, parse_millicores, parse_non_negative};

/// The kubelet's QoS classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum QosClass {
    /// Every container has equal cpu and memory requests and limits.
    Guaranteed,
    /// Some requests or limits, but not Guaranteed.
    Burstable,
    /// No cpu or memory requests or limits at all.
    BestEffort,
}

impl QosClass {
    /// The name as Kubernetes writes it in `status.qosClass`.
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }

    /// The QoS-level cgroup below `kubepods`, or `None` for Guaranteed pods, which sit directly in `kubepods`.
    pub fn cgroup_name(self) -> Option<&'static str> {
        match self {
            QosClass::Guaranteed => None,
            QosClass::Burstable => Some("burstable"),
            QosClass::BestEffort => Some("besteffort"),
        }
    }
}

impl std::fmt::Display for QosClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a pod spec cannot be accounted for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodSpecError {
    /// The pod has no spec.
    #[error("pod has no spec")]
    NoSpec,
    /// The pod has no containers.
    #[error("pod has no containers")]
    NoContainers,
    /// A container name is not usable.
    #[error(transparent)]
    Name(#[from] NameError),
    /// Two containers share a name.
    #[error("container name {0:?} is used twice")]
    DuplicateContainer(String),
    /// A resource quantity is invalid.
    #[error("container {container:?}: {field}: {error}")]
    Quantity {
        /// The container.
        container: String,
        /// The field, such as `resources.limits.memory`.
        field: String,
        /// What was wrong.
        error: QuantityError,
    },
}

/// The cpu and memory requests and limits of one container, with requests defaulted from limits as the API
/// server does.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ContainerResources {
    /// The container name.
    pub name: String,
    /// CPU request in millicores.
    pub cpu_request: Option<u64>,
    /// CPU limit in millicores.
    pub cpu_limit: Option<u64>,
    /// Memory request in bytes.
    pub memory_request: Option<u64>,
    /// Memory limit in bytes.
    pub memory_limit: Option<u64>,
    /// Ephemeral-storage request in bytes.
    pub ephemeral_storage_request: Option<u64>,
}

impl ContainerResources {
    fn from_container(c: &Container) -> Result<Self, PodSpecError> {
        validate_container_name(&c.name)?;
        let res = c.resources.as_ref();
        let requests = res.and_then(|r| r.requests.as_ref());
        let limits = res.and_then(|r| r.limits.as_ref());
        // One quantity of `resources.<kind>.<key>`; cpu in millicores, memory in bytes.
        let get = |kind: &str, map: Option<&BTreeMap<String, K8sQuantity>>, key: &str| {
            let Some(K8sQuantity(s)) = map.and_then(|m| m.get(key)) else { return Ok(None) };
            let parsed = if key == "cpu" { parse_millicores(s) } else { parse_non_negative(s) };
            parsed.map(Some).map_err(|error| PodSpecError::Quantity {
                container: c.name.clone(),
                field: format!("resources.{kind}.{key}"),
                error,
            })
        };
        let cpu_limit = get("limits", limits, "cpu")?;
        let memory_limit = get("limits", limits, "memory")?;
        let ephemeral_limit = get("limits", limits, "ephemeral-storage")?;
        Ok(Self {
            name: c.name.clone(),
            cpu_request: get("requests", requests, "cpu")?.or(cpu_limit),
            cpu_limit,
            memory_request: get("requests", requests, "memory")?.or(memory_limit),
            memory_limit,
            ephemeral_storage_request: get("requests", requests, "ephemeral-storage")?.or(ephemeral_limit),
        })
    }
}

/// The resources of a pod's containers, from which its QoS class and pod-level cgroup values follow.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct PodResources {
    /// Regular init containers, in order.
    pub init: Vec<ContainerResources>,
    /// Sidecars: init containers with `restartPolicy: Always`, which keep running beside the app containers.
    pub sidecars: Vec<(usize, ContainerResources)>,
    /// App containers.
    pub app: Vec<ContainerResources>,
}

/// A `sum`-and-`max` view of one resource across a pod's containers. Sums saturate: limits whose sum would
/// overflow `u64` give `u64::MAX` (no limit a kernel could enforce), never a wrapped, tiny value.
fn pod_total(p: &PodResources, get: impl Fn(&ContainerResources) -> Option<u64>) -> u64 {
    let sum = |a: u64, b: u64| a.saturating_add(b);
    let sum_app = p.app.iter().chain(p.sidecars.iter().map(|(_, c)| c)).map(|c| get(c).unwrap_or(0)).fold(0, sum);
    // A regular init container runs beside the sidecars started before it.
    let init_peak = p
        .init
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let before = p.sidecars.iter().filter(|(pos, _)| *pos < i).map(|(_, s)| get(s).unwrap_or(0)).fold(0, sum);
            get(c).unwrap_or(0).saturating_add(before)
        })
        .max()
        .unwrap_or(0);
    sum_app.max(init_peak)
}

impl PodResources {
    /// Extracts the resources of a pod, validating container names and quantities.
    pub fn from_pod(pod: &Pod) -> Result<Self, PodSpecError> {
        let spec = pod.spec.as_ref().ok_or(PodSpecError::NoSpec)?;
        if spec.containers.is_empty() {
            return Err(PodSpecError::NoContainers);
        }
        let mut seen = BTreeSet::new();
        let mut out = PodResources::default();
        let mut regular_init = 0usize;
        for c in spec.init_containers.iter().flatten() {
            if !seen.insert(c.name.clone()) {
                return Err(PodSpecError::DuplicateContainer(c.name.clone()));
            }
            let r = ContainerResources::from_container(c)?;
            if c.restart_policy.as_deref() == Some("Always") {
                out.sidecars.push((regular_init, r));
            } else {
                out.init.push(r);
                regular_init += 1;
            }
        }
        for c in &spec.containers {
            if !seen.insert(c.name.clone()) {
                return Err(PodSpecError::DuplicateContainer(c.name.clone()));
            }
            out.app.push(ContainerResources::from_container(c)?);
        }
        Ok(out)
    }

    fn all(&self) -> impl Iterator<Item = &ContainerResources> {
        self.init.iter().chain(self.sidecars.iter().map(|(_, c)| c)).chain(self.app.iter())
    }

    /// The QoS class, by the kubelet's rules over init and app containers.
    pub fn qos_class(&self) -> QosClass {
        let (mut req_cpu, mut req_mem, mut lim_cpu, mut lim_mem) = (0u64, 0u64, 0u64, 0u64);
        let (mut has_req_cpu, mut has_req_mem, mut has_lim_cpu, mut has_lim_mem) = (false, false, false, false);
        let mut guaranteed = true;
        for c in self.all() {
            if let Some(v) = c.cpu_request.filter(|v| *v > 0) {
                req_cpu = req_cpu.saturating_add(v);
                has_req_cpu = true;
            }
            if let Some(v) = c.memory_request.filter(|v| *v > 0) {
                req_mem = req_mem.saturating_add(v);
                has_req_mem = true;
            }
            let cpu_lim = c.cpu_limit.filter(|v| *v > 0);
            let mem_lim = c.memory_limit.filter(|v| *v > 0);
            if let Some(v) = cpu_lim {
                lim_cpu = lim_cpu.saturating_add(v);
                has_lim_cpu = true;
            }
            if let Some(v) = mem_lim {
                lim_mem = lim_mem.saturating_add(v);
                has_lim_mem = true;
            }
            if cpu_lim.is_none() || mem_lim.is_none() {
                guaranteed = false;
            }
        }
        if !(has_req_cpu || has_req_mem || has_lim_cpu || has_lim_mem) {
            return QosClass::BestEffort;
        }
        let same = |has_req: bool, req: u64, has_lim: bool, lim: u64| !has_req || (has_lim && req == lim);
        let counts_match =
            usize::from(has_req_cpu) + usize::from(has_req_mem) == usize::from(has_lim_cpu) + usize::from(has_lim_mem);
        if guaranteed
            && same(has_req_cpu, req_cpu, has_lim_cpu, lim_cpu)
            && same(has_req_mem, req_mem, has_lim_mem, lim_mem)
            && counts_match
        {
            QosClass::Guaranteed
        } else {
            QosClass::Burstable
        }
    }

    /// The pod's effective CPU request in millicores (the larger of the app sum and the init peak).
    pub fn cpu_request(&self) -> u64 {
        pod_total(self, |c| c.cpu_request)
    }

    /// The pod's effective memory request in bytes.
    pub fn memory_request(&self) -> u64 {
        pod_total(self, |c| c.memory_request)
    }

    /// The pod's ephemeral-storage request in bytes, by the same rule.
    pub fn ephemeral_storage_request(&self) -> u64 {
        pod_total(self, |c| c.ephemeral_storage_request)
    }

    /// The pod's CPU limit in millicores, or `None` when some container has none.
    pub fn cpu_limit(&self) -> Option<u64> {
        self.all().all(|c| c.cpu_limit.is_some()).then(|| pod_total(self, |c| c.cpu_limit))
    }

    /// The pod's memory limit in bytes, or `None` when some container has none.
    pub fn memory_limit(&self) -> Option<u64> {
        self.all().all(|c| c.memory_limit.is_some()).then(|| pod_total(self, |c| c.memory_limit))
    }
}

/// The smallest cpu shares value (cgroup v1 `cpu.shares`), given to BestEffort pods.
pub const MIN_SHARES: u64 = 2;
/// The largest cpu shares value.
pub const MAX_SHARES: u64 = 262_144;
/// The smallest CFS quota the kubelet sets, in microseconds.
pub const MIN_QUOTA_US: u64 = 1000;
/// The default CFS period in microseconds (`cpuCFSQuotaPeriod: 100ms`).
pub const DEFAULT_CFS_PERIOD_US: u64 = 100_000;
/// The page size Memory QoS aligns `memory.high` to.
pub const PAGE_SIZE: u64 = 4096;

/// Converts millicores to cpu shares (1 CPU = 1024 shares), clamped to the kernel's range.
pub fn cpu_shares(millicores: u64) -> u64 {
    if millicores == 0 {
        return MIN_SHARES;
    }
    (millicores.saturating_mul(1024) / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// Converts cpu shares to a cgroup v2 `cpu.weight` (1..=10000) with the linear mapping runc and the kubelet use.
pub fn shares_to_weight(shares: u64) -> u64 {
    let shares = shares.clamp(MIN_SHARES, MAX_SHARES);
    1 + ((shares - MIN_SHARES) * 9999) / (MAX_SHARES - MIN_SHARES)
}

/// The inverse of [`shares_to_weight`] (to within its rounding), for cgroups adopted without a spec.
pub fn weight_to_shares(weight: u64) -> u64 {
    let weight = weight.clamp(1, 10_000);
    MIN_SHARES + ((weight - 1) * (MAX_SHARES - MIN_SHARES)).div_ceil(9999)
}

/// Converts a CPU limit in millicores to a CFS quota for the given period, never below 1 ms.
pub fn cpu_quota(millicores: u64, period_us: u64) -> u64 {
    (millicores.saturating_mul(period_us) / 1000).max(MIN_QUOTA_US)
}

/// `oom_score_adj` of Guaranteed and critical containers.
pub const GUARANTEED_OOM_SCORE_ADJ: i32 = -997;
/// `oom_score_adj` of BestEffort containers.
pub const BEST_EFFORT_OOM_SCORE_ADJ: i32 = 1000;

/// The kubelet's `oom_score_adj` for a container: -997 for Guaranteed (and critical) pods, 1000 for BestEffort,
/// and for Burstable `1000 − 1000 × request / capacity`, kept within 3..=999 so that Burstable containers always
/// rank between the other two classes.
pub fn oom_score_adj(qos: QosClass, critical: bool, memory_request: u64, memory_capacity: u64) -> i32 {
    if critical {
        return GUARANTEED_OOM_SCORE_ADJ;
    }
    match qos {
        QosClass::Guaranteed => GUARANTEED_OOM_SCORE_ADJ,
        QosClass::BestEffort => BEST_EFFORT_OOM_SCORE_ADJ,
        QosClass::Burstable => {
            let capacity = u128::from(memory_capacity.max(1));
            let share = (1000 * u128::from(memory_request)) / capacity;
            let adj = 1000 - i64::try_from(share.min(2000)).unwrap_or(2000);
            let floor = i64::from(1000 + GUARANTEED_OOM_SCORE_ADJ);
            let adj = if adj < floor {
                floor
            } else if adj >= 1000 {
                999
            } else {
                adj
            };
            i32::try_from(adj).unwrap_or(999)
        }
    }
}

/// Memory QoS (KEP-2570): the `memory.high` of a non-Guaranteed container,
/// `request + factor × (limit − request)` rounded down to a page, where `limit` is the container's memory limit or,
/// without one, node allocatable memory. `None` when no throttling point above the request exists.
pub fn memory_high(request: u64, limit: u64, factor: f64) -> Option<u64> {
    if limit <= request {
        return None;
    }
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let raw = (request as f64 + (limit - request) as f64 * factor).floor() as u64;
    let high = raw / PAGE_SIZE * PAGE_SIZE;
    (high > request).then_some(high)
}

#[cfg(test)]
mod tests;
