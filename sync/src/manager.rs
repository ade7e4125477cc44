//! The pod manager: turns source snapshots into pod workers (one per UID), terminates the pods a source no longer
//! has, cleans up pods adopted from an earlier daemon that no source has, and is the eviction manager's way to
//! terminate a pod.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::FutureExt;
use k8s_openapi::api::core::v1::Pod;
use nodewarden_eviction::Eviction;
use nodewarden_resources::{Ledger, pod};
use rustix::process::Signal;
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::SyncMetrics;
use crate::source::SourceSnapshot;
use crate::store::StatusStore;
use crate::worker::{Reason, Shared, Signalled, Stoppable, SyncSettings, TerminateRequest, Worker, kill_and_release};
use crate::{EventType, PodEvent, state, volumes};
use nodewarden_runtime::{ImageSummary, Runtime, RuntimeHealth};

/// The manager loop's period, which `/readyz` checks.
pub const TICK: Duration = Duration::from_secs(1);
/// A sync pass running longer than this makes `/readyz` fail: a runtime call is stuck.
pub const STUCK_AFTER: Duration = Duration::from_secs(60);
/// The grace period of pods found at start that no source has (their spec, and so their own grace, is unknown).
pub const ORPHAN_GRACE: Duration = Duration::from_secs(30);

/// How often a pod's worker is replaced after panicking before the pod is given up.
pub const MAX_WORKER_PANICS: u32 = 5;

/// A worker, as the manager reaches it: the latest spec (a newer one replaces it) and its terminations (never
/// dropped).
struct Handle {
    spec: watch::Sender<Arc<Pod>>,
    terminations: mpsc::UnboundedSender<TerminateRequest>,
    task: tokio::task::JoinHandle<()>,
    busy: Arc<Mutex<Option<Instant>>>,
    /// The containers an eviction may signal itself (the worker keeps it).
    stoppable: Stoppable,
    name: String,
    source: &'static str,
    /// The grace period of the pod's deletion, once its source dropped it or listed it with a
    /// `deletionTimestamp`: a replacement worker is told again, and a later deletion is told only if shorter.
    deleted: Option<Duration>,
    /// Its source has the pod again (the same UID) since it was deleted: once the terminating worker has ended, a
    /// new one starts the pod anew, as the kubelet restarts a pod re-added while it terminated.
    wanted_again: bool,
    /// Its source no longer lists it, and the worker was told.
    unlisted: bool,
    /// The last termination asked of it on request (an eviction, the node's shutdown): a replacement worker is
    /// told again, since its containers may have been signalled already.
    terminating: Option<(Duration, Reason)>,
    /// How often the pod's worker panicked.
    panics: u32,
}

impl Handle {
    /// Tells the worker its pod is deleted, with `grace` (the worker only ever shortens a termination's grace), and
    /// whether its source still lists it.
    fn delete(&mut self, uid: &str, grace: Duration) {
        self.deleted = Some(self.deleted.map_or(grace, |told| told.min(grace)));
        if self.terminations.send(TerminateRequest::deleted(grace, self.unlisted)).is_err() {
            tracing::warn!(pod_uid = %uid, "the pod's worker is gone");
        }
    }
}

/// Why a pod could not be terminated on request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TerminateError {
    /// No worker has that pod.
    #[error("pod {0} is not known")]
    UnknownPod(String),
    /// The worker ended before confirming.
    #[error("pod {0}'s worker stopped before the pod was terminated")]
    WorkerGone(String),
}

/// The pod manager.
pub struct PodManager<R: Runtime> {
    ctx: Arc<Shared<R>>,
    workers: Mutex<HashMap<String, Handle>>,
    name_locks: Mutex<HashMap<String, Arc<Semaphore>>>,
    last_tick: Mutex<Option<Instant>>,
    /// The sources expected whose first snapshot has not been applied yet.
    awaited: Mutex<BTreeSet<&'static str>>,
    /// The daemon's task tracker and shutdown token: the workers and the detached tasks (orphan termination,
    /// reconciliation) run on them.
    tasks: TaskTracker,
    shutdown: CancellationToken,
    /// The image collector, for a runtime with images.
    images: Option<Arc<crate::ImageCollector<R>>>,
    /// The containers' writable layers, for a runtime with images.
    layers: crate::layers::WritableLayers,
    /// The reclaim of node storage before an eviction for disk.
    reclaim: crate::reclaim::NodeReclaim,
}

