//! Pod status as the kubelet reports it: the phase from the containers' states and the restart policy, the pod
//! conditions, and the container states with their reasons.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use nodewarden_runtime::ExitInfo;

/// A container's state, as the phase needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// Running.
    Running,
    /// Waiting to start; `restarted` when it ran before (the kubelet counts those as stopped).
    Waiting {
        /// It has a last termination state.
        restarted: bool,
    },
    /// Ended and not restarting; `ok` when it exited 0.
    Terminated {
        /// Exit code 0.
        ok: bool,
    },
}

/// The pod's restart policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RestartPolicy {
    /// `Always` (the default).
    #[default]
    Always,
    /// `OnFailure`.
    OnFailure,
    /// `Never`.
    Never,
}

impl RestartPolicy {
    /// Reads `spec.restartPolicy`.
    pub fn parse(s: Option<&str>) -> Self {
        match s {
            Some("OnFailure") => Self::OnFailure,
            Some("Never") => Self::Never,
            _ => Self::Always,
        }
    }

    /// Whether a container that exited with `exit_code` is started again.
    pub fn restarts(self, exit_code: i32) -> bool {
        match self {
            Self::Always => true,
            Self::OnFailure => exit_code != 0,
            Self::Never => false,
        }
    }
}

/// A pod's phase (`status.phase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PodPhase {
    /// Not all containers have started yet.
    Pending,
    /// Bound and at least one container runs or will be restarted.
    Running,
    /// Every container ended with exit code 0 and none is restarted.
    Succeeded,
    /// Every container ended and at least one failed, or the pod was refused or evicted.
    Failed,
}

impl PodPhase {
    /// The phase as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
        }
    }
}

/// How a pod ended: its phase, with the reason and message its status shows (`Evicted`, an admission refusal).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Terminal {
    /// `Succeeded` or `Failed`.
    pub phase: PodPhase,
    /// `status.reason`.
    pub reason: Option<String>,
    /// `status.message`.
    pub message: Option<String>,
    /// The kubelet itself terminated the pod (an eviction, the node's shutdown; not an admission refusal, though
    /// one under pressure says `Evicted` too): its status carries the [`DISRUPTION_TARGET`] condition.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub by_kubelet: bool,
}

impl Terminal {
    /// A pod that ended on its own in `phase`, with no reason or message.
    pub fn ended(phase: PodPhase) -> Self {
        Self { phase, reason: None, message: None, by_kubelet: false }
    }
}

/// The kubelet's `status.reason` of a pod its eviction manager evicted.
pub const EVICTED_REASON: &str = "Evicted";

/// The condition the kubelet adds to a pod it terminates, evicting it or shutting the node down, so that
/// controllers tell a disruption from a failure (a Job's `podFailurePolicy` matches on it).
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";

/// That condition's reason when the kubelet is the one terminating.
pub const TERMINATION_BY_KUBELET: &str = "TerminationByKubelet";

/// The kubelet's `status.reason` of a pod terminated because the node shuts down.
pub const SHUTDOWN_REASON: &str = "Terminated";

/// The kubelet's `status.message` of a pod terminated because the node shuts down.
pub const SHUTDOWN_MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";

impl Terminal {
    /// A pod that failed with this reason and message.
    pub fn failed(reason: Option<String>, message: Option<String>) -> Self {
        Self { phase: PodPhase::Failed, reason, message, by_kubelet: false }
    }

    /// A pod the eviction manager evicted, with its message.
    pub fn evicted(message: String) -> Self {
        Self { by_kubelet: true, ..Self::failed(Some(EVICTED_REASON.into()), Some(message)) }
    }

    /// A pod terminated because the node shuts down.
    pub fn shutdown() -> Self {
        Self { by_kubelet: true, ..Self::failed(Some(SHUTDOWN_REASON.into()), Some(SHUTDOWN_MESSAGE.into())) }
    }

