//! Pod workers against a scripted runtime over a stand-in cgroupfs, with time paused: restart policies and the
//! crash-loop back-off, init containers, probes, termination, eviction and admission.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use nodewarden_resources::testing::FakeHost;
use nodewarden_resources::{Amount, CgroupPath, EvictionReserve, ResourceConfig, ResourceManager};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::manager::PodManager;
use crate::metrics::SyncMetrics;
use nodewarden_runtime::{
    ContainerId, ContainerSpec, ExecOutput, ExitInfo, RunningSandbox, Runtime, RuntimeError, RuntimeFacts,
    SandboxRuntime, SandboxSpec, Started, StopSignals,
};

const SIGTERM: i32 = 15;
const SIGKILL: i32 = 9;
use crate::source::SourceSnapshot;
use crate::worker::SyncSettings;

/// Containers by ID: name and exit.
type Running = HashMap<String, (String, watch::Sender<Option<ExitInfo>>)>;

/// A runtime whose containers run until the test (or a signal) ends them.
#[derive(Default)]
struct Fake {
    next: Mutex<u32>,
    started: Mutex<Vec<(Instant, ContainerSpec)>>,
    running: Mutex<Running>,
    signals: Mutex<Vec<(String, i32)>>,
    /// Containers (by name) that ignore SIGTERM.
    stubborn: Mutex<Vec<String>>,
    /// Containers (by name) that exit 0 on SIGTERM.
    graceful: Mutex<Vec<String>>,
    /// Exec commands (argv[0]) that fail.
    failing: Mutex<Vec<String>>,
    /// Sandbox calls, in order: `run <uid>`, `remove <uid>`.
    sandboxes: Mutex<Vec<String>>,
    /// Images that cannot be pulled.
    unpullable: Mutex<Vec<String>>,
    /// Images whose pull never ends.
    slow: Mutex<Vec<String>>,
    /// Containers (by name) whose next start panics.
    panics: Mutex<Vec<String>>,
    /// How long a stop signal sent at once holds up its caller after the container ended.
    signal_pause: Mutex<Duration>,
    /// The images the runtime lists (none are in use), and those removed.
    images: Mutex<Vec<nodewarden_runtime::NodeImage>>,
    removed_images: Mutex<Vec<String>>,
    /// The containers' writable layers the runtime measures, and whether it fails to answer.
    layers: Mutex<Vec<nodewarden_runtime::WritableLayer>>,
    layers_fail: Mutex<bool>,
    /// The containers removed, in order.
    removed: Mutex<Vec<String>>,
}

fn exit(code: i32) -> ExitInfo {
    ExitInfo::at_epoch(code)
}

impl Fake {
    fn finish(&self, name: &str, code: i32) {
        let running = self.running.lock().unwrap();
        let (_, tx) = running
            .values()
            .find(|(n, tx)| n == name && tx.borrow().is_none())
            .unwrap_or_else(|| panic!("{name} is not running"));
        tx.send_replace(Some(exit(code)));
    }

    fn starts(&self, name: &str) -> Vec<Instant> {
        self.started.lock().unwrap().iter().filter(|(_, s)| s.name == name).map(|(t, _)| *t).collect()
    }

    /// The ID of the running container `name`.
    fn id_of(&self, name: &str) -> String {
        let running = self.running.lock().unwrap();
        let found = running.iter().find(|(_, (n, tx))| n == name && tx.borrow().is_none());
        found.map(|(id, _)| id.clone()).unwrap_or_else(|| panic!("{name} is not running"))
    }

    fn is_running(&self, name: &str) -> bool {
        self.running.lock().unwrap().values().any(|(n, tx)| n == name && tx.borrow().is_none())
    }
}

impl Fake {
    /// Ends a container with `signal` (unless it ignores SIGTERM), as a kernel would.
    fn signal(&self, id: &str, signal: i32) {
        self.signals.lock().unwrap().push((id.to_owned(), signal));
        let running = self.running.lock().unwrap();
        let (name, tx) = &running[id];
        let code = if signal == SIGTERM && self.graceful.lock().unwrap().contains(name) { 0 } else { 128 + signal };
        if signal == SIGKILL || !self.stubborn.lock().unwrap().contains(name) {
            tx.send_if_modified(|v| v.is_none() && v.replace(exit(code)).is_none());
        }
    }

    fn has_exited(&self, id: &str) -> bool {
        self.running.lock().unwrap()[id].1.borrow().is_some()
    }
}

impl StopSignals for Fake {
    fn signal_stop_now(&self, id: &ContainerId) -> bool {
        let id = id.as_str();
        if !self.running.lock().unwrap().contains_key(id) {
            return false;
        }
        self.signal(id, SIGTERM);
        std::thread::sleep(*self.signal_pause.lock().unwrap());
        true
    }
}

impl SandboxRuntime for Fake {
    async fn run_sandbox(&self, spec: &SandboxSpec) -> Result<RunningSandbox, RuntimeError> {
        self.sandboxes.lock().unwrap().push(format!("run {}", spec.pod_uid));
        let ips = if spec.host_network { vec![] } else { vec!["10.88.0.7".to_owned()] };
        Ok(RunningSandbox { id: format!("sb-{}", spec.pod_uid), ips })
    }

    async fn adopt_sandbox(&self, _spec: &SandboxSpec) -> Option<RunningSandbox> {
        None
    }

    async fn stop_sandboxes(&self, pod_uid: &str) {
        self.sandboxes.lock().unwrap().push(format!("stop {pod_uid}"));
    }

    async fn remove_sandboxes(&self, pod_uid: &str) {
        self.sandboxes.lock().unwrap().push(format!("remove {pod_uid}"));
    }
}

/// Every image is present but those that cannot be pulled; the others pull at once.
impl nodewarden_runtime::ImageService for Fake {
    async fn image_present(&self, image: &str) -> Result<bool, RuntimeError> {
        Ok(!self.unpullable.lock().unwrap().iter().any(|i| i == image))
    }

    async fn pull_image(&self, spec: &ContainerSpec) -> Result<nodewarden_runtime::PulledImage, RuntimeError> {
        if self.unpullable.lock().unwrap().contains(&spec.image) {
            return Err(RuntimeError::Image { reason: "ErrImagePull", message: format!("cannot pull {}", spec.image) });
        }
        Ok(nodewarden_runtime::PulledImage { image_ref: spec.image.clone(), ..Default::default() })
    }

    async fn list_images(&self) -> Result<Vec<nodewarden_runtime::NodeImage>, RuntimeError> {
        Ok(self.images.lock().unwrap().clone())
    }

    async fn images_in_use(&self) -> Result<std::collections::BTreeSet<String>, RuntimeError> {
        Ok(std::collections::BTreeSet::new())
    }

    async fn remove_image(&self, id: &str) -> Result<(), RuntimeError> {
        self.images.lock().unwrap().retain(|i| i.id != id);
        self.removed_images.lock().unwrap().push(id.to_owned());
        Ok(())
    }

    async fn writable_layers(&self) -> Result<Vec<nodewarden_runtime::WritableLayer>, RuntimeError> {
        if *self.layers_fail.lock().unwrap() {
            return Err(RuntimeError::Other("the runtime does not answer".into()));
        }
        Ok(self.layers.lock().unwrap().clone())
    }
}

impl RuntimeFacts for Fake {
    fn scheme(&self) -> &'static str {
        "fake"
    }
}

impl Runtime for Fake {
    type Sandboxes = Self;

    fn sandboxes(&self) -> Option<&Self> {
        Some(self)
    }

    type Images = Self;

    fn image_service(&self) -> Option<&Self> {
        Some(self)
    }

    type Streaming = nodewarden_runtime::NoStreaming;

    fn streaming(&self) -> Option<&nodewarden_runtime::NoStreaming> {
        None
    }

    async fn start(&self, spec: &ContainerSpec) -> Result<Started, RuntimeError> {
        assert_eq!(spec.sandbox_id, format!("sb-{}", spec.pod_uid), "containers start in the pod's sandbox");
        let panics = {
            let mut p = self.panics.lock().unwrap();
            let found = p.iter().position(|n| *n == spec.name);
            found.map(|i| p.remove(i))
        };
        if let Some(name) = panics {
            panic!("the runtime broke starting {name}");
        }
        if self.slow.lock().unwrap().contains(&spec.image) {
            std::future::pending::<()>().await;
        }
        let mut n = self.next.lock().unwrap();
        *n += 1;
        let id = format!("c{n}");
        self.started.lock().unwrap().push((Instant::now(), spec.clone()));
        self.running.lock().unwrap().insert(id.clone(), (spec.name.clone(), watch::channel(None).0));
        Ok(Started { id: id.into(), pid: 1000 + *n, pid_start: None, started_at: Timestamp::UNIX_EPOCH })
    }

    async fn adopt(&self, _spec: &ContainerSpec, _main: Option<nodewarden_runtime::MainProcess>) -> Option<Started> {
        None
    }

    async fn wait(&self, id: &ContainerId) -> ExitInfo {
        let id = id.as_str();
        let mut rx = self.running.lock().unwrap()[id].1.subscribe();
        let v = rx.wait_for(Option::is_some).await.unwrap().clone();
        v.unwrap()
    }

    fn stop_signals(&self) -> Option<&dyn StopSignals> {
        Some(self)
    }

    async fn stop(&self, id: &ContainerId, grace: Duration) -> Result<(), RuntimeError> {
        let id = id.as_str();
        if !grace.is_zero() {
            // A container is sent its stop signal once (an eviction may have sent it already).
            if !self.signals.lock().unwrap().contains(&(id.to_owned(), SIGTERM)) {
                self.signal(id, SIGTERM);
            }
            tokio::time::sleep(grace).await;
        }
        if !self.has_exited(id) {
            self.signal(id, SIGKILL);
        }
        Ok(())
    }

    async fn exec(&self, _id: &ContainerId, argv: &[String], _t: Duration) -> Result<ExecOutput, RuntimeError> {
        let fails = self.failing.lock().unwrap().contains(&argv[0]);
        Ok(ExecOutput { exit_code: Some(i32::from(fails)), output: String::new() })
    }

    async fn remove(&self, id: &ContainerId) {
        self.removed.lock().unwrap().push(id.as_str().to_owned());
    }
}

/// The pod events recorded, as (pod UID, reason, message).
#[derive(Default)]
struct Events(Mutex<Vec<(String, String, String)>>);

