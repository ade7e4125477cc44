use super::*;
use crate::parse::{CpuMax, Limit};
use crate::quantity::Amount;
use crate::testing::FakeHost;
use serde_json::json;

const MIB: u64 = 1 << 20;

fn config() -> ResourceConfig {
    ResourceConfig {
        cgroup_root: CgroupPath::parse("/nw").unwrap(),
        enforce_pods: true,
        system_reserved: Reserved { memory: 100 * MIB, cpu_millis: 100, pids: 1000, ephemeral_storage: 0 },
        kube_reserved: Reserved { memory: 24 * MIB, ..Reserved::default() },
        eviction_reserve: EvictionReserve {
            memory_available: Some(Amount::Quantity(100 * MIB)),
            nodefs_available: None,
        },
        max_pods: 3,
        pod_pids_limit: Some(256),
        cpu_cfs_quota: true,
        cpu_cfs_period_us: 100_000,
        memory_qos: true,
        memory_throttling_factor: 0.9,
        static_pods_critical: false,
        container_cgroups: true,
        cgroup_driver: CgroupDriver::Cgroupfs,
    }
}

fn manager(f: &FakeHost) -> ResourceManager {
    let fs = CgroupFs::emulated(f.cgroup_mount(), CgroupPath::parse("/nw").unwrap());
    let mut m = ResourceManager::new(fs, f.host(), config()).unwrap();
    m.setup().unwrap();
    m
}

fn pod(uid: &str, containers: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("p-{uid}"), "namespace": "ns", "uid": uid},
        "spec": {"containers": containers}
    }))
    .unwrap()
}

fn guaranteed(uid: &str, mem: &str) -> Pod {
    pod(uid, json!([{"name": "app", "resources": {"limits": {"cpu": "500m", "memory": mem}}}]))
}

fn read(f: &FakeHost, rel: &str) -> String {
    std::fs::read_to_string(f.cgroup_mount().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}")).trim().to_owned()
}

#[test]
fn setup_enforces_allocatable_on_kubepods() {
    let f = FakeHost::new();
    let m = manager(&f);
    // capacity 1024Mi − (100Mi + 24Mi) reserved = 900Mi enforced; reported subtracts the 100Mi threshold too.
    assert_eq!(read(&f, "nw/kubepods/memory.max"), (900 * MIB).to_string());
    assert_eq!(m.allocatable().reported.memory, 800 * MIB);
    assert_eq!(read(&f, "nw/kubepods/pids.max"), "31768");
    assert_eq!(read(&f, "nw/kubepods/cpu.weight"), qos::shares_to_weight(qos::cpu_shares(1900)).to_string());
    assert_eq!(read(&f, "nw/kubepods/besteffort/cpu.weight"), "1");
    assert!(read(&f, "nw/kubepods/cgroup.subtree_control").contains("+memory"));
    assert!(read(&f, "nw/cgroup.subtree_control").contains("+pids"));
}

#[test]
fn places_each_class_where_the_kubelet_does() {
    let f = FakeHost::new();
    let mut m = manager(&f);
    let g = m.place(&guaranteed("g1", "128Mi")).unwrap();
    assert_eq!(g.cgroup.as_str(), "/nw/kubepods/podg1");
    assert_eq!(read(&f, "nw/kubepods/podg1/memory.max"), (128 * MIB).to_string());
    assert_eq!(read(&f, "nw/kubepods/podg1/cpu.max"), "50000 100000");
    assert_eq!(read(&f, "nw/kubepods/podg1/pids.max"), "256");
    assert_eq!(read(&f, "nw/kubepods/podg1/memory.swap.max"), "0", "pods do not swap");
    assert_eq!(read(&f, "nw/kubepods/podg1/app/memory.max"), (128 * MIB).to_string());
    assert_eq!(g.containers[0].oom_score_adj, -997);

    let b = m
        .place(&pod("b1", json!([{"name": "w", "resources": {"requests": {"cpu": "250m", "memory": "100Mi"}, "limits": {"memory": "200Mi"}}}])))
        .unwrap();
    assert_eq!(b.qos, QosClass::Burstable);
    assert_eq!(read(&f, "nw/kubepods/burstable/podb1/w/memory.high"), (190 * MIB).to_string());
    assert_eq!(read(&f, "nw/kubepods/burstable/podb1/w/memory.min"), (100 * MIB).to_string());
    assert_eq!(read(&f, "nw/kubepods/burstable/podb1/w/cpu.max"), "max 100000");
    assert_eq!(read(&f, "nw/kubepods/burstable/cpu.weight"), qos::shares_to_weight(256).to_string());
    assert_eq!(read(&f, "nw/kubepods/burstable/memory.min"), (100 * MIB).to_string());
    assert_eq!(read(&f, "nw/kubepods/memory.min"), (228 * MIB).to_string());

    let e = m.place(&pod("e1", json!([{"name": "batch"}]))).unwrap();
    assert_eq!(e.cgroup.as_str(), "/nw/kubepods/besteffort/pode1");
    assert_eq!(read(&f, "nw/kubepods/besteffort/pode1/memory.max"), "max");
    assert_eq!(e.containers[0].oom_score_adj, 1000);
    let counts: Vec<(QosClass, usize)> = m.view().pods_by_qos().into_iter().collect();
    assert_eq!(counts, [(QosClass::Guaranteed, 1), (QosClass::Burstable, 1), (QosClass::BestEffort, 1)]);
    m.release("g1").unwrap();
    assert_eq!(m.view().pods_by_qos()[&QosClass::Guaranteed], 0, "a class without pods is still counted");
}

