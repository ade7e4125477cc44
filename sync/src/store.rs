//! The status store: every pod with its latest status, as the workers publish them, plus the manifests that were
//! refused. `/pods` serves it as a `v1.PodList`.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::feed::{StatusFeed, StatusReader};
use crate::manifest::CONFIG_SOURCE_ANNOTATION;
use crate::source::{InvalidManifest, manifest_name};
use crate::status::PodPhase;

/// The annotation that names the manifest file of a refused manifest's `/pods` entry.
pub const MANIFEST_ANNOTATION: &str = "nodewarden.io/manifest";

/// The pod condition that says a pod's worker panicked (status `True`, reason `WorkerPanicked`, and what
/// happened as its message).
pub const WORKER_CONDITION: &str = "nodewarden.io/WorkerPanicked";

/// The [`WORKER_CONDITION`] condition with `message`.
pub(crate) fn worker_condition(message: &str) -> PodCondition {
    PodCondition {
        type_: WORKER_CONDITION.to_owned(),
        status: "True".to_owned(),
        reason: Some("WorkerPanicked".to_owned()),
        message: Some(message.to_owned()),
        last_transition_time: Some(Time(jiff::Timestamp::now())),
        ..PodCondition::default()
    }
}

/// Pods and their status.
#[derive(Debug, Default)]
pub struct StatusStore {
    pods: RwLock<BTreeMap<String, Arc<Pod>>>,
    /// What each source refused, by source: one source's snapshot never clears another's.
    invalid: RwLock<BTreeMap<&'static str, Vec<InvalidManifest>>>,
    /// Each status for a consumer that reports it ([`StatusStore::reader`]).
    feed: Arc<StatusFeed>,
}

impl StatusStore {
    /// Sets a pod's latest state, redacted ([`redact`]): the store is what the unauthenticated `/pods` serves.
    pub fn set(&self, uid: &str, mut pod: Pod) {
        redact(&mut pod);
        let pod = Arc::new(pod);
        let mut pods = self.pods.write().unwrap_or_else(PoisonError::into_inner);
        self.feed.publish(uid, pod.clone());
        pods.insert(uid.to_owned(), pod);
    }

    /// Starts the status feed's one consumer: every pod's status from now on, each kept until the consumer
    /// acknowledged it, the last one of a pod that is gone included. `None` while another consumer reads.
    pub fn reader(&self) -> Option<StatusReader> {
        let pods = self.pods.read().unwrap_or_else(PoisonError::into_inner);
        self.feed.read(pods.iter().map(|(uid, p)| (uid.clone(), p.clone())).collect())
    }

    /// Marks a pod whose worker is gone for good: its status keeps its last state, with `message` in the
    /// [`WORKER_CONDITION`] condition.
    pub fn mark_unsynced(&self, uid: &str, message: &str) {
        let mut pods = self.pods.write().unwrap_or_else(PoisonError::into_inner);
        let Some(pod) = pods.get_mut(uid) else { return };
        let status = Arc::make_mut(pod).status.get_or_insert_with(PodStatus::default);
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        conditions.retain(|c| c.type_ != WORKER_CONDITION);
        conditions.push(worker_condition(message));
        self.feed.publish(uid, pod.clone());
    }

    /// A deleted pod's status is final (its containers are gone): the status feed keeps it until it is
    /// acknowledged, and then hands the pod over to be deleted for good.
    pub fn finalize(&self, uid: &str) {
        self.feed.gone(uid);
    }

    /// Forgets a pod its source no longer lists.
    pub fn remove(&self, uid: &str) {
        self.pods.write().unwrap_or_else(PoisonError::into_inner).remove(uid);
    }

    /// Whether the store has the pod.
    pub fn contains(&self, uid: &str) -> bool {
        self.pods.read().unwrap_or_else(PoisonError::into_inner).contains_key(uid)
    }

    /// One pod.
    pub fn get(&self, uid: &str) -> Option<Pod> {
        self.pods.read().unwrap_or_else(PoisonError::into_inner).get(uid).map(|p| Pod::clone(p))
    }

