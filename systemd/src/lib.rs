//! The systemd cgroup driver's way to systemd (`nodewarden-resources`'s [`Units`]): transient slice units started, changed and stopped over the D-Bus
//! system bus (`org.freedesktop.systemd1.Manager`). The resource ledger calls it from synchronous code, so the
//! bus lives on a thread of its own with its own small runtime, and each call waits for its answer with a bound.

use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use nodewarden_resources::{CpuMax, Limit, UnitError, UnitLimits, Units};
use tokio::sync::mpsc;
use zbus::zvariant::{OwnedObjectPath, Value};

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1",
    gen_blocking = false
)]
trait SystemdManager {
    /// Starts a transient unit with properties.
    fn start_transient_unit(
        &self,
        name: &str,
        mode: &str,
        properties: &[(&str, Value<'_>)],
        aux: &[(&str, &[(&str, Value<'_>)])],
    ) -> zbus::Result<OwnedObjectPath>;

    /// Sets properties of a unit (`runtime`: until the next reboot only).
    fn set_unit_properties(&self, name: &str, runtime: bool, properties: &[(&str, Value<'_>)]) -> zbus::Result<()>;

    /// Stops a unit.
    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;

    /// Starts a loaded unit.
    fn start_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;

    /// Forgets that a unit failed.
    fn reset_failed_unit(&self, name: &str) -> zbus::Result<()>;

    /// systemd's version (`252.38-1~deb12u1`).
    #[zbus(property)]
    fn version(&self) -> zbus::Result<String>;
}

/// How long one call may wait for systemd: the resource ledger waits meanwhile, so it is short. A call that did
/// not get its turn by then is dropped, not made late.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// systemd's answer that a unit of that name is loaded already.
const UNIT_EXISTS: &str = "org.freedesktop.systemd1.UnitExists";
/// systemd's answer that no unit of that name is loaded.
const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";

enum Call {
    Start(String, UnitLimits),
    Set(String, UnitLimits),
    Stop(String),
}

impl Call {
    fn unit(&self) -> &str {
        match self {
            Call::Start(u, _) | Call::Set(u, _) | Call::Stop(u) => u,
        }
    }
}

type Reply = std_mpsc::SyncSender<Result<(), String>>;

/// A call, the time by which its caller stops waiting, and where the answer goes.
type Request = (Call, tokio::time::Instant, Reply);

/// A connection to systemd's manager on the system bus, made again when it breaks.
#[derive(Debug)]
pub struct SystemdSlices {
    calls: mpsc::UnboundedSender<Request>,
    version: u32,
}

/// Why the systemd driver cannot be used on this host.
#[derive(Debug, thiserror::Error)]
pub enum SlicesError {
    /// systemd is not the init system.
    #[error(
        "cgroupDriver: systemd needs systemd as PID 1, and this host's init is {init:?}; use cgroupDriver: cgroupfs"
    )]
    NoSystemd {
        /// What PID 1 is.
        init: String,
    },
    /// The system bus or systemd on it did not answer.
    #[error("cgroupDriver: systemd: cannot reach systemd on the D-Bus system bus: {0}")]
    Bus(String),
}

/// True when systemd is PID 1 (what `sd_booted` checks, and the process name).
pub fn systemd_is_init() -> Result<(), SlicesError> {
    let init = std::fs::read_to_string("/proc/1/comm").map(|s| s.trim().to_owned()).unwrap_or_default();
    if std::path::Path::new("/run/systemd/system").is_dir() && init == "systemd" {
        Ok(())
    } else {
        Err(SlicesError::NoSystemd { init: if init.is_empty() { "unknown".into() } else { init } })
    }
}

impl SystemdSlices {
    /// Checks that systemd is PID 1 and connects to it; the connection lives on a thread of its own.
    pub fn connect() -> Result<Self, SlicesError> {
        systemd_is_init()?;
        let (calls, mut rx) = mpsc::unbounded_channel::<Request>();
        let (ready_tx, ready_rx) = std_mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("systemd-slices".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let (mut proxy, mut version) = match connect().await {
                        Ok(p) => p,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.to_string()));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(version));
                    while let Some((call, deadline, reply)) = rx.recv().await {
                        let started = tokio::time::Instant::now();
                        if started >= deadline {
                            let _ = reply.send(Err("not asked: the calls before it took its time".into()));
                            continue;
                        }
                        let (answer, broken) =
                            match tokio::time::timeout_at(deadline, serve(&proxy, version, &call)).await {
                                Ok(Ok(())) => (Ok(()), false),
                                Ok(Err(Failure::Systemd(e))) => (Err(e), false),
                                Ok(Err(Failure::Bus(e))) => (Err(e), true),
                                // Only a call that had most of its time counts against the connection (one that
                                // waited behind others had little).
                                Err(_) => (
                                    Err(format!("systemd did not answer in {:?}", started.elapsed())),
                                    started.elapsed() >= CALL_TIMEOUT / 2,
                                ),
                            };
                        let _ = reply.send(answer);
                        // The bus broke or hung: a new connection for the next call (or the one after).
                        if broken {
                            match tokio::time::timeout(CALL_TIMEOUT, connect()).await {
                                Ok(Ok((p, v))) => {
                                    tracing::info!("connected to systemd again");
                                    proxy = p;
                                    version = v;
                                }
                                Ok(Err(e)) => tracing::warn!(error = %e, "cannot connect to systemd again"),
                                Err(_) => tracing::warn!("cannot connect to systemd again: no answer"),
                            }
                        }
                    }
                });
            })
            .map_err(|e| SlicesError::Bus(e.to_string()))?;
        match ready_rx.recv_timeout(CALL_TIMEOUT) {
            Ok(Ok(version)) => Ok(Self { calls, version }),
            Ok(Err(e)) => Err(SlicesError::Bus(e)),
            Err(_) => Err(SlicesError::Bus(format!("no answer within {CALL_TIMEOUT:?}"))),
        }
    }

    /// systemd's version (its major number; 0 where it could not be read).
    pub fn version(&self) -> u32 {
        self.version
    }

    fn call(&self, call: Call) -> Result<(), UnitError> {
        let unit = call.unit().to_owned();
        let (tx, rx) = std_mpsc::sync_channel(1);
        let gone = || UnitError { unit: unit.clone(), reason: "the connection to systemd is gone".into() };
        self.calls.send((call, tokio::time::Instant::now() + CALL_TIMEOUT, tx)).map_err(|_| gone())?;
        // A little longer than the call's own deadline, so that its answer (or its timeout) is what comes back.
        match rx.recv_timeout(CALL_TIMEOUT + Duration::from_secs(1)) {
            Ok(r) => r.map_err(|reason| UnitError { unit: unit.clone(), reason }),
            Err(std_mpsc::RecvTimeoutError::Timeout) => {
                Err(UnitError { unit: unit.clone(), reason: format!("systemd did not answer within {CALL_TIMEOUT:?}") })
            }
            Err(std_mpsc::RecvTimeoutError::Disconnected) => Err(gone()),
        }
    }
}

/// Why a call failed: systemd said no (the connection is fine), or the bus failed.
enum Failure {
    Systemd(String),
    Bus(String),
}

impl From<zbus::Error> for Failure {
    fn from(e: zbus::Error) -> Self {
        match e {
            zbus::Error::MethodError(..) => Failure::Systemd(e.to_string()),
            e => Failure::Bus(e.to_string()),
        }
    }
}

async fn connect() -> zbus::Result<(SystemdManagerProxy<'static>, u32)> {
    let conn = zbus::Connection::system().await?;
    let proxy = SystemdManagerProxy::new(&conn).await?;
    let version = proxy.version().await.unwrap_or_default();
    Ok((proxy, major_version(&version)))
}

/// The major number of a systemd version string (`252.38-1~deb12u1` → 252; 0 where there is none).
fn major_version(v: &str) -> u32 {
    v.trim_start_matches('v').split(|c: char| !c.is_ascii_digit()).next().and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// The D-Bus error name of a method error.
fn error_name(e: &zbus::Error) -> Option<&str> {
    match e {
        zbus::Error::MethodError(name, _, _) => Some(name.as_str()),
        _ => None,
    }
}

async fn serve(proxy: &SystemdManagerProxy<'static>, version: u32, call: &Call) -> Result<(), Failure> {
    match call {
        Call::Start(unit, limits) => {
            let mut props = properties(limits, version);
            props.insert(0, ("Description", Value::from(format!("nodewarden {unit}"))));
            // As runc starts its slices: no ordering against shutdown.target, so a poweroff leaves the pods to
            // the graceful node shutdown instead of stopping their slices beside the daemon.
            props.push(("DefaultDependencies", Value::from(false)));
            for accounting in ["MemoryAccounting", "CPUAccounting", "TasksAccounting"] {
                props.push((accounting, Value::from(true)));
            }
            match proxy.start_transient_unit(unit, "replace", &props, &[]).await {
                Ok(_) => Ok(()),
                // A slice started before a restart: adopted, with the limits of now, and started again if it
                // stopped or failed meanwhile (a loaded transient unit can be).
                Err(e) if error_name(&e) == Some(UNIT_EXISTS) => {
                    proxy.set_unit_properties(unit, true, &properties(limits, version)).await?;
                    let _ = proxy.reset_failed_unit(unit).await;
                    proxy.start_unit(unit, "replace").await?;
                    Ok(())
                }
                Err(e) => Err(e.into()),
            }
        }
        Call::Set(unit, limits) => {
            let props = properties(limits, version);
            if props.is_empty() {
                return Ok(());
            }
            Ok(proxy.set_unit_properties(unit, true, &props).await?)
        }
        Call::Stop(unit) => match proxy.stop_unit(unit, "replace").await {
            Ok(_) => Ok(()),
            Err(e) if error_name(&e) == Some(NO_SUCH_UNIT) => Ok(()),
            Err(e) => Err(e.into()),
        },
    }
}

/// A limit as systemd takes it: bytes or a count, `u64::MAX` for infinity.
fn unit_value(l: Limit) -> u64 {
    l.value().unwrap_or(u64::MAX)
}

/// The unit properties for `limits`, leaving out what is not set and what systemd `version` does not have
/// (`MemoryMin` came with 240, `CPUQuotaPeriodUSec` with 242; 0, unknown, sends everything).
fn properties(limits: &UnitLimits, version: u32) -> Vec<(&'static str, Value<'static>)> {
    let has = |since: u32| version == 0 || version >= since;
    let mut props: Vec<(&'static str, Value<'static>)> = Vec::new();
    if let Some(w) = limits.cpu_weight {
        props.push(("CPUWeight", Value::from(w)));
    }
    if let Some(cpu) = limits.cpu_max {
        let CpuMax { period, .. } = cpu;
        props.push(("CPUQuotaPerSecUSec", Value::from(UnitLimits::cpu_quota_per_sec(cpu))));
        if has(242) {
            props.push(("CPUQuotaPeriodUSec", Value::from(period)));
        }
    }
    if let Some(m) = limits.memory_max {
        props.push(("MemoryMax", Value::from(unit_value(m))));
    }
    if let Some(m) = limits.memory_min.filter(|_| has(240)) {
        props.push(("MemoryMin", Value::from(m)));
    }
    if let Some(m) = limits.memory_high {
        props.push(("MemoryHigh", Value::from(unit_value(m))));
    }
    if let Some(t) = limits.tasks_max {
        props.push(("TasksMax", Value::from(unit_value(t))));
    }
    if let Some(m) = limits.memory_swap_max {
        props.push(("MemorySwapMax", Value::from(unit_value(m))));
    }
    props
}

impl Units for SystemdSlices {
    fn start_slice(&self, unit: &str, limits: &UnitLimits) -> Result<(), UnitError> {
        self.call(Call::Start(unit.to_owned(), *limits))
    }

    fn set_limits(&self, unit: &str, limits: &UnitLimits) -> Result<(), UnitError> {
        self.call(Call::Set(unit.to_owned(), *limits))
    }

    fn stop(&self, unit: &str) -> Result<(), UnitError> {
        self.call(Call::Stop(unit.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_become_the_properties_systemd_has() {
        let limits = UnitLimits {
            cpu_weight: Some(39),
            cpu_max: Some(CpuMax { quota: Some(25_000), period: 100_000 }),
            memory_max: Some(Limit::Value(128 << 20)),
            memory_min: None,
            memory_high: Some(Limit::Max),
            tasks_max: Some(Limit::Value(256)),
            memory_swap_max: Some(Limit::Value(0)),
        };
        let props = properties(&limits, 252);
        let get = |name: &str| props.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone());
        assert_eq!(get("CPUWeight"), Some(Value::from(39u64)));
        assert_eq!(get("CPUQuotaPerSecUSec"), Some(Value::from(250_000u64)));
        assert_eq!(get("CPUQuotaPeriodUSec"), Some(Value::from(100_000u64)));
        assert_eq!(get("MemoryMax"), Some(Value::from(128u64 << 20)));
        assert_eq!(get("MemoryHigh"), Some(Value::from(u64::MAX)), "infinity");
        assert_eq!(get("TasksMax"), Some(Value::from(256u64)));
        assert_eq!(get("MemorySwapMax"), Some(Value::from(0u64)), "pods do not swap");
        assert_eq!(get("MemoryMin"), None, "left as it is");
        assert!(properties(&UnitLimits::default(), 252).is_empty());
        let old = properties(&UnitLimits { memory_min: Some(1), ..limits }, 239);
        assert!(old.iter().all(|(n, _)| *n != "CPUQuotaPeriodUSec" && *n != "MemoryMin"), "systemd 239 has neither");
        assert_eq!(major_version("252.38-1~deb12u1"), 252);
        assert_eq!(major_version("v257.1"), 257);
        assert_eq!(major_version(""), 0);
    }

    #[test]
    fn the_driver_is_refused_where_systemd_is_not_the_init() {
        // The host of the tests runs no systemd as PID 1 outside the VM's systemd boot.
        if systemd_is_init().is_ok() {
            return;
        }
        let err = SystemdSlices::connect().unwrap_err();
        assert!(err.to_string().contains("needs systemd as PID 1"), "{err}");
        assert!(err.to_string().contains("use cgroupDriver: cgroupfs"), "{err}");
    }
}
