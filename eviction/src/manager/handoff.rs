//! The hand-off of victims to the [`Evictor`]: a pass hands its victims over, waits until their SIGTERMs went out
//! and gives them a headstart, then logs, records and follows each eviction until its victim is over. Victims
//! still terminating count as in flight for their condition; one whose eviction failed is skipped for a back-off.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use nodewarden_resources::Condition;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::Service;
use super::evictor::{EvictError, Eviction, Evictor};
use crate::metrics::EvictionMetrics;
use crate::pressure::Breach;
use crate::rank::Candidate;
use crate::signal::Signal;
use crate::status::{EvictionRecord, EvictionStatus, Ranked};

/// How long a victim has to confirm SIGTERM beyond its grace period (preStop hooks run first) before the
/// eviction counts as failed and the victim is skipped.
pub const SIGTERM_SLACK: Duration = Duration::from_secs(5);

/// How long a pass waits for its victims' SIGTERMs to go out before it logs and records the evictions and tells
/// admission: long enough for a pod without preStop hooks, signalled at once by the evictor or by its worker; a pod
/// whose hooks run first is waited for in the background.
pub const SIGTERM_WAIT: Duration = Duration::from_millis(20);

/// How long the daemon keeps out of the way of the victims it has just signalled: their bookkeeping (the log lines,
/// the records, the pod worker's step) waits this long. A BestEffort victim's QoS cgroup has `cpu.weight` 1, so on a
/// busy node it runs its SIGTERM handler (and exits, freeing its memory) only when no task of the daemon wants the
/// CPU; in the VM the daemon's bookkeeping right after the signal held the victim off its CPU for 5 to 30 ms.
pub const VICTIM_HEADSTART: Duration = Duration::from_millis(10);

/// The first back-off of a victim whose eviction failed; it doubles on each failure up to [`MAX_VICTIM_BACKOFF`].
pub const VICTIM_BACKOFF: Duration = Duration::from_secs(10);

/// The longest a victim whose evictions keep failing is skipped.
pub const MAX_VICTIM_BACKOFF: Duration = Duration::from_secs(300);

/// How long past its grace period a victim counts as in flight at the most, should its end never be reported.
const IN_FLIGHT_SLACK: Duration = Duration::from_secs(60);

/// A breach's victims, handed over in a pass, with what their log lines and records need.
pub struct Handover {
    /// The breach they were chosen for.
    pub breach: Breach,
    /// The ten best-ranked candidates, to explain the choice.
    pub ranked: Vec<Candidate>,
    /// When the victims were chosen.
    pub decided: jiff::Timestamp,
    /// The observation's age when they were chosen.
    pub age: Duration,
    /// The victims, as [`Handoffs::hand_over`] handed them over.
    pub victims: Vec<Victim>,
}

/// One victim handed over.
pub struct Victim {
    candidate: Candidate,
    grace: Duration,
    message: String,
    reclaims: u64,
    requested: Result<Eviction, EvictError>,
    /// When SIGTERM went out, if it did within the pass's wait.
    early: Option<Result<Instant, oneshot::error::RecvError>>,
}

impl Victim {
    /// The victim's pod UID.
    pub fn uid(&self) -> &str {
        &self.candidate.uid
    }
}

/// A victim still terminating: what it will give back for its condition, until when at the most.
struct InFlight {
    condition: Condition,
    /// Its reclaim counts inodes (it was chosen for an `inodesFree` signal), not bytes or processes.
    inodes: bool,
    reclaims: u64,
    until: Instant,
}

/// A victim whose eviction failed: skipped until `until`.
struct Failed {
    until: Instant,
    backoff: Duration,
}

/// Why an eviction failed, in the words of its log line and record.
#[derive(Debug, thiserror::Error)]
enum Failure {
    /// The evictor could not hand it over.
    #[error(transparent)]
    Refused(EvictError),
    /// SIGTERM did not go out in time.
    #[error(transparent)]
    NotSignalled(NotSignalled),
}

/// SIGTERM did not go out within the victim's grace period and [`SIGTERM_SLACK`] (this long).
#[derive(Debug, thiserror::Error)]
#[error("SIGTERM was not sent within {}s", .0.as_secs())]
pub(crate) struct NotSignalled(Duration);

