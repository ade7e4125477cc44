//! `pods`: pod sync through static manifests with the process runtime.
//!
//! - one at a time: pods written one after another, each `Running` before the next; the daemon's own
//!   `kubelet_pod_start_duration_seconds` per pod (first seen → every container running, as it reports it);
//! - start: N manifests written at once (one after the other, each written beside its name and renamed into place)
//!   → all N pods `Running` in `/pods`;
//! - rename: N manifests prepared outside the directory, then all renamed into it at once → all N `Running`;
//!   the same N pods (no probes) then give the daemon's CPU floor;
//! - edit: a manifest's memory limit changed → the replacement pod's cgroup shows the new `memory.max`;
//! - steady: N pods, each a busybox httpd with an HTTP readiness probe every 10 s: the daemon's CPU and RSS;
//! - bare: the same N containers started by the bench itself with no daemon ([`bare`]), the reference the start
//!   is compared with; and the same N probes made by the bench itself ([`probes`]), the reference the probes' CPU
//!   is compared with.

mod bare;
mod probes;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::{KeepLog, ROOT, StaticNode, cpu_ticks, median, rss_kib, wait, worst, write};

struct Run {
    single_ms: Vec<f64>,
    bare_s: f64,
    start_s: f64,
    rename_s: f64,
    idle_cpu_percent: f64,
    edit_ms: Vec<f64>,
    cpu_percent: f64,
    ready_pods: usize,
    rss_mib: f64,
    bare_probes: probes::Sample,
}

/// What the probed pods' readiness probe asks for, and how often.
const PROBE_PATH: &str = "/hostname";
const PROBE_PERIOD_S: u64 = 10;

/// The port of probed pod `i`'s server.
fn probe_port(i: usize) -> Result<u16> {
    u16::try_from(20000 + i).context("too many pods")
}

/// A pod manifest; `memory` sets a memory limit (which is also the request, so only a few such pods fit). Its
/// container runs a program of its image, busybox (`sleep`, or `httpd` when probed), as the same pod does through
/// containerd in the `cri` bench: the process runtime has no images, so a bare `sleep` would be the host's, a
/// dynamically linked program whose start costs three times the CPU of busybox's under emulation (94 against 31 ms per fork and exec).
fn manifest(name: &str, memory: Option<&str>, probe_port: Option<u16>) -> String {
    let command = match probe_port {
        Some(p) => format!("[busybox, httpd, -f, -p, '127.0.0.1:{p}', -h, /etc]"),
        None => "[busybox, sleep, '100000']".to_owned(),
    };
    let probe = probe_port
        .map(|p| {
            format!(
                "    readinessProbe:\n      httpGet: {{path: {PROBE_PATH}, port: {p}}}\n      periodSeconds: {PROBE_PERIOD_S}\n"
            )
        })
        .unwrap_or_default();
    let resources = memory.map(|m| format!("    resources:\n      limits: {{memory: {m}}}\n")).unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 5\n  containers:\n  \
         - name: app\n    image: busybox\n    command: {command}\n{resources}{probe}"
    )
}

