//! Ephemeral-storage limits, enforced as the kubelet's eviction manager does in its `localStorageEviction`,
//! whatever the node's pressure: a pod whose disk-backed `emptyDir` holds more than its `sizeLimit`, whose
//! ephemeral storage (its containers' writable layers and logs, and its disk-backed volumes) exceeds its
//! containers' limits summed, or with a container whose writable layer and logs exceed its own
//! `limits.ephemeral-storage`, is evicted with 1 s of grace and the kubelet's message. Every [`CHECK_PERIOD`], by
//! walking the pods' directories on a blocking thread, never on the eviction thread; the writable layers are the
//! runtime's last measure (see `layers`), none under the process runtime, whose containers write to the node's
//! own file system.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use nodewarden_eviction::{EvictionStatus, LimitEviction};
use nodewarden_resources::parse_non_negative;
use nodewarden_runtime::Runtime;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::disk_usage::du;
use crate::evictor::pod_disk_usage;
use crate::manager::PodManager;
use crate::spec::pod_log_dir_name;
use crate::volumes::volume_dir;

/// How often the limits are checked (the kubelet's eviction monitoring interval).
pub const CHECK_PERIOD: Duration = Duration::from_secs(10);

/// The grace period of an eviction for a limit (the kubelet's `immediateEvictionGracePeriodSeconds`).
pub const GRACE: Duration = Duration::from_secs(1);

/// A limit: bytes, and the quantity as the pod spells it (for the message).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Limit {
    bytes: u64,
    text: String,
}

impl Limit {
    fn parse(text: &str) -> Option<Self> {
        let bytes = parse_non_negative(text).ok()?;
        (bytes > 0).then(|| Limit { bytes, text: text.to_owned() })
    }
}

/// The ephemeral-storage limits of one pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Disk-backed `emptyDir` volumes with a `sizeLimit`, by name.
    empty_dirs: Vec<(String, Limit)>,
    /// The pod's: its app containers' limits summed (sidecars with them), or the largest init container's if
    /// that is more, where any container has one.
    pod: Option<Limit>,
    /// Each container's own, by name.
    containers: Vec<(String, Limit)>,
}

/// What one pod uses, in bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    /// Each disk-backed `emptyDir` with a limit, by name.
    empty_dirs: BTreeMap<String, u64>,
    /// The whole pod: its containers' writable layers and logs, and its volumes on the node's disk.
    pod: u64,
    /// Each container with a limit: its writable layer and its logs.
    containers: BTreeMap<String, u64>,
}

fn ephemeral_limit(c: &Container) -> Option<Limit> {
    let q = c.resources.as_ref()?.limits.as_ref()?.get("ephemeral-storage")?;
    Limit::parse(&q.0)
}

/// The limits of `pod`; `None` when it has none, and nothing of it needs measuring.
pub(crate) fn limits(pod: &Pod) -> Option<Limits> {
    let spec = pod.spec.as_ref()?;
    let empty_dirs: Vec<(String, Limit)> = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| {
            let e = v.empty_dir.as_ref()?;
            if e.medium.as_deref() == Some("Memory") {
                return None;
            }
            Some((v.name.clone(), Limit::parse(&e.size_limit.as_ref()?.0)?))
        })
        .collect();
    let inits = spec.init_containers.iter().flatten();
    let sidecar = |c: &&Container| c.restart_policy.as_deref() == Some("Always");
    let summed = spec.containers.iter().chain(inits.clone().filter(sidecar)).filter_map(ephemeral_limit);
    let (mut bytes, mut any, mut binary) = (0u64, false, true);
    for l in summed {
        if !any {
            binary = l.text.ends_with('i');
        }
        bytes = bytes.saturating_add(l.bytes);
        any = true;
    }
    let biggest_init = inits.filter(|c| !sidecar(c)).filter_map(ephemeral_limit).map(|l| l.bytes).max();
    if let Some(init) = biggest_init {
        bytes = bytes.max(init);
        any = true;
    }
    let pod_limit = any.then(|| Limit { bytes, text: quantity(bytes, binary) });
    let containers: Vec<(String, Limit)> =
        spec.containers.iter().filter_map(|c| Some((c.name.clone(), ephemeral_limit(c)?))).collect();
    let limits = Limits { empty_dirs, pod: pod_limit, containers };
    (limits != Limits::default()).then_some(limits)
}

