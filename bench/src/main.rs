//! Benchmarks of nodewarden, run inside the VM of `deploy/vm` (they need cgroup v2 and root).
//!
//! `footprint`: the daemon's resident memory, CPU use and observation-pass duration at steady state with N pods
//! placed. The pods are placed through the resources library before the daemon starts, so the daemon adopts them
//! and observes every one of them on each pass. Results are medians over several runs, written as a Markdown
//! table.
//!
//! `pods`: pod sync through static manifests with the process runtime (see `pods.rs`).
//!
//! `cri`: pod start latency through containerd next to the process runtime's and to bare CRI calls made by the
//! bench's own client, and the daemon's own cost per CRI pod (see `cri.rs`).
//!
//! `reload`: a threshold edit → the new threshold in `/metrics` (see `reload.rs`).
//!
//! `cluster`: the daemon joined to the test apiserver: requests per minute when idle, and a condition change →
//! the apiserver's copy (see `cluster.rs`).
//!
//! `api-pods`: pods created through the test apiserver: startup p50/p99, requests per pod, deletion, and the
//! static start for comparison (see `apipods.rs`).
//!
//! `many-nodes`: N nodes joined to one test apiserver: requests and bytes per node per minute, idle and under
//! churn, extrapolated to 5,000 nodes (see `manynodes.rs`).
//!
//! `placement`: the time to place a pod under each cgroup driver (see `placement.rs`).
//!
//! `disk-usage`: the pods' disk usage read from project quotas against the walk of their files (see
//! `diskusage.rs`).
//!
//! `disk-reclaim`: imagefs pressure that removing an unused image covers: the time to the space reclaimed, and the
//! evictions, for nodewarden or the kubelet's cadence (see `reclaim.rs`).
//!
//! `saves`: the pod state saves of pods starting together, on the host's disk (see `saves.rs`; no VM needed).
//!
//! `eviction`: stress scenarios against the kernel OOM killer, earlyoom, a kubelet-like nodewarden and
//! nodewarden, each alone (see `eviction/`); `hog` is their workload.

#![expect(clippy::disallowed_types, reason = "benchmarks measure real time")]

mod apipods;
mod cluster;
mod cri;
mod diskslow;
mod diskusage;
mod eviction;
mod hog;
mod manynodes;
mod placement;
mod pods;
mod reclaim;
mod reload;
mod saves;
mod svg;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use nodewarden_resources::{CgroupFs, CgroupPath, HostPaths, ResourceConfig, ResourceManager};

