//! nodewarden's eviction policy: the kubelet's eviction signals and thresholds (hard and soft, quantities or
//! percentages, grace periods, minimum reclaim), parsed and validated with messages that name the config field,
//! and the observed value of each signal.
//!
//! Policy is pure functions of observations and configuration; the eviction loop that acts on it is built on
//! these types.

mod observe;
mod signal;
mod threshold;

pub use observe::{SignalObservation, signal_observations};
pub use signal::Signal;
pub use threshold::{Threshold, ThresholdError, Thresholds, default_hard_thresholds};
