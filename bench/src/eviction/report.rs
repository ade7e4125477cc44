//! The report: every agent's raw runs (one file per agent, each maybe from its own VM boot) merged into one
//! Markdown table per scenario and three plots: the ramp (seconds), crossing → SIGTERM of every run (a dot per
//! run, the median marked), and the signal ±100 ms around the crossing.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use nodewarden_testkit::{median_of as median, worst_of as worst};

use super::measure::{Outcome, OvershootParts};
use super::{Agent, Kind, SCENARIOS, Scenario, agents_of};
use crate::svg::{Axis, COLORS, Legend, Mark, Plot};

/// The machine the runs were measured on.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Host {
    pub kernel: String,
    pub cpus: usize,
    pub memory_mib: u64,
}

/// One agent's runs, as saved.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Raw {
    pub agent: Agent,
    pub host: Host,
    pub runs: Vec<Outcome>,
}

fn raw_dir(out: &Path) -> PathBuf {
    out.join("eviction-raw")
}

/// Saves an agent's runs to `out/eviction-raw/<agent>.json`, replacing that agent's earlier file.
pub fn save(out: &Path, raw: &Raw) -> Result<()> {
    let dir = raw_dir(out);
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{}.json", raw.agent.key()));
    std::fs::write(&path, serde_json::to_string(raw)?).with_context(|| format!("cannot write {}", path.display()))
}

fn load(out: &Path) -> Result<Vec<Raw>> {
    let mut raws = Vec::new();
    let dir = raw_dir(out);
    for e in std::fs::read_dir(&dir).with_context(|| format!("no runs in {}", dir.display()))? {
        let path = e?.path();
        if path.extension().is_some_and(|x| x == "json") {
            let text = std::fs::read_to_string(&path)?;
            raws.push(serde_json::from_str::<Raw>(&text).with_context(|| format!("{}", path.display()))?);
        }
    }
    raws.sort_by_key(|r| r.agent);
    Ok(raws)
}

pub fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "—".to_owned(), |x| format!("{x:.digits$}"))
}

fn med_worst(v: &[f64], digits: usize) -> String {
    if v.is_empty() {
        return "—".into();
    }
    format!("{} ({})", fmt_opt(median(v.to_vec()), digits), fmt_opt(worst(v), digits))
}

fn color(agent: Agent) -> &'static str {
    COLORS[Agent::ALL.iter().position(|a| *a == agent).unwrap_or(0) % COLORS.len()]
}

/// Writes `eviction.md` and the plots of every scenario with runs in `out/eviction-raw/`.
pub fn write(out: &Path) -> Result<()> {
    let raws = load(out)?;
    let mut md = String::from("# Eviction under stress (in the VM of deploy/vm)\n\n");
    if let Some(h) = raws.first().map(|r| &r.host) {
        let _ = writeln!(
            md,
            "Kernel {}, {} vCPUs emulated by QEMU TCG, {} MiB of memory. Each agent ran alone, in its own VM boot \
             (the kernel and earlyoom runs have no nodewarden daemon: the bench places the pods itself, with the \
             same cgroups, limits and `oom_score_adj`). Each run releases the workload once its pods are ready. \
             Latency is threshold crossing (the agent's own signal, sampled every 1 ms) → SIGTERM delivered to the \
             victim (its signal handler's CLOCK_MONOTONIC); \"victim's woken thread\" is when a thread of the \
             victim, woken by that handler through a pipe, ran (what this page called the delivery until the \
             seventh session); \"decision → SIGTERM\" is the daemon's own record (the detecting pass's \
             observation → SIGTERM sent). Figures are median (worst) over the runs. Overshoot is how far the \
             signal fell below the threshold; its parts (medians, which need not add up to the overshoot's, and the \
             worst of the agent's part) are how far below it the first sample below it was (the signal falls in \
             steps, of 4 MiB for a hog on transparent huge pages: `bench/signal-steps`), how much further it fell \
             until SIGTERM reached the victim (the agent's part; none when SIGTERM came first), and how much \
             further after that. \"ranking\" counts runs whose first victim (by SIGTERM, or the kernel's OOM kill) \
             is the kubelet's first choice. Agent CPU is from the workload's release to \
             1 s after the first action, RSS at its end.\n",
            h.kernel, h.cpus, h.memory_mib
        );
    }
    for sc in SCENARIOS.iter() {
        let by_agent: Vec<(Agent, Vec<&Outcome>)> = agents_of(sc)
            .iter()
            .filter_map(|a| {
                let runs: Vec<&Outcome> = raws
                    .iter()
                    .filter(|r| r.agent == *a)
                    .flat_map(|r| r.runs.iter().filter(|o| o.scenario == sc.key))
                    .collect();
                (!runs.is_empty()).then_some((*a, runs))
            })
            .collect();
        if by_agent.is_empty() {
            continue;
        }
        table(&mut md, sc, &by_agent);
        let plots = [
            (format!("eviction-{}.svg", sc.key), ramp(sc, &by_agent)),
            (format!("eviction-{}-latency.svg", sc.key), latency(sc, &by_agent)),
            (format!("eviction-{}-zoom.svg", sc.key), zoom(sc, &by_agent)),
        ];
        for (name, svg) in plots {
            std::fs::write(out.join(&name), svg)?;
            let _ = writeln!(md, "![{}]({name})\n", sc.title);
        }
    }
    std::fs::write(out.join("eviction.md"), &md)?;
    print!("\n{md}");
    Ok(())
}