impl<R: Runtime> std::fmt::Debug for PodManager<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodManager").finish_non_exhaustive()
    }
}

impl<R: Runtime> PodManager<R> {
    /// A manager over the ledger and a runtime, recording pod events and reading the objects pods reference
    /// through `ports`.
    pub fn new(
        ledger: Ledger,
        runtime: Arc<R>,
        settings: SyncSettings,
        metrics: SyncMetrics,
        ports: crate::Ports,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let store = Arc::new(StatusStore::default());
        let log_epoch = Instant::now();
        let images = crate::ImageCollector::new(runtime.clone(), store.clone(), metrics.images_collected.clone());
        let dead = crate::container_gc::DeadContainers::new(settings.dead_containers);
        let ctx = Arc::new(Shared {
            ledger,
            runtime,
            settings,
            store,
            metrics,
            events: ports.events,
            objects: ports.objects,
            log_epoch,
            dead,
        });
        Arc::new(Self {
            ctx,
            workers: Mutex::new(HashMap::new()),
            name_locks: Mutex::new(HashMap::new()),
            last_tick: Mutex::new(None),
            awaited: Mutex::new(BTreeSet::new()),
            tasks,
            shutdown,
            images,
            layers: crate::layers::WritableLayers::default(),
            reclaim: crate::reclaim::NodeReclaim::new(),
        })
    }

    /// The image collector, for a runtime with images: the daemon runs its periodic passes, the eviction
    /// manager's reclaim removes unused images through it.
    pub fn image_collector(&self) -> Option<Arc<crate::ImageCollector<R>>> {
        self.images.clone()
    }

    /// The runtime.
    pub(crate) fn runtime(&self) -> &R {
        &self.ctx.runtime
    }

    /// The runtime, to move into a task.
    pub(crate) fn runtime_handle(&self) -> Arc<R> {
        self.ctx.runtime.clone()
    }

    /// The node's dead containers.
    pub(crate) fn dead_containers(&self) -> &crate::container_gc::DeadContainers {
        &self.ctx.dead
    }

    /// The reclaim of node storage before an eviction for disk.
    pub(crate) fn node_reclaim(&self) -> &crate::reclaim::NodeReclaim {
        &self.reclaim
    }

    /// The containers' writable layers, as last measured.
    pub(crate) fn writable_layers(&self) -> &crate::layers::WritableLayers {
        &self.layers
    }

    /// The status store (`/pods`).
    pub fn store(&self) -> Arc<StatusStore> {
        self.ctx.store.clone()
    }

    pub(crate) fn settings(&self) -> &SyncSettings {
        &self.ctx.settings
    }

    /// The ledger's view: the pods placed, as the eviction manager sees them.
    pub(crate) fn ledger_view(&self) -> &nodewarden_resources::LedgerView {
        self.ctx.ledger.view()
    }

    fn workers(&self) -> std::sync::MutexGuard<'_, HashMap<String, Handle>> {
        self.workers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs until the daemon's shutdown token is cancelled: applies snapshots from the sources and ticks. Then the
    /// workers are stopped and the detached tasks end on the token; containers keep running for the next daemon to
    /// adopt.
    pub async fn run(self: Arc<Self>, mut rx: mpsc::Receiver<SourceSnapshot>) {
        let shutdown = self.shutdown.clone();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut open = true;
        let mut cleaned = false;
        loop {
            tokio::select! {
                snap = rx.recv(), if open => {
                    match snap {
                        Some(s) => {
                            let source = s.source;
                            self.apply(s);
                            self.awaited().remove(source);
                        }
                        // No source (no staticPodPath), or every source ended: the workers go on, and no first
                        // snapshot is awaited any more.
                        None => {
                            open = false;
                            self.awaited().clear();
                        }
                    }
                    // Once every expected source has spoken, and only then: a pod adopted at start belongs to
                    // some source, and one source's first snapshot says nothing of another's pods.
                    if !cleaned && self.awaited().is_empty() {
                        cleaned = true;
                        self.clean_orphans();
                    }
                }
                _ = tick.tick() => self.tick(),
                () = shutdown.cancelled() => break,
            }
        }
        for (_, h) in self.workers().drain() {
            h.task.abort();
        }
    }

