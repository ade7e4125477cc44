//! The eviction loop. Each pass reads fresh observations, evaluates the thresholds, publishes the node
//! conditions to admission, and evicts as many pods as it takes to bring a crossed signal back above its
//! threshold + minimum reclaim, counting what pods already being evicted will give back.
//!
//! A pass runs when the poll period runs out (shorter as headroom above the thresholds shrinks, between the
//! configured bounds), when a pressure event arrives (PSI trigger, `memory.events`), when the configuration
//! changes, and when an eviction finishes.

mod disk_usage;
mod evictor;
mod handoff;
mod read_ahead;
mod schedule;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nodewarden_resources::{
    CgroupError, Condition, HostPaths, Ledger, LedgerView, MeminfoReader, NodePressure, Observations, ResourceManager,
    fs_stats, pid_stats,
};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::EvictionMetrics;
use crate::observe::{SignalObservation, allocatable_memory, signal_observations};
use crate::pressure::{Breach, Evaluation, PressureState};
use crate::rank::{Candidate, rank};
use crate::realtime::{make_realtime, with_normal_scheduler};
use crate::signal::Signal;
use crate::status::EvictionStatus;
use crate::threshold::Thresholds;
use crate::wake::Wake;
use disk_usage::DiskUsage;

pub use evictor::{EvictError, Eviction, Evictor, Reclaimed};
pub use handoff::VICTIM_HEADSTART;
pub(crate) use handoff::sigterm_sent;
use handoff::{Handoffs, Handover, Outcome, wait_signalled};
use read_ahead::ReadAhead;
pub use schedule::{SETTLE_POLL, next_poll};
use schedule::{Schedule, signal_periods};

/// The shortest time between two passes that events (not the poll) start.
pub const EVENT_INTERVAL: Duration = Duration::from_millis(200);

/// The grace period of an eviction for a hard threshold (the kubelet's).
pub const HARD_EVICTION_GRACE: Duration = Duration::from_secs(1);

/// The eviction settings in force; replaced as a whole on a config reload.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionSettings {
    /// `evictionHard` and `evictionSoft`.
    pub thresholds: Thresholds,
    /// `evictionPressureTransitionPeriod`.
    pub transition_period: Duration,
    /// `evictionMaxPodGracePeriod`.
    pub max_pod_grace_period: Duration,
    /// The shortest poll period, used when headroom is nearly gone.
    pub poll_min: Duration,
    /// The longest poll period, used when headroom is ample.
    pub poll_max: Duration,
}

/// Told about each observation, for the daemon's gauges.
pub trait PassObserver: Send + Sync + 'static {
    /// An observation was read in `took`, and evaluated against `thresholds` (those of the settings this pass
    /// runs with, so a reload shows in the very pass that applies it).
    fn observed(
        &self,
        obs: &Observations,
        signals: &BTreeMap<Signal, SignalObservation>,
        thresholds: &Thresholds,
        took: Duration,
    );

    /// The node could not be observed.
    fn failed(&self, error: &CgroupError);
}

/// The eviction loop and its state.
pub struct EvictionManager<E: Evictor> {
    /// The settle of a lowered kubepods limit.
    limit: MemoryLimit,
    /// What the loop reads of the ledger, behind a lock that placing or releasing a pod never holds.
    view: LedgerView,
    evictor: Arc<E>,
    settings: watch::Receiver<Arc<EvictionSettings>>,
    metrics: EvictionMetrics,
    status: Arc<EvictionStatus>,
    observer: Option<Arc<dyn PassObserver>>,
    state: PressureState,
    pressure: NodePressure,
    /// The victims handed over: in flight, backing off, and the reports of the tasks that follow them.
    handoffs: Handoffs,
    service: Service,
    /// The signals as last read (a memory-only pass updates memory.available alone).
    signals: BTreeMap<Signal, SignalObservation>,
    /// When each signal is read next, and whether a condition's reading is out of date.
    schedule: Schedule,
    /// `/proc/meminfo`, kept open, and the host paths, for polls that read on the loop's thread; `None` when it
    /// cannot be opened.
    inline: Option<(MeminfoReader, HostPaths)>,
    /// The candidates for memory and PID evictions, read ahead while a signal nears its threshold.
    ahead: ReadAhead,
    /// The pods' disk usage for a disk ranking, measured off this thread.
    disk: DiskUsage,
}

