//! The HTTP server's connections, with the limits a node agent needs on a port any local process can reach: a
//! client gets [`Limits::header_timeout`] to send each request's headers (so a stalled or dribbling connection is
//! closed), a request's headers fit in [`Limits::max_header_bytes`], and at most [`Limits::max_connections`] are
//! open at once. When a new connection would pass the cap, the oldest open one is closed: connections hoarded by a
//! flood go first, and the newest client, a health check, is served.

use std::collections::BTreeMap;
use std::pin::pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The server's limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// How long a client has to send a request's headers, on a new connection or a kept-alive one.
    pub header_timeout: Duration,
    /// The largest request head (hyper's read buffer; at least 8 KiB).
    pub max_header_bytes: usize,
    /// Connections open at once; the oldest is closed to make room for a new one.
    pub max_connections: usize,
    /// How long open connections get to finish at shutdown.
    pub drain: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            max_header_bytes: 16 * 1024,
            max_connections: 256,
            drain: Duration::from_secs(5),
        }
    }
}

/// The open connections in the order they came, each with what closes it.
#[derive(Default)]
struct Open {
    next: u64,
    by_age: BTreeMap<u64, CancellationToken>,
}

impl Open {
    /// Registers a connection; closes the oldest ones beyond `cap`.
    fn add(&mut self, cap: usize) -> (u64, CancellationToken) {
        while self.by_age.len() >= cap.max(1) {
            let Some((_, oldest)) = self.by_age.pop_first() else { break };
            oldest.cancel();
        }
        let id = self.next;
        self.next += 1;
        let token = CancellationToken::new();
        self.by_age.insert(id, token.clone());
        (id, token)
    }
}

/// Serves `app` on `listener` until `shutdown`, then lets open connections finish for at most `limits.drain`.
pub async fn serve(listener: TcpListener, app: Router, limits: Limits, shutdown: CancellationToken) {
    let open = Arc::new(Mutex::new(Open::default()));
    let tasks = TaskTracker::new();
    let mut warned = false;
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = shutdown.cancelled() => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and the like: back off instead of spinning; the next accept may succeed.
                if !warned {
                    tracing::warn!(error = %e, "cannot accept an HTTP connection");
                    warned = true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        warned = false;
        let (id, closed) = open.lock().unwrap_or_else(PoisonError::into_inner).add(limits.max_connections);
        let service = TowerToHyperService::new(app.clone());
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .max_buf_size(limits.max_header_bytes.max(8192))
            .serve_connection(TokioIo::new(stream), service);
        let (open, stop, drain) = (open.clone(), shutdown.clone(), limits.drain);
        tasks.spawn(async move {
            let mut conn = pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                () = closed.cancelled() => {}
                () = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(drain, conn).await;
                }
            }
            open.lock().unwrap_or_else(PoisonError::into_inner).by_age.remove(&id);
        });
    }
    drop(listener);
    tasks.close();
    if tokio::time::timeout(limits.drain + Duration::from_millis(500), tasks.wait()).await.is_err() {
        tracing::warn!(left = tasks.len(), "HTTP connections still open after shutdown; closing them");
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    use axum::routing::get;

    use super::*;

    async fn start(limits: Limits) -> (u16, CancellationToken, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let app = Router::new().route("/healthz", get(|| async { "ok" }));
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve(listener, app, limits, stop.clone()));
        (port, stop, server)
    }

    /// One GET on a new connection, from a blocking thread; the status line, or why there is none.
    async fn healthz(port: u16) -> Result<String, String> {
        tokio::task::spawn_blocking(move || {
            let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").map_err(|e| e.to_string())?;
            let mut out = String::new();
            s.read_to_string(&mut out).map_err(|e| e.to_string())?;
            Ok(out.lines().next().unwrap_or_default().to_owned())
        })
        .await
        .unwrap()
    }

    /// Whether the server closed `s` (a read sees EOF or a reset rather than timing out).
    fn closed(s: &mut TcpStream) -> bool {
        s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let mut buf = [0u8; 512];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
                    return false;
                }
                Err(_) => return true,
            }
        }
    }

    // The server accepts while the flood connects (a full accept queue would make the connects wait).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flood_of_stalled_connections_leaves_a_new_client_served() {
        let limits = Limits {
            max_connections: 16,
            header_timeout: Duration::from_secs(60),
            drain: Duration::from_millis(300),
            ..Limits::default()
        };
        let (port, stop, server) = start(limits).await;
        let mut stalled = Vec::new();
        for _ in 0..200 {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost").unwrap();
            stalled.push(s);
        }
        assert_eq!(healthz(port).await.as_deref(), Ok("HTTP/1.1 200 OK"));
        tokio::time::sleep(Duration::from_millis(200)).await;
        // The oldest were closed to make room; at most the cap are still open.
        let still_open = stalled.iter_mut().map(closed).filter(|c| !c).count();
        assert!(still_open <= 16, "{still_open} stalled connections are still open");
        stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_dribbling_or_idle_client_is_cut_off_after_the_header_timeout() {
        let limits = Limits { header_timeout: Duration::from_millis(300), ..Limits::default() };
        let (port, stop, _server) = start(limits).await;
        // A header line every 100 ms never finishes inside 300 ms.
        let mut dribbling = TcpStream::connect(("127.0.0.1", port)).unwrap();
        dribbling.write_all(b"GET /healthz HTTP/1.1\r\n").unwrap();
        // A connection kept alive after its request, then idle.
        let mut idle = TcpStream::connect(("127.0.0.1", port)).unwrap();
        idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut cut = false;
        for i in 0..20 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if dribbling.write_all(format!("X-{i}: y\r\n").as_bytes()).is_err() || closed(&mut dribbling) {
                cut = true;
                break;
            }
        }
        assert!(cut, "the dribbling client was never cut off");
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(closed(&mut idle), "the idle kept-alive connection is still open");
        // A request head over the limit is refused, not buffered.
        let big = format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(64 * 1024));
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let _ = s.write_all(big.as_bytes());
        let mut out = String::new();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.read_to_string(&mut out);
        assert!(!out.starts_with("HTTP/1.1 200"), "{out}");
        stop.cancel();
    }
}