    fn awaited(&self) -> std::sync::MutexGuard<'_, BTreeSet<&'static str>> {
        self.awaited.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Says that `source` will send snapshots: [`PodManager::synced`] waits for its first one. Call it before
    /// [`PodManager::run`].
    pub fn expect_source(&self, source: &'static str) {
        self.awaited().insert(source);
    }

    /// `Ok` once every expected source's first snapshot has been applied (each of its pods has a worker, and
    /// adopted pods no source has are being terminated): the first full sync. Else which sources are awaited.
    pub fn synced(&self) -> Result<(), String> {
        let awaited = self.awaited();
        if awaited.is_empty() {
            return Ok(());
        }
        let names: Vec<&str> = awaited.iter().copied().collect();
        Err(format!("waiting for the first pods from source {}", names.join(", ")))
    }

    fn tick(&self) {
        *self.last_tick.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        self.reap(&mut self.workers());
        self.name_locks.lock().unwrap_or_else(PoisonError::into_inner).retain(|_, s| Arc::strong_count(s) > 1);
        let gone = self.ctx.dead.collect(Instant::now());
        if !gone.is_empty() {
            let (runtime, stop) = (self.ctx.runtime.clone(), self.shutdown.clone());
            self.tasks
                .spawn(async move { stop.run_until_cancelled(crate::worker::remove_dead(&*runtime, gone)).await });
        }
        let (pods, containers) = self.ctx.store.counts();
        self.ctx.metrics.running_pods.set(pods);
        for (state, n) in containers {
            self.ctx.metrics.running_containers.with_label_values(&[state]).set(n);
        }
    }

    /// Applies a source's snapshot: new UIDs get a worker, known ones the latest spec, and UIDs the source no
    /// longer has are terminated.
    fn apply(&self, snap: SourceSnapshot) {
        let refused = self.ctx.store.set_invalid(snap.source, snap.invalid);
        self.ctx.metrics.invalid_manifests.set(i64::try_from(refused).unwrap_or(i64::MAX));
        let wanted: BTreeSet<String> = snap.pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
        let mut workers = self.workers();
        self.reap(&mut workers);
        for (uid, h) in workers.iter_mut().filter(|(uid, h)| h.source == snap.source && !wanted.contains(*uid)) {
            // A pod told already is not told again: a source sends a snapshot on every change, so a hundred
            // manifests deleted one by one would otherwise send each terminating worker up to a hundred requests.
            // One added again meanwhile is told once more, so that a shorter grace period in the spec it came back
            // with cuts the termination short (a longer one never lengthens it).
            h.wanted_again = false;
            if h.unlisted {
                continue;
            }
            h.unlisted = true;
            if h.deleted.is_none() {
                tracing::info!(pod_uid = %uid, pod = %h.name, "pod removed from its source; terminating it");
            }
            let grace = pod::deletion_grace_period(&h.spec.borrow());
            h.delete(uid, grace);
        }
        for p in snap.pods {
            let Some(uid) = p.metadata.uid.clone() else { continue };
            // Deletion is an input like any other: a pod still listed, with a deletion time and grace (the
            // apiserver's graceful deletion), terminates as one its source dropped, and a later, shorter grace
            // cuts the termination short.
            let deleting = pod::is_deleting(&p).then(|| pod::deletion_grace_period(&p));
            let h = match workers.entry(uid.clone()) {
                Entry::Occupied(e) => {
                    let h = e.into_mut();
                    h.unlisted = false;
                    if deleting.is_some() {
                        // Deleted after it was added again: it does not start anew once it has ended.
                        h.wanted_again = false;
                    } else if h.deleted.is_some() && !h.wanted_again {
                        h.wanted_again = true;
                        tracing::info!(pod_uid = %uid, pod = %h.name, "pod added again while it terminates; it starts anew after");
                    }
                    // The same `Arc` is the same pod: only a pod its source rebuilt is compared.
                    h.spec.send_if_modified(|current| {
                        let changed = !Arc::ptr_eq(current, &p) && **current != *p;
                        if changed {
                            *current = p.clone();
                        }
                        changed
                    });
                    h
                }
                // A pod the apiserver lists as over that this node has no worker for (one a node shutdown ended
                // before a reboot, one another node ran): never run again, as the kubelet does.
                Entry::Vacant(_) if pod::is_terminal_phase(&p) => continue,
                Entry::Vacant(e) => e.insert(self.spawn_worker(p, snap.source, None)),
            };
            if let Some(grace) = deleting.filter(|g| h.deleted.is_none_or(|told| *g < told)) {
                tracing::info!(pod_uid = %uid, pod = %h.name, grace_seconds = grace.as_secs(), "pod deleted; terminating it");
                h.delete(&uid, grace);
            }
        }
    }

    /// Starts a worker for a pod; `incident` says why the pod needed a new one.
    fn spawn_worker(&self, pod: Arc<Pod>, source: &'static str, incident: Option<String>) -> Handle {
        let name = pod::full_name(&pod);
        let lock = self
            .name_locks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(name.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(1)))
            .clone();
        let (spec, spec_rx) = watch::channel(pod.clone());
        let (terminations, terminations_rx) = mpsc::unbounded_channel();
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let busy = Arc::new(Mutex::new(None));
        let stoppable = Stoppable::default();
        let worker = Worker::new(self.ctx.clone(), Pod::clone(&pod), events_tx, busy.clone(), stoppable.clone(), lock)
            .with_incident(incident);
        let task = self.tasks.spawn(worker.run(spec_rx, terminations_rx, events_rx));
        Handle {
            spec,
            terminations,
            task,
            busy,
            stoppable,
            name,
            source,
            deleted: None,
            wanted_again: false,
            unlisted: false,
            terminating: None,
            panics: 0,
        }
    }

