//! The system calls that need `unsafe`: starting a container process (clone3 into its cgroup through a small
//! trampoline of our own on x86-64, else clone(2) through the C library), the steps it takes between fork and
//! exec, and registering a pidfd with the async runtime to learn when an adopted process exits.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{CWD, Mode, OFlags};
use rustix::mount::{
    MountFlags, MountPropagationFlags, MoveMountFlags, OpenTreeFlags, UnmountFlags, mount, mount_bind, mount_change,
    mount_move, mount_remount, move_mount, open_tree, unmount,
};
use rustix::process::{Gid, Uid};
use rustix::thread::UnshareFlags;

/// Resolves when the process behind `pidfd` has exited (a pidfd becomes readable then). Errors are returned when
/// the descriptor cannot be watched.
pub async fn pidfd_exited(pidfd: OwnedFd) -> std::io::Result<()> {
    // SAFETY: `register_with_interest` requires that the descriptor stays open and is not replaced while it is
    // registered. The `OwnedFd` is moved into the `AsyncFd`, which owns it until it is dropped at the end of this
    // function, after which it is deregistered and closed together.
    #[expect(unsafe_code, reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound")]
    let fd = unsafe { tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)? };
    let _ready = fd.readable().await?;
    Ok(())
}

/// A process's start time in clock ticks after boot (field 22 of `/proc/<pid>/stat`): with its PID, it names one
/// process for good, since a PID is given again only to a process started later. `None` when the process is gone
/// or the file cannot be parsed.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_ticks(&stat)
}