/// Bytes as a quantity reads in the format of the first limit summed (as a sum of quantities keeps its first
/// one's): binary suffixes (`30Mi`) or decimal ones (`2G`); plain bytes where no suffix divides them.
fn quantity(bytes: u64, binary: bool) -> String {
    if binary {
        for (shift, suffix) in [(60, "Ei"), (50, "Pi"), (40, "Ti"), (30, "Gi"), (20, "Mi"), (10, "Ki")] {
            if bytes != 0 && bytes.trailing_zeros() >= shift {
                return format!("{}{suffix}", bytes >> shift);
            }
        }
    } else {
        for (power, suffix) in [(18, "E"), (15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k")] {
            let unit = 10u64.pow(power);
            if bytes != 0 && bytes.is_multiple_of(unit) {
                return format!("{}{suffix}", bytes / unit);
            }
        }
    }
    bytes.to_string()
}

/// Measures what `limits` needs of pod `uid` (`pod`), walking its directories below `root` (the pods' volumes)
/// and `log_root` (their logs), with its containers' writable layers (`layers`, by container name).
pub(crate) fn measure(
    root: &Path,
    log_root: &Path,
    pod: &Pod,
    uid: &str,
    limits: &Limits,
    layers: &BTreeMap<String, u64>,
) -> Usage {
    let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    let empty_dirs = volumes
        .filter(|v| limits.empty_dirs.iter().any(|(name, _)| *name == v.name))
        .map(|v| (v.name.clone(), du(&volume_dir(root, uid, v))))
        .collect();
    let logs = log_root.join(pod_log_dir_name(pod));
    let layer = |name: &str| layers.get(name).copied().unwrap_or(0);
    let containers = limits
        .containers
        .iter()
        .map(|(name, _)| (name.clone(), du(&logs.join(name)).saturating_add(layer(name))))
        .collect();
    let all_layers = crate::layers::total(layers);
    let pod_usage = if limits.pod.is_some() {
        pod_disk_usage(root, log_root, uid, Some(pod)).bytes.saturating_add(all_layers)
    } else {
        0
    };
    Usage { empty_dirs, pod: pod_usage, containers }
}

/// A limit exceeded: the kubelet's name for it in `kubelet_evictions{eviction_signal}`, the bytes used and the
/// limit, and its eviction message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Exceeded {
    /// `emptydirfs.limit`, `ephemeralpodfs.limit` or `ephemeralcontainerfs.limit`.
    pub signal: &'static str,
    /// The bytes used.
    pub used: u64,
    /// The limit, in bytes.
    pub limit: u64,
    /// The message of the pod's status and its `Evicted` event.
    pub message: String,
}

/// The first limit `usage` exceeds, in the kubelet's order: an `emptyDir`, the pod, a container.
pub(crate) fn exceeded(limits: &Limits, usage: &Usage) -> Option<Exceeded> {
    let over = |signal, used, limit: &Limit, message| Some(Exceeded { signal, used, limit: limit.bytes, message });
    for (name, limit) in &limits.empty_dirs {
        if let Some(used) = usage.empty_dirs.get(name).copied().filter(|used| *used > limit.bytes) {
            return over(
                "emptydirfs.limit",
                used,
                limit,
                format!("Usage of EmptyDir volume {name:?} exceeds the limit {:?}. ", limit.text),
            );
        }
    }
    if let Some(limit) = &limits.pod
        && usage.pod > limit.bytes
    {
        return over(
            "ephemeralpodfs.limit",
            usage.pod,
            limit,
            format!("Pod ephemeral local storage usage exceeds the total limit of containers {}. ", limit.text),
        );
    }
    for (name, limit) in &limits.containers {
        if let Some(used) = usage.containers.get(name).copied().filter(|used| *used > limit.bytes) {
            return over(
                "ephemeralcontainerfs.limit",
                used,
                limit,
                format!("Container {name} exceeded its local ephemeral storage limit {:?}. ", limit.text),
            );
        }
    }
    None
}

