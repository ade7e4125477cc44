//! Which thresholds are met, for how long, and the node conditions they raise, with the kubelet's rules:
//! - a threshold is met while the signal is below it; once met, it stays met until the signal is back above
//!   threshold + `evictionMinimumReclaim`;
//! - a soft threshold acts only after it has been met for its whole `evictionSoftGracePeriod`;
//! - a node condition is raised as soon as one of its thresholds is met (a soft one within its grace period too)
//!   and cleared only after none has been met for `evictionPressureTransitionPeriod`.
//!
//! Time is passed in, so the rules are tested with a paused clock.

use std::collections::BTreeMap;
use std::time::Duration;

use nodewarden_resources::{Condition, NodePressure};
use tokio::time::Instant;

use crate::observe::SignalObservation;
use crate::signal::Signal;
use crate::threshold::{Threshold, Thresholds};

/// A threshold that is met, with what was observed.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Breach {
    /// The threshold.
    pub threshold: Threshold,
    /// True for an `evictionHard` threshold.
    pub hard: bool,
    /// The signal's observed value.
    pub observed: u64,
    /// The threshold resolved against the signal's capacity.
    pub value: u64,
    /// Where eviction must bring the signal back to: threshold + minimum reclaim.
    pub target: u64,
    /// How long the threshold has been met.
    #[serde(with = "secs")]
    pub met_for: Duration,
}

impl Breach {
    /// How much must be reclaimed to reach the target.
    pub fn deficit(&self) -> u64 {
        self.target.saturating_sub(self.observed)
    }
}

