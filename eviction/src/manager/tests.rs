//! The eviction loop over a stand-in host and a scripted evictor, with time paused.

use std::sync::{Mutex as StdMutex, OnceLock};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::oneshot;

use nodewarden_resources::testing::FakeHost;
use nodewarden_resources::{Amount, CgroupPath, ResourceConfig};
use serde_json::json;

use super::handoff::{SIGTERM_SLACK, VICTIM_BACKOFF};
use super::read_ahead::READ_AHEAD_AGE;
use super::*;
use crate::pressure::Evaluation;
use crate::threshold::Threshold;

const MIB: u64 = 1 << 20;

/// Evicts as pod sync does: the pod is marked terminating in the ledger once SIGTERM is sent. Pods in `refuse`
/// fail to be evicted; pods in `hang` never confirm SIGTERM.
#[derive(Default)]
struct FakeEvictor {
    ledger: OnceLock<Ledger>,
    refuse: StdMutex<HashSet<String>>,
    hang: StdMutex<HashSet<String>>,
    attempts: StdMutex<Vec<String>>,
    evicted: StdMutex<Vec<(String, Duration, String)>>,
    /// When each eviction was handed over.
    evicted_at: StdMutex<Vec<Instant>>,
    terminations: StdMutex<Vec<oneshot::Sender<()>>>,
    /// Bytes the next `reclaim_disk` frees (dead pods' logs).
    reclaimable: StdMutex<u64>,
    /// A reclaim is running (images being removed).
    reclaiming: StdMutex<bool>,
    /// The SIGTERM and termination confirmations of hanging pods, held unsent.
    unsent: StdMutex<Vec<(oneshot::Sender<Instant>, oneshot::Sender<()>)>>,
    /// The resources of the `EvictionThresholdMet` events.
    thresholds_met: StdMutex<Vec<&'static str>>,
    /// The pods whose disk usage was measured.
    measured: StdMutex<Vec<String>>,
    /// A slow disk: the next measure waits for a message here.
    gate: StdMutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl Evictor for FakeEvictor {
    fn disk_usage(&self, uid: &str, _signal: Signal) -> u64 {
        let gate = self.gate.lock().unwrap().take();
        if let Some(gate) = gate {
            let _ = gate.recv();
        }
        self.measured.lock().unwrap().push(uid.into());
        if uid.starts_with("writer") { 50 * MIB } else { MIB }
    }

    fn reclaim_disk(&self, _signal: Signal) -> Reclaimed {
        if *self.reclaiming.lock().unwrap() {
            return Reclaimed::Running;
        }
        match std::mem::take(&mut *self.reclaimable.lock().unwrap()) {
            0 => Reclaimed::Nothing,
            bytes => Reclaimed::Freed(bytes),
        }
    }

    fn threshold_met(&self, resource: &'static str) {
        self.thresholds_met.lock().unwrap().push(resource);
    }

    fn evict(&self, uid: &str, grace: Duration, message: String) -> Result<Eviction, EvictError> {
        self.attempts.lock().unwrap().push(uid.into());
        if self.refuse.lock().unwrap().contains(uid) {
            return Err(EvictError::UnknownPod(uid.into()));
        }
        let (signal_tx, signalled) = oneshot::channel();
        let (tx, terminated) = oneshot::channel();
        if self.hang.lock().unwrap().contains(uid) {
            self.unsent.lock().unwrap().push((signal_tx, tx));
        } else {
            self.terminations.lock().unwrap().push(tx);
            // As the pod's worker marks it, later, when the ledger's turn comes.
            let (ledger, marked) = (self.ledger.get().unwrap().clone(), uid.to_owned());
            tokio::spawn(async move { ledger.call(move |m| m.set_terminating(&marked)).await });
            self.evicted.lock().unwrap().push((uid.into(), grace, message));
            self.evicted_at.lock().unwrap().push(Instant::now());
            let _ = signal_tx.send(Instant::now());
        }
        Ok(Eviction { signalled, terminated })
    }
}

impl FakeEvictor {
    fn victims(&self) -> Vec<String> {
        self.evicted.lock().unwrap().iter().map(|e| e.0.clone()).collect()
    }
}

fn pod(uid: &str, memory: Option<&str>, extra: serde_json::Value) -> Pod {
    let resources = match memory {
        Some(m) => json!({"requests": {"memory": m, "cpu": "100m"}, "limits": {"memory": m, "cpu": "100m"}}),
        None => json!({}),
    };
    let mut spec = json!({"containers": [{"name": "c", "image": "x", "resources": resources}]});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    serde_json::from_value(json!({"metadata": {"name": uid, "namespace": "default", "uid": uid}, "spec": spec}))
        .unwrap()
}

struct Rig {
    host: FakeHost,
    ledger: Ledger,
    evictor: Arc<FakeEvictor>,
    settings: watch::Sender<Arc<EvictionSettings>>,
    manager: EvictionManager<FakeEvictor>,
    /// The daemon's tracker and shutdown token, as the manager was given them.
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

fn settings(hard: &[(Signal, Amount, Option<Amount>)], soft: &[(Signal, Amount, u64)]) -> EvictionSettings {
    EvictionSettings {
        thresholds: Thresholds {
            hard: hard
                .iter()
                .map(|(signal, amount, min_reclaim)| Threshold {
                    signal: *signal,
                    amount: *amount,
                    grace_period: Duration::ZERO,
                    min_reclaim: *min_reclaim,
                })
                .collect(),
            soft: soft
                .iter()
                .map(|(signal, amount, g)| Threshold {
                    signal: *signal,
                    amount: *amount,
                    grace_period: Duration::from_secs(*g),
                    min_reclaim: None,
                })
                .collect(),
        },
        transition_period: Duration::from_secs(30),
        max_pod_grace_period: Duration::from_secs(20),
        poll_min: Duration::from_millis(10),
        poll_max: Duration::from_secs(1),
    }
}

/// Places the pods, with (memory usage, pids) each.
fn rig(s: EvictionSettings, pods: Vec<(Pod, u64, u64)>) -> Rig {
    rig_on(s, pods, |h| h)
}

/// [`rig`] with the host paths changed by `paths`.
fn rig_on(s: EvictionSettings, pods: Vec<(Pod, u64, u64)>, paths: impl FnOnce(HostPaths) -> HostPaths) -> Rig {
    let host = FakeHost::new();
    let root = CgroupPath::parse("/nw").unwrap();
    let config = ResourceConfig::new(root.clone());
    let mut m = ResourceManager::new(host.cgroupfs(&root), paths(host.host()), config).unwrap();
    m.setup().unwrap();
    host.set_usage(&m.tree().kubepods, 0, 0);
    for (p, mem, pids) in &pods {
        let placed = m.place(p).unwrap();
        host.set_usage(&placed.cgroup, *mem, *pids);
    }
    drop(pods);
    let evictor = Arc::new(FakeEvictor::default());
    let (tx, rx) = watch::channel(Arc::new(s));
    let ledger = Ledger::new(m);
    assert!(evictor.ledger.set(ledger.clone()).is_ok());
    let metrics = EvictionMetrics::new(&prometheus::Registry::new()).unwrap();
    let (tasks, shutdown) = (TaskTracker::new(), CancellationToken::new());
    let mut manager =
        EvictionManager::new(ledger.clone(), evictor.clone(), rx, metrics, None, tasks.clone(), shutdown.clone());
    // The fake's disk measure is immediate, but its thread may start late on a loaded machine: a pass waits for it.
    manager.disk = DiskUsage::with_wait(Duration::from_secs(10));
    Rig { host, ledger, evictor, settings: tx, manager, tasks, shutdown }
}

/// Lets the spawned eviction tasks run.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

impl Rig {
    /// Hands the manager what its eviction tasks reported, as its loop does.
    fn deliver(&mut self) {
        while let Some((uid, outcome)) = self.manager.handoffs.try_report() {
            self.manager.finished(uid, outcome);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_victim_that_cannot_be_evicted_is_skipped_with_a_back_off() {
    let mut r = rig(
        settings(&[(Signal::MemoryAvailable, Amount::Quantity(100 * MIB), None)], &[]),
        vec![
            (pod("broken", None, json!({})), 700 * MIB, 1),
            (pod("stuck", None, json!({})), 500 * MIB, 1),
            (pod("next", None, json!({})), 300 * MIB, 1),
        ],
    );
    r.evictor.refuse.lock().unwrap().insert("broken".into());
    r.evictor.hang.lock().unwrap().insert("stuck".into());
    r.host.set_memory(1 << 30, 90 * MIB, 90 * MIB);
    r.manager.pass().await;
    settle().await;
    r.deliver();
    assert_eq!(*r.evictor.attempts.lock().unwrap(), ["broken"]);
    assert!(r.manager.status().history()[0].error.as_deref().is_some_and(|e| e.contains("not known")));
    // The next pass takes the next candidate instead of trying the broken pod again.
    r.manager.pass().await;
    settle().await;
    r.deliver();
    assert_eq!(*r.evictor.attempts.lock().unwrap(), ["broken", "stuck"]);
    // A victim whose SIGTERM is never confirmed holds nothing up past its grace period + the slack.
    r.manager.pass().await;
    settle().await;
    assert_eq!(*r.evictor.attempts.lock().unwrap(), ["broken", "stuck"], "stuck is pending, not evicted twice");
    tokio::time::advance(HARD_EVICTION_GRACE + SIGTERM_SLACK).await;
    settle().await;
    r.deliver();
    r.manager.pass().await;
    settle().await;
    assert_eq!(*r.evictor.attempts.lock().unwrap(), ["broken", "stuck", "next"]);
    assert_eq!(r.evictor.victims(), ["next"]);
    // Once its back-off is over, the broken pod is a candidate again (the others are terminating).
    r.evictor.terminations.lock().unwrap().drain(..).for_each(|t| t.send(()).unwrap());
    settle().await;
    r.deliver();
    tokio::time::advance(VICTIM_BACKOFF).await;
    r.manager.pass().await;
    settle().await;
    r.deliver();
    assert_eq!(r.evictor.attempts.lock().unwrap().last().map(String::as_str), Some("broken"));
    // A second failure backs off for twice as long.
    assert_eq!(r.manager.handoffs.backoff("broken"), Some(VICTIM_BACKOFF * 2));
}

/// Memory falls fast toward a 100 MiB threshold (450 MiB in 100 ms, to 50 MiB above it): the candidates are read
/// ahead.
async fn fall_toward_the_threshold(r: &mut Rig) {
    r.host.set_memory(1 << 30, 600 * MIB, 600 * MIB);
    r.manager.pass().await;
    tokio::time::advance(Duration::from_millis(100)).await;
    r.host.set_memory(1 << 30, 150 * MIB, 150 * MIB);
    r.manager.pass().await;
    assert!(r.manager.ahead.read_at().is_some(), "read ahead");
}

#[tokio::test(start_paused = true)]
async fn a_crossing_chooses_from_the_candidates_read_ahead_while_they_are_fresh() {
    let mut r = rig(
        settings(&[(Signal::MemoryAvailable, Amount::Quantity(100 * MIB), None)], &[]),
        vec![(pod("early", None, json!({})), 500 * MIB, 1), (pod("late", None, json!({})), 100 * MIB, 1)],
    );
    let late = r.ledger.call(|m| m.placement("late").unwrap().cgroup.clone()).await.unwrap();
    // Far from the threshold nothing is read ahead.
    r.host.set_memory(1 << 30, 600 * MIB, 600 * MIB);
    r.manager.pass().await;
    assert!(r.manager.ahead.read_at().is_none());
    // Holding steady 50 MiB above it, nothing is read ahead either.
    r.host.set_memory(1 << 30, 150 * MIB, 150 * MIB);
    r.manager.pass().await;
    tokio::time::advance(Duration::from_millis(100)).await;
    r.manager.pass().await;
    assert!(r.manager.ahead.read_at().is_none(), "a node holding steady near a threshold reads nothing ahead");
    // Falling fast, the candidates are read ahead; "late" then outgrows "early".
    fall_toward_the_threshold(&mut r).await;
    r.host.set_usage(&late, 900 * MIB, 1);
    // A pause in the fall (a hog between two bursts) keeps the candidates read: no fall over the last 60 ms.
    let read_at = r.manager.ahead.read_at();
    tokio::time::advance(Duration::from_millis(60)).await;
    r.manager.pass().await;
    assert!(!r.manager.schedule.rates().falling_fast(Signal::MemoryAvailable));
    assert_eq!(r.manager.ahead.read_at(), read_at, "kept, not read again");
    tokio::time::advance(Duration::from_millis(50)).await;
    r.host.set_memory(1 << 30, 90 * MIB, 90 * MIB);
    r.manager.pass().await;
    settle().await;
    assert_eq!(r.evictor.victims(), ["early"], "chosen from the usage read 110 ms before");
    // A read-ahead older than READ_AHEAD_AGE is not used: the next victim is chosen on fresh usage.
    r.deliver();
    r.evictor.terminations.lock().unwrap().drain(..).for_each(|t| t.send(()).unwrap());
    settle().await;
    r.deliver();
    r.ledger.try_call(|m| m.release("early")).await.unwrap();
    r.manager.ahead.keep(Instant::now() - READ_AHEAD_AGE * 2, Vec::new());
    r.manager.pass().await;
    settle().await;
    assert_eq!(r.evictor.victims(), ["early", "late"]);
}

#[tokio::test(start_paused = true)]
async fn memory_pressure_evicts_the_besteffort_hog_not_the_guaranteed_pod() {
    let mut r = rig(
        settings(&[(Signal::MemoryAvailable, Amount::Quantity(100 * MIB), None)], &[]),
        vec![
            (pod("guaranteed", Some("150Mi"), json!({})), 140 * MIB, 3),
            (pod("hog", None, json!({})), 700 * MIB, 1),
            (pod("small", None, json!({})), 10 * MIB, 1),
        ],
    );
    r.host.set_memory(1 << 30, 300 * MIB, 300 * MIB);
    let idle = r.manager.pass().await;
    assert!(r.evictor.victims().is_empty());
    assert!(idle > Duration::from_millis(100), "ample headroom polls slowly: {idle:?}");
    r.host.set_memory(1 << 30, 90 * MIB, 90 * MIB);
    let busy = r.manager.pass().await;
    settle().await;
    assert_eq!(busy, Duration::from_millis(10), "a crossed threshold polls at the shortest period");
    assert_eq!(r.evictor.victims(), ["hog"]);
    assert_eq!(*r.evictor.thresholds_met.lock().unwrap(), ["memory"], "the node event of the eviction");
    let (_, grace, message) = r.evictor.evicted.lock().unwrap()[0].clone();
    assert_eq!(grace, HARD_EVICTION_GRACE);
    assert!(
        message.starts_with("The node was low on resource: memory. Threshold quantity: 102400Ki, available: 92160Ki."),
        "{message}"
    );
    // Admission now refuses BestEffort pods.
    assert!(r.ledger.view().pressure().contains(Condition::MemoryPressure));
    // While the hog terminates, what it will give back covers the deficit: nobody else is evicted.
    r.manager.pass().await;
    settle().await;
    assert_eq!(r.evictor.victims(), ["hog"]);
    let history = r.manager.status().history();
    assert_eq!(history.len(), 1);
    assert_eq!(
        history[0].candidates.iter().map(|c| c.pod.as_str()).collect::<Vec<_>>(),
        ["default/hog", "default/small", "default/guaranteed"]
    );
    assert!(history[0].sigterm_latency_seconds.is_some());
}

#[tokio::test(start_paused = true)]
async fn evicts_as_many_pods_as_the_deficit_needs_in_one_pass() {
    let mut r = rig(
        settings(&[(Signal::MemoryAvailable, Amount::Quantity(100 * MIB), Some(Amount::Quantity(100 * MIB)))], &[]),
        vec![
            (pod("a", Some("50Mi"), json!({})), 100 * MIB, 1),
            (pod("b", Some("50Mi"), json!({})), 90 * MIB, 1),
            (pod("c", Some("50Mi"), json!({})), 80 * MIB, 1),
            (pod("d", Some("50Mi"), json!({})), 70 * MIB, 1),
        ],
    );
    // 60 MiB available, target 200 MiB: 140 MiB to reclaim, so a (100) and b (90).
    r.host.set_memory(1 << 30, 60 * MIB, 60 * MIB);
    r.manager.pass().await;
    settle().await;
    assert_eq!(r.evictor.victims(), ["a", "b"]);
    // Once they are gone but memory is still short (something else grew), the next in rank goes.
    let done: Vec<_> = r.evictor.terminations.lock().unwrap().drain(..).collect();
    for d in done {
        d.send(()).unwrap();
    }
    settle().await;
    for uid in ["a", "b"] {
        r.manager.handoffs.forget(uid);
    }
    r.host.set_memory(1 << 30, 150 * MIB, 150 * MIB);
    r.manager.pass().await;
    settle().await;
    assert_eq!(r.evictor.victims(), ["a", "b", "c"]);
}

#[tokio::test(start_paused = true)]
async fn soft_thresholds_evict_after_their_grace_period_with_the_capped_pod_grace() {
    let mut r = rig(
        settings(&[], &[(Signal::MemoryAvailable, Amount::Quantity(300 * MIB), 60)]),
        vec![(pod("slow", None, json!({"terminationGracePeriodSeconds": 45})), 100 * MIB, 1)],
    );
    r.host.set_memory(1 << 30, 200 * MIB, 200 * MIB);
    let wait = r.manager.pass().await;
    assert_eq!(wait, Duration::from_secs(1), "bounded by the longest period");
    assert!(
        r.ledger.view().pressure().contains(Condition::MemoryPressure),
        "the condition is raised within the grace period"
    );
    tokio::time::advance(Duration::from_secs(59)).await;
    r.manager.pass().await;
    settle().await;
    assert!(r.evictor.victims().is_empty());
    tokio::time::advance(Duration::from_secs(1)).await;
    r.manager.pass().await;
    settle().await;
    assert_eq!(r.evictor.victims(), ["slow"]);
    assert_eq!(r.evictor.evicted.lock().unwrap()[0].1, Duration::from_secs(20), "min(45 s, evictionMaxPodGracePeriod)");
}

#[tokio::test(start_paused = true)]
async fn critical_pods_are_never_evicted_and_a_reload_applies_at_once() {
    let mut r = rig(
        settings(&[(Signal::MemoryAvailable, Amount::Quantity(100 * MIB), None)], &[]),
        vec![
            (pod("system", None, json!({"priorityClassName": "system-node-critical"})), 800 * MIB, 1),
            (pod("vip", None, json!({"priority": 2_000_000_000})), 100 * MIB, 1),
        ],
    );
    r.host.set_memory(1 << 30, 150 * MIB, 150 * MIB);
    r.manager.pass().await;
    assert!(r.evictor.victims().is_empty());
    // Raising the threshold over what is available makes the next pass act, but only critical pods are left.
    r.settings.send_replace(Arc::new(settings(&[(Signal::MemoryAvailable, Amount::Quantity(200 * MIB), None)], &[])));
    let period = r.manager.pass().await;
    settle().await;
    assert!(r.evictor.victims().is_empty());
    assert!(r.ledger.view().pressure().contains(Condition::MemoryPressure));
    // With nothing to evict, the met threshold is looked at again at the longest period, not every SETTLE_POLL.
    assert_eq!(period, Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn disk_pressure_with_only_critical_pods_measures_nothing() {
    let mut r = rig(
        settings(&[(Signal::NodeFsAvailable, Amount::Percentage(1.0), None)], &[]),
        vec![(pod("system", None, json!({"priorityClassName": "system-node-critical"})), MIB, 1)],
    );
    for _ in 0..3 {
        assert_eq!(r.manager.pass().await, Duration::from_secs(1), "nothing can be evicted: no fast polls");
    }
    assert!(r.evictor.measured.lock().unwrap().is_empty(), "no pod can be evicted for disk: none is measured");
    assert!(r.ledger.view().pressure().contains(Condition::DiskPressure));
}

/// A writer beside a quiet pod under `s`, on a slow disk: the first measure of their usage waits until the sender
/// sends (or is dropped), and the pass that starts it waits 20 ms for it.
fn slow_disk(s: EvictionSettings) -> (Rig, std::sync::mpsc::Sender<()>) {
    let mut r = rig(s, vec![(pod("writer", None, json!({})), MIB, 1), (pod("quiet", None, json!({})), MIB, 1)]);
    r.manager.disk = DiskUsage::with_wait(Duration::from_millis(20));
    let (release, gate) = std::sync::mpsc::channel();
    *r.evictor.gate.lock().unwrap() = Some(gate);
    (r, release)
}

#[tokio::test(start_paused = true)]
async fn a_disk_measure_under_way_is_not_polled_for() {
    let (mut r, release) = slow_disk(settings(&[(Signal::NodeFsAvailable, Amount::Percentage(1.0), None)], &[]));
    for _ in 0..2 {
        assert_eq!(r.manager.pass().await, Duration::from_secs(1), "the measure's end wakes the loop: no fast polls");
    }
    assert!(r.evictor.attempts.lock().unwrap().is_empty());
    release.send(()).unwrap();
}

#[tokio::test(start_paused = true)]
#[expect(clippy::disallowed_types, reason = "the measure runs on a real thread, in real time")]
async fn a_reclaim_does_not_throw_away_the_measure_under_way() {
    let (mut r, release) = slow_disk(settings(&[(Signal::NodeFsAvailable, Amount::Percentage(1.0), None)], &[]));
    r.manager.pass().await;
    // A dead pod's logs are reclaimed while the disk is walked: the signals are read again, the walk goes on.
    *r.evictor.reclaimable.lock().unwrap() = 10 * MIB;
    r.manager.pass().await;
    release.send(()).unwrap();
    let started = std::time::Instant::now();
    while r.evictor.measured.lock().unwrap().len() < 2 {
        assert!(started.elapsed() < Duration::from_secs(20), "the measure did not end");
        std::thread::sleep(Duration::from_millis(1));
    }
    r.manager.pass().await;
    settle().await;
    assert_eq!(r.evictor.victims(), ["writer", "quiet"]);
    assert_eq!(r.evictor.measured.lock().unwrap().len(), 2, "ranked by the measure under way, not a second one");
}

/// A measure on a slow disk: the loop does not poll for it, and its end wakes the pass that evicts.
#[tokio::test]
#[expect(clippy::disallowed_types, reason = "the measure runs on a real thread, in real time")]
async fn the_end_of_a_slow_disk_measure_wakes_the_loop() {
    let mut s = settings(&[(Signal::NodeFsAvailable, Amount::Percentage(1.0), None)], &[]);
    s.poll_max = Duration::from_secs(60);
    let (r, release) = slow_disk(s);
    let (_wake_tx, wake_rx) = mpsc::channel(1);
    let (shutdown, evictor) = (r.shutdown.clone(), r.evictor.clone());
    let started = std::time::Instant::now();
    tokio::spawn(r.manager.run(wake_rx));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(evictor.attempts.lock().unwrap().is_empty(), "nobody is evicted while the disk is measured");
    release.send(()).unwrap();
    while evictor.attempts.lock().unwrap().is_empty() {
        assert!(started.elapsed() < Duration::from_secs(20), "the measure's end did not wake the loop");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(evictor.attempts.lock().unwrap().first().map(String::as_str), Some("writer"));
    shutdown.cancel();
}

/// A measure that ends within EVENT_INTERVAL of the pass that started it: its wake is held back, and the pass that
/// answers it is a disk_usage pass (reading every signal), not a poll, which evicts.
#[tokio::test]
#[expect(clippy::disallowed_types, reason = "the measure runs on a real thread, in real time")]
async fn the_end_of_a_measure_held_back_by_the_event_interval_is_answered_as_a_disk_pass() {
    let mut s = settings(&[(Signal::NodeFsAvailable, Amount::Percentage(1.0), None)], &[]);
    s.poll_max = Duration::from_secs(60);
    let (r, release) = slow_disk(s);
    let wakeups = r.manager.metrics.wakeups.clone();
    let (_wake_tx, wake_rx) = mpsc::channel(1);
    let (shutdown, evictor) = (r.shutdown.clone(), r.evictor.clone());
    let started = std::time::Instant::now();
    tokio::spawn(r.manager.run(wake_rx));
    // The first pass starts the measure and waits 20 ms for it; it ends well within EVENT_INTERVAL of that pass.
    tokio::time::sleep(Duration::from_millis(40)).await;
    release.send(()).unwrap();
    let count = |source: &str| wakeups.with_label_values(&[source]).get();
    while evictor.attempts.lock().unwrap().is_empty() {
        assert!(started.elapsed() < Duration::from_secs(20), "the held-back end was never answered");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Counted when it came, and again when the interval was over: the pass that evicted was the measure's own.
    let disk_passes = count("disk_usage");
    assert!(started.elapsed() < EVENT_INTERVAL * 5, "answered at the end of the interval: {:?}", started.elapsed());
    assert_eq!(evictor.attempts.lock().unwrap().first().map(String::as_str), Some("writer"));
    assert!(disk_passes >= 2, "the held-back end was answered by a poll: {disk_passes} disk_usage wakes");
    shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn pid_pressure_ranks_by_priority_then_process_count() {
    let mut r = rig(
        settings(&[(Signal::PidAvailable, Amount::Quantity(1000), None)], &[]),
        vec![
            (pod("forker", None, json!({})), MIB, 30_000),
            (pod("important", None, json!({"priority": 10})), MIB, 31_000),
            (pod("quiet", None, json!({})), MIB, 5),
        ],
    );
    r.host.set_threads(32_000);
    r.manager.pass().await;
    settle().await;
    assert_eq!(r.evictor.victims(), ["forker"]);
    let p = r.ledger.view().pressure();
    assert_eq!(p, NodePressure::of([Condition::PidPressure]));
}

#[tokio::test(start_paused = true)]
async fn breaches_of_one_pass_are_handed_over_together_then_given_one_headstart() {
    let mut r = rig(
        settings(
            &[
                (Signal::MemoryAvailable, Amount::Quantity(100 * MIB), None),
                (Signal::PidAvailable, Amount::Quantity(1000), None),
            ],
            &[],
        ),
        vec![(pod("hog", None, json!({})), 700 * MIB, 1), (pod("forker", None, json!({})), MIB, 30_000)],
    );
    r.host.set_memory(1 << 30, 90 * MIB, 90 * MIB);
    r.host.set_threads(32_000);
    let start = Instant::now();
    r.manager.pass().await;
    let took = Instant::now() - start;
    settle().await;
    let mut victims = r.evictor.victims();
    victims.sort();
    assert_eq!(victims, ["forker", "hog"]);
    let at = r.evictor.evicted_at.lock().unwrap().clone();
    assert!(at.iter().all(|t| *t == start), "both handed over at once, before any wait: {at:?}");
    assert!(took >= VICTIM_HEADSTART && took < 2 * VICTIM_HEADSTART, "one headstart per pass: {took:?}");
    assert_eq!(r.manager.status().history().len(), 2, "both recorded after it");
}

#[tokio::test(start_paused = true)]
async fn a_victim_that_ended_is_not_chosen_again_from_the_read_ahead() {
    let mut r = rig(
        settings(&[(Signal::MemoryAvailable, Amount::Quantity(100 * MIB), None)], &[]),
        vec![(pod("early", None, json!({})), 500 * MIB, 1), (pod("late", None, json!({})), 100 * MIB, 1)],
    );
    fall_toward_the_threshold(&mut r).await;
    tokio::time::advance(Duration::from_millis(50)).await;
    r.host.set_memory(1 << 30, 90 * MIB, 90 * MIB);
    r.manager.pass().await;
    settle().await;
    assert_eq!(r.evictor.victims(), ["early"]);
    // The victim ends and leaves the ledger while memory is still short (another pod grows), well within the
    // read-ahead's age.
    r.deliver();
    r.evictor.terminations.lock().unwrap().drain(..).for_each(|t| t.send(()).unwrap());
    settle().await;
    r.deliver();
    r.ledger.try_call(|m| m.release("early")).await.unwrap();
    tokio::time::advance(Duration::from_millis(10)).await;
    r.manager.pass().await;
    settle().await;
    assert_eq!(r.evictor.victims(), ["early", "late"], "the pod that ended is not chosen again");
}

#[tokio::test(start_paused = true)]
async fn an_input_that_fails_leaves_out_only_its_signals() {
    let mut r = rig_on(
        settings(
            &[
                (Signal::MemoryAvailable, Amount::Quantity(100 * MIB), None),
                (Signal::ImageFsAvailable, Amount::Percentage(0.1), None),
            ],
            &[],
        ),
        vec![(pod("hog", None, json!({})), 700 * MIB, 1)],
        |h| HostPaths { imagefs: "/definitely/gone/imagefs".into(), ..h },
    );
    r.host.set_memory(1 << 30, 90 * MIB, 90 * MIB);
    r.manager.pass().await;
    settle().await;
    // The pass completed: memory pressure is acted on, and /readyz names the imagefs.
    assert_eq!(r.evictor.victims(), ["hog"]);
    assert!(r.manager.status().readiness(Duration::from_secs(5)).is_ok());
    let inputs = r.manager.status().inputs().unwrap_err();
    assert!(inputs.contains("imagefs") && inputs.contains("/definitely/gone"), "{inputs}");
    assert!(!r.manager.signals.contains_key(&Signal::ImageFsAvailable));
}

#[tokio::test(start_paused = true)]
async fn disk_pressure_ranks_by_ephemeral_storage() {
    let mut r = rig(
        settings(&[(Signal::NodeFsAvailable, Amount::Percentage(1.0), None)], &[]),
        vec![(pod("writer", None, json!({})), MIB, 1), (pod("quiet", None, json!({})), 100 * MIB, 1)],
    );
    // The logs of pods that are over go first: that pass evicts nobody.
    *r.evictor.reclaimable.lock().unwrap() = 10 * MIB;
    r.manager.pass().await;
    settle().await;
    assert!(r.evictor.victims().is_empty(), "a running pod was evicted while dead pods' logs could be reclaimed");
    // Nor while a reclaim (of images) is running.
    *r.evictor.reclaiming.lock().unwrap() = true;
    r.manager.pass().await;
    settle().await;
    assert!(r.evictor.victims().is_empty(), "a running pod was evicted while a reclaim was running");
    *r.evictor.reclaiming.lock().unwrap() = false;
    // A threshold of 100 % can never be met by eviction: every pod goes, the biggest writer first.
    r.manager.pass().await;
    settle().await;
    assert_eq!(r.evictor.victims(), ["writer", "quiet"]);
    assert!(r.evictor.evicted.lock().unwrap()[0].2.contains("low on resource: ephemeral-storage"));
    assert_eq!(r.evictor.thresholds_met.lock().unwrap().first(), Some(&"ephemeral-storage"));
}

/// nodefs 20 MiB short of its threshold, with a writer (whose 50 MiB, once it is evicted, covers the deficit)
/// beside a quiet pod.
fn writer_beside_quiet_20_mib_short() -> Rig {
    let available = fs_stats(FakeHost::new().host().nodefs.as_path()).unwrap();
    let threshold = Amount::Quantity(available.available_bytes + 20 * MIB);
    rig(
        settings(&[(Signal::NodeFsAvailable, threshold, None)], &[]),
        vec![(pod("writer", None, json!({})), MIB, 1), (pod("quiet", None, json!({})), MIB, 1)],
    )
}

#[tokio::test(start_paused = true)]
async fn the_logs_of_pods_that_are_over_are_reclaimed_while_an_eviction_is_in_flight() {
    let mut r = writer_beside_quiet_20_mib_short();
    r.evictor.hang.lock().unwrap().insert("writer".into());
    r.manager.pass().await;
    settle().await;
    assert_eq!(r.evictor.attempts.lock().unwrap().as_slice(), ["writer"]);
    // The writer is still terminating when its (or another finished pod's) logs become reclaimable: they go at
    // the next pass, although the eviction in flight already covers the deficit.
    *r.evictor.reclaimable.lock().unwrap() = 10 * MIB;
    r.manager.pass().await;
    settle().await;
    assert_eq!(*r.evictor.reclaimable.lock().unwrap(), 0, "the reclaimable logs waited for the eviction in flight");
    assert_eq!(r.evictor.attempts.lock().unwrap().as_slice(), ["writer"], "nobody else was evicted");
}

#[test]
fn poll_period_shrinks_with_headroom() {
    let s = settings(&[(Signal::MemoryAvailable, Amount::Quantity(100 * MIB), None)], &[]);
    let at = |available: u64| {
        let signals = BTreeMap::from([(Signal::MemoryAvailable, SignalObservation { available, capacity: 1 << 30 })]);
        next_poll(&s, &signals, &Evaluation::default())
    };
    assert_eq!(at(2048 * MIB), Duration::from_secs(1));
    assert!(at(612 * MIB) < Duration::from_secs(1));
    assert!(at(200 * MIB) < at(400 * MIB));
    assert_eq!(at(101 * MIB), Duration::from_millis(10));
    // Inodes and PIDs drain at their own rates: a node with 100 000 free inodes is not polled at the floor.
    let s = settings(&[(Signal::NodeFsInodesFree, Amount::Percentage(0.05), None)], &[]);
    let signals =
        BTreeMap::from([(Signal::NodeFsInodesFree, SignalObservation { available: 100_000, capacity: 200_000 })]);
    assert_eq!(next_poll(&s, &signals, &Evaluation::default()), Duration::from_secs(1));
}

#[test]
fn select_stops_once_the_deficit_is_covered_and_skips_pods_that_give_nothing() {
    let c = |name: &str, usage: u64| Candidate {
        uid: name.into(),
        name: name.into(),
        priority: 0,
        critical: false,
        memory_request: 0,
        memory_usage: usage,
        disk_request: 0,
        disk_usage: 0,
        pids: 0,
        grace: Duration::from_secs(30),
    };
    let ranked = [c("a", 50), c("b", 0), c("c", 40), c("d", 30)];
    let names = |v: Vec<Candidate>| v.into_iter().map(|c| c.name).collect::<Vec<_>>();
    assert_eq!(names(select(Signal::MemoryAvailable, &ranked, 10)), ["a"]);
    assert_eq!(names(select(Signal::MemoryAvailable, &ranked, 60)), ["a", "c"]);
    assert_eq!(names(select(Signal::MemoryAvailable, &ranked, 1000)), ["a", "c", "d"]);
    // Nothing gives anything back (disk usage unknown): only the first ranked goes, as the kubelet would do.
    assert_eq!(names(select(Signal::NodeFsAvailable, &ranked, 1000)), ["a"]);
}

#[tokio::test(start_paused = true)]
async fn shutdown_ends_the_loop_and_its_pending_eviction_tasks() {
    let r = rig(
        settings(&[(Signal::MemoryAvailable, Amount::Quantity(100 * MIB), None)], &[]),
        vec![(pod("stuck", None, json!({})), 500 * MIB, 1)],
    );
    r.evictor.hang.lock().unwrap().insert("stuck".into());
    r.host.set_memory(1 << 30, 90 * MIB, 90 * MIB);
    let (tasks, shutdown) = (r.tasks.clone(), r.shutdown.clone());
    let (_wake_tx, wake_rx) = mpsc::channel(1);
    let loop_task = tokio::spawn(r.manager.run(wake_rx));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(*r.evictor.attempts.lock().unwrap(), ["stuck"]);
    assert_eq!(tasks.len(), 1, "the eviction waits for a SIGTERM that never comes");
    // The daemon's shutdown: the token, then its tracker closed and drained.
    shutdown.cancel();
    tasks.close();
    tokio::time::timeout(Duration::from_millis(100), loop_task).await.unwrap().unwrap();
    tokio::time::timeout(Duration::from_millis(100), tasks.wait()).await.expect("the eviction task ended");
}

/// A hog ramping at 800 MiB/s toward a 100 MiB threshold, one poll at a time with time advanced by each period:
/// the periods shrink as the ramp goes on, the passes between complete reads read memory alone, the crossing is
/// seen within the shortest period, and once the hog is on its way out the loop polls at the settle period.
/// allocatableMemory.available (as the kubelet derives it) is read inline too: kubepods' two files, not every signal.
#[tokio::test(start_paused = true)]
async fn a_ramp_is_polled_faster_and_faster_and_the_memory_signals_alone_are_read_between() {
    let mut s = settings(
        &[
            (Signal::MemoryAvailable, Amount::Quantity(100 * MIB), None),
            (Signal::AllocatableMemoryAvailable, Amount::Quantity(100 * MIB), None),
            (Signal::PidAvailable, Amount::Quantity(10), None),
        ],
        &[],
    );
    s.poll_min = Duration::from_millis(1);
    let mut r = rig(s, vec![(pod("hog", None, json!({})), 500 * MIB, 1)]);
    r.host.set_threads(100);
    let start = Instant::now();
    let rate = 800.0 * MIB as f64; // bytes per second
    let available = |t: Instant| {
        let fallen = (t - start).as_secs_f64() * rate;
        #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let v = (600.0 * MIB as f64 - fallen).max(0.0) as u64;
        v
    };
    // kubepods' working set rises with the hog: allocatable's headroom is memory's.
    let (kubepods, allocatable) =
        r.ledger.call(|m| (m.tree().kubepods.clone(), m.allocatable().enforced.memory)).await.unwrap();
    let set = |r: &Rig, v: u64| {
        r.host.set_memory(1 << 30, v, v);
        r.host.set_usage(&kubepods, allocatable.saturating_sub(v), 0);
    };
    set(&r, available(start));
    let mut period = r.manager.pass_on(Wake::Poll).await;
    let mut periods = vec![period];
    let mut crossed_at = None;
    let mut passed = start;
    while r.evictor.victims().is_empty() {
        tokio::time::advance(period).await;
        let now = Instant::now();
        let v = available(now);
        if v < 100 * MIB && crossed_at.is_none() {
            // When the signal went below: the moment between the two passes.
            crossed_at = Some(start + Duration::from_secs_f64((500.0 * MIB as f64) / rate));
        }
        set(&r, v);
        // A process count the fast passes must not see.
        r.host.set_threads(200);
        period = r.manager.pass_on(Wake::Poll).await;
        passed = Instant::now();
        settle().await;
        periods.push(period);
        if r.evictor.victims().is_empty() {
            assert_eq!(
                r.manager.signals[&Signal::PidAvailable].available,
                32768 - 100,
                "only memory was read since the first pass"
            );
        }
        assert!(periods.len() < 40, "too many passes: {periods:?}");
    }
    let seen = r.evictor.evicted_at.lock().unwrap()[0];
    // The pass ends (logs, records) only after the victim's headstart.
    assert!(passed - seen >= VICTIM_HEADSTART, "the pass waited {:?}", passed - seen);
    let late = seen - crossed_at.unwrap();
    assert!(late <= Duration::from_millis(2), "seen {late:?} after the crossing; periods {periods:?}");
    let ramp = &periods[..periods.len() - 1];
    assert!(ramp.windows(2).all(|w| w[1] <= w[0]), "periods shrink: {periods:?}");
    assert!(periods.len() <= 20, "a handful of passes per ramp: {periods:?}");
    assert_eq!(period, SETTLE_POLL, "the victim is on its way: the loop settles, from the end of its headstart");
}

#[tokio::test(start_paused = true)]
async fn a_config_change_is_acted_on_at_once_not_after_the_event_interval() {
    let r = rig(
        settings(&[(Signal::MemoryAvailable, Amount::Quantity(100 * MIB), None)], &[]),
        vec![(pod("hog", None, json!({})), 500 * MIB, 1)],
    );
    r.host.set_memory(1 << 30, 150 * MIB, 150 * MIB);
    let (_wake_tx, wake_rx) = mpsc::channel(1);
    let shutdown = r.shutdown.clone();
    tokio::spawn(r.manager.run(wake_rx));
    // The first pass runs at once; ample headroom then polls slowly.
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(r.evictor.attempts.lock().unwrap().is_empty());
    // An edit raises the threshold above what is available: the very next pass evicts.
    r.settings.send_replace(Arc::new(settings(&[(Signal::MemoryAvailable, Amount::Quantity(200 * MIB), None)], &[])));
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(*r.evictor.attempts.lock().unwrap(), ["hog"], "within 20 ms of the edit, not EVENT_INTERVAL");
    shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_pass_evicts_while_the_ledger_is_held_by_a_placement() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut r = rig(
        settings(&[(Signal::MemoryAvailable, Amount::Quantity(100 * MIB), None)], &[]),
        vec![(pod("hog", None, json!({})), 700 * MIB, 1), (pod("g", Some("100Mi"), json!({})), 50 * MIB, 1)],
    );
    r.host.set_memory(1 << 30, 90 * MIB, 90 * MIB);
    // Another thread holds the ledger, as a placement waiting on systemd over D-Bus does, for up to 5 s.
    let released = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
    let holder = {
        let (ledger, released) = (r.ledger.clone(), released.clone());
        std::thread::spawn(move || {
            ledger.call_blocking(move |_| {
                held_tx.send(()).unwrap();
                let _ = done_rx.recv_timeout(Duration::from_secs(5));
                released.store(true, Ordering::SeqCst);
            });
        })
    };
    held_rx.recv().unwrap();
    r.manager.pass().await;
    settle().await;
    let during = !released.load(Ordering::SeqCst);
    done_tx.send(()).unwrap();
    holder.join().unwrap();
    assert!(during, "the pass waited for the ledger");
    assert_eq!(r.evictor.victims(), ["hog"]);
    assert!(r.manager.pressure.contains(Condition::MemoryPressure));
}

#[tokio::test(start_paused = true)]
async fn a_victim_that_ended_is_not_followed_by_another_on_a_reading_from_before() {
    let mut r = writer_beside_quiet_20_mib_short();
    r.manager.pass().await;
    settle().await;
    assert_eq!(r.evictor.victims(), ["writer"]);
    // The writer ends; the next poll has read nothing of the disk since: nobody else goes on that old reading.
    r.evictor.terminations.lock().unwrap().drain(..).for_each(|t| t.send(()).unwrap());
    settle().await;
    r.deliver();
    // As if the disk's reading were not due yet at this poll.
    r.manager.schedule.set_due(Signal::NodeFsAvailable, Instant::now() + Duration::from_secs(60));
    r.manager.pass_on(Wake::Poll).await;
    settle().await;
    assert_eq!(r.evictor.victims(), ["writer"], "a second victim on a reading from before the first ended");
    // A fresh reading that is still short does evict the next pod.
    r.manager.pass().await;
    settle().await;
    assert_eq!(r.evictor.victims(), ["writer", "quiet"]);
}

/// memory.available close to its threshold with the pods' memory flat (a process outside the pods takes it): the
/// fast polls read memory, and kubepods' files only when allocatableMemory.available is itself nearly due.
#[tokio::test(start_paused = true)]
async fn memory_falling_alone_does_not_read_kubepods_on_every_poll() {
    let mut s = settings(
        &[
            (Signal::MemoryAvailable, Amount::Quantity(100 * MIB), None),
            (Signal::AllocatableMemoryAvailable, Amount::Quantity(100 * MIB), None),
        ],
        &[],
    );
    s.poll_min = Duration::from_millis(1);
    let mut r = rig(s, vec![(pod("quiet", None, json!({})), 10 * MIB, 1)]);
    let kubepods = r.ledger.call(|m| m.tree().kubepods.clone()).await.unwrap();
    r.host.set_usage(&kubepods, 10 * MIB, 0);
    r.host.set_memory(1 << 30, 101 * MIB, 101 * MIB);
    let mut period = r.manager.pass_on(Wake::Poll).await;
    let allocatable = r.manager.signals[&Signal::AllocatableMemoryAvailable].available;
    // The pods' usage moves; the memory polls must not be the ones to see it.
    r.host.set_usage(&kubepods, 20 * MIB, 0);
    for _ in 0..10 {
        assert!(period <= Duration::from_millis(2), "memory is 1 MiB above its threshold: {period:?}");
        tokio::time::advance(period).await;
        period = r.manager.pass_on(Wake::Poll).await;
        assert_eq!(r.manager.signals[&Signal::AllocatableMemoryAvailable].available, allocatable);
    }
    assert!(r.evictor.victims().is_empty());
}
