//! The CRI runtime: pods run as sandboxes of a CRI runtime (containerd, CRI-O) reached over gRPC. nodewarden
//! stays the owner of the accounting: each sandbox's `cgroup_parent` is the pod's placement and each container
//! gets the placement's limits; eviction and usage keep reading cgroupfs. Exits are found by listing the
//! containers once per poll period (as the kubelet's PLEG relists), which also finds a runtime that stopped
//! answering; its `Status` says whether it and its pod network are ready.

pub mod client;
mod config;
mod health;
mod metrics;
mod pulls;
pub mod responses;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use jiff::Timestamp;
use nodewarden_proto::v1::{
    AuthConfig, ContainerFilter, ContainerState, ContainerStateValue, ContainerStats, CreateContainerRequest,
    PodSandboxConfig, PodSandboxFilter, PodSandboxState, PodSandboxStateValue, PullImageRequest, RunPodSandboxRequest,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use client::{CRI_API_VERSION, CriClient, CriError};
pub use config::{CONTAINER_NAME_LABEL, MANAGED_LABEL, POD_NAME_LABEL, POD_NAMESPACE_LABEL, POD_UID_LABEL};
pub use config::{DEFAULT_ROOT_DIR, container_config, managed_value, sandbox_config};
pub use metrics::RuntimeMetrics;

use crate::seam::{
    ContainerId, ContainerSpec, ExecOutput, ExitInfo, ImageService, ImageSummary, MainProcess, NodeImage, PulledImage,
    RunningSandbox, Runtime, RuntimeError, RuntimeFacts, RuntimeHealth, SandboxRuntime, SandboxSpec, Started,
    StreamingRuntime, Streams, WritableLayer,
};

/// Sandboxes are checked every this many relists: a dead sandbox is rare, and listing sandboxes every second
/// cost the daemon about 1 % of a CPU with 10 pods in the emulated guest.
const SANDBOX_CHECK_EVERY: u32 = 10;

/// The scheme of container IDs (`containerd://...`), and the runtime's name until its `Version` answered.
const SCHEME: &str = "containerd";

/// How long an image pull may take.
const PULL_DEADLINE: Duration = Duration::from_secs(30 * 60);

/// Settings of the CRI runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CriSettings {
    /// `containerRuntimeEndpoint`.
    pub endpoint: String,
    /// `runtimeRequestTimeout`: the deadline of every call but pulls.
    pub request_timeout: Duration,
    /// How many image pulls run at once (`None`: no limit): 1 with `serializeImagePulls`, else
    /// `maxParallelImagePulls`. A reload changes it through [`ImageService::set_pull_limit`].
    pub parallel_pulls: Option<u32>,
    /// How often containers are listed to find exits.
    pub poll: Duration,
    /// The value of [`MANAGED_LABEL`] on this daemon's sandboxes and containers ([`managed_value`]): only those
    /// are adopted, reconciled and removed.
    pub managed: String,
}

/// The CRI runtime.
#[derive(Debug)]
pub struct CriRuntime {
    client: CriClient,
    settings: CriSettings,
    pulls: pulls::PullGate,
    /// The spec each known sandbox was made from (CreateContainer needs the sandbox's config again).
    sandboxes: Mutex<HashMap<String, (SandboxSpec, PodSandboxConfig)>>,
    /// Containers whose exit is awaited.
    waiters: Mutex<HashMap<String, watch::Sender<Option<ExitInfo>>>>,
    /// The runtime's health, version and images, as the monitor last learnt them.
    known: Mutex<health::Known>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn runtime_error(e: CriError) -> RuntimeError {
    if e.is_unavailable() { RuntimeError::Unavailable(e.to_string()) } else { RuntimeError::Other(e.to_string()) }
}

/// Why the runtime at the endpoint cannot be used: it does not serve CRI `runtime.v1`.
#[derive(Debug, thiserror::Error)]
pub enum VersionError {
    /// The call failed.
    #[error(transparent)]
    Call(#[from] CriError),
    /// It answered with another API version.
    #[error("the runtime at {endpoint} serves CRI {found:?}, not {CRI_API_VERSION}")]
    Version {
        /// The endpoint.
        endpoint: String,
        /// The version it serves.
        found: String,
    },
}

impl VersionError {
    /// True when the runtime may still come up (no socket yet, no answer): worth waiting for.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Call(e) if e.is_unavailable())
    }
}

impl CriRuntime {
    /// A runtime for `settings.endpoint`; nothing is connected until [`CriRuntime::check_version`] or the first
    /// call. With `metrics`, every call is counted and timed.
    pub fn new(settings: CriSettings, metrics: Option<RuntimeMetrics>) -> Result<Self, CriError> {
        let mut client = CriClient::new(&settings.endpoint, settings.request_timeout)?;
        if let Some(m) = metrics {
            client = client.with_metrics(m);
        }
        let pulls = pulls::PullGate::new(settings.parallel_pulls);
        Ok(Self {
            client,
            settings,
            pulls,
            sandboxes: Mutex::new(HashMap::new()),
            waiters: Mutex::new(HashMap::new()),
            known: Mutex::new(health::Known::new(SCHEME)),
        })
    }

