//! One pod worker per pod UID: a task that owns the pod's lifecycle, so two syncs of one pod never run at once.
//! The lifecycle is a state machine ([`lifecycle`], [`step`]) in the kubelet's order (admit and place → volumes
//! → sandbox → init containers in order, each to completion → app containers → probes → status), with restarts
//! under the restart policy and the crash-loop back-off, and termination when the pod is deleted or evicted.
//! This module is the executor: it feeds the machine its inputs (spec updates, terminations, container exits,
//! probe results, timers, the results of runtime calls) and carries out the actions it returns. Long runtime
//! calls (image pulls, starts, sandboxes) run as tasks that a termination drops.

mod adopt;
mod containers;
mod lifecycle;
mod status;
mod step;
mod terminate;

pub(crate) use lifecycle::Reason;
pub(crate) use terminate::kill_and_release;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use nodewarden_resources::{Ledger, PlaceError, Placement, PodResources, QosClass};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::metrics::SyncMetrics;
use crate::probe::ProbeKind;
use crate::projection::Payload;
use crate::store::StatusStore;
use crate::volumes::{self, PreparedVolume};
use lifecycle::{Action, Input, Lifecycle, PlaceFailure, PodState, grace_period};
use nodewarden_runtime::{ContainerId, ExitInfo, RunningSandbox, Runtime};

/// Settings of pod sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncSettings {
    /// Where pod volumes and state live (`<rootDir>/pods/<uid>`).
    pub root_dir: PathBuf,
    /// Where container logs go (`podLogsDir`, `/var/log/pods`).
    pub log_dir: PathBuf,
    /// The node name.
    pub node_name: String,
    /// Container log rotation.
    pub log_rotation: crate::LogRotation,
    /// The node's addresses (its `InternalIP`), the primary first: every pod's `hostIP`, and the `podIP` of a
    /// pod on the host's network. Empty when the node has none but the loopback.
    pub host_ips: Vec<String>,
    /// How often the files of volumes made from objects (ConfigMaps, Secrets, tokens, the pod's metadata) are
    /// made again (`syncFrequency`, a minute by default).
    pub sync_frequency: Duration,
    /// Which exited containers are kept, and for how long.
    pub dead_containers: crate::DeadContainerPolicy,
}

/// Removes dead containers the container garbage collection no longer keeps.
pub(crate) async fn remove_dead<R: Runtime>(runtime: &R, ids: Vec<ContainerId>) {
    for id in ids {
        tracing::debug!(container_id = %id.as_str(), "removing a dead container");
        runtime.remove(&id).await;
    }
}

/// How long fetching the objects of one use of a pod (its volumes, a container's environment) may take.
const OBJECTS_TIMEOUT: Duration = Duration::from_secs(15);

/// What the workers share.
pub(crate) struct Shared<R> {
    /// The ledger of placements (its single writer), and what it publishes.
    pub ledger: Ledger,
    pub runtime: Arc<R>,
    pub settings: SyncSettings,
    pub store: Arc<StatusStore>,
    pub metrics: SyncMetrics,
    /// Where pod events go.
    pub events: Arc<dyn crate::EventSink>,
    /// Where the ConfigMaps, Secrets and tokens of pods come from.
    pub objects: Arc<dyn crate::PodObjects>,
    /// Where the grid of container log checks starts ([`crate::logs::first_check`]).
    pub log_epoch: Instant,
    /// The exited containers kept.
    pub dead: crate::container_gc::DeadContainers,
}

/// A request to terminate a pod.
pub(crate) struct TerminateRequest {
    /// The grace period.
    pub grace: Duration,
    /// Why.
    pub reason: Reason,
    /// Told when SIGTERM went to every running container, once it has (dropped when nothing ran).
    pub signalled: Option<Signalled>,
    /// Told once the pod has terminated.
    pub done: Option<oneshot::Sender<()>>,
    /// The pod's source no longer lists it.
    pub unlisted: bool,
}