/// When SIGTERM went out to a victim given `grace`, waited for until the grace and [`SIGTERM_SLACK`] have passed;
/// now when there was nothing left to signal (the sender dropped unsent).
pub(crate) async fn sigterm_sent(
    signalled: oneshot::Receiver<Instant>,
    grace: Duration,
) -> Result<Instant, NotSignalled> {
    let within = grace + SIGTERM_SLACK;
    match tokio::time::timeout(within, signalled).await {
        Ok(at) => Ok(at.unwrap_or_else(|_| Instant::now())),
        Err(_) => Err(NotSignalled(within)),
    }
}

/// What an eviction task reports about its victim, by UID.
pub type Report = (String, Outcome);

/// How an eviction went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// SIGTERM was sent; the pod still counts as pending until it has terminated.
    Signalled,
    /// The pod has terminated.
    Terminated,
    /// The pod could not be evicted.
    Failed,
}

/// The victims handed over and what became of them: those in flight, those backing off after a failed eviction,
/// and the reports of the tasks that follow them.
pub struct Handoffs {
    in_flight: HashMap<String, InFlight>,
    failed: HashMap<String, Failed>,
    done: (mpsc::UnboundedSender<Report>, mpsc::UnboundedReceiver<Report>),
    /// A breach had no pod to evict, and that was said; until a victim is handed over again.
    warned_no_candidates: bool,
}

impl Default for Handoffs {
    fn default() -> Self {
        Self {
            in_flight: HashMap::new(),
            failed: HashMap::new(),
            done: mpsc::unbounded_channel(),
            warned_no_candidates: false,
        }
    }
}

impl Handoffs {
    /// What the victims in flight for `signal`'s condition, counted in its unit (inodes apart from bytes), will
    /// give back; `None` while there are none.
    pub fn pending(&self, signal: Signal) -> Option<u64> {
        self.in_flight
            .values()
            .filter(|f| f.condition == signal.condition() && f.inodes == signal.counts_inodes())
            .fold(None, |sum, f| Some(f.reclaims.saturating_add(sum.unwrap_or(0))))
    }

    /// Stops counting the victims whose end was not reported by `now` (their grace period and a minute).
    pub fn expire(&mut self, now: Instant) {
        self.in_flight.retain(|_, f| f.until > now);
    }

    /// The pods not to choose at `now`: those in flight, and those backing off after a failed eviction. A failure
    /// is remembered (so the next back-off is longer) until it has been over for the longest back-off.
    pub fn skip(&mut self, now: Instant) -> HashSet<String> {
        self.failed.retain(|_, f| f.until + MAX_VICTIM_BACKOFF > now);
        let backing_off = self.failed.iter().filter(|(_, f)| f.until > now).map(|(uid, _)| uid);
        self.in_flight.keys().chain(backing_off).cloned().collect()
    }

    /// Whether to say that a breach of `condition` has no pod to evict: the first time since a victim was handed
    /// over, and only while none is in flight for it.
    pub fn first_without_candidates(&mut self, condition: Condition) -> bool {
        let first = !self.warned_no_candidates && !self.in_flight.values().any(|f| f.condition == condition);
        self.warned_no_candidates |= first;
        first
    }

    /// Hands `victim` over for an eviction for `signal` (SIGTERM goes out now, or from its worker) and counts it as
    /// in flight.
    pub fn hand_over<E: Evictor>(
        &mut self,
        evictor: &E,
        victim: Candidate,
        signal: Signal,
        grace: Duration,
        message: String,
    ) -> Victim {
        self.warned_no_candidates = false;
        let requested = evictor.evict(&victim.uid, grace, message.clone());
        if requested.is_ok() {
            evictor.threshold_met(super::resource_name(signal));
        }
        let reclaims = victim.reclaims(signal);
        let until = Instant::now() + grace + IN_FLIGHT_SLACK;
        let flight = InFlight { condition: signal.condition(), inodes: signal.counts_inodes(), reclaims, until };
        self.in_flight.insert(victim.uid.clone(), flight);
        Victim { candidate: victim, grace, message, reclaims, requested, early: None }
    }

    /// The next report of an eviction task.
    pub async fn report(&mut self) -> Option<Report> {
        self.done.1.recv().await
    }

