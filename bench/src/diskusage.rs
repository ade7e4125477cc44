//! `disk-usage`: what measuring the pods' disk usage costs, read from project quotas (KEP-1029) against the walk
//! of every file, on the same files. `pods` `emptyDir`-like directories, each owning a project as the daemon gives
//! them, hold `files` small files each in ten subdirectories; each run measures all of them both ways, from a cold
//! cache (after `drop_caches`, as on a node whose page cache went to its pods) and warm, timing the wall clock and
//! the CPU the measuring thread spent. `--dir` must be on a file system that keeps project quotas (in the VM:
//! `NODEWARDEN_VM_DISK`, made with `-O quota,project` and mounted with `prjquota`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use nodewarden_sync::disk_usage;
use nodewarden_testkit::{median, worst};

/// A way of measuring: its label, the measure of one directory, and whether the cache is dropped first.
type Way = (&'static str, fn(&Path) -> u64, bool);

/// One way of measuring all the pods once.
struct Pass {
    wall_ms: f64,
    cpu_ms: f64,
    bytes: u64,
}

/// The CPU time the calling thread has used, from `/proc/thread-self/schedstat` (nanoseconds on the CPU).
fn thread_cpu_ns() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").context("/proc/thread-self/schedstat")?;
    text.split_whitespace().next().and_then(|n| n.parse().ok()).context("unparsable schedstat")
}

fn drop_caches() -> Result<()> {
    rustix::fs::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3").context("/proc/sys/vm/drop_caches")
}

fn measure(dirs: &[PathBuf], how: fn(&Path) -> u64) -> Result<Pass> {
    let (t0, c0) = (Instant::now(), thread_cpu_ns()?);
    let bytes = dirs.iter().map(|d| how(d)).fold(0u64, u64::saturating_add);
    let cpu_ms = thread_cpu_ns()?.saturating_sub(c0) as f64 / 1e6;
    Ok(Pass { wall_ms: t0.elapsed().as_secs_f64() * 1000.0, cpu_ms, bytes })
}

/// Makes the pods' directories below `root`, each owning a project, with `files` files of 1 KiB each.
fn populate(root: &Path, pods: usize, files: usize) -> Result<Vec<PathBuf>> {
    let mut dirs = Vec::with_capacity(pods);
    let body = vec![b'x'; 1024];
    for p in 0..pods {
        let dir = root.join(format!("pod-{p}/volumes/kubernetes.io~empty-dir/data"));
        std::fs::create_dir_all(&dir)?;
        disk_usage::claim(&dir).with_context(|| {
            format!(
                "{}: its file system keeps no project quotas (ext4 -O quota,project, mounted prjquota)",
                dir.display()
            )
        })?;
        for f in 0..files {
            let sub = dir.join(format!("d{}", f % 10));
            if f < 10 {
                std::fs::create_dir(&sub)?;
            }
            std::fs::write(sub.join(format!("f{f}")), &body)?;
        }
        dirs.push(dir);
    }
    Ok(dirs)
}

/// Runs the bench and writes its table to `out`.
pub fn run(pods: usize, files: usize, runs: usize, dir: &Path, out: &Path) -> Result<()> {
    if runs == 0 || pods == 0 {
        bail!("--runs and --pods must be at least 1");
    }
    let root = dir.join("disk-usage-bench");
    std::fs::remove_dir_all(&root).ok();
    let t0 = Instant::now();
    let dirs = populate(&root, pods, files)?;
    eprintln!("made {} files in {pods} directories in {:.1} s", pods * files, t0.elapsed().as_secs_f64());
    let ways: [Way; 4] = [
        ("walk, cold cache", disk_usage::walk, true),
        ("project quota, cold cache", disk_usage::du, true),
        ("walk, warm cache", disk_usage::walk, false),
        ("project quota, warm cache", disk_usage::du, false),
    ];
    let mut results: Vec<Vec<Pass>> = ways.iter().map(|_| Vec::new()).collect();
    for r in 0..runs {
        for ((label, how, cold), done) in ways.iter().zip(&mut results) {
            if *cold {
                drop_caches()?;
            } else {
                measure(&dirs, *how)?;
            }
            let pass = measure(&dirs, *how)?;
            eprintln!("run {r} {label}: {:.2} ms, CPU {:.2} ms, {} bytes", pass.wall_ms, pass.cpu_ms, pass.bytes);
            done.push(pass);
        }
    }
    std::fs::remove_dir_all(&root).ok();
    let mut md = format!(
        "# Per-pod disk usage: project quotas against the walk\n\n`nodewarden-bench disk-usage --pods {pods} --files \
         {files} --runs {runs} --dir {}`: {pods} `emptyDir` directories of {files} files of 1 KiB (in ten \
         subdirectories) each, {} files in all, measured together; median (worst) of {runs} runs.\n\n\
         | measure | all {pods} pods, ms | per pod, ms | CPU, ms | bytes found |\n|---|---|---|---|---|\n",
        dir.display(),
        pods * files
    );
    for ((label, _, _), done) in ways.iter().zip(&results) {
        let wall: Vec<f64> = done.iter().map(|p| p.wall_ms).collect();
        let cpu: Vec<f64> = done.iter().map(|p| p.cpu_ms).collect();
        let per_pod: Vec<f64> = wall.iter().map(|w| w / pods as f64).collect();
        let bytes = done.last().map_or(0, |p| p.bytes);
        md.push_str(&format!(
            "| {label} | {:.2} ({:.2}) | {:.3} ({:.3}) | {:.2} ({:.2}) | {bytes} |\n",
            median(wall.clone()),
            worst(&wall),
            median(per_pod.clone()),
            worst(&per_pod),
            median(cpu.clone()),
            worst(&cpu),
        ));
    }
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(out, &md)?;
    print!("{md}");
    Ok(())
}
