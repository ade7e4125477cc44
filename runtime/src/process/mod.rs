//! The embedded process runtime: each container is a host process started by the daemon and placed in its container
//! cgroup before it execs its command (see `exec`), with stdout and stderr written to the container's log file. The log file descriptors belong to the process, not to
//! nodewarden, so containers keep running and logging while the daemon restarts; the next daemon adopts them from
//! their cgroups.

mod confine;
mod exec;
mod overlay;
mod sys;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::Component;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use jiff::Timestamp;
use nodewarden_resources::{CgroupFs, CgroupPath};
use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open, pidfd_send_signal};
use tokio::io::AsyncReadExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use exec::ExecRequest;
pub use exec::START_FAILED;

use crate::seam::{
    ContainerId, ContainerSpec, EXEC_OUTPUT_LIMIT, ExecOutput, ExitInfo, MainProcess, NoImages, NoSandboxes,
    NoStreaming, Runtime, RuntimeError, RuntimeFacts, Started, StopSignals, exit_reason,
};

/// The `PATH` a container gets when its spec sets none: the process runtime has no image to take one from.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The environment with [`DEFAULT_PATH`] first unless it sets `PATH` itself.
fn with_default_path(env: &[(String, String)]) -> Vec<(String, String)> {
    let mut out = Vec::with_capacity(env.len() + 1);
    if !env.iter().any(|(k, _)| k == "PATH") {
        out.push(("PATH".to_owned(), DEFAULT_PATH.to_owned()));
    }
    out.extend(env.iter().cloned());
    out
}

struct Entry {
    pidfd: Option<OwnedFd>,
    /// The main process's PID (0 for one that never started): a command run in the container joins its mount
    /// namespace and takes its environment.
    pid: u32,
    exit: watch::Receiver<Option<ExitInfo>>,
    /// Where the exit watch tells of the exit: held here too, so that a watch ended by the daemon's shutdown
    /// never closes the channel (a closed one would read as an exit nobody saw).
    _exit_tx: Arc<watch::Sender<Option<ExitInfo>>>,
    /// SIGTERM went out: a container is sent its stop signal once.
    term_sent: bool,
    /// What a command run in the container needs: its cgroup, user, environment and mounts.
    spec: ContainerSpec,
}

/// The environment of process `pid` as it was started (`/proc/<pid>/environ`); `None` when it cannot be read.
fn main_environment(pid: u32) -> Option<Vec<(String, String)>> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let vars = raw.split(|b| *b == 0).filter(|v| !v.is_empty()).filter_map(|v| {
        let text = String::from_utf8_lossy(v);
        let (k, v) = text.split_once('=')?;
        Some((k.to_owned(), v.to_owned()))
    });
    Some(vars.collect())
}

/// The process runtime.
pub struct ProcessRuntime {
    fs: CgroupFs,
    /// The runtime's own directory on the node's disk (`<rootDir>/process-runtime`): each container's overlay
    /// directories, for its mountPaths that do not exist on the node, are in `<scratch>/<container id>`.
    scratch: std::path::PathBuf,
    containers: Arc<Mutex<HashMap<String, Entry>>>,
    /// The daemon's task tracker and shutdown token: the exit watches run on them and end with the daemon (the
    /// containers run on, for the next daemon to adopt).
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for ProcessRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessRuntime")
            .field("cgroup_root", &self.fs.scope())
            .field("scratch", &self.scratch)
            .finish_non_exhaustive()
    }
}

fn container_id(spec: &ContainerSpec) -> String {
    format!("{}_{}_{}", spec.pod_uid, spec.name, spec.attempt)
}

/// A container's scratch directory in `scratch`, when its ID is one plain file name (it always is for the IDs this
/// runtime makes; anything else names no directory, so nothing outside `scratch` is ever made or removed).
fn scratch_dir(scratch: &std::path::Path, id: &str) -> Option<std::path::PathBuf> {
    let mut parts = std::path::Path::new(id).components();
    match (parts.next(), parts.next()) {
        (Some(Component::Normal(name)), None) if name == id => Some(scratch.join(name)),
        _ => None,
    }
}

