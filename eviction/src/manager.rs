//! The eviction loop. Each pass reads fresh observations, evaluates the thresholds, publishes the node
//! conditions to admission, and evicts as many pods as it takes to bring a crossed signal back above its
//! threshold + minimum reclaim, counting what pods already being evicted will give back.
//!
//! A pass runs when the poll period runs out (shorter as headroom above the thresholds shrinks, between the
//! configured bounds), when a pressure event arrives (PSI trigger, `memory.events`), when the configuration
//! changes, and when an eviction finishes.

mod schedule;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use nodewarden_resources::{
    CgroupError, HostPaths, MeminfoReader, NodePressure, Observations, PodResources, ResourceManager, fs_stats,
    is_critical, parse_non_negative, pid_stats, pod_priority,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::metrics::EvictionMetrics;
use crate::observe::{SignalObservation, signal_observations};
use crate::pressure::{Breach, Condition, PressureState};
use crate::rank::{Candidate, rank};
use crate::signal::Signal;
use crate::status::{EvictionRecord, EvictionStatus, Ranked};
use crate::threshold::Thresholds;
use crate::wake::Wake;

use schedule::{Rates, signal_periods};
pub use schedule::{SETTLE_POLL, next_poll};

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
    /// Every static pod is critical (the kubelet's rule).
    pub static_pods_critical: bool,
    /// The shortest poll period, used when headroom is nearly gone.
    pub poll_min: Duration,
    /// The longest poll period, used when headroom is ample.
    pub poll_max: Duration,
}

/// Carries out evictions; pod sync implements it.
pub trait Evictor: Send + Sync + 'static {
    /// The pods that run now and are not terminating.
    fn pods(&self) -> Vec<Pod>;

    /// Bytes of node storage a pod uses (container logs and disk-backed volumes).
    fn disk_usage(&self, uid: &str) -> u64;

    /// Evicts a pod with the given grace period; the pod ends `Failed` with reason `Evicted` and the message.
    /// Resolves once SIGTERM has been sent to its containers, with a receiver that resolves once the pod has
    /// terminated.
    fn evict(
        &self,
        uid: &str,
        grace: Duration,
        message: String,
    ) -> impl Future<Output = Result<oneshot::Receiver<()>, String>> + Send;
}

/// Told about each observation, for the daemon's gauges.
pub trait PassObserver: Send + Sync + 'static {
    /// An observation was read in `took`.
    fn observed(
        &self,
        resources: &ResourceManager,
        obs: &Observations,
        signals: &BTreeMap<Signal, SignalObservation>,
        took: Duration,
    );

    /// The node could not be observed.
    fn failed(&self, error: &CgroupError);
}

struct InFlight {
    condition: Condition,
    reclaims: u64,
    until: Instant,
}

/// The eviction loop and its state.
pub struct EvictionManager<E: Evictor> {
    resources: Arc<Mutex<ResourceManager>>,
    evictor: Arc<E>,
    settings: watch::Receiver<Arc<EvictionSettings>>,
    metrics: EvictionMetrics,
    status: Arc<EvictionStatus>,
    observer: Option<Arc<dyn PassObserver>>,
    state: PressureState,
    pressure: NodePressure,
    in_flight: HashMap<String, InFlight>,
    done: (mpsc::UnboundedSender<String>, mpsc::UnboundedReceiver<String>),
    warned_no_candidates: bool,
    /// The last pass that read everything (PSI too) and told the observer.
    last_full: Option<Instant>,
    /// The signals as last read (a memory-only pass updates memory.available alone).
    signals: BTreeMap<Signal, SignalObservation>,
    /// When each signal with a threshold is due to be read again.
    due: BTreeMap<Signal, Instant>,
    /// How fast each signal fell between its last reads.
    rates: Rates,
    /// `/proc/meminfo`, kept open, and the host paths, for polls that read on the loop's thread; `None` when it
    /// cannot be opened.
    inline: Option<(MeminfoReader, HostPaths)>,
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
pub fn grace_period(hard: bool, pod_grace_seconds: u64, max_pod_grace: Duration) -> Duration {
    if hard { HARD_EVICTION_GRACE } else { Duration::from_secs(pod_grace_seconds).min(max_pod_grace) }
}

fn resource_name(signal: Signal) -> &'static str {
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

/// The pod's ephemeral-storage request: the sum over app containers, or the largest init container's if larger.
fn ephemeral_request(pod: &Pod) -> u64 {
    let Some(spec) = pod.spec.as_ref() else { return 0 };
    let req = |c: &k8s_openapi::api::core::v1::Container| {
        c.resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("ephemeral-storage"))
            .and_then(|q| parse_non_negative(&q.0).ok())
            .unwrap_or(0)
    };
    let apps: u64 = spec.containers.iter().map(req).sum();
    let init = spec.init_containers.iter().flatten().map(req).max().unwrap_or(0);
    apps.max(init)
}

