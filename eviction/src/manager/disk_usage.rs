//! The pods' disk usage for a disk ranking, measured on a thread of its own and not on the eviction thread: where
//! usage is walked (no project quotas), 110 pods' files took the VM 3.4 s warm and 8.3 s cold (`bench/run
//! disk-usage`), during which the eviction thread would have read no memory or PID signal. The pass that starts a
//! measure waits for it a little ([`WAIT`]); one that takes longer is picked up by the pass its end wakes
//! ([`DiskUsage::ended`]; the loop does not poll for it), and no pod is evicted for disk meanwhile. A measure ranks pods
//! once, for the signal it was made for, within [`FRESH`] of its end; one that a victim's end made out of date
//! ([`DiskUsage::forget`]), ended or still running, is never used (a reclaim leaves it: what it removed no running
//! pod owns). A measure that runs for longer than
//! [`HUNG_AFTER`] (a walk stuck on a hung mount) is reported, once.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::Notified;
use tokio::time::Instant;

use super::Evictor;
use crate::Signal;

/// How long the pass that starts a measure waits for it.
pub const WAIT: Duration = Duration::from_millis(20);
/// How long after its end a measure may rank pods.
pub const FRESH: Duration = Duration::from_secs(1);
/// How long a measure runs before it is reported as hung.
pub const HUNG_AFTER: Duration = Duration::from_secs(30);

/// Bytes by pod UID.
pub type Usage = HashMap<String, u64>;

/// What the measuring thread sends: when it ended, and the usage.
type Ended = (Instant, Usage);

/// The debug line of a measure's end, which `bench/run disk-slow` reads.
fn log_ended(signal: Signal, started: Instant, at: Instant) {
    let took_ms = at.saturating_duration_since(started).as_millis();
    tracing::debug!(%signal, took_ms, "measured the pods' disk usage");
}

/// Notifies the loop when dropped: at a measure's end.
struct WakeOnDrop(Arc<Notify>);

impl Drop for WakeOnDrop {
    fn drop(&mut self) {
        self.0.notify_one();
    }
}

/// A measure under way.
#[derive(Debug)]
struct Running {
    signal: Signal,
    generation: u64,
    started: Instant,
    reported: bool,
    result: Receiver<Ended>,
}

/// The measures of the pods' disk usage: at most one under way, and the last one ended for each signal.
#[derive(Debug)]
pub struct DiskUsage {
    running: Option<Running>,
    ended: HashMap<Signal, Ended>,
    /// Bumped by [`DiskUsage::forget`]: a measure of an older generation is out of date.
    generation: u64,
    /// How long the pass that starts a measure waits for it ([`WAIT`]; longer in tests, whose threads may be slow).
    wait: Duration,
    /// Notified by each measure's end, for [`DiskUsage::ended`].
    done: Arc<Notify>,
}

impl Default for DiskUsage {
    fn default() -> Self {
        Self::with_wait(WAIT)
    }
}

impl DiskUsage {
    /// Measures that the pass starting them waits `wait` for.
    pub fn with_wait(wait: Duration) -> Self {
        Self { running: None, ended: HashMap::new(), generation: 0, wait, done: Arc::new(Notify::new()) }
    }

    /// What each of `uids` uses of the file system `signal` measures, once a measure made for it has ended; `None`
    /// while it runs (started now if none is).
    pub fn of<E: Evictor>(&mut self, evictor: &Arc<E>, signal: Signal, uids: Vec<String>) -> Option<Usage> {
        self.collect();
        if let Some((at, usage)) = self.ended.remove(&signal)
            && at.elapsed() <= FRESH
        {
            return Some(usage);
        }
        if self.running.is_some() {
            return None;
        }
        if uids.is_empty() {
            return Some(Usage::new());
        }
        let (tx, rx) = mpsc::channel();
        let (measured, done, started) = (Arc::clone(evictor), Arc::clone(&self.done), Instant::now());
        // Started from the eviction thread, it runs under the normal scheduler (SCHED_RESET_ON_FORK).
        let spawned = std::thread::Builder::new().name("nw-disk-usage".into()).spawn(move || {
            // Wakes the loop however the measure ends, a panic included.
            let _wake = WakeOnDrop(done);
            let usage: Usage = uids
                .into_iter()
                .map(|uid| {
                    let bytes = measured.disk_usage(&uid, signal);
                    (uid, bytes)
                })
                .collect();
            let _ = tx.send((Instant::now(), usage));
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start a thread to measure the pods' disk usage; ranking without it");
            return Some(Usage::new());
        }
        match rx.recv_timeout(self.wait) {
            Ok((at, usage)) => {
                log_ended(signal, started, at);
                Some(usage)
            }
            Err(RecvTimeoutError::Timeout) => {
                tracing::debug!(%signal, "measuring the pods' disk usage off the eviction thread");
                let generation = self.generation;
                self.running = Some(Running { signal, generation, started, reported: false, result: rx });
                None
            }
            // The measure panicked: rank without it rather than never.
            Err(RecvTimeoutError::Disconnected) => Some(Usage::new()),
        }
    }

    /// Takes the measure under way if it has ended (and is not out of date); reports one that seems hung.
    fn collect(&mut self) {
        let Some(r) = &mut self.running else { return };
        match r.result.try_recv() {
            Ok(ended) => {
                log_ended(r.signal, r.started, ended.0);
                if r.generation == self.generation {
                    self.ended.insert(r.signal, ended);
                }
                self.running = None;
            }
            Err(TryRecvError::Empty) => {
                if !r.reported && r.started.elapsed() >= HUNG_AFTER {
                    r.reported = true;
                    tracing::warn!(signal = %r.signal, seconds = r.started.elapsed().as_secs(), "the measure of the pods' disk usage has not ended: no pod is evicted for disk until it does (a hung mount below a pod's volumes?)");
                }
            }
            Err(TryRecvError::Disconnected) => self.running = None,
        }
    }

    /// Completes when a measure has ended since the last time it did (or once more, for a measure the pass that
    /// started it already had): the eviction loop waits on it rather than polling while the disk is walked.
    pub fn ended(&self) -> Notified<'_> {
        self.done.notified()
    }