impl ProcessRuntime {
    /// A runtime that starts containers in cgroups of `fs`, which reads `memory.events` for OOM kills; its exit
    /// watches are tasks of `tasks` that end on `shutdown`. `scratch` is a directory of its own on the node's disk
    /// (made when first needed): the upper and work directories of the overlays that give a container the
    /// mountPaths missing on the node are there, removed with the container.
    pub fn new(fs: CgroupFs, scratch: std::path::PathBuf, tasks: TaskTracker, shutdown: CancellationToken) -> Self {
        Self { fs, scratch, containers: Arc::new(Mutex::new(HashMap::new())), tasks, shutdown }
    }

    /// Runs an exit watch, which tells `exit` of the container's exit, on the daemon's tracker until the daemon
    /// shuts down. A watch that ends otherwise without having told (a panic) tells of an exit nobody saw, so the
    /// container is never left looking alive.
    fn spawn_watch(
        tasks: &TaskTracker,
        shutdown: &CancellationToken,
        exit: Arc<watch::Sender<Option<ExitInfo>>>,
        watch: impl Future<Output = ()> + Send + 'static,
    ) {
        let stop = shutdown.clone();
        tasks.spawn(async move {
            let _unseen = Unseen { exit, stop: stop.clone() };
            stop.run_until_cancelled(watch).await;
        });
    }

    fn request(&self, spec: &ContainerSpec, argv: &[String]) -> ExecRequest {
        ExecRequest {
            cgroup_procs: self.fs.file(&spec.cgroup, "cgroup.procs"),
            oom_score_adj: spec.oom_score_adj,
            argv: argv.to_vec(),
            env: with_default_path(&spec.env),
            working_dir: spec.working_dir.clone().unwrap_or_else(|| "/".into()),
            user: spec.user,
            // Without runAsGroup, the user's primary group on the host, never root's by default.
            // (`/etc/passwd` is read only for a container that sets a user.)
            group: spec.group.or_else(|| {
                spec.user.map(|u| {
                    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
                    confine::primary_group(&passwd, u)
                })
            }),
            groups: spec.security.supplemental_groups.clone(),
            no_new_privs: spec.security.no_new_privs,
            // `drop: [ALL]` with `add: [X]` keeps X, as a CRI runtime does.
            drop_capabilities: confine::dropped(&spec.security.drop_capabilities)
                - confine::dropped(&spec.security.add_capabilities),
            mounts: spec.mounts.clone(),
            scratch: scratch_dir(&self.scratch, &container_id(spec)),
            mount_ns: None,
        }
    }

    /// Refuses a container whose cgroup is outside nodewarden's root: only cgroups within it are joined.
    fn within_root(&self, spec: &ContainerSpec) -> Result<(), RuntimeError> {
        if spec.cgroup.is_within(self.fs.scope()) {
            return Ok(());
        }
        Err(RuntimeError::Start(format!("cgroup {} is outside nodewarden's root {}", spec.cgroup, self.fs.scope())))
    }

    /// The command for a process run in container `spec` (an exec), which starts in the container's cgroup, mount
    /// namespace and user; with the overlay directories made for it, to be removed once it has exited.
    fn command(
        &self,
        spec: &ContainerSpec,
        req: &ExecRequest,
    ) -> Result<(tokio::process::Command, exec::OverlayDirs), RuntimeError> {
        self.within_root(spec)?;
        req.command().map_err(RuntimeError::Start)
    }

    /// A container whose process could not be started: known to the runtime, exited at once with `StartError`, as
    /// runc reports a command that cannot be executed.
    fn start_failed(&self, spec: &ContainerSpec, id: String, message: String) -> Started {
        let now = Timestamp::now();
        tracing::debug!(container_id = %id, error = %message, "container process not started");
        let info = ExitInfo {
            exit_code: START_FAILED,
            signal: None,
            reason: "StartError".into(),
            message: Some(message),
            started_at: now,
            finished_at: now,
        };
        let (tx, rx) = watch::channel(Some(info));
        let entry =
            Entry { pidfd: None, pid: 0, exit: rx, _exit_tx: Arc::new(tx), term_sent: false, spec: spec.clone() };
        register(&self.containers, id.clone(), entry);
        Started { id: ContainerId::new(id), pid: 0, pid_start: None, started_at: now }
    }

