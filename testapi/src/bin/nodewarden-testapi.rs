//! The test apiserver as a program, to try the cluster side on one machine with real kubectl: it serves plain
//! HTTP on 127.0.0.1 (HTTPS with `--tls`), writes an admin and a node kubeconfig (bearer tokens, or with `--tls`
//! client certificates valid for a day, as a kubelet's `kubelet.conf` names its own), prints where, and runs until
//! SIGINT or SIGTERM.
//!
//! ```text
//! nodewarden-testapi [--port PORT] [--dir DIR] [--node NAME] [--node-monitor-grace SECONDS] [--tls]
//! ```
//!
//! It keeps everything in memory: a restart forgets the cluster. It is a fixture, never a real control plane.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use nodewarden_testapi::TestApi;

const USAGE: &str = "usage: nodewarden-testapi [--port PORT (0: any free)] [--dir DIR] [--node NAME] \
     [--node-monitor-grace SECONDS] [--tls]";

/// How long the client certificates `--tls` writes are valid.
const CERTIFICATE_LIFE: Duration = Duration::from_secs(24 * 3600);

struct Args {
    port: u16,
    dir: PathBuf,
    node: String,
    grace: Option<u64>,
    tls: bool,
}

fn parse() -> Result<Args, String> {
    let hostname = rustix::system::uname().nodename().to_string_lossy().into_owned();
    let mut args =
        Args { port: 0, dir: std::env::temp_dir().join("nodewarden-testapi"), node: hostname, grace: None, tls: false };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"));
        match flag.as_str() {
            "--port" => args.port = value()?.parse().map_err(|e| format!("--port: {e}"))?,
            "--dir" => args.dir = PathBuf::from(value()?),
            "--node" => args.node = value()?,
            "--node-monitor-grace" => {
                args.grace = Some(value()?.parse().map_err(|e| format!("--node-monitor-grace: {e}"))?);
            }
            "--tls" => args.tls = true,
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(args)
}

async fn serve(args: Args) -> Result<(), String> {
    let started = if args.tls { TestApi::start_tls(args.port).await } else { TestApi::start(args.port).await };
    let api = started.map_err(|e| format!("cannot listen on port {}: {e}", args.port))?;
    if let Some(g) = args.grace {
        api.set_node_monitor_grace(Some(Duration::from_secs(g)));
    }
    std::fs::create_dir_all(&args.dir).map_err(|e| format!("{}: {e}", args.dir.display()))?;
    let written = |name: &str, node: Option<&str>| {
        if args.tls {
            let cert = api.issue_client_certificate(node, CERTIFICATE_LIFE)?;
            api.write_kubeconfig_with_certificate(&args.dir, name, &cert)
        } else {
            api.add_token(name, node);
            api.write_kubeconfig(&args.dir, name)
        }
    };
    let write =
        |name: &str, node: Option<&str>| written(name, node).map_err(|e| format!("{}: {e}", args.dir.display()));
    let (admin, node) = (write("admin", None)?, write(&format!("node-{}", args.node), Some(&args.node))?);
    println!("test apiserver on {}", api.url());
    println!("admin kubeconfig: {}", admin.display());
    println!("node kubeconfig (system:node:{}): {}", args.node, node.display());
    println!("try: kubectl --kubeconfig {} get nodes -o wide", admin.display());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("cannot handle SIGTERM: {e}"))?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