#[derive(Parser)]
#[command(name = "nodewarden-bench", about = "nodewarden benchmarks (run inside deploy/vm)")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Resident memory, CPU and observation-pass time of the daemon with N pods placed.
    Footprint {
        /// The nodewarden binary to measure.
        #[arg(long, default_value = "target/release/nodewarden")]
        nodewarden: PathBuf,
        /// Pods to place before the daemon starts.
        #[arg(long, default_value_t = 100)]
        pods: usize,
        /// Seconds of steady state sampled per run.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// Runs; the table reports the median and the worst.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Where the Markdown table is written.
        #[arg(long, default_value = "results/footprint.md")]
        out: PathBuf,
    },
    /// Pod start, manifest edit and steady-state probe cost through static manifests.
    Pods {
        /// The nodewarden binary to measure.
        #[arg(long, default_value = "target/release/nodewarden")]
        nodewarden: PathBuf,
        /// Pods per scenario.
        #[arg(long, default_value_t = 100)]
        pods: usize,
        /// Seconds of steady state sampled per run.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        /// Runs.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Manifest edits per run.
        #[arg(long, default_value_t = 10)]
        edits: usize,
        /// Where the Markdown table is written.
        #[arg(long, default_value = "results/pods.md")]
        out: PathBuf,
    },
    /// Pod start latency through containerd and through the process runtime, and the daemon's cost per pod.
    Cri {
        /// The nodewarden binary to measure.
        #[arg(long, default_value = "target/release/nodewarden")]
        nodewarden: PathBuf,
        /// Pods started one after another per runtime and run.
        #[arg(long, default_value_t = 10)]
        pods: usize,
        /// Seconds of steady state sampled with no pods and with all pods running.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// Runs.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// The script that starts containerd with the local images.
        #[arg(long, default_value = "deploy/containerd/start")]
        containerd: PathBuf,
        /// Where the Markdown table is written.
        #[arg(long, default_value = "results/cri.md")]
        out: PathBuf,
    },
    /// Stress scenarios: each agent's reaction to memory, PID and disk pressure.
    Eviction {
        /// The nodewarden binary to measure.
        #[arg(long, default_value = "target/release/nodewarden")]
        nodewarden: PathBuf,
        /// Scenarios to run, by letter: a (BestEffort hog), b (Burstable pods), c (fork bomb), d (disk filler).
        #[arg(long, default_value = "abcd")]
        scenarios: String,
        /// Agents to compare, comma-separated: kernel, earlyoom, kubelet-like, nodewarden; or all.
        #[arg(long, default_value = "all")]
        agents: String,
        /// Runs per agent and scenario.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Before each measured run of scenario a, the agent evicts a first hog of the same kind once (the
        /// memory is back before the measured hog starts): the measured eviction is the agent's second, its code
        /// already run once. Under QEMU TCG a path's first run is mostly the emulator translating it.
        #[arg(long)]
        warm_up: bool,
        /// Scenario a's hog (and the warm-up's) on 4 KiB pages, not transparent huge pages: the memory signal then
        /// falls in smaller steps than the 4 MiB it falls by on a hog of huge pages (`bench/signal-steps`), so the
        /// overshoot is seen at a finer grain. It is a different workload too: 512 times the page faults for the
        /// same memory, which costs the hog more CPU under emulation.
        #[arg(long)]
        small_pages: bool,
        /// Where the runs (eviction-raw/), eviction.md and the plots are written.
        #[arg(long, default_value = "results")]
        out: PathBuf,
    },
    /// The daemon joined to the test apiserver: idle requests, a condition change → the apiserver, an outage.
    Cluster {
        #[arg(long, default_value = "target/release/nodewarden")]
        nodewarden: PathBuf,
        #[arg(long, default_value_t = 100)]
        pods: usize,
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        #[arg(long, default_value_t = 5)]
        runs: usize,
        #[arg(long, default_value_t = 3)]
        edits: usize,
        /// How long the apiserver is away in the outage (longer than the lifecycle grace of 50 s).
        #[arg(long, default_value_t = 60)]
        outage: u64,
        #[arg(long, default_value = "results/cluster.md")]
        out: PathBuf,
    },
    /// Pods bound to the node through the test apiserver: startup p50/p99, requests per pod, deletion.
    ApiPods {
        /// The nodewarden binary to measure.
        #[arg(long, default_value = "target/release/nodewarden")]
        nodewarden: PathBuf,
        /// Pods created at once (the kubelet's default maxPods).
        #[arg(long, default_value_t = 110)]
        pods: usize,
        /// Runs; the table reports the median and the worst.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Pods as most real ones are: the service account token volume and a variable from a ConfigMap.
        #[arg(long)]
        objects: bool,
        /// The node's `kubeAPIQPS` (its burst twice that); the kubelet's default, 50, when not given.
        #[arg(long)]
        kube_api_qps: Option<u32>,
        /// Where the Markdown table is written.
        #[arg(long, default_value = "results/api-pods.md")]
        out: PathBuf,
    },
    /// N nodes joined to one test apiserver: requests and bytes per node per minute, idle and under churn.
    ManyNodes {
        /// The nodewarden binary to measure.
        #[arg(long, default_value = "target/release/nodewarden")]
        nodewarden: PathBuf,
        /// Nodes, each a daemon of its own.
        #[arg(long, default_value_t = 20)]
        nodes: usize,
        /// Seconds of each window (idle, churn).
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Pods created and deleted per node in the churn window.
        #[arg(long, default_value_t = 5)]
        pods: usize,
        /// Runs; the table reports the median and the worst.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Where the Markdown table is written.
        #[arg(long, default_value = "results/many-nodes.md")]
        out: PathBuf,
    },
    /// Writes eviction.md and the plots from the runs in <out>/eviction-raw/ (on the host, no VM needed).
    EvictionReport {
        /// The directory holding eviction-raw/; the report is written there.
        #[arg(long, default_value = "results")]
        out: PathBuf,
    },
    /// The benchmark's workload (run as a pod): grows memory, processes or files; records SIGTERM's delivery.
    Hog(hog::HogArgs),
    /// The time to place and release a pod under the cgroupfs and the systemd cgroup drivers (systemd as PID 1).
    Placement {
        /// Pods per run.
        #[arg(long, default_value_t = 50)]
        pods: usize,
        /// Runs per driver.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Where the Markdown table is written.
        #[arg(long, default_value = "results/placement.md")]
        out: PathBuf,
    },
    /// A threshold edit (`sed -i`, in place, rename) → the new value in `kubelet_eviction_stats`.
    Reload {
        /// The nodewarden binary to measure.
        #[arg(long, default_value = "target/release/nodewarden")]
        nodewarden: PathBuf,
        /// Runs (a daemon each).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Edits of each kind per run.
        #[arg(long, default_value_t = 4)]
        edits: usize,
        /// Where the Markdown table is written.
        #[arg(long, default_value = "results/reload.md")]
        out: PathBuf,
    },
    /// Pod state saves of pods starting together, on blocking threads and on the runtime's (host, no VM).
    Saves {
        /// Pods starting together.
        #[arg(long, default_value_t = 100)]
        pods: usize,
        /// Runs per way; the table reports the median and the worst.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// A directory on the disk to measure (not a tmpfs); its `root/` is made and removed.
        #[arg(long, default_value = "target/bench-saves")]
        dir: PathBuf,
        /// Where the Markdown table is written.
        #[arg(long, default_value = "results/saves.md")]
        out: PathBuf,
    },
    /// imagefs pressure that an unused image's removal covers: time to the space reclaimed, and evictions.
    DiskReclaim {
        /// The nodewarden binary to measure.
        #[arg(long, default_value = "target/release/nodewarden")]
        nodewarden: PathBuf,
        /// `nodewarden`, or `kubelet-like` (nodewarden at the kubelet's cadence: a reading every 10 s, no pressure
        /// events, the normal scheduler).
        #[arg(long, default_value = "nodewarden")]
        agent: String,
        /// Runs; the table reports the median and the worst.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// The script that starts containerd with the local images.
        #[arg(long, default_value = "deploy/containerd/start")]
        containerd: PathBuf,
        /// Where the Markdown table is written.
        #[arg(long, default_value = "results/disk-reclaim.md")]
        out: PathBuf,
    },
    /// The pods' disk usage from project quotas against the walk, on the same files (inside the VM, with
    /// `NODEWARDEN_VM_DISK`).
    DiskUsage {
        #[command(flatten)]
        files: DiskFiles,
        /// Runs; the table reports the median and the worst.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// A directory on a file system that keeps project quotas.
        #[arg(long, default_value = "/mnt/disk")]
        dir: PathBuf,
        /// Where the Markdown table is written.
        #[arg(long, default_value = "results/disk-usage.md")]
        out: PathBuf,
    },
    /// The eviction thread while the pods' disk usage is measured on a slow disk, walked and from project quotas
    /// (inside the VM, with `NODEWARDEN_VM_DISK` and `NODEWARDEN_VM_DISK_IOPS`; it makes that disk again).
    DiskSlow {
        /// The nodewarden binary to measure.
        #[arg(long, default_value = "target/release/nodewarden")]
        nodewarden: PathBuf,
        #[command(flatten)]
        files: DiskFiles,
        /// Disk evictions timed (and memory evictions, in each case); the tables report the median and the worst.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Seconds of each CPU window.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// Where the Markdown tables are written.
        #[arg(long, default_value = "results/disk-slow.md")]
        out: PathBuf,
    },
}

