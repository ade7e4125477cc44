//! `disk-slow`: the eviction thread while the pods' disk usage is measured on a slow disk. The VM's disk is
//! throttled (`bench/run disk-slow` boots it with `NODEWARDEN_VM_DISK_IOPS`, QEMU's I/O limit, as a cloud disk's
//! IOPS budget); the daemon's root, the pods' `emptyDir`s and `nodefsPath` are on it. The disk is made twice: ext4
//! without project quotas (usage is walked) and with them (read from each `emptyDir`'s project). Each time:
//! - the CPU of the daemon and of its `eviction` thread over `seconds` with `nodefs.available` met and no pod that
//!   could be evicted (what no pod owns filled the disk), and over `seconds` with `pods` pods holding `files` files
//!   of 1 KiB each in their `emptyDir` and no threshold met;
//! - `runs` disk evictions: `nodefs.available` raised over what is available → the SIGTERM of the pod with the
//!   most files, timed by the pod itself (the bench's `hog`), with the CPU the daemon and its eviction thread spent
//!   meanwhile and the measures of the pods' usage from the daemon's debug log;
//! - where usage is walked, a memory eviction (`memory.available` raised → a memory hog's SIGTERM) `runs` times
//!   with no disk threshold met and once during each disk eviction's walk: the eviction thread does not wait for
//!   the disk.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{Guard, StaticNode, cpu_ticks, get, hog, median, metric, thread_cpu_ns, wait, worst, write};

const MNT: &str = "/mnt/disk";
const MIB: u64 = 1 << 20;
/// USER_HZ on Linux: the unit of `/proc/PID/stat`'s CPU times.
const HZ: f64 = 100.0;
/// What the daemon logs: the measures' start and end lines, and no other debug line.
const LOG_FILTER: &str = "info,nodewarden_eviction::manager::disk_usage=debug";
/// The memory each hog holds; the memory threshold is raised [`OVER_MIB`] over what is available, so that one hog
/// covers it (three hogs a run: dropping the page cache moves what is available, and two may go at once).
const HOG_MIB: u64 = 32;
const OVER_MIB: u64 = 12;

/// How the pods' usage is measured, by how the disk is made.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Walk,
    Quota,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Self::Walk => "walk (ext4 without project quotas)",
            Self::Quota => "project quotas (ext4 prjquota)",
        }
    }
}

/// CPU over a window: the daemon's and its eviction thread's, in ms per second.
#[derive(Clone, Copy, Default)]
struct Cpu {
    daemon: f64,
    eviction: f64,
}

/// What one mode measured.
struct Measured {
    mode: Mode,
    /// No threshold met.
    idle: Cpu,
    /// `nodefs.available` met and no pod to evict; the loop's passes per second then.
    unrelieved: Cpu,
    unrelieved_passes: f64,
    /// The disk evictions.
    disk: Vec<DiskRun>,
    /// Every measure of the pods' usage that ended, ms each.
    measures: Vec<f64>,
    /// Threshold raised → hog's SIGTERM for memory with no disk threshold met, ms.
    memory_idle: Vec<f64>,
}

