//! Launching a container process. The daemon starts a child (sharing its memory until the exec, as `posix_spawn`
//! does, see `sys::Spawn`) and the child, before it execs the container's command, joins the container cgroup (a
//! main process is created in it, through a descriptor of the cgroup's directory, where the kernel allows; a
//! command run in the container, or a main process where the kernel refuses, writes itself to the cgroup's
//! `cgroup.procs`, which the resources crate names and the daemon opens beforehand), sets its `oom_score_adj`,
//! makes the volume mounts in a private mount namespace, changes to the working directory and takes the
//! container's user. So the command's first instruction already runs inside its cgroup, and nothing it forks can
//! escape the accounting. Everything the child needs is prepared here, in the daemon, so that the child only makes
//! system calls (see `sys::ChildSetup`). A volume whose mountPath does not exist on the node is mounted in an overlay
//! of the nearest directory above it, in the container's mount namespace only (see `overlay`): the plan, the
//! overlay's directories under the container's scratch directory and every path the child uses are made here.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use std::os::fd::OwnedFd;

use super::overlay::{self, Probe, Wanted};
use super::sys::{ChildSetup, OverlaySetup, Spawn, Submount, clone3_usable};
use crate::seam::Mount;

/// What a container process is started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ExecRequest {
    /// The container cgroup's `cgroup.procs`.
    pub cgroup_procs: PathBuf,
    /// Its `oom_score_adj`.
    pub oom_score_adj: i32,
    /// The command.
    pub argv: Vec<String>,
    /// The whole environment.
    pub env: Vec<(String, String)>,
    /// The working directory.
    pub working_dir: PathBuf,
    /// `runAsUser`.
    pub user: Option<u32>,
    /// `runAsGroup`, or the user's primary group.
    pub group: Option<u32>,
    /// The supplementary groups: the pod's `fsGroup`, then its `supplementalGroups`.
    pub groups: Vec<u32>,
    /// `allowPrivilegeEscalation: false`.
    pub no_new_privs: bool,
    /// `capabilities.drop`.
    pub drop_capabilities: rustix::thread::CapabilitySet,
    /// Bind mounts.
    pub mounts: Vec<Mount>,
    /// The container's scratch directory (`<scratch>/<container id>`), where the overlays of its missing
    /// mountPaths get their directories; `None` when the container's ID cannot name one.
    pub scratch: Option<PathBuf>,
    /// The mount namespace to join instead of making the mounts (`/proc/<pid>/ns/mnt` of the container's running
    /// main process): a command run in a running container sees what its main process sees, as a CRI exec does.
    pub mount_ns: Option<PathBuf>,
}

/// The exit code of a container whose command could not be started, as runc reports one.
pub const START_FAILED: i32 = 128;

/// Opens `p` close-on-exec with `flags`, the error naming it.
fn open(p: &Path, flags: rustix::fs::OFlags) -> Result<OwnedFd, String> {
    rustix::fs::open(p, flags | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
        .map_err(|e| format!("cannot open {}: {e}", p.display()))
}

fn c_path(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| format!("path {} contains a NUL byte", p.display()))
}

