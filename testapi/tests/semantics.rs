//! The real apiserver's rules the test apiserver keeps, as a client meets them over HTTP: deletion with
//! finalizers and grace periods, pod admission (the service account volume, default tolerations, the status
//! reset, validation), the namespace lifecycle, spec immutability, the `pods/status` strategy, the Node authorizer
//! and NodeRestriction, bindings, evictions, TokenRequest, JSON patch, server-side apply, lists at a resource
//! version and their pages, expired continue tokens, too large resource versions, and the faults a client must
//! survive (a watch cut mid-event among them).
#![expect(clippy::unwrap_used, reason = "test code: a failed unwrap is a failed test")]

use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use nodewarden_testapi::{Fault, TestApi};
use serde_json::{Value, json};

async fn client(api: &TestApi, token: &str) -> kube::Client {
    let dir = tempfile::tempdir().unwrap();
    let path = api.write_kubeconfig(dir.path(), token).unwrap();
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await.unwrap();
    // The answers are the subject here: kube's own retries of 429, 503 and 504 would hide them.
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

fn code(e: &kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("not an API error: {other}"),
    }
}

fn message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => panic!("not an API error: {other}"),
    }
}

fn pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "busybox:1.36"}]},
    }))
    .unwrap()
}

/// A raw request as the admin, for what kube-rs has no call for; the answer's JSON or the API error.
async fn raw(
    c: &kube::Client,
    method: &str,
    path: &str,
    content_type: &str,
    body: Value,
) -> Result<Value, kube::Error> {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(serde_json::to_vec(&body).unwrap())
        .unwrap();
    c.request::<Value>(request).await
}

async fn admin(api: &TestApi) -> kube::Client {
    api.add_token("admin", None);
    client(api, "admin").await
}

#[tokio::test]
async fn finalizers_and_grace_periods_hold_a_deletion() {
    let api = TestApi::start(0).await.unwrap();
    let c = admin(&api).await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "held", "finalizers": ["example.com/hold"]}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    // Held by its finalizer: marked, still there; no new finalizer while deleting.
    let answer = raw(&c, "DELETE", "/api/v1/namespaces/default/configmaps/held", "application/json", json!({})).await;
    assert!(answer.unwrap()["metadata"]["deletionTimestamp"].is_string());
    let marked = cms.get("held").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    let more = json!({"metadata": {"finalizers": ["example.com/hold", "example.com/more"]}});
    let refused = cms.patch("held", &PatchParams::default(), &Patch::Merge(&more)).await.unwrap_err();
    assert_eq!(code(&refused), 422, "{}", message(&refused));
    // The last finalizer removed: gone.
    let none = json!({"metadata": {"finalizers": null}});
    cms.patch("held", &PatchParams::default(), &Patch::Merge(&none)).await.unwrap();
    assert_eq!(code(&cms.get("held").await.unwrap_err()), 404);
    // A kind other than pods and namespaces answers a delete with a Status.
    cms.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "plain"}})).unwrap())
        .await
        .unwrap();
    let answer =
        raw(&c, "DELETE", "/api/v1/namespaces/default/configmaps/plain", "application/json", json!({})).await.unwrap();
    assert_eq!((answer["kind"].as_str(), answer["status"].as_str()), (Some("Status"), Some("Success")), "{answer}");

    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    // Not bound to a node: deleted at once, whatever the grace.
    pods.create(&PostParams::default(), &pod("unbound", "")).await.unwrap();
    pods.delete("unbound", &DeleteParams::default().grace_period(30)).await.unwrap();
    assert_eq!(code(&pods.get("unbound").await.unwrap_err()), 404);
    // Bound: graceful; a longer grace later, or none, leaves the pending one; a shorter one moves it earlier.
    pods.create(&PostParams::default(), &pod("bound", "n1")).await.unwrap();
    pods.delete("bound", &DeleteParams::default().grace_period(60)).await.unwrap();
    pods.delete("bound", &DeleteParams::default()).await.unwrap();
    let p = pods.get("bound").await.unwrap();
    assert_eq!(p.metadata.deletion_grace_period_seconds, Some(60), "no grace given keeps the pending 60 s");
    pods.delete("bound", &DeleteParams::default().grace_period(10)).await.unwrap();
    let shorter = pods.get("bound").await.unwrap();
    assert_eq!(shorter.metadata.deletion_grace_period_seconds, Some(10));
    let moved = shorter.metadata.deletion_timestamp.unwrap().0 - p.metadata.deletion_timestamp.unwrap().0;
    assert_eq!(moved.get_seconds(), -50);
    // The kubelet's grace-0 delete with a stale UID is refused; with the right one the pod goes.
    let stale = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions { uid: Some("x".into()), resource_version: None }),
        ..DeleteParams::default()
    };
    assert_eq!(code(&pods.delete("bound", &stale).await.unwrap_err()), 409);
    pods.delete("bound", &DeleteParams::default().grace_period(0)).await.unwrap();
    assert_eq!(code(&pods.get("bound").await.unwrap_err()), 404);
}

