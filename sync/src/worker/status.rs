//! The pod's status as a function of its lifecycle: the phase, the conditions and each container's state with
//! the kubelet's reasons, published to the status store after every step.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    self as core, ContainerStateRunning, ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use nodewarden_resources::QosClass;
use tokio::time::Instant;

use super::Worker;
use super::lifecycle::{ContainerSlot, ContainerState, Lifecycle, PodState, Readiness, Reason, Role};
use crate::status::{DISRUPTION_TARGET, Observed, PodPhase, TERMINATION_BY_KUBELET, condition, pod_phase, terminated};
use nodewarden_runtime::Runtime;

/// When each condition last changed.
#[derive(Debug, Default)]
pub(super) struct ConditionTimes(BTreeMap<&'static str, (bool, Timestamp)>);

impl ConditionTimes {
    fn set(&mut self, kind: &'static str, ok: bool, now: Timestamp) -> core::PodCondition {
        let entry = self.0.entry(kind).or_insert((ok, now));
        if entry.0 != ok {
            *entry = (ok, now);
        }
        condition(kind, ok, entry.1)
    }
}

/// What the status needs besides the lifecycle.
pub(super) struct View<'a> {
    pub pod: &'a Pod,
    pub scheme: &'static str,
    pub qos: Option<&'static str>,
    /// The pod's IPs and the node's, the primary first.
    pub pod_ips: &'a [String],
    pub host_ips: &'a [String],
}

fn waiting(reason: &str, message: Option<String>) -> core::ContainerState {
    core::ContainerState {
        waiting: Some(ContainerStateWaiting { reason: Some(reason.to_owned()), message }),
        ..core::ContainerState::default()
    }
}

fn container_status(pod: &Lifecycle, c: &ContainerSlot, view: &View<'_>, now: Instant) -> ContainerStatus {
    let spec = view.pod.spec.as_ref();
    let image = spec
        .and_then(|s| s.init_containers.iter().flatten().chain(&s.containers).find(|x| x.name == c.name))
        .and_then(|x| x.image.clone())
        .unwrap_or_default();
    let id_of = |id: &str| format!("{}://{id}", view.scheme);
    let last_id =
        c.last_exit.as_ref().and_then(|l| l.container_id.as_ref()).map(|i| id_of(i.as_str())).unwrap_or_default();
    let last = c.last_exit.as_ref().map(|l| core::ContainerState {
        terminated: Some(terminated(&l.info, &last_id)),
        ..core::ContainerState::default()
    });
    let over = pod.state.is_over();
    let (state, last_state, id) = match &c.state {
        ContainerState::Running(run) => {
            let s = core::ContainerState {
                running: Some(ContainerStateRunning { started_at: Some(Time(run.started_at)) }),
                ..core::ContainerState::default()
            };
            (s, last, Some(id_of(run.id.as_str())))
        }
        ContainerState::StartFailed { reason, message, retry_at } if !over => {
            if reason == "ErrImagePull" && now < *retry_at {
                let message = format!("Back-off pulling image {image:?}: {message}");
                (waiting("ImagePullBackOff", Some(message)), last, None)
            } else {
                (waiting(reason, Some(message.clone())), last, None)
            }
        }
        _ if over || c.state == ContainerState::Exited => match last {
            Some(l) => (l, None, Some(last_id)),
            None => (waiting("ContainerCreating", None), None, None),
        },
        ContainerState::BackOff { until } if now < *until => {
            let wait = until.saturating_duration_since(now);
            let message = format!(
                "back-off {}s restarting failed container={} pod={}",
                wait.as_secs().max(1),
                c.name,
                nodewarden_resources::pod::kubelet_ref(view.pod),
            );
            (waiting("CrashLoopBackOff", Some(message)), last, None)
        }
        _ if c.role == Role::App && !pod.initialized() => (waiting("PodInitializing", None), last, None),
        _ => (waiting("ContainerCreating", pod.retry.as_ref().map(|r| r.message.clone())), last, None),
    };
    let run = c.running();
    ContainerStatus {
        name: c.name.clone(),
        image,
        image_id: String::new(),
        container_id: id,
        ready: run.is_some_and(|r| r.readiness == Readiness::Ready),
        started: Some(run.is_some_and(|r| r.readiness != Readiness::AwaitingStartup)),
        restart_count: i32::try_from(c.restarts).unwrap_or(i32::MAX),
        state: Some(state),
        last_state,
        ..ContainerStatus::default()
    }
}

fn observed(c: &ContainerSlot) -> Observed {
    match &c.state {
        ContainerState::Running(_) => Observed::Running,
        ContainerState::Exited => Observed::Terminated { ok: c.exited_ok() },
        _ => Observed::Waiting { restarted: c.last_exit.is_some() },
    }
}

/// Whether the pod is deleted (terminating for its deletion, or past it).
fn deleted(pod: &Lifecycle) -> bool {
    matches!(
        pod.state,
        PodState::Terminating { reason: Reason::Deleted, .. } | PodState::Finalizing | PodState::Removed
    )
}

