//! The bare phase of `pods`: the reference the daemon's start of N pods is compared with. The same N containers
//! (busybox `sleep`) are started with no daemon running, by the bench itself, on as many threads as the guest has
//! CPUs: per pod, a pod cgroup with the cpu, memory and pids controllers enabled for its children (those the
//! parent offers), a container cgroup below it, the process spawned (`posix_spawn`, which returns once the program
//! is executing) and moved into the container cgroup, as a plain supervisor does. Nothing is parsed, admitted,
//! recorded or reported. The daemon creates each process in its cgroup (`clone3`), which spares it the move made
//! here, so the daemon's ratio to this start understates what its own work adds.

use std::process::{Child, Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use nodewarden_resources::{CgroupFs, CgroupPath};
use nodewarden_testkit::MOUNT;

use crate::{remove_tree, root};

/// The controllers a pod cgroup enables for its containers, those of them its parent offers.
const CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];

/// Makes `cg` and enables for its children those of [`CONTROLLERS`] it has (a write naming one it lacks would be
/// refused whole).
fn make_parent(fs: &CgroupFs, cg: &CgroupPath) -> Result<()> {
    fs.create(cg)?;
    let offered = fs.controllers(cg)?;
    let enable: Vec<&str> = CONTROLLERS.into_iter().filter(|c| offered.iter().any(|o| o == c)).collect();
    if !enable.is_empty() {
        fs.enable_controllers(cg, &enable)?;
    }
    Ok(())
}

/// Starts pod `i`'s container below `base`: returns the running process.
fn start_one(fs: &CgroupFs, base: &CgroupPath, i: usize) -> Result<Child> {
    let pod = base.child(&format!("pod{i}"))?;
    make_parent(fs, &pod)?;
    let app = pod.child("app")?;
    fs.create(&app)?;
    let mut child = Command::new("busybox")
        .args(["sleep", "100000"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot spawn busybox (Debian package busybox)")?;
    if let Err(e) = fs.add_proc(&app, child.id()) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e.into());
    }
    Ok(child)
}

/// Starts `n` containers as described above and returns the seconds from the first `mkdir` to the last process
/// in its cgroup; then kills them and removes the tree. A thread stops at its first error; the error of the last
/// thread that met one is returned.
pub fn start(n: usize) -> Result<f64> {
    let fs = CgroupFs::new(MOUNT, root());
    let base = root().child("bare")?;
    remove_tree(&base);
    fs.enable_above_scope(&CONTROLLERS)?;
    make_parent(&fs, &root())?;
    make_parent(&fs, &base)?;
    // Busybox read once beforehand, as the daemon's start finds it after this phase: no run pays a cold cache.
    if !Command::new("busybox").arg("true").status().context("cannot run busybox (Debian package busybox)")?.success() {
        bail!("busybox true failed");
    }
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let t0 = Instant::now();
    // Each thread's processes, and the first error it met (it stops there).
    let started: Vec<(Vec<Child>, Result<()>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (fs, base) = (&fs, &base);
                s.spawn(move || {
                    let mut children = Vec::new();
                    for i in (t..n).step_by(threads) {
                        match start_one(fs, base, i) {
                            Ok(c) => children.push(c),
                            Err(e) => return (children, Err(e)),
                        }
                    }
                    (children, Ok(()))
                })
            })
            .collect();
        let joined = handles.into_iter().map(|h| h.join());
        joined.map(|r| r.unwrap_or_else(|_| (Vec::new(), Err(anyhow::anyhow!("a start thread panicked"))))).collect()
    });
    let seconds = t0.elapsed().as_secs_f64();
    let mut outcome = Ok(seconds);
    for (children, result) in started {
        for mut c in children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Err(e) = result {
            outcome = Err(e);
        }
    }
    remove_tree(&base);
    outcome
}
