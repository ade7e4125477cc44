//! Helpers shared by the end-to-end tests: a daemon under test with its own cgroup root, config and port, a plain
//! HTTP client, and cgroup clean-up.
#![allow(dead_code)] // each test crate uses a different subset

use std::path::Path;
use std::time::{Duration, Instant};

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

#[allow(unused_imports)] // each test crate uses a different subset
pub use nodewarden_testkit::{get, metric, remove_tree};

/// Whether process `pid` runs (a zombie has no command line).
pub fn alive(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| !c.is_empty())
}

/// A process with `arg` among its arguments, if one runs.
pub fn pid_of(arg: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        cmdline.split(|b| *b == 0).any(|a| a == arg.as_bytes()).then_some(pid)
    })
}

pub fn free_port() -> u16 {
    nodewarden_testkit::free_port().unwrap()
}

pub fn meminfo(key: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let line = text.lines().find(|l| l.starts_with(&format!("{key}:"))).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// A daemon under test with its own cgroup root, config and port; killed and cleaned up when dropped, its log
/// printed when the test failed.
pub struct Daemon {
    inner: nodewarden_testkit::Daemon,
    pub dir: tempfile::TempDir,
}

impl std::ops::Deref for Daemon {
    type Target = nodewarden_testkit::Daemon;
    fn deref(&self) -> &Self::Target {
        &self.inner
    }
}

impl std::ops::DerefMut for Daemon {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.inner
    }
}

impl Daemon {
    pub fn new(name: &str, extra: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        // A root directory of its own (unless the caller sets one), so that daemons of tests running at once do
        // not share the node lock.
        let root = if extra.contains("  rootDir:") {
            String::new()
        } else {
            format!("  rootDir: {}\n", dir.path().join("root").display())
        };
        let extra = format!(
            "systemReserved:\n  memory: 64Mi\nkubeReserved:\n  memory: 16Mi\n\
             authentication:\n  anonymous:\n    enabled: false\nnodewarden:\n  housekeepingInterval: 200ms\n{root}{extra}"
        );
        let inner =
            nodewarden_testkit::Daemon::configure(Path::new(BIN), dir.path(), &format!("/nwtest-d-{name}"), &extra)
                .unwrap();
        Daemon { inner, dir }
    }

    /// Starts the daemon and returns once it serves or has exited, holding [`KERNEL_TUNABLES`] shared meanwhile:
    /// each daemon sets the kernel tunables the kubelet needs as it starts, so a test that resets one waits for
    /// starts in progress and keeps others from starting until it is done.
    pub fn start(&mut self) {
        let _starting = KERNEL_TUNABLES.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.start_unlocked();
        nodewarden_testkit::poll(Duration::from_secs(60), Duration::from_millis(20), || {
            self.log().contains("serving /healthz") || self.inner.exited()
        });
    }

    /// Starts the daemon without [`KERNEL_TUNABLES`]: for the test that holds it.
    pub fn start_unlocked(&mut self) {
        self.inner.start().unwrap();
    }

    /// Waits for /readyz to answer 200.
    pub fn wait_ready(&mut self) {
        self.inner.wait_ready(Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Sends SIGTERM and returns the exit code.
    pub fn stop(&mut self) -> Option<i32> {
        self.inner.stop(Duration::from_secs(30)).unwrap_or_else(|e| panic!("{e}"))
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
    }
}

/// Taken shared by [`Daemon::start`] until the daemon serves, exclusively by [`kernel_tunables`].
pub static KERNEL_TUNABLES: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Keeps every daemon of this test binary from starting (and setting the kernel tunables) while held.
pub fn kernel_tunables() -> std::sync::RwLockWriteGuard<'static, ()> {
    KERNEL_TUNABLES.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Polls `f` every 50 ms until it holds; fails the test after `secs`. Returns how long it took.
pub fn wait_until(secs: u64, what: &str, f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    let held = nodewarden_testkit::poll(Duration::from_secs(secs), Duration::from_millis(50), f);
    assert!(held, "{what} did not happen within {secs}s");
    t0.elapsed()
}