#[tokio::test]
async fn pods_are_admitted_and_namespaces_live_and_die_as_in_a_cluster() {
    let api = TestApi::start(0).await.unwrap();
    let c = admin(&api).await;
    let namespaces: Api<Namespace> = Api::all(c.clone());
    namespaces
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "team"}})).unwrap())
        .await
        .unwrap();
    // The controllers' objects: the default service account and the CA bundle.
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "team");
    assert!(cms.get("kube-root-ca.crt").await.unwrap().data.unwrap().contains_key("ca.crt"));
    let pods: Api<Pod> = Api::namespaced(c.clone(), "team");
    let mut asked = pod("p", "n1");
    asked.status = serde_json::from_value(json!({"phase": "Running", "podIP": "10.0.0.9"})).unwrap();
    let p = pods.create(&PostParams::default(), &asked).await.unwrap();
    let v = serde_json::to_value(&p).unwrap();
    assert_eq!(v["status"], json!({"phase": "Pending", "qosClass": "BestEffort"}), "the status is the server's");
    assert_eq!(v["spec"]["serviceAccountName"], "default");
    let volume = v["spec"]["volumes"][0]["name"].as_str().unwrap();
    assert!(volume.starts_with("kube-api-access-"), "{volume}");
    assert_eq!(
        v["spec"]["containers"][0]["volumeMounts"][0],
        json!({"name": volume, "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"})
    );
    let keys: Vec<&str> =
        v["spec"]["tolerations"].as_array().unwrap().iter().map(|t| t["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"]);
    assert_eq!(
        (v["spec"]["restartPolicy"].as_str(), v["spec"]["terminationGracePeriodSeconds"].as_i64()),
        (Some("Always"), Some(30))
    );
    // Validation; a namespace that does not exist.
    let bad: Pod = serde_json::from_value(
        json!({"metadata": {"name": "bad"}, "spec": {"containers": [{"name": "Upper", "image": ""}]}}),
    )
    .unwrap();
    let e = pods.create(&PostParams::default(), &bad).await.unwrap_err();
    assert_eq!(code(&e), 422, "{}", message(&e));
    let nowhere: Api<Pod> = Api::namespaced(c.clone(), "nowhere");
    assert_eq!(code(&nowhere.create(&PostParams::default(), &pod("p", "n1")).await.unwrap_err()), 404);
    // The spec is immutable but for images; the status is not written through the pod.
    let mut moved = pods.get("p").await.unwrap();
    moved.spec.as_mut().unwrap().node_name = Some("n2".into());
    assert_eq!(code(&pods.replace("p", &PostParams::default(), &moved).await.unwrap_err()), 422);
    let image = json!({"spec": {"containers": [{"name": "app", "image": "busybox:1.37"}]}});
    pods.patch("p", &PatchParams::default(), &Patch::Strategic(&image)).await.unwrap();
    // The status strategy: the spec stays, labels may change, qosClass is kept when left out.
    let status = json!({"metadata": {"labels": {"a": "b"}}, "spec": {"nodeName": "elsewhere"}, "status": {"phase": "Running", "qosClass": null}});
    let after = pods.patch_status("p", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    let after = serde_json::to_value(&after).unwrap();
    assert_eq!(
        (after["spec"]["nodeName"].as_str(), after["metadata"]["labels"]["a"].as_str()),
        (Some("n1"), Some("b"))
    );
    assert_eq!(
        (after["status"]["phase"].as_str(), after["status"]["qosClass"].as_str()),
        (Some("Running"), Some("BestEffort"))
    );
    // Terminating: no new content; its pods are deleted gracefully, and it goes once they have.
    namespaces.delete("team", &DeleteParams::default()).await.unwrap();
    let ns = namespaces.get("team").await.unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Terminating"));
    let e = pods.create(&PostParams::default(), &pod("q", "n1")).await.unwrap_err();
    assert_eq!(code(&e), 403, "{}", message(&e));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(pods.get("p").await.unwrap().metadata.deletion_timestamp.is_some());
    assert!(namespaces.get("team").await.is_ok(), "held while its pod terminates");
    pods.delete("p", &DeleteParams::default().grace_period(0)).await.unwrap();
    let gone = async {
        while namespaces.get("team").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), gone).await.unwrap();
    assert_eq!(code(&namespaces.delete("default", &DeleteParams::default()).await.unwrap_err()), 403);
}