#[test]
fn for_a_cri_runtime_only_the_pod_cgroup_is_made() {
    let f = FakeHost::new();
    let fs = CgroupFs::emulated(f.cgroup_mount(), CgroupPath::parse("/nw").unwrap());
    let mut m = ResourceManager::new(fs, f.host(), ResourceConfig { container_cgroups: false, ..config() }).unwrap();
    m.setup().unwrap();
    let g = m.place(&guaranteed("g1", "128Mi")).unwrap();
    assert_eq!(read(&f, "nw/kubepods/podg1/memory.max"), (128 * MIB).to_string());
    assert!(!f.cgroup_mount().join("nw/kubepods/podg1/app").exists(), "containerd makes the container cgroups");
    // The container's limits are still computed, for the runtime to apply.
    assert_eq!(g.containers[0].limits.memory_max, Limit::Value(128 * MIB));
    assert_eq!(g.containers[0].cpu_shares, 512);
    m.release("g1").unwrap();
    assert!(!f.cgroup_mount().join("nw/kubepods/podg1").exists());
}

#[test]
fn admission_refuses_with_kubelet_reasons() {
    let f = FakeHost::new();
    let mut m = manager(&f);
    m.place(&guaranteed("a", "700Mi")).unwrap();
    let err = m.place(&guaranteed("b", "200Mi")).unwrap_err();
    let PlaceError::Admit(a) = err else { panic!("expected an admission error, got {err}") };
    assert_eq!(a.reason(), "OutOfmemory");
    assert_eq!(
        a,
        AdmitError::Insufficient { resource: "memory", requested: 200 * MIB, used: 700 * MIB, allocatable: 800 * MIB }
    );
    assert!(!f.cgroup_mount().join("nw/kubepods/podb").exists(), "a refused pod leaves no cgroup");
    // Re-placing an admitted pod is not counted against itself.
    m.place(&guaranteed("a", "700Mi")).unwrap();
    m.place(&pod("c", json!([{"name": "x"}]))).unwrap();
    m.place(&pod("d", json!([{"name": "x"}]))).unwrap();
    let err = m.place(&pod("e", json!([{"name": "x"}]))).unwrap_err();
    assert!(matches!(err, PlaceError::Admit(ref a) if a.reason() == "OutOfpods"), "{err}");
    let cpu = m.admit(&pod("f", json!([{"name": "x", "resources": {"requests": {"cpu": "3"}}}])));
    assert!(matches!(cpu, Err(AdmitError::TooManyPods { .. })));
    // A pod being terminated no longer counts, so its replacement fits.
    m.set_terminating("a");
    m.set_terminating("c");
    m.place(&guaranteed("b", "200Mi")).unwrap();
    m.release("a").unwrap();
    assert!(m.admit(&guaranteed("a2", "500Mi")).is_ok(), "released pods are not counted");
}

#[test]
fn hostile_names_never_become_paths() {
    let f = FakeHost::new();
    let mut m = manager(&f);
    for uid in ["../../etc", "a/b", "", "x\0y"] {
        let err = m.place(&guaranteed(uid, "1Mi")).unwrap_err();
        assert!(matches!(err, PlaceError::Admit(AdmitError::Uid(_))), "{uid:?}: {err}");
    }
    let err = m.place(&pod("ok", json!([{"name": "../escape"}]))).unwrap_err();
    assert!(matches!(err, PlaceError::Admit(AdmitError::Spec(_))), "{err}");
    assert_eq!(m.placements().count(), 0);
}

