//! The ledger's single writer: [`Ledger`] owns the [`ResourceManager`], and what pod sync, the eviction loop and
//! the daemon ask of it runs one request at a time, in the order asked, on a thread of the blocking pool. No lock
//! of the ledger is held on a thread of the async runtime, so a cgroup write, or a systemd D-Bus round trip under
//! the systemd driver, never stalls the tasks that share that thread; at most one blocking thread works for the
//! ledger at a time, however many pods wait for it, and it runs the requests queued meanwhile one after the other
//! without handing back to the runtime between them (100 pods starting at once cost one hand-off, not 200). What
//! the eviction loop and the scrapes read is the published [`LedgerView`], which no request waits for.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{Semaphore, oneshot};

use k8s_openapi::api::core::v1::Pod;

use crate::ledger::{PendingPlacement, PlaceError, Placement, ResourceManager};
use crate::view::LedgerView;

/// A request to the ledger did not complete: it panicked (the ledger carries on), or the async runtime is
/// shutting down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the ledger request did not complete: it panicked, or the daemon is shutting down")]
pub struct LedgerError;

impl From<LedgerError> for PlaceError {
    fn from(_: LedgerError) -> Self {
        PlaceError::Ledger
    }
}

/// The most placements whose cgroups are written at once ([`Ledger::place`]): enough for systemd's round trips to
/// overlap, few enough to leave the blocking pool to container starts and saves.
pub const MAX_WRITES: usize = 8;

/// A placement after the ledger's turn.
enum Begun {
    /// Written and confirmed.
    Done(Box<Placement>),
    /// To be written outside the ledger's turn.
    Writing(Box<PendingPlacement>),
}

/// A queued request, which answers its requester itself.
type Request = Box<dyn FnOnce(&mut ResourceManager) + Send>;

/// The requests not yet run, and whether a thread is running them.
#[derive(Default)]
struct Queue {
    requests: VecDeque<Request>,
    draining: bool,
}

/// What the handles share.
struct Owner {
    /// Locked only by the thread draining the queue.
    manager: Mutex<ResourceManager>,
    queue: Mutex<Queue>,
}

impl std::fmt::Debug for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owner").finish_non_exhaustive()
    }
}

/// A lock whose holder panicked is still good here: a request that panics is caught before it could leave the
/// manager or the queue half changed by the ledger's own code.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Owner {
    /// Queues `request`; whether the caller must start a thread to drain the queue (none is draining it).
    fn push(&self, request: Request) -> bool {
        let mut queue = lock(&self.queue);
        queue.requests.push_back(request);
        !std::mem::replace(&mut queue.draining, true)
    }

    /// Runs the queued requests in order until none is left. A request that panics fails alone: its requester
    /// sees its answer dropped.
    fn drain(&self) {
        loop {
            let request = {
                let mut queue = lock(&self.queue);
                match queue.requests.pop_front() {
                    Some(r) => r,
                    None => {
                        queue.draining = false;
                        return;
                    }
                }
            };
            let mut manager = lock(&self.manager);
            let _ = std::panic::catch_unwind(AssertUnwindSafe(|| request(&mut manager)));
        }
    }
}

/// Drains the queue when dropped: run on a blocking thread, or dropped unrun by a runtime shutting down, so that
/// the queue is never left marked as drained by nobody.
struct Drainer(Arc<Owner>);

impl Drop for Drainer {
    fn drop(&mut self) {
        self.0.drain();
    }
}

/// The handle on the ledger; clones share it.
#[derive(Debug, Clone)]
pub struct Ledger {
    owner: Arc<Owner>,
    /// Placements being written, at most [`MAX_WRITES`].
    writes: Arc<Semaphore>,
    view: LedgerView,
}

impl Ledger {
    /// The ledger of `manager`, which it owns from now on.
    pub fn new(manager: ResourceManager) -> Self {
        let view = manager.view();
        let owner = Owner { manager: Mutex::new(manager), queue: Mutex::default() };
        Self { owner: Arc::new(owner), writes: Arc::new(Semaphore::new(MAX_WRITES)), view }
    }

