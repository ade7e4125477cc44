//! Static pods end to end with the real kernel (inside the VM of `deploy/vm`; skipped where cgroup v2 is missing):
//! manifests start, edits replace pods, deletions terminate them, the crash-loop back-off, liveness restarts,
//! OOMKilled, `podPidsLimit` at a container's fork, adoption after `kill -9` of the daemon, volumes and users, bad
//! manifests, and 100 pods.
#![expect(clippy::unwrap_used, reason = "test code: a failed unwrap is a failed test")]
#![expect(clippy::disallowed_types, reason = "waits for real processes, in real time")]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn procs(cg: &Path) -> Vec<u32> {
    std::fs::read_to_string(cg.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect()
}

const SLEEPER: &str =
    "  containers:\n  - name: app\n    image: busybox\n    command: [sh, -c, 'echo started; exec sleep 1000']\n";

#[test]
fn the_example_manifests_run_and_become_ready() {
    if !cgroup2_available() {
        return;
    }
    let n = node("examples");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/manifests");
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        n.write(e.file_name().to_str().unwrap(), &std::fs::read_to_string(e.path()).unwrap());
    }
    let ready = |p: &Value| container(p, "httpd")["ready"] == true;
    let web = n.wait_pod("web", 30, "became ready (its HTTP readiness probe passes)", ready);
    assert_eq!(web["status"]["qosClass"], "Guaranteed");
    let worker = n.wait_pod("worker", 30, "ran its init container, then its worker", |p| phase(p) == "Running");
    assert_eq!(worker["status"]["qosClass"], "Burstable");
    let batch = n.wait_pod("batch", 30, "ran", |p| matches!(phase(p), "Running" | "Succeeded"));
    assert_eq!(batch["status"]["qosClass"], "BestEffort");
}

