//! Joining a cluster: with `--kubeconfig`, the node side of `nodewarden-cluster` is started on the facts the
//! daemon already has (capacity and reported allocatable from the ledger, the eviction manager's conditions, the
//! readiness checks of `/readyz`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use nodewarden_cluster::{
    Clients, ClusterSettings, ClusterStatus, FactSource, NodeFacts, ObjectReader, PodWriter, binary_si, cpu,
    watch_credentials, watch_pods,
};
use nodewarden_resources::{Condition, Resources};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use nodewarden_eviction::EvictionStatus;
use nodewarden_runtime::SelectedRuntime;
use nodewarden_sync::{PodManager, PodSource, SourceSnapshot};

use crate::api_source::ApiPodSource;
use crate::daemon::{NodeReport, NodeResources};
use crate::health::Health;
use crate::pod_events::PodEvents;
use crate::pod_objects::ApiObjects;
use crate::pod_status::StatusManager;

/// The readiness checks that make the Node's `Ready` condition besides the runtime's own, worded as the
/// kubelet words its health checks (`<check> is not healthy: <why>`). The eviction inputs are left out: a
/// missing input drops some signals but the node still works.
const READY_CHECKS: &[(&str, Option<&str>)] = &[
    ("podsync", Some("pod sync is not healthy")),
    ("eviction", Some("eviction manager is not healthy")),
    ("cgroupfs", Some("cgroupfs is not healthy")),
    // The node's shutdown, in the kubelet's words as they are (`node is shutting down`).
    ("shutdown", None),
];

/// The daemon's view, as the node side reads it.
pub struct DaemonFacts {
    health: Health,
    pods: Arc<PodManager<SelectedRuntime>>,
    eviction: Arc<EvictionStatus>,
    node: NodeReport,
}

impl DaemonFacts {
    /// The facts of these parts of the daemon.
    pub fn new(
        health: Health,
        pods: Arc<PodManager<SelectedRuntime>>,
        eviction: Arc<EvictionStatus>,
        node: NodeReport,
    ) -> Self {
        Self { health, pods, eviction, node }
    }

    /// Why the node is not Ready now, in the kubelet's words and order: the runtime's own problem (`container
    /// runtime is down`, `container runtime not ready: ...`), the other checks of `/readyz` (as the kubelet's
    /// health checks), then the network's (`container runtime network not ready: NetworkReady=false ...`).
    fn not_ready(&self) -> Vec<String> {
        let runtime = self.pods.runtime_health();
        let checks = self.health.readiness_with(runtime.clone());
        let others = READY_CHECKS.iter().filter_map(|(name, wording)| {
            let (_, result) = checks.iter().find(|(n, _)| n == name)?;
            result.as_ref().err().map(|e| wording.map_or_else(|| e.clone(), |w| format!("{w}: {e}")))
        });
        let own = runtime.runtime.map(|p| p.message);
        own.into_iter().chain(others).chain(runtime.network.map(|p| p.message)).collect()
    }
}

impl FactSource for DaemonFacts {
    fn facts(&self) -> NodeFacts {
        let NodeResources { capacity, allocatable, max_pods } = self.node.get();
        let pressure = self.eviction.evaluation().pressure;
        let not_ready = self.not_ready();
        NodeFacts {
            capacity: quantities(&capacity, max_pods),
            allocatable: quantities(&allocatable, max_pods),
            memory_pressure: pressure.contains(Condition::MemoryPressure),
            disk_pressure: pressure.contains(Condition::DiskPressure),
            pid_pressure: pressure.contains(Condition::PidPressure),
            not_ready,
            runtime_version: self.pods.runtime_version(),
            images: self.pods.runtime_images().into_iter().map(|i| (i.names, i.size_bytes)).collect(),
        }
    }
}

/// `status.capacity` or `status.allocatable` as the kubelet prints them.
fn quantities(r: &Resources, max_pods: u32) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("cpu".to_owned(), cpu(r.cpu_millis)),
        ("memory".to_owned(), binary_si(r.memory)),
        ("ephemeral-storage".to_owned(), binary_si(r.ephemeral_storage)),
        ("pods".to_owned(), max_pods.to_string()),
    ])
}

/// The node side's settings from the config.
pub fn settings(c: &Config) -> ClusterSettings {
    ClusterSettings {
        node_name: c.pods.node_name.clone(),
        register_node: c.cluster.register_node,
        register_with_taints: c.cluster.register_with_taints.clone(),
        node_labels: c.cluster.node_labels.clone(),
        provider_id: c.cluster.provider_id.clone(),
        lease_duration: c.cluster.node_lease_duration,
        status_update_frequency: c.cluster.node_status_update_frequency,
        status_report_frequency: c.cluster.node_status_report_frequency,
        daemon_port: c.endpoints.healthz.map_or(0, |a| a.port()),
        node_ip: None,
        max_images: c.cluster.node_status_max_images,
        event_qps: c.cluster.event_record_qps,
        event_burst: c.cluster.event_burst,
    }
}

