//! The image garbage collector, as the kubelet's image manager collects: it remembers when each image was first
//! seen and last used by a container (running or not), and frees space by removing the images no container
//! uses and the runtime does not pin, least recently used first, none seen for less than `imageMinimumGCAge`.
//! A pass removes the images unused for longer than `imageMaximumGCAge` first, then, with the image file system
//! at `imageGCHighThresholdPercent` or above, frees down to `imageGCLowThresholdPercent`.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use nodewarden_eviction::Signal;
use nodewarden_runtime::{ImageService, NodeImage, Runtime, RuntimeError};
use prometheus::IntCounterVec;
use tokio::time::Instant;

use crate::StatusStore;
use crate::reclaim::Removed;

/// How the collector decides (the kubelet's `ImageGCPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageGcPolicy {
    /// Usage (percent of the image file system) at which space is freed; 100 never.
    pub high_percent: u8,
    /// Usage freed down to.
    pub low_percent: u8,
    /// An image first seen more recently than this is kept.
    pub minimum_age: Duration,
    /// An image unused for longer than this is removed whatever the usage.
    pub maximum_age: Option<Duration>,
}

/// The image file system's size, as a pass reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageFs {
    /// Its size in bytes.
    pub capacity_bytes: u64,
    /// Its free bytes.
    pub available_bytes: u64,
}

/// Why an image was removed, as `kubelet_image_garbage_collected_total` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GcReason {
    /// Unused for longer than the maximum age.
    Age,
    /// Removed to free space.
    Space,
}

impl GcReason {
    /// The metric's label: `age` or `space`.
    pub fn as_str(self) -> &'static str {
        match self {
            GcReason::Age => "age",
            GcReason::Space => "space",
        }
    }
}

/// What a pass removed: each image's ID and why, and the bytes freed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Freed {
    /// The images removed, in order.
    pub removed: Vec<(String, GcReason)>,
    /// Their sizes, summed.
    pub bytes: u64,
}

/// Why a pass did not free what it should have. The messages are the kubelet's.
#[derive(Debug, thiserror::Error)]
pub enum ImageGcError {
    /// The images could not be listed, or those in use not told.
    #[error("cannot list the images: {0}")]
    List(RuntimeError),
    /// The file system says it has no size.
    #[error("invalid capacity 0 on image filesystem")]
    InvalidCapacity,
    /// Fewer bytes could be freed than the low threshold asks for (the kubelet's `FreeDiskSpaceFailed` event).
    #[error(
        "Failed to garbage collect required amount of images. Attempted to free {wanted} bytes, but only found {freed} bytes eligible to free."
    )]
    NotEnough {
        /// The bytes asked for.
        wanted: u64,
        /// The bytes freed.
        freed: u64,
    },
    /// Some removals failed.
    #[error("wanted to free {wanted} bytes, but freed {freed} bytes space with errors in image deletion: {errors}")]
    Removal {
        /// The bytes asked for.
        wanted: u64,
        /// The bytes freed.
        freed: u64,
        /// The runtime's errors, joined.
        errors: String,
    },
}

impl ImageGcError {
    /// The kubelet's node event reason for this failure, where it has one of its own.
    pub fn event_reason(&self) -> Option<&'static str> {
        match self {
            ImageGcError::NotEnough { .. } => Some("FreeDiskSpaceFailed"),
            ImageGcError::InvalidCapacity => Some("InvalidDiskCapacity"),
            _ => None,
        }
    }
}

/// What the collector remembers of an image.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    first_detected: Instant,
    /// When a container last used it; `None` for an image no container has used since it was first seen.
    last_used: Option<Instant>,
    size_bytes: u64,
    pinned: bool,
}

impl Record {
    /// When it was last needed: its last use, or when it was first seen.
    fn last_needed(&self) -> Instant {
        self.last_used.unwrap_or(self.first_detected)
    }
}

/// The collector's memory of the node's images, between passes.
#[derive(Debug, Default)]
pub struct ImageGc {
    records: BTreeMap<String, Record>,
}