    /// Makes every measure made so far, ended or running, out of date: a victim ended.
    pub fn forget(&mut self) {
        self.ended.clear();
        self.generation = self.generation.wrapping_add(1);
    }
}

#[cfg(test)]
#[expect(clippy::disallowed_types, reason = "the measures run on real threads, in real time")]
mod tests {
    use super::*;
    use crate::{EvictError, Eviction, Reclaimed};
    use std::sync::Mutex;
    use std::time::Instant;

    /// An evictor whose disk measure takes `delay` per pod.
    struct Slow {
        delay: Duration,
        measured: Mutex<u32>,
    }

    impl Evictor for Slow {
        fn disk_usage(&self, uid: &str, _signal: Signal) -> u64 {
            std::thread::sleep(self.delay);
            *self.measured.lock().unwrap() += 1;
            uid.len() as u64
        }
        fn reclaim_disk(&self, _signal: Signal) -> Reclaimed {
            Reclaimed::Nothing
        }
        fn evict(&self, uid: &str, _grace: Duration, _message: String) -> Result<Eviction, EvictError> {
            Err(EvictError::UnknownPod(uid.into()))
        }
        fn threshold_met(&self, _resource: &'static str) {}
    }

    fn uids() -> Vec<String> {
        vec!["a".into(), "bb".into()]
    }

    #[test]
    fn a_quick_measure_is_used_by_the_pass_that_starts_it() {
        let e = Arc::new(Slow { delay: Duration::ZERO, measured: Mutex::new(0) });
        // A generous wait: the thread may start late on a loaded machine.
        let mut d = DiskUsage::with_wait(Duration::from_secs(10));
        let usage = d.of(&e, Signal::NodeFsAvailable, uids()).unwrap();
        assert_eq!(usage, HashMap::from([("a".into(), 1), ("bb".into(), 2)]));
    }

    #[test]
    fn a_slow_measure_does_not_hold_the_pass_and_is_used_once_when_it_ends() {
        let e = Arc::new(Slow { delay: Duration::from_millis(400), measured: Mutex::new(0) });
        let mut d = DiskUsage::default();
        let t0 = Instant::now();
        assert_eq!(d.of(&e, Signal::NodeFsAvailable, uids()), None);
        assert!(t0.elapsed() < Duration::from_millis(400), "the pass waited for the walk: {:?}", t0.elapsed());
        // Passes meanwhile start no second measure.
        assert_eq!(d.of(&e, Signal::NodeFsAvailable, uids()), None);
        let usage = answer(&mut d, &e, Signal::NodeFsAvailable);
        assert_eq!(usage.len(), 2);
        assert_eq!(*e.measured.lock().unwrap(), 2, "one measure of two pods");
        // Used once: the next pass measures again.
        assert_eq!(d.of(&e, Signal::NodeFsAvailable, uids()), None);
    }

    /// Calls `of` until it answers (at most 10 s).
    fn answer(d: &mut DiskUsage, e: &Arc<Slow>, signal: Signal) -> Usage {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(u) = d.of(e, signal, uids()) {
                return u;
            }
            assert!(Instant::now() < deadline, "the measure never ended");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_measure_made_out_of_date_while_it_runs_is_not_used() {
        let e = Arc::new(Slow { delay: Duration::from_millis(100), measured: Mutex::new(0) });
        let mut d = DiskUsage::default();
        assert_eq!(d.of(&e, Signal::NodeFsAvailable, uids()), None);
        // A victim ends while the walk runs: what it measured may count the victim's files.
        d.forget();
        std::thread::sleep(Duration::from_millis(400));
        assert_eq!(d.of(&e, Signal::NodeFsAvailable, uids()), None, "the out-of-date measure was used");
        answer(&mut d, &e, Signal::NodeFsAvailable);
        assert_eq!(*e.measured.lock().unwrap(), 4, "measured again after it was out of date");
    }

    #[test]
    fn a_measure_that_ended_long_ago_is_not_used() {
        let e = Arc::new(Slow { delay: Duration::from_millis(50), measured: Mutex::new(0) });
        let mut d = DiskUsage::default();
        assert_eq!(d.of(&e, Signal::NodeFsAvailable, uids()), None);
        std::thread::sleep(Duration::from_millis(200));
        // Ended, but no pass came for it: the pressure went. Its end is stamped by the thread, not by the pass
        // that finds it.
        std::thread::sleep(FRESH);
        assert_eq!(d.of(&e, Signal::NodeFsAvailable, uids()), None, "a measure from before was used");
    }

    #[test]
    fn a_measure_for_one_signal_waits_for_its_own_pass() {
        let e = Arc::new(Slow { delay: Duration::from_millis(50), measured: Mutex::new(0) });
        let mut d = DiskUsage::default();
        assert_eq!(d.of(&e, Signal::ImageFsAvailable, uids()), None);
        std::thread::sleep(Duration::from_millis(200));
        // The nodefs pass starts its own measure, and leaves the imagefs one for the imagefs pass.
        assert_eq!(d.of(&e, Signal::NodeFsAvailable, uids()), None);
        assert_eq!(d.of(&e, Signal::ImageFsAvailable, uids()).map(|u| u.len()), Some(2));
        assert_eq!(answer(&mut d, &e, Signal::NodeFsAvailable).len(), 2);
    }
}