#[tokio::test]
async fn a_node_reaches_only_its_own_pods_and_what_they_reference() {
    let api = TestApi::start(0).await.unwrap();
    let c = admin(&api).await;
    api.add_token("n1-token", Some("n1"));
    let node = client(&api, "n1-token").await;
    let n1 = Api::<Node>::all(node.clone())
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap())
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(c.clone(), "default");
    for name in ["used", "unused"] {
        secrets
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {"k": "v"}})).unwrap(),
            )
            .await
            .unwrap();
    }
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    for name in ["cm-used", "cm-unused"] {
        let cm = serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let mut p = pod("p", "n1");
    p.spec.as_mut().unwrap().containers[0].env = Some(
        serde_json::from_value(json!([{"name": "E", "valueFrom": {"secretKeyRef": {"name": "used", "key": "k"}}},
            {"name": "F", "valueFrom": {"configMapKeyRef": {"name": "cm-used", "key": "k"}}}]))
        .unwrap(),
    );
    let admin_pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let p = admin_pods.create(&PostParams::default(), &p).await.unwrap();
    admin_pods.create(&PostParams::default(), &pod("other", "n2")).await.unwrap();

    let pods: Api<Pod> = Api::namespaced(node.clone(), "default");
    assert_eq!(code(&pods.get("other").await.unwrap_err()), 403);
    assert_eq!(code(&pods.list(&ListParams::default()).await.unwrap_err()), 403);
    assert_eq!(pods.list(&ListParams::default().fields("spec.nodeName=n1")).await.unwrap().items.len(), 1);
    // The main resource: no writes; the status: yes, but not its labels.
    let label = json!({"metadata": {"labels": {"x": "y"}}});
    assert_eq!(code(&pods.patch("p", &PatchParams::default(), &Patch::Merge(&label)).await.unwrap_err()), 403);
    assert_eq!(code(&pods.patch_status("p", &PatchParams::default(), &Patch::Merge(&label)).await.unwrap_err()), 403);
    let running = json!({"status": {"phase": "Running"}});
    pods.patch_status("p", &PatchParams::default(), &Patch::Merge(&running)).await.unwrap();
    // Only mirror pods, owned by its own Node alone and referencing nothing.
    assert_eq!(code(&pods.create(&PostParams::default(), &pod("plain", "n1")).await.unwrap_err()), 403);
    let mirror = |uid: &str, env: bool| -> Pod {
        let mut m = json!({"metadata": {"name": "static-n1", "annotations": {"kubernetes.io/config.mirror": "h"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": uid, "controller": true}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i:1"}]}});
        if env {
            m["spec"]["containers"][0]["envFrom"] = json!([{"secretRef": {"name": "used"}}]);
        }
        serde_json::from_value(m).unwrap()
    };
    let uid = n1.metadata.uid.unwrap();
    assert_eq!(code(&pods.create(&PostParams::default(), &mirror("wrong", false)).await.unwrap_err()), 403);
    assert_eq!(code(&pods.create(&PostParams::default(), &mirror(&uid, true)).await.unwrap_err()), 403);
    let made = pods.create(&PostParams::default(), &mirror(&uid, false)).await.unwrap();
    assert!(made.spec.unwrap().volumes.is_none(), "a mirror pod gets no service account volume");
    pods.delete("static-n1", &DeleteParams::default().grace_period(0)).await.unwrap();
    // Secrets: those its pods reference, by name only.
    let node_secrets: Api<Secret> = Api::namespaced(node.clone(), "default");
    node_secrets.get("used").await.unwrap();
    assert_eq!(code(&node_secrets.get("unused").await.unwrap_err()), 403);
    assert_eq!(code(&node_secrets.list(&ListParams::default()).await.unwrap_err()), 403);
    assert_eq!(node_secrets.list(&ListParams::default().fields("metadata.name=used")).await.unwrap().items.len(), 1);
    // ConfigMaps the same: those its pods reference (kube-root-ca.crt through the service account volume).
    let node_cms: Api<ConfigMap> = Api::namespaced(node.clone(), "default");
    node_cms.get("cm-used").await.unwrap();
    node_cms.get("kube-root-ca.crt").await.unwrap();
    assert_eq!(code(&node_cms.get("cm-unused").await.unwrap_err()), 403);
    assert_eq!(code(&node_cms.list(&ListParams::default()).await.unwrap_err()), 403);
    // Its own Node only, listed by name; core events only.
    let nodes: Api<Node> = Api::all(node.clone());
    assert_eq!(code(&nodes.list(&ListParams::default()).await.unwrap_err()), 403);
    nodes.list(&ListParams::default().fields("metadata.name=n1")).await.unwrap();
    let event = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"}, "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "x", "reportingInstance": "y", "action": "a", "reason": "r", "type": "Normal", "regarding": {"kind": "Pod", "name": "p"}});
    let e = raw(&node, "POST", "/apis/events.k8s.io/v1/namespaces/default/events", "application/json", event)
        .await
        .unwrap_err();
    assert_eq!(code(&e), 403);
    // A token for its pod's account, bound to that pod (with its UID), and nothing else.
    let token = |bound: Value| json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3607, "boundObjectRef": bound}});
    let path = "/api/v1/namespaces/default/serviceaccounts/default/token";
    let pod_uid = p.metadata.uid.unwrap();
    let answer = raw(
        &node,
        "POST",
        path,
        "application/json",
        token(json!({"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": pod_uid})),
    )
    .await
    .unwrap();
    assert!(answer["status"]["token"].as_str().unwrap().split('.').count() == 3, "{answer}");
    let e = raw(&node, "POST", path, "application/json", token(Value::Null)).await.unwrap_err();
    assert_eq!(code(&e), 403, "{}", message(&e));
    let e = raw(
        &node,
        "POST",
        path,
        "application/json",
        token(json!({"apiVersion": "v1", "kind": "Pod", "name": "other", "uid": "u"})),
    )
    .await
    .unwrap_err();
    assert_eq!(code(&e), 403);
    // Evicting its own pod is allowed.
    let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p"}, "deleteOptions": {"gracePeriodSeconds": 5}});
    raw(&node, "POST", "/api/v1/namespaces/default/pods/p/eviction", "application/json", eviction).await.unwrap();
    assert_eq!(admin_pods.get("p").await.unwrap().metadata.deletion_grace_period_seconds, Some(5));
}