impl ImageGc {
    /// Reads the node's images and those in use at `now`: a new image is first seen now, one in use is used now,
    /// and an image gone is forgotten. In use: an image of a container the runtime holds, or one that `needed`
    /// (the images named by the pods the node runs, whose containers may have ended and been removed: one waiting
    /// out its back-off, an init container) names. Returns the IDs of the images not in use that the runtime does
    /// not pin, in the order they are collected: least recently used first (never used before any), then first
    /// seen first.
    pub async fn detect<I: ImageService>(
        &mut self,
        images: &I,
        needed: &BTreeSet<String>,
        now: Instant,
    ) -> Result<Vec<String>, RuntimeError> {
        let listed: Vec<NodeImage> = images.list_images().await?;
        let mut in_use: BTreeSet<String> = images.images_in_use().await?;
        for image in &listed {
            if image.names.iter().any(|n| needed.contains(&normalized(n))) {
                in_use.insert(image.id.clone());
            }
        }
        let current: BTreeSet<&str> = listed.iter().map(|i| i.id.as_str()).collect();
        self.records.retain(|id, _| current.contains(id.as_str()));
        for image in &listed {
            let r = self.records.entry(image.id.clone()).or_insert(Record {
                first_detected: now,
                last_used: None,
                size_bytes: 0,
                pinned: false,
            });
            if in_use.contains(&image.id) {
                r.last_used = Some(now);
            }
            r.size_bytes = image.size_bytes;
            r.pinned = image.pinned;
        }
        let mut unused: Vec<(&String, &Record)> =
            self.records.iter().filter(|(id, r)| !r.pinned && !in_use.contains(*id)).collect();
        unused.sort_by_key(|(id, r)| (r.last_used, r.first_detected, (*id).clone()));
        Ok(unused.into_iter().map(|(id, _)| id.clone()).collect())
    }

    /// Removes image `id` (a known one), forgets it and counts it in `freed` under `reason`; returns its size.
    async fn remove<I: ImageService>(
        &mut self,
        images: &I,
        id: &str,
        reason: GcReason,
        freed: &mut Freed,
    ) -> Result<u64, RuntimeError> {
        let size = self.records.get(id).map_or(0, |r| r.size_bytes);
        images.remove_image(id).await?;
        let why = match reason {
            GcReason::Age => "unused for longer than imageMaximumGCAge",
            GcReason::Space => "to free space",
        };
        tracing::info!(image = %id, bytes = size, "removed an image {why}");
        self.records.remove(id);
        freed.removed.push((id.to_owned(), reason));
        freed.bytes += size;
        Ok(size)
    }

    /// Removes, from `candidates` in order, the images unused for longer than `maximum_age` at `now`.
    async fn free_old<I: ImageService>(
        &mut self,
        images: &I,
        candidates: &mut Vec<String>,
        maximum_age: Duration,
        now: Instant,
        freed: &mut Freed,
    ) -> Vec<String> {
        let mut errors = Vec::new();
        let mut kept = Vec::new();
        for id in candidates.drain(..) {
            let Some(r) = self.records.get(&id) else { continue };
            if now.saturating_duration_since(r.last_needed()) <= maximum_age {
                kept.push(id);
                continue;
            }
            if let Err(e) = self.remove(images, &id, GcReason::Age, freed).await {
                errors.push(e.to_string());
                kept.push(id);
            }
        }
        *candidates = kept;
        errors
    }

    /// Removes images from `candidates` in order until `wanted` bytes are freed, passing over those seen for less
    /// than `minimum_age` at `now`.
    async fn free_space<I: ImageService>(
        &mut self,
        images: &I,
        candidates: &[String],
        wanted: u64,
        minimum_age: Duration,
        now: Instant,
        freed: &mut Freed,
    ) -> Vec<String> {
        let mut errors = Vec::new();
        let mut space = 0u64;
        for id in candidates {
            if space >= wanted {
                break;
            }
            let Some(r) = self.records.get(id) else { continue };
            if now.saturating_duration_since(r.first_detected) < minimum_age {
                continue;
            }
            match self.remove(images, id, GcReason::Space, freed).await {
                Ok(size) => space += size,
                Err(e) => errors.push(e.to_string()),
            }
        }
        errors
    }

