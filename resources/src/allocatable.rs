//! Node allocatable, by the kubelet's rules.
//!
//! - Reported allocatable (what admission and the scheduler see): `capacity − systemReserved − kubeReserved −
//!   hard eviction threshold`, where the eviction part is the `memory.available` threshold for memory and the
//!   `nodefs.available` threshold for ephemeral storage.
//! - Enforced allocatable (the limits written on `kubepods`): `capacity − systemReserved − kubeReserved`, without
//!   the eviction part, so that pods reach the eviction threshold before the cgroup limit.
//!
//! Negative results are clamped to zero.

use crate::capacity::Capacity;
use crate::quantity::Amount;

/// Reserved amounts of each resource (`systemReserved`, `kubeReserved`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Reserved {
    /// CPU in millicores.
    pub cpu_millis: u64,
    /// Memory in bytes.
    pub memory: u64,
    /// Process IDs (`pid`).
    pub pids: u64,
    /// Ephemeral storage in bytes.
    pub ephemeral_storage: u64,
}

impl Reserved {
    fn plus(self, o: Reserved) -> Reserved {
        Reserved {
            cpu_millis: self.cpu_millis.saturating_add(o.cpu_millis),
            memory: self.memory.saturating_add(o.memory),
            pids: self.pids.saturating_add(o.pids),
            ephemeral_storage: self.ephemeral_storage.saturating_add(o.ephemeral_storage),
        }
    }
}

/// The hard eviction thresholds that allocatable subtracts.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct EvictionReserve {
    /// The hard `memory.available` threshold.
    pub memory_available: Option<Amount>,
    /// The hard `nodefs.available` threshold.
    pub nodefs_available: Option<Amount>,
}

/// An amount of each resource.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Resources {
    /// CPU in millicores.
    pub cpu_millis: u64,
    /// Memory in bytes.
    pub memory: u64,
    /// Process IDs.
    pub pids: u64,
    /// Ephemeral storage in bytes.
    pub ephemeral_storage: u64,
}

/// Capacity, reservations and both views of allocatable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Allocatable {
    /// What the node has.
    pub capacity: Resources,
    /// What admission sees: capacity − reserved − hard eviction thresholds.
    pub reported: Resources,
    /// What `kubepods` is limited to: capacity − reserved.
    pub enforced: Resources,
}

/// Computes allocatable from capacity, reservations and the hard eviction thresholds.
pub fn compute(capacity: &Capacity, system: Reserved, kube: Reserved, eviction: EvictionReserve) -> Allocatable {
    let reserved = system.plus(kube);
    let cap = Resources {
        cpu_millis: capacity.cpu_millis,
        memory: capacity.memory,
        pids: capacity.pids,
        ephemeral_storage: capacity.ephemeral_storage,
    };
    let enforced = Resources {
        cpu_millis: cap.cpu_millis.saturating_sub(reserved.cpu_millis),
        memory: cap.memory.saturating_sub(reserved.memory),
        pids: cap.pids.saturating_sub(reserved.pids),
        ephemeral_storage: cap.ephemeral_storage.saturating_sub(reserved.ephemeral_storage),
    };
    let mem_evict = eviction.memory_available.map_or(0, |a| a.resolve(cap.memory));
    let fs_evict = eviction.nodefs_available.map_or(0, |a| a.resolve(cap.ephemeral_storage));
    let reported = Resources {
        memory: enforced.memory.saturating_sub(mem_evict),
        ephemeral_storage: enforced.ephemeral_storage.saturating_sub(fs_evict),
        ..enforced
    };
    Allocatable { capacity: cap, reported, enforced }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn cap() -> Capacity {
        Capacity { memory: 8 * GIB, cpu_millis: 4000, pids: 32768, ephemeral_storage: 100 * GIB }
    }

    #[test]
    fn kubelet_example() {
        let system = Reserved { cpu_millis: 500, memory: GIB, pids: 1000, ephemeral_storage: GIB };
        let kube = Reserved { cpu_millis: 1000, memory: 2 * GIB, pids: 0, ephemeral_storage: 0 };
        let ev = EvictionReserve {
            memory_available: Some(Amount::Quantity(500 * MIB)),
            nodefs_available: Some(Amount::Percentage(0.1)),
        };
        let a = compute(&cap(), system, kube, ev);
        assert_eq!(
            a.enforced,
            Resources { cpu_millis: 2500, memory: 5 * GIB, pids: 31768, ephemeral_storage: 99 * GIB }
        );
        assert_eq!(a.reported.memory, 5 * GIB - 500 * MIB);
        assert_eq!(a.reported.ephemeral_storage, 99 * GIB - 10 * GIB);
        assert_eq!(a.reported.cpu_millis, 2500);
        assert_eq!(a.reported.pids, 31768);
    }

    #[test]
    fn over_reservation_clamps_to_zero() {
        let huge = Reserved { cpu_millis: 10_000, memory: 16 * GIB, pids: 1 << 20, ephemeral_storage: 1 << 50 };
        let a = compute(&cap(), huge, Reserved::default(), EvictionReserve::default());
        assert_eq!(a.enforced, Resources::default());
        assert_eq!(a.reported, Resources::default());
    }

    proptest! {
        #[test]
        fn reported_never_exceeds_enforced_nor_capacity(
            mem in 0u64..(1 << 40), sys in 0u64..(1 << 40), kube in 0u64..(1 << 40), ev in 0u64..(1 << 40), pct in 0.0f64..=1.0,
        ) {
            let c = Capacity { memory: mem, cpu_millis: 1000, pids: 100, ephemeral_storage: mem };
            let r = |m| Reserved { memory: m, ephemeral_storage: m, ..Reserved::default() };
            let e = EvictionReserve { memory_available: Some(Amount::Quantity(ev)), nodefs_available: Some(Amount::Percentage(pct)) };
            let a = compute(&c, r(sys), r(kube), e);
            prop_assert!(a.reported.memory <= a.enforced.memory && a.enforced.memory <= mem);
            prop_assert!(a.reported.ephemeral_storage <= a.enforced.ephemeral_storage);
            prop_assert_eq!(a.enforced.memory, mem.saturating_sub(sys + kube));
        }
    }
}
