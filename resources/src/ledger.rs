//! The ledger of placements: admission, placement of pods in the kubepods tree with their limits, updates,
//! release, and adoption of the pods whose cgroups exist when nodewarden starts.

mod pending;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use crate::allocatable::{self, Allocatable, EvictionReserve, Reserved};
use crate::capacity::{Capacity, HostPaths, read_capacity};
use crate::cgroupfs::{CgroupFs, CgroupPath};
use crate::error::{CgroupError, NameError};
use crate::limits::{self, CgroupLimits, LimitSettings};
use crate::names::validate_pod_uid;
use crate::observe::{self, Observations, PodUsage};
use crate::parse::Limit;
use crate::pressure::NodePressure;
use crate::priority::{is_critical, is_node_critical, is_static_pod, pod_priority};
use crate::qos::{self, PodResources, PodSpecError, QosClass};
use crate::systemd::{CgroupDriver, UnitError, UnitLimits, Units};
use crate::tree::{self, Tree};
use crate::view::{self, LedgerView};
use pending::CgroupWriter;
pub use pending::PendingPlacement;

/// The daemon cgroup's `cpu.weight`: ten times a default cgroup's, so the daemon keeps running when pods
/// saturate the CPUs.
pub const DAEMON_CPU_WEIGHT: u64 = 1000;

/// The configuration the resources crate needs, taken from the kubelet configuration.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ResourceConfig {
    /// `cgroupRoot`.
    pub cgroup_root: CgroupPath,
    /// `enforceNodeAllocatable` contains `pods`: limit `kubepods` to allocatable.
    pub enforce_pods: bool,
    /// `systemReserved`.
    pub system_reserved: Reserved,
    /// `kubeReserved`.
    pub kube_reserved: Reserved,
    /// The hard eviction thresholds that allocatable subtracts.
    pub eviction_reserve: EvictionReserve,
    /// `maxPods`.
    pub max_pods: u32,
    /// `podPidsLimit`; `None` for no limit.
    pub pod_pids_limit: Option<u64>,
    /// `cpuCFSQuota`.
    pub cpu_cfs_quota: bool,
    /// `cpuCFSQuotaPeriod` in microseconds.
    pub cpu_cfs_period_us: u64,
    /// Memory QoS on.
    pub memory_qos: bool,
    /// `memoryThrottlingFactor`.
    pub memory_throttling_factor: f64,
    /// Treat every static pod as critical (the kubelet's rule) for admission under pressure.
    pub static_pods_critical: bool,
    /// Create a cgroup per container below the pod's. The process runtime starts containers in them; a CRI runtime
    /// creates its own (`<pod>/<container id>`) from the limits it is given, so none are made for it.
    pub container_cgroups: bool,
    /// `cgroupDriver`: who creates the tree's and the pods' cgroups.
    pub cgroup_driver: CgroupDriver,
}

impl ResourceConfig {
    /// The kubelet's defaults below `cgroup_root`: allocatable enforced on pods, nothing reserved, 110 pods, no
    /// pod PID limit, CFS quota with a 100 ms period, Memory QoS off.
    pub fn new(cgroup_root: CgroupPath) -> Self {
        Self {
            cgroup_root,
            enforce_pods: true,
            system_reserved: Reserved::default(),
            kube_reserved: Reserved::default(),
            eviction_reserve: EvictionReserve::default(),
            max_pods: 110,
            pod_pids_limit: None,
            cpu_cfs_quota: true,
            cpu_cfs_period_us: 100_000,
            memory_qos: false,
            memory_throttling_factor: 0.9,
            static_pods_critical: false,
            container_cgroups: true,
            cgroup_driver: CgroupDriver::Cgroupfs,
        }
    }
}

/// One container's cgroup.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ContainerPlacement {
    /// The container name.
    pub name: String,
    /// Its cgroup.
    pub cgroup: CgroupPath,
    /// The limits written.
    pub limits: CgroupLimits,
    /// Its CPU request as cgroup v1 `cpu.shares` (what CRI's `LinuxContainerResources` carries; runtimes convert
    /// it to `cpu.weight` with the same mapping as `limits.cpu_weight`).
    pub cpu_shares: u64,
    /// The `oom_score_adj` its processes should get.
    pub oom_score_adj: i32,
}

