//! Node capacity: memory, CPUs, PIDs and the node and image file systems, read from `/proc`, `/sys` and statfs.

use std::path::{Path, PathBuf};

use crate::cgroupfs::{CgroupFs, CgroupPath};
use crate::error::{CgroupError, IoError, Op, ParseError};
use crate::parse::{self, Meminfo};

/// Where the host's kernel interfaces are. Tests point these at fixture directories.
#[derive(Debug, Clone)]
pub struct HostPaths {
    /// procfs, normally `/proc`.
    pub proc: PathBuf,
    /// sysfs, normally `/sys`.
    pub sys: PathBuf,
    /// The node file system (kubelet root dir, pod logs, emptyDir volumes), normally `/var/lib/kubelet` or `/`.
    pub nodefs: PathBuf,
    /// The image file system (container images and writable layers), often the same as `nodefs`.
    pub imagefs: PathBuf,
}

impl Default for HostPaths {
    fn default() -> Self {
        Self { proc: "/proc".into(), sys: "/sys".into(), nodefs: "/".into(), imagefs: "/".into() }
    }
}

/// Sizes and free space of a file system.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct FsStats {
    /// Total bytes.
    pub capacity_bytes: u64,
    /// Bytes available to unprivileged users.
    pub available_bytes: u64,
    /// Total inodes.
    pub inodes: u64,
    /// Free inodes.
    pub inodes_free: u64,
}

/// Reads the sizes of the file system holding `path`, waiting at most `STATFS_TIMEOUT` (1 s) for it.
pub fn fs_stats(path: &Path) -> Result<FsStats, IoError> {
    let st = crate::statfs::statvfs(path).map_err(|e| IoError::new(Op::Statfs, path, e))?;
    Ok(FsStats {
        capacity_bytes: st.f_blocks.saturating_mul(st.f_frsize),
        available_bytes: st.f_bavail.saturating_mul(st.f_frsize),
        inodes: st.f_files,
        inodes_free: st.f_ffree,
    })
}

/// The node's capacity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Capacity {
    /// Memory in bytes (`MemTotal`).
    pub memory: u64,
    /// CPUs in millicores: the online CPUs, narrowed by the cgroup root's cpuset when it has one.
    pub cpu_millis: u64,
    /// Process IDs: the smaller of `kernel.pid_max` and `kernel.threads-max`.
    pub pids: u64,
    /// Ephemeral storage: the node file system's size in bytes.
    pub ephemeral_storage: u64,
}

pub(crate) fn read_parsed<T>(path: &Path, parse: impl Fn(&str) -> Result<T, String>) -> Result<T, CgroupError> {
    let text = crate::kernel_file::read_text(path)?;
    parse(&text).map_err(|reason| ParseError { path: path.to_owned(), reason }.into())
}

/// Reads `/proc/meminfo`.
///
/// Parsed here rather than with procfs-core: its `Meminfo` requires a dozen fields nodewarden does not use and
/// reports a missing one as an internal error of the crate, not as a fact about the file.
pub fn read_meminfo(host: &HostPaths) -> Result<Meminfo, CgroupError> {
    read_parsed(&host.proc.join("meminfo"), parse::parse_meminfo)
}

/// Reads the PID limit of the node: the smaller of `kernel.pid_max` and `kernel.threads-max`.
pub fn read_pid_limit(host: &HostPaths) -> Result<u64, CgroupError> {
    let sys = host.proc.join("sys/kernel");
    let pid_max = read_parsed(&sys.join("pid_max"), parse::parse_u64)?;
    let threads_max = read_parsed(&sys.join("threads-max"), parse::parse_u64).unwrap_or(pid_max);
    Ok(pid_max.min(threads_max))
}

/// Reads the node's capacity. `cgroup_root` narrows the CPU count by its `cpuset.cpus.effective` when present.
pub fn read_capacity(host: &HostPaths, fs: &CgroupFs, cgroup_root: &CgroupPath) -> Result<Capacity, CgroupError> {
    let mem = read_meminfo(host)?;
    let online = read_parsed(&host.sys.join("devices/system/cpu/online"), parse::parse_cpu_list_count)?;
    let cpus = match fs.read(cgroup_root, "cpuset.cpus.effective") {
        Ok(text) => match parse::parse_cpu_list_count(&text) {
            Ok(n) if n > 0 => n.min(online),
            _ => online,
        },
        Err(_) => online,
    };
    let nodefs = fs_stats(&host.nodefs)?;
    Ok(Capacity {
        memory: mem.mem_total,
        cpu_millis: cpus.saturating_mul(1000),
        pids: read_pid_limit(host)?,
        ephemeral_storage: nodefs.capacity_bytes,
    })
}
