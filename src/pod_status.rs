//! The status manager of the apiserver's pods, as the kubelet's: every status pod sync publishes is patched into
//! the pod's `status` (each kept in the status feed until written), a full pass every 10 s writes again whatever
//! the apiserver holds differently, and a deleted pod whose containers are gone and whose last status is written
//! is deleted with grace 0. Writes carry the pod's UID as a precondition: a pod made again under its name never
//! gets the old one's status. Static pods report through their mirror pods (see `mirror`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use nodewarden_cluster::{KubeError, OWNED_STATUS_FIELDS, PodSet, PodWriter, Written, config_hash, is_mirror};
use nodewarden_resources::pod::full_name;
use nodewarden_sync::{StatusReader, StatusStore, StatusUpdate, check_api_pod, from_apiserver};
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The kubelet's `syncPeriod` of its status manager: the full pass.
pub const FULL_PASS: Duration = Duration::from_secs(10);

/// Status writes in flight at once (each pod has at most one). The kubelet writes one at a time; a burst of pods
/// starting then waits on round trips, not on the client's rate limit (`kubeAPIQPS`), which still bounds them.
const STATUS_WRITES: usize = 8;

/// The status manager's state between passes.
pub struct StatusManager {
    reader: StatusReader,
    writer: PodWriter,
    /// What pod sync has (a pod without a worker there is one the node does not run).
    store: Arc<StatusStore>,
    /// The node's pods as the apiserver has them (the watch's set).
    apiserver: watch::Receiver<Option<Arc<PodSet>>>,
    /// Pods due for their final deletion: tried on each pass while the apiserver lists them.
    to_delete: BTreeMap<String, Arc<Pod>>,
    /// The apiserver's pods reported `Failed` because the node cannot run them.
    refused: BTreeSet<String>,
}

/// The reason of the status of a pod from the apiserver that nodewarden cannot run.
pub const UNSUPPORTED_REASON: &str = "NodeUnsupported";

/// Whether an error is the apiserver's answer about this one write (a refusal), not the apiserver away.
fn refused(e: &KubeError) -> bool {
    matches!(e, KubeError::Api(s) if (400..500).contains(&s.code) && s.code != 429)
}

impl StatusManager {
    /// A status manager reading `store`'s status feed, writing with `writer`, and comparing with `apiserver`.
    /// `None` while another consumer reads the feed.
    pub fn new(
        store: Arc<StatusStore>,
        writer: PodWriter,
        apiserver: watch::Receiver<Option<Arc<PodSet>>>,
    ) -> Option<Self> {
        let reader = store.reader()?;
        Some(Self { reader, writer, store, apiserver, to_delete: BTreeMap::new(), refused: BTreeSet::new() })
    }

