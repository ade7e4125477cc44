//! The container runtime seam. Pod workers decide what runs; a [`Runtime`] starts, signals, watches and execs in
//! containers. The embedded process runtime and the CRI client implement it.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::{Path, PathBuf};
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

/// When an image is pulled (`imagePullPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPolicy {
    /// Pull before every start.
    Always,
    /// Pull when the image is absent.
    IfNotPresent,
    /// Never pull: an absent image is an error (`ErrImageNeverPull`).
    Never,
}

impl PullPolicy {
    /// The policy in force: the pod's, or the Kubernetes default (`Always` for `:latest` or untagged images,
    /// `IfNotPresent` otherwise).
    pub fn resolve(policy: Option<&str>, image: &str) -> Self {
        match policy {
            Some("Always") => Self::Always,
            Some("Never") => Self::Never,
            Some("IfNotPresent") => Self::IfNotPresent,
            _ => {
                if image.contains('@') {
                    return Self::IfNotPresent;
                }
                let last = image.rsplit('/').next().unwrap_or(image);
                match last.split_once(':') {
                    Some((_, "latest")) | None => Self::Always,
                    Some(_) => Self::IfNotPresent,
                }
            }
        }
    }
}

/// CPU and memory settings of a container or sandbox in CRI's terms (`LinuxContainerResources`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinuxResources {
    /// cgroup v1 `cpu.shares` of the CPU request.
    pub cpu_shares: u64,
    /// CFS quota in microseconds, if limited.
    pub cpu_quota: Option<u64>,
    /// CFS period in microseconds.
    pub cpu_period: u64,
    /// Memory limit in bytes, if limited.
    pub memory_limit: Option<u64>,
    /// Memory QoS' `memory.min`, if set.
    pub memory_min: Option<u64>,
    /// Memory QoS' `memory.high`, if set.
    pub memory_high: Option<nodewarden_resources::Limit>,
}

/// Everything a runtime needs to create a pod's sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSpec {
    /// The pod UID.
    pub pod_uid: String,
    /// The pod name.
    pub name: String,
    /// The pod namespace.
    pub namespace: String,
    /// The pod cgroup (the placement's), which becomes the sandbox's `cgroup_parent`.
    pub cgroup_parent: CgroupPath,
    /// `hostNetwork`.
    pub host_network: bool,
    /// `hostPID`.
    pub host_pid: bool,
    /// `hostIPC`.
    pub host_ipc: bool,
    /// The pod's hostname.
    pub hostname: String,
    /// `<podLogsDir>/<namespace>_<name>_<uid>`.
    pub log_directory: PathBuf,
    /// The pod's labels.
    pub labels: BTreeMap<String, String>,
    /// The pod's annotations.
    pub annotations: BTreeMap<String, String>,
    /// The pod-level resources.
    pub resources: LinuxResources,
    /// The pod's `securityContext.sysctls`.
    pub sysctls: BTreeMap<String, String>,
    /// Whether any of its containers is privileged (a CRI runtime refuses a privileged container in a sandbox
    /// that is not).
    pub privileged: bool,
}

