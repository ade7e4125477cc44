//! The daemon's health as `/readyz`, the Node's `Ready` condition and systemd's watchdog read it: each check
//! reads what the loops publish, never the ledger, so a request stuck on a hung cgroup write cannot hang them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use nodewarden_cluster::ClusterStatus;
use nodewarden_eviction::EvictionStatus;
use nodewarden_resources::{CgroupFs, CgroupPath, NodePressure};
use nodewarden_runtime::{Problem, RuntimeHealth, SelectedRuntime};
use nodewarden_sync::PodManager;
use tokio::sync::watch;

use crate::config::Config;

/// The kubelet's words for a node that shuts down (its shutdown manager's status), in `/readyz` and `Ready`.
pub const SHUTTING_DOWN: &str = "node is shutting down";

/// Set while the node shuts down (logind's `PrepareForShutdown`): `/readyz` and the Node's `Ready` say so.
#[derive(Debug, Clone, Default)]
pub struct NodeShutdown(Arc<AtomicBool>);

impl NodeShutdown {
    /// Whether the node is shutting down.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Marks the node as shutting down, or no longer.
    pub fn set(&self, shutting_down: bool) {
        self.0.store(shutting_down, Ordering::Relaxed);
    }
}

/// What the health checks read; clones share it.
#[derive(Clone)]
pub struct Health {
    /// The configuration in force (the housekeeping interval the eviction check allows for).
    config: watch::Receiver<Arc<Config>>,
    /// The eviction loop's last pass, conditions and inputs.
    eviction: Arc<EvictionStatus>,
    /// Pod sync: its loop, its sources and the runtime's health.
    pods: Arc<PodManager<SelectedRuntime>>,
    /// cgroupfs and the kubepods cgroup, read directly.
    probe: (CgroupFs, CgroupPath),
    node_shutdown: NodeShutdown,
    /// The node side's heartbeats, once the daemon has joined a cluster.
    cluster: Arc<OnceLock<Arc<ClusterStatus>>>,
}

impl Health {
    /// The checks of these parts of the daemon.
    pub fn new(
        config: watch::Receiver<Arc<Config>>,
        eviction: Arc<EvictionStatus>,
        pods: Arc<PodManager<SelectedRuntime>>,
        probe: (CgroupFs, CgroupPath),
        node_shutdown: NodeShutdown,
    ) -> Self {
        Self { config, eviction, pods, probe, node_shutdown, cluster: Arc::default() }
    }

    /// Adds the node side's `apiserver` check (once; a second call is ignored).
    pub fn set_cluster(&self, status: Arc<ClusterStatus>) {
        let _ = self.cluster.set(status);
    }

    /// Whether the eviction loop completed a pass within 3 × housekeepingInterval (at least 3 s).
    pub fn eviction(&self) -> Result<(), String> {
        let interval = self.config.borrow().eviction.housekeeping_interval;
        self.eviction.readiness((interval * 3).max(Duration::from_secs(3)))
    }

    /// The node conditions the eviction loop set last.
    pub fn pressure(&self) -> NodePressure {
        self.eviction.evaluation().pressure
    }

    /// Whether the node is shutting down.
    pub fn shutting_down(&self) -> bool {
        self.node_shutdown.get()
    }

    /// The readiness checks with their results.
    pub fn readiness(&self) -> Vec<(&'static str, Result<(), String>)> {
        self.readiness_with(self.pods.runtime_health())
    }

    /// [`Health::readiness`] with the runtime's health already read.
    pub fn readiness_with(&self, runtime: RuntimeHealth) -> Vec<(&'static str, Result<(), String>)> {
        let eviction = self.eviction();
        let (fs, kubepods) = &self.probe;
        let cgroupfs = fs.read(kubepods, "memory.max").map(|_| ()).map_err(|e| e.to_string());
        let podsync = self.pods.readiness();
        let problem = |p: Option<Problem>| p.map_or(Ok(()), |p| Err(p.to_string()));
        let inputs = self.eviction.inputs();
        let mut checks = vec![
            ("eviction", eviction),
            ("cgroupfs", cgroupfs),
            ("podsync", podsync),
            ("sources", self.synced()),
            ("runtime", problem(runtime.runtime)),
            ("network", problem(runtime.network)),
            ("evictioninputs", inputs),
        ];
        if self.shutting_down() {
            checks.push(("shutdown", Err(SHUTTING_DOWN.to_owned())));
        }
        if let Some(cluster) = self.cluster.get() {
            checks.push(("apiserver", cluster.readiness()));
        }
        checks
    }

    /// What systemd's watchdog is fed on: the pod sync loop ticks and the eviction loop passes. A pod's slow image
    /// pull, a runtime or an apiserver that is away is not the daemon's fault, and a restart would not mend it.
    pub fn progress(&self) -> Vec<(&'static str, Result<(), String>)> {
        vec![("podsync", self.pods.loop_health()), ("eviction", self.eviction())]
    }

    /// Whether every pod source's first pods have workers.
    pub fn synced(&self) -> Result<(), String> {
        self.pods.synced()
    }
}
