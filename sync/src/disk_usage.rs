//! How many bytes of node storage a directory holds: one read of its project's quota where it owns one
//! ([`crate::quota`]), else a walk of its files, as the kubelet's `du` (bounded in depth, on one file system).

use std::os::unix::fs::MetadataExt;
use std::path::Path;

pub use crate::quota::{claim, usage_method};

/// How deep [`du`] descends; deeper trees are counted up to this depth.
const MAX_DEPTH: usize = 32;

/// What a directory holds of node storage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskUsage {
    /// Bytes allocated.
    pub bytes: u64,
    /// Inodes: the directory itself and every entry below it.
    pub inodes: u64,
}

impl DiskUsage {
    /// Both sums.
    #[must_use]
    pub fn plus(self, other: Self) -> Self {
        Self { bytes: self.bytes.saturating_add(other.bytes), inodes: self.inodes.saturating_add(other.inodes) }
    }
}

/// Bytes allocated by the files below `dir` on the same file system (see [`usage`]).
pub fn du(dir: &Path) -> u64 {
    usage(dir).bytes
}

/// What the files below `dir` on the same file system hold (a memory-backed emptyDir mounted below is not node
/// storage), without following symbolic links: read from its project's quota where `dir`, or a directory met
/// below it, owns one ([`crate::quota`]), else walked. Only directories are compared by device: overlayfs reports
/// a regular file's device as its layer's, not the overlay's, so a per-file check counts nothing there. A
/// directory that does not exist holds nothing.
pub fn usage(dir: &Path) -> DiskUsage {
    crate::quota::owned_usage(dir).unwrap_or_else(|| walk_with(dir, true))
}

/// What [`du`] finds below `dir` by walking every file, whatever project quotas would say: the measure that
/// quotas replace, for comparison.
pub fn walk(dir: &Path) -> u64 {
    walk_with(dir, false).bytes
}

/// Walks `dir`; with `quotas`, a directory met below it that owns a project is read from its quota, not walked.
fn walk_with(dir: &Path, quotas: bool) -> DiskUsage {
    let Ok(meta) = std::fs::symlink_metadata(dir) else { return DiskUsage::default() };
    let dev = meta.dev();
    let mut total = DiskUsage { bytes: 0, inodes: 1 };
    let mut stack = vec![(dir.to_path_buf(), 0usize)];
    while let Some((d, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let Ok(m) = e.path().symlink_metadata() else { continue };
            if m.is_dir() && m.dev() != dev {
                continue;
            }
            if quotas
                && m.is_dir()
                && let Some(owned) = crate::quota::owned_usage(&e.path())
            {
                total = total.plus(owned);
                continue;
            }
            total = total.plus(DiskUsage { bytes: m.blocks().saturating_mul(512), inodes: 1 });
            if m.is_dir() && depth < MAX_DEPTH {
                stack.push((e.path(), depth + 1));
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn du_counts_allocated_bytes_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/f"), vec![1u8; 64 * 1024]).unwrap();
        std::os::unix::fs::symlink("/usr", dir.path().join("a/link")).unwrap();
        let n = du(dir.path());
        assert!((64 * 1024..1024 * 1024).contains(&n), "{n}");
        assert_eq!(du(&dir.path().join("missing")), 0);
        // The directory itself, a, b, f and the link.
        assert_eq!(usage(dir.path()).inodes, 5);
        assert_eq!(usage(&dir.path().join("missing")), DiskUsage::default());
    }
}
