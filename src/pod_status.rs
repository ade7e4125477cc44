//! The status manager of the apiserver's pods, as the kubelet's: every status pod sync publishes is patched into
//! the pod's `status` (each kept in the status feed until written), a full pass every 10 s writes again whatever
//! the apiserver holds differently, and a deleted pod whose containers are gone and whose last status is written
//! is deleted with grace 0. Writes carry the pod's UID as a precondition: a pod made again under its name never
//! gets the old one's status. Static pods report through their mirror pods (see `mirror`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use nodewarden_cluster::{KubeError, PodSet, PodWriter, Written, config_hash, is_mirror};
use nodewarden_sync::{API_SOURCE, CONFIG_SOURCE_ANNOTATION, StatusReader, StatusUpdate};
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The kubelet's `syncPeriod` of its status manager: the full pass.
pub const FULL_PASS: Duration = Duration::from_secs(10);

/// The status manager's state between passes.
pub struct StatusManager {
    reader: StatusReader,
    writer: PodWriter,
    /// The node's pods as the apiserver has them (the watch's set).
    apiserver: watch::Receiver<Option<Arc<PodSet>>>,
    /// Pods over whose deletion failed: tried again on each pass.
    to_delete: BTreeMap<String, Arc<Pod>>,
}

fn from_api(pod: &Pod) -> bool {
    pod.metadata.annotations.as_ref().and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION)).map(String::as_str)
        == Some(API_SOURCE)
}

impl StatusManager {
    /// A status manager reading `reader`, writing with `writer`, and comparing with `apiserver`.
    pub fn new(reader: StatusReader, writer: PodWriter, apiserver: watch::Receiver<Option<Arc<PodSet>>>) -> Self {
        Self { reader, writer, apiserver, to_delete: BTreeMap::new() }
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

    /// One pass: the unreported statuses, or with `all` every status the apiserver holds otherwise; then the
    /// deletions due. Stops at the first failed write (the apiserver away): the rest waits for the next pass.
    pub async fn pass(&mut self, all: bool) -> Result<(), KubeError> {
        let apiserver = self.apiserver.borrow().clone();
        let updates = if all { self.reader.all() } else { self.reader.unreported() };
        for u in updates {
            let api_pod = from_api(&u.pod);
            let theirs = if api_pod {
                apiserver.as_ref().and_then(|s| s.get(&u.uid))
            } else {
                // A static pod reports through its mirror; until there is one, its status waits (unless it is
                // the last one of a pod that is gone: then there is nothing to report it to).
                match apiserver.as_ref().and_then(|s| mirror_of(&u.pod, s)) {
                    Some(m) => Some(m),
                    None if u.gone => {
                        self.reader.ack(&u.uid, u.generation);
                        continue;
                    }
                    None => continue,
                }
            };
            if all && !u.gone && theirs.is_some_and(|t| holds(t, &u.pod)) {
                self.reader.ack(&u.uid, u.generation);
                continue;
            }
            let written = match theirs {
                // Listed before and not any more: the pod is gone from the apiserver (a forced deletion).
                None if apiserver.is_some() => Written::Gone,
                Some(mirror) if !api_pod => {
                    let mut pod = Pod::clone(&u.pod);
                    pod.metadata.uid.clone_from(&mirror.metadata.uid);
                    self.writer.patch_status(&pod).await?
                }
                _ => self.writer.patch_status(&u.pod).await?,
            };
            self.acked(&u, written);
        }
        let due: Vec<(String, Arc<Pod>)> = std::mem::take(&mut self.to_delete).into_iter().collect();
        let mut failed = None;
        for (uid, pod) in due {
            if failed.is_some() {
                self.to_delete.insert(uid, pod);
                continue;
            }
            match self.writer.delete(&pod).await {
                Ok(_) => tracing::info!(pod = %full_name(&pod), pod_uid = %uid, "pod deleted from the apiserver"),
                Err(e) => {
                    self.to_delete.insert(uid, pod);
                    failed = Some(e);
                }
            }
        }
        failed.map_or(Ok(()), Err)
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
fn mirror_of<'a>(pod: &Pod, apiserver: &'a PodSet) -> Option<&'a Pod> {
    let hash = config_hash(pod)?;
    apiserver.values().find(|m| {
        is_mirror(m)
            && m.metadata.name == pod.metadata.name
            && m.metadata.namespace == pod.metadata.namespace
            && config_hash(m) == Some(hash)
    })
}

fn full_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Whether the apiserver's pod `theirs` holds every field of `ours`'s status (it may hold more: conditions
/// others own, such as `PodScheduled`).
fn holds(theirs: &Pod, ours: &Pod) -> bool {
    let value = |p: &Pod| serde_json::to_value(&p.status).unwrap_or(Value::Null);
    contains(&value(theirs), &value(ours))
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
    use nodewarden_sync::StatusStore;
    use nodewarden_testapi::TestApi;
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
        Some(Arc::new(pods.map(|p| (p.metadata.uid.clone().unwrap(), p)).collect()))
    }

    fn writes(api: &TestApi, method: &str) -> Vec<String> {
        api.requests().into_iter().filter(|r| r.method == method && r.path.contains("/pods/")).map(|r| r.body).collect()
    }

    #[tokio::test]
    async fn statuses_are_written_under_their_uid_once_and_a_deleted_pod_is_deleted_when_over() {
        let api = TestApi::start(0).await.unwrap();
        api.add_token("t", Some("n1"));
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = api.write_kubeconfig(dir.path(), "t").unwrap();
        let clients = Clients::from_kubeconfig(&kubeconfig, 50.0, 100, Duration::from_secs(5)).await.unwrap();
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "default"},
            "spec": {"nodeName": "n1", "automountServiceAccountToken": false,
                     "containers": [{"name": "app", "image": "busybox"}]}});
        api.create("pods", Some("default"), pod.clone()).unwrap();
        let store = Arc::new(StatusStore::default());
        let (set, rx) = watch::channel(listed(&api));
        let mut m = StatusManager::new(store.reader().unwrap(), PodWriter::new(clients), rx);
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

        // Made again under its name: what is left of the old UID never reaches the new pod.
        api.create("pods", Some("default"), pod).unwrap();
        set.send_replace(listed(&api));
        let mut stale = ours(&api, "web", "Failed");
        stale.metadata.uid = Some(uid.clone());
        store.set(&uid, stale);
        m.pass(false).await.unwrap();
        let again = api.get("pods", Some("default"), "web").unwrap();
        assert_ne!(again["status"]["phase"], "Failed", "{again:#}");
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