#[tokio::test]
async fn bindings_json_patches_and_server_side_apply() {
    let api = TestApi::start(0).await.unwrap();
    let c = admin(&api).await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    pods.create(&PostParams::default(), &pod("p", "")).await.unwrap();
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}});
    raw(&c, "POST", "/api/v1/namespaces/default/pods/p/binding", "application/json", binding.clone()).await.unwrap();
    let bound = serde_json::to_value(pods.get("p").await.unwrap()).unwrap();
    assert_eq!(bound["spec"]["nodeName"], "n1");
    assert_eq!(bound["status"]["conditions"][0]["type"], "PodScheduled");
    let e =
        raw(&c, "POST", "/api/v1/namespaces/default/pods/p/binding", "application/json", binding).await.unwrap_err();
    assert_eq!(code(&e), 409);

    // JSON patch: a test that fails changes nothing.
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "cm"}, "data": {"a": "1"}})).unwrap(),
    )
    .await
    .unwrap();
    let ops =
        json!([{"op": "add", "path": "/data/b", "value": "2"}, {"op": "replace", "path": "/data/a", "value": "3"}]);
    let path = "/api/v1/namespaces/default/configmaps/cm";
    let cm = raw(&c, "PATCH", path, "application/json-patch+json", ops).await.unwrap();
    assert_eq!(cm["data"], json!({"a": "3", "b": "2"}));
    let ops = json!([{"op": "remove", "path": "/data/a"}, {"op": "test", "path": "/data/b", "value": "9"}]);
    let e = raw(&c, "PATCH", path, "application/json-patch+json", ops).await.unwrap_err();
    assert_eq!(code(&e), 422);
    assert!(cms.get("cm").await.unwrap().data.unwrap().contains_key("a"));

    // Server-side apply: creates, merges, drops what the manager no longer applies, refuses another's fields.
    let config =
        |data: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": data});
    let apply = |manager: &str, force: bool| {
        let mut p = PatchParams::apply(manager);
        p.force = force;
        p
    };
    let made =
        cms.patch("applied", &apply("one", false), &Patch::Apply(config(json!({"x": "1", "y": "1"})))).await.unwrap();
    assert_eq!(made.metadata.managed_fields.unwrap()[0].manager.as_deref(), Some("one"));
    let later = cms.patch("applied", &apply("one", false), &Patch::Apply(config(json!({"x": "2"})))).await.unwrap();
    assert_eq!(later.data.unwrap(), [("x".to_owned(), "2".to_owned())].into(), "y is no longer applied");
    let e = cms.patch("applied", &apply("two", false), &Patch::Apply(config(json!({"x": "3"})))).await.unwrap_err();
    assert_eq!(code(&e), 409, "{}", message(&e));
    assert!(message(&e).contains("conflict with \"one\""), "{}", message(&e));
    let forced = cms.patch("applied", &apply("two", true), &Patch::Apply(config(json!({"x": "3"})))).await.unwrap();
    assert_eq!(forced.data.unwrap()["x"], "3");
    let no_manager = raw(
        &c,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/applied",
        "application/apply-patch+yaml",
        config(json!({})),
    )
    .await
    .unwrap_err();
    assert_eq!(code(&no_manager), 422);
}