/// Where a pod was placed and with which limits.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Placement {
    /// The pod UID.
    pub uid: String,
    /// `namespace/name`, for messages; empty for adopted pods until their spec is seen.
    pub pod: String,
    /// The QoS class.
    pub qos: QosClass,
    /// The pod cgroup.
    pub cgroup: CgroupPath,
    /// The pod cgroup's limits.
    pub limits: CgroupLimits,
    /// The container cgroups.
    pub containers: Vec<ContainerPlacement>,
    /// The pod's CPU request in millicores, as admission counts it.
    pub cpu_request: u64,
    /// The pod's memory request in bytes.
    pub memory_request: u64,
    /// The pod's ephemeral-storage request in bytes, which disk eviction ranks by.
    pub ephemeral_request: u64,
    /// `spec.priority`.
    pub priority: i32,
    /// Critical by its priority or priority class alone (see [`is_critical`]).
    pub priority_critical: bool,
    /// A static pod (from a manifest file), critical too under the kubelet's rule.
    pub is_static: bool,
    /// The termination grace period of the pod's spec.
    pub grace_period: Duration,
    /// True when rebuilt from an existing cgroup at start and not yet placed again from a spec. Its requests are
    /// inferred from `cpu.weight` and `memory.min`; its priority and grace period are the defaults.
    pub adopted: bool,
}

impl Placement {
    /// Whether the pod is critical (never evicted, admitted under any pressure): by its priority, or as a static
    /// pod when `static_pods_critical` restores the kubelet's rule.
    pub fn is_critical(&self, static_pods_critical: bool) -> bool {
        self.priority_critical || (static_pods_critical && self.is_static)
    }
}

/// A placed pod that may be evicted, with its usage when it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictionCandidate {
    /// The placement.
    pub placement: Placement,
    /// Its usage.
    pub usage: PodUsage,
    /// Critical under the configuration in force.
    pub critical: bool,
}

/// Why a pod was not admitted. `reason()` gives the kubelet's reason string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    /// `maxPods` reached.
    #[error("Node didn't have enough resource: pods, requested: 1, used: {used}, capacity: {max}")]
    TooManyPods {
        /// Pods placed.
        used: usize,
        /// `maxPods`.
        max: u32,
    },
    /// Not enough allocatable CPU or memory left.
    #[error(
        "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {allocatable}"
    )]
    Insufficient {
        /// `cpu` (millicores) or `memory` (bytes).
        resource: &'static str,
        /// The pod's request.
        requested: u64,
        /// Already requested by placed pods.
        used: u64,
        /// Allocatable.
        allocatable: u64,
    },
    /// The pod spec cannot be accounted for.
    #[error("invalid pod: {0}")]
    Spec(#[from] PodSpecError),
    /// The pod UID is unusable.
    #[error("invalid pod UID: {0}")]
    Uid(#[from] NameError),
    /// The node is under pressure and the pod may not start now (the kubelet's message).
    #[error("{0}")]
    NodePressure(String),
    /// The node is shutting down (the kubelet's message).
    #[error("Pod was rejected as the node is shutting down.")]
    NodeShutdown,
}

impl AdmitError {
    /// The kubelet's reason for the pod status (`OutOfcpu`, `OutOfmemory`, `OutOfpods`, ...).
    pub fn reason(&self) -> &'static str {
        match self {
            AdmitError::TooManyPods { .. } => "OutOfpods",
            AdmitError::Insufficient { resource: "cpu", .. } => "OutOfcpu",
            AdmitError::Insufficient { .. } => "OutOfmemory",
            AdmitError::Spec(_) | AdmitError::Uid(_) => "InvalidPod",
            AdmitError::NodePressure(_) => "Evicted",
            AdmitError::NodeShutdown => "NodeShutdown",
        }
    }
}

