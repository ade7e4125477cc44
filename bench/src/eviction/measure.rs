//! One run of a scenario against one agent: the pods started and ready, the signal sampled every millisecond,
//! the workload released at once (its go file), then what the agent did and when.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nodewarden_resources::{HostPaths, fs_stats, node_memory, pid_stats};

use super::node::{Killed, Node, PodDef, Setup, pod_name};
use super::{Agent, Kind, MEMORY_THRESHOLD, MIB, Options, PID_HEADROOM, Scenario};
use crate::hog::{marker, monotonic};
use crate::{cpu_ticks, get, major_faults, rss_kib, thread_cpu_ns, wait};

/// How far around the crossing the zoomed series reaches, in ms.
pub const ZOOM_MS: f64 = 150.0;

/// One run's outcome, as saved in the raw file.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Outcome {
    /// The scenario's key.
    pub scenario: char,
    /// The pods the kernel OOM-killed.
    pub oom_kills: Vec<String>,
    /// Pods that got SIGTERM, by time.
    pub sigterms: Vec<(f64, String)>,
    /// Crossing (the agent's own signal) → SIGTERM delivered (the victim's handler ran), ms.
    pub latency_ms: Option<f64>,
    /// Crossing → a thread of the victim, woken by its handler, ran, ms: what sessions before the seventh measured
    /// as the delivery.
    #[serde(default)]
    pub handled_ms: Option<f64>,
    /// The daemon's own view: the pass's observation → SIGTERM sent (from `/evictions`), ms.
    pub decision_ms: Option<f64>,
    /// Crossing → the daemon's eviction record (the victim chosen; its wall-clock time moved to this clock), ms.
    pub decided_ms: Option<f64>,
    /// The lowest value of the agent's signal (MiB, or PIDs).
    pub min_available: f64,
    /// The threshold (MiB, or PIDs).
    pub threshold: f64,
    pub guaranteed_ok: Option<bool>,
    /// The agent's CPU from the workload's release to 1 s after its first action, % of one CPU.
    pub cpu_percent: Option<f64>,
    pub rss_mib: Option<f64>,
    /// The daemon's eviction wake-ups over the same window (`nodewarden_eviction_wakeups_total`).
    pub passes: Option<f64>,
    /// The agent's major page faults over the same window: code or data it had to wait for from disk.
    #[serde(default)]
    pub major_faults: Option<f64>,
    /// How long some task of the daemon's cgroup stalled on memory over the same window (its `memory.pressure`
    /// `some total`), ms: page-ins and direct reclaim.
    #[serde(default)]
    pub stall_ms: Option<f64>,
    /// Whether the agent had evicted a first hog before this run's ([`WARM_UP`]).
    #[serde(default)]
    pub warmed_up: bool,
    /// Whether the hogs kept their memory on 4 KiB pages (`--small-pages`).
    #[serde(default)]
    pub small_pages: bool,
    /// The agent's CPU over the same window by thread name, ms (the scheduler's count, of threads alive at its
    /// end).
    #[serde(default)]
    pub thread_cpu_ms: BTreeMap<String, f64>,
    /// (s since release, value) over the whole run, downsampled; the first run of each agent only.
    pub series: Vec<(f64, f64)>,
    /// (ms since the crossing, value) within ±[`ZOOM_MS`] of it, every sample.
    pub zoom: Vec<(f64, f64)>,
    /// The crossing, s since release.
    pub crossing_s: Option<f64>,
}

impl Outcome {
    /// The first pod acted on: by SIGTERM, else by the kernel's OOM kill.
    pub fn victim_pod(&self) -> Option<&str> {
        self.sigterms.first().map(|(_, p)| p.as_str()).or(self.oom_kills.first().map(String::as_str))
    }

    pub fn victim(&self) -> String {
        match (self.sigterms.first(), self.oom_kills.first()) {
            (Some((_, pod)), _) => pod.clone(),
            (None, Some(k)) => format!("{k} (OOM kill)"),
            (None, None) => "none".into(),
        }
    }

    /// How far the signal went below the threshold (MiB, or PIDs); 0 when it never did.
    pub fn overshoot(&self) -> f64 {
        (self.threshold - self.min_available).max(0.0)
    }