/// The daemon's task tracker and shutdown token: the eviction tasks, which outlive a pass, and the settle of a
/// lowered limit run on them.
struct Service {
    tasks: TaskTracker,
    stop: CancellationToken,
}

/// A lowered kubepods memory limit waits for the pods to fit: it is settled off the loop's thread, one settle at
/// a time.
struct MemoryLimit {
    /// The ledger, which settles it.
    ledger: Ledger,
    /// A settle is under way.
    settling: Arc<AtomicBool>,
}

impl MemoryLimit {
    /// Settles the limit if `view` says it is pending and no settle is under way: the ledger's turn and the write
    /// (a D-Bus call under the systemd driver) are waited for in a task of `tasks`, the write on the loop's one
    /// blocking thread.
    fn settle(&self, view: &LedgerView, tasks: &TaskTracker) {
        if view.memory_max_pending() && !self.settling.swap(true, Ordering::SeqCst) {
            let (ledger, settling) = (self.ledger.clone(), self.settling.clone());
            tasks.spawn(async move {
                match ledger.call(ResourceManager::settle_memory_limit).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "cannot lower kubepods' memory.max"),
                    Err(e) => tracing::warn!(error = %e, "cannot lower kubepods' memory.max"),
                }
                settling.store(false, Ordering::SeqCst);
            });
        }
    }
}

/// The victims for a breach: the first ranked pod, then more in rank order until what they give back covers
/// `needed`. A pod that would give back nothing is passed over once a victim is chosen.
pub fn select(signal: Signal, ranked: &[Candidate], needed: u64) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = Vec::new();
    let mut sum = 0u64;
    for c in ranked {
        if !out.is_empty() && (sum >= needed || c.reclaims(signal) == 0) {
            if sum >= needed {
                break;
            }
            continue;
        }
        sum = sum.saturating_add(c.reclaims(signal));
        out.push(c.clone());
    }
    out
}

/// The grace period for an eviction: [`HARD_EVICTION_GRACE`] for hard thresholds, else the pod's own capped at
/// `evictionMaxPodGracePeriod`.
pub fn grace_period(hard: bool, pod_grace: Duration, max_pod_grace: Duration) -> Duration {
    if hard { HARD_EVICTION_GRACE } else { pod_grace.min(max_pod_grace) }
}

/// `d` in whole microseconds, for the debug log.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The resource a signal is about, as the kubelet names it in its messages.
pub(crate) fn resource_name(signal: Signal) -> &'static str {
    match signal {
        Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => "memory",
        Signal::NodeFsAvailable | Signal::ImageFsAvailable => "ephemeral-storage",
        Signal::NodeFsInodesFree | Signal::ImageFsInodesFree => "inodes",
        Signal::PidAvailable => "pids",
    }
}

fn amount(signal: Signal, v: u64) -> String {
    match signal {
        Signal::PidAvailable | Signal::NodeFsInodesFree | Signal::ImageFsInodesFree => v.to_string(),
        _ => format!("{}Ki", v / 1024),
    }
}

/// The message in the evicted pod's status, in the kubelet's words.
pub fn eviction_message(b: &Breach, victim: &Candidate) -> String {
    let s = b.threshold.signal;
    let (usage, request) = victim.usage(s);
    format!(
        "The node was low on resource: {}. Threshold quantity: {}, available: {}. Pod {} was using {}, request is {}. ",
        resource_name(s),
        amount(s, b.value),
        amount(s, b.observed),
        victim.name,
        amount(s, usage),
        amount(s, request),
    )
}

/// What acting on a breach came to.
enum Acted {
    /// Victims handed over.
    Handed(Handover),
    /// Nothing yet, but soon: a reading after the last eviction or reclaim, a reclaim, or victims on their way.
    Again,
    /// Nothing until something else changes: no pod can be evicted (critical ones only, or every candidate in
    /// flight or backing off after a failed eviction: looked at again within the longest period of its end), or the
    /// pods' disk usage is being measured (whose end wakes the loop).
    Idle,
}

