//! nodewarden: the part of a kubelet that decides whether a node survives.
//!
//! `nodewarden run --config PATH [--kubeconfig PATH] [--node-ip IP]` runs the daemon (joined to a cluster with a
//! kubeconfig); `nodewarden check-config PATH` validates a config and prints
//! the effective values.

mod api_source;
mod cluster;
mod cri;
mod daemon;
mod health;
mod http;
mod image_gc;
mod kernel_defaults;
mod listen;
mod lock;
mod metrics;
mod mirror;
mod notify;
mod pod_events;
mod pod_objects;
mod pod_status;
mod reload;
mod serve;
mod shutdown;
mod swap;
mod url_source;

use std::path::PathBuf;
use std::process::ExitCode;

// The config lives in a library of its own (its parsers are fuzzed); `crate::config` names it throughout.
use nodewarden_config as config;

use clap::{Parser, Subcommand};

/// How nodewarden exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exit {
    /// Clean shutdown, or a valid config.
    Ok = 0,
    /// A runtime failure.
    Failure = 1,
    /// The config is invalid.
    Config = 2,
    /// The host cannot run nodewarden (no cgroup v2, missing controllers, not writable).
    Host = 3,
    /// Another nodewarden runs with the same rootDir.
    Locked = 4,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}

#[derive(Parser)]
#[command(
    name = "nodewarden",
    version,
    about = "cgroup v2 resource accounting, pressure signals and eviction for a node"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon.
    Run {
        /// A KubeletConfiguration file (kubelet.config.k8s.io/v1beta1).
        #[arg(long, short)]
        config: PathBuf,
        /// A kubeconfig naming the apiserver and the node's credentials: the node registers, heartbeats and
        /// reports its status there (the kubelet's flag). Without it, nodewarden runs standalone.
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// The node's address (the kubelet's flag): the Node's `InternalIP` and every pod's `hostIP`. Without it
        /// (or with `0.0.0.0` or `::`), the address of the interface that routes out, else the host name's in
        /// `/etc/hosts`.
        #[arg(long)]
        node_ip: Option<std::net::IpAddr>,
    },
    /// Validate a config file and print the effective configuration.
    CheckConfig {
        /// The config file.
        path: PathBuf,
    },
    /// Inspect a CRI runtime (containerd, CRI-O) with nodewarden's own client, like crictl.
    Cri {
        /// The CRI endpoint (default: $CONTAINER_RUNTIME_ENDPOINT, else the containerd socket).
        #[arg(long, global = true, env = "CONTAINER_RUNTIME_ENDPOINT", default_value = cri::DEFAULT_ENDPOINT)]
        endpoint: String,
        /// Seconds before a call is given up.
        #[arg(long = "request-timeout", global = true, default_value_t = 10)]
        request_timeout: u64,
        #[command(subcommand)]
        command: cri::CriCommand,
    },
}

fn cri_command(endpoint: &str, timeout: u64, command: cri::CriCommand) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("nodewarden cri: cannot start the async runtime: {e}");
            return Exit::Failure.into();
        }
    };
    match runtime.block_on(cri::run(endpoint, std::time::Duration::from_secs(timeout), command)) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX)),
        Err(e) => {
            eprintln!("nodewarden cri: {e:#}");
            Exit::Failure.into()
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { path } => check_config(&path).into(),
        Command::Run { config, kubeconfig, node_ip } => {
            run(&config, daemon::Flags { kubeconfig, node_ip: node_ip.filter(|ip| !ip.is_unspecified()) }).into()
        }
        Command::Cri { endpoint, request_timeout, command } => cri_command(&endpoint, request_timeout, command),
    }
}

fn check_config(path: &std::path::Path) -> Exit {
    match config::load(path) {
        Ok(c) => {
            print!("{}", c.to_yaml());
            for f in &c.ignored {
                eprintln!("ignored: {f} is a kubelet field that nodewarden does not implement");
            }
            for w in &c.warnings {
                eprintln!("warning: {w}");
            }
            Exit::Ok
        }
        Err(e) => {
            eprintln!("nodewarden: {}: {e}", path.display());
            Exit::Config
        }
    }
}

/// The most threads of the async runtime's blocking pool (container starts, state saves, log copies).
const BLOCKING_THREADS: usize = 64;

/// The blocking threads made at start, before anything can run the node out of PIDs.
const RESERVED_BLOCKING_THREADS: usize = 4;

/// The async runtime: two worker threads, and a blocking pool whose threads, once made, never exit. tokio panics
/// in `spawn_blocking` when the OS refuses a thread and the pool has none; with threads reserved at start and
/// kept, a refusal (a node out of PIDs) only queues the work for a thread that has one, and nothing panics.
fn async_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(BLOCKING_THREADS)
        .thread_keep_alive(nodewarden_resources::KEEP_THREADS)
        .enable_all()
        .build()?;
    // Each waits for the others, so that each is a thread of its own.
    let all = std::sync::Arc::new(std::sync::Barrier::new(RESERVED_BLOCKING_THREADS));
    let reserved: Vec<_> = (0..RESERVED_BLOCKING_THREADS)
        .map(|_| {
            let all = all.clone();
            runtime.spawn_blocking(move || {
                all.wait();
            })
        })
        .collect();
    runtime.block_on(async {
        for r in reserved {
            r.await.map_err(std::io::Error::other)?;
        }
        Ok::<_, std::io::Error>(())
    })?;
    Ok(runtime)
}

fn run(path: &std::path::Path, flags: daemon::Flags) -> Exit {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let config = match config::load(path) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("{}: {e}", path.display());
            return Exit::Config;
        }
    };
    let runtime = match async_runtime() {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("cannot start the async runtime: {e}");
            return Exit::Failure;
        }
    };
    match runtime.block_on(daemon::run(config, path.to_path_buf(), flags)) {
        Ok(()) => Exit::Ok,
        Err(daemon::DaemonError::KernelDefaults(e)) => {
            tracing::error!("{e}");
            Exit::Host
        }
        Err(daemon::DaemonError::Swap(e)) => {
            tracing::error!("failSwapOn: {e}");
            Exit::Host
        }
        Err(daemon::DaemonError::Host(e)) => {
            tracing::error!("{e}");
            Exit::Host
        }
        Err(daemon::DaemonError::Systemd(e)) => {
            tracing::error!("{e}");
            Exit::Host
        }
        Err(daemon::DaemonError::Locked(e)) => {
            tracing::error!("{e}");
            Exit::Locked
        }
        Err(daemon::DaemonError::Other(e)) => {
            tracing::error!("{e:#}");
            Exit::Failure
        }
    }
}