/// Pods with small files in their `emptyDir`s, for the disk benches.
#[derive(clap::Args)]
struct DiskFiles {
    /// Pods, each with one `emptyDir`.
    #[arg(long, default_value_t = 110)]
    pods: usize,
    /// Files of 1 KiB in each pod's `emptyDir`.
    #[arg(long, default_value_t = 1000)]
    files: usize,
}

const ROOT: &str = "/nwbench";

fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::Footprint { nodewarden, pods, seconds, runs, out } => footprint(&nodewarden, pods, seconds, runs, &out),
        Cmd::Pods { nodewarden, pods, seconds, runs, edits, out } => {
            pods::run(&nodewarden, pods, seconds, runs, edits, &out)
        }
        Cmd::Cri { nodewarden, pods, seconds, runs, containerd, out } => {
            cri::run(&nodewarden, &containerd, pods, seconds, runs, &out)
        }
        Cmd::Eviction { nodewarden, scenarios, agents, runs, warm_up, small_pages, out } => {
            eviction::run(&nodewarden, &scenarios, &agents, runs, eviction::Options { warm_up, small_pages }, &out)
        }
        Cmd::EvictionReport { out } => eviction::report(&out),
        Cmd::Cluster { nodewarden, pods, seconds, runs, edits, outage, out } => {
            cluster::run(&nodewarden, pods, seconds, runs, edits, outage, &out)
        }
        Cmd::ApiPods { nodewarden, pods, runs, objects, kube_api_qps, out } => {
            apipods::run(&nodewarden, pods, runs, objects, kube_api_qps, &out)
        }
        Cmd::ManyNodes { nodewarden, nodes, seconds, pods, runs, out } => {
            manynodes::run(&nodewarden, nodes, seconds, pods, runs, &out)
        }
        Cmd::Hog(args) => hog::run(&args),
        Cmd::Placement { pods, runs, out } => placement::run(pods, runs, &out),
        Cmd::Reload { nodewarden, runs, edits, out } => reload::run(&nodewarden, runs, edits, &out),
        Cmd::Saves { pods, runs, dir, out } => saves::run(pods, runs, &dir, &out),
        Cmd::DiskReclaim { nodewarden, agent, runs, containerd, out } => {
            reclaim::run(&nodewarden, &agent, &containerd, runs, &out)
        }
        Cmd::DiskUsage { files, runs, dir, out } => diskusage::run(files.pods, files.files, runs, &dir, &out),
        Cmd::DiskSlow { nodewarden, files, runs, seconds, out } => {
            diskslow::run(&nodewarden, files.pods, files.files, runs, seconds, &out)
        }
    }
}

