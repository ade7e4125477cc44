//! Swap at start, as the kubelet checks it (`failSwapOn`): a node with swap on is refused unless the config allows
//! it. Where it is allowed, pods still do not swap (`memorySwap.swapBehavior: NoSwap`, the default): the resources
//! crate writes `memory.swap.max` 0 in every pod cgroup, so a pod cannot swap past `memory.max` and hide its
//! memory from the eviction signal.

use std::path::Path;

/// A node with swap on, and `failSwapOn`.
#[derive(Debug, thiserror::Error)]
#[error(
    "swap is on ({devices}); pods would swap past their limits and hide memory pressure from eviction: turn swap off \
     (swapoff -a) or set failSwapOn: false (pods then get memory.swap.max 0)"
)]
pub struct SwapError {
    /// The swap devices, as `/proc/swaps` names them.
    devices: String,
}

/// The active swap devices in a `/proc/swaps` table (a header line, then one line a device).
fn devices(table: &str) -> Vec<&str> {
    table.lines().skip(1).filter_map(|l| l.split_ascii_whitespace().next()).collect()
}

/// Refuses to start with swap on when `fail_swap_on`; otherwise says that pods will not use it. A `/proc/swaps`
/// that cannot be read is taken as no swap (a kernel built without it has none).
pub fn check(proc: &Path, fail_swap_on: bool) -> Result<(), SwapError> {
    let table = std::fs::read_to_string(proc.join("swaps")).unwrap_or_default();
    let on = devices(&table);
    if on.is_empty() {
        return Ok(());
    }
    let devices = on.join(", ");
    if fail_swap_on {
        return Err(SwapError { devices });
    }
    tracing::info!(%devices, "swap is on (failSwapOn: false); pods get memory.swap.max 0 and do not use it");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_on_is_refused_only_with_fail_swap_on() {
        let dir = tempfile::tempdir().unwrap();
        let header = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n";
        std::fs::write(dir.path().join("swaps"), header).unwrap();
        assert!(check(dir.path(), true).is_ok(), "no swap device");
        std::fs::write(dir.path().join("swaps"), format!("{header}/swapfile file 1048572 0 -2\n")).unwrap();
        let err = check(dir.path(), true).unwrap_err();
        assert!(err.to_string().contains("swap is on (/swapfile)"), "{err}");
        assert!(check(dir.path(), false).is_ok());
        assert!(check(&dir.path().join("missing"), true).is_ok(), "no /proc/swaps: no swap");
    }
}
