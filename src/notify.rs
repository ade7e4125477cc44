//! systemd's service notifications (`sd_notify`): `READY=1` once every pod source's first pods are synced, the pod
//! sync loop has ticked and the eviction loop has passed, `STATUS=` lines saying what the daemon is doing,
//! `STOPPING=1` at shutdown, and the watchdog: `WATCHDOG=1` every half `WatchdogSec`, sent only while those two
//! loops are making progress, so systemd restarts a daemon that is stuck (the kubelet's `SystemdWatchdog`).
//! Outside a `Type=notify` unit (`NOTIFY_SOCKET` unset) nothing is sent.

use std::io;
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use nodewarden_sync::StatusStore;

use crate::health::Health;
use crate::listen::ListenState;

/// What the notifications say and wait for.
pub struct Watched {
    /// The progress checks, the conditions and the node's shutdown.
    pub health: Health,
    /// The pods, counted in the status line.
    pub store: Arc<StatusStore>,
    /// Why the endpoints are not served, said in the status line.
    pub listen: Arc<ListenState>,
}

/// How often the status line is sent again when there is no watchdog to feed.
const STATUS_EVERY: Duration = Duration::from_secs(5);

/// How often the status line is looked at: it is sent at once when it changed.
const STATUS_LOOK: Duration = Duration::from_secs(1);

/// A connection to systemd's notification socket.
#[derive(Debug)]
pub struct Notifier {
    socket: UnixDatagram,
    /// `WATCHDOG_USEC`, when the unit has a watchdog meant for this process.
    watchdog: Option<Duration>,
}

impl Notifier {
    /// The notifier of this process from `NOTIFY_SOCKET` (a path, or `@name` in the abstract namespace) and
    /// `WATCHDOG_USEC`/`WATCHDOG_PID`; `None` outside a notify unit. A socket that cannot be opened is logged.
    pub fn from_env() -> Option<Notifier> {
        let path = std::env::var_os("NOTIFY_SOCKET")?;
        let watchdog = watchdog_period(
            std::env::var("WATCHDOG_USEC").ok().as_deref(),
            std::env::var("WATCHDOG_PID").ok().as_deref(),
            std::process::id(),
        );
        match connect(&path) {
            Ok(socket) => Some(Notifier { socket, watchdog }),
            Err(e) => {
                tracing::warn!(socket = ?path, error = %e, "cannot reach systemd's notification socket");
                None
            }
        }
    }

    /// Sends one notification (newline-separated `KEY=value` assignments). A failure is logged, not fatal.
    pub fn send(&self, message: &str) {
        if let Err(e) = self.socket.send(message.as_bytes()) {
            tracing::debug!(error = %e, message, "cannot notify systemd");
        }
    }
}

fn connect(path: &std::ffi::OsStr) -> io::Result<UnixDatagram> {
    use std::os::unix::ffi::OsStrExt;
    let socket = UnixDatagram::unbound()?;
    let bytes = path.as_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        socket.connect_addr(&addr)?;
    } else {
        socket.connect(std::path::Path::new(path))?;
    }
    Ok(socket)
}

/// The watchdog period systemd set for process `pid`: `WATCHDOG_USEC` microseconds, unless `WATCHDOG_PID` names
/// another process; `None` when there is none (unset, zero or unreadable).
fn watchdog_period(usec: Option<&str>, for_pid: Option<&str>, pid: u32) -> Option<Duration> {
    if for_pid.is_some_and(|p| p.trim().parse::<u32>().ok() != Some(pid)) {
        return None;
    }
    let usec: u64 = usec?.trim().parse().ok().filter(|u| *u > 0)?;
    Some(Duration::from_micros(usec))
}

/// How often the watchdog is fed for a period: every half of it.
fn feed_every(period: Duration) -> Duration {
    period / 2
}

