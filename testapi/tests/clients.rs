//! The test apiserver as kube-rs sees it: what a real client relies on must hold (create and conflicts, status
//! writes, strategic merge patches, field selectors, paging, watches with bookmarks, field-selector transitions
//! and the in-stream 410, graceful pod deletion, NodeRestriction).
#![expect(clippy::unwrap_used, reason = "test code: a failed unwrap is a failed test")]

use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use nodewarden_testapi::TestApi;
use serde_json::json;

async fn client(api: &TestApi, token: &str) -> kube::Client {
    let dir = tempfile::tempdir().unwrap();
    let path = api.write_kubeconfig(dir.path(), token).unwrap();
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await.unwrap();
    kube::Client::try_from(config).unwrap()
}

fn pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "busybox"}]},
    }))
    .unwrap()
}

fn code(e: &kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test]
async fn writes_conflicts_status_and_patches() {
    let api = TestApi::start(0).await.unwrap();
    api.add_token("admin", None);
    let c = client(&api, "admin").await;
    let nodes: Api<Node> = Api::all(c.clone());
    let n: Node = serde_json::from_value(json!({"metadata": {"name": "n1"}, "status": {"conditions": [
        {"type": "Ready", "status": "False"}, {"type": "NetworkUnavailable", "status": "False"}]}}))
    .unwrap();
    let created = nodes.create(&PostParams::default(), &n).await.unwrap();
    assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());
    assert_eq!(code(&nodes.create(&PostParams::default(), &n).await.unwrap_err()), 409);
    // A stale resourceVersion conflicts.
    let mut stale = created.clone();
    stale.metadata.labels = Some([("a".to_owned(), "b".to_owned())].into());
    nodes.replace("n1", &PostParams::default(), &stale).await.unwrap();
    assert_eq!(code(&nodes.replace("n1", &PostParams::default(), &stale).await.unwrap_err()), 409);
    // A strategic merge patch of the status merges conditions by type.
    let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}});
    let patched = nodes.patch_status("n1", &PatchParams::default(), &Patch::Strategic(&patch)).await.unwrap();
    let conds = patched.status.unwrap().conditions.unwrap();
    assert_eq!(conds.len(), 2);
    assert_eq!((conds[0].type_.as_str(), conds[0].status.as_str()), ("Ready", "True"));
    // A JSON merge patch replaces the list.
    let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}});
    let patched = nodes.patch_status("n1", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    assert_eq!(patched.status.unwrap().conditions.unwrap().len(), 1);
    // Status is not written through the main resource.
    let mut n = nodes.get("n1").await.unwrap();
    n.status = None;
    let kept = nodes.replace("n1", &PostParams::default(), &n).await.unwrap();
    assert!(kept.status.is_some());
    assert_eq!(code(&nodes.get("nope").await.unwrap_err()), 404);
}

#[tokio::test]
async fn lists_page_select_and_watches_resume() {
    let api = TestApi::start(0).await.unwrap();
    let c = client(&api, "admin").await;
    api.add_token("admin", None);
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    for i in 0..5 {
        pods.create(&PostParams::default(), &pod(&format!("p{i}"), if i < 3 { "n1" } else { "n2" })).await.unwrap();
    }
    let all: Api<Pod> = Api::all(c.clone());
    let on_n1 = all.list(&ListParams::default().fields("spec.nodeName=n1")).await.unwrap();
    assert_eq!(on_n1.items.len(), 3);
    let page = all.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(page.items.len(), 2);
    let rest = all
        .list(&ListParams::default().limit(10).continue_token(page.metadata.continue_.as_deref().unwrap()))
        .await
        .unwrap();
    assert_eq!(rest.items.len(), 3);
    assert!(all.list(&ListParams::default().fields("spec.bogus=x")).await.is_err());

    // A watch from the list's resourceVersion with bookmarks, selecting the pods of n1 that have not failed: a pod
    // that fails leaves the selection (DELETED), one that runs again enters it (ADDED).
    let rv = on_n1.metadata.resource_version.clone().unwrap();
    let wp = WatchParams::default().fields("spec.nodeName=n1,status.phase!=Failed").timeout(10);
    let mut with_bookmarks = wp.clone();
    with_bookmarks.bookmarks = true;
    let mut stream = all.watch(&with_bookmarks, &rv).await.unwrap().boxed();
    pods.patch("p3", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})))
        .await
        .unwrap();
    let phase = |p: &str| json!({"status": {"phase": p}});
    pods.patch_status("p1", &PatchParams::default(), &Patch::Merge(phase("Failed"))).await.unwrap();
    pods.patch_status("p1", &PatchParams::default(), &Patch::Merge(phase("Running"))).await.unwrap();
    let graceful = pods.delete("p0", &DeleteParams::default().grace_period(30)).await.unwrap();
    assert!(graceful.left().unwrap().metadata.deletion_timestamp.is_some(), "a bound pod is deleted gracefully");
    pods.delete("p0", &DeleteParams::default().grace_period(0)).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 4 {
        match tokio::time::timeout(Duration::from_secs(5), stream.try_next()).await.unwrap().unwrap().unwrap() {
            WatchEvent::Modified(p) => seen.push(format!("MODIFIED {}", p.metadata.name.unwrap())),
            WatchEvent::Deleted(p) => seen.push(format!("DELETED {}", p.metadata.name.unwrap())),
            WatchEvent::Added(p) => seen.push(format!("ADDED {}", p.metadata.name.unwrap())),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("{e}"),
        }
    }
    assert_eq!(seen, ["DELETED p1", "ADDED p1", "MODIFIED p0", "DELETED p0"], "p3 is on n2 and never matched");
    // A bookmark arrives within its period.
    let bookmark = tokio::time::timeout(Duration::from_secs(8), async {
        while let Some(e) = stream.try_next().await.unwrap() {
            if let WatchEvent::Bookmark(b) = e {
                return b.metadata.resource_version;
            }
        }
        String::new()
    })
    .await
    .unwrap();
    assert!(!bookmark.is_empty());
    // After compaction, a watch from an old resourceVersion gets the in-stream 410.
    api.compact();
    let mut stream = all.watch(&wp, &rv).await.unwrap().boxed();
    match stream.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410 Expired, got {other:?}"),
    }
}