/// Everything a runtime needs to start one container. `Debug` names its environment's variables without their
/// values and leaves out its registry credentials: either may hold a Secret's data.
#[derive(Clone, PartialEq, Eq)]
pub struct ContainerSpec {
    /// The pod UID.
    pub pod_uid: String,
    /// The runtime's ID of the pod's sandbox.
    pub sandbox_id: String,
    /// The container name.
    pub name: String,
    /// How often it was restarted before (names the log file).
    pub attempt: u32,
    /// The image (the process runtime does not use it).
    pub image: String,
    /// When the image is pulled.
    pub pull_policy: PullPolicy,
    /// `command`, with `$(VAR)` references expanded; empty means the image's entrypoint.
    pub command: Vec<String>,
    /// `args`, expanded; empty with an empty `command` means the image's.
    pub args: Vec<String>,
    /// The environment.
    pub env: Vec<(String, String)>,
    /// The working directory; `None` means the image's (`/` under the process runtime).
    pub working_dir: Option<PathBuf>,
    /// `runAsUser`.
    pub user: Option<u32>,
    /// `runAsGroup`.
    pub group: Option<u32>,
    /// The container cgroup (from the placement).
    pub cgroup: CgroupPath,
    /// The `oom_score_adj` its processes get.
    pub oom_score_adj: i32,
    /// Its CPU and memory settings, for a runtime that creates the container cgroup itself.
    pub resources: LinuxResources,
    /// The log file.
    pub log_path: PathBuf,
    /// Volume mounts.
    pub mounts: Vec<Mount>,
    /// The `securityContext`, merged with the pod's.
    pub security: crate::security::Security,
    /// The credentials a pull of the image tries in turn (the pod's `imagePullSecrets` that match it); none: an
    /// anonymous pull.
    pub pull_auths: Vec<RegistryAuth>,
}

impl std::fmt::Debug for ContainerSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerSpec")
            .field("pod_uid", &self.pod_uid)
            .field("sandbox_id", &self.sandbox_id)
            .field("name", &self.name)
            .field("attempt", &self.attempt)
            .field("image", &self.image)
            .field("pull_policy", &self.pull_policy)
            .field("command", &self.command)
            .field("args", &self.args)
            .field("env", &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .field("working_dir", &self.working_dir)
            .field("user", &self.user)
            .field("group", &self.group)
            .field("cgroup", &self.cgroup)
            .field("mounts", &self.mounts)
            .field("pull_auths", &self.pull_auths.len())
            .finish_non_exhaustive()
    }
}

/// Registry credentials for a pull, as CRI's `AuthConfig` carries them. `Debug` shows the registry only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RegistryAuth {
    /// The registry the credentials are for, as the config names it.
    pub server_address: String,
    /// The user name.
    pub username: String,
    /// The password.
    pub password: String,
    /// `base64(username:password)`, as a docker config has it.
    pub auth: String,
    /// An identity token.
    pub identity_token: String,
    /// A registry token.
    pub registry_token: String,
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAuth").field("server_address", &self.server_address).finish_non_exhaustive()
    }
}

impl ContainerSpec {
    /// `command` followed by `args`.
    pub fn argv(&self) -> Vec<String> {
        self.command.iter().chain(&self.args).cloned().collect()
    }
}

/// A container's ID as its runtime gave it: what every call about the container names it by, and, after the
/// runtime's scheme, its `containerID` (`process://...`, `containerd://...`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct ContainerId(String);

impl ContainerId {
    /// The ID the runtime gave.
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The ID as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ContainerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for ContainerId {
    fn from(id: &str) -> Self {
        Self(id.to_owned())
    }
}

impl From<String> for ContainerId {
    fn from(id: String) -> Self {
        Self(id)
    }
}

impl std::borrow::Borrow<str> for ContainerId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// A running container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    /// The runtime's ID, as shown in `containerID` (`process://...`).
    pub id: ContainerId,
    /// The main process; 0 when the runtime does not say (CRI).
    pub pid: u32,
    /// The main process's start time in clock ticks after boot (`/proc/<pid>/stat`), which tells it from a later
    /// process given the same PID; `None` when not known.
    pub pid_start: Option<u64>,
    /// When it started.
    pub started_at: Timestamp,
}

/// A container's main process as an earlier daemon saved it, to adopt it after a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MainProcess {
    /// Its PID.
    pub pid: u32,
    /// Its start time in clock ticks after boot; `None` in state saved before it was recorded.
    pub start: Option<u64>,
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