/// Why the daemon is not making progress (the failing checks), or `None` when it is.
fn stalled(checks: &[(&'static str, Result<(), String>)]) -> Option<String> {
    let failing: Vec<String> =
        checks.iter().filter_map(|(name, r)| r.as_ref().err().map(|e| format!("{name}: {e}"))).collect();
    (!failing.is_empty()).then(|| failing.join("; "))
}

/// How long `READY=1` waits for the pod sources' first pods: a source that cannot be listed (it is retried, and
/// the pods it had keep running) must not keep the unit from starting (systemd's start timeout is 90 s).
const SOURCES_WAIT: Duration = Duration::from_secs(60);

/// What `READY=1` waits for: progress, and the first full sync (every pod source's first pods have workers) for
/// at most [`SOURCES_WAIT`] after `started`.
fn startup(health: &Health, started: tokio::time::Instant) -> Vec<(&'static str, Result<(), String>)> {
    let mut checks = health.progress();
    if started.elapsed() < SOURCES_WAIT {
        checks.push(("sources", health.synced()));
    }
    checks
}

/// The `STATUS=` line of a daemon that runs.
fn status_line(watched: &Watched) -> String {
    let (running, _) = watched.store.counts();
    let pressure = watched.health.pressure().names();
    let conditions = if pressure.is_empty() { "no pressure".to_owned() } else { pressure.join(", ") };
    let what = if watched.health.shutting_down() {
        "Shutting down: terminating pods before the node shuts down"
    } else {
        "Running"
    };
    let mut line = format!("{what}: {running} pods running; node conditions: {conditions}");
    if let Some(problem) = watched.listen.problem() {
        line.push_str("; ");
        line.push_str(&problem);
    }
    line
}

/// Tells systemd the daemon is ready once the first full pod sync and eviction pass are done, then keeps the
/// status line current and feeds the watchdog while the daemon makes progress, until `shutdown`.
pub async fn run(notifier: Notifier, watched: Watched, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let started = tokio::time::Instant::now();
    let mut said = String::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return notifier.send("STOPPING=1\nSTATUS=Stopping"),
        }
        let Some(why) = stalled(&startup(&watched.health, started)) else { break };
        if why != said {
            notifier.send(&format!("STATUS=Starting: {why}"));
            said = why;
        }
    }
    if let Err(why) = watched.health.synced() {
        tracing::warn!(reason = %why, "the pod sources have not synced; telling systemd the daemon is ready");
    }
    let mut said = status_line(&watched);
    notifier.send(&format!("READY=1\nSTATUS={said}"));
    tracing::info!(watchdog = ?notifier.watchdog, "told systemd the daemon is ready");
    let mut feed = tokio::time::interval(notifier.watchdog.map_or(STATUS_EVERY, feed_every));
    // The status line follows what the daemon does (a node shutdown, a stall) within a second.
    let mut look = tokio::time::interval(STATUS_LOOK);
    let mut withheld = false;
    loop {
        let feeding = tokio::select! {
            _ = feed.tick() => true,
            _ = look.tick() => false,
            () = shutdown.cancelled() => break,
        };
        let (line, progress) = match stalled(&watched.health.progress()) {
            None => (status_line(&watched), true),
            Some(why) => (format!("Stalled: {why}"), false),
        };
        if feeding && progress && notifier.watchdog.is_some() {
            notifier.send(&format!("WATCHDOG=1\nSTATUS={line}"));
        } else if feeding || line != said {
            notifier.send(&format!("STATUS={line}"));
        }
        said = line;
        if !feeding {
            continue;
        }
        if progress && withheld {
            tracing::info!("the daemon is making progress again; feeding the watchdog");
        } else if !progress && !withheld && notifier.watchdog.is_some() {
            // No keep-alive: if this lasts for WatchdogSec, systemd restarts the daemon.
            tracing::error!(reason = %said, "the daemon is not making progress; the systemd watchdog is not fed");
        }
        withheld = !progress;
    }
    notifier.send("STOPPING=1\nSTATUS=Stopping: the pods keep running, and the next start adopts them");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_period_is_systemds_for_this_process() {
        assert_eq!(watchdog_period(Some("4000000"), None, 7), Some(Duration::from_secs(4)));
        assert_eq!(watchdog_period(Some("4000000"), Some("7"), 7), Some(Duration::from_secs(4)));
        assert_eq!(watchdog_period(Some("4000000"), Some("8"), 7), None, "meant for another process");
        assert_eq!(watchdog_period(Some("0"), None, 7), None);
        assert_eq!(watchdog_period(Some("x"), None, 7), None);
        assert_eq!(watchdog_period(None, None, 7), None);
        assert_eq!(feed_every(Duration::from_secs(30)), Duration::from_secs(15), "every WatchdogSec/2");
        assert_eq!(feed_every(Duration::from_millis(200)), Duration::from_millis(100));
    }

    #[test]
    fn a_failing_progress_check_withholds_the_watchdog() {
        let ok = |n| (n, Ok(()));
        let bad = |n, e: &str| (n, Err(e.to_owned()));
        assert_eq!(stalled(&[ok("podsync"), ok("eviction")]), None);
        assert_eq!(
            stalled(&[bad("podsync", "the pod sync loop last ran 6.0s ago"), ok("eviction")]).as_deref(),
            Some("podsync: the pod sync loop last ran 6.0s ago")
        );
    }

    #[test]
    fn notifications_reach_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let server = UnixDatagram::bind(&path).unwrap();
        let n = Notifier { socket: connect(path.as_os_str()).unwrap(), watchdog: None };
        n.send("READY=1\nSTATUS=x");
        let mut buf = [0u8; 64];
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=x");
        // The abstract namespace, as systemd's own socket is named.
        let name = format!("nodewarden-test-{}", std::process::id());
        let addr =
            <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(name.as_bytes())
                .unwrap();
        let abstract_server = UnixDatagram::bind_addr(&addr).unwrap();
        let n = Notifier { socket: connect(std::ffi::OsStr::new(&format!("@{name}"))).unwrap(), watchdog: None };
        n.send("WATCHDOG=1");
        let len = abstract_server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"WATCHDOG=1");
    }
}
