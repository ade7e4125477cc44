//! A container's image made present before it starts, as the kubelet's image manager does it: the pull policy
//! (`Always` pulls, `IfNotPresent` pulls what is missing, `Never` refuses what is missing), the runtime's image
//! service for the check and the pull, and the kubelet's events for each outcome.

use std::time::Duration;

use nodewarden_runtime::{ContainerSpec, ImageService, PullPolicy, RuntimeError};
use tokio::time::Instant;

use crate::events::Happened;

/// The waiting reasons of a container whose image could not be made present. The kubelet's start failure event
/// says the reason for these (`Error: ErrImagePull`), the image events having said why.
pub(crate) const REASONS: [&str; 4] = ["ErrImagePull", "ErrImageNeverPull", "ImageInspectError", "ImagePullBackOff"];

/// What happened to a container's image, for its event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ImageEvent {
    /// The image is on the node and the policy does not ask for a pull.
    Present,
    /// A pull begins.
    Pulling,
    /// The pull ended well: how long it took, how long with the wait for earlier pulls, the image's size.
    Pulled { pulling: Duration, with_waiting: Duration, size_bytes: u64 },
    /// The pull failed, with the runtime's message.
    PullFailed(String),
    /// The image is missing and the policy is `Never`.
    NeverPull,
    /// The runtime could not say whether the image is there.
    InspectFailed(String),
}

impl ImageEvent {
    /// `(warning, reason, message)` in the kubelet's words, about `image`.
    pub(crate) fn words(&self, image: &str) -> (bool, &'static str, String) {
        match self {
            ImageEvent::Present => (false, "Pulled", format!("Container image {image:?} already present on machine")),
            ImageEvent::Pulling => (false, "Pulling", format!("Pulling image {image:?}")),
            ImageEvent::Pulled { pulling, with_waiting, size_bytes } => (
                false,
                "Pulled",
                format!(
                    "Successfully pulled image {image:?} in {} ({} including waiting). Image size: {size_bytes} bytes.",
                    go_millis(*pulling),
                    go_millis(*with_waiting)
                ),
            ),
            ImageEvent::PullFailed(why) => (true, "Failed", format!("Failed to pull image {image:?}: {why}")),
            ImageEvent::NeverPull => (
                true,
                "ErrImageNeverPull",
                format!("Container image {image:?} is not present with pull policy of Never"),
            ),
            ImageEvent::InspectFailed(why) => {
                (true, "InspectFailed", format!("Failed to inspect image {image:?}: {why}"))
            }
        }
    }
}

/// Makes the image of container `index` (`spec`) present under its pull policy, telling `record` what happens
/// as it happens. Returns the span of the pull where there was one, for the pod startup SLI (which leaves pulls
/// out), or the error the container's start fails with.
pub(crate) async fn ensure<I: ImageService>(
    images: &I,
    index: usize,
    spec: &ContainerSpec,
    record: impl Fn(Happened),
) -> Result<Option<(Instant, Instant)>, RuntimeError> {
    let say = |what: ImageEvent| record(Happened::Image { index, image: spec.image.clone(), what });
    if spec.pull_policy != PullPolicy::Always {
        match images.image_present(&spec.image).await {
            Ok(true) => {
                say(ImageEvent::Present);
                return Ok(None);
            }
            Ok(false) => {}
            Err(e) => {
                say(ImageEvent::InspectFailed(e.to_string()));
                return Err(RuntimeError::Image {
                    reason: "ImageInspectError",
                    message: format!("Failed to inspect image {:?}: {e}", spec.image),
                });
            }
        }
        if spec.pull_policy == PullPolicy::Never {
            say(ImageEvent::NeverPull);
            return Err(RuntimeError::Image {
                reason: "ErrImageNeverPull",
                message: format!("Container image {:?} is not present with pull policy of Never", spec.image),
            });
        }
    }
    say(ImageEvent::Pulling);
    let began = Instant::now();
    let pulled = images.pull_image(spec).await;
    let ended = Instant::now();
    match pulled {
        Ok(p) => {
            let with_waiting = ended - began;
            say(ImageEvent::Pulled { pulling: p.pulling.min(with_waiting), with_waiting, size_bytes: p.size_bytes });
            Ok(Some((began, ended)))
        }
        // The sandbox went away meanwhile: not the image's fault, and the pod makes a new sandbox.
        Err(e @ RuntimeError::SandboxNotFound(_)) => Err(e),
        Err(e) => {
            say(ImageEvent::PullFailed(e.to_string()));
            Err(e)
        }
    }
}

