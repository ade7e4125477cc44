//! The CRI runtime against real containerd and runc (inside the VM of `deploy/vm`; skipped where cgroup v2 is
//! missing). containerd is started once by `deploy/containerd/start` with locally built busybox and pause images;
//! the tests share it, so they run one at a time.
//!
//! A static pod runs as a sandbox whose cgroup is the placement's, with the placement's limits; an OOM kill is
//! reported; eviction stops the hog through CRI; a container's writes to its root count toward its ephemeral-storage
//! limit; imagefs pressure is relieved by removing unused images before a pod is evicted, and what that cannot cover
//! evicts the pod that filled its writable layer; a restarted daemon adopts its sandboxes; a containerd restart is
//! survived; pods on the pod network get their CNI address and wait while it is not ready (the Node says so);
//! unpullable images, a missing socket and `nodewarden cri` are checked.
#![expect(clippy::unwrap_used, reason = "test code: a failed unwrap is a failed test")]
#![expect(clippy::disallowed_types, reason = "waits for real processes, in real time")]

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const SOCKET: &str = "/run/containerd/containerd.sock";
const ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
const BUSYBOX: &str = "localhost/busybox:1";

static SERIAL: Mutex<()> = Mutex::new(());
static CONTAINERD: OnceLock<()> = OnceLock::new();

/// One test at a time, with containerd running.
fn serial() -> MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    CONTAINERD.get_or_init(start_containerd);
    guard
}

fn start_containerd() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/containerd/start");
    let out = Command::new(script).arg(SOCKET).output().unwrap();
    assert!(out.status.success(), "containerd did not start: {}", String::from_utf8_lossy(&out.stderr));
}

fn containerd_pid() -> Option<u32> {
    let out = Command::new("pidof").arg("containerd").output().ok()?;
    String::from_utf8_lossy(&out.stdout).split_whitespace().next()?.parse().ok()
}

/// `nodewarden cri ARGS` against the test containerd: exit code and stdout.
fn cri(args: &[&str]) -> (i32, String) {
    let (code, out, _) = cri_err(args);
    (code, out)
}

