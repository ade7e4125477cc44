//! `placement`: the time to place a pod (admission, its cgroup and its container's, their limits) and to release
//! it, under each cgroup driver: cgroupfs (directories and file writes) against systemd (a transient slice per pod
//! and per container over D-Bus, with the limits as properties, then the same file writes). Run in the VM booted
//! with systemd as PID 1 (`bench/run placement`). Both drivers run in the same boot, one after the other, through
//! the resources library the daemon uses; the pods are Burstable with one container, as most are.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use nodewarden_resources::{
    CgroupDriver, CgroupFs, CgroupPath, HostPaths, Ledger, REQUIRED_CONTROLLERS, ResourceConfig, ResourceManager,
    Units, systemd,
};
use nodewarden_systemd::SystemdSlices;
use nodewarden_testkit::{median, remove_tree, worst};

/// The times of one run: per pod, placed one after the other, in milliseconds; and all pods placed at once
/// through the ledger, as the pod workers place them, in milliseconds for all.
struct Run {
    place: Vec<f64>,
    release: Vec<f64>,
    at_once: f64,
}

fn pod(i: usize) -> Result<k8s_openapi::api::core::v1::Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("bench-{i}"), "namespace": "default", "uid": format!("bench-{i:04}")},
        "spec": {"containers": [{"name": "app", "resources": {
            "requests": {"cpu": "5m", "memory": "2Mi"}, "limits": {"memory": "16Mi"}}}]}
    }))?)
}

fn one_run(driver: CgroupDriver, pods: usize, units: Option<&Arc<SystemdSlices>>) -> Result<Run> {
    let (root, units) = match (driver, units) {
        (CgroupDriver::Cgroupfs, _) => (CgroupPath::parse("/nwbench-cgroupfs")?, None),
        (CgroupDriver::Systemd, Some(u)) => (systemd::root_path(&CgroupPath::parse("/nwbench")?)?, Some(u.clone())),
        (CgroupDriver::Systemd, None) => bail!("the systemd driver needs its connection"),
    };
    let fs = CgroupFs::new("/sys/fs/cgroup", root.clone());
    // As the daemon does: under cgroupfs the controllers a systemd host has not enabled above the root are
    // enabled; under systemd the slices' properties have systemd enable them.
    if driver == CgroupDriver::Cgroupfs {
        fs.enable_above_scope(&REQUIRED_CONTROLLERS).context("cannot enable the controllers above the root")?;
    }
    let config = ResourceConfig { cgroup_driver: driver, ..ResourceConfig::new(root.clone()) };
    let mut m = ResourceManager::new(fs, HostPaths::default(), config)?;
    if let Some(u) = &units {
        m = m.with_units(u.clone());
    }
    m.setup()?;
    let mut run = Run { place: Vec::new(), release: Vec::new(), at_once: 0.0 };
    for i in 0..pods {
        let p = pod(i)?;
        let t0 = Instant::now();
        m.place(&p)?;
        run.place.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    for i in 0..pods {
        let t0 = Instant::now();
        m.release(&format!("bench-{i:04}"))?;
        run.release.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    run.at_once = at_once(Ledger::new(m), pods)?;
    match &units {
        Some(u) => u.stop(&systemd::slice_unit(&systemd::root_parts(&root)?))?,
        None => remove_tree(&root),
    }
    Ok(run)
}

/// Places `pods` pods at once through the ledger (each a task, as pod workers are; their cgroups written
/// [`nodewarden_resources::MAX_WRITES`] at a time) and returns the milliseconds until all are placed; then
/// releases them.
fn at_once(ledger: Ledger, pods: usize) -> Result<f64> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let all = (0..pods).map(pod).collect::<Result<Vec<_>>>()?;
    let t0 = Instant::now();
    runtime.block_on(async {
        let placing: Vec<_> = all
            .into_iter()
            .map(|p| {
                let ledger = ledger.clone();
                tokio::spawn(async move { ledger.place(p).await })
            })
            .collect();
        for p in placing {
            p.await??;
        }
        anyhow::Ok(())
    })?;
    let took = t0.elapsed().as_secs_f64() * 1000.0;
    for i in 0..pods {
        ledger.call_blocking(move |m| m.release(&format!("bench-{i:04}")))?;
    }
    Ok(took)
}

/// Places and releases `pods` pods `runs` times under each driver and writes the table to `out`.
pub fn run(pods: usize, runs: usize, out: &Path) -> Result<()> {
    let units = Arc::new(SystemdSlices::connect().context("the placement benchmark runs under systemd as PID 1")?);
    let drivers = [CgroupDriver::Cgroupfs, CgroupDriver::Systemd];
    let mut results: Vec<(CgroupDriver, Vec<Run>)> = drivers.iter().map(|d| (*d, Vec::new())).collect();
    for r in 0..runs {
        // The drivers take turns, so that a slow stretch of the emulated machine falls on both.
        for (driver, done) in &mut results {
            let run = one_run(*driver, pods, Some(&units))?;
            eprintln!(
                "run {r} {driver:?}: place median {:.2} ms, {pods} at once {:.0} ms",
                median(run.place.clone()),
                run.at_once
            );
            done.push(run);
        }
    }
    let mut md = format!(
        "# Placing a pod under each cgroup driver\n\n{pods} Burstable pods with one container placed and then released \
         through the resources library, {runs} runs per driver taking turns in one VM boot with systemd {} as PID 1 \
         (TCG, 2 vCPUs). Per pod: the median of the runs' medians, and the worst single pod of all runs. At once: \
         the same pods placed together through the ledger, each a task as pod workers are (under systemd their slices made \
         {} at a time, outside the ledger's turn), until the last is placed: median (worst) of the runs.\n\n\
         | driver | place, median | place, worst | release, median | release, worst | {pods} at once | at once ÷ \
         one after the other |\n|---|---|---|---|---|---|---|\n",
        units.version(),
        nodewarden_resources::MAX_WRITES
    );
    let mut medians = Vec::new();
    for (driver, done) in &results {
        let place = median(done.iter().map(|r| median(r.place.clone())).collect());
        let release = median(done.iter().map(|r| median(r.release.clone())).collect());
        let place_worst = worst(&done.iter().flat_map(|r| r.place.clone()).collect::<Vec<_>>());
        let release_worst = worst(&done.iter().flat_map(|r| r.release.clone()).collect::<Vec<_>>());
        let at_once = done.iter().map(|r| r.at_once).collect::<Vec<_>>();
        let (at_once_median, at_once_worst) = (median(at_once.clone()), worst(&at_once));
        #[expect(clippy::cast_precision_loss, reason = "a pod count")]
        let serial = place * pods as f64;
        md.push_str(&format!(
            "| {driver:?} | {place:.2} ms | {place_worst:.2} ms | {release:.2} ms | {release_worst:.2} ms | \
             {at_once_median:.0} ms ({at_once_worst:.0}) | {:.2} |\n",
            at_once_median / serial
        ));
        medians.push(place);
    }
    if let [cgroupfs, systemd] = medians[..] {
        md.push_str(&format!(
            "\nThe systemd driver takes {:.1}× the time of cgroupfs to place a pod: two slices started over D-Bus \
             (the pod's and its container's), each waited for until its cgroup is there, and the QoS slice's new \
             weight set as a property, before the same file writes.\n",
            systemd / cgroupfs
        ));
    }
    std::fs::write(out, &md)?;
    print!("{md}");
    Ok(())
}
