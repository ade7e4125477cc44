//! `saves`: the pod state writes of pods starting together, on a real disk. A pod worker marks its pod's directory
//! as nodewarden's before the pod's cgroup exists (the terminal record, its space reserved; nothing synced), then
//! saves the pod's state once its container started (three syncs on that first save, journal commits on a real
//! disk). The bench does that for `pods` pods at once on a runtime of two threads, in two ways: the save on
//! blocking threads (as the workers do) and on the runtime's own threads (as they did before). It reports the time
//! until all are saved and how late a 1 ms timer on the same runtime ran meanwhile: what the saves cost every other
//! pod's worker.
//!
//! It needs no cgroups and runs on the host: `--dir` should be on the disk that would hold `rootDir` (the
//! default is under `target/`), not on a tmpfs, where a sync costs nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nodewarden_sync::{SavedContainer, SavedPod, mark_pod_dir, save_pod_state};
use nodewarden_testkit::{median, worst};

/// Where a save runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// On tokio's blocking threads, awaited (the pod worker's way).
    Blocking,
    /// On the runtime's own thread, inline.
    Inline,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Blocking => "on blocking threads (the worker's way)",
            Mode::Inline => "on the runtime's threads (before)",
        }
    }
}

/// One run: all pods' saves, in milliseconds, and the 1 ms timer's longest lateness meanwhile.
struct Run {
    all_saved_ms: f64,
    timer_late_ms: f64,
}

/// The state a worker saves once the pod's container runs.
fn started() -> SavedPod {
    let container = SavedContainer {
        restarts: 0,
        pid: Some(4242),
        pid_start: Some(1),
        started_at: Some(jiff::Timestamp::now()),
        last: None,
        id: Some(nodewarden_runtime::ContainerId::new("0123456789abcdef")),
        last_id: None,
    };
    SavedPod {
        uid: None,
        containers: [("app".to_owned(), container)].into(),
        start_time: Some(jiff::Timestamp::now()),
        terminal: None,
        deletion_deadline: None,
    }
}

/// A pod's first start: the mark, then the first save (where `mode` says).
async fn first_start(mode: Mode, root: Arc<PathBuf>, uid: String) -> Result<()> {
    mark_pod_dir(&root, &uid)?;
    let saved = started();
    let outcome = match mode {
        Mode::Inline => save_pod_state(&root, &uid, &saved, true),
        Mode::Blocking => tokio::task::spawn_blocking(move || save_pod_state(&root, &uid, &saved, true)).await?,
    };
    Ok(outcome?)
}

fn one_run(mode: Mode, pods: usize, root: &Path) -> Result<Run> {
    if root.exists() {
        std::fs::remove_dir_all(root).with_context(|| format!("cannot clear {}", root.display()))?;
    }
    std::fs::create_dir_all(root)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let root = Arc::new(root.to_path_buf());
    runtime.block_on(async move {
        let done = Arc::new(AtomicBool::new(false));
        let ticker = tokio::spawn({
            let done = done.clone();
            async move {
                let mut late = Duration::ZERO;
                while !done.load(Ordering::Relaxed) {
                    let due = Instant::now() + Duration::from_millis(1);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    late = late.max(Instant::now().saturating_duration_since(due));
                }
                late
            }
        });
        let t0 = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for i in 0..pods {
            set.spawn(first_start(mode, root.clone(), format!("bench-saves-{i:04}")));
        }
        while let Some(saved) = set.join_next().await {
            saved??;
        }
        let all_saved_ms = t0.elapsed().as_secs_f64() * 1000.0;
        done.store(true, Ordering::Relaxed);
        let timer_late_ms = ticker.await?.as_secs_f64() * 1000.0;
        Ok(Run { all_saved_ms, timer_late_ms })
    })
}

/// Saves `pods` pods' states `runs` times each way in `dir` and writes the table to `out`.
pub fn run(pods: usize, runs: usize, dir: &Path, out: &Path) -> Result<()> {
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    let root = dir.join("root");
    let modes = [Mode::Blocking, Mode::Inline];
    let mut results: Vec<(Mode, Vec<Run>)> = modes.iter().map(|m| (*m, Vec::new())).collect();
    for r in 0..runs {
        // The two ways take turns, so that a slow stretch of the disk falls on both.
        for (mode, done) in &mut results {
            let run = one_run(*mode, pods, &root)?;
            eprintln!("run {r} {mode:?}: all saved {:.1} ms, timer late {:.1} ms", run.all_saved_ms, run.timer_late_ms);
            done.push(run);
        }
    }
    std::fs::remove_dir_all(&root).ok();
    let mut md = format!(
        "# Pod state saves, {pods} pods starting together\n\n`nodewarden-bench saves --pods {pods} --runs {runs} --dir {}`: \
         the mark and the first save per pod on a tokio runtime of two threads. Median (worst) \
         of {runs} runs.\n\n| saves run | all saved, ms | a 1 ms timer on the runtime, late by ms |\n|---|---|---|\n",
        dir.display()
    );
    for (mode, done) in &results {
        let saved: Vec<f64> = done.iter().map(|r| r.all_saved_ms).collect();
        let late: Vec<f64> = done.iter().map(|r| r.timer_late_ms).collect();
        md.push_str(&format!(
            "| {} | {:.1} ({:.1}) | {:.1} ({:.1}) |\n",
            mode.label(),
            median(saved.clone()),
            worst(&saved),
            median(late.clone()),
            worst(&late)
        ));
    }
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(out, &md)?;
    print!("{md}");
    Ok(())
}
