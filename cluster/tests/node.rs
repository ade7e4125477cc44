//! The node side against the test apiserver over real HTTP, with kube-rs as the client: registration, the Lease,
//! status on change, conditions and events, outages and restarts.
#![expect(clippy::unwrap_used, reason = "test code: a failed unwrap is a failed test")]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use nodewarden_cluster::{Clients, ClusterSettings, FactSource, NodeFacts};
use nodewarden_testapi::{Fault, TestApi};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

struct Facts(Mutex<NodeFacts>);

impl FactSource for Facts {
    fn facts(&self) -> NodeFacts {
        self.0.lock().unwrap().clone()
    }
}

fn facts() -> Arc<Facts> {
    Arc::new(Facts(Mutex::new(NodeFacts {
        capacity: BTreeMap::from([
            ("cpu".into(), "2".into()),
            ("memory".into(), "1Gi".into()),
            ("pods".into(), "110".into()),
        ]),
        allocatable: BTreeMap::from([
            ("cpu".into(), "2".into()),
            ("memory".into(), "900Mi".into()),
            ("pods".into(), "110".into()),
        ]),
        runtime_version: "nodewarden-process://0.1.0".into(),
        images: vec![
            (vec!["localhost/small:1".into()], 10),
            (vec!["sha256:big".into(), "localhost/big:1".into()], 3000),
            (vec!["localhost/mid:1".into()], 200),
        ],
        ..NodeFacts::default()
    })))
}

fn settings(node: &str) -> ClusterSettings {
    ClusterSettings {
        node_name: node.into(),
        register_node: true,
        register_with_taints: Vec::new(),
        node_labels: BTreeMap::from([("example.com/rack".into(), "r1".into())]),
        provider_id: None,
        lease_duration: Duration::from_secs(4),
        status_update_frequency: Duration::from_millis(200),
        status_report_frequency: Duration::from_secs(60),
        daemon_port: 10248,
        node_ip: None,
        max_images: Some(2),
        event_qps: None,
        event_burst: 100,
    }
}

struct Node {
    status: Arc<nodewarden_cluster::ClusterStatus>,
    changed: watch::Sender<u64>,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl Node {
    async fn stop(self) {
        self.stop.cancel();
        self.tasks.close();
        tokio::time::timeout(Duration::from_secs(5), self.tasks.wait()).await.expect("the node side did not stop");
    }
}

async fn start(api: &TestApi, dir: &std::path::Path, s: ClusterSettings, f: Arc<Facts>) -> Node {
    let token = format!("token-{}", s.node_name);
    api.add_token(&token, Some(&s.node_name));
    let kubeconfig = api.write_kubeconfig(dir, &token).unwrap();
    start_from(&kubeconfig, s, f, false).await
}

/// The node side from `kubeconfig`; with `reload`, the kubeconfig and its files are watched as the daemon watches
/// them.
async fn start_from(kubeconfig: &std::path::Path, s: ClusterSettings, f: Arc<Facts>, reload: bool) -> Node {
    let clients = Clients::from_kubeconfig(kubeconfig, 50.0, 100, s.heartbeat_timeout()).await.unwrap();
    let (changed, rx) = watch::channel(0);
    let stop = CancellationToken::new();
    let tasks = TaskTracker::new();
    let status = Arc::new(nodewarden_cluster::ClusterStatus::new(s.lease_duration));
    if reload {
        let (path, timeout) = (kubeconfig.to_owned(), s.heartbeat_timeout());
        tasks.spawn(nodewarden_cluster::watch_credentials(path, clients.clone(), 50.0, 100, timeout, stop.clone()));
    }
    nodewarden_cluster::start(status.clone(), s, clients, f, rx, &tasks, stop.clone());
    Node { status, changed, stop, tasks }
}

async fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn condition<'a>(node: &'a Value, kind: &str) -> &'a Value {
    node["status"]["conditions"].as_array().and_then(|c| c.iter().find(|c| c["type"] == kind)).unwrap_or(&Value::Null)
}

