//! `reload`: how long a threshold edit takes to be in force, measured from the edit to the new value of
//! `kubelet_eviction_stats{eviction_signal="memory.available"}` in `/metrics`, for the ways operators edit the
//! file: `sed -i` (a temporary file renamed over it), an in-place write, and a write beside it renamed into place.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{KeepLog, StaticNode, get, median, metric, worst};

const GAUGE: &str = "kubelet_eviction_stats{eviction_signal=\"memory.available\"}";
const MIB: u64 = 1 << 20;

/// How an edit is made.
#[derive(Debug, Clone, Copy)]
enum Edit {
    Sed,
    InPlace,
    Rename,
}

impl Edit {
    fn name(self) -> &'static str {
        match self {
            Edit::Sed => "`sed -i`",
            Edit::InPlace => "in-place write",
            Edit::Rename => "write + rename",
        }
    }

    fn apply(self, cfg: &Path, mib: u64) -> Result<()> {
        let text = std::fs::read_to_string(cfg)?;
        let line = |v: u64| format!("memory.available: {v}Mi");
        let old = text.lines().find(|l| l.contains("memory.available:")).context("no threshold line")?.trim();
        let new = text.replace(old, &line(mib));
        match self {
            Edit::Sed => {
                let status = Command::new("sed")
                    .arg("-i")
                    .arg(format!("s/memory.available: .*/{}/", line(mib)))
                    .arg(cfg)
                    .status()?;
                if !status.success() {
                    bail!("sed failed: {status}");
                }
            }
            Edit::InPlace => std::fs::write(cfg, new)?,
            Edit::Rename => {
                let tmp = cfg.with_extension("yaml.new");
                std::fs::write(&tmp, new)?;
                std::fs::rename(&tmp, cfg)?;
            }
        }
        Ok(())
    }
}

/// Times one edit: from just before it to the first `/metrics` that shows the new threshold.
fn one_edit(node: &StaticNode, cfg: &Path, edit: Edit, mib: u64) -> Result<Duration> {
    let want = (mib * MIB) as f64;
    let t0 = Instant::now();
    edit.apply(cfg, mib)?;
    loop {
        let shown = get(node.port, "/metrics").and_then(|m| metric(&m, GAUGE));
        if shown == Some(want) {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > Duration::from_secs(10) {
            bail!("{} to {mib}Mi: the gauge still shows {shown:?} after 10 s", edit.name());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Runs `edits` edits of each kind per run and writes the table to `out`.
pub fn run(bin: &Path, runs: usize, edits: usize, out: &Path) -> Result<()> {
    let kinds = [Edit::Sed, Edit::InPlace, Edit::Rename];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    for run in 0..runs {
        let node = StaticNode::start(bin, "reload", "evictionHard:\n  memory.available: 100Mi\n")?;
        let log = out.with_extension(format!("run{}.daemon.log", run + 1));
        let _log = KeepLog(node.dir.join("daemon.log"), &log);
        let cfg = node.dir.join("config.yaml");
        let mut mib = 100;
        for _ in 0..edits {
            for (i, kind) in kinds.iter().enumerate() {
                mib += 1;
                // Edits a second apart, as a person makes them: each one is its own reload.
                std::thread::sleep(Duration::from_millis(1000));
                let at = jiff::Timestamp::now();
                let took = one_edit(&node, &cfg, *kind, mib)?;
                // With the wall clock, to set beside the daemon's log.
                eprintln!("reload: {} to {mib}Mi at {at}: {:.1} ms", kind.name(), took.as_secs_f64() * 1000.0);
                times[i].push(took.as_secs_f64() * 1000.0);
            }
        }
        eprintln!("reload: run {} of {runs} done", run + 1);
    }
    let mut md = String::from(
        "# Threshold edit → in force\n\nFrom the edit to the first `/metrics` whose `kubelet_eviction_stats` shows the \
         new `memory.available` threshold (polled every 2 ms).\n\n| edit | edits | median (ms) | worst (ms) |\n|---|---|---|---|\n",
    );
    for (kind, t) in kinds.iter().zip(&times) {
        let _ = writeln!(md, "| {} | {} | {:.0} | {:.0} |", kind.name(), t.len(), median(t.clone()), worst(t));
    }
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out, &md)?;
    print!("{md}");
    Ok(())
}