/// `nodewarden cri ARGS`: exit code, stdout and stderr.
fn cri_err(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(["cri", "--endpoint", ENDPOINT]).args(args).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

fn cri_node(name: &str, top: &str) -> Node {
    node_with(name, "", &format!("containerRuntimeEndpoint: {ENDPOINT}\n{top}"))
}

/// A host-network pod with one busybox container running `command`.
fn busybox_pod(name: &str, command: &str, resources: &str, extra: &str) -> String {
    pod_yaml(
        name,
        &format!(
            "  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n{extra}  containers:\n  - name: app\n    \
             image: {BUSYBOX}\n    command: [sh, -c, '{command}']\n{resources}"
        ),
    )
}

fn running(p: &Value) -> bool {
    phase(p) == "Running"
}

fn container_id(p: &Value) -> String {
    let id = container(p, "app")["containerID"].as_str().unwrap().to_owned();
    id.strip_prefix("containerd://").unwrap_or_else(|| panic!("not a containerd ID: {id}")).to_owned()
}

/// The sandbox IDs containerd has for a pod UID (any state).
fn sandboxes(uid: &str) -> Vec<String> {
    let (code, out) = cri(&["pods"]);
    assert_eq!(code, 0, "{out}");
    let ids: Vec<String> = out.lines().skip(1).map(|l| l.split_whitespace().next().unwrap().to_owned()).collect();
    ids.into_iter()
        .filter(|id| {
            let (_, json) = cri(&["inspect", id]);
            serde_json::from_str::<Value>(&json).is_ok_and(|v| v["status"]["uid"] == uid)
        })
        .collect()
}

fn remove_pod(n: &Node, file: &str, name: &str) {
    std::fs::remove_file(n.manifests.join(file)).unwrap();
    wait_until(60, &format!("{name} was removed"), || n.pod(name).is_none());
}

#[test]
fn a_static_pod_runs_as_a_sandbox_at_its_placement() {
    if !cgroup2_available() {
        return;
    }
    let _serial = serial();
    let n = cri_node("cri-place", "featureGates:\n  MemoryQoS: true\n");
    let limits = "    resources:\n      requests: {memory: 32Mi, cpu: 100m}\n      limits: {memory: 64Mi}\n";
    let probe = "    readinessProbe:\n      exec: {command: [cat, /etc/passwd]}\n      periodSeconds: 2\n";
    n.write("web.yaml", &busybox_pod("web", "echo hello from cri; exec sleep 3600", &format!("{limits}{probe}"), ""));
    let t0 = Instant::now();
    let p = n.wait_pod("web", 180, "ran", running);
    eprintln!("manifest → Running through containerd: {:?}", t0.elapsed());
    let uid = p["metadata"]["uid"].as_str().unwrap().to_owned();
    let id = container_id(&p);
    // The exec readiness probe runs through ExecSync.
    n.wait_pod("web", 60, "was ready", |p| container(p, "app")["ready"] == true);

    // The sandbox's cgroup parent is the placement: the pod cgroup holds the pause container's and the app's.
    let pod_cg = n.pod_cgroup(&p);
    assert_eq!(std::fs::read_to_string(pod_cg.join("memory.max")).unwrap().trim(), (64 * MIB).to_string());
    let app_cg = pod_cg.join(&id);
    assert!(app_cg.is_dir(), "no container cgroup at {}", app_cg.display());
    assert_eq!(std::fs::read_to_string(app_cg.join("memory.max")).unwrap().trim(), (64 * MIB).to_string());
    let procs = std::fs::read_to_string(app_cg.join("cgroup.procs")).unwrap();
    assert!(!procs.trim().is_empty(), "the app runs in its cgroup");
    // Memory QoS reaches the container through CRI's `unified` (request 32Mi → memory.min).
    assert_eq!(std::fs::read_to_string(app_cg.join("memory.min")).unwrap().trim(), (32 * MIB).to_string());
    assert!(!pod_cg.join("app").exists(), "nodewarden made a container cgroup containerd does not use");
    let sbs = sandboxes(&uid);
    assert_eq!(sbs.len(), 1, "one sandbox: {sbs:?}");
    // CRI calls are counted under the kubelet's names.
    let text = get(n.d.port, "/metrics").unwrap().1;
    for op in ["version", "run_podsandbox", "create_container", "start_container", "list_containers"] {
        let name = format!("kubelet_runtime_operations_total{{operation_type=\"{op}\"}}");
        assert!(metric(&text, &name).is_some_and(|v| v >= 1.0), "{name} missing");
    }

    // The debugging CLI sees the same.
    let (_, ps) = cri(&["ps"]);
    assert!(ps.lines().any(|l| l.starts_with(&id[..13]) && l.contains("RUNNING") && l.contains("web-vm")), "{ps}");
    let (_, images) = cri(&["images"]);
    assert!(images.contains("localhost/busybox"), "{images}");
    let (code, logs) = cri(&["logs", &id[..8]]);
    assert_eq!((code, logs.as_str()), (0, "hello from cri\n"));
    let (code, out, err) = cri_err(&["exec", &id, "--", "sh", "-c", "echo out; echo err >&2; exit 3"]);
    assert_eq!((code, out.as_str(), err.as_str()), (3, "out\n", "err\n"));
    let (_, inspect) = cri(&["inspect", &id]);
    let v: Value = serde_json::from_str(&inspect).unwrap();
    assert_eq!(v["status"]["labels"]["io.kubernetes.pod.uid"], uid.as_str());
    assert_eq!(v["status"]["state"], "RUNNING");

    // Deleting the manifest stops and removes the sandbox, and leaves no cgroup behind.
    remove_pod(&n, "web.yaml", "web");
    assert!(sandboxes(&uid).is_empty(), "the sandbox was left in containerd");
    wait_until(10, "the pod cgroup was removed", || !pod_cg.exists());
}

#[test]
fn a_container_over_its_memory_limit_is_reported_oom_killed() {
    if !cgroup2_available() {
        return;
    }
    let _serial = serial();
    let n = cri_node("cri-oom", "");
    let limits = "    resources:\n      limits: {memory: 24Mi, cpu: 200m}\n";
    let grow = "x=0123456789abcdef; while :; do x=$x$x; done";
    n.write("oom.yaml", &busybox_pod("oom", grow, limits, "  restartPolicy: Never\n"));
    let p = n.wait_pod("oom", 180, "was OOM-killed", |p| phase(p) == "Failed");
    let t = &container(&p, "app")["state"]["terminated"];
    assert_eq!(t["reason"], "OOMKilled", "{p:#}");
    assert_eq!(t["exitCode"], 137);
    remove_pod(&n, "oom.yaml", "oom");
}

#[test]
fn memory_pressure_evicts_the_besteffort_hog_through_cri() {
    if !cgroup2_available() {
        return;
    }
    let _serial = serial();
    // The hog fills a memory-backed emptyDir with 450 MiB: it crosses a threshold 250 MiB below what is free now.
    let threshold = meminfo("MemAvailable") / MIB - 250;
    let n = cri_node("cri-evict", &format!("evictionHard:\n  memory.available: {threshold}Mi\n"));
    let guaranteed =
        "    resources:\n      requests: {memory: 64Mi, cpu: 100m}\n      limits: {memory: 64Mi, cpu: 100m}\n";
    n.write("quiet.yaml", &busybox_pod("quiet", "exec sleep 3600", guaranteed, ""));
    let quiet = n.wait_pod("quiet", 180, "ran", running);
    let quiet_id = container_id(&quiet);
    let fill = "dd if=/dev/zero of=/mem/fill bs=1M count=450; exec sleep 3600";
    let volume = "  volumes:\n  - {name: mem, emptyDir: {medium: Memory}}\n";
    let mount = "    volumeMounts:\n    - {name: mem, mountPath: /mem}\n";
    n.write("hog.yaml", &busybox_pod("hog", fill, mount, volume));
    let p = n.wait_pod("hog", 240, "was evicted", |p| phase(p) == "Failed" && p["status"]["reason"] == "Evicted");
    let message = p["status"]["message"].as_str().unwrap();
    assert!(message.starts_with("The node was low on resource: memory."), "{message}");
    let hog_uid = p["metadata"]["uid"].as_str().unwrap();
    // Stopped through CRI: no sandbox is left in containerd.
    wait_until(30, "the hog's sandbox was removed", || sandboxes(hog_uid).is_empty());
    let quiet = n.pod("quiet").unwrap();
    assert!(running(&quiet), "the Guaranteed pod was disturbed: {quiet:#}");
    assert_eq!(container_id(&quiet), quiet_id);
    remove_pod(&n, "quiet.yaml", "quiet");
}

#[test]
fn a_container_writing_past_its_ephemeral_storage_limit_to_its_root_is_evicted() {
    if !cgroup2_available() {
        return;
    }
    let _serial = serial();
    // What a container writes to its own root file system (its writable layer, measured by containerd) counts
    // toward its limits.ephemeral-storage, as its logs do. The side container's limit keeps the pod's total above
    // what is written: the container's own limit is the one crossed.
    let n = cri_node("cri-layer", "");
    let pod = pod_yaml(
        "layer",
        &format!(
            "  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    \
             command: [sh, -c, 'dd if=/dev/zero of=/fill bs=1M count=40; exec sleep 3600']\n    resources:\n      \
             limits: {{ephemeral-storage: 20Mi}}\n  - name: side\n    image: {BUSYBOX}\n    command: [sleep, '3600']\n    \
             resources:\n      limits: {{ephemeral-storage: 200Mi}}\n"
        ),
    );
    n.write("layer.yaml", &pod);
    let p = n.wait_pod("layer", 120, "was evicted", |p| phase(p) == "Failed" && p["status"]["reason"] == "Evicted");
    assert_eq!(p["status"]["message"], "Container app exceeded its local ephemeral storage limit \"20Mi\". ", "{p:#}");
    let uid = p["metadata"]["uid"].as_str().unwrap();
    wait_until(30, "the pod's sandbox was removed", || sandboxes(uid).is_empty());
    remove_pod(&n, "layer.yaml", "layer");
}

#[test]
fn a_restarted_daemon_adopts_its_sandboxes_and_containerd_restarts_are_survived() {
    if !cgroup2_available() {
        return;
    }
    let _serial = serial();
    let mut n = cri_node("cri-restart", "nodeStatusUpdateFrequency: 1s\n");
    n.write("keep.yaml", &busybox_pod("keep", "exec sleep 3600", "", ""));
    let p = n.wait_pod("keep", 180, "ran", running);
    let uid = p["metadata"]["uid"].as_str().unwrap().to_owned();
    let id = container_id(&p);
    let sbs = sandboxes(&uid);

    // The daemon restarts, now joined to a (test) cluster: the same sandbox and container, nothing new created,
    // no restart counted.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let api = rt.block_on(nodewarden_testapi::TestApi::start(0)).unwrap();
    api.add_token("vm-token", Some("vm"));
    let kubeconfig = api.write_kubeconfig(n.d.dir.path(), "vm-token").unwrap();
    n.d.args = vec!["--kubeconfig".into(), kubeconfig.display().to_string()];
    let ready = |api: &nodewarden_testapi::TestApi| -> Option<(String, String)> {
        let node = api.get("nodes", None, "vm")?;
        let c = node["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == "Ready")?.clone();
        Some((c["status"].as_str()?.to_owned(), c["message"].as_str().unwrap_or("").to_owned()))
    };
    assert_eq!(n.d.stop(), Some(0));
    n.d.start();
    n.d.wait_ready();
    let p = n.wait_pod("keep", 60, "ran again", running);
    assert_eq!(container_id(&p), id, "the container was not adopted:\n{}", n.d.log());
    assert_eq!(container(&p, "app")["restartCount"], 0);
    assert_eq!(sandboxes(&uid), sbs, "a new sandbox was created");
    assert!(n.d.log().contains("adopted running pod sandbox"), "{}", n.d.log());

    // containerd goes away: /readyz says so, the pod keeps running (its shim does), and both recover.
    let pid = containerd_pid().expect("containerd is not running");
    // As the kubelet, the runtime is down once no Status said it was ready for 30 s. The last ready Status came
    // about 5 s (every fifth relist, longer in a loaded guest) or less before the kill.
    let stopped = Instant::now();
    Command::new("kill").arg(pid.to_string()).status().unwrap();
    wait_until(30, "containerd stopped", || containerd_pid().is_none());
    wait_until(60, "/readyz failed", || get(n.d.port, "/readyz").is_some_and(|(s, _)| s != 200));
    assert!(stopped.elapsed() >= Duration::from_secs(20), "down before 30 s: {:?}", stopped.elapsed());
    let (_, body) = get(n.d.port, "/readyz?verbose").unwrap();
    assert!(body.contains("[-]runtime failed: container runtime is down: "), "{body}");
    // The Node says why it is not Ready, with the kubelet's words.
    wait_until(30, "the Node NotReady", || ready(&api).is_some_and(|(s, _)| s == "False"));
    let (_, message) = ready(&api).unwrap();
    assert_eq!(message, "container runtime is down", "the kubelet's words, without the cause /readyz adds");
    start_containerd();
    wait_until(60, "/readyz recovered", || get(n.d.port, "/readyz").is_some_and(|(s, _)| s == 200));
    wait_until(30, "the Node Ready again", || ready(&api).is_some_and(|(s, _)| s == "True"));
    let node = api.get("nodes", None, "vm").unwrap();
    let version = node["status"]["nodeInfo"]["containerRuntimeVersion"].as_str().unwrap();
    assert!(version.starts_with("containerd://"), "{version}");
    // The images containerd holds, the largest first, with their names.
    let images = node["status"]["images"].as_array().unwrap();
    let named = |name: &str| images.iter().any(|i| i["names"].as_array().is_some_and(|n| n.iter().any(|x| x == name)));
    assert!(named("localhost/busybox:1") && named("localhost/pause:1"), "{images:#?}");
    let sizes: Vec<i64> = images.iter().map(|i| i["sizeBytes"].as_i64().unwrap()).collect();
    assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{sizes:?}");
    let p = n.pod("keep").unwrap();
    assert!(running(&p) && container_id(&p) == id, "the pod did not survive: {p:#}");
    // ... and new pods start again.
    n.write("after.yaml", &busybox_pod("after", "exec sleep 3600", "", ""));
    n.wait_pod("after", 180, "ran after the containerd restart", running);
    remove_pod(&n, "after.yaml", "after");
    remove_pod(&n, "keep.yaml", "keep");
    assert!(sandboxes(&uid).is_empty());
}

/// The CNI config `deploy/containerd/start` writes.
const CNI_CONF: &str = "/etc/cni/net.d/10-nodewarden.conflist";

/// A pod on the pod network (not `hostNetwork`) running `command`, with its IP in `POD_IP` and a readiness
/// probe on `port` that names no host (so it goes to the pod's IP).
fn pod_network_pod(name: &str, command: &str, port: u16) -> String {
    pod_yaml(
        name,
        &format!(
            "  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    \
             command: [sh, -c, '{command}']\n    env:\n    - name: POD_IP\n      valueFrom:\n        \
             fieldRef: {{fieldPath: status.podIP}}\n    readinessProbe:\n      \
             httpGet: {{path: /, port: {port}}}\n      periodSeconds: 1\n"
        ),
    )
}

#[test]
fn the_pod_network_gives_pods_their_ips_and_its_absence_makes_the_node_not_ready() {
    if !cgroup2_available() {
        return;
    }
    let _serial = serial();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let api = rt.block_on(nodewarden_testapi::TestApi::start(0)).unwrap();
    api.add_token("vm-token", Some("vm"));
    let mut n = cri_node("cri-net", "nodeStatusUpdateFrequency: 1s\n");
    let kubeconfig = api.write_kubeconfig(n.d.dir.path(), "vm-token").unwrap();
    n.d.args = vec!["--kubeconfig".into(), kubeconfig.display().to_string()];
    assert_eq!(n.d.stop(), Some(0));
    n.d.start();
    n.d.wait_ready();
    let ready = || -> Option<(String, String)> {
        let node = api.get("nodes", None, "vm")?;
        let c = node["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == "Ready")?.clone();
        Some((c["status"].as_str()?.to_owned(), c["message"].as_str().unwrap_or("").to_owned()))
    };

    // A pod on the pod network gets an address from CNI, sees it through the downward API, and its probe
    // reaches it there (the bridge routes from the node into the pod's namespace).
    let web = "mkdir -p /www && echo ok > /www/index.html && echo ip=$POD_IP && exec httpd -f -p 8080 -h /www";
    n.write("web.yaml", &pod_network_pod("web", web, 8080));
    let p = n.wait_pod("web", 180, "became ready", |p| running(p) && container(p, "app")["ready"] == true);
    let ip = p["status"]["podIP"].as_str().unwrap().to_owned();
    assert!(ip.starts_with("10.88."), "an address from the CNI bridge's range: {p:#}");
    assert_eq!(p["status"]["podIPs"][0]["ip"], ip.as_str());
    let uid = p["metadata"]["uid"].as_str().unwrap();
    let log = std::fs::read_to_string(n.logs.join(format!("default_web-vm_{uid}/app/0.log"))).unwrap();
    assert!(log.contains(&format!("ip={ip}")), "the downward API gave another address: {log}");
    wait_until(30, "the Node Ready", || ready().is_some_and(|(s, _)| s == "True"));

    // The CNI config goes away: containerd says its network is not ready, and the node is not Ready, in the
    // kubelet's words; /readyz names the network.
    let aside = format!("{CNI_CONF}.aside");
    std::fs::rename(CNI_CONF, &aside).unwrap();
    let restore = scopeguard(|| {
        let _ = std::fs::rename(&aside, CNI_CONF);
    });
    wait_until(30, "/readyz failed", || get(n.d.port, "/readyz").is_some_and(|(s, _)| s != 200));
    let (_, body) = get(n.d.port, "/readyz?verbose").unwrap();
    assert!(body.contains("[-]network failed") && body.contains("NetworkReady=false"), "{body}");
    wait_until(30, "the Node NotReady", || ready().is_some_and(|(s, _)| s == "False"));
    let (_, message) = ready().unwrap();
    let prefix = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:";
    assert!(message.starts_with(prefix), "{message}");
    // A new pod on the pod network waits for it, saying why; a host-network pod starts; the running pod stays.
    n.write("later.yaml", &pod_network_pod("later", "exec httpd -f -p 8081", 8081));
    let p = n.wait_pod("later", 60, "waits for the network", |p| {
        p["status"]["message"].as_str().is_some_and(|m| m.contains("network is not ready: container runtime network"))
    });
    assert_eq!(phase(&p), "Pending");
    n.write("host.yaml", &busybox_pod("host", "exec sleep 3600", "", ""));
    n.wait_pod("host", 120, "ran on the host's network", running);
    assert!(running(&n.pod("web").unwrap()), "the running pod was disturbed");

    // The config is back: the node is Ready again and the waiting pod starts with an address.
    drop(restore);
    wait_until(60, "/readyz recovered", || get(n.d.port, "/readyz").is_some_and(|(s, _)| s == 200));
    wait_until(30, "the Node Ready again", || ready().is_some_and(|(s, _)| s == "True"));
    let p = n.wait_pod("later", 120, "ran once the network was ready", running);
    assert!(p["status"]["podIP"].as_str().is_some_and(|a| a.starts_with("10.88.") && a != ip), "{p:#}");

    // A pod bound to the node through the apiserver runs through containerd on the pod network: the apiserver's
    // copy says Running and Ready with its address from CNI; deleted there, it is stopped, its sandbox removed,
    // and deleted for good. It serves only once it has read its service account token (the admission plugin's
    // volume) and a ConfigMap key both as a file and from its environment.
    let config = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app", "namespace": "default"},
        "data": {"greeting": "hello"},
    });
    api.create("configmaps", Some("default"), config).unwrap();
    let check = "test -s /var/run/secrets/kubernetes.io/serviceaccount/token && \
                 test \"$(cat /etc/app/greeting)\" = \"$GREETING\" && exec httpd -f -p 8082";
    let bound = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bound", "namespace": "default"},
        "spec": {"nodeName": "vm", "terminationGracePeriodSeconds": 2,
                 "containers": [{"name": "app", "image": BUSYBOX, "command": ["sh", "-c", check],
                                 "env": [{"name": "GREETING",
                                          "valueFrom": {"configMapKeyRef": {"name": "app", "key": "greeting"}}}],
                                 "volumeMounts": [{"name": "cfg", "mountPath": "/etc/app"}],
                                 "readinessProbe": {"tcpSocket": {"port": 8082}, "periodSeconds": 1}}],
                 "volumes": [{"name": "cfg", "configMap": {"name": "app"}}]},
    });
    api.create("pods", Some("default"), bound).unwrap();
    let in_api = || api.get("pods", Some("default"), "bound");
    wait_until(120, "the bound pod Running and Ready in the apiserver", || {
        in_api().is_some_and(|p| {
            let ready = p["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
            running(&p) && ready
        })
    });
    let p = in_api().unwrap();
    let bound_ip = p["status"]["podIP"].as_str().unwrap().to_owned();
    assert!(bound_ip.starts_with("10.88."), "{p:#}");
    assert!(container(&p, "app")["containerID"].as_str().unwrap().starts_with("containerd://"), "{p:#}");
    let uid = p["metadata"]["uid"].as_str().unwrap().to_owned();
    api.delete("pods", Some("default"), "bound", Some(2)).unwrap();
    wait_until(60, "the bound pod deleted for good", || in_api().is_none());
    wait_until(30, "its sandbox removed", || sandboxes(&uid).is_empty());

    for (file, name) in [("web.yaml", "web"), ("later.yaml", "later"), ("host.yaml", "host")] {
        remove_pod(&n, file, name);
    }
}

