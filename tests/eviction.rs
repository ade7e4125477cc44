//! The eviction manager end to end with the real kernel (inside the VM of `deploy/vm`; skipped where cgroup v2 is
//! missing): each signal's hard threshold evicts the ranked victim, a soft threshold waits for its grace period
//! and caps the pod's, node conditions hold for the transition period and refuse pods at admission, thresholds
//! are hot-reloaded (in-place write, rename over, Kubernetes' `..data` symlink swap), ephemeral-storage limits hold
//! (on ext4 with project quotas, measured from the quotas; on ext4 without, walked), and a real Prometheus scrapes
//! `/metrics`.
//!
//! The signals are the node's, so these tests run one at a time.
#![expect(clippy::unwrap_used, reason = "test code: a failed unwrap is a failed test")]
#![expect(clippy::disallowed_types, reason = "waits for real processes, in real time")]

mod common;

use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

fn metrics(n: &Node) -> String {
    get(n.d.port, "/metrics").unwrap().1
}

fn evictions(n: &Node) -> Value {
    serde_json::from_str(&get(n.d.port, "/evictions").unwrap().1).unwrap()
}

fn condition(n: &Node, c: &str) -> bool {
    metric(&metrics(n), &format!("nodewarden_node_condition{{condition=\"{c}\"}}")) == Some(1.0)
}

fn oom_kills() -> usize {
    let out = Command::new("dmesg").output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    out.unwrap_or_default().lines().filter(|l| l.contains("Killed process")).count()
}

/// The pod's `DisruptionTarget` condition, or null.
fn disruption(p: &Value) -> Value {
    let conditions = p["status"]["conditions"].as_array().cloned().unwrap_or_default();
    conditions.into_iter().find(|c| c["type"] == "DisruptionTarget").unwrap_or(Value::Null)
}

fn evicted(p: &Value) -> bool {
    phase(p) == "Failed" && p["status"]["reason"] == "Evicted"
}

/// A container spec: `command` with memory requests and limits (Guaranteed when both are given with cpu).
fn containers(command: &str, resources: &str) -> String {
    format!("  containers:\n  - name: app\n    image: busybox\n    command: {command}\n{resources}")
}

const GUARANTEED: &str =
    "    resources:\n      requests: {memory: 100Mi, cpu: 100m}\n      limits: {memory: 100Mi, cpu: 100m}\n";
const BURSTABLE: &str = "    resources:\n      requests: {memory: 20Mi}\n";

fn hog(bytes: &str) -> String {
    format!("[stress-ng, --vm, '1', --vm-bytes, {bytes}, --vm-keep, --timeout, 600s, --quiet]")
}

fn mib(bytes: u64) -> u64 {
    bytes / MIB
}

