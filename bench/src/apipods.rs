//! `api-pods`: pods bound to the node through the test apiserver (in this process), as a scheduler binds them.
//!
//! - start: N pods created at once → each one Running with all its containers running in the apiserver's copy
//!   (the pod startup SLI, which the kubelet's SLO wants at p99 ≤ 5 s; the process runtime pulls nothing), the
//!   time until all are, and the apiserver requests per pod started (Lease renewals left out);
//! - deletion: all N deleted with a grace period → gone from the apiserver (the node terminates each, writes its
//!   final status and deletes it with grace 0);
//! - the same N pods as static manifests, for comparison: written → all Running in `/pods`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use nodewarden_testapi::TestApi;
use serde_json::{Value, json};

use crate::{StaticNode, get, median, percentile, pods, wait, worst, write};

const NODE: &str = "bench";

struct Run {
    /// Creation → Running in the apiserver, per pod, in seconds.
    starts: Vec<f64>,
    /// Creation of the first → the last Running, in seconds.
    all_s: f64,
    /// Requests (not Lease renewals) per pod while they started.
    per_pod: f64,
    /// The daemon's own count of observed starts (`kubelet_pod_start_sli_duration_seconds_count`).
    sli_count: f64,
    /// Deletion of all → all gone from the apiserver, in seconds.
    delete_s: f64,
    /// Static manifests written → all Running in `/pods`, in seconds.
    static_s: f64,
}

