//! The containers' writable layers, as the runtime last measured them: what a container writes to its root file
//! system is disk the node loses as much as its logs are, so it counts in the disk ranking and toward
//! `ephemeral-storage` limits, as the kubelet counts a container's rootfs. Read from the runtime every
//! [`MEASURE_PERIOD`] off the eviction thread, which reads only this copy.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nodewarden_runtime::{ImageService, Runtime, WritableLayer};
use tokio_util::sync::CancellationToken;

use crate::disk_usage::DiskUsage;
use crate::manager::PodManager;

/// How often the layers are measured (the kubelet's housekeeping of container stats is 10 s).
pub const MEASURE_PERIOD: Duration = Duration::from_secs(10);

/// One pod's containers' writable layers: bytes by container name, and the inodes of them all.
#[derive(Debug, Default, Clone)]
struct PodLayers {
    bytes: BTreeMap<String, u64>,
    inodes: u64,
}

/// Each pod's containers' writable layers.
#[derive(Debug, Default)]
pub(crate) struct WritableLayers(Mutex<HashMap<String, PodLayers>>);

impl WritableLayers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, PodLayers>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Replaces what is known with a new measure of every running container (two of one name are summed).
    pub(crate) fn replace(&self, layers: Vec<WritableLayer>) {
        let mut by_pod: HashMap<String, PodLayers> = HashMap::new();
        for l in layers {
            let pod = by_pod.entry(l.pod_uid).or_default();
            pod.inodes = pod.inodes.saturating_add(l.inodes);
            let bytes = pod.bytes.entry(l.container).or_default();
            *bytes = bytes.saturating_add(l.bytes);
        }
        *self.lock() = by_pod;
    }

    /// The layers of pod `uid`'s containers, in bytes by name.
    pub(crate) fn of_pod(&self, uid: &str) -> BTreeMap<String, u64> {
        self.lock().get(uid).map(|p| p.bytes.clone()).unwrap_or_default()
    }

    /// What pod `uid`'s containers' layers hold together.
    pub(crate) fn pod_total(&self, uid: &str) -> DiskUsage {
        self.lock().get(uid).map_or_else(DiskUsage::default, |p| DiskUsage { bytes: total(&p.bytes), inodes: p.inodes })
    }
}

/// The bytes of a pod's containers' layers (by container name) together.
pub(crate) fn total(layers: &BTreeMap<String, u64>) -> u64 {
    layers.values().fold(0u64, |a, b| a.saturating_add(*b))
}

/// How many measures in a row may fail before the last one is dropped: layers that old are unknown, as the kubelet
/// ranks and limits pods it has no stats for by what else it knows.
pub(crate) const KEPT_THROUGH_FAILURES: u32 = 3;

/// Measures the writable layers every [`MEASURE_PERIOD`] until `shutdown`, for a runtime with images; a failed
/// measure keeps the last one for [`KEPT_THROUGH_FAILURES`] periods, then drops it (logged once each).
pub async fn measure_writable_layers<R: Runtime>(manager: Arc<PodManager<R>>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(MEASURE_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failures = 0u32;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let Some(images) = manager.runtime().image_service() else { return };
        match images.writable_layers().await {
            Ok(layers) => {
                failures = 0;
                manager.writable_layers().replace(layers);
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                if failures == 1 {
                    tracing::warn!(error = %e, "cannot read the containers' writable layers from the runtime; the last measure stays for now");
                } else if failures == KEPT_THROUGH_FAILURES {
                    tracing::warn!(error = %e, "the containers' writable layers are unknown until the runtime answers again");
                    manager.writable_layers().replace(Vec::new());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(uid: &str, container: &str, bytes: u64) -> WritableLayer {
        WritableLayer { pod_uid: uid.into(), container: container.into(), bytes, inodes: bytes / 2 }
    }

    #[test]
    fn layers_are_kept_by_pod_and_container_and_replaced_whole() {
        let l = WritableLayers::default();
        l.replace(vec![layer("u1", "app", 10), layer("u1", "side", 5), layer("u1", "app", 1), layer("u2", "db", 7)]);
        assert_eq!(l.pod_total("u1"), DiskUsage { bytes: 16, inodes: 5 + 2 });
        assert_eq!(l.of_pod("u1"), BTreeMap::from([("app".to_owned(), 11), ("side".to_owned(), 5)]));
        assert_eq!(l.pod_total("gone"), DiskUsage::default());
        l.replace(vec![layer("u2", "db", 9)]);
        let bytes = |uid| l.pod_total(uid).bytes;
        assert_eq!((bytes("u1"), bytes("u2")), (0, 9), "a pod no longer measured has no layers");
    }
}
