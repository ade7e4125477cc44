//! `cri`: pod start through containerd next to the process runtime.
//!
//! For each runtime and run, a daemon starts with no pods; its CPU and RSS are sampled; then N host-network busybox
//! pods are started one after another (manifest written → `Running` in `/pods`, each pod timed); with all N
//! running, CPU and RSS are sampled again. The difference over N is the daemon's own cost per pod. containerd and
//! its shims are measured beside it, for context.
//!
//! In each containerd run, before its daemon starts, the bench's own CRI client starts the same N pods with the
//! bare calls (`bare.rs`), so that nodewarden's start through containerd is reported as a ratio to them.

mod bare;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{StaticNode, cpu_ticks, median, percentile, pods, rss_kib, wait, worst, write};
use bare::BareStart;

const ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Runtime {
    Process,
    Cri,
}

impl Runtime {
    fn name(self) -> &'static str {
        match self {
            Self::Process => "process",
            Self::Cri => "containerd (CRI)",
        }
    }
}

#[derive(Default)]
struct Run {
    start_ms: Vec<f64>,
    idle_cpu: f64,
    idle_rss: f64,
    busy_cpu: f64,
    busy_rss: f64,
    containerd_rss: f64,
    /// The bare CRI starts (containerd runs only), timed before the daemon started.
    bare: Vec<BareStart>,
}

/// A host-network busybox pod that sleeps.
pub(crate) fn manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  \
         terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: localhost/busybox:1\n    \
         command: [sleep, '100000']\n"
    )
}

/// CPU (% of one CPU) and RSS (MiB) of `pid` over `seconds`.
fn sample(pid: u32, seconds: u64) -> Result<(f64, f64)> {
    let (t0, c0) = (Instant::now(), cpu_ticks(pid)?);
    std::thread::sleep(Duration::from_secs(seconds));
    let (t1, c1) = (Instant::now(), cpu_ticks(pid)?);
    Ok(((c1 - c0) as f64 / 100.0 / (t1 - t0).as_secs_f64() * 100.0, rss_kib(pid)? as f64 / 1024.0))
}

/// The summed RSS of containerd and its shims, in MiB.
fn containerd_rss() -> f64 {
    let mut kib = 0;
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.starts_with("containerd") {
            kib += rss_kib(pid).unwrap_or(0);
        }
    }
    kib as f64 / 1024.0
}

fn phase_of(port: u16, name: &str) -> Option<String> {
    let full = format!("{name}-bench");
    pods(port)
        .into_iter()
        .find(|p| p["metadata"]["name"] == full.as_str())
        .and_then(|p| p["status"]["phase"].as_str().map(str::to_owned))
}

