//! The eviction section: what the eviction loop follows, from `evictionHard`, `evictionSoft`,
//! `evictionSoftGracePeriod`, `evictionMinimumReclaim`, `evictionPressureTransitionPeriod`,
//! `evictionMaxPodGracePeriod` and nodewarden's `housekeepingInterval`, `evictionPollMin`,
//! `evictionRealtimePriority` and `pressureEvents`; and `localStorageCapacityIsolation`.

use std::collections::BTreeMap;
use std::time::Duration;

use nodewarden_eviction::{Signal, Thresholds};
use nodewarden_resources::EvictionReserve;

use super::{duration_field, nodewarden, parse_duration, required};
use crate::{ConfigError, KubeletConfiguration, QuantityMap};

/// The eviction section.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionConfig {
    /// Eviction thresholds, with `allocatableMemory.available` when allocatable is enforced on pods.
    pub thresholds: Thresholds,
    /// `evictionPressureTransitionPeriod`.
    pub pressure_transition_period: Duration,
    /// `evictionMaxPodGracePeriod` in seconds.
    pub max_pod_grace_period: u32,
    /// The longest period between two observations of the node (`nodewarden.housekeepingInterval`).
    pub housekeeping_interval: Duration,
    /// The shortest period between two eviction passes (`nodewarden.evictionPollMin`).
    pub poll_min: Duration,
    /// The eviction thread's `SCHED_FIFO` priority, 0 for none (`nodewarden.evictionRealtimePriority`).
    pub realtime_priority: u8,
    /// Wake the eviction loop on PSI triggers and `memory.events` (`nodewarden.pressureEvents`).
    pub pressure_events: bool,
    /// `localStorageCapacityIsolation`: pods over their ephemeral-storage limits or `emptyDir` size limits are
    /// evicted (restart-only).
    pub local_storage_limits: bool,
}

impl EvictionConfig {
    /// The eviction section; `enforce_pods` (the resources section's [`super::resources::enforces_pods`]) adds
    /// the `allocatableMemory.available` threshold derived from `memory.available`.
    pub fn validate(c: &KubeletConfiguration, enforce_pods: bool) -> Result<Self, ConfigError> {
        let thresholds = thresholds(c)?;
        let thresholds = if enforce_pods { thresholds.with_allocatable_memory() } else { thresholds };
        let pressure_transition_period =
            duration_field("evictionPressureTransitionPeriod", &c.eviction_pressure_transition_period)?;
        let mpg = *required(&c.eviction_max_pod_grace_period, "evictionMaxPodGracePeriod")?;
        let max_pod_grace_period = u32::try_from(mpg)
            .map_err(|_| ConfigError::field("evictionMaxPodGracePeriod", format!("{mpg} is negative or too large")))?;
        let nw = nodewarden(c)?;
        let housekeeping_interval = duration_field("nodewarden.housekeepingInterval", &nw.housekeeping_interval)?;
        if housekeeping_interval < Duration::from_millis(10) {
            return Err(ConfigError::field("nodewarden.housekeepingInterval", "must be at least 10ms"));
        }
        let poll_min = duration_field("nodewarden.evictionPollMin", &nw.eviction_poll_min)?;
        if poll_min < Duration::from_millis(1) || poll_min > housekeeping_interval {
            return Err(ConfigError::field(
                "nodewarden.evictionPollMin",
                "must be at least 1ms and at most nodewarden.housekeepingInterval",
            ));
        }
        let realtime_priority =
            u8::try_from(*required(&nw.eviction_realtime_priority, "nodewarden.evictionRealtimePriority")?)
                .ok()
                .filter(|p| *p <= nodewarden_eviction::MAX_REALTIME_PRIORITY)
                .ok_or_else(|| ConfigError::field("nodewarden.evictionRealtimePriority", "must be from 0 to 99"))?;
        Ok(EvictionConfig {
            thresholds,
            pressure_transition_period,
            max_pod_grace_period,
            housekeeping_interval,
            poll_min,
            realtime_priority,
            pressure_events: *required(&nw.pressure_events, "nodewarden.pressureEvents")?,
            local_storage_limits: *required(&c.local_storage_capacity_isolation, "localStorageCapacityIsolation")?,
        })
    }