/// The start time in a `/proc/<pid>/stat` line. The command name (field 2) is in parentheses and may hold spaces
/// and parentheses itself, so the fields are counted from the last `)`.
fn parse_start_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    // After the name: state (field 3) ... starttime (field 22), the 20th.
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// What a new container process does after the fork and before it execs its command, all of it prepared by the
/// daemon: the child of a multi-threaded process may only make async-signal-safe calls, so nothing here
/// allocates, formats or takes a lock (another thread may have held the allocator's lock at the fork).
pub struct ChildSetup {
    /// The container cgroup's `cgroup.procs`, open for writing (close-on-exec): writing `0` moves the writer. Not
    /// written by a child that was created in the cgroup.
    pub procs: OwnedFd,
    /// The `oom_score_adj` value, in decimal.
    pub oom_score_adj: Vec<u8>,
    /// Bind mounts: source, target, read-only. A target exists on the node, or is made in one of `overlays`: the
    /// process runtime shares the node's file system, and nodewarden creates nothing there for a container.
    pub mounts: Vec<(CString, CString, bool)>,
    /// The directories overlaid in the container's mount namespace to make missing mountPaths in (see
    /// `overlay`), in the order they are placed (an overlay before the one it goes into). Empty when every
    /// target exists: then the bind mounts are made by path, as they always were.
    pub overlays: Vec<OverlaySetup>,
    /// With overlays, one slot per bind mount: its source, taken as a detached copy (`open_tree`) before any
    /// overlay covers the node's paths, so that a source below an overlaid directory is the node's own and not the
    /// overlay's copy of it.
    pub sources: Vec<std::sync::atomic::AtomicI32>,
    /// A mount namespace to join instead of making any mount: a running container's, for a command run in it.
    pub mount_ns: Option<OwnedFd>,
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

/// A directory overlaid in the container's mount namespace (see `overlay`), everything prepared by the daemon. The
/// overlay is first made at `merged`, a directory of the runtime's scratch directory, while the node's paths are
/// still those of the node: its lower layer, the mounts attached again in it and the volumes' sources are then
/// found where they are on the node, whatever other overlay is placed first. Only then is it placed.
pub struct OverlaySetup {
    /// A directory to mount a private tmpfs on for `upper` and `work`, which the child makes in it, when the scratch
    /// directory's file system cannot be an overlay's upper layer (an overlayfs itself, as a root file system that
    /// is one, or a network file system); else `None`, and the daemon made both on the scratch directory's disk.
    pub tmpfs: Option<CString>,
    /// The overlay's upper directory.
    pub upper: CString,
    /// Its work directory (on the same file system).
    pub work: CString,
    /// The owner, group and mode of the lower directory, given to `upper`: the overlay's root shows the upper
    /// directory's, and a container of another user must still be able to enter it.
    pub owner: (Uid, Gid, Mode),
    /// Where the overlay is made, an empty directory of the daemon's.
    pub merged: CString,
    /// The overlayfs options: `lowerdir=<the directory>,upperdir=<upper>,workdir=<work>`.
    pub options: CString,
    /// The node's mounts below the directory, attached again in the overlay.
    pub submounts: Vec<Submount>,
    /// What is made in the overlay once the mounts are attached, parents first: a path in `merged` and whether it
    /// is a directory (made 0755) or an empty file.
    pub create: Vec<(CString, bool)>,
    /// Where the overlay is placed: the directory itself, or its place in the overlay of a directory above it;
    /// `None` for the root directory, which becomes the container's root (`pivot_root`).
    pub dest: Option<CString>,
}

/// A mount below an overlaid directory, attached again in the overlay with what is mounted below it.
pub struct Submount {
    /// Its mount point on the node.
    pub host: CString,
    /// The same place in the overlay (below `merged`).
    pub inside: CString,
    /// The detached copy of it the child takes before any overlay exists; -1 when there is none.
    pub fd: std::sync::atomic::AtomicI32,
}

/// Keeps `fd` in `slot` until [`take`]: memory the daemon allocated, so the child needs no allocation for it.
fn keep(slot: &std::sync::atomic::AtomicI32, fd: OwnedFd) {
    slot.store(std::os::fd::IntoRawFd::into_raw_fd(fd), std::sync::atomic::Ordering::Relaxed);
}

/// The descriptor kept in `slot`, once.
fn take(slot: &std::sync::atomic::AtomicI32) -> Option<OwnedFd> {
    let raw = slot.swap(-1, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: a slot holds -1 or a descriptor that `keep` took out of an `OwnedFd` in this same process (the child
    // stores into every slot it reads, before it reads any), and the swap hands it out once, so it is owned again
    // by exactly one `OwnedFd`.
    #[expect(unsafe_code, reason = "a raw descriptor owned again; the SAFETY comment says why it is sound")]
    (raw >= 0).then(|| unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) })
}

impl OverlaySetup {
    /// Makes the overlay at `merged`: its upper layer (on a private tmpfs, if so prepared) with the lower
    /// directory's owner and mode, the overlay, the node's mounts below the directory attached again (one whose
    /// place the overlay lacks is skipped: it is mounted on a path of another file system), then the missing
    /// directories and files, which land in the upper layer.
    fn stage(&self) -> rustix::io::Result<()> {
        if let Some(layers) = &self.tmpfs {
            let flags = MountFlags::NOSUID | MountFlags::NODEV;
            mount(c"tmpfs", layers.as_c_str(), c"tmpfs", flags, c"mode=0700")?;
            rustix::fs::mkdir(self.upper.as_c_str(), Mode::from_raw_mode(0o700))?;
            rustix::fs::mkdir(self.work.as_c_str(), Mode::from_raw_mode(0o700))?;
        }
        let (uid, gid, mode) = self.owner;
        rustix::fs::chown(self.upper.as_c_str(), Some(uid), Some(gid))?;
        rustix::fs::chmod(self.upper.as_c_str(), mode)?;
        mount(c"overlay", self.merged.as_c_str(), c"overlay", MountFlags::empty(), self.options.as_c_str())?;
        if let Some(layers) = &self.tmpfs {
            // The overlay keeps its own reference to its layers: the tmpfs leaves the container's mount table.
            unmount(layers.as_c_str(), UnmountFlags::DETACH)?;
        }
        for sub in &self.submounts {
            if let Some(fd) = take(&sub.fd) {
                match move_mount(&fd, c"", CWD, sub.inside.as_c_str(), MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH) {
                    Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        for (path, dir) in &self.create {
            if *dir {
                let made = match rustix::fs::mkdir(path.as_c_str(), Mode::from_raw_mode(0o755)) {
                    Ok(()) => true,
                    // Made on the node since the daemon looked: there it is, in the lower layer, left as it is
                    // (a directory; a link someone planted is refused below, never followed).
                    Err(rustix::io::Errno::EXIST) => false,
                    Err(e) => return Err(e),
                };
                let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                let fd = rustix::fs::open(path.as_c_str(), flags, Mode::empty())?;
                if made {
                    // Whatever the umask took away: a container of another user must be able to pass.
                    rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o755))?;
                }
            } else {
                // Never through a link: a file is made, or one that is there opened, in the overlay only.
                let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                drop(rustix::fs::open(path.as_c_str(), flags, Mode::from_raw_mode(0o644))?);
            }
        }
        Ok(())
    }

    /// Moves the made overlay to its place; the root directory's becomes the container's root, the node's old root
    /// detached from the namespace (its mounts are attached again in the overlay), or, where the root cannot be
    /// pivoted (an initramfs), the overlay is moved over it and entered with chroot.
    fn place(&self) -> rustix::io::Result<()> {
        if let Some(dest) = &self.dest {
            return mount_move(self.merged.as_c_str(), dest.as_c_str());
        }
        rustix::process::chdir(self.merged.as_c_str())?;
        match rustix::process::pivot_root(c".", c".") {
            Ok(()) => unmount(c".", UnmountFlags::DETACH)?,
            Err(rustix::io::Errno::INVAL) => {
                mount_move(c".", c"/")?;
                rustix::process::chroot(c".")?;
            }
            Err(e) => return Err(e),
        }
        rustix::process::chdir(c"/")
    }
}

impl ChildSetup {
    /// Makes `cmd`'s child take these steps before it execs. The steps run while the child is still root, so
    /// `cmd` must not set a user or group of its own (the standard library would switch before them).
    pub fn install(self, cmd: &mut tokio::process::Command) {
        // SAFETY: `pre_exec` requires that the closure only does what is safe in the child of a fork of a
        // multi-threaded process: `run` makes raw system calls through rustix's linux_raw backend on data
        // prepared before the fork (C strings, a descriptor, integers) and allocates nothing; errors are
        // `Errno` values turned into `io::Error::from_raw_os_error`, which does not allocate either.
        #[expect(unsafe_code, reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound")]
        unsafe {
            cmd.pre_exec(move || self.run(false).map_err(std::io::Error::from));
        }
    }