impl TerminateRequest {
    /// The pod is deleted: terminated with `grace`, and nobody waits. `unlisted` when its source dropped it;
    /// one it still lists with a deletion time (the apiserver's graceful deletion) stays until it is dropped.
    pub(crate) fn deleted(grace: Duration, unlisted: bool) -> Self {
        Self { grace, reason: Reason::Deleted, signalled: None, done: None, unlisted }
    }

    /// A termination whose requester waits: `signalled` tells it of the stop signals; the receiver returned
    /// resolves once the pod has terminated.
    pub(crate) fn requested(grace: Duration, reason: Reason, signalled: Signalled) -> (Self, oneshot::Receiver<()>) {
        let (done, terminated) = oneshot::channel();
        (Self { grace, reason, signalled: Some(signalled), done: Some(done), unlisted: false }, terminated)
    }
}

/// Told once that a termination's stop signals went out, and when, by whoever sent them first: the pod's worker,
/// or an eviction that sent them itself ([`crate::PodManager::evict`]).
#[derive(Clone)]
pub(crate) struct Signalled(Arc<Mutex<Option<oneshot::Sender<Instant>>>>);

impl Signalled {
    /// A slot, and the receiver it tells.
    pub(crate) fn new() -> (Self, oneshot::Receiver<Instant>) {
        let (tx, rx) = oneshot::channel();
        (Self(Arc::new(Mutex::new(Some(tx)))), rx)
    }

    /// Whether the receiver was told.
    pub(crate) fn is_told(&self) -> bool {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).is_none()
    }

    /// Tells the receiver `at`, unless it was told already.
    pub(crate) fn tell(&self, at: Instant) {
        if let Some(tx) = self.0.lock().unwrap_or_else(PoisonError::into_inner).take() {
            let _ = tx.send(at);
        }
    }
}

/// The containers an eviction may send their stop signal itself, on its own thread, holding this list until it has
/// queued the termination for the pod's worker: those running while the pod runs, when the pod has no preStop hook
/// to run first and the runtime can signal at once ([`nodewarden_runtime::StopSignals`]); empty otherwise, and while
/// the worker steps. The worker keeps it up to date.
pub(crate) type Stoppable = Arc<Mutex<Vec<ContainerId>>>;

/// What a worker's own tasks report.
pub(crate) enum Event {
    /// A container exited.
    Exited { id: ContainerId, info: ExitInfo },
    /// One probe result: its output on success, why on failure.
    Probe { id: ContainerId, kind: ProbeKind, result: Result<String, String> },
    /// The termination's stop signals went out, at this time.
    Signalled(Instant),
}

/// The pod's sandbox, as far as the worker knows.
enum Sandbox {
    /// None was asked for.
    None,
    /// Asked for (it may exist even if the call was dropped).
    Requested,
    /// Running.
    Running(RunningSandbox),
    /// Stopped with the pod's end and kept, with its exited containers, while the pod is listed.
    Stopped,
}

/// The worker's handles on a running container: its exit watcher, its probes and a stop in progress.
type ContainerTasks = HashMap<ContainerId, JoinSet<()>>;

pub(crate) struct Worker<R> {
    shared: Arc<Shared<R>>,
    uid: String,
    pod: Pod,
    lifecycle: Lifecycle,
    placement: Option<Placement>,
    /// The pod's QoS class, kept after its placement is released (the kubelet's status keeps it).
    qos: Option<QosClass>,
    volumes: Vec<PreparedVolume>,
    sandbox: Sandbox,
    /// The worker's own tasks.
    tasks: Tasks,
    /// What the worker shares with its manager.
    link: Link,
    /// Who waits on the pod's termination.
    waiting: Waiting,
    /// What the pod's status was and why.
    report: Report,
    /// Whether the spec has a preStop hook to run ([`terminate::has_pre_stop`]), read once per spec.
    pre_stop_hooked: bool,
    /// This worker has saved the pod's state once: from then on only what a save changes is synced.
    saved_once: bool,
}