/// Why a placement, update or release failed.
#[derive(Debug, thiserror::Error)]
pub enum PlaceError {
    /// The pod was refused.
    #[error(transparent)]
    Admit(#[from] AdmitError),
    /// A cgroup operation failed; whatever this call created has been removed again.
    #[error("pod {uid}: {source}")]
    Cgroup {
        /// The pod UID.
        uid: String,
        /// The failure.
        #[source]
        source: CgroupError,
    },
    /// An update would change the pod's QoS class, which moves it to another cgroup: it must be replaced instead.
    #[error("pod {uid}: the QoS class would change from {from} to {to}; replace the pod instead")]
    QosChanged {
        /// The pod UID.
        uid: String,
        /// The class placed.
        from: QosClass,
        /// The class of the new spec.
        to: QosClass,
    },
    /// `update` or `release` of a pod that is not placed.
    #[error("pod {0} is not placed")]
    NotPlaced(String),
    /// The pod's cgroups still hold processes, so they cannot be removed. The pod stays in the ledger.
    #[error("pod {uid} still has processes {pids:?}; its cgroup is kept")]
    Busy {
        /// The pod UID.
        uid: String,
        /// The processes left.
        pids: Vec<u32>,
    },
    /// The ledger request did not complete ([`crate::LedgerError`]).
    #[error("the ledger request did not complete: it panicked, or the daemon is shutting down")]
    Ledger,
}

/// The resource manager: the only owner of the kubepods tree and of the ledger of placements.
#[derive(Debug)]
pub struct ResourceManager {
    fs: CgroupFs,
    host: HostPaths,
    config: ResourceConfig,
    tree: Tree,
    capacity: Capacity,
    allocatable: Allocatable,
    pods: BTreeMap<String, Placement>,
    terminating: BTreeSet<String>,
    /// Pods placed for the first time whose cgroups are being written ([`ResourceManager::begin_place`]): counted
    /// by admission, not shown in the view until they are confirmed.
    writing: BTreeSet<String>,
    /// What the eviction loop reads (and the node's pressure, which it sets), published after each change.
    view: LedgerView,
    /// The systemd driver's way to systemd.
    units: Option<Arc<dyn Units>>,
    /// The node is shutting down: no pod is admitted that is not placed already.
    shutting_down: bool,
    /// kubepods' `memory.max` still to be written: enforced allocatable memory that is below what the pods use
    /// now (more reserved at a reload or a start). Writing it would have the kernel OOM-kill in kubepods; the
    /// eviction manager evicts meanwhile (allocatableMemory.available is below its threshold), and it is written
    /// once the pods fit. Until then kubepods keeps the limit it had.
    pending_memory_max: Option<u64>,
    /// What the QoS-level cgroups were last given, so that a placement that leaves them unchanged does not write
    /// them (or ask systemd) again; cleared when a write fails, so that the next change retries.
    qos_parents: Option<QosParents>,
}

/// The values the QoS-level cgroups follow their pods with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct QosParents {
    /// `burstable`'s `cpu.weight`.
    burstable_weight: u64,
    /// With Memory QoS, `memory.min` of `burstable` and of `kubepods`.
    memory_min: Option<(u64, u64)>,
}

fn pod_uid(pod: &Pod) -> Result<String, AdmitError> {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    validate_pod_uid(&uid)?;
    Ok(uid)
}

impl ResourceManager {
    /// Reads the node's capacity and computes allocatable. Nothing is written until [`ResourceManager::setup`].
    pub fn new(fs: CgroupFs, host: HostPaths, config: ResourceConfig) -> Result<Self, CgroupError> {
        let tree = match config.cgroup_driver {
            CgroupDriver::Cgroupfs => Tree::new(config.cgroup_root.clone())?,
            CgroupDriver::Systemd => Tree::systemd(&config.cgroup_root)?,
        };
        let capacity = read_capacity(&host, &fs, &config.cgroup_root)?;
        let allocatable =
            allocatable::compute(&capacity, config.system_reserved, config.kube_reserved, config.eviction_reserve);
        let view = LedgerView::new(fs.clone(), host.clone(), tree.kubepods.clone());
        view.publish(Vec::new(), BTreeSet::new(), allocatable, config.static_pods_critical, false);
        Ok(Self {
            fs,
            host,
            config,
            tree,
            capacity,
            allocatable,
            pods: BTreeMap::new(),
            terminating: BTreeSet::new(),
            writing: BTreeSet::new(),
            view,
            units: None,
            shutting_down: false,
            pending_memory_max: None,
            qos_parents: None,
        })
    }

    /// Gives the systemd driver its way to systemd: without it, [`ResourceManager::setup`] refuses that driver.
    #[must_use]
    pub fn with_units(mut self, units: Arc<dyn Units>) -> Self {
        self.units = Some(units);
        self
    }

    fn units(&self) -> Option<&dyn Units> {
        self.units.as_deref()
    }

    /// Creates the kubepods tree with allocatable enforced and adopts the pod cgroups that exist. Returns the
    /// UIDs adopted.
    pub fn setup(&mut self) -> Result<Vec<String>, CgroupError> {
        if self.tree.driver() == CgroupDriver::Systemd && self.units.is_none() {
            let reason = "the systemd cgroup driver has no connection to systemd".to_owned();
            return Err(UnitError { unit: self.tree.kubepods.to_string(), reason }.into());
        }
        self.ensure_tree(self.allocatable, self.config.enforce_pods)?;
        self.adopt()
    }

