//! The seam to the pods' owner: [`Evictor`] carries out evictions (pod sync implements it), and says why one could
//! not be handed over ([`EvictError`]).

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::Signal;

/// Carries out evictions; pod sync implements it. Which pods may be evicted comes from the ledger's view
/// ([`LedgerView::eviction_candidates`](nodewarden_resources::LedgerView::eviction_candidates)).
pub trait Evictor: Send + Sync + 'static {
    /// Bytes a pod uses of the file system `signal` measures (inodes, for an `inodesFree` signal), as the kubelet
    /// ranks pods: its containers' writable layers, logs and disk-backed volumes where one file system holds them
    /// all; with images on a file system of their own, the writable layers for an `imagefs` signal and the logs and
    /// volumes for a `nodefs` one. Called
    /// for each candidate on a disk threshold, on a thread of its own: it may take as long as a walk of the files.
    fn disk_usage(&self, uid: &str, signal: Signal) -> u64;

    /// Frees node storage without evicting a running pod (the logs, exited containers and sandboxes of pods that
    /// are over; unused images where `signal` is about the file system that holds them). Called on disk pressure before any pod is evicted,
    /// as the kubelet reclaims node-level resources first; must not block: a reclaim that takes long (image
    /// removals through the runtime) runs on its own and says [`Reclaimed::Running`] until it has ended.
    fn reclaim_disk(&self, signal: Signal) -> Reclaimed;

    /// Evicts a pod with the given grace period; the pod ends `Failed` with reason `Evicted` and the message.
    /// Hands the eviction over and returns at once, without blocking: the loop calls it as soon as it has chosen
    /// the victim.
    fn evict(&self, uid: &str, grace: Duration, message: String) -> Result<Eviction, EvictError>;

    /// A threshold is met and a pod is being evicted to reclaim `resource` (`memory`, `ephemeral-storage`,
    /// `inodes`, `pids`): the kubelet's `EvictionThresholdMet` node event. Called after the eviction is handed
    /// over, so it costs the victim's SIGTERM nothing; must not block.
    fn threshold_met(&self, resource: &'static str);
}

/// What [`Evictor::reclaim_disk`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reclaimed {
    /// These bytes were freed: the next reading shows them.
    Freed(u64),
    /// A reclaim runs: no pod is evicted for disk until it has ended (or its time is up).
    Running,
    /// Nothing was left to reclaim.
    Nothing,
}

/// Why an eviction could not be handed over; its text is the one the eviction's log line and record show.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvictError {
    /// The pod (by UID) has no worker to terminate it.
    #[error("pod {0} is not known")]
    UnknownPod(String),
    /// The pod's worker (by UID) ended before it took the termination.
    #[error("pod {0}'s worker stopped before the pod was terminated")]
    WorkerGone(String),
}

/// An eviction handed over to the pod's owner.
#[derive(Debug)]
pub struct Eviction {
    /// Resolves once SIGTERM has gone to the pod's containers, with when it went; dropped unsent when there was
    /// nothing to signal.
    pub signalled: oneshot::Receiver<Instant>,
    /// Resolves (or is dropped) once the pod has terminated.
    pub terminated: oneshot::Receiver<()>,
}
