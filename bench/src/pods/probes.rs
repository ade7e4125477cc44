//! The bare probes of `pods`: the reference the daemon's probe cost is compared with. The same HTTP GETs the
//! daemon makes (one per probed pod per period, the same request, built by the same function, to the same `httpd`),
//! made by the bench's own thread with blocking sockets and nothing else: no event loop, no timers but one sleep per
//! probe, no verdict, no status, no metric. A probe on loopback makes the kernel run both sides of the TCP
//! handshake in the caller, so this thread pays the servers' side of the connection as the daemon does.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use nodewarden_sync::{HTTP_HEAD_LIMIT, has_status_line, http_probe_passes, http_probe_request, http_status_code};
use rustix::time::{ClockId, clock_gettime};

/// What a probe's answer may take, as the daemon's default `timeoutSeconds`.
const TIMEOUT: Duration = Duration::from_secs(1);

/// The bare probes' cost over a window.
pub struct Sample {
    /// CPU of the probing thread in percent of one core.
    pub cpu_percent: f64,
    /// Probes made.
    pub probes: usize,
    /// Probes answered with a status of 200 to 399.
    pub passed: usize,
}

/// One HTTP GET of `path` on loopback port `port`, with the request the daemon sends; whether it passed. The least
/// a prober does: `socket`, `connect` (blocking: on loopback the handshake is made within the call, and a port with
/// no listener is refused at once), the timeout, `write`, `read` until the status line, `close`.
fn probe(port: u16, path: &str) -> bool {
    let Ok(mut s) = TcpStream::connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port))) else { return false };
    if s.set_read_timeout(Some(TIMEOUT)).is_err() {
        return false;
    }
    if s.write_all(http_probe_request("127.0.0.1", port, path, &[]).as_bytes()).is_err() {
        return false;
    }
    let mut buf = [0u8; HTTP_HEAD_LIMIT];
    let mut n = 0;
    while n < buf.len() && !has_status_line(&buf[..n]) {
        match s.read(&mut buf[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    http_status_code(&buf[..n]).is_ok_and(http_probe_passes)
}

/// The calling thread's CPU time.
fn thread_cpu() -> Duration {
    let t = clock_gettime(ClockId::ThreadCPUTime);
    Duration::new(u64::try_from(t.tv_sec).unwrap_or(0), u32::try_from(t.tv_nsec).unwrap_or(0))
}

/// Probes each of `ports` once per `period` (evenly spread: one probe every `period / ports.len()`) for `seconds`,
/// on the calling thread, and returns that thread's CPU use over the window.
pub fn sample(ports: &[u16], path: &str, period: Duration, seconds: u64) -> Result<Sample> {
    if ports.is_empty() {
        bail!("no ports to probe");
    }
    let every = period / u32::try_from(ports.len()).unwrap_or(u32::MAX);
    let window = Duration::from_secs(seconds);
    let (t0, c0) = (Instant::now(), thread_cpu());
    let (mut probes, mut passed) = (0, 0);
    for (k, port) in ports.iter().cycle().enumerate() {
        let due = every * u32::try_from(k).unwrap_or(u32::MAX);
        if due >= window {
            break;
        }
        if let Some(wait) = due.checked_sub(t0.elapsed()) {
            std::thread::sleep(wait);
        }
        probes += 1;
        passed += usize::from(probe(*port, path));
    }
    let (wall, cpu) = (t0.elapsed(), thread_cpu() - c0);
    Ok(Sample { cpu_percent: cpu.as_secs_f64() / wall.as_secs_f64() * 100.0, probes, passed })
}
