//! Wake-ups for the eviction loop that do not wait for the next poll: PSI triggers on `/proc/pressure/memory` and
//! on kubepods' `memory.pressure` (the kernel marks the file with `POLLPRI` when the stall threshold is crossed),
//! and inotify on kubepods' `memory.events` (modified when the `high`, `max` or `oom` counters move).
//!
//! A thread blocks in `poll(2)` on those descriptors and sends what woke it. Whatever cannot be set up is logged
//! and left out; the loop's own poll still covers it.

use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use inotify::{Inotify, WatchMask};
use nodewarden_resources::{CgroupFs, CgroupPath, open_psi_trigger};
use rustix::event::{PollFd, PollFlags, Timespec};
use tokio::sync::mpsc;

/// What woke the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Wake {
    /// The poll period ran out.
    Poll,
    /// A PSI trigger on `/proc/pressure/memory` fired.
    NodePsi,
    /// A PSI trigger on kubepods' `memory.pressure` fired.
    KubepodsPsi,
    /// kubepods' `memory.events` changed.
    MemoryEvents,
    /// The configuration changed.
    Config,
    /// An eviction finished.
    Evicted,
    /// A measure of the pods' disk usage ended.
    DiskUsage,
}

impl Wake {
    /// The label value for the wake-up metric.
    pub fn as_str(self) -> &'static str {
        match self {
            Wake::Poll => "poll",
            Wake::NodePsi => "psi_node",
            Wake::KubepodsPsi => "psi_kubepods",
            Wake::MemoryEvents => "memory_events",
            Wake::Config => "config",
            Wake::Evicted => "eviction_done",
            Wake::DiskUsage => "disk_usage",
        }
    }
}

/// The PSI trigger: 100 ms of stall by some task within a 1 s window.
pub const PSI_TRIGGER: &str = "some 100000 1000000";

/// Stops the wake-up thread when dropped.
#[derive(Debug)]
pub struct WakeThread {
    stop: Arc<AtomicBool>,
}

impl Drop for WakeThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

enum Source {
    Psi(std::fs::File, Wake),
    Events(Inotify),
}

/// Starts the wake-up thread. Returns `None` when none of the sources could be set up.
pub fn start(proc: &Path, fs: &CgroupFs, kubepods: &CgroupPath, tx: mpsc::Sender<Wake>) -> Option<WakeThread> {
    let mut sources = Vec::new();
    match open_psi_trigger(&proc.join("pressure/memory"), PSI_TRIGGER) {
        Ok(f) => sources.push(Source::Psi(f, Wake::NodePsi)),
        Err(e) => tracing::warn!(error = %e, "no PSI trigger on the node's memory pressure"),
    }
    match fs.psi_trigger(kubepods, "memory.pressure", PSI_TRIGGER) {
        Ok(f) => sources.push(Source::Psi(f, Wake::KubepodsPsi)),
        Err(e) => tracing::warn!(error = %e, "no PSI trigger on kubepods' memory pressure"),
    }
    let events = fs.file(kubepods, "memory.events");
    match Inotify::init().and_then(|i| i.watches().add(&events, WatchMask::MODIFY).map(|_| i)) {
        Ok(i) => sources.push(Source::Events(i)),
        Err(e) => tracing::warn!(file = %events.display(), error = %e, "cannot watch memory.events"),
    }
    if sources.is_empty() {
        return None;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let spawned = std::thread::Builder::new().name("pressure-events".into()).spawn(move || watch(sources, &flag, &tx));
    match spawned {
        Ok(_) => Some(WakeThread { stop }),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the pressure event thread");
            None
        }
    }
}

fn watch(mut sources: Vec<Source>, stop: &AtomicBool, tx: &mpsc::Sender<Wake>) {
    let mut buf = [0u8; 1024];
    let timeout = Timespec { tv_sec: 1, tv_nsec: 0 };
    while !stop.load(Ordering::Relaxed) && !tx.is_closed() {
        let ready: Vec<(PollFlags, Wake)> = {
            let mut fds: Vec<PollFd<'_>> = sources
                .iter()
                .map(|s| match s {
                    Source::Psi(f, _) => PollFd::new(f, PollFlags::PRI),
                    Source::Events(i) => PollFd::from_borrowed_fd(i.as_fd(), PollFlags::IN),
                })
                .collect();
            if let Err(e) = rustix::event::poll(&mut fds, Some(&timeout)) {
                if e != rustix::io::Errno::INTR {
                    tracing::warn!(error = %e, "poll on pressure events failed; the eviction loop keeps polling");
                    return;
                }
                continue;
            }
            fds.iter()
                .zip(&sources)
                .map(|(fd, s)| {
                    let wake = match s {
                        Source::Psi(_, w) => *w,
                        Source::Events(_) => Wake::MemoryEvents,
                    };
                    (fd.revents(), wake)
                })
                .collect()
        };
        let broken = PollFlags::ERR | PollFlags::HUP | PollFlags::NVAL;
        let mut gone = Vec::new();
        for (i, (revents, wake)) in ready.into_iter().enumerate() {
            if revents.intersects(broken) {
                tracing::warn!(source = wake.as_str(), "pressure event source failed; it is no longer watched");
                gone.push(i);
                continue;
            }
            if revents.is_empty() {
                continue;
            }
            if let Some(Source::Events(ino)) = sources.get_mut(i) {
                // Drain the queue; what changed does not matter, only that something did.
                while ino.read_events(&mut buf).is_ok_and(|mut e| e.next().is_some()) {}
            }
            // A full queue already holds a wake-up.
            let _ = tx.try_send(wake);
        }
        for i in gone.into_iter().rev() {
            sources.remove(i);
        }
        if sources.is_empty() {
            return;
        }
    }
}
