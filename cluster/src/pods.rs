//! The node's pods as the apiserver has them, and what the kubelet's status manager writes back.
//!
//! [`watch_pods`] lists and watches the pods bound to the node (`fieldSelector=spec.nodeName=<node>`) through
//! kube's watcher, once the node's own Node is registered, and hands over the whole set only once each list is
//! complete, then after each change. [`PodWriter`] patches a pod's status (strategic merge, the pod's UID as a
//! precondition) and deletes a pod whose deletion is over with grace 0 (the UID again a precondition), so that a
//! pod made again under the same name never gets the old one's status nor its deletion.

use std::collections::BTreeMap;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher::{self, Event, watcher};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::client::WATCH_SECONDS;
use crate::{Clients, ClusterStatus};

/// The annotation of a mirror pod: the apiserver's copy of a static pod, never run.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The node's pods in the apiserver, by UID: the last complete list and the watch's changes since. Shared, so
/// that handing over a set after each change copies no pod.
pub type PodSet = BTreeMap<String, Arc<Pod>>;

/// How often the watch looks whether the Node is registered yet.
const NODE_POLL: Duration = Duration::from_millis(200);

/// Lists and watches the pods bound to `node` until `shutdown`, once `status` knows the node's Node (a list
/// before registration would say nothing of the node's pods). `pods` gets the whole set once the first list is
/// complete and after each change; after an error (the apiserver away, an expired resource version, new
/// credentials) a new list starts after the kubelet's back-off, and the set last handed over stands meanwhile.
pub async fn watch_pods(
    clients: Clients,
    status: Arc<ClusterStatus>,
    node: String,
    pods: watch::Sender<Option<Arc<PodSet>>>,
    shutdown: CancellationToken,
) {
    while status.node_uid().is_none() {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(NODE_POLL) => {}
        }
    }
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}")).timeout(WATCH_SECONDS);
    let mut backoff = Backoff::new(Duration::from_millis(800), Duration::from_secs(30));
    loop {
        // A new client each time: credentials renewed on disk are used from the next list on.
        let api: Api<Pod> = Api::all(clients.watch());
        let mut stream = pin!(watcher(api, config.clone()));
        let mut current: PodSet = pods.borrow().as_deref().cloned().unwrap_or_default();
        let mut listing: Option<PodSet> = None;
        let error = loop {
            let next = tokio::select! {
                () = shutdown.cancelled() => return,
                next = stream.next() => next,
            };
            let event = match next {
                Some(Ok(event)) => event,
                Some(Err(e)) => break e.to_string(),
                None => break "the watch ended".to_owned(),
            };
            match event {
                Event::Init => listing = Some(PodSet::new()),
                Event::InitApply(pod) => {
                    if let Some(l) = listing.as_mut() {
                        insert(l, pod);
                    }
                }
                Event::InitDone => {
                    if let Some(l) = listing.take() {
                        current = l;
                    }
                    backoff.reset();
                    tracing::debug!(pods = current.len(), "listed the node's pods");
                    pods.send_replace(Some(Arc::new(current.clone())));
                }
                Event::Apply(pod) => {
                    insert(&mut current, pod);
                    pods.send_replace(Some(Arc::new(current.clone())));
                }
                Event::Delete(pod) => {
                    if let Some(uid) = pod.metadata.uid.as_deref() {
                        current.remove(uid);
                    }
                    pods.send_replace(Some(Arc::new(current.clone())));
                }
            }
        };
        let wait = backoff.fail();
        tracing::warn!(error = %error, retry_in = ?wait, "the watch of the node's pods failed; the pods run on");
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

fn insert(set: &mut PodSet, mut pod: Pod) {
    // Kept for every pod and read by nobody here.
    pod.metadata.managed_fields = None;
    if let Some(uid) = pod.metadata.uid.clone().filter(|u| !u.is_empty()) {
        set.insert(uid, Arc::new(pod));
    }
}

/// Whether a pod of the apiserver is a mirror pod.
pub fn is_mirror(pod: &Pod) -> bool {
    pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
}

/// The fields of a pod's status the node writes: one it no longer has is removed from the apiserver's copy.
pub const OWNED_STATUS_FIELDS: &[&str] = &[
    "message",
    "reason",
    "podIP",
    "podIPs",
    "hostIP",
    "hostIPs",
    "startTime",
    "initContainerStatuses",
    "containerStatuses",
    "ephemeralContainerStatuses",
];

/// What a write about a pod came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The apiserver took it.
    Done,
    /// The pod is not in the apiserver under this UID (deleted, or made again under its name): nothing to write.
    Gone,
}