/// A worker's own tasks.
#[derive(Default)]
struct Tasks {
    /// Runtime calls in flight.
    in_flight: JoinSet<containers::Completed>,
    /// The termination's preStop hooks and stops.
    stopping: JoinSet<()>,
    /// Removals and kills nobody waits for.
    background: JoinSet<()>,
    /// Each running container's exit watch, probes and log rotation.
    containers: ContainerTasks,
    /// Held while the pod's volumes are being made ([`Worker::preparing`]).
    volumes: Arc<tokio::sync::Mutex<()>>,
    /// When the files of the volumes made from objects are made again ([`Worker::refresh_volumes`]).
    refresh_at: Option<Instant>,
    /// Set while a refresh runs: the next waits for none, it is skipped (a slow one never writes over a newer).
    refreshing: Arc<std::sync::atomic::AtomicBool>,
}

/// What a worker shares with its pod manager.
struct Link {
    /// Its tasks' reports.
    events: mpsc::UnboundedSender<Event>,
    /// Since when it has had runtime calls in flight (the manager's stuck check).
    busy: Arc<Mutex<Option<Instant>>>,
    /// The containers an eviction may signal itself.
    stoppable: Stoppable,
    /// One pod of a name at a time, and this worker's turn.
    name_lock: Arc<Semaphore>,
    permit: Option<OwnedSemaphorePermit>,
}

/// The termination's requesters.
#[derive(Default)]
struct Waiting {
    /// To tell once SIGTERM is out.
    signalled: Vec<Signalled>,
    /// The stop signals are not out yet.
    awaiting_signal: bool,
    /// When the termination's stop signals went out.
    signalled_at: Option<Instant>,
    /// To tell once the pod is over.
    done: Vec<oneshot::Sender<()>>,
}

/// What the pod's status reporting keeps.
struct Report {
    conditions: status::ConditionTimes,
    /// When the worker was made, until the pod-start metric has counted it.
    created: Option<Instant>,
    /// Why this worker took the pod over from one that panicked (a pod condition says so).
    incident: Option<k8s_openapi::api::core::v1::PodCondition>,
    /// The status last put in the store: an input that changes nothing (most probe results) publishes nothing.
    published: Option<k8s_openapi::api::core::v1::PodStatus>,
}

impl<R: Runtime> Worker<R> {
    pub(crate) fn new(
        shared: Arc<Shared<R>>,
        pod: Pod,
        events: mpsc::UnboundedSender<Event>,
        busy: Arc<Mutex<Option<Instant>>>,
        stoppable: Stoppable,
        name_lock: Arc<Semaphore>,
    ) -> Self {
        Self {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            lifecycle: Lifecycle::new(&pod),
            qos: PodResources::from_pod(&pod).ok().map(|r| r.qos_class()),
            pre_stop_hooked: terminate::has_pre_stop(&pod),
            pod,
            shared,
            placement: None,
            volumes: Vec::new(),
            sandbox: Sandbox::None,
            tasks: Tasks::default(),
            link: Link { events, busy, stoppable, name_lock, permit: None },
            waiting: Waiting::default(),
            report: Report {
                conditions: status::ConditionTimes::default(),
                created: Some(Instant::now()),
                incident: None,
                published: None,
            },
            saved_once: false,
        }
    }

    /// A worker that takes the pod over from one that panicked, for this reason.
    pub(crate) fn with_incident(mut self, incident: Option<String>) -> Self {
        self.report.incident = incident.as_deref().map(crate::store::worker_condition);
        self
    }

    fn full_name(&self) -> String {
        nodewarden_resources::pod::full_name(&self.pod)
    }