#[test]
fn manifests_start_edits_replace_and_deletions_terminate() {
    if !cgroup2_available() {
        return;
    }
    let n = node("lifecycle");
    let limits = "    resources:\n      limits: {cpu: 100m, memory: 32Mi}\n";
    let t0 = Instant::now();
    n.write("web.yaml", &pod_yaml("web", &format!("{SLEEPER}{limits}")));
    let p = n.wait_pod("web", 10, "ran", |p| phase(p) == "Running");
    eprintln!("manifest write to Running: {:?}", t0.elapsed());
    assert_eq!(p["status"]["qosClass"], "Guaranteed");
    let cg = n.pod_cgroup(&p);
    assert_eq!(std::fs::read_to_string(cg.join("app/memory.max")).unwrap().trim(), (32 * MIB).to_string());
    let pids = procs(&cg.join("app"));
    assert_eq!(pids.len(), 1, "the container's process runs in its own cgroup");
    // The trampoline that makes the call exists on x86-64 only; elsewhere every process moves itself.
    assert!(
        cfg!(not(target_arch = "x86_64")) || !n.d.log().contains("refuses clone3"),
        "this kernel (5.7 or later) creates the process in its cgroup, without a move:\n{}",
        n.d.log()
    );
    let adj = std::fs::read_to_string(format!("/proc/{}/oom_score_adj", pids[0])).unwrap();
    assert_eq!(adj.trim(), "-997", "Guaranteed containers get the kubelet's oom_score_adj");
    let uid = p["metadata"]["uid"].as_str().unwrap().to_owned();
    let log = n.logs.join(format!("default_web-vm_{uid}/app/0.log"));
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::read_to_string(&log).unwrap_or_default() != "started\n" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "started\n");

    // An edit is a new pod that replaces the old one.
    n.write("web.yaml", &pod_yaml("web", &format!("{SLEEPER}{}", limits.replace("32Mi", "48Mi"))));
    let p2 = n.wait_pod("web", 10, "was replaced", |p| p["metadata"]["uid"] != uid.as_str() && phase(p) == "Running");
    let cg2 = n.pod_cgroup(&p2);
    assert_eq!(std::fs::read_to_string(cg2.join("app/memory.max")).unwrap().trim(), (48 * MIB).to_string());
    assert!(!cg.exists(), "the old pod's cgroup is gone");
    assert_eq!(n.pods().len(), 1);

    // Deletion terminates within the grace period, even a container that ignores SIGTERM.
    let stubborn = "  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: busybox\n    \
                    command: [sh, -c, 'trap \"\" TERM; while true; do sleep 0.1; done']\n";
    n.write("stubborn.yaml", &pod_yaml("stubborn", stubborn));
    let s = n.wait_pod("stubborn", 10, "ran", |p| phase(p) == "Running");
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    std::fs::remove_file(n.manifests.join("stubborn.yaml")).unwrap();
    while n.pod("stubborn").is_some() {
        assert!(t.elapsed() < Duration::from_secs(10), "not terminated within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = t.elapsed();
    assert!(took >= Duration::from_secs(2), "the grace period was not honoured: {took:?}");
    assert!(!n.pod_cgroup(&s).exists());
    eprintln!("deletion with a 2 s grace period took {took:?}");
}

#[test]
fn crash_loop_back_off_and_oom_killed() {
    if !cgroup2_available() {
        return;
    }
    let n = node("crash");
    n.write(
        "crash.yaml",
        &pod_yaml("crash", "  containers:\n  - name: app\n    image: busybox\n    command: [sh, -c, 'exit 3']\n"),
    );
    let oom = "  restartPolicy: Never\n  containers:\n  - name: hog\n    image: busybox\n    \
               command: [dd, if=/dev/zero, of=/dev/null, bs=64M, count=1]\n    resources:\n      limits: {memory: 16Mi}\n";
    n.write("oom.yaml", &pod_yaml("oom", oom));
    let p = n.wait_pod("oom", 20, "failed", |p| phase(p) == "Failed");
    let t = &container(&p, "hog")["state"]["terminated"];
    assert_eq!(t["reason"], "OOMKilled", "{p:#}");
    assert_eq!(t["exitCode"], 137);

    let first = n.wait_pod("crash", 10, "restarted once", |p| container(p, "app")["restartCount"] == 1);
    assert_eq!(container(&first, "app")["lastState"]["terminated"]["exitCode"], 3);
    let backoff = n.wait_pod("crash", 10, "backed off", |p| {
        container(p, "app")["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    });
    assert_eq!(phase(&backoff), "Running");
    let p = n.wait_pod("crash", 20, "restarted twice", |p| container(p, "app")["restartCount"] == 2);
    // The third run keeps the log of the second, as the kubelet keeps one dead container, and the first's is gone.
    let logs = n.logs.join(format!("default_crash-vm_{}/app", p["metadata"]["uid"].as_str().unwrap()));
    let runs = || ["0.log", "1.log", "2.log"].map(|f| logs.join(f).exists());
    wait_until(10, "the first run's log was removed", || runs() == [false, true, true]);
    // The gaps come from the daemon's own timestamps of each start: when this test's polls saw a restart depends
    // on what else it waited for meanwhile (the OOM pod above) and on how loaded the guest is.
    let log = n.d.log();
    let start = |attempt: u32| {
        started_at(&log, "default/crash-vm", attempt).unwrap_or_else(|| panic!("no start of attempt {attempt}\n{log}"))
    };
    let (a0, a1, a2) = (start(0), start(1), start(2));
    let since = |a: f64, b: f64| (b - a).rem_euclid(86_400.0); // a start may fall after midnight
    assert!(since(a0, a1) < 5.0, "the first restart was not immediate: {:.2} s after the first start", since(a0, a1));
    // The back-off runs from the exit of attempt 1, which comes after its start: so at least 10 s between starts.
    let gap = since(a1, a2);
    assert!((10.0..20.0).contains(&gap), "the second restart came {gap:.2} s after the first, not ~10 s");
    eprintln!("first restart after {:.2} s, second after {gap:.2} s", since(a0, a1));
}

/// A pod's `podPidsLimit` holds at the fork: with room for one process, the second container's process is never
/// created, since it is created in its cgroup, where the kernel charges it (a process moved in afterwards, as before
/// clone3, ran over the limit: a move is not refused by `pids.max`). That start fails, naming the limit.
#[test]
fn pods_pids_limit_refuses_a_process_at_its_fork() {
    if !cgroup2_available() {
        return;
    }
    let n = node_with("pidsmax", "", "podPidsLimit: 1\n");
    let sleeper = |name: &str| format!("  - name: {name}\n    image: busybox\n    command: [sleep, '1000']\n");
    let spec = format!("  restartPolicy: Never\n  containers:\n{}{}", sleeper("one"), sleeper("two"));
    n.write("two.yaml", &pod_yaml("two", &spec));
    let failed = |p: &Value, c: &str| container(p, c)["state"]["terminated"]["reason"] == "StartError";
    let p = n.wait_pod("two", 30, "one container running, the other failed to start", |p| {
        let running = |c: &str| container(p, c)["state"]["running"].is_object();
        (running("one") && failed(p, "two")) || (running("two") && failed(p, "one"))
    });
    let (ran, refused) = if failed(&p, "two") { ("one", "two") } else { ("two", "one") };
    let message = container(&p, refused)["state"]["terminated"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("pids.max"), "{p:#}");
    let cg = n.pod_cgroup(&p);
    assert_eq!(std::fs::read_to_string(cg.join("pids.max")).unwrap().trim(), "1");
    assert_eq!(procs(&cg.join(ran)).len(), 1, "{p:#}");
    assert_eq!(std::fs::read_to_string(cg.join("pids.current")).unwrap().trim(), "1", "{p:#}");
}

/// When the daemon's log says the container of `pod` started its `attempt`, in seconds of the day (UTC).
fn started_at(log: &str, pod: &str, attempt: u32) -> Option<f64> {
    let line = log.lines().find(|l| {
        l.contains("container started")
            && l.contains(&format!("pod={pod} "))
            && l.ends_with(&format!("attempt={attempt}"))
    })?;
    // 2026-12-01T21:36:37.514314Z ...
    let clock = line.split_whitespace().next()?.split('T').nth(1)?.trim_end_matches('Z');
    let mut parts = clock.split(':');
    let (h, m, s): (f64, f64, f64) =
        (parts.next()?.parse().ok()?, parts.next()?.parse().ok()?, parts.next()?.parse().ok()?);
    Some(h * 3600.0 + m * 60.0 + s)
}

#[test]
fn a_failing_liveness_probe_restarts_the_container() {
    if !cgroup2_available() {
        return;
    }
    let n = node("probe");
    let flag = n.root.parent().unwrap().join("alive");
    std::fs::write(&flag, "").unwrap();
    let body = format!(
        "  containers:\n  - name: app\n    image: busybox\n    command: [sleep, '1000']\n    livenessProbe:\n      \
         exec:\n        command: [test, -f, {}]\n      periodSeconds: 1\n      failureThreshold: 1\n    \
         readinessProbe:\n      exec:\n        command: ['true']\n      periodSeconds: 1\n",
        flag.display()
    );
    n.write("probe.yaml", &pod_yaml("probe", &body));
    let p = n.wait_pod("probe", 15, "became ready", |p| container(p, "app")["ready"] == true);
    let ready = p["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap().clone();
    assert_eq!(ready["status"], "True");
    std::fs::remove_file(&flag).unwrap();
    let p = n.wait_pod("probe", 15, "restarted", |p| container(p, "app")["restartCount"] == 1);
    assert_eq!(container(&p, "app")["lastState"]["terminated"]["exitCode"], 143, "SIGTERM ends sleep");
}

#[test]
fn a_kill_9_of_the_daemon_loses_no_pod() {
    if !cgroup2_available() {
        return;
    }
    let mut n = node("adopt");
    n.write("keep.yaml", &pod_yaml("keep", SLEEPER));
    let p = n.wait_pod("keep", 10, "ran", |p| phase(p) == "Running");
    let cg = n.pod_cgroup(&p).join("app");
    let before = procs(&cg);
    let started = container(&p, "app")["state"]["running"]["startedAt"].clone();
    let mut child = n.d.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    n.d.start();
    n.d.wait_ready();
    let p = n.wait_pod("keep", 10, "was adopted", |p| phase(p) == "Running" && container(p, "app")["ready"] == true);
    assert_eq!(procs(&cg), before, "the same process, no duplicate");
    assert_eq!(container(&p, "app")["restartCount"], 0);
    assert_eq!(container(&p, "app")["state"]["running"]["startedAt"], started, "the start time survived");
    // The adopted container is still watched: when it dies, it is restarted.
    Command::new("kill").arg("-9").arg(before[0].to_string()).status().unwrap();
    let p = n.wait_pod("keep", 10, "restarted", |p| container(p, "app")["restartCount"] == 1 && phase(p) == "Running");
    assert_ne!(procs(&cg), before);
    assert!(container(&p, "app")["lastState"]["terminated"]["reason"].is_string());
}

#[test]
fn volumes_users_and_bad_manifests() {
    if !cgroup2_available() {
        return;
    }
    let n = node("volumes");
    let target = n.root.parent().unwrap().join("mnt");
    std::fs::create_dir_all(&target).unwrap();
    let body = format!(
        "  restartPolicy: Never\n  securityContext:\n    runAsUser: 65534\n    runAsGroup: 65534\n  containers:\n  \
         - name: app\n    image: busybox\n    command: [sh, -c, 'id -u; echo hi > {t}/f && grep {t} /proc/self/mounts']\n    \
         volumeMounts:\n    - name: cache\n      mountPath: {t}\n  volumes:\n  - name: cache\n    emptyDir:\n      \
         medium: Memory\n      sizeLimit: 8Mi\n",
        t = target.display()
    );
    n.write("vol.yaml", &pod_yaml("vol", &body));
    for (file, text) in [
        ("notyaml.yaml", "{ this is: [not yaml"),
        ("deploy.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n"),
        ("dup.yaml", &pod_yaml("dup", "  containers:\n  - {name: a, image: b}\n  - {name: a, image: b}\n")),
        (
            "escape.yaml",
            &pod_yaml("esc", "  containers:\n  - {name: a, image: b}\n")
                .replace("  name: esc\n", "  name: esc\n  uid: ../../x\n"),
        ),
        (
            "quantity.yaml",
            &pod_yaml("q", "  containers:\n  - {name: a, image: b, resources: {limits: {memory: lots}}}\n"),
        ),
    ] {
        n.write(file, text);
    }
    let huge = std::fs::File::create(n.manifests.join("huge.yaml")).unwrap();
    huge.set_len(2 * MIB).unwrap();
    let p = n.wait_pod("vol", 15, "succeeded", |p| phase(p) == "Succeeded");
    let uid = p["metadata"]["uid"].as_str().unwrap();
    let log = std::fs::read_to_string(n.logs.join(format!("default_vol-vm_{uid}/app/0.log"))).unwrap();
    assert!(log.starts_with("65534\n"), "runAsUser: {log}");
    assert!(log.contains("tmpfs"), "the memory emptyDir is a tmpfs mounted for the container: {log}");
    assert!(!target.join("f").exists(), "the mount is private to the container");
    assert!(!n.root.join("pods").join(uid).join("volumes").exists(), "a finished pod's volumes are removed");

    let deadline = Instant::now() + Duration::from_secs(10);
    let bad = loop {
        let bad: Vec<Value> = n.pods().into_iter().filter(|p| p["status"]["reason"] == "InvalidManifest").collect();
        if bad.len() == 6 || Instant::now() > deadline {
            break bad;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let reasons: Vec<String> = bad
        .iter()
        .map(|p| format!("{}: {}", p["metadata"]["name"].as_str().unwrap(), p["status"]["message"].as_str().unwrap()))
        .collect();
    assert_eq!(reasons.len(), 6, "{reasons:#?}");
    for want in [
        "notyaml.yaml: not valid YAML",
        "deploy.yaml: not a Pod",
        "dup.yaml: spec.containers[a].name: duplicate container name",
        "escape.yaml: metadata.uid",
        "quantity.yaml: spec",
        "huge.yaml: the manifest is 2097152 bytes",
    ] {
        assert!(reasons.iter().any(|r| r.starts_with(want)), "no {want:?} in {reasons:#?}");
    }
    let (_, metrics) = get(n.d.port, "/metrics").unwrap();
    assert!(metrics.contains("nodewarden_static_pod_manifest_errors 6"), "{metrics}");
}

#[test]
fn a_sub_path_cannot_leave_its_volume() {
    if !cgroup2_available() {
        return;
    }
    let n = node("subpath");
    let target = n.root.parent().unwrap().join("mnt");
    std::fs::create_dir_all(&target).unwrap();
    // A non-root init container writes the disk emptyDir (0777, as the kubelet makes it) and plants a link to /.
    let pod = |name: &str, sub: &str| {
        let body = format!(
            "  restartPolicy: Never\n  securityContext:\n    runAsUser: 65534\n    runAsGroup: 65534\n  initContainers:\n  \
             - name: plant\n    image: busybox\n    command: [sh, -c, 'ln -s / {t}/x && mkdir {t}/ok && echo inside > {t}/ok/f']\n    \
             volumeMounts:\n    - name: shared\n      mountPath: {t}\n  containers:\n  - name: app\n    image: busybox\n    \
             command: [sh, -c, 'ls {t} && cat {t}/f']\n    volumeMounts:\n    - name: shared\n      mountPath: {t}\n      \
             subPath: {sub}\n  volumes:\n  - name: shared\n    emptyDir: {{}}\n",
            t = target.display()
        );
        pod_yaml(name, &body)
    };
    n.write("ok.yaml", &pod("inside", "ok"));
    let p = n.wait_pod("inside", 20, "succeeded", |p| phase(p) == "Succeeded");
    let uid = p["metadata"]["uid"].as_str().unwrap();
    let log = std::fs::read_to_string(n.logs.join(format!("default_inside-vm_{uid}/app/0.log"))).unwrap();
    assert!(log.contains("inside"), "the subPath inside the volume is mounted: {log}");
    n.write("escape.yaml", &pod("escape", "x"));
    let p = n.wait_pod("escape", 20, "refuses the subPath", |p| {
        container(p, "app")["state"]["waiting"]["reason"] == "CreateContainerConfigError"
    });
    let message = container(&p, "app")["state"]["waiting"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("out of the volume"), "{message}");
    let uid = p["metadata"]["uid"].as_str().unwrap();
    assert!(
        !n.logs.join(format!("default_escape-vm_{uid}/app/0.log")).exists(),
        "the container must not start with the host's / mounted"
    );
}

#[test]
fn security_fields_are_applied_or_refused_by_name() {
    if !cgroup2_available() {
        return;
    }
    let n = node("security");
    let body = "  restartPolicy: Never\n  securityContext:\n    supplementalGroups: [3000]\n  containers:\n  \
                - name: app\n    image: busybox\n    command: [sh, -c, 'id -u; id -g; grep -E \"^(Groups|NoNewPrivs|CapEff|CapBnd)\" /proc/self/status']\n    \
                securityContext:\n      allowPrivilegeEscalation: false\n      capabilities:\n        drop: [ALL]\n  \
                - name: user\n    image: busybox\n    command: [sh, -c, 'id -u; id -g']\n    securityContext:\n      runAsUser: 4242\n";
    n.write("confined.yaml", &pod_yaml("confined", body));
    let p = n.wait_pod("confined", 20, "succeeded", |p| phase(p) == "Succeeded");
    let uid = p["metadata"]["uid"].as_str().unwrap();
    let log = |c: &str| std::fs::read_to_string(n.logs.join(format!("default_confined-vm_{uid}/{c}/0.log"))).unwrap();
    let app = log("app");
    assert!(app.contains("NoNewPrivs:\t1"), "allowPrivilegeEscalation: false sets no_new_privs: {app}");
    assert!(app.contains("CapEff:\t0000000000000000"), "drop ALL leaves root without capabilities: {app}");
    assert!(app.contains("CapBnd:\t0000000000000000"), "and out of the bounding set: {app}");
    assert!(app.contains("Groups:\t3000"), "supplementalGroups: {app}");
    // runAsUser without runAsGroup and without a passwd entry: the overflow group, not root's.
    assert_eq!(log("user"), "4242\n65534\n");
    let refused = "  containers:\n  - name: app\n    image: busybox\n    command: [sleep, '60']\n    \
                   securityContext:\n      readOnlyRootFilesystem: true\n";
    n.write("readonly.yaml", &pod_yaml("readonly", refused));
    let p = n.wait_pod("readonly", 20, "refuses the field", |p| {
        container(p, "app")["state"]["waiting"]["reason"] == "CreateContainerConfigError"
    });
    let message = container(&p, "app")["state"]["waiting"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("readOnlyRootFilesystem"), "{message}");
}

#[test]
fn a_log_flood_is_rotated_and_the_quiet_pod_keeps_running() {
    if !cgroup2_available() {
        return;
    }
    let top = "containerLogMaxSize: 1Mi\ncontainerLogMaxFiles: 3\ncontainerLogMonitorInterval: 1s\n";
    // About 1 MiB/s, on a file system of its own: the other tests' daemons measure the VM's root.
    let n = node_on_tmpfs(96, "logflood", "", top);
    let flood = "  containers:\n  - name: app\n    image: busybox\n    \
                 command: [sh, -c, 'while true; do yes | head -c 262144; sleep 0.25; done']\n";
    n.write("flood.yaml", &pod_yaml("flood", flood));
    n.write(
        "quiet.yaml",
        &pod_yaml("quiet", "  containers:\n  - name: app\n    image: busybox\n    command: [sleep, '3600']\n"),
    );
    let flood = n.wait_pod("flood", 20, "runs", |p| phase(p) == "Running");
    n.wait_pod("quiet", 20, "runs", |p| phase(p) == "Running");
    let uid = flood["metadata"]["uid"].as_str().unwrap();
    let dir = n.logs.join(format!("default_flood-vm_{uid}/app"));
    let files = || -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.metadata().map(|m| m.len()).unwrap_or(0)))
            // A copy in progress is hidden until it is whole.
            .filter(|(f, _)| !f.starts_with('.'))
            .collect();
        v.sort();
        v
    };
    // Rotated at least once, and never more than containerLogMaxFiles files.
    wait_until(30, "the flood's log is rotated", || files().iter().any(|(f, _)| f.starts_with("0.log.")));
    for _ in 0..10 {
        let f = files();
        assert!(f.len() <= 3, "more than containerLogMaxFiles: {f:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    // The rotated files hold what was written: the flood's output, not holes.
    let (rotated, _) = files().into_iter().find(|(f, _)| f.starts_with("0.log.")).unwrap();
    let text = std::fs::read(dir.join(&rotated)).unwrap();
    assert!(text.starts_with(b"y\n") && text.iter().all(|b| *b == b'y' || *b == b'\n'), "{rotated}");
    assert_eq!(n.pod("quiet").map(|p| phase(&p).to_owned()), Some("Running".to_owned()));
}

#[test]
fn a_yes_flood_is_contained_or_evicted_and_the_quiet_pod_stays() {
    if !cgroup2_available() {
        return;
    }
    // `yes` beside a quiet pod on a small disk of its own (the other tests' daemons measure the VM's root, and
    // must not see this flood as pressure): rotation contains it (never more than
    // containerLogMaxFiles), or, when it outruns a 1 s rotation, nodefs pressure evicts it and its logs are
    // reclaimed while the disk stays short. Either way the quiet pod stays.
    let top = "containerLogMaxSize: 1Mi\ncontainerLogMaxFiles: 2\ncontainerLogMonitorInterval: 1s\n";
    let n = node_on_tmpfs(64, "yesflood", "", top);
    n.write(
        "quiet.yaml",
        &pod_yaml("quiet", "  containers:\n  - name: app\n    image: busybox\n    command: [sleep, '3600']\n"),
    );
    n.wait_pod("quiet", 20, "runs", |p| phase(p) == "Running");
    n.write(
        "flood.yaml",
        &pod_yaml("flood", "  containers:\n  - name: app\n    image: busybox\n    command: ['yes']\n"),
    );
    let flood = n.wait_pod("flood", 20, "runs", |p| phase(p) == "Running");
    let uid = flood["metadata"]["uid"].as_str().unwrap().to_owned();
    let logs = n.logs.join(format!("default_flood-vm_{uid}/app"));
    let deadline = Instant::now() + Duration::from_secs(40);
    while Instant::now() < deadline {
        let evicted = n.pod("flood").is_some_and(|p| p["status"]["reason"] == "Evicted");
        if evicted {
            // The node recovers: the flooder's logs are reclaimed while the disk is short, or its rotation has
            // already freed enough (a pod that is over keeps its logs while the disk has room, as with the kubelet).
            let met = || -> bool {
                let e: Value = serde_json::from_str(&get(n.d.port, "/evictions").unwrap().1).unwrap();
                e["thresholdsMet"].as_array().is_some_and(|m| !m.is_empty())
            };
            wait_until(30, "the disk is above its thresholds again", || !logs.exists() || !met());
            break;
        }
        let files = std::fs::read_dir(&logs)
            .map(|d| d.flatten().filter(|e| !e.file_name().to_string_lossy().starts_with('.')).count())
            .unwrap_or(0);
        assert!(files <= 2, "the flood is neither contained nor evicted: {files} log files");
        assert_eq!(n.pod("quiet").map(|p| phase(&p).to_owned()), Some("Running".to_owned()), "{}", n.d.log());
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(n.pod("quiet").map(|p| phase(&p).to_owned()), Some("Running".to_owned()), "{}", n.d.log());
}

#[test]
fn a_hundred_static_pods_run() {
    if !cgroup2_available() {
        return;
    }
    let n = node("hundred");
    let t0 = Instant::now();
    for i in 0..100 {
        n.write(
            &format!("p{i}.yaml"),
            &pod_yaml(
                &format!("p{i}"),
                "  containers:\n  - name: app\n    image: busybox\n    command: [sleep, '1000']\n",
            ),
        );
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let pods = n.pods();
        let running = pods.iter().filter(|p| phase(p) == "Running").count();
        if running == 100 {
            break;
        }
        let others: Vec<String> = pods
            .iter()
            .filter(|p| phase(p) != "Running")
            .map(|p| format!("{} {}", p["metadata"]["name"], p["status"]))
            .collect();
        assert!(Instant::now() < deadline, "only {running} of 100 pods running: {others:#?}\n{}", n.d.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("100 pods from manifest writes to Running: {:?}", t0.elapsed());
    let pods = std::fs::read_dir(n.d.cgroup("kubepods/besteffort")).unwrap().flatten();
    assert_eq!(pods.filter(|e| e.file_name().to_string_lossy().starts_with("pod")).count(), 100);
    // The gauges follow within a tick of the pod manager.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut metrics = String::new();
    while !metrics.contains("kubelet_running_pods 100") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        metrics = get(n.d.port, "/metrics").unwrap().1;
    }
    assert!(metrics.contains("kubelet_running_pods 100"), "{metrics}");
    assert!(metrics.contains("kubelet_running_containers{container_state=\"running\"} 100"), "{metrics}");
}

/// A tiny HTTP server on 127.0.0.1 answering every request with `answer`'s status and body; the requests' heads
/// are kept in `heads`.
fn serve_http(
    answer: std::sync::Arc<std::sync::Mutex<(u16, String)>>,
    heads: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let n = conn.read(&mut buf).unwrap_or(0);
            heads.lock().unwrap().push(String::from_utf8_lossy(&buf[..n]).into_owned());
            let (status, body) = answer.lock().unwrap().clone();
            let _ = write!(
                conn,
                "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

#[test]
fn pods_from_a_static_pod_url_run_and_an_unreachable_url_keeps_them() {
    if !cgroup2_available() {
        return;
    }
    let answer = std::sync::Arc::new(std::sync::Mutex::new((200, String::new())));
    let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let list = |names: &[&str]| {
        let items: Vec<String> = names
            .iter()
            .map(|n| {
                format!(
                    r#"{{"metadata": {{"name": "{n}"}}, "spec": {{"containers": [{{"name": "app", "image": "busybox", "command": ["sleep", "1000"]}}]}}}}"#
                )
            })
            .collect();
        format!(r#"{{"apiVersion": "v1", "kind": "PodList", "items": [{}]}}"#, items.join(","))
    };
    *answer.lock().unwrap() = (200, list(&["from-url"]));
    let port = serve_http(answer.clone(), heads.clone());
    let top = format!(
        "staticPodURL: http://127.0.0.1:{port}/pods\nstaticPodURLHeader:\n  X-Node-Token: [secret-1]\nhttpCheckFrequency: 1s\n"
    );
    let n = node_with("url", "", &top);
    let p = n.wait_pod("from-url", 30, "ran", |p| phase(p) == "Running");
    assert_eq!(p["metadata"]["annotations"]["kubernetes.io/config.source"], "http", "{p:#}");
    assert!(heads.lock().unwrap().iter().any(|h| h.contains("x-node-token: secret-1")), "{:?}", heads.lock().unwrap());
    // The server fails: the pod stays, untouched.
    let before = n.pod("from-url").unwrap()["status"]["containerStatuses"][0]["containerID"].clone();
    *answer.lock().unwrap() = (503, String::new());
    std::thread::sleep(Duration::from_secs(4));
    let still = n.pod("from-url").expect("the pod went away with its URL");
    assert_eq!((phase(&still), &still["status"]["containerStatuses"][0]["containerID"]), ("Running", &before));
    // It answers again without the pod: the pod is terminated.
    *answer.lock().unwrap() = (200, String::new());
    wait_until(30, "the pod the URL dropped is gone", || n.pod("from-url").is_none());
}

/// The first mount point strictly below `/run` in this process's mount table (the VM's share, `/run/nodewarden-vm`).
fn a_mount_below_run() -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .find(|p| p.starts_with("/run/") && !p.contains('\\'))
        .map(str::to_owned)
}

#[test]
fn a_mount_path_missing_on_the_node_is_made_in_the_container_only() {
    if !cgroup2_available() {
        return;
    }
    assert!(!Path::new("/var/run/secrets/nodewarden-test").exists() && !Path::new("/nonexistent-nw").exists());
    let n = node("missing-mount");
    // Seen in the container only if the node's mounts below the overlaid /run are attached again in its overlay.
    let sub = a_mount_below_run();
    let sa = "/var/run/secrets/nodewarden-test/sa";
    let check_sub = sub
        .as_ref()
        .map_or(String::new(), |s| format!("grep -q \" {s} \" /proc/self/mountinfo && echo submount-visible; "));
    // `app`, not root, writes both volumes: one below /run (through the /var/run link), one below a directory
    // missing at the top of the node's tree (so its container's root is an overlay). Its readiness probe, an exec,
    // runs in the main process's mount namespace (which the main process wrote down), as a CRI exec would. `run`
    // has the first volume only.
    let body = format!(
        "  securityContext:\n    runAsUser: 65534\n    runAsGroup: 65534\n  containers:\n  - name: app\n    image: busybox\n    \
         command: [sh, -c, 'echo from-app > {sa}/token && cat {sa}/token; echo deep > /nonexistent-nw/a/b/f && \
         cat /nonexistent-nw/a/b/f; readlink /proc/self/ns/mnt > {sa}/ns; {check_sub}exec sleep 1000']\n    \
         readinessProbe:\n      exec:\n        command: [sh, -c, 'cat {sa}/token && test \"$(readlink /proc/self/ns/mnt)\" = \"$(cat {sa}/ns)\"']\n      periodSeconds: 1\n    \
         volumeMounts:\n    - name: sa\n      mountPath: {sa}\n    - name: deep\n      mountPath: /nonexistent-nw/a/b\n  \
         - name: run\n    image: busybox\n    command: [sh, -c, 'echo from-run > {sa}/run && cat {sa}/run; exec sleep 1000']\n    \
         volumeMounts:\n    - name: sa\n      mountPath: {sa}\n  volumes:\n  - name: sa\n    emptyDir: {{}}\n  \
         - name: deep\n    emptyDir: {{}}\n"
    );
    n.write("sa.yaml", &pod_yaml("sa", &body));
    let p = n.wait_pod("sa", 60, "ran with its containers ready", |p| {
        phase(p) == "Running" && container(p, "app")["ready"] == true && container(p, "run")["ready"] == true
    });
    let uid = p["metadata"]["uid"].as_str().unwrap().to_owned();
    let log =
        |c: &str| std::fs::read_to_string(n.logs.join(format!("default_sa-vm_{uid}/{c}/0.log"))).unwrap_or_default();
    let want = format!("from-app\ndeep\n{}", if sub.is_some() { "submount-visible\n" } else { "" });
    wait_until(10, "the containers logged", || log("app") == want && log("run") == "from-run\n");
    let volumes = n.root.join(format!("pods/{uid}/volumes/kubernetes.io~empty-dir"));
    assert_eq!(std::fs::read_to_string(volumes.join("sa/token")).unwrap(), "from-app\n");
    assert_eq!(std::fs::read_to_string(volumes.join("sa/run")).unwrap(), "from-run\n");
    assert_eq!(std::fs::read_to_string(volumes.join("deep/f")).unwrap(), "deep\n");
    match &sub {
        Some(s) => eprintln!("{s}, mounted below /run, is visible in the container"),
        None => eprintln!("no mount below /run on this node: not checked"),
    }
    assert!(!Path::new("/var/run/secrets/nodewarden-test").exists(), "nothing is made on the node");
    assert!(!Path::new("/nonexistent-nw").exists(), "nothing is made on the node");
    let scratch = |c: &str| n.root.join(format!("process-runtime/{uid}_{c}_0"));
    assert!(scratch("app").is_dir() && scratch("run").is_dir(), "the overlays' directories are the runtime's");
    std::fs::remove_file(n.manifests.join("sa.yaml")).unwrap();
    wait_until(30, "the pod is gone", || n.pod("sa").is_none());
    let deadline = Instant::now() + Duration::from_secs(10);
    while (scratch("app").exists() || scratch("run").exists()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = Command::new("find").arg(n.root.join("process-runtime")).output().unwrap();
    assert!(
        !scratch("app").exists() && !scratch("run").exists(),
        "the containers' scratch directories are removed with them:\n{}\n{}",
        String::from_utf8_lossy(&left.stdout),
        n.d.log()
    );
    assert!(!Path::new("/var/run/secrets/nodewarden-test").exists() && !Path::new("/nonexistent-nw").exists());
}