impl ExecRequest {
    /// The steps the child takes before exec, with the program and its arguments. The checks that can be made
    /// before the child exists are made here, with messages that name what is wrong; the child can only report an
    /// errno.
    ///
    /// Also returns the overlay directories made for this start under the container's scratch directory (see
    /// [`OverlayDirs`]).
    fn prepare(&self) -> Result<(&String, &[String], ChildSetup, OverlayDirs), String> {
        let (program, args) = self.argv.split_first().ok_or("no command")?;
        if program.is_empty() {
            return Err("the command's program is an empty string".into());
        }
        if let Some(ns) = &self.mount_ns {
            return self.joining(ns).map(|setup| (program, args, setup, OverlayDirs::default()));
        }
        let missing: Vec<&Path> =
            self.mounts.iter().filter(|m| !m.target.exists()).map(|m| m.target.as_path()).collect();
        let plan = if missing.is_empty() { None } else { Some(self.plan()?) };
        let targets =
            plan.as_ref().map_or_else(|| self.mounts.iter().map(|m| m.target.clone()).collect(), |p| p.targets.clone());
        let mounts = self
            .mounts
            .iter()
            .zip(&targets)
            .map(|(m, target)| Ok((c_path(&m.source)?, c_path(target)?, m.read_only)))
            .collect::<Result<Vec<_>, String>>()?;
        // A working directory in a volume, or one of the directories made for a missing mountPath, exists in the
        // container only.
        let made = |w: &Path| missing.iter().any(|t| t.starts_with(w));
        if !self.working_dir.is_dir()
            && self.mounts.iter().all(|m| !self.working_dir.starts_with(&m.target))
            && !made(&self.working_dir)
        {
            return Err(format!("workingDir {} is not a directory on this node", self.working_dir.display()));
        }
        let procs = open(&self.cgroup_procs, rustix::fs::OFlags::WRONLY)?;
        // Last, as the one step that leaves something on the node (removed again if a later step fails).
        let mut dirs = OverlayDirs::default();
        let overlays = match &plan {
            Some(plan) => self.overlays(plan, &mut dirs)?,
            None => Vec::new(),
        };
        // With overlays, every source is taken before they cover the node's paths (see `sys::ChildSetup`).
        let sources =
            if overlays.is_empty() { Vec::new() } else { mounts.iter().map(|_| AtomicI32::new(-1)).collect() };
        let setup = self.setup(procs, mounts, overlays, sources, None)?;
        Ok((program, args, setup, dirs))
    }

    /// The steps of a command run in the mount namespace `ns` of a running container: nothing is mounted; the
    /// working directory is the container's, checked by the child once it has joined.
    fn joining(&self, ns: &Path) -> Result<ChildSetup, String> {
        let procs = open(&self.cgroup_procs, rustix::fs::OFlags::WRONLY)?;
        let ns = open(ns, rustix::fs::OFlags::RDONLY)?;
        self.setup(procs, Vec::new(), Vec::new(), Vec::new(), Some(ns))
    }

    /// The child's steps: this request's user, groups, capabilities and working directory, with the mounts made
    /// (or the namespace joined) as given.
    fn setup(
        &self,
        procs: OwnedFd,
        mounts: Vec<(CString, CString, bool)>,
        overlays: Vec<OverlaySetup>,
        sources: Vec<AtomicI32>,
        mount_ns: Option<OwnedFd>,
    ) -> Result<ChildSetup, String> {
        Ok(ChildSetup {
            procs,
            oom_score_adj: self.oom_score_adj.to_string().into_bytes(),
            mounts,
            overlays,
            sources,
            mount_ns,
            working_dir: c_path(&self.working_dir)?,
            user: self.user,
            group: self.group,
            groups: self.groups.iter().map(|g| rustix::process::Gid::from_raw(*g)).collect(),
            no_new_privs: self.no_new_privs,
            drop_capabilities: self.drop_capabilities,
        })
    }

    /// The plan of the volumes' mounts, from this node's file system and the daemon's mount table (the calling
    /// thread's, which the child starts with).
    fn plan(&self) -> Result<overlay::Plan, String> {
        let wanted: Vec<Wanted<'_>> =
            self.mounts.iter().map(|m| Wanted { target: &m.target, source_is_dir: m.source.is_dir() }).collect();
        for m in &self.mounts {
            if !m.target.exists() && !m.source.exists() {
                return Err(format!(
                    "the source {} of mountPath {} does not exist",
                    m.source.display(),
                    m.target.display()
                ));
            }
        }
        let mountinfo = std::fs::read_to_string(MOUNTINFO).map_err(|e| format!("cannot read {MOUNTINFO}: {e}"))?;
        let resolve = |p: &Path| std::fs::canonicalize(p).map_err(|e| format!("cannot resolve {}: {e}", p.display()));
        overlay::plan(&wanted, Probe::of, resolve, &mountinfo)
    }

