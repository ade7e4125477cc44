//! When the loop looks again: each signal has its own next read, from its headroom and how fast it may fall.
//!
//! A signal above all its thresholds is read again before it could have crossed, assuming it falls at the faster
//! of a fixed worst case ([`drain_rate`]) and twice what it was just seen to fall at; so the period shrinks
//! geometrically on a ramp and reaches the shortest period only in the last moment before the crossing. A
//! threshold met and acted on (victims on their way, a reclaim or a fresh reading awaited) is looked at every
//! [`SETTLE_POLL`]; one with nothing to do (no pod can be evicted, or the pods' disk usage is being measured, whose
//! end wakes the loop) at the longest period; a soft threshold waiting out its grace period, when the grace runs
//! out. [`Schedule`] keeps
//! these deadlines from one pass to the next, with what tells whether a condition's reading is out of date.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use nodewarden_resources::Condition;
use tokio::time::Instant;

use super::EvictionSettings;
use crate::observe::SignalObservation;
use crate::pressure::Evaluation;
use crate::signal::Signal;

/// The period while a met threshold has been acted on: the victims are terminating (or there is nothing left
/// to evict), so there is nothing to decide faster than this.
pub const SETTLE_POLL: Duration = Duration::from_millis(10);

/// The fastest a signal is assumed to fall (per second), to decide the next poll: a hog allocating 1 GiB/s, a
/// writer at 256 MiB/s, 5000 files or 2000 processes created per second.
pub fn drain_rate(signal: Signal) -> f64 {
    match signal {
        Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => 1024.0 * 1024.0 * 1024.0,
        Signal::NodeFsAvailable | Signal::ImageFsAvailable => 256.0 * 1024.0 * 1024.0,
        Signal::NodeFsInodesFree | Signal::ImageFsInodesFree => 5000.0,
        Signal::PidAvailable => 2000.0,
    }
}

/// The shortest span a fall is measured over. The kernel moves its counters in steps (`MemAvailable` by a few MiB
/// at a time), so two reads a millisecond apart on a steady ramp often show no fall at all; measured against a read
/// at least this much older, the ramp shows.
pub const RATE_SPAN: Duration = Duration::from_millis(50);

/// How fast each signal fell over its last [`RATE_SPAN`] of reads (per second; 0 when it rose or held).
#[derive(Debug, Default)]
pub struct Rates {
    /// Per signal, the reads since the last rise, of the last [`RATE_SPAN`] and the newest one before them,
    /// oldest first: the fall is measured from the first to the last.
    reads: BTreeMap<Signal, VecDeque<(Instant, u64)>>,
}

impl Rates {
    /// Records a read of `signal` at `at`.
    pub fn record(&mut self, signal: Signal, at: Instant, available: u64) {
        let reads = self.reads.entry(signal).or_default();
        // A rise (memory freed) starts the window again: a fall after it is measured from it.
        if reads.back().is_some_and(|(_, v)| *v < available) {
            reads.clear();
        }
        // The newest read at least RATE_SPAN old stays as the base to measure from.
        while reads.get(1).is_some_and(|(t, _)| at.saturating_duration_since(*t) >= RATE_SPAN) {
            reads.pop_front();
        }
        reads.push_back((at, available));
    }

    /// When `signal` was last read.
    pub fn last_read(&self, signal: Signal) -> Option<Instant> {
        self.reads.get(&signal).and_then(|r| r.back()).map(|(t, _)| *t)
    }

    /// How fast `signal` fell from the window's first read to its last (per second; 0 with fewer than two reads
    /// apart in time).
    fn rate(&self, signal: Signal) -> f64 {
        let Some((Some((t0, v0)), Some((t1, v1)))) = self.reads.get(&signal).map(|r| (r.front(), r.back())) else {
            return 0.0;
        };
        let dt = t1.saturating_duration_since(*t0).as_secs_f64();
        let fell = v0.saturating_sub(*v1) as f64;
        if dt > 0.0 { fell / dt } else { 0.0 }
    }