    /// Forgets the workers that ended. One whose pod its source has again gets a new worker, which starts the pod
    /// anew. One that panicked is logged and replaced by a new worker, which takes the pod over as after a daemon
    /// restart and says so in the pod's status; after [`MAX_WORKER_PANICS`] the pod is left as it is, its status
    /// saying why.
    fn reap(&self, workers: &mut HashMap<String, Handle>) {
        let ended: Vec<String> = workers.iter().filter(|(_, h)| h.task.is_finished()).map(|(u, _)| u.clone()).collect();
        for uid in ended {
            let Some(mut h) = workers.remove(&uid) else { continue };
            let e = match (&mut h.task).now_or_never() {
                Some(Err(e)) if e.is_panic() => e,
                _ => {
                    if h.deleted.is_some() && h.wanted_again {
                        tracing::info!(pod_uid = %uid, pod = %h.name, "pod added again to its source; starting it");
                        let pod = h.spec.borrow().clone();
                        workers.insert(uid, self.spawn_worker(pod, h.source, None));
                    }
                    continue;
                }
            };
            let panic = panic_message(e.into_panic());
            let panics = h.panics.saturating_add(1);
            if panics > MAX_WORKER_PANICS {
                tracing::error!(pod_uid = %uid, pod = %h.name, %panic, panics, "pod worker panicked again; the pod is no longer synced");
                self.ctx.store.mark_unsynced(
                    &uid,
                    &format!("the pod worker panicked {panics} times, last: {panic}; the pod is no longer synced"),
                );
                continue;
            }
            tracing::error!(pod_uid = %uid, pod = %h.name, %panic, panics, "pod worker panicked; a new worker takes the pod over");
            let incident = format!("the pod worker panicked ({panic}); a new worker took the pod over");
            let pod = h.spec.borrow().clone();
            let mut replacement = self.spawn_worker(pod, h.source, Some(incident));
            replacement.panics = panics;
            replacement.wanted_again = h.wanted_again;
            replacement.unlisted = h.unlisted;
            if let Some(grace) = h.deleted {
                replacement.delete(&uid, grace);
            }
            if let Some((grace, reason)) = h.terminating.take() {
                let req =
                    TerminateRequest { grace, reason: reason.clone(), signalled: None, done: None, unlisted: false };
                let _ = replacement.terminations.send(req);
                replacement.terminating = Some((grace, reason));
            }
            workers.insert(uid, replacement);
        }
    }

