//! The endpoints' listener: bound before pods start and, when its port is held (a pod on the host's network, a
//! user, a daemon that has not let go), bound again with a back-off while pod sync and eviction run on, as the
//! kubelet keeps its healthz server in a retry loop. While it is not bound, the log and the systemd status line
//! say so, and name the holder where `/proc` tells it.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The first wait before the port is tried again, and the longest.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(10);

/// Why the endpoints are not served, while they are not: shown in the systemd status line.
#[derive(Debug, Default)]
pub struct ListenState(Mutex<Option<String>>);

impl ListenState {
    /// Why the endpoints are not served, if they are not.
    pub fn problem(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn set(&self, problem: Option<String>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = problem;
    }
}

/// Binds `addr`, or retries with a back-off (from `first`, the bind made before pods started) until it is bound or
/// `shutdown`; then serves `app` on it until `shutdown`.
pub async fn run(
    addr: SocketAddr,
    first: std::io::Result<TcpListener>,
    app: axum::Router,
    state: Arc<ListenState>,
    shutdown: CancellationToken,
) {
    let mut bound = first;
    let mut wait = RETRY_FIRST;
    let listener = loop {
        match bound {
            Ok(l) => break l,
            Err(e) => {
                let holder = port_holder(Path::new("/proc"), addr.port());
                let problem = match &holder {
                    Some(h) => format!("cannot listen on {addr}: {e} (held by {h}); retrying"),
                    None => format!("cannot listen on {addr}: {e}; retrying"),
                };
                tracing::warn!(%addr, error = %e, holder = holder.as_deref().unwrap_or("unknown"), retry_in = ?wait, "cannot listen on healthzBindAddress:healthzPort; pods and eviction run on, the endpoints wait for the port");
                state.set(Some(problem));
            }
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shutdown.cancelled() => return,
        }
        wait = (wait * 2).min(RETRY_MAX);
        bound = TcpListener::bind(addr).await;
    };
    state.set(None);
    tracing::info!(%addr, "serving /healthz /readyz /metrics /pods /evictions /configz");
    crate::serve::serve(listener, app, crate::serve::Limits::default(), shutdown).await;
}

/// Who listens on TCP `port`, as `PID <pid> (<command>)`, from `/proc/net/tcp{,6}` and the processes' descriptors;
/// `None` when it cannot be told (another network namespace, a process that has gone).
pub fn port_holder(proc: &Path, port: u16) -> Option<String> {
    let inodes: Vec<u64> = ["net/tcp", "net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(proc.join(f)).ok())
        .flat_map(|text| listening_inodes(&text, port))
        .collect();
    if inodes.is_empty() {
        return None;
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    for entry in std::fs::read_dir(proc).ok()?.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|target| wanted.iter().any(|w| target.as_os_str() == w.as_str()))
        });
        if holds {
            let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            return Some(format!("PID {pid} ({})", comm.trim()));
        }
    }
    Some(format!("socket inode {}", inodes[0]))
}

/// The socket inodes listening on `port` in a `/proc/net/tcp` table: each line is `sl local rem st ... inode`,
/// the local address `HEXADDR:HEXPORT`, state `0A` for LISTEN.
fn listening_inodes(table: &str, port: u16) -> Vec<u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_ascii_whitespace().collect();
            let local_port = f.get(1)?.rsplit_once(':')?.1;
            let listening = *f.get(3)? == "0A";
            let inode = f.get(9)?.parse::<u64>().ok()?;
            (listening && u16::from_str_radix(local_port, 16).ok()? == port).then_some(inode)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:2818 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:2818 0100007F:D3A0 01 00000000:00000000 00:00000000 00000000     0        0 999 1 0000000000000000 20 4 30 10 -1
   2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 17 1 0000000000000000 100 0 0 10 0
   3: short line
";

    #[test]
    fn only_listening_sockets_on_the_port_are_taken() {
        assert_eq!(listening_inodes(TABLE, 10264), vec![4242]);
        assert_eq!(listening_inodes(TABLE, 22), vec![17]);
        assert_eq!(listening_inodes(TABLE, 80), Vec::<u64>::new());
        assert_eq!(listening_inodes("", 80), Vec::<u64>::new());
    }

    #[tokio::test]
    async fn the_holder_of_a_port_is_named_and_the_port_is_served_once_free() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap();
        let me = format!("PID {} (", std::process::id());
        assert!(port_holder(Path::new("/proc"), addr.port()).is_some_and(|h| h.starts_with(&me)), "{me}");
        let state = Arc::new(ListenState::default());
        let shutdown = CancellationToken::new();
        let app = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
        let first = TcpListener::bind(addr).await;
        assert!(first.is_err());
        let server = tokio::spawn(run(addr, first, app, state.clone(), shutdown.clone()));
        let problem = || state.problem();
        for _ in 0..100 {
            if problem().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(problem().is_some_and(|p| p.contains("held by PID")), "{:?}", problem());
        drop(held);
        let mut served = false;
        for _ in 0..300 {
            if tokio::net::TcpStream::connect(addr).await.is_ok() && problem().is_none() {
                served = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(served, "the port is served once it is free");
        shutdown.cancel();
        server.await.unwrap();
    }
}