    /// Whether `signal` was just seen falling at least an eighth of its worst case (128 MiB/s for memory): a ramp
    /// toward a crossing, not a node holding steady near a threshold.
    pub fn falling_fast(&self, signal: Signal) -> bool {
        self.rate(signal) >= drain_rate(signal) / 8.0
    }

    /// The rate to plan with: the worst case, or twice the observed fall when that is faster.
    pub fn planning(&self, signal: Signal) -> f64 {
        drain_rate(signal).max(2.0 * self.rate(signal))
    }
}

/// The period until each signal with a threshold should be read again, within the settings' bounds.
/// `acted` holds the signals whose met thresholds were acted on in this pass: settled ones (looked at again
/// [`SETTLE_POLL`] after it), then idle ones (nothing to do until something else changes: the longest period);
/// `rate` gives the fall to plan with.
pub fn signal_periods(
    settings: &EvictionSettings,
    signals: &BTreeMap<Signal, SignalObservation>,
    evaluation: &Evaluation,
    (settled, idle): (&[Signal], &[Signal]),
    rate: impl Fn(Signal) -> f64,
) -> BTreeMap<Signal, Duration> {
    let (lo, hi) = (settings.poll_min, settings.poll_max.max(settings.poll_min));
    let mut out: BTreeMap<Signal, Duration> = BTreeMap::new();
    let t = &settings.thresholds;
    for (th, hard) in t.hard.iter().map(|x| (x, true)).chain(t.soft.iter().map(|x| (x, false))) {
        let period = if let Some(b) = evaluation.met.iter().find(|b| b.threshold.signal == th.signal && b.hard == hard)
        {
            let waiting = th.grace_period.saturating_sub(b.met_for);
            match waiting.is_zero() {
                true if settled.contains(&th.signal) => SETTLE_POLL.max(lo),
                true if idle.contains(&th.signal) => hi,
                _ => waiting,
            }
        } else {
            let Some(obs) = signals.get(&th.signal) else { continue };
            let headroom = obs.available.saturating_sub(th.amount.resolve(obs.capacity)) as f64;
            Duration::from_secs_f64(headroom / rate(th.signal))
        };
        let period = period.clamp(lo, hi);
        out.entry(th.signal).and_modify(|p| *p = (*p).min(period)).or_insert(period);
    }
    out
}

/// How long until the next pass: headroom / drain rate for each threshold not met, the rest of the grace period
/// for soft thresholds waiting, the shortest period while a threshold acts; within the bounds.
pub fn next_poll(
    settings: &EvictionSettings,
    signals: &BTreeMap<Signal, SignalObservation>,
    evaluation: &Evaluation,
) -> Duration {
    signal_periods(settings, signals, evaluation, (&[], &[]), drain_rate)
        .into_values()
        .min()
        .unwrap_or(settings.poll_max)
        .max(settings.poll_min)
}

/// When each signal is read next, and whether what a condition's signals said is out of date: the loop's
/// bookkeeping from one pass to the next.
#[derive(Debug, Default)]
pub struct Schedule {
    /// When each signal with a threshold is due to be read again.
    due: BTreeMap<Signal, Instant>,
    /// How fast each signal fell between its last reads.
    rates: Rates,
    /// The last pass that read everything (PSI too) and told the observer.
    last_full: Option<Instant>,
    /// Passes so far, the pass each signal was last read in, and the pass after which what a condition's signals
    /// said is out of date (a victim ended, or dead pods' logs were reclaimed): no eviction for that condition
    /// until they are read again, so one deficit never costs a second pod on a reading from before the first
    /// was reclaimed (as the kubelet waits for its victim's clean-up).
    passes: u64,
    read_in: BTreeMap<Signal, u64>,
    settled_in: HashMap<Condition, u64>,
}

impl Schedule {
    /// How fast each signal fell between its last reads.
    pub fn rates(&self) -> &Rates {
        &self.rates
    }