    /// The overshoot in three parts that add up to it, from the zoomed series: how far below the threshold the
    /// signal's first sample below it already was (the size of the signal's own steps decides it, whatever the
    /// agent), how much further it fell between the crossing and SIGTERM reaching the victim (the agent's part;
    /// none when SIGTERM came first), and how much further after that (the victim's way out). `None` for a run
    /// without a SIGTERM, or whose SIGTERM came after the zoomed series ends.
    pub fn overshoot_parts(&self) -> Option<OvershootParts> {
        let latency = self.latency_ms?.max(0.0);
        if self.zoom.last().is_none_or(|(t, _)| *t < latency) {
            return None;
        }
        let lowest_until =
            |until: f64| self.zoom.iter().filter(|(t, _)| (0.0..=until).contains(t)).map(|(_, v)| *v).reduce(f64::min);
        let at_crossing = lowest_until(0.0)?;
        let at_sigterm = lowest_until(latency)?;
        Some(OvershootParts {
            at_crossing: (self.threshold - at_crossing).max(0.0),
            until_sigterm: at_crossing - at_sigterm,
            after_sigterm: (at_sigterm - self.min_available).max(0.0),
        })
    }
}

/// [`Outcome::overshoot_parts`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OvershootParts {
    /// Threshold − the first sample below it.
    pub at_crossing: f64,
    /// The further fall from the crossing to SIGTERM delivered.
    pub until_sigterm: f64,
    /// The further fall from SIGTERM delivered to the signal's lowest point.
    pub after_sigterm: f64,
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

/// The signal `agent` acts on, of a read's two: earlyoom watches the kernel's `MemAvailable`, the others the
/// scenario's signal as the daemon computes it.
fn own_signal(agent: Agent, value: f64, mem_available: f64) -> f64 {
    if agent == Agent::Earlyoom { mem_available } else { value }
}

/// Reads the scenario's signal through the resources crate, as the daemon computes it; 0 where unreadable.
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

/// The kernel's count of OOM kills since boot (`oom_kill` in `/proc/vmstat`): a cheap read while the workload
/// runs, where running `dmesg` every 100 ms took a CPU of the guest from the agent under test.
fn oom_kill_count() -> Result<u64> {
    let vmstat = std::fs::read_to_string("/proc/vmstat").context("cannot read /proc/vmstat")?;
    vmstat
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
        .context("/proc/vmstat has no oom_kill count")
}

/// The kernel's `oom-kill:` lines (one per OOM kill, with the victim's cgroup).
fn oom_kill_lines() -> Vec<String> {
    let out = Command::new("dmesg").output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    out.unwrap_or_default().lines().filter(|l| l.contains("oom-kill:")).map(str::to_owned).collect()
}

/// The pod an `oom-kill:` line names through its `task_memcg=/.../pod<UID>/...`, by the pods' UIDs; else the
/// killed task's name.
fn killed_pod(line: &str, uids: &BTreeMap<String, String>) -> String {
    let field = |key: &str| line.split(',').find_map(|f| f.trim().strip_prefix(key)).unwrap_or_default().to_owned();
    let memcg = field("task_memcg=");
    let uid = memcg.split('/').find_map(|c| c.strip_prefix("pod")).unwrap_or_default();
    uids.get(uid).cloned().unwrap_or_else(|| field("task="))
}

fn resources(memory: &str, cpu: Option<&str>, limits: bool) -> serde_json::Value {
    let mut r = serde_json::json!({"memory": memory});
    if let Some(c) = cpu {
        r["cpu"] = c.into();
    }
    if limits { serde_json::json!({"requests": r, "limits": r}) } else { serde_json::json!({"requests": r}) }
}

/// Scenario a's hog, and the warm-up's: 16 MiB every 20 ms until SIGTERM.
const HOG_A: [&str; 4] = ["--grow-mb", "16", "--every-ms", "20"];

/// The pod a warmed-up run's agent evicts first (scenario a's hog, released by its own go file).
const WARM_UP: &str = "warm-up";