/// The pods that may be evicted, with their usage, from the ledger (their disk usage is measured apart: see
/// `disk_usage`); pods in `skip` (already being evicted, or backing off after a failed eviction) are left out.
fn candidates(view: &LedgerView, skip: &HashSet<String>) -> Vec<Candidate> {
    view.eviction_candidates()
        .into_iter()
        .filter(|c| !skip.contains(&c.placement.uid))
        .map(|c| {
            let p = c.placement;
            Candidate {
                disk_usage: 0,
                name: p.pod,
                priority: p.priority,
                critical: c.critical,
                memory_request: p.memory_request,
                memory_usage: c.usage.memory_working_set,
                disk_request: p.ephemeral_request,
                pids: c.usage.pids,
                grace: p.grace_period,
                uid: p.uid,
            }
        })
        .collect()
}

impl<E: Evictor> EvictionManager<E> {
    /// A loop over the ledger's observations, evicting through `evictor`.
    pub fn new(
        ledger: Ledger,
        evictor: Arc<E>,
        settings: watch::Receiver<Arc<EvictionSettings>>,
        metrics: EvictionMetrics,
        observer: Option<Arc<dyn PassObserver>>,
        tasks: TaskTracker,
        stop: CancellationToken,
    ) -> Self {
        let view = ledger.view().clone();
        Self {
            limit: MemoryLimit { ledger, settling: Arc::new(AtomicBool::new(false)) },
            view,
            evictor,
            settings,
            metrics,
            status: Arc::new(EvictionStatus::default()),
            observer,
            state: PressureState::default(),
            pressure: NodePressure::default(),
            handoffs: Handoffs::default(),
            service: Service { tasks, stop },
            signals: BTreeMap::new(),
            schedule: Schedule::default(),
            inline: None,
            ahead: ReadAhead::default(),
            disk: DiskUsage::default(),
        }
    }

    /// The state shared with the daemon.
    pub fn status(&self) -> Arc<EvictionStatus> {
        self.status.clone()
    }

    /// Runs the loop on a thread of its own, named `eviction`, with a single-threaded runtime, and returns once it
    /// is running. Nothing else runs on that thread, so the loop's blocking reads (the kernel's files) hold up
    /// no other task, and no hand-off to another thread stands between the pass that
    /// sees a crossing and the victim's SIGTERM. With a `realtime_priority` (1 to 99; 0 for none) the thread runs
    /// under `SCHED_FIFO` at that priority ([`make_realtime`]), or, where that is refused, says so and runs as
    /// before. The thread ends once the daemon's shutdown token is cancelled and its tracker has drained, or
    /// `drain` after that.
    pub fn spawn(
        self,
        wakeups: mpsc::Receiver<Wake>,
        drain: Duration,
        realtime_priority: u8,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        // The one blocking thread the settling of a lowered allocatable needs is made here and kept: eviction
        // never waits for the OS to give it a thread (a node out of PIDs would refuse it).
        let runtime = tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(1)
            .thread_keep_alive(nodewarden_resources::KEEP_THREADS)
            .enable_all()
            .build()?;
        std::thread::Builder::new().name("eviction".into()).spawn(move || {
            // Made first, on this thread (not within the caller's runtime), and kept.
            if let Err(e) = runtime.block_on(runtime.spawn_blocking(|| ())) {
                tracing::warn!(error = %e, "cannot make the eviction thread's blocking thread");
            }
            if realtime_priority > 0 {
                match make_realtime(realtime_priority) {
                    Ok(()) => tracing::info!(priority = realtime_priority, "the eviction thread runs under SCHED_FIFO"),
                    Err(e) => tracing::warn!(
                        priority = realtime_priority,
                        error = %e,
                        "cannot put the eviction thread under SCHED_FIFO; it runs under the normal scheduler"
                    ),
                }
            }
            let tasks = self.service.tasks.clone();
            runtime.block_on(async move {
                self.run(wakeups).await;
                // The eviction tasks run on this thread's runtime: it is kept until the daemon's tracker has
                // drained (its tasks end on the shutdown token), or `drain` has passed.
                let _ = tokio::time::timeout(drain, tasks.wait()).await;
            });
        })
    }

