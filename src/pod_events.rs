//! Where pod sync's events go: the daemon's log, one line each (a warning at `info`, a normal event at `debug`),
//! with the pod and container they are about. Once pods come from an apiserver, its Events follow from here.

use k8s_openapi::api::core::v1::Pod;
use nodewarden_sync::{EventSink, EventType, PodEvent};

/// Pod events as log lines.
#[derive(Debug, Default)]
pub struct LoggedEvents;

impl EventSink for LoggedEvents {
    fn pod_event(&self, pod: &Pod, e: PodEvent) {
        let name = nodewarden_resources::pod::full_name(pod);
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let container = e.container.as_deref().unwrap_or_default();
        match e.event_type {
            EventType::Warning => {
                tracing::info!(pod = %name, pod_uid = %uid, container, reason = %e.reason, "{}", e.message);
            }
            EventType::Normal => {
                tracing::debug!(pod = %name, pod_uid = %uid, container, reason = %e.reason, "{}", e.message);
            }
        }
    }
}
