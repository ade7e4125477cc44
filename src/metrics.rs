//! Prometheus metrics, in the text format 0.0.4 that the kubelet serves. Names follow the kubelet where it has
//! one; nodewarden's own start with `nodewarden_`.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

use nodewarden_eviction::{Signal, SignalObservation, Thresholds};
use nodewarden_resources::{Allocatable, LedgerView, Observations, Pressure, Psi, QosClass};
use prometheus::{
    CounterVec, Encoder, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// Every metric nodewarden exports.
pub struct Metrics {
    registry: Registry,
    capacity: GaugeVec,
    allocatable: GaugeVec,
    allocatable_enforced: GaugeVec,
    signal: GaugeVec,
    eviction_stats: GaugeVec,
    memory: GaugeVec,
    pressure_avg10: GaugeVec,
    pressure_stalled: CounterVec,
    last_stall_total: std::sync::Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    pods: IntGaugeVec,
    housekeeping_duration: Histogram,
    housekeeping_errors: IntCounter,
    config_reloads: IntCounterVec,
    config_last_reload_ok: IntGauge,
    /// `kubelet_pod_start_sli_duration_seconds`: observed by the apiserver pod source.
    pub pod_start_sli: Histogram,
}

/// Registration can fail only on a programming error (a duplicate or invalid name); tests cover it.
#[derive(Debug, thiserror::Error)]
#[error("cannot register metrics: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

fn gauge_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<GaugeVec, prometheus::Error> {
    let g = GaugeVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

const RESOURCES: [(&str, &str); 5] =
    [("cpu", "core"), ("memory", "byte"), ("pid", "integer"), ("ephemeral_storage", "byte"), ("pods", "integer")];

impl Metrics {
    /// Registers every metric in a fresh registry, with the process metrics (`process_*`).
    pub fn new() -> Result<Self, MetricsError> {
        let r = Registry::new();
        #[cfg(target_os = "linux")]
        r.register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))?;
        let build =
            IntGaugeVec::new(Opts::new("nodewarden_build_info", "nodewarden's version; always 1."), &["version"])?;
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        r.register(Box::new(build))?;
        let pods = IntGaugeVec::new(
            Opts::new("nodewarden_pods", "Pods placed in the kubepods tree, by QoS class."),
            &["qos_class"],
        )?;
        r.register(Box::new(pods.clone()))?;
        let pressure_stalled = CounterVec::new(
            Opts::new("nodewarden_pressure_stalled_seconds_total", "Time stalled on a resource, from /proc/pressure."),
            &["resource", "kind"],
        )?;
        r.register(Box::new(pressure_stalled.clone()))?;
        let housekeeping_duration = Histogram::with_opts(
            HistogramOpts::new("nodewarden_housekeeping_duration_seconds", "Time to read the node's observations.")
                .buckets(vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0]),
        )?;
        r.register(Box::new(housekeeping_duration.clone()))?;
        let pod_start_sli = Histogram::with_opts(
            HistogramOpts::new(
                "kubelet_pod_start_sli_duration_seconds",
                "Duration in seconds to start a pod bound to the node, from its creation to all its containers \
                 running as observed through the watch of the node's pods",
            )
            .buckets(vec![
                0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0, 300.0,
                360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
            ]),
        )?;
        r.register(Box::new(pod_start_sli.clone()))?;
        let housekeeping_errors =
            IntCounter::new("nodewarden_housekeeping_errors_total", "Observation passes that failed.")?;
        r.register(Box::new(housekeeping_errors.clone()))?;
        let config_reloads = IntCounterVec::new(
            Opts::new("nodewarden_config_reloads_total", "Config file reloads, by result (success or failure)."),
            &["result"],
        )?;
        r.register(Box::new(config_reloads.clone()))?;
        for result in ["success", "failure"] {
            config_reloads.with_label_values(&[result]);
        }
        let config_last_reload_ok = IntGauge::new(
            "nodewarden_config_last_reload_successful",
            "1 when the last config reload was applied (or none was tried), 0 when it was refused.",
        )?;
        config_last_reload_ok.set(1);
        r.register(Box::new(config_last_reload_ok.clone()))?;
        Ok(Self {
            config_reloads,
            config_last_reload_ok,
            capacity: gauge_vec(&r, "nodewarden_node_capacity", "Node capacity by resource.", &["resource", "unit"])?,
            allocatable: gauge_vec(
                &r,
                "nodewarden_node_allocatable",
                "Node allocatable (capacity − reserved − hard eviction threshold), as admission sees it.",
                &["resource", "unit"],
            )?,
            allocatable_enforced: gauge_vec(
                &r,
                "nodewarden_node_allocatable_enforced",
                "The limits written on the kubepods cgroup (capacity − reserved).",
                &["resource", "unit"],
            )?,
            signal: gauge_vec(
                &r,
                "nodewarden_eviction_signal_value",
                "The observed value of each eviction signal (bytes, or count for inodes and PIDs).",
                &["eviction_signal"],
            )?,
            eviction_stats: gauge_vec(
                &r,
                "kubelet_eviction_stats",
                "The hard eviction threshold in force for each signal (bytes, or count for inodes and PIDs).",
                &["eviction_signal"],
            )?,
            memory: gauge_vec(
                &r,
                "nodewarden_node_memory_bytes",
                "Node memory as read from /proc/meminfo: capacity, working_set (the kubelet's), mem_available (the kernel's).",
                &["kind"],
            )?,
            pressure_avg10: gauge_vec(
                &r,
                "nodewarden_pressure_avg10_ratio",
                "Share of the last 10 s stalled on a resource (PSI avg10 / 100). cgroup=kubepods for the kubepods cgroup.",
                &["resource", "kind", "cgroup"],
            )?,
            pressure_stalled,
            last_stall_total: std::sync::Mutex::new(BTreeMap::new()),
            pods,
            housekeeping_duration,
            pod_start_sli,
            housekeeping_errors,
            registry: r,
        })
    }

    /// Sets the capacity and allocatable gauges; `pods` (maxPods) is reported for all three, as the kubelet
    /// reports it in the node's capacity and allocatable.
    pub fn set_allocatable(&self, a: &Allocatable, max_pods: u32) {
        for (gauge, res) in
            [(&self.capacity, &a.capacity), (&self.allocatable, &a.reported), (&self.allocatable_enforced, &a.enforced)]
        {
            let values = [
                res.cpu_millis as f64 / 1000.0,
                res.memory as f64,
                res.pids as f64,
                res.ephemeral_storage as f64,
                f64::from(max_pods),
            ];
            for ((name, unit), v) in RESOURCES.iter().zip(values) {
                gauge.with_label_values(&[name, unit]).set(v);
            }
        }
    }

    /// Sets the threshold gauges from the thresholds in force and the signals' capacities. Series are updated in
    /// place (a signal without a hard threshold loses its series), so a scrape never sees them missing.
    pub fn set_thresholds(&self, t: &Thresholds, signals: &BTreeMap<Signal, SignalObservation>) {
        for signal in Signal::ALL {
            match (t.hard_for(signal), signals.get(&signal)) {
                (Some(th), Some(o)) => {
                    self.eviction_stats.with_label_values(&[signal.as_str()]).set(th.amount.resolve(o.capacity) as f64);
                }
                _ => {
                    let _ = self.eviction_stats.remove_label_values(&[signal.as_str()]);
                }
            }
        }
    }

    /// Records one observation pass.
    pub fn observe(&self, obs: &Observations, signals: &BTreeMap<Signal, SignalObservation>, seconds: f64) {
        self.housekeeping_duration.observe(seconds);
        for (s, o) in signals {
            self.signal.with_label_values(&[s.as_str()]).set(o.available as f64);
        }
        self.memory.with_label_values(&["capacity"]).set(obs.memory.capacity as f64);
        self.memory.with_label_values(&["working_set"]).set(obs.memory.working_set as f64);
        self.memory.with_label_values(&["mem_available"]).set(obs.memory.mem_available as f64);
    }

    /// Sets the pressure gauges from the pressure stall files and counts the stall since the last call (the first
    /// call only takes the baseline: what was stalled before nodewarden started is not counted).
    pub fn set_pressure(&self, p: &Pressure) {
        for (resource, psi) in [("memory", p.memory), ("cpu", p.cpu), ("io", p.io)] {
            self.set_psi(resource, "node", psi);
        }
        self.set_psi("memory", "kubepods", p.kubepods_memory);
    }

    fn set_psi(&self, resource: &'static str, cgroup: &str, psi: Option<Psi>) {
        let Some(psi) = psi else { return };
        for (kind, line) in [("some", Some(psi.some)), ("full", psi.full)] {
            let Some(line) = line else { continue };
            self.pressure_avg10.with_label_values(&[resource, kind, cgroup]).set(line.avg10 / 100.0);
            if cgroup != "node" {
                continue;
            }
            let mut last = self.last_stall_total.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            // Only forward: of two scrapes that overlap, the one that read the file first may get here last, and
            // its older total must neither be counted nor become the base of the next count.
            match last.entry((resource, kind)) {
                Entry::Vacant(e) => {
                    e.insert(line.total);
                }
                Entry::Occupied(mut e) if line.total > *e.get() => {
                    let delta = (line.total - *e.get()) as f64 / 1e6;
                    self.pressure_stalled.with_label_values(&[resource, kind]).inc_by(delta);
                    e.insert(line.total);
                }
                Entry::Occupied(_) => {}
            }
        }
    }

    /// Counts a config reload.
    pub fn config_reloaded(&self, ok: bool) {
        self.config_reloads.with_label_values(&[if ok { "success" } else { "failure" }]).inc();
        self.config_last_reload_ok.set(i64::from(ok));
    }

    /// Counts a failed observation pass.
    pub fn housekeeping_failed(&self) {
        self.housekeeping_errors.inc();
    }

    /// Sets the pod counts by QoS class.
    pub fn set_pods(&self, counts: &BTreeMap<QosClass, usize>) {
        for (q, n) in counts {
            self.pods.with_label_values(&[q.as_str()]).set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }

    /// The registry, for the metrics other crates register (pod sync).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Sets the gauges that are read when they are scraped rather than on every pass, from the ledger's published
    /// view: the pressure stall files and the pods by QoS class.
    pub fn refresh(&self, view: &LedgerView) {
        self.set_pressure(&view.pressure_stall());
        self.set_pods(&view.pods_by_qos());
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        String::from_utf8(buf).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }
}