    /// Writes each change at once and makes a full pass every [`FULL_PASS`], until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut full = tokio::time::interval(FULL_PASS);
        full.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let all = tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.reader.changed() => false,
                _ = full.tick() => true,
            };
            if let Err(e) = self.pass(all).await {
                tracing::warn!(error = %e, "cannot report pod statuses to the apiserver; trying again");
            }
        }
    }

    /// One pass: the deletions due first (a `kubectl delete --wait` waits on them), then the unreported
    /// statuses, or with `all` every status the apiserver holds otherwise, and the pods the node cannot run. A
    /// refusal of one write is logged and passed over; the apiserver away stops the pass, and the rest waits
    /// for the next one.
    pub async fn pass(&mut self, all: bool) -> Result<(), KubeError> {
        let apiserver = self.apiserver.borrow().clone();
        if let Some(set) = &apiserver {
            self.due_without_worker(set);
        }
        self.delete_due(apiserver.as_deref()).await?;
        // What to write for each status, decided first; then the writes, several at once.
        let mut writes = Vec::new();
        for u in if all { self.reader.all() } else { self.reader.unreported() } {
            let api_pod = from_apiserver(&u.pod);
            let theirs = if api_pod {
                apiserver.as_ref().and_then(|s| s.get(&u.uid)).cloned()
            } else {
                // A static pod reports through its mirror; until there is one, its status waits (unless it is
                // the last one of a pod that is gone: then there is nothing to report it to).
                match apiserver.as_ref().and_then(|s| mirror_of(&u.pod, s)) {
                    Some(m) => Some(m.clone()),
                    None if u.gone => {
                        self.reader.ack(&u.uid, u.generation);
                        continue;
                    }
                    None => continue,
                }
            };
            if all && !u.gone && theirs.as_ref().is_some_and(|t| holds(t, &u.pod)) {
                self.reader.ack(&u.uid, u.generation);
                continue;
            }
            writes.push((u, theirs, api_pod));
        }
        let writer = &self.writer;
        let listed = apiserver.is_some();
        let mut writing = futures_util::stream::iter(writes)
            .map(|(u, theirs, api_pod)| async move {
                let written = match theirs {
                    // Listed before and not any more: the pod is gone from the apiserver (a forced deletion).
                    None if listed => Ok(Written::Gone),
                    Some(mirror) if !api_pod => {
                        let mut pod = Pod::clone(&u.pod);
                        pod.metadata.uid.clone_from(&mirror.metadata.uid);
                        writer.patch_status(&pod, Some(&mirror)).await
                    }
                    theirs => writer.patch_status(&u.pod, theirs.as_deref()).await,
                };
                (u, written)
            })
            .buffer_unordered(STATUS_WRITES);
        // The apiserver away stops the pass at its first such answer: the writes in flight are dropped, and those
        // not begun wait for the next pass.
        let mut done = Vec::new();
        let mut away = None;
        while let Some((u, written)) = writing.next().await {
            match written {
                Ok(w) => done.push((u, w)),
                Err(e) if refused(&e) => {
                    tracing::warn!(pod = %full_name(&u.pod), error = %e, "the apiserver refused a pod status");
                    done.push((u, Written::Done));
                }
                Err(e) => {
                    away = Some(e);
                    break;
                }
            }
        }
        drop(writing);
        for (u, written) in done {
            self.acked(&u, written);
        }
        if let Some(e) = away {
            return Err(e);
        }
        if let Some(set) = &apiserver {
            self.report_refused(set).await?;
        }
        self.delete_due(apiserver.as_deref()).await
    }

    /// The apiserver's pods that are over there, deleted, and without a worker here (the node never ran them, or
    /// forgot them): nothing of them runs, so they are due for their final deletion at once, as the kubelet's
    /// status manager deletes them.
    fn due_without_worker(&mut self, set: &PodSet) {
        for (uid, p) in set {
            if p.metadata.deletion_timestamp.is_some()
                && nodewarden_resources::pod::is_terminal_phase(p)
                && !is_mirror(p)
                && !self.store.contains(uid)
            {
                self.to_delete.entry(uid.clone()).or_insert_with(|| Arc::clone(p));
            }
        }
    }

    /// Reports `Failed` (reason [`UNSUPPORTED_REASON`]) for each of the apiserver's pods that nodewarden refuses
    /// to run (a gRPC probe, say), once.
    async fn report_refused(&mut self, set: &PodSet) -> Result<(), KubeError> {
        self.refused.retain(|uid| set.contains_key(uid));
        for (uid, p) in set {
            if is_mirror(p) || self.refused.contains(uid) || nodewarden_resources::pod::is_terminal_phase(p) {
                continue;
            }
            let Err(why) = check_api_pod(p) else { continue };
            let mut failed = Pod::clone(p);
            failed.status = Some(PodStatus {
                phase: Some("Failed".into()),
                reason: Some(UNSUPPORTED_REASON.into()),
                message: Some(format!("Pod was rejected: nodewarden cannot run it: {why}")),
                ..p.status.clone().unwrap_or_default()
            });
            match self.writer.patch_status(&failed, Some(p)).await {
                Ok(_) => {}
                Err(e) if refused(&e) => {
                    tracing::warn!(pod = %full_name(p), error = %e, "the apiserver refused a pod status")
                }
                Err(e) => return Err(e),
            }
            self.refused.insert(uid.clone());
        }
        Ok(())
    }

    /// Deletes the pods due, while the apiserver lists them; a refusal drops the pod, the apiserver away stops.
    async fn delete_due(&mut self, apiserver: Option<&PodSet>) -> Result<(), KubeError> {
        if let Some(set) = apiserver {
            self.to_delete.retain(|uid, _| set.contains_key(uid));
        }
        let due: Vec<(String, Arc<Pod>)> = self.to_delete.iter().map(|(u, p)| (u.clone(), p.clone())).collect();
        for (uid, pod) in due {
            match self.writer.delete(&pod).await {
                Ok(_) => tracing::info!(pod = %full_name(&pod), pod_uid = %uid, "pod deleted from the apiserver"),
                Err(e) if refused(&e) => {
                    tracing::warn!(pod = %full_name(&pod), error = %e, "the apiserver refused a pod's final deletion");
                }
                Err(e) => return Err(e),
            }
            self.to_delete.remove(&uid);
        }
        Ok(())
    }

    /// The status is written (or there is nothing to write it to): acknowledged, and a pod that is over and
    /// deleted in the apiserver is due for its final deletion.
    fn acked(&mut self, u: &StatusUpdate, written: Written) {
        let Some(over) = self.reader.ack(&u.uid, u.generation) else { return };
        let deleting = self
            .apiserver
            .borrow()
            .as_ref()
            .and_then(|s| s.get(&u.uid))
            .is_some_and(|p| p.metadata.deletion_timestamp.is_some());
        if written == Written::Done && deleting {
            self.to_delete.insert(u.uid.clone(), over);
        }
    }
}