/// The pods that may be evicted for `signal`, with their usage; pods in `skip` (already being evicted) and pods
/// whose cgroup vanished meanwhile are left out. Reads files, so it runs off the async threads.
fn candidates<E: Evictor>(
    resources: &Mutex<ResourceManager>,
    evictor: &E,
    signal: Signal,
    skip: &HashSet<String>,
    static_critical: bool,
) -> Vec<Candidate> {
    let pods = evictor.pods();
    let usage: HashMap<String, (u64, u64)> = {
        let m = resources.lock().unwrap_or_else(PoisonError::into_inner);
        m.pod_usage().into_iter().map(|u| (u.uid, (u.memory_working_set, u.pids))).collect()
    };
    let disk = Condition::of(signal) == Condition::DiskPressure;
    pods.iter()
        .filter_map(|pod| {
            let uid = pod.metadata.uid.clone()?;
            if skip.contains(&uid) {
                return None;
            }
            let (memory_usage, pids) = *usage.get(&uid)?;
            let memory_request = PodResources::from_pod(pod).map(|r| r.memory_request()).unwrap_or(0);
            let grace = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds).unwrap_or(30);
            Some(Candidate {
                name: format!(
                    "{}/{}",
                    pod.metadata.namespace.as_deref().unwrap_or("default"),
                    pod.metadata.name.as_deref().unwrap_or_default()
                ),
                priority: pod_priority(pod),
                critical: is_critical(pod, static_critical),
                memory_request,
                memory_usage,
                disk_request: ephemeral_request(pod),
                disk_usage: if disk { evictor.disk_usage(&uid) } else { 0 },
                pids,
                grace_seconds: u64::try_from(grace).unwrap_or(0),
                uid,
            })
        })
        .collect()
}

impl<E: Evictor> EvictionManager<E> {
    /// A loop over the resource manager's observations, evicting through `evictor`.
    pub fn new(
        resources: Arc<Mutex<ResourceManager>>,
        evictor: Arc<E>,
        settings: watch::Receiver<Arc<EvictionSettings>>,
        metrics: EvictionMetrics,
        observer: Option<Arc<dyn PassObserver>>,
    ) -> Self {
        Self {
            resources,
            evictor,
            settings,
            metrics,
            status: Arc::new(EvictionStatus::default()),
            observer,
            state: PressureState::default(),
            pressure: NodePressure::default(),
            in_flight: HashMap::new(),
            done: mpsc::unbounded_channel(),
            warned_no_candidates: false,
            last_full: None,
            signals: BTreeMap::new(),
            due: BTreeMap::new(),
            rates: Rates::default(),
            inline: None,
        }
    }

    /// The state shared with the daemon.
    pub fn status(&self) -> Arc<EvictionStatus> {
        self.status.clone()
    }