    /// Sends `signal` to the container's main process unless it has exited (or, for SIGTERM, has been sent it
    /// already); returns its exit watch.
    fn signal(&self, id: &str, signal: Signal) -> Result<watch::Receiver<Option<ExitInfo>>, RuntimeError> {
        let mut map = self.containers.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = map.get_mut(id).ok_or_else(|| RuntimeError::NotFound(id.to_owned()))?;
        if entry.exit.borrow().is_some() || (signal == Signal::TERM && entry.term_sent) {
            return Ok(entry.exit.clone());
        }
        let fd = entry.pidfd.as_ref().ok_or_else(|| RuntimeError::NotFound(id.to_owned()))?;
        match pidfd_send_signal(fd, signal) {
            Ok(()) | Err(rustix::io::Errno::SRCH) => {
                tracing::debug!(container_id = %id, ?signal, "signal sent");
                entry.term_sent |= signal == Signal::TERM;
                Ok(entry.exit.clone())
            }
            Err(e) => Err(RuntimeError::Other(format!("cannot signal container {id}: {e}"))),
        }
    }
}

impl StopSignals for ProcessRuntime {
    /// SIGTERM to the container's process, once; a container the runtime no longer has is gone, so done.
    fn signal_stop_now(&self, id: &ContainerId) -> bool {
        let id = id.as_str();
        let known = self.containers.lock().unwrap_or_else(PoisonError::into_inner).contains_key(id);
        !known || self.signal(id, Signal::TERM).is_ok()
    }
}

/// Records container `id` in the runtime's map.
fn register(containers: &Mutex<HashMap<String, Entry>>, id: String, entry: Entry) {
    containers.lock().unwrap_or_else(PoisonError::into_inner).insert(id, entry);
}

/// How long the processes a container's last run left behind get to disappear after `cgroup.kill` before the next
/// run starts anyway.
const LEFTOVER_WAIT: Duration = Duration::from_secs(2);

/// Kills what is left in a container's cgroup (`cgroup.kill`), as runc ends a container without a PID namespace
/// of its own when its main process exits: a run's children never outlive it. True when something was killed.
fn kill_leftovers(fs: &CgroupFs, cg: &CgroupPath) -> bool {
    let left = fs.read_procs(cg).map(|p| p.len()).unwrap_or(0);
    if left == 0 {
        return false;
    }
    tracing::info!(cgroup = %cg, processes = left, "killing what the container's main process left behind");
    match fs.kill(cg) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(cgroup = %cg, error = %e, "cannot kill the processes left in a container's cgroup");
            false
        }
    }
}

/// Kills what is left in a container's cgroup and waits, at most [`LEFTOVER_WAIT`], for it to be gone.
async fn clear_leftovers(fs: &CgroupFs, cg: &CgroupPath) {
    if !kill_leftovers(fs, cg) {
        return;
    }
    let deadline = tokio::time::Instant::now() + LEFTOVER_WAIT;
    while fs.read_procs(cg).is_ok_and(|p| !p.is_empty()) {
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(cgroup = %cg, "processes left in a container's cgroup survive cgroup.kill; starting beside them");
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The OOM kills counted in a cgroup's `memory.events` (0 when it cannot be read).
fn oom_kills(fs: &CgroupFs, cg: &CgroupPath) -> u64 {
    fs.read_flat_keyed(cg, "memory.events").ok().and_then(|m| m.get("oom_kill").copied()).unwrap_or(0)
}

fn open_log(path: &std::path::Path) -> Result<std::fs::File, RuntimeError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| RuntimeError::Start(format!("{}: {e}", dir.display())))?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| RuntimeError::Start(format!("cannot open the log file {}: {e}", path.display())))
}

/// Tells of an exit nobody saw when an exit watch ends without having told, unless the daemon is shutting down.
struct Unseen {
    exit: Arc<watch::Sender<Option<ExitInfo>>>,
    stop: CancellationToken,
}

impl Drop for Unseen {
    fn drop(&mut self) {
        if !self.stop.is_cancelled() && self.exit.borrow().is_none() {
            let now = Timestamp::now();
            self.exit.send_replace(Some(ExitInfo::unknown("the container's exit watch ended without its exit", now)));
        }
    }
}