#[test]
fn release_removes_cgroups_and_refuses_while_busy() {
    let f = FakeHost::new();
    let mut m = manager(&f);
    m.place(&guaranteed("r1", "10Mi")).unwrap();
    std::fs::write(f.cgroup_mount().join("nw/kubepods/podr1/app/cgroup.procs"), "4242\n").unwrap();
    let err = m.release("r1").unwrap_err();
    assert!(matches!(err, PlaceError::Busy { ref pids, .. } if pids == &[4242]), "{err}");
    assert!(m.placement("r1").is_some(), "a busy pod stays in the ledger");
    std::fs::write(f.cgroup_mount().join("nw/kubepods/podr1/app/cgroup.procs"), "").unwrap();
    // A runtime's own nested cgroups below the pod are removed with it; a process there keeps the pod busy.
    std::fs::create_dir_all(f.cgroup_mount().join("nw/kubepods/podr1/sandbox/inner")).unwrap();
    std::fs::write(f.cgroup_mount().join("nw/kubepods/podr1/sandbox/inner/cgroup.procs"), "77\n").unwrap();
    assert!(matches!(m.release("r1"), Err(PlaceError::Busy { ref pids, .. }) if pids == &[77]));
    std::fs::write(f.cgroup_mount().join("nw/kubepods/podr1/sandbox/inner/cgroup.procs"), "").unwrap();
    m.release("r1").unwrap();
    assert!(!f.cgroup_mount().join("nw/kubepods/podr1").exists());
    assert!(matches!(m.release("r1"), Err(PlaceError::NotPlaced(_))));
}

#[test]
fn failed_placement_removes_what_it_created() {
    let f = FakeHost::new();
    let mut m = manager(&f);
    // A cgroup file that cannot be written: b's memory.max is a directory.
    std::fs::create_dir_all(f.cgroup_mount().join("nw/kubepods/podx/b/memory.max")).unwrap();
    let p = pod(
        "x",
        json!([{"name": "a", "resources": {"limits": {"cpu": "500m", "memory": "1Mi"}}}, {"name": "b", "resources": {"limits": {"cpu": "500m", "memory": "1Mi"}}}]),
    );
    let err = m.place(&p).unwrap_err();
    assert!(matches!(err, PlaceError::Cgroup { .. }), "{err}");
    assert!(err.to_string().contains("memory.max"), "{err}");
    assert!(
        !f.cgroup_mount().join("nw/kubepods/podx/a").exists(),
        "container a was created by the failed call and removed"
    );
    assert!(m.placement("x").is_none());
}

#[test]
fn update_rewrites_limits_and_refuses_class_changes() {
    let f = FakeHost::new();
    let mut m = manager(&f);
    assert!(matches!(m.update(&guaranteed("u", "10Mi")), Err(PlaceError::NotPlaced(_))));
    m.place(&guaranteed("u", "10Mi")).unwrap();
    m.update(&guaranteed("u", "20Mi")).unwrap();
    assert_eq!(read(&f, "nw/kubepods/podu/memory.max"), (20 * MIB).to_string());
    let err = m.update(&pod("u", json!([{"name": "app"}]))).unwrap_err();
    assert!(
        matches!(err, PlaceError::QosChanged { from: QosClass::Guaranteed, to: QosClass::BestEffort, .. }),
        "{err}"
    );
}

#[test]
fn a_new_manager_adopts_existing_pods() {
    let f = FakeHost::new();
    let mut m = manager(&f);
    m.place(&guaranteed("g", "64Mi")).unwrap();
    m.place(&pod("b", json!([{"name": "w", "resources": {"requests": {"cpu": "1", "memory": "100Mi"}}}]))).unwrap();
    m.place(&pod("e", json!([{"name": "x"}]))).unwrap();
    std::fs::create_dir_all(f.cgroup_mount().join("nw/kubepods/not-a-pod")).unwrap();
    drop(m);

    let fs = CgroupFs::emulated(f.cgroup_mount(), CgroupPath::parse("/nw").unwrap());
    let mut m2 = ResourceManager::new(fs, f.host(), config()).unwrap();
    let mut adopted = m2.setup().unwrap();
    adopted.sort();
    assert_eq!(adopted, ["b", "e", "g"]);
    let g = m2.placement("g").unwrap();
    assert!(g.adopted);
    assert_eq!(g.qos, QosClass::Guaranteed);
    assert_eq!(g.limits.memory_max, Limit::Value(64 * MIB));
    assert_eq!(g.limits.cpu_max, CpuMax { quota: Some(50_000), period: 100_000 });
    assert_eq!(g.containers.len(), 1);
    assert_eq!(g.memory_request, 64 * MIB, "memory.min carries the request");
    let b = m2.placement("b").unwrap();
    assert_eq!(b.qos, QosClass::Burstable);
    assert!((1000..=1026).contains(&b.cpu_request), "cpu request inferred from cpu.weight: {}", b.cpu_request);
    // Adopted pods count against maxPods: a fourth pod is refused.
    assert!(matches!(m2.admit(&pod("z", json!([{"name": "x"}]))), Err(AdmitError::TooManyPods { used: 3, max: 3 })));
    // Placing an adopted pod from its spec replaces the inferred entry.
    assert!(!m2.place(&guaranteed("g", "64Mi")).unwrap().adopted);
}

