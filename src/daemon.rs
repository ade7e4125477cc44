//! The daemon: checks the host, builds the kubepods tree, adopts existing pods, serves the endpoints, keeps
//! observing the node, and shuts down on SIGTERM or SIGINT leaving pod cgroups in place for the next start.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context;
use nodewarden_eviction::signal_observations;
use nodewarden_resources::{CgroupFs, CgroupPath, HostPaths, ResourceManager, check_host};
use nodewarden_sync::{PodManager, PodSource, ProcessRuntime, StaticPodSource, StatusStore, SyncMetrics, SyncSettings};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::config::Config;
use crate::metrics::Metrics;

/// State shared by the endpoints and the loops.
pub struct Shared {
    /// The configuration in force.
    pub config: Config,
    /// The resource manager, the only writer of cgroupfs.
    pub manager: Arc<Mutex<ResourceManager>>,
    /// Pod sync; `None` when no runtime is available.
    pods: Option<Arc<PodManager<ProcessRuntime>>>,
    /// Pods and their status (`/pods`).
    pub store: Arc<StatusStore>,
    /// The metrics.
    pub metrics: Metrics,
    /// A handle on cgroupfs and the kubepods cgroup for the readiness check, which must never wait for the
    /// manager's lock: a pass stuck on a hung read would otherwise hang `/readyz` too.
    probe: (CgroupFs, CgroupPath),
    last_pass: Mutex<Option<Instant>>,
    last_error: Mutex<Option<String>>,
}

impl Shared {
    /// The readiness checks with their results.
    pub fn readiness(&self) -> Vec<(&'static str, Result<(), String>)> {
        let stale_after = (self.config.housekeeping_interval * 3).max(Duration::from_secs(3));
        let last = *self.last_pass.lock().unwrap_or_else(PoisonError::into_inner);
        let housekeeping = match last {
            Some(t) if t.elapsed() <= stale_after => Ok(()),
            Some(t) => {
                let err = self.last_error.lock().unwrap_or_else(PoisonError::into_inner).clone();
                Err(format!(
                    "last pass {:.1}s ago{}",
                    t.elapsed().as_secs_f64(),
                    err.map(|e| format!(": {e}")).unwrap_or_default()
                ))
            }
            None => Err("no pass completed yet".into()),
        };
        let (fs, kubepods) = &self.probe;
        let cgroupfs = fs.read(kubepods, "memory.max").map(|_| ()).map_err(|e| e.to_string());
        let (podsync, runtime) = match &self.pods {
            Some(p) => (p.readiness(), Ok(())),
            None => (Ok(()), Err(NO_CRI.to_owned())),
        };
        vec![("housekeeping", housekeeping), ("cgroupfs", cgroupfs), ("podsync", podsync), ("runtime", runtime)]
    }

    /// One observation pass: read the node-level signals (a fixed number of reads), update the metrics.
    fn housekeeping_pass(&self) {
        let start = Instant::now();
        let m = self.manager.lock().unwrap_or_else(PoisonError::into_inner);
        match m.observe() {
            Ok(obs) => {
                let signals = signal_observations(&obs, m.allocatable());
                self.metrics.set_thresholds(&self.config.thresholds, &signals);
                self.metrics.set_pods(m.placements());
                self.metrics.observe(&obs, &signals, start.elapsed().as_secs_f64());
                *self.last_pass.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
                *self.last_error.lock().unwrap_or_else(PoisonError::into_inner) = None;
            }
            Err(e) => {
                tracing::warn!(error = %e, "observation pass failed");
                self.metrics.housekeeping_failed();
                *self.last_error.lock().unwrap_or_else(PoisonError::into_inner) = Some(e.to_string());
            }
        }
    }
}

/// The nearest existing ancestor of `path` (statfs needs an existing path; `/var/lib/kubelet` may not exist yet).
fn existing_ancestor(path: &Path) -> PathBuf {
    path.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/")).to_path_buf()
}

/// True when the running kernel is at least `major.minor`.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let uname = rustix::system::uname();
    let release = uname.release().to_string_lossy();
    let mut parts = release.split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse::<u32>().ok());
    match (parts.next(), parts.next()) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}

/// Why no pods run when `containerRuntimeEndpoint` is set.
const NO_CRI: &str = "containerRuntimeEndpoint is set, but this nodewarden has no CRI client yet; no pods are run";

/// How long shutdown waits for open HTTP connections.
const SERVER_DRAIN: Duration = Duration::from_secs(5);