    /// Runs until the daemon's shutdown token is cancelled. `wakeups` carries pressure events. Its reads block the
    /// thread it runs on: the daemon gives it a thread of its own ([`EvictionManager::spawn`]).
    pub async fn run(mut self, mut wakeups: mpsc::Receiver<Wake>) {
        let shutdown = self.service.stop.clone();
        let mut next = Instant::now();
        let mut last = None::<Instant>;
        // A measure's end held back by EVENT_INTERVAL: the poll that answers it reads every signal, as its own
        // pass would have, so that victims for disk are chosen on a fresh reading.
        let mut deferred_disk = false;
        loop {
            let wake = tokio::select! {
                () = tokio::time::sleep_until(next) => {
                    if std::mem::take(&mut deferred_disk) { Wake::DiskUsage } else { Wake::Poll }
                }
                Some(w) = wakeups.recv() => w,
                Ok(()) = self.settings.changed() => {
                    // `changed` marks the settings seen: make the pass a full one so the gauges follow at once.
                    self.schedule.reload();
                    Wake::Config
                }
                () = self.disk.ended() => Wake::DiskUsage,
                Some((uid, outcome)) = self.handoffs.report() => {
                    let wake = !matches!(outcome, Outcome::Signalled);
                    self.finished(uid, outcome);
                    if !wake {
                        continue;
                    }
                    Wake::Evicted
                }
                () = shutdown.cancelled() => return,
            };
            self.metrics.wakeups.with_label_values(&[wake.as_str()]).inc();
            // Pressure events come in bursts (measured: with every daemon's triggers firing during a 100-pod start
            // in the VM, unthrottled passes starved pod sync): one pass per EVENT_INTERVAL answers a burst. The
            // poll is never held back, nor is a config change (one per edit, and an edit is in force at once).
            let earliest = last.map(|t: Instant| t + EVENT_INTERVAL);
            if !matches!(wake, Wake::Poll | Wake::Config) && earliest.is_some_and(|e| e > Instant::now()) {
                next = next.min(earliest.unwrap_or(next));
                deferred_disk |= wake == Wake::DiskUsage;
                continue;
            }
            let period = self.pass_on(wake).await;
            last = Some(Instant::now());
            self.metrics.poll_period.set(period.as_secs_f64());
            next = Instant::now() + period;
        }
    }

    /// One pass that reads every signal; returns the time until the next poll.
    pub async fn pass(&mut self) -> Duration {
        self.pass_on(Wake::Config).await
    }

    /// The signals a poll reads on the loop's thread, without waiting for the ledger: those due now (once every
    /// signal has been read in full). `None` when the poll must read everything.
    fn inline_reads(&mut self, now: Instant) -> Option<Vec<Signal>> {
        if self.inline.is_none() && !self.signals.is_empty() {
            let host = self.view.host().clone();
            self.inline = MeminfoReader::open(&host)
                .inspect_err(|e| tracing::warn!(error = %e, "eviction polls read every signal"))
                .ok()
                .map(|r| (r, host));
        }
        self.inline.as_ref()?;
        let due = self.schedule.due(now);
        let cached = due.iter().all(|s| self.signals.contains_key(s));
        cached.then_some(due)
    }

