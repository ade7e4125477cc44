//! The status feed: each pod's latest status with a generation, for a consumer that reports it elsewhere (the
//! apiserver's status manager, next). A status is kept until the consumer acknowledged its generation, the last one
//! of a pod whose worker is gone included, so a pod's terminal status is never lost between its end and its report.
//! Keyed by UID: a pod made again under its name never gets the old one's status. Nothing is kept while no
//! consumer reads.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;

/// What a consumer has yet to report of one pod.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusUpdate {
    /// The pod's UID.
    pub uid: String,
    /// The generation of this status: larger for each later status of the pod.
    pub generation: u64,
    /// The pod with this status (as `/pods` serves it).
    pub pod: Arc<Pod>,
    /// The pod is deleted and its containers are gone: this is its last status, and the feed forgets the pod once
    /// it is acknowledged.
    pub gone: bool,
}

#[derive(Debug)]
struct Fed {
    pod: Arc<Pod>,
    generation: u64,
    acked: u64,
    gone: bool,
}

impl Fed {
    fn update(&self, uid: &str) -> StatusUpdate {
        StatusUpdate { uid: uid.to_owned(), generation: self.generation, pod: self.pod.clone(), gone: self.gone }
    }
}

#[derive(Debug, Default)]
struct State {
    /// A consumer reads: statuses are kept until acknowledged.
    reading: bool,
    next: u64,
    pods: BTreeMap<String, Fed>,
}

/// The feed's side that pod sync writes (through the status store).
#[derive(Debug)]
pub(crate) struct StatusFeed {
    state: Mutex<State>,
    changed: watch::Sender<u64>,
}

impl Default for StatusFeed {
    fn default() -> Self {
        Self { state: Mutex::new(State::default()), changed: watch::Sender::new(0) }
    }
}

impl StatusFeed {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A pod's new status.
    pub(crate) fn publish(&self, uid: &str, pod: Arc<Pod>) {
        let mut s = self.state();
        if !s.reading {
            return;
        }
        s.next += 1;
        let generation = s.next;
        // A final status stays final.
        let (acked, gone) = s.pods.get(uid).map_or((0, false), |f| (f.acked, f.gone));
        s.pods.insert(uid.to_owned(), Fed { pod, generation, acked, gone });
        drop(s);
        self.changed.send_replace(generation);
    }

    /// The pod's status is final (it is deleted and its containers are gone): as a new generation, it stays until
    /// it is acknowledged (even one reported already: the acknowledgement of a gone pod is what tells the consumer
    /// to finalize it). Told again before that, it changes nothing.
    pub(crate) fn gone(&self, uid: &str) {
        let mut s = self.state();
        s.next += 1;
        let generation = s.next;
        let Some(f) = s.pods.get_mut(uid).filter(|f| !f.gone) else { return };
        f.gone = true;
        f.generation = generation;
        drop(s);
        self.changed.send_replace(generation);
    }

    /// Starts reading with `current`, the statuses the pods have now (all unreported); `None` while another
    /// reader reads (its unacknowledged statuses are its own).
    pub(crate) fn read(self: &Arc<Self>, current: Vec<(String, Arc<Pod>)>) -> Option<StatusReader> {
        {
            let mut s = self.state();
            if s.reading {
                return None;
            }
            s.reading = true;
            for (uid, pod) in current {
                s.next += 1;
                let generation = s.next;
                s.pods.entry(uid).or_insert(Fed { pod, generation, acked: 0, gone: false });
            }
        }
        let mut changed = self.changed.subscribe();
        changed.mark_changed();
        Some(StatusReader { feed: self.clone(), changed })
    }
}

/// The consumer's side of the status feed ([`crate::StatusStore::reader`]): one consumer, which reports each
/// status and acknowledges it. Dropping it stops the feed from keeping statuses.
#[derive(Debug)]
pub struct StatusReader {
    feed: Arc<StatusFeed>,
    changed: watch::Receiver<u64>,
}

impl StatusReader {
    /// Waits until a status changed since the last call (at once on the first call).
    pub async fn changed(&mut self) {
        // The sender lives in the feed, which this reader holds: it never closes.
        let _ = self.changed.changed().await;
    }

    /// Every pod whose latest status is not acknowledged, oldest change first.
    pub fn unreported(&self) -> Vec<StatusUpdate> {
        let s = self.feed.state();
        let mut out: Vec<StatusUpdate> =
            s.pods.iter().filter(|(_, f)| f.acked < f.generation).map(|(uid, f)| f.update(uid)).collect();
        out.sort_by_key(|u| u.generation);
        out
    }

    /// The latest status of every pod the feed has, reported or not: what a full pass compares with what the
    /// consumer's side holds.
    pub fn all(&self) -> Vec<StatusUpdate> {
        self.feed.state().pods.iter().map(|(uid, f)| f.update(uid)).collect()
    }

