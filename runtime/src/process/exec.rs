//! Launching a container process. The daemon starts a child (sharing its memory until the exec, as `posix_spawn`
//! does, see `sys::Spawn`) and the child, before it execs the container's command, joins the container cgroup (a
//! main process is created in it, through a descriptor of the cgroup's directory, where the kernel allows; a
//! command run in the container, or a main process where the kernel refuses, writes itself to the cgroup's
//! `cgroup.procs`, which the resources crate names and the daemon opens beforehand), sets its `oom_score_adj`,
//! makes the volume mounts in a private mount namespace, changes to the working directory and takes the
//! container's user. So the command's first instruction already runs inside its cgroup, and nothing it forks can
//! escape the accounting. Everything the child needs is prepared here, in the daemon, so that the child only makes
//! system calls (see `sys::ChildSetup`).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use std::os::fd::OwnedFd;

use super::sys::{ChildSetup, Spawn, clone3_usable};
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
    /// The pod's `supplementalGroups`.
    pub groups: Vec<u32>,
    /// `allowPrivilegeEscalation: false`.
    pub no_new_privs: bool,
    /// `capabilities.drop`.
    pub drop_capabilities: rustix::thread::CapabilitySet,
    /// Bind mounts.
    pub mounts: Vec<Mount>,
}

/// The exit code of a container whose command could not be started, as runc reports one.
pub const START_FAILED: i32 = 128;

fn c_path(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| format!("path {} contains a NUL byte", p.display()))
}

impl ExecRequest {
    /// The steps the child takes before exec, with the program and its arguments. The checks that can be made
    /// before the child exists are made here, with messages that name what is wrong; the child can only report an
    /// errno.
    fn prepare(&self) -> Result<(&String, &[String], ChildSetup), String> {
        let (program, args) = self.argv.split_first().ok_or("no command")?;
        if program.is_empty() {
            return Err("the command's program is an empty string".into());
        }
        let mut mounts = Vec::with_capacity(self.mounts.len());
        for m in &self.mounts {
            if !m.target.exists() {
                return Err(format!(
                    "mountPath {} does not exist on this node; the process runtime mounts volumes over existing directories or files",
                    m.target.display()
                ));
            }
            mounts.push((c_path(&m.source)?, c_path(&m.target)?, m.read_only));
        }
        if !self.working_dir.is_dir() && self.mounts.iter().all(|m| !self.working_dir.starts_with(&m.target)) {
            return Err(format!("workingDir {} is not a directory on this node", self.working_dir.display()));
        }
        let procs = rustix::fs::open(
            &self.cgroup_procs,
            rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| format!("cannot open {}: {e}", self.cgroup_procs.display()))?;
        let setup = ChildSetup {
            procs,
            oom_score_adj: self.oom_score_adj.to_string().into_bytes(),
            mounts,
            working_dir: c_path(&self.working_dir)?,
            user: self.user,
            group: self.group,
            groups: self.groups.iter().map(|g| rustix::process::Gid::from_raw(*g)).collect(),
            no_new_privs: self.no_new_privs,
            drop_capabilities: self.drop_capabilities,
        };
        Ok((program, args, setup))
    }

    /// The command, with the steps its child takes before exec, for a process whose output the daemon reads.
    pub(super) fn command(&self) -> Result<tokio::process::Command, String> {
        let (program, args, setup) = self.prepare()?;
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args).env_clear().envs(self.env.iter().map(|(k, v)| (k, v))).stdin(std::process::Stdio::null());
        setup.install(&mut cmd);
        Ok(cmd)
    }

    /// A container's main process, writing to `stdout` and `stderr`, to be started by [`Spawn::spawn`].
    pub(super) fn spawn(&self, stdout: OwnedFd, stderr: OwnedFd) -> Result<Spawn, String> {
        let (program, args, setup) = self.prepare()?;
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
        let mut req = request(dir.path());
        req.mounts.push(Mount { source: dir.path().into(), target: missing.clone(), read_only: false });
        assert!(req.command().unwrap_err().starts_with(&format!("mountPath {} does not exist", missing.display())));
        let mut req = request(dir.path());
        req.working_dir = missing.clone();
        assert!(req.command().unwrap_err().starts_with("workingDir"));
        let req = request(dir.path());
        assert!(req.command().unwrap_err().contains("cgroup.procs"), "no cgroup.procs to open");
        std::fs::write(dir.path().join("cgroup.procs"), "").unwrap();
        assert!(req.command().is_ok());
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