/// Runs `f` when dropped, also when the test fails: what a test changed outside its own directories goes back.
fn scopeguard<F: FnOnce()>(f: F) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

/// The `nodewarden cri ps --all` rows of pod `name`: (short container ID, state).
fn containers_of(name: &str) -> Vec<(String, String)> {
    let (code, out) = cri(&["ps", "--all"]);
    assert_eq!(code, 0, "{out}");
    let rows = out.lines().skip(1).map(|l| l.split_whitespace().collect::<Vec<_>>());
    rows.filter(|r| r.last() == Some(&name)).map(|r| (r[0].to_owned(), r[r.len() - 5].to_owned())).collect()
}

#[test]
fn dead_containers_are_kept_as_the_kubelet_keeps_them_until_their_pod_is_deleted() {
    if !cgroup2_available() {
        return;
    }
    let _serial = serial();
    let n = cri_node("cri-dead", "");
    n.write("crash.yaml", &busybox_pod("crash", "echo run; exit 1", "", ""));
    let p = n.wait_pod("crash", 180, "restarted twice", |p| container(p, "app")["restartCount"].as_i64() >= Some(2));
    let name = p["metadata"]["name"].as_str().unwrap().to_owned();
    // As the kubelet's default policy: the newest dead container stays (for `crictl ps -a`, its layer, its exit in
    // lastState), the ones before it go: besides the live one, one dead (two for the moment between an exit and
    // its worker's reading of it), never the whole history.
    let mut seen = Vec::new();
    wait_until(60, "one dead container kept, the one lastState names", || {
        let rows = containers_of(&name);
        assert!(rows.len() <= 3, "{rows:?}");
        let p = n.pod("crash").unwrap();
        let last = container(&p, "app")["lastState"]["terminated"]["containerID"].as_str().unwrap_or("").to_owned();
        let exited: Vec<&(String, String)> = rows.iter().filter(|r| r.1 == "EXITED").collect();
        seen = rows.clone();
        exited.len() == 1 && last.strip_prefix("containerd://").is_some_and(|id| id.starts_with(&exited[0].0))
    });
    eprintln!("the pod's containers: {seen:?}");
    remove_pod(&n, "crash.yaml", "crash");
    assert_eq!(containers_of(&name), [], "the pod's end takes its dead containers");

    // A pod over on its own and still listed keeps its exited container and its sandbox, stopped (for
    // `crictl ps -a` and its logs), until it is deleted.
    n.write("done.yaml", &busybox_pod("done", "echo done", "", "  restartPolicy: Never\n"));
    let p = n.wait_pod("done", 180, "succeeded", |p| phase(p) == "Succeeded");
    let (name, uid) = (p["metadata"]["name"].as_str().unwrap(), p["metadata"]["uid"].as_str().unwrap());
    let sandbox_state = |id: &str| -> Value { serde_json::from_str::<Value>(&cri(&["inspect", id]).1).unwrap() };
    wait_until(30, "the sandbox stopped", || {
        let ids = sandboxes(uid);
        ids.len() == 1 && sandbox_state(&ids[0])["status"]["state"] == "NOTREADY"
    });
    std::thread::sleep(Duration::from_secs(2));
    let rows = containers_of(name);
    assert!(rows.len() == 1 && rows[0].1 == "EXITED", "{rows:?}\n{}", n.d.log());
    assert_eq!(sandboxes(uid).len(), 1, "kept");
    remove_pod(&n, "done.yaml", "done");
    assert_eq!(containers_of(name), [], "its deletion takes its exited container");
    assert_eq!(sandboxes(uid), Vec::<String>::new(), "and its sandbox");
}