mod secs {
    pub fn serialize<S: serde::Serializer>(d: &std::time::Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

/// The outcome of one evaluation.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Evaluation {
    /// The node conditions in force, after the transition period.
    pub pressure: NodePressure,
    /// Every threshold met (soft ones within their grace period too).
    pub met: Vec<Breach>,
    /// The thresholds to act on now, in the order to act on them: memory first, hard before soft.
    pub act: Vec<Breach>,
}

type Key = (Signal, bool);

/// What the evaluation remembers between passes.
#[derive(Debug, Default)]
pub struct PressureState {
    first_met: BTreeMap<Key, Instant>,
    last_observed: BTreeMap<Condition, Instant>,
}

fn order(signal: Signal) -> u8 {
    match signal.condition() {
        Condition::MemoryPressure => 0,
        Condition::DiskPressure => 1,
        Condition::PidPressure => 2,
    }
}

impl PressureState {
    /// Evaluates the thresholds against fresh observations at `now`.
    pub fn evaluate(
        &mut self,
        now: Instant,
        thresholds: &Thresholds,
        signals: &BTreeMap<Signal, SignalObservation>,
        transition_period: Duration,
    ) -> Evaluation {
        let mut out = Evaluation::default();
        let all = thresholds.hard.iter().map(|t| (t, true)).chain(thresholds.soft.iter().map(|t| (t, false)));
        let mut still_met = Vec::new();
        for (t, hard) in all {
            let Some(obs) = signals.get(&t.signal) else {
                // No reading this pass (its input failed): a threshold that was met stays met, with its grace
                // period running and its condition held, until a reading says otherwise.
                if self.first_met.contains_key(&(t.signal, hard)) {
                    still_met.push((t.signal, hard));
                    self.last_observed.insert(t.signal.condition(), now);
                }
                continue;
            };
            let value = t.amount.resolve(obs.capacity);
            let target = value.saturating_add(t.min_reclaim.map_or(0, |r| r.resolve(obs.capacity)));
            let key = (t.signal, hard);
            let was_met = self.first_met.contains_key(&key);
            let met = obs.available < value || (was_met && obs.available < target);
            if !met {
                continue;
            }
            still_met.push(key);
            let since = *self.first_met.entry(key).or_insert(now);
            let met_for = now.saturating_duration_since(since);
            let breach = Breach { threshold: *t, hard, observed: obs.available, value, target, met_for };
            self.last_observed.insert(t.signal.condition(), now);
            if met_for >= t.grace_period {
                out.act.push(breach.clone());
            }
            out.met.push(breach);
        }
        self.first_met.retain(|k, _| still_met.contains(k));
        out.act.sort_by_key(|b| (order(b.threshold.signal), !b.hard, b.threshold.signal));
        let on = |c: Condition| {
            self.last_observed.get(&c).is_some_and(|t| {
                let age = now.saturating_duration_since(*t);
                age.is_zero() || age < transition_period
            })
        };
        out.pressure = NodePressure::of(Condition::ALL.into_iter().filter(|c| on(*c)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodewarden_resources::Amount;

    const MIB: u64 = 1 << 20;

    fn threshold(signal: Signal, amount: Amount, grace: u64, reclaim: Option<Amount>) -> Threshold {
        Threshold { signal, amount, grace_period: Duration::from_secs(grace), min_reclaim: reclaim }
    }

    fn mem(available: u64) -> BTreeMap<Signal, SignalObservation> {
        [(Signal::MemoryAvailable, SignalObservation { available, capacity: 1024 * MIB })].into()
    }

    #[tokio::test(start_paused = true)]
    async fn hard_thresholds_act_at_once_and_hold_until_min_reclaim() {
        let t = Thresholds {
            hard: vec![threshold(
                Signal::MemoryAvailable,
                Amount::Quantity(100 * MIB),
                0,
                Some(Amount::Quantity(50 * MIB)),
            )],
            soft: vec![],
        };
        let mut s = PressureState::default();
        let p = Duration::from_secs(30);
        assert!(s.evaluate(Instant::now(), &t, &mem(101 * MIB), p).met.is_empty());
        let e = s.evaluate(Instant::now(), &t, &mem(90 * MIB), p);
        assert_eq!(e.act.len(), 1);
        assert_eq!((e.act[0].value, e.act[0].target, e.act[0].deficit()), (100 * MIB, 150 * MIB, 60 * MIB));
        assert!(e.pressure.contains(Condition::MemoryPressure));
        // Above the threshold but below threshold + minimum reclaim: still met.
        assert_eq!(s.evaluate(Instant::now(), &t, &mem(120 * MIB), p).act.len(), 1);
        // Above the target: no longer met; a fresh dip below threshold + reclaim does not count until below.
        assert!(s.evaluate(Instant::now(), &t, &mem(151 * MIB), p).act.is_empty());
        assert!(s.evaluate(Instant::now(), &t, &mem(120 * MIB), p).act.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_without_a_reading_neither_meets_nor_clears_a_threshold() {
        let t = Thresholds {
            hard: vec![],
            soft: vec![threshold(Signal::MemoryAvailable, Amount::Quantity(100 * MIB), 60, None)],
        };
        let mut s = PressureState::default();
        let p = Duration::from_secs(30);
        assert_eq!(s.evaluate(Instant::now(), &t, &mem(90 * MIB), p).met.len(), 1);
        // The input fails for a while: the grace period keeps running and the condition stays.
        tokio::time::advance(Duration::from_secs(45)).await;
        let gap = s.evaluate(Instant::now(), &t, &BTreeMap::new(), p);
        assert!(gap.pressure.contains(Condition::MemoryPressure));
        tokio::time::advance(Duration::from_secs(20)).await;
        let back = s.evaluate(Instant::now(), &t, &mem(90 * MIB), p);
        assert_eq!(back.act.len(), 1, "met for 65 s across the gap: the 60 s grace period is over");
    }

    #[tokio::test(start_paused = true)]
    async fn soft_thresholds_wait_for_their_grace_period_but_raise_the_condition_at_once() {
        let t = Thresholds {
            hard: vec![],
            soft: vec![threshold(Signal::MemoryAvailable, Amount::Percentage(0.5), 90, None)],
        };
        let mut s = PressureState::default();
        let p = Duration::from_secs(30);
        let e = s.evaluate(Instant::now(), &t, &mem(400 * MIB), p);
        assert_eq!((e.met.len(), e.act.len(), e.pressure.contains(Condition::MemoryPressure)), (1, 0, true));
        tokio::time::advance(Duration::from_secs(89)).await;
        assert!(s.evaluate(Instant::now(), &t, &mem(400 * MIB), p).act.is_empty());
        tokio::time::advance(Duration::from_secs(1)).await;
        let e = s.evaluate(Instant::now(), &t, &mem(400 * MIB), p);
        assert_eq!(e.act.len(), 1);
        assert_eq!(e.act[0].met_for, Duration::from_secs(90));
        // Recovering resets the grace period.
        s.evaluate(Instant::now(), &t, &mem(600 * MIB), p);
        assert!(s.evaluate(Instant::now(), &t, &mem(400 * MIB), p).act.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn conditions_clear_only_after_the_transition_period() {
        let t =
            Thresholds { hard: vec![threshold(Signal::PidAvailable, Amount::Quantity(100), 0, None)], soft: vec![] };
        let pids =
            |available| BTreeMap::from([(Signal::PidAvailable, SignalObservation { available, capacity: 1000 })]);
        let mut s = PressureState::default();
        let p = Duration::from_secs(5);
        assert!(s.evaluate(Instant::now(), &t, &pids(50), p).pressure.contains(Condition::PidPressure));
        tokio::time::advance(Duration::from_secs(1)).await;
        let e = s.evaluate(Instant::now(), &t, &pids(500), p);
        assert!(
            e.act.is_empty() && e.pressure.contains(Condition::PidPressure),
            "recovered, but within the transition period"
        );
        tokio::time::advance(Duration::from_millis(3_999)).await;
        assert!(s.evaluate(Instant::now(), &t, &pids(500), p).pressure.contains(Condition::PidPressure));
        tokio::time::advance(Duration::from_millis(1)).await;
        let e = s.evaluate(Instant::now(), &t, &pids(500), p);
        assert_eq!(e.pressure, NodePressure::default());
        // A new breach within the period extends it.
        s.evaluate(Instant::now(), &t, &pids(10), p);
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(s.evaluate(Instant::now(), &t, &pids(500), p).pressure.contains(Condition::PidPressure));
    }

    #[tokio::test(start_paused = true)]
    async fn memory_is_acted_on_first_and_hard_before_soft() {
        let t = Thresholds {
            hard: vec![
                threshold(Signal::PidAvailable, Amount::Quantity(100), 0, None),
                threshold(Signal::NodeFsAvailable, Amount::Percentage(0.1), 0, None),
            ],
            soft: vec![threshold(Signal::MemoryAvailable, Amount::Quantity(500 * MIB), 0, None)],
        };
        let signals = BTreeMap::from([
            (Signal::MemoryAvailable, SignalObservation { available: 10 * MIB, capacity: 1024 * MIB }),
            (Signal::NodeFsAvailable, SignalObservation { available: 1, capacity: 100 }),
            (Signal::PidAvailable, SignalObservation { available: 1, capacity: 1000 }),
        ]);
        let e = PressureState::default().evaluate(Instant::now(), &t, &signals, Duration::ZERO);
        let order: Vec<Signal> = e.act.iter().map(|b| b.threshold.signal).collect();
        assert_eq!(order, [Signal::MemoryAvailable, Signal::NodeFsAvailable, Signal::PidAvailable]);
        assert_eq!(e.pressure, NodePressure::of(Condition::ALL));
    }
}