#[test]
fn memory_pressure_evicts_the_besteffort_hog_and_holds_the_condition() {
    if !cgroup2_available() {
        return;
    }
    let _serial = serial();
    // A threshold 300 MiB below what is available now: the hog's 500 MiB crosses it.
    let threshold = mib(meminfo("MemAvailable")).saturating_sub(300);
    let n = node_with(
        "evict-mem",
        "",
        &format!("evictionHard:\n  memory.available: {threshold}Mi\nevictionPressureTransitionPeriod: 6s\n"),
    );
    n.write("guaranteed.yaml", &pod_yaml("guaranteed", &containers(&hog("40M"), GUARANTEED)));
    n.write("burstable.yaml", &pod_yaml("burstable", &containers("[sleep, '1000']", BURSTABLE)));
    for p in ["guaranteed", "burstable"] {
        n.wait_pod(p, 60, "ran", |v| phase(v) == "Running");
    }
    let kills = oom_kills();
    n.write("hog.yaml", &pod_yaml("hog", &containers(&hog("500M"), "")));
    let p = n.wait_pod("hog", 90, "was evicted", evicted);
    let message = p["status"]["message"].as_str().unwrap();
    assert!(message.starts_with("The node was low on resource: memory. Threshold quantity: "), "{message}");
    // The condition that tells controllers (a Job's podFailurePolicy) the kubelet disrupted the pod.
    assert_eq!(disruption(&p)["reason"], "TerminationByKubelet", "{p:#}");
    assert_eq!(disruption(&p)["message"], message);
    for p in ["guaranteed", "burstable"] {
        assert_eq!(phase(&n.pod(p).unwrap()), "Running", "{p} was disturbed:\n{}", n.d.log());
    }
    assert_eq!(oom_kills(), kills, "the kernel OOM killer fired");

    let e = evictions(&n);
    let first = &e["evictions"][0];
    assert_eq!(first["pod"], "default/hog-vm");
    assert_eq!(first["signal"], "memory.available");
    assert_eq!(first["hard"], true);
    assert_eq!(first["grace_period_seconds"], 1);
    assert_eq!(first["candidates"][0]["pod"], "default/hog-vm", "{e:#}");
    let latency = first["sigterm_latency_seconds"].as_f64().unwrap();
    eprintln!("memory.available crossing observed → SIGTERM: {:.1} ms", latency * 1000.0);
    assert_eq!(e["evictions"].as_array().unwrap().len(), 1, "only the hog: {e:#}");
    let text = metrics(&n);
    assert_eq!(metric(&text, "kubelet_evictions{eviction_signal=\"memory.available\"}"), Some(1.0), "{text}");
    assert_eq!(
        metric(&text, "nodewarden_eviction_latency_seconds_count{eviction_signal=\"memory.available\"}"),
        Some(1.0)
    );

    // MemoryPressure holds for the transition period after recovery, and refuses BestEffort pods meanwhile.
    assert!(condition(&n, "MemoryPressure"));
    n.write("late.yaml", &pod_yaml("late", &containers("[sleep, '1000']", "")));
    n.write("late-burstable.yaml", &pod_yaml("late-burstable", &containers("[sleep, '1000']", BURSTABLE)));
    let late = n.wait_pod("late", 30, "was refused", |v| phase(v) == "Failed");
    assert_eq!(late["status"]["reason"], "Evicted");
    assert_eq!(late["status"]["message"], "The node had condition: [MemoryPressure]. ");
    assert_eq!(disruption(&late), Value::Null, "a pod refused at admission was not disrupted: {late:#}");
    n.wait_pod("late-burstable", 30, "ran", |v| phase(v) == "Running");
    let cleared = wait_until(30, "MemoryPressure cleared", || !condition(&n, "MemoryPressure"));
    eprintln!("MemoryPressure cleared {cleared:?} after the check");
}

#[test]
fn more_reserved_under_load_evicts_before_kubepods_memory_max_is_lowered() {
    if !cgroup2_available() {
        return;
    }
    let _serial = serial();
    // Only allocatable matters here: memory.available (and the allocatableMemory.available threshold copied
    // from it) is 1Mi.
    let n = node_with("evict-alloc", "", "evictionHard:\n  memory.available: 1Mi\n");
    n.write("keep.yaml", &pod_yaml("keep", &containers("[sleep, '1000']", GUARANTEED)));
    n.write("hog.yaml", &pod_yaml("hog", &containers(&hog("300M"), "")));
    for p in ["keep", "hog"] {
        n.wait_pod(p, 60, "ran", |v| phase(v) == "Running");
    }
    let kubepods = std::path::Path::new("/sys/fs/cgroup/nwtest-d-evict-alloc/kubepods");
    let read = |f: &str| std::fs::read_to_string(kubepods.join(f)).unwrap().trim().to_owned();
    wait_until(60, "the hog holds its 300M", || read("memory.current").parse::<u64>().unwrap() > 250 * MIB);
    let before = read("memory.max");
    let kills = oom_kills();

    // systemReserved raised so that enforced allocatable (capacity − reserved) is about 200Mi, below the hog alone.
    let capacity = mib(meminfo("MemTotal"));
    let reserved = capacity - 16 - 200;
    let config = n.d.dir.path().join("config.yaml");
    let original = std::fs::read_to_string(&config).unwrap();
    let edited =
        original.replace("systemReserved:\n  memory: 64Mi", &format!("systemReserved:\n  memory: {reserved}Mi"));
    assert_ne!(edited, original);
    std::fs::write(&config, edited).unwrap();
    let p = n.wait_pod("hog", 60, "was evicted", evicted);
    assert!(p["status"]["message"].as_str().unwrap().starts_with("The node was low on resource: memory."), "{p:#}");
    let e = evictions(&n);
    assert_eq!(e["evictions"][0]["signal"], "allocatableMemory.available", "{e:#}");
    assert!(n.d.log().contains("kubepods' memory.max would be below what the pods use"), "{}", n.d.log());
    // Written once the pods fit, and the kernel killed nothing meanwhile.
    let enforced = meminfo("MemTotal") - (reserved + 16) * MIB;
    wait_until(30, "kubepods' memory.max lowered", || read("memory.max") == enforced.to_string());
    assert_ne!(before, read("memory.max"));
    assert_eq!(oom_kills(), kills, "the kernel OOM killer fired:\n{}", n.d.log());
    assert_eq!(read("memory.events").lines().find(|l| l.starts_with("oom_kill ")), Some("oom_kill 0"));
    assert_eq!(phase(&n.pod("keep").unwrap()), "Running");
}

