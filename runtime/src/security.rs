//! A container's `securityContext`, merged with its pod's as the kubelet merges them (the container's field wins),
//! checked, and handed to the runtime. Each runtime honours every field or refuses the container naming the one it
//! cannot: the CRI runtime passes them all in `LinuxContainerSecurityContext`; the process runtime applies what a
//! host process can have (see `process`).

use k8s_openapi::api::core::v1::{Container, Pod, SeccompProfile};

/// `seccompProfile`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seccomp {
    /// `Unconfined`, and the kubelet's default when no profile is given.
    Unconfined,
    /// `RuntimeDefault`.
    RuntimeDefault,
    /// `Localhost`: the profile's file, below [`SECCOMP_ROOT`].
    Localhost(std::path::PathBuf),
}

/// The security settings of one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Security {
    /// `privileged`.
    pub privileged: bool,
    /// `capabilities.add`, as capability names without `CAP_` (or `ALL`).
    pub add_capabilities: Vec<String>,
    /// `capabilities.drop`, the same way.
    pub drop_capabilities: Vec<String>,
    /// `allowPrivilegeEscalation: false`: the process gets `no_new_privs`.
    pub no_new_privs: bool,
    /// `readOnlyRootFilesystem`.
    pub read_only_root: bool,
    /// `seccompProfile`, the container's or else the pod's.
    pub seccomp: Seccomp,
    /// `procMount: Unmasked`.
    pub unmasked_proc: bool,
    /// The pod's `fsGroup`, then its `supplementalGroups`.
    pub supplemental_groups: Vec<u32>,
    /// The pod's `sysctls`, for a runtime without sandboxes to refuse.
    pub sysctls: Vec<(String, String)>,
}

impl Default for Security {
    fn default() -> Self {
        Self {
            privileged: false,
            add_capabilities: Vec::new(),
            drop_capabilities: Vec::new(),
            no_new_privs: false,
            read_only_root: false,
            seccomp: Seccomp::Unconfined,
            unmasked_proc: false,
            supplemental_groups: Vec::new(),
            sysctls: Vec::new(),
        }
    }
}

/// Where `Localhost` seccomp profiles are found: where the kubelet keeps them (`<root-dir>/seccomp` with its default
/// root directory), so profiles an operator installed for the kubelet serve nodewarden too.
pub const SECCOMP_ROOT: &str = "/var/lib/kubelet/seccomp";

