//! `eviction`: stress scenarios against each agent that could save the node, measured in the same VM:
//!
//! - `kernel`: no eviction at all (nodewarden runs the pods with every threshold disabled): the kernel OOM killer;
//! - `earlyoom`: the same, with earlyoom (Debian package) watching `MemAvailable` (memory scenarios only);
//! - `kubelet-like`: nodewarden with the kubelet's cadence: one observation every 10 s, no pressure events;
//! - `nodewarden`: nodewarden's defaults (a poll that shrinks to 10 ms as headroom shrinks, PSI and memory.events).
//!
//! Scenarios: (a) a BestEffort hog ramping into a node that also runs a Guaranteed workload; (b) four Burstable
//! pods over their requests; (c) a fork bomb against `pid.available`; (d) a disk filler against
//! `nodefs.available` on a tmpfs of its own. The workload is the `hog` subcommand, which records when SIGTERM
//! reached it; a sampler reads the signal every millisecond, so crossing → SIGTERM is measured from the outside
//! on one clock.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nodewarden_resources::{HostPaths, fs_stats, node_memory, pid_stats};

use crate::hog::monotonic;
use crate::svg::{Line, plot};
use crate::{Guard, ROOT, cpu_ticks, get, pods, remove_tree, root, rss_kib, wait, write};

const MIB: u64 = 1 << 20;

/// The agents compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agent {
    Kernel,
    Earlyoom,
    KubeletLike,
    Nodewarden,
}

impl Agent {
    /// The name `--agents` takes.
    fn key(self) -> &'static str {
        match self {
            Agent::Kernel => "kernel",
            Agent::Earlyoom => "earlyoom",
            Agent::KubeletLike => "kubelet-like",
            Agent::Nodewarden => "nodewarden",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Agent::Kernel => "kernel OOM killer only",
            Agent::Earlyoom => "earlyoom",
            Agent::KubeletLike => "nodewarden, kubelet-like (10 s, no events)",
            Agent::Nodewarden => "nodewarden (default)",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Memory,
    Pids,
    Disk,
}

struct Scenario {
    key: char,
    title: &'static str,
    kind: Kind,
    /// The pod the kubelet's ranking evicts first.
    expected: &'static str,
}

const SCENARIOS: [Scenario; 4] = [
    Scenario {
        key: 'a',
        title: "(a) BestEffort hog (16 MiB per 20 ms) beside a Guaranteed stress-ng",
        kind: Kind::Memory,
        expected: "hog",
    },
    Scenario {
        key: 'b',
        title: "(b) four Burstable pods over their 64Mi requests (b1 grows fastest)",
        kind: Kind::Memory,
        expected: "b1",
    },
    Scenario { key: 'c', title: "(c) fork bomb (50 processes per 20 ms)", kind: Kind::Pids, expected: "forker" },
    Scenario {
        key: 'd',
        title: "(d) disk filler (8 MiB per 50 ms) on a 256 MiB nodefs",
        kind: Kind::Disk,
        expected: "writer",
    },
];

/// The memory threshold of the memory scenarios (the design's measurements used the same).
const MEMORY_THRESHOLD: u64 = 120 * MIB;
/// Processes the fork scenario may start before crossing.
const PID_HEADROOM: u64 = 1000;
/// The disk scenario's file system.
const DISK_SIZE_MIB: u64 = 256;

/// One run's outcome.
struct Outcome {
    oom_kills: Vec<String>,
    /// Pods that got SIGTERM, by time.
    sigterms: Vec<(f64, String)>,
    latency_ms: Option<f64>,
    min_available: f64,
    guaranteed_ok: Option<bool>,
    cpu_percent: Option<f64>,
    rss_mib: Option<f64>,
    series: Vec<(f64, f64)>,
    markers: Vec<f64>,
    threshold: f64,
}

impl Outcome {
    /// The first pod acted on: by SIGTERM, else by the kernel's OOM kill.
    fn victim_pod(&self) -> Option<&str> {
        self.sigterms.first().map(|(_, p)| p.as_str()).or(self.oom_kills.first().map(String::as_str))
    }