impl ExitInfo {
    /// An exit with `code` and the kubelet's reason for it, started and ended at the epoch: what a test of a
    /// runtime's client feeds in.
    pub fn at_epoch(code: i32) -> Self {
        Self {
            exit_code: code,
            signal: None,
            reason: exit_reason(code, false).into(),
            message: None,
            started_at: Timestamp::UNIX_EPOCH,
            finished_at: Timestamp::UNIX_EPOCH,
        }
    }

    /// The kubelet's `ContainerStatusUnknown` (exit code 137) for a container whose end was not seen, with why.
    pub fn unknown(message: impl Into<String>, started_at: Timestamp) -> Self {
        Self {
            exit_code: 137,
            signal: None,
            reason: "ContainerStatusUnknown".into(),
            message: Some(message.into()),
            started_at,
            finished_at: Timestamp::now(),
        }
    }
}

/// The most output of a command run in a container ([`ExecOutput`]) that is kept, in bytes.
pub const EXEC_OUTPUT_LIMIT: usize = 10 * 1024;

/// The result of running a command in a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// The exit code; `None` when the command was killed at its timeout.
    pub exit_code: Option<i32>,
    /// stdout and stderr, truncated.
    pub output: String,
}

impl ExecOutput {
    /// The output of a command that ended with `exit_code`: stdout followed by stderr, invalid UTF-8 replaced, cut
    /// to at most [`EXEC_OUTPUT_LIMIT`] bytes at a character boundary.
    pub fn from_streams(exit_code: Option<i32>, stdout: &[u8], stderr: &[u8]) -> Self {
        let mut output = String::from_utf8_lossy(stdout).into_owned();
        output.push_str(&String::from_utf8_lossy(stderr));
        if output.len() > EXEC_OUTPUT_LIMIT {
            let end = (0..=EXEC_OUTPUT_LIMIT).rev().find(|i| output.is_char_boundary(*i)).unwrap_or(0);
            output.truncate(end);
        }
        Self { exit_code, output }
    }

    /// The output of a command killed at its timeout.
    pub fn timed_out(timeout: Duration) -> Self {
        Self { exit_code: None, output: format!("command timed out after {timeout:?}") }
    }
}

/// A runtime problem: the kubelet's message (what the Node's `Ready` condition says), and the error behind it
/// where there is one (what `/readyz` adds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The kubelet's words: `container runtime is down`, `container runtime network not ready: ...`.
    pub message: String,
    /// The error behind it.
    pub cause: Option<String>,
}

impl Problem {
    /// A problem with no error behind it.
    pub fn new(message: impl Into<String>) -> Self {
        Self { message: message.into(), cause: None }
    }