    /// Makes the tree and writes kubepods' limits for `allocatable`: enforced when `enforce`, else capacity, with
    /// a `memory.max` below the pods' working set left pending (see [`ResourceManager::settle_memory_limit`]).
    fn ensure_tree(&mut self, allocatable: Allocatable, enforce: bool) -> Result<(), CgroupError> {
        let (memory, pending) = self.kubepods_memory_max(&allocatable, enforce);
        let target = if enforce { allocatable.enforced } else { allocatable.capacity };
        tree::ensure(&self.fs, self.units(), &self.tree, &target, memory)?;
        self.pending_memory_max = pending;
        // A QoS-level cgroup made again here has the kernel's values: the next change of the ledger writes them.
        self.qos_parents = None;
        Ok(())
    }

    /// The `memory.max` to write on kubepods for `allocatable`, and the one left pending: its enforced memory,
    /// unless that is below what the pods use now (their working set); then the limit kubepods has stays, and the
    /// lower one is pending until [`ResourceManager::settle_memory_limit`] finds the pods fit.
    fn kubepods_memory_max(&self, allocatable: &Allocatable, enforce: bool) -> (Limit, Option<u64>) {
        if !enforce {
            return (Limit::Max, None);
        }
        let wanted = allocatable.enforced.memory;
        let kubepods = &self.tree.kubepods;
        let Ok(used) = observe::working_set(&self.fs, kubepods) else { return (Limit::Value(wanted), None) };
        if used <= wanted {
            return (Limit::Value(wanted), None);
        }
        let current = self.fs.read_limit(kubepods, "memory.max").unwrap_or(Limit::Max);
        tracing::warn!(
            wanted,
            used,
            kept = %current,
            "kubepods' memory.max would be below what the pods use; it is kept until evictions make room"
        );
        (current, Some(wanted))
    }

    /// Writes kubepods' pending `memory.max` once the pods' working set fits under it; true when written (or
    /// nothing was pending). The eviction loop has it called off its thread after each read of the kubepods
    /// working set (under the systemd driver it is a D-Bus call).
    pub fn settle_memory_limit(&mut self) -> Result<bool, CgroupError> {
        let Some(wanted) = self.pending_memory_max else { return Ok(true) };
        let kubepods = self.tree.kubepods.clone();
        if observe::working_set(&self.fs, &kubepods)? > wanted {
            return Ok(false);
        }
        let limit = Limit::Value(wanted);
        tree::set_unit_limits(
            self.units(),
            &self.tree,
            &kubepods,
            &UnitLimits { memory_max: Some(limit), ..UnitLimits::default() },
        )?;
        self.fs.write_limit(&kubepods, "memory.max", limit)?;
        self.pending_memory_max = None;
        self.publish();
        tracing::info!(memory_max = wanted, "the pods fit: kubepods' memory.max lowered to enforced allocatable");
        Ok(true)
    }

    /// kubepods' `memory.max` that waits for the pods to fit under it, if any.
    pub fn pending_memory_max(&self) -> Option<u64> {
        self.pending_memory_max
    }

    /// The node's capacity.
    pub fn capacity(&self) -> &Capacity {
        &self.capacity
    }

    /// Allocatable, reported and enforced.
    pub fn allocatable(&self) -> &Allocatable {
        &self.allocatable
    }

    /// The configuration in force.
    pub fn config(&self) -> &ResourceConfig {
        &self.config
    }

    /// The kubepods tree.
    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// The host paths that observations read.
    pub fn host(&self) -> &HostPaths {
        &self.host
    }

    /// The cgroup file system.
    pub fn cgroupfs(&self) -> &CgroupFs {
        &self.fs
    }

    /// The placements, by UID.
    pub fn placements(&self) -> impl Iterator<Item = &Placement> {
        self.pods.values()
    }

    /// One placement.
    pub fn placement(&self, uid: &str) -> Option<&Placement> {
        self.pods.get(uid)
    }

    fn settings(&self) -> LimitSettings {
        LimitSettings {
            pod_pids_limit: self.config.pod_pids_limit,
            cpu_cfs_quota: self.config.cpu_cfs_quota,
            cpu_cfs_period_us: self.config.cpu_cfs_period_us,
            memory_qos: self.config.memory_qos,
            memory_throttling_factor: self.config.memory_throttling_factor,
            memory_capacity: self.capacity.memory,
            allocatable_memory: self.allocatable.enforced.memory,
        }
    }

    /// Marks a placed pod as being terminated: admission no longer counts it, as the kubelet does not count pods
    /// whose termination was requested, so that a replacement can be admitted while the old pod winds down.
    pub fn set_terminating(&mut self, uid: &str) {
        if self.pods.contains_key(uid) {
            self.terminating.insert(uid.to_owned());
            self.publish();
        }
    }

