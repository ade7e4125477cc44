//! The bare phase of `pods`: the reference the daemon's start of N pods is compared with. The same N containers
//! (busybox `sleep`) are started with no daemon running, by the bench itself, on as many threads as the guest has
//! CPUs: per pod, a pod cgroup with the cpu, memory and pids controllers enabled for its children (those the
//! parent offers), a container cgroup below it, the process spawned (`posix_spawn`, which returns once the program
//! is executing) and moved into the container cgroup, as a plain supervisor does. Nothing is parsed, admitted,
//! recorded or reported. The daemon creates each process in its cgroup (`clone3`), which spares it the move made
//! here, so the daemon's ratio to this start understates what its own work adds.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use nodewarden_resources::CgroupPath;

use crate::{remove_tree, root};

/// The bare tree, below the daemon's cgroup root (which a daemon's start purges as well).
fn tree() -> Result<CgroupPath> {
    Ok(root().child("bare")?)
}

fn dir(cg: &CgroupPath) -> PathBuf {
    Path::new("/sys/fs/cgroup").join(cg.to_string().trim_start_matches('/'))
}

/// Makes `cg` and enables for its children those of the cpu, memory and pids controllers it has (a write naming
/// one it lacks would be refused whole).
fn make_parent(cg: &Path) -> Result<()> {
    std::fs::create_dir_all(cg).with_context(|| format!("cannot create {}", cg.display()))?;
    let offered = std::fs::read_to_string(cg.join("cgroup.controllers"))
        .with_context(|| format!("cannot read {}/cgroup.controllers", cg.display()))?;
    let enable: Vec<String> = ["cpu", "memory", "pids"]
        .into_iter()
        .filter(|c| offered.split_whitespace().any(|o| o == *c))
        .map(|c| format!("+{c}"))
        .collect();
    if enable.is_empty() {
        return Ok(());
    }
    std::fs::write(cg.join("cgroup.subtree_control"), enable.join(" "))
        .with_context(|| format!("cannot enable controllers in {}", cg.display()))
}

/// Starts pod `i`'s container: returns the running process.
fn start_one(base: &Path, i: usize) -> Result<Child> {
    let pod = base.join(format!("pod{i}"));
    make_parent(&pod)?;
    let app = pod.join("app");
    std::fs::create_dir(&app).with_context(|| format!("cannot create {}", app.display()))?;
    let child = Command::new("busybox")
        .args(["sleep", "100000"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot spawn busybox (Debian package busybox)")?;
    if let Err(e) = std::fs::write(app.join("cgroup.procs"), child.id().to_string()) {
        let (id, mut child) = (child.id(), child);
        let _ = child.kill();
        let _ = child.wait();
        return Err(e).with_context(|| format!("cannot move {id} into {}", app.display()));
    }
    Ok(child)
}

/// Starts `n` containers as described above and returns the seconds from the first `mkdir` to the last process
/// in its cgroup; then kills them and removes the tree. A thread stops at its first error; the error of the last
/// thread that met one is returned.
pub fn start(n: usize) -> Result<f64> {
    let cg = tree()?;
    remove_tree(&cg);
    let base = dir(&cg);
    for parent in [dir(&root()), base.clone()] {
        make_parent(&parent)?;
    }
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
                let base = &base;
                s.spawn(move || {
                    let mut children = Vec::new();
                    for i in (t..n).step_by(threads) {
                        match start_one(base, i) {
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
    remove_tree(&cg);
    outcome
}