    /// A report already sent, if any.
    #[cfg(test)]
    pub fn try_report(&mut self) -> Option<Report> {
        self.done.1.try_recv().ok()
    }

    /// News from an eviction task at `now`: a victim that has terminated no longer counts as pending (its condition
    /// is returned: what its signals said is out of date); one that could not be evicted is skipped, with a
    /// back-off, so that the next candidate is taken.
    pub fn finished(&mut self, uid: String, outcome: Outcome, now: Instant) -> Option<Condition> {
        match outcome {
            Outcome::Signalled => {
                self.failed.remove(&uid);
                None
            }
            Outcome::Terminated => self.in_flight.remove(&uid).map(|f| f.condition),
            Outcome::Failed => {
                self.in_flight.remove(&uid);
                let backoff = self.failed.get(&uid).map_or(VICTIM_BACKOFF, |f| (f.backoff * 2).min(MAX_VICTIM_BACKOFF));
                tracing::warn!(pod_uid = %uid, backoff_seconds = backoff.as_secs(), "skipping a pod that could not be evicted");
                self.failed.insert(uid, Failed { until: now + backoff, backoff });
                None
            }
        }
    }

    /// The back-off of a victim whose eviction failed.
    #[cfg(test)]
    pub fn backoff(&self, uid: &str) -> Option<Duration> {
        self.failed.get(uid).map(|f| f.backoff)
    }

    /// Stops counting `uid` as in flight, as if its end had been reported.
    #[cfg(test)]
    pub fn forget(&mut self, uid: &str) {
        self.in_flight.remove(uid);
    }

    /// Logs and records the evictions of one breach, and follows each until its victim is over (or the eviction
    /// failed) in a task on the daemon's tracker, which reports to [`Handoffs::report`].
    pub fn follow(
        &self,
        handover: Handover,
        observed_at: Instant,
        metrics: &EvictionMetrics,
        status: &Arc<EvictionStatus>,
        service: &Service,
    ) {
        let Handover { breach, ranked, decided, age, victims } = handover;
        let breach = &breach;
        let signal = breach.threshold.signal;
        let explained: Vec<Ranked> = ranked
            .iter()
            .map(|c| {
                let (usage, request) = c.usage(signal);
                Ranked { pod: c.name.clone(), usage, request, priority: c.priority }
            })
            .collect();
        for Victim { candidate: victim, grace, message, reclaims, requested, early } in victims {
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
            metrics.evictions.with_label_values(&[signal.as_str()]).inc();
            metrics.stats_age.with_label_values(&[signal.as_str()]).observe(age.as_secs_f64());
            let id = status.record(EvictionRecord {
                time: decided,
                pod: victim.name.clone(),
                uid: victim.uid.clone(),
                signal: signal.as_str(),
                hard: breach.hard,
                observed: breach.observed,
                threshold: breach.value,
                target: breach.target,
                reclaims,
                grace_period_seconds: grace.as_secs(),
                message,
                candidates: explained.clone(),
                sigterm_latency_seconds: None,
                error: None,
                completed: false,
            });
            let status = status.clone();
            let latency = metrics.latency.with_label_values(&[signal.as_str()]);
            let done = self.done.0.clone();
            let stop = service.stop.clone();
            // A shutdown abandons the wait; the pod's worker carries on with the termination until it stops too.
            service.tasks.spawn(async move {
                stop.run_until_cancelled(async move {
                    let result = match requested {
                        Ok(eviction) => {
                            let signalled = match early {
                                Some(at) => Ok(at.unwrap_or_else(|_| Instant::now())),
                                None => sigterm_sent(eviction.signalled, grace).await.map_err(Failure::NotSignalled),
                            };
                            signalled.map(|at| (at, eviction.terminated))
                        }
                        Err(e) => Err(Failure::Refused(e)),
                    };
                    let outcome = match result {
                        Ok((signalled_at, terminated)) => {
                            let l = signalled_at.saturating_duration_since(observed_at).as_secs_f64();
                            latency.observe(l);
                            status.update(id, |r| r.sigterm_latency_seconds = Some(l));
                            let _ = done.send((victim.uid.clone(), Outcome::Signalled));
                            let _ = terminated.await;
                            status.update(id, |r| r.completed = true);
                            Outcome::Terminated
                        }
                        Err(e) => {
                            tracing::warn!(pod = %victim.name, error = %e, "eviction failed");
                            status.update(id, |r| r.error = Some(e.to_string()));
                            Outcome::Failed
                        }
                    };
                    let _ = done.send((victim.uid, outcome));
                })
                .await;
            });
        }
    }
}