#[tokio::test]
async fn old_continue_tokens_expire_and_future_versions_time_out() {
    let api = TestApi::start(0).await.unwrap();
    let c = admin(&api).await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "kube-system");
    for i in 0..3 {
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": format!("c{i}")}})).unwrap(),
        )
        .await
        .unwrap();
    }
    let first = cms.list(&ListParams::default().limit(1)).await.unwrap();
    let token = first.metadata.continue_.unwrap();
    cms.list(&ListParams::default().limit(1).continue_token(&token)).await.unwrap();
    // Compacted past the list's resourceVersion (as etcd is, every 5 minutes, after later writes).
    cms.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "later"}})).unwrap())
        .await
        .unwrap();
    api.compact();
    let e = cms.list(&ListParams::default().limit(1).continue_token(&token)).await.unwrap_err();
    assert_eq!(code(&e), 410, "{}", message(&e));
    let ahead = first.metadata.resource_version.unwrap().parse::<u64>().unwrap() + 1000;
    let request = http::Request::get(format!("/api/v1/namespaces/kube-system/configmaps?resourceVersion={ahead}"))
        .body(Vec::new())
        .unwrap();
    let e = c.request::<Value>(request).await.unwrap_err();
    assert_eq!(code(&e), 504);
    let kube::Error::Api(status) = e else { unreachable!() };
    assert_eq!(status.details.unwrap().causes[0].reason, "ResourceVersionTooLarge");
}

/// A raw list of `kube-system`'s ConfigMaps with `query`.
async fn list_cms(c: &kube::Client, query: &str) -> Result<Value, kube::Error> {
    let request =
        http::Request::get(format!("/api/v1/namespaces/kube-system/configmaps?{query}")).body(Vec::new()).unwrap();
    c.request::<Value>(request).await
}

/// The names and `data.v` of a list's items.
fn contents(list: &Value) -> Vec<(String, Value)> {
    let items = list["items"].as_array().unwrap();
    items.iter().map(|i| (i["metadata"]["name"].as_str().unwrap().to_owned(), i["data"]["v"].clone())).collect()
}

