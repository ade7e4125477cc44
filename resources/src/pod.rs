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

/// A grace period given in seconds, clamped to `0..=`[`MAX_GRACE_PERIOD`].
fn grace_from_seconds(secs: i64) -> Duration {
    Duration::from_secs(u64::try_from(secs).unwrap_or(0)).min(MAX_GRACE_PERIOD)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

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