/// A duration cut to the millisecond, as Go prints one (`512ms`, `1.5s`, `2m3.004s`, `1h0m0s`).
fn go_millis(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".to_owned();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, m, s, frac) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    let seconds = if frac == 0 {
        format!("{s}s")
    } else {
        let digits = format!("{frac:03}");
        format!("{s}.{}s", digits.trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => seconds,
        (0, m) => format!("{m}m{seconds}"),
        (h, m) => format!("{h}h{m}m{seconds}"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    use nodewarden_runtime::PulledImage;

    use super::*;

    /// Images by name: those present, and those a pull can fetch; every call is written down.
    #[derive(Default)]
    struct Images {
        present: Mutex<BTreeSet<String>>,
        pullable: BTreeSet<String>,
        inspect_fails: bool,
        calls: Mutex<Vec<String>>,
    }

    impl ImageService for Images {
        async fn image_present(&self, image: &str) -> Result<bool, RuntimeError> {
            self.calls.lock().unwrap().push(format!("present {image}"));
            if self.inspect_fails {
                return Err(RuntimeError::Unavailable("connection refused".into()));
            }
            Ok(self.present.lock().unwrap().contains(image))
        }

        async fn pull_image(&self, spec: &ContainerSpec) -> Result<PulledImage, RuntimeError> {
            self.calls.lock().unwrap().push(format!("pull {}", spec.image));
            if !self.pullable.contains(&spec.image) {
                let message = format!("failed to pull image {:?}: not found", spec.image);
                return Err(RuntimeError::Image { reason: "ErrImagePull", message });
            }
            self.present.lock().unwrap().insert(spec.image.clone());
            let pulling = Duration::from_millis(1500);
            Ok(PulledImage { image_ref: spec.image.clone(), size_bytes: 4096, pulling })
        }

        async fn list_images(&self) -> Result<Vec<nodewarden_runtime::NodeImage>, RuntimeError> {
            Ok(Vec::new())
        }

        async fn images_in_use(&self) -> Result<BTreeSet<String>, RuntimeError> {
            Ok(BTreeSet::new())
        }

        async fn remove_image(&self, _id: &str) -> Result<(), RuntimeError> {
            Ok(())
        }

        async fn writable_layers(&self) -> Result<Vec<nodewarden_runtime::WritableLayer>, RuntimeError> {
            Ok(Vec::new())
        }
    }

    fn spec(image: &str, pull_policy: PullPolicy) -> ContainerSpec {
        ContainerSpec {
            pod_uid: "u1".into(),
            sandbox_id: "sb-u1".into(),
            name: "app".into(),
            attempt: 0,
            image: image.into(),
            pull_policy,
            command: vec![],
            args: vec![],
            env: vec![],
            working_dir: None,
            user: None,
            group: None,
            cgroup: nodewarden_resources::CgroupPath::root(),
            oom_score_adj: 1000,
            resources: nodewarden_runtime::LinuxResources::default(),
            log_path: "/var/log/pods/app/0.log".into(),
            mounts: vec![],
            security: nodewarden_runtime::security::Security::default(),
            pull_auths: vec![],
        }
    }

    /// Runs [`ensure`] and returns its result with the events' reasons and messages.
    async fn run(images: &Images, spec: &ContainerSpec) -> (Result<bool, RuntimeError>, Vec<(&'static str, String)>) {
        let said = Mutex::new(Vec::new());
        let result = ensure(images, 0, spec, |h| {
            let Happened::Image { what, image, .. } = h else { panic!("{h:?}") };
            let (_, reason, message) = what.words(&image);
            said.lock().unwrap().push((reason, message));
        })
        .await;
        (result.map(|span| span.is_some()), said.into_inner().unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn the_pull_policy_decides_and_each_outcome_has_the_kubelets_event() {
        let images = Images { pullable: ["app:1".to_owned()].into(), ..Images::default() };
        // IfNotPresent, missing: pulled, with both events.
        let (pulled, said) = run(&images, &spec("app:1", PullPolicy::IfNotPresent)).await;
        assert_eq!(pulled, Ok(true));
        assert_eq!(said[0], ("Pulling", r#"Pulling image "app:1""#.to_owned()));
        assert_eq!(said[1].0, "Pulled");
        assert!(said[1].1.starts_with(r#"Successfully pulled image "app:1" in "#), "{}", said[1].1);
        assert!(said[1].1.ends_with("including waiting). Image size: 4096 bytes."), "{}", said[1].1);
        // IfNotPresent, present: no pull.
        let (pulled, said) = run(&images, &spec("app:1", PullPolicy::IfNotPresent)).await;
        assert_eq!(pulled, Ok(false));
        assert_eq!(said, [("Pulled", r#"Container image "app:1" already present on machine"#.to_owned())]);
        // Always: pulled even when present, without asking first.
        images.calls.lock().unwrap().clear();
        let (pulled, _) = run(&images, &spec("app:1", PullPolicy::Always)).await;
        assert_eq!(pulled, Ok(true));
        assert_eq!(*images.calls.lock().unwrap(), ["pull app:1"]);
        // Never: present runs, missing is refused without a pull.
        assert_eq!(run(&images, &spec("app:1", PullPolicy::Never)).await.0, Ok(false));
        let (refused, said) = run(&images, &spec("other:1", PullPolicy::Never)).await;
        let Err(RuntimeError::Image { reason, message }) = refused else { panic!("{refused:?}") };
        assert_eq!((reason, message.as_str()), ("ErrImageNeverPull", said[0].1.as_str()));
        assert_eq!(
            said,
            [("ErrImageNeverPull", r#"Container image "other:1" is not present with pull policy of Never"#.to_owned())]
        );
        // A pull that fails: its error, and the Failed event with the runtime's words.
        let (failed, said) = run(&images, &spec("gone:1", PullPolicy::IfNotPresent)).await;
        assert!(matches!(failed, Err(RuntimeError::Image { reason: "ErrImagePull", .. })), "{failed:?}");
        assert_eq!(
            said[1],
            ("Failed", r#"Failed to pull image "gone:1": failed to pull image "gone:1": not found"#.to_owned())
        );
        // A runtime that cannot say whether the image is there.
        let broken = Images { inspect_fails: true, ..Images::default() };
        let (failed, said) = run(&broken, &spec("app:1", PullPolicy::IfNotPresent)).await;
        assert!(matches!(failed, Err(RuntimeError::Image { reason: "ImageInspectError", .. })), "{failed:?}");
        assert_eq!(said, [("InspectFailed", r#"Failed to inspect image "app:1": connection refused"#.to_owned())]);
    }

    #[test]
    fn durations_read_as_go_prints_them() {
        let ms = Duration::from_millis;
        assert_eq!(go_millis(Duration::from_micros(300)), "0s");
        assert_eq!(go_millis(ms(512)), "512ms");
        assert_eq!(go_millis(ms(15_981)), "15.981s");
        assert_eq!(go_millis(ms(2000)), "2s");
        assert_eq!(go_millis(ms(1500)), "1.5s");
        assert_eq!(go_millis(ms(123_004)), "2m3.004s");
        assert_eq!(go_millis(ms(3_600_000)), "1h0m0s");
    }
}
