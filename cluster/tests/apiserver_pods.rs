//! The pod side against the test apiserver over real HTTP, with kube-rs as the client: the watch of the node's
//! pods (whole sets, only its own, through outages), status patches and the final deletion with the UID as a
//! precondition.
#![expect(clippy::unwrap_used, reason = "test code: a failed unwrap is a failed test")]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use nodewarden_cluster::{Clients, ClusterSettings, FactSource, NodeFacts, PodSet, PodWriter, Written, watch_pods};
use nodewarden_testapi::TestApi;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const NODE: &str = "n1";

struct Facts;

impl FactSource for Facts {
    fn facts(&self) -> NodeFacts {
        NodeFacts {
            capacity: BTreeMap::from([("cpu".into(), "2".into()), ("memory".into(), "1Gi".into())]),
            allocatable: BTreeMap::from([("cpu".into(), "2".into()), ("memory".into(), "1Gi".into())]),
            runtime_version: "nodewarden-process://0.1.0".into(),
            ..NodeFacts::default()
        }
    }
}

fn settings() -> ClusterSettings {
    ClusterSettings {
        node_name: NODE.into(),
        register_node: true,
        register_with_taints: Vec::new(),
        node_labels: BTreeMap::new(),
        provider_id: None,
        lease_duration: Duration::from_secs(4),
        status_update_frequency: Duration::from_secs(1),
        status_report_frequency: Duration::from_secs(60),
        daemon_port: 10248,
        node_ip: None,
        max_images: None,
        event_qps: None,
        event_burst: 100,
    }
}

struct Side {
    clients: Clients,
    set: watch::Receiver<Option<Arc<PodSet>>>,
    stop: CancellationToken,
    tasks: TaskTracker,
}

/// The node side and the pod watch of node `n1`.
async fn start(api: &TestApi, dir: &std::path::Path) -> Side {
    api.add_token("t", Some(NODE));
    let kubeconfig = api.write_kubeconfig(dir, "t").unwrap();
    let s = settings();
    let clients = Clients::from_kubeconfig(&kubeconfig, 50.0, 100, s.heartbeat_timeout()).await.unwrap();
    let (stop, tasks) = (CancellationToken::new(), TaskTracker::new());
    let status = Arc::new(nodewarden_cluster::ClusterStatus::new(s.lease_duration));
    let (_changed, rx) = watch::channel(0);
    nodewarden_cluster::start(status.clone(), s, clients.clone(), Arc::new(Facts), rx, &tasks, stop.clone());
    let (tx, set) = watch::channel(None);
    tasks.spawn(watch_pods(clients.clone(), status, NODE.into(), tx, stop.clone()));
    Side { clients, set, stop, tasks }
}

fn pod(name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "automountServiceAccountToken": false,
                 "containers": [{"name": "app", "image": "busybox"}]},
    })
}

async fn wait_set(side: &mut Side, what: &str, f: impl Fn(&PodSet) -> bool) -> Arc<PodSet> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(s) = side.set.borrow_and_update().clone().filter(|s| f(s)) {
            return s;
        }
        let left = until.saturating_duration_since(Instant::now());
        assert!(tokio::time::timeout(left, side.set.changed()).await.is_ok(), "timed out waiting for {what}");
    }
}

fn names(s: &PodSet) -> Vec<String> {
    let mut v: Vec<String> = s.values().filter_map(|p| p.metadata.name.clone()).collect();
    v.sort();
    v
}

fn typed(v: Value) -> Pod {
    serde_json::from_value(v).unwrap()
}

