//! Pod lifecycle for nodewarden: pod sources (static manifests, later an apiserver), per-pod workers, the syncPod
//! steps and the runtimes that carry them out.
//!
//! Empty until the pod sync work lands; the crate exists so that the workspace has its final shape and the
//! dependency direction (sync depends on resources, never the reverse) is fixed from the start.