#[test]
fn a_sandbox_that_died_is_replaced() {
    if !cgroup2_available() {
        return;
    }
    let _serial = serial();
    let n = cri_node("cri-lost", "");
    n.write("lost.yaml", &busybox_pod("lost", "exec sleep 3600", "", ""));
    let p = n.wait_pod("lost", 180, "ran", running);
    let uid = p["metadata"]["uid"].as_str().unwrap().to_owned();
    let old = sandboxes(&uid);
    assert_eq!(old.len(), 1);
    // The sandbox's pause process dies behind nodewarden's back; the app container would run on.
    let (_, json) = cri(&["inspect", &old[0]]);
    let full: Value = serde_json::from_str(&json).unwrap();
    let sandbox_id = full["status"]["id"].as_str().unwrap().to_owned();
    let killed = Command::new("ctr")
        .args(["--address", SOCKET, "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", &sandbox_id])
        .status()
        .unwrap();
    assert!(killed.success());
    // As the kubelet does, the pod's container is stopped, and the restart makes a new sandbox and removes the
    // old one.
    let p = n.wait_pod("lost", 180, "ran in a new sandbox", |p| {
        let c = container(p, "app");
        running(p) && c["restartCount"].as_i64() >= Some(1) && !c["state"]["running"].is_null()
    });
    let now = sandboxes(&uid);
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now, old, "the dead sandbox is still used:\n{}", n.d.log());
    assert!(running(&p));
    remove_pod(&n, "lost.yaml", "lost");
}

