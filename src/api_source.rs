//! The apiserver as a source of pods: each set of the node's pods the watch hands over (see
//! `nodewarden_cluster::watch_pods`) becomes a snapshot of source `api` for pod sync. Mirror pods are left out
//! (they are the apiserver's copies of static pods), each pod carries `kubernetes.io/config.source: api`, and
//! what only the apiserver keeps (the status it was last told, the resource version) is dropped, so that the
//! node's own status writes do not read as changes of the pod.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use nodewarden_cluster::{PodSet, is_mirror};
use nodewarden_resources::pod::full_name;
use nodewarden_sync::{
    API_SOURCE, CONFIG_SOURCE_ANNOTATION, InvalidManifest, ManifestError, PodSource, SourceSnapshot, check_api_pod,
};
use prometheus::Histogram;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// The node's pods from the apiserver, as a pod source.
pub struct ApiPodSource {
    /// The latest complete set (none before the first list is complete).
    pub pods: watch::Receiver<Option<Arc<PodSet>>>,
    /// `kubelet_pod_start_sli_duration_seconds`.
    pub start_sli: Histogram,
    /// The pods' image pulls, which the SLI leaves out.
    pub pulls: Arc<crate::pod_events::PodEvents>,
}

impl PodSource for ApiPodSource {
    async fn run(mut self, tx: mpsc::Sender<SourceSnapshot>, shutdown: CancellationToken) {
        let mut starts = Starts::default();
        let mut converted = Converted::default();
        // The refusals logged already (each is logged once, not on every change of the set).
        let mut logged = BTreeSet::new();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                changed = self.pods.changed() => if changed.is_err() { return },
            }
            // The latest set only: sets that came while the manager was busy are passed over.
            let Some(set) = self.pods.borrow_and_update().clone() else { continue };
            for (uid, pod, took) in starts.observe(&set, Timestamp::now()) {
                let pulling = self.pulls.take_pull_time(&uid).as_secs_f64();
                let took = (took - pulling).max(0.0);
                tracing::info!(pod = %pod, seconds = took, pulling, "observed the pod's start through the watch");
                self.start_sli.observe(took);
            }
            self.pulls.retain_pulls(|uid| starts.waiting.contains_key(uid));
            let snapshot = converted.snapshot(&set);
            for refused in snapshot.invalid.iter().filter(|r| !logged.contains(&r.path)) {
                tracing::warn!(pod = %refused.path.display(), error = %refused.error, "a pod from the apiserver is refused");
            }
            logged = snapshot.invalid.iter().map(|r| r.path.clone()).collect();
            tokio::select! {
                () = shutdown.cancelled() => return,
                sent = tx.send(snapshot) => if sent.is_err() { return },
            }
        }
    }
}

/// The pod startup SLI as the kubelet measures it: from a pod's creation to the moment the watch shows all its
/// containers running, for pods first seen not running; the time its image pulls took is taken out by the caller.
#[derive(Debug, Default)]
struct Starts {
    /// Every pod of the last set.
    seen: BTreeSet<String>,
    /// The pods not running yet, with their creation time.
    waiting: BTreeMap<String, Timestamp>,
}

impl Starts {
    /// The pods of `set` whose start is observed now: their UIDs, namespaced names and seconds from their creation.
    fn observe(&mut self, set: &PodSet, now: Timestamp) -> Vec<(String, String, f64)> {
        let mut out = Vec::new();
        for (uid, pod) in set.iter().filter(|(_, p)| !is_mirror(p)) {
            let new = self.seen.insert(uid.clone());
            if all_running(pod) {
                if let Some(created) = self.waiting.remove(uid) {
                    let took = now.duration_since(created).as_secs_f64().max(0.0);
                    out.push((uid.clone(), full_name(pod), took));
                }
            } else if new && let Some(created) = &pod.metadata.creation_timestamp {
                self.waiting.insert(uid.clone(), created.0);
            }
        }
        self.seen.retain(|uid| set.contains_key(uid));
        self.waiting.retain(|uid, _| set.contains_key(uid));
        out
    }
}

/// Whether each of the pod's containers is running, as its status in the apiserver says.
fn all_running(pod: &Pod) -> bool {
    let wanted = pod.spec.as_ref().map_or(0, |s| s.containers.len());
    let statuses = pod.status.as_ref().and_then(|s| s.container_statuses.as_ref());
    statuses.is_some_and(|c| {
        wanted > 0 && c.len() == wanted && c.iter().all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
    })
}

/// The pods of the last snapshot as pod sync took them, by UID: the apiserver's copy each was made from, and what
/// it became (or why it was refused). The watch hands over a whole set on every change of one pod; a pod whose
/// copy is the same `Arc` as last time is neither checked nor converted again, and one whose new copy converts
/// to the same pod (the node's own status write, echoed by the watch) keeps its `Arc`, so pod sync passes over
/// both without comparing them. A burst of a hundred pods costs a hundred conversions, not ten thousand.
#[derive(Debug, Default)]
struct Converted(HashMap<String, (Arc<Pod>, Conversion)>);

