//! systemd-logind over the D-Bus system bus: the delay inhibitor lock that holds a shutdown back while pods
//! terminate, `InhibitDelayMaxUSec` (how long logind waits for such a lock), and `PrepareForShutdown`.

use std::path::Path;
use std::time::Duration;

use zbus::zvariant::OwnedFd;

#[zbus::proxy(
    interface = "org.freedesktop.login1.Manager",
    default_service = "org.freedesktop.login1",
    default_path = "/org/freedesktop/login1",
    gen_blocking = false
)]
trait Manager {
    /// Takes an inhibitor lock; it holds until the returned file descriptor is closed.
    fn inhibit(&self, what: &str, who: &str, why: &str, mode: &str) -> zbus::Result<OwnedFd>;

    /// How long logind waits for delay locks before it shuts down anyway.
    #[zbus(property(emits_changed_signal = "false"), name = "InhibitDelayMaxUSec")]
    fn inhibit_delay_max_usec(&self) -> zbus::Result<u64>;

    /// Whether a shutdown has been announced and is under way.
    #[zbus(property(emits_changed_signal = "false"))]
    fn preparing_for_shutdown(&self) -> zbus::Result<bool>;

    /// `true` when a shutdown starts (delay locks are honoured from then on), `false` when it was cancelled.
    #[zbus(signal)]
    fn prepare_for_shutdown(&self, start: bool) -> zbus::Result<()>;
}

/// The logind drop-in that raises `InhibitDelayMaxSec` to the node's shutdown period, as the kubelet writes its own.
pub const LOGIND_DROP_IN: &str = "/etc/systemd/logind.conf.d/99-nodewarden.conf";

/// A connection to logind.
pub struct Logind {
    conn: zbus::Connection,
    manager: ManagerProxy<'static>,
}

impl Logind {
    /// Connects to the system bus and logind.
    pub async fn connect() -> zbus::Result<Logind> {
        let conn = zbus::Connection::system().await?;
        let manager = ManagerProxy::new(&conn).await?;
        Ok(Logind { conn, manager })
    }

    /// `InhibitDelayMaxUSec`.
    pub async fn inhibit_delay_max(&self) -> zbus::Result<Duration> {
        Ok(Duration::from_micros(self.manager.inhibit_delay_max_usec().await?))
    }

    /// Whether logind is shutting the node down now (`PreparingForShutdown`): for a daemon that starts meanwhile.
    pub async fn preparing_for_shutdown(&self) -> zbus::Result<bool> {
        self.manager.preparing_for_shutdown().await
    }

    /// Takes the delay lock on shutdown; dropping the descriptor releases it.
    pub async fn delay_shutdown(&self) -> zbus::Result<OwnedFd> {
        let why = "nodewarden terminates the pods in priority order before the node shuts down";
        self.manager.inhibit("shutdown", "nodewarden", why, "delay").await
    }

    /// Subscribes to `PrepareForShutdown`: `true` when a shutdown starts, `false` when it was cancelled (a signal
    /// whose argument cannot be read is skipped).
    pub async fn shutdown_signals(&self) -> zbus::Result<impl futures_util::Stream<Item = bool> + Unpin + use<>> {
        let signals = self.manager.receive_prepare_for_shutdown().await?;
        Ok(futures_util::StreamExt::filter_map(signals, |s| std::future::ready(s.args().ok().map(|a| a.start))))
    }

    /// Raises logind's `InhibitDelayMaxSec` to `wanted` with a drop-in and makes logind read it (SIGHUP to the
    /// process that owns its bus name), as the kubelet does.
    pub async fn raise_inhibit_delay(&self, wanted: Duration) -> Result<(), String> {
        let dir = Path::new(LOGIND_DROP_IN).parent().ok_or("no directory")?;
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let text = format!(
            "# Written by nodewarden: logind waits this long for its pods to terminate at shutdown.\n[Login]\n\
             InhibitDelayMaxSec={}\n",
            wanted.as_secs() + u64::from(wanted.subsec_nanos() > 0)
        );
        std::fs::write(LOGIND_DROP_IN, text).map_err(|e| format!("cannot write {LOGIND_DROP_IN}: {e}"))?;
        let dbus = zbus::fdo::DBusProxy::new(&self.conn).await.map_err(|e| e.to_string())?;
        let name = zbus::names::BusName::try_from("org.freedesktop.login1").map_err(|e| e.to_string())?;
        let pid = dbus.get_connection_unix_process_id(name).await.map_err(|e| e.to_string())?;
        let pid = rustix::process::Pid::from_raw(i32::try_from(pid).map_err(|e| e.to_string())?)
            .ok_or("logind has no process ID")?;
        rustix::process::kill_process(pid, rustix::process::Signal::HUP).map_err(|e| format!("SIGHUP to logind: {e}"))
    }
}