fn status_patches(api: &TestApi, node: &str) -> usize {
    api.requests().iter().filter(|r| r.method == "PATCH" && r.path == format!("/api/v1/nodes/{node}/status")).count()
}

#[tokio::test]
async fn a_node_registers_heartbeats_and_reports_changes_at_once() {
    let api = TestApi::start(0).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let f = facts();
    // A long update period: anything reported within it was reported because the daemon said something changed.
    let mut s = settings("n1");
    s.status_update_frequency = Duration::from_secs(30);
    let n = start(&api, dir.path(), s, f.clone()).await;
    wait_for("the Node", Duration::from_secs(10), || api.get("nodes", None, "n1").is_some()).await;
    let node = api.get("nodes", None, "n1").unwrap();
    let labels = &node["metadata"]["labels"];
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(labels["kubernetes.io/arch"], nodewarden_cluster::go_arch(std::env::consts::ARCH));
    assert_eq!(labels["example.com/rack"], "r1");
    assert!(labels["kubernetes.io/hostname"].is_string());
    assert_eq!(node["status"]["capacity"]["memory"], "1Gi");
    assert_eq!(node["status"]["allocatable"]["memory"], "900Mi");
    assert_eq!(node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"], 10248);
    assert_eq!(node["status"]["nodeInfo"]["containerRuntimeVersion"], "nodewarden-process://0.1.0");
    assert_eq!(node["status"]["nodeInfo"]["architecture"], labels["kubernetes.io/arch"]);
    // The largest images first, at most nodeStatusMaxImages (2 here).
    assert_eq!(
        node["status"]["images"],
        serde_json::json!([
            {"names": ["sha256:big", "localhost/big:1"], "sizeBytes": 3000},
            {"names": ["localhost/mid:1"], "sizeBytes": 200}
        ])
    );
    let kinds: Vec<&str> =
        node["status"]["conditions"].as_array().unwrap().iter().map(|c| c["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"], "Ready last");
    assert_eq!(condition(&node, "Ready")["reason"], "KubeletReady");

    // The Lease, owned by the Node, renewed every second (a quarter of 4 s).
    wait_for("the Lease with its owner", Duration::from_secs(10), || {
        api.get("leases", Some("kube-node-lease"), "n1").is_some_and(|l| l["metadata"]["ownerReferences"].is_array())
    })
    .await;
    let lease = api.get("leases", Some("kube-node-lease"), "n1").unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "n1");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 4);
    assert_eq!(lease["metadata"]["ownerReferences"][0]["uid"], node["metadata"]["uid"]);
    let renewed = lease["spec"]["renewTime"].clone();
    wait_for("a renewal", Duration::from_secs(3), || {
        api.get("leases", Some("kube-node-lease"), "n1").is_some_and(|l| l["spec"]["renewTime"] != renewed)
    })
    .await;
    assert!(n.status.readiness().is_ok(), "{:?}", n.status.readiness());

    // A new Node's first conditions are transitions from Unknown: their events are posted.
    wait_for("the first events", Duration::from_secs(3), || {
        let reasons: Vec<Value> = api.list("events", Some("default")).iter().map(|e| e["reason"].clone()).collect();
        ["Starting", "NodeHasSufficientMemory", "NodeHasNoDiskPressure", "NodeHasSufficientPID", "NodeReady"]
            .iter()
            .all(|r| reasons.contains(&json!(r)))
    })
    .await;

    // Memory pressure: posted at once when the daemon says so, with its event; Ready follows the facts.
    f.0.lock().unwrap().memory_pressure = true;
    f.0.lock().unwrap().not_ready = vec!["container runtime is down".into()];
    let changed_at = Instant::now();
    n.changed.send_modify(|g| *g += 1);
    wait_for("MemoryPressure True", Duration::from_secs(2), || {
        api.get("nodes", None, "n1").is_some_and(|n| condition(&n, "MemoryPressure")["status"] == "True")
    })
    .await;
    let took = changed_at.elapsed();
    assert!(took < Duration::from_millis(500), "{took:?}");
    let node = api.get("nodes", None, "n1").unwrap();
    assert_eq!(condition(&node, "MemoryPressure")["reason"], "KubeletHasInsufficientMemory");
    assert_eq!(condition(&node, "Ready")["status"], "False");
    assert_eq!(condition(&node, "Ready")["reason"], "KubeletNotReady");
    assert_eq!(condition(&node, "Ready")["message"], "container runtime is down");
    wait_for("the events", Duration::from_secs(2), || {
        let reasons: Vec<Value> = api.list("events", Some("default")).iter().map(|e| e["reason"].clone()).collect();
        reasons.contains(&json!("NodeHasInsufficientMemory")) && reasons.contains(&json!("NodeNotReady"))
    })
    .await;
    let events = api.list("events", Some("default"));
    let e = events.iter().find(|e| e["reason"] == "NodeHasInsufficientMemory").unwrap();
    assert_eq!(e["message"], "Node n1 status is now: NodeHasInsufficientMemory");
    assert_eq!(e["type"], "Normal");
    assert_eq!(
        (e["involvedObject"]["kind"].as_str(), e["involvedObject"]["name"].as_str()),
        (Some("Node"), Some("n1"))
    );
    assert_eq!(e["source"]["component"], "kubelet");
    n.stop().await;
}