#[tokio::test]
async fn lists_read_at_a_resource_version_and_page_one_snapshot_as_etcd_does() {
    let api = TestApi::start(0).await.unwrap();
    let c = admin(&api).await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "kube-system");
    let made = |name: &str, v: &str| serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": v}}));
    for name in ["a", "b"] {
        cms.create(&PostParams::default(), &made(name, "1").unwrap()).await.unwrap();
    }
    let then = cms.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    // Later: a changed, b deleted, c made.
    cms.patch("a", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "2"}}))).await.unwrap();
    cms.delete("b", &DeleteParams::default()).await.unwrap();
    cms.create(&PostParams::default(), &made("c", "1").unwrap()).await.unwrap();
    let root = ("kube-root-ca.crt".to_owned(), Value::Null);
    let v = |s: &str| Value::from(s);
    // Exact: the state at that resourceVersion, reported as it.
    let exact = list_cms(&c, &format!("resourceVersion={then}&resourceVersionMatch=Exact")).await.unwrap();
    assert_eq!(contents(&exact), [("a".into(), v("1")), ("b".into(), v("1")), root.clone()]);
    // Each as it was stored then, its resourceVersion included (b's deletion made a newer one).
    let rvs: Vec<u64> = exact["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap())
        .collect();
    assert!(rvs.iter().all(|rv| *rv <= then.parse().unwrap()), "{rvs:?} at {then}");
    assert_eq!(exact["metadata"]["resourceVersion"], then.as_str());
    // NotOlderThan: the current state.
    let now = list_cms(&c, &format!("resourceVersion={then}&resourceVersionMatch=NotOlderThan")).await.unwrap();
    assert_eq!(contents(&now), [("a".into(), v("2")), ("c".into(), v("1")), root.clone()]);
    assert_ne!(now["metadata"]["resourceVersion"], then.as_str());
    // Pages read the first page's snapshot: what is deleted or made meanwhile does not show.
    let first = list_cms(&c, "limit=1").await.unwrap();
    assert_eq!(contents(&first), [("a".into(), v("2"))]);
    cms.delete("c", &DeleteParams::default()).await.unwrap();
    cms.create(&PostParams::default(), &made("b2", "1").unwrap()).await.unwrap();
    let token = first["metadata"]["continue"].as_str().unwrap();
    let rest = list_cms(&c, &format!("continue={token}")).await.unwrap();
    assert_eq!(contents(&rest), [("c".into(), v("1")), root]);
    assert_eq!(rest["metadata"]["resourceVersion"], first["metadata"]["resourceVersion"]);
    // The rules of ListOptions.
    for (query, status) in [
        ("resourceVersionMatch=Exact", 422),
        ("resourceVersion=0&resourceVersionMatch=Exact", 422),
        ("resourceVersion=1&resourceVersionMatch=Newest", 422),
        (&format!("resourceVersion={then}&resourceVersionMatch=Exact&continue={token}") as &str, 422),
        (&format!("resourceVersion={then}&continue={token}"), 400),
    ] {
        let e = list_cms(&c, query).await.unwrap_err();
        assert_eq!(code(&e), status, "{query}: {}", message(&e));
    }
    // Compacted away: 410 Expired, as etcd's compaction makes it.
    api.compact();
    let e = list_cms(&c, &format!("resourceVersion={then}&resourceVersionMatch=Exact")).await.unwrap_err();
    assert_eq!((code(&e), message(&e)), (410, "The resourceVersion for the provided list is too old.".into()));
}

/// Takes names from `rx` into `seen` until `name` is among them (10 s at most for each).
async fn seen_until(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    seen: &mut std::collections::BTreeSet<String>,
    name: &str,
) {
    while !seen.contains(name) {
        seen.insert(tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap().unwrap());
    }
}

