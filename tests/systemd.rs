//! The daemon as a systemd service, under systemd as PID 1 (`NODEWARDEN_VM_INIT=systemd deploy/vm/run`; skipped
//! elsewhere): the unit of `deploy/` starts as `Type=notify` (systemctl returns once the daemon said `READY=1`),
//! its `STATUS=` line says what it does, a restart adopts the pods, and the watchdog restarts a daemon that stops
//! making progress. The systemd cgroup driver: the slices systemd makes for the tree, the pods and the process
//! runtime's containers, with the limits as unit properties that a reload keeps; adoption after `kill -9`; and
//! containerd's scopes in a pod's slice.
#![expect(clippy::unwrap_used, reason = "test code: a failed unwrap is a failed test")]
#![expect(clippy::disallowed_types, reason = "waits for real processes, in real time")]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::*;

const UNIT: &str = "nodewarden-test.service";

/// True in the VM's systemd boot (`NODEWARDEN_VM_SYSTEMD` set, and systemd PID 1): the test installs, restarts
/// and stops units, which it must never do to the host's own systemd.
fn systemd_available() -> bool {
    if std::env::var_os("NODEWARDEN_VM_SYSTEMD").is_none() {
        eprintln!("skipped: not the VM's systemd boot (NODEWARDEN_VM_SYSTEMD)");
        return false;
    }
    let comm = std::fs::read_to_string("/proc/1/comm").unwrap_or_default();
    assert_eq!(comm.trim(), "systemd", "NODEWARDEN_VM_SYSTEMD is set but PID 1 is not systemd");
    cgroup2_available()
}

/// The tests share PID 1: one at a time, so that one's `daemon-reload` or unit restart never lands in the middle
/// of another's daemon start (under TCG a reload keeps systemd from answering for seconds).
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static PID1: std::sync::Mutex<()> = std::sync::Mutex::new(());
    PID1.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `systemctl` with a deadline: a job systemd never finishes fails the test with what it said, instead of hanging
