//! One pod worker per pod UID: a task that owns the pod's lifecycle, so two syncs of one pod never run at once.
//! It runs the syncPod steps in the kubelet's order (admit and place → volumes → sandbox → init containers in
//! order, each to completion → app containers → probes → status), restarts containers under the restart policy
//! with the crash-loop back-off, and terminates the pod when it is deleted or evicted.

mod containers;
mod status;
mod terminate;

pub(crate) use terminate::kill_and_release;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Container, Pod};
use nodewarden_resources::{PlaceError, Placement, ResourceManager};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::metrics::SyncMetrics;
use crate::probe::{ProbeKind, ProbeState};
use crate::runtime::{ContainerSpec, ExitInfo, Runtime};
use crate::state::{self, SavedPod};
use crate::status::RestartPolicy;
use crate::store::StatusStore;
use crate::volumes::{self, PreparedVolume};

/// Settings of pod sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncSettings {
    /// Where pod volumes and state live (`<rootDir>/pods/<uid>`).
    pub root_dir: PathBuf,
    /// Where container logs go (`podLogsDir`, `/var/log/pods`).
    pub log_dir: PathBuf,
    /// The node name.
    pub node_name: String,
}

/// What the workers share.
pub(crate) struct Ctx<R> {
    pub resources: Arc<Mutex<ResourceManager>>,
    pub runtime: Arc<R>,
    pub settings: SyncSettings,
    pub store: Arc<StatusStore>,
    pub metrics: SyncMetrics,
}

impl<R> Ctx<R> {
    fn resources(&self) -> std::sync::MutexGuard<'_, ResourceManager> {
        self.resources.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Why a pod is terminated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reason {
    /// Its source no longer has it: remove it entirely.
    Deleted,
    /// The eviction manager evicted it: it stays, `Failed` with reason `Evicted` and this message.
    Evicted(String),
}

/// A message to a worker.
pub(crate) enum Msg {
    /// The source has a newer spec for the pod.
    Update(Box<Pod>),
    /// Terminate the pod, with this grace period (the pod's own when `None`). `signalled` is told once SIGTERM
    /// has been sent to every running container, `done` once the pod has terminated.
    Terminate {
        grace: Option<Duration>,
        reason: Reason,
        signalled: Option<oneshot::Sender<()>>,
        done: Option<oneshot::Sender<()>>,
    },
}

/// Something that happened to a container.
pub(crate) enum Event {
    Exited { id: String, info: ExitInfo },
    Probe { id: String, kind: ProbeKind, result: Result<String, String> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Init,
    Sidecar,
    App,
}

/// A task that is aborted when its handle is dropped.
pub(crate) struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A running container.
pub(crate) struct Run {
    pub id: String,
    pub pid: u32,
    pub started_at: Timestamp,
    pub since: Instant,
    pub spec: ContainerSpec,
    pub tasks: Vec<AbortOnDrop>,
    pub probes: std::collections::BTreeMap<ProbeKind, ProbeState>,
    pub started: bool,
    pub ready: bool,
    pub killing: bool,
}

/// One container's lifecycle.
pub(crate) struct CState {
    pub name: String,
    pub kind: Kind,
    pub restarts: u32,
    pub backoff: Backoff,
    pub next_start: Option<Instant>,
    pub run: Option<Run>,
    pub last: Option<(ExitInfo, String)>,
    /// Waiting with this reason and message (`CreateContainerConfigError`, `RunContainerError`).
    pub waiting: Option<(String, String)>,
    /// Ended and not restarting.
    pub done: bool,
}

/// A pod that is over: its phase, reason and message.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Terminal {
    pub phase: String,
    pub reason: Option<String>,
    pub message: Option<String>,
}

pub(crate) struct Worker<R> {
    ctx: Arc<Ctx<R>>,
    uid: String,
    pod: Pod,
    policy: RestartPolicy,
    placement: Option<Placement>,
    volumes: Option<Vec<PreparedVolume>>,
    /// The runtime's sandbox ID, once the sandbox runs.
    sandbox: Option<String>,
    containers: Vec<CState>,
    initialized: bool,
    terminal: Option<Terminal>,
    retry: Option<Instant>,
    retry_backoff: Duration,
    pending: Option<String>,
    start_time: Option<Timestamp>,
    seen: Instant,
    start_reported: bool,
    conditions: std::collections::BTreeMap<&'static str, (bool, Timestamp)>,
    events: mpsc::UnboundedSender<Event>,
    busy: Arc<Mutex<Option<Instant>>>,
    name_lock: Arc<Semaphore>,
    permit: Option<OwnedSemaphorePermit>,
}

fn all_containers(pod: &Pod) -> Vec<(Kind, &Container)> {
    let Some(spec) = pod.spec.as_ref() else { return Vec::new() };
    let init = spec.init_containers.iter().flatten().map(|c| {
        let sidecar = c.restart_policy.as_deref() == Some("Always");
        (if sidecar { Kind::Sidecar } else { Kind::Init }, c)
    });
    init.chain(spec.containers.iter().map(|c| (Kind::App, c))).collect()
}

impl<R: Runtime> Worker<R> {
    pub(crate) fn new(
        ctx: Arc<Ctx<R>>,
        pod: Pod,
        events: mpsc::UnboundedSender<Event>,
        busy: Arc<Mutex<Option<Instant>>>,
        name_lock: Arc<Semaphore>,
    ) -> Self {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let containers = all_containers(&pod)
            .into_iter()
            .map(|(kind, c)| CState {
                name: c.name.clone(),
                kind,
                restarts: 0,
                backoff: Backoff::default(),
                next_start: None,
                run: None,
                last: None,
                waiting: None,
                done: false,
            })
            .collect();
        Self {
            policy: RestartPolicy::parse(pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref())),
            ctx,
            uid,
            pod,
            placement: None,
            volumes: None,
            sandbox: None,
            containers,
            initialized: false,
            terminal: None,
            retry: None,
            retry_backoff: Duration::ZERO,
            pending: None,
            start_time: None,
            seen: Instant::now(),
            start_reported: false,
            conditions: std::collections::BTreeMap::new(),
            events,
            busy,
            name_lock,
            permit: None,
        }
    }

