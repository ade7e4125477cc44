//! The field names of the kubelet's `KubeletConfiguration` (v1beta1) that nodewarden does not implement. A real
//! kubelet config file carries many of them: they are accepted and reported once as ignored. Any other unknown
//! field is an error, with the nearest known name suggested.

/// Real kubelet fields that nodewarden accepts and ignores.
pub const IGNORED: &[&str] = &[
    "enableServer",
    "address",
    "port",
    "readOnlyPort",
    "tlsCertFile",
    "tlsPrivateKeyFile",
    "tlsCipherSuites",
    "tlsCurvePreferences",
    "tlsMinVersion",
    "rotateCertificates",
    "serverTLSBootstrap",
    "authentication",
    "authorization",
    "registryPullQPS",
    "registryBurst",
    "imagePullCredentialsVerificationPolicy",
    "preloadedImagesVerificationAllowlist",
    "enableDebuggingHandlers",
    "enableContentionProfiling",
    "oomScoreAdj",
    "clusterDomain",
    "clusterDNS",
    "streamingConnectionIdleTimeout",
    "volumeStatsAggPeriod",
    "kubeletCgroups",
    "systemCgroups",
    "cpuManagerPolicy",
    "singleProcessOOMKill",
    "cpuManagerPolicyOptions",
    "cpuManagerReconcilePeriod",
    "memoryManagerPolicy",
    "topologyManagerPolicy",
    "topologyManagerScope",
    "topologyManagerPolicyOptions",
    "qosReserved",
    "hairpinMode",
    "podCIDR",
    "resolvConf",
    "runOnce",
    "contentType",
    "podsPerCore",
    "enableControllerAttachDetach",
    "makeIPTablesUtilChains",
    "iptablesMasqueradeBit",
    "iptablesDropBit",
    "containerLogMaxWorkers",
    "configMapAndSecretChangeDetectionStrategy",
    "reservedSystemCPUs",
    "showHiddenMetricsForVersion",
    "systemReservedCgroup",
    "kubeReservedCgroup",
    "allowedUnsafeSysctls",
    "volumePluginDir",
    "kernelMemcgNotification",
    "logging",
    "enableSystemLogHandler",
    "enableSystemLogQuery",
    "crashLoopBackOff",
    "reservedMemory",
    "enableProfilingHandler",
    "enableDebugFlagsHandler",
    "seccompDefault",
    "tracing",
    "imageServiceEndpoint",
    "failCgroupV1",
    "userNamespaces",
    "memoryReservationPolicy",
];

/// The known name closest to `name`, when it is close enough to be a likely misspelling.
pub fn suggest<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let lower = name.to_ascii_lowercase();
    known
        .into_iter()
        .map(|k| (edit_distance(&lower, &k.to_ascii_lowercase()), k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 5))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions() {
        assert_eq!(suggest("evictonHard", ["evictionHard", "evictionSoft"]), Some("evictionHard"));
        assert_eq!(suggest("maxpods", ["maxPods"]), Some("maxPods"));
        assert_eq!(suggest("somethingElse", ["maxPods"]), None);
    }
}
