//! Mirror pods: the apiserver's copy of each static pod (manifest or URL), so that a cluster sees the pods the
//! node runs on its own, as the kubelet makes them. A mirror is made for each static pod, made again when the
//! static pod's hash changes or an operator deletes it, and deleted once its static pod is gone; mirror pods are
//! never run (the apiserver source leaves them out). Deletions carry the mirror's UID as a precondition.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use nodewarden_cluster::{ClusterStatus, KubeError, PodSet, PodWriter, config_hash, is_mirror};
use nodewarden_resources::pod::full_name;
use nodewarden_runtime::SelectedRuntime;
use nodewarden_sync::{PodManager, from_apiserver};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How often the mirrors are compared with the static pods.
const PERIOD: Duration = Duration::from_secs(1);

/// What one pass does about one pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Make the mirror of this static pod.
    Create(Arc<Pod>),
    /// Delete this mirror (stale, or its static pod is gone).
    Delete(Arc<Pod>),
}

/// What to do to bring the mirrors of `apiserver` in line with the static pods of `pods`: stale ones deleted,
/// then, once a name is free, the missing ones made.
pub fn plan(pods: &[Arc<Pod>], apiserver: &PodSet) -> Vec<Step> {
    let statics: BTreeMap<String, &Arc<Pod>> =
        pods.iter().filter(|p| !from_apiserver(p)).map(|p| (full_name(p), p)).collect();
    let mirrors: BTreeMap<String, &Arc<Pod>> =
        apiserver.values().filter(|p| is_mirror(p)).map(|p| (full_name(p), p)).collect();
    // A pod of the apiserver under a static pod's name (not a mirror) is left alone: the apiserver would refuse
    // a mirror over it.
    let taken: BTreeSet<String> = apiserver.values().map(|p| full_name(p)).collect();
    let mut steps = Vec::new();
    for (k, m) in &mirrors {
        // One an operator deletes (it carries a deletion time) is deleted for good and made again, as the
        // kubelet does.
        let wanted =
            statics.get(k).is_some_and(|s| config_hash(s) == config_hash(m)) && m.metadata.deletion_timestamp.is_none();
        if !wanted {
            steps.push(Step::Delete(Arc::clone(m)));
        }
    }
    for (k, s) in &statics {
        if !taken.contains(k) {
            steps.push(Step::Create(Arc::clone(s)));
        }
    }
    steps
}

/// Keeps the mirrors in line with the static pods until `shutdown`, once the Node is registered, the first list
/// of the node's pods is complete and every pod source has delivered its first pods (a static pod not listed
/// yet must not lose its mirror). A pass every [`PERIOD`] at most: a step that fails is tried at the next one,
/// and the others go on.
pub async fn run(
    pods: Arc<PodManager<SelectedRuntime>>,
    writer: PodWriter,
    status: Arc<ClusterStatus>,
    node: String,
    apiserver: watch::Receiver<Option<Arc<PodSet>>>,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let set = apiserver.borrow().clone();
        let (Some(node_uid), Some(set), Ok(())) = (status.node_uid(), set, pods.synced()) else { continue };
        for step in plan(&pods.store().pods(), &set) {
            let done = match &step {
                Step::Create(p) => writer.create_mirror(p, &node, &node_uid).await,
                Step::Delete(m) => writer.delete(m).await.map(drop),
            };
            match done {
                Ok(()) => tracing::info!(step = ?StepName(&step), "mirror pod updated"),
                // Made already (the set had not shown it yet).
                Err(KubeError::Api(e)) if e.code == 409 => {}
                Err(e) => {
                    tracing::warn!(step = ?StepName(&step), error = %e, "cannot update a mirror pod; trying again")
                }
            }
        }
    }
}

/// A step as the log names it.
struct StepName<'a>(&'a Step);

impl std::fmt::Debug for StepName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (what, p) = match self.0 {
            Step::Create(p) => ("create", &**p),
            Step::Delete(p) => ("delete", &**p),
        };
        write!(f, "{what} {}", full_name(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, uid: &str, annotations: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "kube-system", "uid": uid,
            "annotations": annotations}}))
        .unwrap()
    }

    fn statics(hash: &str) -> Arc<Pod> {
        Arc::new(pod(
            "etcd-n1",
            "s1",
            json!({"kubernetes.io/config.source": "file", "kubernetes.io/config.hash": hash}),
        ))
    }

    fn mirror(hash: &str, uid: &str) -> Pod {
        pod("etcd-n1", uid, json!({"kubernetes.io/config.mirror": hash, "kubernetes.io/config.hash": hash}))
    }

    fn names(steps: &[Step]) -> Vec<String> {
        steps.iter().map(|s| format!("{:?}", StepName(s))).collect()
    }

    #[test]
    fn a_mirror_is_made_replaced_on_a_new_hash_and_deleted_with_its_static_pod() {
        let none = PodSet::new();
        assert_eq!(names(&plan(&[statics("h1")], &none)), ["create kube-system/etcd-n1"]);
        let current = PodSet::from([("m1".to_owned(), Arc::new(mirror("h1", "m1")))]);
        assert!(plan(&[statics("h1")], &current).is_empty(), "in line");
        // The manifest edited: the stale mirror goes first, and the new one is made once it is gone.
        assert_eq!(names(&plan(&[statics("h2")], &current)), ["delete kube-system/etcd-n1"]);
        let mut deleting = mirror("h1", "m1");
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH));
        let deleting = PodSet::from([("m1".to_owned(), Arc::new(deleting))]);
        assert_eq!(names(&plan(&[statics("h1")], &deleting)), ["delete kube-system/etcd-n1"], "kubectl delete");
        // The static pod gone: its mirror too.
        assert_eq!(names(&plan(&[], &current)), ["delete kube-system/etcd-n1"]);
        // An apiserver pod (not a mirror) under the name is left alone, and nothing is made over it.
        let api_pod = pod("etcd-n1", "a1", json!({}));
        assert!(plan(&[statics("h1")], &PodSet::from([("a1".to_owned(), Arc::new(api_pod))])).is_empty());
        // The apiserver's own pods make no mirror.
        let from_api = Arc::new(pod("web", "w1", json!({"kubernetes.io/config.source": "api"})));
        assert!(plan(&[from_api], &none).is_empty());
    }
}
