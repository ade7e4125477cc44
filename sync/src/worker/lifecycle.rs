//! What a pod worker knows about its pod: the pod's state, each container's state, and the inputs and actions
//! of the state machine that [`super::step`] moves on. Nothing here does I/O or reads a clock.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::probe::{ProbeConfig, ProbeKind, ProbeState};
use crate::status::{RestartPolicy, Terminal};
use nodewarden_runtime::{ContainerId, ExitInfo};

/// The longest grace period a pod gets: a larger `terminationGracePeriodSeconds` is cut to this, so that a deadline
/// never overflows.
pub(crate) const MAX_GRACE: Duration = nodewarden_resources::pod::MAX_GRACE_PERIOD;

/// How long the pod's processes get to disappear after `cgroup.kill` before the clean-up goes ahead.
pub(crate) const KILL_WAIT: Duration = Duration::from_secs(5);

pub(crate) use nodewarden_resources::pod::grace_period;

/// `now + wait`, saturating at `now + MAX_GRACE`.
pub(crate) fn after(now: Instant, wait: Duration) -> Instant {
    now.checked_add(wait.min(MAX_GRACE)).unwrap_or(now)
}

/// Why a pod is terminated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reason {
    /// Its source no longer has it: remove it entirely.
    Deleted,
    /// The eviction manager evicted it: it stays, `Failed` with reason `Evicted` and this message; with the
    /// `DisruptionTarget` condition unless the pod broke its own ephemeral-storage limit.
    Evicted { message: String, disruption: bool },
    /// The node shuts down: `Failed` with the kubelet's reason `Terminated` and its message.
    Shutdown,
    /// It ended on its own (its app containers are done, or an init container failed under `Never`).
    Completed(Terminal),
}

impl Reason {
    /// How the pod ends, unless it is deleted.
    pub(crate) fn terminal(&self) -> Option<Terminal> {
        match self {
            Self::Deleted => None,
            Self::Evicted { message, disruption } => {
                Some(Terminal { by_kubelet: *disruption, ..Terminal::evicted(message.clone()) })
            }
            Self::Shutdown => Some(Terminal::shutdown()),
            Self::Completed(t) => Some(t.clone()),
        }
    }
}

/// What the pod is doing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum PodState {
    /// Waits until no other pod of its full name runs: an edited manifest's pod starts once the old one is gone.
    #[default]
    AwaitingName,
    /// Being admitted and placed in its cgroup.
    Admitting,
    /// Placed; its volumes and sandbox are being made. `then` is where it goes once they are.
    Preparing { step: PrepareStep, then: Resume },
    /// Init containers run in order, each to completion (sidecars only need to have started).
    Initializing,
    /// App containers run and are restarted under the restart policy.
    Running,
    /// Being stopped, by `deadline` at the latest (a new request can only bring it forward).
    Terminating { reason: Reason, deadline: Instant, stage: Stage },
    /// Over, and its resources released; its status stays.
    Finished(Terminal),
    /// Deleted, its containers gone and its resources released, its final status handed to the status feed: it
    /// waits until its source no longer lists it (the apiserver lists a deleted pod until its final status is
    /// reported and the pod is deleted for good).
    Finalizing,
    /// Deleted, cleaned up and no longer listed: the worker ends.
    Removed,
}

impl PodState {
    /// Whether the pod is being stopped or is over: nothing of it starts again.
    pub(crate) fn is_over(&self) -> bool {
        matches!(self, Self::Terminating { .. } | Self::Finished(_) | Self::Finalizing | Self::Removed)
    }
}

/// What is being prepared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PrepareStep {
    /// The pod's volumes.
    Volumes,
    /// The runtime's sandbox.
    Sandbox,
}

/// Where a prepared pod goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resume {
    /// Its init containers have not all run yet.
    Initializing,
    /// Initialisation was over (the sandbox was lost and made again).
    Running,
}

/// How far a termination has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// preStop hooks and SIGTERM; waiting for the containers to exit until the deadline.
    Stopping,
    /// `cgroup.kill` sent at the deadline; waiting until `until` for the exits.
    Killing { until: Instant },
    /// Releasing the cgroups and removing the sandbox and volumes.
    CleaningUp,
}

/// A retry of a pod-level step (placement, volumes, sandbox) after a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Retry {
    /// When; `None` once the retry is under way.
    pub at: Option<Instant>,
    /// The wait that led to `at`; the next failure waits twice as long, up to 30 s.
    pub wait: Duration,
    /// Why, shown as the pod's status message.
    pub message: String,
}