#[tokio::test]
async fn the_nodes_pods_are_watched_and_their_status_and_deletion_written() {
    let api = TestApi::start(0).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Before the node exists: the watch waits for the Node, then its first set is the whole list.
    api.create("pods", Some("default"), pod("first", NODE)).unwrap();
    api.create("pods", Some("default"), pod("elsewhere", "n2")).unwrap();
    let mut side = start(&api, dir.path()).await;
    let first = wait_set(&mut side, "the first list", |_| true).await;
    assert_eq!(names(&first), ["first"], "only the node's own pods, all of them at once");
    let reads: Vec<_> = api.requests().into_iter().filter(|r| r.path == "/api/v1/pods").collect();
    assert!(!reads.is_empty());
    for r in &reads {
        assert!(r.query.contains("fieldSelector=spec.nodeName%3Dn1"), "{}", r.query);
        assert_eq!(r.status, 200, "the node's own pods, as NodeRestriction allows: {}", r.query);
    }
    let registered = api.requests().iter().position(|r| r.method == "POST" && r.path == "/api/v1/nodes").unwrap();
    let listed = api.requests().iter().position(|r| r.path == "/api/v1/pods").unwrap();
    assert!(registered < listed, "the Node is registered before the pods are listed");

    // A change comes as the whole set.
    api.create("pods", Some("default"), pod("second", NODE)).unwrap();
    wait_set(&mut side, "the second pod", |s| names(s) == ["first", "second"]).await;

    // A status is written with the UID as a precondition.
    let writer = PodWriter::new(side.clients.clone());
    let mut second = typed(api.get("pods", Some("default"), "second").unwrap());
    second.status = Some(
        serde_json::from_value(json!({"phase": "Running", "podIP": "10.0.0.5",
        "podIPs": [{"ip": "10.0.0.5"}], "conditions": [{"type": "Ready", "status": "True"}]}))
        .unwrap(),
    );
    assert_eq!(writer.patch_status(&second, None).await.unwrap(), Written::Done);
    let stored = api.get("pods", Some("default"), "second").unwrap();
    assert_eq!(stored["status"]["phase"], "Running");
    assert_eq!(stored["status"]["podIP"], "10.0.0.5");
    assert_eq!(stored["status"]["conditions"][0]["type"], "Ready");
    wait_set(&mut side, "the status echoed", |s| {
        s.values().any(|p| p.status.as_ref().and_then(|st| st.phase.as_deref()) == Some("Running"))
    })
    .await;

    // A graceful deletion: the pod stays listed, with its deletion time, until the node deletes it with grace 0.
    api.delete("pods", Some("default"), "second", Some(3)).unwrap();
    let s =
        wait_set(&mut side, "the deletion time", |s| s.values().any(|p| p.metadata.deletion_timestamp.is_some())).await;
    let deleting = s.values().find(|p| p.metadata.name.as_deref() == Some("second")).unwrap();
    assert_eq!(deleting.metadata.deletion_grace_period_seconds, Some(3));
    assert_eq!(writer.delete(deleting).await.unwrap(), Written::Done);
    wait_set(&mut side, "the pod gone", |s| names(s) == ["first"]).await;
    assert!(api.get("pods", Some("default"), "second").is_none());

    // Made again under its name: the old UID's status and deletion do not reach the new pod.
    api.create("pods", Some("default"), pod("second", NODE)).unwrap();
    assert_eq!(writer.patch_status(&second, None).await.unwrap(), Written::Gone);
    assert_eq!(writer.delete(&second).await.unwrap(), Written::Gone);
    let again = api.get("pods", Some("default"), "second").unwrap();
    assert!(again["status"]["phase"] != "Running" && again["metadata"]["deletionTimestamp"].is_null(), "{again:#}");

    // The apiserver away and back, its history compacted meanwhile: the set stands, then a new list.
    api.set_up(false);
    api.compact();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(names(side.set.borrow().as_ref().unwrap()), ["first", "second"], "the last set stands");
    api.delete("pods", Some("default"), "first", Some(0)).unwrap();
    api.set_up(true);
    wait_set(&mut side, "the deletion made meanwhile", |s| names(s) == ["second"]).await;

    side.stop.cancel();
    side.tasks.close();
    tokio::time::timeout(Duration::from_secs(5), side.tasks.wait()).await.unwrap();
}
