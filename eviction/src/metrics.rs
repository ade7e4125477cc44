//! The eviction manager's metrics: the kubelet's `kubelet_evictions` and `kubelet_eviction_stats_age_seconds`, and
//! nodewarden's own (latency from crossing to SIGTERM, node conditions, wake-ups, the poll period).

use prometheus::{Gauge, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use crate::signal::Signal;
use nodewarden_resources::Condition;

/// The metrics the eviction loop updates.
#[derive(Debug, Clone)]
pub struct EvictionMetrics {
    /// `kubelet_evictions{eviction_signal}`: pods evicted (a counter without `_total`, as the kubelet names it).
    pub evictions: IntCounterVec,
    /// `kubelet_eviction_stats_age_seconds{eviction_signal}`: age of the observation an eviction was decided on.
    pub stats_age: HistogramVec,
    /// `nodewarden_eviction_latency_seconds{eviction_signal}`: threshold crossing observed → SIGTERM sent.
    pub latency: HistogramVec,
    /// `nodewarden_node_condition{condition}`: 1 while a pressure condition is true.
    pub conditions: IntGaugeVec,
    /// `nodewarden_eviction_wakeups_total{source}`: what woke the eviction loop.
    pub wakeups: IntCounterVec,
    /// `nodewarden_eviction_poll_period_seconds`: the period until the next poll, as headroom decides it.
    pub poll_period: Gauge,
}

impl EvictionMetrics {
    /// Creates the metrics and registers them.
    pub fn new(r: &Registry) -> Result<Self, prometheus::Error> {
        let m = Self {
            evictions: IntCounterVec::new(
                Opts::new("kubelet_evictions", "Cumulative number of pod evictions by eviction signal"),
                &["eviction_signal"],
            )?,
            stats_age: HistogramVec::new(
                HistogramOpts::new(
                    "kubelet_eviction_stats_age_seconds",
                    "Time between when stats are collected, and when pod is evicted based on those stats by eviction signal",
                ),
                &["eviction_signal"],
            )?,
            latency: HistogramVec::new(
                HistogramOpts::new(
                    "nodewarden_eviction_latency_seconds",
                    "Time from the observation that found a threshold crossed to SIGTERM sent to the victim's containers",
                )
                .buckets(vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
                &["eviction_signal"],
            )?,
            conditions: IntGaugeVec::new(
                Opts::new("nodewarden_node_condition", "1 while the node condition is true (MemoryPressure, DiskPressure, PIDPressure)"),
                &["condition"],
            )?,
            wakeups: IntCounterVec::new(
                Opts::new("nodewarden_eviction_wakeups_total", "Eviction loop passes by what started them"),
                &["source"],
            )?,
            poll_period: Gauge::new(
                "nodewarden_eviction_poll_period_seconds",
                "The eviction loop's current poll period (shorter as headroom above the thresholds shrinks)",
            )?,
        };
        r.register(Box::new(m.evictions.clone()))?;
        r.register(Box::new(m.stats_age.clone()))?;
        r.register(Box::new(m.latency.clone()))?;
        r.register(Box::new(m.conditions.clone()))?;
        r.register(Box::new(m.wakeups.clone()))?;
        r.register(Box::new(m.poll_period.clone()))?;
        for s in Signal::ALL {
            m.evictions.with_label_values(&[s.as_str()]);
        }
        for c in Condition::ALL {
            m.conditions.with_label_values(&[c.as_str()]).set(0);
        }
        Ok(m)
    }
}
