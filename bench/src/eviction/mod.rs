//! `eviction`: stress scenarios against each agent that could save the node. Each agent runs **alone**:
//!
//! - `kernel`: no agent; the bench places the pods itself through the resources library (same cgroups, limits and
//!   `oom_score_adj` as the daemon) and the kernel OOM killer is all there is;
//! - `earlyoom`: the same pods placed by the bench, with earlyoom (Debian package) watching `MemAvailable`
//!   (memory scenarios only) and no nodewarden daemon running beside it;
//! - `kubelet-like`: nodewarden with the kubelet's cadence: one observation every 10 s, no pressure events;
//! - `nodewarden`: nodewarden's defaults (a poll that shrinks as headroom shrinks, PSI and memory.events).
//!
//! Scenarios: (a) a BestEffort hog ramping into a node that also runs a Guaranteed workload; (b) four Burstable
//! pods over their requests; (c) a fork bomb against `pid.available`; (d) a disk filler against
//! `nodefs.available` on a tmpfs of its own. The workload is the `hog` subcommand, which waits for a go file,
//! then grows, and records when SIGTERM reached it; a sampler reads the signal every millisecond, so crossing →
//! SIGTERM is measured from the outside on one clock. With `--warm-up` (scenario a, earlyoom and nodewarden), each
//! run's agent first evicts a hog of the same kind, and the measured eviction is its second: under QEMU TCG a
//! path's first run is mostly the emulator translating it (`bench/cold-code`).
//!
//! Each invocation writes its runs to `<out>/eviction-raw/<agent>.json` and then the report of every raw file
//! there (`eviction.md` and the plots), so agents measured in separate VM boots (`bench/run eviction` boots one
//! per agent) end up in one table; `eviction-report` re-renders the report on the host.

mod measure;
mod node;
mod report;

use std::path::Path;

use anyhow::{Context, Result, bail};
use nodewarden_resources::{HostPaths, node_memory};

pub use report::write as report;

const MIB: u64 = 1 << 20;

/// The agents compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Agent {
    Kernel,
    Earlyoom,
    KubeletLike,
    Nodewarden,
}

impl Agent {
    const ALL: [Agent; 4] = [Agent::Kernel, Agent::Earlyoom, Agent::KubeletLike, Agent::Nodewarden];

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
            Agent::KubeletLike => "nodewarden, kubelet-like (10 s, no events, normal scheduler)",
            Agent::Nodewarden => "nodewarden (default)",
        }
    }

    /// A short name, for plot legends.
    fn short(self) -> &'static str {
        match self {
            Agent::Kernel => "kernel only",
            Agent::Earlyoom => "earlyoom",
            Agent::KubeletLike => "kubelet-like",
            Agent::Nodewarden => "nodewarden",
        }
    }

    /// True when a nodewarden daemon runs the pods; else the bench places them itself.
    fn daemon(self) -> bool {
        matches!(self, Agent::KubeletLike | Agent::Nodewarden)
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

/// The agents a scenario is measured with.
fn agents_of(sc: &Scenario) -> &'static [Agent] {
    if sc.kind == Kind::Memory { &Agent::ALL } else { &[Agent::Kernel, Agent::KubeletLike, Agent::Nodewarden] }
}

/// The memory threshold of the memory scenarios (the design's measurements used the same).
const MEMORY_THRESHOLD: u64 = 120 * MIB;
/// Processes the fork scenario may start before crossing.
const PID_HEADROOM: u64 = 1000;
/// The disk scenario's file system.
const DISK_SIZE_MIB: u64 = 256;

/// How scenario a's runs are made.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// The agent evicts a first hog before the measured one (earlyoom and nodewarden).
    pub warm_up: bool,
    /// The hogs keep their memory on 4 KiB pages.
    pub small_pages: bool,
}

/// Runs the scenarios (by key, `abcd`) `runs` times against each agent named in `agents` (comma-separated
/// keys, or `all`), adds the runs to `out/eviction-raw/`, and writes the report of every raw file there.
pub fn run(nodewarden: &Path, scenarios: &str, agents: &str, runs: usize, opts: Options, out: &Path) -> Result<()> {
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    let wanted: Vec<Agent> = if agents == "all" {
        Agent::ALL.to_vec()
    } else {
        agents
            .split(',')
            .map(|k| Agent::ALL.into_iter().find(|a| a.key() == k.trim()).with_context(|| format!("agent {k}")))
            .collect::<Result<_>>()?
    };
    if opts.small_pages && scenarios != "a" {
        bail!("--small-pages is for scenario a");
    }
    if opts.warm_up && (scenarios != "a" || wanted.iter().any(|a| !matches!(a, Agent::Earlyoom | Agent::Nodewarden))) {
        bail!("--warm-up is for scenario a with the earlyoom and nodewarden agents");
    }
    let host = report::Host {
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned(),
        cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        memory_mib: node_memory(&HostPaths::default()).map_or(0, |m| m.capacity >> 20),
    };
    for agent in wanted {
        let mut raw = report::Raw { agent, host: host.clone(), runs: Vec::new() };
        for sc in SCENARIOS.iter().filter(|s| scenarios.contains(s.key) && agents_of(s).contains(&agent)) {
            for r in 1..=runs {
                let logs = agent.daemon().then(|| out.join("eviction-logs").join(format!("run{r}")));
                let o = measure::one_run(sc, agent, nodewarden, r == 1, opts, logs.as_deref())
                    .with_context(|| format!("{} with {}, run {r}", sc.title, agent.name()))?;
                eprintln!(
                    "{} | {} | run {r}: victim {}, latency {} ms (to its woken thread {} ms; crossing → decided {} ms, \
                     decision → SIGTERM {} ms), OOM kills {}, min {:.0}, cpu {} %, wake-ups {}, major faults {}, \
                     daemon memory stall {} ms; CPU by thread, ms: {}",
                    sc.key,
                    agent.name(),
                    o.victim(),
                    report::fmt_opt(o.latency_ms, 1),
                    report::fmt_opt(o.handled_ms, 1),
                    report::fmt_opt(o.decided_ms, 1),
                    report::fmt_opt(o.decision_ms, 1),
                    o.oom_kills.len(),
                    o.min_available,
                    report::fmt_opt(o.cpu_percent, 2),
                    report::fmt_opt(o.passes, 0),
                    report::fmt_opt(o.major_faults, 0),
                    report::fmt_opt(o.stall_ms, 1),
                    o.thread_cpu_ms.iter().map(|(t, ms)| format!("{t} {ms:.1}")).collect::<Vec<_>>().join(", "),
                );
                raw.runs.push(o);
                // Saved after every run: a later run that fails keeps the ones before it.
                report::save(out, &raw)?;
            }
        }
    }
    report::write(out)
}