    /// Whether a pass at `now` reads every signal and tells the observer: the first pass, one that applies new
    /// settings (`reloaded`, or after [`Schedule::reload`]), and one `poll_max` or more after the last that did.
    /// Such a pass counts from `now`.
    pub fn full_pass(&mut self, now: Instant, poll_max: Duration, reloaded: bool) -> bool {
        let full = reloaded || self.last_full.is_none_or(|t| now.saturating_duration_since(t) >= poll_max);
        if full {
            self.last_full = Some(now);
        }
        full
    }

    /// The settings changed: the next pass reads every signal.
    pub fn reload(&mut self) {
        self.last_full = None;
    }

    /// The signals due at `now`. The two memory signals usually fall together (pods take the memory):
    /// allocatableMemory.available due brings memory.available along (one `pread`), and memory.available due
    /// brings allocatableMemory.available along once it is past half its period, so that their polls stay in step
    /// without kubepods' `memory.stat` read on every poll of memory falling alone.
    pub fn due(&self, now: Instant) -> Vec<Signal> {
        let mut due: Vec<Signal> = self.due.iter().filter(|(_, at)| **at <= now).map(|(s, _)| *s).collect();
        let (memory, allocatable) = (Signal::MemoryAvailable, Signal::AllocatableMemoryAvailable);
        let soon = |s: Signal| {
            self.due.get(&s).is_some_and(|at| self.rates.last_read(s).is_none_or(|last| now - last >= (*at - last) / 2))
        };
        if due.contains(&allocatable) && !due.contains(&memory) && self.due.contains_key(&memory) {
            due.push(memory);
        } else if due.contains(&memory) && !due.contains(&allocatable) && soon(allocatable) {
            due.push(allocatable);
        }
        due
    }

    /// A pass read the signals `read` (their values in `signals`), observed at `at`.
    pub fn read(&mut self, read: &[Signal], signals: &BTreeMap<Signal, SignalObservation>, at: Instant) {
        self.passes += 1;
        for s in read {
            self.read_in.insert(*s, self.passes);
            if let Some(o) = signals.get(s) {
                self.rates.record(*s, at, o.available);
            }
        }
    }

    /// Whether `signal` has not been read since what its condition's signals said went out of date
    /// ([`Schedule::settled`]): no eviction on it until it has.
    pub fn stale(&self, signal: Signal) -> bool {
        self.settled_in.get(&signal.condition()).is_some_and(|p| self.read_in.get(&signal).is_none_or(|r| r <= p))
    }

    /// What `condition`'s signals said before now is out of date: they are due at `now`, and stale until a later
    /// pass reads them.
    pub fn settled(&mut self, condition: Condition, now: Instant) {
        self.settled_in.insert(condition, self.passes);
        for (s, at) in &mut self.due {
            if s.condition() == condition {
                *at = now;
            }
        }
    }

    /// Forgets when each signal is due (the node could not be observed); the next pass plans them all afresh.
    pub fn clear(&mut self) {
        self.due.clear();
    }

    /// Plans the next reads after a pass that read `read`, observed at `observed_at` and ended at `ended`, given
    /// each signal's period (signals without one are no longer due). A signal read, or not yet planned, is due its
    /// period after the observation; one in `settled` (a met threshold acted on, whose victims' headstart the pass
    /// may have waited out), its period after the pass ended. The others keep their deadlines. Returns when the
    /// next pass is due: the first deadline, and at the latest `poll_max` after the last full pass.
    pub fn plan(
        &mut self,
        periods: &BTreeMap<Signal, Duration>,
        read: &[Signal],
        settled: &[Signal],
        observed_at: Instant,
        ended: Instant,
        poll_max: Duration,
    ) -> Instant {
        self.due.retain(|s, _| periods.contains_key(s));
        for (s, p) in periods {
            if read.contains(s) || !self.due.contains_key(s) {
                let from = if settled.contains(s) { ended } else { observed_at };
                self.due.insert(*s, from + *p);
            }
        }
        let last_full = self.last_full.unwrap_or(observed_at);
        self.due.values().copied().chain([last_full + poll_max]).min().unwrap_or(observed_at)
    }

