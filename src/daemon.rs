//! The daemon: checks the host, builds the kubepods tree, adopts existing pods, serves the endpoints, keeps
//! observing the node, and shuts down on SIGTERM or SIGINT leaving pod cgroups in place for the next start.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use std::collections::BTreeMap;

use anyhow::Context;
use nodewarden_eviction::{
    EvictionManager, EvictionMetrics, EvictionSettings, EvictionStatus, PassObserver, Signal, SignalObservation,
    Thresholds,
};
use nodewarden_resources::{
    CgroupDriver, CgroupError, CgroupFs, CgroupPath, HostError, HostPaths, Ledger, Observations, REQUIRED_CONTROLLERS,
    ResourceManager, check_host,
};
use nodewarden_runtime::cri::{CriRuntime, CriSettings, RuntimeMetrics, managed_value};
use nodewarden_runtime::{ImageService as _, ProcessRuntime, SelectedRuntime};
use nodewarden_sync::{
    API_SOURCE, FILE_SOURCE, HTTP_SOURCE, PodManager, PodSource, StaticPodSource, SyncMetrics, SyncSettings,
};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::health::{Health, NodeShutdown};
use crate::http::Endpoints;
use crate::metrics::Metrics;
use crate::pod_events::PodEvents;
use crate::pod_objects::ApiObjects;
use crate::reload::Reloader;
use crate::url_source::UrlPodSource;

/// What the Node reports of the ledger.
#[derive(Debug, Clone, Copy)]
pub struct NodeResources {
    /// The node's capacity.
    pub capacity: nodewarden_resources::Resources,
    /// The reported allocatable (capacity − reserved − hard eviction thresholds).
    pub allocatable: nodewarden_resources::Resources,
    /// `maxPods`.
    pub max_pods: u32,
}

impl NodeResources {
    /// What `m` reports now.
    pub fn of(m: &ResourceManager) -> NodeResources {
        let a = m.allocatable();
        NodeResources { capacity: a.capacity, allocatable: a.reported, max_pods: m.config().max_pods }
    }
}

/// Capacity, the reported allocatable and maxPods, kept apart from the ledger (and replaced by a reload) so that
/// reporting them never waits for it; clones share it.
#[derive(Debug, Clone)]
pub struct NodeReport(Arc<Mutex<NodeResources>>);

impl NodeReport {
    /// What the Node reports now.
    pub fn get(&self) -> NodeResources {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Replaces it.
    pub fn set(&self, r: NodeResources) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = r;
    }
}

/// The eviction loop's settings from the config.
pub(crate) fn eviction_settings(c: &Config) -> EvictionSettings {
    EvictionSettings {
        thresholds: c.eviction.thresholds.clone(),
        transition_period: c.eviction.pressure_transition_period,
        max_pod_grace_period: Duration::from_secs(u64::from(c.eviction.max_pod_grace_period)),
        poll_min: c.eviction.poll_min,
        poll_max: c.eviction.housekeeping_interval,
    }
}

/// Keeps the node gauges current from the eviction loop's observations.
struct Gauges {
    metrics: Arc<Metrics>,
}

impl PassObserver for Gauges {
    fn observed(
        &self,
        obs: &Observations,
        signals: &BTreeMap<Signal, SignalObservation>,
        thresholds: &Thresholds,
        took: Duration,
    ) {
        self.metrics.set_thresholds(thresholds, signals);
        self.metrics.observe(obs, signals, took.as_secs_f64());
    }

    fn failed(&self, _error: &CgroupError) {
        self.metrics.housekeeping_failed();
    }
}

/// The runtime `containerRuntimeEndpoint` selects. For CRI, the runtime's version is checked first: a runtime
/// that does not serve CRI v1 stops the daemon; one that does not answer yet is waited for (pods wait, `/readyz`
/// says why) while everything else is served.
async fn connect_cri(
    config: &Config,
    metrics: &Metrics,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) -> Result<Option<Cri>, DaemonError> {
    let Some(endpoint) = &config.runtime.endpoint else { return Ok(None) };
    let settings = CriSettings {
        endpoint: endpoint.clone(),
        request_timeout: config.runtime.request_timeout,
        parallel_pulls: config.images.parallel_pulls,
        poll: CRI_POLL,
        managed: managed_value(&config.pods.root_dir),
    };
    let runtime_metrics = RuntimeMetrics::new(metrics.registry()).context("cannot create metrics")?;
    let cri = Arc::new(CriRuntime::new(settings, Some(runtime_metrics)).context("containerRuntimeEndpoint")?);
    let answered = match cri.check_version().await {
        Ok((name, version)) => {
            tracing::info!(%endpoint, runtime = %name, %version, "CRI runtime connected");
            true
        }
        Err(e) if e.is_transient() => {
            tracing::error!(error = %e, "the CRI runtime does not answer; pods wait until it does");
            false
        }
        Err(e) => return Err(anyhow::Error::new(e).into()),
    };
    tasks.spawn(cri.clone().monitor(shutdown.clone()));
    Ok(Some(Cri { runtime: cri, answered }))
}

