//! How the runtime's answers are read: a container's exit, a sandbox's addresses, the runtime's conditions and its
//! images. Pure functions of the messages, so that what a runtime may send (any field, any value) is fuzzed.

use jiff::Timestamp;
use nodewarden_proto::v1::{
    ContainerState, ContainerStatus, Image, PodSandboxStatusResponse, RuntimeCondition, StatusResponse,
};

use crate::seam::{ExitInfo, ImageSummary, Problem, exit_reason};

/// A time the runtime sent in nanoseconds; the epoch when out of range.
pub(super) fn timestamp(nanos: i64) -> Timestamp {
    Timestamp::from_nanosecond(i128::from(nanos)).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// How a container ended, from its status; `None` while it has not exited.
pub fn exit_of(s: ContainerStatus) -> Option<ExitInfo> {
    if s.state() != ContainerState::ContainerExited {
        return None;
    }
    let oom = s.reason == "OOMKilled";
    Some(ExitInfo {
        exit_code: s.exit_code,
        signal: (s.exit_code > 128).then(|| s.exit_code - 128),
        reason: exit_reason(s.exit_code, oom).to_owned(),
        message: (!s.message.is_empty()).then_some(s.message),
        started_at: timestamp(s.started_at),
        finished_at: timestamp(s.finished_at),
    })
}

/// The sandbox's addresses on the pod network, the primary first, empty ones left out.
pub fn sandbox_ips(status: PodSandboxStatusResponse) -> Vec<String> {
    let network = status.status.and_then(|s| s.network).unwrap_or_default();
    let extra = network.additional_ips.into_iter().map(|ip| ip.ip);
    std::iter::once(network.ip).chain(extra).filter(|ip| !ip.is_empty()).collect()
}

/// What a `Status` answer says is wrong, in the kubelet's words: the runtime, then its network (`None` when
/// ready). A condition the runtime did not report counts as not ready.
pub fn problems(status: &StatusResponse) -> (Option<Problem>, Option<Problem>) {
    let conditions = status.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
    let problem = |kind: &str, what: &str| {
        let c = conditions.iter().find(|c| c.r#type == kind);
        (!c.is_some_and(|c| c.status)).then(|| Problem::new(format!("{what}: {}", describe(c))))
    };
    (
        problem("RuntimeReady", "container runtime not ready"),
        problem("NetworkReady", "container runtime network not ready"),
    )
}

/// A condition as the kubelet prints it: `NetworkReady=false reason:NetworkPluginNotReady message:...`, or
/// `<nil>` when the runtime did not report it.
fn describe(c: Option<&RuntimeCondition>) -> String {
    match c {
        Some(c) => format!("{}={} reason:{} message:{}", c.r#type, c.status, c.reason, c.message),
        None => "<nil>".to_owned(),
    }
}

/// An image as the Node lists it: its digests, then its tags.
pub fn image_summary(i: Image) -> ImageSummary {
    ImageSummary { names: [i.repo_digests, i.repo_tags].concat(), size_bytes: i.size }
}
