//! The image garbage collector's loop, for a runtime with images (CRI): a pass at start and every five minutes,
//! as the kubelet's, and at once when a reload changes its settings (`imageGCHighThresholdPercent` and the
//! others apply live; so do `serializeImagePulls` and `maxParallelImagePulls`, handed to the runtime from here). The
//! image file system is the one the runtime names (`ImageFsInfo`, asked at each pass), else the one found at start. A shortfall is the kubelet's
//! `FreeDiskSpaceFailed` node event; a pass that fails after a failed one, its `ImageGCFailed`. The eviction
//! manager's reclaim shares the collector (see `nodewarden_sync::ImageCollector`); this loop keeps its
//! settings.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, ImagesConfig};
use nodewarden_runtime::SelectedRuntime;
use nodewarden_sync::{EventSink, EventType, ImageCollector, ImageFs, ImageGcPolicy, PodEvent, ReclaimSettings};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The kubelet's `ImageGCPeriod`.
pub const PERIOD: Duration = Duration::from_secs(300);

/// The collector's policy from the config's images section.
fn policy(c: &ImagesConfig) -> ImageGcPolicy {
    ImageGcPolicy {
        high_percent: c.high_percent,
        low_percent: c.low_percent,
        minimum_age: c.minimum_age,
        maximum_age: c.maximum_age,
    }
}

/// Whether two paths are on one file system (their nearest existing ancestors' devices).
pub(crate) fn same_fs(a: &Path, b: &Path) -> bool {
    let dev = |p: &Path| std::fs::metadata(crate::daemon::existing_ancestor(p)).ok().map(|m| m.dev());
    dev(a).is_some_and(|d| Some(d) == dev(b))
}

/// What the eviction manager's reclaim follows, from `config` and the image file system.
fn reclaim_settings(config: &Config, imagefs: &Path) -> ReclaimSettings {
    let shares_nodefs = same_fs(&config.host.nodefs_path, imagefs);
    ReclaimSettings { minimum_age: config.images.minimum_age, shares_nodefs }
}

/// Runs the collector's passes until `shutdown`; `imagefs` is the image file system (the one the runtime names).
pub async fn run(
    collector: Arc<ImageCollector<SelectedRuntime>>,
    mut config: watch::Receiver<Arc<Config>>,
    imagefs: PathBuf,
    events: Arc<dyn EventSink>,
    shutdown: CancellationToken,
) {
    collector.set_reclaim(reclaim_settings(&config.borrow(), &imagefs));
    // The images there are now count their age from the start, as the kubelet's.
    if let Err(e) = collector.detect(Instant::now()).await {
        tracing::warn!(error = %e, "cannot list the images");
    }
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut in_force = config.borrow_and_update().images;
    let mut failed_before = false;
    let mut moved_warned = false;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
            changed = config.changed() => {
                if changed.is_err() {
                    return;
                }
                let now = config.borrow_and_update().images;
                if now == in_force {
                    continue;
                }
                tracing::info!(settings = ?now, "image garbage collection settings reloaded; collecting now");
                if now.parallel_pulls != in_force.parallel_pulls {
                    collector.set_pull_limit(now.parallel_pulls);
                }
                in_force = now;
                collector.set_reclaim(reclaim_settings(&config.borrow(), &imagefs));
            }
        }
        // As the kubelet asks at each pass: the runtime's answer now (the runtime may have come up after the
        // daemon), else what the start found.
        let named = collector.image_fs().await;
        if let Some(now) = named.as_ref().filter(|n| !same_fs(n, &imagefs))
            && !moved_warned
        {
            moved_warned = true;
            tracing::warn!(
                runtime = %now.display(),
                signals = %imagefs.display(),
                "the runtime keeps its images on another file system than at start: image garbage collection measures it, the imagefs signals read the other until a restart"
            );
        }
        let path = crate::daemon::existing_ancestor(named.as_deref().unwrap_or(&imagefs));
        let fs = || match nodewarden_resources::fs_stats(&path) {
            Ok(s) => Some(ImageFs { capacity_bytes: s.capacity_bytes, available_bytes: s.available_bytes }),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the image file system's usage");
                None
            }
        };
        let (freed, result) = collector.collect(&policy(&in_force), fs, Instant::now()).await;
        if !freed.removed.is_empty() {
            tracing::info!(images = freed.removed.len(), bytes = freed.bytes, "image garbage collection freed space");
        }
        let Err(e) = result else {
            failed_before = false;
            continue;
        };
        let warning = |reason: &str| PodEvent {
            event_type: EventType::Warning,
            reason: reason.to_owned(),
            message: e.to_string(),
            container: None,
        };
        if let Some(reason) = e.event_reason() {
            events.node_event(warning(reason));
        }
        if failed_before {
            tracing::error!(error = %e, "image garbage collection failed twice in a row");
            events.node_event(warning("ImageGCFailed"));
        } else {
            tracing::warn!(error = %e, "image garbage collection failed");
        }
        failed_before = true;
    }
}
