//! The reclaim of node storage the eviction manager asks for before it evicts a pod for disk, as the kubelet's
//! `reclaimNodeLevelResources`: first the logs of the pods that are over, then the dead containers and stopped
//! sandboxes of those still listed (the kubelet's `DeleteAllUnusedContainers`, which under disk pressure removes
//! them too), then the unused images where they are on the file system under pressure. It runs as one task at a time; the eviction thread,
//! which asks, is never blocked: it is told the reclaim runs, then what it removed, once.

use std::future::Future;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use nodewarden_eviction::Reclaimed;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long the eviction manager holds off evicting a pod for disk while a reclaim runs.
pub const RECLAIM_WAIT: Duration = Duration::from_secs(30);

/// After a reclaim that removed nothing, the images are not tried again for this long (the next try would remove
/// nothing either, and evictions would wait on it); what pods that are over leave is.
const RECLAIM_QUIET: Duration = Duration::from_secs(60);

/// What a reclaim removed: `None` when nothing; else the bytes it freed, as far as they are known (a dead
/// container of the process runtime has no measure, but its removal is worth a new reading).
pub(crate) type Removed = Option<u64>;

#[derive(Debug)]
enum State {
    Idle {
        quiet_until: Option<Instant>,
    },
    /// `quiet_until`: the quiet in force when it started.
    Running {
        since: Instant,
        task: JoinHandle<Removed>,
        quiet_until: Option<Instant>,
    },
}

/// The node's one reclaim: none, or one running as a task.
#[derive(Debug)]
pub(crate) struct NodeReclaim {
    state: Mutex<State>,
    /// The runtime the reclaims run on (the caller, the eviction thread, has its own); none outside a Tokio runtime.
    handle: Option<tokio::runtime::Handle>,
}

impl NodeReclaim {
    /// No reclaim yet; they will run on the current Tokio runtime.
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(State::Idle { quiet_until: None }),
            handle: tokio::runtime::Handle::try_current().ok(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How the reclaim stands: while one runs (for at most [`RECLAIM_WAIT`]), that it runs; once it has ended, what
    /// it removed, once. Otherwise `work` is asked for a new one, told whether the images are to be left alone (a
    /// reclaim removed nothing less than [`RECLAIM_QUIET`] ago); it starts unless it has nothing to do. Never
    /// blocks.
    pub(crate) fn poll<F>(&self, work: impl FnOnce(bool) -> Option<F>) -> Reclaimed
    where
        F: Future<Output = Removed> + Send + 'static,
    {
        let now = Instant::now();
        let mut state = self.state();
        match &mut *state {
            State::Running { since, task, quiet_until } => {
                if task.is_finished() {
                    let removed = futures_util::FutureExt::now_or_never(&mut *task).and_then(Result::ok).flatten();
                    let quiet_until = if removed.is_none() { Some(now + RECLAIM_QUIET) } else { *quiet_until };
                    *state = State::Idle { quiet_until };
                    return removed.map_or(Reclaimed::Nothing, Reclaimed::Freed);
                }
                if now.saturating_duration_since(*since) < RECLAIM_WAIT {
                    Reclaimed::Running
                } else {
                    Reclaimed::Nothing
                }
            }
            State::Idle { quiet_until } => {
                let quiet_until = quiet_until.filter(|until| now < *until);
                // Asked only where it can run: what it takes on is removed by it alone.
                let Some(handle) = &self.handle else { return Reclaimed::Nothing };
                let Some(work) = work(quiet_until.is_some()) else { return Reclaimed::Nothing };
                *state = State::Running { since: now, task: handle.spawn(work), quiet_until };
                Reclaimed::Running
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn settle(reclaim: &NodeReclaim) -> Reclaimed {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let said = reclaim.poll(|_| None::<std::future::Ready<Removed>>);
            if said != Reclaimed::Running {
                return said;
            }
        }
        Reclaimed::Running
    }

    #[tokio::test(start_paused = true)]
    async fn a_reclaim_runs_once_says_what_it_removed_and_after_nothing_leaves_the_images_alone_for_a_while() {
        let reclaim = NodeReclaim::new();
        let nothing = |_| None::<std::future::Ready<Removed>>;
        assert_eq!(reclaim.poll(nothing), Reclaimed::Nothing, "nothing to do");
        assert_eq!(reclaim.poll(|quiet| (!quiet).then_some(async { Some(0) })), Reclaimed::Running);
        assert_eq!(settle(&reclaim).await, Reclaimed::Freed(0), "removed, though its bytes are not known");
        assert_eq!(reclaim.poll(|quiet| (!quiet).then_some(async { None })), Reclaimed::Running);
        assert_eq!(settle(&reclaim).await, Reclaimed::Nothing);
        // Quiet: the images are left alone; what else there is still goes, and the quiet stays.
        let mut told = None;
        assert_eq!(
            reclaim.poll(|quiet| {
                told = Some(quiet);
                None::<std::future::Ready<Removed>>
            }),
            Reclaimed::Nothing
        );
        assert_eq!(told, Some(true));
        assert_eq!(reclaim.poll(|_| Some(async { Some(7) })), Reclaimed::Running);
        assert_eq!(settle(&reclaim).await, Reclaimed::Freed(7));
        reclaim.poll(|quiet| {
            told = Some(quiet);
            None::<std::future::Ready<Removed>>
        });
        assert_eq!(told, Some(true), "still quiet");
        tokio::time::advance(RECLAIM_QUIET).await;
        reclaim.poll(|quiet| {
            told = Some(quiet);
            None::<std::future::Ready<Removed>>
        });
        assert_eq!(told, Some(false));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reclaim_that_hangs_holds_evictions_off_for_a_while_only() {
        let reclaim = NodeReclaim::new();
        let nothing = |_| None::<std::future::Ready<Removed>>;
        assert_eq!(reclaim.poll(|_| Some(std::future::pending::<Removed>())), Reclaimed::Running);
        tokio::time::advance(RECLAIM_WAIT - Duration::from_millis(1)).await;
        assert_eq!(reclaim.poll(nothing), Reclaimed::Running);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(reclaim.poll(nothing), Reclaimed::Nothing);
    }
}
