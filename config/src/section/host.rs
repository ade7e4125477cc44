//! The host section: what the daemon checks and sets on the host at start, and its own place there, from
//! `maxOpenFiles`, `protectKernelDefaults`, `failSwapOn`, `memorySwap` and nodewarden's `cgroupMount`,
//! `nodefsPath`, `imagefsPath`, `daemonCgroup` and `daemonMemoryMin`.

use std::path::PathBuf;

use nodewarden_resources::parse_non_negative;

use super::{nodewarden, required};
use crate::{ConfigError, KubeletConfiguration, raw};

/// The host section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostConfig {
    /// The cgroup2 mount.
    pub cgroup_mount: PathBuf,
    /// A path on nodefs.
    pub nodefs_path: PathBuf,
    /// A path on imagefs.
    pub imagefs_path: PathBuf,
    /// The daemon's own cgroup below `cgroupRoot`, if any (`nodewarden.daemonCgroup`).
    pub daemon_cgroup: Option<String>,
    /// The daemon cgroup's `memory.min` in bytes (`nodewarden.daemonMemoryMin`).
    pub daemon_memory_min: u64,
    /// `maxOpenFiles`: the open-file limit the daemon raises itself to at start (`RLIMIT_NOFILE`).
    pub max_open_files: u64,
    /// `protectKernelDefaults`: refuse to start on kernel tunables that differ from the kubelet's, instead of
    /// setting them.
    pub protect_kernel_defaults: bool,
    /// `failSwapOn`: refuse to start on a node with swap on.
    pub fail_swap_on: bool,
}

impl HostConfig {
    /// The host section; `LimitedSwap` is accepted and warned about.
    pub fn validate(c: &KubeletConfiguration, warnings: &mut Vec<String>) -> Result<Self, ConfigError> {
        let max_open_files = match *required(&c.max_open_files, "maxOpenFiles")? {
            n if n > 0 => u64::try_from(n).unwrap_or(u64::MAX),
            n => return Err(ConfigError::field("maxOpenFiles", format!("{n} is not a positive number of files"))),
        };
        swap_behavior(c, warnings)?;
        let nw = nodewarden(c)?;
        let daemon_cgroup = required(&nw.daemon_cgroup, "nodewarden.daemonCgroup")?;
        if !daemon_cgroup.is_empty() {
            nodewarden_resources::validate_container_name(daemon_cgroup)
                .map_err(|e| ConfigError::field("nodewarden.daemonCgroup", e.to_string()))?;
            if daemon_cgroup == "kubepods" {
                return Err(ConfigError::field("nodewarden.daemonCgroup", "must not be the kubepods cgroup"));
            }
        }
        let daemon_memory_min = parse_non_negative(required(&nw.daemon_memory_min, "nodewarden.daemonMemoryMin")?)
            .map_err(|e| ConfigError::field("nodewarden.daemonMemoryMin", e.to_string()))?;
        Ok(HostConfig {
            cgroup_mount: PathBuf::from(required(&nw.cgroup_mount, "nodewarden.cgroupMount")?),
            nodefs_path: PathBuf::from(required(&nw.nodefs_path, "nodewarden.nodefsPath")?),
            imagefs_path: PathBuf::from(required(&nw.imagefs_path, "nodewarden.imagefsPath")?),
            daemon_cgroup: (!daemon_cgroup.is_empty()).then(|| daemon_cgroup.clone()),
            daemon_memory_min,
            max_open_files,
            protect_kernel_defaults: *required(&c.protect_kernel_defaults, "protectKernelDefaults")?,
            fail_swap_on: *required(&c.fail_swap_on, "failSwapOn")?,
        })
    }
}

/// `memorySwap.swapBehavior`: `NoSwap`, or `LimitedSwap`, which nodewarden runs as `NoSwap` and warns about.
fn swap_behavior(c: &KubeletConfiguration, warnings: &mut Vec<String>) -> Result<(), ConfigError> {
    match required(&c.memory_swap, "memorySwap")?.swap_behavior.as_deref().unwrap_or(raw::NO_SWAP) {
        raw::NO_SWAP => Ok(()),
        "LimitedSwap" => {
            warnings.push(
                "memorySwap.swapBehavior: LimitedSwap is not implemented; pods get memory.swap.max 0, as with NoSwap"
                    .into(),
            );
            Ok(())
        }
        other => Err(ConfigError::field(
            "memorySwap.swapBehavior",
            format!("{other:?} is not a swap behavior (NoSwap or LimitedSwap)"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse;
    use crate::section::{HEAD, assert_refused, raw};

    #[test]
    fn the_daemon_gets_a_cgroup_of_its_own_unless_told_not_to() {
        let h = HostConfig::validate(&raw(""), &mut Vec::new()).unwrap();
        assert_eq!((h.daemon_cgroup.as_deref(), h.daemon_memory_min), (Some("nodewarden"), 16 << 20));
        assert_eq!((h.max_open_files, h.protect_kernel_defaults, h.fail_swap_on), (1_000_000, false, true));
        let h = HostConfig::validate(&raw("nodewarden:\n  daemonCgroup: \"\"\n"), &mut Vec::new()).unwrap();
        assert_eq!(h.daemon_cgroup, None);
        assert_refused(
            |c| HostConfig::validate(c, &mut Vec::new()),
            &[
                ("maxOpenFiles: 0\n", "maxOpenFiles"),
                ("nodewarden:\n  daemonCgroup: kubepods\n", "nodewarden.daemonCgroup"),
                ("nodewarden:\n  daemonCgroup: a/b\n", "nodewarden.daemonCgroup"),
                ("nodewarden:\n  daemonMemoryMin: lots\n", "nodewarden.daemonMemoryMin"),
                ("memorySwap:\n  swapBehavior: Unlimited\n", "memorySwap.swapBehavior"),
            ],
        );
    }

    #[test]
    fn swap_settings_are_the_kubelets() {
        let c = parse(&format!("{HEAD}failSwapOn: false\nmemorySwap:\n  swapBehavior: LimitedSwap\n")).unwrap();
        assert!(!c.host.fail_swap_on);
        assert!(c.warnings.iter().any(|w| w.contains("LimitedSwap is not implemented")), "{:?}", c.warnings);
        let err = parse(&format!("{HEAD}memorySwap:\n  swapBehavior: Unlimited\n")).unwrap_err();
        assert!(err.to_string().contains("memorySwap.swapBehavior"), "{err}");
        assert!(parse(&format!("{HEAD}memorySwap:\n  swapLimit: 1\n")).is_err(), "not a memorySwap field");
    }
}