/// Writes the node's pods' statuses and final deletions, on the main client within its rate limit.
#[derive(Clone)]
pub struct PodWriter {
    clients: Clients,
}

impl PodWriter {
    /// A writer on `clients`.
    pub fn new(clients: Clients) -> PodWriter {
        PodWriter { clients }
    }

    fn api(&self, pod: &Pod) -> Api<Pod> {
        Api::namespaced(self.clients.main(), pod.metadata.namespace.as_deref().unwrap_or("default"))
    }

    /// Patches `pod`'s status into `pods/<name>/status` (a strategic merge, as the kubelet's status manager
    /// does), with its UID as a precondition. `theirs` is the apiserver's copy, if known: the fields the node
    /// owns ([`OWNED_STATUS_FIELDS`]) that it holds and `pod` no longer has are removed.
    pub async fn patch_status(&self, pod: &Pod, theirs: Option<&Pod>) -> Result<Written, kube::Error> {
        let (Some(name), Some(uid)) = (pod.metadata.name.as_deref(), pod.metadata.uid.as_deref()) else {
            return Ok(Written::Gone);
        };
        let mut status = serde_json::to_value(&pod.status).unwrap_or_default();
        if let (Some(ours), Some(theirs)) = (status.as_object_mut(), theirs.and_then(|t| t.status.as_ref())) {
            let theirs = serde_json::to_value(theirs).unwrap_or_default();
            for field in OWNED_STATUS_FIELDS {
                if !ours.contains_key(*field) && theirs.get(*field).is_some_and(|v| !v.is_null()) {
                    ours.insert((*field).to_owned(), serde_json::Value::Null);
                }
            }
        }
        let body = json!({ "metadata": { "uid": uid }, "status": status });
        self.clients.limiter.acquire().await;
        let patched = self.api(pod).patch_status(name, &PatchParams::default(), &Patch::Strategic(body)).await;
        gone_or(patched.map(drop))
    }

    /// Deletes `pod` for good (grace 0) once its containers are gone and its last status is written, with its
    /// UID as a precondition.
    pub async fn delete(&self, pod: &Pod) -> Result<Written, kube::Error> {
        let (Some(name), Some(uid)) = (pod.metadata.name.as_deref(), pod.metadata.uid.clone()) else {
            return Ok(Written::Gone);
        };
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions { uid: Some(uid), resource_version: None }),
            ..DeleteParams::default()
        };
        self.clients.limiter.acquire().await;
        gone_or(self.api(pod).delete(name, &params).await.map(drop))
    }

    /// Creates the mirror pod of `static_pod` (whose `kubernetes.io/config.hash` it carries as its mirror
    /// annotation): the static pod's metadata and spec, owned by the node's own Node (`node`, `node_uid`), as the
    /// apiserver's NodeRestriction admits it.
    pub async fn create_mirror(&self, static_pod: &Pod, node: &str, node_uid: &str) -> Result<(), kube::Error> {
        let mirror = mirror_of(static_pod, node, node_uid);
        self.clients.limiter.acquire().await;
        self.api(static_pod).create(&PostParams::default(), &mirror).await.map(drop)
    }
}

/// The annotation that holds a static pod's hash.
const CONFIG_HASH: &str = "kubernetes.io/config.hash";

/// The hash a static pod carries, or its mirror pod as its mirror annotation.
pub fn config_hash(pod: &Pod) -> Option<&str> {
    let a = pod.metadata.annotations.as_ref()?;
    a.get(MIRROR_ANNOTATION).or_else(|| a.get(CONFIG_HASH)).map(String::as_str)
}

/// The mirror pod of a static pod.
fn mirror_of(static_pod: &Pod, node: &str, node_uid: &str) -> Pod {
    let meta = &static_pod.metadata;
    let mut annotations = meta.annotations.clone().unwrap_or_default();
    let hash = annotations.get(CONFIG_HASH).cloned().unwrap_or_default();
    annotations.insert(MIRROR_ANNOTATION.into(), hash);
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.into(),
        uid: node_uid.into(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    let mut spec = static_pod.spec.clone();
    if let Some(s) = spec.as_mut() {
        s.node_name = Some(node.into());
    }
    Pod {
        metadata: ObjectMeta {
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            labels: meta.labels.clone(),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    }
}

/// A 404 (the pod is gone) or a 409 (its UID is not the precondition's: it was made again) is [`Written::Gone`].
fn gone_or(result: Result<(), kube::Error>) -> Result<Written, kube::Error> {
    match result {
        Ok(()) => Ok(Written::Done),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Written::Gone),
        Err(e) => Err(e),
    }
}