    /// One pass at `now`, as the kubelet's every five minutes: the images over the maximum age, then, with the
    /// image file system (`fs`, read after those) over the high threshold, space down to the low one.
    pub async fn collect<I: ImageService>(
        &mut self,
        images: &I,
        needed: &BTreeSet<String>,
        policy: &ImageGcPolicy,
        fs: impl FnOnce() -> Option<ImageFs>,
        now: Instant,
    ) -> (Freed, Result<(), ImageGcError>) {
        let mut freed = Freed::default();
        let mut candidates = match self.detect(images, needed, now).await {
            Ok(c) => c,
            Err(e) => return (freed, Err(ImageGcError::List(e))),
        };
        if let Some(max) = policy.maximum_age {
            let errors = self.free_old(images, &mut candidates, max, now, &mut freed).await;
            if !errors.is_empty() {
                tracing::warn!(errors = %errors.join("; "), "cannot remove images unused for longer than imageMaximumGCAge");
            }
        }
        let Some(fs) = fs() else { return (freed, Ok(())) };
        if fs.capacity_bytes == 0 {
            return (freed, Err(ImageGcError::InvalidCapacity));
        }
        let available = fs.available_bytes.min(fs.capacity_bytes);
        let usage = 100 - available.saturating_mul(100) / fs.capacity_bytes;
        if policy.high_percent >= 100 || usage < u64::from(policy.high_percent) {
            return (freed, Ok(()));
        }
        let low_mark = u128::from(fs.capacity_bytes) * u128::from(100 - policy.low_percent.min(100)) / 100;
        let wanted = u64::try_from(low_mark).unwrap_or(u64::MAX).saturating_sub(available);
        tracing::info!(
            usage,
            high_threshold = policy.high_percent,
            low_threshold = policy.low_percent,
            bytes = wanted,
            "image file system usage is over the high threshold; freeing space down to the low threshold"
        );
        let before = freed.bytes;
        let errors = self.free_space(images, &candidates, wanted, policy.minimum_age, now, &mut freed).await;
        let space = freed.bytes - before;
        let result = if !errors.is_empty() {
            Err(ImageGcError::Removal { wanted, freed: space, errors: errors.join("; ") })
        } else if space < wanted {
            Err(ImageGcError::NotEnough { wanted, freed: space })
        } else {
            Ok(())
        };
        (freed, result)
    }

    /// Removes every image no container uses that is old enough, as the eviction manager's reclaim asks before
    /// it evicts a pod for disk.
    pub async fn delete_unused<I: ImageService>(
        &mut self,
        images: &I,
        needed: &BTreeSet<String>,
        minimum_age: Duration,
        now: Instant,
    ) -> Result<Freed, ImageGcError> {
        let candidates = self.detect(images, needed, now).await.map_err(ImageGcError::List)?;
        let mut freed = Freed::default();
        let errors = self.free_space(images, &candidates, u64::MAX, minimum_age, now, &mut freed).await;
        if errors.is_empty() {
            Ok(freed)
        } else {
            Err(ImageGcError::Removal { wanted: u64::MAX, freed: freed.bytes, errors: errors.join("; ") })
        }
    }
}

/// An image reference as the runtime lists it: the registry (`docker.io` where none is named) and, for Docker
/// Hub's official images, `library/`; `:latest` where neither a tag nor a digest is given.
pub(crate) fn normalized(image: &str) -> String {
    let (first, rest) = image.split_once('/').unwrap_or(("", image));
    let registry = first.contains('.') || first.contains(':') || first == "localhost";
    let path = match (registry, first) {
        (true, _) => image.to_owned(),
        (false, "") => format!("docker.io/library/{rest}"),
        (false, _) => format!("docker.io/{image}"),
    };
    let last = path.rsplit('/').next().unwrap_or_default();
    if last.contains(':') || last.contains('@') { path } else { format!("{path}:latest") }
}

