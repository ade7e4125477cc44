//! The CRI runtime's health as the kubelet keeps it (`pkg/kubelet/runtime.go`, `updateRuntimeUp`): `Status`
//! says whether the runtime and its network are ready, in its conditions' words; a runtime that does not answer
//! is down. The messages are the kubelet's, so the Node's `Ready` condition reads as it does under a kubelet.

use nodewarden_proto::v1::{RuntimeCondition, StatusResponse};

use super::{CriError, CriRuntime, lock};
use crate::runtime::{Problem, RuntimeHealth};

/// Before the first `Status` answer.
pub(super) const NOT_CHECKED: &str = "container runtime status check may not have completed yet";

/// The runtime does not answer.
pub(super) const DOWN: &str = "container runtime is down";

/// The network's state before the first `Status` answer (the kubelet's `ErrNetworkUnknown`).
pub(super) const NETWORK_UNKNOWN: &str = "network state unknown";

/// The health before the runtime was asked.
pub(super) fn unchecked() -> RuntimeHealth {
    RuntimeHealth { runtime: Some(Problem::new(NOT_CHECKED)), network: Some(Problem::new(NETWORK_UNKNOWN)) }
}

/// A condition as the kubelet prints it: `NetworkReady=false reason:NetworkPluginNotReady message:...`, or
/// `<nil>` when the runtime did not report it.
fn describe(c: Option<&RuntimeCondition>) -> String {
    match c {
        Some(c) => format!("{}={} reason:{} message:{}", c.r#type, c.status, c.reason, c.message),
        None => "<nil>".to_owned(),
    }
}

/// The health a `Status` answer gives: each of `RuntimeReady` and `NetworkReady` missing or false is a problem.
pub(super) fn from_status(status: &StatusResponse) -> RuntimeHealth {
    let conditions = status.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
    let problem = |kind: &str, what: &str| {
        let c = conditions.iter().find(|c| c.r#type == kind);
        (!c.is_some_and(|c| c.status)).then(|| Problem::new(format!("{what}: {}", describe(c))))
    };
    RuntimeHealth {
        runtime: problem("RuntimeReady", "container runtime not ready"),
        network: problem("NetworkReady", "container runtime network not ready"),
    }
}

impl CriRuntime {
    /// Records a call that found the runtime unreachable: it is down; the network keeps its last known state.
    pub(super) fn set_down(&self, e: &CriError) {
        let mut h = lock(&self.health);
        let next = RuntimeHealth { runtime: Some(Problem::caused(DOWN, e)), network: h.network.clone() };
        log_change(&h, &next);
        *h = next;
    }

    /// Asks the runtime for its conditions and records them (a failed call: the runtime is down). When the
    /// runtime is back after it was down, or its version was never known, the version is asked again: it may
    /// have been upgraded.
    pub(super) async fn check_status(&self) {
        let was_down = lock(&self.health).runtime.as_ref().is_some_and(|p| p.message == DOWN);
        let next = match self.client.status().await {
            Ok(s) => from_status(&s),
            Err(e) => return self.set_down(&e),
        };
        if next.runtime.is_none() && (was_down || lock(&self.version).is_none()) {
            match self.client.version().await {
                Ok(v) => *lock(&self.version) = Some(format!("{}://{}", v.runtime_name, v.runtime_version)),
                Err(e) => return self.set_down(&e),
            }
        }
        let mut h = lock(&self.health);
        log_change(&h, &next);
        *h = next;
    }
}

/// Logs what changed between two health records: a new problem as a warning, one that cleared as info.
fn log_change(old: &RuntimeHealth, new: &RuntimeHealth) {
    for (what, before, after) in [("runtime", &old.runtime, &new.runtime), ("network", &old.network, &new.network)] {
        match (before, after) {
            (_, Some(p)) if before.as_ref().map(|b| &b.message) != Some(&p.message) => {
                tracing::warn!(part = what, problem = %p, "the CRI runtime is not ready");
            }
            (Some(_), None) => tracing::info!(part = what, "the CRI runtime is ready"),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use nodewarden_proto::v1::RuntimeStatus;

    use super::*;

    fn status(conditions: &[(&str, bool, &str, &str)]) -> StatusResponse {
        let conditions = conditions
            .iter()
            .map(|(t, s, r, m)| RuntimeCondition {
                r#type: (*t).into(),
                status: *s,
                reason: (*r).into(),
                message: (*m).into(),
            })
            .collect();
        StatusResponse { status: Some(RuntimeStatus { conditions }), info: Default::default() }
    }

    #[test]
    fn conditions_become_the_kubelets_messages() {
        let ready = status(&[("RuntimeReady", true, "", ""), ("NetworkReady", true, "", "")]);
        assert_eq!(from_status(&ready), RuntimeHealth::default());
        // containerd without a CNI config.
        let no_cni = status(&[
            ("RuntimeReady", true, "", ""),
            (
                "NetworkReady",
                false,
                "NetworkPluginNotReady",
                "Network plugin returns error: cni plugin not initialized",
            ),
        ]);
        let h = from_status(&no_cni);
        assert_eq!(h.runtime, None);
        assert_eq!(
            h.network.unwrap().to_string(),
            "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady \
             message:Network plugin returns error: cni plugin not initialized"
        );
        // A condition that is missing is a problem too, printed as the kubelet prints a nil condition.
        let h = from_status(&status(&[("NetworkReady", true, "", "")]));
        assert_eq!(h.runtime.unwrap().message, "container runtime not ready: <nil>");
        assert_eq!(
            from_status(&StatusResponse::default()).network.unwrap().message,
            "container runtime network not ready: <nil>"
        );
    }
}