#[test]
fn pid_pressure_evicts_the_pod_with_the_most_processes() {
    if !cgroup2_available() {
        return;
    }
    let _serial = serial();
    let text = std::fs::read_to_string("/proc/loadavg").unwrap();
    let threads: u64 = text.split_whitespace().nth(3).unwrap().split('/').nth(1).unwrap().parse().unwrap();
    let max = ["/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max"]
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap().trim().parse::<u64>().unwrap())
        .min()
        .unwrap();
    // 150 processes more than now crosses it; the forker starts 300.
    let threshold = max - threads - 150;
    let n = node_with("evict-pid", "", &format!("evictionHard:\n  pid.available: '{threshold}'\n"));
    n.write("quiet.yaml", &pod_yaml("quiet", &containers("[sh, -c, 'sleep 1000 & sleep 1000 & wait']", "")));
    n.wait_pod("quiet", 60, "ran", |v| phase(v) == "Running");
    let forker = "[sh, -c, 'for i in $(seq 300); do sleep 1000 & done; wait']";
    n.write("forker.yaml", &pod_yaml("forker", &containers(forker, "")));
    let p = n.wait_pod("forker", 90, "was evicted", evicted);
    assert!(p["status"]["message"].as_str().unwrap().starts_with("The node was low on resource: pids."), "{p:#}");
    assert_eq!(phase(&n.pod("quiet").unwrap()), "Running");
    let e = evictions(&n);
    assert_eq!(e["evictions"][0]["signal"], "pid.available", "{e:#}");
    assert_eq!(e["evictions"].as_array().unwrap().len(), 1, "{e:#}");
    // The forker's 300 processes go with its cgroup after the 1 s grace period (SIGTERM reached only the shell).
    let cg = n.pod_cgroup(&p);
    wait_until(30, "the forker's cgroup removed", || !cg.exists());
}

#[test]
fn nodefs_pressure_evicts_the_pod_writing_to_its_empty_dir() {
    if !cgroup2_available() {
        return;
    }
    let _serial = serial();
    // A 64 MiB file system of its own for the pods' volumes and logs, so the test fills nothing else.
    let n = node_on_tmpfs(64, "evict-disk", "", "evictionHard:\n  nodefs.available: 50%\n");
    let volume = "  volumes:\n  - name: data\n    emptyDir: {}\n";
    let mount = "    volumeMounts:\n    - {name: data, mountPath: /mnt}\n";
    n.write("quiet.yaml", &pod_yaml("quiet", &format!("{}{mount}{volume}", containers("[sleep, '1000']", ""))));
    n.wait_pod("quiet", 60, "ran", |v| phase(v) == "Running");
    let writer = "[sh, -c, 'dd if=/dev/zero of=/mnt/fill bs=1M count=40; sleep 1000']";
    n.write("writer.yaml", &pod_yaml("writer", &format!("{}{mount}{volume}", containers(writer, ""))));
    let p = n.wait_pod("writer", 90, "was evicted", evicted);
    let message = p["status"]["message"].as_str().unwrap();
    assert!(message.starts_with("The node was low on resource: ephemeral-storage."), "{message}");
    assert_eq!(phase(&n.pod("quiet").unwrap()), "Running");
    let e = evictions(&n);
    assert_eq!(e["evictions"][0]["signal"], "nodefs.available", "{e:#}");
    // The writer crossed the threshold while still writing: ranked first by what its emptyDir held then.
    let first = &e["evictions"][0]["candidates"][0];
    assert_eq!(first["pod"], "default/writer-vm", "{e:#}");
    assert!(first["usage"].as_u64().unwrap() >= 20 * MIB, "{e:#}");
    assert!(condition(&n, "DiskPressure"), "{}\n{}", metrics(&n), n.d.log());
}