    /// The steps; `born_in_cgroup` when the child was created in the container cgroup, so it need not move there.
    fn run(&self, born_in_cgroup: bool) -> rustix::io::Result<()> {
        if !born_in_cgroup {
            write_all(&self.procs, b"0")?;
        }
        let adj = rustix::fs::open(c"/proc/self/oom_score_adj", OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty())?;
        write_all(&adj, &self.oom_score_adj)?;
        drop(adj);
        if let Some(ns) = &self.mount_ns {
            rustix::thread::move_into_link_name_space(ns.as_fd(), Some(rustix::thread::LinkNameSpaceType::Mount))?;
        } else if !self.mounts.is_empty() {
            // SAFETY: `unshare_unsafe` is unsafe only for `CLONE_FILES`, which can leave other threads holding
            // file descriptors from another table. Only `CLONE_NEWNS` is passed, and this runs in the
            // single-threaded child between fork and exec.
            #[expect(
                unsafe_code,
                reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound"
            )]
            unsafe {
                rustix::thread::unshare_unsafe(UnshareFlags::NEWNS)?;
            }
            mount_change(c"/", MountPropagationFlags::PRIVATE | MountPropagationFlags::REC)?;
            if self.overlays.is_empty() {
                for (source, target, read_only) in &self.mounts {
                    mount_bind(source.as_c_str(), target.as_c_str())?;
                    if *read_only {
                        mount_remount(target.as_c_str(), MountFlags::BIND | MountFlags::RDONLY, c"")?;
                    }
                }
            } else {
                self.mount_with_overlays()?;
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

    /// The bind mounts, with overlays for the targets that do not exist on the node (see `overlay`). First, while
    /// every path is still the node's, each volume's source and each mount below an overlaid directory is taken as
    /// a detached copy (a missing mount, gone since the daemon read the mount table, is skipped); then every
    /// overlay is made at its scratch directory and placed, deepest first; then each copy of a source is attached
    /// at its target, which resolves through the overlays, and made read-only where asked, as before.
    fn mount_with_overlays(&self) -> rustix::io::Result<()> {
        let copy = OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC;
        for ((source, _, _), slot) in self.mounts.iter().zip(&self.sources) {
            keep(slot, open_tree(CWD, source.as_c_str(), copy)?);
        }
        for sub in self.overlays.iter().flat_map(|o| &o.submounts) {
            match open_tree(CWD, sub.host.as_c_str(), copy | OpenTreeFlags::AT_RECURSIVE) {
                Ok(fd) => keep(&sub.fd, fd),
                Err(rustix::io::Errno::NOENT) => sub.fd.store(-1, std::sync::atomic::Ordering::Relaxed),
                Err(e) => return Err(e),
            }
        }
        for overlay in &self.overlays {
            overlay.stage()?;
        }
        for overlay in &self.overlays {
            overlay.place()?;
        }
        for ((_, target, read_only), slot) in self.mounts.iter().zip(&self.sources) {
            let fd = take(slot).ok_or(rustix::io::Errno::BADF)?;
            let flags = MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_SYMLINKS;
            move_mount(&fd, c"", CWD, target.as_c_str(), flags)?;
            drop(fd);
            if *read_only {
                mount_remount(target.as_c_str(), MountFlags::BIND | MountFlags::RDONLY, c"")?;
            }
        }
        Ok(())
    }
}

/// The child's stack while it runs in the daemon's memory, before it execs: it only makes system calls.
const CHILD_STACK: usize = 256 << 10;

/// The bottom of the child's stack, mapped without access so that an overflow faults instead of writing below.
const GUARD: usize = 4096;

/// A stack for one child, mapped for it and unmapped after: only the pages it touches are ever resident (the
/// daemon's memory is locked as it is touched), and nothing stays behind in the allocator.
struct ChildStack(*mut libc::c_void);

impl ChildStack {
    fn new() -> std::io::Result<Self> {
        use rustix::mm::{MapFlags, MprotectFlags, ProtFlags};
        // SAFETY: a new private anonymous mapping that nothing else refers to; its lowest page is made
        // inaccessible, within the mapping.
        #[expect(unsafe_code, reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound")]
        unsafe {
            let base = rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                CHILD_STACK,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::STACK | MapFlags::NORESERVE,
            )?;
            let stack = Self(base);
            rustix::mm::mprotect(base, GUARD, MprotectFlags::empty())?;
            Ok(stack)
        }
    }