/// Which list a container is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// An init container: runs to completion before the next one.
    Init,
    /// An init container with `restartPolicy: Always`: started in order, then kept running.
    Sidecar,
    /// An app container.
    App,
}

/// A container's last exit, for `lastState` and the restart decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LastExit {
    /// How it ended.
    pub info: ExitInfo,
    /// The runtime's ID of that run; `None` when it ran under an earlier daemon.
    pub container_id: Option<ContainerId>,
}

/// How far a running container has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Readiness {
    /// Its startup probe has not succeeded yet.
    AwaitingStartup,
    /// Started, not ready (its readiness probe has not succeeded, or failed).
    NotReady,
    /// Started and ready.
    Ready,
    /// A liveness or startup probe failed: it is being stopped, to be restarted.
    Stopping,
}

/// A running container, as the runtime reported it when it started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunningContainer {
    /// The runtime's ID.
    pub id: ContainerId,
    /// The main process (0 when the runtime does not say).
    pub pid: u32,
    /// The main process's start time in clock ticks after boot, where known.
    pub pid_start: Option<u64>,
    /// When it started.
    pub started_at: Timestamp,
    /// When it started, on the worker's clock (the back-off counts from it).
    pub since: Instant,
    /// Its probes, with their thresholds and their consecutive results.
    pub probes: BTreeMap<ProbeKind, (ProbeConfig, ProbeState)>,
    /// How far it has come.
    pub readiness: Readiness,
}

/// What the runtime said about a container it started (or adopted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StartedContainer {
    /// The runtime's ID.
    pub id: ContainerId,
    /// The main process.
    pub pid: u32,
    /// The main process's start time in clock ticks after boot, where known.
    pub pid_start: Option<u64>,
    /// When it started.
    pub started_at: Timestamp,
    /// Its probes.
    pub probes: Vec<(ProbeKind, ProbeConfig)>,
}

impl StartedContainer {
    /// The container as running since `now`.
    pub(crate) fn running(self, now: Instant) -> RunningContainer {
        let has = |k| self.probes.iter().any(|(kind, _)| *kind == k);
        let readiness = if has(ProbeKind::Startup) {
            Readiness::AwaitingStartup
        } else if has(ProbeKind::Readiness) {
            Readiness::NotReady
        } else {
            Readiness::Ready
        };
        RunningContainer {
            probes: self.probes.into_iter().map(|(k, cfg)| (k, (cfg, ProbeState::default()))).collect(),
            id: self.id,
            pid: self.pid,
            pid_start: self.pid_start,
            started_at: self.started_at,
            since: now,
            readiness,
        }
    }
}

/// Why a container could not be started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StartFailure {
    /// The kubelet's waiting reason (`CreateContainerConfigError`, `ErrImagePull`, `RunContainerError`).
    pub reason: String,
    /// Why.
    pub message: String,
    /// The runtime lost the pod's sandbox: a new one is needed first.
    pub sandbox_lost: bool,
}

/// One container's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ContainerState {
    /// Not started yet (or no longer starting: the pod is terminating).
    Pending,
    /// The runtime is starting it (pulling its image, creating it).
    Starting,
    /// Running.
    Running(RunningContainer),
    /// Could not be started: waiting with the kubelet's reason, tried again at `retry_at`.
    StartFailed { reason: String, message: String, retry_at: Instant },
    /// Exited; started again at `until` (the crash-loop back-off).
    BackOff { until: Instant },
    /// Exited and not started again (an init container that completed, or the restart policy says so).
    Exited,
}

/// One container of the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ContainerSlot {
    /// Its name.
    pub name: String,
    /// Its list.
    pub role: Role,
    /// Restarts so far.
    pub restarts: u32,
    /// Its crash-loop back-off.
    pub backoff: Backoff,
    /// The back-off of its image's pulls (the kubelet keeps it apart from the crash loop's).
    pub pull_backoff: Backoff,
    /// Its last exit.
    pub last_exit: Option<LastExit>,
    /// What it is doing.
    pub state: ContainerState,
    /// Stopped because its definition changed: started again at once when it exits, whatever the restart policy.
    pub redefined: bool,
}

impl ContainerSlot {
    /// A container that has not run.
    pub(crate) fn new(name: impl Into<String>, role: Role) -> Self {
        Self {
            name: name.into(),
            role,
            restarts: 0,
            backoff: Backoff::default(),
            pull_backoff: Backoff::default(),
            last_exit: None,
            state: ContainerState::Pending,
            redefined: false,
        }
    }

    /// The running container, if it runs.
    pub(crate) fn running(&self) -> Option<&RunningContainer> {
        match &self.state {
            ContainerState::Running(r) => Some(r),
            _ => None,
        }
    }