/// A pod of the apiserver as pod sync takes it, or why it is refused.
type Conversion = Result<Arc<Pod>, ManifestError>;

impl Converted {
    /// The snapshot of a set of the apiserver's pods.
    fn snapshot(&mut self, set: &PodSet) -> SourceSnapshot {
        let mut pods = Vec::with_capacity(set.len());
        let mut invalid = Vec::new();
        let mut next = HashMap::with_capacity(set.len());
        for (uid, pod) in set.iter().filter(|(_, p)| !is_mirror(p)) {
            let converted = match self.0.remove(uid) {
                Some((from, done)) if Arc::ptr_eq(&from, pod) => done,
                Some((_, Ok(before))) => match convert(pod) {
                    Ok(p) if *p == *before => Ok(before),
                    other => other,
                },
                _ => convert(pod),
            };
            match &converted {
                Ok(p) => pods.push(p.clone()),
                Err(error) => {
                    invalid.push(InvalidManifest { path: PathBuf::from(full_name(pod)), error: error.clone() });
                }
            }
            next.insert(uid.clone(), (pod.clone(), converted));
        }
        self.0 = next;
        SourceSnapshot { source: API_SOURCE, pods, invalid }
    }
}

/// One pod of the apiserver, converted.
fn convert(pod: &Pod) -> Conversion {
    check_api_pod(pod)?;
    Ok(Arc::new(as_source_pod(pod)))
}