#[test]
fn inode_pressure_evicts_the_pod_with_the_most_files_not_the_most_bytes() {
    if !cgroup2_available() {
        return;
    }
    let _serial = serial();
    // A file system of its own with 2000 inodes: one pod writes 20 MiB in one file, the other 1200 empty files.
    let top = "evictionHard:\n  nodefs.inodesFree: 50%\n";
    let n = node_on_tmpfs_with("size=64m,nr_inodes=2000", "evict-inodes", "", top);
    let volume = "  volumes:\n  - name: data\n    emptyDir: {}\n";
    let mount = "    volumeMounts:\n    - {name: data, mountPath: /mnt}\n";
    let big = "[sh, -c, 'dd if=/dev/zero of=/mnt/fill bs=1M count=20; sleep 1000']";
    n.write("big.yaml", &pod_yaml("big", &format!("{}{mount}{volume}", containers(big, ""))));
    n.wait_pod("big", 60, "ran", |v| phase(v) == "Running");
    std::thread::sleep(Duration::from_secs(2));
    let many = "[sh, -c, 'i=0; while [ $i -lt 1200 ]; do : > /mnt/f$i; i=$((i+1)); done; sleep 1000']";
    n.write("many.yaml", &pod_yaml("many", &format!("{}{mount}{volume}", containers(many, ""))));
    let p = n.wait_pod("many", 90, "was evicted", evicted);
    let message = p["status"]["message"].as_str().unwrap();
    assert!(message.starts_with("The node was low on resource: inodes."), "{message}");
    assert_eq!(phase(&n.pod("big").unwrap()), "Running", "the pod with the most bytes stays");
    let e = evictions(&n);
    assert_eq!(e["evictions"][0]["signal"], "nodefs.inodesFree", "{e:#}");
    // Ranked by inodes, against no request, as the kubelet ranks them.
    let first = &e["evictions"][0]["candidates"][0];
    assert_eq!(first["pod"], "default/many-vm", "{e:#}");
    assert!(first["usage"].as_u64().is_some_and(|u| (500..100_000).contains(&u)), "{e:#}");
}

