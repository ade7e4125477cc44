//! `disk-reclaim`: imagefs pressure that removing an unused image covers. containerd (its own 512 MiB tmpfs, the
//! image file system) holds an unused image of 48 MiB beside a running pod's; `imagefs.available` is set 20 MiB
//! below what is free, and a node process writes 40 MiB there. Measured per run: the time from the crossing (seen by
//! the writer between its 1 MiB writes) to the space back above the threshold (read with `statvfs` every 20 ms),
//! and the pods evicted. The agent is nodewarden
//! or nodewarden at the kubelet's cadence (a reading every 10 s, no pressure events, the normal scheduler), each in
//! a VM boot of its own (`bench/run disk-reclaim` boots one per agent). The kubelet reclaims unused images first
//! too (`reclaimNodeLevelResources`), at its own cadence: the second agent models that.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{StaticNode, get, median, pods, wait, worst, write};

const ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
const SOCKET: &str = "/run/containerd/containerd.sock";
const IMAGEFS: &str = "/var/lib/nodewarden-containerd";
const BULKY: &str = "localhost/bulky:1";
const MIB: u64 = 1 << 20;

/// One run: the time to the space reclaimed, and the pods evicted.
struct Run {
    reclaimed_ms: f64,
    evictions: usize,
}

fn available() -> Result<u64> {
    let s = rustix::fs::statvfs(IMAGEFS).with_context(|| format!("statvfs {IMAGEFS}"))?;
    Ok(s.f_bavail.saturating_mul(s.f_frsize))
}

fn ctr(args: &[&str]) -> Result<String> {
    let out = Command::new("ctr").args(["--address", SOCKET, "-n", "k8s.io"]).args(args).output()?;
    if !out.status.success() {
        bail!("ctr {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn hard(mib: u64) -> String {
    format!("evictionHard:\n  imagefs.available: {mib}Mi\n")
}

fn one_run(bin: &Path, kubelet_like: bool, tar: &Path) -> Result<Run> {
    ctr(&["images", "import", &tar.to_string_lossy()])?;
    let cadence = if kubelet_like {
        "  housekeepingInterval: 10s\n  evictionPollMin: 10s\n  pressureEvents: false\n  evictionRealtimePriority: 0\n"
    } else {
        ""
    };
    // The threshold 20 MiB below what is free: a node process's 40 MiB write crosses it.
    let threshold = (available()? / MIB).checked_sub(20).context("less than 20 MiB free on the image file system")?;
    let extra = format!(
        "containerRuntimeEndpoint: {ENDPOINT}\nimageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n\
         imageMinimumGCAge: 0s\nevictionPressureTransitionPeriod: 5s\n{}",
        hard(threshold)
    );
    let node = StaticNode::start_full(bin, "reclaim", &extra, &format!("  imagefsPath: {IMAGEFS}\n{cadence}"), &[])?;
    write(&node.manifests, "quiet.yaml", &crate::cri::manifest("quiet"))?;
    wait("the quiet pod running", 180, || pods(node.port).iter().any(|p| p["status"]["phase"] == "Running"))?;
    // Settled: the images' last use recorded, nothing else moving.
    std::thread::sleep(Duration::from_secs(3));
    let fill = Path::new(IMAGEFS).join("bench-fill");
    let mut file = std::fs::File::create(&fill)?;
    let chunk = vec![0x5a_u8; 1 << 20];
    let mut crossed = None;
    for _ in 0..40 {
        std::io::Write::write_all(&mut file, &chunk)?;
        if crossed.is_none() && available()? / MIB < threshold {
            crossed = Some(Instant::now());
        }
    }
    drop(file);
    let t0 = crossed.context("the write did not cross the threshold")?;
    let deadline = t0 + Duration::from_secs(120);
    while available()? / MIB < threshold {
        if Instant::now() > deadline {
            bail!("the space was not reclaimed within 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let reclaimed_ms = t0.elapsed().as_secs_f64() * 1000.0;
    // Whatever the agent would still do about it, it has done within a pass or two.
    std::thread::sleep(Duration::from_secs(if kubelet_like { 12 } else { 2 }));
    let list: serde_json::Value = serde_json::from_str(&get(node.port, "/evictions").unwrap_or_default())?;
    let evictions = list["evictions"].as_array().map_or(0, Vec::len);
    if ctr(&["images", "ls", "-q"])?.contains(BULKY) {
        bail!("the space came back, but not from the unused image");
    }
    std::fs::remove_file(&fill)?;
    std::fs::remove_file(node.manifests.join("quiet.yaml"))?;
    wait("the quiet pod removed", 120, || pods(node.port).is_empty())?;
    drop(node);
    Ok(Run { reclaimed_ms, evictions })
}

/// Starts containerd, runs the bench `runs` times for `agent`, and writes a Markdown table to `out`.
pub fn run(bin: &Path, agent: &str, containerd: &Path, runs: usize, out: &Path) -> Result<()> {
    let kubelet_like = match agent {
        "nodewarden" => false,
        "kubelet-like" => true,
        other => bail!("unknown agent {other:?} (nodewarden or kubelet-like)"),
    };
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    let status = Command::new(containerd).status().with_context(|| format!("cannot run {}", containerd.display()))?;
    if !status.success() {
        bail!("{} failed", containerd.display());
    }
    let tar = std::env::temp_dir().join(format!("nwbench-bulky-{}.tar", std::process::id()));
    let made = Command::new("deploy/containerd/make-image").env("PAD_MIB", "48").arg(BULKY).arg(&tar).status()?;
    if !made.success() {
        bail!("deploy/containerd/make-image failed");
    }
    let mut done = Vec::new();
    for r in 0..runs {
        let one = one_run(bin, kubelet_like, &tar).with_context(|| format!("run {}", r + 1))?;
        eprintln!("{agent} run {}: reclaimed in {:.0} ms, {} evictions", r + 1, one.reclaimed_ms, one.evictions);
        done.push(one);
    }
    let _ = std::fs::remove_file(&tar);
    let ms: Vec<f64> = done.iter().map(|r| r.reclaimed_ms).collect();
    let evictions: usize = done.iter().map(|r| r.evictions).sum();
    let table = format!(
        "# imagefs pressure covered by an unused image: {agent}\n\n`nodewarden-bench disk-reclaim --agent {agent} \
         --runs {runs}`: a 48 MiB unused image beside a running pod; a node process writes 40 MiB on the image file \
         system, crossing `imagefs.available` by 20 MiB. Median (worst) of {runs} runs.\n\n| agent | crossing → space \
         above the threshold | pods evicted, \
         all runs |\n|---|---|---|\n| {agent} | {:.0} ms ({:.0}) | {evictions} |\n",
        median(ms.clone()),
        worst(&ms),
    );
    std::fs::write(out, &table)?;
    print!("{table}");
    Ok(())
}
