//! Observations: the node signals and per-pod usage that eviction decides on, and the pressure stall files the
//! gauges show, read fresh on every call.
//!
//! How memory.available is computed: the kubelet takes `capacity − working set`, with the node's working set
//! `MemTotal − MemFree − Inactive(file)` from `/proc/meminfo` (the root cgroup has no `memory.current`, and its
//! `memory.stat` is not charged with most memory). That ignores the kernel's own reserves (watermarks, unreclaimable
//! slab), so on a small node it reports tens of MiB more than can really be allocated. nodewarden therefore uses the
//! smaller of that value and `MemAvailable`: memory.available never exceeds `MemAvailable`.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use crate::capacity::{FsStats, HostPaths, fs_stats, read_meminfo, read_parsed, read_pid_limit};
use crate::cgroupfs::{CgroupFs, CgroupPath};
use crate::error::{CgroupError, IoError, Op, ParseError};
use crate::parse::{self, Psi};

/// Node memory, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct NodeMemory {
    /// `MemTotal`.
    pub capacity: u64,
    /// The kubelet's working set: `MemTotal − MemFree − Inactive(file)`.
    pub working_set: u64,
    /// The kernel's `MemAvailable` estimate.
    pub mem_available: u64,
    /// The memory.available signal: `min(capacity − working_set, MemAvailable)`.
    pub available: u64,
}

/// Process IDs in use and available.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PidStats {
    /// The smaller of `pid_max` and `threads-max`.
    pub max: u64,
    /// Threads that exist now (from `/proc/loadavg`).
    pub running: u64,
    /// The pid.available signal: `max − running`.
    pub available: u64,
}

/// Pressure stall information, where the kernel provides it.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Pressure {
    /// `/proc/pressure/memory`.
    pub memory: Option<Psi>,
    /// `/proc/pressure/cpu`.
    pub cpu: Option<Psi>,
    /// `/proc/pressure/io`.
    pub io: Option<Psi>,
    /// `kubepods/memory.pressure`.
    pub kubepods_memory: Option<Psi>,
}

/// The usage of one pod's cgroup.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PodUsage {
    /// The pod UID.
    pub uid: String,
    /// `memory.current − inactive_file`, floored at zero.
    pub memory_working_set: u64,
    /// `pids.current`.
    pub pids: u64,
}

/// The node-level observations of one pass.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Observations {
    /// Node memory.
    pub memory: NodeMemory,
    /// Node process IDs; `None` when they cannot be read (see `unavailable`).
    pub pids: Option<PidStats>,
    /// The node file system; `None` when it does not answer.
    pub nodefs: Option<FsStats>,
    /// The image file system; `None` when it does not answer.
    pub imagefs: Option<FsStats>,
    /// The inputs (`pids`, `nodefs`, `imagefs`) that could not be read, each with why: their signals are left out
    /// of this observation, and the others are read as usual.
    pub unavailable: Vec<(&'static str, String)>,
    /// The working set of the whole kubepods tree (`memory.current − inactive_file` of `kubepods`): every pod,
    /// and any process placed there outside the ledger, in one read.
    pub kubepods_working_set: u64,
}

/// Reads node memory from `/proc/meminfo`.
pub fn node_memory(host: &HostPaths) -> Result<NodeMemory, CgroupError> {
    Ok(memory_of(&read_meminfo(host)?))
}

/// The memory signal from a meminfo reading: the kubelet's working set and `min(kubelet view, MemAvailable)`.
fn memory_of(m: &parse::Meminfo) -> NodeMemory {
    let inactive_file = m.inactive_file.unwrap_or(0);
    let working_set = m.mem_total.saturating_sub(m.mem_free).saturating_sub(inactive_file);
    let kubelet_view = m.mem_total.saturating_sub(working_set);
    let mem_available = m.mem_available.unwrap_or(kubelet_view);
    NodeMemory { capacity: m.mem_total, working_set, mem_available, available: kubelet_view.min(mem_available) }
}

/// Reads node memory again and again through one open `/proc/meminfo` and one buffer: each read is a `pread` at
/// offset 0 and a parse, with no path built, no file opened and nothing allocated once the buffer has grown to
/// the file's size. For the eviction loop's frequent passes, which need nothing else while only memory is close
/// to its threshold.
#[derive(Debug)]
pub struct MeminfoReader {
    path: PathBuf,
    file: std::fs::File,
    buf: Vec<u8>,
}

impl MeminfoReader {
    /// Opens `/proc/meminfo` below `host.proc`.
    pub fn open(host: &HostPaths) -> Result<Self, CgroupError> {
        let path = host.proc.join("meminfo");
        let file = std::fs::File::open(&path).map_err(|e| IoError::new(Op::Read, &path, e))?;
        Ok(Self { path, file, buf: vec![0; 4096] })
    }