    /// Moves the daemon itself (process `pid`) into its own cgroup `<cgroupRoot>/<name>`, beside kubepods, with
    /// `memory.min` protecting `memory_min` bytes of it from reclaim and [`DAEMON_CPU_WEIGHT`], so that pods
    /// that saturate the CPUs do not starve the eviction loop. Returns the cgroup.
    pub fn place_daemon(&self, name: &str, pid: u32, memory_min: u64) -> Result<CgroupPath, CgroupError> {
        let cg = self.tree.root.child(name)?;
        self.fs.create(&cg)?;
        self.fs.write(&cg, "memory.min", &memory_min.to_string())?;
        self.fs.write(&cg, "cpu.weight", &DAEMON_CPU_WEIGHT.to_string())?;
        self.fs.add_proc(&cg, pid)?;
        Ok(cg)
    }

    /// The node conditions admission follows (the eviction manager sets them through [`LedgerView`]).
    pub fn pressure(&self) -> NodePressure {
        self.view.pressure()
    }

    /// While the node shuts down (and until the shutdown is cancelled), pods not placed yet are refused with the
    /// kubelet's `NodeShutdown`.
    pub fn set_shutting_down(&mut self, shutting_down: bool) {
        self.shutting_down = shutting_down;
    }

    /// Applies a reloaded configuration: reserved resources, the hard eviction thresholds that allocatable
    /// subtracts, `maxPods` and `podPidsLimit` (for pods placed from now on). Allocatable is computed again and
    /// the kubepods limits rewritten. The cgroup root and driver settings cannot change here.
    pub fn reconfigure(&mut self, config: ResourceConfig) -> Result<(), CgroupError> {
        let allocatable =
            allocatable::compute(&self.capacity, config.system_reserved, config.kube_reserved, config.eviction_reserve);
        if allocatable != self.allocatable || config.enforce_pods != self.config.enforce_pods {
            self.ensure_tree(allocatable, config.enforce_pods)?;
        }
        self.allocatable = allocatable;
        self.config = ResourceConfig {
            cgroup_root: self.config.cgroup_root.clone(),
            cgroup_driver: self.config.cgroup_driver,
            ..config
        };
        self.publish();
        Ok(())
    }

    /// Decides whether a pod fits: the node's pressure conditions (for pods not placed yet), `maxPods`, then allocatable CPU and memory against the requests of the pods
    /// placed and not terminating. A pod already placed is admitted again (re-admission after a restart or an
    /// update).
    pub fn admit(&self, pod: &Pod) -> Result<PodResources, AdmitError> {
        let uid = pod_uid(pod)?;
        let res = PodResources::from_pod(pod)?;
        if !self.pods.contains_key(&uid) {
            if self.shutting_down {
                return Err(AdmitError::NodeShutdown);
            }
            let critical = is_critical(pod, self.config.static_pods_critical);
            self.view.pressure().admit(res.qos_class(), critical).map_err(AdmitError::NodePressure)?;
        }
        let others = || self.pods.values().filter(|p| p.uid != uid && !self.terminating.contains(&p.uid));
        let count = others().count();
        if count >= self.config.max_pods as usize {
            return Err(AdmitError::TooManyPods { used: count, max: self.config.max_pods });
        }
        let alloc = &self.allocatable.reported;
        let checks = [
            ("cpu", res.cpu_request(), others().map(|p| p.cpu_request).sum::<u64>(), alloc.cpu_millis),
            ("memory", res.memory_request(), others().map(|p| p.memory_request).sum::<u64>(), alloc.memory),
        ];
        for (resource, requested, used, allocatable) in checks {
            if requested > 0 && used.saturating_add(requested) > allocatable {
                return Err(AdmitError::Insufficient { resource, requested, used, allocatable });
            }
        }
        Ok(res)
    }

    /// Admits and places a pod: creates `kubepods/[qos/]pod<UID>/<container>` with the limits its QoS class and
    /// resources call for. Placing a placed pod again rewrites its limits (see [`ResourceManager::update`]). On a
    /// failure the cgroups this call created are removed again. [`ResourceManager::begin_place`], the write and
    /// [`ResourceManager::end_place`] in one go.
    pub fn place(&mut self, pod: &Pod) -> Result<Placement, PlaceError> {
        let pending = self.begin_place(pod)?;
        let written = pending.write();
        self.end_place(pending, written)
    }