    fn container(&self, c: &CState) -> Option<&Container> {
        all_containers(&self.pod).into_iter().map(|(_, c)| c).find(|x| x.name == c.name)
    }

    /// The sandbox spec, once the pod is placed.
    fn sandbox_spec(&self) -> Option<crate::runtime::SandboxSpec> {
        let placement = self.placement.as_ref()?;
        Some(crate::spec::sandbox_spec(&self.pod, placement, &self.ctx.settings.log_dir))
    }

    fn grace_period(&self) -> Duration {
        let secs = self.pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds).unwrap_or(30);
        Duration::from_secs(u64::try_from(secs).unwrap_or(0))
    }

    fn save(&self) {
        let mut saved = SavedPod { start_time: self.start_time, ..SavedPod::default() };
        for c in &self.containers {
            saved.containers.insert(
                c.name.clone(),
                state::SavedContainer {
                    restarts: c.restarts,
                    pid: c.run.as_ref().map(|r| r.pid),
                    started_at: c.run.as_ref().map(|r| r.started_at),
                    last: c.last.as_ref().map(|(i, _)| i.clone()),
                },
            );
        }
        saved.terminal = self.terminal.clone().map(|t| (t.phase, t.reason, t.message));
        if let Err(e) = state::save(&self.ctx.settings.root_dir, &self.uid, &saved) {
            tracing::warn!(pod_uid = %self.uid, error = %e, "cannot save pod state");
        }
    }

    /// The worker's life: wait until no other pod of the same name runs, take over what survives of an earlier
    /// daemon, then sync until terminated.
    pub(crate) async fn run(mut self, mut rx: mpsc::Receiver<Msg>, mut events: mpsc::UnboundedReceiver<Event>) {
        self.publish();
        // The kubelet runs one static pod of a given full name at a time: an edited manifest's pod starts once the
        // old one has terminated.
        let lock = self.name_lock.clone();
        let acquire = lock.acquire_owned();
        tokio::pin!(acquire);
        loop {
            tokio::select! {
                p = &mut acquire => {
                    self.permit = p.ok();
                    break;
                }
                msg = rx.recv() => match msg {
                    Some(Msg::Update(p)) => self.pod = *p,
                    Some(Msg::Terminate { reason, done, .. }) => {
                        if let Reason::Evicted(m) = reason {
                            self.terminal = Some(Terminal {
                                phase: "Failed".into(),
                                reason: Some("Evicted".into()),
                                message: Some(m),
                            });
                            self.publish();
                        } else {
                            self.ctx.store.remove(&self.uid);
                        }
                        if let Some(d) = done {
                            let _ = d.send(());
                        }
                        if self.terminal.is_none() {
                            return;
                        }
                        break;
                    }
                    None => return,
                },
            }
        }
        if self.permit.is_some() {
            self.adopt().await;
        }
        loop {
            if self.terminal.is_none() && self.permit.is_some() {
                let started = Instant::now();
                self.set_busy(true);
                self.sync().await;
                self.set_busy(false);
                let op = if self.placement.is_some() { "sync" } else { "create" };
                self.ctx.metrics.pod_worker_duration.with_label_values(&[op]).observe(started.elapsed().as_secs_f64());
            }
            self.publish();
            let deadline = self.next_deadline();
            tokio::select! {
                msg = rx.recv() => match msg {
                    None => return,
                    Some(Msg::Update(p)) => self.update(*p),
                    Some(Msg::Terminate { grace, reason, signalled, done }) => {
                        let deleted = reason == Reason::Deleted;
                        self.terminate(grace, reason, signalled, &mut events).await;
                        if let Some(d) = done { let _ = d.send(()); }
                        if deleted {
                            self.ctx.store.remove(&self.uid);
                            return;
                        }
                    }
                },
                Some(ev) = events.recv() => self.handle(ev),
                () = sleep_until(deadline) => {}
            }
        }
    }

    fn set_busy(&self, busy: bool) {
        *self.busy.lock().unwrap_or_else(PoisonError::into_inner) = busy.then(Instant::now);
    }

    fn update(&mut self, pod: Pod) {
        if pod == self.pod {
            return;
        }
        self.pod = pod;
        if self.placement.is_some() && self.terminal.is_none() {
            let res = self.ctx.resources().update(&self.pod);
            match res {
                Ok(p) => self.placement = Some(p),
                Err(e) => tracing::warn!(pod_uid = %self.uid, error = %e, "cannot apply the pod's new resources"),
            }
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        if self.terminal.is_some() {
            return None;
        }
        self.containers
            .iter()
            .filter(|c| c.run.is_none() && !c.done)
            .filter_map(|c| c.next_start)
            .chain(self.retry)
            .min()
    }

    /// A step failed: retry with a back-off of 1 s doubling to 30 s, showing why in the status.
    fn retry_later(&mut self, why: String) {
        tracing::warn!(pod = %self.full_name(), error = %why, "pod sync failed; retrying");
        self.retry_backoff = (self.retry_backoff * 2).clamp(Duration::from_secs(1), Duration::from_secs(30));
        self.retry = Some(Instant::now() + self.retry_backoff);
        self.pending = Some(why);
    }

    fn full_name(&self) -> String {
        format!(
            "{}/{}",
            self.pod.metadata.namespace.as_deref().unwrap_or("default"),
            self.pod.metadata.name.as_deref().unwrap_or_default()
        )
    }

    /// Takes over a pod an earlier daemon ran: its saved state and its running containers. No process is started
    /// for a container that is still running.
    async fn adopt(&mut self) {
        let root = self.ctx.settings.root_dir.clone();
        let saved = state::load(&root, &self.uid);
        if let Some((phase, reason, message)) = saved.terminal.clone() {
            self.terminal = Some(Terminal { phase, reason, message });
            return;
        }
        let placed = self.ctx.resources().placement(&self.uid).is_some();
        if !placed {
            return;
        }
        self.start_time = saved.start_time;
        let res = self.ctx.resources().place(&self.pod);
        match res {
            Ok(p) => self.placement = Some(p),
            Err(e) => {
                tracing::warn!(pod_uid = %self.uid, error = %e, "cannot place an adopted pod again");
                return;
            }
        }
        let memory_limit = self.placement.as_ref().and_then(|p| p.limits.memory_max.value());
        let volumes = self.pod.spec.as_ref().and_then(|s| s.volumes.clone()).unwrap_or_default();
        self.volumes = volumes::prepare(&root, &self.uid, &volumes, memory_limit).ok();
        self.sandbox = match self.sandbox_spec() {
            Some(spec) => self.ctx.runtime.adopt_sandbox(&spec).await,
            None => None,
        };
        if self.sandbox.is_none() {
            // The runtime lost the sandbox, and its containers with it: the next sync creates a new one.
            tracing::warn!(pod = %self.full_name(), "no ready sandbox found for an adopted pod; creating a new one");
            self.start_reported = true;
            self.save();
            return;
        }
        let mut any_app = false;
        for i in 0..self.containers.len() {
            let name = self.containers[i].name.clone();
            let s = saved.containers.get(&name).cloned().unwrap_or_default();
            self.containers[i].restarts = s.restarts;
            self.containers[i].last = s.last.map(|l| (l, String::new()));
            if let Some(spec) = self.build_spec(i).ok()
                && let Some(started) = self.ctx.runtime.adopt(&spec, s.pid).await
            {
                let started_at = s.started_at.unwrap_or(started.started_at);
                tracing::info!(pod = %self.full_name(), container = %name, pid = started.pid, "adopted running container");
                self.attach(i, spec, started.id, started.pid, started_at);
                any_app |= self.containers[i].kind == Kind::App;
            }
            any_app |= self.containers[i].kind == Kind::App && self.containers[i].last.is_some();
        }
        if any_app {
            // App containers ran, so initialisation was over.
            for c in self.containers.iter_mut().filter(|c| c.kind == Kind::Init && c.run.is_none()) {
                c.done = true;
            }
        }
        self.start_reported = true;
        self.save();
    }

    /// One sync pass.
    async fn sync(&mut self) {
        let now = Instant::now();
        if self.retry.is_some_and(|t| now < t) {
            return;
        }
        self.retry = None;
        if self.placement.is_none() {
            let placed = self.ctx.resources().place(&self.pod);
            match placed {
                Ok(p) => {
                    self.placement = Some(p);
                    self.start_time.get_or_insert_with(Timestamp::now);
                }
                Err(PlaceError::Admit(e)) => {
                    tracing::warn!(pod = %self.full_name(), reason = e.reason(), error = %e, "pod refused at admission");
                    self.terminal = Some(Terminal {
                        phase: "Failed".into(),
                        reason: Some(e.reason().into()),
                        message: Some(e.to_string()),
                    });
                    self.release_name();
                    return;
                }
                Err(e) => return self.retry_later(format!("cannot place the pod: {e}")),
            }
        }
        if self.volumes.is_none() {
            let memory_limit = self.placement.as_ref().and_then(|p| p.limits.memory_max.value());
            let vols = self.pod.spec.as_ref().and_then(|s| s.volumes.clone()).unwrap_or_default();
            match volumes::prepare(&self.ctx.settings.root_dir, &self.uid, &vols, memory_limit) {
                Ok(v) => self.volumes = Some(v),
                Err(e) => return self.retry_later(format!("cannot prepare volumes: {e}")),
            }
        }
        if self.sandbox.is_none() {
            let Some(spec) = self.sandbox_spec() else { return self.retry_later("pod not placed".into()) };
            match self.ctx.runtime.run_sandbox(&spec).await {
                Ok(id) => {
                    tracing::info!(pod = %self.full_name(), sandbox = %id, "pod sandbox running");
                    self.sandbox = Some(id);
                }
                Err(e) => {
                    // A half-made sandbox is not left behind.
                    self.ctx.runtime.remove_sandbox(&spec).await;
                    return self.retry_later(format!("cannot create the pod sandbox: {e}"));
                }
            }
        }
        self.pending = None;
        self.retry_backoff = Duration::ZERO;
        if !self.sync_init().await {
            return;
        }
        self.initialized = true;
        for i in 0..self.containers.len() {
            let c = &self.containers[i];
            if c.kind != Kind::App || c.run.is_some() || c.done {
                continue;
            }
            self.try_start(i).await;
        }
        let apps = self.containers.iter().filter(|c| c.kind == Kind::App);
        if apps.clone().all(|c| c.done) {
            let ok = apps.clone().all(|c| c.last.as_ref().is_some_and(|(l, _)| l.exit_code == 0));
            let phase = if ok { "Succeeded" } else { "Failed" };
            self.finish(Terminal { phase: phase.into(), reason: None, message: None }).await;
        } else if !self.start_reported && apps.clone().all(|c| c.run.is_some()) {
            self.start_reported = true;
            self.ctx.metrics.pod_start_duration.observe(self.seen.elapsed().as_secs_f64());
        }
    }

    /// Init containers in order, each to completion; sidecars (init containers with `restartPolicy: Always`) only
    /// need to have started. Returns true once initialisation is complete.
    async fn sync_init(&mut self) -> bool {
        if self.initialized {
            // Sidecars keep being restarted after initialisation.
            for i in 0..self.containers.len() {
                if self.containers[i].kind == Kind::Sidecar && self.containers[i].run.is_none() {
                    self.try_start(i).await;
                }
            }
            return true;
        }
        for i in 0..self.containers.len() {
            let c = &self.containers[i];
            match c.kind {
                Kind::App => continue,
                Kind::Sidecar => {
                    if c.run.is_none() && !self.try_start(i).await {
                        return false;
                    }
                    if !self.containers[i].run.as_ref().is_some_and(|r| r.started) {
                        return false;
                    }
                }
                Kind::Init => {
                    if c.done || c.last.as_ref().is_some_and(|(l, _)| l.exit_code == 0) && c.run.is_none() {
                        continue;
                    }
                    if c.run.is_some() {
                        return false;
                    }
                    if let Some((l, _)) = &c.last
                        && self.policy == RestartPolicy::Never
                    {
                        let message = format!("init container {} failed with exit code {}", c.name, l.exit_code);
                        self.finish(Terminal { phase: "Failed".into(), reason: None, message: Some(message) }).await;
                        return false;
                    }
                    self.try_start(i).await;
                    return false;
                }
            }
        }
        true
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