    /// Acknowledges `uid`'s status up to `generation` (a later status stays unreported). A pod whose worker is
    /// gone is forgotten once its last status is acknowledged, and returned: its containers are gone and its
    /// final status is reported, so it is the consumer's to finalize (the apiserver's side deletes it with grace 0
    /// and its UID as a precondition, as the kubelet's status manager does).
    pub fn ack(&self, uid: &str, generation: u64) -> Option<Arc<Pod>> {
        let mut s = self.feed.state();
        let f = s.pods.get_mut(uid)?;
        f.acked = f.acked.max(generation.min(f.generation));
        if f.gone && f.acked >= f.generation {
            return s.pods.remove(uid).map(|f| f.pod);
        }
        None
    }
}

impl Drop for StatusReader {
    fn drop(&mut self) {
        let mut s = self.feed.state();
        s.reading = false;
        s.pods.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(phase: &str) -> Arc<Pod> {
        let status = k8s_openapi::api::core::v1::PodStatus { phase: Some(phase.into()), ..Default::default() };
        Arc::new(Pod { status: Some(status), ..Pod::default() })
    }

    fn phases(r: &StatusReader) -> Vec<(String, String, bool)> {
        let phase = |u: &StatusUpdate| u.pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        r.unreported().iter().map(|u| (u.uid.clone(), phase(u), u.gone)).collect()
    }

    #[test]
    fn without_a_reader_nothing_is_kept() {
        let feed = Arc::new(StatusFeed::default());
        feed.publish("a", pod("Running"));
        feed.gone("a");
        assert!(feed.state().pods.is_empty());
    }

    #[test]
    fn a_status_is_kept_until_acknowledged_the_last_one_of_a_gone_pod_too() {
        let feed = Arc::new(StatusFeed::default());
        let r = feed.read(vec![("a".into(), pod("Pending"))]).unwrap();
        assert!(feed.read(Vec::new()).is_none(), "one reader at a time");
        assert_eq!(phases(&r), [("a".into(), "Pending".into(), false)], "what the pods have when reading starts");
        feed.publish("a", pod("Running"));
        feed.publish("b", pod("Pending"));
        let first = r.unreported();
        assert_eq!(phases(&r), [("a".into(), "Running".into(), false), ("b".into(), "Pending".into(), false)]);
        // A status published after the consumer read it stays unreported however the older one is acknowledged.
        feed.publish("a", pod("Succeeded"));
        assert!(r.ack("a", first[0].generation).is_none());
        assert!(r.ack("b", first[1].generation).is_none());
        assert_eq!(phases(&r), [("a".into(), "Succeeded".into(), false)]);
        // The worker ends before the report: the terminal status waits for it, then the pod is forgotten.
        feed.gone("a");
        assert_eq!(phases(&r), [("a".into(), "Succeeded".into(), true)]);
        let last = r.unreported()[0].generation;
        // Told again (a worker that took the pod over finalizes it once more), or updated, it stays final, and one
        // acknowledgement still finalizes it.
        feed.gone("a");
        assert_eq!(r.unreported()[0].generation, last);
        feed.publish("a", pod("Succeeded"));
        assert_eq!(phases(&r), [("a".into(), "Succeeded".into(), true)]);
        let last = r.unreported()[0].generation;
        let over = r.ack("a", last).expect("the pod is over: the consumer finalizes it");
        assert_eq!(over.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded"));
        assert!(r.unreported().is_empty());
        assert_eq!(r.all().iter().map(|u| u.uid.as_str()).collect::<Vec<_>>(), ["b"], "a is forgotten, b kept");
        // A pod whose last status was reported before its worker ended: reported once more, as gone, and its
        // acknowledgement hands it over for finalizing.
        feed.gone("b");
        assert_eq!(phases(&r), [("b".into(), "Pending".into(), true)]);
        let b = r.unreported()[0].generation;
        assert!(r.ack("b", b).is_some());
        assert!(r.all().is_empty());
        assert!(r.ack("nobody", 7).is_none());
        drop(r);
        feed.publish("c", pod("Running"));
        assert!(feed.state().pods.is_empty(), "reading stopped");
    }

    #[tokio::test]
    async fn a_reader_wakes_on_each_change() {
        let feed = Arc::new(StatusFeed::default());
        let mut r = feed.read(Vec::new()).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(1), r.changed()).await.unwrap();
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), r.changed()).await;
        assert!(waiting.is_err(), "no change, no wake-up");
        feed.publish("a", pod("Running"));
        tokio::time::timeout(std::time::Duration::from_secs(1), r.changed()).await.unwrap();
        feed.gone("a");
        tokio::time::timeout(std::time::Duration::from_secs(1), r.changed()).await.unwrap();
    }
}
