//! The container entry point: the first thing that runs in a new container process. The daemon starts its own
//! binary with a request; this code moves the process into the container cgroup (through resources/, the only
//! writer of cgroupfs), sets its `oom_score_adj`, makes the volume mounts in a private mount namespace, and
//! replaces itself with the container's command under the container's user. So the command's first instruction
//! already runs inside its cgroup, and nothing it forks can escape the accounting.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use nodewarden_resources::{CgroupFs, CgroupPath};

use crate::runtime::Mount;

/// What the entry point does, passed as JSON on its command line.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExecRequest {
    /// The cgroup2 mount.
    pub cgroup_mount: PathBuf,
    /// nodewarden's cgroup root (the write scope).
    pub cgroup_root: String,
    /// The container cgroup to join.
    pub cgroup: String,
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
    /// `runAsGroup`.
    pub group: Option<u32>,
    /// Bind mounts.
    pub mounts: Vec<Mount>,
    /// Where a start failure is written for the daemon to read.
    pub error_file: Option<PathBuf>,
}

/// The exit code of a container whose command could not be started, as runc reports one.
pub const START_FAILED: i32 = 128;

/// Runs the entry point. Returns only on failure, with the exit code to exit with.
pub fn container_exec(request: &str) -> i32 {
    let req: ExecRequest = match serde_json::from_str(request) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("nodewarden: invalid container request: {e}");
            return START_FAILED;
        }
    };
    let err = match prepare_and_exec(&req) {
        Ok(never) => match never {},
        Err(e) => e,
    };
    if let Some(f) = &req.error_file {
        let _ = std::fs::write(f, &err);
    }
    eprintln!("nodewarden: cannot start container: {err}");
    START_FAILED
}

fn prepare_and_exec(req: &ExecRequest) -> Result<std::convert::Infallible, String> {
    let root = CgroupPath::parse(&req.cgroup_root).map_err(|e| format!("cgroup root: {e}"))?;
    let cgroup = CgroupPath::parse(&req.cgroup).map_err(|e| format!("cgroup: {e}"))?;
    if !cgroup.is_within(&root) {
        return Err(format!("cgroup {cgroup} is outside nodewarden's root {root}"));
    }
    let fs = CgroupFs::new(&req.cgroup_mount, root);
    fs.add_proc(&cgroup, std::process::id()).map_err(|e| format!("cannot join the container cgroup: {e}"))?;
    std::fs::write("/proc/self/oom_score_adj", req.oom_score_adj.to_string())
        .map_err(|e| format!("cannot set oom_score_adj: {e}"))?;
    if !req.mounts.is_empty() {
        super::sys::private_mounts(&req.mounts)?;
    }
    let (program, args) = req.argv.split_first().ok_or("no command")?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(args).env_clear().envs(req.env.iter().map(|(k, v)| (k, v))).current_dir(&req.working_dir);
    if let Some(g) = req.group {
        cmd.gid(g);
    }
    if let Some(u) = req.user {
        cmd.uid(u);
    }
    let e = cmd.exec();
    Err(format!("exec {program:?}: {e}"))
}