    /// Reads `due` on this thread: memory.available with one `pread` of the open `/proc/meminfo`,
    /// allocatableMemory.available with two reads of kubepods' files, the others with a `statvfs` or a read of
    /// `/proc/loadavg`. Returns what was read.
    fn read_inline(&mut self, due: &[Signal]) -> Result<Vec<Signal>, CgroupError> {
        let o = |available, capacity| SignalObservation { available, capacity };
        let mut read = Vec::new();
        if due.contains(&Signal::MemoryAvailable) {
            let Some((meminfo, _)) = self.inline.as_mut() else { return Ok(Vec::new()) };
            let m = meminfo.read()?;
            read.push((Signal::MemoryAvailable, o(m.available, m.capacity)));
        }
        // A kubepods, PID or file system input that fails leaves its signals out (and names itself in /readyz);
        // memory, and the rest, are read as usual.
        let mut lost = Vec::new();
        let mut inputs = Vec::new();
        if due.contains(&Signal::AllocatableMemoryAvailable) {
            match self.view.kubepods_working_set() {
                Ok(ws) => {
                    read.push((Signal::AllocatableMemoryAvailable, allocatable_memory(&self.view.allocatable(), ws)));
                    inputs.push(("kubepods", None));
                    self.settle_memory_limit();
                }
                Err(e) => {
                    inputs.push(("kubepods", Some(e.to_string())));
                    lost.push(Signal::AllocatableMemoryAvailable);
                }
            }
        }
        let Some((_, host)) = self.inline.as_ref() else { return Ok(Vec::new()) };
        if due.contains(&Signal::PidAvailable) {
            match pid_stats(host) {
                Ok(p) => {
                    read.push((Signal::PidAvailable, o(p.available, p.max)));
                    inputs.push(("pids", None));
                }
                Err(e) => {
                    inputs.push(("pids", Some(e.to_string())));
                    lost.push(Signal::PidAvailable);
                }
            }
        }
        for (what, path, bytes, inodes) in [
            ("nodefs", &host.nodefs, Signal::NodeFsAvailable, Signal::NodeFsInodesFree),
            ("imagefs", &host.imagefs, Signal::ImageFsAvailable, Signal::ImageFsInodesFree),
        ] {
            if due.contains(&bytes) || due.contains(&inodes) {
                match fs_stats(path) {
                    Ok(f) => {
                        read.push((bytes, o(f.available_bytes, f.capacity_bytes)));
                        read.push((inodes, o(f.inodes_free, f.inodes)));
                        inputs.push((what, None));
                    }
                    Err(e) => {
                        inputs.push((what, Some(e.to_string())));
                        lost.extend([bytes, inodes]);
                    }
                }
            }
        }
        self.status.record_inputs(&inputs);
        for s in &lost {
            self.signals.remove(s);
        }
        let signals = read.iter().map(|(s, _)| *s).collect();
        self.signals.extend(read);
        Ok(signals)
    }

