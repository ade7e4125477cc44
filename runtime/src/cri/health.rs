//! What the CRI runtime's monitor learns besides exits, kept as the kubelet keeps its runtime state
//! (`pkg/kubelet/runtime.go`, `updateRuntimeUp`, the image cache): `Status` says whether the runtime and its
//! network are ready, in its conditions' words; a runtime is down once no `Status` said it was ready for
//! [`DOWN_AFTER`]; its version is asked with every `Status`; its images are listed every [`IMAGES_EVERY`] relists
//! and after a pull. The messages are the kubelet's, so the Node's `Ready` condition reads as under a kubelet.

use std::time::Duration;

use nodewarden_proto::v1::StatusResponse;
use tokio::time::Instant;

use super::responses::{image_summary, problems};
use super::{CriError, CriRuntime, lock};
use crate::seam::{ImageSummary, Problem, RuntimeHealth};

/// Before the first `Status` answer that said the runtime is ready.
const NOT_CHECKED: &str = "container runtime status check may not have completed yet";

/// No `Status` said the runtime is ready for [`DOWN_AFTER`].
const DOWN: &str = "container runtime is down";

/// The network's state before the first `Status` answer (the kubelet's `ErrNetworkUnknown`).
const NETWORK_UNKNOWN: &str = "network state unknown";

/// How long a runtime may go without a ready `Status` before it is down (the kubelet's
/// `maxWaitForContainerRuntime`): a containerd restart of a few seconds does not make the node NotReady.
pub(super) const DOWN_AFTER: Duration = Duration::from_secs(30);

/// `Status` (and `Version`) is asked every this many relists while the runtime is ready (the kubelet asks every
/// 5 s), and at every relist while it is not.
const STATUS_EVERY: u32 = 5;

/// The images are listed every this many relists (the kubelet refreshes its image cache every 30 s), and at the
/// next relist after a pull.
const IMAGES_EVERY: u32 = 30;

/// What the monitor knows of the runtime.
#[derive(Debug)]
pub(super) struct Known {
    /// When a `Status` last said the runtime is ready (the kubelet's `lastBaseRuntimeSync`).
    ready_at: Option<Instant>,
    /// Why the runtime is not ready, from the last `Status` answer.
    not_ready: Option<Problem>,
    /// Why the network is not ready, from the last `Status` answer.
    network: Option<Problem>,
    /// The last error talking to the runtime, until a `Status` succeeds.
    error: Option<String>,
    /// The runtime's name from `Version` (the scheme until it answered), and its version while it answers.
    name: String,
    version: Option<String>,
    /// The images from the last `ListImages`.
    images: Vec<ImageSummary>,
    /// Pulls so far, and how many had completed when the last successful `ListImages` was asked.
    pulls: u64,
    listed_after: Option<u64>,
}

impl Known {
    pub(super) fn new(name: &str) -> Self {
        Known {
            ready_at: None,
            not_ready: None,
            network: Some(Problem::new(NETWORK_UNKNOWN)),
            error: None,
            name: name.to_owned(),
            version: None,
            images: Vec::new(),
            pulls: 0,
            listed_after: None,
        }
    }

    /// The runtime's health now.
    pub(super) fn health(&self, now: Instant) -> RuntimeHealth {
        let problem = |message| Problem { message, cause: self.error.clone() };
        let runtime = match self.ready_at {
            None => Some(self.not_ready.clone().unwrap_or_else(|| problem(NOT_CHECKED.to_owned()))),
            Some(at) if now.saturating_duration_since(at) > DOWN_AFTER => Some(problem(DOWN.to_owned())),
            Some(_) => self.not_ready.clone(),
        };
        RuntimeHealth { runtime, network: self.network.clone() }
    }

    /// `<name>://<version>`, `Unknown` for the version while the runtime does not answer (as the kubelet shows it).
    pub(super) fn version(&self) -> String {
        format!("{}://{}", self.name, self.version.as_deref().unwrap_or("Unknown"))
    }

    /// The images from the last list.
    pub(super) fn images(&self) -> Vec<ImageSummary> {
        self.images.clone()
    }

    /// Notes a `Version` answer.
    pub(super) fn set_version(&mut self, name: String, version: String) {
        self.name = name;
        self.version = Some(version);
    }

    /// Notes a completed pull: the images are listed again at the next relist.
    pub(super) fn pulled(&mut self) {
        self.pulls += 1;
    }

    /// Notes a call that failed because the runtime could not be reached.
    pub(super) fn failed(&mut self, e: &CriError) {
        self.error = Some(e.to_string());
        self.version = None;
    }

    /// Notes a `Status` answer.
    fn answered(&mut self, status: &StatusResponse, now: Instant) {
        (self.not_ready, self.network) = problems(status);
        self.error = None;
        if self.not_ready.is_none() {
            self.ready_at = Some(now);
        }
    }

    /// Whether `Status` is due at relist `n`: every [`STATUS_EVERY`], and at each while anything is wrong.
    fn status_due(&self, n: u32) -> bool {
        n.is_multiple_of(STATUS_EVERY) || self.error.is_some() || self.not_ready.is_some() || self.network.is_some()
    }

    /// Whether `ListImages` is due at relist `n`: every [`IMAGES_EVERY`], and at the first after a pull.
    fn images_due(&self, n: u32) -> bool {
        n.is_multiple_of(IMAGES_EVERY) || self.listed_after != Some(self.pulls)
    }
}