/// it.
fn systemctl(args: &[&str]) -> (bool, String) {
    let out = Command::new("timeout").arg("120").arg("systemctl").args(args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// `systemctl show` of the unit's properties.
fn show(props: &[&str]) -> BTreeMap<String, String> {
    let mut args = vec!["show", UNIT];
    for p in props {
        args.extend(["-p", p]);
    }
    let (_, out) = systemctl(&args);
    out.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
}

/// The unit of `deploy/`, pointed at the built binary and the test's config, with a short watchdog and abort
/// timeout for the test (a drop-in, as an operator would override it).
fn install_unit(config: &Path) {
    let shipped = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/nodewarden.service"))
        .unwrap()
        .replace("/usr/local/bin/nodewarden", BIN)
        .replace("/etc/nodewarden/config.yaml", &config.display().to_string());
    std::fs::write(format!("/run/systemd/system/{UNIT}"), shipped).unwrap();
    let dropin = format!("/run/systemd/system/{UNIT}.d");
    std::fs::create_dir_all(&dropin).unwrap();
    std::fs::write(format!("{dropin}/test.conf"), "[Service]\nWatchdogSec=3s\nTimeoutAbortSec=2s\nRestartSec=1\n")
        .unwrap();
    let (ok, out) = systemctl(&["daemon-reload"]);
    assert!(ok, "{out}");
}

#[test]
fn the_unit_notifies_ready_restarts_adopt_and_the_watchdog_restarts_a_stalled_daemon() {
    if !systemd_available() {
        return;
    }
    let _pid1 = one_at_a_time();
    // The kubeadm node's driver: the pod's slice is systemd's, and the restarts below adopt it.
    let d = Daemon::new("systemd", "cgroupDriver: systemd\n");
    let manifests = quiet_manifests(d.dir.path());
    let config = std::fs::read_to_string(d.config_path()).unwrap();
    std::fs::write(d.config_path(), format!("{config}staticPodPath: {}\n", manifests.display())).unwrap();
    install_unit(&d.config_path());

    // Type=notify: `systemctl start` returns once the daemon said READY=1, after its first pod sync and eviction
    // pass, so /readyz answers at once.
    let (ok, out) = systemctl(&["start", UNIT]);
    assert!(ok, "{out}\n{}", systemctl(&["status", UNIT]).1);
    assert_eq!(get(d.port, "/readyz").map(|(s, _)| s), Some(200), "READY=1 came before the daemon was ready");
    let s = show(&["ActiveState", "SubState", "Type", "WatchdogUSec", "NRestarts", "MainPID"]);
    assert_eq!(
        (s["ActiveState"].as_str(), s["SubState"].as_str(), s["Type"].as_str()),
        ("active", "running", "notify")
    );
    assert_eq!(s["WatchdogUSec"], "3s");
    wait_until(30, "the quiet pod running", || first_container(d.port).is_some());
    wait_until(10, "the status line", || show(&["StatusText"])["StatusText"].starts_with("Running: 1 pods running"));
    let pod = first_container(d.port);

    // `systemctl restart`: the pod keeps running and the new daemon adopts it.
    let first = s["MainPID"].clone();
    let (ok, out) = systemctl(&["restart", UNIT]);
    assert!(ok, "{out}");
    assert_ne!(show(&["MainPID"])["MainPID"], first);
    wait_until(30, "the pod adopted after systemctl restart", || first_container(d.port) == pod);

    // A stalled daemon (SIGSTOP) feeds no watchdog: systemd kills it after WatchdogSec and starts it again, and
    // the new one adopts the pod.
    let stalled = show(&["MainPID"])["MainPID"].clone();
    Command::new("kill").args(["-STOP", &stalled]).status().unwrap();
    wait_until(60, "systemd restarted the stalled daemon", || {
        let s = show(&["NRestarts", "MainPID", "ActiveState"]);
        s["NRestarts"] != "0" && s["MainPID"] != stalled && s["MainPID"] != "0" && s["ActiveState"] == "active"
    });
    let (_, journal) = {
        let out = Command::new("journalctl").args(["-u", UNIT, "--no-pager", "-o", "cat"]).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    assert!(journal.contains("Watchdog timeout"), "{journal}");
    wait_until(60, "ready again after the watchdog restart", || get(d.port, "/readyz").is_some_and(|(s, _)| s == 200));
    wait_until(30, "the pod adopted after the watchdog restart", || first_container(d.port) == pod);

    let (ok, out) = systemctl(&["stop", UNIT]);
    assert!(ok, "{out}");
    let _ = std::fs::remove_dir_all(format!("/run/systemd/system/{UNIT}.d"));
    let _ = std::fs::remove_file(format!("/run/systemd/system/{UNIT}"));
    // The pod outlived the daemon (KillMode=process); stopping its slices ends it.
    assert!(first_container(d.port).is_none(), "the daemon is stopped");
    let (ok, out) = systemctl(&["stop", "nwtest_d_systemd.slice"]);
    assert!(ok, "{out}");
}

/// A unit's properties, by `systemctl show`.
fn show_unit(unit: &str, props: &[&str]) -> BTreeMap<String, String> {
    let mut args = vec!["show", unit];
    for p in props {
        args.extend(["-p", p]);
    }
    let (_, out) = systemctl(&args);
    out.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
}

/// A cgroup file below the mount, trimmed.
fn cgroup_file(cgroup: &str, file: &str) -> String {
    std::fs::read_to_string(Path::new(MOUNT).join(cgroup.trim_start_matches('/')).join(file))
        .unwrap_or_else(|e| panic!("{cgroup}/{file}: {e}"))
        .trim()
        .to_owned()
}

/// systemd's words for a cgroup limit file's value.
fn as_property(file_value: &str) -> String {
    if file_value == "max" { "infinity".into() } else { file_value.to_owned() }
}

#[test]
fn the_systemd_driver_has_systemd_make_the_slices_and_the_limits_hold() {
    if !systemd_available() {
        return;
    }
    let _pid1 = one_at_a_time();
    let sleep = "  containers:\n  - name: app\n    image: busybox\n    command: [sleep, '100000']\n";
    let pods = [
        ("g", "", format!("{sleep}    resources:\n      limits: {{cpu: 250m, memory: 64Mi}}\n")),
        (
            "b",
            "burstable-",
            format!(
                "{sleep}    resources:\n      requests: {{cpu: 100m, memory: 32Mi}}\n      limits: {{memory: 128Mi}}\n"
            ),
        ),
        ("e", "besteffort-", sleep.to_owned()),
    ];
    let mut n = node_with("sdslices", "", "cgroupDriver: systemd\npodPidsLimit: 300\n");
    // cgroupRoot /nwtest-d-sdslices names the slice nwtest_d_sdslices.slice, as the kubelet reads it (one part, its
    // dashes written as underscores).
    let prefix = "nwtest_d_sdslices";
    let kubepods = format!("{prefix}-kubepods.slice");
    let k = show_unit(&kubepods, &["ActiveState", "ControlGroup", "MemoryMax", "TasksMax", "CPUWeight"]);
    assert_eq!(k["ActiveState"], "active", "{k:?}\n{}", n.d.log());
    assert_eq!(k["ControlGroup"], format!("/{prefix}.slice/{kubepods}"));
    for (prop, file) in [("MemoryMax", "memory.max"), ("TasksMax", "pids.max"), ("CPUWeight", "cpu.weight")] {
        assert_eq!(k[prop], as_property(&cgroup_file(&k["ControlGroup"], file)), "{prop} of {kubepods}");
    }
    for (name, _, body) in &pods {
        n.write(&format!("{name}.yaml"), &pod_yaml(name, body));
    }
    let mut placed = Vec::new();
    for (name, class, _) in &pods {
        let p = n.wait_pod(name, 60, "running", |p| phase(p) == "Running");
        let uid = p["metadata"]["uid"].as_str().unwrap().to_owned();
        let unit = format!("{prefix}-kubepods-{class}pod{}.slice", uid.replace('-', "_"));
        let props = [
            "ActiveState",
            "ControlGroup",
            "MemoryMax",
            "TasksMax",
            "CPUWeight",
            "CPUQuotaPerSecUSec",
            "MemorySwapMax",
        ];
        let s = show_unit(&unit, &props);
        assert_eq!(s["ActiveState"], "active", "{unit}: {s:?}\n{}", n.d.log());
        let cg = s["ControlGroup"].clone();
        assert!(cg.starts_with(&k["ControlGroup"]), "{cg}");
        // The unit's properties and the files say the same (systemd would write its own on a reload).
        for (prop, file) in [("MemoryMax", "memory.max"), ("TasksMax", "pids.max"), ("CPUWeight", "cpu.weight")] {
            assert_eq!(s[prop], as_property(&cgroup_file(&cg, file)), "{prop} of {unit}");
        }
        assert_eq!(s["TasksMax"], "300", "podPidsLimit");
        // NoSwap as a property of the slice, so a daemon-reload does not give the pod swap.
        assert_eq!((s["MemorySwapMax"].as_str(), cgroup_file(&cg, "memory.swap.max").as_str()), ("0", "0"), "{unit}");
        let (memory, quota) = match *name {
            "g" => ("67108864", "250ms"),
            "b" => ("134217728", "infinity"),
            _ => ("max", "infinity"),
        };
        assert_eq!(cgroup_file(&cg, "memory.max"), memory, "{unit}");
        assert_eq!(s["CPUQuotaPerSecUSec"], quota, "{unit}");
        // The process runtime's container has a slice of its own in the pod's, with its limits, and runs there.
        let app = format!("{}-app.slice", unit.trim_end_matches(".slice"));
        let a = show_unit(&app, &["ActiveState", "ControlGroup", "MemoryMax"]);
        assert_eq!(a["ControlGroup"], format!("{cg}/{app}"), "{a:?}");
        assert_eq!(a["MemoryMax"], as_property(&cgroup_file(&a["ControlGroup"], "memory.max")), "{app}");
        assert!(!cgroup_file(&a["ControlGroup"], "cgroup.procs").is_empty(), "{unit}: no process in its container");
        placed.push((name.to_owned(), unit, a["ControlGroup"].clone(), first_container_of(&p)));
    }

    // A reload has systemd apply its properties again: the limits hold and the containers keep their
    // controllers.
    let (ok, out) = systemctl(&["daemon-reload"]);
    assert!(ok, "{out}");
    std::thread::sleep(std::time::Duration::from_secs(1));
    for (_, unit, app, _) in &placed {
        let s = show_unit(unit, &["MemoryMax", "ControlGroup"]);
        assert_eq!(s["MemoryMax"], as_property(&cgroup_file(&s["ControlGroup"], "memory.max")), "{unit} after reload");
        assert!(
            Path::new(MOUNT).join(app.trim_start_matches('/')).join("memory.max").exists(),
            "{app}: the container lost its memory controller after daemon-reload"
        );
    }

    // kill -9 and a new daemon: the slices are adopted and the containers left alone.
    n.d.kill();
    n.d.start();
    n.d.wait_ready();
    for (name, unit, _, container) in &placed {
        let p = n.wait_pod(name, 60, "running again", |p| phase(p) == "Running");
        assert_eq!(&first_container_of(&p), container, "{unit} was not adopted");
    }
    assert_eq!(n.d.log().matches("adopted existing pod cgroup").count(), 3, "{}", n.d.log());

    // A pod that is removed has its slice stopped: the unit and its cgroup are gone.
    let (_, unit, app, _) = &placed[0];
    let cg = app.rsplit_once('/').unwrap().0;
    std::fs::remove_file(n.manifests.join("g.yaml")).unwrap();
    wait_until(60, "the removed pod's slice stopped", || {
        show_unit(unit, &["ActiveState"]).get("ActiveState").is_none_or(|s| s == "inactive")
            && !Path::new(MOUNT).join(cg.trim_start_matches('/')).exists()
    });
    assert_eq!(n.d.stop(), Some(0), "{}", n.d.log());
    let (ok, out) = systemctl(&["stop", "nwtest_d_sdslices.slice"]);
    assert!(ok, "{out}");
}

/// The pod's first container's ID and start time.
fn first_container_of(p: &serde_json::Value) -> String {
    let c = &p["status"]["containerStatuses"][0];
    format!("{} {}", c["containerID"], c["state"]["running"]["startedAt"])
}

#[test]
fn under_the_systemd_driver_containerd_runs_the_containers_in_scopes_of_the_pods_slice() {
    if !systemd_available() {
        return;
    }
    let _pid1 = one_at_a_time();
    let socket = "/run/containerd/containerd.sock";
    let out = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/containerd/start"))
        .env("CONTAINERD_SYSTEMD_CGROUP", "true")
        .arg(socket)
        .output()
        .unwrap();
    assert!(out.status.success(), "containerd did not start: {}", String::from_utf8_lossy(&out.stderr));
    let mut n = node_with("sdcri", "", &format!("cgroupDriver: systemd\ncontainerRuntimeEndpoint: unix://{socket}\n"));
    let body = |resources: &str| {
        format!(
            "  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: \
             localhost/busybox:1\n    command: [sh, -c, 'exec sleep 3600']\n{resources}"
        )
    };
    // A pod of each QoS class: its slice where the kubelet puts it, the container's limit on its scope.
    let pods = [
        ("g", "", "    resources:\n      limits: {memory: 64Mi, cpu: 250m}\n", "67108864"),
        (
            "b",
            "burstable-",
            "    resources:\n      requests: {memory: 32Mi, cpu: 100m}\n      limits: {memory: 64Mi}\n",
            "67108864",
        ),
        ("e", "besteffort-", "", "infinity"),
    ];
    for (name, _, resources, _) in &pods {
        n.write(&format!("{name}.yaml"), &pod_yaml(name, &body(resources)));
    }
    let mut placed = Vec::new();
    for (name, class, _, memory) in &pods {
        let p = n.wait_pod(name, 180, "running", |p| phase(p) == "Running");
        let uid = p["metadata"]["uid"].as_str().unwrap().to_owned();
        let id = p["status"]["containerStatuses"][0]["containerID"].as_str().unwrap().to_owned();
        let slice = format!("nwtest_d_sdcri-kubepods-{class}pod{}.slice", uid.replace('-', "_"));
        let s = show_unit(&slice, &["ActiveState", "ControlGroup"]);
        assert_eq!(s["ActiveState"], "active", "{slice}: {s:?}");
        // runc's systemd driver made the container a scope of the pod's slice (the sandbox's cgroup_parent), with
        // the container's limit.
        let scope = format!("cri-containerd-{}.scope", id.trim_start_matches("containerd://"));
        let c = show_unit(&scope, &["ActiveState", "ControlGroup", "Slice", "MemoryMax"]);
        assert_eq!((c["ActiveState"].as_str(), c["Slice"].as_str()), ("active", slice.as_str()), "{c:?}");
        assert_eq!(c["MemoryMax"], *memory, "{scope} of pod {name}");
        assert!(c["ControlGroup"].starts_with(&s["ControlGroup"]), "{c:?}");
        assert!(!cgroup_file(&c["ControlGroup"], "cgroup.procs").is_empty(), "the container runs in its scope");
        placed.push((name.to_owned(), slice, s["ControlGroup"].clone(), id));
    }

    // kill -9 and a new daemon: the sandboxes and their containers are adopted, nothing is made again.
    n.d.kill();
    n.d.start();
    n.d.wait_ready();
    for (name, slice, _, id) in &placed {
        let p = n.wait_pod(name, 60, "running again", |p| phase(p) == "Running");
        assert_eq!(p["status"]["containerStatuses"][0]["containerID"].as_str(), Some(id.as_str()), "{slice}");
        assert_eq!(p["status"]["containerStatuses"][0]["restartCount"], 0);
    }
    assert!(n.d.log().contains("adopted running pod sandbox"), "{}", n.d.log());

    // Removed: the sandboxes go, and the slices are stopped with nothing left of them.
    for (name, slice, cg, _) in &placed {
        std::fs::remove_file(n.manifests.join(format!("{name}.yaml"))).unwrap();
        let cg = Path::new(MOUNT).join(cg.trim_start_matches('/'));
        wait_until(90, "the pod's slice stopped", || {
            n.pod(name).is_none()
                && show_unit(slice, &["ActiveState"]).get("ActiveState").is_none_or(|a| a == "inactive")
                && !cg.exists()
        });
    }
    assert_eq!(n.d.stop(), Some(0), "{}", n.d.log());
    let (ok, out) = systemctl(&["stop", "nwtest_d_sdcri.slice"]);
    assert!(ok, "{out}");
}
