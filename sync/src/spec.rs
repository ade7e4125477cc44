//! Turns a pod's container into what a runtime starts: the command with `$(VAR)` references expanded, the
//! environment (values and the downward API's pod fields), the user, the volume mounts and the log path, laid out
//! as the kubelet lays out `/var/log/pods`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod};
use nodewarden_resources::{ContainerPlacement, Placement, Resources};

use crate::objects::ObjectMap;

use crate::volumes::PreparedVolume;
use nodewarden_runtime::{ContainerSpec, LinuxResources, Mount, PullPolicy, SandboxSpec};

/// The directory of one container's logs: `<logDir>/<namespace>_<name>_<uid>/<container>`.
pub fn log_dir(root: &Path, pod: &Pod, container: &str) -> PathBuf {
    root.join(pod_log_dir_name(pod)).join(container)
}

/// `<namespace>_<name>_<uid>`.
pub fn pod_log_dir_name(pod: &Pod) -> String {
    let m = &pod.metadata;
    format!(
        "{}_{}_{}",
        nodewarden_resources::pod::namespace(pod),
        m.name.as_deref().unwrap_or_default(),
        m.uid.as_deref().unwrap_or_default()
    )
}

/// Expands `$(NAME)` from `vars`; `$$` escapes a `$`; unknown references are kept as written, as Kubernetes does.
pub fn expand(s: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match vars.get(name) {
                Some(v) => out.push_str(v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The addresses the downward API gives a container: the pod's (`status.podIP`, `status.podIPs`) and the
/// node's (`status.hostIP`, `status.hostIPs`), the primary first.
#[derive(Debug, Clone, Copy, Default)]
pub struct PodIps<'a> {
    /// The pod's.
    pub pod: &'a [String],
    /// The node's.
    pub host: &'a [String],
}

/// The pod-level inputs of a container's spec.
#[derive(Debug, Clone, Copy)]
pub struct PodContext<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// Its prepared volumes.
    pub volumes: &'a [PreparedVolume],
    /// `podLogsDir`.
    pub log_root: &'a Path,
    /// Its addresses.
    pub ips: PodIps<'a>,
    /// The node's allocatable: a `resourceFieldRef` to a limit the container does not set reads it.
    pub node: &'a Resources,
    /// The ConfigMaps and Secrets its environment reads, fetched; `None` for a container adopted from an earlier
    /// daemon, whose environment leaves them out.
    pub objects: Option<&'a ObjectMap>,
    /// The variables of the cluster's Services, first in the environment.
    pub services: &'a [(String, String)],
}

/// A `fieldRef` of the environment: the pod's metadata, its node and service account, its and the node's IPs.
pub(crate) fn field_ref(pod: &Pod, path: &str, ips: PodIps<'_>) -> Result<String, String> {
    let spec = pod.spec.as_ref();
    Ok(match path {
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()).unwrap_or_default(),
        "status.podIP" => ips.pod.first().cloned().unwrap_or_default(),
        "status.podIPs" => ips.pod.join(","),
        "status.hostIP" => ips.host.first().cloned().unwrap_or_default(),
        "status.hostIPs" => ips.host.join(","),
        other => crate::projection::metadata_field(pod, other)
            .ok_or_else(|| format!("fieldRef {other:?} is not supported"))?,
    })
}

