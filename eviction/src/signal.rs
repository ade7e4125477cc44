//! Eviction signals, named as the kubelet names them.

use std::fmt;
use std::str::FromStr;

use nodewarden_resources::Condition;

/// An eviction signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    /// `memory.available`: node memory capacity − working set (never above `MemAvailable` here).
    MemoryAvailable,
    /// `allocatableMemory.available`: allocatable memory − the pods' working set.
    AllocatableMemoryAvailable,
    /// `nodefs.available`: free bytes on the node file system.
    NodeFsAvailable,
    /// `nodefs.inodesFree`: free inodes on the node file system.
    NodeFsInodesFree,
    /// `imagefs.available`: free bytes on the image file system.
    ImageFsAvailable,
    /// `imagefs.inodesFree`: free inodes on the image file system.
    ImageFsInodesFree,
    /// `pid.available`: process IDs left.
    PidAvailable,
}

impl Signal {
    /// Every signal, in a stable order.
    pub const ALL: [Signal; 7] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::PidAvailable,
    ];

    /// The kubelet's name, as used in config keys and the `eviction_signal` metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    /// Whether the signal counts inodes (`*.inodesFree`), not bytes.
    pub fn counts_inodes(self) -> bool {
        matches!(self, Signal::NodeFsInodesFree | Signal::ImageFsInodesFree)
    }

    /// The node condition the signal raises.
    pub fn condition(self) -> Condition {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Condition::MemoryPressure,
            Signal::NodeFsAvailable
            | Signal::NodeFsInodesFree
            | Signal::ImageFsAvailable
            | Signal::ImageFsInodesFree => Condition::DiskPressure,
            Signal::PidAvailable => Condition::PidPressure,
        }
    }
}

impl serde::Serialize for Signal {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Signal {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Signal::ALL.into_iter().find(|sig| sig.as_str() == s).ok_or_else(|| {
            let known: Vec<&str> = Signal::ALL.iter().map(|s| s.as_str()).collect();
            format!("unknown eviction signal {s:?} (known: {})", known.join(", "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in Signal::ALL {
            assert_eq!(s.as_str().parse::<Signal>(), Ok(s));
        }
        assert!("memory.availble".parse::<Signal>().unwrap_err().contains("memory.available"));
    }
}
