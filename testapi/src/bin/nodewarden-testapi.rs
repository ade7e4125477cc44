//! The test apiserver as a program, to try the cluster side on one machine with real kubectl: it serves plain
//! HTTP on 127.0.0.1, writes an admin and a node kubeconfig, prints where, and runs until SIGINT or SIGTERM.
//!
//! ```text
//! nodewarden-testapi [--port PORT] [--dir DIR] [--node NAME] [--node-monitor-grace SECONDS]
//! ```
//!
//! It keeps everything in memory: a restart forgets the cluster. It is a fixture, never a real control plane.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use nodewarden_testapi::TestApi;

const USAGE: &str =
    "usage: nodewarden-testapi [--port PORT (0: any free)] [--dir DIR] [--node NAME] [--node-monitor-grace SECONDS]";

struct Args {
    port: u16,
    dir: PathBuf,
    node: String,
    grace: Option<u64>,
}

fn parse() -> Result<Args, String> {
    let hostname = rustix::system::uname().nodename().to_string_lossy().into_owned();
    let mut args = Args { port: 0, dir: std::env::temp_dir().join("nodewarden-testapi"), node: hostname, grace: None };
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
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(args)
}

async fn serve(args: Args) -> Result<(), String> {
    let api = TestApi::start(args.port).await.map_err(|e| format!("cannot listen on port {}: {e}", args.port))?;
    if let Some(g) = args.grace {
        api.set_node_monitor_grace(Some(Duration::from_secs(g)));
    }
    std::fs::create_dir_all(&args.dir).map_err(|e| format!("{}: {e}", args.dir.display()))?;
    let node_token = format!("node-{}", args.node);
    api.add_token("admin", None);
    api.add_token(&node_token, Some(&args.node));
    let write =
        |token: &str| api.write_kubeconfig(&args.dir, token).map_err(|e| format!("{}: {e}", args.dir.display()));
    let (admin, node) = (write("admin")?, write(&node_token)?);
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