/// A CRI runtime, and whether it answered at start.
struct Cri {
    runtime: Arc<CriRuntime>,
    answered: bool,
}

/// How long the start waits for the runtime to name its image file system.
const IMAGE_FS_WAIT: Duration = Duration::from_secs(10);

/// The image file system: under CRI the one the runtime names (`ImageFsInfo`), as the kubelet measures it; else,
/// or where the runtime names none or did not answer at start, `nodewarden.imagefsPath` (until a restart: the
/// observations read one file system for the daemon's life).
async fn image_fs(config: &Config, cri: Option<&Cri>) -> PathBuf {
    let configured = &config.host.imagefs_path;
    let Some(cri) = cri.filter(|c| c.answered) else { return configured.clone() };
    let why = match tokio::time::timeout(IMAGE_FS_WAIT, cri.runtime.image_fs()).await {
        Ok(Ok(Some(named))) => {
            if !crate::image_gc::same_fs(&named, configured) {
                tracing::info!(
                    runtime = %named.display(),
                    imagefs_path = %configured.display(),
                    "the image file system is the one the runtime names (ImageFsInfo), not nodewarden.imagefsPath"
                );
            }
            return named;
        }
        Ok(Ok(None)) => "the runtime names none".to_owned(),
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer within {IMAGE_FS_WAIT:?}"),
    };
    tracing::warn!(reason = %why, imagefs_path = %configured.display(), "the runtime's image file system is unknown; nodewarden.imagefsPath is measured");
    configured.clone()
}

/// How often the CRI runtime's containers are listed (exits, health): the kubelet's PLEG relist period.
const CRI_POLL: Duration = Duration::from_secs(1);

/// Raises the open-file limit to `maxOpenFiles`, as the kubelet does at start, so that many connections or pods
/// never make a directory listing or an observation fail with EMFILE. Where the hard limit cannot be raised that
/// far (no privilege, or past `fs.nr_open`), the soft limit goes up to the hard one and a warning says so.
fn raise_open_files(wanted: u64) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let now = getrlimit(Resource::Nofile);
    if now.current.is_some_and(|c| c >= wanted) {
        return;
    }
    // The hard limit is raised to `wanted` if it is lower, never lowered.
    let maximum = now.maximum.map(|m| m.max(wanted));
    if setrlimit(Resource::Nofile, Rlimit { current: Some(wanted), maximum }).is_ok() {
        tracing::info!(limit = wanted, "raised the open-file limit (maxOpenFiles)");
        return;
    }
    let hard = now.maximum;
    let raised = setrlimit(Resource::Nofile, Rlimit { current: hard, maximum: hard }).is_ok();
    let limit = if raised { hard } else { now.current };
    tracing::warn!(maxOpenFiles = wanted, limit = ?limit, "cannot raise the open-file limit to maxOpenFiles; running with the limit shown");
}

/// Moves the daemon into its own cgroup with `memory.min` protection, makes it the last process the kernel
/// OOM killer would choose, and locks its pages in memory. Failures are logged: the daemon runs on without the
/// protection.
fn protect_self(manager: &ResourceManager, config: &Config) {
    // A systemd service stays in its unit's cgroup: journald files its log under the unit by that cgroup, and
    // the unit's own settings (MemoryMin=, OOMScoreAdjust=) protect it there.
    if config.host.daemon_cgroup.is_some() && config.resources.cgroup_driver == CgroupDriver::Systemd {
        tracing::info!(
            "under the systemd cgroup driver the daemon stays where systemd put it (daemonCgroup is not used; run \
             it as a unit with MemoryMin=)"
        );
    } else if config.host.daemon_cgroup.is_some() && std::env::var_os("INVOCATION_ID").is_some() {
        tracing::info!(
            "running as a systemd service: the daemon stays in its unit's cgroup (daemonCgroup is not used)"
        );
    } else if let Some(name) = &config.host.daemon_cgroup {
        match manager.place_daemon(name, std::process::id(), config.host.daemon_memory_min) {
            Ok(cg) => {
                tracing::info!(cgroup = %cg, memory_min = config.host.daemon_memory_min, "moved the daemon into its own cgroup")
            }
            Err(e) => tracing::warn!(error = %e, "cannot move the daemon into its own cgroup; it runs unprotected"),
        }
    }
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", DAEMON_OOM_SCORE_ADJ.to_string()) {
        tracing::warn!(error = %e, "cannot set the daemon's oom_score_adj");
    }
    lock_memory();
}

/// Locks the daemon's pages in memory: what is mapped now (the binary's code and data, faulted in at once) and,
/// as they are touched, the pages mapped later. Measured in the VM: the code of the eviction path (set pressure,
/// gather candidates, hand the pod to its worker, SIGTERM) runs only when the node is short of memory, which is
/// exactly when the kernel has dropped the binary's clean pages from the page cache; every step then waited for
/// page-ins from disk (tens of ms each, hundreds in all between the crossing and SIGTERM).
fn lock_memory() {
    use rustix::mm::{MlockAllFlags, mlockall};
    let locked =
        mlockall(MlockAllFlags::CURRENT).and_then(|()| mlockall(MlockAllFlags::FUTURE | MlockAllFlags::ONFAULT));
    if let Err(e) = locked {
        tracing::warn!(error = %e, "cannot lock the daemon's memory; under memory pressure its eviction path may wait for page-ins");
    }
}