/// Waits for a started container's process to exit and sends its exit, an OOM kill in its cgroup since
/// `oom_before` included.
async fn watch_exit(
    pidfd: OwnedFd,
    tx: Arc<watch::Sender<Option<ExitInfo>>>,
    fs: CgroupFs,
    cgroup: CgroupPath,
    oom_before: u64,
    started_at: Timestamp,
) {
    let (exit_code, signal) = match sys::wait_exit(pidfd).await {
        Ok((code, signal)) => decode(code, signal),
        Err(e) => {
            tracing::warn!(error = %e, "cannot wait for a container process");
            (START_FAILED, None)
        }
    };
    kill_leftovers(&fs, &cgroup);
    let oom_killed = oom_kills(&fs, &cgroup) > oom_before;
    let _ = tx.send(Some(ExitInfo {
        exit_code,
        signal,
        reason: exit_reason(exit_code, oom_killed).to_owned(),
        message: None,
        started_at,
        finished_at: Timestamp::now(),
    }));
}

/// The exit code and signal of an exit status: its code, or the signal that ended it.
fn decode(code: Option<i32>, signal: Option<i32>) -> (i32, Option<i32>) {
    match (code, signal) {
        (Some(c), _) => (c, None),
        (None, Some(s)) => (128 + s, Some(s)),
        (None, None) => (START_FAILED, None),
    }
}

/// Reads `from` to its end, keeping the first [`EXEC_OUTPUT_LIMIT`] bytes in `kept`: a command that writes more
/// than a pipe holds must not block on it (a probe would time out, a preStop hook run out its grace period), so
/// the rest is read and dropped, as a CRI runtime drains an exec's output and the kubelet cuts it.
async fn drain(from: &mut (impl tokio::io::AsyncRead + Unpin), kept: &mut Vec<u8>) {
    let mut buf = [0u8; 8192];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let room = EXEC_OUTPUT_LIMIT.saturating_sub(kept.len()).min(n);
                kept.extend_from_slice(&buf[..room]);
            }
        }
    }
}

/// Runs an exec's command to its end, or until `timeout` (then it is killed).
async fn run_exec(
    cmd: &mut tokio::process::Command,
    argv: &[String],
    timeout: Duration,
) -> Result<ExecOutput, RuntimeError> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| RuntimeError::Start(format!("cannot start {:?}: {e}", argv[0])))?;
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let run = async {
        let mut out = Vec::new();
        let mut err = Vec::new();
        let read_out = async {
            if let Some(s) = stdout.as_mut() {
                drain(s, &mut out).await;
            }
        };
        let read_err = async {
            if let Some(s) = stderr.as_mut() {
                drain(s, &mut err).await;
            }
        };
        tokio::join!(read_out, read_err);
        let status = child.wait().await;
        (status, out, err)
    };
    match tokio::time::timeout(timeout, run).await {
        Ok((Ok(status), out, err)) => {
            use std::os::unix::process::ExitStatusExt;
            Ok(ExecOutput::from_streams(Some(decode(status.code(), status.signal()).0), &out, &err))
        }
        Ok((Err(e), _, _)) => Err(RuntimeError::Other(format!("exec: {e}"))),
        Err(_) => Ok(ExecOutput::timed_out(timeout)),
    }
}

impl RuntimeFacts for ProcessRuntime {
    fn scheme(&self) -> &'static str {
        "process"
    }

    fn version(&self) -> String {
        format!("nodewarden-process://{}", env!("CARGO_PKG_VERSION"))
    }
}

impl Runtime for ProcessRuntime {
    type Sandboxes = NoSandboxes;

    fn sandboxes(&self) -> Option<&NoSandboxes> {
        None
    }

    type Images = NoImages;

    fn image_service(&self) -> Option<&NoImages> {
        None
    }

    type Streaming = NoStreaming;

    fn streaming(&self) -> Option<&NoStreaming> {
        None
    }