/// The pod's status: a function of its lifecycle (and, for the conditions' transition times, of when they last
/// changed).
pub(super) fn pod_status(pod: &Lifecycle, view: &View<'_>, times: &mut ConditionTimes, now: Instant) -> PodStatus {
    let statuses = |init: bool| -> Vec<ContainerStatus> {
        let wanted = |c: &&ContainerSlot| (c.role != Role::App) == init;
        pod.containers.iter().filter(wanted).map(|c| container_status(pod, c, view, now)).collect()
    };
    let terminal = pod.terminal();
    // As the kubelet (since 1.27): the terminal phase only once no container runs any more; a pod being evicted or
    // shut down shows why, and stays Running until its containers have stopped.
    let stopped = !pod.containers.iter().any(|c| c.running().is_some());
    let phase = match &terminal {
        Some(t) if stopped => t.phase,
        _ => {
            let apps: Vec<Observed> = pod.containers.iter().filter(|c| c.role == Role::App).map(observed).collect();
            // As the kubelet (since 1.27): a deleted pod of the apiserver whose containers have all ended is over,
            // whatever its restart policy (a static pod is not: its mirror is not the pod).
            let ended = !apps.is_empty() && apps.iter().all(|a| matches!(a, Observed::Terminated { .. }));
            if ended && deleted(pod) && crate::from_apiserver(view.pod) {
                let ok = apps.iter().all(|a| *a == Observed::Terminated { ok: true });
                if ok { PodPhase::Succeeded } else { PodPhase::Failed }
            } else {
                pod_phase(pod.policy, !pod.initialized(), &apps)
            }
        }
    };
    let listed = |ips: &[String]| (!ips.is_empty()).then(|| ips.to_vec());
    let mut status = PodStatus {
        qos_class: view.qos.map(str::to_owned),
        start_time: pod.start_time.map(Time),
        phase: Some(phase.as_str().to_owned()),
        host_ip: view.host_ips.first().cloned(),
        host_ips: listed(view.host_ips).map(|l| l.into_iter().map(|ip| HostIP { ip }).collect()),
        pod_ip: view.pod_ips.first().cloned(),
        pod_ips: listed(view.pod_ips).map(|l| l.into_iter().map(|ip| PodIP { ip }).collect()),
        ..PodStatus::default()
    };
    let t = Timestamp::now();
    // From the moment the kubelet decides to terminate the pod, as the kubelet's status manager adds it.
    let disruption = terminal.as_ref().filter(|term| term.by_kubelet).map(|term| core::PodCondition {
        reason: Some(TERMINATION_BY_KUBELET.to_owned()),
        message: term.message.clone(),
        ..times.set(DISRUPTION_TARGET, true, t)
    });
    if let Some(term) = terminal {
        status.reason = term.reason;
        status.message = term.message;
    } else if let Some(r) = &pod.retry {
        status.message = Some(r.message.clone());
    }
    let unready: Vec<&str> = pod
        .containers
        .iter()
        .filter(|c| c.role != Role::Init)
        .filter(|c| !c.running().is_some_and(|r| r.readiness == Readiness::Ready))
        .map(|c| c.name.as_str())
        .collect();
    let containers_ready = unready.is_empty() && phase == PodPhase::Running;
    // Why not, as the kubelet says it: a pod that completed, or the containers not ready.
    let containers_why = match phase {
        _ if containers_ready => None,
        PodPhase::Succeeded => Some(("PodCompleted", None)),
        PodPhase::Failed => Some(("PodFailed", None)),
        _ if unready.is_empty() => None,
        _ => Some(("ContainersNotReady", Some(format!("containers with unready status: [{}]", unready.join(" "))))),
    };
    let gates = unready_gates(view.pod);
    let ready = containers_ready && gates.is_empty();
    let ready_why = match (&containers_why, gates.is_empty()) {
        (Some(why), _) => Some(why.clone()),
        (None, false) => Some(("ReadinessGatesNotReady", Some(gates.join(", ")))),
        (None, true) => None,
    };
    let explained = |mut c: core::PodCondition, why: Option<(&str, Option<String>)>| {
        if let Some((reason, message)) = why {
            c.reason = Some(reason.to_owned());
            c.message = message;
        }
        c
    };
    status.conditions = Some(
        [
            times.set("PodScheduled", true, t),
            times.set("Initialized", pod.initialized(), t),
            explained(times.set("ContainersReady", containers_ready, t), containers_why),
            explained(times.set("Ready", ready, t), ready_why),
        ]
        .into_iter()
        .chain(disruption)
        .collect(),
    );
    let init = statuses(true);
    if !init.is_empty() {
        status.init_container_statuses = Some(init);
    }
    status.container_statuses = Some(statuses(false));
    status
}

/// The pod's readiness gates that are not met, each said as the kubelet says it: the condition they name is
/// missing from the pod's status (as its source last gave it), or not `True`.
fn unready_gates(pod: &Pod) -> Vec<String> {
    let gates = pod.spec.as_ref().and_then(|s| s.readiness_gates.as_ref());
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    let mut out = Vec::new();
    for gate in gates.into_iter().flatten() {
        let kind = &gate.condition_type;
        match conditions.into_iter().flatten().find(|c| c.type_ == *kind) {
            None => out.push(format!("corresponding condition of pod readiness gate {kind:?} does not exist.")),
            Some(c) if c.status != "True" => {
                out.push(format!("the status of pod readiness gate {kind:?} is not \"True\", but {}", c.status));
            }
            Some(_) => {}
        }
    }
    out
}

impl<R: Runtime> Worker<R> {
    /// Publishes the pod with its current status.
    pub(super) fn publish(&mut self) {
        let pod_ips = self.pod_ips();
        let view = View {
            pod: &self.pod,
            scheme: self.shared.runtime.scheme(),
            qos: self.qos.map(QosClass::as_str),
            pod_ips: &pod_ips,
            host_ips: &self.shared.settings.host_ips,
        };
        let mut status = pod_status(&self.lifecycle, &view, &mut self.report.conditions, Instant::now());
        if let Some(c) = &self.report.incident {
            status.conditions.get_or_insert_with(Vec::new).push(c.clone());
        }
        if self.report.published.as_ref() == Some(&status) && self.shared.store.contains(&self.uid) {
            return;
        }
        self.report.published = Some(status.clone());
        let pod = Pod { metadata: self.pod.metadata.clone(), spec: self.pod.spec.clone(), status: Some(status) };
        self.shared.store.set(&self.uid, pod);
    }
}
