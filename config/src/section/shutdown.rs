//! The shutdown section: the node's graceful shutdown, from `shutdownGracePeriod`,
//! `shutdownGracePeriodCriticalPods` and `shutdownGracePeriodByPodPriority`.

use std::time::Duration;

use super::{duration_field, required};
use crate::{ConfigError, KubeletConfiguration};

/// The shutdown section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownConfig {
    /// The groups of pods by lowest priority, ascending, each with its share of the shutdown; empty when graceful
    /// shutdown is off.
    pub groups: Vec<(i32, Duration)>,
}

impl ShutdownConfig {
    /// The node's shutdown groups, as the kubelet derives them: `shutdownGracePeriodByPodPriority` sorted by
    /// priority, or, from the two periods, the pods below system-critical priority with the period less the
    /// critical pods' share, then the critical pods with theirs. Setting both forms is refused, as by the kubelet.
    pub fn validate(c: &KubeletConfiguration) -> Result<Self, ConfigError> {
        let total = duration_field("shutdownGracePeriod", &c.shutdown_grace_period)?;
        let critical = duration_field("shutdownGracePeriodCriticalPods", &c.shutdown_grace_period_critical_pods)?;
        let by_priority = required(&c.shutdown_grace_period_by_pod_priority, "shutdownGracePeriodByPodPriority")?;
        if !by_priority.is_empty() {
            if !total.is_zero() || !critical.is_zero() {
                return Err(ConfigError::field(
                    "shutdownGracePeriodByPodPriority",
                    "cannot be set with shutdownGracePeriod or shutdownGracePeriodCriticalPods",
                ));
            }
            let mut groups = Vec::new();
            for (i, g) in by_priority.iter().enumerate() {
                let secs = u64::try_from(g.shutdown_grace_period_seconds).map_err(|_| {
                    ConfigError::field(
                        format!("shutdownGracePeriodByPodPriority[{i}].shutdownGracePeriodSeconds"),
                        "is negative",
                    )
                })?;
                groups.push((g.priority, Duration::from_secs(secs)));
            }
            groups.sort_by_key(|g| g.0);
            return Ok(ShutdownConfig { groups });
        }
        if critical > total {
            return Err(ConfigError::field(
                "shutdownGracePeriodCriticalPods",
                format!("{critical:?} is longer than shutdownGracePeriod ({total:?})"),
            ));
        }
        if total.is_zero() {
            return Ok(ShutdownConfig { groups: Vec::new() });
        }
        let groups = vec![(0, total - critical), (nodewarden_resources::SYSTEM_CRITICAL_PRIORITY, critical)];
        Ok(ShutdownConfig { groups })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse;
    use crate::section::HEAD;
    use crate::tests::field_error;

    #[test]
    fn shutdown_grace_periods_become_the_kubelets_priority_groups() {
        assert!(parse(HEAD).unwrap().shutdown.groups.is_empty(), "off by default");
        let c = parse(&format!("{HEAD}shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\n")).unwrap();
        assert_eq!(c.shutdown.groups, [(0, Duration::from_secs(20)), (2_000_000_000, Duration::from_secs(10))]);
        let c = parse(&format!(
            "{HEAD}shutdownGracePeriodByPodPriority:\n- {{priority: 100000, shutdownGracePeriodSeconds: 5}}\n\
             - {{priority: 0, shutdownGracePeriodSeconds: 3}}\n"
        ))
        .unwrap();
        assert_eq!(c.shutdown.groups, [(0, Duration::from_secs(3)), (100_000, Duration::from_secs(5))], "sorted");
        for (text, field) in [
            ("shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 20s\n", "shutdownGracePeriodCriticalPods"),
            (
                "shutdownGracePeriod: 10s\nshutdownGracePeriodByPodPriority:\n- {priority: 0, shutdownGracePeriodSeconds: 3}\n",
                "shutdownGracePeriodByPodPriority",
            ),
        ] {
            let (f, reason) = field_error(&format!("{HEAD}{text}"));
            assert_eq!(f, field, "{text}: {reason}");
        }
    }
}
