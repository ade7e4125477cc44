//! The node's side of a Kubernetes cluster, as the kubelet does it: the Node registered (and its default labels
//! reconciled), a Lease in `kube-node-lease` renewed every quarter of its duration on a client of its own, the
//! node status patched (strategic merge) when it changed or the report frequency passed, condition transitions
//! posted at once with their Normal events, and the `Ready` condition from the same facts `/readyz` reports.
//!
//! Every loop retries with the kubelet's back-off while the apiserver is away; nothing here ever stops pod sync
//! or eviction. [`ClusterStatus`] says how the heartbeats fare, for `/readyz`.

mod backoff;
mod bounded;
mod client;
mod conditions;
mod correlate;
mod credentials;
mod events;
mod host;
mod labels;
mod lease;
mod node;
mod objects;
mod pods;
mod register;
mod status;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Taint;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use client::{Clients, RateLimiter};
pub use conditions::aggregate;
pub use credentials::watch as watch_credentials;
pub use events::{NodeEvent, PodRef, Recorder};
pub use host::{HostInfo, node_ip};
/// An error of a request to the apiserver.
pub use kube::Error as KubeError;
pub use labels::{check_label_syntax, check_node_label};
pub use node::{KUBERNETES_VERSION, binary_si, cpu, go_arch, kubelet_version};
pub use objects::{IssuedToken, ObjectReader};
pub use pods::{
    MIRROR_ANNOTATION, OWNED_STATUS_FIELDS, PodSet, PodWriter, Written, config_hash, is_mirror, watch_pods,
};

/// Why the node side cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The kubeconfig cannot be read or used.
    #[error("kubeconfig {path}: {reason}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The client cannot be built from the kubeconfig (TLS material, URL).
    #[error("cannot build the apiserver client: {0}")]
    Client(String),
}

/// The settings of the node side, from the kubelet's config fields.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSettings {
    /// The Node's name.
    pub node_name: String,
    /// `registerNode`: create the Node (else only report on one that exists).
    pub register_node: bool,
    /// `registerWithTaints`: the taints a newly created Node gets.
    pub register_with_taints: Vec<Taint>,
    /// `nodeLabels`: labels a newly created Node gets, after the defaults.
    pub node_labels: BTreeMap<String, String>,
    /// `providerID`.
    pub provider_id: Option<String>,
    /// `nodeLeaseDurationSeconds`.
    pub lease_duration: Duration,
    /// `nodeStatusUpdateFrequency`: how often the status is computed (and patched if it changed).
    pub status_update_frequency: Duration,
    /// `nodeStatusReportFrequency`: the longest time between two patches of an unchanged status.
    pub status_report_frequency: Duration,
    /// The port reported in `daemonEndpoints.kubeletEndpoint` (the port nodewarden serves, 0 if none).
    pub daemon_port: u16,
    /// The node's `InternalIP`: `--node-ip`, or the address [`node_ip`] found at start; none if neither.
    pub node_ip: Option<IpAddr>,
    /// `nodeStatusMaxImages`: the most images `status.images` lists, the largest first; `None` for all.
    pub max_images: Option<usize>,
    /// `eventRecordQPS`: the events posted per second at most; `None` for no limit.
    pub event_qps: Option<f64>,
    /// `eventBurst`: the events posted in a burst at most, with a limit.
    pub event_burst: u32,
}

impl ClusterSettings {
    /// The Lease renewal interval: a quarter of the duration (the kubelet's `nodeLeaseRenewIntervalFraction`).
    pub fn renew_interval(&self) -> Duration {
        self.lease_duration / 4
    }

    /// The heartbeat client's timeout: min(nodeStatusUpdateFrequency, nodeLeaseDurationSeconds).
    pub fn heartbeat_timeout(&self) -> Duration {
        self.status_update_frequency.min(self.lease_duration).max(Duration::from_secs(1))
    }
}

/// What the node reports, as the daemon sees it now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// `status.capacity`: resource name → quantity.
    pub capacity: BTreeMap<String, String>,
    /// `status.allocatable` (the reported allocatable).
    pub allocatable: BTreeMap<String, String>,
    /// The eviction manager's MemoryPressure.
    pub memory_pressure: bool,
    /// The eviction manager's DiskPressure.
    pub disk_pressure: bool,
    /// The eviction manager's PIDPressure.
    pub pid_pressure: bool,
    /// Why the node is not Ready (empty when it is): the runtime, its network, pod sync, the eviction loop.
    pub not_ready: Vec<String>,
    /// `<runtime>://<version>`, the version `Unknown` while the runtime does not answer.
    pub runtime_version: String,
    /// The images the runtime holds: (names, digests first, then tags; size in bytes).
    pub images: Vec<(Vec<String>, u64)>,
}

/// Where the node side reads the facts it reports.
pub trait FactSource: Send + Sync + 'static {
    /// The facts now.
    fn facts(&self) -> NodeFacts;
}