    /// Terminates the pods found at start (cgroups from an earlier daemon) that no source has, once every
    /// expected source has sent its first snapshot, and removes the directories of pods that are gone. Only what
    /// nodewarden made is touched ([`state::is_ours`]): a pod cgroup or a pod directory without its mark is left
    /// alone, and stays counted against allocatable.
    fn clean_orphans(&self) {
        let wanted: BTreeSet<String> = self.workers().keys().cloned().collect();
        let root = self.ctx.settings.root_dir.clone();
        let (orphans, foreign): (Vec<String>, Vec<String>) = self
            .ctx
            .ledger
            .view()
            .placed()
            .into_iter()
            .filter(|u| !wanted.contains(u))
            .partition(|u| state::is_ours(&root, u));
        for uid in &foreign {
            tracing::warn!(pod_uid = %uid, "a pod cgroup nodewarden did not make (no state in rootDir); leaving it alone");
        }
        let runtime = self.ctx.runtime.clone();
        let keep: BTreeSet<String> = wanted.clone();
        let stop = self.shutdown.clone();
        self.tasks.spawn(async move { stop.run_until_cancelled(runtime.reconcile(&keep)).await });
        for uid in &orphans {
            tracing::info!(pod_uid = %uid, "pod cgroup from an earlier run has no manifest; terminating it");
            let terminate = terminate_orphan(self.ctx.ledger.clone(), uid.clone(), root.clone());
            // Cut short by a shutdown: the next daemon finds the orphan again.
            let stop = self.shutdown.clone();
            self.tasks.spawn(async move { stop.run_until_cancelled(terminate).await });
        }
        if let Ok(entries) = std::fs::read_dir(root.join("pods")) {
            for e in entries.flatten() {
                let uid = e.file_name().to_string_lossy().into_owned();
                if wanted.contains(&uid) || orphans.contains(&uid) || foreign.contains(&uid) {
                    continue;
                }
                if !state::is_ours(&root, &uid) {
                    tracing::info!(pod_uid = %uid, "leaving alone a pod directory nodewarden did not make");
                    continue;
                }
                if let Err(e) = volumes::remove_pod_dir(&root, &uid) {
                    tracing::warn!(pod_uid = %uid, error = %e, "cannot remove a stale pod directory");
                }
            }
        }
    }

    /// Terminates a pod with a grace period and marks it `Failed`, reason `Evicted`, with `message`: SIGTERM to
    /// its containers (after their preStop hooks), then `cgroup.kill` on the pod cgroup once the grace period is
    /// over. Returns at once, with a receiver that resolves once SIGTERM has been sent and one that resolves when the
    /// pod's processes are gone. A static pod stays evicted until its manifest changes.
    ///
    /// Where the worker's termination would begin with the stop signals of its running containers and nothing
    /// else (the pod runs, no preStop hook, a grace period to give) and the runtime can send them at once, they go
    /// out here, on the caller's thread, before the termination is queued for the worker: on a node short of memory
    /// the hop to the worker's task and its step took milliseconds, and so did waking the worker before the
    /// signals. The worker's stop then only waits and kills; the queued termination, which it reads before the
    /// container exit the signal caused, makes the pod end `Evicted`.
    pub fn evict(&self, uid: &str, grace: Duration, message: String) -> Result<Eviction, TerminateError> {
        self.evict_with(uid, grace, message, true)
    }

    /// [`PodManager::evict`] for a pod over its own ephemeral-storage limit: as the kubelet's, its status gets
    /// no `DisruptionTarget` condition.
    pub(crate) fn evict_for_limit(
        &self,
        uid: &str,
        grace: Duration,
        message: String,
    ) -> Result<Eviction, TerminateError> {
        self.evict_with(uid, grace, message, false)
    }

