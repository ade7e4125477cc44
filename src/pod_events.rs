//! Where pod sync's events go: the daemon's log, one line each (a warning at `info`, a normal event at `debug`),
//! with the pod and container they are about; and, once the node has joined a cluster, the apiserver's Events
//! (through the node side's recorder, correlated as client-go does). A daemon that is joining keeps the events
//! of its first moments until the recorder is there, as the kubelet's broadcaster queues them.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use nodewarden_cluster::{NodeEvent, PodRef, Recorder};
use nodewarden_sync::{EventSink, EventType, PodEvent};

/// Events kept until the recorder is there; more are dropped.
const KEPT: usize = 1000;

/// Pods whose pull spans are kept until their start is observed; pulls of more pods are not counted.
const SPANS_KEPT: usize = 10_000;

/// Pod events as log lines, and as Events once a cluster is joined.
#[derive(Debug, Default)]
pub struct PodEvents {
    cluster: OnceLock<Recorder>,
    /// Whether a cluster is being joined: events are kept for it meanwhile.
    joining: AtomicBool,
    pending: Mutex<VecDeque<NodeEvent>>,
    /// By pod UID: from the start of its first image pull to the end of its last, until its start is observed.
    pulls: Mutex<BTreeMap<String, (Instant, Instant)>>,
}

impl PodEvents {
    /// Keeps the events from now on until [`PodEvents::join`].
    pub fn expect_cluster(&self) {
        self.joining.store(true, Ordering::SeqCst);
    }

    /// Posts the events kept and those from now on through `recorder` (once; a second call is ignored).
    pub fn join(&self, recorder: Recorder) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        for e in pending.drain(..) {
            recorder.send(e);
        }
        let _ = self.cluster.set(recorder);
        self.joining.store(true, Ordering::SeqCst);
    }

    /// Forgets the pull spans of the pods `keep` says no: those whose start is observed already or that are gone
    /// (a pull after a pod's start, a restart's, is no part of its start).
    pub fn retain_pulls(&self, keep: impl Fn(&str) -> bool) {
        self.pulls.lock().unwrap_or_else(PoisonError::into_inner).retain(|uid, _| keep(uid));
    }

    /// How long pod `uid` spent pulling images (from its first pull's start to its last pull's end, as the
    /// kubelet's startup latency tracker counts it), forgetting it: the pod startup SLI leaves that out.
    pub fn take_pull_time(&self, uid: &str) -> Duration {
        let span = self.pulls.lock().unwrap_or_else(PoisonError::into_inner).remove(uid);
        span.map_or(Duration::ZERO, |(first, last)| last.saturating_duration_since(first))
    }
}

/// Where container `name` is in the pod, as the kubelet's object references say it: `spec.initContainers{name}`
/// for an init container (a sidecar is one), else `spec.containers{name}`.
fn field_path(pod: &Pod, name: &str) -> String {
    let init =
        pod.spec.as_ref().and_then(|s| s.init_containers.as_ref()).is_some_and(|i| i.iter().any(|c| c.name == name));
    if init { format!("spec.initContainers{{{name}}}") } else { format!("spec.containers{{{name}}}") }
}

impl PodEvents {
    /// In a cluster, posts `e` about `about` (the node itself when `None`).
    fn post(&self, e: PodEvent, about: Option<PodRef>) {
        if !self.joining.load(Ordering::SeqCst) {
            return;
        }
        // Stamped now, as client-go stamps an event when it is recorded, however long it waits to be posted.
        let event = NodeEvent::now(e.event_type.as_str(), &e.reason, e.message, about);
        // The recorder is set only once the events kept have gone to it: from then on, no lock.
        if let Some(recorder) = self.cluster.get() {
            return recorder.send(event);
        }
        // Under the lock that `join` takes: an event is either kept and sent by it, or sent after it.
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        match self.cluster.get() {
            Some(recorder) => recorder.send(event),
            None if pending.len() < KEPT => pending.push_back(event),
            None => {
                tracing::debug!(reason = %event.reason, "pod event dropped: too many kept before the cluster joined")
            }
        }
    }
}

