//! What nodewarden's end-to-end tests (`tests/`) and benchmarks (`bench/`) share: a daemon under test with its
//! own config, cgroup root and port; a plain HTTP/1.1 client; metric parsing; polling; cgroup clean-up; and the
//! statistics the benchmarks report. Both run real processes in real time, so this crate uses `std::time`.
#![expect(clippy::disallowed_types, reason = "real processes, real time")]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nodewarden_resources::{CgroupFs, CgroupPath};

/// Where cgroup2 is mounted in the VM.
pub const MOUNT: &str = "/sys/fs/cgroup";

/// A free TCP port on the loopback address.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A plain HTTP/1.1 GET to `127.0.0.1:port` with a 10 s read timeout; the status code and the body.
pub fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let status = raw.split_whitespace().nth(1)?.parse().ok()?;
    let body = raw.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Some((status, body))
}

/// The value of the first metric line that starts with `prefix` (a name, with or without labels).
pub fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines().find(|l| l.starts_with(prefix)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok())
}

/// A `/proc/<pid>/stat` (or a thread's) split into the command name and the fields after it: the name may hold
/// spaces and parentheses, so it ends at the last `)`. Field 0 is the state (`proc_pid_stat(5)`'s field 3), so
/// its field `n` is at `n - 3`. `None` when the text is not such a file.
pub fn proc_stat_fields(stat: &str) -> Option<(&str, Vec<&str>)> {
    let (head, rest) = stat.rsplit_once(')')?;
    let (_, name) = head.split_once('(')?;
    Some((name, rest.split_whitespace().collect()))
}

/// Polls `f` every `every` until it holds or `timeout` has passed; whether it held.
pub fn poll(timeout: Duration, every: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(every);
    }
}

/// Kills whatever runs in a cgroup tree below [`MOUNT`] and removes it; a failure is printed, not raised.
pub fn remove_tree(cg: &CgroupPath) {
    if let Err(e) = CgroupFs::new(MOUNT, CgroupPath::root()).purge(cg) {
        eprintln!("cannot remove {cg}: {e}");
    }
}

/// The median (the upper one of an even count); `None` when empty.
pub fn median_of(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// The largest value; `None` when empty.
pub fn worst_of(v: &[f64]) -> Option<f64> {
    v.iter().copied().reduce(f64::max)
}

/// [`median_of`], NaN when empty (a table cell that shows there was nothing).
pub fn median(v: Vec<f64>) -> f64 {
    median_of(v).unwrap_or(f64::NAN)
}

/// [`worst_of`], NaN when empty.
pub fn worst(v: &[f64]) -> f64 {
    worst_of(v).unwrap_or(f64::NAN)
}

/// A `nodewarden run` with its own directory (config, log), cgroup root and port. Dropping it kills the daemon
/// and removes its cgroup tree; the directory is the caller's.
#[derive(Debug)]
pub struct Daemon {
    /// The binary.
    pub bin: PathBuf,
    /// Holds `config.yaml` and `log`.
    pub dir: PathBuf,
    /// `cgroupRoot`.
    pub root: CgroupPath,
    /// `healthzPort`.
    pub port: u16,
    /// The running daemon.
    pub child: Option<Child>,
    /// More arguments for `nodewarden run` (e.g. `--kubeconfig PATH`).
    pub args: Vec<String>,
}

impl Daemon {
    /// Writes `dir/config.yaml`: a `KubeletConfiguration` with `cgroupRoot: root`, a free `healthzPort` and
    /// `extra` (config lines, a `nodewarden:` section included). What an earlier run left at `root` is removed.
    pub fn configure(bin: &Path, dir: &Path, root: &str, extra: &str) -> std::io::Result<Self> {
        let root = CgroupPath::parse(root).map_err(std::io::Error::other)?;
        remove_tree(&root);
        let port = free_port()?;
        std::fs::create_dir_all(dir)?;
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupRoot: {root}\n\
             healthzPort: {port}\n{extra}"
        );
        std::fs::write(dir.join("config.yaml"), config)?;
        Ok(Self { bin: bin.to_owned(), dir: dir.to_owned(), root, port, child: None, args: Vec::new() })
    }

    /// The config file.
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("config.yaml")
    }

    /// A path below the daemon's cgroup root.
    pub fn cgroup(&self, rel: &str) -> PathBuf {
        Path::new(MOUNT).join(self.root.as_str().trim_start_matches('/')).join(rel)
    }

    /// What the daemon logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    /// The daemon's PID, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the started daemon has exited (false before a start).
    pub fn exited(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_some())
    }

    /// Starts `nodewarden run --config` (with [`Daemon::args`]), its stderr to `log`.
    pub fn start(&mut self) -> std::io::Result<()> {
        let log = std::fs::File::create(self.dir.join("log"))?;
        let child = Command::new(&self.bin)
            .args(["run", "--config"])
            .arg(self.config_path())
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits until `/readyz` answers 200; the error says why not (the daemon exited, or the time ran out).
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some((200, _)) = get(self.port, "/readyz") {
                return Ok(());
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                return Err(format!("nodewarden exited with {status} before it was ready:\n{}", self.log()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("nodewarden was not ready within {timeout:?}:\n{}", self.log()))
    }

    /// Sends SIGTERM and waits up to `timeout` for the exit; its code, or the error (then the daemon is killed).
    pub fn stop(&mut self, timeout: Duration) -> Result<Option<i32>, String> {
        let Some(mut child) = self.child.take() else { return Ok(None) };
        if let Some(pid) = i32::try_from(child.id()).ok().and_then(rustix::process::Pid::from_raw) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(s)) = child.try_wait() {
                return Ok(s.code());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        Err(format!("nodewarden did not stop within {timeout:?} of SIGTERM:\n{}", self.log()))
    }

    /// Kills the daemon at once (SIGKILL), leaving everything it made in place.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
        remove_tree(&self.root);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_splits_at_the_last_parenthesis_of_the_name() {
        let (name, fields) = proc_stat_fields("42 (a) b (c)) S 1 42 42 0 -1 4194560 7 0 5").unwrap();
        assert_eq!(name, "a) b (c)");
        assert_eq!(fields[0], "S");
        assert_eq!(fields[9], "5", "majflt, field 12");
        assert!(proc_stat_fields("no parentheses").is_none());
    }
}