    /// The hard thresholds that allocatable subtracts (the resources section takes them).
    pub fn reserve(&self) -> EvictionReserve {
        EvictionReserve {
            memory_available: self.thresholds.hard_for(Signal::MemoryAvailable).map(|t| t.amount),
            nodefs_available: self.thresholds.hard_for(Signal::NodeFsAvailable).map(|t| t.amount),
        }
    }
}

/// The thresholds as the file gives them (hard, soft with their grace periods, minimum reclaim).
fn thresholds(c: &KubeletConfiguration) -> Result<Thresholds, ConfigError> {
    let grace: BTreeMap<String, Duration> = required(&c.eviction_soft_grace_period, "evictionSoftGracePeriod")?
        .iter()
        .map(|(k, v)| parse_duration(&format!("evictionSoftGracePeriod.{k}"), v).map(|d| (k.clone(), d)))
        .collect::<Result<_, _>>()?;
    Thresholds::from_config(
        &text_map(required(&c.eviction_hard, "evictionHard")?),
        &text_map(required(&c.eviction_soft, "evictionSoft")?),
        &grace,
        &text_map(required(&c.eviction_minimum_reclaim, "evictionMinimumReclaim")?),
    )
    .map_err(|e| ConfigError::field(e.field, e.reason))
}

fn text_map(map: &QuantityMap) -> BTreeMap<String, String> {
    map.iter().map(|(k, v)| (k.clone(), v.text())).collect()
}

#[cfg(test)]
mod tests {
    use super::super::{assert_refused, raw};
    use super::*;
    use nodewarden_resources::Amount;

    #[test]
    fn the_defaults() {
        let e = EvictionConfig::validate(&raw(""), true).unwrap();
        assert_eq!(e.thresholds.hard.len(), 6, "the kubelet's five and allocatableMemory.available");
        assert_eq!(e.pressure_transition_period, Duration::from_secs(300));
        assert_eq!((e.housekeeping_interval, e.poll_min), (Duration::from_secs(1), Duration::from_millis(1)));
        assert_eq!((e.max_pod_grace_period, e.realtime_priority, e.pressure_events), (0, 1, true));
        assert!(e.local_storage_limits);
        assert_eq!(e.reserve().memory_available, Some(Amount::Quantity(100 << 20)));
    }

    #[test]
    fn allocatable_memory_is_watched_only_when_pods_are_enforced() {
        let signals = |enforce| {
            let e = EvictionConfig::validate(&raw("evictionHard:\n  memory.available: 1Gi\n"), enforce).unwrap();
            e.thresholds.hard.iter().map(|t| t.signal).collect::<Vec<_>>()
        };
        assert_eq!(signals(true), [Signal::MemoryAvailable, Signal::AllocatableMemoryAvailable]);
        assert_eq!(signals(false), [Signal::MemoryAvailable]);
        let e = EvictionConfig::validate(&raw("evictionHard:\n  nodefs.available: 10%\n"), true).unwrap();
        assert_eq!(
            e.reserve(),
            EvictionReserve { memory_available: None, nodefs_available: Some(Amount::Percentage(0.1)) }
        );
    }

    #[test]
    fn invalid_values_name_the_field() {
        let section = |c: &KubeletConfiguration| EvictionConfig::validate(c, true);
        assert_refused(
            section,
            &[
                ("evictionHard:\n  memory.available: -1Mi\n", "evictionHard.memory.available"),
                ("evictionHard:\n  nodefs.available: 110%\n", "evictionHard.nodefs.available"),
                ("evictionHard:\n  memory.availble: 1Mi\n", "evictionHard.memory.availble"),
                ("evictionSoft:\n  memory.available: 1Gi\n", "evictionSoftGracePeriod.memory.available"),
                ("evictionSoftGracePeriod:\n  memory.available: soon\n", "evictionSoftGracePeriod.memory.available"),
                ("evictionPressureTransitionPeriod: later\n", "evictionPressureTransitionPeriod"),
                ("evictionMaxPodGracePeriod: -3\n", "evictionMaxPodGracePeriod"),
                ("nodewarden:\n  housekeepingInterval: 1us\n", "nodewarden.housekeepingInterval"),
                ("nodewarden:\n  evictionPollMin: 2s\n", "nodewarden.evictionPollMin"),
                ("nodewarden:\n  evictionRealtimePriority: 100\n", "nodewarden.evictionRealtimePriority"),
                ("nodewarden:\n  evictionRealtimePriority: -1\n", "nodewarden.evictionRealtimePriority"),
            ],
        );
    }
}