    /// What the child needs for the plan's overlays: for each, a fresh directory under the container's scratch
    /// directory (recorded in `dirs`) with the overlay's upper, work and merged directories, and every path as a C
    /// string.
    fn overlays(&self, plan: &overlay::Plan, dirs: &mut OverlayDirs) -> Result<Vec<OverlaySetup>, String> {
        let scratch = self.scratch.as_deref().ok_or("the container's ID cannot name a scratch directory")?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(scratch)
            .map_err(|e| format!("cannot create the scratch directory {}: {e}", scratch.display()))?;
        let on_tmpfs = !can_hold_upper(scratch)?;
        let mut merged = Vec::with_capacity(plan.overlays.len());
        let mut setups = Vec::with_capacity(plan.overlays.len());
        for o in &plan.overlays {
            let dir = fresh_dir(scratch)?;
            dirs.0.push(dir.clone());
            let mkdir = |d: &Path| std::fs::create_dir(d).map_err(|e| format!("cannot create {}: {e}", d.display()));
            let (tmpfs, layers) =
                if on_tmpfs { (Some(dir.join("layers")), dir.join("layers")) } else { (None, dir.clone()) };
            let (upper, work, here) = (layers.join("upper"), layers.join("work"), dir.join("merged"));
            mkdir(&here)?;
            match &tmpfs {
                Some(t) => mkdir(t)?,
                None => {
                    mkdir(&upper)?;
                    mkdir(&work)?;
                }
            }
            overlay::check_option_path("the process runtime's scratch directory", &upper)?;
            let meta = std::fs::metadata(&o.lower).map_err(|e| format!("cannot read {}: {e}", o.lower.display()))?;
            let mut options = b"lowerdir=".to_vec();
            options.extend_from_slice(o.lower.as_os_str().as_bytes());
            options.extend_from_slice(b",upperdir=");
            options.extend_from_slice(upper.as_os_str().as_bytes());
            options.extend_from_slice(b",workdir=");
            options.extend_from_slice(work.as_os_str().as_bytes());
            let inside = |p: &Path| -> Result<CString, String> {
                let rel = p
                    .strip_prefix(&o.lower)
                    .map_err(|_| format!("{} is not below {}", p.display(), o.lower.display()))?;
                c_path(&here.join(rel))
            };
            let submounts = o
                .submounts
                .iter()
                .map(|s| Ok(Submount { host: c_path(s)?, inside: inside(s)?, fd: AtomicI32::new(-1) }))
                .collect::<Result<_, String>>()?;
            let create =
                o.create.iter().map(|(p, d)| Ok((c_path(&here.join(p))?, *d))).collect::<Result<_, String>>()?;
            setups.push(OverlaySetup {
                tmpfs: tmpfs.as_deref().map(c_path).transpose()?,
                upper: c_path(&upper)?,
                work: c_path(&work)?,
                owner: (
                    rustix::process::Uid::from_raw(meta.uid()),
                    rustix::process::Gid::from_raw(meta.gid()),
                    rustix::fs::Mode::from_raw_mode(meta.mode() & 0o7777),
                ),
                merged: c_path(&here)?,
                options: CString::new(options).map_err(|_| "an overlay's options contain a NUL byte".to_owned())?,
                submounts,
                create,
                dest: None,
            });
            merged.push(here);
        }
        // An overlay goes into the overlay of the directory above it, else over its own directory, else (the root
        // directory) becomes the container's root.
        for (i, o) in plan.overlays.iter().enumerate() {
            let dest = match o.parent {
                Some(p) => {
                    let above = plan.overlays.get(p).zip(merged.get(p)).ok_or("an overlay's parent is missing")?;
                    let rel = o.lower.strip_prefix(&above.0.lower).map_err(|_| "an overlay is not below its parent")?;
                    Some(c_path(&above.1.join(rel))?)
                }
                None if o.lower == Path::new("/") => None,
                None => Some(c_path(&o.lower)?),
            };
            if let Some(s) = setups.get_mut(i) {
                s.dest = dest;
            }
        }
        Ok(setups)
    }