/// Why the daemon stopped.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The host cannot run nodewarden (no cgroup v2, missing controllers, not writable).
    #[error(transparent)]
    Host(#[from] nodewarden_resources::HostError),
    /// Anything else, with context.
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// Runs the daemon until SIGTERM or SIGINT.
pub async fn run(mut config: Config) -> Result<(), DaemonError> {
    for f in &config.ignored {
        tracing::info!(field = %f, "kubelet config field is not implemented by nodewarden and is ignored");
    }
    for w in &config.warnings {
        tracing::warn!("{w}");
    }
    let fs = CgroupFs::new(&config.cgroup_mount, config.resources.cgroup_root.clone());
    check_host(&fs, &config.resources.cgroup_root)?;
    if config.resources.memory_qos && !kernel_at_least(5, 9) {
        tracing::warn!("Memory QoS needs Linux 5.9 or newer; memory.min and memory.high are not set");
        config.resources.memory_qos = false;
    }
    let host = HostPaths {
        nodefs: existing_ancestor(&config.nodefs_path),
        imagefs: existing_ancestor(&config.imagefs_path),
        ..HostPaths::default()
    };
    let mut manager =
        ResourceManager::new(fs, host, config.resources.clone()).context("cannot read the node's capacity")?;
    let adopted = manager.setup().context("cannot set up the kubepods tree")?;
    let alloc = *manager.allocatable();
    tracing::info!(
        cgroup = %manager.tree().kubepods,
        memory_limit = alloc.enforced.memory,
        cpu_millis = alloc.enforced.cpu_millis,
        pids_limit = alloc.enforced.pids,
        adopted = adopted.len(),
        memory_qos = config.resources.memory_qos,
        "kubepods tree ready"
    );
    for uid in &adopted {
        tracing::info!(pod_uid = %uid, "adopted existing pod cgroup");
    }
    let metrics = Metrics::new().context("cannot create metrics")?;
    metrics.set_allocatable(&alloc, config.resources.max_pods);
    let probe = (manager.cgroupfs().clone(), manager.tree().kubepods.clone());
    let fs = manager.cgroupfs().clone();
    let manager = Arc::new(Mutex::new(manager));
    let (drain_tx, drain_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    let pods = if config.container_runtime_endpoint.is_some() {
        tracing::error!("{NO_CRI}");
        None
    } else {
        let helper = std::env::current_exe().context("cannot find nodewarden's own executable")?;
        let settings = SyncSettings {
            root_dir: config.root_dir.clone(),
            log_dir: config.pod_logs_dir.clone(),
            node_name: config.node_name.clone(),
        };
        let sync_metrics = SyncMetrics::new(metrics.registry()).context("cannot create metrics")?;
        let pods = PodManager::new(manager.clone(), Arc::new(ProcessRuntime::new(helper, fs)), settings, sync_metrics);
        let (tx, rx) = mpsc::channel(4);
        if let Some(dir) = &config.static_pod_path {
            tracing::info!(dir = %dir.display(), "watching static pod manifests");
            let source = StaticPodSource::new(dir, &config.node_name, config.file_check_frequency);
            tasks.push(tokio::spawn(source.run(tx, drain_rx.clone())));
        }
        tasks.push(tokio::spawn(pods.clone().run(rx, drain_rx.clone())));
        Some(pods)
    };
    let store = pods.as_ref().map_or_else(|| Arc::new(StatusStore::default()), |p| p.store());
    let shared = Arc::new(Shared {
        probe,
        manager,
        pods,
        store,
        metrics,
        last_pass: Mutex::new(None),
        last_error: Mutex::new(None),
        config,
    });

    let housekeeping = tokio::spawn(housekeeping_loop(shared.clone(), drain_rx.clone()));
    let server = match shared.config.healthz {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (healthzBindAddress:healthzPort)"))?;
            tracing::info!(%addr, "serving /healthz /readyz /metrics /pods /configz");
            let mut rx = drain_rx.clone();
            let app = crate::http::router(shared.clone());
            Some(tokio::spawn(async move {
                axum::serve(listener, app).with_graceful_shutdown(async move { drained(&mut rx).await }).await
            }))
        }
        None => None,
    };

    let signal = wait_for_signal().await.context("cannot install signal handlers")?;
    tracing::info!(signal, "shutting down; pod cgroups are left in place for the next start to adopt");
    let _ = drain_tx.send(true);
    let _ = housekeeping.await;
    for t in tasks {
        let _ = t.await;
    }
    if let Some(mut server) = server {
        // Open connections get a moment to finish; a client that holds one open does not hold up the exit.
        match tokio::time::timeout(SERVER_DRAIN, &mut server).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "HTTP server stopped with an error"),
            Ok(Err(e)) => tracing::warn!(error = %e, "HTTP server task failed"),
            Err(_) => {
                tracing::warn!("HTTP connections still open after {SERVER_DRAIN:?}; closing them");
                server.abort();
            }
        }
    }
    Ok(())
}