fn table(md: &mut String, sc: &Scenario, by_agent: &[(Agent, Vec<&Outcome>)]) {
    let unit = if sc.kind == Kind::Pids { "PIDs" } else { "MiB" };
    let _ = writeln!(
        md,
        "## {}\n\nExpected first victim: `{}`.\n\n| agent | runs | kernel OOM kills | first victim (runs) | ranking | \
         crossing → SIGTERM, ms | crossing → victim's woken thread, ms | decision → SIGTERM, ms | overshoot, {unit} | \
         overshoot: at the crossing / until SIGTERM / after it, {unit} | Guaranteed survived | agent CPU % | \
         eviction wake-ups | agent major faults | daemon memory stall, ms | agent RSS MiB |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        sc.title, sc.expected
    );
    let mut medians = Vec::new();
    for (agent, runs) in by_agent {
        let lat: Vec<f64> = runs.iter().filter_map(|o| o.latency_ms).collect();
        medians.push((*agent, median(lat.clone())));
        let mut victims: Vec<String> = runs.iter().map(|o| o.victim()).collect();
        victims.sort();
        victims.dedup();
        let counts: Vec<String> =
            victims.iter().map(|v| format!("{v} ×{}", runs.iter().filter(|o| &o.victim() == v).count())).collect();
        let ranked = runs.iter().filter(|o| o.victim_pod() == Some(sc.expected)).count();
        let kills: usize = runs.iter().map(|o| o.oom_kills.len()).sum();
        let survived: Vec<bool> = runs.iter().filter_map(|o| o.guaranteed_ok).collect();
        let survived = if survived.is_empty() {
            "—".to_owned()
        } else {
            format!("{}/{}", survived.iter().filter(|s| **s).count(), survived.len())
        };
        let digits = if sc.kind == Kind::Pids { 0 } else { 1 };
        let col =
            |f: fn(&Outcome) -> Option<f64>, d| med_worst(&runs.iter().filter_map(|o| f(o)).collect::<Vec<_>>(), d);
        let _ = writeln!(
            md,
            "| {}{} | {} | {kills} | {} | {ranked}/{} | {} | {} | {} | {} | {} | {survived} | {} | {} | {} | {} | {} |",
            agent.name(),
            suffix(runs),
            runs.len(),
            counts.join(", "),
            runs.len(),
            med_worst(&lat, 1),
            col(|o| o.handled_ms, 1),
            col(|o| o.decision_ms, 1),
            col(|o| Some(o.overshoot()), digits),
            parts(runs, digits),
            col(|o| o.cpu_percent, 2),
            col(|o| o.passes, 0),
            col(|o| o.major_faults, 0),
            col(|o| o.stall_ms, 1),
            col(|o| o.rss_mib, 1),
        );
    }
    let _ = writeln!(md);
    for (agent, runs) in by_agent {
        let lat: Vec<String> = runs.iter().map(|o| fmt_opt(o.latency_ms, 1)).collect();
        let _ = writeln!(md, "- {}: crossing → SIGTERM per run, ms: {}", agent.name(), lat.join(", "));
    }
    let ours = medians.iter().find(|(a, _)| *a == Agent::Nodewarden).and_then(|(_, m)| *m);
    for (agent, m) in &medians {
        if let (Some(o), Some(m), false) = (ours, m, *agent == Agent::Nodewarden) {
            let _ = writeln!(md, "\nnodewarden's median latency is **{:.2}×** {}'s.", o / m, agent.name());
        }
    }
    let _ = writeln!(md);
}

