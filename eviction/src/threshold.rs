//! Eviction thresholds as the kubelet configures them: `evictionHard`, `evictionSoft` with
//! `evictionSoftGracePeriod`, `evictionMinimumReclaim`, and the kubelet's defaults.

use std::collections::BTreeMap;
use std::time::Duration;

use nodewarden_resources::Amount;

use crate::signal::Signal;

/// A threshold that names the config field it came from when it is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ThresholdError {
    /// The config field, such as `evictionHard.memory.available`.
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

fn err(field: impl Into<String>, reason: impl Into<String>) -> ThresholdError {
    ThresholdError { field: field.into(), reason: reason.into() }
}

/// One threshold: the signal is below `amount` (resolved against the signal's capacity).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Threshold {
    /// The signal.
    pub signal: Signal,
    /// The amount, a quantity or a percentage of capacity.
    pub amount: Amount,
    /// For soft thresholds, how long the signal must stay below before evicting; zero for hard thresholds.
    pub grace_period: Duration,
    /// How much above the threshold eviction must bring the signal (`evictionMinimumReclaim`).
    pub min_reclaim: Option<Amount>,
}

/// The hard and soft thresholds in force.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Thresholds {
    /// `evictionHard`.
    pub hard: Vec<Threshold>,
    /// `evictionSoft`.
    pub soft: Vec<Threshold>,
}

