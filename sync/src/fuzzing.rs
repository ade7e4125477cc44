//! Entry points for the fuzz targets of `fuzz/`: each takes arbitrary bytes the way the daemon takes them from a
//! user, a file or a runtime, runs the library's own code on them, and panics only where a property the daemon
//! relies on does not hold. The code under them must never panic, whatever the input.

use std::collections::BTreeMap;
use std::path::Path;

use nodewarden_resources::{self as resources, Limit, LimitSettings};

use crate::state;

/// A static pod manifest, as the file source reads it. A pod it accepts has a UID and can be accounted for: its
/// requests, QoS class, priority and grace period, and cgroup limits the kernel takes (a `cpu.weight` within
/// 1..=10000, a `cpu.max` quota of at least 1 ms).
pub fn manifest(bytes: &[u8]) {
    let Ok(pod) = crate::parse_static_pod(bytes, Path::new("/etc/kubernetes/manifests/fuzz.yaml"), "fuzz-node") else {
        return;
    };
    assert!(pod.metadata.uid.as_deref().is_some_and(|u| !u.is_empty()), "an accepted pod has a UID");
    let _ = resources::pod::full_name(&pod);
    let _ = resources::pod::grace_period(&pod);
    let _ = resources::resolved_priority(&pod);
    let _ = resources::is_critical(&pod, false);
    let Ok(r) = resources::PodResources::from_pod(&pod) else { return };
    let qos = r.qos_class();
    for memory_qos in [false, true] {
        let settings = LimitSettings {
            pod_pids_limit: Some(4096),
            cpu_cfs_quota: true,
            cpu_cfs_period_us: 100_000,
            memory_qos,
            memory_throttling_factor: 0.9,
            memory_capacity: 8 << 30,
            allocatable_memory: 7 << 30,
        };
        let pod_limits = resources::pod_limits(&r, qos, &settings);
        let containers = r.init.iter().chain(r.sidecars.iter().map(|(_, c)| c)).chain(&r.app);
        for limits in
            std::iter::once(pod_limits).chain(containers.map(|c| resources::container_limits(c, qos, &settings)))
        {
            assert!(
                (1..=10_000).contains(&limits.cpu_weight),
                "cpu.weight {} out of the kernel's range",
                limits.cpu_weight
            );
            if let Some(q) = limits.cpu_max.quota {
                assert!(q >= 1000, "a cpu.max quota of {q} µs is below the kernel's minimum");
            }
            if let Some(Limit::Value(high)) = limits.memory_high {
                assert!(high > 0, "memory.high 0 would stall the container");
            }
        }
    }
}

/// `$(VAR)` expansion of a command, argument or value: the first line of the input is the text, each further
/// line a `NAME=value` variable. Expansion is one pass: a value that itself holds `$(NAME)` is taken as written;
/// text without `$` comes back as it is.
pub fn expand(text: &str) {
    let mut lines = text.split('\n');
    let template = lines.next().unwrap_or_default();
    let vars: BTreeMap<String, String> =
        lines.filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
    let out = crate::spec::expand(template, &vars);
    if !template.contains('$') {
        assert_eq!(out, template, "text without a reference changed");
    }
    // One pass: expanding a variable whose value is a reference to itself gives that reference, not a loop.
    if let Some((name, value)) = vars.iter().next()
        && !name.contains(')')
        && template == format!("$({name})")
    {
        assert_eq!(&out, value, "a reference to a known variable gives its value");
    }
}

/// A pod's state file and its terminal record, as a restarted daemon reads them. A state the daemon can read,
/// saved again, reads back as the same state; a terminal record it writes reads back as the same record, or is
/// refused when it cannot fit (never written cut).
pub fn state_file(bytes: &[u8]) {
    const UID: &str = "fuzz-uid";
    if let Ok(saved) = state::decode(bytes, UID) {
        let again = state::encode(UID, &saved).expect("a state that was read can be written");
        let back = state::decode(&again, UID).expect("a state that was written can be read");
        assert_eq!(back, state::SavedPod { uid: Some(UID.to_owned()), ..saved.clone() });
        if let Some(terminal) = &saved.terminal
            && let Ok(record) = state::encode_terminal(UID, terminal)
        {
            let read = state::decode_terminal(&record, UID).expect("a terminal record that was written can be read");
            let read = read.expect("a written terminal record holds the state");
            assert_eq!((&read.phase, &read.reason), (&terminal.phase, &terminal.reason));
        }
    }
    if let Ok(Some(terminal)) = state::decode_terminal(bytes, UID) {
        let _ = state::encode_terminal(UID, &terminal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entry_points_take_good_and_bad_input() {
        let pod = b"apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers:\n  - name: app\n    \
                    image: busybox\n    resources: {limits: {cpu: 1m, memory: 1Ki}}\n";
        manifest(pod);
        manifest(b"\xff\xfe: [");
        expand("$(A) $$(B) $(C\nA=$(A)\nB=x");
        expand("$(A)\nA=$(A)");
        let saved = br#"{"uid":"fuzz-uid","containers":{"app":{"restarts":4294967295,"pid":1,"started_at":null,
            "last":null}},"start_time":null,"terminal":["Failed","Evicted","m"]}"#;
        state_file(saved);
        state_file(b"{}");
        state_file(b"\0\0");
    }
}