async fn housekeeping_loop(shared: Arc<Shared>, mut drain: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(shared.config.housekeeping_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let s = shared.clone();
                if let Err(e) = tokio::task::spawn_blocking(move || s.housekeeping_pass()).await {
                    tracing::error!(error = %e, "observation pass panicked");
                }
            }
            () = drained(&mut drain) => return,
        }
    }
}

/// Resolves once the drain signal is given (or its sender is gone).
async fn drained(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|d| *d).await.map(|_| ());
}

async fn wait_for_signal() -> std::io::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;

    #[test]
    fn ancestors_and_kernel_versions() {
        assert_eq!(existing_ancestor(Path::new("/definitely/not/here")), PathBuf::from("/"));
        assert!(kernel_at_least(2, 6));
        assert!(!kernel_at_least(999, 0));
    }

    /// A daemon state over a stand-in cgroupfs and /proc in a temporary directory.
    fn shared(dir: &Path) -> Arc<Shared> {
        for d in ["proc/sys/kernel", "sys/devices/system/cpu", "cg"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        std::fs::write(dir.join("proc/meminfo"), "MemTotal: 1048576 kB\nMemFree: 524288 kB\nMemAvailable: 500000 kB\n")
            .unwrap();
        std::fs::write(dir.join("proc/sys/kernel/pid_max"), "32768\n").unwrap();
        std::fs::write(dir.join("proc/sys/kernel/threads-max"), "32768\n").unwrap();
        std::fs::write(dir.join("proc/loadavg"), "0 0 0 1/10 1\n").unwrap();
        std::fs::write(dir.join("sys/devices/system/cpu/online"), "0\n").unwrap();
        std::fs::create_dir_all(dir.join("cg/kubepods")).unwrap();
        std::fs::write(dir.join("cg/kubepods/memory.current"), "0\n").unwrap();
        std::fs::write(dir.join("cg/kubepods/memory.stat"), "inactive_file 0\n").unwrap();
        let config = config::parse("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n").unwrap();
        let fs = CgroupFs::emulated(dir.join("cg"), CgroupPath::root());
        let host = HostPaths { proc: dir.join("proc"), sys: dir.join("sys"), nodefs: dir.into(), imagefs: dir.into() };
        let mut manager = ResourceManager::new(fs, host, config.resources.clone()).unwrap();
        manager.setup().unwrap();
        Arc::new(Shared {
            probe: (manager.cgroupfs().clone(), manager.tree().kubepods.clone()),
            manager: Arc::new(Mutex::new(manager)),
            pods: None,
            store: Arc::new(StatusStore::default()),
            metrics: Metrics::new().unwrap(),
            last_pass: Mutex::new(None),
            last_error: Mutex::new(None),
            config,
        })
    }

    #[test]
    fn readiness_never_waits_for_the_manager() {
        let dir = tempfile::tempdir().unwrap();
        let s = shared(dir.path());
        let _held = s.manager.lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let s2 = s.clone();
        std::thread::spawn(move || tx.send(s2.readiness()).unwrap());
        let checks = rx.recv_timeout(Duration::from_secs(5)).expect("readiness blocked on the manager's lock");
        assert_eq!(checks[1], ("cgroupfs", Ok(())));
    }

    #[tokio::test(start_paused = true)]
    async fn readiness_goes_stale_when_passes_stop() {
        let dir = tempfile::tempdir().unwrap();
        let s = shared(dir.path());
        assert_eq!(s.readiness()[0], ("housekeeping", Err("no pass completed yet".into())));
        s.housekeeping_pass();
        assert_eq!(s.readiness()[0], ("housekeeping", Ok(())));
        tokio::time::advance(Duration::from_secs(4)).await;
        let (name, result) = &s.readiness()[0];
        assert_eq!(*name, "housekeeping");
        assert!(result.as_ref().is_err_and(|e| e.starts_with("last pass 4.0s ago")), "{result:?}");
        // The kubepods cgroup disappearing fails the cgroupfs check.
        std::fs::remove_file(dir.path().join("cg/kubepods/memory.max")).unwrap();
        assert!(s.readiness()[1].1.is_err());
    }
}