    /// `Version`: checks that the runtime serves CRI `runtime.v1` and returns its name and version.
    pub async fn check_version(&self) -> Result<(String, String), VersionError> {
        let v = self.client.version().await;
        let v = match v {
            Ok(v) => v,
            Err(e) => {
                self.set_failed(&e);
                return Err(e.into());
            }
        };
        if v.runtime_api_version != CRI_API_VERSION {
            return Err(VersionError::Version {
                endpoint: self.settings.endpoint.clone(),
                found: v.runtime_api_version,
            });
        }
        lock(&self.known).set_version(v.runtime_name.clone(), v.runtime_version.clone());
        Ok((v.runtime_name, v.runtime_version))
    }

    /// The sandbox's addresses on the pod network, the primary first (`PodSandboxStatus`).
    async fn sandbox_ips(&self, id: &str) -> Result<Vec<String>, CriError> {
        Ok(responses::sandbox_ips(self.client.pod_sandbox_status(id).await?))
    }

    /// Watches the runtime until `drain`: lists the containers every poll period, resolves the waits of those
    /// that exited or vanished, and records whether the runtime answers; every [`SANDBOX_CHECK_EVERY`] periods it
    /// also looks for sandboxes that died under running containers. `Status`, `Version` and the images are asked
    /// when due (`health.rs`).
    pub async fn monitor(self: Arc<Self>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.settings.poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut n: u32 = 0;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    n = n.wrapping_add(1);
                    let answered = self.relist(n.is_multiple_of(SANDBOX_CHECK_EVERY)).await;
                    self.check(n, answered).await;
                }
                () = shutdown.cancelled() => return,
            }
        }
    }

    /// Lists the containers and resolves the exits found; false when the runtime did not answer.
    async fn relist(&self, check_sandboxes: bool) -> bool {
        let listed = self.client.list_containers(None).await;
        let containers = match listed {
            Ok(c) => c,
            Err(e) => {
                self.set_failed(&e);
                return false;
            }
        };
        let states: HashMap<&str, ContainerState> = containers.iter().map(|c| (c.id.as_str(), c.state())).collect();
        let watched: Vec<String> = lock(&self.waiters).keys().cloned().collect();
        if check_sandboxes && !watched.is_empty() {
            self.stop_orphaned_containers(&containers, &watched).await;
        }
        for id in watched {
            if let Some(ContainerState::ContainerRunning | ContainerState::ContainerCreated) = states.get(id.as_str()) {
                continue;
            }
            let Some(info) = self.exit_info(&id).await else { continue };
            if let Some(tx) = lock(&self.waiters).remove(&id) {
                tx.send_replace(Some(info));
            }
        }
        true
    }

    /// Stops the running containers of sandboxes that are no longer ready (their pause container died): as the
    /// kubelet does, the pod is then started again in a new sandbox (the restart finds the sandbox not ready).
    async fn stop_orphaned_containers(&self, containers: &[nodewarden_proto::v1::Container], watched: &[String]) {
        let filter = PodSandboxFilter {
            state: Some(PodSandboxStateValue { state: PodSandboxState::SandboxNotready.into() }),
            label_selector: [(MANAGED_LABEL.to_owned(), self.settings.managed.clone())].into(),
            ..PodSandboxFilter::default()
        };
        let Ok(dead) = self.client.list_pod_sandbox(Some(filter)).await else { return };
        if dead.is_empty() {
            return;
        }
        for c in containers.iter().filter(|c| c.state() == ContainerState::ContainerRunning) {
            if watched.contains(&c.id) && dead.iter().any(|s| s.id == c.pod_sandbox_id) {
                tracing::warn!(container_id = %c.id, sandbox = %c.pod_sandbox_id, "the pod sandbox is not ready; stopping its container so the pod starts again in a new one");
                if let Err(e) = self.stop(&ContainerId::new(c.id.clone()), Duration::ZERO).await {
                    tracing::debug!(container_id = %c.id, error = %e, "StopContainer failed");
                }
            }
        }
    }

    /// How a container ended, from its status; `ContainerStatusUnknown` when the runtime lost it. `None` while it
    /// still runs or the runtime cannot say now.
    async fn exit_info(&self, id: &str) -> Option<ExitInfo> {
        match self.client.container_status(id, false).await {
            Ok(r) => responses::exit_of(r.status?),
            Err(e) if e.is_not_found() => Some(ExitInfo::unknown(
                "The container could not be located when the pod was terminated",
                Timestamp::UNIX_EPOCH,
            )),
            Err(e) => {
                tracing::debug!(container_id = %id, error = %e, "no container status yet");
                None
            }
        }
    }

    fn watch(&self, id: &str) -> watch::Receiver<Option<ExitInfo>> {
        lock(&self.waiters).entry(id.to_owned()).or_insert_with(|| watch::channel(None).0).subscribe()
    }

    /// The pod's sandboxes, any state.
    /// A sandbox's config, marked as this daemon's.
    fn sandbox_config(&self, spec: &SandboxSpec, attempt: u32) -> PodSandboxConfig {
        let mut config = sandbox_config(spec, attempt);
        config.labels.insert(MANAGED_LABEL.to_owned(), self.settings.managed.clone());
        config
    }

    /// A container's config, marked as this daemon's.
    fn container_config(&self, spec: &ContainerSpec, pod: &SandboxSpec) -> nodewarden_proto::v1::ContainerConfig {
        let mut config = container_config(spec, pod);
        config.labels.insert(MANAGED_LABEL.to_owned(), self.settings.managed.clone());
        config
    }

    async fn pod_sandboxes(
        &self,
        uid: &str,
        state: Option<PodSandboxState>,
    ) -> Result<Vec<nodewarden_proto::v1::PodSandbox>, CriError> {
        let filter = PodSandboxFilter {
            state: state.map(|s| PodSandboxStateValue { state: s.into() }),
            label_selector: [
                (POD_UID_LABEL.to_owned(), uid.to_owned()),
                (MANAGED_LABEL.to_owned(), self.settings.managed.clone()),
            ]
            .into(),
            ..PodSandboxFilter::default()
        };
        self.client.list_pod_sandbox(Some(filter)).await
    }

    /// False when the runtime says the sandbox is missing or not ready; true when it is ready or cannot say.
    async fn sandbox_ready(&self, id: &str) -> bool {
        match self.client.pod_sandbox_status(id).await {
            Ok(r) => r.status.is_some_and(|s| s.state() == PodSandboxState::SandboxReady),
            Err(e) => !e.is_not_found(),
        }
    }

    async fn stop_and_remove_sandbox(&self, id: &str) {
        if let Err(e) = self.client.stop_pod_sandbox(id).await
            && !e.is_not_found()
        {
            tracing::warn!(sandbox = %id, error = %e, "cannot stop the pod sandbox");
        }
        if let Err(e) = self.client.remove_pod_sandbox(id).await
            && !e.is_not_found()
        {
            tracing::warn!(sandbox = %id, error = %e, "cannot remove the pod sandbox");
        }
        lock(&self.sandboxes).remove(id);
    }
}