    fn victim(&self) -> String {
        match (self.sigterms.first(), self.oom_kills.first()) {
            (Some((_, pod)), _) => pod.clone(),
            (None, Some(k)) => format!("{k} (OOM kill)"),
            (None, None) => "none".into(),
        }
    }
}

/// One sample of the scenario's signal, on CLOCK_MONOTONIC.
#[derive(Clone, Copy)]
struct Sample {
    t: f64,
    /// The signal nodewarden evicts on: memory.available, pid.available or nodefs.available.
    value: f64,
    /// The kernel's MemAvailable (earlyoom's signal), for the memory scenarios.
    mem_available: f64,
}

/// Reads the scenario's signal through the resources crate, as the daemon computes it; 0 where unreadable.
#[allow(clippy::cast_precision_loss)]
fn read_signal(kind: Kind, host: &HostPaths, disk: &Path) -> (f64, f64) {
    match kind {
        Kind::Memory => node_memory(host).map_or((0.0, 0.0), |m| (m.available as f64, m.mem_available as f64)),
        Kind::Pids => (pid_stats(host).map_or(0.0, |p| p.available as f64), 0.0),
        Kind::Disk => (fs_stats(disk).map_or(0.0, |f| f.available_bytes as f64), 0.0),
    }
}

/// Reads the scenario's signal every millisecond until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Vec<Sample>>,
}

impl Sampler {
    fn start(kind: Kind, disk: PathBuf) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let host = HostPaths::default();
            let mut out = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let (value, mem_available) = read_signal(kind, &host, &disk);
                out.push(Sample { t: monotonic(), value, mem_available });
                std::thread::sleep(Duration::from_millis(1));
            }
            out
        });
        Self { stop, handle }
    }

    fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// The kernel's `oom-kill:` lines (one per OOM kill, with the victim's cgroup).
fn oom_kill_lines() -> Vec<String> {
    let out = Command::new("dmesg").output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    out.unwrap_or_default().lines().filter(|l| l.contains("oom-kill:")).map(str::to_owned).collect()
}

/// The pod an `oom-kill:` line names through its `task_memcg=/.../pod<UID>/...`, by the pods' UIDs; else the
/// killed task's name.
fn killed_pod(line: &str, list: &[serde_json::Value]) -> String {
    let field = |key: &str| line.split(',').find_map(|f| f.trim().strip_prefix(key)).unwrap_or_default().to_owned();
    let memcg = field("task_memcg=");
    let uid = memcg.split('/').find_map(|c| c.strip_prefix("pod")).unwrap_or_default();
    let name = list
        .iter()
        .find(|p| !uid.is_empty() && p["metadata"]["uid"] == uid)
        .and_then(|p| p["metadata"]["name"].as_str().map(|n| n.trim_end_matches("-bench").to_owned()));
    name.unwrap_or_else(|| field("task="))
}

fn pod<'a>(list: &'a [serde_json::Value], name: &str) -> Option<&'a serde_json::Value> {
    list.iter().find(|p| p["metadata"]["name"] == format!("{name}-bench").as_str())
}

fn running(p: &serde_json::Value) -> bool {
    p["status"]["phase"] == "Running"
        && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
        && p["status"]["containerStatuses"][0]["restartCount"] == 0
}

fn manifest(name: &str, command: &[String], resources: &str, volume: bool) -> String {
    let argv: Vec<String> = command.iter().map(|a| format!("'{a}'")).collect();
    let (mounts, volumes) = if volume {
        ("    volumeMounts:\n    - {name: data, mountPath: /mnt}\n", "  volumes:\n  - name: data\n    emptyDir: {}\n")
    } else {
        ("", "")
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  restartPolicy: Never\n  \
         terminationGracePeriodSeconds: 5\n  containers:\n  - name: app\n    image: busybox\n    command: [{}]\n\
         {resources}{mounts}{volumes}",
        argv.join(", ")
    )
}

struct Setup {
    dir: PathBuf,
    base: PathBuf,
    mounted: bool,
}