#[test]
fn observation_reads_kubepods_and_pod_usage_skips_vanished_pods() {
    let f = FakeHost::new();
    let mut m = manager(&f);
    m.place(&guaranteed("o", "10Mi")).unwrap();
    std::fs::write(f.cgroup_mount().join("nw/kubepods/memory.current"), "5000").unwrap();
    std::fs::write(f.cgroup_mount().join("nw/kubepods/memory.stat"), "anon 4000\ninactive_file 1000\n").unwrap();
    std::fs::write(f.cgroup_mount().join("nw/kubepods/podo/memory.current"), "1000").unwrap();
    std::fs::write(f.cgroup_mount().join("nw/kubepods/podo/memory.stat"), "inactive_file 100\n").unwrap();
    std::fs::write(f.cgroup_mount().join("nw/kubepods/podo/pids.current"), "2").unwrap();
    let obs = m.observe().unwrap();
    assert_eq!(obs.kubepods_working_set, 4000);
    assert_eq!(obs.memory.available, 524_288 * 1024, "the kubelet view (MemFree) is below MemAvailable here");
    let usage = m.pod_usage();
    assert_eq!(usage.len(), 1);
    assert_eq!(usage[0].memory_working_set, 900);
    std::fs::remove_file(f.cgroup_mount().join("nw/kubepods/podo/memory.current")).unwrap();
    assert!(m.pod_usage().is_empty());
    std::fs::remove_file(f.cgroup_mount().join("nw/kubepods/memory.current")).unwrap();
    assert!(m.observe().is_err(), "an unreadable kubepods cgroup fails the pass");
}

#[test]
fn eviction_candidates_carry_what_eviction_ranks_by() {
    let f = FakeHost::new();
    let mut m = manager(&f);
    let burstable: Pod = serde_json::from_value(json!({
        "metadata": {"name": "w", "uid": "w", "annotations": {"kubernetes.io/config.source": "file"}},
        "spec": {
            "priority": 7,
            "terminationGracePeriodSeconds": i64::MAX,
            "containers": [{"name": "a", "resources": {"requests": {"memory": "10Mi", "ephemeral-storage": "1Gi"}}}],
        }
    }))
    .unwrap();
    m.place(&burstable).unwrap();
    m.place(&guaranteed("g", "10Mi")).unwrap();
    for uid in ["w", "g"] {
        let dir = f.cgroup_mount().join(format!("nw/kubepods/{}pod{uid}", if uid == "w" { "burstable/" } else { "" }));
        std::fs::write(dir.join("memory.current"), "1000").unwrap();
        std::fs::write(dir.join("memory.stat"), "inactive_file 100\n").unwrap();
        std::fs::write(dir.join("pids.current"), "3").unwrap();
    }
    let mut found = m.view().eviction_candidates();
    found.sort_by(|a, b| a.placement.uid.cmp(&b.placement.uid));
    assert_eq!(found.iter().map(|c| c.placement.uid.as_str()).collect::<Vec<_>>(), ["g", "w"]);
    let w = &found[1];
    assert_eq!(w.placement.pod, "default/w");
    assert_eq!((w.placement.priority, w.placement.memory_request), (7, 10 * MIB));
    assert_eq!(w.placement.ephemeral_request, 1 << 30);
    assert_eq!(w.placement.grace_period, crate::pod::MAX_GRACE_PERIOD, "saturated, not wrapped");
    assert_eq!((w.usage.memory_working_set, w.usage.pids), (900, 3));
    assert!(w.placement.is_static && !w.critical, "static pods are critical only under the kubelet's rule");
    assert!(w.placement.is_critical(true));
    // A pod being terminated is no candidate; nor is one adopted from a cgroup whose spec was not seen yet.
    m.set_terminating("g");
    assert_eq!(m.view().eviction_candidates().len(), 1);
    drop(m);
    let fs = CgroupFs::emulated(f.cgroup_mount(), CgroupPath::parse("/nw").unwrap());
    let mut m2 = ResourceManager::new(fs, f.host(), config()).unwrap();
    m2.setup().unwrap();
    assert!(m2.view().eviction_candidates().is_empty());
}

