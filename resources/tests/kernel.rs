//! Tests against the real kernel's cgroup v2 hierarchy. They run inside the VM of `deploy/vm` (the test command
//! sets NODEWARDEN_VM_TESTS=1 there, and then a missing cgroup v2 is a failure); elsewhere they skip.
//! Each test works below its own cgroup root, `/nwtest-<name>`, and removes it at the end.

#![expect(clippy::unwrap_used, reason = "test code: a failed unwrap is a failed test")]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use nodewarden_resources::{
    AdmitError, CgroupDriver, CgroupFs, CgroupPath, EvictionReserve, HostPaths, Limit, PlaceError, QosClass, Reserved,
    ResourceConfig, ResourceManager, check_host,
};
use serde_json::json;

const MOUNT: &str = "/sys/fs/cgroup";
const MIB: u64 = 1 << 20;

/// Returns false (skip) when the host has no usable cgroup v2; panics in the VM, where it must have one.
fn cgroup2_available() -> bool {
    let required = std::env::var_os("NODEWARDEN_VM_TESTS").is_some();
    let fs = CgroupFs::new(MOUNT, CgroupPath::root());
    match check_host(&fs, &CgroupPath::root()) {
        Ok(()) => true,
        Err(e) if required => panic!("NODEWARDEN_VM_TESTS is set but cgroup v2 is not usable: {e}"),
        Err(e) => {
            eprintln!("skipped: {e}");
            false
        }
    }
}

/// A test's own cgroup root, removed (with any process in it killed) when dropped.
struct Root {
    path: CgroupPath,
}

impl Root {
    fn new(name: &str) -> Self {
        let path = CgroupPath::parse(&format!("/nwtest-{name}")).unwrap();
        remove_tree(&path);
        Root { path }
    }

    fn dir(&self) -> PathBuf {
        Path::new(MOUNT).join(&self.path.as_str()[1..])
    }

    fn read(&self, rel: &str) -> String {
        let p = self.dir().join(rel);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).trim().to_owned()
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        remove_tree(&self.path);
    }
}

/// Kills whatever runs in a cgroup tree and removes it.
fn remove_tree(cg: &CgroupPath) {
    if let Err(e) = CgroupFs::new(MOUNT, CgroupPath::root()).purge(cg) {
        eprintln!("cannot remove {cg}: {e}");
    }
}

fn config(root: &Root) -> ResourceConfig {
    ResourceConfig {
        cgroup_root: root.path.clone(),
        enforce_pods: true,
        system_reserved: Reserved { memory: 64 * MIB, cpu_millis: 100, pids: 500, ephemeral_storage: 0 },
        kube_reserved: Reserved { memory: 32 * MIB, ..Reserved::default() },
        eviction_reserve: EvictionReserve::default(),
        max_pods: 10,
        pod_pids_limit: Some(64),
        cpu_cfs_quota: true,
        cpu_cfs_period_us: 100_000,
        memory_qos: true,
        memory_throttling_factor: 0.9,
        static_pods_critical: false,
        container_cgroups: true,
        cgroup_driver: CgroupDriver::Cgroupfs,
    }
}

fn manager(root: &Root) -> ResourceManager {
    let fs = CgroupFs::new(MOUNT, root.path.clone());
    let mut m = ResourceManager::new(fs, HostPaths::default(), config(root)).unwrap();
    m.setup().unwrap();
    m
}

fn pod(uid: &str, containers: serde_json::Value) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({"metadata": {"name": uid, "uid": uid}, "spec": {"containers": containers}})).unwrap()
}