impl EventSink for PodEvents {
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
        let about = PodRef {
            namespace: pod.metadata.namespace.clone().unwrap_or_else(|| "default".to_owned()),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: uid.to_owned(),
            field_path: e.container.as_deref().map(|c| field_path(pod, c)),
        };
        self.post(e, Some(about));
    }

    fn image_pulled(&self, pod: &Pod, began: Instant, ended: Instant) {
        let Some(uid) = pod.metadata.uid.as_deref() else { return };
        let mut pulls = self.pulls.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((first, last)) = pulls.get_mut(uid) {
            *first = (*first).min(began);
            *last = (*last).max(ended);
        } else if pulls.len() < SPANS_KEPT {
            pulls.insert(uid.to_owned(), (began, ended));
        }
    }

    fn node_event(&self, e: PodEvent) {
        match e.event_type {
            EventType::Warning => tracing::info!(reason = %e.reason, "{}", e.message),
            EventType::Normal => tracing::debug!(reason = %e.reason, "{}", e.message),
        }
        self.post(e, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use nodewarden_cluster::Clients;
    use nodewarden_testapi::TestApi;
    use serde_json::Value;
    use tokio_util::sync::CancellationToken;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns1", "uid": "u-1"},
            "spec": {"containers": [{"name": "app"}], "initContainers": [{"name": "setup"}]}
        }))
        .unwrap()
    }

    fn event(reason: &str, container: Option<&str>) -> PodEvent {
        PodEvent {
            event_type: EventType::Normal,
            reason: reason.into(),
            message: format!("{reason} container app"),
            container: container.map(str::to_owned),
        }
    }

    #[test]
    fn a_pods_pull_time_spans_its_first_pull_to_its_last_and_is_taken_once() {
        let events = PodEvents::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Two containers' pulls, overlapping: from the first start to the last end, as the kubelet counts.
        events.image_pulled(&pod(), at(1), at(4));
        events.image_pulled(&pod(), at(2), at(6));
        assert_eq!(events.take_pull_time("u-1"), Duration::from_secs(5));
        assert_eq!(events.take_pull_time("u-1"), Duration::ZERO, "forgotten once taken");
        assert_eq!(events.take_pull_time("other"), Duration::ZERO);
    }

    #[tokio::test]
    async fn the_events_of_a_joining_node_are_kept_then_posted_about_the_pod_in_its_namespace() {
        let api = TestApi::start(0).await.unwrap();
        api.add_token("t", Some("n1"));
        let ns = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns1"}});
        api.create("namespaces", None, ns).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = api.write_kubeconfig(dir.path(), "t").unwrap();
        let clients = Clients::from_kubeconfig(&kubeconfig, 50.0, 100, Duration::from_secs(5)).await.unwrap();
        let (recorder, poster) = Recorder::new("n1", clients, None);
        let stop = CancellationToken::new();
        tokio::spawn(poster.run(stop.clone()));

        let events = PodEvents::default();
        // Not joining: only logged.
        events.pod_event(&pod(), event("Pulled", Some("app")));
        events.expect_cluster();
        events.pod_event(&pod(), event("Created", Some("app")));
        events.pod_event(&pod(), event("Started", Some("app")));
        events.pod_event(&pod(), event("Pulled", Some("setup")));
        let kept_at = jiff::Timestamp::now();
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert!(api.list("events", Some("ns1")).is_empty(), "posted before the node side was there");
        events.join(recorder);
        events.pod_event(&pod(), event("Killing", None));
        let reasons =
            || -> Vec<Value> { api.list("events", Some("ns1")).iter().map(|e| e["reason"].clone()).collect() };
        let start = Instant::now();
        while reasons().len() < 4 {
            assert!(start.elapsed() < Duration::from_secs(10), "the events: {:?}", reasons());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let all = api.list("events", Some("ns1"));
        let started = all.iter().find(|e| e["reason"] == "Started").unwrap();
        let o = &started["involvedObject"];
        assert_eq!(
            (&o["kind"], &o["name"], &o["namespace"], &o["uid"]),
            (&"Pod".into(), &"web".into(), &"ns1".into(), &"u-1".into())
        );
        assert_eq!(o["fieldPath"], "spec.containers{app}");
        assert_eq!(started["source"]["host"], "n1");
        let killing = all.iter().find(|e| e["reason"] == "Killing").unwrap();
        assert_eq!(killing["involvedObject"]["fieldPath"], Value::Null);
        let pulled: Vec<&Value> = all.iter().filter(|e| e["reason"] == "Pulled").collect();
        assert_eq!(pulled.len(), 1, "only the event from after expect_cluster was kept: {pulled:?}");
        assert_eq!(pulled[0]["involvedObject"]["fieldPath"], "spec.initContainers{setup}");
        // Kept events carry the time they happened, not the time they were posted.
        let stamped: jiff::Timestamp = started["lastTimestamp"].as_str().unwrap().parse().unwrap();
        assert!(stamped <= kept_at, "stamped {stamped} after it was kept ({kept_at})");
        stop.cancel();
    }
}