/// Checks every running pod's limits each [`CHECK_PERIOD`] until `shutdown`, evicting those over one, counting
/// each in `evictions` (the kubelet's `kubelet_evictions`) by the limit's name and recording it in `status` (for
/// `/evictions`) beside the eviction loop's, followed on `tasks`. As the kubelet's, such an eviction sets no
/// `DisruptionTarget` condition: the pod broke its own limit.
pub async fn enforce_local_storage<R: Runtime>(
    manager: Arc<PodManager<R>>,
    evictions: prometheus::IntCounterVec,
    status: Arc<EvictionStatus>,
    tasks: TaskTracker,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(CHECK_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let m = manager.clone();
        let over = match tokio::task::spawn_blocking(move || m.over_local_storage_limits()).await {
            Ok(over) => over,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => return,
        };
        for (uid, name, Exceeded { signal, used, limit, message }) in over {
            let decided = (tokio::time::Instant::now(), jiff::Timestamp::now());
            match manager.evict_for_limit(&uid, GRACE, message.clone()) {
                Ok(eviction) => {
                    evictions.with_label_values(&[signal]).inc();
                    tracing::info!(pod = %name, pod_uid = %uid, %message, "evicted a pod over its ephemeral-storage limit");
                    let e = LimitEviction { pod: name, uid, signal, used, limit, grace: GRACE, message, decided };
                    let (status, stop) = (status.clone(), shutdown.clone());
                    tasks.spawn(async move { stop.run_until_cancelled(status.follow_limit(e, eviction)).await });
                }
                Err(e) => {
                    tracing::warn!(pod = %name, pod_uid = %uid, error = %e, "cannot evict a pod over its ephemeral-storage limit")
                }
            }
        }
    }
}

