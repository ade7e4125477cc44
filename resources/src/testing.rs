//! A stand-in host for unit tests of the crates built on this one: a temporary directory with the `/proc` and
//! `/sys` files that capacity and observations read, and an emulated cgroupfs. Enabled by the `testing` feature.

use std::path::{Path, PathBuf};

use crate::capacity::HostPaths;
use crate::cgroupfs::{CgroupFs, CgroupPath};

/// A temporary stand-in host: 1 GiB of memory, 2 CPUs, 32768 PIDs.
#[derive(Debug)]
pub struct FakeHost {
    dir: tempfile::TempDir,
}

impl FakeHost {
    /// Creates the files.
    ///
    /// # Panics
    /// When the temporary directory cannot be written (a broken test machine).
    #[expect(clippy::unwrap_used)]
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        for d in ["proc/sys/kernel", "proc/pressure", "sys/devices/system/cpu", "cgroup"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        let h = Self { dir };
        h.set_memory(1 << 30, 512 << 20, 600 << 20);
        h.write("proc/sys/kernel/pid_max", "32768\n");
        h.write("proc/sys/kernel/threads-max", "100000\n");
        h.set_threads(100);
        h.write("sys/devices/system/cpu/online", "0-1\n");
        h
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file below the directory.
    ///
    /// # Panics
    /// When the file cannot be written.
    #[expect(clippy::unwrap_used)]
    pub fn write(&self, rel: &str, text: &str) {
        let p = self.dir.path().join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(p, text).unwrap();
    }

    /// Sets `/proc/meminfo`: MemTotal, MemFree and MemAvailable in bytes (no inactive file pages).
    pub fn set_memory(&self, total: u64, free: u64, available: u64) {
        let kb = |b: u64| b / 1024;
        self.write(
            "proc/meminfo",
            &format!("MemTotal: {} kB\nMemFree: {} kB\nMemAvailable: {} kB\n", kb(total), kb(free), kb(available)),
        );
    }

    /// Sets the number of threads `/proc/loadavg` reports.
    pub fn set_threads(&self, n: u64) {
        self.write("proc/loadavg", &format!("0.00 0.00 0.00 1/{n} 1\n"));
    }

    /// The host paths (nodefs and imagefs are the directory itself).
    pub fn host(&self) -> HostPaths {
        let p = self.dir.path();
        HostPaths { proc: p.join("proc"), sys: p.join("sys"), nodefs: p.into(), imagefs: p.into() }
    }

    /// The emulated cgroup mount.
    pub fn cgroup_mount(&self) -> PathBuf {
        self.dir.path().join("cgroup")
    }

    /// An emulated cgroupfs scoped to `root`.
    pub fn cgroupfs(&self, root: &CgroupPath) -> CgroupFs {
        CgroupFs::emulated(self.cgroup_mount(), root.clone())
    }

    /// Sets a cgroup's memory usage (`memory.current`, no inactive file pages) and process count.
    pub fn set_usage(&self, cg: &CgroupPath, memory: u64, pids: u64) {
        let rel = format!("cgroup{}", cg.as_str());
        self.write(&format!("{rel}/memory.current"), &format!("{memory}\n"));
        self.write(&format!("{rel}/memory.stat"), "anon 0\ninactive_file 0\n");
        self.write(&format!("{rel}/pids.current"), &format!("{pids}\n"));
    }
}

impl Default for FakeHost {
    fn default() -> Self {
        Self::new()
    }
}