#[test]
fn unused_images_are_collected_and_a_reload_of_the_thresholds_applies_at_once() {
    if !cgroup2_available() {
        return;
    }
    let _serial = serial();
    // An image no pod uses, of its own (another entrypoint makes another image).
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("spare.tar");
    let make = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/containerd/make-image");
    assert!(Command::new(make).arg("localhost/spare:1").arg(&tar).arg("/bin/true").status().unwrap().success());
    let mut import = Command::new("ctr");
    import.args(["--address", SOCKET, "-n", "k8s.io", "images", "import"]).arg(&tar);
    assert!(import.status().unwrap().success());
    let off = "imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n";
    let n = cri_node("cri-imagegc", &format!("{off}imageMinimumGCAge: 0s\n"));
    // containerd keeps its images on its own file system, which ImageFsInfo names: that one is measured, whatever
    // nodewarden.imagefsPath (left at its default here) says.
    let said = "the image file system is the one the runtime names (ImageFsInfo)";
    assert!(n.d.log().contains(said) && n.d.log().contains("/var/lib/nodewarden-containerd/"), "{}", n.d.log());
    n.write("web.yaml", &busybox_pod("web", "sleep 1000", "", ""));
    n.wait_pod("web", 120, "running", running);
    let images = || cri(&["images"]).1;
    std::thread::sleep(Duration::from_secs(2));
    assert!(images().contains("localhost/spare"), "the collector is off: {}", images());

    // On at a reload, and at once: the unused image goes; the one in use and the sandbox image stay.
    let config = std::fs::read_to_string(n.d.config_path()).unwrap();
    let edited = config.replace(off, "imageGCHighThresholdPercent: 1\nimageGCLowThresholdPercent: 0\n");
    assert_ne!(edited, config);
    std::fs::write(n.d.config_path(), edited).unwrap();
    wait_until(30, "the unused image was collected", || !images().contains("localhost/spare"));
    let left = images();
    assert!(left.contains("localhost/busybox") && left.contains("localhost/pause"), "{left}");
    let text = get(n.d.port, "/metrics").unwrap().1;
    let collected = metric(&text, "kubelet_image_garbage_collected_total{reason=\"space\"}");
    assert!(collected.is_some_and(|v| v >= 1.0), "{collected:?}");
    // Down to 0 % cannot be done: the kubelet's warning says what could be freed.
    wait_until(10, "the shortfall was reported", || n.d.log().contains("FreeDiskSpaceFailed"));
    assert!(n.d.log().contains("Failed to garbage collect required amount of images"), "{}", n.d.log());
    remove_pod(&n, "web.yaml", "web");
}

