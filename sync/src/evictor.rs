//! Pod sync as the eviction manager's [`Evictor`]: what pods write to node storage, and
//! eviction through the pod workers (the same graceful termination as a deletion; the pod stays `Failed` with
//! reason `Evicted`).

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use nodewarden_eviction::{EvictError, Eviction, Evictor, Reclaimed, Signal};

use crate::disk_usage::{DiskUsage, du, usage};
use crate::manager::{PodManager, TerminateError};
use crate::spec::pod_log_dir_name;
use crate::volumes::pod_dir;
use nodewarden_runtime::Runtime;

/// The node storage pod `uid` uses: its volumes below `root` and, where the pod is known, its logs below
/// `log_root`.
pub(crate) fn pod_disk_usage(root: &Path, log_root: &Path, uid: &str, pod: Option<&Pod>) -> DiskUsage {
    let volumes = pod_dir(root, uid).join("volumes");
    let logs = pod.map_or_else(DiskUsage::default, |p| usage(&log_root.join(pod_log_dir_name(p))));
    usage(&volumes).plus(logs)
}

impl<R: Runtime> PodManager<R> {
    /// Removes the logs of the pods that are over, empty ones too (they hold inodes, and would be measured again
    /// at every pass); returns the bytes freed.
    fn reclaim_logs(&self) -> u64 {
        let log_dir = &self.settings().log_dir;
        let mut freed = 0u64;
        for pod in self.store().finished() {
            let dir = log_dir.join(pod_log_dir_name(&pod));
            if !dir.exists() {
                continue;
            }
            let bytes = du(&dir);
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {
                    tracing::info!(pod = %nodewarden_resources::pod::full_name(&pod), bytes, "reclaimed the logs of a pod that is over");
                    freed = freed.saturating_add(bytes);
                }
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot remove the logs of a pod that is over")
                }
            }
        }
        freed
    }
}

impl<R: Runtime> Evictor for PodManager<R> {
    fn disk_usage(&self, uid: &str, signal: Signal) -> u64 {
        let settings = self.settings();
        let files = || pod_disk_usage(&settings.root_dir, &settings.log_dir, uid, self.store().get(uid).as_ref());
        let layers = || self.writable_layers().pod_total(uid);
        // The process runtime has no images and no layers: its pods' files are all there is.
        let one_fs = self.image_collector().is_none_or(|c| c.covers(Signal::NodeFsAvailable));
        let imagefs = matches!(signal, Signal::ImageFsAvailable | Signal::ImageFsInodesFree);
        let used = match (one_fs, imagefs) {
            (true, _) => files().plus(layers()),
            (false, true) => layers(),
            (false, false) => files(),
        };
        if signal.counts_inodes() { used.inodes } else { used.bytes }
    }

    fn reclaim_disk(&self, signal: Signal) -> Reclaimed {
        let logs = self.reclaim_logs();
        let images = match self.image_collector() {
            Some(c) if c.covers(signal) => c.reclaim(),
            _ => Reclaimed::Nothing,
        };
        match (logs, images) {
            (_, Reclaimed::Running) => Reclaimed::Running,
            (0, images) => images,
            (logs, Reclaimed::Freed(bytes)) => Reclaimed::Freed(logs.saturating_add(bytes)),
            (logs, Reclaimed::Nothing) => Reclaimed::Freed(logs),
        }
    }

    fn evict(&self, uid: &str, grace: Duration, message: String) -> Result<Eviction, EvictError> {
        PodManager::evict(self, uid, grace, message).map_err(evict_error)
    }

    fn threshold_met(&self, resource: &'static str) {
        self.record_node_event(crate::PodEvent {
            event_type: crate::EventType::Warning,
            reason: "EvictionThresholdMet".into(),
            message: format!("Attempting to reclaim {resource}"),
            container: None,
        });
    }
}

/// Why the manager could not hand an eviction over, as the eviction manager names it.
fn evict_error(e: TerminateError) -> EvictError {
    match e {
        TerminateError::UnknownPod(uid) => EvictError::UnknownPod(uid),
        TerminateError::WorkerGone(uid) => EvictError::WorkerGone(uid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_eviction_keeps_the_managers_cause_and_words() {
        for (e, expected) in [
            (TerminateError::UnknownPod("u1".into()), EvictError::UnknownPod("u1".into())),
            (TerminateError::WorkerGone("u2".into()), EvictError::WorkerGone("u2".into())),
        ] {
            let words = e.to_string();
            let mapped = evict_error(e);
            assert_eq!(mapped, expected);
            assert_eq!(mapped.to_string(), words);
        }
    }
}