/// What sets a row's runs apart from the default ones, in its agent column.
fn suffix(runs: &[&Outcome]) -> String {
    let mut s = String::new();
    if runs.iter().all(|o| o.small_pages) {
        s.push_str(", hog on 4 KiB pages");
    }
    if runs.iter().all(|o| o.warmed_up) {
        s.push_str(", second eviction (after a warm-up)");
    }
    s
}

/// The medians of the overshoot's three parts ([`Outcome::overshoot_parts`]) over the runs that have them (how many,
/// when not all), and the worst of the agent's part.
fn parts(runs: &[&Outcome], digits: usize) -> String {
    let parts: Vec<OvershootParts> = runs.iter().filter_map(|o| o.overshoot_parts()).collect();
    if parts.is_empty() {
        return "—".into();
    }
    let part = |f: fn(&OvershootParts) -> f64| fmt_opt(median(parts.iter().map(f).collect()), digits);
    let agents = med_worst(&parts.iter().map(|p| p.until_sigterm).collect::<Vec<_>>(), digits);
    let of =
        if parts.len() < runs.len() { format!(" ({} of {} runs)", parts.len(), runs.len()) } else { String::new() };
    format!("{} / {agents} / {}{of}", part(|p| p.at_crossing), part(|p| p.after_sigterm))
}

/// The first run of each agent over the whole ramp, with a ring where each agent acted.
fn ramp(sc: &Scenario, by_agent: &[(Agent, Vec<&Outcome>)]) -> String {
    let first: Vec<(Agent, &Outcome)> = by_agent.iter().filter_map(|(a, r)| r.first().map(|o| (*a, *o))).collect();
    let threshold = first.first().map_or(0.0, |(_, o)| o.threshold);
    let actions = |o: &Outcome| -> Vec<f64> {
        let mut m: Vec<f64> = o.sigterms.iter().map(|(t, _)| *t).collect();
        if m.is_empty() && !o.oom_kills.is_empty() {
            // The kill's moment is not on this clock; mark where the signal bottomed out.
            if let Some(low) = o.series.iter().min_by(|a, b| a.1.total_cmp(&b.1)) {
                m.push(low.0);
            }
        }
        m
    };
    let x_max = first.iter().flat_map(|(_, o)| actions(o).into_iter().chain(o.crossing_s)).fold(2.0, f64::max) + 0.5;
    let y_max = first.iter().flat_map(|(_, o)| o.series.iter().map(|p| p.1)).fold(threshold * 1.2, f64::max);
    let y_label = match sc.kind {
        Kind::Memory => "memory.available, MiB (earlyoom: MemAvailable)",
        Kind::Pids => "pid.available",
        Kind::Disk => "nodefs.available, MiB",
    };
    let mut p = Plot::new(
        &format!("{}: the first run of each agent", sc.title),
        Axis::linear(-0.2, x_max, "seconds since the workload was released"),
        Axis::linear(0.0, y_max * 1.05, y_label),
        first.len() + 1,
    );
    p.hline(threshold, "threshold");
    let mut legend = Vec::new();
    for (agent, o) in &first {
        let c = color(*agent);
        p.line(&o.series, c, 1.5, 1.0);
        for m in actions(o).into_iter().filter(|m| *m <= x_max) {
            let v = o.series.iter().rev().find(|(x, _)| *x <= m).map_or(threshold, |s| s.1);
            p.dot(m, v, c, true);
        }
        legend.push(Legend { color: c.into(), label: agent.name().into(), mark: Mark::Line });
    }
    legend.push(Legend {
        color: "#555".into(),
        label: "the agent's action (SIGTERM delivered, or the kernel's OOM kill)".into(),
        mark: Mark::Ring,
    });
    p.finish(&legend)
}