/// What the bench reads of a pod in `/pods`. It polls the list every 50 ms while 100 pods start, on the guest's two
/// CPUs, so it parses no more than these fields (a JSON tree of every pod took a good share of a CPU).
#[derive(serde::Deserialize)]
struct Brief {
    status: Option<BriefStatus>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct BriefStatus {
    phase: Option<String>,
    container_statuses: Option<Vec<BriefContainer>>,
}

#[derive(serde::Deserialize)]
struct BriefContainer {
    #[serde(default)]
    ready: bool,
}

#[derive(serde::Deserialize)]
struct BriefList {
    items: Vec<Brief>,
}

/// The pods in `/pods`; empty when the daemon does not answer.
fn briefs(port: u16) -> Vec<Brief> {
    crate::get(port, "/pods")
        .and_then(|b| serde_json::from_str::<BriefList>(&b).ok())
        .map(|l| l.items)
        .unwrap_or_default()
}

fn count(port: u16, f: impl Fn(&Brief) -> bool) -> usize {
    briefs(port).iter().filter(|p| f(p)).count()
}

fn running(p: &Brief) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

fn ready(p: &Brief) -> bool {
    p.status.as_ref().and_then(|s| s.container_statuses.as_ref()?.first()).is_some_and(|c| c.ready)
}

/// How many pods the one-at-a-time start writes.
const SINGLE: usize = 10;

/// The daemon's `kubelet_pod_start_duration_seconds` sum so far, in seconds.
fn start_duration_sum(port: u16) -> Result<f64> {
    let text = crate::get(port, "/metrics").context("the daemon's /metrics did not answer")?;
    nodewarden_testkit::metric(&text, "kubelet_pod_start_duration_seconds_sum")
        .context("no kubelet_pod_start_duration_seconds_sum in /metrics")
}

fn clear(dir: &Path, port: u16) -> Result<()> {
    for e in std::fs::read_dir(dir)?.flatten() {
        std::fs::remove_file(e.path())?;
    }
    wait("removal of every pod", 120, || briefs(port).is_empty())
}

/// The daemon's CPU use in percent of one core over `seconds`.
fn cpu_percent(pid: u32, seconds: u64) -> Result<f64> {
    let (t0, c0) = (Instant::now(), cpu_ticks(pid)?);
    std::thread::sleep(Duration::from_secs(seconds));
    let (t1, c1) = (Instant::now(), cpu_ticks(pid)?);
    Ok((c1 - c0) as f64 / 100.0 / (t1 - t0).as_secs_f64() * 100.0)
}

fn one_run(bin: &Path, n: usize, seconds: u64, edits: usize, log: &Path) -> Result<Run> {
    let bare_s = bare::start(n).context("the bare start")?;
    eprintln!("pods: {n} containers started bare in {bare_s:.2} s");
    let node = StaticNode::start(bin, "pods", "")?;
    let _log = KeepLog(node.dir.join("daemon.log"), log);
    let (manifests, port, pid) = (node.manifests.clone(), node.port, node.pid());
    eprintln!("pods: daemon ready");

    // one at a time: each pod Running before the next is written.
    let mut single_ms = Vec::new();
    for i in 0..SINGLE {
        let before = start_duration_sum(port)?;
        write(&manifests, &format!("o{i}.yaml"), &manifest(&format!("o{i}"), None, None))?;
        wait("the pod running", 60, || count(port, running) == i + 1)?;
        single_ms.push((start_duration_sum(port)? - before) * 1000.0);
    }
    eprintln!("pods: one at a time, {:.1} ms (median of {SINGLE})", median(single_ms.clone()));
    clear(&manifests, port)?;

    // start: N manifests written at once.
    let t0 = Instant::now();
    for i in 0..n {
        write(&manifests, &format!("p{i}.yaml"), &manifest(&format!("p{i}"), None, None))?;
    }
    wait("all pods running", 300, || count(port, running) == n)?;
    let start_s = t0.elapsed().as_secs_f64();
    eprintln!("pods: {n} pods running after {start_s:.2} s");
    clear(&manifests, port)?;

    // rename: N manifests made beside the directory, then all renamed into it at once.
    let staging = node.dir.join("staging");
    std::fs::create_dir_all(&staging)?;
    for i in 0..n {
        std::fs::write(staging.join(format!("r{i}.yaml")), manifest(&format!("r{i}"), None, None))?;
    }
    let t0 = Instant::now();
    for i in 0..n {
        let file = format!("r{i}.yaml");
        std::fs::rename(staging.join(&file), manifests.join(&file))?;
    }
    wait("all renamed pods running", 300, || count(port, running) == n)?;
    let rename_s = t0.elapsed().as_secs_f64();
    eprintln!("pods: {n} renamed pods running after {rename_s:.2} s");
    std::thread::sleep(Duration::from_secs(5));
    let idle_cpu_percent = cpu_percent(pid, seconds)?;
    clear(&manifests, port)?;

    // edit: the replacement's cgroup carries the new limit.
    let mut edit_ms = Vec::new();
    write(&manifests, "e.yaml", &manifest("e", Some("64Mi"), None))?;
    wait("the edited pod running", 60, || count(port, running) == 1)?;
    for k in 0..edits {
        let limit = 65 + k;
        let want = (limit << 20).to_string();
        let burstable = PathBuf::from("/sys/fs/cgroup").join(&ROOT[1..]).join("kubepods/burstable");
        let t = Instant::now();
        write(&manifests, "e.yaml", &manifest("e", Some(&format!("{limit}Mi")), None))?;
        wait("the new limit", 30, || {
            std::fs::read_dir(&burstable)
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| std::fs::read_to_string(e.path().join("memory.max")).is_ok_and(|v| v.trim() == want))
        })?;
        edit_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        wait("the edited pod running", 60, || count(port, running) == 1)?;
    }
    clear(&manifests, port)?;

