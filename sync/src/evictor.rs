//! Pod sync as the eviction manager's [`Evictor`]: what pods write to node storage, and
//! eviction through the pod workers (the same graceful termination as a deletion; the pod stays `Failed` with
//! reason `Evicted`).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use nodewarden_eviction::{EvictError, Eviction, Evictor, Reclaimed, Signal};

use crate::disk_usage::{DiskUsage, du, usage};
use crate::manager::{PodManager, TerminateError};
use crate::reclaim::Removed;
use crate::spec::pod_log_dir_name;
use crate::volumes::pod_dir;
use crate::worker::remove_dead;
use nodewarden_runtime::{Runtime, SandboxRuntime};

/// The node storage pod `uid` uses: its volumes below `root` and, where the pod is known, its logs below
/// `log_root`.
pub(crate) fn pod_disk_usage(root: &Path, log_root: &Path, uid: &str, pod: Option<&Pod>) -> DiskUsage {
    let volumes = pod_dir(root, uid).join("volumes");
    let logs = pod.map_or_else(DiskUsage::default, |p| usage(&log_root.join(pod_log_dir_name(p))));
    usage(&volumes).plus(logs)
}

impl<R: Runtime> PodManager<R> {
    /// The log directories of the pods that are over, to remove as a task, empty ones too (they hold inodes, and
    /// would be measured again at every pass); `None` when there are none.
    fn reclaim_logs(&self) -> Option<impl Future<Output = Removed> + Send + use<R>> {
        let log_dir = &self.settings().log_dir;
        let dirs: Vec<(String, PathBuf)> = self
            .store()
            .finished()
            .iter()
            .map(|p| (nodewarden_resources::pod::full_name(p), log_dir.join(pod_log_dir_name(p))))
            .filter(|(_, dir)| dir.exists())
            .collect();
        if dirs.is_empty() {
            return None;
        }
        Some(async move { tokio::task::spawn_blocking(move || remove_logs(dirs)).await.ok().flatten() })
    }

    /// The dead containers and stopped sandboxes of the pods that ended on their own and are still listed, to
    /// remove as a task (under disk pressure the kubelet's `DeleteAllUnusedContainers` takes them too); `None` when
    /// no such pod keeps any. What they held is not known (the runtime measures the layers of running containers
    /// only): the next reading shows it.
    fn reclaim_containers(&self) -> Option<impl Future<Output = Removed> + Send + use<R>> {
        let pods = self.dead_containers().reclaim_over();
        if pods.is_empty() {
            return None;
        }
        let runtime = self.runtime_handle();
        Some(async move {
            let containers = pods.iter().map(|(_, ids)| ids.len()).sum::<usize>();
            let count = pods.len();
            for (uid, ids) in pods {
                remove_dead(&*runtime, ids).await;
                if let Some(sandboxes) = runtime.sandboxes() {
                    sandboxes.remove_sandboxes(&uid).await;
                }
            }
            tracing::info!(
                pods = count,
                containers,
                "removed the dead containers and sandboxes of pods that are over to reclaim disk space before evicting"
            );
            Some(0)
        })
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
        // As the kubelet's reclaim: the logs and containers of pods that are over first (an image they used is
        // unused once they are gone), then the images, where they are on the file system under pressure.
        self.node_reclaim().poll(|images_quiet| {
            let logs = self.reclaim_logs();
            let containers = self.reclaim_containers();
            let images = self.image_collector().filter(|c| !images_quiet && c.covers(signal)).map(|c| c.reclaim());
            if logs.is_none() && containers.is_none() && images.is_none() {
                return None;
            }
            Some(async move {
                let mut removed = None;
                if let Some(logs) = logs {
                    removed = plus(removed, logs.await);
                }
                if let Some(containers) = containers {
                    removed = plus(removed, containers.await);
                }
                if let Some(images) = images {
                    removed = plus(removed, images.await);
                }
                removed
            })
        })
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

/// Removes the log directories `dirs` (each with its pod's full name); the bytes they held, `None` when none was
/// removed.
fn remove_logs(dirs: Vec<(String, PathBuf)>) -> Removed {
    let mut freed = None;
    for (pod, dir) in dirs {
        let bytes = du(&dir);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {
                tracing::info!(pod, bytes, "reclaimed the logs of a pod that is over");
                freed = plus(freed, Some(bytes));
            }
            Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "cannot remove the logs of a pod that is over"),
        }
    }
    freed
}

/// What two parts of a reclaim removed together.
fn plus(a: Removed, b: Removed) -> Removed {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
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
