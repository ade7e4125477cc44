//! Builds the CRI messages for a sandbox and a container from nodewarden's specs: the cgroup parent and resources
//! from the placement, the kubelet's labels (so crictl and reconciliation find pods by UID), and the log layout.

use std::collections::HashMap;

use nodewarden_proto::v1::security_profile::ProfileType;
use nodewarden_proto::v1::{
    Capability, ContainerConfig, ContainerMetadata, Int64Value, KeyValue, LinuxContainerConfig,
    LinuxContainerResources, LinuxContainerSecurityContext, LinuxPodSandboxConfig, LinuxSandboxSecurityContext, Mount,
    NamespaceMode, NamespaceOption, PodSandboxConfig, PodSandboxMetadata, SecurityProfile,
};

use super::client::image_spec;
use crate::seam::{ContainerSpec, LinuxResources, SandboxSpec};
use crate::security::{MASKED_PATHS, READONLY_PATHS, Seccomp};

/// The kubelet's label holding the pod name.
pub const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";
/// The kubelet's label holding the pod namespace.
pub const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
/// The kubelet's label holding the pod UID.
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
/// The kubelet's label holding the container name.
pub const CONTAINER_NAME_LABEL: &str = "io.kubernetes.container.name";
/// Marks what nodewarden created: reconciliation never touches sandboxes without it.
pub const MANAGED_LABEL: &str = "nodewarden.io/managed";

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// `LinuxContainerResources` (zero means "not set" in CRI). Memory QoS' values go in `unified`, as the kubelet
/// passes them.
pub fn linux_resources(r: &LinuxResources, oom_score_adj: i32) -> LinuxContainerResources {
    let mut unified = HashMap::new();
    if let Some(min) = r.memory_min {
        unified.insert("memory.min".to_owned(), min.to_string());
    }
    if let Some(high) = r.memory_high {
        unified.insert("memory.high".to_owned(), high.to_string());
    }
    LinuxContainerResources {
        cpu_period: i64_of(r.cpu_period),
        cpu_quota: r.cpu_quota.map_or(0, i64_of),
        cpu_shares: i64_of(r.cpu_shares),
        memory_limit_in_bytes: r.memory_limit.map_or(0, i64_of),
        oom_score_adj: i64::from(oom_score_adj),
        unified,
        ..LinuxContainerResources::default()
    }
}

fn namespaces(spec: &SandboxSpec) -> NamespaceOption {
    let mode = |host: bool, own: NamespaceMode| if host { NamespaceMode::Node } else { own };
    NamespaceOption {
        network: mode(spec.host_network, NamespaceMode::Pod).into(),
        // As the kubelet: each container has its own PID namespace unless the pod shares the host's.
        pid: mode(spec.host_pid, NamespaceMode::Container).into(),
        ipc: mode(spec.host_ipc, NamespaceMode::Pod).into(),
        target_id: String::new(),
    }
}

/// The default `nodewarden.rootDir`, whose daemon marks its sandboxes [`MANAGED_LABEL`]`=true`, as every
/// version before the mark named the instance.
pub const DEFAULT_ROOT_DIR: &str = "/var/lib/nodewarden";

/// The value of [`MANAGED_LABEL`] that names the daemon with `root_dir`: `true` for the default rootDir, else
/// `root-` and a hash of the path, so that two daemons with two rootDirs on one runtime never take (or remove) each
/// other's sandboxes. The hash is FNV-1a, which is fixed: the same path gives the same mark in every version.
pub fn managed_value(root_dir: &std::path::Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    if root_dir == std::path::Path::new(DEFAULT_ROOT_DIR) {
        return "true".to_owned();
    }
    let hash = root_dir
        .as_os_str()
        .as_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3));
    format!("root-{hash:016x}")
}

/// The labels that identify a pod's sandbox and containers: the kubelet's, and nodewarden's mark.
fn kubelet_labels(spec: &SandboxSpec) -> HashMap<String, String> {
    HashMap::from([
        (POD_NAME_LABEL.to_owned(), spec.name.clone()),
        (POD_NAMESPACE_LABEL.to_owned(), spec.namespace.clone()),
        (POD_UID_LABEL.to_owned(), spec.pod_uid.clone()),
        (MANAGED_LABEL.to_owned(), "true".to_owned()),
    ])
}

/// The sandbox's labels: the pod's own, then [`kubelet_labels`] (which win).
fn pod_labels(spec: &SandboxSpec) -> HashMap<String, String> {
    let mut labels: HashMap<String, String> = spec.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    labels.extend(kubelet_labels(spec));
    labels
}

/// The sandbox of a pod, the `attempt`-th for its UID.
pub fn sandbox_config(spec: &SandboxSpec, attempt: u32) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: spec.name.clone(),
            uid: spec.pod_uid.clone(),
            namespace: spec.namespace.clone(),
            attempt,
        }),
        // With the node's network namespace the sandbox has the node's hostname.
        hostname: if spec.host_network { String::new() } else { spec.hostname.clone() },
        log_directory: spec.log_directory.to_string_lossy().into_owned(),
        labels: pod_labels(spec),
        annotations: spec.annotations.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: spec.cgroup_parent.as_str().to_owned(),
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(namespaces(spec)),
                privileged: spec.privileged,
                ..LinuxSandboxSecurityContext::default()
            }),
            resources: Some(linux_resources(&spec.resources, 0)),
            sysctls: spec.sysctls.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            ..LinuxPodSandboxConfig::default()
        }),
        ..PodSandboxConfig::default()
    }
}