/// The pod as pod sync takes it: its spec and metadata, marked as the apiserver's, and of its status only a
/// terminal phase (a pod over is not run again) and the conditions its readiness gates name (others set them).
fn as_source_pod(pod: &Pod) -> Pod {
    let gates: Vec<&str> =
        pod.spec.iter().flat_map(|s| s.readiness_gates.iter().flatten()).map(|g| g.condition_type.as_str()).collect();
    let gated: Vec<PodCondition> = pod
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .filter(|c| gates.contains(&c.type_.as_str()))
        // Only what the gate reads: a heartbeat time that moves is no change of the pod.
        .map(|c| PodCondition { type_: c.type_.clone(), status: c.status.clone(), ..PodCondition::default() })
        .collect();
    let terminal = nodewarden_resources::pod::is_terminal_phase(pod);
    let status = (terminal || !gated.is_empty()).then(|| PodStatus {
        phase: if terminal { pod.status.as_ref().and_then(|s| s.phase.clone()) } else { None },
        conditions: (!gated.is_empty()).then_some(gated),
        ..PodStatus::default()
    });
    let mut p = Pod { metadata: pod.metadata.clone(), spec: pod.spec.clone(), status };
    p.metadata.resource_version = None;
    p.metadata.managed_fields = None;
    p.metadata.annotations.get_or_insert_default().insert(CONFIG_SOURCE_ANNOTATION.into(), API_SOURCE.into());
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, uid: &str, extra: serde_json::Value) -> Pod {
        let mut v = json!({
            "metadata": {"name": name, "namespace": "default", "uid": uid, "resourceVersion": "7"},
            "spec": {"nodeName": "n1", "containers": [{"name": "app", "image": "busybox"}]},
            "status": {"phase": "Running"},
        });
        if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
            for (k, x) in e {
                o.insert(k.clone(), x.clone());
            }
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn mirror_pods_are_left_out_and_the_rest_marked_as_the_apiservers() {
        let mirror = pod(
            "static-n1",
            "m1",
            json!({"metadata": {"name": "static-n1", "namespace": "kube-system", "uid": "m1",
                    "annotations": {"kubernetes.io/config.mirror": "abc"}}}),
        );
        let bad = pod("bad", "u2", json!({"spec": {"containers": []}}));
        let set = PodSet::from([
            ("u1".into(), Arc::new(pod("web", "u1", json!({})))),
            ("m1".into(), Arc::new(mirror)),
            ("u2".into(), Arc::new(bad)),
        ]);
        let s = Converted::default().snapshot(&set);
        assert_eq!(s.source, "api");
        assert_eq!(s.pods.len(), 1, "{:?}", s.pods);
        let p = &s.pods[0];
        assert_eq!(p.metadata.name.as_deref(), Some("web"));
        assert_eq!(p.metadata.annotations.as_ref().unwrap()["kubernetes.io/config.source"], "api");
        assert!(p.status.is_none() && p.metadata.resource_version.is_none(), "the apiserver's own fields: {p:?}");
        assert_eq!(s.invalid.len(), 1);
        assert_eq!(s.invalid[0].path, PathBuf::from("default/bad"));
    }

    #[test]
    fn a_pod_unchanged_for_pod_sync_is_handed_over_as_the_same_arc() {
        let mut converted = Converted::default();
        let web = Arc::new(pod("web", "u1", json!({})));
        let db = Arc::new(pod("db", "u2", json!({})));
        let first = converted.snapshot(&PodSet::from([("u1".into(), web.clone()), ("u2".into(), db.clone())]));
        let find = |s: &SourceSnapshot, name: &str| {
            s.pods.iter().find(|p| p.metadata.name.as_deref() == Some(name)).cloned().unwrap()
        };
        // The node's own status write comes back as a new copy with a new resourceVersion: the same pod.
        let mut echoed = pod("web", "u1", json!({"status": {"phase": "Pending"}}));
        echoed.metadata.resource_version = Some("8".into());
        let mut resized = (*db).clone();
        resized.spec.as_mut().unwrap().containers[0].image = Some("busybox:2".into());
        let second =
            converted.snapshot(&PodSet::from([("u1".into(), Arc::new(echoed)), ("u2".into(), Arc::new(resized))]));
        assert!(Arc::ptr_eq(&find(&first, "web"), &find(&second, "web")), "a status write changes nothing");
        assert!(!Arc::ptr_eq(&find(&first, "db"), &find(&second, "db")), "a new image is a change");
        assert_eq!(find(&second, "db").spec.as_ref().unwrap().containers[0].image.as_deref(), Some("busybox:2"));
        // A pod gone from the set is forgotten: back under its UID, it is converted anew.
        let third = converted.snapshot(&PodSet::from([("u1".into(), web.clone())]));
        assert_eq!(third.pods.len(), 1);
        assert!(!converted.0.contains_key("u2"));
    }

    #[test]
    fn of_the_status_only_the_conditions_readiness_gates_name_are_kept() {
        let gated = pod(
            "web",
            "u1",
            json!({
                "spec": {"nodeName": "n1", "containers": [{"name": "app", "image": "busybox"}],
                         "readinessGates": [{"conditionType": "example.com/lb"}]},
                "status": {"phase": "Running", "conditions": [
                    {"type": "Ready", "status": "False"},
                    {"type": "example.com/lb", "status": "True", "lastProbeTime": "2026-12-07T10:00:00Z"},
                ]},
            }),
        );
        let p = as_source_pod(&gated);
        let status = p.status.unwrap();
        assert_eq!(status.phase, None, "a running pod's phase is the node's to say");
        let conditions = status.conditions.unwrap();
        assert_eq!(conditions.len(), 1);
        assert_eq!((conditions[0].type_.as_str(), conditions[0].status.as_str()), ("example.com/lb", "True"));
        assert!(conditions[0].last_probe_time.is_none(), "a moving time is no change of the pod");
    }

    #[test]
    fn a_start_is_observed_from_creation_to_all_containers_running_for_pods_first_seen_waiting() {
        let created = json!({"metadata": {"name": "web", "namespace": "default", "uid": "u1",
            "creationTimestamp": "2026-12-06T10:00:00Z"}});
        let mut waiting = pod("web", "u1", created.clone());
        waiting.status = None;
        let running = pod(
            "web",
            "u1",
            json!({"metadata": created["metadata"].clone(),
            "status": {"phase": "Running", "containerStatuses": [{"name": "app", "image": "busybox", "imageID": "",
                "ready": true, "restartCount": 0, "state": {"running": {"startedAt": "2026-12-06T10:00:01Z"}}}]}}),
        );
        let at = |s: &str| -> Timestamp { s.parse().unwrap() };
        let mut starts = Starts::default();
        assert!(
            starts
                .observe(&PodSet::from([("u1".into(), Arc::new(waiting.clone()))]), at("2026-12-06T10:00:01Z"))
                .is_empty()
        );
        let seen =
            starts.observe(&PodSet::from([("u1".into(), Arc::new(running.clone()))]), at("2026-12-06T10:00:02.5Z"));
        assert_eq!(seen, [("u1".to_owned(), "default/web".to_owned(), 2.5)]);
        assert!(
            starts
                .observe(&PodSet::from([("u1".into(), Arc::new(running.clone()))]), at("2026-12-06T10:00:09Z"))
                .is_empty()
        );
        // Running when first seen (the node restarted): not a start this node saw.
        let mut fresh = Starts::default();
        assert!(
            fresh.observe(&PodSet::from([("u1".into(), Arc::new(running))]), at("2026-12-06T10:00:09Z")).is_empty()
        );
        assert!(fresh.waiting.is_empty());
    }

    #[test]
    fn a_status_write_echoed_by_the_watch_is_no_change_of_the_pod_until_it_is_over() {
        let before = pod("web", "u1", json!({}));
        let mut after = before.clone();
        after.metadata.resource_version = Some("8".into());
        after.metadata.managed_fields = Some(vec![Default::default()]);
        after.status.get_or_insert_default().pod_ip = Some("10.0.0.7".into());
        assert_eq!(as_source_pod(&before), as_source_pod(&after));
        // Over: the terminal phase is handed on (a pod over is never run again).
        after.status.get_or_insert_default().phase = Some("Succeeded".into());
        let over = as_source_pod(&after);
        assert_eq!(over.status.and_then(|s| s.phase).as_deref(), Some("Succeeded"));
    }
}
