//! Pod lifecycle for nodewarden: pod sources (the static pod directory; an apiserver source can follow), one worker
//! per pod running the kubelet's syncPod steps, the restart policy with the crash-loop back-off, probes, graceful
//! termination and pod status. The runtimes that carry it out are `nodewarden-runtime`'s.
//!
//! Pod sync is a client of `nodewarden-resources`: it asks for admission and placement and never writes cgroupfs
//! itself; the runtime starts each container in the cgroup the resources crate made for it.

mod atomic_writer;
mod backoff;
mod container_gc;
pub mod disk_usage;
mod env;
mod events;
mod evictor;
mod feed;
pub mod fuzzing;
mod image_gc;
mod images;
mod layers;
mod local_storage;
mod logs;
mod manager;
mod manifest;
mod metrics;
mod objects;
mod probe;
mod projection;
mod pull_secrets;
mod quota;
mod reclaim;
mod source;
mod spec;
mod state;
mod status;
mod store;
mod subpath;
mod volumes;
mod worker;

pub use container_gc::DeadContainerPolicy;
pub use events::{EventSink, EventType, PodEvent};
pub use feed::{StatusReader, StatusUpdate};
pub use image_gc::{Freed, GcReason, ImageCollector, ImageFs, ImageGc, ImageGcError, ImageGcPolicy, ReclaimSettings};
pub use layers::{MEASURE_PERIOD, measure_writable_layers};
pub use local_storage::enforce_local_storage;
pub use logs::LogRotation;
pub use manager::{MAX_WORKER_PANICS, ORPHAN_GRACE, PodManager, RunningPod, STUCK_AFTER, TICK, TerminateError};
pub use manifest::{
    CONFIG_HASH_ANNOTATION, CONFIG_SOURCE_ANNOTATION, HTTP_SOURCE, MAX_MANIFEST_BYTES, ManifestError, check_api_pod,
    parse_static_pod, parse_url_pods, read_manifest,
};
pub use metrics::SyncMetrics;
pub use objects::{
    NoObjects, ObjectData, ObjectError, ObjectFuture, ObjectKind, ObjectMap, PodObjects, ServiceAddress, ServicePort,
    Token, TokenAsk,
};
pub use probe::{HTTP_HEAD_LIMIT, has_status_line, http_probe_passes, http_probe_request, http_status_code};
pub use reclaim::RECLAIM_WAIT;
pub use source::{
    API_SOURCE, FILE_SOURCE, InvalidManifest, PodSource, SourceSnapshot, StaticPodSource, from_apiserver,
    is_ignored_file,
};
pub use spec::{PodContext, PodIps, container_spec, sandbox_spec};
pub use state::{
    SavedContainer, SavedPod, WriteError as StateWriteError, mark as mark_pod_dir, save as save_pod_state,
};
pub use status::{PodPhase, SHUTDOWN_MESSAGE, SHUTDOWN_REASON, Terminal};
pub use store::{MANIFEST_ANNOTATION, StatusStore, WORKER_CONDITION};
pub use worker::SyncSettings;

/// The ports pod sync leaves through that the daemon implements: where pod events go and where the objects pods
/// reference come from.
#[derive(Clone)]
pub struct Ports {
    /// The event sink.
    pub events: std::sync::Arc<dyn EventSink>,
    /// The ConfigMaps, Secrets and tokens.
    pub objects: std::sync::Arc<dyn PodObjects>,
}