    /// A problem caused by `cause`.
    pub fn caused(message: impl Into<String>, cause: impl std::fmt::Display) -> Self {
        Self { message: message.into(), cause: Some(cause.to_string()) }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.cause {
            Some(c) => write!(f, "{}: {c}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// What a runtime says about itself: the kubelet's runtime state (`pkg/kubelet/runtime.go`), which makes the
/// Node's `Ready` condition and `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RuntimeHealth {
    /// Why no container can run now; `None` when they can.
    pub runtime: Option<Problem>,
    /// Why pods on the pod network cannot start now (host-network pods can); `None` when they can.
    pub network: Option<Problem>,
}

/// An image the runtime holds, as the Node's `status.images` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ImageSummary {
    /// Its digests, then its tags.
    pub names: Vec<String>,
    /// Its size in bytes.
    pub size_bytes: u64,
}

/// A runtime failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// The container's configuration cannot be run (the kubelet's `CreateContainerConfigError`).
    #[error("{0}")]
    Config(String),
    /// The runtime refused to create the container (`CreateContainerError`).
    #[error("{0}")]
    Create(String),
    /// Starting failed (`StartError` / `RunContainerError`).
    #[error("{0}")]
    Start(String),
    /// The container is not known.
    #[error("container {0} not found")]
    NotFound(String),
    /// The image could not be made present: the kubelet's `reason` (`ErrImagePull`, `ErrImageNeverPull`) and why.
    #[error("{message}")]
    Image {
        /// The waiting reason.
        reason: &'static str,
        /// What happened.
        message: String,
    },
    /// The pod's sandbox is gone (the runtime lost it); a new one is needed.
    #[error("pod sandbox {0} not found")]
    SandboxNotFound(String),
    /// The runtime cannot be reached.
    #[error("{0}")]
    Unavailable(String),
    /// The pod network is not ready, and the pod is not on the host's network (the kubelet's `NetworkNotReady`).
    #[error("network is not ready: {0}")]
    NetworkNotReady(String),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// What a runtime says of itself, apart from any container: what the Node's status, `/readyz` and `/metrics`
/// show. Object-safe, so its readers need not know which runtime runs.
pub trait RuntimeFacts: Send + Sync {
    /// The scheme of container IDs (`process`, `containerd`).
    fn scheme(&self) -> &'static str;

    /// Whether the runtime can run containers and pods on the pod network; a runtime that has neither problem
    /// (the process runtime) keeps the default.
    fn health(&self) -> RuntimeHealth {
        RuntimeHealth::default()
    }

    /// The images the runtime holds, as it last listed them; none for a runtime without images.
    fn images(&self) -> Vec<ImageSummary> {
        Vec::new()
    }

    /// `<name>://<version>` as the Node's `containerRuntimeVersion` shows it, as the runtime last said; the
    /// default is the kubelet's for a runtime whose version is not known (`<scheme>://Unknown`).
    fn version(&self) -> String {
        format!("{}://Unknown", self.scheme())
    }
}

/// A container runtime: the containers' lifecycle. Sandboxes are a capability a runtime may have
/// ([`Runtime::sandboxes`]); what it says of itself is [`RuntimeFacts`].
pub trait Runtime: RuntimeFacts + 'static {
    /// The runtime's pod sandboxes, where it has them.
    type Sandboxes: SandboxRuntime;

    /// The pod sandboxes of a runtime that has them (CRI); `None` where the pod cgroup is the sandbox (the process
    /// runtime).
    fn sandboxes(&self) -> Option<&Self::Sandboxes>;

    /// The runtime's images, where it has them.
    type Images: ImageService;

    /// The images of a runtime that pulls them (CRI); `None` where a container runs the node's own files (the
    /// process runtime). Pod sync makes a container's image present through it before [`Runtime::start`].
    fn image_service(&self) -> Option<&Self::Images>;

    /// The runtime's interactive sessions, where it serves them.
    type Streaming: StreamingRuntime;

    /// The interactive sessions (`kubectl exec`, `attach`, `port-forward`) of a runtime that serves them from a
    /// streaming server of its own (CRI); `None` where it has none (the process runtime).
    fn streaming(&self) -> Option<&Self::Streaming>;

    /// At start, once the pods are known: removes what the runtime holds for pods that are not in `keep`.
    fn reconcile(&self, keep: &BTreeSet<String>) -> impl Future<Output = ()> + Send {
        let _ = keep;
        async {}
    }

    /// Starts a container in the sandbox `spec.sandbox_id`.
    fn start(&self, spec: &ContainerSpec) -> impl Future<Output = Result<Started, RuntimeError>> + Send;

    /// Finds a container that is already running (after a daemon restart): no new process is started. `main` is
    /// the main process the earlier daemon saved; a runtime that knows processes adopts that one only.
    fn adopt(&self, spec: &ContainerSpec, main: Option<MainProcess>) -> impl Future<Output = Option<Started>> + Send;

    /// Resolves when the container has exited.
    fn wait(&self, id: &ContainerId) -> impl Future<Output = ExitInfo> + Send;

    /// Stops a container: the stop signal (not sent again to a container that has had it, e.g. through
    /// [`StopSignals`]), then SIGKILL once `grace` has passed (a zero grace kills at once). Resolves once the
    /// container has exited or has been sent SIGKILL; its exit arrives through [`Runtime::wait`].
    fn stop(&self, id: &ContainerId, grace: Duration) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// How to send a container its stop signal on the calling thread, where the runtime can (the process runtime);
    /// `None` where stopping a container is a call to the runtime (CRI). Required, so that a runtime that forwards
    /// to others cannot leave it out.
    fn stop_signals(&self) -> Option<&dyn StopSignals>;

    /// Runs a command in the container `id` (its cgroup, user and environment), killed at `timeout`.
    fn exec(
        &self,
        id: &ContainerId,
        argv: &[String],
        timeout: Duration,
    ) -> impl Future<Output = Result<ExecOutput, RuntimeError>> + Send;

    /// Forgets a container that exited (and frees what the runtime kept for it).
    fn remove(&self, id: &ContainerId) -> impl Future<Output = ()> + Send;

    /// Moves the live log `log` of running container `id` aside to `to`. The default copies its newest `keep`
    /// bytes and truncates it, for a runtime whose containers hold their log open with `O_APPEND`.
    fn rotate_log(
        &self,
        id: &ContainerId,
        log: &Path,
        to: &Path,
        keep: u64,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send {
        let _ = id;
        let (log, to) = (log.to_path_buf(), to.to_path_buf());
        async move {
            tokio::task::spawn_blocking(move || crate::copy_truncate(&log, &to, keep))
                .await
                .map_err(|e| RuntimeError::Other(e.to_string()))?
                .map_err(|e| RuntimeError::Other(format!("cannot rotate the log: {e}")))
        }
    }
}

/// A pod sandbox that runs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunningSandbox {
    /// The runtime's ID.
    pub id: String,
    /// The pod's addresses on the pod network, the primary first (`podIP`); empty on the host's network.
    pub ips: Vec<String>,
}

/// A runtime that can send a container its stop signal at once, without waiting for anything.
pub trait StopSignals: Send + Sync {
    /// Sends container `id` its stop signal now. A later [`Runtime::stop`] of the same container does not send it
    /// again, but still waits out its grace period and kills. Returns whether the signal is out (or the container
    /// has exited).
    fn signal_stop_now(&self, id: &ContainerId) -> bool;
}

/// The pod sandboxes of a runtime that has them.
pub trait SandboxRuntime: Send + Sync + 'static {
    /// Creates a pod's sandbox.
    fn run_sandbox(&self, spec: &SandboxSpec) -> impl Future<Output = Result<RunningSandbox, RuntimeError>> + Send;