/// The daemon's `oom_score_adj`, as the kubelet's own.
const DAEMON_OOM_SCORE_ADJ: i32 = -999;

/// The nearest existing ancestor of `path` (statfs needs an existing path; `/var/lib/kubelet` may not exist yet).
pub(crate) fn existing_ancestor(path: &Path) -> PathBuf {
    path.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/")).to_path_buf()
}

/// True when the running kernel is at least `major.minor`.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let uname = rustix::system::uname();
    let release = uname.release().to_string_lossy();
    let mut parts = release.split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse::<u32>().ok());
    match (parts.next(), parts.next()) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}

/// How long the exit waits for each group of tasks after the shutdown token is cancelled.
const TASK_DRAIN: Duration = Duration::from_secs(5);

/// Why the daemon stopped.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The host cannot run nodewarden (no cgroup v2, missing controllers, not writable).
    #[error(transparent)]
    Host(#[from] HostError),
    /// `protectKernelDefaults` and a kernel tunable that differs.
    #[error(transparent)]
    KernelDefaults(#[from] crate::kernel_defaults::KernelDefaultsError),
    /// `failSwapOn` and swap on.
    #[error(transparent)]
    Swap(#[from] crate::swap::SwapError),
    /// `cgroupDriver: systemd` on a host where systemd cannot be reached.
    #[error(transparent)]
    Systemd(#[from] nodewarden_systemd::SlicesError),
    /// Another nodewarden holds the node lock in rootDir.
    #[error(transparent)]
    Locked(#[from] crate::lock::LockError),
    /// Anything else, with context.
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// The daemon's parts once the host is set up, each a handle that its consumers share, and the eviction loop, not
/// started yet. [`run`] and the tests build it the same way, and each consumer is handed the parts it uses.
pub(crate) struct Daemon {
    /// The ledger, the only writer of cgroupfs.
    pub(crate) ledger: Ledger,
    /// Pod sync.
    pub(crate) pods: Arc<PodManager<SelectedRuntime>>,
    /// The metrics.
    pub(crate) metrics: Arc<Metrics>,
    /// The eviction loop's state: its last pass and the recent evictions.
    pub(crate) eviction_status: Arc<EvictionStatus>,
    /// The readiness and progress checks.
    pub(crate) health: Health,
    /// What a reload changes.
    pub(crate) reloader: Arc<Reloader>,
    /// What the Node reports of the ledger.
    pub(crate) node: NodeReport,
    /// Set while the node shuts down.
    pub(crate) node_shutdown: NodeShutdown,
    /// The node's address, found once at start: the Node's `InternalIP` and every pod's `hostIP`.
    pub(crate) node_ip: Option<std::net::IpAddr>,
    /// The kubepods cgroup.
    pub(crate) kubepods: CgroupPath,
    /// Where pod events go: the log, and the apiserver once the node joined a cluster.
    pub(crate) pod_events: Arc<PodEvents>,
    /// Where pods' ConfigMaps, Secrets and tokens come from: the apiserver once the node joined a cluster.
    pub(crate) pod_objects: Arc<ApiObjects>,
    /// The eviction loop.
    pub(crate) eviction: EvictionManager<PodManager<SelectedRuntime>>,
    /// `kubelet_evictions`, where the evictions for ephemeral-storage limits (made outside the loop) count too.
    pub(crate) limit_evictions: prometheus::IntCounterVec,
}

impl Daemon {
    /// Wires pod sync and the eviction loop to the ledger made of `manager` (set up), on the daemon's one task
    /// tracker and shutdown token. Nothing runs yet.
    pub(crate) fn build(
        config: Config,
        manager: ResourceManager,
        runtime: SelectedRuntime,
        settings: SyncSettings,
        metrics: Arc<Metrics>,
        tasks: &TaskTracker,
        shutdown: &CancellationToken,
    ) -> Result<Self, DaemonError> {
        let kubepods = manager.tree().kubepods.clone();
        let probe = (manager.cgroupfs().clone(), kubepods.clone());
        let node = NodeReport(Arc::new(Mutex::new(NodeResources::of(&manager))));
        // The node's address is the pods' host IP.
        let node_ip = settings.host_ips.first().and_then(|ip| ip.parse().ok());
        let ledger = Ledger::new(manager);
        let sync_metrics = SyncMetrics::new(metrics.registry()).context("cannot create metrics")?;
        let (t, s) = (tasks.clone(), shutdown.clone());
        let pod_events = Arc::new(PodEvents::default());
        // An object is read at most once per sync period, however many pods use it.
        let pod_objects = Arc::new(ApiObjects::new(settings.sync_frequency));
        let ports = nodewarden_sync::Ports { events: pod_events.clone(), objects: pod_objects.clone() };
        let pods = PodManager::new(ledger.clone(), Arc::new(runtime), settings, sync_metrics, ports, t, s);
        let (settings_tx, settings_rx) = watch::channel(Arc::new(eviction_settings(&config)));
        let eviction_metrics = EvictionMetrics::new(metrics.registry()).context("cannot create metrics")?;
        let limit_evictions = eviction_metrics.evictions.clone();
        let gauges: Arc<dyn PassObserver> = Arc::new(Gauges { metrics: metrics.clone() });
        let eviction = EvictionManager::new(
            ledger.clone(),
            pods.clone(),
            settings_rx,
            eviction_metrics,
            Some(gauges),
            tasks.clone(),
            shutdown.clone(),
        );
        let eviction_status = eviction.status();
        let config = watch::Sender::new(Arc::new(config));
        let node_shutdown = NodeShutdown::default();
        let health =
            Health::new(config.subscribe(), eviction_status.clone(), pods.clone(), probe, node_shutdown.clone());
        let reloader = Arc::new(Reloader {
            config,
            ledger: ledger.clone(),
            node: node.clone(),
            metrics: metrics.clone(),
            eviction: settings_tx,
        });
        Ok(Self {
            ledger,
            pods,
            metrics,
            eviction_status,
            health,
            reloader,
            node,
            node_shutdown,
            node_ip,
            kubepods,
            pod_events,
            pod_objects,
            eviction,
            limit_evictions,
        })
    }

    /// The state of the HTTP endpoints.
    pub(crate) fn endpoints(&self) -> Endpoints {
        Endpoints {
            health: self.health.clone(),
            metrics: self.metrics.clone(),
            view: self.ledger.view().clone(),
            store: self.pods.store(),
            eviction: self.eviction_status.clone(),
            config: self.reloader.config.subscribe(),
        }
    }
}

/// The flags of `nodewarden run` beside the config file (the kubelet's, and restart-only as its are).
#[derive(Debug, Clone, Default)]
pub struct Flags {
    /// `--kubeconfig`: the node joins the cluster it names.
    pub kubeconfig: Option<PathBuf>,
    /// `--node-ip`: the node's address, instead of the one found.
    pub node_ip: Option<std::net::IpAddr>,
}

/// Runs the daemon until SIGTERM or SIGINT. `path` is the config file, watched for edits.
pub async fn run(mut config: Config, path: PathBuf, flags: Flags) -> Result<(), DaemonError> {
    // From the first moment: a SIGTERM during a long start (waiting for CRI or the apiserver) takes the shutdown
    // path instead of the default action.
    let mut signals = Signals::install().context("cannot install signal handlers")?;
    for f in &config.ignored {
        tracing::info!(field = %f, "kubelet config field is not implemented by nodewarden and is ignored");
    }
    for w in &config.warnings {
        tracing::warn!("{w}");
    }
    let fs = CgroupFs::new(&config.host.cgroup_mount, config.resources.cgroup_root.clone());
    let systemd_driver = config.resources.cgroup_driver == CgroupDriver::Systemd;
    // Under the systemd driver the root's slices are systemd's to make: the host is checked at the top, the
    // kubepods slice once it is there.
    let checked_root = if systemd_driver { CgroupPath::root() } else { config.resources.cgroup_root.clone() };
    let checked = check_host(&fs, &checked_root);
    if let Err(e) = &checked
        && !matches!(e, HostError::MissingControllers { .. })
    {
        return Err(e.clone().into());
    }
    // Before anything is touched (the check above only reads): a second daemon on this root changes nothing.
    let _lock = crate::lock::lock(&config.pods.root_dir)?;
    // The systemd driver asks systemd for every slice: refused, before anything is made, where it cannot.
    let slices = if systemd_driver { Some(Arc::new(nodewarden_systemd::SystemdSlices::connect()?)) } else { None };
    if !systemd_driver && Path::new("/run/systemd/system").exists() {
        tracing::warn!(
            "systemd is the init system and owns the cgroup tree; nodewarden writes its kubepods tree beside it \
             (the cgroupfs driver; cgroupDriver: systemd has systemd make it)"
        );
    }
    // Under the systemd driver systemd enables the controllers its slices need: checked once they are there.
    if checked.is_err() && !systemd_driver {
        // Controllers the ancestors offer but have not enabled (a systemd host enables at the root only what its
        // units need) are enabled, as the kubelet's cgroupfs driver does; then the check must pass.
        match fs.enable_above_scope(&REQUIRED_CONTROLLERS) {
            Ok(changed) => {
                for (cg, enabled) in changed {
                    tracing::info!(cgroup = %cg, ?enabled, "enabled controllers for the cgroup root's subtree");
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot enable the controllers above the cgroup root"),
        }
        check_host(&fs, &config.resources.cgroup_root)?;
    }
    raise_open_files(config.host.max_open_files);
    // Only on a host that can run pods: nothing is changed where the daemon will not run.
    crate::kernel_defaults::ensure(Path::new("/proc/sys"), config.host.protect_kernel_defaults)?;
    crate::swap::check(Path::new("/proc"), config.host.fail_swap_on)?;
    if config.resources.memory_qos && !kernel_at_least(5, 9) {
        tracing::warn!("Memory QoS needs Linux 5.9 or newer; memory.min and memory.high are not set");
        config.resources.memory_qos = false;
    }
    // Before the observations: a CRI runtime names the image file system they read. One shutdown path: every
    // long-lived task ends on this token and is tracked, so the exit waits for them.
    let metrics = Arc::new(Metrics::new().context("cannot create metrics")?);
    let shutdown = CancellationToken::new();
    let tasks = TaskTracker::new();
    let cri = match signals.unless(connect_cri(&config, &metrics, &tasks, &shutdown)).await {
        Ok(cri) => cri?,
        Err(signal) => return stop_early(signal, &shutdown, &[&tasks]).await,
    };
    let imagefs = match signals.unless(image_fs(&config, cri.as_ref())).await {
        Ok(path) => path,
        Err(signal) => return stop_early(signal, &shutdown, &[&tasks]).await,
    };
    let host = HostPaths {
        nodefs: existing_ancestor(&config.host.nodefs_path),
        imagefs: existing_ancestor(&imagefs),
        ..HostPaths::default()
    };
    let proc = host.proc.clone();
    let mut manager =
        ResourceManager::new(fs, host, config.resources.clone()).context("cannot read the node's capacity")?;
    if let Some(slices) = slices {
        manager = manager.with_units(slices);
    }
    let adopted = manager.setup().context("cannot set up the kubepods tree")?;
    if systemd_driver {
        nodewarden_resources::check_controllers(manager.cgroupfs(), &manager.tree().kubepods)?;
    }
    protect_self(&manager, &config);
    let alloc = *manager.allocatable();
    tracing::info!(
        cgroup = %manager.tree().kubepods,
        memory_limit = alloc.enforced.memory,
        cpu_millis = alloc.enforced.cpu_millis,
        pids_limit = alloc.enforced.pids,
        adopted = adopted.len(),
        memory_qos = config.resources.memory_qos,
        "kubepods tree ready"
    );
    for uid in &adopted {
        tracing::info!(pod_uid = %uid, "adopted existing pod cgroup");
    }
    metrics.set_allocatable(&alloc, config.resources.max_pods);
    let fs = manager.cgroupfs().clone();
    let runtime = match cri {
        Some(cri) => SelectedRuntime::Cri(cri.runtime),
        None => {
            let scratch = config.pods.root_dir.join("process-runtime");
            SelectedRuntime::Process(ProcessRuntime::new(fs.clone(), scratch, tasks.clone(), shutdown.clone()))
        }
    };
    let node_ip = flags.node_ip.or_else(nodewarden_cluster::node_ip);
    let settings = SyncSettings {
        root_dir: config.pods.root_dir.clone(),
        log_dir: config.pods.pod_logs_dir.clone(),
        node_name: config.pods.node_name.clone(),
        log_rotation: config.pods.log_rotation,
        host_ips: node_ip.iter().map(ToString::to_string).collect(),
        sync_frequency: config.pods.sync_frequency,
        dead_containers: config.pods.dead_containers,
    };
    // Says how the pods' disk usage will be measured: read from project quotas, or walked.
    for (dir, what) in [(&settings.root_dir, "emptyDir volumes"), (&settings.log_dir, "pod logs")] {
        match nodewarden_sync::disk_usage::usage_method(dir) {
            Ok(()) => tracing::info!(dir = %dir.display(), "the disk usage of {what} is read from project quotas"),
            Err(e) => {
                tracing::info!(dir = %dir.display(), reason = %e, "the disk usage of {what} is measured by walking their files")
            }
        }
    }
    // Bound before pods start; a port that is held is tried again, while pods and eviction run (see `listen`).
    let healthz = config.endpoints.healthz;
    let first_bind = match healthz {
        Some(addr) => Some((addr, tokio::net::TcpListener::bind(addr).await)),
        None => None,
    };
    let (tx, rx) = mpsc::channel(4);
    let static_pods = config
        .pods
        .static_pod_path
        .clone()
        .map(|dir| (StaticPodSource::new(&dir, &config.pods.node_name, config.pods.file_check_frequency), dir));
    let url_pods = match &config.pods.static_pod_url {
        Some(url) => {
            let p = &config.pods;
            let source = UrlPodSource::new(url, p.static_pod_url_header.clone(), &p.node_name, p.http_check_frequency)
                .context("staticPodURL: cannot load the system's root certificates")?;
            Some((source, url.clone()))
        }
        None => None,
    };
    let pressure_events = config.eviction.pressure_events;
    let realtime = config.eviction.realtime_priority;
    let daemon = Daemon::build(config, manager, runtime, settings, metrics, &tasks, &shutdown)?;
    if flags.kubeconfig.is_some() {
        // The first pods' events are kept until the node side can post them.
        daemon.pod_events.expect_cluster();
        daemon.pod_objects.expect_cluster();
        // Pods adopted at start may be the apiserver's: none is cleaned up before its first list.
        daemon.pods.expect_source(API_SOURCE);
    }
    // The pod manager knows there is no source at all once every sender is gone.
    let api_tx = flags.kubeconfig.is_some().then(|| tx.clone());
    if let Some((source, url)) = url_pods {
        tracing::info!(url = %url, "fetching static pods from staticPodURL");
        daemon.pods.expect_source(HTTP_SOURCE);
        tasks.spawn(source.run(tx.clone(), shutdown.clone()));
    }
    match static_pods {
        Some((source, dir)) => {
            tracing::info!(dir = %dir.display(), "watching static pod manifests");
            daemon.pods.expect_source(FILE_SOURCE);
            tasks.spawn(source.run(tx, shutdown.clone()));
        }
        None => drop(tx),
    }
    tasks.spawn(daemon.pods.clone().run(rx));
    let (wake_tx, wake_rx) = mpsc::channel(8);
    let _wake_thread =
        if pressure_events { nodewarden_eviction::start_wakeups(&proc, &fs, &daemon.kubepods, wake_tx) } else { None };
    // The pressure stall counters count from here; the adopted pods show from the first scrape.
    daemon.metrics.refresh(daemon.ledger.view());
    let endpoints = daemon.endpoints();
    let start_sli = daemon.metrics.pod_start_sli.clone();
    let Daemon {
        ledger,
        pods,
        eviction_status,
        health,
        reloader,
        node,
        node_shutdown,
        node_ip,
        pod_events,
        pod_objects,
        eviction,
        limit_evictions,
        ..
    } = daemon;
    if reloader.config().eviction.local_storage_limits {
        let evictions = limit_evictions.clone();
        let status = eviction_status.clone();
        let enforce =
            nodewarden_sync::enforce_local_storage(pods.clone(), evictions, status, tasks.clone(), shutdown.clone());
        tasks.spawn(enforce);
    }
    if let Some(collector) = pods.image_collector() {
        tasks.spawn(nodewarden_sync::measure_writable_layers(pods.clone(), shutdown.clone()));
        let events: Arc<dyn nodewarden_sync::EventSink> = pod_events.clone();
        let config = reloader.config.subscribe();
        tasks.spawn(crate::image_gc::run(collector, config, imagefs, events, shutdown.clone()));
    }
    let eviction = eviction.spawn(wake_rx, TASK_DRAIN, realtime).context("cannot start the eviction thread")?;
    let config = reloader.config();
    tasks.spawn(crate::reload::watch(path, reloader, shutdown.clone()));

    // Before the endpoints are served: /readyz names the apiserver from its first answer.
    if let (Some(kubeconfig), Some(api_tx)) = (&flags.kubeconfig, api_tx) {
        let facts = crate::cluster::DaemonFacts::new(health.clone(), pods.clone(), eviction_status, node);
        let joining = crate::cluster::start(
            kubeconfig,
            &config,
            node_ip,
            facts,
            pod_events,
            pod_objects,
            api_tx,
            start_sli,
            &tasks,
            &shutdown,
        );
        let started = signals.unless(joining);
        match started.await {
            Ok(status) => health.set_cluster(status.context("--kubeconfig")?),
            Err(signal) => return stop_early(signal, &shutdown, &[&tasks]).await,
        }
    }
    let listen = Arc::<crate::listen::ListenState>::default();
    let server = first_bind.map(|(addr, first)| {
        let app = crate::http::router(endpoints);
        tokio::spawn(crate::listen::run(addr, first, app, listen.clone(), shutdown.clone()))
    });
    let shutdown_groups = config.shutdown.groups.clone();
    if !shutdown_groups.is_empty() {
        let node = crate::shutdown::Node { ledger, pods: pods.clone(), shutting_down: node_shutdown };
        tasks.spawn(crate::shutdown::run(node, shutdown_groups, shutdown.clone()));
    }
    // Under a systemd unit of Type=notify: READY=1 after the first pod sync and eviction pass, and the watchdog.
    if let Some(notifier) = crate::notify::Notifier::from_env() {
        let watched = crate::notify::Watched { health, store: pods.store(), listen };
        tasks.spawn(crate::notify::run(notifier, watched, shutdown.clone()));
    }

    let signal = signals.recv().await;
    tracing::info!(signal, "shutting down; pod cgroups are left in place for the next start to adopt");
    shutdown.cancel();
    // One deadline for every task of the daemon (pod sync's workers, its exit watches, eviction's waits, the
    // cluster side, the config watcher), then they are left behind.
    tasks.close();
    if tokio::time::timeout(TASK_DRAIN, tasks.wait()).await.is_err() {
        tracing::warn!(left = tasks.len(), "tasks still running {TASK_DRAIN:?} after shutdown; leaving them");
    }
    // The eviction thread keeps its runtime, where the eviction tasks run, until the tracker has drained, at most
    // TASK_DRAIN.
    let joined = tokio::task::spawn_blocking(move || eviction.join());
    match tokio::time::timeout(TASK_DRAIN * 2, joined).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(_)) | Err(_)) => tracing::error!("the eviction thread panicked"),
        Err(_) => tracing::warn!("the eviction thread is still running after shutdown; leaving it"),
    }
    if let Some(server) = server
        && let Err(e) = server.await
    {
        tracing::warn!(error = %e, "HTTP server task failed");
    }
    Ok(())
}

/// SIGTERM and SIGINT, handled from the daemon's first moment.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self { term: signal(SignalKind::terminate())?, int: signal(SignalKind::interrupt())? })
    }

    /// The next signal's name.
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }

    /// `work`'s output, unless a signal comes first (its name).
    async fn unless<T>(&mut self, work: impl Future<Output = T>) -> Result<T, &'static str> {
        tokio::select! {
            out = work => Ok(out),
            signal = self.recv() => Err(signal),
        }
    }
}