    /// The command, with the steps its child takes before exec, for a process whose output the daemon reads.
    /// With the overlay directories made for it, to be removed once the process has exited.
    pub(super) fn command(&self) -> Result<(tokio::process::Command, OverlayDirs), String> {
        let (program, args, setup, dirs) = self.prepare()?;
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args).env_clear().envs(self.env.iter().map(|(k, v)| (k, v))).stdin(std::process::Stdio::null());
        setup.install(&mut cmd);
        Ok((cmd, dirs))
    }

    /// A container's main process, writing to `stdout` and `stderr`, to be started by [`Spawn::spawn`].
    /// Its overlay directories stay until the container is removed (see `ProcessRuntime::remove`).
    pub(super) fn spawn(&self, stdout: OwnedFd, stderr: OwnedFd) -> Result<Spawn, String> {
        let (program, args, setup, dirs) = self.prepare()?;
        dirs.keep();
        let c = |s: &str| CString::new(s).map_err(|_| format!("{s:?} contains a NUL byte"));
        let path = self.env.iter().rev().find(|(k, _)| k == "PATH").map_or("", |(_, v)| v.as_str());
        let candidates = search(program, path).into_iter().map(|p| c_path(&p)).collect::<Result<_, _>>()?;
        let argv = std::iter::once(program).chain(args).map(|a| c(a)).collect::<Result<_, _>>()?;
        let envp = self.env.iter().map(|(k, v)| c(&format!("{k}={v}"))).collect::<Result<_, _>>()?;
        let stdin = rustix::fs::open(
            c"/dev/null",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| format!("cannot open /dev/null: {e}"))?;
        Ok(Spawn { candidates, argv, envp, stdio: [stdin, stdout, stderr], setup, cgroup: self.cgroup_dir()? })
    }

    /// The container cgroup's directory, open for the child to be created in, when it is a cgroup v2 directory
    /// and the kernel lets a child be created in it (else `None`: the child joins through `cgroup.procs`, as in
    /// tests on a plain directory).
    fn cgroup_dir(&self) -> Result<Option<OwnedFd>, String> {
        use rustix::fs::{Mode, OFlags};
        if !clone3_usable() {
            return Ok(None);
        }
        let Some(dir) = self.cgroup_procs.parent() else { return Ok(None) };
        let fd = rustix::fs::open(dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| format!("cannot open {}: {e}", dir.display()))?;
        let st = rustix::fs::fstatfs(&fd).map_err(|e| format!("cannot statfs {}: {e}", dir.display()))?;
        Ok((st.f_type == nodewarden_resources::CGROUP2_SUPER_MAGIC).then_some(fd))
    }
}

/// The mount table the plan reads: the calling thread's, whose mount namespace a child starts with.
const MOUNTINFO: &str = "/proc/thread-self/mountinfo";

/// The directories made for one start's overlays, removed when this is dropped (best effort, logged): a command
/// run in the container keeps them until it has exited, a start that fails before its child exists not at all. A
/// container's main process keeps them until the container is removed ([`OverlayDirs::keep`]). Something a
/// command left running in its mount namespace loses what it wrote to the overlays (their upper directories go);
/// its volumes are untouched.
#[derive(Debug, Default)]
pub(super) struct OverlayDirs(Vec<PathBuf>);

impl OverlayDirs {
    /// Leaves the directories to the removal of the container's scratch directory.
    pub(super) fn keep(mut self) {
        self.0.clear();
    }
}

impl Drop for OverlayDirs {
    fn drop(&mut self) {
        for dir in self.0.drain(..) {
            remove_logged(&dir);
        }
    }
}

/// Removes `dir` and everything in it, as root (an overlay's work directory holds a directory of mode 000); a
/// failure is logged. Also removes a container's whole scratch directory when it is removed.
pub(super) fn remove_logged(dir: &Path) {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a container's overlay directories"),
    }
}

/// Numbers the overlay directories, so that no two overlays ever share an upper directory; a number taken by an
/// earlier daemon's directory is skipped (see [`fresh_dir`]).
static NEXT_OVERLAY: AtomicU64 = AtomicU64::new(0);

/// A new directory `overlay-<n>` in `scratch`, made here (never one that exists: an overlay of a running
/// container, adopted from an earlier daemon, may use it).
fn fresh_dir(scratch: &Path) -> Result<PathBuf, String> {
    loop {
        let dir = scratch.join(format!("overlay-{}", NEXT_OVERLAY.fetch_add(1, Ordering::Relaxed)));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
        }
    }
}

/// File systems that cannot be an overlay's upper layer: overlayfs (refused as upperdir), NFS, 9p and FUSE.
const NO_UPPER: [i128; 4] = [0x794c_7630, 0x6969, 0x0102_1997, 0x6573_5546];

