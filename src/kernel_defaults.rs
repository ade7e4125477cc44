//! The kernel tunables the kubelet needs, checked at start as the kubelet does (`protectKernelDefaults`): with the
//! flag on, a differing value stops the daemon naming the sysctl and both values; with it off, nodewarden sets
//! them and logs what it changed.

use std::path::Path;

/// The sysctls and the values the kubelet expects: overcommit for the memory accounting, no panic on OOM (the
/// OOM killer, not a reboot, ends a pod), and a reboot 10 s after a panic or an oops.
pub const KERNEL_DEFAULTS: [(&str, &str); 4] =
    [("vm.overcommit_memory", "1"), ("vm.panic_on_oom", "0"), ("kernel.panic", "10"), ("kernel.panic_on_oops", "1")];

/// Why the daemon cannot start with the kernel it has.
#[derive(Debug, thiserror::Error)]
pub enum KernelDefaultsError {
    /// `protectKernelDefaults` is on and a value differs.
    #[error(
        "protectKernelDefaults: {sysctl} is {actual}, the kubelet needs {expected}; set it (sysctl -w {sysctl}={expected}) or turn the flag off"
    )]
    Differs {
        /// The sysctl.
        sysctl: &'static str,
        /// Its value now.
        actual: String,
        /// The value needed.
        expected: &'static str,
    },
    /// A sysctl cannot be read.
    #[error("cannot read {sysctl}: {error}")]
    Unreadable {
        /// The sysctl.
        sysctl: &'static str,
        /// Why.
        error: String,
    },
}

/// Checks (with `protect`) or sets the kernel defaults below `proc_sys` (`/proc/sys`). Returns what was changed,
/// as (sysctl, old value, new value); a value that cannot be set is logged and left.
pub fn ensure(
    proc_sys: &Path,
    protect: bool,
) -> Result<Vec<(&'static str, String, &'static str)>, KernelDefaultsError> {
    let mut changed = Vec::new();
    for (sysctl, expected) in KERNEL_DEFAULTS {
        let file = proc_sys.join(sysctl.replace('.', "/"));
        let actual = std::fs::read_to_string(&file)
            .map_err(|e| KernelDefaultsError::Unreadable { sysctl, error: e.to_string() })?
            .trim()
            .to_owned();
        if actual == expected {
            continue;
        }
        if protect {
            return Err(KernelDefaultsError::Differs { sysctl, actual, expected });
        }
        match std::fs::write(&file, expected) {
            Ok(()) => {
                tracing::info!(sysctl, from = %actual, to = expected, "set a kernel tunable the kubelet needs");
                changed.push((sysctl, actual, expected));
            }
            Err(e) => tracing::warn!(sysctl, value = %actual, expected, error = %e, "cannot set a kernel tunable"),
        }
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc_sys(values: [&str; 4]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for ((sysctl, _), v) in KERNEL_DEFAULTS.iter().zip(values) {
            let f = dir.path().join(sysctl.replace('.', "/"));
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, format!("{v}\n")).unwrap();
        }
        dir
    }

    #[test]
    fn protect_refuses_a_differing_value_and_otherwise_it_is_set() {
        let dir = proc_sys(["0", "0", "0", "1"]);
        let err = ensure(dir.path(), true).unwrap_err().to_string();
        assert!(err.contains("vm.overcommit_memory is 0, the kubelet needs 1"), "{err}");
        assert_eq!(std::fs::read_to_string(dir.path().join("vm/overcommit_memory")).unwrap(), "0\n", "nothing set");
        let changed = ensure(dir.path(), false).unwrap();
        assert_eq!(changed, [("vm.overcommit_memory", "0".to_owned(), "1"), ("kernel.panic", "0".to_owned(), "10")]);
        assert_eq!(std::fs::read_to_string(dir.path().join("kernel/panic")).unwrap(), "10");
        assert!(ensure(dir.path(), true).unwrap().is_empty(), "all as needed now");
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(ensure(empty.path(), false), Err(KernelDefaultsError::Unreadable { .. })));
    }
}