    /// The top of the stack (it grows down), 16-byte aligned.
    fn top(&self) -> *mut libc::c_void {
        self.0.cast::<u8>().wrapping_add(CHILD_STACK).cast()
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer used: the child has exec'd or exited.
        #[expect(unsafe_code, reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound")]
        unsafe {
            let _ = rustix::mm::munmap(self.0, CHILD_STACK);
        }
    }
}

/// A container process, prepared by the daemon to be started by [`Spawn::spawn`].
pub struct Spawn {
    /// The paths the command is tried at, in order (`execvp`'s search, made by the daemon): the program itself
    /// when it names a path, else the program in each `PATH` directory.
    pub candidates: Vec<CString>,
    /// The arguments, the program first.
    pub argv: Vec<CString>,
    /// The whole environment, as `NAME=value`.
    pub envp: Vec<CString>,
    /// Descriptors for the child's standard input, output and error.
    pub stdio: [OwnedFd; 3],
    /// The steps before exec.
    pub setup: ChildSetup,
    /// The container cgroup's directory, when the child can be created in it (a cgroup v2 directory and a kernel
    /// that allows clone3, see [`clone3_usable`]): then it does not move itself there. A move takes the cgroup
    /// mutex and the write side of the kernel's lock against concurrent forks: it holds up every fork on the node
    /// while it has that lock, and first waits for an RCU grace period to get it. Creating the child in the cgroup
    /// takes the cgroup mutex and only the read side, as every fork does. The cgroup's `pids.max` is then
    /// enforced at the fork (EAGAIN, a failed start), where a move would have let the process in over the limit.
    pub cgroup: Option<OwnedFd>,
}

/// A started container process: its PID and a pidfd for it.
pub struct Spawned {
    /// Its process ID.
    pub pid: u32,
    /// A pidfd (close-on-exec): readable once the process exited, and the handle to collect its status with.
    pub pidfd: OwnedFd,
}

/// What the child reads, in the daemon's memory: pointers prepared before the clone.
struct ChildArgs<'a> {
    spawn: &'a Spawn,
    candidates: Vec<*const libc::c_char>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    /// For each candidate, the argv of `/bin/sh` running it as a script: `sh`, the candidate, the arguments.
    sh_argv: Vec<Vec<*const libc::c_char>>,
    /// The child was created in the container cgroup.
    born_in_cgroup: bool,
    /// The errno of the step that failed, set by the child before it exits; 0 when it exec'd.
    error: std::sync::atomic::AtomicI32,
}

fn null_terminated(v: &[CString]) -> Vec<*const libc::c_char> {
    v.iter().map(|c| c.as_ptr()).chain(std::iter::once(std::ptr::null())).collect()
}

fn errno() -> rustix::io::Errno {
    rustix::io::Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(rustix::io::Errno::IO)
}

impl ChildArgs<'_> {
    /// Runs in the child. Returns only when the command could not be exec'd.
    fn run(&self) -> rustix::io::Errno {
        // SAFETY: the child has its own signal handlers (no CLONE_SIGHAND), so setting them to the default does not
        // touch the daemon's; these are plain system calls, made raw so that they reach the signals the C library
        // keeps to itself too. The daemon's handlers are gone before signals are unblocked (a failure stops the
        // child first), so none runs in the child on the shared memory.
        #[expect(unsafe_code, reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound")]
        unsafe {
            // The kernel's `struct sigaction` with SIG_DFL (0), no flags, no restorer and an empty mask.
            let default = [0usize; 4];
            for sig in 1..=64 {
                if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                    let sig = libc::c_long::from(sig);
                    let none = std::ptr::null_mut::<usize>();
                    if libc::syscall(libc::SYS_rt_sigaction, sig, default.as_ptr(), none, SIGSET_SIZE) < 0 {
                        return errno();
                    }
                }
            }
            if set_signal_mask(0, None) < 0 {
                return errno();
            }
        }
        for (target, fd) in (0..).zip(&self.spawn.stdio) {
            use std::os::fd::AsRawFd;
            let fd = fd.as_raw_fd();
            // SAFETY: `dup2` and `fcntl` on descriptors the child owns a copy of (no CLONE_FILES).
            #[expect(
                unsafe_code,
                reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound"
            )]
            let ok = unsafe { if fd == target { libc::fcntl(fd, libc::F_SETFD, 0) } else { libc::dup2(fd, target) } };
            if ok < 0 {
                return errno();
            }
        }
        if let Err(e) = self.spawn.setup.run(self.born_in_cgroup) {
            return e;
        }
        // As execvp: a missing file or directory (or one that cannot be reached) moves on to the next candidate, so
        // does a denied one (reported if nothing else is found), anything else stops; a file that is not an
        // executable format runs as a shell script.
        let mut failed = rustix::io::Errno::NOENT;
        for (i, &path) in self.candidates.iter().enumerate() {
            // SAFETY: `path`, `argv`, `envp` and the shell's argv point into C strings and null-terminated arrays
            // that the daemon keeps alive until this child has exec'd or exited.
            #[expect(
                unsafe_code,
                reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound"
            )]
            unsafe {
                libc::execve(path, self.argv.as_ptr(), self.envp.as_ptr());
                if errno() == rustix::io::Errno::NOEXEC {
                    if let Some(sh) = self.sh_argv.get(i) {
                        libc::execve(c"/bin/sh".as_ptr(), sh.as_ptr(), self.envp.as_ptr());
                    }
                    return rustix::io::Errno::NOEXEC;
                }
            }
            match errno() {
                rustix::io::Errno::NOENT
                | rustix::io::Errno::NOTDIR
                | rustix::io::Errno::STALE
                | rustix::io::Errno::NODEV
                | rustix::io::Errno::TIMEDOUT => {}
                rustix::io::Errno::ACCESS => failed = rustix::io::Errno::ACCESS,
                e => return e,
            }
        }
        failed
    }
}