impl<R: Runtime> PodManager<R> {
    /// The running pods over one of their ephemeral-storage limits, but critical ones: UID, name, the limit.
    fn over_local_storage_limits(&self) -> Vec<(String, String, Exceeded)> {
        let settings = self.settings();
        let mut out = Vec::new();
        for candidate in self.ledger_view().eviction_candidates() {
            let uid = &candidate.placement.uid;
            if candidate.critical {
                continue;
            }
            let Some(pod) = self.store().get(uid) else { continue };
            let Some(limits) = limits(&pod) else { continue };
            let layers = self.writable_layers().of_pod(uid);
            let usage = measure(&settings.root_dir, &settings.log_dir, &pod, uid, &limits, &layers);
            if let Some(over) = exceeded(&limits, &usage) {
                out.push((uid.clone(), nodewarden_resources::pod::full_name(&pod), over));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volumes::pod_dir;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}, "spec": spec}),
        )
        .unwrap()
    }

    fn with_limit(name: &str, limit: Option<&str>) -> serde_json::Value {
        let mut c = serde_json::json!({"name": name, "image": "busybox"});
        if let Some(l) = limit {
            c["resources"] = serde_json::json!({"limits": {"ephemeral-storage": l}});
        }
        c
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn limits_are_read_as_the_kubelet_sums_them() {
        assert_eq!(limits(&pod(serde_json::json!({"containers": [with_limit("a", None)]}))), None);
        let p = pod(serde_json::json!({
            "containers": [with_limit("a", Some("10Mi")), with_limit("b", Some("20Mi")), with_limit("c", None)],
            "initContainers": [with_limit("setup", Some("50Mi"))],
            "volumes": [
                {"name": "scratch", "emptyDir": {"sizeLimit": "5Mi"}},
                {"name": "ram", "emptyDir": {"medium": "Memory", "sizeLimit": "5Mi"}},
                {"name": "free", "emptyDir": {}},
            ],
        }));
        let l = limits(&p).unwrap();
        assert_eq!(l.empty_dirs.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["scratch"], "disk-backed only");
        assert_eq!(l.pod, Some(Limit { bytes: 50 * MIB, text: "50Mi".into() }), "the larger of 30Mi summed and 50Mi");
        assert_eq!(l.containers.len(), 2);
        assert_eq!(quantity(1536 * 1024, true), "1536Ki");
        assert_eq!(quantity(2_000_000_000, false), "2G");
        assert_eq!(quantity(1001, false), "1001");
    }

    #[test]
    fn the_first_limit_exceeded_gives_the_kubelets_message() {
        let p = pod(serde_json::json!({
            "containers": [with_limit("app", Some("10Mi")), with_limit("side", Some("10Mi"))],
            "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "5Mi"}}],
        }));
        let l = limits(&p).unwrap();
        let usage = |scratch: u64, total: u64, app: u64| Usage {
            empty_dirs: [("scratch".to_owned(), scratch)].into(),
            pod: total,
            containers: [("app".to_owned(), app), ("side".to_owned(), 0)].into(),
        };
        assert_eq!(exceeded(&l, &usage(5 * MIB, 20 * MIB, 10 * MIB)), None, "at a limit is not over it");
        let said = |u: Usage| exceeded(&l, &u).map(|e| (e.signal, e.message)).unwrap();
        assert_eq!(
            said(usage(5 * MIB + 1, 30 * MIB, 11 * MIB)),
            ("emptydirfs.limit", "Usage of EmptyDir volume \"scratch\" exceeds the limit \"5Mi\". ".to_owned())
        );
        assert_eq!(
            said(usage(0, 20 * MIB + 1, 11 * MIB)),
            (
                "ephemeralpodfs.limit",
                "Pod ephemeral local storage usage exceeds the total limit of containers 20Mi. ".to_owned()
            )
        );
        assert_eq!(
            said(usage(0, 0, 10 * MIB + 1)),
            (
                "ephemeralcontainerfs.limit",
                "Container app exceeded its local ephemeral storage limit \"10Mi\". ".to_owned()
            )
        );
    }

    #[test]
    fn usage_is_measured_in_the_pods_own_directories() {
        let dir = tempfile::tempdir().unwrap();
        let (root, logs) = (dir.path().join("root"), dir.path().join("logs"));
        let p = pod(serde_json::json!({
            "containers": [with_limit("app", Some("10Mi"))],
            "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "5Mi"}}],
        }));
        let scratch = pod_dir(&root, "u1").join("volumes/kubernetes.io~empty-dir/scratch");
        std::fs::create_dir_all(&scratch).unwrap();
        std::fs::write(scratch.join("data"), vec![1u8; 3 << 20]).unwrap();
        let app_logs = logs.join(pod_log_dir_name(&p)).join("app");
        std::fs::create_dir_all(&app_logs).unwrap();
        std::fs::write(app_logs.join("0.log"), vec![b'x'; 1 << 20]).unwrap();
        let l = limits(&p).unwrap();
        let u = measure(&root, &logs, &p, "u1", &l, &BTreeMap::new());
        assert!(u.empty_dirs["scratch"] >= 3 * MIB, "{u:?}");
        assert!(u.containers["app"] >= MIB && u.containers["app"] < 2 * MIB, "{u:?}");
        assert!(u.pod >= 4 * MIB && u.pod < 5 * MIB, "{u:?}");
        // Under CRI, what the container wrote to its root file system counts for it and for the pod.
        let layers = BTreeMap::from([("app".to_owned(), 8 * MIB), ("other".to_owned(), 2 * MIB)]);
        let u = measure(&root, &logs, &p, "u1", &l, &layers);
        assert!(u.containers["app"] >= 9 * MIB && u.containers["app"] < 10 * MIB, "{u:?}");
        assert!(u.pod >= 14 * MIB && u.pod < 15 * MIB, "{u:?}");
        let over = exceeded(&l, &u).unwrap().message;
        assert_eq!(over, "Pod ephemeral local storage usage exceeds the total limit of containers 10Mi. ");
    }
}