impl crate::EventSink for Events {
    fn pod_event(&self, pod: &Pod, e: crate::PodEvent) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.0.lock().unwrap().push((uid, e.reason, e.message));
    }

    /// Recorded with the node's name as the UID.
    fn node_event(&self, e: crate::PodEvent) {
        self.0.lock().unwrap().push(("node".into(), e.reason, e.message));
    }
}

impl Events {
    /// The reasons recorded for pod `uid`, in order.
    fn reasons(&self, uid: &str) -> Vec<String> {
        self.0.lock().unwrap().iter().filter(|(u, ..)| u == uid).map(|(_, r, _)| r.clone()).collect()
    }
}

struct Harness {
    _host: FakeHost,
    events: Arc<Events>,
    cg: std::path::PathBuf,
    fake: Arc<Fake>,
    manager: Arc<PodManager<Fake>>,
    tx: mpsc::Sender<SourceSnapshot>,
    registry: prometheus::Registry,
    _drain: tokio_util::sync::DropGuard,
}

fn harness() -> Harness {
    harness_on(FakeHost::new())
}

/// A pod manager on `host`, whose cgroups and root directory an earlier manager may have left.
fn harness_on(host: FakeHost) -> Harness {
    harness_expecting(host, &[])
}

/// [`harness_on`], with the sources whose first snapshots the manager waits for.
fn harness_expecting(host: FakeHost, sources: &[&'static str]) -> Harness {
    harness_with(host, sources, Arc::new(crate::NoObjects))
}

/// [`harness_expecting`], reading the objects pods reference from `objects`.
fn harness_with(host: FakeHost, sources: &[&'static str], objects: Arc<dyn crate::PodObjects>) -> Harness {
    let p = host.path().to_path_buf();
    let config = ResourceConfig {
        eviction_reserve: EvictionReserve {
            memory_available: Some(Amount::Quantity(100 << 20)),
            nodefs_available: None,
        },
        max_pods: 10,
        ..ResourceConfig::new(CgroupPath::parse("/nw").unwrap())
    };
    let fs = host.cgroupfs(&config.cgroup_root);
    let mut rm = ResourceManager::new(fs, host.host(), config).unwrap();
    rm.setup().unwrap();
    let fake = Arc::new(Fake::default());
    let settings = SyncSettings {
        root_dir: p.join("root"),
        log_dir: p.join("logs"),
        node_name: "n".into(),
        log_rotation: crate::LogRotation::default(),
        host_ips: vec!["192.0.2.10".into()],
        sync_frequency: Duration::from_secs(60),
        dead_containers: crate::DeadContainerPolicy::default(),
    };
    let registry = prometheus::Registry::new();
    let metrics = SyncMetrics::new(&registry).unwrap();
    let events = Arc::new(Events::default());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let manager = PodManager::new(
        nodewarden_resources::Ledger::new(rm),
        fake.clone(),
        settings,
        metrics,
        crate::Ports { events: events.clone(), objects },
        tasks,
        shutdown.clone(),
    );
    for source in sources {
        manager.expect_source(source);
    }
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(manager.clone().run(rx));
    let drain_tx = shutdown.drop_guard();
    Harness {
        cg: host.cgroup_mount().join("nw/kubepods"),
        _host: host,
        events,
        fake,
        manager,
        tx,
        registry,
        _drain: drain_tx,
    }
}

fn pod(uid: &str, spec: serde_json::Value) -> Pod {
    serde_json::from_value(
        json!({"metadata": {"name": format!("p-{uid}"), "namespace": "default", "uid": uid}, "spec": spec}),
    )
    .unwrap()
}

fn app(name: &str) -> serde_json::Value {
    json!({"name": name, "image": "busybox", "command": ["sleep", "infinity"]})
}

impl Harness {
    async fn set(&self, pods: Vec<Pod>) {
        self.send(crate::FILE_SOURCE, pods).await;
    }

    /// A snapshot of `source`.
    async fn send(&self, source: &'static str, pods: Vec<Pod>) {
        let pods = pods.into_iter().map(Arc::new).collect();
        self.tx.send(SourceSnapshot { source, pods, invalid: vec![] }).await.unwrap();
    }

    /// How many inputs the pod workers have handled (`kubelet_pod_worker_duration_seconds{operation_type="sync"}`).
    fn worker_syncs(&self) -> u64 {
        self.registry
            .gather()
            .iter()
            .filter(|f| f.name() == "kubelet_pod_worker_duration_seconds")
            .flat_map(|f| f.get_metric())
            .map(|m| m.get_histogram().get_sample_count())
            .sum()
    }

    /// Runs `pod`, whose container `stubborn` ignores SIGTERM, until it is Running, then deletes it from the source
    /// and waits until its worker has sent the stop signal: the pod is in its grace period.
    async fn run_then_delete_stubborn(&self, pod: Pod) {
        let uid = pod.metadata.uid.clone().unwrap();
        self.set(vec![pod]).await;
        self.until(&uid, "runs", |v| phase(v) == "Running").await;
        self.fake.stubborn.lock().unwrap().push("stubborn".into());
        self.set(vec![]).await;
        while self.fake.signals.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits (in paused time) until the pod's status satisfies `f`.
    async fn until(&self, uid: &str, what: &str, f: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        for _ in 0..2000 {
            if let Some(p) = self.manager.store().get(uid) {
                let v = serde_json::to_value(&p).unwrap();
                if f(&v) {
                    return v;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{uid}: never {what}: {:#}", serde_json::to_value(self.manager.store().get(uid)).unwrap());
    }
}

fn phase(v: &serde_json::Value) -> &str {
    v["status"]["phase"].as_str().unwrap_or_default()
}

fn container<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["status"]["containerStatuses"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap()
}

#[tokio::test(start_paused = true)]
async fn crash_loop_back_off_doubles_from_ten_seconds() {
    let h = harness();
    h.set(vec![pod("u1", json!({"containers": [app("app")]}))]).await;
    h.until("u1", "runs", |v| phase(v) == "Running").await;
    for _ in 0..4 {
        let n = h.fake.starts("app").len();
        h.fake.finish("app", 1);
        while h.fake.starts("app").len() == n {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let starts = h.fake.starts("app");
    let gaps: Vec<u64> = starts.windows(2).map(|w| (w[1] - w[0]).as_secs()).collect();
    assert_eq!(gaps, [0, 10, 20, 40], "restart delays");
    h.fake.finish("app", 2);
    let v =
        h.until("u1", "backs off", |v| container(v, "app")["state"]["waiting"]["reason"] == "CrashLoopBackOff").await;
    let c = container(&v, "app");
    assert_eq!(c["restartCount"], 4);
    assert_eq!(c["lastState"]["terminated"]["exitCode"], 2);
    assert!(
        c["state"]["waiting"]["message"].as_str().unwrap().starts_with("back-off 80s restarting failed container=app")
    );
    assert_eq!(phase(&v), "Running", "a restarting pod is Running, as the kubelet reports it");
    // The first restart is at once; each later one waits out a back-off, and says so.
    let reasons = h.events.reasons("u1");
    // The image is untagged: pulled before each start (`Always`), as the kubelet does.
    let started = ["Pulling", "Pulled", "Created", "Started"];
    let want: Vec<&str> =
        [&started[..], &started, &["BackOff"], &started, &["BackOff"], &started, &["BackOff"], &started, &["BackOff"]]
            .concat();
    assert_eq!(reasons, want);
    let messages = h.events.0.lock().unwrap().clone();
    assert!(
        messages
            .iter()
            .any(|(_, r, m)| r == "BackOff" && m == "Back-off restarting failed container app in pod p-u1_default(u1)"),
        "{messages:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_restarted_container_keeps_its_last_dead_one_until_the_next_exit_or_the_pods_end() {
    let h = harness();
    let removed = || h.fake.removed.lock().unwrap().clone();
    h.set(vec![pod("u1", json!({"containers": [app("app"), app("side")]}))]).await;
    h.until("u1", "runs", |v| phase(v) == "Running").await;
    let side = h.fake.id_of("side");
    let mut dead = Vec::new();
    for round in 0..3 {
        let n = h.fake.starts("app").len();
        dead.push(h.fake.id_of("app"));
        h.fake.finish("app", 1);
        while h.fake.starts("app").len() == n {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The kubelet's default policy: one dead container per container, the newest, kept for inspection.
        assert_eq!(removed(), dead[..round], "after restart {}", round + 1);
    }
    let v =
        h.until("u1", "reports the last exit", |v| container(v, "app")["lastState"]["terminated"].is_object()).await;
    let last = container(&v, "app")["lastState"]["terminated"]["containerID"].clone();
    assert_eq!(last, format!("fake://{}", dead[2]), "the last state names the dead container still kept");
    let live = h.fake.id_of("app");
    h.set(vec![]).await;
    while h.manager.store().get("u1").is_some() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut gone = removed();
    gone.sort();
    let mut want = [&dead[..], &[live, side]].concat();
    want.sort();
    assert_eq!(gone, want, "the pod's end takes its dead containers and the ones that ran, each once");
}

#[tokio::test(start_paused = true)]
async fn a_pod_over_on_its_own_keeps_its_stopped_sandbox_and_exited_containers_until_deleted_or_reclaimed() {
    use nodewarden_eviction::{Evictor, Reclaimed, Signal};
    let h = harness();
    let removed = || h.fake.removed.lock().unwrap().clone();
    let sandboxes = |uid: &str| -> Vec<String> {
        h.fake.sandboxes.lock().unwrap().iter().filter(|s| s.ends_with(uid)).cloned().collect()
    };
    let never = |uid: &str, name: &str| pod(uid, json!({"restartPolicy": "Never", "containers": [app(name)]}));
    h.set(vec![never("u95", "a95"), never("u96", "a96")]).await;
    h.until("u95", "runs", |v| phase(v) == "Running").await;
    h.until("u96", "runs", |v| phase(v) == "Running").await;
    let (c95, c96) = (h.fake.id_of("a95"), h.fake.id_of("a96"));
    assert_eq!(h.manager.reclaim_disk(Signal::NodeFsAvailable), Reclaimed::Nothing, "nothing of running pods");
    h.fake.finish("a95", 0);
    h.fake.finish("a96", 1);
    h.until("u95", "succeeds", |v| phase(v) == "Succeeded").await;
    h.until("u96", "fails", |v| phase(v) == "Failed").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // As the kubelet's: the sandbox is stopped, and the exited containers stay for `crictl ps -a` and their logs.
    assert_eq!(sandboxes("u95"), ["run u95", "stop u95"]);
    assert_eq!(removed(), Vec::<String>::new(), "the containers of a pod over and still listed are kept");
    // Its deletion takes them.
    h.set(vec![never("u96", "a96")]).await;
    while h.manager.store().get("u95").is_some() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(sandboxes("u95"), ["run u95", "stop u95", "remove u95"]);
    // Disk pressure reclaims those of the pod still listed before any eviction, off the eviction thread.
    let mut said = Reclaimed::Running;
    for _ in 0..100 {
        said = h.manager.reclaim_disk(Signal::NodeFsAvailable);
        if said != Reclaimed::Running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(said, Reclaimed::Freed(0), "removed: the next reading shows what they held");
    let mut gone = removed();
    gone.sort();
    assert_eq!(gone, [c95, c96], "each removed once");
    assert_eq!(sandboxes("u96"), ["run u96", "stop u96", "remove u96"]);
    assert_eq!(h.manager.reclaim_disk(Signal::NodeFsAvailable), Reclaimed::Nothing, "nothing is left");
    let v = serde_json::to_value(h.manager.store().get("u96").unwrap()).unwrap();
    assert_eq!(phase(&v), "Failed", "the pod itself stays, over");
}

#[tokio::test(start_paused = true)]
async fn a_restarted_daemon_keeps_what_a_pod_over_kept_until_the_pod_is_deleted() {
    let h = harness();
    let spec = json!({"restartPolicy": "Never", "containers": [app("app")]});
    h.set(vec![pod("u98", spec.clone())]).await;
    h.until("u98", "runs", |v| phase(v) == "Running").await;
    let id = h.fake.id_of("app");
    h.fake.finish("app", 0);
    h.until("u98", "succeeds", |v| phase(v) == "Succeeded").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let Harness { _host: host, _drain: drain, .. } = h;
    drop(drain);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let h = harness_on(host);
    h.set(vec![pod("u98", spec)]).await;
    h.until("u98", "is over again", |v| phase(v) == "Succeeded").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Its sandbox is stopped again (the earlier daemon may have ended first), and nothing is removed or run.
    assert_eq!(*h.fake.sandboxes.lock().unwrap(), ["stop u98"]);
    assert!(h.fake.removed.lock().unwrap().is_empty() && h.fake.starts("app").is_empty());
    h.set(vec![]).await;
    while h.manager.store().get("u98").is_some() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(*h.fake.sandboxes.lock().unwrap(), ["stop u98", "remove u98"]);
    assert_eq!(*h.fake.removed.lock().unwrap(), [id], "the exited container the earlier daemon kept");
}

#[tokio::test(start_paused = true)]
async fn init_containers_run_in_order_before_the_app() {
    let h = harness();
    let spec = json!({"restartPolicy": "OnFailure", "initContainers": [app("first"), app("second")], "containers": [app("app")]});
    h.set(vec![pod("u2", spec)]).await;
    let v = h.until("u2", "runs first", |v| phase(v) == "Pending").await;
    assert_eq!(container(&v, "app")["state"]["waiting"]["reason"], "PodInitializing");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(h.fake.is_running("first") && h.fake.starts("second").is_empty() && h.fake.starts("app").is_empty());
    // A failed init container is restarted (OnFailure), then the next one runs.
    h.fake.finish("first", 1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(h.fake.starts("first").len(), 2);
    h.fake.finish("first", 0);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(h.fake.is_running("second") && h.fake.starts("app").is_empty());
    h.fake.finish("second", 0);
    let v = h.until("u2", "runs the app", |v| phase(v) == "Running").await;
    assert_eq!(v["status"]["initContainerStatuses"][0]["state"]["terminated"]["reason"], "Completed");
    // OnFailure: a clean exit of the only app container ends the pod, and its cgroup is released.
    h.fake.finish("app", 0);
    let v = h.until("u2", "succeeds", |v| phase(v) == "Succeeded").await;
    assert!(!h.cg.join("burstable/podu2").exists() && !h.cg.join("besteffort/podu2").exists());
    let conditions = v["status"]["conditions"].as_array().unwrap();
    assert!(!conditions.iter().any(|c| c["type"] == "DisruptionTarget"), "a pod that ended on its own: {conditions:?}");
}

#[tokio::test(start_paused = true)]
async fn a_failed_init_container_fails_a_never_pod() {
    let h = harness();
    h.set(vec![pod(
        "u3",
        json!({"restartPolicy": "Never", "initContainers": [app("init")], "containers": [app("app")]}),
    )])
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    h.fake.finish("init", 3);
    let v = h.until("u3", "fails", |v| phase(v) == "Failed").await;
    assert!(v["status"]["message"].as_str().unwrap().contains("init container init failed with exit code 3"));
    assert!(h.fake.starts("app").is_empty());
}

#[tokio::test(start_paused = true)]
async fn probes_drive_readiness_and_restarts() {
    let h = harness();
    let mut c = app("web");
    c["readinessProbe"] = json!({"exec": {"command": ["ready"]}, "periodSeconds": 1});
    c["livenessProbe"] = json!({"exec": {"command": ["alive"]}, "periodSeconds": 1, "failureThreshold": 2});
    h.set(vec![pod("u4", json!({"terminationGracePeriodSeconds": 5, "containers": [c]}))]).await;
    let v = h.until("u4", "is ready", |v| container(v, "web")["ready"] == true).await;
    let ready = v["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap().clone();
    assert_eq!(ready["status"], "True");
    // Readiness failing (3 times by default) takes the pod out of Ready.
    h.fake.failing.lock().unwrap().push("ready".into());
    h.until("u4", "is unready", |v| container(v, "web")["ready"] == false).await;
    // Liveness failing twice restarts the container: SIGTERM, and the container exits.
    h.fake.failing.lock().unwrap().push("alive".into());
    let v = h.until("u4", "restarts", |v| container(v, "web")["restartCount"] == 1).await;
    assert_eq!(container(&v, "web")["lastState"]["terminated"]["exitCode"], 128 + SIGTERM);
    assert!(h.fake.signals.lock().unwrap().iter().any(|(_, s)| *s == SIGTERM));
    let events = h.events.0.lock().unwrap().clone();
    let said = |reason: &str, message: &str| events.iter().any(|(_, r, m)| r == reason && m.starts_with(message));
    assert!(said("Unhealthy", "Readiness probe failed: command [\"ready\"] exited with 1"), "{events:?}");
    assert!(said("Unhealthy", "Liveness probe failed: "), "{events:?}");
    assert!(said("Killing", "Container web failed liveness probe, will be restarted"), "{events:?}");
}

#[tokio::test(start_paused = true)]
async fn readiness_gates_hold_ready_until_their_conditions_are_true() {
    let h = harness();
    let ready_of = |v: &serde_json::Value| {
        v["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap().clone()
    };
    let gated = |status: Option<&str>| {
        let mut p =
            pod("u40", json!({"readinessGates": [{"conditionType": "example.com/lb"}], "containers": [app("web")]}));
        if let Some(s) = status {
            p.status =
                Some(serde_json::from_value(json!({"conditions": [{"type": "example.com/lb", "status": s}]})).unwrap());
        }
        p
    };
    h.set(vec![gated(None)]).await;
    let v = h.until("u40", "runs", |v| phase(v) == "Running").await;
    let ready = ready_of(&v);
    assert_eq!((ready["status"].as_str(), ready["reason"].as_str()), (Some("False"), Some("ReadinessGatesNotReady")));
    assert_eq!(ready["message"], "corresponding condition of pod readiness gate \"example.com/lb\" does not exist.");
    let containers =
        v["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "ContainersReady").cloned();
    assert_eq!(containers.unwrap()["status"], "True", "the containers are ready; the gate is not");
    h.set(vec![gated(Some("False"))]).await;
    let v = h
        .until("u40", "names the gate's status", |v| {
            ready_of(v)["message"] == "the status of pod readiness gate \"example.com/lb\" is not \"True\", but False"
        })
        .await;
    assert_eq!(container(&v, "web")["restartCount"], 0, "a condition's change restarts nothing");
    h.set(vec![gated(Some("True"))]).await;
    let v = h.until("u40", "is ready", |v| ready_of(v)["status"] == "True").await;
    assert!(ready_of(&v)["reason"].is_null());

    // A pod whose containers are not ready says which.
    let mut c = app("slow");
    c["readinessProbe"] = json!({"exec": {"command": ["never"]}, "periodSeconds": 1});
    h.fake.failing.lock().unwrap().push("never".into());
    h.set(vec![gated(Some("True")), pod("u41", json!({"containers": [c, app("fine")]}))]).await;
    let v = h.until("u41", "runs, one container ready", |v| container(v, "fine")["ready"] == true).await;
    let ready = ready_of(&v);
    assert_eq!(
        (ready["reason"].as_str(), ready["message"].as_str()),
        (Some("ContainersNotReady"), Some("containers with unready status: [slow]"))
    );
}

#[tokio::test(start_paused = true)]
async fn deletion_terminates_within_the_grace_period() {
    let h = harness();
    h.set(vec![pod("u5", json!({"terminationGracePeriodSeconds": 7, "containers": [app("a"), app("stubborn")]}))])
        .await;
    h.until("u5", "runs", |v| phase(v) == "Running").await;
    h.fake.stubborn.lock().unwrap().push("stubborn".into());
    let t0 = Instant::now();
    h.set(vec![]).await;
    while h.manager.store().get("u5").is_some() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = t0.elapsed();
    assert!(took >= Duration::from_secs(7) && took < Duration::from_secs(8), "took {took:?}");
    assert!(!h.fake.is_running("a"));
    assert!(!h.cg.join("besteffort/podu5").exists(), "cgroup released");
    assert_eq!(*h.fake.sandboxes.lock().unwrap(), ["run u5", "remove u5"], "one sandbox, removed at the end");
}

/// `p` as the apiserver lists it once deleted: a deletion time, and the grace period of the deletion.
fn deleting(mut p: Pod, grace: i64) -> Pod {
    p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH));
    p.metadata.deletion_grace_period_seconds = Some(grace);
    p
}

/// Waits until the pod is gone from the store; how long that took since `t0`.
async fn gone(h: &Harness, uid: &str, t0: Instant) -> Duration {
    while h.manager.store().get(uid).is_some() && t0.elapsed() < Duration::from_secs(600) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    t0.elapsed()
}

/// Waits until the status feed has the pod's final status; how long that took since `t0`.
async fn finalized(feed: &mut crate::StatusReader, uid: &str, t0: Instant) -> Duration {
    while !feed.unreported().iter().any(|u| u.uid == uid && u.gone) && t0.elapsed() < Duration::from_secs(600) {
        let _ = tokio::time::timeout(Duration::from_secs(1), feed.changed()).await;
    }
    t0.elapsed()
}

#[tokio::test(start_paused = true)]
async fn a_pod_listed_with_a_deletion_time_terminates_with_its_grace_and_is_not_run_again() {
    let h = harness();
    let mut feed = h.manager.store().reader().unwrap();
    let spec = || pod("u40", json!({"terminationGracePeriodSeconds": 30, "containers": [app("stubborn")]}));
    h.set(vec![spec()]).await;
    h.until("u40", "runs", |v| phase(v) == "Running").await;
    h.fake.stubborn.lock().unwrap().push("stubborn".into());
    // Deleted with 20 s, still listed; then a second deletion with 3 s (`kubectl delete --grace-period=3`): the
    // grace only shrinks, from when it was asked.
    let t0 = Instant::now();
    h.set(vec![deleting(spec(), 20)]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(h.fake.signals.lock().unwrap().iter().any(|(_, s)| *s == SIGTERM), "SIGTERM at once");
    h.set(vec![deleting(spec(), 3)]).await;
    h.set(vec![deleting(spec(), 10)]).await;
    let took = finalized(&mut feed, "u40", t0).await;
    assert!(took >= Duration::from_secs(4) && took < Duration::from_secs(5), "took {took:?}");
    let ended = h.until("u40", "ended", |v| container(v, "stubborn")["state"]["terminated"].is_object()).await;
    assert_eq!(phase(&ended), "Running", "a deleted pod's phase stays (the kubelet's, under Always)");
    // Listed with its deletion time until the apiserver removes it: never run again, and still served.
    h.set(vec![deleting(spec(), 3)]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let syncs = h.worker_syncs();
    for _ in 0..3 {
        h.set(vec![deleting(spec(), 3)]).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(h.manager.store().get("u40").is_some(), "a finalizing pod is served until its source drops it");
    }
    assert_eq!(h.worker_syncs(), syncs, "a worker took the deleted pod up again");
    assert_eq!(h.fake.starts("stubborn").len(), 1, "run again after its deletion");
    assert_eq!(*h.fake.sandboxes.lock().unwrap(), ["run u40", "remove u40"], "one sandbox, removed at the end");
    // Dropped by its source (the apiserver deleted it for good), it is forgotten; the same UID is then a new pod
    // when a source has it again.
    let t1 = Instant::now();
    h.set(vec![]).await;
    assert!(gone(&h, "u40", t1).await < Duration::from_secs(1), "forgotten once dropped");
    h.set(vec![spec()]).await;
    h.until("u40", "runs again", |v| phase(v) == "Running").await;
}

#[tokio::test(start_paused = true)]
async fn the_status_feed_keeps_a_deleted_pods_last_status_until_it_is_acknowledged() {
    let h = harness();
    let mut feed = h.manager.store().reader().unwrap();
    let named = |uid: &str| {
        let mut p = pod(uid, json!({"terminationGracePeriodSeconds": 2, "containers": [app("a")]}));
        p.metadata.name = Some("same-name".into());
        p
    };
    h.set(vec![named("u50")]).await;
    h.until("u50", "runs", |v| phase(v) == "Running").await;
    // Made again under its name (a new UID): the old pod's last status and the new pod's are apart.
    let t0 = Instant::now();
    h.set(vec![named("u51")]).await;
    gone(&h, "u50", t0).await;
    h.until("u51", "runs", |v| phase(v) == "Running").await;
    feed.changed().await;
    let unreported = feed.unreported();
    let old = unreported.iter().find(|u| u.uid == "u50").expect("the deleted pod's last status was dropped");
    assert!(old.gone);
    let c = &old.pod.status.as_ref().unwrap().container_statuses.as_ref().unwrap()[0];
    assert!(c.state.as_ref().unwrap().terminated.is_some(), "its last status says its container ended: {c:?}");
    let new = unreported.iter().find(|u| u.uid == "u51").unwrap();
    assert_eq!(new.pod.metadata.uid.as_deref(), Some("u51"));
    assert_eq!(new.pod.status.as_ref().unwrap().phase.as_deref(), Some("Running"));
    // Acknowledged, the old one is forgotten; the new one stays known, reported.
    let finalized: Vec<String> = unreported
        .iter()
        .filter_map(|u| feed.ack(&u.uid, u.generation))
        .map(|p| p.metadata.uid.clone().unwrap())
        .collect();
    assert_eq!(
        finalized,
        ["u50"],
        "the deleted pod, once its final status is acknowledged, is the consumer's to finalize"
    );
    assert!(feed.unreported().is_empty());
    assert_eq!(feed.all().iter().map(|u| u.uid.as_str()).collect::<Vec<_>>(), ["u51"]);
}

#[tokio::test(start_paused = true)]
async fn a_pod_an_earlier_daemon_ran_and_first_seen_deleted_is_taken_over_then_terminated() {
    let h = harness();
    let p = || pod("u70", json!({"terminationGracePeriodSeconds": 30, "containers": [app("a")]}));
    h.set(vec![p()]).await;
    h.until("u70", "runs", |v| phase(v) == "Running").await;
    let Harness { _host: host, _drain: drain, cg, .. } = h;
    drop(drain);
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(cg.join("besteffort/podu70").exists());
    // The next daemon first hears of it deleted (the apiserver's graceful deletion went on meanwhile): it takes
    // the pod over, then terminates it and releases its cgroup; forgetting it would leave it running.
    let h = harness_on(host);
    h.set(vec![deleting(p(), 2)]).await;
    for _ in 0..100 {
        if !cg.join("besteffort/podu70").exists() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(!cg.join("besteffort/podu70").exists(), "the deleted pod's cgroup is left behind");
    assert!(h.fake.starts("a").is_empty(), "the deleted pod was started again");
}

#[tokio::test(start_paused = true)]
async fn a_pod_added_again_then_deleted_by_the_apiserver_does_not_start_anew() {
    let h = harness();
    let spec = || pod("u71", json!({"terminationGracePeriodSeconds": 5, "containers": [app("stubborn")]}));
    // Dropped, listed again while it terminates (it would start anew once it ended), then listed deleted.
    h.run_then_delete_stubborn(spec()).await;
    h.set(vec![spec()]).await;
    h.set(vec![deleting(spec(), 5)]).await;
    let t0 = Instant::now();
    gone(&h, "u71", t0).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(h.fake.starts("stubborn").len(), 1, "started anew after its deletion");
    assert!(h.manager.store().get("u71").is_none());
}

#[tokio::test(start_paused = true)]
async fn a_pod_first_seen_deleted_is_never_started() {
    let h = harness();
    let p = pod("u41", json!({"terminationGracePeriodSeconds": 30, "containers": [app("a")]}));
    let t0 = Instant::now();
    h.set(vec![deleting(p, 5)]).await;
    let took = gone(&h, "u41", t0).await;
    assert!(took < Duration::from_secs(6), "took {took:?}");
    assert!(h.fake.starts("a").is_empty(), "a deleted pod was started");
}

#[tokio::test(start_paused = true)]
async fn a_deleted_pod_is_told_once_however_many_snapshots_follow() {
    let h = harness();
    h.run_then_delete_stubborn(pod(
        "u31",
        json!({"terminationGracePeriodSeconds": 60, "containers": [app("stubborn")]}),
    ))
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = h.worker_syncs();
    assert!(before > 0, "the worker's inputs are counted");
    // More snapshots without the pod, as the directory source sends one per deleted manifest.
    for _ in 0..5 {
        h.set(vec![]).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.worker_syncs(), before, "the terminating worker got no further requests");
    assert!(h.manager.store().get("u31").is_some(), "still in its grace period");
}

#[tokio::test(start_paused = true)]
async fn a_pod_added_again_while_it_terminates_starts_anew_after() {
    let h = harness();
    let spec = || pod("u32", json!({"terminationGracePeriodSeconds": 5, "containers": [app("stubborn")]}));
    h.run_then_delete_stubborn(spec()).await;
    // The manifest comes back (the same UID) within the grace period: the deletion runs its course, then the pod
    // starts again in a new sandbox.
    h.set(vec![spec()]).await;
    let runs = || h.fake.sandboxes.lock().unwrap().iter().filter(|s| *s == "run u32").count();
    let t0 = Instant::now();
    while runs() < 2 && t0.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(*h.fake.sandboxes.lock().unwrap(), ["run u32", "remove u32", "run u32"]);
    assert!(t0.elapsed() >= Duration::from_secs(4), "not before the first termination ended");
    h.until("u32", "runs again", |v| phase(v) == "Running").await;
}

/// Runs a pod with grace period `first`, deletes it, adds it again with grace period `then` while it terminates,
/// deletes it again; returns how long after the first deletion the pod was gone, and checks it was not started again.
async fn deleted_added_again_deleted(uid: &str, first: u32, then: u32) -> Duration {
    let h = harness();
    let spec = |grace: u32| pod(uid, json!({"terminationGracePeriodSeconds": grace, "containers": [app("stubborn")]}));
    h.run_then_delete_stubborn(spec(first)).await;
    let t0 = Instant::now();
    // Both snapshots back to back: the worker may take the deletion before the spec it came back with.
    h.set(vec![spec(then)]).await;
    h.set(vec![]).await;
    while h.manager.store().get(uid).is_some() && t0.elapsed() < Duration::from_secs(600) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let runs = [format!("run {uid}"), format!("remove {uid}")];
    assert_eq!(*h.fake.sandboxes.lock().unwrap(), runs, "not started again");
    t0.elapsed()
}

#[tokio::test(start_paused = true)]
async fn a_pod_added_again_with_a_shorter_grace_then_deleted_again_ends_within_it() {
    // Back with 3 s while the 60 s deletion runs, then deleted again: the 3 s apply.
    let took = deleted_added_again_deleted("u33", 60, 3).await;
    assert!(took >= Duration::from_secs(3) && took < Duration::from_secs(4), "took {took:?}");
}

#[tokio::test(start_paused = true)]
async fn a_pod_added_again_with_a_longer_grace_then_deleted_again_keeps_the_first() {
    let took = deleted_added_again_deleted("u34", 5, 300).await;
    assert!(took < Duration::from_secs(6), "took {took:?}");
}

#[tokio::test(start_paused = true)]
async fn an_evicted_pod_with_a_pre_stop_hook_is_signalled_by_its_worker_after_the_hook() {
    let h = harness();
    let hooked = json!({"name": "app", "image": "busybox", "command": ["sleep", "600"],
        "lifecycle": {"preStop": {"exec": {"command": ["true"]}}}});
    h.set(vec![pod("u13", json!({"containers": [hooked, app("plain")]}))]).await;
    h.until("u13", "runs", |v| phase(v) == "Running").await;
    let eviction = h.manager.evict("u13", Duration::from_secs(1), "evicted".into()).unwrap();
    assert!(h.fake.signals.lock().unwrap().is_empty(), "the hook runs before any SIGTERM");
    eviction.signalled.await.unwrap();
    eviction.terminated.await.unwrap();
    let mut signals: Vec<i32> = h.fake.signals.lock().unwrap().iter().map(|s| s.1).collect();
    signals.sort_unstable();
    assert_eq!(signals, [SIGTERM, SIGTERM], "each container once");
    let v = h.until("u13", "is evicted", |v| phase(v) == "Failed").await;
    assert_eq!(v["status"]["reason"], "Evicted");
    assert_disrupted(&v, "evicted");
}

/// The `DisruptionTarget` condition the kubelet adds to a pod it terminates, with `message`.
fn assert_disrupted(v: &serde_json::Value, message: &str) {
    let conditions = v["status"]["conditions"].as_array().unwrap();
    let c = conditions.iter().find(|c| c["type"] == "DisruptionTarget").unwrap_or_else(|| panic!("{conditions:?}"));
    assert_eq!(
        (&c["status"], &c["reason"], &c["message"]),
        (&json!("True"), &json!("TerminationByKubelet"), &json!(message))
    );
    assert!(c["lastTransitionTime"].is_string(), "{c}");
}

#[tokio::test(start_paused = true)]
async fn a_pre_stop_hook_added_by_a_spec_update_keeps_the_evictions_signal_for_the_worker() {
    let h = harness();
    h.set(vec![pod("u16", json!({"containers": [app("app")]}))]).await;
    h.until("u16", "runs", |v| phase(v) == "Running").await;
    // An exec hook without a command runs nothing: no hook.
    let empty = json!({"name": "app", "image": "busybox", "command": ["sleep", "600"],
        "lifecycle": {"preStop": {"exec": {}}}});
    h.set(vec![pod("u16", json!({"containers": [empty]}))]).await;
    h.until("u16", "has the empty hook", |v| v["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"].is_object())
        .await;
    let hooked = json!({"name": "app", "image": "busybox", "command": ["sleep", "600"],
        "lifecycle": {"preStop": {"exec": {"command": ["true"]}}}});
    h.set(vec![pod("u16", json!({"containers": [hooked]}))]).await;
    h.until("u16", "has the hook", |v| {
        v["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][0] == "true"
    })
    .await;
    let eviction = h.manager.evict("u16", Duration::from_secs(1), "evicted".into()).unwrap();
    assert!(h.fake.signals.lock().unwrap().is_empty(), "the hook of the new spec runs before any SIGTERM");
    eviction.terminated.await.unwrap();
    assert_eq!(h.fake.signals.lock().unwrap().iter().map(|s| s.1).collect::<Vec<_>>(), [SIGTERM]);
}

#[tokio::test(start_paused = true)]
async fn an_exec_pre_stop_hook_without_a_command_is_no_hook() {
    let h = harness();
    let empty = json!({"name": "app", "image": "busybox", "command": ["sleep", "600"],
        "lifecycle": {"preStop": {"exec": {}}}});
    h.set(vec![pod("u17", json!({"containers": [empty]}))]).await;
    h.until("u17", "runs", |v| phase(v) == "Running").await;
    let _eviction = h.manager.evict("u17", Duration::from_secs(1), "evicted".into()).unwrap();
    assert_eq!(
        h.fake.signals.lock().unwrap().iter().map(|s| s.1).collect::<Vec<_>>(),
        [SIGTERM],
        "signalled on the caller's thread, as a pod without a hook"
    );
}

#[tokio::test(start_paused = true)]
async fn an_evicted_pod_whose_container_exits_0_at_once_ends_evicted_not_succeeded() {
    let h = harness();
    h.fake.graceful.lock().unwrap().push("app".into());
    h.set(vec![pod("u15", json!({"restartPolicy": "Never", "containers": [app("app")]}))]).await;
    h.until("u15", "runs", |v| phase(v) == "Running").await;
    let eviction = h.manager.evict("u15", Duration::from_secs(1), "evicted".into()).unwrap();
    // Signalled on this thread: the container has exited 0 before its worker reads the termination.
    assert!(!h.fake.is_running("app"));
    eviction.terminated.await.unwrap();
    let v = h.until("u15", "is over", |v| phase(v) == "Failed" || phase(v) == "Succeeded").await;
    assert_eq!(v["status"]["reason"], "Evicted");
    assert_eq!(container(&v, "app")["state"]["terminated"]["exitCode"], 0);
}

/// The worker runs on another thread and reads the container's exit while the eviction, which signalled it, has
/// not yet queued the termination: it waits for the termination and ends the pod `Evicted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exit_read_before_the_evictions_termination_is_queued_still_ends_evicted() {
    let h = harness();
    h.fake.graceful.lock().unwrap().push("app".into());
    h.set(vec![pod("u18", json!({"restartPolicy": "Never", "containers": [app("app")]}))]).await;
    h.until("u18", "runs", |v| phase(v) == "Running").await;
    *h.fake.signal_pause.lock().unwrap() = Duration::from_millis(300);
    let syncs = h.worker_syncs();
    let eviction = h.manager.evict("u18", Duration::from_secs(1), "evicted".into()).unwrap();
    eviction.terminated.await.unwrap();
    let v = h.until("u18", "is over", |v| phase(v) == "Failed" || phase(v) == "Succeeded").await;
    assert_eq!(v["status"]["reason"], "Evicted");
    assert_eq!(container(&v, "app")["state"]["terminated"]["exitCode"], 0);
    assert!(h.worker_syncs() > syncs);
}

#[tokio::test(start_paused = true)]
async fn a_pod_shut_down_with_the_node_is_signalled_by_its_worker() {
    let h = harness();
    h.set(vec![pod("u14", json!({"containers": [app("app")]}))]).await;
    h.until("u14", "runs", |v| phase(v) == "Running").await;
    let shutdown = h.manager.shut_down("u14", Duration::from_secs(1)).unwrap();
    assert!(h.fake.signals.lock().unwrap().is_empty(), "only an eviction signals on the caller's thread");
    shutdown.signalled.await.unwrap();
    shutdown.terminated.await.unwrap();
    assert_eq!(h.fake.signals.lock().unwrap().iter().map(|s| s.1).collect::<Vec<_>>(), [SIGTERM]);
}

#[tokio::test(start_paused = true)]
async fn eviction_leaves_a_failed_evicted_pod() {
    let h = harness();
    h.set(vec![pod("u6", json!({"containers": [app("hog")]}))]).await;
    h.until("u6", "runs", |v| phase(v) == "Running").await;
    let msg = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi.";
    let eviction = h.manager.evict("u6", Duration::from_secs(1), msg.into()).unwrap();
    // Without a preStop hook, SIGTERM went out before evict returned, on the caller's thread; the container ended
    // at once, before its worker ran, and the queued termination still comes first (no restart below).
    assert_eq!(h.fake.signals.lock().unwrap().iter().map(|s| s.1).collect::<Vec<_>>(), [SIGTERM]);
    // The first receiver resolves once SIGTERM is sent, before the pod is gone.
    eviction.signalled.await.unwrap();
    eviction.terminated.await.unwrap();
    assert_eq!(h.fake.signals.lock().unwrap().len(), 1, "the worker's stop did not signal again");
    let v = h.until("u6", "is evicted", |v| phase(v) == "Failed").await;
    assert_eq!(v["status"]["reason"], "Evicted");
    assert_eq!(v["status"]["message"], msg);
    assert_eq!(container(&v, "hog")["state"]["terminated"]["exitCode"], 128 + SIGTERM);
    assert!(!h.cg.join("besteffort/podu6").exists());
    assert_eq!(v["status"]["qosClass"], "BestEffort", "the class outlives the placement");
    assert_disrupted(&v, msg);
    // It stays evicted while its manifest is unchanged.
    h.set(vec![pod("u6", json!({"containers": [app("hog")]}))]).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(h.fake.starts("hog").len(), 1);
    assert_eq!(
        h.manager.evict("nope", Duration::ZERO, String::new()).err(),
        Some(crate::TerminateError::UnknownPod("nope".into()))
    );
}

#[tokio::test(start_paused = true)]
async fn a_pod_evicted_for_its_own_limit_is_evicted_without_a_disruption_condition() {
    let h = harness();
    h.set(vec![pod("u7", json!({"containers": [app("app")]}))]).await;
    h.until("u7", "runs", |v| phase(v) == "Running").await;
    let msg = "Container app exceeded its local ephemeral storage limit \"1Mi\". ";
    let eviction = h.manager.evict_for_limit("u7", Duration::from_secs(1), msg.into()).unwrap();
    eviction.terminated.await.unwrap();
    let v = h.until("u7", "is evicted", |v| phase(v) == "Failed").await;
    assert_eq!((&v["status"]["reason"], &v["status"]["message"]), (&json!("Evicted"), &json!(msg)));
    let conditions = v["status"]["conditions"].as_array().unwrap();
    assert!(conditions.iter().all(|c| c["type"] != "DisruptionTarget"), "as the kubelet's: {conditions:?}");
}

#[tokio::test(start_paused = true)]
async fn admission_refusal_fails_the_pod_with_the_kubelets_reason() {
    let h = harness();
    let mut big = app("big");
    big["resources"] = json!({"requests": {"memory": "2Gi"}});
    h.set(vec![pod("u7", json!({"containers": [big]}))]).await;
    let v = h.until("u7", "is refused", |v| phase(v) == "Failed").await;
    assert_eq!(v["status"]["reason"], "OutOfmemory");
    assert!(h.fake.starts("big").is_empty());
    assert_eq!(h.events.reasons("u7"), ["OutOfmemory"]);
}

#[tokio::test(start_paused = true)]
async fn a_volume_that_cannot_be_made_is_failed_mount_retried_off_the_worker() {
    let h = harness();
    let volumes = json!([{"name": "h", "hostPath": {"path": "/definitely/not/here", "type": "Directory"}}]);
    h.set(vec![pod("u60", json!({"volumes": volumes, "containers": [app("a")]}))]).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let events = h.events.0.lock().unwrap().clone();
    let mounts: Vec<&String> = events.iter().filter(|(_, r, _)| r == "FailedMount").map(|(.., m)| m).collect();
    // At once, then after 1 s and 2 s more: retried with a doubling wait, and never started.
    assert_eq!(mounts.len(), 3, "{events:?}");
    assert!(
        mounts[0].starts_with("MountVolume.SetUp failed for volume \"h\" : hostPath /definitely/not/here"),
        "{mounts:?}"
    );
    assert!(h.fake.starts("a").is_empty());
    assert_eq!(phase(&serde_json::to_value(h.manager.store().get("u60").unwrap()).unwrap()), "Pending");
}

#[tokio::test(start_paused = true)]
async fn config_errors_wait_and_retry() {
    let h = harness();
    let mut bad = app("bad");
    bad["envFrom"] = json!([{"configMapRef": {"name": "settings"}}]);
    h.set(vec![pod("u8", json!({"containers": [bad]}))]).await;
    let v = h.until("u8", "waits", |v| !container(v, "bad")["state"]["waiting"]["reason"].is_null()).await;
    assert_eq!(container(&v, "bad")["state"]["waiting"]["reason"], "CreateContainerConfigError");
    // A node in no cluster has no ConfigMaps to read, as a kubelet without a client says.
    let message = container(&v, "bad")["state"]["waiting"]["message"].as_str().unwrap().to_owned();
    assert_eq!(message, "couldn't get configMap default/settings, no kubeClient defined");
}

#[tokio::test(start_paused = true)]
async fn an_image_that_cannot_be_pulled_backs_off() {
    let h = harness();
    h.fake.unpullable.lock().unwrap().push("registry.invalid/app:1".into());
    let mut c = app("app");
    c["image"] = json!("registry.invalid/app:1");
    h.set(vec![pod("u9", json!({"containers": [c]}))]).await;
    let reason = |v: &serde_json::Value| container(v, "app")["state"]["waiting"]["reason"].as_str().map(str::to_owned);
    let v = h.until("u9", "backs off", |v| reason(v).as_deref() == Some("ImagePullBackOff")).await;
    let message = container(&v, "app")["state"]["waiting"]["message"].as_str().unwrap().to_owned();
    assert!(message.starts_with("Back-off pulling image \"registry.invalid/app:1\""), "{message}");
    assert!(message.ends_with("cannot pull registry.invalid/app:1"), "the pull error is kept: {message}");
    assert_eq!(phase(&v), "Pending");
    let events = h.events.0.lock().unwrap().clone();
    let said: Vec<(&str, &str)> = events.iter().map(|(_, r, m)| (r.as_str(), m.as_str())).collect();
    let failed = "Failed to pull image \"registry.invalid/app:1\": cannot pull registry.invalid/app:1";
    let pulls = [
        ("Pulling", "Pulling image \"registry.invalid/app:1\""),
        ("Failed", failed),
        ("Failed", "Error: ErrImagePull"),
    ];
    assert_eq!(said[..3], pulls, "each try");
    // Each retry waits out the pull's own back-off (10 s first), and says so.
    let backoff =
        [("BackOff", "Back-off pulling image \"registry.invalid/app:1\""), ("Failed", "Error: ImagePullBackOff")];
    assert!(said.windows(5).any(|w| w[..3] == pulls && w[3..] == backoff), "{said:?}");
    // Once the image can be pulled, the next attempt (after the back-off) runs it.
    h.fake.unpullable.lock().unwrap().clear();
    h.until("u9", "runs", |v| phase(v) == "Running").await;
}

#[tokio::test(start_paused = true)]
async fn a_replacement_waits_for_the_old_pod_of_its_name_then_starts() {
    let h = harness();
    let named = |uid: &str| {
        let mut p = pod(uid, json!({"terminationGracePeriodSeconds": 3, "containers": [app("app")]}));
        p.metadata.name = Some("same".into());
        p
    };
    h.set(vec![named("old")]).await;
    h.until("old", "runs", |v| phase(v) == "Running").await;
    h.fake.stubborn.lock().unwrap().push("app".into());
    // The edit: the new UID replaces the old one. Snapshots repeat while the old one terminates.
    h.set(vec![named("new")]).await;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        h.set(vec![named("new")]).await;
    }
    assert_eq!(h.fake.starts("app").len(), 1, "the new pod waits while the old one terminates");
    h.fake.stubborn.lock().unwrap().clear();
    h.until("new", "runs", |v| phase(v) == "Running").await;
    assert!(h.manager.store().get("old").is_none());
    assert_eq!(h.fake.starts("app").len(), 2);
}

#[tokio::test(start_paused = true)]
async fn without_sources_the_loop_keeps_ticking() {
    let h = harness();
    drop(h.tx);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(h.manager.readiness(), Ok(()));
}

#[tokio::test(start_paused = true)]
async fn termination_does_not_wait_for_an_image_pull() {
    let h = harness();
    h.fake.slow.lock().unwrap().push("registry.invalid/huge:1".into());
    let mut slow = app("slow");
    slow["image"] = json!("registry.invalid/huge:1");
    h.set(vec![pod("u10", json!({"terminationGracePeriodSeconds": 600, "containers": [app("a"), slow]}))]).await;
    h.until("u10", "runs a", |v| container(v, "a")["state"]["running"].is_object()).await;
    // An eviction in the middle of the pull: the pull is dropped, the running container stopped.
    let done = h.manager.evict("u10", Duration::from_secs(1), "evicted".into()).unwrap().terminated;
    tokio::time::timeout(Duration::from_secs(10), done).await.expect("evicted within the grace period").unwrap();
    let v = h.until("u10", "is evicted", |v| phase(v) == "Failed").await;
    assert_eq!(container(&v, "a")["state"]["terminated"]["exitCode"], 128 + SIGTERM);
    assert_eq!(h.fake.starts("slow").len(), 0, "the pull never finished");
    // A deletion during a pull, with the pod's own grace period: done at once, nothing runs.
    h.set(vec![pod("u11", json!({"containers": [slow_app()]}))]).await;
    h.until("u11", "pulls", |v| container(v, "slow")["state"]["waiting"]["reason"] == "ContainerCreating").await;
    let t0 = Instant::now();
    h.set(vec![]).await;
    while h.manager.store().get("u11").is_some() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(t0.elapsed() < Duration::from_secs(2), "took {:?}", t0.elapsed());
    assert!(!h.cg.join("besteffort/podu11").exists(), "cgroup released");
}

fn slow_app() -> serde_json::Value {
    let mut c = app("slow");
    c["image"] = json!("registry.invalid/huge:1");
    c
}

#[tokio::test(start_paused = true)]
async fn a_later_termination_only_shortens_the_grace_period() {
    let h = harness();
    h.set(vec![pod("u12", json!({"terminationGracePeriodSeconds": 300, "containers": [app("stubborn")]}))]).await;
    h.until("u12", "runs", |v| phase(v) == "Running").await;
    h.fake.stubborn.lock().unwrap().push("stubborn".into());
    let t0 = Instant::now();
    // Deleted with 300 s, then evicted with 2 s: the 2 s win.
    h.set(vec![]).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let done = h.manager.evict("u12", Duration::from_secs(2), "evicted".into()).unwrap().terminated;
    done.await.unwrap();
    let took = t0.elapsed();
    assert!(took >= Duration::from_secs(2) && took < Duration::from_secs(3), "took {took:?}");
    // A deletion is never turned into an eviction: the pod is gone.
    while h.manager.store().get("u12").is_some() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_panics_is_replaced_and_the_status_says_so() {
    let h = harness();
    h.fake.panics.lock().unwrap().push("app".into());
    h.set(vec![pod("u13", json!({"containers": [app("app")]}))]).await;
    let v = h.until("u13", "runs under a new worker", |v| phase(v) == "Running").await;
    let conditions = v["status"]["conditions"].as_array().unwrap();
    let c = conditions.iter().find(|c| c["type"] == crate::WORKER_CONDITION).expect("a condition says so");
    assert_eq!((c["status"].as_str(), c["reason"].as_str()), (Some("True"), Some("WorkerPanicked")));
    assert!(c["message"].as_str().unwrap().contains("the runtime broke starting app"), "{c}");
    assert_eq!(h.fake.starts("app").len(), 1, "the new worker started the container");
    // The new worker terminates the pod as the old one would have.
    h.set(vec![]).await;
    while h.manager.store().get("u13").is_some() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!h.cg.join("besteffort/podu13").exists(), "cgroup released");
}

#[tokio::test(start_paused = true)]
async fn start_up_cleans_up_only_what_nodewarden_made() {
    let h = harness();
    h.set(vec![pod("ours", json!({"containers": [app("a")]})), pod("stray", json!({"containers": [app("a")]}))]).await;
    h.until("ours", "runs", |v| phase(v) == "Running").await;
    h.until("stray", "runs", |v| phase(v) == "Running").await;
    let root = h._host.path().join("root");
    assert!(crate::state::is_ours(&root, "ours"), "the mark is down once the pod is placed");
    // The daemon stops; its pod cgroups stay. One of them loses its mark (a cgroup someone else made looks like
    // this), and beside them are a directory nodewarden did not make and one of its own pods that is gone.
    let Harness { _host: host, _drain: drain, cg, .. } = h;
    drop(drain);
    tokio::time::sleep(Duration::from_secs(6)).await;
    std::fs::remove_dir_all(root.join("pods/stray")).unwrap();
    std::fs::create_dir_all(root.join("pods/foreign")).unwrap();
    std::fs::write(root.join("pods/foreign/data"), "keep").unwrap();
    std::fs::create_dir_all(root.join("pods/gone")).unwrap();
    crate::state::save(&root, "gone", &crate::state::SavedPod::default(), true).unwrap();
    // The next start, with no manifests: only its own orphan is terminated, only its own directories removed.
    let h = harness_on(host);
    h.set(vec![]).await;
    for _ in 0..100 {
        if !cg.join("besteffort/podours").exists() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(!cg.join("besteffort/podours").exists(), "nodewarden's own orphan is terminated and released");
    assert!(cg.join("besteffort/podstray").exists(), "a pod cgroup without the mark is left alone");
    assert_eq!(std::fs::read_to_string(root.join("pods/foreign/data")).unwrap(), "keep");
    assert!(!root.join("pods/gone").exists(), "its own stale directory is removed");
}

#[tokio::test(start_paused = true)]
async fn orphans_are_cleaned_up_only_once_every_source_has_spoken() {
    // Two sources' pods run; the daemon stops, and its pod cgroups stay.
    let h = harness();
    h.set(vec![pod("fromfile", json!({"containers": [app("a")]}))]).await;
    h.send(
        "api",
        vec![pod("fromapi", json!({"containers": [app("a")]})), pod("gone", json!({"containers": [app("a")]}))],
    )
    .await;
    for uid in ["fromfile", "fromapi", "gone"] {
        h.until(uid, "runs", |v| phase(v) == "Running").await;
    }
    let Harness { _host: host, _drain: drain, cg, .. } = h;
    drop(drain);
    tokio::time::sleep(Duration::from_secs(6)).await;

    // The next start expects both. The file source speaks first: the other source's pods are left alone, however
    // long it takes to speak, and the manager says what it waits for.
    let h = harness_expecting(host, &[crate::FILE_SOURCE, "api"]);
    h.set(vec![pod("fromfile", json!({"containers": [app("a")]}))]).await;
    tokio::time::sleep(Duration::from_secs(120)).await;
    for uid in ["fromapi", "gone"] {
        assert!(cg.join(format!("besteffort/pod{uid}")).exists(), "{uid} was cleaned up before its source spoke");
    }
    assert_eq!(h.manager.synced(), Err("waiting for the first pods from source api".into()));

    // It speaks without one of its pods: that one alone is an orphan.
    h.send("api", vec![pod("fromapi", json!({"containers": [app("a")]}))]).await;
    for _ in 0..100 {
        if !cg.join("besteffort/podgone").exists() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(!cg.join("besteffort/podgone").exists(), "the pod no source has is terminated and released");
    assert_eq!(h.manager.synced(), Ok(()));
    for uid in ["fromfile", "fromapi"] {
        assert!(cg.join(format!("besteffort/pod{uid}")).exists(), "{uid}");
        h.until(uid, "runs", |v| phase(v) == "Running").await;
    }
}

#[tokio::test(start_paused = true)]
async fn pods_report_their_ips_and_the_nodes() {
    let h = harness();
    let mut c = app("net");
    c["env"] = json!([{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]);
    let mut host = app("host");
    host["env"] = c["env"].clone();
    h.set(vec![pod("u20", json!({"containers": [c]})), pod("u21", json!({"hostNetwork": true, "containers": [host]}))])
        .await;
    // On the pod network: the sandbox's IP; on the host's: the node's. Both show the node's as hostIP.
    let v = h.until("u20", "runs", |v| phase(v) == "Running").await;
    assert_eq!((&v["status"]["podIP"], &v["status"]["podIPs"]), (&json!("10.88.0.7"), &json!([{"ip": "10.88.0.7"}])));
    assert_eq!(
        (&v["status"]["hostIP"], &v["status"]["hostIPs"]),
        (&json!("192.0.2.10"), &json!([{"ip": "192.0.2.10"}]))
    );
    let v = h.until("u21", "runs", |v| phase(v) == "Running").await;
    assert_eq!((&v["status"]["podIP"], &v["status"]["hostIP"]), (&json!("192.0.2.10"), &json!("192.0.2.10")));
    // The downward API sees the same addresses.
    let env = |name: &str| {
        let started = h.fake.started.lock().unwrap();
        let spec = &started.iter().find(|(_, s)| s.name == name).unwrap().1;
        spec.env.iter().find(|(k, _)| k == "POD_IP").map(|(_, v)| v.clone())
    };
    assert_eq!((env("net").as_deref(), env("host").as_deref()), (Some("10.88.0.7"), Some("192.0.2.10")));
}

#[tokio::test(start_paused = true)]
async fn a_pod_the_node_shutdown_terminated_runs_again_with_the_next_daemon() {
    let h = harness();
    let spec = json!({"terminationGracePeriodSeconds": 30, "containers": [app("app")]});
    h.set(vec![pod("u30", spec.clone())]).await;
    h.until("u30", "runs", |v| phase(v) == "Running").await;
    h.manager.shut_down("u30", Duration::from_secs(2)).unwrap();
    let v = h.until("u30", "is shut down", |v| phase(v) == "Failed").await;
    assert_eq!(v["status"]["reason"], "Terminated");
    assert_eq!(v["status"]["message"], "Pod was terminated in response to imminent node shutdown.");
    assert_disrupted(&v, "Pod was terminated in response to imminent node shutdown.");
    // The node comes back: the next daemon starts the pod again (an evicted pod would stay Failed).
    let Harness { _host: host, _drain: drain, .. } = h;
    drop(drain);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let h = harness_on(host);
    h.set(vec![pod("u30", spec)]).await;
    h.until("u30", "runs again", |v| phase(v) == "Running").await;
    assert_eq!(h.fake.starts("app").len(), 1, "started anew by the next daemon");
}

#[tokio::test(start_paused = true)]
async fn the_first_full_sync_waits_for_every_expected_source() {
    let h = harness();
    assert_eq!(h.manager.synced(), Ok(()), "no source expected, nothing to wait for");
    h.manager.expect_source(crate::FILE_SOURCE);
    let waiting = h.manager.synced().unwrap_err();
    assert_eq!(waiting, "waiting for the first pods from source file");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(h.manager.synced().is_err(), "ticks alone are no sync");
    h.set(vec![pod("u1", json!({"containers": [app("app")]}))]).await;
    for _ in 0..100 {
        if h.manager.synced().is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(h.manager.synced(), Ok(()));
    h.until("u1", "runs", |v| phase(v) == "Running").await;
}

/// A pod's next state save, held up: a FIFO where the save's temporary file goes, whose opening for writing waits
/// for a reader. Dropped (also when a test fails), it lets a waiting save go on and removes the FIFO, so that no save
/// is left waiting (a blocking task that never ends would hang the runtime's shutdown).
struct HeldSave {
    fifo: std::path::PathBuf,
    reader: Option<std::os::fd::OwnedFd>,
}

impl HeldSave {
    fn new(root_dir: &std::path::Path, uid: &str) -> Self {
        let fifo = root_dir.join("pods").join(uid).join("nodewarden-state.json.tmp");
        std::fs::create_dir_all(fifo.parent().unwrap()).unwrap();
        let mode = rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR;
        rustix::fs::mknodat(rustix::fs::CWD, &fifo, rustix::fs::FileType::Fifo, mode, 0).unwrap();
        Self { fifo, reader: None }
    }

    fn open_reader(&mut self) -> &std::os::fd::OwnedFd {
        self.reader.get_or_insert_with(|| {
            let flags = rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NONBLOCK;
            rustix::fs::open(&self.fifo, flags, rustix::fs::Mode::empty()).unwrap()
        })
    }

    /// Lets the save go on (it then fails: a FIFO cannot be synced); whether it wrote the pod's state within 5 s
    /// (real time).
    async fn release(&mut self) -> bool {
        for _ in 0..100 {
            let mut buf = [0u8; 64];
            if rustix::io::read(self.open_reader(), &mut buf).is_ok_and(|n| n > 0) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }
}

impl Drop for HeldSave {
    fn drop(&mut self) {
        if self.reader.is_none() {
            let flags = rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NONBLOCK;
            self.reader = rustix::fs::open(&self.fifo, flags, rustix::fs::Mode::empty()).ok();
        }
        let _ = std::fs::remove_file(&self.fifo);
    }
}

impl Harness {
    /// The pod's phase now, or "" when it has no status.
    fn phase_now(&self, uid: &str) -> String {
        self.manager.store().get(uid).map(|p| phase(&serde_json::to_value(&p).unwrap()).to_owned()).unwrap_or_default()
    }

    /// The pod's phases over a second, every 50 ms.
    async fn phases_for_a_second(&self, uid: &str) -> Vec<String> {
        let mut seen = Vec::new();
        for _ in 0..20 {
            seen.push(self.phase_now(uid));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        seen
    }
}

/// A started pod is reported Running only once its state is saved, so that a daemon killed right after it said so
/// adopts the container with the start time and restart count it reported. The save is held up; the container
/// runs, and the pod is not reported Running until the save returns. Real time: a paused clock does not move while
/// a blocking task runs.
#[tokio::test]
async fn a_started_pod_is_reported_running_only_once_its_state_is_saved() {
    let h = harness();
    let mut held = HeldSave::new(&h._host.path().join("root"), "u1");
    h.set(vec![pod("u1", json!({"containers": [app("app")]}))]).await;
    h.until("u1", "starts its container", |_| h.fake.is_running("app")).await;
    let seen = h.phases_for_a_second("u1").await;
    assert!(held.release().await, "the held save went on once it could");
    drop(held);
    assert!(!seen.iter().any(|p| p == "Running"), "reported Running before its save: {seen:?}");
    h.until("u1", "is reported Running once the save returned", |v| phase(v) == "Running").await;
}

/// A pod that is over is reported so only once the save saying so returns: the save that follows its container's
/// exit is held up (after its terminal record, at its state file), and the pod is not reported Succeeded meanwhile.
#[tokio::test]
async fn a_pod_that_is_over_is_reported_so_only_after_its_save() {
    let h = harness();
    h.set(vec![pod("u1", json!({"restartPolicy": "Never", "containers": [app("app")]}))]).await;
    // Running, and its first save done.
    let root = h._host.path().join("root");
    let saved = root.join("pods/u1/nodewarden-state.json");
    let temporary = saved.with_extension("json.tmp");
    let first_save = || saved.exists() && !temporary.exists();
    h.until("u1", "runs with its first save done", |v| phase(v) == "Running" && first_save()).await;
    let mut held = HeldSave::new(&root, "u1");
    h.fake.finish("app", 0);
    let seen = h.phases_for_a_second("u1").await;
    assert!(!seen.iter().any(|p| p == "Succeeded"), "reported over before its save: {seen:?}");
    assert!(held.release().await, "the held save went on once it could");
    drop(held);
    h.until("u1", "is reported Succeeded once saved", |v| phase(v) == "Succeeded").await;
}

#[tokio::test(start_paused = true)]
async fn a_pod_its_source_lists_as_over_is_not_run_unless_the_node_runs_it_already() {
    let h = harness();
    let over = |uid: &str| {
        let mut p = pod(uid, json!({"containers": [app("app")]}));
        p.status = Some(k8s_openapi::api::core::v1::PodStatus { phase: Some("Failed".into()), ..Default::default() });
        p
    };
    // Failed in the apiserver before this node knew it (a node shutdown ended it before a reboot): never started.
    h.set(vec![over("u90"), pod("u91", json!({"containers": [app("app")]}))]).await;
    h.until("u91", "runs", |v| phase(v) == "Running").await;
    assert!(h.manager.store().get("u90").is_none(), "a pod over was started");
    assert!(!h.fake.sandboxes.lock().unwrap().iter().any(|s| s.contains("u90")));
    // One the node runs, which its source lists with a terminal phase afterwards (its own report echoed): kept.
    h.set(vec![over("u91")]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let v = serde_json::to_value(h.manager.store().get("u91").unwrap()).unwrap();
    assert_eq!(phase(&v), "Running", "the node's own pod was stopped");
}

#[tokio::test(start_paused = true)]
async fn a_deleted_apiserver_pod_whose_containers_ended_is_over() {
    let h = harness();
    let mut feed = h.manager.store().reader().unwrap();
    let spec = || {
        let mut p = pod("u42", json!({"terminationGracePeriodSeconds": 30, "containers": [app("stubborn")]}));
        p.metadata.annotations =
            Some([(crate::CONFIG_SOURCE_ANNOTATION.to_owned(), crate::API_SOURCE.to_owned())].into());
        p
    };
    h.send(crate::API_SOURCE, vec![spec()]).await;
    h.until("u42", "runs", |v| phase(v) == "Running").await;
    h.fake.stubborn.lock().unwrap().push("stubborn".into());
    let t0 = Instant::now();
    h.send(crate::API_SOURCE, vec![deleting(spec(), 2)]).await;
    finalized(&mut feed, "u42", t0).await;
    // As the kubelet since 1.27, unlike a static pod: killed at the end of its grace, the pod is Failed, so that
    // the final status a controller reads before the deletion says it is over.
    let last = feed.unreported().into_iter().find(|u| u.uid == "u42").unwrap();
    assert_eq!(last.pod.status.as_ref().unwrap().phase.as_deref(), Some("Failed"));
}

#[tokio::test(start_paused = true)]
async fn a_new_image_restarts_the_container_with_it_whatever_the_restart_policy() {
    let h = harness();
    h.set(vec![pod("u70", json!({"restartPolicy": "Never", "containers": [app("app")]}))]).await;
    h.until("u70", "runs", |v| phase(v) == "Running").await;
    let mut newer = app("app");
    newer["image"] = json!("busybox:1.37");
    h.set(vec![pod("u70", json!({"restartPolicy": "Never", "containers": [newer]}))]).await;
    let v = h.until("u70", "runs the new image", |v| container(v, "app")["restartCount"] == 1).await;
    assert_eq!(phase(&v), "Running");
    let images: Vec<String> =
        h.fake.started.lock().unwrap().iter().filter(|(_, s)| s.name == "app").map(|(_, s)| s.image.clone()).collect();
    assert_eq!(images, ["busybox", "busybox:1.37"]);
    let killing = h.events.0.lock().unwrap().iter().find(|(u, r, _)| u == "u70" && r == "Killing").cloned();
    assert_eq!(killing.unwrap().2, "Container app definition changed, will be restarted");
    // A spec update that changes no image restarts nothing.
    let mut same = app("app");
    same["image"] = json!("busybox:1.37");
    h.set(vec![pod("u70", json!({"restartPolicy": "Never", "activeDeadlineSeconds": 600, "containers": [same]}))])
        .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(h.fake.starts("app").len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_config_map_volume_follows_its_object_every_sync_period_and_goes_with_its_pod() {
    use crate::objects::{ObjectKind, testing::MemObjects};
    let objects = Arc::new(MemObjects::default());
    objects.put(ObjectKind::ConfigMap, "default", "cfg", &[("greeting", "hello")]);
    let h = harness_with(FakeHost::new(), &[], objects.clone());
    let spec = json!({"containers": [app("app")], "volumes": [{"name": "v", "configMap": {"name": "cfg"}}]});
    h.set(vec![pod("u71", spec)]).await;
    h.until("u71", "runs", |v| phase(v) == "Running").await;
    let dir = h._host.path().join("root/pods/u71/volumes/kubernetes.io~configmap/v");
    let read = || std::fs::read_to_string(dir.join("greeting")).unwrap_or_default();
    assert_eq!(read(), "hello");
    objects.put(ObjectKind::ConfigMap, "default", "cfg", &[("greeting", "bye")]);
    // Not before the sync period; within it and its half of jitter.
    tokio::time::sleep(Duration::from_secs(50)).await;
    assert_eq!(read(), "hello");
    let mut waited = 0;
    while read() != "bye" && waited < 200 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        waited += 1;
    }
    assert_eq!(read(), "bye", "refreshed within the period and its jitter");
    // Gone with its pod, and no refresh makes it again.
    h.set(vec![]).await;
    gone(&h, "u71", Instant::now()).await;
    tokio::time::sleep(Duration::from_secs(200)).await;
    assert!(!dir.exists() && !h._host.path().join("root/pods/u71").exists());
}

#[tokio::test(start_paused = true)]
async fn disk_pressure_reclaims_unused_images_before_any_eviction_without_blocking() {
    use nodewarden_eviction::{Evictor, Reclaimed, Signal};
    let h = harness();
    let image = |id: &str, pinned: bool| nodewarden_runtime::NodeImage {
        id: id.into(),
        names: vec![],
        size_bytes: 5 << 20,
        pinned,
    };
    *h.fake.images.lock().unwrap() = vec![image("sha256:old", false), image("sha256:pause", true)];
    let collector = h.manager.image_collector().expect("the fake runtime has images");
    collector.set_reclaim(crate::ReclaimSettings { minimum_age: Duration::ZERO, shares_nodefs: false });
    assert_eq!(h.manager.reclaim_disk(Signal::NodeFsAvailable), Reclaimed::Nothing, "the images are not on nodefs");
    // imagefs: the reclaim runs as a task; meanwhile the eviction manager is told to wait, not blocked.
    assert_eq!(h.manager.reclaim_disk(Signal::ImageFsAvailable), Reclaimed::Running);
    let mut said = Reclaimed::Running;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        said = h.manager.reclaim_disk(Signal::ImageFsAvailable);
        if said != Reclaimed::Running {
            break;
        }
    }
    assert_eq!(said, Reclaimed::Freed(5 << 20));
    assert_eq!(*h.fake.removed_images.lock().unwrap(), ["sha256:old"], "the pinned image stays");
    // Nothing is left: the next reclaim says so, and none is tried again for a while (evictions go ahead).
    assert_eq!(h.manager.reclaim_disk(Signal::ImageFsAvailable), Reclaimed::Running);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.manager.reclaim_disk(Signal::ImageFsAvailable), Reclaimed::Nothing);
    assert_eq!(h.manager.reclaim_disk(Signal::ImageFsAvailable), Reclaimed::Nothing);
    let space: Vec<f64> = h
        .registry
        .gather()
        .iter()
        .filter(|f| f.name() == "kubelet_image_garbage_collected_total")
        .flat_map(|f| f.get_metric())
        .filter(|m| m.get_label().iter().any(|l| l.value() == "space"))
        .map(|m| m.get_counter().get_value())
        .collect();
    assert_eq!(space, [1.0], "kubelet_image_garbage_collected_total{{reason=space}}");
}

#[tokio::test(start_paused = true)]
async fn disk_ranking_counts_writable_layers_on_the_file_system_that_holds_them() {
    use nodewarden_eviction::{Evictor, Signal};
    let h = harness();
    h.set(vec![pod("u1", json!({"containers": [app("app")]})), pod("u2", json!({"containers": [app("app")]}))]).await;
    for uid in ["u1", "u2"] {
        h.until(uid, "runs", |v| phase(v) == "Running").await;
    }
    // u2 writes logs; u1 fills its root file system, which only the runtime sees.
    let quiet = h.manager.store().get("u2").unwrap();
    let logs = h._host.path().join("logs").join(crate::spec::pod_log_dir_name(&quiet)).join("app");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::write(logs.join("9.log"), vec![b'x'; 1 << 20]).unwrap();
    let layer = |uid: &str, bytes: u64| nodewarden_runtime::WritableLayer {
        pod_uid: uid.into(),
        container: "app".into(),
        bytes,
        inodes: bytes >> 20,
    };
    *h.fake.layers.lock().unwrap() = vec![layer("u1", 30 << 20), layer("u2", 0)];
    let token = tokio_util::sync::CancellationToken::new();
    tokio::spawn(crate::measure_writable_layers(h.manager.clone(), token.clone()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let collector = h.manager.image_collector().unwrap();
    let usage = |uid: &str, s: Signal| h.manager.disk_usage(uid, s);

    // One file system for images and pods: everything counts, and the writer ranks first.
    collector.set_reclaim(crate::ReclaimSettings { minimum_age: Duration::ZERO, shares_nodefs: true });
    assert!(usage("u1", Signal::NodeFsAvailable) >= 30 << 20);
    let quiet_nodefs = usage("u2", Signal::NodeFsAvailable);
    assert!((1 << 20..2 << 20).contains(&quiet_nodefs), "{quiet_nodefs}");
    // Images on a file system of their own: imagefs pressure ranks by the layers, nodefs by logs and volumes.
    collector.set_reclaim(crate::ReclaimSettings { minimum_age: Duration::ZERO, shares_nodefs: false });
    assert_eq!((usage("u1", Signal::ImageFsAvailable), usage("u2", Signal::ImageFsAvailable)), (30 << 20, 0));
    assert!(usage("u1", Signal::NodeFsAvailable) < 1 << 20);
    assert!(usage("u2", Signal::NodeFsAvailable) >= 1 << 20);
    // An inodes signal ranks by inodes: the layer's 30 on imagefs; on nodefs, the log directory's files
    // (the pod's log directory, the container's, and its one log).
    assert_eq!(usage("u1", Signal::ImageFsInodesFree), 30);
    assert_eq!(usage("u2", Signal::NodeFsInodesFree), 3);

    // A new measure replaces the last: the writer deleted its files.
    *h.fake.layers.lock().unwrap() = vec![layer("u1", 4096)];
    tokio::time::sleep(crate::MEASURE_PERIOD + Duration::from_millis(100)).await;
    assert_eq!(usage("u1", Signal::ImageFsAvailable), 4096);
    // The runtime stops answering: the last measure stays a while, then the layers are unknown (0), not old.
    *h.fake.layers_fail.lock().unwrap() = true;
    tokio::time::sleep(crate::MEASURE_PERIOD).await;
    assert_eq!(usage("u1", Signal::ImageFsAvailable), 4096, "dropped at the first failure");
    tokio::time::sleep(crate::MEASURE_PERIOD * 2).await;
    assert_eq!(usage("u1", Signal::ImageFsAvailable), 0, "layers measured three failures ago still count");
    token.cancel();
}