/// The content type of [`Metrics::render`].
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;
    use nodewarden_resources::{Amount, Resources};

    #[test]
    fn renders_kubelet_and_own_names() {
        let m = Metrics::new().unwrap();
        let alloc = Allocatable {
            capacity: Resources { cpu_millis: 2000, memory: 1 << 30, pids: 100, ephemeral_storage: 10 },
            ..Allocatable::default()
        };
        m.set_allocatable(&alloc, 110);
        let signals =
            BTreeMap::from([(Signal::MemoryAvailable, SignalObservation { available: 5, capacity: 1 << 30 })]);
        let t = Thresholds {
            hard: vec![nodewarden_eviction::Threshold {
                signal: Signal::MemoryAvailable,
                amount: Amount::Percentage(0.5),
                grace_period: std::time::Duration::ZERO,
                min_reclaim: None,
            }],
            soft: vec![],
        };
        m.set_thresholds(&t, &signals);
        m.observe(&Observations::default(), &signals, 0.001);
        let text = m.render().unwrap();
        assert!(text.contains("kubelet_eviction_stats{eviction_signal=\"memory.available\"} 536870912"), "{text}");
        assert!(text.contains("nodewarden_node_capacity{resource=\"cpu\",unit=\"core\"} 2"), "{text}");
        assert!(text.contains("nodewarden_node_allocatable{resource=\"pods\",unit=\"integer\"} 110"), "{text}");
        assert!(text.contains("nodewarden_eviction_signal_value{eviction_signal=\"memory.available\"} 5"), "{text}");
        assert!(text.contains("# TYPE nodewarden_housekeeping_duration_seconds histogram"), "{text}");
    }

    #[test]
    fn pressure_sets_the_gauges_and_counts_the_stall_since_the_last_read() {
        let m = Metrics::new().unwrap();
        let psi = |avg10: f64, total: u64| {
            let line = nodewarden_resources::PsiLine { avg10, avg60: 0.0, avg300: 0.0, total };
            Some(Psi { some: line, full: None })
        };
        let stalled = |m: &Metrics| {
            let text = m.render().unwrap();
            text.lines()
                .find_map(|l| {
                    l.strip_prefix("nodewarden_pressure_stalled_seconds_total{kind=\"some\",resource=\"memory\"} ")
                })
                .map(|v| v.parse::<f64>().unwrap())
        };
        // The first read is the baseline: what was stalled before it is not counted.
        m.set_pressure(&Pressure {
            memory: psi(25.0, 9_000_000),
            kubepods_memory: psi(50.0, 1),
            ..Pressure::default()
        });
        assert_eq!(stalled(&m), None);
        m.set_pressure(&Pressure { memory: psi(10.0, 11_500_000), ..Pressure::default() });
        assert_eq!(stalled(&m), Some(2.5));
        // An older total (a scrape that read the file before the last one) counts nothing and is no new base.
        m.set_pressure(&Pressure { memory: psi(10.0, 10_000_000), ..Pressure::default() });
        m.set_pressure(&Pressure { memory: psi(10.0, 12_000_000), ..Pressure::default() });
        assert_eq!(stalled(&m), Some(3.0));
        let text = m.render().unwrap();
        let gauge = "nodewarden_pressure_avg10_ratio{cgroup=\"node\",kind=\"some\",resource=\"memory\"} 0.1";
        assert!(text.contains(gauge), "{text}");
        // A file missing in a read leaves its gauge as it was.
        let kubepods = "nodewarden_pressure_avg10_ratio{cgroup=\"kubepods\",kind=\"some\",resource=\"memory\"} 0.5";
        assert!(text.contains(kubepods), "{text}");
    }
}
