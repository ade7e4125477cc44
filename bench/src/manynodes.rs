//! `many-nodes`: N nodewarden nodes (each its own `cgroupRoot`, `rootDir`, name and port) joined to one test
//! apiserver in this process: the requests and bytes each node costs the apiserver per minute, idle and under pod
//! churn, extrapolated to 5,000 nodes against the kubelet's budget (a Lease every 10 s, a status every 5 min).

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nodewarden_resources::CgroupPath;
use nodewarden_testapi::{Logged, TestApi};
use serde_json::json;

use crate::{median, spawn_daemon, wait, worst};

/// One node's daemon; dropping it stops the daemon and removes its directory and cgroup tree.
struct Member {
    child: Child,
    dir: PathBuf,
    root: CgroupPath,
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        nodewarden_testkit::remove_tree(&self.root);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn node_name(i: usize) -> String {
    format!("many-{i}")
}

fn start_member(bin: &Path, api: &TestApi, i: usize) -> Result<Member> {
    let name = node_name(i);
    let dir = std::env::temp_dir().join(format!("nwbench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let root = CgroupPath::parse(&format!("/nwbench-{name}")).context("cgroup root")?;
    nodewarden_testkit::remove_tree(&root);
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let token = format!("token-{name}");
    api.add_token(&token, Some(&name));
    let kubeconfig = api.write_kubeconfig(&dir, &token)?;
    let config = format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupRoot: {root}\n\
         healthzPort: {port}\npodLogsDir: {}\nnodewarden:\n  rootDir: {}\n  nodeName: {name}\n",
        dir.join("logs").display(),
        dir.join("root").display()
    );
    let kubeconfig = kubeconfig.display().to_string();
    let child = spawn_daemon(bin, &dir, &config, &["--kubeconfig", &kubeconfig])?;
    Ok(Member { child, dir, root })
}

fn ready(api: &TestApi, i: usize) -> bool {
    api.get("nodes", None, &node_name(i)).is_some_and(|n| {
        n["status"]["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
    })
}

/// Requests and the bytes whose size is known (watches stream theirs), per node per minute.
fn per_node_minute(window: &[Logged], nodes: usize, elapsed: Duration) -> (f64, f64) {
    let minutes = elapsed.as_secs_f64() / 60.0;
    let bytes: u64 = window.iter().map(|r| r.bytes_in as u64 + r.bytes_out.unwrap_or(0)).sum();
    (window.len() as f64 / nodes as f64 / minutes, bytes as f64 / nodes as f64 / minutes)
}

struct Run {
    idle: (f64, f64),
    churn: (f64, f64),
}

fn one_run(bin: &Path, n: usize, seconds: u64, pods: usize) -> Result<Run> {
    let rt = tokio::runtime::Runtime::new()?;
    let api = rt.block_on(TestApi::start(0))?;
    let members: Vec<Member> = (0..n).map(|i| start_member(bin, &api, i)).collect::<Result<_>>()?;
    wait("every node Ready", 300, || (0..n).all(|i| ready(&api, i)))?;
    // Past the start (registration, first reports and lists).
    std::thread::sleep(Duration::from_secs(20));

    let from = api.requests().len();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(seconds));
    let idle = per_node_minute(&api.requests()[from..], n, t0.elapsed());

    // Churn: `pods` pods bound to each node, then deleted, within the window.
    let from = api.requests().len();
    let t1 = Instant::now();
    for i in 0..n {
        for k in 0..pods {
            let pod = json!({
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("p{i}-{k}"), "namespace": "default"},
                "spec": {"nodeName": node_name(i), "automountServiceAccountToken": false,
                         "terminationGracePeriodSeconds": 2,
                         "containers": [{"name": "app", "image": "busybox", "command": ["sleep", "100000"]}]},
            });
            api.create("pods", Some("default"), pod)?;
        }
    }
    let running = |p: &serde_json::Value| p["status"]["phase"] == "Running";
    wait("every churn pod Running", 300, || {
        api.scan("pods", Some("default"), |p| running(p).then_some(())).len() == n * pods
    })?;
    for i in 0..n {
        for k in 0..pods {
            api.delete("pods", Some("default"), &format!("p{i}-{k}"), Some(2))?;
        }
    }
    wait("every churn pod deleted", 300, || api.scan("pods", Some("default"), |_| Some(())).is_empty())?;
    std::thread::sleep(Duration::from_secs(seconds).saturating_sub(t1.elapsed()));
    let churn = per_node_minute(&api.requests()[from..], n, t1.elapsed());
    drop(members);
    Ok(Run { idle, churn })
}

/// Runs the benchmark and writes a Markdown table.
pub fn run(bin: &Path, n: usize, seconds: u64, pods: usize, runs: usize, out: &Path) -> Result<()> {
    if runs == 0 || n == 0 || seconds == 0 {
        bail!("--runs, --nodes and --seconds must be at least 1");
    }
    let mut results = Vec::new();
    for r in 0..runs {
        let run = one_run(bin, n, seconds, pods).with_context(|| format!("run {}", r + 1))?;
        eprintln!(
            "run {}: idle {:.2} requests and {:.0} B per node per minute; churn ({pods} pods per node) {:.2} and {:.0} B",
            r + 1,
            run.idle.0,
            run.idle.1,
            run.churn.0,
            run.churn.1
        );
        results.push(run);
    }
    let col = |f: &dyn Fn(&Run) -> f64| -> Vec<f64> { results.iter().map(f).collect() };
    let (idle_r, idle_b, churn_r, churn_b) =
        (col(&|r| r.idle.0), col(&|r| r.idle.1), col(&|r| r.churn.0), col(&|r| r.churn.1));
    let at_scale = |per_min: f64| per_min * 5000.0 / 60.0;
    let table = format!(
        "# Many nodes, one apiserver\n\n{runs} runs, {n} nodes in one VM (each its own cgroupRoot, rootDir, name and \
         port) joined to one test apiserver, a {seconds} s window idle and one with {pods} pods created and deleted \
         per node; 2 emulated vCPUs (TCG). Median (worst).\n\n\
         | measure | kubelet's budget | median | worst |\n|---|---|---|---|\n\
         | requests per node per minute, idle | 6.2 (a Lease every 10 s, a status every 5 min) | {:.2} | {:.2} |\n\
         | bytes per node per minute, idle (watch streams not counted) | | {:.0} | {:.0} |\n\
         | requests per node per minute, churn | | {:.2} | {:.2} |\n\
         | bytes per node per minute, churn | | {:.0} | {:.0} |\n\
         | 5,000 nodes idle: requests per second at the apiserver | 517 | {:.0} | {:.0} |\n\
         | 5,000 nodes under this churn: requests per second | | {:.0} | {:.0} |\n",
        median(idle_r.clone()),
        worst(&idle_r),
        median(idle_b.clone()),
        worst(&idle_b),
        median(churn_r.clone()),
        worst(&churn_r),
        median(churn_b.clone()),
        worst(&churn_b),
        at_scale(median(idle_r.clone())),
        at_scale(worst(&idle_r)),
        at_scale(median(churn_r.clone())),
        at_scale(worst(&churn_r)),
    );
    std::fs::write(out, &table)?;
    print!("{table}");
    Ok(())
}
