//! What every crate reads off a pod's metadata and spec the same way: its namespace with the API's default, its
//! full name, and its termination grace period with the API's default and a ceiling that keeps deadline
//! arithmetic from overflowing.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

/// The namespace of a pod that names none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// `terminationGracePeriodSeconds` when the spec leaves it out (the API server's default).
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(30);

/// The longest grace period honoured: a longer one (up to `i64::MAX` seconds passes the API's validation) is cut
/// to this, so that `now + grace` can always be computed and a timer set for it.
pub const MAX_GRACE_PERIOD: Duration = Duration::from_secs(365 * 24 * 3600);

/// The pod's namespace, or [`DEFAULT_NAMESPACE`].
pub fn namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().filter(|n| !n.is_empty()).unwrap_or(DEFAULT_NAMESPACE)
}

/// The kubelet's way of naming a pod in messages (its `format.Pod`): `name_namespace(uid)`.
pub fn kubelet_ref(pod: &Pod) -> String {
    let m = &pod.metadata;
    format!("{}_{}({})", m.name.as_deref().unwrap_or_default(), namespace(pod), m.uid.as_deref().unwrap_or_default())
}

/// `namespace/name`, as logs, messages and the per-name start lock use it.
pub fn full_name(pod: &Pod) -> String {
    format!("{}/{}", namespace(pod), pod.metadata.name.as_deref().unwrap_or_default())
}

/// The pod's termination grace period: [`DEFAULT_GRACE_PERIOD`] when unset, zero when negative, at most
/// [`MAX_GRACE_PERIOD`].
pub fn grace_period(pod: &Pod) -> Duration {
    let secs = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds);
    secs.map_or(DEFAULT_GRACE_PERIOD, grace_from_seconds)
}

/// True for a pod the apiserver is deleting (`metadata.deletionTimestamp` set): still listed, it is to terminate.
pub fn is_deleting(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// True for a pod whose status says it is over (phase `Succeeded` or `Failed`): the kubelet never runs such a
/// pod again.
pub fn is_terminal_phase(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// The grace period a deletion gives the pod, as the kubelet reckons it: `deletionGracePeriodSeconds` where the
/// apiserver set one, else the spec's ([`grace_period`]); never under 1 s, so that a container always gets its
/// stop signal before SIGKILL. A later deletion may only shorten it (the pod worker's rule).
pub fn deletion_grace_period(pod: &Pod) -> Duration {
    let grace = match pod.metadata.deletion_grace_period_seconds {
        Some(secs) if is_deleting(pod) && secs > 0 => grace_from_seconds(secs),
        _ => grace_period(pod),
    };
    grace.max(Duration::from_secs(1))
}

/// A grace period given in seconds, clamped to `0..=`[`MAX_GRACE_PERIOD`].
fn grace_from_seconds(secs: i64) -> Duration {
    Duration::from_secs(u64::try_from(secs).unwrap_or(0)).min(MAX_GRACE_PERIOD)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    #[test]
    fn a_deletion_takes_the_apiservers_grace_period_and_at_least_a_second() {
        let mut p = pod(Some("default"), Some(30));
        assert_eq!(deletion_grace_period(&p), Duration::from_secs(30), "a pod dropped by its source: the spec's");
        p.metadata.deletion_grace_period_seconds = Some(5);
        assert_eq!(deletion_grace_period(&p), Duration::from_secs(30), "no deletionTimestamp: not a deletion");
        p.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert!(is_deleting(&p));
        assert_eq!(deletion_grace_period(&p), Duration::from_secs(5));
        p.metadata.deletion_grace_period_seconds = Some(0);
        assert_eq!(deletion_grace_period(&p), Duration::from_secs(30), "0 is no override: the spec's");
        let p = pod(Some("default"), Some(0));
        assert_eq!(deletion_grace_period(&p), Duration::from_secs(1), "never under a second");
    }

    fn pod(namespace: Option<&str>, grace: Option<i64>) -> Pod {
        let mut p = Pod {
            spec: Some(PodSpec { termination_grace_period_seconds: grace, ..PodSpec::default() }),
            ..Pod::default()
        };
        p.metadata.name = Some("web".into());
        p.metadata.namespace = namespace.map(Into::into);
        p
    }

    #[test]
    fn names_default_the_namespace() {
        assert_eq!(full_name(&pod(None, None)), "default/web");
        assert_eq!(full_name(&pod(Some(""), None)), "default/web");
        assert_eq!(full_name(&pod(Some("kube-system"), None)), "kube-system/web");
        assert_eq!(full_name(&Pod::default()), "default/");
    }

    #[test]
    fn grace_period_defaults_and_saturates() {
        assert_eq!(grace_period(&pod(None, None)), DEFAULT_GRACE_PERIOD);
        assert_eq!(grace_period(&Pod::default()), DEFAULT_GRACE_PERIOD);
        assert_eq!(grace_period(&pod(None, Some(5))), Duration::from_secs(5));
        assert_eq!(grace_period(&pod(None, Some(0))), Duration::ZERO);
        assert_eq!(grace_period(&pod(None, Some(-1))), Duration::ZERO);
        assert_eq!(grace_period(&pod(None, Some(i64::MAX))), MAX_GRACE_PERIOD);
        assert_eq!(grace_period(&pod(None, Some(i64::MAX - 1))), MAX_GRACE_PERIOD);
    }
}