    /// The ledger as published after its last change.
    pub fn view(&self) -> &LedgerView {
        &self.view
    }

    /// Runs `f` on a blocking thread once the requests made before have run; what it returned. A request whose
    /// caller stopped waiting (its task aborted, as pod sync's workers are at shutdown) is skipped when its turn
    /// comes, as it would not have run had it waited for a lock. The thread that runs a busy spell's requests is
    /// one of the blocking pool of the runtime whose request began the spell (the eviction loop's own thread when
    /// its request finds the ledger idle): a spell never waits for the OS to give it a thread.
    pub async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut ResourceManager) -> T + Send + 'static,
    ) -> Result<T, LedgerError> {
        let (answer, answered) = oneshot::channel();
        let request: Request = Box::new(move |m| {
            if !answer.is_closed() {
                let _ = answer.send(f(m));
            }
        });
        if self.owner.push(request) {
            let drainer = Drainer(self.owner.clone());
            drop(tokio::task::spawn_blocking(move || drop(drainer)));
        }
        answered.await.map_err(|_| LedgerError)
    }

    /// [`Ledger::call`] of a fallible request, the ledger's failure folded into the request's error.
    pub async fn try_call<T: Send + 'static, E: From<LedgerError> + Send + 'static>(
        &self,
        f: impl FnOnce(&mut ResourceManager) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E> {
        self.call(f).await?
    }

    /// Places a pod ([`ResourceManager::place`]): admitted and recorded in the ledger's turn, its cgroups written
    /// after it (under the systemd driver, a D-Bus round trip per slice), so that other requests, and other pods'
    /// writes, go on meanwhile; then confirmed in the ledger's turn.
    pub async fn place(&self, pod: Pod) -> Result<Placement, PlaceError> {
        self.placed(move |m| m.begin_place(&pod)).await
    }

    /// Rewrites a placed pod's limits ([`ResourceManager::update`]), as [`Ledger::place`] does.
    pub async fn update(&self, pod: Pod) -> Result<Placement, PlaceError> {
        self.placed(move |m| m.begin_update(&pod)).await
    }

    /// Begins a placement with `begin`; under the cgroupfs driver (file writes only: nothing to overlap) it is
    /// written and confirmed in the same turn.
    async fn placed(
        &self,
        begin: impl FnOnce(&mut ResourceManager) -> Result<PendingPlacement, PlaceError> + Send + 'static,
    ) -> Result<Placement, PlaceError> {
        let begun = self
            .try_call(move |m| {
                let pending = begin(m)?;
                if m.uses_systemd() {
                    return Ok(Begun::Writing(Box::new(pending)));
                }
                let written = pending.write();
                m.end_place(pending, written).map(|placed| Begun::Done(Box::new(placed)))
            })
            .await?;
        match begun {
            Begun::Done(placed) => Ok(*placed),
            Begun::Writing(pending) => self.write(*pending).await,
        }
    }

    async fn write(&self, pending: PendingPlacement) -> Result<Placement, PlaceError> {
        // The semaphore is never closed.
        let permit = self.writes.clone().acquire_owned().await.map_err(|_| PlaceError::Ledger)?;
        let writing = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let written = pending.write();
            (pending, written)
        });
        let (pending, written) = match writing.await {
            Ok(done) => done,
            // A panic is the requester's, as if the write had run on its own thread.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => return Err(PlaceError::Ledger),
        };
        self.try_call(move |m| m.end_place(pending, written)).await
    }

    /// Runs `f` once the requests made before have run, on the calling thread if no other is running the ledger's
    /// requests: for a caller outside the async runtime (the daemon's start, a blocking thread). Never call it from
    /// a task: it blocks the thread. A caller that finds the ledger idle runs the requests queued behind its own
    /// too, until none is left.
    pub fn call_blocking<T: Send + 'static>(&self, f: impl FnOnce(&mut ResourceManager) -> T + Send + 'static) -> T {
        let (answer, answered) = std::sync::mpsc::sync_channel(1);
        let request: Request = Box::new(move |m| {
            let _ = answer.send(std::panic::catch_unwind(AssertUnwindSafe(|| f(m))));
        });
        if self.owner.push(request) {
            self.owner.drain();
        }
        match answered.recv() {
            Ok(Ok(out)) => out,
            // The caller's own request panicked: the panic is the caller's, as if it had run on its own.
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(_) => unreachable!("a queued request is always run, and answers unless it panicked"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::ResourceConfig;
    use crate::testing::FakeHost;
    use crate::{CgroupPath, Condition, NodePressure};

    fn ledger() -> (FakeHost, Ledger) {
        let host = FakeHost::new();
        let root = CgroupPath::parse("/nw").unwrap();
        let fs = crate::CgroupFs::emulated(host.cgroup_mount(), root.clone());
        let mut m = ResourceManager::new(fs, host.host(), ResourceConfig::new(root)).unwrap();
        m.setup().unwrap();
        (host, Ledger::new(m))
    }

    /// A first request that holds the ledger until the returned sender is sent to (or dropped), made and running
    /// when this returns, so that what is asked next queues up behind it.
    async fn hold(ledger: &Ledger) -> (std::sync::mpsc::Sender<()>, tokio::task::JoinHandle<Result<(), LedgerError>>) {
        let (release, held) = std::sync::mpsc::channel::<()>();
        let first = tokio::spawn({
            let ledger = ledger.clone();
            async move {
                ledger
                    .call(move |_| {
                        let _ = held.recv();
                    })
                    .await
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        (release, first)
    }

    #[tokio::test]
    async fn requests_are_served_in_the_order_made() {
        let (_host, ledger) = ledger();
        let order = Arc::new(Mutex::new(Vec::new()));
        // The first request holds the ledger until the others have queued up behind it.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let first = tokio::spawn({
            let (ledger, order) = (ledger.clone(), order.clone());
            async move {
                ledger
                    .call(move |_| {
                        held.recv().unwrap();
                        order.lock().unwrap().push(0);
                    })
                    .await
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let mut queued = Vec::new();
        for i in 1..=5 {
            let (ledger, order) = (ledger.clone(), order.clone());
            queued.push(tokio::spawn(async move { ledger.call(move |_| order.lock().unwrap().push(i)).await }));
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        release.send(()).unwrap();
        first.await.unwrap().unwrap();
        for q in queued {
            q.await.unwrap().unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4, 5]);
    }

    #[tokio::test]
    async fn each_request_sees_the_changes_of_those_before() {
        let (_host, ledger) = ledger();
        ledger.call(|m| m.set_shutting_down(true)).await.unwrap();
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [{"name": "app"}]}
        }))
        .unwrap();
        let refused = ledger.call(move |m| m.admit(&pod).map(|_| ())).await.unwrap().unwrap_err();
        assert_eq!(refused.reason(), "NodeShutdown");
    }

    #[tokio::test]
    async fn a_request_that_panics_fails_alone_and_the_ledger_carries_on() {
        let (_host, ledger) = ledger();
        // The panicking request and the one behind it are queued while a first holds the ledger, so that one
        // thread runs all three in one spell.
        let (release, first) = hold(&ledger).await;
        let panicking = tokio::spawn({
            let ledger = ledger.clone();
            async move { ledger.call(|_| -> u32 { panic!("a bug in a request") }).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        let behind = tokio::spawn({
            let ledger = ledger.clone();
            async move { ledger.try_call(|m| m.release("nobody")).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        release.send(()).unwrap();
        let within = std::time::Duration::from_secs(10);
        tokio::time::timeout(within, first).await.expect("the first request ran").unwrap().unwrap();
        let panicked = tokio::time::timeout(within, panicking).await.expect("the panicking request ended").unwrap();
        assert_eq!(panicked, Err(LedgerError));
        let released: Result<(), PlaceError> =
            tokio::time::timeout(within, behind).await.expect("the request behind the panic ran").unwrap();
        assert!(matches!(released, Err(PlaceError::NotPlaced(_))), "the ledger still answers: {released:?}");
        // And a request in a spell of its own after it.
        let again = tokio::time::timeout(within, ledger.call(|m| m.config().max_pods)).await;
        assert!(matches!(again, Ok(Ok(_))), "the ledger carries on: {again:?}");
    }

    #[tokio::test]
    async fn a_request_whose_caller_stopped_waiting_is_skipped() {
        let (_host, ledger) = ledger();
        let (release, first) = hold(&ledger).await;
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let abandoned = tokio::spawn({
            let (ledger, ran) = (ledger.clone(), ran.clone());
            async move { ledger.call(move |_| ran.store(true, std::sync::atomic::Ordering::SeqCst)).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        abandoned.abort();
        assert!(abandoned.await.unwrap_err().is_cancelled());
        release.send(()).unwrap();
        first.await.unwrap().unwrap();
        // A request after it has run once the abandoned one had its turn.
        ledger.call(|_| ()).await.unwrap();
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst), "the request of an aborted caller ran");
    }

    #[test]
    fn requests_made_while_the_runtime_shuts_down_are_still_served() {
        let (_host, ledger) = ledger();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let handle = rt.handle().clone();
        drop(rt);
        // The blocking pool refuses the drainer; dropping it unrun drains the queue on the caller's thread instead.
        let (done, answered) = std::sync::mpsc::channel();
        std::thread::spawn({
            let ledger = ledger.clone();
            move || {
                let served = handle.block_on(ledger.call(|m| m.config().max_pods)).is_ok();
                let again = ledger.call_blocking(|_| true);
                let _ = done.send((served, again));
            }
        });
        let within = std::time::Duration::from_secs(10);
        let (served, again) = answered.recv_timeout(within).expect("the request was left queued");
        assert!(served, "the request was dropped unrun");
        assert!(again, "the queue is not left marked as drained by nobody");
    }

    #[test]
    fn a_blocking_caller_behind_a_request_waits_its_turn_and_its_panic_is_its_own() {
        let (_host, ledger) = ledger();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (inside, entered) = std::sync::mpsc::channel::<()>();
        let first = rt.spawn({
            let ledger = ledger.clone();
            async move {
                ledger
                    .call(move |m| {
                        inside.send(()).unwrap();
                        held.recv().unwrap();
                        m.view().set_pressure(NodePressure::of([Condition::MemoryPressure]));
                    })
                    .await
            }
        });
        let driver = std::thread::spawn(move || rt.block_on(first));
        entered.recv().unwrap();
        // A second request, queued but not running, whose change the blocking caller must see.
        let second = {
            let ledger = ledger.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(ledger.call(|m| m.view().set_pressure(NodePressure::of([Condition::DiskPressure]))))
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        let blocked = std::thread::spawn({
            let ledger = ledger.clone();
            move || ledger.call_blocking(|m| m.pressure())
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!blocked.is_finished(), "the blocking caller jumped the queue");
        release.send(()).unwrap();
        driver.join().unwrap().unwrap().unwrap();
        second.join().unwrap().unwrap();
        let seen = blocked.join().unwrap();
        assert!(seen.contains(Condition::DiskPressure), "the blocking caller ran before the queued request: {seen:?}");

        let panicked = std::panic::catch_unwind(AssertUnwindSafe(|| ledger.call_blocking(|_| panic!("a bug"))));
        assert!(panicked.is_err(), "the blocking caller's panic reaches the caller");
        assert!(ledger.call_blocking(|m| m.pressure().contains(Condition::DiskPressure)), "the ledger carries on");
    }

    #[test]
    fn a_blocking_caller_is_served_and_the_view_follows_the_ledger() {
        let (_host, ledger) = ledger();
        let memory = NodePressure::of([Condition::MemoryPressure]);
        ledger.call_blocking(move |m| m.view().set_pressure(memory));
        assert!(ledger.view().pressure().contains(Condition::MemoryPressure));
    }
}