/// systemd as the systemd driver sees it: starting a slice makes its cgroup, stopping one removes it; every call
/// is recorded.
#[derive(Debug)]
struct FakeSystemd {
    fs: CgroupFs,
    calls: std::sync::Mutex<Vec<String>>,
    /// Starting a unit whose name contains this fails.
    refuse: std::sync::Mutex<Option<&'static str>>,
    /// Starting a unit whose name contains this waits until the receiver hears (a slow or hung systemd).
    hold: std::sync::Mutex<Option<(&'static str, std::sync::mpsc::Receiver<()>)>>,
}

impl Units for FakeSystemd {
    fn start_slice(&self, unit: &str, limits: &UnitLimits) -> Result<(), UnitError> {
        self.calls.lock().unwrap().push(format!("start {unit} {limits:?}"));
        let held = self.hold.lock().unwrap().take_if(|(marker, _)| unit.contains(*marker));
        if let Some((_, release)) = held {
            release.recv().unwrap();
        }
        if self.refuse.lock().unwrap().is_some_and(|r| unit.contains(r)) {
            return Err(UnitError { unit: unit.to_owned(), reason: "refused by the test".into() });
        }
        let cg = crate::systemd::slice_path(unit).unwrap();
        if !self.fs.exists(&cg) {
            self.fs.create(&cg).unwrap();
        }
        Ok(())
    }
    fn set_limits(&self, unit: &str, limits: &UnitLimits) -> Result<(), UnitError> {
        self.calls.lock().unwrap().push(format!("set {unit} {limits:?}"));
        Ok(())
    }
    fn stop(&self, unit: &str) -> Result<(), UnitError> {
        self.calls.lock().unwrap().push(format!("stop {unit}"));
        let cg = crate::systemd::slice_path(unit).unwrap();
        for c in self.fs.subtree(&cg).unwrap_or_default() {
            self.fs.remove(&c).unwrap();
        }
        Ok(())
    }
}

fn systemd_manager(f: &FakeHost) -> (ResourceManager, Arc<FakeSystemd>) {
    let root = CgroupPath::root();
    let units = Arc::new(FakeSystemd {
        fs: CgroupFs::emulated(f.cgroup_mount(), root.clone()),
        calls: std::sync::Mutex::default(),
        refuse: std::sync::Mutex::default(),
        hold: std::sync::Mutex::default(),
    });
    let config = ResourceConfig { cgroup_root: root.clone(), cgroup_driver: CgroupDriver::Systemd, ..config() };
    let fs = CgroupFs::emulated(f.cgroup_mount(), root);
    let mut m = ResourceManager::new(fs, f.host(), config).unwrap().with_units(units.clone());
    m.setup().unwrap();
    (m, units)
}

#[test]
fn the_systemd_driver_places_pods_in_slices_named_as_the_kubelet_names_them() {
    let f = FakeHost::new();
    let (mut m, units) = systemd_manager(&f);
    assert_eq!(m.tree().kubepods.as_str(), "/kubepods.slice");
    assert_eq!(read(&f, "kubepods.slice/memory.max"), (900 * MIB).to_string(), "the files are written too");
    assert_eq!(read(&f, "kubepods.slice/kubepods-besteffort.slice/cpu.weight"), "1");
    let calls = units.calls.lock().unwrap().clone();
    assert!(calls[0].starts_with("start kubepods.slice") && calls[0].contains("memory_max: Some(Value(943718400))"));
    assert!(
        calls.iter().any(|c| c.starts_with("start kubepods-besteffort.slice") && c.contains("cpu_weight: Some(1)"))
    );

    let g = m.place(&guaranteed("0a-1b", "128Mi")).unwrap();
    assert_eq!(g.cgroup.as_str(), "/kubepods.slice/kubepods-pod0a_1b.slice");
    assert_eq!(read(&f, "kubepods.slice/kubepods-pod0a_1b.slice/memory.max"), (128 * MIB).to_string());
    // The container's cgroup is a slice of its own inside the pod's, so systemd keeps its controllers.
    assert_eq!(g.containers[0].cgroup.as_str(), "/kubepods.slice/kubepods-pod0a_1b.slice/kubepods-pod0a_1b-app.slice");
    assert_eq!(
        read(&f, "kubepods.slice/kubepods-pod0a_1b.slice/kubepods-pod0a_1b-app.slice/memory.max"),
        (128 * MIB).to_string()
    );
    let b = m
        .place(&pod("b1", json!([{"name": "w", "resources": {"requests": {"cpu": "250m", "memory": "100Mi"}}}])))
        .unwrap();
    assert_eq!(b.cgroup.as_str(), "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podb1.slice");
    let calls = units.calls.lock().unwrap().clone();
    let start = calls.iter().find(|c| c.starts_with("start kubepods-pod0a_1b.slice")).unwrap();
    assert!(start.contains("memory_max: Some(Value(134217728))") && start.contains("quota: Some(50000)"), "{start}");
    // The burstable slice's weight follows its pods, as a property and in the file.
    let weight = qos::shares_to_weight(qos::cpu_shares(250));
    let set = calls.iter().rev().find(|c| c.starts_with("set kubepods-burstable.slice")).unwrap();
    assert!(set.contains(&format!("cpu_weight: Some({weight})")), "{calls:?}");
    assert_eq!(read(&f, "kubepods.slice/kubepods-burstable.slice/cpu.weight"), weight.to_string());

    // A restart adopts the slices; a release stops the pod's slice and nothing is left of it.
    let (mut again, units) = systemd_manager(&f);
    let mut adopted = again.placements().map(|p| p.uid.clone()).collect::<Vec<_>>();
    adopted.sort();
    assert_eq!(adopted, ["0a-1b", "b1"]);
    let containers: Vec<&str> = again.placement("0a-1b").unwrap().containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(containers, ["app"], "the container slice read back as its container");
    again.release("0a-1b").unwrap();
    assert!(units.calls.lock().unwrap().iter().any(|c| c == "stop kubepods-pod0a_1b.slice"));
    assert!(!f.cgroup_mount().join("kubepods.slice/kubepods-pod0a_1b.slice").exists());

    // A UID with an underscore could not be read back from its slice's name.
    let err = again.place(&guaranteed("a_b", "64Mi")).unwrap_err();
    assert!(err.to_string().contains("'_'"), "{err}");
}

#[test]
fn the_systemd_driver_is_refused_without_a_way_to_systemd() {
    let f = FakeHost::new();
    let config = ResourceConfig { cgroup_driver: CgroupDriver::Systemd, ..config() };
    let fs = CgroupFs::emulated(f.cgroup_mount(), CgroupPath::parse("/nw.slice").unwrap());
    let err = ResourceManager::new(fs, f.host(), config).unwrap().setup().unwrap_err();
    assert!(err.to_string().contains("no connection to systemd"), "{err}");
}

#[test]
fn a_node_that_shuts_down_refuses_new_pods_and_keeps_those_it_has() {
    let f = FakeHost::new();
    let mut m = manager(&f);
    m.place(&guaranteed("g1", "64Mi")).unwrap();
    m.set_shutting_down(true);
    let err = m.admit(&guaranteed("g2", "64Mi")).unwrap_err();
    assert_eq!(
        (err.reason(), err.to_string().as_str()),
        ("NodeShutdown", "Pod was rejected as the node is shutting down.")
    );
    assert!(m.admit(&guaranteed("g1", "64Mi")).is_ok(), "a placed pod is admitted again");
    m.set_shutting_down(false);
    assert!(m.admit(&guaranteed("g2", "64Mi")).is_ok(), "a cancelled shutdown admits again");
}

#[test]
fn a_slice_systemd_refuses_undoes_the_placement() {
    let f = FakeHost::new();
    let (mut m, units) = systemd_manager(&f);
    *units.refuse.lock().unwrap() = Some("-app.slice");
    let err = m.place(&guaranteed("g1", "64Mi")).unwrap_err();
    assert!(err.to_string().contains("refused by the test"), "{err}");
    // The refused container slice (recorded before it was asked for) and the pod's slice, started before it, are
    // stopped again; the ledger has nothing.
    let calls = units.calls.lock().unwrap().clone();
    let stops: Vec<&String> = calls.iter().filter(|c| c.starts_with("stop")).collect();
    assert_eq!(stops, ["stop kubepods-podg1-app.slice", "stop kubepods-podg1.slice"], "{calls:?}");
    assert!(!f.cgroup_mount().join("kubepods.slice/kubepods-podg1.slice").exists());
    assert!(m.placement("g1").is_none());
    *units.refuse.lock().unwrap() = None;
    m.place(&guaranteed("g1", "64Mi")).unwrap();
    // A container name with an underscore could not be read back from its slice's name.
    let err = m.place(&pod("u1", json!([{"name": "a_b"}]))).unwrap_err();
    assert!(err.to_string().contains("'_'"), "{err}");
}

#[test]
fn a_lowered_allocatable_waits_for_the_pods_to_fit_before_it_is_written() {
    let f = FakeHost::new();
    let mut m = manager(&f);
    let kubepods = f.cgroup_mount().join("nw/kubepods");
    // The pods use 700Mi (page cache apart): more than the 500Mi a reload leaves them.
    std::fs::write(kubepods.join("memory.current"), (750 * MIB).to_string()).unwrap();
    std::fs::write(kubepods.join("memory.stat"), format!("anon {}\ninactive_file {}\n", 700 * MIB, 50 * MIB)).unwrap();
    let more =
        ResourceConfig { system_reserved: Reserved { memory: 500 * MIB, ..config().system_reserved }, ..config() };
    m.reconfigure(more.clone()).unwrap();
    assert_eq!(m.allocatable().enforced.memory, 500 * MIB, "admission and allocatableMemory.available see it at once");
    assert_eq!(read(&f, "nw/kubepods/memory.max"), (900 * MIB).to_string(), "not written under the pods' feet");
    assert_eq!(m.pending_memory_max(), Some(500 * MIB));
    assert!(!m.settle_memory_limit().unwrap(), "still too much in use");
    assert_eq!(read(&f, "nw/kubepods/memory.max"), (900 * MIB).to_string());
    // An eviction later the working set fits (the page cache above it is the kernel's to reclaim).
    std::fs::write(kubepods.join("memory.current"), (540 * MIB).to_string()).unwrap();
    std::fs::write(kubepods.join("memory.stat"), format!("anon {}\ninactive_file {}\n", 490 * MIB, 50 * MIB)).unwrap();
    assert!(m.settle_memory_limit().unwrap());
    assert_eq!(read(&f, "nw/kubepods/memory.max"), (500 * MIB).to_string());
    assert_eq!(m.pending_memory_max(), None);
    // A limit the pods fit under is written at once; so is a raised one, which also drops a pending one.
    m.reconfigure(config()).unwrap();
    assert_eq!(read(&f, "nw/kubepods/memory.max"), (900 * MIB).to_string());
    std::fs::write(kubepods.join("memory.stat"), format!("anon {}\ninactive_file 0\n", 700 * MIB)).unwrap();
    m.reconfigure(more).unwrap();
    assert_eq!(m.pending_memory_max(), Some(500 * MIB));
    m.reconfigure(config()).unwrap();
    assert_eq!(m.pending_memory_max(), None);
    assert_eq!(read(&f, "nw/kubepods/memory.max"), (900 * MIB).to_string());
}

#[test]
fn a_new_cgroup_is_not_given_the_values_it_has() {
    let f = FakeHost::new();
    let fs = CgroupFs::emulated(f.cgroup_mount(), CgroupPath::parse("/nw").unwrap());
    let limits = CgroupLimits {
        memory_max: Limit::Max,
        memory_min: None,
        memory_high: None,
        pids_max: Limit::Value(5),
        cpu_weight: 100,
        cpu_max: CpuMax { quota: None, period: 100_000 },
    };
    // Directories made behind the emulation's back, so that only what `apply` writes is there.
    for (name, new) in [("made", true), ("found", false)] {
        let cg = CgroupPath::parse(&format!("/nw/{name}")).unwrap();
        std::fs::create_dir_all(fs.dir(&cg)).unwrap();
        tree::apply(&fs, &cg, &limits, new).unwrap();
        let mut written: Vec<String> = std::fs::read_dir(fs.dir(&cg))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        written.sort();
        let want: &[&str] = if new { &["pids.max"] } else { &["cpu.max", "cpu.weight", "memory.max", "pids.max"] };
        assert_eq!(written, want, "new: {new}");
    }
}

#[test]
fn the_qos_parents_are_written_when_their_values_change_or_a_write_failed() {
    let f = FakeHost::new();
    let (mut m, units) = systemd_manager(&f);
    let sets = || units.calls.lock().unwrap().iter().filter(|c| c.starts_with("set kubepods-burstable.slice")).count();
    assert_eq!(sets(), 1, "the start sets them");
    m.place(&guaranteed("g1", "64Mi")).unwrap();
    assert_eq!(sets(), 2, "a Guaranteed pod's memory request changes kubepods' memory.min (Memory QoS)");
    m.place(&pod("e1", json!([{"name": "batch"}]))).unwrap();
    m.release("e1").unwrap();
    assert_eq!(sets(), 2, "a BestEffort pod changes nothing of theirs");
    let burstable = |uid: &str| pod(uid, json!([{"name": "w", "resources": {"requests": {"cpu": "250m"}}}]));
    m.place(&burstable("b1")).unwrap();
    assert_eq!(sets(), 3, "a Burstable pod's CPU request changes burstable's weight");
    let weight = qos::shares_to_weight(qos::cpu_shares(250)).to_string();
    assert_eq!(read(&f, "kubepods.slice/kubepods-burstable.slice/cpu.weight"), weight);

    // A write that failed is made again at the next placement, whatever it changes.
    m.release("g1").unwrap();
    let file = f.cgroup_mount().join("kubepods.slice/kubepods-burstable.slice/memory.min");
    std::fs::remove_file(&file).ok();
    std::fs::create_dir(&file).unwrap();
    m.place(&burstable("b2")).unwrap();
    std::fs::remove_dir(&file).unwrap();
    let before = sets();
    m.place(&pod("e2", json!([{"name": "batch"}]))).unwrap();
    assert_eq!(sets(), before + 1, "retried after the failed write");
    let weight = qos::shares_to_weight(qos::cpu_shares(500)).to_string();
    assert_eq!(read(&f, "kubepods.slice/kubepods-burstable.slice/cpu.weight"), weight);
    m.release("e2").unwrap();
    m.place(&pod("e3", json!([{"name": "batch"}]))).unwrap();
    assert_eq!(sets(), before + 1, "and not again once it held");

    // A reload that makes the tree again (allocatable changed) has the next placement write them again.
    let mut reloaded = m.config().clone();
    reloaded.system_reserved.memory += MIB;
    m.reconfigure(reloaded).unwrap();
    m.release("e3").unwrap();
    m.place(&pod("e4", json!([{"name": "batch"}]))).unwrap();
    assert_eq!(sets(), before + 2, "written again after the tree was made again");
}

/// `f`, which must not wait for a held slice.
async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(5), f).await.expect("held up by the slow slice")
}