    async fn start(&self, spec: &ContainerSpec) -> Result<Started, RuntimeError> {
        confine::check(spec)?;
        if spec.command.is_empty() {
            return Err(RuntimeError::Config(
                "the process runtime needs a command: it does not read images, so there is no entrypoint".into(),
            ));
        }
        let argv = spec.argv();
        let id = container_id(spec);
        let log = OwnedFd::from(open_log(&spec.log_path)?);
        let err_log = log.try_clone().map_err(|e| RuntimeError::Start(e.to_string()))?;
        if self.within_root(spec).is_ok() {
            clear_leftovers(&self.fs, &spec.cgroup).await;
        }
        let oom_before = oom_kills(&self.fs, &spec.cgroup);
        let req = self.request(spec, &argv);
        let prepared = self.within_root(spec).and_then(|()| req.spawn(log, err_log).map_err(RuntimeError::Start));
        let prepared = match prepared {
            Ok(p) => p,
            Err(e) => return Ok(self.start_failed(spec, id, e.to_string())),
        };
        let (containers, fs, cgroup) = (self.containers.clone(), self.fs.clone(), spec.cgroup.clone());
        let (registered, owned) = (id.clone(), spec.clone());
        let (tasks, shutdown) = (self.tasks.clone(), self.shutdown.clone());
        // The spawn returns once the child has exec'd its command (or failed to), so the process runs in its cgroup
        // by then: started means running in the container, as a runtime reports it. Until then the thread waits
        // (where the kernel refuses to create the child in its cgroup, through the child's move there: an RCU
        // grace period, tens of milliseconds under emulation), so on the blocking pool. The spawn and the watch of
        // the child are one blocking task, which runs to its end even when this start is abandoned (its future
        // dropped): a started child is always registered, watched and collected.
        let spawned = tokio::task::spawn_blocking(move || {
            let child = prepared.spawn()?;
            let started_at = Timestamp::now();
            let pid_start = sys::start_ticks(child.pid);
            let (tx, rx) = watch::channel(None);
            let tx = Arc::new(tx);
            let kept = child
                .pidfd
                .try_clone()
                .inspect_err(|e| tracing::warn!(container_id = %registered, error = %e, "cannot keep a pidfd to signal the container"))
                .ok();
            let pid = child.pid;
            let entry = Entry { pidfd: kept, pid, exit: rx, _exit_tx: tx.clone(), term_sent: false, spec: owned };
            register(&containers, registered, entry);
            let watch = watch_exit(child.pidfd, tx.clone(), fs, cgroup, oom_before, started_at);
            Self::spawn_watch(&tasks, &shutdown, tx, watch);
            Ok::<_, std::io::Error>((child.pid, pid_start, started_at))
        })
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r);
        match spawned {
            Ok((pid, pid_start, started_at)) => Ok(Started { id: ContainerId::new(id), pid, pid_start, started_at }),
            Err(e) => Ok(self.start_failed(spec, id, format!("cannot start {:?}: {e}", argv[0]))),
        }
    }

    async fn adopt(&self, spec: &ContainerSpec, main: Option<MainProcess>) -> Option<Started> {
        self.within_root(spec).ok()?;
        let procs = self.fs.read_procs(&spec.cgroup).ok()?;
        // Only the main process the earlier daemon saved, and only while it is the same process: another process
        // of the cgroup (a child the main process left) is no container, and a PID given again is another process.
        // The pidfd is opened first, so the process checked is the one watched.
        let found = main.filter(|m| procs.contains(&m.pid)).and_then(|m| {
            let pidfd =
                Pid::from_raw(i32::try_from(m.pid).ok()?).and_then(|p| pidfd_open(p, PidfdFlags::empty()).ok())?;
            let now = sys::start_ticks(m.pid);
            let same = now.is_some() && (m.start.is_none() || m.start == now);
            same.then_some((m.pid, now, pidfd))
        });
        let Some((pid, pid_start, pidfd)) = found else {
            // Its main process ended while no daemon watched it: what it left is killed, and the container is
            // seen exited.
            kill_leftovers(&self.fs, &spec.cgroup);
            return None;
        };
        let id = container_id(spec);
        let (tx, rx) = watch::channel(None);
        let tx = Arc::new(tx);
        let pidfd = Some(pidfd);
        let entry = Entry { pidfd, pid, exit: rx, _exit_tx: tx.clone(), term_sent: false, spec: spec.clone() };
        register(&self.containers, id.clone(), entry);
        let pidfd = {
            let map = self.containers.lock().unwrap_or_else(PoisonError::into_inner);
            map.get(&id).and_then(|e| e.pidfd.as_ref().and_then(|fd| fd.try_clone().ok()))
        };
        let Some(pidfd) = pidfd else {
            // The process is gone already.
            self.containers.lock().unwrap_or_else(PoisonError::into_inner).remove(&id);
            return None;
        };
        let started_at = Timestamp::now();
        let fs = self.fs.clone();
        let cgroup = spec.cgroup.clone();
        let oom_before = oom_kills(&self.fs, &spec.cgroup);
        Self::spawn_watch(&self.tasks, &self.shutdown, tx.clone(), async move {
            // Not a child of this daemon, so its exit status is not ours to collect: a pidfd tells when it ended.
            if let Err(e) = sys::pidfd_exited(pidfd).await {
                tracing::warn!(error = %e, "cannot watch an adopted container; treating it as exited");
            }
            kill_leftovers(&fs, &cgroup);
            let (exit_code, reason, message) = if oom_kills(&fs, &cgroup) > oom_before {
                (137, "OOMKilled", None)
            } else {
                (
                    137,
                    "ContainerStatusUnknown",
                    Some("the container was adopted after a nodewarden restart and its exit code is unknown".into()),
                )
            };
            let _ = tx.send(Some(ExitInfo {
                exit_code,
                signal: None,
                reason: reason.into(),
                message,
                started_at,
                finished_at: Timestamp::now(),
            }));
        });
        Some(Started { id: ContainerId::new(id), pid, pid_start, started_at })
    }

    async fn wait(&self, id: &ContainerId) -> ExitInfo {
        let id = id.as_str();
        let rx = self.containers.lock().unwrap_or_else(PoisonError::into_inner).get(id).map(|e| e.exit.clone());
        let unknown = || ExitInfo::unknown(format!("container {id} is not known to the runtime"), Timestamp::now());
        let Some(mut rx) = rx else { return unknown() };
        match rx.wait_for(Option::is_some).await {
            Ok(v) => v.clone().unwrap_or_else(unknown),
            Err(_) => unknown(),
        }
    }

    async fn stop(&self, id: &ContainerId, grace: Duration) -> Result<(), RuntimeError> {
        let id = id.as_str();
        if !grace.is_zero() {
            let mut exit = self.signal(id, Signal::TERM)?;
            if tokio::time::timeout(grace, exit.wait_for(Option::is_some)).await.is_ok() {
                return Ok(());
            }
        }
        self.signal(id, Signal::KILL).map(drop)
    }

    fn stop_signals(&self) -> Option<&dyn StopSignals> {
        Some(self)
    }

    async fn exec(&self, id: &ContainerId, argv: &[String], timeout: Duration) -> Result<ExecOutput, RuntimeError> {
        let id = id.as_str();
        let (spec, main) = {
            let map = self.containers.lock().unwrap_or_else(PoisonError::into_inner);
            let e = map.get(id).ok_or_else(|| RuntimeError::NotFound(id.to_owned()))?;
            let running = e.exit.borrow().is_none() && e.pid != 0;
            (e.spec.clone(), running.then_some(e.pid))
        };
        if argv.is_empty() {
            return Err(RuntimeError::Config("exec: no command".into()));
        }
        let mut req = self.request(&spec, argv);
        // In a running container, the command sees what its main process sees: its mounts (the overlays of its
        // missing mountPaths, what it wrote there) and its environment (with the values from ConfigMaps and
        // Secrets it was started with, which an adopted container's spec leaves out).
        if let Some(pid) = main {
            req.mount_ns = Some(std::path::PathBuf::from(format!("/proc/{pid}/ns/mnt")));
            if let Some(env) = main_environment(pid) {
                req.env = env;
            }
        }
        let built = self.command(&spec, &req);
        // The namespace opened was the main process's if it still runs now (its PID not reused meanwhile).
        let exited = || {
            self.containers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(id)
                .is_none_or(|e| e.exit.borrow().is_some())
        };
        if main.is_some() && exited() {
            return Err(RuntimeError::Other(format!("container {id} exited")));
        }
        let out = match built {
            Ok((mut cmd, dirs)) => {
                let out = run_exec(&mut cmd, argv, timeout).await;
                // The command's own overlays (in a mount namespace of its own) are no longer used once it has
                // exited, or was killed at its timeout; removed off the async threads, as in `remove`.
                let _ = tokio::task::spawn_blocking(move || drop(dirs)).await;
                out
            }
            Err(e) => Err(e),
        };
        // A container removed while the command started (a probe's, at the pod's end) may have had its scratch
        // directory made again by it: it goes now.
        let removed = !self.containers.lock().unwrap_or_else(PoisonError::into_inner).contains_key(id);
        if removed && let Some(dir) = req.scratch.filter(|d| d.exists()) {
            exec::remove_logged(&dir);
        }
        out
    }

    /// Forgets the container and removes its scratch directory (the overlays of its missing mountPaths; best
    /// effort, logged), off the async threads: a container may have written much to an overlaid directory.
    async fn remove(&self, id: &ContainerId) {
        let id = id.as_str();
        self.containers.lock().unwrap_or_else(PoisonError::into_inner).remove(id);
        if let Some(dir) = scratch_dir(&self.scratch, id).filter(|d| d.exists())
            && let Err(e) = tokio::task::spawn_blocking(move || exec::remove_logged(&dir)).await
        {
            tracing::warn!(container_id = %id, error = %e, "cannot remove a container's scratch directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seam::{LinuxResources, PullPolicy};

    #[tokio::test]
    async fn a_container_signalled_at_once_is_not_signalled_again_by_its_stop_which_still_kills() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("nw/podu/app")).unwrap();
        std::fs::write(dir.path().join("nw/podu/app/cgroup.procs"), "").unwrap();
        let fs = CgroupFs::new(dir.path(), CgroupPath::parse("/nw").unwrap());
        let runtime = ProcessRuntime::new(fs, dir.path().join("scratch"), TaskTracker::new(), CancellationToken::new());
        let (terms, ready) = (dir.path().join("terms"), dir.path().join("ready"));
        // A container that notes each SIGTERM and carries on.
        let script = format!(
            "trap 'echo term >> {}' TERM; touch {}; while :; do sleep 0.05; done",
            terms.display(),
            ready.display()
        );
        let spec = ContainerSpec {
            pod_uid: "u".into(),
            sandbox_id: String::new(),
            name: "app".into(),
            attempt: 0,
            image: "busybox".into(),
            pull_policy: PullPolicy::Never,
            command: vec!["sh".into(), "-c".into(), script],
            args: vec![],
            env: vec![],
            working_dir: None,
            user: None,
            group: None,
            cgroup: CgroupPath::parse("/nw/podu/app").unwrap(),
            oom_score_adj: 0,
            resources: LinuxResources::default(),
            log_path: dir.path().join("log"),
            mounts: vec![],
            security: crate::security::Security::default(),
            pull_auths: Vec::new(),
        };
        let runtime = crate::SelectedRuntime::Process(runtime);
        assert!(runtime.stop_signals().is_some(), "the daemon's runtime signals at once");
        let started = runtime.start(&spec).await.unwrap();
        let id = started.id;
        let wait_for = |path: std::path::PathBuf| async move {
            for _ in 0..400 {
                if path.exists() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("{} never appeared", path.display());
        };
        wait_for(ready).await;
        // A command that writes far more than a pipe holds runs to its end: its output is read and cut.
        let chatty = ["sh", "-c", "seq 1 40000; seq 1 40000 >&2; exit 3"].map(String::from);
        let out = runtime.exec(&id, &chatty, Duration::from_secs(20)).await.unwrap();
        assert_eq!(out.exit_code, Some(3), "{out:?}");
        assert!(out.output.starts_with("1\n2\n3\n") && out.output.len() <= EXEC_OUTPUT_LIMIT, "{}", out.output.len());
        assert!(runtime.stop_signals().unwrap().signal_stop_now(&id));
        wait_for(terms.clone()).await;
        // The stop waits out the grace period without a second SIGTERM, then kills.
        runtime.stop(&id, Duration::from_millis(300)).await.unwrap();
        let exit = tokio::time::timeout(Duration::from_secs(5), runtime.wait(&id)).await.unwrap();
        assert_eq!(exit.signal, Some(9));
        assert_eq!(std::fs::read_to_string(&terms).unwrap(), "term\n");
    }
}
