//! `cluster`: the daemon joined to the test apiserver (in this process) with N static pods.
//!
//! - idle: the requests a node makes per minute once registered, by kind (the kubelet's cadence is 6 Lease
//!   renewals and a status patch only on change, or every 5 minutes);
//! - conditions: a threshold edit makes MemoryPressure True (then False again): the time from the eviction
//!   manager's decision (its log line) to the status patch that carries it, and from the edit to the apiserver's
//!   copy;
//! - bytes: what the idle node's requests and their answers weigh, per minute;
//! - an outage: the apiserver gone for longer than the node lifecycle grace (50 s), so the Node goes `Unknown`
//!   and tainted `unreachable`: the time from its return to the Node `Ready=True` and untainted, and the
//!   requests and bytes of the minute after it returns.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nodewarden_testapi::TestApi;

use crate::{StaticNode, median, pods, wait, worst, write};

const NODE: &str = "bench";

struct Run {
    per_minute: f64,
    bytes_per_minute: f64,
    outage: Outage,
    leases: f64,
    patches: f64,
    other: f64,
    decided_ms: Vec<f64>,
    edit_ms: Vec<f64>,
}

fn pod(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: app\n    image: busybox\n    \
         command: [sleep, '100000']\n"
    )
}

/// What an outage cost.
struct Outage {
    /// From the apiserver's return to the Node Ready and untainted, in seconds.
    ready_s: f64,
    /// Requests in the minute after the return.
    requests: f64,
    /// Bytes (requests and answers) in the minute after the return.
    bytes: f64,
}

/// The bytes of requests and the answers whose size is known.
fn bytes(window: &[nodewarden_testapi::Logged]) -> f64 {
    window.iter().map(|r| r.bytes_in as u64 + r.bytes_out.unwrap_or(0)).sum::<u64>() as f64
}

/// True when the Node is Ready and carries no unreachable or not-ready taint.
fn ready_untainted(api: &TestApi) -> bool {
    let Some(node) = api.get("nodes", None, NODE) else { return false };
    let ready = node["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
    let tainted = node["spec"]["taints"].as_array().is_some_and(|t| {
        t.iter().any(|t| {
            matches!(t["key"].as_str(), Some("node.kubernetes.io/unreachable" | "node.kubernetes.io/not-ready"))
        })
    });
    ready && !tainted
}

/// The apiserver away for `seconds`, then back.
fn outage(api: &TestApi, seconds: u64) -> Result<Outage> {
    api.set_up(false);
    std::thread::sleep(Duration::from_secs(seconds));
    if ready_untainted(api) {
        bail!("the Node is still Ready after a {seconds} s outage: the lifecycle controller did not run");
    }
    let from = api.requests().len();
    let back = Instant::now();
    api.set_up(true);
    wait("the Node Ready and untainted after the outage", 120, || ready_untainted(api))?;
    let ready_s = back.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(60).saturating_sub(back.elapsed()));
    let window = api.requests()[from..].to_vec();
    let minutes = back.elapsed().as_secs_f64() / 60.0;
    let requests = window.len() as f64 / minutes;
    Ok(Outage { ready_s, requests, bytes: bytes(&window) / minutes })
}

fn memory_pressure(api: &TestApi) -> Option<String> {
    let node = api.get("nodes", None, NODE)?;
    node["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == "MemoryPressure")?["status"]
        .as_str()
        .map(str::to_owned)
}

/// The time of the last daemon log line containing `needle`.
fn logged(log: &Path, needle: &str) -> Option<jiff::Timestamp> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines().rfind(|l| l.contains(needle))?.split_whitespace().next()?.parse().ok()
}