/// The mirror pod of static pod `pod` in `apiserver`: its name, and its static pod's hash.
fn mirror_of<'a>(pod: &Pod, apiserver: &'a PodSet) -> Option<&'a Arc<Pod>> {
    let hash = config_hash(pod)?;
    apiserver.values().find(|m| {
        is_mirror(m)
            && m.metadata.name == pod.metadata.name
            && m.metadata.namespace == pod.metadata.namespace
            && config_hash(m) == Some(hash)
    })
}

/// Whether the apiserver's pod `theirs` holds every field of `ours`'s status (it may hold more: conditions
/// others own, such as `PodScheduled`), and none the node owns that `ours` no longer has.
fn holds(theirs: &Pod, ours: &Pod) -> bool {
    let value = |p: &Pod| serde_json::to_value(&p.status).unwrap_or(Value::Null);
    let (theirs, ours) = (value(theirs), value(ours));
    let stale = OWNED_STATUS_FIELDS
        .iter()
        .any(|f| ours.get(*f).is_none_or(Value::is_null) && theirs.get(*f).is_some_and(|v| !v.is_null()));
    !stale && contains(&theirs, &ours)
}

/// `big` has everything `small` has: each field of an object, and each item of a list in some item.
fn contains(big: &Value, small: &Value) -> bool {
    match (big, small) {
        (Value::Object(b), Value::Object(s)) => {
            s.iter().all(|(k, v)| v.is_null() || b.get(k).is_some_and(|x| contains(x, v)))
        }
        (Value::Array(b), Value::Array(s)) => s.iter().all(|v| b.iter().any(|x| contains(x, v))),
        (b, s) => b == s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodewarden_cluster::Clients;
    use nodewarden_sync::{API_SOURCE, CONFIG_SOURCE_ANNOTATION};
    use nodewarden_testapi::{Fault, TestApi};
    use serde_json::json;

    fn typed(v: Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    /// The test apiserver's pod as pod sync has it: marked as the apiserver's, with `phase`.
    fn ours(api: &TestApi, name: &str, phase: &str) -> Pod {
        let mut p = typed(api.get("pods", Some("default"), name).unwrap());
        p.metadata.annotations.get_or_insert_default().insert(CONFIG_SOURCE_ANNOTATION.into(), API_SOURCE.into());
        p.status = Some(
            serde_json::from_value(json!({"phase": phase, "conditions": [
            {"type": "Ready", "status": if phase == "Running" { "True" } else { "False" }}]}))
            .unwrap(),
        );
        p
    }

    fn listed(api: &TestApi) -> Option<Arc<PodSet>> {
        let pods = api.list("pods", Some("default")).into_iter().map(typed);
        Some(Arc::new(pods.map(|p| (p.metadata.uid.clone().unwrap(), Arc::new(p))).collect()))
    }

    fn writes(api: &TestApi, method: &str) -> Vec<String> {
        api.requests().into_iter().filter(|r| r.method == method && r.path.contains("/pods/")).map(|r| r.body).collect()
    }

    fn bound(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": "n1", "automountServiceAccountToken": false,
                     "containers": [{"name": "app", "image": "busybox"}]}})
    }

    async fn clients(api: &TestApi, dir: &std::path::Path) -> Clients {
        api.add_token("t", Some("n1"));
        let kubeconfig = api.write_kubeconfig(dir, "t").unwrap();
        Clients::from_kubeconfig(&kubeconfig, 50.0, 100, Duration::from_secs(5)).await.unwrap()
    }

    #[tokio::test]
    async fn a_refused_status_holds_up_no_other_and_an_apiserver_away_stops_the_pass() {
        let api = TestApi::start(0).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let clients = clients(&api, dir.path()).await;
        api.create("pods", Some("default"), bound("a")).unwrap();
        api.create("pods", Some("default"), bound("b")).unwrap();
        let store = Arc::new(StatusStore::default());
        let (_set, rx) = watch::channel(listed(&api));
        let mut m = StatusManager::new(store.clone(), PodWriter::new(clients), rx).unwrap();
        for name in ["a", "b"] {
            let p = ours(&api, name, "Running");
            store.set(&p.metadata.uid.clone().unwrap(), p);
        }
        api.set_fault(Fault { status: Some(503), ..Fault::default() });
        assert!(m.pass(false).await.is_err(), "the apiserver away stops the pass");
        api.set_fault(Fault { status: Some(422), paths: Some("/pods/a/status".into()), ..Fault::default() });
        m.pass(false).await.unwrap();
        assert_eq!(api.get("pods", Some("default"), "b").unwrap()["status"]["phase"], "Running");
        assert_ne!(api.get("pods", Some("default"), "a").unwrap()["status"]["phase"], "Running");
        api.set_fault(Fault::default());
        let before = writes(&api, "PATCH").len();
        m.pass(false).await.unwrap();
        assert_eq!(writes(&api, "PATCH").len(), before, "the refused status is not tried again until it changes");
    }

    #[tokio::test]
    async fn statuses_are_written_under_their_uid_once_and_a_deleted_pod_is_deleted_when_over() {
        let api = TestApi::start(0).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let clients = clients(&api, dir.path()).await;
        let pod = bound("web");
        api.create("pods", Some("default"), pod.clone()).unwrap();
        let store = Arc::new(StatusStore::default());
        let (set, rx) = watch::channel(listed(&api));
        let mut m = StatusManager::new(store.clone(), PodWriter::new(clients), rx).unwrap();
        let running = ours(&api, "web", "Running");
        let uid = running.metadata.uid.clone().unwrap();
        store.set(&uid, running);
        m.pass(false).await.unwrap();
        let stored = api.get("pods", Some("default"), "web").unwrap();
        assert_eq!(stored["status"]["phase"], "Running");
        let patches = writes(&api, "PATCH");
        assert_eq!(patches.len(), 1);
        assert!(patches[0].contains(&format!("\"uid\":\"{uid}\"")), "the UID as a precondition: {}", patches[0]);
        // Written once: neither the next pass nor a full pass writes it again while the apiserver holds it.
        set.send_replace(listed(&api));
        m.pass(false).await.unwrap();
        m.pass(true).await.unwrap();
        assert_eq!(writes(&api, "PATCH").len(), 1);
        // Someone else wrote an older status: the full pass puts it right.
        api.patch("pods", Some("default"), "web", &json!({"status": {"phase": "Pending"}})).unwrap();
        set.send_replace(listed(&api));
        m.pass(true).await.unwrap();
        assert_eq!(writes(&api, "PATCH").len(), 2);
        assert_eq!(api.get("pods", Some("default"), "web").unwrap()["status"]["phase"], "Running");

        // Deleted with a grace period: once the containers are gone and the last status is written, the pod is
        // deleted with grace 0 and its UID as a precondition.
        api.delete("pods", Some("default"), "web", Some(30)).unwrap();
        set.send_replace(listed(&api));
        store.set(&uid, ours(&api, "web", "Succeeded"));
        m.pass(false).await.unwrap();
        assert!(api.get("pods", Some("default"), "web").is_some(), "not over yet");
        store.finalize(&uid);
        m.pass(false).await.unwrap();
        assert!(api.get("pods", Some("default"), "web").is_none());
        let deletes = writes(&api, "DELETE");
        assert!(deletes[0].contains("\"gracePeriodSeconds\":0") && deletes[0].contains(&uid), "{deletes:?}");

        // Made again under its name, while the set still shows the old pod: the write goes out, and the UID
        // precondition keeps the old status off the new pod.
        api.create("pods", Some("default"), pod.clone()).unwrap();
        let mut stale = ours(&api, "web", "Failed");
        stale.metadata.uid = Some(uid.clone());
        let mut old_set = PodSet::new();
        old_set.insert(uid.clone(), Arc::new(stale.clone()));
        set.send_replace(Some(Arc::new(old_set)));
        store.set(&uid, stale.clone());
        let patches = writes(&api, "PATCH").len();
        m.pass(false).await.unwrap();
        assert_eq!(writes(&api, "PATCH").len(), patches + 1, "written under the old UID");
        let again = api.get("pods", Some("default"), "web").unwrap();
        assert_ne!(again["status"]["phase"], "Failed", "{again:#}");
        // Once the set shows the new pod, nothing of the old one is written at all.
        set.send_replace(listed(&api));
        store.set(&uid, stale);
        m.pass(false).await.unwrap();
        assert_eq!(writes(&api, "PATCH").len(), patches + 1);
    }

    #[tokio::test]
    async fn pods_the_node_does_not_run_are_reported_and_deleted_and_a_dropped_field_is_removed() {
        let api = TestApi::start(0).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let clients = clients(&api, dir.path()).await;
        let mut grpc = bound("grpc");
        grpc["spec"]["containers"][0]["livenessProbe"] = json!({"grpc": {"port": 9000}});
        api.create("pods", Some("default"), grpc).unwrap();
        api.create("pods", Some("default"), bound("done")).unwrap();
        api.create("pods", Some("default"), bound("web")).unwrap();
        let store = Arc::new(StatusStore::default());
        let (set, rx) = watch::channel(listed(&api));
        let mut m = StatusManager::new(store.clone(), PodWriter::new(clients), rx).unwrap();
        // A pod nodewarden refuses: Failed, with why, once.
        m.pass(false).await.unwrap();
        let refused = api.get("pods", Some("default"), "grpc").unwrap();
        assert_eq!(
            (&refused["status"]["phase"], &refused["status"]["reason"]),
            (&json!("Failed"), &json!(UNSUPPORTED_REASON))
        );
        assert!(refused["status"]["message"].as_str().unwrap().contains("gRPC"), "{refused:#}");
        let patches = writes(&api, "PATCH").len();
        m.pass(true).await.unwrap();
        assert_eq!(writes(&api, "PATCH").len(), patches, "reported once");
        // A pod deleted, over in the apiserver (its last status written) and without a worker here (the daemon
        // restarted before its final deletion): deleted for good at once. (The apiserver deletes a pod that is
        // over when it is deleted at once.)
        api.delete("pods", Some("default"), "done", Some(30)).unwrap();
        api.patch("pods", Some("default"), "done", &json!({"status": {"phase": "Succeeded"}})).unwrap();
        let done = api.get("pods", Some("default"), "done").unwrap();
        assert!(done["metadata"]["deletionTimestamp"].is_string() && done["status"]["phase"] == "Succeeded");
        set.send_replace(listed(&api));
        m.pass(false).await.unwrap();
        assert!(api.get("pods", Some("default"), "done").is_none());
        // A field the node no longer reports is removed from the apiserver's copy.
        let mut with = ours(&api, "web", "Pending");
        with.status.as_mut().unwrap().message = Some("Back-off restarting".into());
        let uid = with.metadata.uid.clone().unwrap();
        store.set(&uid, with);
        m.pass(false).await.unwrap();
        assert_eq!(api.get("pods", Some("default"), "web").unwrap()["status"]["message"], "Back-off restarting");
        set.send_replace(listed(&api));
        store.set(&uid, ours(&api, "web", "Running"));
        m.pass(false).await.unwrap();
        let web = api.get("pods", Some("default"), "web").unwrap();
        assert!(web["status"]["message"].is_null() && web["status"]["phase"] == "Running", "{web:#}");
    }

    fn pod(status: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "uid": "u"}, "status": status})).unwrap()
    }

    #[test]
    fn the_full_pass_writes_only_what_the_apiserver_holds_otherwise() {
        let ours = pod(json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}));
        let theirs = pod(json!({"phase": "Running", "qosClass": "BestEffort", "conditions": [
            {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]}));
        assert!(holds(&theirs, &ours), "more in the apiserver is fine");
        let stale = pod(json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}));
        assert!(!holds(&stale, &ours));
        assert!(!holds(&pod(json!({"phase": "Pending"})), &ours));
        assert!(!holds(&pod(json!(null)), &ours));
    }
}