/// The container's security settings as the kubelet passes them: `procMount: Default` (and not privileged) masks
/// the kubelet's paths; no `seccompProfile` is `Unconfined`.
fn security_context(spec: &ContainerSpec, pod: &SandboxSpec) -> LinuxContainerSecurityContext {
    let s = &spec.security;
    let id = |v: Option<u32>| v.map(|v| Int64Value { value: i64::from(v) });
    let owned = |paths: &[&str]| paths.iter().map(|p| (*p).to_owned()).collect::<Vec<_>>();
    let masked = !s.unmasked_proc && !s.privileged;
    let (profile_type, localhost_ref) = match &s.seccomp {
        Seccomp::Unconfined => (ProfileType::Unconfined, String::new()),
        Seccomp::RuntimeDefault => (ProfileType::RuntimeDefault, String::new()),
        Seccomp::Localhost(path) => (ProfileType::Localhost, path.to_string_lossy().into_owned()),
    };
    LinuxContainerSecurityContext {
        capabilities: Some(Capability {
            add_capabilities: s.add_capabilities.clone(),
            drop_capabilities: s.drop_capabilities.clone(),
        }),
        privileged: s.privileged,
        namespace_options: Some(namespaces(pod)),
        run_as_user: id(spec.user),
        run_as_group: id(spec.group),
        readonly_rootfs: s.read_only_root,
        supplemental_groups: s.supplemental_groups.iter().map(|g| i64::from(*g)).collect(),
        no_new_privs: s.no_new_privs,
        masked_paths: if masked { owned(&MASKED_PATHS) } else { Vec::new() },
        readonly_paths: if masked { owned(&READONLY_PATHS) } else { Vec::new() },
        seccomp: Some(SecurityProfile { profile_type: profile_type.into(), localhost_ref }),
        ..LinuxContainerSecurityContext::default()
    }
}