/// The kubelet's default `evictionHard` on Linux.
pub fn default_hard_thresholds() -> BTreeMap<String, String> {
    [
        ("memory.available", "100Mi"),
        ("nodefs.available", "10%"),
        ("nodefs.inodesFree", "5%"),
        ("imagefs.available", "15%"),
        ("imagefs.inodesFree", "5%"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// Parses an eviction map (`{"memory.available": "100Mi"}`) of the config field `field`. Zero amounts (`0`, `0%`)
/// disable a signal, as in the kubelet, and are left out.
pub(crate) fn parse_amounts(
    field: &str,
    map: &BTreeMap<String, String>,
) -> Result<BTreeMap<Signal, Amount>, ThresholdError> {
    let mut out = BTreeMap::new();
    for (key, value) in map {
        let name = format!("{field}.{key}");
        let signal: Signal = key.parse().map_err(|e: String| err(&name, e))?;
        let amount = Amount::parse(value).map_err(|e| err(&name, e.to_string()))?;
        if !amount.is_zero() {
            out.insert(signal, amount);
        }
    }
    Ok(out)
}

/// Parses the signal keys of a per-signal map whose values are already typed (`evictionSoftGracePeriod`).
pub(crate) fn parse_signal_keys<T: Clone>(
    field: &str,
    map: &BTreeMap<String, T>,
) -> Result<BTreeMap<Signal, T>, ThresholdError> {
    map.iter()
        .map(|(k, v)| k.parse::<Signal>().map(|s| (s, v.clone())).map_err(|e| err(format!("{field}.{k}"), e)))
        .collect()
}

impl Thresholds {
    /// Builds and validates the thresholds from the kubelet's fields. `hard` is the effective `evictionHard` (the
    /// caller applies the defaults); every soft threshold needs a grace period.
    pub fn from_config(
        hard: &BTreeMap<String, String>,
        soft: &BTreeMap<String, String>,
        soft_grace: &BTreeMap<String, Duration>,
        min_reclaim: &BTreeMap<String, String>,
    ) -> Result<Self, ThresholdError> {
        let hard = parse_amounts("evictionHard", hard)?;
        let soft = parse_amounts("evictionSoft", soft)?;
        let grace = parse_signal_keys("evictionSoftGracePeriod", soft_grace)?;
        let reclaim = parse_amounts("evictionMinimumReclaim", min_reclaim)?;
        let build = |signal: Signal, amount: Amount, grace_period: Duration| Threshold {
            signal,
            amount,
            grace_period,
            min_reclaim: reclaim.get(&signal).copied(),
        };
        let mut out = Thresholds::default();
        for (signal, amount) in hard {
            out.hard.push(build(signal, amount, Duration::ZERO));
        }
        for (signal, amount) in soft {
            let Some(g) = grace.get(&signal) else {
                return Err(err(
                    format!("evictionSoftGracePeriod.{signal}"),
                    format!("missing: the soft threshold evictionSoft.{signal} needs a grace period"),
                ));
            };
            out.soft.push(build(signal, amount, *g));
        }
        Ok(out)
    }

    /// Derives the `allocatableMemory.available` threshold from the hard `memory.available` one, as the kubelet
    /// does when `enforceNodeAllocatable` contains `pods` (unless one was configured).
    pub fn with_allocatable_memory(mut self) -> Self {
        if self.hard_for(Signal::AllocatableMemoryAvailable).is_none()
            && let Some(t) = self.hard_for(Signal::MemoryAvailable).copied()
        {
            self.hard.push(Threshold { signal: Signal::AllocatableMemoryAvailable, ..t });
        }
        self
    }

    /// The hard threshold of a signal, if any.
    pub fn hard_for(&self, signal: Signal) -> Option<&Threshold> {
        self.hard.iter().find(|t| t.signal == signal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn defaults_parse() {
        let t = Thresholds::from_config(&default_hard_thresholds(), &map(&[]), &BTreeMap::new(), &map(&[])).unwrap();
        assert_eq!(t.hard.len(), 5);
        assert_eq!(t.hard_for(Signal::MemoryAvailable).map(|t| t.amount), Some(Amount::Quantity(100 << 20)));
        assert_eq!(t.hard_for(Signal::NodeFsAvailable).map(|t| t.amount), Some(Amount::Percentage(0.1)));
    }

    #[test]
    fn soft_needs_grace_and_gets_min_reclaim() {
        let soft = map(&[("memory.available", "300Mi")]);
        let e = Thresholds::from_config(&map(&[]), &soft, &BTreeMap::new(), &map(&[])).unwrap_err();
        assert_eq!(e.field, "evictionSoftGracePeriod.memory.available");
        let grace = [("memory.available".to_owned(), Duration::from_secs(90))].into();
        let t = Thresholds::from_config(&map(&[]), &soft, &grace, &map(&[("memory.available", "50Mi")])).unwrap();
        assert_eq!(t.soft[0].grace_period, Duration::from_secs(90));
        assert_eq!(t.soft[0].min_reclaim, Some(Amount::Quantity(50 << 20)));
    }

    #[test]
    fn bad_values_name_the_field() {
        let cases = [
            (map(&[("memory.available", "-1Mi")]), "evictionHard.memory.available", "negative"),
            (map(&[("nodefs.available", "120%")]), "evictionHard.nodefs.available", "percentage"),
            (map(&[("memory.avail", "1Mi")]), "evictionHard.memory.avail", "unknown eviction signal"),
            (map(&[("pid.available", "lots")]), "evictionHard.pid.available", "not a quantity"),
        ];
        for (hard, field, words) in cases {
            let e = Thresholds::from_config(&hard, &map(&[]), &BTreeMap::new(), &map(&[])).unwrap_err();
            assert_eq!(e.field, field);
            assert!(e.reason.contains(words), "{e}");
        }
    }

    #[test]
    fn allocatable_memory_copies_the_hard_memory_threshold() {
        let reclaim = map(&[("memory.available", "10Mi")]);
        let t = Thresholds::from_config(&default_hard_thresholds(), &map(&[]), &BTreeMap::new(), &reclaim)
            .unwrap()
            .with_allocatable_memory();
        let a = t.hard_for(Signal::AllocatableMemoryAvailable).unwrap();
        assert_eq!((a.amount, a.min_reclaim), (Amount::Quantity(100 << 20), Some(Amount::Quantity(10 << 20))));
        assert_eq!(t.hard.len(), 6);
        assert_eq!(t.clone().with_allocatable_memory(), t, "derived once");
    }

    #[test]
    fn zero_disables_a_signal() {
        let t = Thresholds::from_config(
            &map(&[("memory.available", "0"), ("nodefs.available", "0%")]),
            &map(&[]),
            &BTreeMap::new(),
            &map(&[]),
        )
        .unwrap();
        assert!(t.hard.is_empty());
    }
}