fn one_run(bin: &Path, n: usize, seconds: u64, edits: usize, away: u64) -> Result<Run> {
    let rt = tokio::runtime::Runtime::new()?;
    // Over TLS with a node client certificate, as a kubelet joins.
    let api = rt.block_on(TestApi::start_tls(0))?;
    let dir = std::env::temp_dir().join(format!("nwbench-cluster-kube-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let cert = api.issue_client_certificate(Some(NODE), Duration::from_secs(24 * 3600))?;
    let kubeconfig = api.write_kubeconfig_with_certificate(&dir, "node", &cert)?;
    let kubeconfig = kubeconfig.display().to_string();
    let base = "evictionPressureTransitionPeriod: 1s\n";
    let node = StaticNode::start_with(bin, "cluster", base, &["--kubeconfig", &kubeconfig])?;
    for i in 0..n {
        write(&node.manifests, &format!("p{i}.yaml"), &pod(&format!("p{i}")))?;
    }
    wait("all pods running", 300, || {
        pods(node.port).iter().filter(|p| p["status"]["phase"] == "Running").count() == n
    })?;
    wait("the node registered and Ready", 60, || memory_pressure(&api).is_some())?;
    // Settle past the start (registration, the first status reports), then count.
    std::thread::sleep(Duration::from_secs(15));
    let from = api.requests().len();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(seconds));
    let window = api.requests()[from..].to_vec();
    let minutes = t0.elapsed().as_secs_f64() / 60.0;
    let count = |f: &dyn Fn(&nodewarden_testapi::Logged) -> bool| {
        let c = window.iter().filter(|r| f(r)).count() as f64;
        c / minutes
    };
    let leases = count(&|r| r.path.contains("/leases/"));
    let patches = count(&|r| r.method == "PATCH" && r.path.ends_with("/status"));
    let all = count(&|_| true);
    let bytes_per_minute = bytes(&window) / minutes;

    let config = node.dir.join("config.yaml");
    let log = node.dir.join("daemon.log");
    let original = std::fs::read_to_string(&config)?;
    let mut decided_ms = Vec::new();
    let mut edit_ms = Vec::new();
    for k in 0..edits {
        for (want, text) in [
            (
                "True",
                format!(
                    "{original}evictionSoft:\n  memory.available: 100Gi\nevictionSoftGracePeriod:\n  memory.available: 10m\n"
                ),
            ),
            ("False", original.clone()),
        ] {
            let edited = jiff::Timestamp::now();
            let t = Instant::now();
            std::fs::write(&config, text)?;
            wait(&format!("MemoryPressure {want} (edit {k})"), 60, || memory_pressure(&api).as_deref() == Some(want))?;
            edit_ms.push(t.elapsed().as_secs_f64() * 1000.0);
            let decided =
                logged(&log, "node conditions changed").filter(|d| *d >= edited).context("no decision logged")?;
            let patched = api
                .requests()
                .iter()
                .filter(|r| r.method == "PATCH" && r.time >= decided)
                .map(|r| r.time)
                .next()
                .context("no status patch after the decision")?;
            decided_ms.push((patched - decided).get_milliseconds() as f64);
        }
    }
    let outage = outage(&api, away)?;
    drop(node);
    Ok(Run {
        per_minute: all,
        bytes_per_minute,
        outage,
        leases,
        patches,
        other: all - leases - patches,
        decided_ms,
        edit_ms,
    })
}

/// Runs the cluster benchmark and writes a Markdown table.
pub fn run(bin: &Path, n: usize, seconds: u64, runs: usize, edits: usize, away: u64, out: &Path) -> Result<()> {
    if runs == 0 || seconds == 0 {
        bail!("--runs and --seconds must be at least 1");
    }
    let mut results = Vec::new();
    for r in 0..runs {
        let run = one_run(bin, n, seconds, edits, away).with_context(|| format!("run {}", r + 1))?;
        eprintln!(
            "run {}: {:.1} requests/min, {:.0} B/min ({:.1} lease, {:.1} status patches, {:.1} other); decision → \
             patch {:.0} ms, edit → apiserver {:.0} ms (medians); after a {away} s outage Ready in {:.1} s, {:.1} \
             requests and {:.0} B in its first minute",
            r + 1,
            run.per_minute,
            run.bytes_per_minute,
            run.leases,
            run.patches,
            run.other,
            median(run.decided_ms.clone()),
            median(run.edit_ms.clone()),
            run.outage.ready_s,
            run.outage.requests,
            run.outage.bytes,
        );
        results.push(run);
    }
    let col = |f: &dyn Fn(&Run) -> f64| -> Vec<f64> { results.iter().map(f).collect() };
    let (all, leases, patches, other) =
        (col(&|r| r.per_minute), col(&|r| r.leases), col(&|r| r.patches), col(&|r| r.other));
    let decided: Vec<f64> = results.iter().flat_map(|r| r.decided_ms.clone()).collect();
    let edit: Vec<f64> = results.iter().flat_map(|r| r.edit_ms.clone()).collect();
    let (bytes_idle, ready, after, after_bytes) = (
        col(&|r| r.bytes_per_minute),
        col(&|r| r.outage.ready_s),
        col(&|r| r.outage.requests),
        col(&|r| r.outage.bytes),
    );
    let table = format!(
        "# Joined to a cluster (test apiserver)\n\n{runs} runs, {n} static pods, {seconds} s idle window, {edits} \
         MemoryPressure round trips per run; 1 GiB guest, 2 emulated vCPUs (TCG). Median (worst).\n\n\
         | measure | kubelet | median | worst |\n|---|---|---|---|\n\
         | requests per minute, idle | 6 Lease renewals + status on change | {:.1} | {:.1} |\n\
         | of which Lease renewals | 6 | {:.1} | {:.1} |\n\
         | of which status patches | 0 (one per 5 min) | {:.1} | {:.1} |\n\
         | of which other | | {:.1} | {:.1} |\n\
         | bytes per minute, idle (requests and answers) | | {:.0} | {:.0} |\n\
         | apiserver back after {away} s → Node Ready, unreachable taints gone | 20–60 s (informer relist), up to 5 min \
         if nothing changed | {:.1} s | {:.1} s |\n\
         | requests in the minute after the return | | {:.1} | {:.1} |\n\
         | bytes in the minute after the return | | {:.0} | {:.0} |\n\
         | MemoryPressure decided → status patch received | up to 10 s (nodeStatusUpdateFrequency) | {:.0} ms | {:.0} ms |\n\
         | threshold edit → the apiserver's copy changed | | {:.0} ms | {:.0} ms |\n",
        median(all.clone()),
        worst(&all),
        median(leases.clone()),
        worst(&leases),
        median(patches.clone()),
        worst(&patches),
        median(other.clone()),
        worst(&other),
        median(bytes_idle.clone()),
        worst(&bytes_idle),
        median(ready.clone()),
        worst(&ready),
        median(after.clone()),
        worst(&after),
        median(after_bytes.clone()),
        worst(&after_bytes),
        median(decided.clone()),
        worst(&decided),
        median(edit.clone()),
        worst(&edit),
    );
    std::fs::write(out, &table)?;
    print!("{table}");
    Ok(())
}