/// Reads the kubeconfig (an unusable one is an error now) and starts registration, heartbeats and node status
/// in the background: building the clients loads the root certificates, which no other part of the start waits
/// for. Once the Node is registered, the node's pods are watched and sent to `pod_source` (as source `api`, which
/// the pod manager must expect), and their statuses reported. The status is `/readyz`'s `apiserver` check from
/// the start.
#[expect(clippy::too_many_arguments, reason = "the parts of the daemon the cluster side joins, each once")]
pub async fn start(
    kubeconfig: &Path,
    config: &Config,
    node_ip: Option<std::net::IpAddr>,
    facts: DaemonFacts,
    pod_events: Arc<PodEvents>,
    pod_objects: Arc<ApiObjects>,
    pod_source: mpsc::Sender<SourceSnapshot>,
    start_sli: prometheus::Histogram,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) -> anyhow::Result<Arc<ClusterStatus>> {
    let s = ClusterSettings { node_ip, ..settings(config) };
    let kube_config = Clients::read_kubeconfig(kubeconfig).await?;
    tracing::info!(node = %s.node_name, apiserver = %kube_config.cluster_url, "joining the cluster");
    let status = Arc::new(ClusterStatus::new(s.lease_duration));
    let conditions = facts.eviction.conditions_changed();
    let facts = Arc::new(facts);
    let (changed_tx, changed) = watch::channel(0u64);
    tasks.spawn(watch_changes(facts.clone(), conditions, changed_tx, shutdown.clone()));
    let (qps, burst, timeout) = (config.cluster.kube_api_qps, config.cluster.kube_api_burst, s.heartbeat_timeout());
    let (status2, tasks2, shutdown2) = (status.clone(), tasks.clone(), shutdown.clone());
    let path = kubeconfig.to_path_buf();
    tasks.spawn(async move {
        let built = tokio::task::spawn_blocking(move || Clients::from_config(kube_config, qps, burst, timeout)).await;
        let error = match built {
            Ok(Ok(clients)) => {
                // A renewed client certificate (or token) is taken up without a restart.
                tasks2.spawn(watch_credentials(path, clients.clone(), qps, burst, timeout, shutdown2.clone()));
                let node = s.node_name.clone();
                let pods = facts.pods.clone();
                let (c, st) = (clients.clone(), status2.clone());
                let recorder =
                    nodewarden_cluster::start(status2, s, clients.clone(), facts, changed, &tasks2, shutdown2.clone());
                pod_events.join(recorder);
                let pulls = pod_events.clone();
                pod_objects.join(ObjectReader::new(clients.clone()));
                let (set_tx, set) = watch::channel(None);
                let mirrors = PodWriter::new(clients.clone());
                let mirroring =
                    crate::mirror::run(pods.clone(), mirrors, st.clone(), node.clone(), set.clone(), shutdown2.clone());
                tasks2.spawn(mirroring);
                tasks2.spawn(watch_pods(c, st, node, set_tx, shutdown2.clone()));
                let source = ApiPodSource { pods: set.clone(), start_sli, pulls };
                tasks2.spawn(source.run(pod_source, shutdown2.clone()));
                match StatusManager::new(pods.store(), PodWriter::new(clients), set) {
                    Some(manager) => {
                        tasks2.spawn(manager.run(shutdown2));
                    }
                    None => tracing::error!("the pod status feed has another reader; pod statuses are not reported"),
                }
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(e) => format!("building the clients failed: {e}"),
        };
        tracing::error!(error = %error, "cannot join the cluster");
        status2.register_failed(error);
        // The apiserver's source stays open without speaking: the pods adopted at start may be the apiserver's,
        // and none is cleaned up for a join that failed.
        shutdown2.cancelled().await;
        drop(pod_source);
    });
    Ok(status)
}

/// How often readiness is looked at for a change to post.
const READINESS_POLL: Duration = Duration::from_secs(1);

/// Tells the status loop when to report at once: when the eviction manager changes a condition, and when the
/// reasons the node is not Ready change (looked at every second), so Ready flips reach the apiserver within a
/// second instead of at the next `nodeStatusUpdateFrequency`.
async fn watch_changes(
    facts: Arc<DaemonFacts>,
    mut conditions: watch::Receiver<u64>,
    changed: watch::Sender<u64>,
    shutdown: CancellationToken,
) {
    let bump = || changed.send_modify(|g| *g = g.wrapping_add(1));
    let mut last: Option<Vec<String>> = None;
    let mut tick = tokio::time::interval(READINESS_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut conditions_open = true;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            r = conditions.changed(), if conditions_open => {
                conditions_open = r.is_ok();
                if conditions_open { bump() }
            }
            _ = tick.tick() => {
                let f = facts.clone();
                let Ok(now) = tokio::task::spawn_blocking(move || f.not_ready()).await else { continue };
                if last.as_ref().is_some_and(|l| *l != now) {
                    bump();
                }
                last = Some(now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn probes_say_the_kubernetes_release_the_node_reports() {
        // The kubelet's prober names its own release in its User-Agent; pod sync's and the Node's must agree.
        let request = nodewarden_sync::http_probe_request("127.0.0.1", 80, "/", &[]);
        let agent = format!("User-Agent: kube-probe/{}\r\n", nodewarden_cluster::KUBERNETES_VERSION);
        assert!(request.contains(&agent), "{request}");
    }
}