fn run_cmd(program: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(program).args(args).output().with_context(|| format!("cannot run {program}"))?;
    if !out.status.success() {
        bail!("{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Makes the disk at [`MNT`] again, with or without project quotas.
fn make_disk(mode: Mode) -> Result<()> {
    let mounts = std::fs::read_to_string("/proc/mounts")?;
    let device = mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(1) == Some(&MNT))
        .and_then(|f| f.first().map(|d| (*d).to_owned()))
        .with_context(|| format!("nothing is mounted at {MNT} (boot the VM with NODEWARDEN_VM_DISK)"))?;
    run_cmd("umount", &[MNT])?;
    match mode {
        Mode::Walk => {
            run_cmd("mkfs.ext4", &["-q", "-F", &device])?;
            run_cmd("mount", &["-t", "ext4", &device, MNT])
        }
        Mode::Quota => {
            run_cmd("mkfs.ext4", &["-q", "-F", "-O", "quota,project", &device])?;
            run_cmd("mount", &["-t", "ext4", "-o", "prjquota", &device, MNT])
        }
    }
}

fn drop_caches() -> Result<()> {
    rustix::fs::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3").context("/proc/sys/vm/drop_caches")
}

/// The daemon's config with `memory.available` and `nodefs.available` hard thresholds of these MiB.
fn config(dir: &Path, port: u16, memory_mib: u64, nodefs_mib: u64) -> String {
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupRoot: {}\nhealthzPort: {port}\n\
         staticPodPath: {}\npodLogsDir: {}\nevictionHard:\n  memory.available: {memory_mib}Mi\n  nodefs.available: \
         {nodefs_mib}Mi\nevictionPressureTransitionPeriod: 1s\nmaxPods: 250\nnodewarden:\n  rootDir: {}\n  nodeName: bench\n  \
         nodefsPath: {MNT}\n",
        crate::ROOT,
        dir.join("manifests").display(),
        dir.join("logs").display(),
        dir.join("root").display()
    )
}

/// Starts the daemon with its directory on the slow disk and the debug lines of the disk measures in its log.
fn start(bin: &Path) -> Result<StaticNode> {
    nodewarden_testkit::remove_tree(&crate::root());
    let dir = Path::new(MNT).join("nwbench-slow");
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let cfg = dir.join("config.yaml");
    std::fs::write(&cfg, config(&dir, port, 1, 1))?;
    let log = std::fs::File::create(dir.join("daemon.log"))?;
    let child = Command::new(bin)
        .args(["run", "--config"])
        .arg(&cfg)
        .env("RUST_LOG", LOG_FILTER)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    let node = StaticNode { guard: Guard(child), dir, manifests, port };
    wait("readiness", 60, || get(port, "/readyz").is_some())?;
    Ok(node)
}

fn reconfigure(node: &StaticNode, memory_mib: u64, nodefs_mib: u64) -> Result<()> {
    write(&node.dir, "config.yaml", &config(&node.dir, node.port, memory_mib, nodefs_mib))
}

/// An eviction signal's value as the daemon last observed it.
fn signal(port: u16, name: &str) -> Result<u64> {
    let text = get(port, "/metrics").context("no /metrics")?;
    let v = metric(&text, &format!("nodewarden_eviction_signal_value{{eviction_signal=\"{name}\"}}"))
        .with_context(|| format!("no {name} in /metrics"))?;
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a byte count")]
    Ok(v as u64)
}

fn condition(port: u16, name: &str) -> bool {
    get(port, "/metrics")
        .and_then(|t| metric(&t, &format!("nodewarden_node_condition{{condition=\"{name}\"}}")))
        .is_some_and(|v| v > 0.5)
}

fn passes(port: u16) -> f64 {
    let text = get(port, "/metrics").unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("nodewarden_eviction_wakeups_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The CPU time of the daemon's eviction thread, in ns.
fn eviction_thread_ns(pid: u32) -> Result<u64> {
    thread_cpu_ns(pid).get("eviction").copied().context("no thread named eviction")
}

/// The CPU of the daemon and of its eviction thread over `seconds`.
fn sample_cpu(pid: u32, seconds: u64) -> Result<Cpu> {
    let (t0, c0, e0) = (Instant::now(), cpu_ticks(pid)?, eviction_thread_ns(pid)?);
    std::thread::sleep(Duration::from_secs(seconds));
    let (c1, e1) = (cpu_ticks(pid)?, eviction_thread_ns(pid)?);
    let s = t0.elapsed().as_secs_f64();
    Ok(Cpu { daemon: (c1 - c0) as f64 / HZ * 1000.0 / s, eviction: (e1 - e0) as f64 / 1e6 / s })
}

/// The measures the daemon logged, in order: `Some(ms)` for one that ended, `None` for one left running.
fn logged_measures(node: &StaticNode) -> Vec<Option<f64>> {
    let log = std::fs::read_to_string(node.dir.join("daemon.log")).unwrap_or_default();
    log.lines()
        .filter_map(|l| {
            if l.contains("measured the pods' disk usage") {
                let ms = l.split_whitespace().find_map(|w| w.strip_prefix("took_ms="))?.parse().ok()?;
                Some(Some(ms))
            } else if l.contains("measuring the pods' disk usage off the eviction thread") {
                Some(None)
            } else {
                None
            }
        })
        .collect()
}

fn ended(node: &StaticNode) -> Vec<f64> {
    logged_measures(node).into_iter().flatten().collect()
}

/// Whether a measure started off the eviction thread has not ended yet: measures run one at a time, so the
/// line after its start is its end.
fn walking(node: &StaticNode) -> bool {
    logged_measures(node).last() == Some(&None)
}

fn hog_manifest(name: &str, bench: &Path, term: &Path, grow_mib: u64, critical: bool, volume: bool) -> String {
    let priority = if critical { "  priorityClassName: system-node-critical\n" } else { "" };
    let volume = if volume { "  volumes:\n  - name: data\n    emptyDir: {}\n" } else { "" };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n{priority}  terminationGracePeriodSeconds: 1\n  \
         containers:\n  - name: app\n    image: busybox\n    command: ['{}', hog, --grow-mb, '{grow_mib}', --steps, \
         '1', --term-file, '{}']\n{volume}",
        bench.display(),
        term.display()
    )
}

/// Fills each pod's `emptyDir` with `files` files of 1 KiB in ten subdirectories.
fn populate(root: &Path, pods: usize, files: usize) -> Result<()> {
    let mut dirs = Vec::new();
    for pod in std::fs::read_dir(root.join("pods"))? {
        let dir = pod?.path().join("volumes/kubernetes.io~empty-dir/data");
        if dir.is_dir() {
            dirs.push(dir);
        }
    }
    if dirs.len() != pods {
        bail!("found {} emptyDirs under {}, not {pods}", dirs.len(), root.display());
    }
    let body = vec![b'x'; 1024];
    for dir in dirs {
        for f in 0..files {
            let sub = dir.join(format!("d{}", f % 10));
            if f < 10 {
                std::fs::create_dir_all(&sub)?;
            }
            std::fs::write(sub.join(format!("f{f}")), &body)?;
        }
    }
    Ok(())
}

/// The SIGTERM time (CLOCK_MONOTONIC, s) a hog wrote, once it has.
fn sigterm_at(term: &Path) -> Option<f64> {
    std::fs::read_to_string(term).ok()?.split_whitespace().next()?.parse().ok()
}

/// Waits up to `secs` for the first SIGTERM among `hogs`; drops from `hogs` every one signalled.
fn first_sigterm(hogs: &mut Vec<PathBuf>, secs: u64) -> Option<f64> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let at = loop {
        if let Some(at) = hogs.iter().find_map(|t| sigterm_at(t)) {
            break at;
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    hogs.retain(|t| sigterm_at(t).is_none());
    Some(at)
}

/// A signal's value from a pass after this call: the gauges are set by the passes that read every signal, at least
/// once a second (`housekeepingInterval`).
fn fresh_signal(port: u16, name: &str) -> Result<u64> {
    let first = signal(port, name)?;
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let now = signal(port, name)?;
        if now != first || Instant::now() > deadline {
            return Ok(now);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Raises `memory.available` over what is available and times the first hog's SIGTERM, in ms; puts it back after.
/// What is available moves (a hog evicted before gives its memory back late): a raise that crossed nothing within
/// 10 s is made again from a fresh reading, at most three times, and the time counts from the raise that crossed.
fn memory_run(node: &StaticNode, hogs: &mut Vec<PathBuf>, nodefs_mib: u64) -> Result<f64> {
    let mut crossed = None;
    for attempt in 1..=3 {
        let threshold = fresh_signal(node.port, "memory.available")? / MIB + OVER_MIB;
        let t0 = hog::monotonic();
        reconfigure(node, threshold, nodefs_mib)?;
        if let Some(at) = first_sigterm(hogs, 10) {
            crossed = Some(at - t0);
            break;
        }
        eprintln!("memory threshold raised to {threshold} MiB, attempt {attempt}: no SIGTERM within 10 s");
    }
    let took = crossed.context("no hog was sent SIGTERM after three raises of the memory threshold")?;
    reconfigure(node, 1, nodefs_mib)?;
    wait("MemoryPressure gone", 60, || !condition(node.port, "MemoryPressure"))?;
    // Another hog evicted in the same pass is seen here.
    hogs.retain(|t| sigterm_at(t).is_none());
    Ok(took * 1000.0)
}

/// One disk eviction: the time from the crossing to the top pod's SIGTERM, and what the eviction thread did
/// meanwhile.
struct DiskRun {
    ms: f64,
    /// The eviction thread's CPU and the daemon's in that time, ms.
    eviction_cpu: f64,
    daemon_cpu: f64,
    passes: f64,
    /// Threshold raised → SIGTERM for memory while the walk was under way, ms.
    memory: Option<f64>,
}

/// Raises `nodefs.available` 1 MiB over what is available (the page cache dropped first, so that the disk is read
/// again) and times the first SIGTERM of `fills`; where usage is walked, times a memory eviction meanwhile.
fn disk_run(node: &StaticNode, fills: &mut Vec<PathBuf>, hogs: &mut Vec<PathBuf>, walk: bool) -> Result<DiskRun> {
    drop_caches()?;
    let pid = node.pid();
    let over = fresh_signal(node.port, "nodefs.available")? / MIB + 1;
    let (passes0, c0, e0) = (passes(node.port), cpu_ticks(pid)?, eviction_thread_ns(pid)?);
    let t0 = hog::monotonic();
    reconfigure(node, 1, over)?;
    let memory = if walk {
        wait("a walk under way", 60, || walking(node))?;
        let ms = memory_run(node, hogs, over)?;
        if !walking(node) {
            bail!("the walk ended before the memory eviction: a slower disk or more files are needed");
        }
        Some(ms)
    } else {
        None
    };
    let at =
        first_sigterm(fills, 300).context("no pod was sent SIGTERM within 300 s of the nodefs threshold raised")?;
    let (c1, e1) = (cpu_ticks(pid)?, eviction_thread_ns(pid)?);
    let run = DiskRun {
        ms: (at - t0) * 1000.0,
        eviction_cpu: (e1 - e0) as f64 / 1e6,
        daemon_cpu: (c1 - c0) as f64 / HZ * 1000.0,
        passes: passes(node.port) - passes0,
        memory,
    };
    reconfigure(node, 1, 1)?;
    wait("DiskPressure gone", 60, || !condition(node.port, "DiskPressure"))?;
    Ok(run)
}

/// The CPU with `nodefs.available` met and no pod that could be evicted (one critical pod, and what no pod owns
/// filling the disk): the loop has nothing to do, and nothing to measure.
fn unrelieved(bin: &Path, bench: &Path, seconds: u64) -> Result<(Cpu, f64)> {
    let node = start(bin)?;
    let term = node.dir.join("term-critical");
    write(&node.manifests, "critical.yaml", &hog_manifest("critical", bench, &term, 0, true, true))?;
    wait("the critical pod ready", 120, || hog::marker(&term, "ready").exists())?;
    let over = signal(node.port, "nodefs.available")? / MIB + 1024;
    reconfigure(&node, 1, over)?;
    wait("DiskPressure", 30, || condition(node.port, "DiskPressure"))?;
    let before = passes(node.port);
    let cpu = sample_cpu(node.pid(), seconds)?;
    let passes = (passes(node.port) - before) / seconds as f64;
    if !ended(&node).is_empty() {
        bail!("the pods' disk usage was measured, though no pod could be evicted");
    }
    drop(node);
    Ok((cpu, passes))
}

fn one_mode(bin: &Path, mode: Mode, pods_n: usize, files: usize, runs: usize, seconds: u64) -> Result<Measured> {
    make_disk(mode)?;
    let bench = std::env::current_exe()?;
    let (unrelieved, unrelieved_passes) = unrelieved(bin, &bench, seconds)?;
    let node = start(bin)?;
    let mut fills = Vec::new();
    for i in 0..pods_n {
        let term = node.dir.join(format!("term-fill-{i}"));
        write(
            &node.manifests,
            &format!("fill-{i}.yaml"),
            &hog_manifest(&format!("fill-{i}"), &bench, &term, 0, false, true),
        )?;
        fills.push(term);
    }
    let walk = mode == Mode::Walk;
    let mut hogs = Vec::new();
    for r in 0..if walk { 3 * runs } else { 0 } {
        let term = node.dir.join(format!("term-hog-{r}"));
        write(
            &node.manifests,
            &format!("hog-{r}.yaml"),
            &hog_manifest(&format!("hog-{r}"), &bench, &term, HOG_MIB, false, false),
        )?;
        hogs.push(term);
    }
    let ready = |all: &[PathBuf]| all.iter().all(|t| hog::marker(t, "ready").exists());
    let all_ready = wait("the pods ready", 900, || ready(&fills) && ready(&hogs));
    if let Err(e) = all_ready {
        let n = fills.iter().chain(&hogs).filter(|t| hog::marker(t, "ready").exists()).count();
        bail!("{e}: {n} of {} ready", fills.len() + hogs.len());
    }
    let t0 = Instant::now();
    populate(&node.dir.join("root"), pods_n, files)?;
    eprintln!(
        "{}: {} files in {pods_n} pods made in {:.1} s",
        mode.label(),
        pods_n * files,
        t0.elapsed().as_secs_f64()
    );
    drop_caches()?;
    std::thread::sleep(Duration::from_secs(2));
    let idle = sample_cpu(node.pid(), seconds)?;
    let mut memory_idle = Vec::new();
    for r in 0..if walk { runs } else { 0 } {
        let ms = memory_run(&node, &mut hogs, 1)?;
        eprintln!("memory run {r}, no disk threshold met: {ms:.1} ms");
        memory_idle.push(ms);
    }
    let mut disk = Vec::new();
    for r in 0..runs {
        let run = disk_run(&node, &mut fills, &mut hogs, walk)?;
        eprintln!(
            "{} run {r}: nodefs crossing → SIGTERM {:.0} ms; eviction thread {:.1} ms of CPU, daemon {:.0} ms, {} passes; memory eviction meanwhile {:?} ms",
            mode.label(),
            run.ms,
            run.eviction_cpu,
            run.daemon_cpu,
            run.passes,
            run.memory
        );
        disk.push(run);
    }
    let measures = ended(&node);
    drop(node);
    let _ = std::fs::remove_dir_all(Path::new(MNT).join("nwbench-slow"));
    Ok(Measured { mode, idle, unrelieved, unrelieved_passes, disk, measures, memory_idle })
}

fn med_worst(v: &[f64]) -> String {
    if v.is_empty() {
        return "–".into();
    }
    format!("{:.0} ({:.0})", median(v.to_vec()), worst(v))
}

fn series<T>(done: &[T], f: impl Fn(&T) -> f64) -> Vec<f64> {
    done.iter().map(f).collect()
}

/// Runs the bench and writes its tables to `out`.
pub fn run(bin: &Path, pods_n: usize, files: usize, runs: usize, seconds: u64, out: &Path) -> Result<()> {
    if runs == 0 || pods_n <= runs || seconds == 0 {
        bail!("--runs and --seconds must be at least 1, and --pods more than --runs");
    }
    let iops = std::env::var("NODEWARDEN_VM_DISK_IOPS").unwrap_or_else(|_| "no limit of".into());
    let mut done = Vec::new();
    for mode in [Mode::Walk, Mode::Quota] {
        done.push(one_mode(bin, mode, pods_n, files, runs, seconds).with_context(|| mode.label())?);
    }
    let mut md = format!(
        "# The eviction thread under a slow disk\n\n`nodewarden-bench disk-slow --pods {pods_n} --files {files} \
         --runs {runs} --seconds {seconds}`, the VM's disk limited to {iops} I/O operations per second; the daemon's \
         root, the pods' `emptyDir`s and `nodefsPath` on it. Median (worst) of {runs} runs where there are runs.\n\n\
         ## CPU, ms per second, over {seconds} s\n\nIdle: {pods_n} pods with {files} files of 1 KiB in their \
         `emptyDir`s, no threshold met. Unrelieved: `nodefs.available` met, and one critical pod only (the disk \
         filled by what no pod owns): no pod can be evicted.\n\n\
         | usage measured by | daemon, idle | eviction thread, idle | daemon, unrelieved | eviction thread, \
         unrelieved | loop passes per second, unrelieved |\n|---|---|---|---|---|---|\n"
    );
    for m in &done {
        md.push_str(&format!(
            "| {} | {:.1} | {:.2} | {:.1} | {:.2} | {:.1} |\n",
            m.mode.label(),
            m.idle.daemon,
            m.idle.eviction,
            m.unrelieved.daemon,
            m.unrelieved.eviction,
            m.unrelieved_passes
        ));
    }
    md.push_str(
        "\n## A disk eviction\n\n`nodefs.available` raised 1 MiB over what is available (a live reload; the page \
         cache dropped just before, so that the disk is read again) → the SIGTERM of the pod with the most files, \
         and what the daemon and its eviction thread spent in that time (CPU ms, loop passes); the measures of the \
         pods' usage, ms each.\n\n\
         | usage measured by | crossing → SIGTERM, ms | eviction thread CPU, ms | daemon CPU, ms | loop passes | \
         measure, ms |\n|---|---|---|---|---|---|\n",
    );
    for m in &done {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            m.mode.label(),
            med_worst(&series(&m.disk, |r| r.ms)),
            med_worst(&series(&m.disk, |r| r.eviction_cpu)),
            med_worst(&series(&m.disk, |r| r.daemon_cpu)),
            med_worst(&series(&m.disk, |r| r.passes)),
            med_worst(&m.measures)
        ));
    }
    if let Some(walk) = done.iter().find(|m| m.mode == Mode::Walk) {
        let walking: Vec<f64> = walk.disk.iter().filter_map(|r| r.memory).collect();
        md.push_str(&format!(
            "\n## A memory eviction while the disk is walked\n\n`memory.available` raised {OVER_MIB} MiB over what \
             is available (a live reload) → a {HOG_MIB} MiB hog's SIGTERM, where usage is walked: with no disk \
             threshold met, and during each disk eviction above, while the walk is under way.\n\n\
             | while | reload → SIGTERM, ms |\n|---|---|\n| no disk threshold met | {} |\n| a walk of the pods' \
             usage under way | {} |\n",
            med_worst(&walk.memory_idle),
            med_worst(&walking)
        ));
    }
    std::fs::write(out, &md)?;
    print!("{md}");
    Ok(())
}