    /// Makes `signal` due at `at`, as if planned so.
    #[cfg(test)]
    pub fn set_due(&mut self, signal: Signal, at: Instant) {
        self.due.insert(signal, at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const MIB: u64 = 1 << 20;
    const MEMORY: Signal = Signal::MemoryAvailable;
    const ALLOCATABLE: Signal = Signal::AllocatableMemoryAvailable;
    const NODEFS: Signal = Signal::NodeFsAvailable;
    const PIDS: Signal = Signal::PidAvailable;

    /// Every signal in `read` observed with `available`.
    fn observed(read: &[Signal], available: u64) -> BTreeMap<Signal, SignalObservation> {
        read.iter().map(|s| (*s, SignalObservation { available, capacity: 1 << 30 })).collect()
    }

    /// A pass that reads `read` at `at` and plans them with `periods` (in milliseconds).
    fn pass(s: &mut Schedule, read: &[Signal], at: Instant, periods: &[(Signal, u64)]) -> Instant {
        s.read(read, &observed(read, 512 * MIB), at);
        let periods = periods.iter().map(|(s, ms)| (*s, MS * u32::try_from(*ms).unwrap())).collect();
        s.plan(&periods, read, &[], at, at, Duration::from_secs(1))
    }

    #[tokio::test(start_paused = true)]
    async fn every_signal_is_read_at_the_first_pass_after_a_reload_and_every_poll_max() {
        let mut s = Schedule::default();
        let (t, max) = (Instant::now(), Duration::from_secs(1));
        assert!(s.full_pass(t, max, false), "the first pass");
        assert!(!s.full_pass(t + 999 * MS, max, false));
        assert!(s.full_pass(t + 1000 * MS, max, false), "poll_max after the last");
        assert!(!s.full_pass(t + 1001 * MS, max, false), "counted from the last full pass");
        assert!(s.full_pass(t + 1002 * MS, max, true), "a pass that applies new settings");
        s.reload();
        assert!(s.full_pass(t + 1003 * MS, max, false), "after the loop saw new settings");
    }

    #[tokio::test(start_paused = true)]
    async fn each_signal_keeps_its_own_deadline_and_the_next_pass_is_the_first_of_them() {
        let mut s = Schedule::default();
        let t = Instant::now();
        assert!(s.full_pass(t, Duration::from_secs(1), false));
        let next = pass(&mut s, &[MEMORY, NODEFS, PIDS], t, &[(MEMORY, 300), (NODEFS, 800), (PIDS, 500)]);
        assert_eq!(next, t + 300 * MS);
        assert_eq!(s.due(t + 299 * MS), []);
        assert_eq!(s.due(t + 300 * MS), [MEMORY]);
        // A poll reads memory alone; its threshold met and acted on, it is planned from the end of the pass. PIDs,
        // not read, keep their deadline though their period is now shorter; nodefs has no threshold left.
        let t1 = t + 300 * MS;
        s.read(&[MEMORY], &observed(&[MEMORY], 90 * MIB), t1);
        let periods = BTreeMap::from([(MEMORY, 10 * MS), (PIDS, 100 * MS)]);
        let next = s.plan(&periods, &[MEMORY], &[MEMORY], t1, t1 + 20 * MS, Duration::from_secs(1));
        assert_eq!(next, t1 + 30 * MS, "from the end of the pass, not the observation");
        assert_eq!(s.due(t + 499 * MS), [MEMORY]);
        assert_eq!(s.due(t + 500 * MS), [MEMORY, PIDS]);
        assert_eq!(s.due(t + 10_000 * MS), [MEMORY, PIDS], "nodefs is no longer due");
        // With nothing due sooner, the next pass is poll_max after the last full one.
        let mut idle = Schedule::default();
        assert!(idle.full_pass(t, Duration::from_secs(1), false));
        assert_eq!(pass(&mut idle, &[MEMORY], t + 200 * MS, &[]), t + 1000 * MS);
        idle.clear();
        assert_eq!(idle.due(t + 10_000 * MS), []);
    }

    #[tokio::test(start_paused = true)]
    async fn the_memory_signals_are_read_together() {
        let mut s = Schedule::default();
        let t = Instant::now();
        pass(&mut s, &[MEMORY, ALLOCATABLE], t, &[(MEMORY, 100), (ALLOCATABLE, 400)]);
        // Memory due brings allocatable along only once allocatable is past half its period.
        assert_eq!(s.due(t + 100 * MS), [MEMORY]);
        assert_eq!(s.due(t + 199 * MS), [MEMORY]);
        assert_eq!(s.due(t + 200 * MS), [MEMORY, ALLOCATABLE]);
        // Allocatable due brings memory along at once.
        let mut s = Schedule::default();
        pass(&mut s, &[MEMORY, ALLOCATABLE], t, &[(MEMORY, 800), (ALLOCATABLE, 100)]);
        assert_eq!(s.due(t + 100 * MS), [ALLOCATABLE, MEMORY]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_settled_condition_is_read_at_once_and_stale_until_a_later_pass_reads_it() {
        let mut s = Schedule::default();
        let t = Instant::now();
        pass(&mut s, &[MEMORY, NODEFS], t, &[(MEMORY, 500), (ALLOCATABLE, 500), (NODEFS, 500)]);
        assert!(!s.stale(MEMORY) && !s.stale(NODEFS));
        // A memory victim ended: memory's signals are due now, and what they said is out of date.
        s.settled(Condition::MemoryPressure, t + 5 * MS);
        assert_eq!(s.due(t + 5 * MS), [MEMORY, ALLOCATABLE]);
        assert!(s.stale(MEMORY) && s.stale(ALLOCATABLE));
        assert!(!s.stale(NODEFS), "another condition's reading is still good");
        // A pass that reads the disk alone leaves memory stale; one that reads memory does not.
        s.read(&[NODEFS], &observed(&[NODEFS], MIB), t + 6 * MS);
        assert!(s.stale(MEMORY));
        s.read(&[MEMORY], &observed(&[MEMORY], MIB), t + 7 * MS);
        assert!(!s.stale(MEMORY));
        assert!(s.stale(ALLOCATABLE), "not read since");
    }

    #[test]
    fn the_planned_rate_is_twice_the_observed_fall_when_that_beats_the_worst_case() {
        let mut rates = Rates::default();
        let t = Instant::now();
        let s = Signal::MemoryAvailable;
        assert!((rates.planning(s) - drain_rate(s)).abs() < 1.0);
        rates.record(s, t, 2048 * MIB);
        // 1 GiB in 0.5 s: 2 GiB/s observed, 4 GiB/s planned.
        rates.record(s, t + Duration::from_millis(500), 1024 * MIB);
        assert!((rates.planning(s) - 4.0 * 1024.0 * MIB as f64).abs() < 1.0);
        // Rising: back to the worst case.
        rates.record(s, t + Duration::from_millis(600), 1100 * MIB);
        assert!((rates.planning(s) - drain_rate(s)).abs() < 1.0);
    }

    #[test]
    fn a_ramp_in_the_kernels_steps_is_seen_falling_between_the_steps() {
        // memory.available moves 4 MiB at a time, every 10 ms (400 MiB/s), read every millisecond: most reads show
        // the same value as the one before, and the ramp must still show on each of them.
        let mut rates = Rates::default();
        let t = Instant::now();
        let s = Signal::MemoryAvailable;
        for ms in 0..200u64 {
            rates.record(s, t + Duration::from_millis(ms), 1024 * MIB - (ms / 10) * 4 * MIB);
            if ms >= 10 {
                assert!(rates.falling_fast(s), "at {ms} ms");
            }
        }
        // Held for longer than the span: no longer falling.
        for ms in 200..260u64 {
            rates.record(s, t + Duration::from_millis(ms), 1024 * MIB - 19 * 4 * MIB);
        }
        assert!(!rates.falling_fast(s));
        // Memory freed, then a fall again: measured from the rise, not from before it.
        rates.record(s, t + Duration::from_millis(270), 1024 * MIB);
        assert!(!rates.falling_fast(s));
        rates.record(s, t + Duration::from_millis(280), 1020 * MIB);
        assert!(rates.falling_fast(s), "4 MiB in 10 ms after the rise");
    }
}