    fn evict_with(
        &self,
        uid: &str,
        grace: Duration,
        message: String,
        disruption: bool,
    ) -> Result<Eviction, TerminateError> {
        let started = Instant::now();
        let said = message.clone();
        let reason = Reason::Evicted { message, disruption };
        let (terminations, stoppable) = {
            let mut workers = self.workers();
            let handle = workers.get_mut(uid).ok_or_else(|| TerminateError::UnknownPod(uid.into()))?;
            if handle.terminations.is_closed() {
                return Err(TerminateError::WorkerGone(uid.into()));
            }
            // Recorded first: should the worker be gone by the time the request is sent (it panicked), the worker
            // that takes the pod over still terminates it, as evicted.
            handle.terminating = Some((grace, reason.clone()));
            (handle.terminations.clone(), handle.stoppable.clone())
        };
        // Held from before the signals go out until the termination is queued: the worker takes this lock before it
        // acts on a termination or on a container's exit (and clears the list before any step), so it reads the
        // termination before the exit the signal caused, and sees whether the signals went out.
        let ids = stoppable.lock().unwrap_or_else(PoisonError::into_inner);
        let (slot, signalled) = Signalled::new();
        let mut sent = 0;
        // The signals go out before the worker is woken: on a busy node, waking it cost the signals milliseconds.
        if let Some(signals) = self.ctx.runtime.stop_signals()
            && !grace.is_zero()
            && !ids.is_empty()
        {
            // Every container is tried; the worker signals those that failed, and tells the requester then.
            sent = ids.iter().filter(|id| signals.signal_stop_now(id)).count();
            if sent == ids.len() {
                slot.tell(Instant::now());
            }
        }
        let signalled_us = started.elapsed().as_micros();
        let eviction = Self::send_termination(&terminations, uid, grace, reason, (slot, signalled))?;
        let containers = ids.len();
        drop(ids);
        tracing::debug!(
            pod_uid = uid,
            containers,
            sent,
            signalled_us,
            took_us = started.elapsed().as_micros(),
            "eviction handed to the worker"
        );
        // The kubelet's event about the pod, once its signals are out.
        if let Some(pod) = self.ctx.store.get(uid) {
            let event =
                PodEvent { event_type: EventType::Warning, reason: "Evicted".into(), message: said, container: None };
            self.ctx.events.pod_event(&pod, event);
        }
        Ok(eviction)
    }

    /// Records an event about the node.
    pub(crate) fn record_node_event(&self, event: PodEvent) {
        self.ctx.events.node_event(event);
    }

    /// Terminates a pod because the node shuts down, within `grace` (the pod's own if shorter): it ends `Failed`
    /// with the kubelet's reason `Terminated`, and starts again when the node is back.
    pub fn shut_down(&self, uid: &str, grace: Duration) -> Result<Eviction, TerminateError> {
        let mut workers = self.workers();
        let handle = workers.get_mut(uid).ok_or_else(|| TerminateError::UnknownPod(uid.into()))?;
        handle.terminating = Some((grace, Reason::Shutdown));
        Self::send_termination(&handle.terminations, uid, grace, Reason::Shutdown, Signalled::new())
    }

    /// The pods that have a worker, for the node's shutdown.
    pub fn running_pods(&self) -> Vec<RunningPod> {
        let uids: Vec<String> = self.workers().keys().cloned().collect();
        uids.into_iter()
            .filter_map(|uid| {
                let p = self.store().get(&uid)?;
                Some(RunningPod {
                    name: pod::full_name(&p),
                    priority: nodewarden_resources::resolved_priority(&p),
                    grace: pod::grace_period(&p),
                    uid,
                })
            })
            .collect()
    }

    /// Sends a termination to a pod's worker (the caller has recorded it in the pod's handle first, for a worker
    /// that takes the pod over), with the slot that tells the requester of its stop signals and that requester's
    /// receiver.
    fn send_termination(
        terminations: &mpsc::UnboundedSender<TerminateRequest>,
        uid: &str,
        grace: Duration,
        reason: Reason,
        (slot, signalled): (Signalled, oneshot::Receiver<Instant>),
    ) -> Result<Eviction, TerminateError> {
        let (req, terminated) = TerminateRequest::requested(grace, reason, slot);
        terminations.send(req).map_err(|_| TerminateError::WorkerGone(uid.into()))?;
        Ok(Eviction { signalled, terminated })
    }

    /// Whether the runtime can run containers, and pods on the pod network.
    pub fn runtime_health(&self) -> RuntimeHealth {
        self.ctx.runtime.health()
    }

    /// The images the runtime holds, as it last listed them.
    pub fn runtime_images(&self) -> Vec<ImageSummary> {
        self.ctx.runtime.images()
    }

    /// The runtime's `<name>://<version>`, as it last said.
    pub fn runtime_version(&self) -> String {
        self.ctx.runtime.version()
    }

