//! The container runtime seam. Pod workers decide what runs; a [`Runtime`] starts, signals, watches and execs in
//! containers. The embedded process runtime implements it; a CRI client follows.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use jiff::Timestamp;
use nodewarden_resources::CgroupPath;

/// A bind mount into a container.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Mount {
    /// The host path.
    pub source: PathBuf,
    /// Where the container sees it.
    pub target: PathBuf,
    /// Mounted read-only.
    pub read_only: bool,
}

/// Everything a runtime needs to start one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSpec {
    /// The pod UID.
    pub pod_uid: String,
    /// The container name.
    pub name: String,
    /// How often it was restarted before (names the log file).
    pub attempt: u32,
    /// The image, recorded (the process runtime does not use it).
    pub image: String,
    /// `command` followed by `args`, with `$(VAR)` references expanded.
    pub argv: Vec<String>,
    /// The environment.
    pub env: Vec<(String, String)>,
    /// The working directory.
    pub working_dir: PathBuf,
    /// `runAsUser`.
    pub user: Option<u32>,
    /// `runAsGroup`.
    pub group: Option<u32>,
    /// The container cgroup (from the placement).
    pub cgroup: CgroupPath,
    /// The `oom_score_adj` its processes get.
    pub oom_score_adj: i32,
    /// The log file.
    pub log_path: PathBuf,
    /// Volume mounts.
    pub mounts: Vec<Mount>,
}

/// A running container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    /// The runtime's ID, as shown in `containerID` (`process://...`).
    pub id: String,
    /// The main process.
    pub pid: u32,
    /// When it started.
    pub started_at: Timestamp,
}

/// How a container ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExitInfo {
    /// The exit code (128 + signal when killed by one).
    pub exit_code: i32,
    /// The signal that killed it.
    pub signal: Option<i32>,
    /// `OOMKilled`, `Completed`, `Error`, `StartError` or `ContainerStatusUnknown`.
    pub reason: String,
    /// Details, such as a start failure's message.
    pub message: Option<String>,
    /// When it started.
    pub started_at: Timestamp,
    /// When it ended.
    pub finished_at: Timestamp,
}

/// The result of running a command in a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// The exit code; `None` when the command was killed at its timeout.
    pub exit_code: Option<i32>,
    /// stdout and stderr, truncated.
    pub output: String,
}

/// A runtime failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// The container's configuration cannot be run (the kubelet's `CreateContainerConfigError`).
    #[error("{0}")]
    Config(String),
    /// Starting failed (`StartError` / `RunContainerError`).
    #[error("{0}")]
    Start(String),
    /// The container is not known.
    #[error("container {0} not found")]
    NotFound(String),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// A container runtime.
pub trait Runtime: Send + Sync + 'static {
    /// The scheme of container IDs (`process`, `containerd`).
    fn scheme(&self) -> &'static str;

    /// Prepares a pod's sandbox. The process runtime has nothing to do: the pod cgroup is the sandbox.
    fn run_sandbox(&self, pod_uid: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// Starts a container.
    fn start(&self, spec: &ContainerSpec) -> impl Future<Output = Result<Started, RuntimeError>> + Send;

    /// Finds a container that is already running (after a daemon restart): no new process is started.
    fn adopt(&self, spec: &ContainerSpec, pid_hint: Option<u32>) -> impl Future<Output = Option<Started>> + Send;

    /// Resolves when the container has exited.
    fn wait(&self, id: &str) -> impl Future<Output = ExitInfo> + Send;

    /// Sends a signal to the container's main process.
    fn signal(&self, id: &str, signal: i32) -> Result<(), RuntimeError>;

    /// Runs a command in the container (its cgroup, user and environment), killed at `timeout`.
    fn exec(
        &self,
        spec: &ContainerSpec,
        argv: &[String],
        timeout: Duration,
    ) -> impl Future<Output = Result<ExecOutput, RuntimeError>> + Send;

    /// Forgets a container that exited (and frees what the runtime kept for it).
    fn remove(&self, id: &str);
}

/// SIGTERM.
pub const SIGTERM: i32 = 15;
/// SIGKILL.
pub const SIGKILL: i32 = 9;

/// The kubelet's reason for an exit: `OOMKilled`, `Completed` (0) or `Error`.
pub fn exit_reason(exit_code: i32, oom_killed: bool) -> &'static str {
    match (oom_killed, exit_code) {
        (true, _) => "OOMKilled",
        (false, 0) => "Completed",
        (false, _) => "Error",
    }
}