/// CRI's form of registry credentials.
/// A container's writable layer from its stats, for a container of a pod (labelled with the pod's UID and the
/// container's name, as the kubelet and nodewarden label theirs); `None` for one without, or without a measure.
fn writable_layer(stats: ContainerStats) -> Option<WritableLayer> {
    let attributes = stats.attributes?;
    let layer = stats.writable_layer?;
    let bytes = layer.used_bytes?.value;
    let inodes = layer.inodes_used.map_or(0, |v| v.value);
    let label = |key: &str| attributes.labels.get(key).filter(|v| !v.is_empty()).cloned();
    let container = label(CONTAINER_NAME_LABEL).or_else(|| attributes.metadata.map(|m| m.name))?;
    Some(WritableLayer { pod_uid: label(POD_UID_LABEL)?, container, bytes, inodes })
}

fn auth_config(a: &crate::seam::RegistryAuth) -> AuthConfig {
    AuthConfig {
        username: a.username.clone(),
        password: a.password.clone(),
        auth: a.auth.clone(),
        server_address: a.server_address.clone(),
        identity_token: a.identity_token.clone(),
        registry_token: a.registry_token.clone(),
    }
}

impl StreamingRuntime for CriRuntime {
    async fn exec_session(&self, id: &ContainerId, cmd: &[String], streams: Streams) -> Result<String, RuntimeError> {
        streams.check()?;
        if cmd.is_empty() {
            return Err(RuntimeError::Config("no command to run".into()));
        }
        let id = id.as_str();
        self.client.exec(id, cmd, streams).await.map_err(|e| session_error(e, id))
    }