    /// `Ok` when the manager loop ticked recently: the loop itself makes progress, whatever a pod's runtime call
    /// is waiting for (what the systemd watchdog is fed on).
    pub fn loop_health(&self) -> Result<(), String> {
        let stale = TICK * 5;
        match *self.last_tick.lock().unwrap_or_else(PoisonError::into_inner) {
            None => Err("the pod sync loop has not run yet".into()),
            Some(t) if t.elapsed() > stale => {
                Err(format!("the pod sync loop last ran {:.1}s ago", t.elapsed().as_secs_f64()))
            }
            Some(_) => Ok(()),
        }
    }

    /// `Ok` when the manager loop ticked recently and no pod sync has been stuck in a runtime call.
    pub fn readiness(&self) -> Result<(), String> {
        self.loop_health()?;
        for h in self.workers().values() {
            if let Some(since) = *h.busy.lock().unwrap_or_else(PoisonError::into_inner)
                && since.elapsed() > STUCK_AFTER
            {
                return Err(format!(
                    "the sync of pod {} has been running for {:.0}s",
                    h.name,
                    since.elapsed().as_secs_f64()
                ));
            }
        }
        Ok(())
    }
}

/// A pod with a worker, as the node's shutdown orders them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningPod {
    /// The pod's UID.
    pub uid: String,
    /// `<namespace>/<name>`.
    pub name: String,
    /// Its priority, as the apiserver would resolve it.
    pub priority: i32,
    /// Its grace period (`terminationGracePeriodSeconds`, 30 s when unset).
    pub grace: Duration,
}

/// The text of a panic's payload.
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(payload) => {
            payload.downcast_ref::<&str>().map_or_else(|| "a panic without a message".into(), |s| (*s).to_owned())
        }
    }
}

/// How long an orphan gets after SIGTERM: the rest of the grace period of a deletion an earlier daemon had begun
/// (`deadline`, saved with the pod's state), else [`ORPHAN_GRACE`].
pub(crate) fn orphan_grace(deadline: Option<jiff::Timestamp>, now: jiff::Timestamp) -> Duration {
    match deadline {
        Some(d) => now.duration_until(d).try_into().unwrap_or(Duration::ZERO),
        None => ORPHAN_GRACE,
    }
}

/// SIGTERM to every process of a pod nobody has any more, `cgroup.kill` once its grace period is over (see
/// [`orphan_grace`]), then release.
async fn terminate_orphan(ledger: Ledger, uid: String, root: std::path::PathBuf) {
    let grace = orphan_grace(state::load(&root, &uid).deletion_deadline, jiff::Timestamp::now());
    tracing::info!(pod_uid = %uid, grace_seconds = grace.as_secs(), "terminating an orphaned pod");
    let owned = uid.clone();
    let signalled = ledger
        .try_call(move |m| {
            m.set_terminating(&owned);
            m.signal(&owned, Signal::TERM)
        })
        .await;
    if let Err(e) = signalled {
        tracing::warn!(pod_uid = %uid, error = %e, "cannot signal an orphaned pod's processes");
    }
    let deadline = Instant::now() + grace.min(pod::MAX_GRACE_PERIOD);
    // A pod whose processes cannot be listed is taken as still running: it gets its whole grace period.
    let running = || {
        let uid = uid.clone();
        ledger.call(move |m| m.procs(&uid).map_or(true, |p| !p.is_empty()))
    };
    while Instant::now() < deadline && running().await.unwrap_or(true) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Its directory (and the mark that it is nodewarden's) goes only with its cgroup.
    if kill_and_release(&ledger, &uid).await
        && let Err(e) = volumes::remove_pod_dir(&root, &uid)
    {
        tracing::warn!(pod_uid = %uid, error = %e, "cannot remove the pod's directory");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_orphan_gets_the_rest_of_a_saved_deletion_or_the_default() {
        let now = jiff::Timestamp::from_second(1_000_000).unwrap();
        let at = |s: i64| jiff::Timestamp::from_second(1_000_000 + s).unwrap();
        assert_eq!(orphan_grace(None, now), ORPHAN_GRACE);
        assert_eq!(orphan_grace(Some(at(90)), now), Duration::from_secs(90));
        assert_eq!(orphan_grace(Some(at(-5)), now), Duration::ZERO, "a deadline passed while the daemon was down");
    }
}