struct Sample {
    rss_mib: f64,
    cpu_percent: f64,
    pass_ms: f64,
    pods_seen: f64,
}

fn footprint(bin: &Path, pods: usize, seconds: u64, runs: usize, out: &Path) -> Result<()> {
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    let mut samples = Vec::new();
    for run in 1..=runs {
        let s = one_run(bin, pods, seconds).with_context(|| format!("run {run}"))?;
        println!(
            "run {run}: rss {:.1} MiB, cpu {:.3}% of one core, pass {:.2} ms, pods {}",
            s.rss_mib, s.cpu_percent, s.pass_ms, s.pods_seen
        );
        samples.push(s);
    }
    let stat = |f: fn(&Sample) -> f64| {
        let mut v: Vec<f64> = samples.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[v.len() - 1])
    };
    let (rss, rss_max) = stat(|s| s.rss_mib);
    let (cpu, cpu_max) = stat(|s| s.cpu_percent);
    let (pass, pass_max) = stat(|s| s.pass_ms);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let table = format!(
        "# nodewarden footprint\n\n{pods} pods placed and adopted, housekeeping every 1 s, {seconds} s sampled per run, \
         {runs} runs, kernel {}, {} CPUs. Median (worst). In the VM of deploy/vm the CPU is emulated (QEMU TCG), \
         so CPU time and pass duration are upper bounds of what a real host shows.\n\n\
         | resident memory | CPU (% of one core) | observation pass |\n|---|---|---|\n\
         | {rss:.1} MiB ({rss_max:.1}) | {cpu:.3} ({cpu_max:.3}) | {pass:.2} ms ({pass_max:.2}) |\n",
        kernel.trim(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    );
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out, &table)?;
    print!("\n{table}");
    Ok(())
}

fn config(root: &CgroupPath) -> ResourceConfig {
    ResourceConfig { memory_qos: true, ..ResourceConfig::new(root.clone()) }
}

/// A resource manager for the bench's root in the real cgroup tree, its tree set up.
fn manager(config: ResourceConfig) -> Result<ResourceManager> {
    let mut m = ResourceManager::new(CgroupFs::new("/sys/fs/cgroup", root()), HostPaths::default(), config)?;
    m.setup()?;
    Ok(m)
}

fn root() -> CgroupPath {
    CgroupPath::parse(ROOT).unwrap_or_else(|_| CgroupPath::root())
}

fn place_pods(n: usize) -> Result<()> {
    let mut m = manager(config(&root()))?;
    for i in 0..n {
        let resources = match i % 3 {
            0 => serde_json::json!({"limits": {"cpu": "10m", "memory": "4Mi"}}),
            1 => serde_json::json!({"requests": {"cpu": "5m", "memory": "2Mi"}}),
            _ => serde_json::json!({}),
        };
        let pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("bench-{i}"), "uid": format!("bench-{i:04}")},
            "spec": {"containers": [{"name": "app", "resources": resources}]}
        }))?;
        m.place(&pod)?;
    }
    Ok(())
}