    /// The worker's life: wait until no other pod of the same name runs, take over what survives of an earlier
    /// daemon, then follow the pod until it is removed. Terminations are never dropped; of the specs, the latest
    /// wins.
    pub(crate) async fn run(
        mut self,
        mut spec: watch::Receiver<Arc<Pod>>,
        mut terminations: mpsc::UnboundedReceiver<TerminateRequest>,
        mut events: mpsc::UnboundedReceiver<Event>,
    ) {
        self.publish();
        let acquire = self.link.name_lock.clone().acquire_owned();
        tokio::pin!(acquire);
        // An event read together with a termination queued before it, handled right after the termination.
        let mut deferred: Option<Event> = None;
        while self.lifecycle.state != PodState::Removed {
            let wakeup = self.lifecycle.next_wakeup();
            let awaiting_name = self.lifecycle.state == PodState::AwaitingName;
            // A pod an earlier daemon placed is taken over before it is terminated: a termination read first
            // would forget it and leave its containers running. Its terminations wait in their queue meanwhile.
            let adoptable = awaiting_name && self.shared.ledger.view().is_placed(&self.uid);
            while self.tasks.background.try_join_next().is_some() {}
            if let Some(ev) = deferred.take() {
                if let Some(input) = self.event_input(ev) {
                    self.handle(input).await;
                }
                continue;
            }
            let input = tokio::select! {
                biased;
                req = terminations.recv(), if !adoptable => {
                    let Some(req) = req else { return };
                    self.accept(req).await
                }
                permit = &mut acquire, if awaiting_name => {
                    self.link.permit = permit.ok();
                    self.adopt().await.unwrap_or(Input::NameFree)
                }
                changed = spec.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let pod = Pod::clone(&spec.borrow_and_update());
                    if pod == self.pod {
                        continue;
                    }
                    self.pre_stop_hooked = terminate::has_pre_stop(&pod);
                    let redefined = self.redefined(&pod);
                    self.pod = pod;
                    self.report.published = None;
                    Input::SpecUpdate { grace: grace_period(&self.pod), redefined }
                }
                Some(done) = self.tasks.in_flight.join_next() => match done {
                    Ok(done) => self.completed(done),
                    Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                    Err(_) => continue,
                },
                Some(ev) = events.recv() => {
                    // The select may have found no termination just before an eviction signalled the container:
                    // it queues the termination before it lets go of the list, so once the list is free a
                    // termination that caused this exit is queued, and goes first, so that the exit ends the pod
                    // as terminated, not as completed or to be restarted.
                    drop(self.link.stoppable.lock().unwrap_or_else(PoisonError::into_inner));
                    if let Ok(req) = terminations.try_recv() {
                        deferred = Some(ev);
                        self.accept(req).await
                    } else {
                        match self.event_input(ev) {
                            Some(input) => input,
                            None => continue,
                        }
                    }
                }
                () = sleep_until(wakeup) => Input::Timer,
                () = sleep_until(self.tasks.refresh_at) => {
                    self.tasks.refresh_at = None;
                    self.refresh_volumes();
                    self.schedule_refresh();
                    continue;
                }
            };
            self.handle(input).await;
            self.schedule_refresh();
        }
        // Its tokens are of no use to anyone else.
        self.shared.objects.forget_pod(&self.uid);
    }

    /// The containers (by index) whose image in `new` differs from the running spec's: what the kubelet's
    /// container hash sees change in a pod the apiserver lets change (every other field of a container but its
    /// resources is immutable there; a static pod whose manifest changes is a new pod).
    fn redefined(&self, new: &Pod) -> Vec<usize> {
        let image = |pod: &Pod, name: &str| {
            let spec = pod.spec.as_ref()?;
            let c = spec.init_containers.iter().flatten().chain(&spec.containers).find(|c| c.name == name)?;
            c.image.clone()
        };
        let names = self.lifecycle.containers.iter().map(|c| c.name.as_str());
        names.enumerate().filter(|(_, n)| image(&self.pod, n) != image(new, n)).map(|(i, _)| i).collect()
    }

    /// Keeps the next refresh of the volumes made from objects due while the pod runs with them.
    fn schedule_refresh(&mut self) {
        let due = !self.lifecycle.state.is_over()
            && self.volumes.iter().any(|v| v.projected)
            && self.shared.settings.sync_frequency > Duration::ZERO;
        match (due, self.tasks.refresh_at) {
            (true, None) => {
                // Spread over half a period by the pod's UID, as the kubelet jitters its pod syncs: the pods of a
                // restarted node do not all ask for their objects and tokens at once.
                let period = self.shared.settings.sync_frequency;
                let spread = self.uid.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b))) % 1000;
                let jitter = period.mul_f64(0.5 * f64::from(spread) / 1000.0);
                self.tasks.refresh_at = Some(Instant::now() + period + jitter);
            }
            (false, Some(_)) => self.tasks.refresh_at = None,
            _ => {}
        }
    }

    /// Takes a termination request: its requesters are told what they wait for; a pod its source dropped is
    /// terminated before it is told so. Where an eviction has just sent
    /// the stop signals itself, the victims get [`nodewarden_eviction::VICTIM_HEADSTART`] of the CPU first.
    async fn accept(&mut self, req: TerminateRequest) -> Input {
        // An eviction holds the list while it signals (see `PodManager::evict`): once it is free, the signals are
        // out, or left to this worker.
        drop(self.link.stoppable.lock().unwrap_or_else(PoisonError::into_inner));
        if req.signalled.as_ref().is_some_and(Signalled::is_told) {
            tokio::time::sleep(nodewarden_eviction::VICTIM_HEADSTART).await;
        }
        self.waiting.signalled.extend(req.signalled);
        self.waiting.done.extend(req.done);
        let terminate = Input::Terminate { grace: req.grace, reason: req.reason };
        if !req.unlisted {
            return terminate;
        }
        self.handle(terminate).await;
        Input::Unlisted
    }

    /// The input of an event of the worker's own tasks; `None` for one that only updates what it tells requesters.
    fn event_input(&mut self, ev: Event) -> Option<Input> {
        match ev {
            Event::Exited { id, info } => Some(Input::ContainerExited { id, info }),
            Event::Probe { id, kind, result } => Some(self.probe_input(id, kind, result)),
            Event::Signalled(at) => {
                self.waiting.awaiting_signal = false;
                self.waiting.signalled_at = Some(at);
                self.after_input();
                None
            }
        }
    }

    /// Steps the machine with `input` and carries out its actions, and the inputs they produce at once.
    async fn handle(&mut self, input: Input) {
        let started = Instant::now();
        // While the pod changes, an eviction leaves the signals to this worker.
        self.link.stoppable.lock().unwrap_or_else(PoisonError::into_inner).clear();
        let mut queue = VecDeque::from([input]);
        while let Some(input) = queue.pop_front() {
            let (next, actions) = step::step(std::mem::take(&mut self.lifecycle), input, Instant::now());
            self.lifecycle = next;
            for action in actions {
                queue.extend(self.execute(action).await);
            }
        }
        self.shared.metrics.pod_worker_duration.with_label_values(&["sync"]).observe(started.elapsed().as_secs_f64());
        self.after_input();
    }

    /// Publishes the status and tells the termination requesters what they wait for.
    fn after_input(&mut self) {
        if !self.waiting.awaiting_signal {
            let at = self.waiting.signalled_at.unwrap_or_else(Instant::now);
            for s in self.waiting.signalled.drain(..) {
                s.tell(at);
            }
        }
        let busy = (!self.tasks.in_flight.is_empty()).then(Instant::now);
        {
            let mut b = self.link.busy.lock().unwrap_or_else(PoisonError::into_inner);
            if busy.is_none() || b.is_none() {
                *b = busy;
            }
        }
        self.publish_stoppable();
        // A finalized pod's last status went to the feed with the action that finalized it.
        if !matches!(self.lifecycle.state, PodState::Finalizing | PodState::Removed) {
            self.publish();
        }
        // After the status: whoever waited for the termination (the eviction manager, which then reclaims the
        // logs of pods that are over) finds the pod over.
        if matches!(self.lifecycle.state, PodState::Finished(_) | PodState::Finalizing | PodState::Removed) {
            for d in self.waiting.done.drain(..) {
                let _ = d.send(());
            }
        }
    }

    /// Says which containers an eviction may signal itself (see [`Stoppable`]): the pod's termination would begin
    /// with their stop signals and nothing else. A pod with an exec preStop hook anywhere in its spec (read once
    /// per spec) never has any, whichever containers run at the moment.
    fn publish_stoppable(&self) {
        let ids = match self.lifecycle.state {
            PodState::Initializing | PodState::Running
                if !self.pre_stop_hooked && self.shared.runtime.stop_signals().is_some() =>
            {
                self.lifecycle.running_ids()
            }
            _ => Vec::new(),
        };
        *self.link.stoppable.lock().unwrap_or_else(PoisonError::into_inner) = ids;
    }

    fn probe_input(&self, id: ContainerId, kind: ProbeKind, result: Result<String, String>) -> Input {
        let name = self.lifecycle.index_of(&id).map(|i| self.lifecycle.containers[i].name.clone()).unwrap_or_default();
        let ok = result.is_ok();
        self.shared.metrics.probed(kind, ok, &name, &self.pod_labels());
        Input::ProbeResult { id, kind, ok, output: result.unwrap_or_else(|e| e) }
    }

    /// The pod's labels in its metrics.
    fn pod_labels(&self) -> crate::metrics::PodLabels<'_> {
        crate::metrics::PodLabels {
            name: self.pod.metadata.name.as_deref().unwrap_or_default(),
            namespace: nodewarden_resources::pod::namespace(&self.pod),
            uid: &self.uid,
        }
    }

    /// Carries out one action; returns the input it produces at once, if any.
    async fn execute(&mut self, action: Action) -> Option<Input> {
        match action {
            Action::Place => Some(self.place().await),
            Action::PrepareVolumes => {
                self.prepare_volumes();
                None
            }
            Action::RunSandbox => self.run_sandbox(),
            Action::UpdateResources => {
                if self.placement.is_some() {
                    match self.shared.ledger.update(self.pod.clone()).await {
                        Ok(p) => {
                            self.qos = Some(p.qos);
                            self.placement = Some(p);
                        }
                        Err(e) => {
                            tracing::warn!(pod_uid = %self.uid, error = %e, "cannot apply the pod's new resources")
                        }
                    }
                }
                None
            }
            Action::StartContainer { index, attempt } => self.start_container(index, attempt).await,
            Action::StopContainer { id, grace, why } => {
                self.stop_container(id, grace, &why);
                None
            }
            Action::RetireContainer { index, id, created } => {
                self.tasks.containers.remove(&id);
                let name = &self.lifecycle.containers[index].name;
                let gone = self.shared.dead.died(&self.uid, name, id, instant_of(created), Instant::now());
                if self.lifecycle.state.is_over() {
                    // Here, not in a task the worker's end would drop: the pod's clean-up no longer sees them.
                    remove_dead(&*self.shared.runtime, gone).await;
                } else if !gone.is_empty() {
                    let runtime = self.shared.runtime.clone();
                    self.tasks.background.spawn(async move { remove_dead(&*runtime, gone).await });
                }
                None
            }
            Action::Abandon => {
                self.tasks.in_flight = JoinSet::new();
                None
            }
            Action::MarkTerminating => {
                tracing::info!(pod = %self.full_name(), state = ?self.lifecycle.state, "terminating pod");
                let uid = self.uid.clone();
                if let Err(e) = self.shared.ledger.call(move |m| m.set_terminating(&uid)).await {
                    tracing::warn!(pod_uid = %self.uid, error = %e, "cannot mark the pod terminating");
                }
                None
            }
            Action::StopAll { ids, deadline } => {
                self.stop_all(ids, deadline).await;
                None
            }
            Action::KillAll { ids } => {
                self.kill_all(ids).await;
                None
            }
            Action::CleanUp { deleted, keep_containers } => {
                self.clean_up(deleted, keep_containers).await;
                Some(Input::CleanedUp)
            }
            Action::Save => {
                self.save().await;
                None
            }
            Action::ReleaseName => {
                self.link.permit = None;
                None
            }
            Action::Finalize => {
                // The status the pod ends with (its containers gone), kept by the status feed until it is reported.
                self.publish();
                self.shared.store.finalize(&self.uid);
                None
            }
            Action::Forget => {
                self.shared.store.remove(&self.uid);
                let names = self.lifecycle.containers.iter().map(|c| c.name.as_str());
                self.shared.metrics.forget_probes(names, &self.pod_labels());
                None
            }
            Action::Record(happened) => {
                let names: Vec<&str> = self.lifecycle.containers.iter().map(|c| c.name.as_str()).collect();
                self.shared.events.pod_event(&self.pod, happened.event(&self.pod, &names));
                None
            }
            Action::ReportStarted => {
                if let Some(t) = self.report.created.take() {
                    self.shared.metrics.pod_start_duration.observe(t.elapsed().as_secs_f64());
                }
                None
            }
        }
    }

    async fn place(&mut self) -> Input {
        let started = Instant::now();
        // The mark that this pod is nodewarden's goes down before its cgroup exists, so that a later start never
        // finds a cgroup of its own without it.
        let root = &self.shared.settings.root_dir;
        if !crate::state::is_ours(root, &self.uid)
            && let Err(e) = crate::state::mark(root, &self.uid)
        {
            tracing::warn!(pod_uid = %self.uid, error = %e, "cannot mark the pod's directory as nodewarden's");
        }
        let placed = self.shared.ledger.place(self.pod.clone()).await;
        self.shared.metrics.pod_worker_duration.with_label_values(&["create"]).observe(started.elapsed().as_secs_f64());
        match placed {
            Ok(p) => {
                self.qos = Some(p.qos);
                self.placement = Some(p);
                Input::Placed(Ok(jiff::Timestamp::now()))
            }
            Err(PlaceError::Admit(e)) => {
                tracing::warn!(pod = %self.full_name(), reason = e.reason(), error = %e, "pod refused at admission");
                Input::Placed(Err(PlaceFailure::Refused { reason: e.reason().into(), message: e.to_string() }))
            }
            Err(e) => {
                tracing::warn!(pod = %self.full_name(), error = %e, "cannot place the pod; retrying");
                Input::Placed(Err(PlaceFailure::Failed(format!("cannot place the pod: {e}"))))
            }
        }
    }

    /// The files of the pod's volumes written from API objects and the pod itself, by volume name, fetched through
    /// the objects port (a failed one is kept as its error).
    fn payloads(&self) -> impl Future<Output = BTreeMap<String, Result<Payload, String>>> + Send + 'static {
        let pod = self.pod.clone();
        let objects = self.shared.objects.clone();
        let node = self.shared.ledger.view().allocatable().reported;
        async move {
            let mut out = BTreeMap::new();
            let namespace = nodewarden_resources::pod::namespace(&pod).to_owned();
            let mut fetched = crate::objects::Fetched::new(&*objects, &namespace);
            for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
                let made = crate::projection::volume_payload(v, &pod, &mut fetched, &node);
                match tokio::time::timeout(OBJECTS_TIMEOUT, made).await {
                    Ok(Ok(Some(p))) => {
                        out.insert(v.name.clone(), Ok(p));
                    }
                    Ok(Ok(None)) => {}
                    Ok(Err(e)) => {
                        out.insert(v.name.clone(), Err(e));
                    }
                    Err(_) => {
                        out.insert(v.name.clone(), Err("timed out fetching the volume's objects".into()));
                    }
                }
            }
            out
        }
    }

    /// Makes the pod's volumes ready: the files of those written from objects fetched first, then directories,
    /// tmpfs mounts sized to the pod's memory limit, hostPath checks and creation and the files on a blocking
    /// thread (`adopting`: see [`volumes::prepare`]'s `keep_last`). The thread holds the volumes' lock until it is
    /// done, even when what waits for it is dropped (a termination abandons it): the clean-up takes the lock before
    /// it removes them.
    fn preparing(
        &self,
        adopting: bool,
    ) -> impl Future<Output = Result<Vec<PreparedVolume>, volumes::VolumeError>> + Send + 'static {
        let memory_limit = self.placement.as_ref().and_then(|p| p.limits.memory_max.value());
        let vols = self.pod.spec.as_ref().and_then(|s| s.volumes.clone()).unwrap_or_default();
        let (root, uid) = (self.shared.settings.root_dir.clone(), self.uid.clone());
        let lock = self.tasks.volumes.clone();
        let payloads = self.payloads();
        // An `fsGroup` out of range fails the containers' start with its message.
        let fs_group = nodewarden_runtime::security::fs_group(&self.pod).ok().flatten();
        async move {
            let payloads = payloads.await;
            let held = lock.lock_owned().await;
            let preparing = tokio::task::spawn_blocking(move || {
                let _held = held;
                volumes::prepare(&root, &uid, &vols, memory_limit, &payloads, adopting, fs_group)
            });
            match preparing.await {
                Ok(result) => result,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => Err(volumes::VolumeError { volume: String::new(), message: e.to_string() }),
            }
        }
    }

    /// Writes the files of the pod's volumes made from objects again, as a task of its own that nobody waits for:
    /// a changed ConfigMap or Secret, or a renewed token, is swapped in; a failure keeps the last files and is
    /// the kubelet's `FailedMount` event.
    fn refresh_volumes(&mut self) {
        let memory_limit = self.placement.as_ref().and_then(|p| p.limits.memory_max.value());
        let vols: Vec<_> = self
            .pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter(|v| crate::projection::is_projected(v))
            .cloned()
            .collect();
        if vols.is_empty() {
            return;
        }
        if self.tasks.refreshing.swap(true, std::sync::atomic::Ordering::SeqCst) {
            tracing::debug!(pod = %self.full_name(), "the last refresh of the volumes still runs; this one is skipped");
            return;
        }
        let (root, uid) = (self.shared.settings.root_dir.clone(), self.uid.clone());
        let lock = self.tasks.volumes.clone();
        let payloads = self.payloads();
        let (pod, shared) = (self.pod.clone(), self.shared.clone());
        let done = Refreshing(self.tasks.refreshing.clone());
        self.tasks.background.spawn(async move {
            let _done = done;
            let payloads = payloads.await;
            let held = lock.lock_owned().await;
            let refreshing = tokio::task::spawn_blocking(move || {
                let _held = held;
                volumes::refresh(&root, &uid, &vols, memory_limit, &payloads)
            });
            let full_name = nodewarden_resources::pod::full_name(&pod);
            let (changed, errors) = match refreshing.await {
                Ok(done) => done,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => return,
            };
            if !changed.is_empty() {
                tracing::info!(pod = %full_name, volumes = ?changed, "volume files updated");
            }
            for e in errors {
                tracing::warn!(pod = %full_name, error = %e, "cannot refresh a volume's files; it keeps the last ones");
                let event = crate::events::Happened::FailedMount(e.to_string()).event(&pod, &[]);
                shared.events.pod_event(&pod, event);
            }
        });
    }

    /// [`Worker::preparing`] as an action in flight: its result comes back as [`containers::Completed::Volumes`].
    fn prepare_volumes(&mut self) {
        let preparing = self.preparing(false);
        self.tasks.in_flight.spawn(async move { containers::Completed::Volumes(preparing.await) });
    }

    /// Saves the pod's state on a blocking thread, so that its syncs (journal commits on a real disk) hold none of
    /// the runtime's threads and the saves of pods starting together can share a commit. Waited for, so that a
    /// pod's saves land in order.
    async fn save(&mut self) {
        let saved = adopt::saved(&self.lifecycle, (Instant::now(), jiff::Timestamp::now()));
        let (root, uid, first) = (self.shared.settings.root_dir.clone(), self.uid.clone(), !self.saved_once);
        let saving = tokio::task::spawn_blocking(move || crate::state::save(&root, &uid, &saved, first));
        let error = match saving.await {
            Ok(Ok(())) => {
                self.saved_once = true;
                return;
            }
            Ok(Err(e)) => e.to_string(),
            // A panic is the worker's, as if the save had run on its own thread.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => e.to_string(),
        };
        tracing::warn!(pod_uid = %self.uid, error = %error, "cannot save pod state");
    }
}

/// Clears the refresh flag when the refresh ends, however it ends.
struct Refreshing(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Refreshing {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The monotonic instant of wall-clock time `at`, by its age now (now for a time in the future).
fn instant_of(at: jiff::Timestamp) -> Instant {
    let age = Duration::try_from(jiff::Timestamp::now().duration_since(at)).unwrap_or(Duration::ZERO);
    let now = Instant::now();
    now.checked_sub(age).unwrap_or(now)
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