impl CriRuntime {
    /// Records a call that found the runtime unreachable.
    pub(super) fn set_failed(&self, e: &CriError) {
        let mut k = lock(&self.known);
        let before = k.health(Instant::now());
        k.failed(e);
        log_change(&before, &k.health(Instant::now()));
    }

    /// After relist `n` (`answered`: the runtime answered it): asks `Status` and `Version` and lists the images
    /// when they are due.
    pub(super) async fn check(&self, n: u32, answered: bool) {
        let (status_due, images_due) = {
            let k = lock(&self.known);
            (answered && k.status_due(n), answered && k.images_due(n))
        };
        if status_due {
            self.check_status().await;
        }
        if images_due {
            let pulls = lock(&self.known).pulls;
            match self.client.list_images().await {
                Ok(images) => {
                    let mut images: Vec<ImageSummary> = images.into_iter().map(image_summary).collect();
                    // A stable order for images of one size, so the Node's list does not change between lists.
                    images.sort_by(|a, b| b.size_bytes.cmp(&a.size_bytes).then_with(|| a.names.cmp(&b.names)));
                    let mut k = lock(&self.known);
                    k.images = images;
                    k.listed_after = Some(pulls);
                }
                Err(e) => tracing::debug!(error = %e, "cannot list the images; the last list is kept"),
            }
        }
    }

    /// Asks the runtime for its conditions and its version, and records them.
    async fn check_status(&self) {
        let (status, version) = (self.client.status().await, self.client.version().await);
        let now = Instant::now();
        let mut k = lock(&self.known);
        let before = k.health(now);
        match (status, version) {
            (Ok(s), Ok(v)) => {
                k.answered(&s, now);
                k.set_version(v.runtime_name, v.runtime_version);
            }
            (Err(e), _) | (_, Err(e)) => k.failed(&e),
        }
        log_change(&before, &k.health(now));
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
            .map(|(t, s, r, m)| nodewarden_proto::v1::RuntimeCondition {
                r#type: (*t).into(),
                status: *s,
                reason: (*r).into(),
                message: (*m).into(),
            })
            .collect();
        StatusResponse { status: Some(RuntimeStatus { conditions }), info: Default::default() }
    }

    fn ready() -> StatusResponse {
        status(&[("RuntimeReady", true, "", ""), ("NetworkReady", true, "", "")])
    }

    #[test]
    fn conditions_become_the_kubelets_messages() {
        let now = Instant::now();
        let mut k = Known::new("containerd");
        let h = k.health(now);
        assert_eq!(h.runtime.unwrap().message, NOT_CHECKED);
        assert_eq!(h.network.unwrap().message, NETWORK_UNKNOWN);
        k.answered(&ready(), now);
        assert_eq!(k.health(now), RuntimeHealth::default());
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
        k.answered(&no_cni, now);
        let h = k.health(now);
        assert_eq!(h.runtime, None);
        assert_eq!(
            h.network.unwrap().to_string(),
            "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady \
             message:Network plugin returns error: cni plugin not initialized"
        );
        // A condition that is missing is a problem too, printed as the kubelet prints a nil condition.
        k.answered(&status(&[("NetworkReady", true, "", "")]), now);
        assert_eq!(k.health(now).runtime.unwrap().message, "container runtime not ready: <nil>");
        k.answered(&StatusResponse::default(), now);
        assert_eq!(k.health(now).network.unwrap().message, "container runtime network not ready: <nil>");
    }

    #[test]
    fn a_runtime_is_down_only_after_thirty_seconds_without_a_ready_status() {
        let t0 = Instant::now();
        let mut k = Known::new("containerd");
        k.answered(&ready(), t0);
        k.set_version("containerd".into(), "1.6.20".into());
        assert_eq!(k.version(), "containerd://1.6.20");
        let e = CriError::Timeout { rpc: "ListContainers", timeout: Duration::from_secs(2) };
        k.failed(&e);
        // Down for a moment (a containerd restart): not yet a problem for the Node, but no version is known.
        assert_eq!(k.health(t0 + Duration::from_secs(10)).runtime, None);
        assert_eq!(k.version(), "containerd://Unknown");
        let down = k.health(t0 + DOWN_AFTER + Duration::from_secs(1)).runtime.unwrap();
        assert_eq!(down.message, DOWN);
        assert!(down.to_string().contains("ListContainers"), "the cause for /readyz: {down}");
        // Never ready at all: the kubelet's words for a runtime not checked yet, with why.
        let mut never = Known::new("containerd");
        never.failed(&e);
        let p = never.health(t0 + Duration::from_secs(600)).runtime.unwrap();
        assert_eq!((p.message.as_str(), p.cause.is_some()), (NOT_CHECKED, true));
    }

    #[test]
    fn status_and_images_are_asked_when_due() {
        let now = Instant::now();
        let mut k = Known::new("containerd");
        assert!(k.status_due(1) && k.images_due(1), "nothing known yet");
        k.answered(&ready(), now);
        k.listed_after = Some(0);
        assert!(!k.status_due(1) && k.status_due(STATUS_EVERY));
        assert!(!k.images_due(1) && k.images_due(IMAGES_EVERY));
        // A pull makes the list stale at once; a list asked before the pull completed does not count.
        k.pulled();
        assert!(k.images_due(1));
        k.listed_after = Some(1);
        assert!(!k.images_due(1));
        k.failed(&CriError::Timeout { rpc: "Status", timeout: Duration::from_secs(2) });
        assert!(k.status_due(1), "asked at every relist while it fails");
    }
}