/// Crossing → SIGTERM of every run: a row per agent, a dot per run, the median marked.
fn latency(sc: &Scenario, by_agent: &[(Agent, Vec<&Outcome>)]) -> String {
    let all: Vec<f64> = by_agent.iter().flat_map(|(_, r)| r.iter().filter_map(|o| o.latency_ms)).collect();
    // A run whose SIGTERM came before the bench's own samples crossed (the agent read a dip below the threshold
    // that the bench's next sample did not show) has no place on a log scale: it is drawn at the left edge.
    let lo = (all.iter().copied().filter(|l| *l > 0.0).fold(f64::MAX, f64::min).min(1.0) * 0.7).max(0.1);
    let hi = all.iter().copied().fold(10.0, f64::max) * 1.5;
    let rows = by_agent.len() as f64;
    let mut y = Axis::linear(-0.5, rows - 0.5, "");
    y.ticks = false;
    let mut p = Plot::new(
        &format!("{}: crossing → SIGTERM, every run", sc.title),
        Axis::log(lo, hi, "ms from the threshold crossing to SIGTERM delivered (log scale)"),
        y,
        2,
    );
    for (i, (agent, runs)) in by_agent.iter().enumerate() {
        let row = rows - 1.0 - i as f64;
        let c = color(*agent);
        p.row_label(row, agent.short());
        let lat: Vec<f64> = runs.iter().filter_map(|o| o.latency_ms).collect();
        for (j, l) in lat.iter().enumerate() {
            let jitter = ((j % 5) as f64 - 2.0) * 0.06;
            p.dot(l.max(lo), row + jitter, c, false);
        }
        let early = lat.iter().filter(|l| **l <= 0.0).count();
        if early > 0 {
            p.text(lo, row, 6.0, 18.0, &format!("{early} before the bench's own samples crossed (at the left edge)"));
        }
        match median(lat.clone()) {
            Some(m) => {
                p.tick(m.max(lo), row, 22.0, "black");
                p.text(m.max(lo), row, 6.0, -14.0, &format!("median {m:.1} ms ({} runs)", lat.len()));
            }
            None => {
                let kills: usize = runs.iter().map(|o| o.oom_kills.len()).sum();
                p.text(lo, row, 6.0, 4.0, &format!("no SIGTERM in {} runs (kernel OOM kills: {kills})", runs.len()));
            }
        }
    }
    p.finish(&[
        Legend {
            color: "#555".into(),
            label: "one run (spread vertically so they do not hide each other)".into(),
            mark: Mark::Dot,
        },
        Legend { color: "black".into(), label: "the agent's median (vertical bar)".into(), mark: Mark::Line },
    ])
}

/// The signal ±100 ms around the crossing, every run, with a ring at each SIGTERM.
fn zoom(sc: &Scenario, by_agent: &[(Agent, Vec<&Outcome>)]) -> String {
    const HALF: f64 = 100.0;
    let threshold = by_agent.first().and_then(|(_, r)| r.first()).map_or(0.0, |o| o.threshold);
    let inside =
        || by_agent.iter().flat_map(|(_, r)| r.iter().flat_map(|o| o.zoom.iter().filter(|(ms, _)| ms.abs() <= HALF)));
    let lo = inside().map(|p| p.1).fold(threshold, f64::min);
    let hi = inside().map(|p| p.1).fold(threshold, f64::max);
    let pad = ((hi - lo) * 0.08).max(2.0);
    let unit = if sc.kind == Kind::Pids { "" } else { ", MiB" };
    let signal = match sc.kind {
        Kind::Memory => "memory.available (earlyoom: MemAvailable)",
        Kind::Pids => "pid.available",
        Kind::Disk => "nodefs.available",
    };
    let mut p = Plot::new(
        &format!("{}: ±{HALF:.0} ms around the crossing, every run", sc.title),
        Axis::linear(-HALF, HALF, "ms since the agent's signal crossed the threshold"),
        Axis::linear(lo - pad, hi + pad, &format!("{signal}{unit}")),
        by_agent.len() + 1,
    );
    p.hline(threshold, "threshold");
    p.vline(0.0, "crossing");
    let mut legend = Vec::new();
    for (agent, runs) in by_agent {
        let c = color(*agent);
        let mut late = 0;
        for o in runs {
            p.line(&o.zoom, c, 1.2, 0.6);
            match o.latency_ms {
                Some(l) if l <= HALF => {
                    let v = o.zoom.iter().rev().find(|(ms, _)| *ms <= l).map_or(threshold, |s| s.1);
                    p.dot(l, v, c, true);
                }
                Some(_) => late += 1,
                None => {}
            }
        }
        let extra = if late > 0 { format!("; {late} SIGTERM after +{HALF:.0} ms") } else { String::new() };
        legend.push(Legend {
            color: c.into(),
            label: format!("{} ({} runs{extra})", agent.name(), runs.len()),
            mark: Mark::Line,
        });
    }
    legend.push(Legend { color: "#555".into(), label: "SIGTERM delivered".into(), mark: Mark::Ring });
    p.finish(&legend)
}