/// Starts `sh -c SCRIPT` and moves it into `cgroup` before it runs anything else.
/// Runs `script` in `cgroup`; returns once the process has joined it or already exited (a fixed sleep was too
/// short on a loaded emulated guest).
fn spawn_in(cgroup: &Path, script: &str) -> Child {
    let procs = cgroup.join("cgroup.procs");
    let mut child =
        Command::new("sh").arg("-c").arg(format!("echo $$ > {} && exec {script}", procs.display())).spawn().unwrap();
    let pid = child.id().to_string();
    for _ in 0..500 {
        let joined = std::fs::read_to_string(&procs).unwrap_or_default().lines().any(|l| l == pid);
        if joined || child.try_wait().unwrap().is_some() {
            return child;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("process {pid} never joined {}", cgroup.display());
}

fn mem_total() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    nodewarden_resources::parse_meminfo(&text).unwrap().mem_total
}

#[test]
fn kubepods_is_limited_to_capacity_minus_reserved() {
    if !cgroup2_available() {
        return;
    }
    let root = Root::new("alloc");
    let m = manager(&root);
    let expected = mem_total() - 96 * MIB;
    assert_eq!(root.read("kubepods/memory.max"), expected.to_string());
    assert_eq!(m.allocatable().enforced.memory, expected);
    let pid_max = m.capacity().pids;
    assert_eq!(root.read("kubepods/pids.max"), (pid_max - 500).to_string());
    for qos in ["burstable", "besteffort"] {
        let ctl = root.read(&format!("kubepods/{qos}/cgroup.controllers"));
        for c in ["cpu", "memory", "pids"] {
            assert!(ctl.split_whitespace().any(|x| x == c), "{qos} lacks {c}: {ctl}");
        }
    }
    assert_eq!(root.read("kubepods/besteffort/cpu.weight"), "1");
}

#[test]
fn placed_pods_carry_their_limits() {
    if !cgroup2_available() {
        return;
    }
    let root = Root::new("place");
    let mut m = manager(&root);
    let g = m
        .place(&pod("g1", json!([{"name": "app", "resources": {"limits": {"cpu": "250m", "memory": "64Mi"}}}])))
        .unwrap();
    assert_eq!(g.qos, QosClass::Guaranteed);
    assert_eq!(root.read("kubepods/podg1/memory.max"), (64 * MIB).to_string());
    assert_eq!(root.read("kubepods/podg1/pids.max"), "64");
    assert_eq!(root.read("kubepods/podg1/cpu.max"), "25000 100000");
    assert_eq!(root.read("kubepods/podg1/cpu.weight"), nodewarden_resources::shares_to_weight(256).to_string());
    assert_eq!(root.read("kubepods/podg1/app/memory.max"), (64 * MIB).to_string());
    assert_eq!(root.read("kubepods/podg1/app/cpu.max"), "25000 100000");

    let b = m
        .place(&pod("b1", json!([{"name": "w", "resources": {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}}}])))
        .unwrap();
    assert_eq!(b.qos, QosClass::Burstable);
    let dir = "kubepods/burstable/podb1";
    assert_eq!(root.read(&format!("{dir}/memory.max")), (128 * MIB).to_string());
    assert_eq!(root.read(&format!("{dir}/cpu.max")), "max 100000");
    assert_eq!(root.read(&format!("{dir}/w/memory.min")), (32 * MIB).to_string());
    let high: u64 = root.read(&format!("{dir}/w/memory.high")).parse().unwrap();
    assert_eq!(high, nodewarden_resources::memory_high(32 * MIB, 128 * MIB, 0.9).unwrap());
    assert_eq!(root.read("kubepods/burstable/memory.min"), (32 * MIB).to_string());

    m.place(&pod("e1", json!([{"name": "batch"}]))).unwrap();
    assert_eq!(root.read("kubepods/besteffort/pode1/memory.max"), "max");
    assert_eq!(root.read("kubepods/besteffort/pode1/cpu.max"), "max 100000");
    assert_eq!(root.read("kubepods/besteffort/pode1/cpu.weight"), "1");
    assert_eq!(root.read("kubepods/besteffort/pode1/batch/memory.max"), "max");
    assert_eq!(root.read("kubepods/besteffort/pode1/memory.swap.max"), "0", "pods do not swap");

    // A placement leaves out the values a new cgroup has: this kernel gives them.
    let fs = CgroupFs::new(MOUNT, root.path.clone());
    let new = root.path.child("kubepods").unwrap().child("fresh").unwrap();
    assert!(fs.create(&new).unwrap(), "made by this call");
    assert!(!fs.create(&new).unwrap(), "there already");
    for (name, value) in nodewarden_resources::NEW_CGROUP_DEFAULTS {
        assert_eq!(root.read(&format!("kubepods/fresh/{name}")), value, "{name}");
    }
    fs.remove(&new).unwrap();
}

#[test]
fn the_kernel_enforces_memory_max() {
    if !cgroup2_available() {
        return;
    }
    let root = Root::new("oom");
    let mut m = manager(&root);
    let p =
        m.place(&pod("o1", json!([{"name": "hog", "resources": {"limits": {"cpu": "1", "memory": "16Mi"}}}]))).unwrap();
    let dir = root.dir().join("kubepods/podo1/hog");
    // dd with a 64 MiB block size allocates and fills a 64 MiB buffer: four times the limit.
    let status = spawn_in(&dir, "dd if=/dev/zero of=/dev/null bs=64M count=1").wait().unwrap();
    assert!(!status.success(), "the hog survived a 16Mi memory.max");
    let events = m.cgroupfs().read_flat_keyed(&p.containers[0].cgroup, "memory.events").unwrap();
    assert!(events.get("oom_kill").copied().unwrap_or(0) >= 1, "{events:?}");
}