/// Builds a container's runtime spec. Errors are the kubelet's `CreateContainerConfigError` messages.
pub fn container_spec(
    ctx: &PodContext<'_>,
    c: &Container,
    placement: &ContainerPlacement,
    attempt: u32,
    stage: &mut dyn FnMut(&PreparedVolume, &str, usize) -> Result<PathBuf, String>,
) -> Result<ContainerSpec, String> {
    let PodContext { pod, volumes, log_root, ips, node, objects, services } = *ctx;
    let spec = pod.spec.as_ref().ok_or("pod has no spec")?;
    let crate::env::Env { vars: env, skipped } = crate::env::container_env(pod, c, ips, node, objects, services)?;
    if !skipped.is_empty() {
        tracing::warn!(
            pod = %nodewarden_resources::pod::full_name(pod), container = %c.name, keys = ?skipped,
            "envFrom keys skipped: they are not valid environment variable names"
        );
    }
    let vars: BTreeMap<String, String> = env.iter().cloned().collect();
    let command: Vec<String> = c.command.iter().flatten().map(|a| expand(a, &vars)).collect();
    let args: Vec<String> = c.args.iter().flatten().map(|a| expand(a, &vars)).collect();
    let pod_sc = spec.security_context.as_ref();
    let sc = c.security_context.as_ref();
    let as_u32 = |v: Option<i64>, what: &str| -> Result<Option<u32>, String> {
        v.map(|v| u32::try_from(v).map_err(|_| format!("{what} {v} is out of range"))).transpose()
    };
    let user = as_u32(sc.and_then(|s| s.run_as_user).or(pod_sc.and_then(|s| s.run_as_user)), "runAsUser")?;
    let group = as_u32(sc.and_then(|s| s.run_as_group).or(pod_sc.and_then(|s| s.run_as_group)), "runAsGroup")?;
    let non_root = sc.and_then(|s| s.run_as_non_root).or(pod_sc.and_then(|s| s.run_as_non_root)).unwrap_or(false);
    if non_root && user.is_none_or(|u| u == 0) {
        return Err("container has runAsNonRoot and would run as root (set runAsUser)".into());
    }
    let mut mounts = Vec::new();
    for (index, m) in c.volume_mounts.iter().flatten().enumerate() {
        let v = volumes.iter().find(|v| v.name == m.name).ok_or_else(|| format!("volume {} is not ready", m.name))?;
        let sub_path = m.sub_path.as_deref().filter(|s| !s.is_empty());
        let sub_path_expr = m.sub_path_expr.as_deref().filter(|s| !s.is_empty());
        // subPathExpr takes the container's environment, $(VAR) only, as the kubelet expands it.
        let sub = match (sub_path, sub_path_expr) {
            (Some(_), Some(_)) => {
                return Err(format!("volumeMount {}: subPath and subPathExpr are mutually exclusive", m.mount_path));
            }
            (Some(s), None) => Some(s.to_owned()),
            (None, Some(e)) => Some(expand(e, &vars)),
            (None, None) => None,
        };
        let source = match sub {
            Some(sub) => {
                crate::subpath::check(&sub)?;
                stage(v, &sub, index)?
            }
            None => v.path.clone(),
        };
        mounts.push(Mount { source, target: PathBuf::from(&m.mount_path), read_only: m.read_only.unwrap_or(false) });
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let image = c.image.clone().unwrap_or_default();
    let limits = &placement.limits;
    Ok(ContainerSpec {
        log_path: log_dir(log_root, pod, &c.name).join(format!("{attempt}.log")),
        pod_uid: uid,
        sandbox_id: String::new(),
        name: c.name.clone(),
        attempt,
        pull_policy: PullPolicy::resolve(c.image_pull_policy.as_deref(), &image),
        image,
        command,
        args,
        env,
        working_dir: c.working_dir.as_deref().filter(|w| !w.is_empty()).map(PathBuf::from),
        user,
        group,
        cgroup: placement.cgroup.clone(),
        oom_score_adj: placement.oom_score_adj,
        resources: LinuxResources {
            cpu_shares: placement.cpu_shares,
            cpu_quota: limits.cpu_max.quota,
            cpu_period: limits.cpu_max.period,
            memory_limit: limits.memory_max.value(),
            memory_min: limits.memory_min,
            memory_high: limits.memory_high,
        },
        mounts,
        security: nodewarden_runtime::security::security(pod, c)?,
        pull_auths: Vec::new(),
    })
}

/// Builds a pod's sandbox spec: its cgroup is the placement's, its resources the pod-level limits.
pub fn sandbox_spec(pod: &Pod, placement: &Placement, log_root: &Path) -> SandboxSpec {
    let m = &pod.metadata;
    let spec = pod.spec.as_ref();
    let flag = |f: fn(&k8s_openapi::api::core::v1::PodSpec) -> Option<bool>| spec.and_then(f).unwrap_or(false);
    let name = m.name.clone().unwrap_or_default();
    let limits = &placement.limits;
    SandboxSpec {
        pod_uid: m.uid.clone().unwrap_or_default(),
        hostname: spec.and_then(|s| s.hostname.clone()).unwrap_or_else(|| name.clone()),
        name,
        namespace: nodewarden_resources::pod::namespace(pod).to_owned(),
        cgroup_parent: placement.cgroup.clone(),
        host_network: flag(|s| s.host_network),
        host_pid: flag(|s| s.host_pid),
        host_ipc: flag(|s| s.host_ipc),
        log_directory: log_root.join(pod_log_dir_name(pod)),
        labels: m.labels.clone().unwrap_or_default(),
        annotations: m.annotations.clone().unwrap_or_default(),
        resources: LinuxResources {
            cpu_shares: nodewarden_resources::cpu_shares(placement.cpu_request),
            cpu_quota: limits.cpu_max.quota,
            cpu_period: limits.cpu_max.period,
            memory_limit: limits.memory_max.value(),
            memory_min: None,
            memory_high: None,
        },
        privileged: spec.is_some_and(|s| {
            s.init_containers.iter().flatten().chain(&s.containers).any(nodewarden_runtime::security::is_privileged)
        }),
        sysctls: nodewarden_runtime::security::pod_sysctls(pod),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_references_like_kubernetes() {
        let vars: BTreeMap<String, String> = [("A".to_owned(), "1".to_owned())].into();
        assert_eq!(expand("x$(A)y", &vars), "x1y");
        assert_eq!(expand("$(B)", &vars), "$(B)");
        assert_eq!(expand("$$(A)", &vars), "$(A)");
        assert_eq!(expand("cost $5 $(A", &vars), "cost $5 $(A");
    }

    #[test]
    fn builds_a_container_spec() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-n", "namespace": "default", "uid": "u1"},
            "spec": {
                "securityContext": {"runAsUser": 1000},
                "containers": [{
                    "name": "app", "image": "busybox",
                    "command": ["sh", "-c"], "args": ["echo $(GREETING) $(POD)"],
                    "env": [
                        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "GREETING", "value": "hi-$(POD)"},
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {"name": "HOST_IPS", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIPs"}}}
                    ],
                    "securityContext": {"runAsGroup": 1000},
                    "volumeMounts": [
                        {"name": "data", "mountPath": "/mnt", "readOnly": true},
                        {"name": "data", "mountPath": "/logs", "subPathExpr": "logs/$(POD)"}
                    ]
                }]
            }
        }))
        .unwrap();
        let c = &pod.spec.as_ref().unwrap().containers[0];
        let placement = ContainerPlacement {
            name: "app".into(),
            cgroup: nodewarden_resources::CgroupPath::parse("/kubepods/podu1/app").unwrap(),
            limits: nodewarden_resources::CgroupLimits {
                memory_max: nodewarden_resources::Limit::Max,
                memory_min: None,
                memory_high: None,
                pids_max: nodewarden_resources::Limit::Max,
                cpu_weight: 100,
                cpu_max: nodewarden_resources::CpuMax { quota: None, period: 100_000 },
            },
            cpu_shares: 2,
            oom_score_adj: 1000,
        };
        let vols = [PreparedVolume { name: "data".into(), path: "/var/lib/x".into(), projected: false }];
        let mut staged = Vec::new();
        let mut stage = |v: &PreparedVolume, sub: &str, i: usize| {
            staged.push((v.name.clone(), sub.to_owned(), i));
            Ok(PathBuf::from("/staged"))
        };
        let (pod_ips, host_ips) = (["10.88.0.7".to_owned()], ["192.0.2.10".to_owned()]);
        let ips = PodIps { pod: &pod_ips, host: &host_ips };
        let (node, objects) = (Resources::default(), ObjectMap::new());
        let ctx = PodContext {
            pod: &pod,
            volumes: &vols,
            log_root: Path::new("/var/log/pods"),
            ips,
            node: &node,
            objects: Some(&objects),
            services: &[],
        };
        let s = container_spec(&ctx, c, &placement, 2, &mut stage).unwrap();
        assert_eq!(s.argv(), ["sh", "-c", "echo hi-web-n web-n"]);
        let env = |k: &str| s.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!((env("POD_IP"), env("HOST_IPS")), (Some("10.88.0.7"), Some("192.0.2.10")), "the downward API");
        assert_eq!(s.pull_policy, PullPolicy::Always, "an untagged image is pulled every time");
        assert_eq!(s.log_path, Path::new("/var/log/pods/default_web-n_u1/app/2.log"));
        assert_eq!((s.user, s.group), (Some(1000), Some(1000)));
        assert_eq!(
            s.mounts,
            [
                Mount { source: "/var/lib/x".into(), target: "/mnt".into(), read_only: true },
                Mount { source: "/staged".into(), target: "/logs".into(), read_only: false },
            ]
        );
        // subPathExpr is expanded from the container's environment, then staged like a subPath.
        assert_eq!(staged, [("data".to_owned(), "logs/web-n".to_owned(), 1)]);
        // Both at once, or an expansion that climbs out, are refused.
        let mut bad = pod.clone();
        let mounts = bad.spec.as_mut().unwrap().containers[0].volume_mounts.as_mut().unwrap();
        mounts[1].sub_path = Some("x".into());
        let c = &bad.spec.as_ref().unwrap().containers[0];
        let mut never = |_: &PreparedVolume, _: &str, _: usize| -> Result<PathBuf, String> { panic!("staged") };
        let ctx = PodContext { pod: &bad, log_root: Path::new("/l"), ips: PodIps::default(), ..ctx };
        let err = container_spec(&ctx, c, &placement, 0, &mut never).unwrap_err();
        assert!(err.contains("mutually exclusive"), "{err}");
        let mut bad = pod.clone();
        let mounts = bad.spec.as_mut().unwrap().containers[0].volume_mounts.as_mut().unwrap();
        mounts[1].sub_path_expr = Some("../$(POD)".into());
        let c = &bad.spec.as_ref().unwrap().containers[0];
        let ctx = PodContext { pod: &bad, log_root: Path::new("/l"), ips: PodIps::default(), ..ctx };
        let err = container_spec(&ctx, c, &placement, 0, &mut never).unwrap_err();
        assert!(err.contains("without '..'"), "{err}");
        assert_eq!(s.working_dir, None, "the image's working directory");
    }

    #[test]
    fn pull_policy_defaults_follow_the_tag() {
        assert_eq!(PullPolicy::resolve(None, "busybox"), PullPolicy::Always);
        assert_eq!(PullPolicy::resolve(None, "localhost:5000/busybox"), PullPolicy::Always);
        assert_eq!(PullPolicy::resolve(None, "busybox:latest"), PullPolicy::Always);
        assert_eq!(PullPolicy::resolve(None, "localhost:5000/busybox:1"), PullPolicy::IfNotPresent);
        assert_eq!(PullPolicy::resolve(None, "busybox@sha256:0123"), PullPolicy::IfNotPresent);
        assert_eq!(PullPolicy::resolve(Some("Never"), "busybox"), PullPolicy::Never);
        assert_eq!(PullPolicy::resolve(Some("IfNotPresent"), "busybox:latest"), PullPolicy::IfNotPresent);
    }
}