/// The images the pods in `store` that are not over name, normalized: theirs while they run, whatever their
/// containers' state.
fn needed(store: &StatusStore) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for pod in store.pods() {
        if nodewarden_resources::pod::is_terminal_phase(&pod) {
            continue;
        }
        let Some(spec) = &pod.spec else { continue };
        let containers = spec.containers.iter().chain(spec.init_containers.iter().flatten());
        out.extend(containers.filter_map(|c| c.image.as_deref()).map(normalized));
    }
    out
}

/// What the reclaim of images needs from the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReclaimSettings {
    /// `imageMinimumGCAge`: a reclaim keeps the images seen for less than this, as a pass does.
    pub minimum_age: Duration,
    /// The images are on the node file system too (no dedicated imagefs): `nodefs` pressure reclaims them.
    pub shares_nodefs: bool,
}

/// The node's one image collector, for a runtime with images: the periodic passes and the eviction manager's
/// reclaim share its memory of when each image was first seen and last used.
pub struct ImageCollector<R: Runtime> {
    runtime: Arc<R>,
    /// The node's pods: the images they name are in use.
    store: Arc<StatusStore>,
    gc: Arc<tokio::sync::Mutex<ImageGc>>,
    settings: std::sync::Mutex<ReclaimSettings>,
    /// `kubelet_image_garbage_collected_total{reason}`.
    collected: IntCounterVec,
}

impl<R: Runtime> std::fmt::Debug for ImageCollector<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageCollector").finish_non_exhaustive()
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<R: Runtime> ImageCollector<R> {
    /// The collector of `runtime`'s images, keeping those `store`'s pods name and counting removals in
    /// `collected`; `None` for a runtime without images.
    pub fn new(runtime: Arc<R>, store: Arc<StatusStore>, collected: IntCounterVec) -> Option<Arc<Self>> {
        runtime.image_service()?;
        for reason in [GcReason::Age, GcReason::Space] {
            collected.with_label_values(&[reason.as_str()]);
        }
        Some(Arc::new(Self { runtime, store, gc: Arc::default(), settings: std::sync::Mutex::default(), collected }))
    }

    /// Sets what the reclaim follows (from the configuration in force).
    pub fn set_reclaim(&self, settings: ReclaimSettings) {
        *lock(&self.settings) = settings;
    }

    /// Sets how many image pulls run at once (see [`ImageService::set_pull_limit`]).
    pub fn set_pull_limit(&self, limit: Option<u32>) {
        if let Some(images) = self.runtime.image_service() {
            images.set_pull_limit(limit);
        }
    }

    /// Reads the node's images at `now`, so that their ages count from here.
    pub async fn detect(&self, now: Instant) -> Result<(), RuntimeError> {
        let Some(images) = self.runtime.image_service() else { return Ok(()) };
        self.gc.lock().await.detect(images, &needed(&self.store), now).await.map(drop)
    }

    /// One periodic pass (see [`ImageGc::collect`]), counted.
    pub async fn collect(
        &self,
        policy: &ImageGcPolicy,
        fs: impl FnOnce() -> Option<ImageFs>,
        now: Instant,
    ) -> (Freed, Result<(), ImageGcError>) {
        let Some(images) = self.runtime.image_service() else { return (Freed::default(), Ok(())) };
        let needed = needed(&self.store);
        let (freed, result) = self.gc.lock().await.collect(images, &needed, policy, fs, now).await;
        count(&self.collected, &freed);
        (freed, result)
    }

    /// The file system the runtime names for its images now, if it names one and answers.
    pub async fn image_fs(&self) -> Option<std::path::PathBuf> {
        match self.runtime.image_service()?.image_fs().await {
            Ok(named) => named,
            Err(e) => {
                tracing::debug!(error = %e, "cannot ask the runtime for its image file system");
                None
            }
        }
    }

    /// Whether removing images frees what `signal` measures.
    pub fn covers(&self, signal: Signal) -> bool {
        match signal {
            Signal::ImageFsAvailable | Signal::ImageFsInodesFree => true,
            Signal::NodeFsAvailable | Signal::NodeFsInodesFree => lock(&self.settings).shares_nodefs,
            _ => false,
        }
    }

    /// The eviction manager's reclaim of images, to run as a task: removes every unused image old enough; what it
    /// removed (`None` when nothing).
    pub(crate) fn reclaim(&self) -> impl Future<Output = Removed> + Send + use<R> {
        let (runtime, gc, collected) = (self.runtime.clone(), self.gc.clone(), self.collected.clone());
        let minimum_age = lock(&self.settings).minimum_age;
        let store = self.store.clone();
        async move {
            let images = runtime.image_service()?;
            let needed = needed(&store);
            let result = gc.lock().await.delete_unused(images, &needed, minimum_age, Instant::now()).await;
            let freed = match result {
                Ok(freed) => freed,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot remove every unused image to reclaim disk space");
                    return None;
                }
            };
            count(&collected, &freed);
            tracing::info!(
                images = freed.removed.len(),
                bytes = freed.bytes,
                "removed unused images to reclaim disk space before evicting"
            );
            (!freed.removed.is_empty()).then_some(freed.bytes)
        }
    }
}

