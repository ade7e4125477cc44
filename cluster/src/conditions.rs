//! The node conditions the kubelet reports, with its reasons and messages, and the events a transition posts.
//!
//! `lastHeartbeatTime` is now on every build; `lastTransitionTime` moves only when a condition's status
//! changes. A condition not reported before counts as `Unknown`, so the first build is a transition.

use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::NodeFacts;

/// One condition's wording for each status: (type, reason when true, message when true, reason when false,
/// message when false, event when true, event when false).
struct Wording {
    kind: &'static str,
    true_reason: &'static str,
    true_message: &'static str,
    false_reason: &'static str,
    false_message: &'static str,
    true_event: &'static str,
    false_event: &'static str,
}

const PRESSURE: [Wording; 3] = [
    Wording {
        kind: "MemoryPressure",
        true_reason: "KubeletHasInsufficientMemory",
        true_message: "kubelet has insufficient memory available",
        false_reason: "KubeletHasSufficientMemory",
        false_message: "kubelet has sufficient memory available",
        true_event: "NodeHasInsufficientMemory",
        false_event: "NodeHasSufficientMemory",
    },
    Wording {
        kind: "DiskPressure",
        true_reason: "KubeletHasDiskPressure",
        true_message: "kubelet has disk pressure",
        false_reason: "KubeletHasNoDiskPressure",
        false_message: "kubelet has no disk pressure",
        true_event: "NodeHasDiskPressure",
        false_event: "NodeHasNoDiskPressure",
    },
    Wording {
        kind: "PIDPressure",
        true_reason: "KubeletHasInsufficientPID",
        true_message: "kubelet has insufficient PID available",
        false_reason: "KubeletHasSufficientPID",
        false_message: "kubelet has sufficient PID available",
        true_event: "NodeHasInsufficientPID",
        false_event: "NodeHasSufficientPID",
    },
];

/// The `Ready` condition's reasons.
pub const READY: &str = "KubeletReady";
/// The `Ready` condition's reason when not ready.
pub const NOT_READY: &str = "KubeletNotReady";

/// An event a condition transition posts on the Node (type Normal): its reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// `NodeHasInsufficientMemory`, `NodeReady`, ...
    pub event: &'static str,
}

/// The aggregate of the errors that keep a node from Ready, as the kubelet prints it: one bare, several as
/// `[a, b]`.
pub fn aggregate(errors: &[String]) -> String {
    match errors {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

fn condition(
    kind: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: Time,
    previous: &[NodeCondition],
) -> NodeCondition {
    let status = if status { "True" } else { "False" };
    let transition = previous
        .iter()
        .find(|c| c.type_ == kind && c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    NodeCondition {
        type_: kind.to_owned(),
        status: status.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        last_heartbeat_time: Some(now),
        last_transition_time: Some(transition),
    }
}

/// The conditions for `facts`, in the kubelet's order (Ready last), keeping the transition times of
/// `previous` where the status did not change; and the events of the transitions from `previous`.
pub fn build(
    facts: &NodeFacts,
    previous: &[NodeCondition],
    now: jiff::Timestamp,
) -> (Vec<NodeCondition>, Vec<Transition>) {
    let now = Time(now);
    let mut out = Vec::with_capacity(4);
    let mut events = Vec::new();
    let changed = |kind: &str, status: bool| {
        let s = if status { "True" } else { "False" };
        previous.iter().find(|c| c.type_ == kind).is_none_or(|c| c.status != s)
    };
    let flags = [facts.memory_pressure, facts.disk_pressure, facts.pid_pressure];
    for (w, on) in PRESSURE.iter().zip(flags) {
        let (reason, message) = if on { (w.true_reason, w.true_message) } else { (w.false_reason, w.false_message) };
        if changed(w.kind, on) {
            events.push(Transition { event: if on { w.true_event } else { w.false_event } });
        }
        out.push(condition(w.kind, on, reason, message, now.clone(), previous));
    }
    let ready = facts.not_ready.is_empty();
    let message = if ready { "kubelet is posting ready status".to_owned() } else { aggregate(&facts.not_ready) };
    if changed("Ready", ready) {
        events.push(Transition { event: if ready { "NodeReady" } else { "NodeNotReady" } });
    }
    out.push(condition("Ready", ready, if ready { READY } else { NOT_READY }, &message, now, previous));
    (out, events)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> NodeFacts {
        NodeFacts { not_ready: Vec::new(), ..NodeFacts::default() }
    }

    #[test]
    fn conditions_keep_transition_times_and_report_transitions() {
        let t0: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let t1: jiff::Timestamp = "2026-01-01T00:00:10Z".parse().unwrap();
        let (first, events) = build(&facts(), &[], t0);
        let kinds: Vec<&str> = first.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(kinds, ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]);
        let names: Vec<&str> = events.iter().map(|e| e.event).collect();
        assert_eq!(names, ["NodeHasSufficientMemory", "NodeHasNoDiskPressure", "NodeHasSufficientPID", "NodeReady"]);
        assert_eq!(first[3].reason.as_deref(), Some("KubeletReady"));
        assert_eq!(first[3].message.as_deref(), Some("kubelet is posting ready status"));

        let mut f = facts();
        f.memory_pressure = true;
        f.not_ready = vec!["container runtime is down".into(), "PLEG is not healthy".into()];
        let (second, events) = build(&f, &first, t1);
        let names: Vec<&str> = events.iter().map(|e| e.event).collect();
        assert_eq!(names, ["NodeHasInsufficientMemory", "NodeNotReady"]);
        assert_eq!(second[0].reason.as_deref(), Some("KubeletHasInsufficientMemory"));
        assert_eq!(second[0].last_transition_time, Some(Time(t1)));
        // DiskPressure did not change: its transition time stays, its heartbeat moves.
        assert_eq!(second[1].last_transition_time, Some(Time(t0)));
        assert_eq!(second[1].last_heartbeat_time, Some(Time(t1)));
        assert_eq!(second[3].reason.as_deref(), Some("KubeletNotReady"));
        assert_eq!(second[3].message.as_deref(), Some("[container runtime is down, PLEG is not healthy]"));
        assert_eq!(aggregate(&["one".into()]), "one");
    }
}