/// The pods that must survive, the workload, and the warm-up hog.
fn pods(sc: &Scenario, bench: &Path, base: &Path, small_pages: bool) -> (Vec<PodDef>, Vec<PodDef>, PodDef) {
    let hog_a: Vec<&str> = HOG_A.iter().copied().chain(small_pages.then_some("--small-pages")).collect();
    let hog = |name: &str, extra: &[&str], go: Option<&str>| -> Vec<String> {
        let mut v = vec![bench.display().to_string(), "hog".into()];
        v.extend(extra.iter().map(|s| (*s).to_owned()));
        v.push("--term-file".into());
        v.push(base.join(format!("term-{name}")).display().to_string());
        if let Some(go) = go {
            v.push("--go-file".into());
            v.push(base.join(go).display().to_string());
        }
        v
    };
    let def = |name: &str, argv: Vec<String>, resources: Option<serde_json::Value>, volume: bool| PodDef {
        name: name.to_owned(),
        argv,
        resources,
        volume,
    };
    let baseline = match sc.kind {
        Kind::Memory => {
            let cmd = ["stress-ng", "--vm", "1", "--vm-bytes", "150M", "--vm-keep", "--timeout", "600s", "--quiet"];
            let argv = cmd.iter().map(|s| (*s).to_owned()).collect();
            def("guaranteed", argv, Some(resources("200Mi", Some("100m"), true)), false)
        }
        Kind::Pids => def("quiet", hog("quiet", &["--fork", "2", "--steps", "1"], None), None, false),
        Kind::Disk => {
            def("quiet", hog("quiet", &["--write-dir", "/mnt", "--write-mb", "4", "--steps", "1"], None), None, true)
        }
    };
    let workload = match sc.key {
        'a' => vec![def("hog", hog("hog", &hog_a, Some("go")), None, false)],
        // b1 always holds the most above its request, so the kubelet's ranking picks it whenever the node crosses.
        'b' => [("b1", "12"), ("b2", "6"), ("b3", "6"), ("b4", "4")]
            .into_iter()
            .map(|(n, mb)| {
                let argv = hog(n, &["--grow-mb", mb, "--every-ms", "20", "--steps", "30"], Some("go"));
                def(n, argv, Some(resources("64Mi", None, false)), false)
            })
            .collect(),
        'c' => vec![def(
            "forker",
            hog("forker", &["--fork", "50", "--every-ms", "20", "--steps", "60"], Some("go")),
            None,
            false,
        )],
        _ => vec![def(
            "writer",
            hog("writer", &["--write-dir", "/mnt", "--write-mb", "8", "--every-ms", "50", "--steps", "30"], Some("go")),
            None,
            true,
        )],
    };
    let warm_up = def(WARM_UP, hog(WARM_UP, &hog_a, Some("go-warm-up")), None, false);
    (vec![baseline], workload, warm_up)
}