/// The paths in `/proc` and `/sys` a container's view masks unless `procMount` is `Unmasked` (the kubelet's list).
pub const MASKED_PATHS: [&str; 11] = [
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// The paths in `/proc` a container sees read-only unless `procMount` is `Unmasked` (the kubelet's list).
pub const READONLY_PATHS: [&str; 5] = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"];

/// A capability name as the CRI takes it: upper case, without `CAP_`; refused when it names no capability.
fn capability(field: &str, name: &str) -> Result<String, String> {
    let upper = name.to_ascii_uppercase();
    let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
    if bare == "ALL" || rustix::thread::CapabilitySet::from_name(bare).is_some() {
        Ok(bare.to_owned())
    } else {
        Err(format!("securityContext.capabilities.{field}: {name:?} is not a Linux capability"))
    }
}

fn seccomp(p: &SeccompProfile, field: &str) -> Result<Seccomp, String> {
    match p.type_.as_str() {
        "Unconfined" => Ok(Seccomp::Unconfined),
        "RuntimeDefault" => Ok(Seccomp::RuntimeDefault),
        "Localhost" => match p.localhost_profile.as_deref().filter(|s| !s.is_empty()) {
            Some(path) if !is_relative_beneath(path) => {
                Err(format!("{field}.localhostProfile {path:?} must be a relative path without '..'"))
            }
            Some(path) => Ok(Seccomp::Localhost(std::path::Path::new(SECCOMP_ROOT).join(path))),
            None => Err(format!("{field}.localhostProfile is required for type Localhost")),
        },
        other => Err(format!("{field}.type {other:?} is not Unconfined, RuntimeDefault or Localhost")),
    }
}

/// True for a relative path without `..`: one that names something beneath the directory it is joined to, as far
/// as its words go (a `subPath`, a `Localhost` seccomp profile). Symbolic links are the opener's to refuse.
pub fn is_relative_beneath(path: &str) -> bool {
    let p = std::path::Path::new(path);
    !p.is_absolute() && p.components().all(|c| c != std::path::Component::ParentDir)
}

/// The pod's `securityContext.sysctls`, by name.
pub fn pod_sysctls(pod: &Pod) -> std::collections::BTreeMap<String, String> {
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    pod_sc.and_then(|s| s.sysctls.as_ref()).into_iter().flatten().map(|s| (s.name.clone(), s.value.clone())).collect()
}

/// Whether container `c` is `privileged`.
pub fn is_privileged(c: &Container) -> bool {
    c.security_context.as_ref().and_then(|s| s.privileged).unwrap_or(false)
}

/// The pod's `securityContext.fsGroup`: the group its volumes are given and its containers run with.
pub fn fs_group(pod: &Pod) -> Result<Option<u32>, String> {
    let group = pod.spec.as_ref().and_then(|s| s.security_context.as_ref()).and_then(|s| s.fs_group);
    group
        .map(|g| u32::try_from(g).map_err(|_| format!("spec.securityContext.fsGroup: {g} is out of range")))
        .transpose()
}

/// The user every container of `pod` runs as, where all of them name the same one (their own `runAsUser`, else
/// the pod's; ephemeral containers count too): the kubelet gives that user the service account token of a
/// projected volume.
pub fn fs_user(pod: &Pod) -> Option<u32> {
    let spec = pod.spec.as_ref()?;
    let pod_user = spec.security_context.as_ref().and_then(|s| s.run_as_user);
    let containers = spec.init_containers.iter().flatten().chain(&spec.containers).map(|c| &c.security_context);
    let ephemeral = spec.ephemeral_containers.iter().flatten().map(|c| &c.security_context);
    let mut users = containers.chain(ephemeral).map(|sc| sc.as_ref().and_then(|s| s.run_as_user).or(pod_user));
    let first = users.next()??;
    let first = u32::try_from(first).ok()?;
    users.all(|u| u.and_then(|u| u32::try_from(u).ok()) == Some(first)).then_some(first)
}

/// The security settings of container `c` of `pod`.
pub fn security(pod: &Pod, c: &Container) -> Result<Security, String> {
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let sc = c.security_context.as_ref();
    let privileged = is_privileged(c);
    let escalation = sc.and_then(|s| s.allow_privilege_escalation);
    if privileged && escalation == Some(false) {
        return Err("securityContext: allowPrivilegeEscalation cannot be false when privileged is true".into());
    }
    let caps = sc.and_then(|s| s.capabilities.as_ref());
    let names = |field: &str, list: Option<&Vec<String>>| -> Result<Vec<String>, String> {
        list.into_iter().flatten().map(|n| capability(field, n)).collect()
    };
    let seccomp = match (sc.and_then(|s| s.seccomp_profile.as_ref()), pod_sc.and_then(|s| s.seccomp_profile.as_ref())) {
        (Some(p), _) => seccomp(p, "securityContext.seccompProfile")?,
        (None, Some(p)) => seccomp(p, "spec.securityContext.seccompProfile")?,
        (None, None) => Seccomp::Unconfined,
    };
    let unmasked_proc = match sc.and_then(|s| s.proc_mount.as_deref()) {
        None | Some("" | "Default") => false,
        Some("Unmasked") => true,
        Some(other) => return Err(format!("securityContext.procMount {other:?} is not Default or Unmasked")),
    };
    // As the kubelet gives them: the `fsGroup` first (the group the pod's volumes are given), then the others.
    let fs_group = fs_group(pod)?;
    let supplemental_groups = fs_group
        .into_iter()
        .map(Ok)
        .chain(pod_sc.and_then(|s| s.supplemental_groups.as_ref()).into_iter().flatten().map(|g| {
            u32::try_from(*g).map_err(|_| format!("spec.securityContext.supplementalGroups: {g} is out of range"))
        }))
        .collect::<Result<_, _>>()?;
    let sysctls = pod_sysctls(pod).into_iter().collect();
    Ok(Security {
        privileged,
        add_capabilities: names("add", caps.and_then(|c| c.add.as_ref()))?,
        drop_capabilities: names("drop", caps.and_then(|c| c.drop.as_ref()))?,
        no_new_privs: escalation == Some(false),
        read_only_root: sc.and_then(|s| s.read_only_root_filesystem).unwrap_or(false),
        seccomp,
        unmasked_proc,
        supplemental_groups,
        sysctls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(container_sc: serde_json::Value, pod_sc: serde_json::Value) -> (Pod, Container) {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"securityContext": pod_sc, "containers": [{"name": "a", "securityContext": container_sc}]}
        }))
        .unwrap();
        let c = pod.spec.as_ref().unwrap().containers[0].clone();
        (pod, c)
    }

    #[test]
    fn merges_the_container_over_the_pod_and_checks_names() {
        let (p, c) = pod(
            serde_json::json!({
                "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                "capabilities": {"add": ["cap_net_admin"], "drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"}
            }),
            serde_json::json!({
                "supplementalGroups": [10, 20], "seccompProfile": {"type": "Unconfined"},
                "sysctls": [{"name": "net.core.somaxconn", "value": "1024"}]
            }),
        );
        let s = security(&p, &c).unwrap();
        assert_eq!(s.add_capabilities, ["NET_ADMIN"]);
        assert_eq!(s.drop_capabilities, ["ALL"]);
        assert!(s.no_new_privs && s.read_only_root && !s.privileged);
        assert_eq!(s.seccomp, Seccomp::RuntimeDefault, "the container's profile wins");
        assert_eq!(s.supplemental_groups, [10, 20]);
        assert_eq!(s.sysctls, [("net.core.somaxconn".to_owned(), "1024".to_owned())]);
        let (p, c) = pod(serde_json::json!({}), serde_json::json!({}));
        assert_eq!(security(&p, &c).unwrap(), Security::default());
        for (sc, want) in [
            (serde_json::json!({"capabilities": {"add": ["FLY"]}}), "capabilities.add"),
            (serde_json::json!({"privileged": true, "allowPrivilegeEscalation": false}), "allowPrivilegeEscalation"),
            (serde_json::json!({"seccompProfile": {"type": "Localhost"}}), "localhostProfile"),
            (serde_json::json!({"procMount": "Weird"}), "procMount"),
        ] {
            let (p, c) = pod(sc, serde_json::json!({}));
            let err = security(&p, &c).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn the_fs_group_comes_first_among_the_groups_and_a_common_user_owns_the_token() {
        let (p, c) = pod(
            serde_json::json!({"runAsUser": 1000}),
            serde_json::json!({"fsGroup": 2000, "supplementalGroups": [10]}),
        );
        assert_eq!(security(&p, &c).unwrap().supplemental_groups, [2000, 10]);
        assert_eq!((fs_group(&p), fs_user(&p)), (Ok(Some(2000)), Some(1000)));
        let (p, _) = pod(serde_json::json!({}), serde_json::json!({"runAsUser": 7, "fsGroup": -1}));
        assert_eq!(fs_user(&p), Some(7), "the pod's user, where the container names none");
        assert!(fs_group(&p).unwrap_err().contains("fsGroup"));
        let (p, _) = pod(serde_json::json!({}), serde_json::json!({}));
        assert_eq!((fs_group(&p), fs_user(&p)), (Ok(None), None));
        // An ephemeral container (kubectl debug) running as another user: no common user.
        let (mut p, _) = pod(serde_json::json!({}), serde_json::json!({"runAsUser": 7}));
        let debug = serde_json::json!([{"name": "debug", "image": "busybox", "securityContext": {"runAsUser": 0}}]);
        p.spec.as_mut().unwrap().ephemeral_containers = Some(serde_json::from_value(debug).unwrap());
        assert_eq!(fs_user(&p), None);
    }
}