    /// Reads every signal, on the loop's own thread; a `full` pass also tells the observer.
    fn read_all(&self, full: bool, in_force: &EvictionSettings) -> Result<BTreeMap<Signal, SignalObservation>, String> {
        let start = Instant::now();
        let obs = self.view.observe();
        let read = obs.map(|obs| {
            if !obs.unavailable.is_empty() {
                tracing::warn!(inputs = ?obs.unavailable, "eviction inputs not answering; their signals are left out");
            }
            let inputs: Vec<(&'static str, Option<String>)> = ["kubepods", "pids", "nodefs", "imagefs"]
                .into_iter()
                .map(|i| (i, obs.unavailable.iter().find(|(u, _)| *u == i).map(|(_, e)| e.clone())))
                .collect();
            self.status.record_inputs(&inputs);
            let signals = signal_observations(&obs, &self.view.allocatable());
            if let (true, Some(o)) = (full, &self.observer) {
                o.observed(&obs, &signals, &in_force.thresholds, start.elapsed());
            }
            signals
        });
        if let (Err(e), Some(o)) = (&read, &self.observer) {
            o.failed(e);
        }
        self.settle_memory_limit();
        read.map_err(|e| e.to_string())
    }

    /// A lowered allocatable waits for the pods to fit (evicted meanwhile on allocatableMemory.available); each
    /// read of that signal tries again. The ledger's turn and the write (a D-Bus call under the systemd driver)
    /// are waited for off this thread, one settle at a time.
    fn settle_memory_limit(&self) {
        self.limit.settle(&self.view, &self.service.tasks);
    }

    /// One pass for a wake-up; returns the time until the next poll. A poll reads only the signals due, on this
    /// thread and without waiting for the ledger (memory.available is one `pread`); a full pass and a pass for any
    /// other wake-up read every signal.
    async fn pass_on(&mut self, wake: Wake) -> Duration {
        // New settings show in the gauges at once.
        let reloaded = self.settings.has_changed().unwrap_or(false);
        let settings = self.settings.borrow_and_update().clone();
        let now = Instant::now();
        // Every signal read and the observer's gauges set at most once per longest poll period; the passes
        // between read only the signals due.
        let full = self.schedule.full_pass(now, settings.poll_max, reloaded);
        let due = if !full && wake == Wake::Poll { self.inline_reads(now) } else { None };
        let fast = due.is_some();
        let inline = due.map(|d| self.read_inline(&d));
        let read: Vec<Signal> = match inline {
            Some(Ok(read)) => read,
            other => {
                if let Some(Err(e)) = other {
                    tracing::warn!(error = %e, "cannot read the signals due alone; reading every signal");
                    self.inline = None;
                }
                match self.read_all(full, &settings) {
                    Ok(s) => self.signals = s,
                    Err(e) => {
                        tracing::warn!(error = %e, "eviction pass cannot observe the node");
                        self.status.pass_failed(e);
                        self.schedule.clear();
                        return settings.poll_max;
                    }
                }
                self.signals.keys().copied().collect()
            }
        };
        let observed_at = Instant::now();
        self.schedule.read(&read, &self.signals, observed_at);
        self.handoffs.expire(observed_at);
        let evaluation =
            self.state.evaluate(observed_at, &settings.thresholds, &self.signals, settings.transition_period);
        // Evictions first: every breach's victims are handed over, then the pass waits until their SIGTERMs went
        // out (within SIGTERM_WAIT, one deadline for the pass) and gives them their headstart (once); only then
        // come the log lines, the records, the metrics, and admission hearing of the new conditions.
        let (mut handovers, mut settled, mut idle) = (Vec::new(), Vec::new(), Vec::new());
        for breach in &evaluation.act {
            let signal = breach.threshold.signal;
            match self.act(breach, observed_at, &settings) {
                Acted::Handed(h) => {
                    handovers.push(h);
                    settled.push(signal);
                }
                Acted::Again => settled.push(signal),
                Acted::Idle => idle.push(signal),
            }
        }
        if !handovers.is_empty() {
            wait_signalled(&mut handovers).await;
            for h in handovers {
                self.handoffs.follow(h, observed_at, &self.metrics, &self.status, &self.service);
            }
        }
        self.set_pressure(evaluation.pressure);
        // A breach acted on is settled (looked at again soon): its victims are on their way, or a reclaim or a
        // reading is awaited; one with nothing to do until something else changes is idle (looked at again at the
        // longest period, or when a measure of the pods' disk usage ends), unless another breach of its signal
        // (hard beside soft) settled.
        idle.retain(|s| !settled.contains(s));
        let periods = signal_periods(&settings, &self.signals, &evaluation, (&settled, &idle), |s| {
            self.schedule.rates().planning(s)
        });
        self.read_ahead(&periods, &evaluation);
        // A met threshold acted on is looked at again SETTLE_POLL after this pass, which may have waited out its
        // victims' headstart; the others, their period after the observation.
        let next = self.schedule.plan(&periods, &read, &settled, observed_at, Instant::now(), settings.poll_max);
        let period = next.saturating_duration_since(Instant::now()).max(settings.poll_min);
        tracing::debug!(
            wake = wake.as_str(),
            fast,
            full,
            memory_available = self.signals.get(&Signal::MemoryAvailable).map(|s| s.available),
            acted = evaluation.act.len(),
            took_us = micros(now.elapsed()),
            period_us = micros(period),
            "eviction pass"
        );
        self.status.pass_done(Instant::now(), evaluation);
        period
    }

    /// Reads the memory and PID candidates ahead when such a signal, not yet met and falling fast, could cross
    /// soon ([`ReadAhead::wanted`]).
    fn read_ahead(&mut self, periods: &BTreeMap<Signal, Duration>, evaluation: &Evaluation) {
        let now = Instant::now();
        if self.ahead.wanted(now, periods, self.schedule.rates(), &evaluation.met) {
            let found = candidates(&self.view, &HashSet::new());
            self.ahead.keep(now, found);
        }
    }

    /// News from an eviction task: a victim that has terminated no longer counts as pending, and what its signals
    /// said is out of date; one that could not be evicted is skipped, with a back-off, so that the next candidate
    /// is taken.
    fn finished(&mut self, uid: String, outcome: Outcome) {
        if let Some(condition) = self.handoffs.finished(uid, outcome, Instant::now()) {
            self.settled(condition);
        }
    }

    /// What `condition`'s signals said before now is out of date: they are read at the next pass.
    fn settled(&mut self, condition: Condition) {
        // Candidates read before a victim was reclaimed are such a reading too (the victim among them).
        if condition == Condition::DiskPressure {
            self.disk.forget();
        } else {
            self.ahead.clear();
        }
        self.schedule.settled(condition, Instant::now());
    }

    fn set_pressure(&mut self, p: NodePressure) {
        if p == self.pressure {
            return;
        }
        let (old, new) = (self.pressure.names(), p.names());
        tracing::info!(from = ?old, to = ?new, "node conditions changed");
        self.pressure = p;
        self.view.set_pressure(p);
        for c in Condition::ALL {
            self.metrics.conditions.with_label_values(&[c.as_str()]).set(i64::from(p.contains(c)));
        }
    }

    /// Chooses the victims of a breach and hands them over (SIGTERM goes out now, or from their workers), counting
    /// them as in flight; what is left to do about them once they are signalled is returned.
    fn act(&mut self, breach: &Breach, observed_at: Instant, settings: &EvictionSettings) -> Acted {
        let signal = breach.threshold.signal;
        let condition = signal.condition();
        let pending = self.handoffs.pending(signal);
        if self.schedule.stale(signal) {
            tracing::debug!(%signal, "waiting for a reading taken after the last eviction or reclaim");
            return Acted::Again;
        }
        // Node storage that no running pod needs goes first, also while an eviction is in flight (the evicted pod's
        // own logs are reclaimable once it is over); the next pass sees what that freed.
        if condition == Condition::DiskPressure {
            match with_normal_scheduler(|| self.evictor.reclaim_disk(signal)) {
                Reclaimed::Freed(freed) => {
                    tracing::info!(%signal, freed, "reclaimed node storage before evicting; looking again");
                    // The signals are read again; the pods' usage measured before is still theirs (what was
                    // reclaimed no running pod owns), so a measure under way on a slow disk is not thrown away.
                    self.schedule.settled(condition, Instant::now());
                    return Acted::Again;
                }
                Reclaimed::Running => {
                    tracing::debug!(%signal, "node storage is being reclaimed; no pod is evicted for disk meanwhile");
                    return Acted::Again;
                }
                Reclaimed::Nothing => {}
            }
        }
        let needed = breach.deficit().saturating_sub(pending.unwrap_or(0));
        if pending.is_some() && needed == 0 {
            return Acted::Again;
        }
        let now = Instant::now();
        tracing::debug!(%signal, since_observed_us = micros(now.saturating_duration_since(observed_at)), "choosing victims");
        let skip = self.handoffs.skip(now);
        let ahead = self
            .ahead
            .fresh(now)
            .filter(|_| condition != Condition::DiskPressure)
            .map(|found| found.iter().filter(|c| !skip.contains(&c.uid)).cloned().collect::<Vec<_>>());
        let read_ahead = ahead.is_some();
        let mut found = ahead.unwrap_or_else(|| candidates(&self.view, &skip));
        // The pods' disk usage is measured only when a pod could be evicted for it: a node whose disk went to what
        // no pod owns, or to critical pods, is not walked over and over.
        if condition == Condition::DiskPressure && found.iter().any(|c| !c.critical) {
            let uids = found.iter().map(|c| c.uid.clone()).collect();
            // Measured off this thread, whose loop its end wakes ([`DiskUsage::ended`]): no poll waits for it.
            let Some(usage) = self.disk.of(&self.evictor, signal, uids) else { return Acted::Idle };
            for c in &mut found {
                c.disk_usage = usage.get(&c.uid).copied().unwrap_or(0);
            }
        }
        let mut ranked = rank(signal, &found);
        tracing::debug!(%signal, candidates = ranked.len(), read_ahead, took_us = micros(now.elapsed()), "candidates ranked");
        if ranked.is_empty() {
            if self.handoffs.first_without_candidates(condition) {
                tracing::warn!(%signal, observed = breach.observed, threshold = breach.value, "threshold crossed, but no pod can be evicted");
            }
            return Acted::Idle;
        }
        // Handed over before anything else: the log lines, the records and the metrics come after the SIGTERMs
        // and the victims' headstart (see `wait_signalled`).
        let (decided, age) = (jiff::Timestamp::now(), observed_at.elapsed());
        let victims: Vec<_> = select(signal, &ranked, needed)
            .into_iter()
            .map(|victim| {
                let grace = grace_period(breach.hard, victim.grace, settings.max_pod_grace_period);
                let message = eviction_message(breach, &victim);
                self.handoffs.hand_over(self.evictor.as_ref(), victim, signal, grace, message)
            })
            .collect();
        // The victims leave the candidates read ahead: a later pass must not choose them again.
        for v in &victims {
            self.ahead.remove(v.uid());
        }
        ranked.truncate(10);
        Acted::Handed(Handover { breach: breach.clone(), ranked, decided, age, victims })
    }
}

#[cfg(test)]
mod tests;
