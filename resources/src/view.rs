//! What the eviction loop (and a scrape of the metrics) reads of the ledger, kept beside it behind a lock of its
//! own: the placements, the pods being terminated, allocatable and the node's pressure. The ledger publishes a copy
//! after each change; the lock is held only to copy, never across a cgroup write or a systemd D-Bus call, so placing
//! or releasing a pod (three D-Bus round trips under the systemd driver, or a hung systemd's time-outs) never holds
//! up an eviction pass or a scrape.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::allocatable::Allocatable;
use crate::capacity::HostPaths;
use crate::cgroupfs::{CgroupFs, CgroupPath};
use crate::error::CgroupError;
use crate::ledger::{EvictionCandidate, Placement};
use crate::observe::{self, Observations, PodUsage, Pressure};
use crate::pressure::NodePressure;
use crate::qos::QosClass;

/// The ledger as the eviction loop and the metrics see it; clones share it.
#[derive(Debug, Clone)]
pub struct LedgerView {
    fs: CgroupFs,
    host: HostPaths,
    kubepods: CgroupPath,
    shared: Arc<Mutex<Shared>>,
}

#[derive(Debug, Default)]
struct Shared {
    placements: Vec<Placement>,
    terminating: BTreeSet<String>,
    allocatable: Allocatable,
    static_pods_critical: bool,
    pressure: NodePressure,
    memory_max_pending: bool,
}

impl LedgerView {
    pub(crate) fn new(fs: CgroupFs, host: HostPaths, kubepods: CgroupPath) -> Self {
        LedgerView { fs, host, kubepods, shared: Arc::default() }
    }

    fn shared(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Replaces what the ledger shows (its pressure is the eviction loop's and stays).
    pub(crate) fn publish(
        &self,
        placements: Vec<Placement>,
        terminating: BTreeSet<String>,
        allocatable: Allocatable,
        static_pods_critical: bool,
        memory_max_pending: bool,
    ) {
        let mut s = self.shared();
        s.placements = placements;
        s.terminating = terminating;
        s.allocatable = allocatable;
        s.static_pods_critical = static_pods_critical;
        s.memory_max_pending = memory_max_pending;
    }

    /// Whether a lowered kubepods `memory.max` waits for the pods to fit
    /// ([`crate::ResourceManager::settle_memory_limit`]).
    pub fn memory_max_pending(&self) -> bool {
        self.shared().memory_max_pending
    }

    /// The node's conditions as the eviction loop last set them; admission refuses pods by them.
    pub fn pressure(&self) -> NodePressure {
        self.shared().pressure
    }

    /// Sets the node's conditions.
    pub fn set_pressure(&self, pressure: NodePressure) {
        self.shared().pressure = pressure;
    }

    /// Allocatable in force.
    pub fn allocatable(&self) -> Allocatable {
        self.shared().allocatable
    }

    /// Whether the pod is placed.
    pub fn is_placed(&self, uid: &str) -> bool {
        self.shared().placements.iter().any(|p| p.uid == uid)
    }

    /// The UIDs of the pods placed.
    pub fn placed(&self) -> BTreeSet<String> {
        self.shared().placements.iter().map(|p| p.uid.clone()).collect()
    }

    /// How many pods are placed in each QoS class (every class, with 0 where none is).
    pub fn pods_by_qos(&self) -> BTreeMap<QosClass, usize> {
        let mut counts =
            BTreeMap::from([(QosClass::Guaranteed, 0), (QosClass::Burstable, 0), (QosClass::BestEffort, 0)]);
        for p in &self.shared().placements {
            *counts.entry(p.qos).or_default() += 1;
        }
        counts
    }

    /// The host's kernel interfaces.
    pub fn host(&self) -> &HostPaths {
        &self.host
    }

    /// The kubepods tree's working set now (`memory.current` − `inactive_file`), read without any lock.
    pub fn kubepods_working_set(&self) -> Result<u64, CgroupError> {
        observe::working_set(&self.fs, &self.kubepods)
    }

    /// Fresh observations of the node and the kubepods tree: what the eviction signals need (read without any
    /// lock).
    pub fn observe(&self) -> Result<Observations, CgroupError> {
        observe::observe_node(&self.host, &self.fs, &self.kubepods)
    }

    /// The pressure stall files of the node and the kubepods tree, read now (without any lock).
    pub fn pressure_stall(&self) -> Pressure {
        observe::read_pressure(&self.host, &self.fs, &self.kubepods)
    }

    /// What eviction ranks: every pod placed from a spec that is not being terminated, with its usage (read
    /// after the copy, without any lock) and its criticality under the configuration in force. Pods whose cgroup
    /// vanished meanwhile are left out.
    pub fn eviction_candidates(&self) -> Vec<EvictionCandidate> {
        let (placements, critical_static) = {
            let s = self.shared();
            let placed = s.placements.iter().filter(|p| !p.adopted && !s.terminating.contains(&p.uid)).cloned();
            (placed.collect::<Vec<_>>(), s.static_pods_critical)
        };
        placements
            .into_iter()
            .filter_map(|p| {
                let usage = usage_of(&self.fs, &p)?;
                Some(EvictionCandidate { usage, critical: p.is_critical(critical_static), placement: p })
            })
            .collect()
    }
}

/// A placed pod's usage; `None` (logged) when its cgroup vanished meanwhile.
pub(crate) fn usage_of(fs: &CgroupFs, p: &Placement) -> Option<PodUsage> {
    observe::pod_usage(fs, &p.uid, &p.cgroup)
        .inspect_err(|e| tracing::debug!(pod_uid = %p.uid, error = %e, "skipping pod usage"))
        .ok()
}