#[test]
fn release_waits_for_processes_and_then_removes_cgroups() {
    if !cgroup2_available() {
        return;
    }
    let root = Root::new("release");
    let mut m = manager(&root);
    m.place(&pod("r1", json!([{"name": "sleeper"}]))).unwrap();
    let dir = root.dir().join("kubepods/besteffort/podr1/sleeper");
    let mut child = spawn_in(&dir, "sleep 600");
    // Wait until the process is really in the cgroup.
    for _ in 0..100 {
        if !std::fs::read_to_string(dir.join("cgroup.procs")).unwrap().trim().is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let err = m.release("r1").unwrap_err();
    assert!(matches!(&err, PlaceError::Busy { pids, .. } if pids.contains(&child.id())), "{err}");
    assert!(dir.exists());
    m.kill("r1").unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success(), "cgroup.kill should have killed the sleeper");
    m.release("r1").unwrap();
    assert!(!root.dir().join("kubepods/besteffort/podr1").exists());
}

#[test]
fn a_restart_adopts_existing_pods() {
    if !cgroup2_available() {
        return;
    }
    let root = Root::new("adopt");
    let mut m = manager(&root);
    m.place(&pod("a1", json!([{"name": "c", "resources": {"limits": {"cpu": "500m", "memory": "48Mi"}}}]))).unwrap();
    m.place(&pod("a2", json!([{"name": "c", "resources": {"requests": {"memory": "16Mi"}}}]))).unwrap();
    drop(m);
    let mut m2 =
        ResourceManager::new(CgroupFs::new(MOUNT, root.path.clone()), HostPaths::default(), config(&root)).unwrap();
    let mut adopted = m2.setup().unwrap();
    adopted.sort();
    assert_eq!(adopted, ["a1", "a2"]);
    let a1 = m2.placement("a1").unwrap();
    assert_eq!(a1.limits.memory_max, Limit::Value(48 * MIB));
    assert_eq!(a1.memory_request, 48 * MIB);
    assert_eq!(m2.placement("a2").unwrap().qos, QosClass::Burstable);
    // Adopted pods count for admission.
    let big = pod(
        "big",
        json!([{"name": "c", "resources": {"requests": {"memory": format!("{}", m2.allocatable().reported.memory - 60 * MIB)}}}]),
    );
    assert!(matches!(m2.admit(&big), Err(AdmitError::Insufficient { resource: "memory", .. })));
}

#[test]
fn refused_kernel_writes_are_errors_with_the_path() {
    if !cgroup2_available() {
        return;
    }
    let root = Root::new("refused");
    let m = manager(&root);
    let fs = m.cgroupfs();
    let kp = m.tree().kubepods.clone();
    let e = fs.write(&kp, "cpu.max", "not-a-number").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(22), "EINVAL expected: {e}");
    assert!(e.to_string().contains("kubepods/cpu.max"), "{e}");
    let e = fs.write(&kp, "no.such.file", "1").unwrap_err();
    assert!(e.is_not_found(), "{e}");
    // A cgroup with a process may not enable controllers for children (the no-internal-process rule): EBUSY.
    let leaf = kp.child("busy").unwrap();
    fs.create(&leaf).unwrap();
    let mut child = spawn_in(&fs.dir(&leaf), "sleep 600");
    let e = fs.enable_controllers(&leaf, &["memory"]).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(16), "EBUSY expected: {e}");
    let _ = child.kill();
    let _ = child.wait();
    // Nothing outside the root is ever written.
    let outside = CgroupPath::parse("/nwtest-outside").unwrap();
    assert!(fs.create(&outside).is_err());
    assert!(!Path::new(MOUNT).join("nwtest-outside").exists());
}

#[test]
fn observations_see_what_pods_use() {
    if !cgroup2_available() {
        return;
    }
    let root = Root::new("observe");
    let mut m = manager(&root);
    m.place(&pod("w1", json!([{"name": "writer"}]))).unwrap();
    let before = m.observe().unwrap();
    // 32 MiB written to tmpfs stay charged to the writer's cgroup (as shmem) after it exits.
    let file = format!("/dev/shm/nwtest-observe-{}", std::process::id());
    let dir = root.dir().join("kubepods/besteffort/podw1/writer");
    let status = spawn_in(&dir, &format!("dd if=/dev/zero of={file} bs=1M count=32 status=none")).wait().unwrap();
    assert!(status.success());
    let after = m.observe().unwrap();
    let grown = after.kubepods_working_set.saturating_sub(before.kubepods_working_set);
    let usage = m.pod_usage();
    let _ = std::fs::remove_file(&file);
    assert!(grown >= 30 * MIB, "kubepods working set grew by {grown} bytes only");
    assert!(after.memory.available <= after.memory.mem_available);
    assert!(after.pids.is_some_and(|p| p.available > 0) && after.nodefs.is_some_and(|f| f.capacity_bytes > 0));
    let psi = m.view().pressure_stall();
    assert!(psi.memory.is_some() && psi.kubepods_memory.is_some(), "the VM kernel has PSI: {psi:?}");
    assert_eq!(usage.len(), 1);
    assert!(usage[0].memory_working_set >= 30 * MIB, "pod working set {}", usage[0].memory_working_set);
}