/// A pod bound to the node; `objects`: as most real pods are, with the admission plugin's service account
/// volume (a token from TokenRequest, `kube-root-ca.crt`, the namespace) and a variable from a ConfigMap.
fn bound_pod(name: &str, objects: bool) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": NODE, "automountServiceAccountToken": false, "terminationGracePeriodSeconds": 5,
                 "containers": [{"name": "app", "image": "busybox", "command": ["sleep", "100000"]}]},
    });
    if objects {
        pod["spec"]["automountServiceAccountToken"] = json!(true);
        pod["spec"]["containers"][0]["env"] =
            json!([{"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "level"}}}]);
    }
    pod
}

fn started(p: &Value) -> bool {
    p["status"]["phase"] == "Running"
        && p["status"]["containerStatuses"]
            .as_array()
            .is_some_and(|c| !c.is_empty() && c.iter().all(|c| c["state"]["running"].is_object()))
}

fn node_ready(api: &TestApi) -> bool {
    api.get("nodes", None, NODE).is_some_and(|n| {
        n["status"]["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
    })
}

fn one_run(bin: &Path, n: usize, objects: bool, qps: Option<u32>) -> Result<Run> {
    let rt = tokio::runtime::Runtime::new()?;
    let api = rt.block_on(TestApi::start(0))?;
    api.add_token("node", Some(NODE));
    let settings = json!({"metadata": {"name": "settings"}, "data": {"level": "info"}});
    api.create("configmaps", Some("default"), settings)?;
    let dir = std::env::temp_dir().join(format!("nwbench-apipods-kube-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let kubeconfig = api.write_kubeconfig(&dir, "node")?.display().to_string();
    let limits = qps.map_or(String::new(), |q| format!("kubeAPIQPS: {q}\nkubeAPIBurst: {}\n", 2 * q));
    let node = StaticNode::start_with(bin, "apipods", &limits, &["--kubeconfig", &kubeconfig])?;
    wait("the Node Ready", 60, || node_ready(&api))?;
    std::thread::sleep(Duration::from_secs(2));

    let from = api.requests().len();
    let t0 = Instant::now();
    let mut created = BTreeMap::new();
    for i in 0..n {
        let name = format!("p{i}");
        api.create("pods", Some("default"), bound_pod(&name, objects))?;
        created.insert(name, Instant::now());
    }
    let mut running: BTreeMap<String, f64> = BTreeMap::new();
    wait("every pod Running in the apiserver", 300, || {
        let names = api.scan("pods", Some("default"), |p| {
            started(p).then(|| p["metadata"]["name"].as_str()).flatten().map(str::to_owned)
        });
        for name in names {
            if let Some(at) = created.get(&name) {
                running.entry(name).or_insert_with(|| at.elapsed().as_secs_f64());
            }
        }
        running.len() == n
    })?;
    let all_s = t0.elapsed().as_secs_f64();
    let window = api.requests()[from..].to_vec();
    // With `NODEWARDEN_BENCH_LOGS`, the apiserver's requests of the burst beside the daemon's log.
    if let Some(keep) = std::env::var_os("NODEWARDEN_BENCH_LOGS") {
        let lines: String = window
            .iter()
            .map(|r| format!("{} {} {} {} {}\n", r.time, r.status, r.method, r.path, r.user_agent))
            .collect();
        let _ = std::fs::create_dir_all(&keep);
        let _ = std::fs::write(Path::new(&keep).join(format!("requests-{}.log", std::process::id())), lines);
    }
    let requests = window.iter().filter(|r| !r.path.contains("/leases/")).count();
    let per_pod = requests as f64 / n as f64;
    let metrics = get(node.port, "/metrics").unwrap_or_default();
    let sli_count = nodewarden_testkit::metric(&metrics, "kubelet_pod_start_sli_duration_seconds_count").unwrap_or(0.0);

    let t1 = Instant::now();
    for name in created.keys() {
        api.delete("pods", Some("default"), name, Some(5))?;
    }
    wait("every pod gone from the apiserver", 300, || api.scan("pods", Some("default"), |_| Some(())).is_empty())?;
    let delete_s = t1.elapsed().as_secs_f64();
    wait("every pod gone from the node", 120, || pods(node.port).is_empty())?;

    let t2 = Instant::now();
    for i in 0..n {
        let manifest = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: s{i}\nspec:\n  containers:\n  - name: app\n    \
             image: busybox\n    command: [sleep, '100000']\n"
        );
        write(&node.manifests, &format!("s{i}.yaml"), &manifest)?;
    }
    wait("every static pod Running", 300, || {
        pods(node.port).iter().filter(|p| p["status"]["phase"] == "Running").count() == n
    })?;
    let static_s = t2.elapsed().as_secs_f64();
    drop(node);
    Ok(Run { starts: running.into_values().collect(), all_s, per_pod, sli_count, delete_s, static_s })
}

/// Runs the benchmark and writes a Markdown table.
pub fn run(bin: &Path, n: usize, runs: usize, objects: bool, qps: Option<u32>, out: &Path) -> Result<()> {
    if runs == 0 || n == 0 {
        bail!("--runs and --pods must be at least 1");
    }
    let mut results = Vec::new();
    for r in 0..runs {
        let run = one_run(bin, n, objects, qps)?;
        eprintln!(
            "run {}: p50 {:.2} s, p99 {:.2} s, all {:.2} s, {:.1} requests/pod, SLI count {}, deleted in {:.2} s, \
             static {:.2} s",
            r + 1,
            percentile(run.starts.clone(), 0.5),
            percentile(run.starts.clone(), 0.99),
            run.all_s,
            run.per_pod,
            run.sli_count,
            run.delete_s,
            run.static_s
        );
        results.push(run);
    }
    let col = |f: &dyn Fn(&Run) -> f64| -> Vec<f64> { results.iter().map(f).collect() };
    let (p50, p99) = (col(&|r| percentile(r.starts.clone(), 0.5)), col(&|r| percentile(r.starts.clone(), 0.99)));
    let (all, per_pod, delete, statics) =
        (col(&|r| r.all_s), col(&|r| r.per_pod), col(&|r| r.delete_s), col(&|r| r.static_s));
    let sli = col(&|r| r.sli_count);
    let limits = qps.map_or(String::new(), |q| format!(", kubeAPIQPS {q}"));
    let title = if objects {
        ", with their objects (a service account token volume and a ConfigMap variable each)"
    } else {
        " (no service account token: automountServiceAccountToken false)"
    };
    let table = format!(
        "# Pods from the apiserver{title}{limits}\n\n{runs} runs, {n} pods created at once through the test apiserver, bound to \
         the node, on the process runtime; 1 GiB guest, 2 emulated vCPUs (TCG). Median of the runs (worst run).\n\n\
         | measure | kubelet | median | worst |\n|---|---|---|---|\n\
         | pod startup (creation → Running in the apiserver), p50 | | {:.2} s | {:.2} s |\n\
         | pod startup, p99 | SLO: p99 ≤ 5 s | {:.2} s | {:.2} s |\n\
         | all {n} Running | | {:.2} s | {:.2} s |\n\
         | apiserver requests per pod started (Lease renewals left out) | | {:.1} | {:.1} |\n\
         | starts observed by `kubelet_pod_start_sli_duration_seconds` | {n} | {:.0} | {:.0} |\n\
         | all {n} deleted (grace 5 s) → gone from the apiserver | | {:.2} s | {:.2} s |\n\
         | the same {n} as static manifests → all Running | | {:.2} s | {:.2} s |\n",
        median(p50.clone()),
        worst(&p50),
        median(p99.clone()),
        worst(&p99),
        median(all.clone()),
        worst(&all),
        median(per_pod.clone()),
        worst(&per_pod),
        median(sli.clone()),
        sli.iter().copied().fold(f64::INFINITY, f64::min),
        median(delete.clone()),
        worst(&delete),
        median(statics.clone()),
        worst(&statics),
    );
    std::fs::write(out, &table)?;
    print!("{table}");
    Ok(())
}