    /// Every pod the store has.
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.pods.read().unwrap_or_else(PoisonError::into_inner).values().cloned().collect()
    }

    /// The pods that are over (phase `Succeeded` or `Failed`: finished or evicted).
    pub fn finished(&self) -> Vec<Pod> {
        let over = [PodPhase::Succeeded.as_str(), PodPhase::Failed.as_str()];
        let pods = self.pods.read().unwrap_or_else(PoisonError::into_inner);
        pods.values()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()).is_some_and(|ph| over.contains(&ph)))
            .map(|p| Pod::clone(p))
            .collect()
    }

    /// Replaces `source`'s refused manifests; returns how many all sources have refused.
    pub fn set_invalid(&self, source: &'static str, invalid: Vec<InvalidManifest>) -> usize {
        let mut all = self.invalid.write().unwrap_or_else(PoisonError::into_inner);
        all.insert(source, invalid);
        all.values().map(Vec::len).sum()
    }

    /// Counts pods by phase and containers by state (`running`, `exited`, `created`), for the gauges.
    pub fn counts(&self) -> (i64, BTreeMap<&'static str, i64>) {
        let pods = self.pods.read().unwrap_or_else(PoisonError::into_inner);
        let mut running_pods = 0;
        let mut containers: BTreeMap<&'static str, i64> = [("running", 0), ("exited", 0), ("created", 0)].into();
        for p in pods.values() {
            let Some(s) = &p.status else { continue };
            if s.phase.as_deref() == Some(PodPhase::Running.as_str()) {
                running_pods += 1;
            }
            for c in s.container_statuses.iter().flatten().chain(s.init_container_statuses.iter().flatten()) {
                let state = c.state.as_ref();
                let key = if state.is_some_and(|s| s.running.is_some()) {
                    "running"
                } else if state.is_some_and(|s| s.terminated.is_some()) || c.last_state.is_some() {
                    "exited"
                } else {
                    "created"
                };
                *containers.entry(key).or_default() += 1;
            }
        }
        (running_pods, containers)
    }

    /// Every pod, and an entry per refused manifest (phase `Failed`, reason `InvalidManifest`), as a `v1.PodList`
    /// in JSON, whole ([`StatusStore::pod_list_pieces`] joined).
    pub fn pod_list_json(self: &Arc<Self>) -> Result<Vec<u8>, serde_json::Error> {
        let mut out = Vec::new();
        for piece in self.clone().pod_list_pieces() {
            out.extend(piece?);
        }
        Ok(out)
    }

    /// The `v1.PodList` of [`StatusStore::pod_list_json`] in pieces, to be sent as they are made: its head, each
    /// pod written straight from the store under the read lock, one pod a lock (so a request never holds a copy of
    /// the list, nor the lock while the client reads), then the refused manifests and its end. A pod removed
    /// meanwhile is left out.
    pub fn pod_list_pieces(self: Arc<Self>) -> impl Iterator<Item = Result<Vec<u8>, serde_json::Error>> + Send {
        let uids: Vec<String> = self.pods.read().unwrap_or_else(PoisonError::into_inner).keys().cloned().collect();
        let head = std::iter::once(Ok(br#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":["#.to_vec()));
        let store = self.clone();
        let pods = uids.into_iter().filter_map(move |uid| {
            let pods = store.pods.read().unwrap_or_else(PoisonError::into_inner);
            pods.get(&uid).map(|p| serde_json::to_vec(&**p))
        });
        let invalid = std::iter::once(()).flat_map(move |()| {
            let invalid = self.invalid.read().unwrap_or_else(PoisonError::into_inner);
            invalid.values().flatten().map(|m| serde_json::to_vec(&invalid_manifest_pod(m))).collect::<Vec<_>>()
        });
        let mut first = true;
        let items = pods.chain(invalid).map(move |item| {
            let mut piece = if first { Vec::new() } else { vec![b','] };
            first = false;
            piece.extend(item?);
            Ok(piece)
        });
        head.chain(items).chain(std::iter::once(Ok(b"]}".to_vec())))
    }
}

/// What an environment variable's value is replaced with in `/pods`.
pub const REDACTED: &str = "(redacted)";

/// The annotation in which `kubectl apply` keeps the whole object it applied, env values included.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Takes out of a pod what the unauthenticated read-only port must not show: every container's env values (a
/// manifest's credentials, as `value:`), and the copy of the object `kubectl apply` keeps in an annotation. Values
/// from Secrets and ConfigMaps are only references in a spec and stay so.
fn redact(pod: &mut Pod) {
    if let Some(annotations) = pod.metadata.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
    let Some(spec) = pod.spec.as_mut() else { return };
    let envs = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
        .filter_map(|c| c.env.as_mut())
        .chain(spec.ephemeral_containers.iter_mut().flatten().filter_map(|c| c.env.as_mut()));
    for var in envs.flatten().filter(|v| v.value.is_some()) {
        var.value = Some(REDACTED.to_owned());
    }
}

/// The `/pods` entry of a refused manifest.
fn invalid_manifest_pod(m: &InvalidManifest) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(manifest_name(&m.path)),
            annotations: Some(
                [
                    (CONFIG_SOURCE_ANNOTATION.to_owned(), "file".to_owned()),
                    (MANIFEST_ANNOTATION.to_owned(), m.path.display().to_string()),
                ]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(PodStatus {
            phase: Some(PodPhase::Failed.as_str().into()),
            reason: Some("InvalidManifest".into()),
            message: Some(m.error.to_string()),
            ..PodStatus::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::ManifestError;

    fn pod(uid: &str, phase: &str) -> Pod {
        Pod {
            metadata: ObjectMeta { name: Some(format!("p-{uid}")), uid: Some(uid.to_owned()), ..ObjectMeta::default() },
            spec: None,
            status: Some(PodStatus { phase: Some(phase.to_owned()), ..PodStatus::default() }),
        }
    }

    #[test]
    fn env_values_and_the_applied_copy_are_not_served() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u", "annotations": {LAST_APPLIED: "{\"password\": \"hunter2\"}", "keep": "x"}},
            "spec": {
                "containers": [{"name": "a", "env": [
                    {"name": "PASSWORD", "value": "hunter2"},
                    {"name": "FROM", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
                ]}],
                "initContainers": [{"name": "i", "env": [{"name": "TOKEN", "value": "hunter2"}]}],
                "ephemeralContainers": [{"name": "e", "env": [{"name": "T", "value": "hunter2"}]}]
            }
        }))
        .unwrap();
        let store = Arc::new(StatusStore::default());
        store.set("u", pod);
        let text = String::from_utf8(store.pod_list_json().unwrap()).unwrap();
        assert!(!text.contains("hunter2"), "{text}");
        let list: serde_json::Value = serde_json::from_str(&text).unwrap();
        let spec = &list["items"][0]["spec"];
        assert_eq!(spec["containers"][0]["env"][0], serde_json::json!({"name": "PASSWORD", "value": REDACTED}));
        assert_eq!(spec["containers"][0]["env"][1]["valueFrom"]["secretKeyRef"]["name"], "s");
        assert_eq!(spec["initContainers"][0]["env"][0]["value"], REDACTED);
        assert_eq!(list["items"][0]["metadata"]["annotations"], serde_json::json!({"keep": "x"}));
    }

    #[test]
    fn the_pod_list_has_every_pod_in_uid_order_then_the_refused_manifests() {
        let store = Arc::new(StatusStore::default());
        store.set("b", pod("b", "Running"));
        store.set("a", pod("a", "Pending"));
        store.set_invalid(
            "file",
            vec![InvalidManifest {
                path: "/etc/kubernetes/manifests/x.yaml".into(),
                error: ManifestError::Read("denied".into()),
            }],
        );
        let list: serde_json::Value = serde_json::from_slice(&store.pod_list_json().unwrap()).unwrap();
        assert_eq!(list["kind"], "PodList");
        assert_eq!(list["apiVersion"], "v1");
        assert_eq!(list["metadata"], serde_json::json!({}));
        let items = list["items"].as_array().unwrap();
        let names: Vec<&str> = items.iter().map(|p| p["metadata"]["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["p-a", "p-b", "x.yaml"]);
        assert_eq!(items[1]["status"]["phase"], "Running");
        assert_eq!(items[2]["status"]["reason"], "InvalidManifest");
        assert_eq!(items[2]["status"]["message"], "cannot read the manifest: denied");
        assert_eq!(items[2]["metadata"]["annotations"][MANIFEST_ANNOTATION], "/etc/kubernetes/manifests/x.yaml");
        // A real client reads it as a pod list.
        let typed: k8s_openapi::List<Pod> = serde_json::from_value(list).unwrap();
        assert_eq!(typed.items.len(), 3);

        store.remove("a");
        // Another source's snapshot leaves the file source's refusals alone.
        assert_eq!(store.set_invalid("api", Vec::new()), 1);
        assert_eq!(store.set_invalid("file", Vec::new()), 0);
        let list: serde_json::Value = serde_json::from_slice(&store.pod_list_json().unwrap()).unwrap();
        assert_eq!(list["items"].as_array().unwrap().len(), 1);
    }
}
