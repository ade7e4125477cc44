//! Ranking pods for eviction, by the kubelet's orderings:
//! - memory: pods whose usage exceeds their request first, then lower priority first, then the larger
//!   usage − request first;
//! - disk (nodefs, imagefs): the same on ephemeral-storage usage and request;
//! - PIDs: lower priority first, then more processes first.
//!
//! Critical pods are never candidates. Ties are broken by name so the order is stable.

use std::cmp::Ordering;

use crate::signal::Signal;
use nodewarden_resources::Condition;

/// A pod the eviction manager may choose, with what ranking needs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Candidate {
    /// The pod UID.
    pub uid: String,
    /// `namespace/name`.
    pub name: String,
    /// `spec.priority`.
    pub priority: i32,
    /// Never evicted.
    pub critical: bool,
    /// The pod's memory request in bytes.
    pub memory_request: u64,
    /// The pod cgroup's working set in bytes.
    pub memory_usage: u64,
    /// The pod's ephemeral-storage request in bytes.
    pub disk_request: u64,
    /// What the pod uses of node storage (writable layers, logs and disk-backed emptyDir volumes): bytes, or
    /// inodes for an `inodesFree` signal; read only for disk pressure.
    pub disk_usage: u64,
    /// Processes and threads in the pod cgroup.
    pub pids: u64,
    /// The pod's own termination grace period.
    pub grace: std::time::Duration,
}

impl Candidate {
    /// The usage ranking compares for a signal and the matching request (bytes; or processes, or inodes, and 0:
    /// as the kubelet's, no pod requests those).
    pub fn usage(&self, signal: Signal) -> (u64, u64) {
        match signal.condition() {
            Condition::MemoryPressure => (self.memory_usage, self.memory_request),
            Condition::DiskPressure if signal.counts_inodes() => (self.disk_usage, 0),
            Condition::DiskPressure => (self.disk_usage, self.disk_request),
            Condition::PidPressure => (self.pids, 0),
        }
    }

    /// What evicting this pod gives back for a signal (bytes, or processes).
    pub fn reclaims(&self, signal: Signal) -> u64 {
        self.usage(signal).0
    }
}

#[cfg(test)]
impl Candidate {
    /// A BestEffort pod `default/<uid>` using `memory` bytes and one process, with a grace period of 30 s.
    pub fn best_effort(uid: &str, memory: u64) -> Self {
        Candidate {
            uid: uid.into(),
            name: format!("default/{uid}"),
            priority: 0,
            critical: false,
            memory_request: 0,
            memory_usage: memory,
            disk_request: 0,
            disk_usage: 0,
            pids: 1,
            grace: std::time::Duration::from_secs(30),
        }
    }
}

/// usage above request first, then lower priority, then the larger usage − request.
fn by_usage(a: (u64, u64, i32), b: (u64, u64, i32)) -> Ordering {
    let ((ua, ra, pa), (ub, rb, pb)) = (a, b);
    let over = |u: u64, r: u64| u > r;
    over(ub, rb)
        .cmp(&over(ua, ra))
        .then(pa.cmp(&pb))
        .then((i128::from(ub) - i128::from(rb)).cmp(&(i128::from(ua) - i128::from(ra))))
}

/// The non-critical pods in the order the kubelet would evict them for `signal`.
pub fn rank(signal: Signal, pods: &[Candidate]) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = pods.iter().filter(|p| !p.critical).cloned().collect();
    out.sort_by(|a, b| {
        let primary = match signal.condition() {
            Condition::MemoryPressure | Condition::DiskPressure => {
                let ((ua, ra), (ub, rb)) = (a.usage(signal), b.usage(signal));
                by_usage((ua, ra, a.priority), (ub, rb, b.priority))
            }
            Condition::PidPressure => a.priority.cmp(&b.priority).then(b.pids.cmp(&a.pids)),
        };
        primary.then_with(|| a.name.cmp(&b.name))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn pod(name: &str, priority: i32, request: u64, usage: u64, pids: u64) -> Candidate {
        Candidate {
            uid: name.into(),
            name: name.into(),
            priority,
            critical: false,
            memory_request: request,
            memory_usage: usage,
            disk_request: request,
            disk_usage: usage,
            pids,
            grace: std::time::Duration::from_secs(30),
        }
    }

    fn names(r: &[Candidate]) -> Vec<&str> {
        r.iter().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn memory_ranking_follows_the_kubelet() {
        // (name, priority, request, usage)
        let pods = [
            pod("guaranteed-within-request", 0, 150 * MIB, 140 * MIB, 1),
            pod("besteffort-small", 0, 0, 10 * MIB, 1),
            pod("besteffort-hog", 0, 0, 700 * MIB, 1),
            pod("burstable-over-high-priority", 1000, 100 * MIB, 900 * MIB, 1),
            pod("burstable-slightly-over", 0, 100 * MIB, 120 * MIB, 1),
        ];
        let r = rank(Signal::MemoryAvailable, &pods);
        assert_eq!(
            names(&r),
            [
                // Over request, priority 0, by usage − request.
                "besteffort-hog",
                "burstable-slightly-over",
                "besteffort-small",
                // Over request but higher priority.
                "burstable-over-high-priority",
                // Within request comes last.
                "guaranteed-within-request",
            ]
        );
        assert_eq!(names(&rank(Signal::AllocatableMemoryAvailable, &pods)), names(&r));
    }

    #[test]
    fn pid_ranking_is_priority_then_count() {
        let pods = [pod("a", 0, 0, 0, 10), pod("b", 0, 0, 0, 500), pod("c", -5, 0, 0, 1), pod("d", 100, 0, 0, 900)];
        assert_eq!(names(&rank(Signal::PidAvailable, &pods)), ["c", "b", "a", "d"]);
    }

    #[test]
    fn disk_ranking_uses_ephemeral_storage_and_critical_pods_never_rank() {
        let mut pods =
            vec![pod("writer", 0, 0, 50 * MIB, 1), pod("quiet", 0, 0, MIB, 1), pod("system", 0, 0, 900 * MIB, 1)];
        pods[2].critical = true;
        let r = rank(Signal::NodeFsAvailable, &pods);
        assert_eq!(names(&r), ["writer", "quiet"]);
        assert_eq!(r[0].reclaims(Signal::NodeFsAvailable), 50 * MIB);
        assert_eq!(r[0].reclaims(Signal::PidAvailable), 1);
    }

    #[test]
    fn inode_ranking_compares_inodes_against_no_request() {
        // (name, priority, ephemeral-storage request, usage): the usage read for an inodes signal is inodes.
        let pods = [pod("many-files-within-request", 0, 10_000, 5_000, 1), pod("few-files-no-request", 0, 0, 100, 1)];
        assert_eq!(names(&rank(Signal::NodeFsAvailable, &pods)), ["few-files-no-request", "many-files-within-request"]);
        // No pod requests inodes: the one with the most files goes first, whatever its storage request (the
        // kubelet's last key subtracts that request, in bytes, from the inodes; a deliberate difference).
        let r = rank(Signal::NodeFsInodesFree, &pods);
        assert_eq!(names(&r), ["many-files-within-request", "few-files-no-request"]);
        assert_eq!(r[0].usage(Signal::ImageFsInodesFree), (5_000, 0));
    }
}