fn one_run(bin: &Path, runtime: Runtime, n: usize, seconds: u64) -> Result<Run> {
    let mut run = Run::default();
    // Never beside a daemon: the bare starts run alone, before this run's daemon starts.
    if runtime == Runtime::Cri {
        run.bare = bare::run(ENDPOINT, n, manifest).context("bare CRI phase")?;
    }
    let endpoint = match runtime {
        Runtime::Cri => format!("containerRuntimeEndpoint: {ENDPOINT}\n"),
        Runtime::Process => String::new(),
    };
    let node = StaticNode::start(bin, "cri", &endpoint)?;
    let (manifests, port, pid) = (node.manifests.clone(), node.port, node.pid());
    std::thread::sleep(Duration::from_secs(2));
    (run.idle_cpu, run.idle_rss) = sample(pid, seconds)?;
    for i in 0..n {
        let name = format!("p{i}");
        let t0 = Instant::now();
        write(&manifests, &format!("{name}.yaml"), &manifest(&name))?;
        wait(&format!("{name} running"), 300, || phase_of(port, &name).as_deref() == Some("Running"))?;
        run.start_ms.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    std::thread::sleep(Duration::from_secs(2));
    (run.busy_cpu, run.busy_rss) = sample(pid, seconds)?;
    run.containerd_rss = containerd_rss();
    for e in std::fs::read_dir(&manifests)?.flatten() {
        std::fs::remove_file(e.path())?;
    }
    wait("removal of every pod", 300, || pods(port).is_empty())?;
    drop(node);
    Ok(run)
}

/// Starts containerd, runs the benchmark for both runtimes, and writes a Markdown table.
pub fn run(bin: &Path, containerd: &Path, n: usize, seconds: u64, runs: usize, out: &Path) -> Result<()> {
    let status = Command::new(containerd).status().with_context(|| format!("cannot run {}", containerd.display()))?;
    if !status.success() {
        bail!("{} failed", containerd.display());
    }
    let base_containerd = containerd_rss();
    let mut results: Vec<(Runtime, Vec<Run>)> = vec![(Runtime::Process, Vec::new()), (Runtime::Cri, Vec::new())];
    for r in 0..runs {
        for (runtime, runs) in &mut results {
            let one =
                one_run(bin, *runtime, n, seconds).with_context(|| format!("{} run {}", runtime.name(), r + 1))?;
            eprintln!(
                "{} run {}: start median {:.0} ms, idle {:.2} % {:.1} MiB, {n} pods {:.2} % {:.1} MiB",
                runtime.name(),
                r + 1,
                median(one.start_ms.clone()),
                one.idle_cpu,
                one.idle_rss,
                one.busy_cpu,
                one.busy_rss
            );
            if !one.bare.is_empty() {
                let bare: Vec<f64> = one.bare.iter().map(BareStart::total_ms).collect();
                eprintln!("{} run {}: bare CRI start median {:.0} ms", runtime.name(), r + 1, median(bare));
            }
            runs.push(one);
        }
    }
    let per_pod = |v: f64| v / n as f64;
    let mut rows = String::new();
    let mut medians = Vec::new();
    for (runtime, runs) in &results {
        let starts: Vec<f64> = runs.iter().flat_map(|r| r.start_ms.clone()).collect();
        let rss: Vec<f64> = runs.iter().map(|r| per_pod(r.busy_rss - r.idle_rss) * 1024.0).collect();
        let cpu: Vec<f64> = runs.iter().map(|r| per_pod(r.busy_cpu - r.idle_cpu)).collect();
        let busy_cpu: Vec<f64> = runs.iter().map(|r| r.busy_cpu).collect();
        let busy_rss: Vec<f64> = runs.iter().map(|r| r.busy_rss).collect();
        medians.push(median(starts.clone()));
        rows.push_str(&format!(
            "| {} | {:.0} ms | {:.0} ms | {:.0} ms | {:.2} % | {:.1} MiB | {:.0} KiB | {:.3} % |\n",
            runtime.name(),
            median(starts.clone()),
            percentile(starts.clone(), 0.9),
            worst(&starts),
            median(busy_cpu),
            median(busy_rss),
            median(rss),
            median(cpu),
        ));
    }
    let shims: Vec<f64> = results
        .iter()
        .filter(|(r, _)| *r == Runtime::Cri)
        .flat_map(|(_, v)| v.iter().map(|r| r.containerd_rss))
        .collect();
    let table = format!(
        "# Pod start through containerd\n\n{runs} runs per runtime; per run {n} host-network busybox pods started one \
         after another (manifest written → `Running` in `/pods`); the daemon sampled for {seconds} s before the \
         first and for {seconds} s with all {n} running; release build; 1 GiB guest, 2 emulated vCPUs (TCG); containerd 1.6 with runc and \
         the overlayfs snapshotter, images local.\n\n\
         | runtime | start median | p90 | worst | daemon CPU, {n} pods | daemon RSS, {n} pods | daemon RSS per pod | \
         daemon CPU per pod |\n|---|---|---|---|---|---|---|---|\n{rows}\n\
         CRI / process start latency: **{:.1}×**. containerd and its shims: {:.0} MiB with no pods, {:.0} MiB with {n} \
         pods (median), i.e. {:.1} MiB per pod outside the daemon.\n",
        medians[1] / medians[0],
        base_containerd,
        median(shims.clone()),
        per_pod(median(shims) - base_containerd),
    );
    let cri_starts: Vec<f64> = results
        .iter()
        .filter(|(r, _)| *r == Runtime::Cri)
        .flat_map(|(_, v)| v.iter().flat_map(|r| r.start_ms.clone()))
        .collect();
    let bare: Vec<BareStart> = results.iter().flat_map(|(_, v)| v.iter().flat_map(|r| r.bare.clone())).collect();
    let table = table + &bare_report(&bare, median(cri_starts), n);
    std::fs::write(out, &table)?;
    print!("{table}");
    Ok(())
}

/// The report's section on the bare CRI starts, with nodewarden's start through containerd (`nodewarden_ms`, a
/// median) as a ratio to theirs.
fn bare_report(bare: &[BareStart], nodewarden_ms: f64, n: usize) -> String {
    let total: Vec<f64> = bare.iter().map(BareStart::total_ms).collect();
    let call = |f: fn(&BareStart) -> f64| median(bare.iter().map(f).collect());
    let floor = median(total.clone());
    format!(
        "\n## Bare CRI calls\n\nIn each containerd run, before its daemon starts, the bench's own CRI client (the daemon's \
         client from `nodewarden-sync`, one connection) starts the same {n} pods one after another with the requests \
         the daemon sends (host network, a log directory, the pod cgroup made by the resources library as the cgroup \
         parent, `localhost/busybox:1` running `sleep 100000`), timed from `RunPodSandbox` sent to `StartContainer` \
         returned; each pod is stopped and removed, untimed, before the next. {} starts.\n\n\
         | bare CRI start (3 calls) median | p90 | worst | `RunPodSandbox` median | `CreateContainer` median | \
         `StartContainer` median |\n|---|---|---|---|---|---|\n\
         | {floor:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms |\n\n\
         nodewarden manifest written → `Running` through containerd ÷ bare CRI start (medians): **{:.2}×** \
         ({nodewarden_ms:.0} ms against {floor:.0} ms, {:.0} ms {}). The difference is the daemon's work around the \
         same three calls and the bench's view of it: the manifest's inotify event, read and parse, the pod's state \
         file saved, admission and the pod cgroup, the calls the daemon adds (`ListPodSandbox` before \
         `RunPodSandbox`, `ImageStatus` before `CreateContainer`), the status published, and the bench's poll of \
         `/pods` every 50 ms (25 ms on average, plus the request).\n",
        bare.len(),
        percentile(total.clone(), 0.9),
        worst(&total),
        call(|b| b.sandbox_ms),
        call(|b| b.create_ms),
        call(|b| b.start_ms),
        nodewarden_ms / floor,
        (nodewarden_ms - floor).abs(),
        if nodewarden_ms >= floor { "more" } else { "less: the bare calls' runs were slower" },
    )
}