    // steady: N pods with HTTP readiness probes every 10 s.
    for i in 0..n {
        write(&manifests, &format!("s{i}.yaml"), &manifest(&format!("s{i}"), None, Some(probe_port(i)?)))?;
    }
    wait("all probed pods running", 300, || count(port, running) == n)?;
    // The CPU figure needs the probes running, not passing: on a loaded host some pods' probes keep failing (the
    // old and the new daemon alike), so the sample is taken after at most a minute, with the count of ready pods.
    let _ = wait("all pods ready", 60, || count(port, ready) == n);
    let ready_pods = count(port, ready);
    eprintln!("pods: {ready_pods} of {n} probed pods ready");
    std::thread::sleep(Duration::from_secs(5));
    let cpu_percent = cpu_percent(pid, seconds)?;
    let rss = rss_kib(pid)?;
    // The same probes made bare, against the same servers, right after (the daemon goes on probing meanwhile; only
    // the bench's probing thread is counted).
    let ports = (0..n).map(probe_port).collect::<Result<Vec<_>>>()?;
    let bare_probes = probes::sample(&ports, PROBE_PATH, Duration::from_secs(PROBE_PERIOD_S), seconds)?;
    eprintln!(
        "pods: {} bare probes ({} passed), {:.2} % of a core",
        bare_probes.probes, bare_probes.passed, bare_probes.cpu_percent
    );
    clear(&manifests, port)?;
    Ok(Run {
        single_ms,
        bare_s,
        start_s,
        rename_s,
        idle_cpu_percent,
        edit_ms,
        cpu_percent,
        ready_pods,
        rss_mib: rss as f64 / 1024.0,
        bare_probes,
    })
}