/// Whether the file system of `dir` can be an overlay's upper layer; where it cannot (a root file system that is
/// an overlay itself, as in the test VM or a node running in a container), the child puts the upper and work
/// directories on a tmpfs of its own instead, charged to the container's memory.
fn can_hold_upper(dir: &Path) -> Result<bool, String> {
    let st = rustix::fs::statfs(dir).map_err(|e| format!("cannot statfs {}: {e}", dir.display()))?;
    Ok(!NO_UPPER.contains(&i128::from(st.f_type)))
}

/// Where `execvp` would look for `program` with `path` as `PATH`: the program itself when it names a path, else
/// each directory of `path` in order (an empty entry is the working directory).
fn search(program: &str, path: &str) -> Vec<PathBuf> {
    if program.contains('/') {
        return vec![PathBuf::from(program)];
    }
    path.split(':').map(|dir| Path::new(if dir.is_empty() { "." } else { dir }).join(program)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(dir: &Path) -> ExecRequest {
        ExecRequest {
            cgroup_procs: dir.join("cgroup.procs"),
            oom_score_adj: 1000,
            argv: vec!["true".into()],
            env: vec![],
            working_dir: "/".into(),
            user: None,
            group: None,
            groups: Vec::new(),
            no_new_privs: false,
            drop_capabilities: rustix::thread::CapabilitySet::empty(),
            mounts: vec![],
            scratch: Some(dir.join("scratch").join("c")),
            mount_ns: None,
        }
    }

    #[test]
    fn what_can_be_checked_before_the_fork_is_refused_with_a_message() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let mut req = request(dir.path());
        req.argv.clear();
        assert_eq!(req.command().err().as_deref(), Some("no command"));
        req.argv = vec![String::new()];
        assert!(req.command().unwrap_err().contains("empty"));
        // A missing mountPath that cannot be made in an overlay is refused by name.
        let comma = dir.path().join("a,b");
        std::fs::create_dir(&comma).unwrap();
        for (target, error) in [
            (
                missing.join("../x"),
                format!("mountPath {}/../x does not exist on this node and has a '..'", missing.display()),
            ),
            (comma.join("x"), format!("mountPath {}/x is missing, and its nearest", comma.display())),
            ("relative".into(), "mountPath relative does not exist on this node and is not an absolute path".into()),
        ] {
            let mut req = request(dir.path());
            req.mounts.push(Mount { source: dir.path().into(), target, read_only: false });
            let got = req.command().unwrap_err();
            assert!(got.starts_with(&error), "{got}");
        }
        let mut req = request(dir.path());
        req.mounts.push(Mount { source: dir.path().join("gone"), target: missing.clone(), read_only: false });
        assert!(req.command().unwrap_err().starts_with(&format!("the source {}/gone", dir.path().display())));
        let mut req = request(dir.path());
        req.working_dir = missing.clone();
        assert!(req.command().unwrap_err().starts_with("workingDir"));
        let req = request(dir.path());
        assert!(req.command().unwrap_err().contains("cgroup.procs"), "no cgroup.procs to open");
        std::fs::write(dir.path().join("cgroup.procs"), "").unwrap();
        assert!(req.command().is_ok());
        let mut req = request(dir.path());
        req.scratch = None;
        req.mounts.push(Mount { source: dir.path().into(), target: missing.clone(), read_only: false });
        assert!(req.command().unwrap_err().contains("cannot name a scratch directory"));
        // A missing mountPath is accepted, with a working directory in it or made for it; nothing is made on the
        // node but the overlay's directories in the scratch directory.
        let mut req = request(dir.path());
        req.mounts.push(Mount { source: dir.path().into(), target: missing.join("deep/er"), read_only: false });
        for working_dir in [missing.join("deep/er/in"), missing.join("deep")] {
            req.working_dir = working_dir;
            let (_, dirs) = req.command().unwrap();
            assert_eq!(dirs.0.len(), 1);
            assert!(dirs.0[0].starts_with(dir.path().join("scratch/c")) && dirs.0[0].join("merged").is_dir());
            drop(dirs);
        }
        assert!(!missing.exists());
        assert_eq!(std::fs::read_dir(dir.path().join("scratch/c")).unwrap().count(), 0, "the exec's overlays removed");
    }

    /// Runs `test` on a thread of its own in a mount namespace of its own (so that it can mount without touching
    /// the host, and the children it starts begin there), with a current-thread async runtime. False when the
    /// namespace cannot be made.
    fn in_own_mount_namespace(test: impl FnOnce() + Send + 'static) -> bool {
        std::thread::spawn(move || {
            // SAFETY: `unshare_unsafe` is unsafe only for `CLONE_FILES`; only `CLONE_NEWNS` is passed (it unshares
            // this thread's file system context from the other threads', nothing that they hold).
            #[expect(
                unsafe_code,
                reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound"
            )]
            let made = unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) };
            if made.is_err() {
                return false;
            }
            use rustix::mount::MountPropagationFlags as P;
            rustix::mount::mount_change(c"/", P::PRIVATE | P::REC).unwrap();
            test();
            true
        })
        .join()
        .unwrap()
    }

    #[test]
    fn missing_mount_paths_are_made_in_the_container_only() {
        if !rustix::process::getuid().is_root() {
            eprintln!("skipped: needs root to mount");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_path_buf();
        let top = PathBuf::from(format!("/nonexistent-nw-unit-{}", std::process::id()));
        let ran = in_own_mount_namespace({
            let top = top.clone();
            move || missing_mount_paths_in_a_namespace(&d, &top)
        });
        if !ran {
            eprintln!("skipped: cannot make a mount namespace");
        }
        assert!(!top.exists(), "nothing is made on the node");
    }

    fn missing_mount_paths_in_a_namespace(d: &Path, top: &Path) {
        use rustix::mount::{MountFlags, mount};
        let host = d.join("host");
        for p in ["host/a/sub", "host/existing", "vol", "vol2", "vol3", "ol", "ou", "ow", "ovl"] {
            std::fs::create_dir_all(d.join(p)).unwrap();
        }
        std::fs::write(d.join("vol-file"), "file-content\n").unwrap();
        std::fs::write(d.join("cgroup.procs"), "").unwrap();
        // A mount below the overlaid directory: it stays visible in the container.
        let sub = host.join("a/sub");
        mount(c"tmpfs", sub.as_path(), c"tmpfs", MountFlags::empty(), None).unwrap();
        std::fs::write(sub.join("inside"), "").unwrap();
        let mut req = request(d);
        req.env = vec![("PATH".into(), "/usr/bin:/bin".into())];
        let new = host.join("a/new");
        req.mounts = vec![
            Mount { source: d.join("vol"), target: new.join("deeper"), read_only: false },
            Mount { source: d.join("vol-file"), target: new.join("token"), read_only: true },
            // Below the root directory: the container's root becomes an overlay of it.
            Mount { source: d.join("vol2"), target: top.join("x"), read_only: false },
            Mount { source: d.join("vol3"), target: host.join("existing"), read_only: true },
        ];
        // A directory made for the missing mountPaths.
        req.working_dir = new.clone();
        let script = format!(
            "echo hi > deeper/f; cat token; ls ../sub; echo top > {top}/x/g; stat -c %a {top} {top}/x .; pwd; \
             touch {existing}/f 2>/dev/null && echo rw || echo ro; test -e /proc/self/mountinfo && echo proc",
            top = top.display(),
            existing = host.join("existing").display(),
        );
        req.argv = ["sh", "-c", &script].map(String::from).to_vec();
        let expected = format!("file-content\ninside\n755\n777\n755\n{}\nro\nproc\n", new.display());
        // The daemon's view is untouched: the sources got the writes, nothing else appeared.
        let check = |out: &str| {
            assert_eq!(out, expected);
            assert_eq!(std::fs::read_to_string(d.join("vol/f")).unwrap(), "hi\n");
            assert_eq!(std::fs::read_to_string(d.join("vol2/g")).unwrap(), "top\n");
            assert!(!new.exists() && !top.exists());
            assert_eq!(std::fs::read_dir(host.join("existing")).unwrap().count(), 0);
        };
        std::fs::set_permissions(d.join("vol2"), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        // A main process, started as `Spawn` does (sharing the daemon's memory), on the disk of the scratch
        // directory: the overlays' upper directories hold what was made.
        let (out, err) = output_file(d);
        let child = req.spawn(out, err).unwrap().spawn().unwrap();
        assert_eq!(rt.block_on(super::super::sys::wait_exit(child.pidfd)).unwrap(), (Some(0), None));
        check(&std::fs::read_to_string(d.join("out")).unwrap());
        let overlays: Vec<PathBuf> =
            std::fs::read_dir(d.join("scratch/c")).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(overlays.len(), 2, "{overlays:?}");
        assert!(overlays.iter().any(|o| o.join("upper/new/token").is_file()), "{overlays:?}");
        assert!(
            overlays.iter().any(|o| o.join(format!("upper/{}", top.file_name().unwrap().to_str().unwrap())).is_dir())
        );
        // A command run in the container (the exec's path, a fork), with a scratch directory on an overlayfs, which
        // cannot hold an upper directory: the child puts the layers on a tmpfs of its own.
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            d.join("ol").display(),
            d.join("ou").display(),
            d.join("ow").display()
        );
        let opts = CString::new(opts).unwrap();
        mount(c"overlay", d.join("ovl").as_path(), c"overlay", MountFlags::empty(), opts.as_c_str()).unwrap();
        req.scratch = Some(d.join("ovl/scratch/c"));
        std::fs::remove_file(d.join("vol/f")).unwrap();
        let (mut cmd, dirs) = req.command().unwrap();
        let output = rt.block_on(async { cmd.output().await }).unwrap();
        assert!(output.status.success(), "{output:?}");
        check(&String::from_utf8(output.stdout).unwrap());
        assert_eq!(dirs.0.len(), 2);
        for o in &dirs.0 {
            assert_eq!(std::fs::read_dir(o.join("layers")).unwrap().count(), 0, "the layers were on a private tmpfs");
        }
        drop(dirs);
        assert_eq!(std::fs::read_dir(d.join("ovl/scratch/c")).unwrap().count(), 0);
        // The working directory inside a missing mountPath.
        req.working_dir = new.join("deeper");
        req.argv = ["sh", "-c", "pwd; cat f"].map(String::from).to_vec();
        let (mut cmd, dirs) = req.command().unwrap();
        let output = rt.block_on(async { cmd.output().await }).unwrap();
        assert_eq!(String::from_utf8(output.stdout).unwrap(), format!("{}\nhi\n", new.join("deeper").display()));
        drop(dirs);
    }

    fn output_file(dir: &Path) -> (OwnedFd, OwnedFd) {
        let f = std::fs::File::create(dir.join("out")).unwrap();
        (OwnedFd::from(f.try_clone().unwrap()), OwnedFd::from(f))
    }

    #[tokio::test]
    async fn a_spawned_process_starts_clean_and_its_exit_is_collected() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cgroup.procs"), "").unwrap();
        let mut req = request(dir.path());
        req.working_dir = dir.path().into();
        req.env = vec![("PATH".into(), "/no/such/dir:/usr/bin:/bin".into()), ("GREETING".into(), "hi".into())];
        // Found on the second PATH entry; the environment, the working directory and default signal handling
        // (the test harness ignores SIGPIPE, and the daemon blocks every signal around the clone).
        req.argv = ["sh", "-c", "echo $GREETING; pwd; grep -E '^Sig(Ign|Blk)' /proc/self/status; exit 3"]
            .map(String::from)
            .to_vec();
        let (out, err) = output_file(dir.path());
        let child = req.spawn(out, err).unwrap().spawn().unwrap();
        assert!(child.pid > 0);
        assert_eq!(super::super::sys::wait_exit(child.pidfd).await.unwrap(), (Some(3), None));
        let text = std::fs::read_to_string(dir.path().join("out")).unwrap();
        assert_eq!(
            text,
            format!("hi\n{}\nSigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n", dir.path().display())
        );
        assert_eq!(std::fs::read_to_string(dir.path().join("cgroup.procs")).unwrap(), "0", "the child joined");

        req.argv = vec!["sh".into(), "-c".into(), "kill -TERM $$".into()];
        let (out, err) = output_file(dir.path());
        let child = req.spawn(out, err).unwrap().spawn().unwrap();
        assert_eq!(super::super::sys::wait_exit(child.pidfd).await.unwrap(), (None, Some(15)));

        // A file that is no executable format runs as a shell script, as execvp runs it.
        let script = dir.path().join("script");
        std::fs::write(&script, "echo script ran with $1\n").unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        req.argv = vec![script.display().to_string(), "an argument".into()];
        let (out, err) = output_file(dir.path());
        let child = req.spawn(out, err).unwrap().spawn().unwrap();
        assert_eq!(super::super::sys::wait_exit(child.pidfd).await.unwrap(), (Some(0), None));
        assert_eq!(std::fs::read_to_string(dir.path().join("out")).unwrap(), "script ran with an argument\n");

        req.argv = vec!["no-such-program-anywhere".into()];
        let (out, err) = output_file(dir.path());
        let e = req.spawn(out, err).unwrap().spawn().err().unwrap();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    }

    #[tokio::test]
    async fn a_child_that_takes_another_user_leaves_the_daemon_dumpable() {
        if !rustix::process::getuid().is_root() {
            eprintln!("skipped: needs root to switch users");
            return;
        }
        let before = rustix::process::dumpable_behavior().unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cgroup.procs"), "").unwrap();
        let mut req = request(dir.path());
        req.env = vec![("PATH".into(), "/usr/bin:/bin".into())];
        (req.user, req.group) = (Some(65534), Some(65534));
        req.argv = vec!["id".into(), "-u".into()];
        let (out, err) = output_file(dir.path());
        let child = req.spawn(out, err).unwrap().spawn().unwrap();
        assert_eq!(super::super::sys::wait_exit(child.pidfd).await.unwrap(), (Some(0), None));
        assert_eq!(std::fs::read_to_string(dir.path().join("out")).unwrap(), "65534\n");
        assert_eq!(rustix::process::dumpable_behavior().unwrap(), before, "the shared memory's flag was put back");
    }

    /// The cgroup v2 directory this test process is in, where the host has a cgroup v2 hierarchy.
    fn own_cgroup2() -> Option<PathBuf> {
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let mount = mounts.lines().find(|l| l.contains(" - cgroup2 "))?.split(' ').nth(4)?;
        Some(Path::new(mount).join(path.trim_start_matches('/')))
    }

    /// A cgroup made for a test, removed at its end, whatever the test's outcome.
    struct TestCgroup(PathBuf);

    impl Drop for TestCgroup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(&self.0);
        }
    }

    #[tokio::test]
    async fn a_main_process_is_created_in_its_cgroup_without_writing_cgroup_procs() {
        let Some(cg) = own_cgroup2().map(|p| p.join(format!("nw-exec-test-{}", std::process::id()))) else {
            eprintln!("skipped: no cgroup v2 hierarchy");
            return;
        };
        if let Err(e) = std::fs::create_dir(&cg) {
            eprintln!("skipped: cannot create {}: {e}", cg.display());
            return;
        }
        let cg = TestCgroup(cg);
        let dir = tempfile::tempdir().unwrap();
        let mut req = request(&cg.0);
        req.env = vec![("PATH".into(), "/usr/bin:/bin".into())];
        req.argv = vec!["cat".into(), "/proc/self/cgroup".into()];
        let (out, err) = output_file(dir.path());
        let mut spawn = req.spawn(out, err).unwrap();
        if !clone3_usable() {
            assert!(spawn.cgroup.is_none(), "no directory is given where the kernel cannot use it");
            eprintln!("skipped: the kernel (or a seccomp filter) refuses clone3 here");
            return;
        }
        assert!(spawn.cgroup.is_some(), "a cgroup v2 directory is given to the child to be created in");
        // Every write to cgroup.procs fails now: the process is in the cgroup only if it was created there.
        spawn.setup.procs = rustix::fs::open(
            c"/dev/null",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        let child = spawn.spawn().unwrap();
        assert_eq!(super::super::sys::wait_exit(child.pidfd).await.unwrap(), (Some(0), None));
        let own = std::fs::read_to_string(dir.path().join("out")).unwrap();
        let line = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
        assert_eq!(Path::new(line).file_name(), cg.0.file_name(), "the process ran in {line}");
    }

    #[test]
    fn the_program_is_searched_for_as_execvp_does() {
        assert_eq!(search("./x", "/bin"), vec![PathBuf::from("./x")]);
        assert_eq!(search("ls", "/a::/b"), ["/a/ls", "./ls", "/b/ls"].map(PathBuf::from).to_vec());
    }
}