/// Waits until the victims handed over in a pass were signalled (at most until [`SIGTERM_WAIT`] from now), then
/// gives those signalled [`VICTIM_HEADSTART`] (once for the pass).
pub async fn wait_signalled(handovers: &mut [Handover]) {
    let signal_by = Instant::now() + SIGTERM_WAIT;
    let mut signalled = false;
    for v in handovers.iter_mut().flat_map(|h| h.victims.iter_mut()) {
        if let Ok(e) = &mut v.requested {
            v.early = tokio::time::timeout_at(signal_by, &mut e.signalled).await.ok();
            signalled |= matches!(v.early, Some(Ok(_)));
        }
    }
    if signalled {
        tokio::time::sleep(VICTIM_HEADSTART).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use nodewarden_resources::Amount;
    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;

    use super::*;
    use crate::threshold::Threshold;

    const MS: Duration = Duration::from_millis(1);
    const MIB: u64 = 1 << 20;
    const MEMORY: Condition = Condition::MemoryPressure;

    /// The two ends of an eviction the test confirms: SIGTERM sent, the pod terminated.
    type Confirm = (oneshot::Sender<Instant>, oneshot::Sender<()>);

    /// Refuses the pods in `refuse` as unknown; keeps the confirmations of the others for the test to send.
    #[derive(Default)]
    struct Stub {
        refuse: Vec<&'static str>,
        confirm: Mutex<HashMap<String, Confirm>>,
    }

    impl Evictor for Stub {
        fn disk_usage(&self, _: &str, _: Signal) -> u64 {
            0
        }

        fn reclaim_disk(&self, _: Signal) -> crate::Reclaimed {
            crate::Reclaimed::Nothing
        }

        fn threshold_met(&self, _: &'static str) {}

        fn evict(&self, uid: &str, _: Duration, _: String) -> Result<Eviction, EvictError> {
            if self.refuse.contains(&uid) {
                return Err(EvictError::UnknownPod(uid.into()));
            }
            let (signal_tx, signalled) = oneshot::channel();
            let (terminate_tx, terminated) = oneshot::channel();
            self.confirm.lock().unwrap().insert(uid.into(), (signal_tx, terminate_tx));
            Ok(Eviction { signalled, terminated })
        }
    }

    impl Stub {
        fn confirm(&self, uid: &str) -> Confirm {
            self.confirm.lock().unwrap().remove(uid).unwrap()
        }
    }

    /// Hands the pods over for memory.available, with a grace of 1 s.
    fn hand_over(h: &mut Handoffs, stub: &Stub, uids: &[&str]) -> Handover {
        let victims = uids
            .iter()
            .map(|uid| {
                h.hand_over(
                    stub,
                    Candidate::best_effort(uid, 100 * MIB),
                    Signal::MemoryAvailable,
                    Duration::from_secs(1),
                    format!("{uid} goes"),
                )
            })
            .collect();
        let threshold = Threshold {
            signal: Signal::MemoryAvailable,
            amount: Amount::Quantity(100 * MIB),
            grace_period: Duration::ZERO,
            min_reclaim: None,
        };
        let breach = Breach {
            threshold,
            hard: true,
            observed: 90 * MIB,
            value: 100 * MIB,
            target: 100 * MIB,
            met_for: Duration::ZERO,
        };
        Handover { breach, ranked: Vec::new(), decided: jiff::Timestamp::now(), age: Duration::ZERO, victims }
    }

    fn sorted(skip: HashSet<String>) -> Vec<String> {
        let mut v: Vec<String> = skip.into_iter().collect();
        v.sort();
        v
    }

    fn reports(h: &mut Handoffs) -> Vec<Report> {
        std::iter::from_fn(|| h.try_report()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn victims_count_for_their_condition_until_they_end_or_expire() {
        let (mut h, stub) = (Handoffs::default(), Stub::default());
        let t = Instant::now();
        let memory = Signal::MemoryAvailable;
        assert_eq!(h.pending(memory), None);
        for (uid, memory, signal, grace) in
            [("a", 300, Signal::MemoryAvailable, 1), ("b", 200, Signal::AllocatableMemoryAvailable, 30)]
        {
            let victim = Candidate::best_effort(uid, memory * MIB);
            h.hand_over(&stub, victim, signal, Duration::from_secs(grace), String::new());
        }
        assert_eq!(h.pending(memory), Some(500 * MIB), "the two memory signals share their victims");
        assert_eq!(h.pending(Signal::PidAvailable), None);
        assert_eq!(sorted(h.skip(t)), ["a", "b"]);
        assert_eq!(h.finished("a".into(), Outcome::Signalled, t), None, "still terminating");
        assert_eq!(h.pending(memory), Some(500 * MIB));
        assert_eq!(h.finished("a".into(), Outcome::Terminated, t), Some(MEMORY));
        assert_eq!(h.pending(memory), Some(200 * MIB));
        assert_eq!(h.finished("a".into(), Outcome::Terminated, t), None, "its end settles the condition once");
        // b's end is never reported: it stops counting a minute past its grace period.
        h.expire(t + Duration::from_secs(90) - MS);
        assert_eq!(h.pending(memory), Some(200 * MIB));
        h.expire(t + Duration::from_secs(90));
        assert_eq!(h.pending(memory), None);
        assert!(h.skip(t).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_victim_for_inodes_counts_against_inodes_not_bytes() {
        let (mut h, stub) = (Handoffs::default(), Stub::default());
        let victim = Candidate { disk_usage: 5_000, ..Candidate::best_effort("files", 0) };
        h.hand_over(&stub, victim, Signal::NodeFsInodesFree, Duration::from_secs(1), String::new());
        assert_eq!(h.pending(Signal::NodeFsInodesFree), Some(5_000));
        assert_eq!(h.pending(Signal::ImageFsInodesFree), Some(5_000), "inodes, whichever file system");
        assert_eq!(h.pending(Signal::NodeFsAvailable), None, "5000 inodes are not 5000 bytes");
    }

    #[tokio::test(start_paused = true)]
    async fn a_victim_that_could_not_be_evicted_backs_off_longer_each_time() {
        let mut h = Handoffs::default();
        let t = Instant::now();
        assert_eq!(h.finished("x".into(), Outcome::Failed, t), None);
        assert_eq!(h.backoff("x"), Some(VICTIM_BACKOFF));
        assert_eq!(sorted(h.skip(t + VICTIM_BACKOFF - MS)), ["x"]);
        assert!(h.skip(t + VICTIM_BACKOFF).is_empty(), "a candidate again once its back-off is over");
        let (mut at, mut expected) = (t + VICTIM_BACKOFF, VICTIM_BACKOFF);
        for _ in 0..6 {
            h.finished("x".into(), Outcome::Failed, at);
            expected = (expected * 2).min(MAX_VICTIM_BACKOFF);
            assert_eq!(h.backoff("x"), Some(expected));
            at += expected;
        }
        assert_eq!(expected, MAX_VICTIM_BACKOFF, "doubled up to the longest");
        // A SIGTERM that went out forgets the failures.
        h.finished("x".into(), Outcome::Signalled, at);
        assert_eq!(h.backoff("x"), None);
        // A failure is remembered until it has been over for the longest back-off.
        h.finished("y".into(), Outcome::Failed, t);
        h.skip(t + VICTIM_BACKOFF + MAX_VICTIM_BACKOFF - MS);
        assert_eq!(h.backoff("y"), Some(VICTIM_BACKOFF));
        h.skip(t + VICTIM_BACKOFF + MAX_VICTIM_BACKOFF);
        assert_eq!(h.backoff("y"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn no_pod_to_evict_is_said_once_until_a_victim_is_handed_over() {
        let (mut h, stub) = (Handoffs::default(), Stub::default());
        assert!(h.first_without_candidates(MEMORY));
        assert!(!h.first_without_candidates(MEMORY));
        assert!(!h.first_without_candidates(Condition::PidPressure));
        hand_over(&mut h, &stub, &["a"]);
        assert!(!h.first_without_candidates(MEMORY), "a victim is on its way");
        assert!(h.first_without_candidates(Condition::PidPressure));
        assert!(!h.first_without_candidates(Condition::PidPressure));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_waits_for_its_victims_sigterms_then_gives_one_headstart() {
        let (mut h, stub) = (Handoffs::default(), Stub { refuse: vec!["refused"], ..Stub::default() });
        // One signalled at once, one never, one refused: the wait runs out, then the headstart.
        let mut handovers =
            [hand_over(&mut h, &stub, &["quick", "slow", "refused"]), hand_over(&mut h, &stub, &["other"])];
        let (quick, _quick_end) = stub.confirm("quick");
        quick.send(Instant::now()).unwrap();
        let (_slow, _slow_end) = stub.confirm("slow");
        let (other, _other_end) = stub.confirm("other");
        other.send(Instant::now()).unwrap();
        let start = Instant::now();
        wait_signalled(&mut handovers).await;
        assert_eq!(start.elapsed(), SIGTERM_WAIT + VICTIM_HEADSTART, "one wait and one headstart for the pass");
        // Nobody signalled (nothing to signal, or not yet): no headstart.
        let mut handovers = [hand_over(&mut h, &stub, &["empty", "late"])];
        drop(stub.confirm("empty"));
        let (_late, _late_end) = stub.confirm("late");
        let start = Instant::now();
        wait_signalled(&mut handovers).await;
        assert_eq!(start.elapsed(), SIGTERM_WAIT);
        // Everyone signalled: no wait but the headstart.
        let mut handovers = [hand_over(&mut h, &stub, &["at-once"])];
        let (at_once, _at_once_end) = stub.confirm("at-once");
        at_once.send(Instant::now()).unwrap();
        let start = Instant::now();
        wait_signalled(&mut handovers).await;
        assert_eq!(start.elapsed(), VICTIM_HEADSTART);
    }

    #[tokio::test(start_paused = true)]
    async fn a_followed_eviction_is_recorded_and_reported_until_its_victim_is_over() {
        let (mut h, stub) = (Handoffs::default(), Stub { refuse: vec!["unknown"], ..Stub::default() });
        let status = Arc::new(EvictionStatus::default());
        let metrics = EvictionMetrics::new(&prometheus::Registry::new()).unwrap();
        let service = Service { tasks: TaskTracker::new(), stop: CancellationToken::new() };
        let observed_at = Instant::now();
        let handover = hand_over(&mut h, &stub, &["ok", "unknown", "hung"]);
        let (ok, ok_end) = stub.confirm("ok");
        let (_hung, _hung_end) = stub.confirm("hung");
        tokio::time::advance(5 * MS).await;
        ok.send(Instant::now()).unwrap();
        h.follow(handover, observed_at, &metrics, &status, &service);
        let settle = || async {
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        };
        settle().await;
        let record = |uid: &str| status.history().into_iter().find(|r| r.uid == uid).unwrap();
        assert_eq!(status.history().len(), 3);
        assert_eq!(metrics.evictions.with_label_values(&["memory.available"]).get(), 3);
        assert_eq!(record("unknown").error.as_deref(), Some("pod unknown is not known"));
        assert_eq!(record("ok").sigterm_latency_seconds, Some(0.005));
        assert!(!record("ok").completed);
        assert_eq!(record("ok").message, "ok goes");
        assert_eq!(reports(&mut h), [("ok".into(), Outcome::Signalled), ("unknown".into(), Outcome::Failed)]);
        ok_end.send(()).unwrap();
        settle().await;
        assert!(record("ok").completed);
        assert_eq!(reports(&mut h), [("ok".into(), Outcome::Terminated)]);
        // A SIGTERM never confirmed fails the eviction after the grace period and the slack.
        tokio::time::advance(Duration::from_secs(1) + SIGTERM_SLACK).await;
        settle().await;
        assert_eq!(record("hung").error.as_deref(), Some("SIGTERM was not sent within 6s"));
        assert_eq!(reports(&mut h), [("hung".into(), Outcome::Failed)]);
        service.tasks.close();
        service.tasks.wait().await;
    }
}