    /// Finds the ready sandbox of a pod an earlier daemon ran, so that no new one is created.
    fn adopt_sandbox(&self, spec: &SandboxSpec) -> impl Future<Output = Option<RunningSandbox>> + Send;

    /// Stops every sandbox of pod `pod_uid` (its network and shared namespaces are released) and keeps them, with
    /// the pod's exited containers, as the kubelet keeps them for a pod that is over but still listed.
    fn stop_sandboxes(&self, pod_uid: &str) -> impl Future<Output = ()> + Send;

    /// Stops and removes every sandbox of pod `pod_uid` (what is left of its containers with them).
    fn remove_sandboxes(&self, pod_uid: &str) -> impl Future<Output = ()> + Send;
}

/// Which standard streams an interactive session carries: at least one of `stdin`, `stdout` and `stderr`; with
/// a `tty`, stderr goes with stdout and is not asked for on its own (the CRI's rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Streams {
    /// The client's input goes to the container.
    pub stdin: bool,
    /// The container's standard output comes back.
    pub stdout: bool,
    /// The container's standard error comes back (never with a `tty`).
    pub stderr: bool,
    /// A terminal.
    pub tty: bool,
}

impl Streams {
    /// Why these streams make no session, if they do not.
    pub fn check(self) -> Result<(), RuntimeError> {
        if !(self.stdin || self.stdout || self.stderr) {
            return Err(RuntimeError::Config("one of stdin, stdout and stderr must be streamed".into()));
        }
        if self.tty && self.stderr {
            return Err(RuntimeError::Config("a tty carries stderr with stdout: stderr cannot be asked for".into()));
        }
        Ok(())
    }
}