/// The shutdown path of a daemon signalled before it was fully started: what was started stops (pods keep
/// running, for the next daemon to adopt).
async fn stop_early(
    signal: &'static str,
    shutdown: &CancellationToken,
    trackers: &[&TaskTracker],
) -> Result<(), DaemonError> {
    tracing::info!(signal, "shutting down during start; pod cgroups are left in place for the next start to adopt");
    shutdown.cancel();
    for tracker in trackers {
        tracker.close();
        if tokio::time::timeout(TASK_DRAIN, tracker.wait()).await.is_err() {
            tracing::warn!(left = tracker.len(), "tasks still running {TASK_DRAIN:?} after shutdown; leaving them");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodewarden_resources::testing::FakeHost;

    #[test]
    fn ancestors_and_kernel_versions() {
        assert_eq!(existing_ancestor(Path::new("/definitely/not/here")), PathBuf::from("/"));
        assert!(kernel_at_least(2, 6));
        assert!(!kernel_at_least(999, 0));
    }

    const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupRoot: /nw\n";

    struct Rig {
        host: FakeHost,
        daemon: Daemon,
    }

    /// A daemon state over a stand-in host, with its eviction loop (not running; passes are made by hand).
    fn rig() -> Rig {
        let host = FakeHost::new();
        let config = crate::config::parse(HEAD).unwrap();
        let mut manager =
            ResourceManager::new(host.cgroupfs(&config.resources.cgroup_root), host.host(), config.resources.clone())
                .unwrap();
        manager.setup().unwrap();
        host.set_usage(&manager.tree().kubepods, 0, 0);
        let fs = manager.cgroupfs().clone();
        let (tasks, shutdown) = (TaskTracker::new(), CancellationToken::new());
        let scratch = host.path().join("root/process-runtime");
        let runtime = SelectedRuntime::Process(ProcessRuntime::new(fs, scratch, tasks.clone(), shutdown.clone()));
        let settings = SyncSettings {
            root_dir: host.path().join("root"),
            log_dir: host.path().join("logs"),
            node_name: "node".into(),
            log_rotation: nodewarden_sync::LogRotation::default(),
            host_ips: Vec::new(),
            sync_frequency: Duration::from_secs(60),
            dead_containers: nodewarden_sync::DeadContainerPolicy::default(),
        };
        let metrics = Arc::new(Metrics::new().unwrap());
        let daemon = Daemon::build(config, manager, runtime, settings, metrics, &tasks, &shutdown).unwrap();
        Rig { host, daemon }
    }

    /// Runs `f` of `handle` on a thread of its own while a request holds the ledger; fails the test if `f` waits
    /// for it.
    fn with_the_manager_held<H: Send + 'static, T: Send + 'static>(
        r: &Rig,
        handle: H,
        f: impl FnOnce(&H) -> T + Send + 'static,
    ) -> T {
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (inside, entered) = std::sync::mpsc::channel();
        let ledger = r.daemon.ledger.clone();
        let holder = std::thread::spawn(move || {
            ledger.call_blocking(move |_| {
                inside.send(()).unwrap();
                let _ = held.recv();
            })
        });
        entered.recv_timeout(Duration::from_secs(5)).expect("the ledger was never held");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(f(&handle)).unwrap());
        let out = rx.recv_timeout(Duration::from_secs(5)).expect("blocked on the ledger");
        release.send(()).unwrap();
        holder.join().unwrap();
        out
    }

    #[test]
    fn readiness_never_waits_for_the_manager() {
        let r = rig();
        let checks = with_the_manager_held(&r, r.daemon.health.clone(), Health::readiness);
        assert_eq!(checks[1], ("cgroupfs", Ok(())));
    }

    #[test]
    fn readiness_waits_for_the_first_pods_of_every_source() {
        let r = rig();
        let sources = |h: &Health| h.readiness().into_iter().find(|(name, _)| *name == "sources").map(|(_, r)| r);
        assert_eq!(sources(&r.daemon.health), Some(Ok(())));
        r.daemon.pods.expect_source(FILE_SOURCE);
        assert_eq!(sources(&r.daemon.health), Some(Err("waiting for the first pods from source file".into())));
    }

    #[test]
    fn a_scrape_never_waits_for_the_manager() {
        let r = rig();
        let text = with_the_manager_held(&r, r.daemon.endpoints(), |e| {
            e.metrics.refresh(&e.view);
            e.metrics.render().unwrap()
        });
        assert!(text.contains("nodewarden_pods{qos_class=\"BestEffort\"} 0"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn readiness_goes_stale_when_passes_stop() {
        let mut r = rig();
        let s = r.daemon.health.clone();
        assert_eq!(s.readiness()[0], ("eviction", Err("the eviction loop has not completed a pass yet".into())));
        r.daemon.eviction.pass().await;
        assert_eq!(s.readiness()[0], ("eviction", Ok(())));
        tokio::time::advance(Duration::from_secs(4)).await;
        let (name, result) = &s.readiness()[0];
        assert_eq!(*name, "eviction");
        assert!(result.as_ref().is_err_and(|e| e.contains("last completed a pass 4.0s ago")), "{result:?}");
        // The kubepods cgroup disappearing fails the cgroupfs check.
        std::fs::remove_file(r.host.cgroup_mount().join("nw/kubepods/memory.max")).unwrap();
        assert!(s.readiness()[1].1.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn the_pass_that_applies_new_thresholds_shows_them() {
        // The gauges follow the eviction settings of the pass itself: a reload sends those before it replaces
        // the config, and the pass it wakes must not show the old thresholds for another second.
        let mut r = rig();
        let s = r.daemon.reloader.clone();
        r.daemon.eviction.pass().await;
        let mut edited = (*s.eviction.borrow().clone()).clone();
        let th = edited.thresholds.hard.iter_mut().find(|t| t.signal == Signal::MemoryAvailable).unwrap();
        th.amount = nodewarden_resources::Amount::Quantity(123 << 20);
        s.eviction.send_replace(Arc::new(edited));
        r.daemon.eviction.pass().await;
        let text = s.metrics.render().unwrap();
        assert!(
            text.contains(&format!("kubelet_eviction_stats{{eviction_signal=\"memory.available\"}} {}", 123u64 << 20)),
            "{text}"
        );
    }

    #[test]
    fn a_reload_hands_each_consumer_only_a_section_of_its_own_that_changed() {
        let r = rig();
        let reload = |s: &Arc<Reloader>, text: &str| {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(s.apply(&format!("{HEAD}{text}")))
        };
        let mut settings = r.daemon.reloader.eviction.subscribe();
        settings.mark_unchanged();
        // maxPods is the resources section's: the ledger takes it, the eviction loop is not woken.
        assert_eq!(reload(&r.daemon.reloader, "maxPods: 7\n"), Ok(Vec::new()));
        assert_eq!(r.daemon.ledger.call_blocking(|m| m.config().max_pods), 7);
        assert!(!settings.has_changed().unwrap(), "the eviction settings were sent again unchanged");
        // The transition period is the eviction section's: the loop takes it, and the ledger is not asked (the
        // reload ends while a request holds it).
        let edit = "maxPods: 7\nevictionPressureTransitionPeriod: 1m\n";
        assert_eq!(with_the_manager_held(&r, r.daemon.reloader.clone(), move |s| reload(s, edit)), Ok(Vec::new()));
        assert_eq!(settings.borrow_and_update().transition_period, Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reload_applies_thresholds_and_limits_and_a_bad_one_changes_nothing() {
        let mut r = rig();
        let s = r.daemon.reloader.clone();
        r.daemon.eviction.pass().await;
        let stats = |s: &Reloader| {
            let text = s.metrics.render().unwrap();
            text.lines()
                .find(|l| l.starts_with("kubelet_eviction_stats{eviction_signal=\"memory.available\"}"))
                .map(str::to_owned)
        };
        assert_eq!(
            stats(&s).as_deref(),
            Some("kubelet_eviction_stats{eviction_signal=\"memory.available\"} 104857600")
        );
        let edited = HEAD.replace("/nw", "/elsewhere") + "maxPods: 7\nevictionHard:\n  memory.available: 300Mi\n";
        // A negative threshold is refused; the running config stays.
        let bad = format!("{HEAD}maxPods: 3\nevictionHard:\n  memory.available: -1Mi\n");
        assert!(s.apply(&bad).await.is_err());
        assert_eq!(s.config().resources.max_pods, 110);
        assert_eq!(s.apply(&edited).await.unwrap(), ["cgroupRoot"]);
        assert_eq!(s.config().resources.max_pods, 7);
        assert_eq!(s.ledger.call(|m| m.config().max_pods).await.unwrap(), 7);
        assert_eq!(s.config().resources.cgroup_root.as_str(), "/nw");
        r.daemon.eviction.pass().await;
        assert_eq!(
            stats(&s).as_deref(),
            Some("kubelet_eviction_stats{eviction_signal=\"memory.available\"} 314572800")
        );
        // Allocatable (capacity − reserved − the hard memory threshold) follows.
        let text = s.metrics.render().unwrap();
        assert!(
            text.contains(&format!(
                "nodewarden_node_allocatable{{resource=\"memory\",unit=\"byte\"}} {}",
                (1u64 << 30) - (300 << 20)
            )),
            "{text}"
        );
    }
}