use nodewarden_testkit::{median, metric, proc_stat_fields, remove_tree, worst};

/// Fields of a process's `/proc/PID/stat` after the command ([`proc_stat_fields`]), by index there.
fn stat_fields<const N: usize>(pid: u32, indices: [usize; N]) -> Result<[u64; N]> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let (_, fields) = proc_stat_fields(&stat).context("malformed /proc/PID/stat")?;
    let mut out = [0; N];
    for (o, i) in out.iter_mut().zip(indices) {
        *o = fields.get(i).context("short /proc/PID/stat")?.parse()?;
    }
    Ok(out)
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> Result<u64> {
    // After the command: state is field 0, utime field 11, stime field 12.
    let [user, system] = stat_fields(pid, [11, 12])?;
    Ok(user + system)
}

/// CPU time of each live thread of a process by thread name (`comm`), in ns, from each thread's
/// `/proc/PID/task/TID/schedstat` (the scheduler's own count, not the 10 ms ticks of `stat`). Threads of one name are
/// summed; a thread that exited is missing, so the sum can be below the process's own count.
fn thread_cpu_ns(pid: u32) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return out };
    for task in tasks.flatten() {
        let dir = task.path();
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default().trim().to_owned();
        let ns = std::fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
        if let Some(ns) = ns {
            *out.entry(name).or_default() += ns;
        }
    }
    out
}

/// Major page faults of a process (pages it had to wait for from disk), from `/proc/PID/stat`.
fn major_faults(pid: u32) -> Result<u64> {
    // After the command: state is field 0, majflt field 9.
    let [majflt] = stat_fields(pid, [9])?;
    Ok(majflt)
}

fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("no VmRSS")?;
    Ok(line.split_whitespace().nth(1).context("no VmRSS value")?.parse()?)
}

/// The body of a `GET` answered with 200.
fn get(port: u16, path: &str) -> Option<String> {
    nodewarden_testkit::get(port, path).filter(|(status, _)| *status == 200).map(|(_, body)| body)
}

/// The daemon's `/pods` items; empty when it does not answer.
fn pods(port: u16) -> Vec<serde_json::Value> {
    get(port, "/pods")
        .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
        .and_then(|v| v["items"].as_array().cloned())
        .unwrap_or_default()
}

/// Writes a manifest beside `file` and renames it into place, as config management does.
fn write(dir: &Path, file: &str, text: &str) -> Result<()> {
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, dir.join(file))?;
    Ok(())
}

/// Polls `f` every 50 ms until it holds, for at most `secs`.
/// The `p` quantile (0..=1) of `v`, the nearest rank.
fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).copied().unwrap_or(f64::NAN)
}

fn wait(what: &str, secs: u64, f: impl FnMut() -> bool) -> Result<()> {
    if !nodewarden_testkit::poll(Duration::from_secs(secs), Duration::from_millis(50), f) {
        bail!("{what} did not happen within {secs} s");
    }
    Ok(())
}

struct Guard(Child);

/// Copies a daemon's log out of its directory when dropped, so a failed run leaves it too.
struct KeepLog<'a>(PathBuf, &'a Path);

impl Drop for KeepLog<'_> {
    fn drop(&mut self) {
        let _ = std::fs::copy(&self.0, self.1);
    }
}

/// Writes `config` as `<dir>/config.yaml` and starts `nodewarden run` on it with `args`, its log in
/// `<dir>/daemon.log`.
fn spawn_daemon(bin: &Path, dir: &Path, config: &str, args: &[&str]) -> Result<Child> {
    let cfg = dir.join("config.yaml");
    std::fs::write(&cfg, config)?;
    let log = std::fs::File::create(dir.join("daemon.log"))?;
    let child =
        Command::new(bin).args(["run", "--config"]).arg(&cfg).args(args).stdout(Stdio::null()).stderr(log).spawn()?;
    Ok(child)
}

/// A daemon with its own static pod directory, logs and root below a fresh temporary directory, ready to serve.
/// Dropping it stops the daemon and removes the directory and the cgroup tree.
struct StaticNode {
    guard: Guard,
    dir: PathBuf,
    manifests: PathBuf,
    port: u16,
}