/// The size of the kernel's signal set, in bytes.
const SIGSET_SIZE: libc::c_long = 8;

/// Sets the calling thread's signal mask to `mask` (one bit per signal, the C library's own signals included),
/// returning the old one in `old`; the raw system call's result.
///
/// # Safety
/// Only for the spawn: blocking every signal of the thread for the duration of a clone, and unblocking them in the
/// child.
#[expect(unsafe_code, reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound")]
unsafe fn set_signal_mask(mask: u64, old: Option<&mut u64>) -> libc::c_long {
    let old = old.map_or(std::ptr::null_mut(), std::ptr::from_mut);
    // SAFETY: `mask` and `old` are valid for the kernel's 8-byte signal set.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::c_long::from(libc::SIG_SETMASK),
            std::ptr::from_ref(&mask),
            old,
            SIGSET_SIZE,
        )
    }
}

extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildArgs` that `Spawn::spawn` passed to the clone; the daemon's thread that owns it is
    // suspended (CLONE_VFORK) until this child execs or exits, so it is alive and nobody else writes it.
    #[expect(unsafe_code, reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound")]
    let args = unsafe { &*arg.cast::<ChildArgs<'_>>() };
    let e = args.run();
    args.error.store(e.raw_os_error(), std::sync::atomic::Ordering::Release);
    // SAFETY: ends the child at once, without running anything of the daemon's (no atexit handlers, no flushes).
    #[expect(unsafe_code, reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound")]
    unsafe {
        libc::_exit(127)
    }
}

/// The kernel's `struct clone_args` for clone3(2), up to `cgroup` (its second version, 88 bytes).
#[cfg(target_arch = "x86_64")]
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

#[cfg(target_arch = "x86_64")]
const _: () = {
    use std::mem::offset_of;
    assert!(size_of::<CloneArgs>() == 88, "CLONE_ARGS_SIZE_VER2");
    assert!(offset_of!(CloneArgs, pidfd) == 8);
    assert!(offset_of!(CloneArgs, exit_signal) == 32);
    assert!(offset_of!(CloneArgs, stack) == 40);
    assert!(offset_of!(CloneArgs, stack_size) == 48);
    assert!(offset_of!(CloneArgs, cgroup) == 80);
};

/// clone3's flag to create the child in the cgroup of `clone_args.cgroup` (Linux 5.7).
#[cfg(target_arch = "x86_64")]
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Cleared when a kernel that has clone3 refused `CLONE_INTO_CGROUP` (Linux 5.3 to 5.6) and clone(2) started the
/// child instead: later children move themselves into their cgroup.
static CLONE3_WORKS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Whether children can be created in their cgroup: clone3 exists and is allowed, and has not refused
/// `CLONE_INTO_CGROUP`. Whether clone3 is allowed is asked once, with no arguments, which a kernel that has it
/// answers with EINVAL and creates nothing; ENOSYS (an old kernel, or a seccomp filter, as container runtimes'
/// default profiles have) or EPERM (a seccomp filter) mean no. A filter cannot look into clone3's arguments, so
/// it refuses every call alike, and an EPERM on a real call is the start's own error (a security module's).
pub(super) fn clone3_usable() -> bool {
    static ALLOWED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    let allowed = *ALLOWED.get_or_init(|| {
        // SAFETY: a clone3 whose argument size (0) is below the smallest the kernel knows is refused before
        // anything is read or created.
        #[expect(unsafe_code, reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound")]
        let ret = unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<libc::c_void>(), 0usize) };
        let errno = std::io::Error::last_os_error();
        let allowed = ret == -1 && errno.raw_os_error() == Some(libc::EINVAL);
        if !allowed {
            tracing::info!(
                error = %errno,
                "the kernel refuses clone3: container processes move themselves into their cgroups"
            );
        }
        allowed
    });
    allowed && CLONE3_WORKS.load(std::sync::atomic::Ordering::Relaxed)
}

/// The flags shared by both ways of starting a child: it shares the daemon's memory, the calling thread waits for
/// its exec or exit, and the kernel makes a pidfd for it.
const CLONE_FLAGS: libc::c_int = libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD;

/// Starts `child_main(arg)` on `stack` with clone(2), through the C library, which runs the function on the new
/// stack. Returns the child's PID.
///
/// # Safety
/// As for [`Spawn::spawn`]'s clone: every signal blocked, `arg` a `ChildArgs` alive until this returns, `pidfd`
/// writable.
#[expect(unsafe_code, reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound")]
unsafe fn clone_vfork(stack: &ChildStack, arg: *mut libc::c_void, pidfd: *mut libc::c_int) -> std::io::Result<i32> {
    // SAFETY: as the caller guarantees; CLONE_VFORK keeps `stack` and `arg` alive until the child execs or exits.
    let pid = unsafe { libc::clone(child_main, stack.top(), CLONE_FLAGS | libc::SIGCHLD, arg, pidfd) };
    if pid < 0 { Err(std::io::Error::last_os_error()) } else { Ok(pid) }
}

/// Whether clone3's error, once [`clone3_usable`] said yes, is a refusal of `CLONE_INTO_CGROUP` by a kernel too
/// old for it (E2BIG: the `cgroup` field is past what it knows; ENOSYS for good measure): the child can still be
/// started with clone(2) and move itself into its cgroup. Any other error is the start's own and fails it as a
/// move would have: EAGAIN at the cgroup's `pids.max`, EBUSY where controllers are enabled in its
/// `cgroup.subtree_control`, ENODEV for a removed cgroup, EPERM or EACCES from a security module.
fn clone3_refused(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::E2BIG))
}

/// Starts `child_main(arg)` on `stack` with clone3(2), created in the cgroup whose directory `cgroup` is. The C
/// library has no clone3 for a child that runs a function on its own stack, so the system call is made here: the
/// child, on its new stack with its registers as the parent's, clears the frame pointer (a backtrace ends there)
/// and calls `child_main`, which never returns (it execs or exits; the `exit` after it is a guard). Returns the
/// child's PID, or the kernel's error (see [`clone3_refused`]).
///
/// # Safety
/// As for [`clone_vfork`].
#[cfg(target_arch = "x86_64")]
#[expect(unsafe_code, reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound")]
unsafe fn clone3_in_cgroup(
    stack: &ChildStack,
    cgroup: std::os::fd::BorrowedFd<'_>,
    arg: *mut libc::c_void,
    pidfd: *mut libc::c_int,
) -> std::io::Result<i32> {
    use std::os::fd::AsRawFd;
    let clone_args = CloneArgs {
        flags: u64::from(CLONE_FLAGS.cast_unsigned()) | CLONE_INTO_CGROUP,
        pidfd: pidfd.expose_provenance() as u64,
        exit_signal: u64::from(libc::SIGCHLD.cast_unsigned()),
        stack: stack.0.expose_provenance() as u64,
        stack_size: CHILD_STACK as u64,
        cgroup: u64::from(cgroup.as_raw_fd().cast_unsigned()),
        ..CloneArgs::default()
    };
    let main: extern "C" fn(*mut libc::c_void) -> libc::c_int = child_main;
    let ret: i64;
    // SAFETY: the system call's arguments are valid for it (`clone_args` read by the kernel during the call, the
    // stack mapped for the child). The parent's registers other than rax, rcx and r11 are kept and it does not
    // touch its stack (`nostack`). The child starts at the instruction after `syscall` with rax 0, the stack
    // pointer at the top of `stack` (16-byte aligned, so `call` leaves the alignment the C ABI expects), and r12
    // and r13 as the parent had them: it calls `child_main(arg)`, which does not return, so the child's clearing
    // of rbp is never seen by the parent's code.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "mov rdi, r13",
            "call r12",
            "mov edi, eax",
            "mov eax, {exit}",
            "syscall",
            "ud2",
            "2:",
            exit = const libc::SYS_exit,
            inlateout("rax") libc::SYS_clone3 => ret,
            in("rdi") &raw const clone_args,
            in("rsi") size_of::<CloneArgs>(),
            in("r12") main,
            in("r13") arg,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    match ret {
        0.. => i32::try_from(ret).map_err(std::io::Error::other),
        e => Err(std::io::Error::from_raw_os_error(i32::try_from(-e).unwrap_or(libc::EIO))),
    }
}

/// Without clone3 on this architecture, every child moves itself into its cgroup: the runtime gives no child a
/// cgroup directory here, so this is not called.
///
/// # Safety
/// None needed; the signature is [`clone3_in_cgroup`]'s on x86-64.
#[cfg(not(target_arch = "x86_64"))]
#[expect(unsafe_code, reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound")]
unsafe fn clone3_in_cgroup(
    _: &ChildStack,
    _: std::os::fd::BorrowedFd<'_>,
    _: *mut libc::c_void,
    _: *mut libc::c_int,
) -> std::io::Result<i32> {
    Err(std::io::Error::from_raw_os_error(libc::ENOSYS))
}

impl Spawn {
    /// Starts the process as `posix_spawn` does: the child shares the daemon's memory, the calling thread waits
    /// until it has exec'd (or failed), so nothing of the daemon is copied. A fork would copy the page tables of
    /// the whole locked daemon and make both sides copy every page the daemon writes until the exec. The child is
    /// created in its cgroup where the kernel can (clone3, `CLONE_INTO_CGROUP`), else it moves itself there. Blocks
    /// for the child's steps. Returns the errno of the step that failed.
    pub fn spawn(&self) -> std::io::Result<Spawned> {
        let mut args = ChildArgs {
            spawn: self,
            candidates: self.candidates.iter().map(|c| c.as_ptr()).collect(),
            argv: null_terminated(&self.argv),
            envp: null_terminated(&self.envp),
            sh_argv: self
                .candidates
                .iter()
                .map(|c| {
                    [c"/bin/sh".as_ptr(), c.as_ptr()]
                        .into_iter()
                        .chain(self.argv.iter().skip(1).map(|a| a.as_ptr()))
                        .chain(std::iter::once(std::ptr::null()))
                        .collect()
                })
                .collect(),
            born_in_cgroup: false,
            error: std::sync::atomic::AtomicI32::new(0),
        };
        let stack = ChildStack::new()?;
        let mut pidfd: libc::c_int = -1;
        // A child that changes its user or group changes the dumpable flag of the memory it shares with the daemon;
        // the daemon's own is put back after the exec.
        let dumpable = rustix::process::dumpable_behavior().ok();
        let into_cgroup = self.cgroup.as_ref().filter(|_| clone3_usable());
        // SAFETY: every signal is blocked around the clone so that no handler of the daemon's runs in the child
        // before it resets them; the child runs `child_main` on `stack` with `args`, both alive until the clone
        // returns (CLONE_VFORK: after the child's exec or exit). The kernel writes the pidfd (CLONE_PIDFD) to
        // `pidfd`. `args` is not touched while a child runs.
        #[expect(unsafe_code, reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound")]
        let (pid, refused) = unsafe {
            let mut old = 0u64;
            if set_signal_mask(!0, Some(&mut old)) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let mut pid = None;
            let mut refused = None;
            if let Some(cgroup) = into_cgroup {
                args.born_in_cgroup = true;
                match clone3_in_cgroup(&stack, cgroup.as_fd(), (&raw mut args).cast(), &raw mut pidfd) {
                    Err(e) if clone3_refused(&e) => refused = Some(e),
                    started => pid = Some(started),
                }
            }
            let pid = pid.unwrap_or_else(|| {
                args.born_in_cgroup = false;
                clone_vfork(&stack, (&raw mut args).cast(), &raw mut pidfd)
            });
            set_signal_mask(old, None);
            (pid, refused)
        };
        // Remembered only once clone(2) did start the child: the refusal was of clone3, not of any new process.
        if let Some(e) = refused
            && pid.is_ok()
            && CLONE3_WORKS.swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::info!(
                error = %e,
                "the kernel refuses clone3 with CLONE_INTO_CGROUP: container processes move themselves into their \
                 cgroups"
            );
        }
        if let Some(d) = dumpable
            && rustix::process::dumpable_behavior().ok() != Some(d)
        {
            let _ = rustix::process::set_dumpable_behavior(d);
        }
        drop(stack);
        let pid = pid.map_err(|e| match e.raw_os_error() {
            Some(libc::EAGAIN) => std::io::Error::new(
                e.kind(),
                format!(
                    "{e}: pids.max of the container's cgroup or one above it (podPidsLimit), or the node's limit \
                     of processes, is reached"
                ),
            ),
            _ => e,
        })?;
        // SAFETY: CLONE_PIDFD made `pidfd` a new descriptor that nothing else owns.
        #[expect(unsafe_code, reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound")]
        let pidfd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(pidfd) };
        match args.error.load(std::sync::atomic::Ordering::Acquire) {
            0 => Ok(Spawned { pid: pid.unsigned_abs(), pidfd }),
            e => {
                // The child exited without exec: collect it.
                let _ = rustix::process::waitid(
                    rustix::process::WaitId::PidFd(pidfd.as_fd()),
                    rustix::process::WaitIdOptions::EXITED,
                );
                Err(std::io::Error::from_raw_os_error(e))
            }
        }
    }
}

/// Waits for the exit of a process started by [`Spawn::spawn`] and collects it: its exit code, or the signal that
/// ended it.
pub async fn wait_exit(pidfd: OwnedFd) -> std::io::Result<(Option<i32>, Option<i32>)> {
    use rustix::process::{WaitId, WaitIdOptions, waitid};
    let exited = match pidfd.try_clone() {
        Ok(fd) => pidfd_exited(fd).await,
        Err(e) => Err(e),
    };
    let status = match exited {
        Ok(()) => waitid(WaitId::PidFd(pidfd.as_fd()), WaitIdOptions::EXITED | WaitIdOptions::NOHANG)?,
        // It cannot be watched: a blocking wait, off the async threads, so that it is still collected.
        Err(_) => tokio::task::spawn_blocking(move || waitid(WaitId::PidFd(pidfd.as_fd()), WaitIdOptions::EXITED))
            .await
            .map_err(std::io::Error::other)??,
    };
    let status = status.ok_or_else(|| std::io::Error::other("the process has not exited"))?;
    Ok((status.exit_status(), status.terminating_signal()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_read_after_the_last_parenthesis() {
        let fields = "S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 4242 20 21";
        assert_eq!(parse_start_ticks(&format!("12 (a) b) c) {fields}")), Some(4242));
        assert_eq!(parse_start_ticks(&format!("12 (sh) {fields}")), Some(4242));
        assert_eq!(parse_start_ticks("12 (sh) S 1 2"), None);
        assert_eq!(parse_start_ticks("garbage"), None);
        assert_eq!(parse_start_ticks(&format!("12 (sh) {}", fields.replace("4242", "x"))), None);
        let own = start_ticks(std::process::id()).unwrap();
        assert!(own > 0 && start_ticks(std::process::id()) == Some(own), "stable for a process");
    }

    #[test]
    fn only_a_refusal_of_clone3_itself_falls_back_to_a_move() {
        let refused = |e| clone3_refused(&std::io::Error::from_raw_os_error(e));
        // A kernel with clone3 but without CLONE_INTO_CGROUP (5.3 to 5.6): a clone_args size it does not know.
        assert!(refused(libc::E2BIG) && refused(libc::ENOSYS));
        // The start's own errors fail it: the cgroup's pids.max reached, a cgroup that is no leaf, one removed, a
        // security module's refusal (a seccomp filter would have refused the probe of `clone3_usable` already).
        for e in [libc::EAGAIN, libc::EBUSY, libc::ENODEV, libc::ENOENT, libc::EACCES, libc::EPERM] {
            assert!(!refused(e), "errno {e}");
        }
    }

    #[test]
    fn clone3_is_allowed_on_this_kernel_where_it_exists() {
        // Linux 5.3 and later have clone3; this checks the probe, which must not say no where the call works.
        let release = rustix::system::uname().release().to_string_lossy().into_owned();
        let mut parts = release.split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
        let version = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        if cfg!(target_arch = "x86_64") && version >= (5, 7) {
            // A seccomp filter may still forbid it (as some container sandboxes do): then there is nothing to test.
            let filtered = std::fs::read_to_string("/proc/self/status")
                .is_ok_and(|s| s.lines().any(|l| l.starts_with("Seccomp:") && !l.ends_with('0')));
            assert!(clone3_usable() || filtered, "clone3 refused on {release}");
        }
    }
}