/// How the heartbeats fare, for `/readyz`.
#[derive(Debug)]
pub struct ClusterStatus {
    started: Instant,
    last_heartbeat: Mutex<Option<Instant>>,
    /// Why the last heartbeat failed, until one succeeds.
    heartbeat_error: Mutex<Option<String>>,
    /// Why registration (or building the clients) failed, until it succeeds.
    register_error: Mutex<Option<String>>,
    /// `Some` once the Node is registered: its UID (empty if the apiserver gave none).
    node_uid: Mutex<Option<String>>,
    /// Set while the Node is gone from the apiserver after it was registered (deleted by an operator).
    deleted: AtomicBool,
    /// Set when a request failed: the apiserver's Node may have changed meanwhile (the node lifecycle
    /// controller marks a quiet node Unknown), so the next status report reads it first.
    stale: AtomicBool,
    /// Told when a heartbeat succeeds while the Node is stale, so its status is put right at once.
    reconnected: Notify,
    lease_duration: Duration,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ClusterStatus {
    /// The status of a node side about to start: no heartbeat yet.
    pub fn new(lease_duration: Duration) -> ClusterStatus {
        ClusterStatus {
            started: Instant::now(),
            last_heartbeat: Mutex::new(None),
            heartbeat_error: Mutex::new(None),
            register_error: Mutex::new(None),
            node_uid: Mutex::new(None),
            deleted: AtomicBool::new(false),
            stale: AtomicBool::new(false),
            reconnected: Notify::new(),
            lease_duration,
        }
    }

    fn heartbeat_ok(&self) {
        *lock(&self.last_heartbeat) = Some(Instant::now());
        *lock(&self.heartbeat_error) = None;
        if self.stale.load(Ordering::SeqCst) {
            self.reconnected.notify_one();
        }
    }

    fn heartbeat_failed(&self, error: String) {
        *lock(&self.heartbeat_error) = Some(error);
        self.stale.store(true, Ordering::SeqCst);
    }

    /// Marks the apiserver's Node as possibly changed behind the node's back (a failed request).
    fn mark_stale(&self) {
        self.stale.store(true, Ordering::SeqCst);
    }

    /// Whether the Node must be read before the next report; clears the mark.
    fn take_stale(&self) -> bool {
        self.stale.swap(false, Ordering::SeqCst)
    }

    /// Records whether the Node is gone from the apiserver; true when that is news.
    fn set_deleted(&self, deleted: bool) -> bool {
        self.deleted.swap(deleted, Ordering::SeqCst) != deleted
    }

    /// Records why the node could not register (or join at all), for `/readyz`.
    pub fn register_failed(&self, error: String) {
        *lock(&self.register_error) = Some(error);
    }

    fn registered(&self, uid: Option<String>) {
        *lock(&self.register_error) = None;
        *lock(&self.node_uid) = Some(uid.unwrap_or_default());
    }

    /// The registered Node's UID, once known.
    pub fn node_uid(&self) -> Option<String> {
        lock(&self.node_uid).clone().filter(|u| !u.is_empty())
    }

    /// `Ok` once the Node is registered and while the last Lease renewal is younger than the Lease's duration;
    /// else what is missing, how old the last heartbeat is, and the last error.
    pub fn readiness(&self) -> Result<(), String> {
        if lock(&self.node_uid).is_none() {
            let error = lock(&self.register_error).clone().map(|e| format!(": {e}")).unwrap_or_default();
            return Err(format!(
                "the Node is not registered yet ({:.1}s since start){error}",
                self.started.elapsed().as_secs_f64()
            ));
        }
        if self.deleted.load(Ordering::SeqCst) {
            return Err(NODE_DELETED.to_owned());
        }
        let error = lock(&self.heartbeat_error).clone().map(|e| format!(": {e}")).unwrap_or_default();
        match *lock(&self.last_heartbeat) {
            Some(t) if t.elapsed() <= self.lease_duration => Ok(()),
            Some(t) => Err(format!("last heartbeat accepted {:.1}s ago{error}", t.elapsed().as_secs_f64())),
            None => Err(format!(
                "no heartbeat accepted yet ({:.1}s since start){error}",
                self.started.elapsed().as_secs_f64()
            )),
        }
    }
}

/// What `/readyz` and the log say of a Node deleted from the apiserver after it was registered.
pub const NODE_DELETED: &str = "the Node was deleted from the apiserver (fenced or decommissioned by an operator); \
                                it is not registered again until nodewarden restarts";

/// What every loop shares.
pub(crate) struct Ctx {
    pub(crate) settings: ClusterSettings,
    pub(crate) clients: Clients,
    pub(crate) host: HostInfo,
    pub(crate) facts: Arc<dyn FactSource>,
    pub(crate) status: Arc<ClusterStatus>,
    pub(crate) events: Recorder,
}

/// Starts registration, the Lease and the node status loops (and the event poster) as tracked tasks that end
/// on `shutdown`, reporting to `status`. `changed` is bumped by the daemon when a condition changes, so the
/// status is computed (and, if it changed, posted) at once instead of at the next tick. The recorder returned
/// takes the events of the node's pods.
pub fn start(
    status: Arc<ClusterStatus>,
    settings: ClusterSettings,
    clients: Clients,
    facts: Arc<dyn FactSource>,
    changed: watch::Receiver<u64>,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) -> Recorder {
    // As the kubelet's: the node name is the host name unless overridden, and the override names both.
    let host = HostInfo { hostname: settings.node_name.clone(), ..HostInfo::read(settings.node_ip) };
    let limit = settings.event_qps.map(|qps| RateLimiter::new(qps, settings.event_burst));
    let (events, poster) = Recorder::new(&settings.node_name, clients.clone(), limit);
    tasks.spawn(poster.run(shutdown.clone()));
    let ctx = Arc::new(Ctx { settings, clients, host, facts, status, events: events.clone() });
    tasks.spawn(lease::run(ctx.clone(), shutdown.clone()));
    tasks.spawn(status::run(ctx, changed, shutdown));
    events
}
