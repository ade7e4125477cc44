//! nodewarden's eviction manager: the kubelet's eviction signals and thresholds (hard and soft, quantities or
//! percentages, grace periods, minimum reclaim, the pressure transition period), node conditions, the kubelet's
//! rankings, and a loop that evicts through an [`Evictor`] as soon as a threshold is crossed.
//!
//! The policy ([`PressureState`], [`rank`], [`select`], [`next_poll`]) is pure functions of observations,
//! settings and an injected time; [`EvictionManager`] is the loop that reads observations and acts on them.

mod manager;
mod metrics;
mod observe;
mod pressure;
mod rank;
mod realtime;
mod signal;
mod status;
mod threshold;
mod wake;

pub use manager::{
    EVENT_INTERVAL, EvictError, Eviction, EvictionManager, EvictionSettings, Evictor, HARD_EVICTION_GRACE,
    PassObserver, Reclaimed, SETTLE_POLL, VICTIM_HEADSTART, eviction_message, grace_period, next_poll, select,
};
pub use metrics::EvictionMetrics;
pub use nodewarden_resources::Condition;
pub use observe::{SignalObservation, signal_observations};
pub use pressure::{Breach, Evaluation, PressureState};
pub use rank::{Candidate, rank};
pub use realtime::{MAX_REALTIME_PRIORITY, make_realtime, with_normal_scheduler};
pub use signal::Signal;
pub use status::{EvictionRecord, EvictionStatus, HISTORY, LimitEviction, Ranked};
pub use threshold::{Threshold, ThresholdError, Thresholds, default_hard_thresholds};
pub use wake::{PSI_TRIGGER, Wake, WakeThread, start as start_wakeups};