/// Under the systemd driver a pod's slices are made outside the ledger's turn: a slice systemd is slow to start
/// holds up neither another pod's placement nor any other request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_slice_holds_up_no_other_placement() {
    let f = FakeHost::new();
    let (m, units) = systemd_manager(&f);
    let (release, held) = std::sync::mpsc::channel();
    *units.hold.lock().unwrap() = Some(("slow", held));
    let ledger = crate::Ledger::new(m);
    let slow = tokio::spawn({
        let ledger = ledger.clone();
        async move { ledger.place(guaranteed("slow", "64Mi")).await }
    });
    while !units.calls.lock().unwrap().iter().any(|c| c.contains("slow")) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let fast = within(ledger.place(guaranteed("fast", "64Mi"))).await;
    assert_eq!(fast.unwrap().uid, "fast");
    let count = within(ledger.call(|m| m.placements().count())).await.unwrap();
    assert_eq!(count, 2, "the ledger counts the pod being written");
    assert!(ledger.view().is_placed("fast") && !ledger.view().is_placed("slow"), "shown once written");
    // Admission counted the pod being written: with maxPods 3, a third pod fits and a fourth does not.
    within(ledger.place(guaranteed("third", "64Mi"))).await.unwrap();
    let fourth = within(ledger.place(guaranteed("fourth", "64Mi"))).await.unwrap_err();
    assert!(matches!(fourth, PlaceError::Admit(AdmitError::TooManyPods { .. })), "{fourth:?}");
    release.send(()).unwrap();
    assert_eq!(slow.await.unwrap().unwrap().uid, "slow");
    assert!(ledger.view().is_placed("slow"));
}

/// A write that fails takes the placement back: a new pod is gone from the ledger, a placed one keeps its limits.
#[test]
fn a_failed_write_takes_the_placement_back() {
    let f = FakeHost::new();
    let (mut m, units) = systemd_manager(&f);
    m.place(&guaranteed("kept", "64Mi")).unwrap();
    *units.refuse.lock().unwrap() = Some("pod");
    let pending = m.begin_place(&guaranteed("new", "64Mi")).unwrap();
    let written = pending.write();
    assert!(m.end_place(pending, written).is_err());
    assert!(m.placement("new").is_none() && !m.view().is_placed("new"));
    assert_eq!(m.admit(&guaranteed("again", "64Mi")).map(|_| ()), Ok(()), "the failed pod is not counted");
    let pending = m.begin_update(&guaranteed("kept", "128Mi")).unwrap();
    assert_eq!(m.placement("kept").unwrap().limits.memory_max, Limit::Value(128 * MIB), "recorded while written");
    let failed = CgroupError::from(NameError::Empty { what: "a test's write" });
    assert!(m.end_place(pending, Err(failed)).is_err());
    assert_eq!(m.placement("kept").unwrap().limits.memory_max, Limit::Value(64 * MIB), "the old limits kept");
}
