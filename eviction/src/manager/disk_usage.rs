//! The pods' disk usage for a disk ranking, measured on a thread of its own and not on the eviction thread: where
//! usage is walked (no project quotas), 110 pods' files took the VM 3.4 s warm and 8.3 s cold (`bench/run
//! disk-usage`), during which the eviction thread would have read no memory or PID signal. The pass that starts a
//! measure waits for it a little ([`WAIT`], what a read of quotas takes); one that takes longer is picked up by a
//! later pass (the loop polls every `evictionPollMin` while a threshold is met), and no pod is evicted for disk
//! meanwhile. A measure is used once, by the pass that finds it ended, and only within [`FRESH`] of its end; what a
//! victim's end or a reclaim makes out of date is forgotten ([`DiskUsage::forget`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::time::Duration;

use tokio::time::Instant;

use super::Evictor;
use crate::Signal;

/// How long the pass that starts a measure waits for it.
pub const WAIT: Duration = Duration::from_millis(20);
/// How long after its end a measure may rank pods.
pub const FRESH: Duration = Duration::from_secs(1);

/// Bytes by pod UID.
pub type Usage = HashMap<String, u64>;

/// A measure under way, for a signal.
#[derive(Debug)]
struct Running {
    signal: Signal,
    result: Receiver<Usage>,
}

/// The measures of the pods' disk usage: at most one under way, and the last one ended.
#[derive(Debug, Default)]
pub struct DiskUsage {
    running: Option<Running>,
    ended: Option<(Signal, Instant, Usage)>,
}

impl DiskUsage {
    /// What each of `uids` uses of the file system `signal` measures, once a measure made for this breach has
    /// ended; `None` while it runs (started now if none is).
    pub fn of<E: Evictor>(&mut self, evictor: &Arc<E>, signal: Signal, uids: Vec<String>) -> Option<Usage> {
        self.collect();
        if let Some((s, at, usage)) = self.ended.take()
            && s == signal
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
        let measured = Arc::clone(evictor);
        // Started from the eviction thread, it runs under the normal scheduler (SCHED_RESET_ON_FORK).
        let spawned = std::thread::Builder::new().name("nw-disk-usage".into()).spawn(move || {
            let usage: Usage = uids
                .into_iter()
                .map(|uid| {
                    let bytes = measured.disk_usage(&uid, signal);
                    (uid, bytes)
                })
                .collect();
            let _ = tx.send(usage);
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start a thread to measure the pods' disk usage; ranking without it");
            return Some(Usage::new());
        }
        match rx.recv_timeout(WAIT) {
            Ok(usage) => Some(usage),
            Err(RecvTimeoutError::Timeout) => {
                tracing::debug!(%signal, "measuring the pods' disk usage off the eviction thread");
                self.running = Some(Running { signal, result: rx });
                None
            }
            // The measure panicked: rank without it rather than never.
            Err(RecvTimeoutError::Disconnected) => Some(Usage::new()),
        }
    }

    /// Takes the measure under way if it has ended.
    fn collect(&mut self) {
        let Some(r) = &self.running else { return };
        match r.result.try_recv() {
            Ok(usage) => {
                self.ended = Some((r.signal, Instant::now(), usage));
                self.running = None;
            }
            Err(TryRecvError::Empty) => {}
            Err(TryRecvError::Disconnected) => self.running = None,
        }
    }

    /// Drops the measure that ended: a victim ended or a reclaim freed space since.
    pub fn forget(&mut self) {
        self.ended = None;
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
        let mut d = DiskUsage::default();
        let usage = d.of(&e, Signal::NodeFsAvailable, uids()).unwrap();
        assert_eq!(usage, HashMap::from([("a".into(), 1), ("bb".into(), 2)]));
    }

    #[test]
    fn a_slow_measure_does_not_hold_the_pass_and_is_used_once_when_it_ends() {
        let e = Arc::new(Slow { delay: Duration::from_millis(150), measured: Mutex::new(0) });
        let mut d = DiskUsage::default();
        let t0 = Instant::now();
        assert_eq!(d.of(&e, Signal::NodeFsAvailable, uids()), None);
        assert!(t0.elapsed() < Duration::from_millis(150), "the pass waited for the walk: {:?}", t0.elapsed());
        // Passes meanwhile start no second measure.
        assert_eq!(d.of(&e, Signal::NodeFsAvailable, uids()), None);
        let deadline = Instant::now() + Duration::from_secs(10);
        let usage = loop {
            if let Some(u) = d.of(&e, Signal::NodeFsAvailable, uids()) {
                break u;
            }
            assert!(Instant::now() < deadline, "the measure never ended");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(usage.len(), 2);
        assert_eq!(*e.measured.lock().unwrap(), 2, "one measure of two pods");
        // Used once: the next pass measures again.
        assert_eq!(d.of(&e, Signal::NodeFsAvailable, uids()), None);
    }

    #[test]
    fn a_measure_for_another_signal_or_made_out_of_date_is_not_used() {
        let e = Arc::new(Slow { delay: Duration::from_millis(50), measured: Mutex::new(0) });
        let mut d = DiskUsage::default();
        assert_eq!(d.of(&e, Signal::ImageFsAvailable, uids()), None);
        std::thread::sleep(Duration::from_millis(300));
        d.collect();
        d.forget();
        assert_eq!(d.of(&e, Signal::ImageFsAvailable, uids()), None, "forgotten after a victim ended");
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(d.of(&e, Signal::NodeFsAvailable, uids()), None, "measured for imagefs, not nodefs");
    }
}
