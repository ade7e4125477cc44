//! The value of each eviction signal, derived from the resources crate's observations, with the capacity that
//! percentage thresholds are resolved against.

use std::collections::BTreeMap;

use nodewarden_resources::{Allocatable, Observations};

use crate::signal::Signal;

/// One signal's observed value and the capacity it is a part of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SignalObservation {
    /// What is available now (bytes, inodes or PIDs).
    pub available: u64,
    /// The whole, for percentage thresholds.
    pub capacity: u64,
}

/// Computes every signal, by the kubelet's definitions:
/// - `memory.available`: from [`Observations::memory`] (never above `MemAvailable`);
/// - `allocatableMemory.available`: enforced allocatable memory − the kubepods tree's working set;
/// - `nodefs.*`, `imagefs.*`: available bytes and free inodes of those file systems;
/// - `pid.available`: the PID limit − the threads that exist.
pub fn signal_observations(obs: &Observations, alloc: &Allocatable) -> BTreeMap<Signal, SignalObservation> {
    let o = |available, capacity| SignalObservation { available, capacity };
    let mut out = BTreeMap::from([
        (Signal::MemoryAvailable, o(obs.memory.available, obs.memory.capacity)),
        (Signal::AllocatableMemoryAvailable, allocatable_memory(alloc, obs.kubepods_working_set)),
    ]);
    // An input that could not be read gives no signal: its thresholds are neither met nor cleared this pass.
    for (f, bytes, inodes) in [
        (&obs.nodefs, Signal::NodeFsAvailable, Signal::NodeFsInodesFree),
        (&obs.imagefs, Signal::ImageFsAvailable, Signal::ImageFsInodesFree),
    ] {
        if let Some(f) = f {
            out.insert(bytes, o(f.available_bytes, f.capacity_bytes));
            out.insert(inodes, o(f.inodes_free, f.inodes));
        }
    }
    if let Some(p) = &obs.pids {
        out.insert(Signal::PidAvailable, o(p.available, p.max));
    }
    out
}

/// `allocatableMemory.available`: enforced allocatable memory − the kubepods tree's working set.
pub fn allocatable_memory(alloc: &Allocatable, kubepods_working_set: u64) -> SignalObservation {
    let memory = alloc.enforced.memory;
    SignalObservation { available: memory.saturating_sub(kubepods_working_set), capacity: memory }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodewarden_resources::{FsStats, NodeMemory, PidStats, Resources};

    #[test]
    fn signals_follow_the_kubelet_definitions() {
        let obs = Observations {
            memory: NodeMemory { capacity: 1000, working_set: 300, mem_available: 600, available: 600 },
            pids: Some(PidStats { max: 100, running: 40, available: 60 }),
            nodefs: Some(FsStats { capacity_bytes: 10_000, available_bytes: 2_500, inodes: 500, inodes_free: 50 }),
            imagefs: Some(FsStats { capacity_bytes: 20_000, available_bytes: 1_000, inodes: 800, inodes_free: 700 }),
            kubepods_working_set: 200,
            ..Observations::default()
        };
        let alloc =
            Allocatable { enforced: Resources { memory: 800, ..Resources::default() }, ..Allocatable::default() };
        let s = signal_observations(&obs, &alloc);
        assert_eq!(s[&Signal::MemoryAvailable], SignalObservation { available: 600, capacity: 1000 });
        assert_eq!(s[&Signal::AllocatableMemoryAvailable], SignalObservation { available: 600, capacity: 800 });
        assert_eq!(s[&Signal::NodeFsInodesFree], SignalObservation { available: 50, capacity: 500 });
        assert_eq!(s[&Signal::ImageFsAvailable].available, 1_000);
        assert_eq!(s[&Signal::PidAvailable], SignalObservation { available: 60, capacity: 100 });
        assert_eq!(s.len(), Signal::ALL.len());
        // An imagefs that does not answer gives no imagefs signals; the others stay.
        let s = signal_observations(&Observations { imagefs: None, ..obs }, &alloc);
        assert!(!s.contains_key(&Signal::ImageFsAvailable) && !s.contains_key(&Signal::ImageFsInodesFree));
        assert_eq!(s.len(), Signal::ALL.len() - 2);
    }
}