#[tokio::test]
async fn a_watch_cut_mid_stream_is_resumed_by_the_client_without_a_loss() {
    use kube::runtime::watcher;
    let api = TestApi::start(0).await.unwrap();
    let c = admin(&api).await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    // The watcher, driven on a task of its own: the names of the ConfigMaps it sees, as they come.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut events = watcher(cms, watcher::Config::default()).boxed();
        while let Some(e) = events.next().await {
            if let Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) = e
                && tx.send(cm.metadata.name.unwrap_or_default()).is_err()
            {
                return;
            }
        }
    });
    let mut seen = std::collections::BTreeSet::new();
    seen_until(&mut rx, &mut seen, "kube-root-ca.crt").await;
    // Every answer about ConfigMaps is cut after 50 bytes from now, and the open watch ends: each watch the
    // client opens again breaks in the middle of its first event (a ConfigMap the test makes in the store).
    api.set_fault(Fault { cut_after: Some(50), paths: Some("/configmaps".into()), ..Fault::default() });
    let from = api.requests().len();
    api.close_watches();
    let watches = || {
        let after = api.requests()[from..].to_vec();
        after.into_iter().filter(|r| r.query.contains("watch=true") && r.status == 200).map(|r| r.query).collect()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while Vec::<String>::is_empty(&watches()) {
        assert!(tokio::time::Instant::now() < deadline, "the watch was not opened again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    api.create("configmaps", Some("default"), json!({"metadata": {"name": "during"}})).unwrap();
    while watches().len() < 3 {
        assert!(tokio::time::Instant::now() < deadline, "the client stopped asking: {:?}", watches());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The client took no cut event for a whole one, and asks again from where it was each time.
    let asked: Vec<String> = watches();
    assert!(asked.iter().all(|q| q == &asked[0]), "{asked:#?}");
    assert!(rx.try_recv().is_err(), "an event arrived through a cut watch");
    // Once the cuts stop, the resumed watch brings what it missed and what follows.
    api.set_fault(Fault::default());
    api.create("configmaps", Some("default"), json!({"metadata": {"name": "after"}})).unwrap();
    seen_until(&mut rx, &mut seen, "during").await;
    seen_until(&mut rx, &mut seen, "after").await;
    driver.abort();
}

#[tokio::test]
async fn answers_cut_mid_body_and_oversized_watch_lines() {
    let api = TestApi::start(0).await.unwrap();
    let c = admin(&api).await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    // A watch whose events are each over 1 MiB arrives whole.
    api.set_fault(Fault { oversized: Some(1 << 20), ..Fault::default() });
    let mut stream = cms.watch(&WatchParams::default().timeout(10), "0").await.unwrap().boxed();
    api.set_fault(Fault::default());
    match tokio::time::timeout(Duration::from_secs(5), stream.try_next()).await.unwrap().unwrap().unwrap() {
        WatchEvent::Added(cm) => {
            assert_eq!(cm.metadata.annotations.unwrap()["testapi.nodewarden.io/padding"].len(), 1 << 20);
        }
        other => panic!("{other:?}"),
    }
    // An answer cut after 10 bytes is an error for the client, not a short object.
    api.set_fault(Fault {
        cut_after: Some(10),
        paths: Some("/configmaps/kube-root-ca.crt".into()),
        ..Fault::default()
    });
    let e = cms.get("kube-root-ca.crt").await.unwrap_err();
    assert!(!matches!(e, kube::Error::Api(_)), "{e}");
    api.set_fault(Fault::default());
    cms.get("kube-root-ca.crt").await.unwrap();
}

#[tokio::test]
async fn hostile_and_odd_requests_are_refused_and_harm_nothing() {
    let api = TestApi::start(0).await.unwrap();
    let c = admin(&api).await;
    // Bodies of the wrong shape are a 400 before anything looks at them, and the server (and its controllers)
    // go on.
    for (path, body) in [
        ("/api/v1/namespaces/default/pods", json!({"metadata": {"name": "p"}, "spec": {"containers": [1]}})),
        ("/api/v1/nodes", json!({"metadata": {"name": "n"}, "status": "x"})),
        (
            "/api/v1/namespaces/default/secrets",
            json!({"metadata": {"name": "s"}, "data": "x", "stringData": {"a": "b"}}),
        ),
        ("/api/v1/namespaces/default/serviceaccounts/default/token", json!({"spec": "x"})),
    ] {
        let e = raw(&c, "POST", path, "application/json", body).await.unwrap_err();
        assert_eq!(code(&e), 400, "{path}: {}", message(&e));
    }
    // A patch that would leave a pod of the wrong type is refused.
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    pods.create(&PostParams::default(), &pod("p", "")).await.unwrap();
    let ops = json!([{"op": "replace", "path": "/spec/containers/0", "value": 5}]);
    let e =
        raw(&c, "PATCH", "/api/v1/namespaces/default/pods/p", "application/json-patch+json", ops).await.unwrap_err();
    assert_eq!(code(&e), 422, "{}", message(&e));
    // Copies that double a value each time are bounded.
    let mut ops = vec![json!({"op": "add", "path": "/metadata/annotations", "value": {"a": "x".repeat(1000)}})];
    for i in 0..14 {
        ops.push(json!({"op": "copy", "from": "/metadata/annotations", "path": format!("/metadata/annotations/k{i}")}));
    }
    let e = raw(&c, "PATCH", "/api/v1/namespaces/default/pods/p", "application/json-patch+json", json!(ops))
        .await
        .unwrap_err();
    assert_eq!(code(&e), 413, "{}", message(&e));
    // Methods a resource does not take.
    let e =
        raw(&c, "DELETE", "/api/v1/namespaces/default/pods/p/status", "application/json", json!({})).await.unwrap_err();
    assert_eq!(code(&e), 405);
    let e =
        raw(&c, "POST", "/api/v1/namespaces/default/pods/p", "application/json", json!({"metadata": {"name": "p"}}))
            .await
            .unwrap_err();
    assert_eq!(code(&e), 405);
    assert!(pods.get("p").await.is_ok());
    // A generated name is there before validation.
    let generated: Pod = serde_json::from_value(
        json!({"metadata": {"generateName": "web-"}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}}),
    )
    .unwrap();
    let made = pods.create(&PostParams::default(), &generated).await.unwrap();
    assert!(made.metadata.name.unwrap().starts_with("web-"));
    // A write to a terminating namespace leaves it terminating, and it still empties and goes.
    let namespaces: Api<Namespace> = Api::all(c.clone());
    namespaces
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "gone"}})).unwrap())
        .await
        .unwrap();
    namespaces.delete("gone", &DeleteParams::default()).await.unwrap();
    let label = json!({"metadata": {"labels": {"x": "y"}}});
    namespaces.patch("gone", &PatchParams::default(), &Patch::Merge(&label)).await.unwrap();
    let ns = namespaces.get("gone").await.unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Terminating"));
    let emptied = async {
        while namespaces.get("gone").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), emptied).await.unwrap();
    assert!(
        Api::<ConfigMap>::namespaced(c.clone(), "gone").get("kube-root-ca.crt").await.is_err(),
        "its contents went first"
    );

    // A node: no service account reads, no deleting its Node, no forbidden label by server-side apply.
    api.add_token("n1-token", Some("n1"));
    let node = client(&api, "n1-token").await;
    let e = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(node.clone(), "default")
        .get("default")
        .await
        .unwrap_err();
    assert_eq!(code(&e), 403);
    let nodes: Api<Node> = Api::all(node.clone());
    let own = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"node-role.kubernetes.io/control-plane": ""}}});
    let e = nodes.patch("n1", &PatchParams::apply("kubelet"), &Patch::Apply(own)).await.unwrap_err();
    assert_eq!(code(&e), 403, "{}", message(&e));
    nodes
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap())
        .await
        .unwrap();
    assert_eq!(code(&nodes.delete("n1", &DeleteParams::default()).await.unwrap_err()), 403);
}

