//! What the eviction loop shares with the daemon: when it last completed a pass (for `/readyz`), the last
//! evaluation, and the recent evictions with their explanations (for `/evictions`).

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::manager::{Eviction, sigterm_sent};
use crate::pressure::Evaluation;

/// How many evictions `/evictions` keeps.
pub const HISTORY: usize = 100;

/// One ranked candidate, as an eviction explains its choice.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Ranked {
    /// `namespace/name`.
    pub pod: String,
    /// The usage that ranking compared (bytes, or processes for `pid.available`).
    pub usage: u64,
    /// The matching request (0 for PIDs).
    pub request: u64,
    /// `spec.priority`.
    pub priority: i32,
}

/// One eviction and why.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EvictionRecord {
    /// When it was decided (for a limit, when the limit was found exceeded).
    pub time: jiff::Timestamp,
    /// `namespace/name`.
    pub pod: String,
    /// The pod UID.
    pub uid: String,
    /// The signal below its threshold (`memory.available`, ...), or the ephemeral-storage limit the pod went over
    /// (`emptydirfs.limit`, `ephemeralpodfs.limit`, `ephemeralcontainerfs.limit`), as `kubelet_evictions` names
    /// them.
    pub signal: &'static str,
    /// An `evictionHard` threshold, or a limit (else `evictionSoft`).
    pub hard: bool,
    /// The signal's observed value (for a limit, the bytes used).
    pub observed: u64,
    /// The threshold (for a limit, the limit in bytes).
    pub threshold: u64,
    /// Threshold + minimum reclaim: where eviction must bring the signal (for a limit, the limit).
    pub target: u64,
    /// What this pod was expected to give back.
    pub reclaims: u64,
    /// The grace period it was given, in seconds.
    pub grace_period_seconds: u64,
    /// The message in the pod's status.
    pub message: String,
    /// The candidates in rank order (at most ten), the victim first among those not already being evicted (none
    /// for a limit: the pod alone broke it).
    pub candidates: Vec<Ranked>,
    /// Threshold crossing observed (for a limit, found exceeded) → SIGTERM sent, once sent.
    pub sigterm_latency_seconds: Option<f64>,
    /// Why the eviction failed, if it did.
    pub error: Option<String>,
    /// True once the pod has terminated.
    pub completed: bool,
}

/// An eviction decided outside the eviction loop: a pod over one of its ephemeral-storage limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitEviction {
    /// `namespace/name`.
    pub pod: String,
    /// The pod UID.
    pub uid: String,
    /// `emptydirfs.limit`, `ephemeralpodfs.limit` or `ephemeralcontainerfs.limit`.
    pub signal: &'static str,
    /// The bytes used.
    pub used: u64,
    /// The limit, in bytes.
    pub limit: u64,
    /// The grace period the pod was given.
    pub grace: Duration,
    /// The message in the pod's status.
    pub message: String,
    /// When the limit was found exceeded.
    pub decided: (Instant, jiff::Timestamp),
}