/// A container of the sandbox `sandbox` (built by [`sandbox_config`] from `pod`).
pub fn container_config(spec: &ContainerSpec, pod: &SandboxSpec) -> ContainerConfig {
    let log_path = spec
        .log_path
        .strip_prefix(&pod.log_directory)
        .map_or_else(|_| format!("{}/{}.log", spec.name, spec.attempt), |p| p.to_string_lossy().into_owned());
    let mut labels = kubelet_labels(pod);
    labels.insert(CONTAINER_NAME_LABEL.into(), spec.name.clone());
    ContainerConfig {
        metadata: Some(ContainerMetadata { name: spec.name.clone(), attempt: spec.attempt }),
        image: Some(image_spec(&spec.image)),
        command: spec.command.clone(),
        args: spec.args.clone(),
        working_dir: spec.working_dir.as_ref().map(|w| w.to_string_lossy().into_owned()).unwrap_or_default(),
        envs: spec.env.iter().map(|(k, v)| KeyValue { key: k.clone(), value: v.clone() }).collect(),
        mounts: spec
            .mounts
            .iter()
            .map(|m| Mount {
                container_path: m.target.to_string_lossy().into_owned(),
                host_path: m.source.to_string_lossy().into_owned(),
                readonly: m.read_only,
                ..Mount::default()
            })
            .collect(),
        labels,
        log_path,
        linux: Some(LinuxContainerConfig {
            resources: Some(linux_resources(&spec.resources, spec.oom_score_adj)),
            security_context: Some(security_context(spec, pod)),
        }),
        ..ContainerConfig::default()
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use nodewarden_resources::CgroupPath;

    use super::*;
    use crate::seam::{Mount as SpecMount, PullPolicy};

    fn pod() -> SandboxSpec {
        SandboxSpec {
            pod_uid: "u1".into(),
            name: "web-node".into(),
            namespace: "default".into(),
            cgroup_parent: CgroupPath::parse("/nodewarden/kubepods/burstable/podu1").unwrap(),
            host_network: true,
            host_pid: false,
            host_ipc: false,
            hostname: "web-node".into(),
            log_directory: PathBuf::from("/var/log/pods/default_web-node_u1"),
            labels: [("app".to_owned(), "web".to_owned())].into(),
            annotations: [("kubernetes.io/config.source".to_owned(), "file".to_owned())].into(),
            resources: LinuxResources { cpu_shares: 512, cpu_period: 100_000, ..LinuxResources::default() },
            sysctls: [("net.core.somaxconn".to_owned(), "1024".to_owned())].into(),
            privileged: true,
        }
    }

    #[test]
    fn the_sandbox_sits_at_the_placement_with_the_kubelets_labels() {
        let c = sandbox_config(&pod(), 2);
        let linux = c.linux.unwrap();
        assert_eq!(linux.cgroup_parent, "/nodewarden/kubepods/burstable/podu1");
        assert_eq!(c.metadata.unwrap().attempt, 2);
        assert_eq!(c.labels[POD_UID_LABEL], "u1");
        assert_eq!(c.labels["app"], "web");
        assert_eq!(c.labels[MANAGED_LABEL], "true");
        assert_eq!(c.annotations["kubernetes.io/config.source"], "file");
        let sc = linux.security_context.unwrap();
        assert!(sc.privileged, "the sandbox of a privileged container is privileged");
        let ns = sc.namespace_options.unwrap();
        assert_eq!(ns.network(), NamespaceMode::Node);
        assert_eq!(ns.pid(), NamespaceMode::Container);
        assert_eq!(c.hostname, "", "host network: the node's hostname");
        assert_eq!(linux.sysctls["net.core.somaxconn"], "1024");

        assert_eq!(linux.resources.unwrap().memory_limit_in_bytes, 0, "0 is unlimited in CRI");
    }

    #[test]
    fn a_container_carries_the_placements_limits_and_a_relative_log_path() {
        let spec = ContainerSpec {
            pod_uid: "u1".into(),
            sandbox_id: "sb".into(),
            name: "app".into(),
            attempt: 3,
            image: "localhost/busybox:1".into(),
            pull_policy: PullPolicy::IfNotPresent,
            command: vec!["sh".into(), "-c".into()],
            args: vec!["sleep 1".into()],
            env: vec![("A".into(), "1".into())],
            working_dir: None,
            user: Some(1000),
            group: None,
            cgroup: CgroupPath::parse("/nodewarden/kubepods/burstable/podu1/app").unwrap(),
            oom_score_adj: 968,
            resources: LinuxResources {
                cpu_shares: 256,
                cpu_quota: Some(50_000),
                cpu_period: 100_000,
                memory_limit: Some(64 << 20),
                memory_min: Some(32 << 20),
                memory_high: Some(nodewarden_resources::Limit::Value(60 << 20)),
            },
            log_path: PathBuf::from("/var/log/pods/default_web-node_u1/app/3.log"),
            mounts: vec![SpecMount { source: "/var/lib/x".into(), target: "/data".into(), read_only: true }],
            security: crate::security::Security {
                drop_capabilities: vec!["ALL".into()],
                add_capabilities: vec!["NET_BIND_SERVICE".into()],
                no_new_privs: true,
                read_only_root: true,
                seccomp: Seccomp::RuntimeDefault,
                supplemental_groups: vec![2000],
                ..crate::security::Security::default()
            },
            pull_auths: Vec::new(),
        };
        let c = container_config(&spec, &pod());
        assert_eq!(c.log_path, "app/3.log");
        assert_eq!(c.metadata.unwrap().attempt, 3);
        assert_eq!(c.labels[CONTAINER_NAME_LABEL], "app");
        assert_eq!(c.labels[POD_UID_LABEL], "u1");
        assert!(!c.labels.contains_key("app"), "pod labels stay on the sandbox");
        assert_eq!(c.working_dir, "", "the image's");
        assert_eq!((c.mounts[0].host_path.as_str(), c.mounts[0].readonly), ("/var/lib/x", true));
        let linux = c.linux.unwrap();
        let r = linux.resources.unwrap();
        assert_eq!((r.cpu_shares, r.cpu_quota, r.cpu_period), (256, 50_000, 100_000));
        assert_eq!((r.memory_limit_in_bytes, r.oom_score_adj), (64 << 20, 968));
        assert_eq!(r.unified["memory.min"], (32 << 20).to_string(), "Memory QoS as the kubelet passes it");
        assert_eq!(r.unified["memory.high"], (60 << 20).to_string());
        let sc = linux.security_context.unwrap();
        assert_eq!(sc.run_as_user.map(|u| u.value), Some(1000));
        let caps = sc.capabilities.unwrap();
        assert_eq!(
            (caps.add_capabilities, caps.drop_capabilities),
            (vec!["NET_BIND_SERVICE".into()], vec!["ALL".into()])
        );
        assert!(sc.no_new_privs && sc.readonly_rootfs && !sc.privileged);
        assert_eq!(sc.supplemental_groups, [2000]);
        assert_eq!(sc.seccomp.unwrap().profile_type, i32::from(ProfileType::RuntimeDefault));
        assert!(sc.masked_paths.contains(&"/proc/kcore".to_owned()), "procMount Default masks the kubelet's paths");
        assert!(sc.readonly_paths.contains(&"/proc/sys".to_owned()));
        // Unconfined without a profile, as the kubelet passes it; Unmasked masks nothing.
        let plain = ContainerSpec {
            security: crate::security::Security { unmasked_proc: true, ..crate::security::Security::default() },
            ..spec
        };
        let sc = container_config(&plain, &pod()).linux.unwrap().security_context.unwrap();
        assert_eq!(sc.seccomp.unwrap().profile_type, i32::from(ProfileType::Unconfined));
        assert!(sc.masked_paths.is_empty() && sc.readonly_paths.is_empty());
    }
}