    /// Whether its last run ended with exit code 0.
    pub(crate) fn exited_ok(&self) -> bool {
        self.last_exit.as_ref().is_some_and(|l| l.info.exit_code == 0)
    }

    /// Whether it may be started now.
    pub(crate) fn startable(&self, now: Instant) -> bool {
        match &self.state {
            ContainerState::Pending => true,
            ContainerState::BackOff { until } => *until <= now,
            ContainerState::StartFailed { retry_at, .. } => *retry_at <= now,
            ContainerState::Starting | ContainerState::Running(_) | ContainerState::Exited => false,
        }
    }
}

/// The pod's containers from its spec: init containers (and sidecars) first, then app containers.
pub(crate) fn containers_of(pod: &Pod) -> Vec<ContainerSlot> {
    let Some(spec) = pod.spec.as_ref() else { return Vec::new() };
    let init = spec.init_containers.iter().flatten().map(|c| {
        let sidecar = c.restart_policy.as_deref() == Some("Always");
        ContainerSlot::new(c.name.clone(), if sidecar { Role::Sidecar } else { Role::Init })
    });
    init.chain(spec.containers.iter().map(|c| ContainerSlot::new(c.name.clone(), Role::App))).collect()
}

/// The pod's lifecycle: its state and its containers'.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Lifecycle {
    /// What the pod is doing.
    pub state: PodState,
    /// Its containers, in the order of [`containers_of`].
    pub containers: Vec<ContainerSlot>,
    /// Its restart policy.
    pub policy: RestartPolicy,
    /// Its own grace period.
    pub grace: Duration,
    /// When it was first placed.
    pub start_time: Option<Timestamp>,
    /// A failed pod-level step waiting to be retried.
    pub retry: Option<Retry>,
    /// Its source no longer lists it: once deleted and cleaned up, it is forgotten.
    pub unlisted: bool,
}

impl Lifecycle {
    /// A pod that has not started.
    pub(crate) fn new(pod: &Pod) -> Self {
        Self {
            state: PodState::AwaitingName,
            containers: containers_of(pod),
            policy: RestartPolicy::parse(pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref())),
            grace: grace_period(pod),
            start_time: None,
            retry: None,
            unlisted: false,
        }
    }

    /// The container running as `id`.
    pub(crate) fn index_of(&self, id: &ContainerId) -> Option<usize> {
        self.containers.iter().position(|c| c.running().is_some_and(|r| &r.id == id))
    }

    /// Whether initialisation is over (the `Initialized` condition).
    pub(crate) fn initialized(&self) -> bool {
        match &self.state {
            PodState::Running | PodState::Preparing { then: Resume::Running, .. } => true,
            PodState::AwaitingName | PodState::Admitting | PodState::Initializing | PodState::Preparing { .. } => false,
            PodState::Terminating { .. } | PodState::Finished(_) | PodState::Finalizing | PodState::Removed => {
                self.containers.iter().filter(|c| c.role == Role::Init).all(ContainerSlot::exited_ok)
            }
        }
    }

    /// How the pod ends, once that is decided (it may still be terminating).
    pub(crate) fn terminal(&self) -> Option<Terminal> {
        match &self.state {
            PodState::Finished(t) => Some(t.clone()),
            PodState::Terminating { reason, .. } => reason.terminal(),
            _ => None,
        }
    }

    /// When the worker must look again even if nothing happens: a back-off or retry that expires, a deadline.
    pub(crate) fn next_wakeup(&self) -> Option<Instant> {
        match &self.state {
            PodState::Terminating { deadline, stage, .. } => match stage {
                Stage::Stopping => Some(*deadline),
                Stage::Killing { until } => Some(*until),
                Stage::CleaningUp => None,
            },
            PodState::Admitting | PodState::Preparing { .. } => self.retry.as_ref().and_then(|r| r.at),
            PodState::Initializing | PodState::Running => self
                .containers
                .iter()
                .filter_map(|c| match &c.state {
                    ContainerState::BackOff { until } => Some(*until),
                    ContainerState::StartFailed { retry_at, .. } => Some(*retry_at),
                    _ => None,
                })
                .min(),
            PodState::AwaitingName | PodState::Finished(_) | PodState::Finalizing | PodState::Removed => None,
        }
    }
}