/// Bytes available on the file system of `path`, as `df` reads them.
fn available(path: &str) -> u64 {
    let out = Command::new("df").args(["-B1", "--output=avail", path]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().nth(1).unwrap().trim().parse().unwrap()
}

#[test]
fn imagefs_pressure_is_relieved_by_removing_unused_images_before_any_pod_is_evicted() {
    if !cgroup2_available() {
        return;
    }
    let _serial = serial();
    const IMAGEFS: &str = "/var/lib/nodewarden-containerd";
    // An unused image of 48 MiB (its blob and its unpacked snapshot, on containerd's own file system).
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("bulky.tar");
    let make = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/containerd/make-image");
    let made = Command::new(make).env("PAD_MIB", "48").arg("localhost/bulky:1").arg(&tar).status().unwrap();
    assert!(made.success());
    let mut import = Command::new("ctr");
    import.args(["--address", SOCKET, "-n", "k8s.io", "images", "import"]).arg(&tar);
    assert!(import.status().unwrap().success());
    let images = || cri(&["images"]).1;
    assert!(images().contains("localhost/bulky"), "{}", images());
    let off = "imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\nimageMinimumGCAge: 0s\n";
    let hard = |mib: u64| format!("{off}evictionHard:\n  imagefs.available: {mib}Mi\n");
    let n = node_with(
        "cri-reclaim",
        &format!("  imagefsPath: {IMAGEFS}\n"),
        &format!("containerRuntimeEndpoint: {ENDPOINT}\n{}", hard(1)),
    );
    // A quiet pod, and one that fills its own root file system (its writable layer, on the image file system).
    n.write("quiet.yaml", &busybox_pod("quiet", "exec sleep 3600", "", ""));
    n.write("filler.yaml", &busybox_pod("filler", "dd if=/dev/zero of=/fill bs=1M count=40; exec sleep 3600", "", ""));
    // And a pod over, still listed, whose exited container wrote 16 MiB to its writable layer.
    let over = "dd if=/dev/zero of=/fill bs=1M count=16";
    n.write("over.yaml", &busybox_pod("over", over, "", "  restartPolicy: Never\n"));
    n.wait_pod("quiet", 180, "ran", running);
    n.wait_pod("filler", 180, "ran", running);
    let p = n.wait_pod("over", 180, "succeeded", |p| phase(p) == "Succeeded");
    let over_name = p["metadata"]["name"].as_str().unwrap().to_owned();
    assert_eq!(containers_of(&over_name).len(), 1, "kept while no disk is short");
    // containerd measures writable layers every 10 s, and the daemon reads them every 10 s.
    std::thread::sleep(Duration::from_secs(25));
    let reload = |from: u64, to: u64| {
        let config = std::fs::read_to_string(n.d.config_path()).unwrap();
        let edited = config.replace(&hard(from), &hard(to));
        assert_ne!(edited, config);
        std::fs::write(n.d.config_path(), edited).unwrap();
    };
    let mib = |b: u64| b >> 20;
    let evictions = || -> Value { serde_json::from_str(&get(n.d.port, "/evictions").unwrap().1).unwrap() };

    // Crossed at once by 30 MiB, which removing the dead container of the pod over and the unused image covers:
    // no pod is evicted, and the pod over stays listed, over.
    let threshold = mib(available(IMAGEFS)) + 30;
    reload(1, threshold);
    let t0 = Instant::now();
    wait_until(60, "the unused image was removed", || !images().contains("localhost/bulky"));
    assert_eq!(containers_of(&over_name), [], "the exited container was reclaimed\n{}", n.d.log());
    assert_eq!(phase(&n.pod("over").unwrap()), "Succeeded");
    wait_until(30, "the disk is above its threshold", || mib(available(IMAGEFS)) > threshold);
    eprintln!("reload → the disk above its threshold again: {:.2} s, with no eviction", t0.elapsed().as_secs_f64());
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(evictions()["evictions"].as_array().map(Vec::len), Some(0), "{:#}\n{}", evictions(), n.d.log());
    assert!(running(&n.pod("quiet").unwrap()) && running(&n.pod("filler").unwrap()), "{}", n.d.log());
    let left = images();
    assert!(left.contains("localhost/busybox") && left.contains("localhost/pause"), "images in use stay: {left}");

    // What no reclaim covers (no image is unused now): the pod that filled its writable layer is evicted, not the
    // quiet one.
    let next = mib(available(IMAGEFS)) + 20;
    reload(threshold, next);
    let p = n.wait_pod("filler", 90, "was evicted", |p| phase(p) == "Failed" && p["status"]["reason"] == "Evicted");
    let message = p["status"]["message"].as_str().unwrap();
    assert!(message.starts_with("The node was low on resource: ephemeral-storage."), "{message}");
    let e = evictions();
    assert_eq!(e["evictions"][0]["signal"], "imagefs.available", "{e:#}");
    let first = &e["evictions"][0]["candidates"][0];
    assert_eq!(first["pod"], "default/filler-vm", "{e:#}");
    assert!(first["usage"].as_u64().unwrap() >= 30 << 20, "ranked by its writable layer: {e:#}");
    assert!(running(&n.pod("quiet").unwrap()), "{}", n.d.log());
    remove_pod(&n, "quiet.yaml", "quiet");
    remove_pod(&n, "filler.yaml", "filler");
    remove_pod(&n, "over.yaml", "over");
}

#[test]
fn bad_images_and_sockets_get_clear_errors() {
    if !cgroup2_available() {
        return;
    }
    let _serial = serial();
    let n = cri_node("cri-bad", "");
    let pod = busybox_pod("nopull", "true", "", "").replace(BUSYBOX, "localhost/absent:1");
    n.write("nopull.yaml", &pod);
    let p = n.wait_pod("nopull", 180, "backed off", |p| {
        p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ImagePullBackOff"
    });
    let message = container(&p, "app")["state"]["waiting"]["message"].as_str().unwrap();
    assert!(message.contains("localhost/absent:1"), "{message}");
    assert_eq!(phase(&p), "Pending");
    // The kubelet's warning events of a pull, in the daemon's log.
    let log = n.d.log();
    assert!(log.contains(r#"Failed to pull image "localhost/absent:1": "#), "{log}");
    assert!(log.contains("Error: ErrImagePull") && log.contains("Error: ImagePullBackOff"), "{log}");
    let pod_cg = n.pod_cgroup(&p);
    remove_pod(&n, "nopull.yaml", "nopull");
    wait_until(10, "the pod cgroup was removed", || !pod_cg.exists());

    // A daemon pointed at no socket keeps serving, and says why it is not ready.
    let mut d = Daemon::new("cri-nosocket", "containerRuntimeEndpoint: unix:///run/nowhere.sock\n");
    d.start();
    wait_until(30, "/healthz answered", || get(d.port, "/healthz").is_some_and(|(s, _)| s == 200));
    let (status, body) = get(d.port, "/readyz?verbose").unwrap();
    assert_ne!(status, 200);
    assert!(body.contains("/run/nowhere.sock"), "{body}");
    assert!(d.log().contains("does not answer"), "{}", d.log());

    let out = Command::new(BIN).args(["cri", "--endpoint", "unix:///run/nowhere.sock", "ps"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach the CRI runtime at unix:///run/nowhere.sock"), "{err}");
}
