//! The candidates for memory and PID evictions, read ahead while such a signal falls fast toward its threshold,
//! so that the pass that sees the crossing chooses its victim without reading every pod's usage first.

use std::collections::BTreeMap;
use std::time::Duration;

use nodewarden_resources::Condition;
use tokio::time::Instant;

use super::schedule::Rates;
use crate::pressure::Breach;
use crate::rank::Candidate;
use crate::signal::Signal;

/// A memory or PID signal that is falling fast and could cross a threshold this soon (at the rate the schedule
/// plans with) has the candidates read ahead, at most once per this period, so the pass that sees the crossing
/// chooses its victim without reading every pod's usage first. A node holding steady near a threshold reads
/// nothing ahead (measured: 100 pods near allocatableMemory.available made the read-ahead cost 2 % CPU and slowed
/// pod start, when it still held the ledger's lock).
pub const READ_AHEAD: Duration = Duration::from_millis(100);

/// The oldest read-ahead a decision uses; past it, the candidates are read when the crossing is seen. The
/// kubelet ranks on usage that is seconds old.
pub const READ_AHEAD_AGE: Duration = Duration::from_millis(200);

/// The candidates read ahead, and when. A read is kept until it is too old to use ([`READ_AHEAD_AGE`]), also
/// through a pause in the fall: a hog that allocates in bursts shows no fall between them.
#[derive(Debug, Default)]
pub struct ReadAhead {
    read: Option<(Instant, Vec<Candidate>)>,
}

impl ReadAhead {
    /// Whether to read the candidates ahead at `now`: a memory or PID signal, not yet `met` and falling fast,
    /// could cross within [`READ_AHEAD`] (its next read, in `periods`, is that close), and the last read is at
    /// least [`READ_AHEAD`] old.
    pub fn wanted(&self, now: Instant, periods: &BTreeMap<Signal, Duration>, rates: &Rates, met: &[Breach]) -> bool {
        let near = periods.iter().any(|(s, p)| {
            s.condition() != Condition::DiskPressure
                && *p <= READ_AHEAD
                && rates.falling_fast(*s)
                && !met.iter().any(|b| b.threshold.signal == *s)
        });
        near && self.read.as_ref().is_none_or(|(t, _)| now.saturating_duration_since(*t) >= READ_AHEAD)
    }

    /// Keeps the candidates `found`, read at `at`.
    pub fn keep(&mut self, at: Instant, found: Vec<Candidate>) {
        self.read = Some((at, found));
    }

    /// The candidates read ahead, if they were read at most [`READ_AHEAD_AGE`] before `now`.
    pub fn fresh(&self, now: Instant) -> Option<&[Candidate]> {
        match &self.read {
            Some((at, found)) if now.saturating_duration_since(*at) <= READ_AHEAD_AGE => Some(found),
            _ => None,
        }
    }

    /// Leaves out the pod `uid` (a victim just handed over: a later pass must not choose it again).
    pub fn remove(&mut self, uid: &str) {
        if let Some((_, found)) = &mut self.read {
            found.retain(|c| c.uid != uid);
        }
    }

    /// Forgets what was read (a victim has been reclaimed since, and is among the candidates).
    pub fn clear(&mut self) {
        self.read = None;
    }

    /// When the candidates kept were read.
    #[cfg(test)]
    pub fn read_at(&self) -> Option<Instant> {
        self.read.as_ref().map(|(at, _)| *at)
    }
}

#[cfg(test)]
mod tests {
    use nodewarden_resources::Amount;

    use super::*;
    use crate::threshold::Threshold;

    const MS: Duration = Duration::from_millis(1);
    const MIB: u64 = 1 << 20;

    fn uids(found: Option<&[Candidate]>) -> Option<Vec<&str>> {
        found.map(|f| f.iter().map(|c| c.uid.as_str()).collect())
    }

    fn met(signal: Signal) -> Breach {
        Breach {
            threshold: Threshold {
                signal,
                amount: Amount::Quantity(100 * MIB),
                grace_period: Duration::ZERO,
                min_reclaim: None,
            },
            hard: true,
            observed: 90 * MIB,
            value: 100 * MIB,
            target: 100 * MIB,
            met_for: Duration::ZERO,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_memory_or_pid_signal_falling_fast_near_its_threshold_is_read_ahead() {
        let t = Instant::now();
        let mut rates = Rates::default();
        for s in [Signal::MemoryAvailable, Signal::NodeFsAvailable] {
            // 450 MiB in 100 ms.
            rates.record(s, t - 100 * MS, 600 * MIB);
            rates.record(s, t, 150 * MIB);
        }
        rates.record(Signal::PidAvailable, t - 100 * MS, 1000);
        rates.record(Signal::PidAvailable, t, 1000);
        let ahead = ReadAhead::default();
        let near = |s: Signal, ms: u32| BTreeMap::from([(s, MS * ms)]);
        assert!(ahead.wanted(t, &near(Signal::MemoryAvailable, 100), &rates, &[]));
        assert!(!ahead.wanted(t, &near(Signal::MemoryAvailable, 101), &rates, &[]), "not that near");
        assert!(!ahead.wanted(t, &near(Signal::MemoryAvailable, 10), &rates, &[met(Signal::MemoryAvailable)]), "met");
        assert!(ahead.wanted(t, &near(Signal::MemoryAvailable, 10), &rates, &[met(Signal::PidAvailable)]));
        assert!(!ahead.wanted(t, &near(Signal::NodeFsAvailable, 10), &rates, &[]), "disk candidates are not");
        assert!(!ahead.wanted(t, &near(Signal::PidAvailable, 10), &rates, &[]), "holding steady");
        assert!(!ahead.wanted(t, &BTreeMap::new(), &rates, &[]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_is_not_repeated_within_the_period_and_used_only_while_fresh() {
        let t = Instant::now();
        let mut rates = Rates::default();
        rates.record(Signal::MemoryAvailable, t - 100 * MS, 600 * MIB);
        rates.record(Signal::MemoryAvailable, t, 150 * MIB);
        let periods = BTreeMap::from([(Signal::MemoryAvailable, 10 * MS)]);
        let mut ahead = ReadAhead::default();
        assert_eq!(uids(ahead.fresh(t)), None);
        ahead.keep(t, vec![Candidate::best_effort("a", 100 * MIB), Candidate::best_effort("b", 100 * MIB)]);
        assert_eq!(ahead.read_at(), Some(t));
        assert!(!ahead.wanted(t + READ_AHEAD - MS, &periods, &rates, &[]), "read again too soon");
        assert!(ahead.wanted(t + READ_AHEAD, &periods, &rates, &[]));
        assert_eq!(uids(ahead.fresh(t + READ_AHEAD_AGE)), Some(vec!["a", "b"]));
        assert_eq!(uids(ahead.fresh(t + READ_AHEAD_AGE + MS)), None, "too old to use");
        ahead.remove("a");
        assert_eq!(uids(ahead.fresh(t)), Some(vec!["b"]), "a victim is not chosen again");
        ahead.clear();
        assert_eq!(uids(ahead.fresh(t)), None);
        assert_eq!(ahead.read_at(), None);
    }
}