/// Counts the removals of `freed` by reason.
fn count(collected: &IntCounterVec, freed: &Freed) {
    for (_, reason) in &freed.removed {
        collected.with_label_values(&[reason.as_str()]).inc();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use nodewarden_runtime::{ContainerSpec, PulledImage};

    use super::*;

    /// A runtime's images: by ID, each with its size and whether it is pinned; those in use; removals written
    /// down, and IDs whose removal fails.
    #[derive(Default)]
    struct Images {
        images: Mutex<BTreeMap<String, (u64, bool)>>,
        in_use: Mutex<BTreeSet<String>>,
        removed: Mutex<Vec<String>>,
        refuse: BTreeSet<String>,
        /// The name each image is listed under, by ID.
        names: BTreeMap<String, String>,
    }

    impl Images {
        fn with(images: &[(&str, u64)]) -> Self {
            let images = images.iter().map(|(id, size)| ((*id).to_owned(), (*size, id.contains("pause")))).collect();
            Images { images: Mutex::new(images), ..Images::default() }
        }

        fn use_only(&self, ids: &[&str]) {
            *self.in_use.lock().unwrap() = ids.iter().map(|i| (*i).to_owned()).collect();
        }

        fn removed(&self) -> Vec<String> {
            std::mem::take(&mut *self.removed.lock().unwrap())
        }
    }

    impl ImageService for Images {
        async fn image_present(&self, image: &str) -> Result<bool, RuntimeError> {
            Ok(self.images.lock().unwrap().contains_key(image))
        }

        async fn pull_image(&self, _spec: &ContainerSpec) -> Result<PulledImage, RuntimeError> {
            Err(RuntimeError::Other("no pulls here".into()))
        }

        async fn list_images(&self) -> Result<Vec<NodeImage>, RuntimeError> {
            let images = self.images.lock().unwrap();
            let image = |(id, (size, pinned)): (&String, &(u64, bool))| NodeImage {
                id: id.clone(),
                names: self.names.get(id).cloned().into_iter().collect(),
                size_bytes: *size,
                pinned: *pinned,
            };
            Ok(images.iter().map(image).collect())
        }

        async fn images_in_use(&self) -> Result<BTreeSet<String>, RuntimeError> {
            Ok(self.in_use.lock().unwrap().clone())
        }

        async fn remove_image(&self, id: &str) -> Result<(), RuntimeError> {
            if self.refuse.contains(id) {
                return Err(RuntimeError::Other(format!("image {id} is busy")));
            }
            self.images.lock().unwrap().remove(id);
            self.removed.lock().unwrap().push(id.to_owned());
            Ok(())
        }

        async fn writable_layers(&self) -> Result<Vec<nodewarden_runtime::WritableLayer>, RuntimeError> {
            Ok(Vec::new())
        }
    }

    const MIB: u64 = 1 << 20;

    /// No pod names an image.
    fn none() -> BTreeSet<String> {
        BTreeSet::new()
    }

    fn policy() -> ImageGcPolicy {
        ImageGcPolicy { high_percent: 85, low_percent: 80, minimum_age: Duration::from_secs(120), maximum_age: None }
    }

    /// A file system of 100 MiB with `used` MiB used.
    fn fs(used: u64) -> impl FnOnce() -> Option<ImageFs> {
        move || Some(ImageFs { capacity_bytes: 100 * MIB, available_bytes: (100 - used) * MIB })
    }

    #[tokio::test(start_paused = true)]
    async fn over_the_high_threshold_the_least_recently_used_go_first_down_to_the_low_one() {
        let images = Images::with(&[("a", 5 * MIB), ("b", 5 * MIB), ("c", 5 * MIB), ("pause", MIB)]);
        let mut gc = ImageGc::default();
        let t0 = Instant::now();
        // a used now, then b, then c later: a is the least recently used.
        images.use_only(&["a"]);
        gc.detect(&images, &none(), t0).await.unwrap();
        tokio::time::advance(Duration::from_secs(60)).await;
        images.use_only(&["b"]);
        gc.detect(&images, &none(), Instant::now()).await.unwrap();
        tokio::time::advance(Duration::from_secs(60)).await;
        images.use_only(&["c"]);
        gc.detect(&images, &none(), Instant::now()).await.unwrap();
        // Under the high threshold: nothing.
        images.use_only(&[]);
        let (freed, r) = gc.collect(&images, &none(), &policy(), fs(84), Instant::now()).await;
        assert!(r.is_ok() && freed.removed.is_empty(), "{freed:?} {r:?}");
        // At 90 %: 10 MiB to free for 80 %: a then b; c and the pinned pause image stay.
        let (freed, r) = gc.collect(&images, &none(), &policy(), fs(90), Instant::now()).await;
        r.unwrap();
        assert_eq!(images.removed(), ["a", "b"]);
        assert_eq!((freed.bytes, freed.removed[0].1), (10 * MIB, GcReason::Space));
        // At 90 % again with only c left: 5 MiB freed of 10, said as the kubelet says it.
        let (freed, r) = gc.collect(&images, &none(), &policy(), fs(90), Instant::now()).await;
        let e = r.unwrap_err();
        assert_eq!(freed.bytes, 5 * MIB);
        assert_eq!(e.event_reason(), Some("FreeDiskSpaceFailed"));
        assert_eq!(
            e.to_string(),
            format!(
                "Failed to garbage collect required amount of images. Attempted to free {} bytes, but only found {} bytes eligible to free.",
                10 * MIB,
                5 * MIB
            )
        );
    }

    #[tokio::test(start_paused = true)]
    async fn images_in_use_pinned_or_too_young_are_kept() {
        let images = Images::with(&[("used", 10 * MIB), ("young", 10 * MIB), ("pause", 10 * MIB), ("old", MIB)]);
        let mut gc = ImageGc::default();
        images.images.lock().unwrap().remove("young");
        gc.detect(&images, &none(), Instant::now()).await.unwrap();
        tokio::time::advance(Duration::from_secs(300)).await;
        images.images.lock().unwrap().insert("young".into(), (10 * MIB, false));
        images.use_only(&["used"]);
        let (freed, r) = gc.collect(&images, &none(), &policy(), fs(99), Instant::now()).await;
        assert_eq!(images.removed(), ["old"], "only the old unused image");
        assert_eq!(freed.bytes, MIB);
        assert!(matches!(r, Err(ImageGcError::NotEnough { .. })), "{r:?}");
        // Once old enough, the young one goes too; the threshold 100 turns the collector off.
        tokio::time::advance(Duration::from_secs(120)).await;
        let off = ImageGcPolicy { high_percent: 100, ..policy() };
        let (freed, r) = gc.collect(&images, &none(), &off, fs(99), Instant::now()).await;
        assert!(r.is_ok() && freed.removed.is_empty());
        gc.collect(&images, &none(), &policy(), fs(99), Instant::now()).await.1.unwrap_err();
        assert_eq!(images.removed(), ["young"]);
    }

    #[tokio::test(start_paused = true)]
    async fn images_unused_past_the_maximum_age_go_whatever_the_usage() {
        let images = Images::with(&[("a", MIB), ("b", MIB)]);
        let mut gc = ImageGc::default();
        images.use_only(&["a", "b"]);
        gc.detect(&images, &none(), Instant::now()).await.unwrap();
        tokio::time::advance(Duration::from_secs(3000)).await;
        images.use_only(&["b"]);
        gc.detect(&images, &none(), Instant::now()).await.unwrap();
        images.use_only(&[]);
        tokio::time::advance(Duration::from_secs(700)).await;
        let aged = ImageGcPolicy { maximum_age: Some(Duration::from_secs(3600)), ..policy() };
        let (freed, r) = gc.collect(&images, &none(), &aged, fs(10), Instant::now()).await;
        r.unwrap();
        assert_eq!(freed.removed, [("a".to_owned(), GcReason::Age)], "a was last used 3700 s ago, b 700 s ago");
        assert_eq!(images.removed(), ["a"]);
    }

    #[test]
    fn references_are_normalized_as_the_runtime_lists_them() {
        assert_eq!(normalized("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(normalized("busybox:1.36"), "docker.io/library/busybox:1.36");
        assert_eq!(normalized("grafana/agent"), "docker.io/grafana/agent:latest");
        assert_eq!(normalized("localhost/busybox:1"), "localhost/busybox:1");
        assert_eq!(normalized("reg.example:5000/team/app"), "reg.example:5000/team/app:latest");
        assert_eq!(normalized("quay.io/x/y@sha256:ab"), "quay.io/x/y@sha256:ab");
    }

    #[tokio::test(start_paused = true)]
    async fn an_image_a_running_pod_names_is_kept_though_no_container_holds_it() {
        let mut images = Images::with(&[("a", 5 * MIB), ("b", 5 * MIB)]);
        images.names = [("a".to_owned(), "docker.io/library/busybox:latest".to_owned())].into();
        let mut gc = ImageGc::default();
        // A pod names busybox; its container ended and was removed, so no container holds the image.
        let needed: BTreeSet<String> = [normalized("busybox")].into();
        gc.detect(&images, &needed, Instant::now()).await.unwrap();
        tokio::time::advance(Duration::from_secs(600)).await;
        let (freed, _) = gc.collect(&images, &needed, &policy(), fs(99), Instant::now()).await;
        assert_eq!(freed.removed, [("b".to_owned(), GcReason::Space)], "busybox is a running pod's");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_removal_is_reported_and_the_rest_go_on() {
        let mut images = Images::with(&[("a", 5 * MIB), ("b", 5 * MIB), ("c", 5 * MIB)]);
        images.refuse.insert("a".into());
        let mut gc = ImageGc::default();
        gc.detect(&images, &none(), Instant::now()).await.unwrap();
        tokio::time::advance(Duration::from_secs(600)).await;
        let (freed, r) = gc.collect(&images, &none(), &policy(), fs(90), Instant::now()).await;
        assert_eq!(images.removed(), ["b", "c"]);
        assert_eq!(freed.bytes, 10 * MIB);
        let e = r.unwrap_err();
        assert!(e.to_string().contains("image a is busy"), "{e}");
        assert_eq!(e.event_reason(), None);
        // The reclaim before an eviction removes every unused image old enough.
        images.refuse.clear();
        let freed = gc.delete_unused(&images, &none(), Duration::from_secs(120), Instant::now()).await.unwrap();
        assert_eq!((images.removed(), freed.bytes), (vec!["a".to_owned()], 5 * MIB));
    }
}
