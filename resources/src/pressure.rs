//! The node's pressure conditions: which ones the eviction manager raised, and what admission does under them.

use crate::qos::QosClass;

/// A node condition that eviction raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum Condition {
    /// From `memory.available` and `allocatableMemory.available`.
    MemoryPressure,
    /// From the `nodefs.*` and `imagefs.*` signals.
    DiskPressure,
    /// From `pid.available`.
    PidPressure,
}

impl Condition {
    /// Every condition, in the order Kubernetes lists them.
    pub const ALL: [Condition; 3] = [Condition::MemoryPressure, Condition::DiskPressure, Condition::PidPressure];

    /// The Kubernetes name.
    pub fn as_str(self) -> &'static str {
        match self {
            Condition::MemoryPressure => "MemoryPressure",
            Condition::DiskPressure => "DiskPressure",
            Condition::PidPressure => "PIDPressure",
        }
    }

    fn bit(self) -> u8 {
        match self {
            Condition::MemoryPressure => 1,
            Condition::DiskPressure => 2,
            Condition::PidPressure => 4,
        }
    }
}

impl std::fmt::Display for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The set of pressure conditions that are true, as the eviction manager last decided them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodePressure {
    bits: u8,
}

impl NodePressure {
    /// The set of the given conditions.
    pub fn of(conditions: impl IntoIterator<Item = Condition>) -> Self {
        let mut p = Self::default();
        for c in conditions {
            p.insert(c);
        }
        p
    }

    /// Marks `c` true.
    pub fn insert(&mut self, c: Condition) {
        self.bits |= c.bit();
    }

    /// Whether `c` is true.
    pub fn contains(&self, c: Condition) -> bool {
        self.bits & c.bit() != 0
    }

    /// True when no condition is.
    pub fn is_empty(&self) -> bool {
        self.bits == 0
    }

    /// The conditions that are true, in [`Condition::ALL`]'s order.
    pub fn iter(&self) -> impl Iterator<Item = Condition> + '_ {
        Condition::ALL.into_iter().filter(|c| self.contains(*c))
    }

    /// The conditions that are true, by their Kubernetes names.
    pub fn names(&self) -> Vec<&'static str> {
        self.iter().map(Condition::as_str).collect()
    }

    /// Whether a pod may start under these conditions, by the kubelet's rules: anything when there is no pressure;
    /// critical pods always; under memory pressure alone, every pod but BestEffort ones; under any other pressure,
    /// nothing else. The error is the kubelet's message.
    pub fn admit(&self, qos: QosClass, critical: bool) -> Result<(), String> {
        let memory_only = *self == Self::of([Condition::MemoryPressure]);
        if self.is_empty() || critical || (memory_only && qos != QosClass::BestEffort) {
            return Ok(());
        }
        Err(format!("The node had condition: [{}]. ", self.names().join(", ")))
    }
}

impl serde::Serialize for NodePressure {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_of_conditions() {
        let p = NodePressure::of([Condition::PidPressure, Condition::MemoryPressure]);
        assert!(p.contains(Condition::MemoryPressure) && p.contains(Condition::PidPressure));
        assert!(!p.contains(Condition::DiskPressure));
        assert_eq!(p.names(), ["MemoryPressure", "PIDPressure"]);
        assert!(NodePressure::default().is_empty());
        assert_eq!(NodePressure::of(Condition::ALL).iter().collect::<Vec<_>>(), Condition::ALL);
    }

    #[test]
    fn admission_under_pressure() {
        let none = NodePressure::default();
        let memory = NodePressure::of([Condition::MemoryPressure]);
        let disk = NodePressure::of([Condition::DiskPressure]);
        let both = NodePressure::of([Condition::MemoryPressure, Condition::PidPressure]);
        assert_eq!(none.admit(QosClass::BestEffort, false), Ok(()));
        assert_eq!(memory.admit(QosClass::Burstable, false), Ok(()));
        assert_eq!(memory.admit(QosClass::BestEffort, false), Err("The node had condition: [MemoryPressure]. ".into()));
        assert_eq!(memory.admit(QosClass::BestEffort, true), Ok(()));
        assert!(disk.admit(QosClass::Guaranteed, false).is_err());
        assert_eq!(disk.admit(QosClass::Guaranteed, true), Ok(()));
        assert_eq!(
            both.admit(QosClass::Guaranteed, false),
            Err("The node had condition: [MemoryPressure, PIDPressure]. ".into())
        );
    }
}
