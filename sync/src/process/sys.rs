//! The system calls that need `unsafe`: the steps a container process takes between fork and exec, and
//! registering a pidfd with the async runtime to learn when an adopted process exits.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{Mode, OFlags};
use rustix::mount::{MountFlags, MountPropagationFlags, mount_bind, mount_change, mount_remount};
use rustix::process::{Gid, Uid};
use rustix::thread::UnshareFlags;

/// Resolves when the process behind `pidfd` has exited (a pidfd becomes readable then). Errors are returned when
/// the descriptor cannot be watched.
pub async fn pidfd_exited(pidfd: OwnedFd) -> std::io::Result<()> {
    // SAFETY: `register_with_interest` requires that the descriptor stays open and is not replaced while it is
    // registered. The `OwnedFd` is moved into the `AsyncFd`, which owns it until it is dropped at the end of this
    // function, after which it is deregistered and closed together.
    #[allow(unsafe_code)]
    let fd = unsafe { tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)? };
    let _ready = fd.readable().await?;
    Ok(())
}

/// What a new container process does after the fork and before it execs its command, all of it prepared by the
/// daemon: the child of a multi-threaded process may only make async-signal-safe calls, so nothing here
/// allocates, formats or takes a lock (another thread may have held the allocator's lock at the fork).
pub struct ChildSetup {
    /// The container cgroup's `cgroup.procs`, open for writing (close-on-exec): writing `0` moves the writer.
    pub procs: OwnedFd,
    /// The `oom_score_adj` value, in decimal.
    pub oom_score_adj: Vec<u8>,
    /// Bind mounts: source, target, read-only. Targets must exist: the process runtime shares the host's file
    /// system, and nodewarden does not create directories there for a container.
    pub mounts: Vec<(CString, CString, bool)>,
    /// The working directory, entered after the mounts (it may be inside one).
    pub working_dir: CString,
    /// `runAsUser`.
    pub user: Option<u32>,
    /// `runAsGroup`.
    pub group: Option<u32>,
    /// Supplemental groups, set when the user is switched.
    pub groups: Vec<Gid>,
    /// Sets `no_new_privs` last.
    pub no_new_privs: bool,
    /// Capabilities dropped from the bounding set and, for a root user, from its own sets.
    pub drop_capabilities: rustix::thread::CapabilitySet,
}

fn write_all(fd: impl AsFd, mut buf: &[u8]) -> rustix::io::Result<()> {
    while !buf.is_empty() {
        match rustix::io::write(&fd, buf) {
            Ok(0) => return Err(rustix::io::Errno::IO),
            Ok(n) => buf = buf.get(n..).unwrap_or_default(),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl ChildSetup {
    /// Makes `cmd`'s child take these steps before it execs. The steps run while the child is still root, so
    /// `cmd` must not set a user or group of its own (the standard library would switch before them).
    pub fn install(self, cmd: &mut tokio::process::Command) {
        // SAFETY: `pre_exec` requires that the closure only does what is safe in the child of a fork of a
        // multi-threaded process: `run` makes raw system calls through rustix's linux_raw backend on data
        // prepared before the fork (C strings, a descriptor, integers) and allocates nothing; errors are
        // `Errno` values turned into `io::Error::from_raw_os_error`, which does not allocate either.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(move || self.run().map_err(std::io::Error::from));
        }
    }

    fn run(&self) -> rustix::io::Result<()> {
        write_all(&self.procs, b"0")?;
        let adj = rustix::fs::open(c"/proc/self/oom_score_adj", OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty())?;
        write_all(&adj, &self.oom_score_adj)?;
        drop(adj);
        if !self.mounts.is_empty() {
            // SAFETY: `unshare_unsafe` is unsafe only for `CLONE_FILES`, which can leave other threads holding
            // file descriptors from another table. Only `CLONE_NEWNS` is passed, and this runs in the
            // single-threaded child between fork and exec.
            #[allow(unsafe_code)]
            unsafe {
                rustix::thread::unshare_unsafe(UnshareFlags::NEWNS)?;
            }
            mount_change(c"/", MountPropagationFlags::PRIVATE | MountPropagationFlags::REC)?;
            for (source, target, read_only) in &self.mounts {
                mount_bind(source.as_c_str(), target.as_c_str())?;
                if *read_only {
                    mount_remount(target.as_c_str(), MountFlags::BIND | MountFlags::RDONLY, c"")?;
                }
            }
        }
        rustix::process::chdir(self.working_dir.as_c_str())?;
        // The child has one thread, so the per-thread system calls change the whole process, as setgid(2),
        // setgroups(2) and setuid(2) would; the order is the standard library's.
        let drop = self.drop_capabilities;
        // Out of the bounding set while the child still may (it needs CAP_SETPCAP): nothing it execs, setuid
        // binaries included, can get them back. Numbers the kernel does not know are refused with EINVAL.
        for bit in 0..64u32 {
            let cap = rustix::thread::CapabilitySet::from_bits_retain(1 << bit);
            if drop.contains(cap) {
                match rustix::thread::remove_capability_from_bounding_set(cap) {
                    Ok(()) | Err(rustix::io::Errno::INVAL) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        if let Some(g) = self.group {
            rustix::thread::set_thread_gid(Gid::from_raw(g))?;
        }
        if rustix::process::getuid().is_root() && (self.user.is_some() || !self.groups.is_empty()) {
            rustix::thread::set_thread_groups(&self.groups)?;
        }
        if let Some(u) = self.user {
            rustix::thread::set_thread_uid(Uid::from_raw(u))?;
        }
        // A user still root keeps its capabilities across exec, less the dropped ones (a non-root user has none).
        if !drop.is_empty() && rustix::process::getuid().is_root() {
            let mut sets = rustix::thread::capabilities(None)?;
            sets.effective &= !drop;
            sets.permitted &= !drop;
            sets.inheritable &= !drop;
            rustix::thread::set_capabilities(None, sets)?;
        }
        if self.no_new_privs {
            rustix::thread::set_no_new_privs(true)?;
        }
        Ok(())
    }
}