    async fn attach_session(&self, id: &ContainerId, streams: Streams) -> Result<String, RuntimeError> {
        streams.check()?;
        let id = id.as_str();
        self.client.attach(id, streams).await.map_err(|e| session_error(e, id))
    }

    async fn port_forward_session(&self, sandbox_id: &str, ports: &[u16]) -> Result<String, RuntimeError> {
        self.client.port_forward(sandbox_id, ports).await.map_err(|e| match e {
            e if e.is_not_found() => RuntimeError::SandboxNotFound(sandbox_id.to_owned()),
            e => runtime_error(e),
        })
    }
}

/// A streaming call's failure: an unknown container, or the runtime's error.
fn session_error(e: CriError, id: &str) -> RuntimeError {
    if e.is_not_found() { RuntimeError::NotFound(id.to_owned()) } else { runtime_error(e) }
}

impl SandboxRuntime for CriRuntime {
    async fn run_sandbox(&self, spec: &SandboxSpec) -> Result<RunningSandbox, RuntimeError> {
        // As the kubelet: a pod on the pod network waits for it; a host-network pod does not need it.
        if !spec.host_network
            && let Some(p) = lock(&self.known).health(tokio::time::Instant::now()).network
        {
            return Err(RuntimeError::NetworkNotReady(p.message));
        }
        // Each sandbox of a pod gets the next attempt number: the runtime reserves (name, attempt).
        let earlier = self.pod_sandboxes(&spec.pod_uid, None).await.map_err(runtime_error)?;
        let attempt = earlier.iter().filter_map(|s| s.metadata.as_ref()).map(|m| m.attempt + 1).max().unwrap_or(0);
        // What is left of an earlier sandbox (one that died, or failed half-made) goes first.
        for s in earlier.iter().filter(|s| s.state() != PodSandboxState::SandboxReady) {
            self.stop_and_remove_sandbox(&s.id).await;
        }
        let config = self.sandbox_config(spec, attempt);
        let req = RunPodSandboxRequest { config: Some(config.clone()), runtime_handler: String::new() };
        let id = self.client.run_pod_sandbox(req).await.map_err(runtime_error)?;
        lock(&self.sandboxes).insert(id.clone(), (spec.clone(), config));
        let ips = if spec.host_network { Vec::new() } else { self.sandbox_ips(&id).await.map_err(runtime_error)? };
        Ok(RunningSandbox { id, ips })
    }

    async fn adopt_sandbox(&self, spec: &SandboxSpec) -> Option<RunningSandbox> {
        let ready = match self.pod_sandboxes(&spec.pod_uid, Some(PodSandboxState::SandboxReady)).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(pod_uid = %spec.pod_uid, error = %e, "cannot list the pod's sandboxes");
                return None;
            }
        };
        let newest = ready.into_iter().max_by_key(|s| s.created_at)?;
        let attempt = newest.metadata.as_ref().map_or(0, |m| m.attempt);
        lock(&self.sandboxes).insert(newest.id.clone(), (spec.clone(), self.sandbox_config(spec, attempt)));
        let ips = if spec.host_network {
            Vec::new()
        } else {
            // The sandbox keeps running either way: a status that cannot be read costs the pod its IP in the
            // status until the next daemon start, not its containers.
            self.sandbox_ips(&newest.id).await.unwrap_or_else(|e| {
                tracing::warn!(sandbox = %newest.id, error = %e, "cannot read an adopted sandbox's IPs");
                Vec::new()
            })
        };
        tracing::info!(pod_uid = %spec.pod_uid, sandbox = %newest.id, ?ips, "adopted running pod sandbox");
        Some(RunningSandbox { id: newest.id, ips })
    }

    async fn stop_sandboxes(&self, pod_uid: &str) {
        match self.pod_sandboxes(pod_uid, None).await {
            Ok(all) => {
                for s in all {
                    if let Err(e) = self.client.stop_pod_sandbox(&s.id).await
                        && !e.is_not_found()
                    {
                        tracing::warn!(sandbox = %s.id, error = %e, "cannot stop the pod sandbox");
                    }
                    // No container is made in it again.
                    lock(&self.sandboxes).remove(&s.id);
                }
            }
            Err(e) => tracing::warn!(pod_uid, error = %e, "cannot list the pod's sandboxes"),
        }
    }

    async fn remove_sandboxes(&self, pod_uid: &str) {
        match self.pod_sandboxes(pod_uid, None).await {
            Ok(all) => {
                for s in all {
                    self.stop_and_remove_sandbox(&s.id).await;
                }
            }
            Err(e) => tracing::warn!(pod_uid, error = %e, "cannot list the pod's sandboxes"),
        }
    }
}