    /// Reads node memory now, as [`node_memory`] does.
    pub fn read(&mut self) -> Result<NodeMemory, CgroupError> {
        let mut len = 0;
        loop {
            if len == self.buf.len() {
                // Only when the file outgrew the buffer; kept for the next reads. Bounded like other reads.
                if self.buf.len() >= MEMINFO_MAX {
                    return Err(self.parse_error("larger than 1 MiB".into()));
                }
                self.buf.resize(self.buf.len() * 2, 0);
            }
            let offset = u64::try_from(len).unwrap_or(u64::MAX);
            let n =
                self.file.read_at(&mut self.buf[len..], offset).map_err(|e| IoError::new(Op::Read, &self.path, e))?;
            if n == 0 {
                break;
            }
            len += n;
        }
        let text = std::str::from_utf8(&self.buf[..len]).map_err(|e| self.parse_error(e.to_string()))?;
        let m = parse::parse_meminfo(text).map_err(|reason| self.parse_error(reason))?;
        Ok(memory_of(&m))
    }

    fn parse_error(&self, reason: String) -> CgroupError {
        ParseError { path: self.path.clone(), reason }.into()
    }
}

/// The largest `/proc/meminfo` [`MeminfoReader`] accepts.
const MEMINFO_MAX: usize = 1 << 20;

/// Reads PID usage.
pub fn pid_stats(host: &HostPaths) -> Result<PidStats, CgroupError> {
    let max = read_pid_limit(host)?;
    let running = read_parsed(&host.proc.join("loadavg"), parse::parse_loadavg_threads)?;
    Ok(PidStats { max, running, available: max.saturating_sub(running) })
}

/// A cgroup's memory working set: `memory.current − inactive_file`, floored at zero.
pub fn working_set(fs: &CgroupFs, cg: &CgroupPath) -> Result<u64, CgroupError> {
    let current = fs.read_u64(cg, "memory.current")?;
    let inactive_file = fs.read_flat_keyed(cg, "memory.stat")?.get("inactive_file").copied().unwrap_or(0);
    Ok(current.saturating_sub(inactive_file))
}

/// Reads the usage of a pod cgroup.
pub fn pod_usage(fs: &CgroupFs, uid: &str, cg: &CgroupPath) -> Result<PodUsage, CgroupError> {
    Ok(PodUsage {
        uid: uid.to_owned(),
        memory_working_set: working_set(fs, cg)?,
        pids: fs.read_u64(cg, "pids.current")?,
    })
}

/// Reads the pressure stall files: the node's memory, CPU and I/O, and the kubepods tree's memory. A file the kernel
/// does not have (no PSI) is `None`.
pub fn read_pressure(host: &HostPaths, fs: &CgroupFs, kubepods: &CgroupPath) -> Pressure {
    let psi = |name: &str| read_parsed(&host.proc.join("pressure").join(name), parse::parse_psi).ok();
    Pressure {
        memory: psi("memory"),
        cpu: psi("cpu"),
        io: psi("io"),
        kubepods_memory: fs.read_psi(kubepods, "memory.pressure").ok(),
    }
}