#[tokio::test]
async fn dependents_go_with_their_last_owner() {
    let api = TestApi::start(0).await.unwrap();
    let owner = api.create("configmaps", Some("default"), json!({"metadata": {"name": "owner"}})).unwrap();
    let other = api.create("configmaps", Some("default"), json!({"metadata": {"name": "other"}})).unwrap();
    let node = api.create("nodes", None, json!({"metadata": {"name": "n1"}})).unwrap();
    let by = |o: &Value, kind: &str| json!({"apiVersion": "v1", "kind": kind, "name": o["metadata"]["name"], "uid": o["metadata"]["uid"]});
    let owned = |name: &str, owners: Value| json!({"metadata": {"name": name, "ownerReferences": owners}});
    api.create("secrets", Some("default"), owned("dependent", json!([by(&owner, "ConfigMap")]))).unwrap();
    let both = json!([by(&owner, "ConfigMap"), by(&other, "ConfigMap")]);
    api.create("secrets", Some("default"), owned("shared", both)).unwrap();
    let lease = json!({"metadata": {"name": "n1", "ownerReferences": [by(&node, "Node")]}, "spec": {}});
    api.create("leases", Some("kube-node-lease"), lease).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(api.get("secrets", Some("default"), "dependent").is_some(), "collected while its owner is there");
    api.delete("configmaps", Some("default"), "owner", None).unwrap();
    api.delete("nodes", None, "n1", None).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while api.get("secrets", Some("default"), "dependent").is_some()
        || api.get("leases", Some("kube-node-lease"), "n1").is_some()
    {
        assert!(tokio::time::Instant::now() < deadline, "dependents of a deleted owner were not collected");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(api.get("secrets", Some("default"), "shared").is_some(), "an owner is still there");
    // Deleted in the foreground, an owner takes with it only what no other owner holds; one that blocks it
    // goes first. A policy the apiserver does not know is refused.
    let c = admin(&api).await;
    let first = api.create("configmaps", Some("default"), json!({"metadata": {"name": "first"}})).unwrap();
    let mut blocking = by(&first, "ConfigMap");
    blocking["blockOwnerDeletion"] = json!(true);
    api.create("secrets", Some("default"), owned("mine", json!([blocking.clone()]))).unwrap();
    api.create("secrets", Some("default"), owned("ours", json!([blocking, by(&other, "ConfigMap")]))).unwrap();
    let path = "/api/v1/namespaces/default/configmaps/first";
    let e = raw(&c, "DELETE", path, "application/json", json!({"propagationPolicy": "Sideways"})).await.unwrap_err();
    assert_eq!(code(&e), 422, "{}", message(&e));
    let held = raw(&c, "DELETE", path, "application/json", json!({"propagationPolicy": "Foreground"})).await.unwrap();
    assert_eq!(held["metadata"]["finalizers"], json!(["foregroundDeletion"]), "{held:#}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while api.get("configmaps", Some("default"), "first").is_some() {
        assert!(tokio::time::Instant::now() < deadline, "the owner was never let go");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(api.get("secrets", Some("default"), "mine").is_none(), "the owner went before what blocks it");
    let ours = api.get("secrets", Some("default"), "ours").expect("a dependent another owner holds was deleted");
    assert_eq!(ours["metadata"]["ownerReferences"].as_array().unwrap().len(), 1, "{ours:#}");
}