impl RuntimeFacts for CriRuntime {
    fn scheme(&self) -> &'static str {
        SCHEME
    }

    fn health(&self) -> RuntimeHealth {
        lock(&self.known).health(tokio::time::Instant::now())
    }

    fn images(&self) -> Vec<ImageSummary> {
        lock(&self.known).images()
    }

    fn version(&self) -> String {
        lock(&self.known).version()
    }
}

impl ImageService for CriRuntime {
    async fn image_present(&self, image: &str) -> Result<bool, RuntimeError> {
        Ok(self.client.image_status(image).await.map_err(runtime_error)?.is_some())
    }

    async fn pull_image(&self, spec: &ContainerSpec) -> Result<PulledImage, RuntimeError> {
        let sandbox = lock(&self.sandboxes).get(&spec.sandbox_id).map(|(_, config)| config.clone());
        let Some(sandbox_config) = sandbox else {
            return Err(RuntimeError::SandboxNotFound(spec.sandbox_id.clone()));
        };
        let _ticket = self.pulls.enter().await;
        let began = tokio::time::Instant::now();
        tracing::info!(image = %spec.image, credentials = spec.pull_auths.len(), "pulling image");
        // Each matching credential in turn, as the kubelet tries them; anonymous where none matches.
        let auths: Vec<Option<AuthConfig>> = if spec.pull_auths.is_empty() {
            vec![None]
        } else {
            spec.pull_auths.iter().map(|a| Some(auth_config(a))).collect()
        };
        let mut last = None;
        for auth in auths {
            let req = PullImageRequest {
                image: Some(client::image_spec(&spec.image)),
                auth,
                sandbox_config: Some(sandbox_config.clone()),
            };
            match self.client.pull_image(req, PULL_DEADLINE).await {
                Ok(image_ref) => {
                    let pulling = began.elapsed();
                    tracing::info!(image = %spec.image, %image_ref, seconds = pulling.as_secs_f64(), "image pulled");
                    lock(&self.known).pulled();
                    // The size the Pulled event reports; a runtime that cannot say leaves it 0.
                    let size_bytes = match self.client.image_status(&image_ref).await {
                        Ok(image) => image.map_or(0, |i| i.size),
                        Err(_) => 0,
                    };
                    return Ok(PulledImage { image_ref, size_bytes, pulling });
                }
                Err(e) => last = Some(e),
            }
        }
        // The runtime's error as the kubelet shows it (the waiting message; its event names the image).
        let message = match last {
            Some(CriError::Status { code, message, .. }) => format!("rpc error: code = {code:?} desc = {message}"),
            Some(e) => e.to_string(),
            None => String::new(),
        };
        Err(RuntimeError::Image { reason: "ErrImagePull", message })
    }

    async fn list_images(&self) -> Result<Vec<NodeImage>, RuntimeError> {
        let listed = self.client.list_images().await.map_err(runtime_error)?;
        // A runtime that does not pin its sandbox image (containerd before 1.7) would lose it, and with it every
        // new pod sandbox: it counts as pinned.
        let sandbox_image = self.client.sandbox_image().await.ok().flatten();
        let image = |i: nodewarden_proto::v1::Image| {
            let names: Vec<String> = i.repo_digests.into_iter().chain(i.repo_tags).collect();
            let sandbox = sandbox_image.as_ref().is_some_and(|s| names.contains(s));
            NodeImage { names, size_bytes: i.size, pinned: i.pinned || sandbox, id: i.id }
        };
        Ok(listed.into_iter().map(image).collect())
    }

