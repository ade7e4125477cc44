//! When the loop looks again: each signal has its own next read, from its headroom and how fast it may fall.
//!
//! A signal above all its thresholds is read again before it could have crossed, assuming it falls at the faster
//! of a fixed worst case ([`drain_rate`]) and twice what it was just seen to fall at; so the period shrinks
//! geometrically on a ramp and reaches the shortest period only in the last moment before the crossing. A
//! threshold met and acted on (victims on their way, or nothing left to evict) is looked at every
//! [`SETTLE_POLL`]; a soft threshold waiting out its grace period, when the grace runs out.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

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
/// `settled` holds the signals whose met thresholds were acted on in this pass; `rate` gives the fall to plan
/// with.
pub fn signal_periods(
    settings: &EvictionSettings,
    signals: &BTreeMap<Signal, SignalObservation>,
    evaluation: &Evaluation,
    settled: &[Signal],
    rate: impl Fn(Signal) -> f64,
) -> BTreeMap<Signal, Duration> {
    let (lo, hi) = (settings.poll_min, settings.poll_max.max(settings.poll_min));
    let mut out: BTreeMap<Signal, Duration> = BTreeMap::new();
    let t = &settings.thresholds;
    for (th, hard) in t.hard.iter().map(|x| (x, true)).chain(t.soft.iter().map(|x| (x, false))) {
        let period = if let Some(b) = evaluation.met.iter().find(|b| b.threshold.signal == th.signal && b.hard == hard)
        {
            let waiting = th.grace_period.saturating_sub(b.met_for);
            if waiting.is_zero() && settled.contains(&th.signal) { SETTLE_POLL.max(lo) } else { waiting }
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
    signal_periods(settings, signals, evaluation, &[], drain_rate)
        .into_values()
        .min()
        .unwrap_or(settings.poll_max)
        .max(settings.poll_min)
}
