//! The ledger's single writer: [`Ledger`] owns the [`ResourceManager`], and what pod sync, the eviction loop and
//! the daemon ask of it runs one request at a time, in the order asked, on a thread of the blocking pool. No lock
//! of the ledger is held on a thread of the async runtime, so a cgroup write, or a systemd D-Bus round trip under
//! the systemd driver, never stalls the tasks that share that thread; at most one blocking thread works for the
//! ledger at a time, however many pods wait for it. What the eviction loop and the scrapes read is the published
//! [`LedgerView`], which no request waits for.

use std::sync::Arc;

use tokio::sync::{Mutex, Semaphore};

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

/// The handle on the ledger; clones share it.
#[derive(Debug, Clone)]
pub struct Ledger {
    /// Fair: requests are served in the order they were made.
    manager: Arc<Mutex<ResourceManager>>,
    /// Placements being written, at most [`MAX_WRITES`].
    writes: Arc<Semaphore>,
    view: LedgerView,
}

impl Ledger {
    /// The ledger of `manager`, which it owns from now on.
    pub fn new(manager: ResourceManager) -> Self {
        let view = manager.view();
        Self { manager: Arc::new(Mutex::new(manager)), writes: Arc::new(Semaphore::new(MAX_WRITES)), view }
    }

    /// The ledger as published after its last change.
    pub fn view(&self) -> &LedgerView {
        &self.view
    }

    /// Runs `f` on a blocking thread once the requests made before have run; what it returned.
    pub async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut ResourceManager) -> T + Send + 'static,
    ) -> Result<T, LedgerError> {
        let mut manager = self.manager.clone().lock_owned().await;
        // A request that panics is the requester's failure; the ledger is released and carries on.
        tokio::task::spawn_blocking(move || f(&mut manager)).await.map_err(|_| LedgerError)
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

    /// Runs `f` on the calling thread, once the requests made before have run: for a caller outside the async
    /// runtime (the daemon's start, a blocking thread). Never call it from a task: it blocks the thread.
    pub fn call_blocking<T>(&self, f: impl FnOnce(&mut ResourceManager) -> T) -> T {
        f(&mut self.manager.blocking_lock())
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

    #[tokio::test]
    async fn requests_are_served_in_the_order_made() {
        let (_host, ledger) = ledger();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
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
        let panicked = ledger.call(|_| -> u32 { panic!("a bug in a request") }).await;
        assert_eq!(panicked, Err(LedgerError));
        let released: Result<(), PlaceError> = ledger.try_call(|m| m.release("nobody")).await;
        assert!(matches!(released, Err(PlaceError::NotPlaced(_))), "the ledger still answers: {released:?}");
    }

    #[test]
    fn a_blocking_caller_is_served_and_the_view_follows_the_ledger() {
        let (_host, ledger) = ledger();
        let memory = NodePressure::of([Condition::MemoryPressure]);
        ledger.call_blocking(|m| m.view().set_pressure(memory));
        assert!(ledger.view().pressure().contains(Condition::MemoryPressure));
    }
}