    async fn images_in_use(&self) -> Result<BTreeSet<String>, RuntimeError> {
        // Every container, whoever made it: an image another client's container uses is in use too.
        let containers = self.client.list_containers(None).await.map_err(runtime_error)?;
        Ok(containers.into_iter().map(|c| c.image_ref).filter(|r| !r.is_empty()).collect())
    }

    fn set_pull_limit(&self, limit: Option<u32>) {
        self.pulls.set_limit(limit);
    }

    /// The running containers' layers: as in the kubelet's stats, a dead container kept for inspection is no
    /// pod's usage (and would stand for a running one of the same name).
    async fn writable_layers(&self) -> Result<Vec<WritableLayer>, RuntimeError> {
        let state = Some(ContainerStateValue { state: ContainerState::ContainerRunning.into() });
        let running = self.client.list_containers(Some(ContainerFilter { state, ..ContainerFilter::default() }));
        let running: BTreeSet<String> = running.await.map_err(runtime_error)?.into_iter().map(|c| c.id).collect();
        let stats = self.client.list_container_stats().await.map_err(runtime_error)?;
        let live = |s: &ContainerStats| s.attributes.as_ref().is_some_and(|a| running.contains(&a.id));
        Ok(stats.into_iter().filter(live).filter_map(writable_layer).collect())
    }

    /// `ImageFsInfo`: the first absolute mount point the runtime names, which the kubelet's image garbage
    /// collection and `imagefs` signals measure.
    async fn image_fs(&self) -> Result<Option<std::path::PathBuf>, RuntimeError> {
        let filesystems = self.client.image_fs_info().await.map_err(runtime_error)?;
        let named = filesystems.into_iter().filter_map(|f| f.fs_id).map(|id| id.mountpoint);
        Ok(named.into_iter().find(|m| m.starts_with('/')).map(std::path::PathBuf::from))
    }

    async fn remove_image(&self, id: &str) -> Result<(), RuntimeError> {
        match self.client.remove_image(id).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(RuntimeError::Other(format!("cannot remove image {id}: {e}"))),
        }
    }
}

impl Runtime for CriRuntime {
    type Sandboxes = Self;

    fn sandboxes(&self) -> Option<&Self> {
        Some(self)
    }

    type Images = Self;

    fn image_service(&self) -> Option<&Self> {
        Some(self)
    }

    type Streaming = Self;

    fn streaming(&self) -> Option<&Self> {
        Some(self)
    }