impl StaticNode {
    /// Starts `bin` with `extra` (top-level config lines) and waits until it answers.
    fn start(bin: &Path, name: &str, extra: &str) -> Result<Self> {
        Self::start_with(bin, name, extra, &[])
    }

    /// As [`StaticNode::start`], with more arguments for `nodewarden run`.
    fn start_with(bin: &Path, name: &str, extra: &str, args: &[&str]) -> Result<Self> {
        Self::start_full(bin, name, extra, "", args)
    }

    /// As [`StaticNode::start_with`], with lines of the `nodewarden` section (indented two spaces).
    fn start_full(bin: &Path, name: &str, extra: &str, nodewarden: &str, args: &[&str]) -> Result<Self> {
        remove_tree(&root());
        let dir = std::env::temp_dir().join(format!("nwbench-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let manifests = dir.join("manifests");
        std::fs::create_dir_all(&manifests)?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupRoot: {ROOT}\n\
             healthzPort: {port}\nstaticPodPath: {}\npodLogsDir: {}\n{extra}nodewarden:\n  rootDir: {}\n  \
             nodeName: bench\n{nodewarden}",
            manifests.display(),
            dir.join("logs").display(),
            dir.join("root").display()
        );
        let child = spawn_daemon(bin, &dir, &config, args)?;
        let node = Self { guard: Guard(child), dir, manifests, port };
        wait("readiness", 60, || get(port, "/readyz").is_some())?;
        Ok(node)
    }

    fn pid(&self) -> u32 {
        self.guard.0.id()
    }
}

impl Drop for StaticNode {
    fn drop(&mut self) {
        let _ = self.guard.0.kill();
        let _ = self.guard.0.wait();
        // `NODEWARDEN_BENCH_LOGS`: a directory where each node's daemon log is kept, to see where a run's time went.
        if let Some(keep) = std::env::var_os("NODEWARDEN_BENCH_LOGS") {
            let name = self.dir.file_name().unwrap_or_default().to_string_lossy().into_owned();
            let _ = std::fs::create_dir_all(&keep);
            let free = (1..).map(|i| Path::new(&keep).join(format!("{name}-{i}.log"))).find(|p| !p.exists());
            if let Some(to) = free {
                let _ = std::fs::copy(self.dir.join("daemon.log"), to);
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        remove_tree(&root());
    }
}

fn one_run(bin: &Path, pods: usize, seconds: u64) -> Result<Sample> {
    remove_tree(&root());
    place_pods(pods)?;
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let dir = std::env::temp_dir().join(format!("nwbench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let cfg = dir.join("config.yaml");
    std::fs::write(
        &cfg,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupRoot: {ROOT}\nhealthzPort: {port}\n"
        ),
    )?;
    let child =
        Command::new(bin).args(["run", "--config"]).arg(&cfg).stdout(Stdio::null()).stderr(Stdio::null()).spawn()?;
    let guard = Guard(child);
    let pid = guard.0.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    while get(port, "/readyz").is_none() {
        if Instant::now() > deadline {
            bail!("nodewarden was not ready within 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Let start-up settle, then sample a steady-state window.
    std::thread::sleep(Duration::from_secs(2));
    let before = get(port, "/metrics").context("no metrics")?;
    let (t0, c0) = (Instant::now(), cpu_ticks(pid)?);
    std::thread::sleep(Duration::from_secs(seconds));
    let (t1, c1) = (Instant::now(), cpu_ticks(pid)?);
    let after = get(port, "/metrics").context("no metrics")?;
    let rss = rss_kib(pid)?;
    let hz = 100.0; // USER_HZ on Linux
    let cpu_percent = (c1 - c0) as f64 / hz / (t1 - t0).as_secs_f64() * 100.0;
    let sum = |t: &str| metric(t, "nodewarden_housekeeping_duration_seconds_sum").unwrap_or(0.0);
    let count = |t: &str| metric(t, "nodewarden_housekeeping_duration_seconds_count").unwrap_or(0.0);
    let passes = (count(&after) - count(&before)).max(1.0);
    let pods_seen = ["Guaranteed", "Burstable", "BestEffort"]
        .iter()
        .filter_map(|q| metric(&after, &format!("nodewarden_pods{{qos_class=\"{q}\"}}")))
        .sum::<f64>();
    drop(guard);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Sample {
        rss_mib: rss as f64 / 1024.0,
        cpu_percent,
        pass_ms: (sum(&after) - sum(&before)) / passes * 1000.0,
        pods_seen,
    })
}