/// Reads the node-level signals and the kubepods tree's working set: a fixed number of reads however many pods
/// there are (per-pod usage is read separately, when ranking needs it). Memory is required; the PID and file
/// system inputs that fail are named in `unavailable` instead.
pub fn observe_node(host: &HostPaths, fs: &CgroupFs, kubepods: &CgroupPath) -> Result<Observations, CgroupError> {
    // Memory first: nothing below may delay it.
    let memory = node_memory(host)?;
    let mut unavailable = Vec::new();
    let pids = pid_stats(host).map_err(|e| unavailable.push(("pids", e.to_string()))).ok();
    let nodefs = fs_stats(&host.nodefs).map_err(|e| unavailable.push(("nodefs", e.to_string()))).ok();
    let imagefs = fs_stats(&host.imagefs).map_err(|e| unavailable.push(("imagefs", e.to_string()))).ok();
    Ok(Observations { memory, pids, nodefs, imagefs, unavailable, kubepods_working_set: working_set(fs, kubepods)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_with(meminfo: &str) -> (tempfile::TempDir, HostPaths) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("proc/sys/kernel")).unwrap();
        std::fs::write(dir.path().join("proc/meminfo"), meminfo).unwrap();
        std::fs::write(dir.path().join("proc/sys/kernel/pid_max"), "4194304\n").unwrap();
        std::fs::write(dir.path().join("proc/sys/kernel/threads-max"), "7844\n").unwrap();
        std::fs::write(dir.path().join("proc/loadavg"), "0.10 0.20 0.30 2/144 999\n").unwrap();
        let host = HostPaths {
            proc: dir.path().join("proc"),
            sys: dir.path().join("sys"),
            nodefs: dir.path().into(),
            imagefs: dir.path().into(),
        };
        (dir, host)
    }

    const MEMINFO: &str = "MemTotal:        1000000 kB\nMemFree:          600000 kB\nMemAvailable:     500000 kB\nBuffers:               0 kB\nCached:           100000 kB\nInactive(file):    50000 kB\n";

    #[test]
    fn memory_available_never_exceeds_mem_available() {
        let (_d, host) = host_with(MEMINFO);
        let m = node_memory(&host).unwrap();
        assert_eq!(m.capacity, 1_000_000 * 1024);
        assert_eq!(m.working_set, 350_000 * 1024);
        // The kubelet's view would be 650000 kB; MemAvailable says 500000 kB.
        assert_eq!(m.available, 500_000 * 1024);
    }

    #[test]
    fn the_reader_reads_what_node_memory_reads_every_time() {
        let (dir, host) = host_with(MEMINFO);
        let mut r = MeminfoReader::open(&host).unwrap();
        assert_eq!(r.read().unwrap(), node_memory(&host).unwrap());
        // The same open file, read again from the start: a changed and a longer file.
        let longer = format!("{}{}", MEMINFO.replace("500000", "400000"), "Filler:  1 kB\n".repeat(400));
        std::fs::write(dir.path().join("proc/meminfo"), &longer).unwrap();
        let m = r.read().unwrap();
        assert_eq!(m.mem_available, 400_000 * 1024);
        assert_eq!(m, node_memory(&host).unwrap());
        std::fs::write(dir.path().join("proc/meminfo"), "MemTotal: lots kB\n").unwrap();
        assert!(r.read().unwrap_err().to_string().contains("meminfo"));
    }

    #[test]
    fn pids_use_the_smaller_limit() {
        let (_d, host) = host_with(MEMINFO);
        assert_eq!(pid_stats(&host).unwrap(), PidStats { max: 7844, running: 144, available: 7700 });
    }

    #[test]
    fn malformed_meminfo_is_an_error_not_a_panic() {
        for bad in ["", "MemTotal: lots kB\n", "garbage\n", "MemFree: 1 kB\n"] {
            let (_d, host) = host_with(bad);
            let err = node_memory(&host).unwrap_err().to_string();
            assert!(err.contains("meminfo"), "{err}");
        }
    }

    #[test]
    fn pressure_reads_each_file_that_is_there() {
        let (dir, host) = host_with(MEMINFO);
        let fs = CgroupFs::emulated(dir.path().join("cgroup"), CgroupPath::root());
        let kubepods = CgroupPath::parse("/kubepods").unwrap();
        std::fs::create_dir_all(fs.dir(&kubepods)).unwrap();
        // No PSI at all (a kernel without it): every file is None, nothing fails.
        assert_eq!(read_pressure(&host, &fs, &kubepods), Pressure::default());
        let line = |avg10: &str, total: u64| format!("avg10={avg10} avg60=0.00 avg300=0.00 total={total}");
        std::fs::create_dir_all(host.proc.join("pressure")).unwrap();
        let memory = format!("some {}\nfull {}\n", line("1.50", 10), line("0.50", 5));
        std::fs::write(host.proc.join("pressure/memory"), memory).unwrap();
        std::fs::write(host.proc.join("pressure/cpu"), format!("some {}\n", line("2.00", 7))).unwrap();
        std::fs::write(host.proc.join("pressure/io"), "some garbage\n").unwrap();
        fs.write(&kubepods, "memory.pressure", &format!("some {}\n", line("3.00", 9))).unwrap();
        let p = read_pressure(&host, &fs, &kubepods);
        let memory = p.memory.unwrap();
        assert_eq!((memory.some.avg10, memory.some.total, memory.full.map(|f| f.total)), (1.5, 10, Some(5)));
        assert_eq!(p.cpu.map(|c| (c.some.total, c.full.is_none())), Some((7, true)));
        assert!(p.io.is_none(), "an unparsable file is left out: {:?}", p.io);
        assert_eq!(p.kubepods_memory.map(|k| k.some.total), Some(9));
    }

    #[test]
    fn pod_usage_subtracts_inactive_file() {
        let dir = tempfile::tempdir().unwrap();
        let fs = CgroupFs::emulated(dir.path(), CgroupPath::root());
        let cg = CgroupPath::parse("/kubepods/podx").unwrap();
        std::fs::create_dir_all(fs.dir(&cg)).unwrap();
        fs.write(&cg, "memory.current", "1000\n").unwrap();
        fs.write(&cg, "memory.stat", "anon 800\ninactive_file 300\n").unwrap();
        fs.write(&cg, "pids.current", "3\n").unwrap();
        assert_eq!(pod_usage(&fs, "x", &cg).unwrap(), PodUsage { uid: "x".into(), memory_working_set: 700, pids: 3 });
        fs.write(&cg, "memory.stat", "inactive_file 5000\n").unwrap();
        assert_eq!(pod_usage(&fs, "x", &cg).unwrap().memory_working_set, 0);
    }
}