    /// Admits a pod and records its placement, whose cgroups are still to be written
    /// ([`PendingPlacement::write`], which needs nothing of the ledger: the systemd driver's D-Bus round trips of
    /// different pods overlap), then confirmed with [`ResourceManager::end_place`]. Admission counts it from now
    /// on; the published view shows it once it is confirmed.
    pub fn begin_place(&mut self, pod: &Pod) -> Result<PendingPlacement, PlaceError> {
        let res = self.admit(pod)?;
        let uid = pod_uid(pod)?;
        let qos = res.qos_class();
        let cg_err = |source: CgroupError| PlaceError::Cgroup { uid: uid.clone(), source };
        let cgroup = self.tree.pod_cgroup(qos, &uid).map_err(|e| cg_err(e.into()))?;
        if let Some(old) = self.pods.get(&uid).filter(|old| old.qos != qos) {
            return Err(PlaceError::QosChanged { uid, from: old.qos, to: qos });
        }
        let s = self.settings();
        let critical = is_node_critical(pod);
        let containers: Vec<ContainerPlacement> = res
            .init
            .iter()
            .chain(res.sidecars.iter().map(|(_, c)| c))
            .chain(res.app.iter())
            .map(|c| -> Result<ContainerPlacement, NameError> {
                Ok(ContainerPlacement {
                    name: c.name.clone(),
                    cgroup: self.tree.container_cgroup(&cgroup, &c.name)?,
                    limits: limits::container_limits(c, qos, &s),
                    cpu_shares: qos::cpu_shares(c.cpu_request.unwrap_or(0)),
                    oom_score_adj: qos::oom_score_adj(
                        qos,
                        critical,
                        c.memory_request.unwrap_or(0),
                        self.capacity.memory,
                    ),
                })
            })
            .collect::<Result<_, _>>()
            .map_err(|e| cg_err(e.into()))?;
        let placement = Placement {
            uid: uid.clone(),
            pod: crate::pod::full_name(pod),
            qos,
            limits: limits::pod_limits(&res, qos, &s),
            cgroup,
            containers,
            cpu_request: res.cpu_request(),
            memory_request: res.memory_request(),
            ephemeral_request: res.ephemeral_storage_request(),
            priority: pod_priority(pod),
            priority_critical: is_critical(pod, false),
            is_static: is_static_pod(pod),
            grace_period: crate::pod::grace_period(pod),
            adopted: false,
        };
        let before = self.pods.insert(uid.clone(), placement.clone());
        if before.is_none() {
            self.writing.insert(uid);
        }
        Ok(PendingPlacement { placement, before, writer: self.writer() })
    }

    /// Confirms a placement whose cgroups were written, or, when `written` failed, takes it back (a placed pod
    /// keeps what it had).
    pub fn end_place(
        &mut self,
        pending: PendingPlacement,
        written: Result<(), CgroupError>,
    ) -> Result<Placement, PlaceError> {
        let PendingPlacement { placement, before, .. } = pending;
        self.writing.remove(&placement.uid);
        if let Err(source) = written {
            match before {
                Some(old) => self.pods.insert(placement.uid.clone(), old),
                None => self.pods.remove(&placement.uid),
            };
            return Err(PlaceError::Cgroup { uid: placement.uid, source });
        }
        self.publish();
        self.refresh_qos_parents();
        Ok(placement)
    }

    /// Whether cgroups are made through systemd (the systemd driver), whose round trips a placement's write
    /// waits for.
    pub fn uses_systemd(&self) -> bool {
        self.units.is_some()
    }

    /// What writing cgroups needs of the manager.
    fn writer(&self) -> CgroupWriter {
        CgroupWriter {
            fs: self.fs.clone(),
            units: self.units.clone(),
            tree: self.tree.clone(),
            container_cgroups: self.config.container_cgroups,
        }
    }

    /// Makes a placed pod's container cgroup again, with its limits, where it has vanished (someone removed it):
    /// a container starts each run in its cgroup, as runc makes the cgroup at every start. True when it was made.
    pub fn ensure_container(&mut self, uid: &str, name: &str) -> Result<bool, PlaceError> {
        let p = self.pods.get(uid).ok_or_else(|| PlaceError::NotPlaced(uid.to_owned()))?;
        let cg_err = |source: CgroupError| PlaceError::Cgroup { uid: uid.to_owned(), source };
        let Some(c) = p.containers.iter().find(|c| c.name == name) else { return Ok(false) };
        if !self.config.container_cgroups || self.fs.exists(&c.cgroup) {
            return Ok(false);
        }
        self.writer().make(&c.cgroup, &c.limits, &mut Vec::new()).map_err(cg_err)?;
        Ok(true)
    }

    /// Rewrites the limits of a placed pod from a changed spec (its QoS class must not change).
    pub fn update(&mut self, pod: &Pod) -> Result<Placement, PlaceError> {
        let pending = self.begin_update(pod)?;
        let written = pending.write();
        self.end_place(pending, written)
    }

