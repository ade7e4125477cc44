//! `hog`: the benchmark's workload, run as a pod. It grows memory, processes or files at a set rate, and on
//! SIGTERM writes the moment it was delivered (its handler's CLOCK_MONOTONIC, seconds) and the moment a thread of
//! the hog was woken by it to a file and exits, so the harness can measure threshold crossing → SIGTERM without
//! waiting for the process to die.
//!
//! Beside the SIGTERM file (`--term-file`) it writes `<term-file>.ready` once its handler is installed and
//! `<term-file>.done` once its steps are done; with `--go-file` it starts growing only once that file exists, so
//! the harness can start every agent's measurement window at the same point.

use std::io::{Read, Write};
use std::os::fd::IntoRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// What to grow.
#[derive(Debug, Clone, clap::Args)]
pub struct HogArgs {
    /// MiB of memory to add every step.
    #[arg(long, default_value_t = 0)]
    pub grow_mb: u64,
    /// Processes (`sleep 600`) to start every step.
    #[arg(long, default_value_t = 0)]
    pub fork: u64,
    /// MiB to write to files in this directory every step.
    #[arg(long)]
    pub write_dir: Option<PathBuf>,
    /// MiB per step for --write-dir.
    #[arg(long, default_value_t = 8)]
    pub write_mb: u64,
    /// Milliseconds between steps.
    #[arg(long, default_value_t = 20)]
    pub every_ms: u64,
    /// Stop growing after this many steps.
    #[arg(long, default_value_t = u64::MAX)]
    pub steps: u64,
    /// Where the SIGTERM time goes.
    #[arg(long)]
    pub term_file: PathBuf,
    /// Wait until this file exists before growing.
    #[arg(long)]
    pub go_file: Option<PathBuf>,
    /// Keep the memory on 4 KiB pages (`PR_SET_THP_DISABLE`), not on transparent huge pages.
    #[arg(long)]
    pub small_pages: bool,
}

/// `<term-file>.<suffix>`.
pub fn marker(term_file: &std::path::Path, suffix: &str) -> PathBuf {
    let mut name = term_file.as_os_str().to_owned();
    name.push(".");
    name.push(suffix);
    PathBuf::from(name)
}

/// CLOCK_MONOTONIC in seconds, the clock the harness samples with.
pub fn monotonic() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

/// When the SIGTERM handler ran (CLOCK_MONOTONIC, ns); 0 until it has.
static DELIVERED_NS: AtomicU64 = AtomicU64::new(0);
/// The write end of the pipe through which the handler wakes the watcher thread; -1 until it exists.
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

/// The SIGTERM handler: notes the time and wakes the watcher thread. Only async-signal-safe calls: the C
/// library's `clock_gettime` (rustix's sets itself up on first use, which may allocate) and a raw `write`, which
/// leaves `errno` alone.
#[expect(unsafe_code, reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound")]
extern "C" fn on_sigterm(_: libc::c_int) {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec on this stack; clock_gettime is async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut t) };
    let ns = u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0);
    let _ = DELIVERED_NS.compare_exchange(0, ns, Ordering::SeqCst, Ordering::SeqCst);
    let fd = WAKE_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: `fd` is the pipe's write end, open for the life of the process.
        let _ = rustix::io::write(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }, &[1]);
    }
}

/// Records SIGTERM's delivery: the handler notes when it ran (the delivery), and a thread of its own, woken by
/// the handler, writes that and its own time (when the process could act on it) to `term_file`, then exits with
/// 143.
fn watch_sigterm(term_file: PathBuf) -> Result<()> {
    // The clock the watcher thread reads sets itself up now, not on the signal's path.
    let _ = monotonic();
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).context("pipe")?;
    WAKE_FD.store(write.into_raw_fd(), Ordering::SeqCst);
    // SAFETY: the action is fully initialised (an empty mask, no flags but SA_RESTART) and the handler only makes
    // async-signal-safe calls.
    #[expect(unsafe_code, reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound")]
    let installed = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigterm as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&raw mut action.sa_mask);
        libc::sigaction(libc::SIGTERM, &raw const action, std::ptr::null_mut())
    };
    if installed != 0 {
        bail!("cannot install the SIGTERM handler: {}", std::io::Error::last_os_error());
    }
    std::thread::spawn(move || {
        let mut pipe = std::fs::File::from(read);
        let mut byte = [0u8; 1];
        let _ = pipe.read(&mut byte);
        let handled = monotonic();
        let delivered = DELIVERED_NS.load(Ordering::SeqCst) as f64 / 1e9;
        let _ = std::fs::write(&term_file, format!("{delivered:.6} {handled:.6}\n"));
        std::process::exit(143);
    });
    Ok(())
}

/// Runs the hog until killed.
pub fn run(a: &HogArgs) -> Result<()> {
    if a.small_pages {
        rustix::thread::disable_transparent_huge_pages(true).context("cannot turn transparent huge pages off")?;
    }
    watch_sigterm(a.term_file.clone())?;
    std::fs::write(marker(&a.term_file, "ready"), "")?;
    if let Some(go) = &a.go_file {
        while !go.exists() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut children = Vec::new();
    let mut file_no = 0u64;
    let mut disk_full = false;
    for _ in 0..a.steps {
        if a.grow_mb > 0 {
            let n = usize::try_from(a.grow_mb << 20).context("step too large")?;
            let mut chunk = vec![0u8; n];
            // Touch every page so it is really allocated.
            for i in (0..n).step_by(4096) {
                chunk[i] = 1;
            }
            held.push(chunk);
        }
        for _ in 0..a.fork {
            match std::process::Command::new("sleep").arg("600").spawn() {
                Ok(c) => children.push(c),
                Err(_) => break,
            }
        }
        if let (Some(dir), false) = (&a.write_dir, disk_full) {
            file_no += 1;
            let buf = vec![7u8; 1 << 20];
            let written = std::fs::File::create(dir.join(format!("fill-{file_no}"))).and_then(|mut f| {
                for _ in 0..a.write_mb {
                    f.write_all(&buf)?;
                }
                f.sync_data()
            });
            // A full file system ends the writing, not the hog.
            disk_full = written.is_err();
        }
        std::thread::sleep(Duration::from_millis(a.every_ms));
    }
    std::fs::write(marker(&a.term_file, "done"), "")?;
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