#[tokio::test]
async fn outages_are_ridden_out_and_a_restart_duplicates_nothing() {
    let api = TestApi::start(0).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let f = facts();
    let mut s = settings("n2");
    s.status_report_frequency = Duration::from_secs(3);
    let n = start(&api, dir.path(), s, f.clone()).await;
    wait_for("the Lease", Duration::from_secs(10), || api.get("leases", Some("kube-node-lease"), "n2").is_some()).await;

    // Nothing changed: no status patch for a second (the update frequency is 200 ms), then one once the report
    // frequency (3 s) has passed.
    wait_for("the first status report", Duration::from_secs(5), || status_patches(&api, "n2") >= 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = status_patches(&api, "n2");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(status_patches(&api, "n2"), before, "an unchanged status is not patched");
    wait_for("the status reported again", Duration::from_secs(4), || status_patches(&api, "n2") > before).await;
    let uid = api.get("nodes", None, "n2").unwrap()["metadata"]["uid"].clone();

    // 5xx: the heartbeat fails, readiness says so with its age; it recovers once the apiserver does.
    api.set_fault(Fault { status: Some(503), ..Fault::default() });
    wait_for("readiness to fail", Duration::from_secs(10), || n.status.readiness().is_err()).await;
    let why = n.status.readiness().unwrap_err();
    assert!(why.contains("last heartbeat accepted") && why.contains("503"), "{why}");
    api.set_fault(Fault::default());
    let back = Instant::now();
    wait_for("readiness again", Duration::from_secs(10), || n.status.readiness().is_ok()).await;
    assert!(back.elapsed() < Duration::from_secs(8), "recovered in {:?}", back.elapsed());

    // Connections refused for longer than the Lease's duration: the same.
    api.set_up(false);
    wait_for("readiness to fail while refused", Duration::from_secs(10), || n.status.readiness().is_err()).await;
    f.0.lock().unwrap().disk_pressure = true;
    n.changed.send_modify(|g| *g += 1);
    api.set_up(true);
    let back = Instant::now();
    wait_for("DiskPressure posted after the outage", Duration::from_secs(15), || {
        api.get("nodes", None, "n2").is_some_and(|n| condition(&n, "DiskPressure")["status"] == "True")
    })
    .await;
    wait_for("readiness after the outage", Duration::from_secs(10), || n.status.readiness().is_ok()).await;
    assert!(back.elapsed() < Duration::from_secs(10), "recovered in {:?}", back.elapsed());

    // Someone else writes the Lease just after a renewal: the next renewal conflicts, re-reads it and renews.
    let renewals = || {
        api.requests().iter().filter(|r| r.method == "PUT" && r.path.ends_with("/leases/n2") && r.status == 200).count()
    };
    let before = renewals();
    wait_for("a renewal after the outage", Duration::from_secs(10), || renewals() > before).await;
    let mut l = api.get("leases", Some("kube-node-lease"), "n2").unwrap();
    l["metadata"]["labels"] = json!({"touched": "yes"});
    // Made again from the old copy, as a backup restore would: a create carries no resourceVersion.
    l["metadata"].as_object_mut().unwrap().remove("resourceVersion");
    api.delete("leases", Some("kube-node-lease"), "n2", None).unwrap();
    let recreated = api.create("leases", Some("kube-node-lease"), l).unwrap();
    let rv = recreated["metadata"]["resourceVersion"].clone();
    wait_for("the Lease renewed after the conflict", Duration::from_secs(5), || {
        api.get("leases", Some("kube-node-lease"), "n2").is_some_and(|l| l["metadata"]["resourceVersion"] != rv)
    })
    .await;
    // The fixture logs a request once it has answered it: the renewal seen in the store may not be logged yet.
    let lease_requests = || -> Vec<(String, u16)> {
        api.requests().iter().filter(|r| r.path.ends_with("/leases/n2")).map(|r| (r.method.clone(), r.status)).collect()
    };
    let is_conflict = |r: &(String, u16)| *r == ("PUT".to_owned(), 409);
    let all_logged = || {
        let logged = lease_requests();
        logged.iter().position(is_conflict).is_some_and(|at| logged.len() >= at + 3)
    };
    let waited = Instant::now();
    while !all_logged() && waited.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let lease_requests = lease_requests();
    let conflict = lease_requests
        .iter()
        .position(is_conflict)
        .unwrap_or_else(|| panic!("no renewal conflicted: {lease_requests:?}"));
    assert_eq!(
        lease_requests.get(conflict + 1..conflict + 3),
        Some(&[("GET".to_owned(), 200), ("PUT".to_owned(), 200)][..]),
        "a conflict re-reads the Lease and renews it: {lease_requests:?}"
    );
    n.stop().await;

    // A restart (as after kill -9) finds the same Node and Lease; nothing is created twice.
    let creates_before = api.requests().iter().filter(|r| r.method == "POST").count();
    let n = start(&api, dir.path(), settings("n2"), f).await;
    wait_for("a renewal after the restart", Duration::from_secs(10), || n.status.readiness().is_ok()).await;
    assert_eq!(api.get("nodes", None, "n2").unwrap()["metadata"]["uid"], uid);
    assert_eq!(api.list("nodes", None).len(), 1);
    let creates: Vec<String> = api
        .requests()
        .iter()
        .filter(|r| r.method == "POST")
        .skip(creates_before)
        .map(|r| r.path.clone())
        .filter(|p| !p.ends_with("/events"))
        .collect();
    // The Node create is tried (AlreadyExists), the Lease is not.
    assert_eq!(creates, ["/api/v1/nodes"], "{creates:?}");
    n.stop().await;
}

#[tokio::test]
async fn a_node_forbidden_to_create_its_node_uses_the_one_provisioned_for_it() {
    // Nodes provisioned ahead by an operator, with the kubelet's create forbidden: as kubelets since 1.32, the
    // 403 is followed by a read, and the node reports on the Node it finds.
    let api = TestApi::start(0).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    api.create("nodes", None, json!({"metadata": {"name": "p1", "labels": {"example.com/provisioned": "yes"}}}))
        .unwrap();
    api.set_fault(Fault {
        status: Some(403),
        paths: Some("/api/v1/nodes".into()),
        method: Some("POST".into()),
        ..Fault::default()
    });
    let n = start(&api, dir.path(), settings("p1"), facts()).await;
    wait_for("ready", Duration::from_secs(10), || n.status.readiness().is_ok()).await;
    let node = api.get("nodes", None, "p1").unwrap();
    assert_eq!(condition(&node, "Ready")["status"], "True", "{node:#}");
    assert_eq!(node["metadata"]["labels"]["example.com/provisioned"], "yes");
    assert!(api.requests().iter().any(|r| r.method == "POST" && r.path == "/api/v1/nodes" && r.status == 403));
    n.stop().await;
}

#[tokio::test]
async fn a_label_the_node_may_not_set_is_refused_by_the_apiserver() {
    // NodeRestriction in the test apiserver refuses what the config check would refuse first.
    let api = TestApi::start(0).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings("n3");
    s.node_labels.insert("node-role.kubernetes.io/worker".into(), String::new());
    let n = start(&api, dir.path(), s, facts()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(api.get("nodes", None, "n3").is_none());
    let refused = api.requests().iter().filter(|r| r.method == "POST" && r.path == "/api/v1/nodes").count();
    assert!(refused >= 2, "registration is retried ({refused} tries)");
    // The Lease may be renewed, but a node that is not registered is not ready.
    let why = n.status.readiness().unwrap_err();
    assert!(why.contains("not registered") && why.contains("403"), "{why}");
    n.stop().await;
}

fn has_taint(node: &Value, key: &str) -> bool {
    node["spec"]["taints"].as_array().is_some_and(|t| t.iter().any(|t| t["key"] == key))
}

#[tokio::test]
async fn a_quiet_outage_past_the_lifecycle_grace_is_put_right_within_15_s_of_the_return() {
    let api = TestApi::start(0).await.unwrap();
    api.set_node_monitor_grace(Some(Duration::from_secs(6)));
    let dir = tempfile::tempdir().unwrap();
    // A report frequency far past the test: only a read of the apiserver's Node can show what happened to it.
    let mut s = settings("q1");
    s.status_report_frequency = Duration::from_secs(600);
    let n = start(&api, dir.path(), s, facts()).await;
    let node = || api.get("nodes", None, "q1").unwrap_or(Value::Null);
    wait_for("Ready", Duration::from_secs(10), || condition(&node(), "Ready")["status"] == "True").await;
    // A repeat of an event counts on the first (client-go's correlation): the occurrences are the counts' sum.
    let ready_events = || {
        let events = api.list("events", None);
        events.iter().filter(|e| e["reason"] == "NodeReady").map(|e| e["count"].as_u64().unwrap_or(1)).sum::<u64>()
    };
    let events_before = ready_events();

    // Nothing changes on the node while the apiserver is away past the grace: the controller marks it.
    api.set_up(false);
    wait_for("Unknown and unreachable", Duration::from_secs(30), || {
        let n = node();
        condition(&n, "Ready")["status"] == "Unknown" && has_taint(&n, "node.kubernetes.io/unreachable")
    })
    .await;
    assert_eq!(condition(&node(), "MemoryPressure")["status"], "Unknown");
    tokio::time::sleep(Duration::from_secs(2)).await;
    api.set_up(true);
    let back = Instant::now();
    let returned = jiff::Timestamp::now();
    wait_for("Ready and untainted after the return", Duration::from_secs(30), || {
        let n = node();
        condition(&n, "Ready")["status"] == "True" && !has_taint(&n, "node.kubernetes.io/unreachable")
    })
    .await;
    let took = back.elapsed();
    assert!(took < Duration::from_secs(15), "put right {took:?} after the apiserver's return");
    let n_now = node();
    let ready = condition(&n_now, "Ready");
    let transition: jiff::Timestamp = ready["lastTransitionTime"].as_str().unwrap().parse().unwrap();
    assert!(transition >= returned - jiff::SignedDuration::from_secs(1), "a transition from Unknown: {ready}");
    assert_eq!(condition(&n_now, "MemoryPressure")["status"], "False");
    wait_for("the NodeReady event", Duration::from_secs(5), || ready_events() > events_before).await;
    n.stop().await;
}

#[tokio::test]
async fn a_node_deleted_by_an_operator_is_not_registered_again() {
    let api = TestApi::start(0).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Deletion is seen at the next report (a patch answered 404), after a failed heartbeat, or when the Lease
    // goes with its Node (the garbage collector deletes what the Node owns).
    let mut s = settings("d1");
    s.status_report_frequency = Duration::from_secs(2);
    let n = start(&api, dir.path(), s, facts()).await;
    wait_for("ready", Duration::from_secs(10), || n.status.readiness().is_ok()).await;
    let kept = api.get("nodes", None, "d1").unwrap();
    api.delete("nodes", None, "d1", None).unwrap();
    wait_for("readiness to say so", Duration::from_secs(10), || {
        n.status.readiness().is_err_and(|e| e.contains("deleted from the apiserver"))
    })
    .await;
    let creates = || api.requests().iter().filter(|r| r.method == "POST" && r.path == "/api/v1/nodes").count();
    let before = creates();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(api.get("nodes", None, "d1").is_none(), "the Node was registered again");
    assert_eq!(creates(), before, "no create was even tried");
    // The operator makes it again (uncordoned): it is reported on again.
    let mut again = json!({"metadata": {"name": "d1", "labels": kept["metadata"]["labels"]}});
    again["apiVersion"] = json!("v1");
    again["kind"] = json!("Node");
    api.create("nodes", None, again).unwrap();
    wait_for("reported again", Duration::from_secs(10), || {
        n.status.readiness().is_ok()
            && api.get("nodes", None, "d1").is_some_and(|n| condition(&n, "Ready")["status"] == "True")
    })
    .await;
    n.stop().await;
}

#[tokio::test]
async fn a_trickled_lease_answer_is_abandoned_at_its_deadline_and_renewals_go_on() {
    let api = TestApi::start(0).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The heartbeat client's deadline: min(200 ms, 4 s), at least 1 s.
    let n = start(&api, dir.path(), settings("t1"), facts()).await;
    wait_for("ready", Duration::from_secs(10), || n.status.readiness().is_ok()).await;
    // The fixture logs a request when its answer starts (a trickled body comes after).
    // Tries: the renewals, and the reads of the Lease after the conflicts an abandoned (but applied) one leaves.
    let puts = || api.requests().iter().filter(|r| r.path.ends_with("/leases/t1")).count();
    // A byte every 500 ms: each resets kube's idle timers (1 s), so a Lease of some 400 bytes would hold a
    // renewal for minutes; the whole answer is due within 1 s.
    let trickle = Some(Duration::from_millis(500));
    api.set_fault(Fault { trickle, paths: Some("/leases/t1".into()), ..Fault::default() });
    let start_puts = puts();
    let started = Instant::now();
    wait_for("readiness to fail", Duration::from_secs(15), || n.status.readiness().is_err()).await;
    let why = n.status.readiness().unwrap_err();
    assert!(why.contains("last heartbeat accepted"), "{why}");
    tokio::time::sleep(Duration::from_secs(8).saturating_sub(started.elapsed())).await;
    api.set_fault(Fault::default());
    wait_for("renewals again", Duration::from_secs(10), || n.status.readiness().is_ok()).await;
    assert!(puts() > start_puts + 2, "renewals kept being tried: {} → {}", start_puts, puts());
    n.stop().await;
}

#[tokio::test]
async fn retry_after_is_honoured() {
    let api = TestApi::start(0).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let n = start(&api, dir.path(), settings("r1"), facts()).await;
    wait_for("ready", Duration::from_secs(10), || n.status.readiness().is_ok()).await;
    api.set_fault(Fault {
        status: Some(429),
        retry_after: Some(2),
        paths: Some("/leases/r1".into()),
        ..Fault::default()
    });
    tokio::time::sleep(Duration::from_secs(9)).await;
    api.set_fault(Fault::default());
    let refused: Vec<Instant> =
        api.requests().iter().filter(|r| r.path.ends_with("/leases/r1") && r.status == 429).map(|r| r.at).collect();
    assert!((2..=6).contains(&refused.len()), "{} tries in 9 s", refused.len());
    for pair in refused.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(gap >= Duration::from_millis(1900), "a try {gap:?} after a 429 that asked for 2 s");
    }
    wait_for("renewals again", Duration::from_secs(10), || n.status.readiness().is_ok()).await;
    n.stop().await;
}

#[tokio::test]
async fn credentials_changed_on_disk_are_used_without_a_restart() {
    let api = TestApi::start(0).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let s = settings("c1");
    api.add_token("old-c1", Some("c1"));
    let path = api.write_kubeconfig(dir.path(), "old-c1").unwrap();
    let n = start_from(&path, s, facts(), true).await;
    let status = n.status.clone();
    wait_for("ready", Duration::from_secs(10), || status.readiness().is_ok()).await;
    // The old credential revoked: refused.
    api.remove_token("old-c1");
    wait_for("readiness to fail", Duration::from_secs(10), || status.readiness().is_err()).await;
    assert!(status.readiness().unwrap_err().contains("401"), "{}", status.readiness().unwrap_err());
    // A new one written where the kubeconfig is: taken up within a poll and a renewal.
    api.add_token("new-c1", Some("c1"));
    let fresh = api.write_kubeconfig(dir.path(), "new-c1").unwrap();
    std::fs::copy(&fresh, &path).unwrap();
    let written = Instant::now();
    wait_for("heartbeats with the new credentials", Duration::from_secs(20), || status.readiness().is_ok()).await;
    assert!(written.elapsed() < Duration::from_secs(15), "{:?}", written.elapsed());
    n.stop().await;
}

/// Writes `text` to `path` as a rotation does: a new file renamed over the old one.
fn replace(path: &std::path::Path, text: &str) {
    let fresh = path.with_extension("new");
    std::fs::write(&fresh, text).unwrap();
    std::fs::rename(&fresh, path).unwrap();
}

#[tokio::test]
async fn an_expired_client_certificate_renewed_on_disk_is_used_without_a_restart() {
    // Over TLS with the x509 authenticator, as a kubelet's client certificate (rotateCertificates) is used.
    let api = TestApi::start_tls(0).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let s = settings("c2");
    let life = Duration::from_secs(12);
    let first = api.issue_client_certificate(Some("c2"), life).unwrap();
    let issued = Instant::now();
    let path = api.write_kubeconfig_with_certificate(dir.path(), "c2", &first).unwrap();
    let n = start_from(&path, s, facts(), true).await;
    let status = n.status.clone();
    wait_for("ready", life, || status.readiness().is_ok()).await;
    assert!(issued.elapsed() < life, "registered only after the certificate expired");
    assert!(api.get("nodes", None, "c2").is_some(), "registered with the certificate's identity");
    // The certificate's end: the apiserver refuses it, and the node is not ready.
    wait_for("readiness to fail", life + Duration::from_secs(15), || status.readiness().is_err()).await;
    assert!(status.readiness().unwrap_err().contains("401"), "{}", status.readiness().unwrap_err());
    // A renewed certificate and key written over the files the kubeconfig names: taken up within a poll and a
    // renewal, with no restart.
    let renewed = api.issue_client_certificate(Some("c2"), Duration::from_secs(3600)).unwrap();
    replace(&dir.path().join("c2.crt"), &renewed.cert_pem);
    replace(&dir.path().join("c2.key"), &renewed.key_pem);
    let written = Instant::now();
    wait_for("heartbeats with the renewed certificate", Duration::from_secs(20), || status.readiness().is_ok()).await;
    assert!(written.elapsed() < Duration::from_secs(15), "{:?}", written.elapsed());
    n.stop().await;
}