/// Something that happened, for [`super::step`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Input {
    /// No other pod of the same name runs any more (and nothing was adopted from an earlier daemon).
    NameFree,
    /// What an earlier daemon left of the pod: it carries on from there (nothing it ran is started again).
    Restore(Box<Found>),
    /// The source has a newer spec, with this grace period; the containers (by index) whose definition changed
    /// otherwise than in their resources (a new image): restarted with it, whatever the restart policy.
    SpecUpdate { grace: Duration, redefined: Vec<usize> },
    /// Terminate the pod, with this grace period (cut to [`MAX_GRACE`]; a later one only ever shortens it).
    Terminate { grace: Duration, reason: Reason },
    /// The pod's source no longer lists it (it came with or after its deletion).
    Unlisted,
    /// The result of [`Action::Place`]: when the pod was placed, or why not.
    Placed(Result<Timestamp, PlaceFailure>),
    /// The result of [`Action::PrepareVolumes`].
    VolumesPrepared(Result<(), crate::volumes::VolumeError>),
    /// The result of [`Action::RunSandbox`].
    SandboxReady(Result<(), String>),
    /// The result of [`Action::StartContainer`].
    ContainerStarted { index: usize, attempt: u32, result: Result<StartedContainer, StartFailure> },
    /// The container running as `id` exited.
    ContainerExited { id: ContainerId, info: ExitInfo },
    /// One result of a probe of the container running as `id`, with its output or why it failed.
    ProbeResult { id: ContainerId, kind: ProbeKind, ok: bool, output: String },
    /// A back-off, retry or deadline may have expired.
    Timer,
    /// The result of [`Action::CleanUp`].
    CleanedUp,
}

/// What the executor found of a pod an earlier daemon ran ([`Input::Restore`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    /// The state the earlier daemon saved.
    pub saved: crate::state::SavedPod,
    /// The runtime still has the pod's sandbox (always, where the runtime has none); without it the containers
    /// are gone with it.
    pub sandbox: bool,
    /// The containers adopted running, by index.
    pub running: BTreeMap<usize, StartedContainer>,
    /// The wall-clock time then: when a container that ended unseen is taken to have ended.
    pub at: Timestamp,
}

/// Why a pod was not placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PlaceFailure {
    /// Admission refused it, with the kubelet's reason (`OutOfmemory`): the pod fails.
    Refused { reason: String, message: String },
    /// Placement failed: retried.
    Failed(String),
}

/// What the executor is to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Admit and place the pod.
    Place,
    /// Make its volumes.
    PrepareVolumes,
    /// Create its sandbox (nothing to do where the runtime has none).
    RunSandbox,
    /// Apply the newer spec's resources to the placement.
    UpdateResources,
    /// Start container `index` for its run number `attempt`.
    StartContainer { index: usize, attempt: u32 },
    /// Stop a container that failed its liveness or startup probe (it is restarted once it exits).
    StopContainer { id: ContainerId, grace: Duration, why: String },
    /// Container `index` exited as `id`, a run started at `created`: it is kept as a dead container, or removed,
    /// under the container garbage collection policy (whose minimum age counts from `created`, as the kubelet's
    /// from the container's creation).
    RetireContainer { index: usize, id: ContainerId, created: Timestamp },
    /// Drop the runtime calls in flight (image pulls, starts, sandbox creation).
    Abandon,
    /// Tell the resource manager the pod is terminating.
    MarkTerminating,
    /// Run the preStop hooks and stop these running containers (by ID) within the deadline.
    StopAll { ids: Vec<ContainerId>, deadline: Instant },
    /// `cgroup.kill` the pod and kill these containers (by ID).
    KillAll { ids: Vec<ContainerId> },
    /// Release the cgroups and remove the volumes (and, when deleted, the logs). The sandbox and the dead
    /// containers are removed, unless `keep_containers`: the pod ended on its own and stays listed, so its
    /// sandbox is only stopped and its exited containers are kept (for `crictl ps -a`, `kubectl logs`), as the
    /// kubelet keeps them until the pod is deleted or disk pressure reclaims them. An evicted pod's go at once.
    CleanUp { deleted: bool, keep_containers: bool },
    /// Save the state to disk.
    Save,
    /// Let the next pod of the same name start.
    ReleaseName,
    /// Hand the pod's final status to the status feed: its containers are gone and its resources released, so
    /// once the status is reported the pod may be deleted for good.
    Finalize,
    /// Forget the pod: it is gone from its source.
    Forget,
    /// Every app container runs (the pod-start metric counts the first time).
    ReportStarted,
    /// Record an event about the pod.
    Record(crate::events::Happened),
}

impl Action {
    /// The clean-up that ends a termination for `reason`.
    pub(crate) fn clean_up(reason: &Reason) -> Self {
        Action::CleanUp { deleted: *reason == Reason::Deleted, keep_containers: matches!(reason, Reason::Completed(_)) }
    }
}