/// A runtime that serves interactive sessions from a streaming server of its own: each call prepares one session
/// and returns the URL a client is sent to (the kubelet API redirects or proxies `kubectl exec` to it).
pub trait StreamingRuntime: Send + Sync + 'static {
    /// A session running `cmd` in container `id`.
    fn exec_session(
        &self,
        id: &ContainerId,
        cmd: &[String],
        streams: Streams,
    ) -> impl Future<Output = Result<String, RuntimeError>> + Send;

    /// A session attached to the main process of container `id`.
    fn attach_session(
        &self,
        id: &ContainerId,
        streams: Streams,
    ) -> impl Future<Output = Result<String, RuntimeError>> + Send;

    /// A session forwarding `ports` of the pod whose sandbox is `sandbox_id`.
    fn port_forward_session(
        &self,
        sandbox_id: &str,
        ports: &[u16],
    ) -> impl Future<Output = Result<String, RuntimeError>> + Send;
}

/// An image pulled by [`ImageService::pull_image`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PulledImage {
    /// The reference the runtime resolved the image to.
    pub image_ref: String,
    /// Its size in bytes, as the runtime gives it after the pull (0 when it does not say).
    pub size_bytes: u64,
    /// How long the pull itself took, not counting a wait for an earlier pull (`serializeImagePulls`).
    pub pulling: Duration,
}

/// A runtime's images: whether one is on the node, and its pull (the kubelet's image service).
pub trait ImageService: Send + Sync + 'static {
    /// Whether `image` is on the node.
    fn image_present(&self, image: &str) -> impl Future<Output = Result<bool, RuntimeError>> + Send;

    /// Pulls the image of `spec` with its credentials (each in turn; anonymously where it has none), in the
    /// context of its pod sandbox. A failure is a [`RuntimeError::Image`].
    fn pull_image(&self, spec: &ContainerSpec) -> impl Future<Output = Result<PulledImage, RuntimeError>> + Send;

    /// Every image on the node.
    fn list_images(&self) -> impl Future<Output = Result<Vec<NodeImage>, RuntimeError>> + Send;

    /// The IDs of the images of the containers the runtime holds, running or not (a container that exited keeps
    /// its image until it is removed).
    fn images_in_use(&self) -> impl Future<Output = Result<BTreeSet<String>, RuntimeError>> + Send;

    /// Removes image `id`; one already gone is no error.
    fn remove_image(&self, id: &str) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// What each container's writable layer holds (CRI `ListContainerStats`): the disk a container fills by
    /// writing to its root file system, which counts toward its `ephemeral-storage` as its logs do.
    fn writable_layers(&self) -> impl Future<Output = Result<Vec<WritableLayer>, RuntimeError>> + Send;

    /// The mount point of the file system the runtime keeps its images on (CRI `ImageFsInfo`), if it names one.
    /// The default names none.
    fn image_fs(&self) -> impl Future<Output = Result<Option<PathBuf>, RuntimeError>> + Send {
        std::future::ready(Ok(None))
    }

    /// How many pulls may run at once from now on (`None`: no limit), as a reload of `serializeImagePulls` or
    /// `maxParallelImagePulls` says. The default ignores it.
    fn set_pull_limit(&self, limit: Option<u32>) {
        let _ = limit;
    }
}

/// A container's writable layer, as the runtime measured it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WritableLayer {
    /// The UID of the container's pod.
    pub pod_uid: String,
    /// The container's name in its pod.
    pub container: String,
    /// Bytes the layer holds.
    pub bytes: u64,
    /// Inodes it holds (0 where the runtime does not say).
    pub inodes: u64,
}