    /// [`ResourceManager::begin_place`] for a pod that must be placed already ([`ResourceManager::update`]).
    pub fn begin_update(&mut self, pod: &Pod) -> Result<PendingPlacement, PlaceError> {
        let uid = pod_uid(pod)?;
        if !self.pods.contains_key(&uid) {
            return Err(PlaceError::NotPlaced(uid));
        }
        self.begin_place(pod)
    }

    /// Removes a pod's cgroups (and any cgroup below them) once its processes are gone and drops it from the
    /// ledger. A pod whose cgroups still hold processes is reported with their PIDs and kept, never leaked.
    pub fn release(&mut self, uid: &str) -> Result<(), PlaceError> {
        let p = self.pods.get(uid).ok_or_else(|| PlaceError::NotPlaced(uid.to_owned()))?;
        let cg_err = |source: CgroupError| PlaceError::Cgroup { uid: uid.to_owned(), source };
        let pids = self.fs.subtree_procs(&p.cgroup).map_err(cg_err)?;
        if !pids.is_empty() {
            return Err(PlaceError::Busy { uid: uid.to_owned(), pids });
        }
        // Every cgroup below the pod goes too, including ones a runtime made there (containerd nests sandbox and
        // container cgroups under the pod).
        tree::remove(&self.fs, self.units(), &self.tree, &p.cgroup).map_err(cg_err)?;
        self.pods.remove(uid);
        self.terminating.remove(uid);
        self.publish();
        self.refresh_qos_parents();
        Ok(())
    }

    /// Kills every process of a pod at once (`cgroup.kill` on the pod cgroup).
    pub fn kill(&self, uid: &str) -> Result<(), PlaceError> {
        let p = self.pods.get(uid).ok_or_else(|| PlaceError::NotPlaced(uid.to_owned()))?;
        self.fs.kill(&p.cgroup).map_err(|e| PlaceError::Cgroup { uid: uid.to_owned(), source: e.into() })
    }

    /// The processes in a placed pod's cgroups (empty for a pod not placed).
    pub fn procs(&self, uid: &str) -> Result<Vec<u32>, PlaceError> {
        let Some(p) = self.pods.get(uid) else { return Ok(Vec::new()) };
        self.fs.subtree_procs(&p.cgroup).map_err(|e| PlaceError::Cgroup { uid: uid.to_owned(), source: e })
    }