/// The daemon's `nodewarden_eviction_wakeups_total`, summed over the sources (each wake-up runs one pass at
/// most).
fn wakeups(port: Option<u16>) -> Option<f64> {
    let text = get(port?, "/metrics")?;
    let values: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("nodewarden_eviction_wakeups_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// `some total` of the daemon's cgroup's `memory.pressure`, µs.
fn memory_stall_us() -> Option<u64> {
    let text = std::fs::read_to_string(format!("/sys/fs/cgroup{}/nodewarden/memory.pressure", crate::ROOT)).ok()?;
    let some = text.lines().find(|l| l.starts_with("some "))?;
    some.split_whitespace().find_map(|f| f.strip_prefix("total="))?.parse().ok()
}

/// How long the node rests after the warm-up, once its memory is back: longer than the daemon's
/// `evictionPressureTransitionPeriod` (5 s), so that MemoryPressure is off again, as before a run without warm-up.
const WARM_UP_REST: Duration = Duration::from_secs(6);

/// Releases the warm-up hog, waits until the agent signalled it and the agent's own signal is back 256 MiB above the
/// threshold, then lets the node rest. Fails when the kernel OOM-killed anything meanwhile, or when a pod of the
/// workload (`workload_terms`, their SIGTERM files) was signalled instead.
fn evict_warm_up(agent: Agent, base: &Path, term: &Path, workload_terms: &[PathBuf], threshold: f64) -> Result<()> {
    let kills = oom_kill_count()?;
    std::fs::write(base.join("go-warm-up"), "")?;
    wait("the warm-up hog signalled", 60, || term.exists() || oom_kill_count().is_ok_and(|k| k > kills))?;
    let host = HostPaths::default();
    let back = threshold + (256 * MIB) as f64;
    let signal = || {
        let (value, mem_available) = read_signal(Kind::Memory, &host, base);
        own_signal(agent, value, mem_available)
    };
    wait("the memory back after the warm-up", 60, || signal() >= back)?;
    std::thread::sleep(WARM_UP_REST);
    if oom_kill_count()? > kills {
        bail!("the kernel OOM-killed during the warm-up");
    }
    if let Some(t) = workload_terms.iter().find(|t| t.exists()) {
        bail!("a workload pod was signalled during the warm-up ({})", t.display());
    }
    Ok(())
}

/// Runs the scenario once (after a warm-up eviction when `opts` asks); `keep_series` keeps the whole signal for the
/// ramp plot; the daemon's log is copied into `logs`.
pub fn one_run(
    sc: &Scenario,
    agent: Agent,
    nodewarden: &Path,
    keep_series: bool,
    opts: Options,
    logs: Option<&Path>,
) -> Result<Outcome> {
    let setup = Setup::new(sc.kind)?;
    let base = setup.base.clone();
    let host = HostPaths::default();
    let threshold = match sc.kind {
        Kind::Memory => MEMORY_THRESHOLD as f64,
        Kind::Pids => (read_signal(Kind::Pids, &host, &base).0 - PID_HEADROOM as f64).max(1.0),
        Kind::Disk => read_signal(Kind::Disk, &host, &base).0 * 0.25,
    };
    let mut node = Node::start(sc, agent, nodewarden, &setup.dir, &base, threshold)?;
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
    let agent_pid = earlyoom.as_ref().map(|e| e.0.id()).or(node.daemon_pid());

    let bench = std::env::current_exe()?;
    let (baseline, workload, warm_up_pod) = pods(sc, &bench, &base, opts.small_pages);
    for p in &baseline {
        node.start_pod(p, &base)?;
    }
    let names: Vec<&str> = baseline.iter().map(|p| p.name.as_str()).collect();
    wait("the baseline pods running", 120, || node.running(&names).iter().all(|r| *r))?;
    std::thread::sleep(Duration::from_secs(2));
    // The warm-up hog starts with the workload: once the node has been under pressure, a daemon admits no more
    // BestEffort pods for the transition period.
    let warm_up = opts.warm_up.then_some(&warm_up_pod);
    for p in workload.iter().chain(warm_up) {
        node.start_pod(p, &base)?;
    }
    let term = |name: &str| base.join(format!("term-{name}"));
    let ready = |p: &PodDef| marker(&term(&p.name), "ready").exists();
    wait("the workload ready", 120, || workload.iter().chain(warm_up).all(ready))?;
    // Let the pod starts' own work settle: the window below is the pressure alone.
    std::thread::sleep(Duration::from_millis(1500));
    if warm_up.is_some() {
        let terms: Vec<PathBuf> = workload.iter().map(|p| term(&p.name)).collect();
        evict_warm_up(agent, &base, &term(WARM_UP), &terms, threshold)?;
    }
    let kills_before = oom_kill_lines().len();
    let kill_count_before = oom_kill_count()?;
    let passes0 = wakeups(node.port());
    let sampler = Sampler::start(sc.kind, base.clone());
    std::thread::sleep(Duration::from_millis(200));
    let c0 = agent_pid.map(cpu_ticks).transpose()?;
    let threads0 = agent_pid.map(thread_cpu_ns).unwrap_or_default();
    let f0 = agent_pid.map(major_faults).transpose()?;
    let s0 = node.daemon_pid().and_then(|_| memory_stall_us());
    let (t0, started) = (monotonic(), Instant::now());
    let wall_offset = jiff::Timestamp::now().as_nanosecond() as f64 / 1e9 - monotonic();
    std::fs::write(base.join("go"), "")?;
    // Until the expected victim got SIGTERM, the kernel killed something, every workload pod is done growing, or
    // the scenario's time is up: file reads only, so the agent is not disturbed by the harness meanwhile.
    let limit = Duration::from_secs(if agent == Agent::KubeletLike { 40 } else { 30 });
    let mut n = 0u32;
    while started.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(10));
        n += 1;
        // The kernel's OOM kill count every 100 ms: a read of /proc/vmstat costs more than a file's existence.
        let acted = term(sc.expected).exists()
            || workload.iter().any(|p| term(&p.name).exists())
            || (n.is_multiple_of(10) && oom_kill_count()? > kill_count_before);
        if acted || workload.iter().all(|p| marker(&term(&p.name), "done").exists()) {
            break;
        }
    }
    std::thread::sleep(Duration::from_secs(1));
    let c1 = agent_pid.map(cpu_ticks).transpose()?;
    let threads1 = agent_pid.map(thread_cpu_ns).unwrap_or_default();
    let f1 = agent_pid.map(major_faults).transpose()?;
    let s1 = node.daemon_pid().and_then(|_| memory_stall_us());
    let elapsed = started.elapsed().as_secs_f64();
    let rss = agent_pid.map(rss_kib).transpose()?;
    let samples = sampler.finish();
    let passes1 = wakeups(node.port());
    let guaranteed_ok = (sc.kind == Kind::Memory).then(|| node.running(&["guaranteed"])[0]);
    let uids = node.uids();
    let oom_kills: Vec<String> = oom_kill_lines().iter().skip(kills_before).map(|l| killed_pod(l, &uids)).collect();
    // Each victim's file: when its handler ran, then when its thread woken by the handler ran.
    let mut sigterms: Vec<(f64, f64, String)> = workload
        .iter()
        .filter_map(|p| {
            let text = std::fs::read_to_string(term(&p.name)).ok()?;
            let mut times = text.split_whitespace().map(str::parse::<f64>);
            let delivered = times.next()?.ok()?;
            let handled = times.next().and_then(Result::ok).unwrap_or(delivered);
            Some((delivered, handled, p.name.clone()))
        })
        .collect();
    sigterms.sort_by(|a, b| a.0.total_cmp(&b.0));
    let record = node
        .port()
        .and_then(|p| get(p, "/evictions"))
        .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
        .and_then(|v| {
            // The measured eviction's record, not the warm-up's.
            let warm_up = format!("/{}", pod_name(WARM_UP));
            v["evictions"]
                .as_array()?
                .iter()
                .find(|r| r["pod"].as_str().is_some_and(|p| !p.ends_with(&warm_up)))
                .cloned()
        });
    let decision_ms = record.as_ref().and_then(|r| r["sigterm_latency_seconds"].as_f64()).map(|s| s * 1000.0);
    // The record's wall-clock time, on CLOCK_MONOTONIC.
    let decided = record.as_ref().and_then(|r| r["time"].as_str()?.parse::<jiff::Timestamp>().ok()).map(|t| {
        let wall = t.as_nanosecond() as f64 / 1e9;
        wall - wall_offset
    });
    if let Some(logs) = logs {
        let _ = std::fs::create_dir_all(logs);
        let _ = std::fs::copy(setup.dir.join("daemon.log"), logs.join(format!("{}-{}.log", agent.key(), sc.key)));
    }
    drop(earlyoom);
    drop(node);
    drop(setup);

    let value = |s: &Sample| own_signal(agent, s.value, s.mem_available);
    let after: Vec<&Sample> = samples.iter().filter(|s| s.t >= t0).collect();
    let crossing = after.iter().find(|s| value(s) < threshold).map(|s| s.t);
    let since_crossing = |t: Option<f64>| crossing.zip(t).map(|(c, t)| (t - c) * 1000.0);
    let latency_ms = since_crossing(sigterms.first().map(|s| s.0));
    let handled_ms = since_crossing(sigterms.first().map(|s| s.1));
    let decided_ms = since_crossing(decided);
    let unit = if sc.kind == Kind::Pids { 1.0 } else { MIB as f64 };
    let min_available = after.iter().map(|s| value(s)).fold(f64::MAX, f64::min) / unit;
    let cpu_percent = match (c0, c1) {
        (Some(a), Some(b)) => Some((b - a) as f64 / 100.0 / elapsed * 100.0),
        _ => None,
    };
    let thread_cpu_ms = threads1
        .into_iter()
        .map(|(name, ns)| {
            let before = threads0.get(&name).copied().unwrap_or(0);
            (name, ns.saturating_sub(before) as f64 / 1e6)
        })
        .collect();
    let stride = (after.len() / 2000).max(1);
    let series =
        if keep_series { after.iter().step_by(stride).map(|s| (s.t - t0, value(s) / unit)).collect() } else { vec![] };
    let zoom = crossing.map_or_else(Vec::new, |c| {
        samples.iter().map(|s| ((s.t - c) * 1000.0, value(s) / unit)).filter(|(ms, _)| ms.abs() <= ZOOM_MS).collect()
    });
    Ok(Outcome {
        scenario: sc.key,
        oom_kills,
        sigterms: sigterms.into_iter().map(|(t, _, p)| (t - t0, p)).collect(),
        latency_ms,
        handled_ms,
        decision_ms,
        decided_ms,
        min_available,
        threshold: threshold / unit,
        guaranteed_ok,
        cpu_percent,
        rss_mib: rss.map(|k| k as f64 / 1024.0),
        warmed_up: warm_up.is_some(),
        small_pages: opts.small_pages,
        thread_cpu_ms,
        passes: passes0.zip(passes1).map(|(a, b)| b - a),
        major_faults: f0.zip(f1).map(|(a, b)| b.saturating_sub(a) as f64),
        stall_ms: s0.zip(s1).map(|(a, b)| b.saturating_sub(a) as f64 / 1000.0),
        series,
        zoom,
        crossing_s: crossing.map(|c| c - t0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(latency_ms: Option<f64>, zoom: &[(f64, f64)], min_available: f64) -> Outcome {
        Outcome {
            scenario: 'a',
            oom_kills: Vec::new(),
            sigterms: Vec::new(),
            latency_ms,
            handled_ms: None,
            decision_ms: None,
            decided_ms: None,
            min_available,
            threshold: 120.0,
            guaranteed_ok: None,
            cpu_percent: None,
            rss_mib: None,
            passes: None,
            major_faults: None,
            stall_ms: None,
            warmed_up: false,
            small_pages: false,
            thread_cpu_ms: BTreeMap::new(),
            series: Vec::new(),
            zoom: zoom.to_vec(),
            crossing_s: None,
        }
    }

    #[test]
    fn the_overshoot_splits_at_the_crossing_and_at_sigterm() {
        // 121.8 before; the crossing sample 117.8; 113.8 at 3 ms, before SIGTERM at 5 ms; 109.8 at 9 ms.
        let zoom = [(-2.0, 121.8), (0.0, 117.8), (3.0, 113.8), (5.0, 113.8), (9.0, 109.8), (20.0, 400.0)];
        let o = run(Some(5.0), &zoom, 109.8);
        let p = o.overshoot_parts().unwrap();
        assert!((p.at_crossing - 2.2).abs() < 1e-9, "{p:?}");
        assert!((p.until_sigterm - 4.0).abs() < 1e-9, "{p:?}");
        assert!((p.after_sigterm - 4.0).abs() < 1e-9, "{p:?}");
        assert!((p.at_crossing + p.until_sigterm + p.after_sigterm - o.overshoot()).abs() < 1e-9);
    }

    #[test]
    fn a_sigterm_before_the_crossing_leaves_the_agent_no_part() {
        let zoom = [(-1.0, 121.0), (0.0, 119.0), (4.0, 115.0), (30.0, 300.0)];
        let p = run(Some(-3.0), &zoom, 115.0).overshoot_parts().unwrap();
        assert!((p.at_crossing - 1.0).abs() < 1e-9 && p.until_sigterm == 0.0, "{p:?}");
        assert!((p.after_sigterm - 4.0).abs() < 1e-9, "{p:?}");
    }

    #[test]
    fn a_run_without_sigterm_or_zoom_has_no_parts() {
        assert_eq!(run(None, &[(0.0, 119.0)], 100.0).overshoot_parts(), None);
        assert_eq!(run(Some(2.0), &[], 100.0).overshoot_parts(), None);
    }

    #[test]
    fn a_sigterm_after_the_zoom_leaves_the_parts_unknown() {
        // The signal may have fallen further between the zoom's end and the SIGTERM: not the victim's part.
        let zoom = [(0.0, 119.0), (100.0, 115.0), (150.0, 111.0)];
        assert_eq!(run(Some(240.0), &zoom, 99.0).overshoot_parts(), None);
        assert!(run(Some(150.0), &zoom, 99.0).overshoot_parts().is_some());
    }
}