/// An image on the node, as the image garbage collector sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeImage {
    /// The runtime's ID (`sha256:...`).
    pub id: String,
    /// Its tags and digests.
    pub names: Vec<String>,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// Pinned by the runtime (its sandbox image, say): never collected.
    pub pinned: bool,
}

/// The images of a runtime that has none: this type has no values, so [`Runtime::image_service`] can only be
/// `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoImages {}

impl ImageService for NoImages {
    async fn image_present(&self, _image: &str) -> Result<bool, RuntimeError> {
        match *self {}
    }

    async fn pull_image(&self, _spec: &ContainerSpec) -> Result<PulledImage, RuntimeError> {
        match *self {}
    }

    async fn list_images(&self) -> Result<Vec<NodeImage>, RuntimeError> {
        match *self {}
    }

    async fn images_in_use(&self) -> Result<BTreeSet<String>, RuntimeError> {
        match *self {}
    }

    async fn remove_image(&self, _id: &str) -> Result<(), RuntimeError> {
        match *self {}
    }

    async fn writable_layers(&self) -> Result<Vec<WritableLayer>, RuntimeError> {
        match *self {}
    }
}

/// The interactive sessions of a runtime that serves none: this type has no values, so [`Runtime::streaming`] can
/// only be `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoStreaming {}

impl StreamingRuntime for NoStreaming {
    async fn exec_session(
        &self,
        _id: &ContainerId,
        _cmd: &[String],
        _streams: Streams,
    ) -> Result<String, RuntimeError> {
        match *self {}
    }

    async fn attach_session(&self, _id: &ContainerId, _streams: Streams) -> Result<String, RuntimeError> {
        match *self {}
    }

    async fn port_forward_session(&self, _sandbox_id: &str, _ports: &[u16]) -> Result<String, RuntimeError> {
        match *self {}
    }
}

/// The sandboxes of a runtime that has none: this type has no values, so [`Runtime::sandboxes`] can only be `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoSandboxes {}

impl SandboxRuntime for NoSandboxes {
    async fn run_sandbox(&self, _spec: &SandboxSpec) -> Result<RunningSandbox, RuntimeError> {
        match *self {}
    }

    async fn adopt_sandbox(&self, _spec: &SandboxSpec) -> Option<RunningSandbox> {
        match *self {}
    }

    async fn stop_sandboxes(&self, _pod_uid: &str) {
        match *self {}
    }

    async fn remove_sandboxes(&self, _pod_uid: &str) {
        match *self {}
    }
}

/// The kubelet's reason for an exit: `OOMKilled`, `Completed` (0) or `Error`.
pub fn exit_reason(exit_code: i32, oom_killed: bool) -> &'static str {
    match (oom_killed, exit_code) {
        (true, _) => "OOMKilled",
        (false, 0) => "Completed",
        (false, _) => "Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_output_is_cut_at_a_char_boundary() {
        // 'é' is two bytes: with one ASCII byte first, the limit falls inside a character.
        let stdout = format!("x{}", "é".repeat(EXEC_OUTPUT_LIMIT));
        let out = ExecOutput::from_streams(Some(0), stdout.as_bytes(), b"never seen");
        assert_eq!(out.output.len(), EXEC_OUTPUT_LIMIT - 1);
        assert!(out.output.starts_with("xé") && out.output.ends_with('é'));
        // stdout then stderr, both kept when short; a three-byte character across the cut.
        let out = ExecOutput::from_streams(Some(1), b"out", "€".repeat(EXEC_OUTPUT_LIMIT).as_bytes());
        assert!(out.output.starts_with("out€"));
        assert!(out.output.len() <= EXEC_OUTPUT_LIMIT && out.output.len() > EXEC_OUTPUT_LIMIT - 3);
        assert_eq!(ExecOutput::from_streams(None, b"a", b"\xffb").output, "a\u{fffd}b");
    }
}