    /// Runs until `drain` turns true. `wakeups` carries pressure events.
    pub async fn run(mut self, mut wakeups: mpsc::Receiver<Wake>, mut drain: watch::Receiver<bool>) {
        let mut next = Instant::now();
        let mut last = None::<Instant>;
        loop {
            let wake = tokio::select! {
                () = tokio::time::sleep_until(next) => Wake::Poll,
                Some(w) = wakeups.recv() => w,
                Ok(()) = self.settings.changed() => {
                    // `changed` marks the settings seen: make the pass a full one so the gauges follow at once.
                    self.last_full = None;
                    Wake::Config
                }
                Some(uid) = self.done.1.recv() => {
                    self.in_flight.remove(&uid);
                    Wake::Evicted
                }
                _ = drain.wait_for(|d| *d) => return,
            };
            self.metrics.wakeups.with_label_values(&[wake.as_str()]).inc();
            // Pressure events come in bursts (measured: with every daemon's triggers firing during a 100-pod start
            // in the VM, unthrottled passes starved pod sync): one pass per EVENT_INTERVAL answers a burst. The
            // poll itself is never held back.
            let earliest = last.map(|t: Instant| t + EVENT_INTERVAL);
            if wake != Wake::Poll && earliest.is_some_and(|e| e > Instant::now()) {
                next = next.min(earliest.unwrap_or(next));
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

    /// The signals a poll may read on the loop's thread, without the resources lock: those due now, when none
    /// of them needs the cgroup tree (allocatableMemory.available reads kubepods' `memory.stat`). `None` when the
    /// poll must read everything.
    fn inline_reads(&mut self, now: Instant) -> Option<Vec<Signal>> {
        if self.inline.is_none() && !self.signals.is_empty() {
            let host = self.resources.lock().unwrap_or_else(PoisonError::into_inner).host().clone();
            self.inline = MeminfoReader::open(&host)
                .inspect_err(|e| tracing::warn!(error = %e, "eviction polls read every signal"))
                .ok()
                .map(|r| (r, host));
        }
        self.inline.as_ref()?;
        let due: Vec<Signal> = self.due.iter().filter(|(_, at)| **at <= now).map(|(s, _)| *s).collect();
        let cached = due.iter().all(|s| self.signals.contains_key(s));
        (cached && !due.contains(&Signal::AllocatableMemoryAvailable)).then_some(due)
    }

    /// Reads `due` on this thread: memory.available with one `pread` of the open `/proc/meminfo`, the others
    /// with a `statvfs` or a read of `/proc/loadavg`. Returns what was read.
    fn read_inline(&mut self, due: &[Signal]) -> Result<Vec<Signal>, CgroupError> {
        let Some((meminfo, host)) = self.inline.as_mut() else { return Ok(Vec::new()) };
        let o = |available, capacity| SignalObservation { available, capacity };
        let mut read = Vec::new();
        if due.contains(&Signal::MemoryAvailable) {
            let m = meminfo.read()?;
            read.push((Signal::MemoryAvailable, o(m.available, m.capacity)));
        }
        if due.contains(&Signal::PidAvailable) {
            let p = pid_stats(host)?;
            read.push((Signal::PidAvailable, o(p.available, p.max)));
        }
        for (path, bytes, inodes) in [
            (&host.nodefs, Signal::NodeFsAvailable, Signal::NodeFsInodesFree),
            (&host.imagefs, Signal::ImageFsAvailable, Signal::ImageFsInodesFree),
        ] {
            if due.contains(&bytes) || due.contains(&inodes) {
                let f = fs_stats(path)?;
                read.push((bytes, o(f.available_bytes, f.capacity_bytes)));
                read.push((inodes, o(f.inodes_free, f.inodes)));
            }
        }
        let signals = read.iter().map(|(s, _)| *s).collect();
        self.signals.extend(read);
        Ok(signals)
    }

    /// Reads every signal (and, when `full`, the PSI averages for the observer) off the async threads: the lock
    /// may be held by a pod being placed, and the reads are file I/O.
    async fn read_all(&self, full: bool) -> Result<BTreeMap<Signal, SignalObservation>, String> {
        let (resources, observer) = (self.resources.clone(), self.observer.clone());
        tokio::task::spawn_blocking(move || {
            let start = Instant::now();
            let m = resources.lock().unwrap_or_else(PoisonError::into_inner);
            let obs = if full { m.observe() } else { m.observe_signals() };
            let read = obs.map(|obs| {
                let signals = signal_observations(&obs, m.allocatable());
                if let (true, Some(o)) = (full, &observer) {
                    o.observed(&m, &obs, &signals, start.elapsed());
                }
                signals
            });
            if let (Err(e), Some(o)) = (&read, &observer) {
                o.failed(e);
            }
            read.map_err(|e| e.to_string())
        })
        .await
        .unwrap_or_else(|e| Err(format!("the observation task failed: {e}")))
    }

    /// One pass for a wake-up; returns the time until the next poll. A poll reads only the signals due, on this
    /// thread and without the resources lock (memory.available is one `pread`); a full pass, a pass for any other
    /// wake-up, and a poll with allocatableMemory.available due read every signal off the async threads.
    async fn pass_on(&mut self, wake: Wake) -> Duration {
        // New settings show in the gauges at once.
        let reloaded = self.settings.has_changed().unwrap_or(false);
        let settings = self.settings.borrow_and_update().clone();
        let now = Instant::now();
        // A full observation (with PSI, for the observer's gauges) at most once per longest poll period; the
        // passes between read only what the signals need.
        let full = reloaded || self.last_full.is_none_or(|t| now.saturating_duration_since(t) >= settings.poll_max);
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
                if full {
                    self.last_full = Some(now);
                }
                match self.read_all(full).await {
                    Ok(s) => self.signals = s,
                    Err(e) => {
                        tracing::warn!(error = %e, "eviction pass cannot observe the node");
                        self.status.pass_failed(e);
                        self.due.clear();
                        return settings.poll_max;
                    }
                }
                self.signals.keys().copied().collect()
            }
        };
        let observed_at = Instant::now();
        for s in &read {
            if let Some(o) = self.signals.get(s) {
                self.rates.record(*s, observed_at, o.available);
            }
        }
        self.in_flight.retain(|_, f| f.until > observed_at);
        let evaluation =
            self.state.evaluate(observed_at, &settings.thresholds, &self.signals, settings.transition_period);
        // Evictions first: admission hears of the new conditions right after, off the path to SIGTERM.
        for breach in &evaluation.act {
            self.act(breach, observed_at, &settings).await;
        }
        self.set_pressure(evaluation.pressure).await;
        // Every breach acted on is settled: its victims are on their way, or there is nothing left to evict.
        let settled: Vec<Signal> = evaluation.act.iter().map(|b| b.threshold.signal).collect();
        let periods = signal_periods(&settings, &self.signals, &evaluation, &settled, |s| self.rates.planning(s));
        self.due.retain(|s, _| periods.contains_key(s));
        for (s, p) in &periods {
            if read.contains(s) || !self.due.contains_key(s) {
                self.due.insert(*s, observed_at + *p);
            }
        }
        let last_full = self.last_full.unwrap_or(observed_at);
        let next = self.due.values().copied().chain([last_full + settings.poll_max]).min().unwrap_or(observed_at);
        let period = next.saturating_duration_since(Instant::now()).max(settings.poll_min);
        tracing::debug!(
            wake = wake.as_str(),
            fast,
            full,
            memory_available = self.signals.get(&Signal::MemoryAvailable).map(|s| s.available),
            acted = evaluation.act.len(),
            took_us = u64::try_from(now.elapsed().as_micros()).unwrap_or(u64::MAX),
            period_us = u64::try_from(period.as_micros()).unwrap_or(u64::MAX),
            "eviction pass"
        );
        self.status.pass_done(Instant::now(), evaluation);
        period
    }

    async fn set_pressure(&mut self, p: NodePressure) {
        if p == self.pressure {
            return;
        }
        let (old, new) = (self.pressure.names(), p.names());
        tracing::info!(from = ?old, to = ?new, "node conditions changed");
        self.pressure = p;
        let resources = self.resources.clone();
        let set = move || resources.lock().unwrap_or_else(PoisonError::into_inner).set_pressure(p);
        if let Err(e) = tokio::task::spawn_blocking(set).await {
            tracing::error!(error = %e, "cannot pass the node conditions to admission");
        }
        for (c, on) in
            [(Condition::MemoryPressure, p.memory), (Condition::DiskPressure, p.disk), (Condition::PidPressure, p.pid)]
        {
            self.metrics.conditions.with_label_values(&[c.as_str()]).set(i64::from(on));
        }
    }

    async fn act(&mut self, breach: &Breach, observed_at: Instant, settings: &EvictionSettings) {
        let signal = breach.threshold.signal;
        let condition = Condition::of(signal);
        let pending: u64 = self.in_flight.values().filter(|f| f.condition == condition).map(|f| f.reclaims).sum();
        let any_pending = self.in_flight.values().any(|f| f.condition == condition);
        let needed = breach.deficit().saturating_sub(pending);
        if any_pending && needed == 0 {
            return;
        }
        let (resources, evictor) = (self.resources.clone(), self.evictor.clone());
        let skip: HashSet<String> = self.in_flight.keys().cloned().collect();
        let critical = settings.static_pods_critical;
        let found =
            tokio::task::spawn_blocking(move || candidates(&resources, evictor.as_ref(), signal, &skip, critical))
                .await
                .unwrap_or_default();
        let ranked = rank(signal, &found);
        if ranked.is_empty() {
            if !self.warned_no_candidates && !any_pending {
                tracing::warn!(%signal, observed = breach.observed, threshold = breach.value, "threshold crossed, but no pod can be evicted");
                self.warned_no_candidates = true;
            }
            return;
        }
        self.warned_no_candidates = false;
        let explained: Vec<Ranked> = ranked
            .iter()
            .take(10)
            .map(|c| {
                let (usage, request) = c.usage(signal);
                Ranked { pod: c.name.clone(), usage, request, priority: c.priority }
            })
            .collect();
        for victim in select(signal, &ranked, needed) {
            let grace = grace_period(breach.hard, victim.grace_seconds, settings.max_pod_grace_period);
            let message = eviction_message(breach, &victim);
            let reclaims = victim.reclaims(signal);
            tracing::warn!(
                pod = %victim.name,
                pod_uid = %victim.uid,
                %signal,
                hard = breach.hard,
                observed = breach.observed,
                threshold = breach.value,
                target = breach.target,
                reclaims,
                grace_seconds = grace.as_secs(),
                candidates = ?explained.iter().map(|r| format!("{} usage={} request={} priority={}", r.pod, r.usage, r.request, r.priority)).collect::<Vec<_>>(),
                "evicting pod"
            );
            self.metrics.evictions.with_label_values(&[signal.as_str()]).inc();
            self.metrics.stats_age.with_label_values(&[signal.as_str()]).observe(observed_at.elapsed().as_secs_f64());
            let id = self.status.record(EvictionRecord {
                time: jiff::Timestamp::now(),
                pod: victim.name.clone(),
                uid: victim.uid.clone(),
                signal,
                hard: breach.hard,
                observed: breach.observed,
                threshold: breach.value,
                target: breach.target,
                reclaims,
                grace_period_seconds: grace.as_secs(),
                message: message.clone(),
                candidates: explained.clone(),
                sigterm_latency_seconds: None,
                error: None,
                completed: false,
            });
            self.in_flight.insert(
                victim.uid.clone(),
                InFlight { condition, reclaims, until: Instant::now() + grace + Duration::from_secs(60) },
            );
            let evictor = self.evictor.clone();
            let status = self.status.clone();
            let latency = self.metrics.latency.with_label_values(&[signal.as_str()]);
            let done = self.done.0.clone();
            tokio::spawn(async move {
                match evictor.evict(&victim.uid, grace, message).await {
                    Ok(terminated) => {
                        let l = observed_at.elapsed().as_secs_f64();
                        latency.observe(l);
                        status.update(id, |r| r.sigterm_latency_seconds = Some(l));
                        let _ = terminated.await;
                        status.update(id, |r| r.completed = true);
                    }
                    Err(e) => {
                        tracing::warn!(pod = %victim.name, error = %e, "eviction failed");
                        status.update(id, |r| r.error = Some(e));
                    }
                }
                let _ = done.send(victim.uid);
            });
        }
    }
}

#[cfg(test)]
mod tests;