    /// Whether the pod was evicted (its containers and sandbox went with its end), or refused at admission with
    /// the same reason (it never had any).
    pub fn is_evicted(&self) -> bool {
        self.reason.as_deref() == Some(EVICTED_REASON)
    }

    /// Whether the pod ended because the node shut down: it runs again when the node is back, so its end is not
    /// kept for the next daemon.
    pub fn is_shutdown(&self) -> bool {
        self.reason.as_deref() == Some(SHUTDOWN_REASON) && self.message.as_deref() == Some(SHUTDOWN_MESSAGE)
    }
}

/// The pod phase from its app containers, following the kubelet: `Pending` while initialising or while a
/// container has never run; `Running` while one runs or will be restarted; `Succeeded` or `Failed` once all have
/// ended for good.
pub fn pod_phase(policy: RestartPolicy, initializing: bool, containers: &[Observed]) -> PodPhase {
    use PodPhase::{Failed, Pending, Running, Succeeded};
    if initializing {
        return Pending;
    }
    let running = containers.iter().filter(|c| **c == Observed::Running).count();
    let waiting = containers.iter().filter(|c| **c == Observed::Waiting { restarted: false }).count();
    let stopped = containers.len() - running - waiting;
    let failed = containers.iter().filter(|c| **c == Observed::Terminated { ok: false }).count();
    let restarting = containers.contains(&Observed::Waiting { restarted: true });
    if running > 0 {
        return Running;
    }
    if waiting > 0 || containers.is_empty() {
        return Pending;
    }
    debug_assert_eq!(stopped, containers.len());
    match policy {
        RestartPolicy::Always => Running,
        _ if restarting => Running,
        RestartPolicy::OnFailure if failed > 0 => Running,
        _ if failed == 0 => Succeeded,
        _ => Failed,
    }
}

/// A pod condition.
pub fn condition(kind: &str, ok: bool, since: Timestamp) -> PodCondition {
    PodCondition {
        type_: kind.to_owned(),
        status: if ok { "True" } else { "False" }.to_owned(),
        last_transition_time: Some(Time(since)),
        ..PodCondition::default()
    }
}

/// A terminated container state.
pub fn terminated(info: &ExitInfo, container_id: &str) -> ContainerStateTerminated {
    ContainerStateTerminated {
        container_id: Some(container_id.to_owned()),
        exit_code: info.exit_code,
        signal: info.signal,
        reason: Some(info.reason.clone()),
        message: info.message.clone(),
        started_at: Some(Time(info.started_at)),
        finished_at: Some(Time(info.finished_at)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Observed::*;
    use RestartPolicy::*;

    #[test]
    fn phases_follow_the_kubelet() {
        let cases: &[(RestartPolicy, bool, &[Observed], &str)] = &[
            (Always, true, &[Waiting { restarted: false }], "Pending"),
            (Always, false, &[Waiting { restarted: false }], "Pending"),
            (Always, false, &[Running, Waiting { restarted: false }], "Running"),
            (Always, false, &[Waiting { restarted: true }], "Running"),
            (Always, false, &[Terminated { ok: true }], "Running"),
            (OnFailure, false, &[Terminated { ok: true }], "Succeeded"),
            (OnFailure, false, &[Waiting { restarted: true }], "Running"),
            (Never, false, &[Terminated { ok: true }, Terminated { ok: true }], "Succeeded"),
            (Never, false, &[Terminated { ok: true }, Terminated { ok: false }], "Failed"),
            (Never, false, &[Running, Terminated { ok: false }], "Running"),
        ];
        for (policy, init, cs, want) in cases {
            assert_eq!(pod_phase(*policy, *init, cs).as_str(), *want, "{policy:?} {init} {cs:?}");
        }
    }

    #[test]
    fn restart_policies() {
        assert!(Always.restarts(0) && Always.restarts(1));
        assert!(!OnFailure.restarts(0) && OnFailure.restarts(137));
        assert!(!Never.restarts(1));
        assert_eq!(RestartPolicy::parse(None), Always);
        assert_eq!(RestartPolicy::parse(Some("Never")), Never);
    }
}