impl Drop for Setup {
    fn drop(&mut self) {
        remove_tree(&root());
        if self.mounted {
            let _ = Command::new("umount").arg(&self.base).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn one_run(sc: &Scenario, agent: Agent, nodewarden: &Path) -> Result<Outcome> {
    remove_tree(&root());
    let dir = std::env::temp_dir().join(format!("nwbench-ev-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let base = dir.join("fs");
    std::fs::create_dir_all(&base)?;
    let mut setup = Setup { dir: dir.clone(), base: base.clone(), mounted: false };
    if sc.kind == Kind::Disk {
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={DISK_SIZE_MIB}m"), "tmpfs"])
            .arg(&base)
            .status()?;
        if !st.success() {
            bail!("cannot mount a tmpfs at {}", base.display());
        }
        setup.mounted = true;
    }
    let manifests = base.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    let threshold = match sc.kind {
        Kind::Memory => MEMORY_THRESHOLD as f64,
        Kind::Pids => (read_signal(Kind::Pids, &HostPaths::default(), &base).0 - PID_HEADROOM as f64).max(1.0),
        Kind::Disk => read_signal(Kind::Disk, &HostPaths::default(), &base).0 * 0.25,
    };
    let hard = match (agent, sc.kind) {
        (Agent::Kernel | Agent::Earlyoom, _) => "evictionHard:\n  memory.available: '0'\n".to_owned(),
        (_, Kind::Memory) => format!("evictionHard:\n  memory.available: {}Mi\n", MEMORY_THRESHOLD / MIB),
        (_, Kind::Pids) => format!("evictionHard:\n  pid.available: '{threshold:.0}'\n"),
        (_, Kind::Disk) => "evictionHard:\n  nodefs.available: 25%\n".to_owned(),
    };
    let cadence = if agent == Agent::KubeletLike {
        "  housekeepingInterval: 10s\n  evictionPollMin: 10s\n  pressureEvents: false\n"
    } else {
        ""
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let fs_paths = if sc.kind == Kind::Disk {
        format!("  nodefsPath: {0}\n  imagefsPath: {0}\n", base.display())
    } else {
        String::new()
    };
    let cfg = dir.join("config.yaml");
    std::fs::write(
        &cfg,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupRoot: {ROOT}\n\
             healthzPort: {port}\nstaticPodPath: {}\npodLogsDir: {}\nevictionPressureTransitionPeriod: 5s\n{hard}\
             nodewarden:\n  rootDir: {}\n  nodeName: bench\n{cadence}{fs_paths}",
            manifests.display(),
            base.join("logs").display(),
            base.join("root").display(),
        ),
    )?;
    let log = std::fs::File::create(dir.join("daemon.log"))?;
    let child =
        Command::new(nodewarden).args(["run", "--config"]).arg(&cfg).stdout(Stdio::null()).stderr(log).spawn()?;
    let daemon = Guard(child);
    wait("nodewarden ready", 60, || get(port, "/readyz").is_some())?;
    let earlyoom = if agent == Agent::Earlyoom {
        let kib = (MEMORY_THRESHOLD / 1024).to_string();
        let c = Command::new("earlyoom")
            .args(["-M", &kib, "-r", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("earlyoom (Debian package earlyoom) is needed")?;
        Some(Killed(c))
    } else {
        None
    };
    let agent_pid = match (&earlyoom, agent) {
        (Some(e), _) => Some(e.0.id()),
        (None, Agent::Kernel) => None,
        (None, _) => Some(daemon.0.id()),
    };

    let bench = std::env::current_exe()?;
    let hog = |name: &str, extra: &[&str]| -> Vec<String> {
        let mut v = vec![bench.display().to_string(), "hog".into()];
        v.extend(extra.iter().map(|s| (*s).to_owned()));
        v.push("--term-file".into());
        v.push(base.join(format!("term-{name}")).display().to_string());
        v
    };
    // The baseline: what must survive.
    let guaranteed =
        "    resources:\n      requests: {memory: 200Mi, cpu: 100m}\n      limits: {memory: 200Mi, cpu: 100m}\n";
    let baseline: Vec<&str> = match sc.kind {
        Kind::Memory => {
            let cmd: Vec<String> =
                ["stress-ng", "--vm", "1", "--vm-bytes", "150M", "--vm-keep", "--timeout", "600s", "--quiet"]
                    .iter()
                    .map(|s| (*s).to_owned())
                    .collect();
            write(&manifests, "guaranteed.yaml", &manifest("guaranteed", &cmd, guaranteed, false))?;
            vec!["guaranteed"]
        }
        Kind::Pids => {
            write(
                &manifests,
                "quiet.yaml",
                &manifest("quiet", &hog("quiet", &["--fork", "2", "--steps", "1"]), "", false),
            )?;
            vec!["quiet"]
        }
        Kind::Disk => {
            let cmd = hog("quiet", &["--write-dir", "/mnt", "--write-mb", "4", "--steps", "1"]);
            write(&manifests, "quiet.yaml", &manifest("quiet", &cmd, "", true))?;
            vec!["quiet"]
        }
    };
    wait("the baseline pods running", 120, || {
        let list = pods(port);
        baseline.iter().all(|b| pod(&list, b).is_some_and(running))
    })?;
    std::thread::sleep(Duration::from_secs(2));

    // The workload.
    let burstable = "    resources:\n      requests: {memory: 64Mi}\n";
    let workload: Vec<(&str, String)> = match sc.key {
        'a' => vec![("hog", manifest("hog", &hog("hog", &["--grow-mb", "16", "--every-ms", "20"]), "", false))],
        // b1 always holds the most above its request, so the kubelet's ranking picks it whenever the node crosses.
        'b' => [("b1", "12"), ("b2", "6"), ("b3", "6"), ("b4", "4")]
            .into_iter()
            .map(|(n, mb)| {
                let cmd = hog(n, &["--grow-mb", mb, "--every-ms", "20", "--steps", "30"]);
                (n, manifest(n, &cmd, burstable, false))
            })
            .collect(),
        'c' => vec![(
            "forker",
            manifest("forker", &hog("forker", &["--fork", "50", "--every-ms", "20", "--steps", "60"]), "", false),
        )],
        _ => vec![(
            "writer",
            manifest(
                "writer",
                &hog("writer", &["--write-dir", "/mnt", "--write-mb", "8", "--every-ms", "50", "--steps", "30"]),
                "",
                true,
            ),
        )],
    };
    let kills_before = oom_kill_lines().len();
    let sampler = Sampler::start(sc.kind, base.clone());
    std::thread::sleep(Duration::from_millis(200));
    let c0 = agent_pid.map(cpu_ticks).transpose()?;
    let (t0, started) = (monotonic(), Instant::now());
    for (name, text) in &workload {
        write(&manifests, &format!("{name}.yaml"), text)?;
    }
    // Until every workload pod got SIGTERM or stopped running, or the scenario's time is up.
    let limit = Duration::from_secs(if agent == Agent::KubeletLike { 40 } else { 30 });
    let mut seen_running = false;
    while started.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(100));
        let list = pods(port);
        let states: Vec<bool> = workload.iter().map(|(n, _)| pod(&list, n).is_some_and(running)).collect();
        seen_running |= states.iter().any(|r| *r);
        let acted = base.join(format!("term-{}", sc.expected)).exists() || oom_kill_lines().len() > kills_before;
        if seen_running && (acted || states.iter().all(|r| !r)) {
            break;
        }
    }
    std::thread::sleep(Duration::from_secs(1));
    let c1 = agent_pid.map(cpu_ticks).transpose()?;
    let elapsed = started.elapsed().as_secs_f64();
    let rss = agent_pid.map(rss_kib).transpose()?;
    let samples = sampler.finish();
    let list = pods(port);
    let guaranteed_ok = (sc.kind == Kind::Memory).then(|| pod(&list, "guaranteed").is_some_and(running));
    let oom_kills: Vec<String> = oom_kill_lines().iter().skip(kills_before).map(|l| killed_pod(l, &list)).collect();
    let mut sigterms: Vec<(f64, String)> = workload
        .iter()
        .filter_map(|(n, _)| {
            let text = std::fs::read_to_string(base.join(format!("term-{n}"))).ok()?;
            Some((text.trim().parse::<f64>().ok()?, (*n).to_owned()))
        })
        .collect();
    sigterms.sort_by(|a, b| a.0.total_cmp(&b.0));
    let value = |s: &Sample| if agent == Agent::Earlyoom { s.mem_available } else { s.value };
    let after: Vec<&Sample> = samples.iter().filter(|s| s.t >= t0).collect();
    let crossing = after.iter().find(|s| value(s) < threshold).map(|s| s.t);
    let latency_ms = match (crossing, sigterms.first()) {
        (Some(c), Some((t, _))) => Some((t - c) * 1000.0),
        _ => None,
    };
    let unit = if sc.kind == Kind::Pids { 1.0 } else { MIB as f64 };
    let min_available = after.iter().map(|s| value(s)).fold(f64::MAX, f64::min) / unit;
    #[allow(clippy::cast_precision_loss)]
    let cpu_percent = match (c0, c1) {
        (Some(a), Some(b)) => Some((b - a) as f64 / 100.0 / elapsed * 100.0),
        _ => None,
    };
    let mut markers: Vec<f64> = sigterms.iter().map(|(t, _)| t - t0).collect();
    if sigterms.is_empty() && !oom_kills.is_empty() {
        // The kill's moment is not on this clock; mark where the hog's memory came back.
        if let Some(low) = after.iter().min_by(|a, b| value(a).total_cmp(&value(b))) {
            markers.push(low.t - t0);
        }
    }
    drop(earlyoom);
    drop(daemon);
    #[allow(clippy::cast_precision_loss)]
    Ok(Outcome {
        oom_kills,
        sigterms,
        latency_ms,
        min_available,
        guaranteed_ok,
        cpu_percent,
        rss_mib: rss.map(|k| k as f64 / 1024.0),
        series: after.iter().map(|s| (s.t - t0, value(s) / unit)).collect(),
        markers,
        threshold: threshold / unit,
    })
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "—".to_owned(), |x| format!("{x:.digits$}"))
}

/// Runs the scenarios (by key, `abcd`) `runs` times against each agent named in `agents` (comma-separated
/// keys, or `all`); writes `eviction.md` and one SVG per scenario into `out`.
pub fn run(nodewarden: &Path, scenarios: &str, agents: &str, runs: usize, out: &Path) -> Result<()> {
    let wanted = |a: Agent| agents == "all" || agents.split(',').any(|k| k.trim() == a.key());
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    std::fs::create_dir_all(out)?;
    let mut md = String::from("# Eviction under stress (in the VM of deploy/vm)\n\n");
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let _ = writeln!(
        md,
        "{runs} runs per agent and scenario; kernel {}, {} vCPUs emulated by QEMU TCG, {} MiB of memory. \
         Latency is threshold crossing (the agent's own signal, sampled every 1 ms) → SIGTERM delivered to the \
         victim (its handler's CLOCK_MONOTONIC): median (worst). \"ranking\" counts runs whose first victim (by SIGTERM, or \
         the kernel's OOM kill) is the kubelet's first choice. Agent CPU is over the scenario's window, RSS at its end.\n",
        kernel.trim(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        node_memory(&HostPaths::default()).map_or(0, |m| m.capacity >> 20),
    );
    for sc in SCENARIOS.iter().filter(|s| scenarios.contains(s.key)) {
        let all: &[Agent] = if sc.kind == Kind::Memory {
            &[Agent::Kernel, Agent::Earlyoom, Agent::KubeletLike, Agent::Nodewarden]
        } else {
            &[Agent::Kernel, Agent::KubeletLike, Agent::Nodewarden]
        };
        let agents: Vec<Agent> = all.iter().copied().filter(|a| wanted(*a)).collect();
        let unit = if sc.kind == Kind::Pids { "PIDs" } else { "MiB" };
        let _ = writeln!(
            md,
            "## {}\n\nExpected first victim: `{}`.\n\n| agent | kernel OOM kills | first victim (runs) | ranking | \
             crossing → SIGTERM, ms | min available, {unit} | Guaranteed survived | agent CPU % | agent RSS MiB |\n\
             |---|---|---|---|---|---|---|---|---|",
            sc.title, sc.expected
        );
        let mut lines = Vec::new();
        let mut medians = Vec::new();
        for &agent in &agents {
            let mut outcomes = Vec::new();
            for r in 1..=runs {
                let o = one_run(sc, agent, nodewarden)
                    .with_context(|| format!("{} with {}, run {r}", sc.title, agent.name()))?;
                eprintln!(
                    "{} | {} | run {r}: victim {}, latency {} ms, OOM kills {}, min {:.0}",
                    sc.key,
                    agent.name(),
                    o.victim(),
                    fmt_opt(o.latency_ms, 1),
                    o.oom_kills.len(),
                    o.min_available
                );
                outcomes.push(o);
            }
            let lat: Vec<f64> = outcomes.iter().filter_map(|o| o.latency_ms).collect();
            let worst = lat.iter().copied().fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
            let med = median(lat.clone());
            medians.push((agent, med));
            let mut victims: Vec<String> = outcomes.iter().map(Outcome::victim).collect();
            victims.sort();
            victims.dedup();
            let victim_counts: Vec<String> = victims
                .iter()
                .map(|v| format!("{v} ×{}", outcomes.iter().filter(|o| &o.victim() == v).count()))
                .collect();
            let ranked = outcomes.iter().filter(|o| o.victim_pod() == Some(sc.expected)).count();
            let kills: usize = outcomes.iter().map(|o| o.oom_kills.len()).sum();
            let survived = outcomes.iter().filter_map(|o| o.guaranteed_ok).collect::<Vec<_>>();
            let survived = if survived.is_empty() {
                "—".to_owned()
            } else {
                format!("{}/{}", survived.iter().filter(|s| **s).count(), survived.len())
            };
            let _ = writeln!(
                md,
                "| {} | {kills} | {} | {ranked}/{runs} | {} ({}) | {} | {survived} | {} | {} |",
                agent.name(),
                victim_counts.join(", "),
                fmt_opt(med, 1),
                fmt_opt(worst, 1),
                fmt_opt(median(outcomes.iter().map(|o| o.min_available).collect()), 0),
                fmt_opt(median(outcomes.iter().filter_map(|o| o.cpu_percent).collect()), 2),
                fmt_opt(median(outcomes.iter().filter_map(|o| o.rss_mib).collect()), 1),
            );
            if let Some(first) = outcomes.into_iter().next() {
                lines.push((agent, first));
            }
        }
        let ours = medians.iter().find(|(a, _)| *a == Agent::Nodewarden).and_then(|(_, m)| *m);
        for (agent, m) in &medians {
            if let (Some(o), Some(m), false) = (ours, m, *agent == Agent::Nodewarden) {
                let _ = writeln!(md, "\nnodewarden's median latency is {:.2}× {}'s.", o / m, agent.name());
            }
        }
        let threshold = lines.first().map_or(0.0, |(_, o)| o.threshold);
        let x_max = lines
            .iter()
            .flat_map(|(_, o)| o.markers.iter().copied())
            .fold(4.0, f64::max)
            .min(if sc.kind == Kind::Memory { 14.0 } else { 20.0 })
            + 1.0;
        let plot_lines: Vec<Line> = lines
            .iter()
            .map(|(a, o)| Line { label: a.name().to_owned(), points: o.series.clone(), markers: o.markers.clone() })
            .collect();
        let y_label = match sc.kind {
            Kind::Memory => "memory.available (MiB; earlyoom: MemAvailable)",
            Kind::Pids => "pid.available",
            Kind::Disk => "nodefs.available (MiB)",
        };
        let svg = plot(sc.title, y_label, threshold, &plot_lines, x_max);
        let name = format!("eviction-{}.svg", sc.key);
        std::fs::write(out.join(&name), svg)?;
        let _ = writeln!(md, "\n![{}]({name})\n", sc.title);
    }
    std::fs::write(out.join("eviction.md"), &md)?;
    print!("\n{md}");
    Ok(())
}