/// Runs the pod sync benchmark and writes a Markdown table.
pub fn run(bin: &Path, n: usize, seconds: u64, runs: usize, edits: usize, out: &Path) -> Result<()> {
    let mut results = Vec::new();
    for r in 0..runs {
        let run = one_run(bin, n, seconds, edits, &out.with_extension("daemon.log"))
            .with_context(|| format!("run {}", r + 1))?;
        eprintln!(
            "run {}: one at a time {:.1} ms, bare {:.2} s, start {:.2} s, rename {:.2} s, edit median {:.1} ms, cpu {:.2} % ({} pods ready; {:.2} % \
             without probes; bare probes {:.2} %), rss {:.1} MiB",
            r + 1,
            median(run.single_ms.clone()),
            run.bare_s,
            run.start_s,
            run.rename_s,
            median(run.edit_ms.clone()),
            run.cpu_percent,
            run.ready_pods,
            run.idle_cpu_percent,
            run.bare_probes.cpu_percent,
            run.rss_mib
        );
        results.push(run);
    }
    let start: Vec<f64> = results.iter().map(|r| r.start_s).collect();
    let rename: Vec<f64> = results.iter().map(|r| r.rename_s).collect();
    let bare: Vec<f64> = results.iter().map(|r| r.bare_s).collect();
    let single: Vec<f64> = results.iter().flat_map(|r| r.single_ms.clone()).collect();
    let idle: Vec<f64> = results.iter().map(|r| r.idle_cpu_percent).collect();
    let least_ready = results.iter().map(|r| r.ready_pods).min().unwrap_or(0);
    let edit: Vec<f64> = results.iter().flat_map(|r| r.edit_ms.clone()).collect();
    let cpu: Vec<f64> = results.iter().map(|r| r.cpu_percent).collect();
    let rss: Vec<f64> = results.iter().map(|r| r.rss_mib).collect();
    let bare_probe: Vec<f64> = results.iter().map(|r| r.bare_probes.cpu_percent).collect();
    // The probes' own cost in the daemon: its CPU with the probed pods less its CPU with as many unprobed ones.
    let probe_cost: Vec<f64> = results.iter().map(|r| r.cpu_percent - r.idle_cpu_percent).collect();
    let (probes_made, probes_passed) =
        results.iter().fold((0, 0), |(m, p), r| (m + r.bare_probes.probes, p + r.bare_probes.passed));
    let table = format!(
        "# Pod sync (process runtime)\n\n{runs} runs, {n} pods, {edits} edits per run, {seconds} s steady-state window; \
         1 GiB guest, 2 emulated vCPUs (TCG). Median (worst).\n\n\
         | measure | target | median | worst |\n|---|---|---|---|\n\
         | one pod at a time, first seen → Running (the daemon's `kubelet_pod_start_duration_seconds`, {SINGLE} per run) | | {:.1} ms | {:.1} ms |\n\
         | {n} manifests written → all Running | < 2 s | {:.2} s | {:.2} s |\n\
         | {n} manifests renamed into the directory at once → all Running | < 2 s | {:.2} s | {:.2} s |\n\
         | the same {n} containers started bare (no daemon; see below) | | {:.2} s | {:.2} s |\n\
         | manifest edit → new memory.max in the replacement's cgroup | < 100 ms | {:.1} ms | {:.1} ms |\n\
         | daemon CPU, {n} pods with HTTP readiness probes every 10 s (≥ {least_ready} ready) | < 1 % | {:.2} % | {:.2} % |\n\
         | daemon RSS, same | | {:.1} MiB | {:.1} MiB |\n\
         | daemon CPU, {n} pods without probes | | {:.2} % | {:.2} % |\n\
         | the probes' own cost in the daemon (with probes − without, per run) | | {:.2} % | {:.2} % |\n\
         | the same probes made bare (one thread of the bench; see below) | | {:.2} % | {:.2} % |\n\n\
         Bare: in each run, before the daemon starts, the bench starts the same {n} busybox `sleep` containers itself, \
         on as many threads as the guest has CPUs: per pod a pod cgroup (cpu, memory and pids enabled for its \
         children) and a container cgroup, the process spawned and moved into it, as a plain supervisor does. The \
         daemon creates its processes in their cgroups and makes no such move, so the ratios understate what its \
         own work adds. Written → Running is {:.2}× the bare start, renamed → Running {:.2}× (ratios of the \
         medians).\n\n\
         Bare probes: right after the daemon's probed sample, one thread of the bench makes the same HTTP GET to \
         the same {n} servers, one every {PROBE_PERIOD_S} s ÷ {n}, for as long, with blocking sockets and nothing \
         else ({probes_passed} of {probes_made} passed); its own CPU time is counted. The daemon's probes cost \
         {:.2}× the bare probes (ratio of the medians).\n",
        median(single.clone()),
        worst(&single),
        median(start.clone()),
        worst(&start),
        median(rename.clone()),
        worst(&rename),
        median(bare.clone()),
        worst(&bare),
        median(edit.clone()),
        worst(&edit),
        median(cpu.clone()),
        worst(&cpu),
        median(rss.clone()),
        worst(&rss),
        median(idle.clone()),
        worst(&idle),
        median(probe_cost.clone()),
        worst(&probe_cost),
        median(bare_probe.clone()),
        worst(&bare_probe),
        median(start.clone()) / median(bare.clone()),
        median(rename.clone()) / median(bare.clone()),
        median(probe_cost) / median(bare_probe),
    );
    std::fs::write(out, &table)?;
    print!("{table}");
    Ok(())
}