    async fn reconcile(&self, keep: &BTreeSet<String>) {
        let filter = PodSandboxFilter {
            label_selector: [(MANAGED_LABEL.to_owned(), self.settings.managed.clone())].into(),
            ..Default::default()
        };
        let all = match self.client.list_pod_sandbox(Some(filter)).await {
            Ok(all) => all,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list pod sandboxes to reconcile");
                return;
            }
        };
        for s in all {
            let uid = s.labels.get(POD_UID_LABEL).cloned().unwrap_or_default();
            if keep.contains(&uid) {
                continue;
            }
            tracing::info!(sandbox = %s.id, pod_uid = %uid, "removing a pod sandbox that belongs to no known pod");
            self.stop_and_remove_sandbox(&s.id).await;
        }
    }

    async fn start(&self, spec: &ContainerSpec) -> Result<Started, RuntimeError> {
        let sandbox = lock(&self.sandboxes).get(&spec.sandbox_id).cloned();
        let Some((pod, sandbox_config)) = sandbox else {
            return Err(RuntimeError::SandboxNotFound(spec.sandbox_id.clone()));
        };
        let req = CreateContainerRequest {
            pod_sandbox_id: spec.sandbox_id.clone(),
            config: Some(self.container_config(spec, &pod)),
            sandbox_config: Some(sandbox_config),
        };
        let id = match self.client.create_container(req).await {
            Ok(id) => id,
            Err(e) if e.is_not_found() || !self.sandbox_ready(&spec.sandbox_id).await => {
                tracing::warn!(sandbox = %spec.sandbox_id, error = %e, "the pod sandbox is gone or not ready");
                lock(&self.sandboxes).remove(&spec.sandbox_id);
                return Err(RuntimeError::SandboxNotFound(spec.sandbox_id.clone()));
            }
            Err(e) => return Err(RuntimeError::Create(e.to_string())),
        };
        if let Err(e) = self.client.start_container(&id).await {
            if let Err(re) = self.client.remove_container(&id).await {
                tracing::warn!(container_id = %id, error = %re, "cannot remove a container that failed to start");
            }
            return Err(RuntimeError::Start(e.to_string()));
        }
        drop(self.watch(&id));
        Ok(Started { id: ContainerId::new(id), pid: 0, pid_start: None, started_at: Timestamp::now() })
    }

    async fn adopt(&self, spec: &ContainerSpec, _main: Option<MainProcess>) -> Option<Started> {
        let filter = ContainerFilter {
            pod_sandbox_id: spec.sandbox_id.clone(),
            label_selector: [(CONTAINER_NAME_LABEL.to_owned(), spec.name.clone())].into(),
            ..ContainerFilter::default()
        };
        let listed = self.client.list_containers(Some(filter)).await.ok()?;
        let running = listed.into_iter().filter(|c| c.state() == ContainerState::ContainerRunning);
        let newest = running.max_by_key(|c| c.created_at)?;
        let started_at = match self.client.container_status(&newest.id, false).await {
            Ok(r) => r.status.map_or_else(Timestamp::now, |s| responses::timestamp(s.started_at)),
            Err(_) => Timestamp::now(),
        };
        drop(self.watch(&newest.id));
        Some(Started { id: ContainerId::new(newest.id), pid: 0, pid_start: None, started_at })
    }

    async fn wait(&self, id: &ContainerId) -> ExitInfo {
        let id = id.as_str();
        let mut rx = self.watch(id);
        match rx.wait_for(Option::is_some).await {
            Ok(v) => v.clone().unwrap_or_else(unreachable_exit),
            Err(_) => unreachable_exit(),
        }
    }

    async fn stop(&self, id: &ContainerId, grace: Duration) -> Result<(), RuntimeError> {
        let id = id.as_str();
        match self.client.stop_container(id, grace).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(runtime_error(e)),
        }
    }

    /// A CRI container is stopped by a call to the runtime (`StopContainer`), which the pod's worker makes.
    fn stop_signals(&self) -> Option<&dyn crate::seam::StopSignals> {
        None
    }

    async fn exec(&self, id: &ContainerId, argv: &[String], timeout: Duration) -> Result<ExecOutput, RuntimeError> {
        let id = id.as_str();
        match self.client.exec_sync(id, argv, timeout).await {
            Ok(r) => Ok(ExecOutput::from_streams(Some(r.exit_code), &r.stdout, &r.stderr)),
            Err(e) if e.code() == Some(tonic::Code::DeadlineExceeded) || matches!(e, CriError::Timeout { .. }) => {
                Ok(ExecOutput::timed_out(timeout))
            }
            Err(e) if e.is_not_found() => Err(RuntimeError::NotFound(id.to_owned())),
            Err(e) => Err(runtime_error(e)),
        }
    }

    async fn remove(&self, id: &ContainerId) {
        let id = id.as_str();
        lock(&self.waiters).remove(id);
        if let Err(e) = self.client.remove_container(id).await
            && !e.is_not_found()
        {
            tracing::debug!(container_id = %id, error = %e, "RemoveContainer failed");
        }
    }

    /// Renames the live log and asks the runtime to reopen it, as the kubelet rotates under CRI (nothing is
    /// copied, so the whole file is kept).
    async fn rotate_log(
        &self,
        id: &ContainerId,
        log: &std::path::Path,
        to: &std::path::Path,
        _keep: u64,
    ) -> Result<(), RuntimeError> {
        let id = id.as_str();
        std::fs::rename(log, to).map_err(|e| RuntimeError::Other(format!("cannot rotate the log: {e}")))?;
        if let Err(e) = self.client.reopen_container_log(id).await {
            // The runtime keeps writing to the renamed file: put it back, so that nothing is lost.
            let _ = std::fs::rename(to, log);
            return Err(runtime_error(e));
        }
        Ok(())
    }
}

/// The exit of a container whose watch ended without one (the runtime was dropped).
fn unreachable_exit() -> ExitInfo {
    ExitInfo::unknown("the runtime stopped watching the container", Timestamp::UNIX_EPOCH)
}

#[cfg(test)]
mod tests;