#[tokio::test]
async fn a_node_identity_is_restricted_as_noderestriction_restricts_it() {
    let api = TestApi::start(0).await.unwrap();
    api.add_token("n1-token", Some("n1"));
    let c = client(&api, "n1-token").await;
    let nodes: Api<Node> = Api::all(c.clone());
    let other: Node = serde_json::from_value(json!({"metadata": {"name": "n2"}})).unwrap();
    assert_eq!(code(&nodes.create(&PostParams::default(), &other).await.unwrap_err()), 403);
    let role: Node =
        serde_json::from_value(json!({"metadata": {"name": "n1", "labels": {"node-role.kubernetes.io/worker": ""}}}))
            .unwrap();
    assert_eq!(code(&nodes.create(&PostParams::default(), &role).await.unwrap_err()), 403);
    let own: Node =
        serde_json::from_value(json!({"metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "h"}},
        "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}}))
        .unwrap();
    nodes.create(&PostParams::default(), &own).await.unwrap();
    let untaint = json!({"spec": {"taints": []}});
    assert_eq!(code(&nodes.patch("n1", &PatchParams::default(), &Patch::Strategic(&untaint)).await.unwrap_err()), 403);
    // What a write would make of the Node counts, not only what it sends: a PUT that leaves the taints out, a
    // patch that removes a label only an administrator may set.
    let mut without_taints = nodes.get("n1").await.unwrap();
    without_taints.spec = None;
    assert_eq!(code(&nodes.replace("n1", &PostParams::default(), &without_taints).await.unwrap_err()), 403);
    api.create("nodes", None, json!({"metadata": {"name": "n4", "labels": {"node-role.kubernetes.io/worker": ""}}}))
        .unwrap();
    api.add_token("n4-token", Some("n4"));
    let n4: Api<Node> = Api::all(client(&api, "n4-token").await);
    let unlabel = json!({"metadata": {"labels": {"node-role.kubernetes.io/worker": null}}});
    assert_eq!(code(&n4.patch("n4", &PatchParams::default(), &Patch::Merge(&unlabel)).await.unwrap_err()), 403);
    let relabel = json!({"metadata": {"labels": {"kubernetes.io/hostname": "n4"}}});
    n4.patch("n4", &PatchParams::default(), &Patch::Merge(&relabel)).await.unwrap();
    let leases: Api<Lease> = Api::namespaced(c.clone(), "kube-node-lease");
    let theirs: Lease = serde_json::from_value(json!({"metadata": {"name": "n2"}})).unwrap();
    assert_eq!(code(&leases.create(&PostParams::default(), &theirs).await.unwrap_err()), 403);
    let all_pods: Api<Pod> = Api::all(c.clone());
    assert_eq!(code(&all_pods.list(&ListParams::default()).await.unwrap_err()), 403);
    all_pods.list(&ListParams::default().fields("spec.nodeName=n1")).await.unwrap();
    // An unknown token is 401.
    let stranger = client(&api, "who").await;
    assert_eq!(code(&Api::<Node>::all(stranger).get("n1").await.unwrap_err()), 401);
}

#[tokio::test]
async fn a_watch_list_sends_the_state_then_the_end_bookmark_then_changes() {
    let api = TestApi::start(0).await.unwrap();
    api.add_token("admin", None);
    let c = client(&api, "admin").await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    for i in 0..3 {
        pods.create(&PostParams::default(), &pod(&format!("w{i}"), "n1")).await.unwrap();
    }
    let wp = WatchParams::streaming_lists().timeout(10);
    let mut stream = pods.watch(&wp, "0").await.unwrap().boxed();
    let mut added = Vec::new();
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.try_next()).await.unwrap().unwrap().unwrap() {
            WatchEvent::Added(p) => added.push(p.metadata.name.unwrap()),
            WatchEvent::Bookmark(b) => break b,
            other => panic!("{other:?}"),
        }
    };
    added.sort();
    assert_eq!(added, ["w0", "w1", "w2"], "the state first");
    assert_eq!(end.metadata.annotations.get("k8s.io/initial-events-end").map(String::as_str), Some("true"));
    pods.create(&PostParams::default(), &pod("w3", "n1")).await.unwrap();
    match tokio::time::timeout(Duration::from_secs(5), stream.try_next()).await.unwrap().unwrap().unwrap() {
        WatchEvent::Added(p) => assert_eq!(p.metadata.name.as_deref(), Some("w3")),
        other => panic!("{other:?}"),
    }
    // What the apiserver's ListOptions validation refuses, as 422 before any stream.
    for query in [
        "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
        "watch=true&sendInitialEvents=true&allowWatchBookmarks=true",
        "watch=true&resourceVersionMatch=NotOlderThan",
    ] {
        let request = http::Request::get(format!("/api/v1/namespaces/default/pods?{query}")).body(Vec::new()).unwrap();
        let err = c.request_text(request).await.unwrap_err();
        assert_eq!(code(&err), 422, "{query}: {err}");
    }
}