#[test]
fn pods_over_their_ephemeral_storage_limits_are_evicted_without_node_pressure() {
    if !cgroup2_available() {
        return;
    }
    let _serial = serial();
    let n = node_on_tmpfs(64, "evict-limits", "", "");
    let mount = "    volumeMounts:\n    - {name: data, mountPath: /mnt}\n";
    // An emptyDir over its sizeLimit.
    let volume = "  volumes:\n  - name: data\n    emptyDir: {sizeLimit: 5Mi}\n";
    let writer = "[sh, -c, 'dd if=/dev/zero of=/mnt/fill bs=1M count=8; sleep 1000']";
    n.write("dir.yaml", &pod_yaml("dir", &format!("{}{mount}{volume}", containers(writer, ""))));
    // A container whose log outgrows its own limit, though the pod stays within its containers' limits summed.
    let two = "  containers:\n  - name: app\n    image: busybox\n    command: [sh, -c, 'head -c 1500000 /dev/zero | tr -c x x; sleep 1000']\n    \
               resources:\n      limits: {ephemeral-storage: 1Mi}\n  - name: side\n    image: busybox\n    \
               command: [sleep, '1000']\n    resources:\n      limits: {ephemeral-storage: 10Mi}\n";
    n.write("log.yaml", &pod_yaml("log", two));
    // One within its limits.
    let calm = "[sh, -c, 'dd if=/dev/zero of=/mnt/fill bs=1M count=2; sleep 1000']";
    let limit = "    resources:\n      limits: {ephemeral-storage: 10Mi}\n";
    n.write("calm.yaml", &pod_yaml("calm", &format!("{}{mount}{volume}", containers(calm, limit))));
    let p = n.wait_pod("dir", 60, "was evicted", evicted);
    assert_eq!(p["status"]["message"], "Usage of EmptyDir volume \"data\" exceeds the limit \"5Mi\". ");
    // As the kubelet's: the pod broke its own limit, nothing disrupted it.
    assert_eq!(disruption(&p), Value::Null, "{p:#}");
    let p = n.wait_pod("log", 60, "was evicted", evicted);
    assert_eq!(p["status"]["message"], "Container app exceeded its local ephemeral storage limit \"1Mi\". ");
    assert_eq!(phase(&n.pod("calm").unwrap()), "Running");
    // Counted as the kubelet counts them, by the limit's name.
    let text = metrics(&n);
    for signal in ["emptydirfs.limit", "ephemeralcontainerfs.limit"] {
        let series = format!("kubelet_evictions{{eviction_signal=\"{signal}\"}}");
        assert_eq!(metric(&text, &series), Some(1.0), "{text}");
    }
    assert!(!condition(&n, "DiskPressure"), "no node pressure was needed");
    // Listed at /evictions beside the eviction loop's, with the usage against the limit, and followed to the end.
    let mut e = evictions(&n);
    for _ in 0..100 {
        if e["evictions"].as_array().is_some_and(|l| l.iter().all(|r| r["completed"] == true)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        e = evictions(&n);
    }
    let of = |pod: &str| e["evictions"].as_array().and_then(|l| l.iter().find(|r| r["pod"] == pod)).cloned();
    let dir = of("default/dir-vm").unwrap_or_else(|| panic!("{e:#}"));
    assert_eq!(dir["signal"], "emptydirfs.limit", "{e:#}");
    assert_eq!(dir["threshold"], 5 * 1024 * 1024, "{e:#}");
    assert!(dir["observed"].as_u64().is_some_and(|u| u > 5 * 1024 * 1024), "{e:#}");
    assert!(dir["sigterm_latency_seconds"].as_f64().is_some() && dir["completed"] == true, "{e:#}");
    let log = of("default/log-vm").unwrap_or_else(|| panic!("{e:#}"));
    assert_eq!(log["signal"], "ephemeralcontainerfs.limit", "{e:#}");
    assert_eq!(e["evictions"].as_array().map(Vec::len), Some(2), "{e:#}");
}

#[test]
fn on_a_file_system_with_project_quotas_an_empty_dir_is_measured_by_its_quota() {
    if !cgroup2_available() {
        return;
    }
    let _serial = serial();
    // ext4 with project quotas: the daemon says so, each disk-backed emptyDir and pod log directory owns a project,
    // and its usage is the quota's. The writer fills its emptyDir past the sizeLimit through a file it has already
    // deleted: no walk can see those 8 MiB (the kubelet's walk misses them too), the quota does.
    let n = node_on_ext4(128, "evict-quota", &["-O", "quota,project"], "");
    let log = n.d.log();
    assert!(log.contains("the disk usage of emptyDir volumes is read from project quotas"), "{log}");
    assert!(log.contains("the disk usage of pod logs is read from project quotas"), "{log}");
    let mount = "    volumeMounts:\n    - {name: data, mountPath: /mnt}\n";
    let volume = "  volumes:\n  - name: data\n    emptyDir: {sizeLimit: 5Mi}\n";
    let hidden = "[sh, -c, 'exec 3>/mnt/fill; rm /mnt/fill; dd if=/dev/zero bs=1M count=8 >&3; exec sleep 1000']";
    n.write("hidden.yaml", &pod_yaml("hidden", &format!("{}{mount}{volume}", containers(hidden, ""))));
    let running = n.wait_pod("hidden", 60, "runs", |p| phase(p) == "Running");
    let uid = running["metadata"]["uid"].as_str().unwrap().to_owned();
    let dir = n.root.join(format!("pods/{uid}/volumes/kubernetes.io~empty-dir/data"));
    let out = Command::new("lsattr").args(["-pd"]).arg(&dir).output().unwrap();
    let attrs = String::from_utf8_lossy(&out.stdout).into_owned();
    let project: u32 = attrs.split_whitespace().next().and_then(|p| p.parse().ok()).unwrap_or(0);
    assert!(project >= 1_048_577, "the emptyDir owns no project: {attrs}");
    assert!(attrs.split_whitespace().nth(1).is_some_and(|f| f.contains('P')), "no inheritance: {attrs}");
    let p = n.wait_pod("hidden", 60, "was evicted", evicted);
    assert_eq!(p["status"]["message"], "Usage of EmptyDir volume \"data\" exceeds the limit \"5Mi\". ");
}

#[test]
fn on_ext4_without_project_quotas_an_empty_dir_is_walked_and_its_limit_still_holds() {
    if !cgroup2_available() {
        return;
    }
    let _serial = serial();
    // The same file system without the quota feature: the daemon says the files are walked, no directory is given a
    // project, and an emptyDir over its sizeLimit is still evicted, measured by the walk.
    let n = node_on_ext4(128, "evict-walk", &[], "");
    let log = n.d.log();
    assert!(log.contains("the disk usage of emptyDir volumes is measured by walking their files"), "{log}");
    assert!(log.contains("the disk usage of pod logs is measured by walking their files"), "{log}");
    let mount = "    volumeMounts:\n    - {name: data, mountPath: /mnt}\n";
    let volume = "  volumes:\n  - name: data\n    emptyDir: {sizeLimit: 5Mi}\n";
    let writer = "[sh, -c, 'sleep 2; dd if=/dev/zero of=/mnt/fill bs=1M count=8; exec sleep 1000']";
    n.write("walked.yaml", &pod_yaml("walked", &format!("{}{mount}{volume}", containers(writer, ""))));
    let running = n.wait_pod("walked", 60, "runs", |p| phase(p) == "Running");
    let uid = running["metadata"]["uid"].as_str().unwrap().to_owned();
    let dir = n.root.join(format!("pods/{uid}/volumes/kubernetes.io~empty-dir/data"));
    let out = Command::new("lsattr").args(["-pd"]).arg(&dir).output().unwrap();
    let attrs = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(attrs.split_whitespace().next(), Some("0"), "a project where quotas are off: {attrs}");
    let p = n.wait_pod("walked", 60, "was evicted", evicted);
    assert_eq!(p["status"]["message"], "Usage of EmptyDir volume \"data\" exceeds the limit \"5Mi\". ");
}

#[test]
fn a_soft_threshold_waits_for_its_grace_period_and_caps_the_pods() {
    if !cgroup2_available() {
        return;
    }
    let _serial = serial();
    // The hog crosses the soft threshold by half its size and leaves about half of what was available free, so
    // the hard threshold is never near, whatever an earlier test in this boot left in memory.
    // memory.available as the daemon reads it: min(MemFree + Inactive(file), MemAvailable).
    let available = mib((meminfo("MemFree") + meminfo("Inactive(file)")).min(meminfo("MemAvailable")));
    let hog_mib = (available * 45 / 100).min(400);
    let threshold = available.saturating_sub(hog_mib / 2);
    let top = format!(
        "evictionHard:\n  memory.available: 1Mi\nevictionSoft:\n  memory.available: {threshold}Mi\n\
         evictionSoftGracePeriod:\n  memory.available: 4s\nevictionMaxPodGracePeriod: 2\n"
    );
    let n = node_with("evict-soft", "", &top);
    // Ignores SIGTERM (the shell traps it and stress-ng is its child), with a 30 s grace period of its own.
    let stubborn = format!(
        "  terminationGracePeriodSeconds: 30\n{}",
        containers(
            &format!(
                "[sh, -c, \"trap '' TERM; stress-ng --vm 1 --vm-bytes {hog_mib}M --vm-keep --timeout 600s --quiet\"]"
            ),
            "",
        )
    );
    n.write("stubborn.yaml", &pod_yaml("stubborn", &stubborn));
    let p = n.wait_pod("stubborn", 120, "was evicted and killed", |v| {
        evicted(v) && v["status"]["containerStatuses"][0]["state"]["terminated"].is_object()
    });
    let e = evictions(&n);
    let r = &e["evictions"][0];
    assert_eq!(
        (r["hard"].as_bool(), r["grace_period_seconds"].as_u64()),
        (Some(false), Some(2)),
        "{e:#}\navailable at start {available} MiB, hog {hog_mib} MiB"
    );
    let ts = |v: &Value| v.as_str().unwrap().parse::<jiff::Timestamp>().unwrap();
    let c = container(&p, "app");
    let started = ts(&p["status"]["startTime"]);
    let finished = ts(&c["state"]["terminated"]["finishedAt"]);
    let decided = ts(&r["time"]);
    // The grace period of the threshold (4 s) passed before the decision, and the pod's capped grace (2 s)
    // before the kill; timestamps have whole seconds.
    assert!(decided.duration_since(started).as_secs_f64() >= 3.0, "evicted {decided} after a start at {started}");
    let grace = finished.duration_since(decided).as_secs_f64();
    assert!((1.0..10.0).contains(&grace), "killed {grace} s after the decision");
    assert_eq!(c["state"]["terminated"]["exitCode"], 137, "killed after the grace period: {c:#}");
}

#[test]
fn thresholds_are_hot_reloaded() {
    if !cgroup2_available() {
        return;
    }
    let _serial = serial();
    let n = node_with("evict-reload", "", "evictionHard:\n  memory.available: 1Mi\n");
    n.write("holder.yaml", &pod_yaml("holder", &containers(&hog("200M"), "")));
    n.wait_pod("holder", 60, "ran", |v| phase(v) == "Running");
    std::thread::sleep(Duration::from_secs(3));
    let stats = |n: &Node| metric(&metrics(n), "kubelet_eviction_stats{eviction_signal=\"memory.available\"}");
    assert_eq!(stats(&n), Some(MIB as f64));
    let config = n.d.dir.path().join("config.yaml");
    let original = std::fs::read_to_string(&config).unwrap();
    let with = |threshold: &str| original.replace("memory.available: 1Mi", &format!("memory.available: {threshold}"));
    let reloads = |n: &Node, result: &str| {
        metric(&metrics(n), &format!("nodewarden_config_reloads_total{{result=\"{result}\"}}")).unwrap_or(0.0)
    };

    // An invalid edit in place: counted, the running threshold stays.
    std::fs::write(&config, with("-5Mi")).unwrap();
    wait_until(5, "the failed reload counted", || reloads(&n, "failure") == 1.0);
    assert_eq!(stats(&n), Some(MIB as f64));
    assert!(n.d.log().contains("evictionHard.memory.available"), "{}", n.d.log());

    // An editor's write-and-rename, with a change that needs a restart.
    let tmp = n.d.dir.path().join(".config.yaml.swp");
    std::fs::write(&tmp, with("2Mi").replace("healthzPort:", "nodeStatusUpdateFrequency: 20s\nhealthzPort:")).unwrap();
    std::fs::rename(&tmp, &config).unwrap();
    let took = wait_until(5, "the new threshold in /metrics", || stats(&n) == Some(2.0 * MIB as f64));
    eprintln!("rename over config.yaml → kubelet_eviction_stats updated in {took:?}");
    assert!(n.d.log().contains("only takes effect after a restart"), "{}", n.d.log());

    // Written in place in two parts: the first (without the threshold, so the kubelet's default 100Mi would
    // apply) is not read while its writer has the file open; the whole file is, once it is closed.
    let base = original.replace("evictionHard:\n  memory.available: 1Mi\n", "");
    assert_ne!(base, original);
    let mut f = std::fs::OpenOptions::new().write(true).truncate(true).open(&config).unwrap();
    std::io::Write::write_all(&mut f, base.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(stats(&n), Some(2.0 * MIB as f64), "a file being written was read:\n{}", n.d.log());
    std::io::Write::write_all(&mut f, b"evictionHard:\n  memory.available: 4Mi\n").unwrap();
    drop(f);
    wait_until(5, "the whole file read once closed", || stats(&n) == Some(4.0 * MIB as f64));

    // Kubernetes' atomic writer: config.yaml → ..data/config.yaml, ..data → ..v1; then ..data swapped to ..v2,
    // whose threshold is over what is available: the holder goes.
    let dir = n.d.dir.path();
    let version = |name: &str, text: &str| {
        std::fs::create_dir_all(dir.join(name)).unwrap();
        std::fs::write(dir.join(name).join("config.yaml"), text).unwrap();
    };
    version("..v1", &with("3Mi"));
    std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/config.yaml", dir.join("config.yaml.new")).unwrap();
    std::fs::rename(dir.join("config.yaml.new"), &config).unwrap();
    wait_until(5, "the symlinked config", || stats(&n) == Some(3.0 * MIB as f64));
    let over = mib(meminfo("MemAvailable")) + 100;
    version("..v2", &with(&format!("{over}Mi")));
    std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).unwrap();
    let swapped = Instant::now();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    wait_until(5, "the swapped threshold", || stats(&n) == Some((over * MIB) as f64));
    eprintln!("..data swap → kubelet_eviction_stats updated in {:?}", swapped.elapsed());
    n.wait_pod("holder", 30, "was evicted by the reloaded threshold", evicted);
    assert_eq!(reloads(&n, "success"), 4.0);
}

#[test]
fn prometheus_scrapes_the_metrics() {
    if !cgroup2_available() {
        return;
    }
    let _serial = serial();
    let n = node("evict-prom");
    let dir = tempfile::tempdir().unwrap();
    let web = free_port();
    std::fs::write(
        dir.path().join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n- job_name: nodewarden\n  static_configs:\n  \
             - targets: ['127.0.0.1:{}']\n",
            n.d.port
        ),
    )
    .unwrap();
    let mut prom = Command::new("prometheus")
        .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{web}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus (Debian package prometheus) is needed for this test");
    let query = |q: &str| -> Vec<Value> {
        get(web, &format!("/api/v1/query?query={q}"))
            .and_then(|(_, b)| serde_json::from_str::<Value>(&b).ok())
            .and_then(|v| v["data"]["result"].as_array().cloned())
            .unwrap_or_default()
    };
    let scraped = Instant::now();
    while query("up%7Bjob%3D%22nodewarden%22%7D%3D%3D1").is_empty() {
        assert!(scraped.elapsed() < Duration::from_secs(120), "prometheus never scraped the daemon");
        std::thread::sleep(Duration::from_millis(500));
    }
    let stats = query("kubelet_eviction_stats");
    let signals: Vec<&str> = stats.iter().filter_map(|s| s["metric"]["eviction_signal"].as_str()).collect();
    assert!(signals.contains(&"memory.available") && signals.contains(&"nodefs.available"), "{stats:#?}");
    assert!(!query("kubelet_evictions").is_empty());
    assert!(!query("nodewarden_node_condition").is_empty());
    // The gauges set when scraped: the pressure stall files (the VM's kernel has PSI) and the pods by QoS class.
    let psi = query("nodewarden_pressure_avg10_ratio");
    let cgroups: Vec<&str> = psi.iter().filter_map(|s| s["metric"]["cgroup"].as_str()).collect();
    assert!(cgroups.contains(&"node") && cgroups.contains(&"kubepods"), "{psi:#?}");
    assert!(!query("nodewarden_pressure_stalled_seconds_total").is_empty());
    assert_eq!(query("nodewarden_pods").len(), 3, "a series per QoS class");
    let _ = prom.kill();
    let _ = prom.wait();
}