    /// Sends `signal` to every process in a placed pod's cgroups; returns how many were signalled. A process
    /// that exited meanwhile is not an error.
    pub fn signal(&self, uid: &str, signal: rustix::process::Signal) -> Result<usize, PlaceError> {
        let mut sent = 0;
        for pid in self.procs(uid)? {
            let Some(pid) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) else { continue };
            if rustix::process::kill_process(pid, signal).is_ok() {
                sent += 1;
            }
        }
        Ok(sent)
    }

    /// Updates the QoS-level cgroups after the ledger changed. A failure leaves the pods' own cgroups correct, so
    /// it is logged rather than undoing the change; the next change retries.
    fn refresh_qos_parents(&mut self) {
        if let Err(e) = self.update_qos_parents() {
            tracing::warn!(error = %e, "cannot update the QoS-level cgroups");
        }
    }

    /// The QoS-level cgroups follow their pods: `burstable`'s `cpu.weight` from the Burstable pods' CPU requests,
    /// and with Memory QoS, `memory.min` of `burstable` and `kubepods` from the memory requests below them.
    fn update_qos_parents(&mut self) -> Result<(), CgroupError> {
        let sum = |f: fn(&Placement) -> u64, classes: &[QosClass]| -> u64 {
            self.pods.values().filter(|p| classes.contains(&p.qos)).map(f).fold(0, u64::saturating_add)
        };
        let want = QosParents {
            burstable_weight: qos::shares_to_weight(qos::cpu_shares(sum(|p| p.cpu_request, &[QosClass::Burstable]))),
            memory_min: self.config.memory_qos.then(|| {
                let burstable = sum(|p| p.memory_request, &[QosClass::Burstable]);
                (burstable, sum(|p| p.memory_request, &[QosClass::Burstable, QosClass::Guaranteed]))
            }),
        };
        if self.qos_parents == Some(want) {
            return Ok(());
        }
        self.qos_parents = None;
        self.write_qos_parents(want)?;
        self.qos_parents = Some(want);
        Ok(())
    }

    fn write_qos_parents(&self, want: QosParents) -> Result<(), CgroupError> {
        let weight = want.burstable_weight;
        // The files first: they hold at once, whatever systemd answers.
        self.fs.write(&self.tree.burstable, "cpu.weight", &weight.to_string())?;
        if let Some((burstable_min, protected)) = want.memory_min {
            self.fs.write(&self.tree.burstable, "memory.min", &burstable_min.to_string())?;
            self.fs.write(&self.tree.kubepods, "memory.min", &protected.to_string())?;
            let kubepods = UnitLimits { memory_min: Some(protected), ..UnitLimits::default() };
            tree::set_unit_limits(self.units(), &self.tree, &self.tree.kubepods, &kubepods)?;
        }
        let burstable_min = want.memory_min.map(|(burstable, _)| burstable);
        let burstable = UnitLimits { cpu_weight: Some(weight), memory_min: burstable_min, ..UnitLimits::default() };
        tree::set_unit_limits(self.units(), &self.tree, &self.tree.burstable, &burstable)
    }

    /// Rebuilds the ledger from the pod cgroups that exist under kubepods, so that a restart adopts running pods
    /// instead of duplicating or orphaning them. Cgroups that are not pods or cannot be read are skipped with a
    /// warning. Returns the UIDs adopted.
    pub fn adopt(&mut self) -> Result<Vec<String>, CgroupError> {
        let mut adopted = Vec::new();
        for qos in [QosClass::Guaranteed, QosClass::Burstable, QosClass::BestEffort] {
            let parent = self.tree.qos_parent(qos).clone();
            for name in self.fs.children(&parent)? {
                let Some(uid) = self.tree.pod_uid(qos, &name) else { continue };
                if validate_pod_uid(&uid).is_err() || self.pods.contains_key(&uid) {
                    continue;
                }
                match self.read_existing(&uid, qos) {
                    Ok(p) => {
                        adopted.push(uid.clone());
                        self.pods.insert(uid, p);
                    }
                    Err(e) => tracing::warn!(pod_uid = uid, error = %e, "cannot adopt existing pod cgroup"),
                }
            }
        }
        self.publish();
        self.update_qos_parents()?;
        Ok(adopted)
    }

    fn read_existing(&self, uid: &str, qos: QosClass) -> Result<Placement, CgroupError> {
        let cgroup = self.tree.pod_cgroup(qos, uid)?;
        let limits = tree::read_limits(&self.fs, &cgroup)?;
        let mut containers = Vec::new();
        for child in self.fs.children(&cgroup)? {
            let Some(name) = self.tree.container_name(&cgroup, &child) else { continue };
            let cg = cgroup.child(&child)?;
            let limits = tree::read_limits(&self.fs, &cg)?;
            containers.push(ContainerPlacement {
                name,
                cgroup: cg,
                cpu_shares: qos::weight_to_shares(limits.cpu_weight),
                limits,
                oom_score_adj: 0,
            });
        }
        // Invert cpu.weight → shares → millicores. One weight step spans about 26 shares; take the largest shares
        // value that maps to this weight, so that admission over-counts an adopted pod rather than under-counts it.
        let span = qos::MAX_SHARES - qos::MIN_SHARES;
        let shares =
            (qos::MIN_SHARES + (limits.cpu_weight * span).div_ceil(9999)).saturating_sub(1).min(qos::MAX_SHARES);
        let cpu_request = if qos == QosClass::BestEffort { 0 } else { shares * 1000 / 1024 };
        let memory_request = limits.memory_min.unwrap_or(0);
        Ok(Placement {
            uid: uid.to_owned(),
            pod: String::new(),
            qos,
            cgroup,
            limits,
            containers,
            cpu_request,
            memory_request,
            ephemeral_request: 0,
            priority: 0,
            priority_critical: false,
            is_static: false,
            grace_period: crate::pod::DEFAULT_GRACE_PERIOD,
            adopted: true,
        })
    }

    /// Reads the node's signals and the kubepods tree's working set: a fixed number of reads, however many pods.
    pub fn observe(&self) -> Result<Observations, CgroupError> {
        self.view.observe()
    }

    /// Reads every placed pod's usage. A pod whose cgroup vanished meanwhile is skipped.
    pub fn pod_usage(&self) -> Vec<PodUsage> {
        self.pods.values().filter_map(|p| view::usage_of(&self.fs, p)).collect()
    }

    /// What the eviction loop reads of the ledger, behind a lock of its own (see [`LedgerView`]).
    pub fn view(&self) -> LedgerView {
        self.view.clone()
    }

    /// Shows the eviction loop the ledger as it is now.
    fn publish(&self) {
        let placements = self.pods.values().filter(|p| !self.writing.contains(&p.uid)).cloned().collect();
        let (terminating, critical) = (self.terminating.clone(), self.config.static_pods_critical);
        self.view.publish(placements, terminating, self.allocatable, critical, self.pending_memory_max.is_some());
    }
}

#[cfg(test)]
mod tests;