/// The eviction loop's shared state.
#[derive(Debug, Default)]
pub struct EvictionStatus {
    last_pass: Mutex<Option<Instant>>,
    last_error: Mutex<Option<String>>,
    unavailable: Mutex<std::collections::BTreeMap<&'static str, String>>,
    evaluation: Mutex<Evaluation>,
    history: Mutex<VecDeque<(u64, EvictionRecord)>>,
    next_id: Mutex<u64>,
    /// Bumped when a pass changes the node conditions, so the node status can be posted at once.
    conditions_changed: tokio::sync::watch::Sender<u64>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl EvictionStatus {
    /// `Ok` when a pass completed within `stale_after`; else why not.
    pub fn readiness(&self, stale_after: Duration) -> Result<(), String> {
        match *lock(&self.last_pass) {
            Some(t) if t.elapsed() <= stale_after => Ok(()),
            Some(t) => Err(format!(
                "the eviction loop last completed a pass {:.1}s ago{}",
                t.elapsed().as_secs_f64(),
                lock(&self.last_error).as_ref().map(|e| format!(": {e}")).unwrap_or_default()
            )),
            None => Err("the eviction loop has not completed a pass yet".into()),
        }
    }

    /// Records how the inputs in `read` fared in the last read that tried them: `None` answered, `Some(why)` did
    /// not (their signals were left out). Inputs not in `read` keep what was last recorded.
    pub fn record_inputs(&self, read: &[(&'static str, Option<String>)]) {
        let mut u = lock(&self.unavailable);
        for (input, error) in read {
            match error {
                Some(e) => u.insert(input, e.clone()),
                None => u.remove(input),
            };
        }
    }

    /// `Ok` while every input of the eviction signals answers; else the ones that do not, with why.
    pub fn inputs(&self) -> Result<(), String> {
        let u = lock(&self.unavailable);
        if u.is_empty() {
            return Ok(());
        }
        let each: Vec<String> = u.iter().map(|(i, e)| format!("{i}: {e}")).collect();
        Err(format!("signals left out: {}", each.join("; ")))
    }

    /// The last evaluation: conditions and the thresholds met.
    pub fn evaluation(&self) -> Evaluation {
        lock(&self.evaluation).clone()
    }

    /// The recent evictions, oldest first.
    pub fn history(&self) -> Vec<EvictionRecord> {
        lock(&self.history).iter().map(|(_, r)| r.clone()).collect()
    }

    /// A receiver that sees a new value each time a pass changes the node conditions.
    pub fn conditions_changed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.conditions_changed.subscribe()
    }

    pub(crate) fn pass_done(&self, at: Instant, evaluation: Evaluation) {
        *lock(&self.last_pass) = Some(at);
        *lock(&self.last_error) = None;
        let changed = {
            let mut e = lock(&self.evaluation);
            let changed = e.pressure != evaluation.pressure;
            *e = evaluation;
            changed
        };
        if changed {
            self.conditions_changed.send_modify(|g| *g = g.wrapping_add(1));
        }
    }

    pub(crate) fn pass_failed(&self, error: String) {
        *lock(&self.last_error) = Some(error);
    }

    pub(crate) fn record(&self, r: EvictionRecord) -> u64 {
        let id = {
            let mut n = lock(&self.next_id);
            *n += 1;
            *n
        };
        let mut h = lock(&self.history);
        if h.len() == HISTORY {
            h.pop_front();
        }
        h.push_back((id, r));
        id
    }

    /// Records `e`, decided at `decided`, beside the eviction loop's, and follows it as the loop follows its own:
    /// when SIGTERM went out, and when the pod terminated. Returns once it has, or SIGTERM did not go out in time.
    pub async fn follow_limit(&self, e: LimitEviction, eviction: Eviction) {
        let LimitEviction { pod, uid, signal, used, limit, grace, message, decided: (decided, time) } = e;
        let id = self.record(EvictionRecord {
            time,
            pod,
            uid,
            signal,
            hard: true,
            observed: used,
            threshold: limit,
            target: limit,
            reclaims: used,
            grace_period_seconds: grace.as_secs(),
            message,
            candidates: Vec::new(),
            sigterm_latency_seconds: None,
            error: None,
            completed: false,
        });
        match sigterm_sent(eviction.signalled, grace).await {
            Ok(at) => {
                let l = at.saturating_duration_since(decided).as_secs_f64();
                self.update(id, |r| r.sigterm_latency_seconds = Some(l));
            }
            Err(e) => {
                self.update(id, |r| r.error = Some(e.to_string()));
                return;
            }
        }
        let _ = eviction.terminated.await;
        self.update(id, |r| r.completed = true);
    }

    pub(crate) fn update(&self, id: u64, f: impl FnOnce(&mut EvictionRecord)) {
        if let Some((_, r)) = lock(&self.history).iter_mut().find(|(i, _)| *i == id) {
            f(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::oneshot;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_limit_eviction_is_listed_and_followed_to_the_pod_s_end() {
        let status = std::sync::Arc::new(EvictionStatus::default());
        let (signal_tx, signalled) = oneshot::channel();
        let (end_tx, terminated) = oneshot::channel();
        let e = LimitEviction {
            pod: "ns/p".into(),
            uid: "u1".into(),
            signal: "emptydirfs.limit",
            used: 8 << 20,
            limit: 5 << 20,
            grace: Duration::from_secs(1),
            message: "Usage of EmptyDir volume \"data\" exceeds the limit \"5Mi\". ".into(),
            decided: (Instant::now(), jiff::Timestamp::UNIX_EPOCH),
        };
        let following = tokio::spawn({
            let status = status.clone();
            async move { status.follow_limit(e, Eviction { signalled, terminated }).await }
        });
        tokio::time::sleep(Duration::from_millis(3)).await;
        signal_tx.send(Instant::now()).unwrap();
        tokio::task::yield_now().await;
        let r = &status.history()[0];
        assert_eq!((r.signal, r.observed, r.threshold, r.completed), ("emptydirfs.limit", 8 << 20, 5 << 20, false));
        assert!(r.sigterm_latency_seconds.is_some_and(|l| (l - 0.003).abs() < 1e-9), "{r:?}");
        end_tx.send(()).unwrap();
        following.await.unwrap();
        assert!(status.history()[0].completed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_limit_eviction_never_signalled_is_marked_failed() {
        let status = EvictionStatus::default();
        let (_signal_tx, signalled) = oneshot::channel::<Instant>();
        let (_end_tx, terminated) = oneshot::channel();
        let e = LimitEviction {
            pod: "ns/p".into(),
            uid: "u1".into(),
            signal: "ephemeralpodfs.limit",
            used: 2,
            limit: 1,
            grace: Duration::from_secs(1),
            message: String::new(),
            decided: (Instant::now(), jiff::Timestamp::UNIX_EPOCH),
        };
        status.follow_limit(e, Eviction { signalled, terminated }).await;
        let r = &status.history()[0];
        assert_eq!(r.error.as_deref(), Some("SIGTERM was not sent within 6s"));
        assert!(!r.completed);
    }
}
