//! Helpers shared by the end-to-end tests: a daemon under test with its own cgroup root, config and port, a plain
//! HTTP client, and cgroup clean-up.
#![allow(dead_code)] // each test crate uses a different subset

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nodewarden_resources::{CgroupFs, CgroupPath};

mod node;
#[allow(unused_imports)] // the daemon tests run no pods
pub use node::*;

pub const MOUNT: &str = "/sys/fs/cgroup";
pub const MIB: u64 = 1 << 20;
pub const BIN: &str = env!("CARGO_BIN_EXE_nodewarden");

pub fn cgroup2_available() -> bool {
    let required = std::env::var_os("NODEWARDEN_VM_TESTS").is_some();
    let ok = std::fs::read_to_string(Path::new(MOUNT).join("cgroup.controllers"))
        .map(|c| ["cpu", "memory", "pids"].iter().all(|w| c.split_whitespace().any(|x| x == *w)))
        .unwrap_or(false);
    if !ok && required {
        panic!("NODEWARDEN_VM_TESTS is set but {MOUNT} has no cgroup v2 with cpu, memory and pids");
    }
    if !ok {
        eprintln!("skipped: no cgroup v2 with cpu, memory and pids at {MOUNT}");
    }
    ok
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A plain HTTP/1.1 GET; returns the status code and the body.
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

/// The value of a metric line that starts with `prefix` (name and labels).
pub fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines().find(|l| l.starts_with(prefix)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok())
}

pub fn meminfo(key: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let line = text.lines().find(|l| l.starts_with(&format!("{key}:"))).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// A daemon under test with its own cgroup root, config and port; killed and cleaned up when dropped.
pub struct Daemon {
    pub dir: tempfile::TempDir,
    pub root: String,
    pub port: u16,
    pub child: Option<Child>,
}

impl Daemon {
    pub fn new(name: &str, extra: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = format!("/nwtest-d-{name}");
        remove_tree(&CgroupPath::parse(&root).unwrap());
        let port = free_port();
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupRoot: {root}\n\
             healthzPort: {port}\nsystemReserved:\n  memory: 64Mi\nkubeReserved:\n  memory: 16Mi\n\
             authentication:\n  anonymous:\n    enabled: false\nnodewarden:\n  housekeepingInterval: 200ms\n{extra}"
        );
        std::fs::write(dir.path().join("config.yaml"), config).unwrap();
        Daemon { dir, root, port, child: None }
    }

    pub fn cgroup(&self, rel: &str) -> PathBuf {
        Path::new(MOUNT).join(&self.root[1..]).join(rel)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    pub fn start(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("log")).unwrap();
        let child = Command::new(BIN)
            .args(["run", "--config"])
            .arg(self.dir.path().join("config.yaml"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// Waits for /readyz to answer 200.
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some((200, _)) = get(self.port, "/readyz") {
                return;
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!("nodewarden exited with {status} before it was ready:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("nodewarden was not ready within 60 s:\n{}", self.log());
    }

    /// Sends SIGTERM and returns the exit code.
    pub fn stop(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(s) = child.try_wait().unwrap() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        panic!("nodewarden did not stop within 30 s of SIGTERM:\n{}", self.log());
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("--- the daemon's log (last 40 lines):");
            for l in tail.into_iter().rev() {
                eprintln!("{l}");
            }
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        remove_tree(&CgroupPath::parse(&self.root).unwrap());
    }
}

/// Polls `f` every 50 ms until it holds; fails the test after `secs`. Returns how long it took.
pub fn wait_until(secs: u64, what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(secs), "{what} did not happen within {secs}s");
        std::thread::sleep(Duration::from_millis(50));
    }
    t0.elapsed()
}

/// Kills whatever runs in a cgroup tree and removes it.
pub fn remove_tree(cg: &CgroupPath) {
    if let Err(e) = CgroupFs::new(MOUNT, CgroupPath::root()).purge(cg) {
        eprintln!("cannot remove {cg}: {e}");
    }
}
