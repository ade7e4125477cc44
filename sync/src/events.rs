//! The pod events pod sync records, in the kubelet's reasons and messages, and the port they leave through
//! ([`EventSink`], implemented by the daemon). The pod worker's transitions name what happened ([`Happened`]);
//! the words are made here, once.

use k8s_openapi::api::core::v1::Pod;
use nodewarden_resources::pod::kubelet_ref;

use crate::probe::ProbeKind;

/// An event's type, as `core/v1` Events have it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Something that went as it should.
    Normal,
    /// Something an operator may need to look at.
    Warning,
}

impl EventType {
    /// `Normal` or `Warning`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// One event about a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEvent {
    /// Normal or warning.
    pub event_type: EventType,
    /// The kubelet's reason (`Started`, `BackOff`, `Unhealthy`, ...).
    pub reason: String,
    /// The kubelet's message.
    pub message: String,
    /// The container it is about (the event's `involvedObject.fieldPath` is `spec.containers{name}`), if any.
    pub container: Option<String>,
}

/// Where pod events go: the daemon's side (its log; an apiserver's Events once the node is in a cluster).
pub trait EventSink: Send + Sync + 'static {
    /// Records `event` about `pod`. Called on the pod's worker: it must not block.
    fn pod_event(&self, pod: &Pod, event: PodEvent);

    /// Records `event` about the node itself (its `container` is `None`). Must not block.
    fn node_event(&self, event: PodEvent);

    /// A pull of one of `pod`'s images ran from `began` to `ended`: the pod startup SLI leaves pulls out. The
    /// default forgets it. Must not block.
    fn image_pulled(&self, pod: &Pod, began: tokio::time::Instant, ended: tokio::time::Instant) {
        let _ = (pod, began, ended);
    }
}

/// What a pod worker's transition saw happen, by container index where it is about one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Happened {
    /// A container was created (the runtime made it).
    Created(usize),
    /// A container started.
    Started(usize),
    /// A container could not be started, with the kubelet's reason and the runtime's message.
    StartFailed { index: usize, message: String },
    /// A container's restart waits out its crash-loop back-off.
    BackOff(usize),
    /// A probe failed, with its output.
    Unhealthy { index: usize, kind: ProbeKind, output: String },
    /// A container is stopped: after a failed liveness or startup probe (`probe`), or with its pod.
    Killing { index: usize, probe: Option<ProbeKind> },
    /// A container is stopped because its definition changed (a new image); it is started again with it.
    Redefined(usize),
    /// What happened to a container's image: present, pulled, or why not.
    Image { index: usize, image: String, what: crate::images::ImageEvent },
    /// A container's image pull failed and waits out its back-off before the next try.
    ImageBackOff(usize),
    /// Admission refused the pod, with its reason (`OutOfmemory`, ...) and message.
    Refused { reason: String, message: String },
    /// The pod's volumes could not be made.
    FailedMount(String),
    /// The pod's sandbox could not be made.
    FailedSandbox(String),
}

impl Happened {
    /// The event in the kubelet's words; `containers` are the pod's container names by index.
    pub(crate) fn event(&self, pod: &Pod, containers: &[&str]) -> PodEvent {
        use EventType::{Normal, Warning};
        let name = |i: &usize| containers.get(*i).copied().unwrap_or_default().to_owned();
        let (event_type, reason, message, container) = match self {
            Happened::Created(i) => (Normal, "Created", format!("Created container: {}", name(i)), Some(name(i))),
            Happened::Started(i) => (Normal, "Started", format!("Started container {}", name(i)), Some(name(i))),
            Happened::StartFailed { index, message } => {
                (Warning, "Failed", format!("Error: {message}"), Some(name(index)))
            }
            Happened::BackOff(i) => (
                Warning,
                "BackOff",
                format!("Back-off restarting failed container {} in pod {}", name(i), kubelet_ref(pod)),
                Some(name(i)),
            ),
            Happened::Unhealthy { index, kind, output } => {
                (Warning, "Unhealthy", format!("{} probe failed: {output}", kind.as_str()), Some(name(index)))
            }
            Happened::Killing { index, probe: Some(kind) } => (
                Normal,
                "Killing",
                format!("Container {} failed {} probe, will be restarted", name(index), kind.as_str().to_lowercase()),
                Some(name(index)),
            ),
            Happened::Killing { index, probe: None } => {
                (Normal, "Killing", format!("Stopping container {}", name(index)), Some(name(index)))
            }
            Happened::Redefined(i) => (
                Normal,
                "Killing",
                format!("Container {} definition changed, will be restarted", name(i)),
                Some(name(i)),
            ),
            Happened::Image { index, image, what } => {
                let (warning, reason, message) = what.words(image);
                (if warning { Warning } else { Normal }, reason, message, Some(name(index)))
            }
            Happened::ImageBackOff(i) => {
                let c = pod.spec.iter().flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers));
                let image = c.filter(|c| c.name == name(i)).find_map(|c| c.image.clone()).unwrap_or_default();
                (Normal, "BackOff", format!("Back-off pulling image {image:?}"), Some(name(i)))
            }
            Happened::Refused { reason, message } => (Warning, reason.as_str(), message.clone(), None),
            Happened::FailedMount(why) => (Warning, crate::volumes::VolumeError::REASON, why.clone(), None),
            Happened::FailedSandbox(why) => {
                (Warning, "FailedCreatePodSandBox", format!("Failed to create pod sandbox: {why}"), None)
            }
        };
        PodEvent { event_type, reason: reason.to_owned(), message, container }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_have_the_kubelets_reasons_and_messages() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1"}
        }))
        .unwrap();
        let names = ["app", "side"];
        let text = |h: Happened| {
            let e = h.event(&pod, &names);
            (e.event_type.as_str(), e.reason, e.message)
        };
        assert_eq!(text(Happened::Started(1)), ("Normal", "Started".into(), "Started container side".into()));
        assert_eq!(text(Happened::Created(0)).2, "Created container: app");
        assert_eq!(
            text(Happened::BackOff(0)),
            ("Warning", "BackOff".into(), "Back-off restarting failed container app in pod web_shop(u1)".into())
        );
        assert_eq!(
            text(Happened::Unhealthy {
                index: 0,
                kind: ProbeKind::Liveness,
                output: "HTTP probe failed with statuscode: 500".into()
            }),
            ("Warning", "Unhealthy".into(), "Liveness probe failed: HTTP probe failed with statuscode: 500".into())
        );
        assert_eq!(
            text(Happened::Killing { index: 0, probe: Some(ProbeKind::Liveness) }).2,
            "Container app failed liveness probe, will be restarted"
        );
        assert_eq!(text(Happened::Killing { index: 1, probe: None }).2, "Stopping container side");
        assert_eq!(
            text(Happened::StartFailed { index: 0, message: "ErrImagePull".into() }),
            ("Warning", "Failed".into(), "Error: ErrImagePull".into())
        );
        let refused = Happened::Refused {
            reason: "OutOfmemory".into(),
            message: "Node didn't have enough resource: memory".into(),
        };
        assert_eq!(text(refused).1, "OutOfmemory");
        assert_eq!(text(Happened::FailedSandbox("no network".into())).2, "Failed to create pod sandbox: no network");
        assert_eq!(Happened::Started(7).event(&pod, &names).container.as_deref(), Some(""), "an index out of range");
    }
}
