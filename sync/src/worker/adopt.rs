//! What a pod's worker finds of a pod an earlier daemon ran (its saved state, its placement, sandbox and running
//! containers), for the state machine to restore; and the state saved for the next daemon.

use std::collections::BTreeMap;

use jiff::Timestamp;
use tokio::time::Instant;

use super::lifecycle::{Found, Input, Lifecycle, PodState, Reason};
use super::{Sandbox, Worker};
use crate::state::{self, SavedContainer, SavedPod};
use nodewarden_runtime::{MainProcess, RunningSandbox, Runtime, SandboxRuntime};

/// The state to save for the next daemon; `now` is the same moment on the worker's clock and the wall clock, to
/// save a deletion's deadline as a time.
pub(super) fn saved(pod: &Lifecycle, now: (Instant, Timestamp)) -> SavedPod {
    let containers = pod
        .containers
        .iter()
        .map(|c| {
            let running = c.running();
            let saved = SavedContainer {
                restarts: c.restarts,
                pid: running.map(|r| r.pid),
                pid_start: running.and_then(|r| r.pid_start),
                started_at: running.map(|r| r.started_at),
                last: c.last_exit.as_ref().map(|l| l.info.clone()),
                id: running.map(|r| r.id.clone()),
                last_id: c.last_exit.as_ref().and_then(|l| l.container_id.clone()),
            };
            (c.name.clone(), saved)
        })
        .collect();
    // A pod the node's shutdown terminated starts again with the node.
    SavedPod {
        uid: None,
        containers,
        start_time: pod.start_time,
        terminal: pod.terminal().filter(|t| !t.is_shutdown()),
        deletion_deadline: match &pod.state {
            PodState::Terminating { reason: Reason::Deleted, deadline, .. } => {
                let left = deadline.saturating_duration_since(now.0);
                now.1.checked_add(left).ok()
            }
            _ => None,
        },
    }
}

impl<R: Runtime> Worker<R> {
    /// Takes over what an earlier daemon left, for [`Input::Restore`]: a pod that was over is found over; a
    /// placed pod is placed again, its volumes and sandbox made ready, and its running containers adopted (no
    /// process is started for them). `None` when there is nothing to take over.
    pub(super) async fn adopt(&mut self) -> Option<Input> {
        let root = self.shared.settings.root_dir.clone();
        let saved = state::load(&root, &self.uid);
        let mut found = Found { saved, sandbox: false, running: BTreeMap::new(), at: Timestamp::now() };
        if let Some(terminal) = &found.saved.terminal {
            // A pod that ended on its own keeps its sandbox, stopped (again: the earlier daemon may have ended
            // before it did), with its exited containers, until it is deleted; an evicted pod's went at once.
            if !terminal.is_evicted() {
                if let Some(sandboxes) = self.shared.runtime.sandboxes() {
                    sandboxes.stop_sandboxes(&self.uid).await;
                    self.sandbox = Sandbox::Stopped;
                }
                self.shared.dead.pod_over(&self.uid);
            }
            return Some(Input::Restore(Box::new(found)));
        }
        if !self.shared.ledger.view().is_placed(&self.uid) {
            return None;
        }
        match self.shared.ledger.place(self.pod.clone()).await {
            Ok(p) => self.placement = Some(p),
            Err(e) => {
                tracing::warn!(pod_uid = %self.uid, error = %e, "cannot place an adopted pod again");
                return None;
            }
        }
        match self.preparing(true).await {
            Ok(prepared) => self.volumes = prepared,
            Err(e) => tracing::warn!(pod = %self.full_name(), error = %e, "cannot prepare an adopted pod's volumes"),
        }
        let sandbox = match (self.shared.runtime.sandboxes(), self.sandbox_spec()) {
            (None, _) => Some(RunningSandbox { id: self.uid.clone(), ips: Vec::new() }),
            (Some(sandboxes), Some(spec)) => sandboxes.adopt_sandbox(&spec).await,
            (Some(_), None) => None,
        };
        found.sandbox = sandbox.is_some();
        if let Some(running) = sandbox {
            self.sandbox = Sandbox::Running(running);
        } else {
            // The runtime lost the sandbox, and its containers with it: a new one is made.
            tracing::warn!(pod = %self.full_name(), "no ready sandbox found for an adopted pod; creating a new one");
            self.sandbox = Sandbox::Requested;
        }
        for i in 0..self.lifecycle.containers.len() {
            let name = self.lifecycle.containers[i].name.clone();
            let s = found.saved.containers.get(&name).cloned().unwrap_or_default();
            let main = s.pid.map(|pid| MainProcess { pid, start: s.pid_start });
            if found.sandbox
                && let Ok(spec) = self.build_spec(i, s.restarts, None)
                && let Some(started) = self.shared.runtime.adopt(&spec, main).await
            {
                tracing::info!(pod = %self.full_name(), container = %name, pid = started.pid, "adopted running container");
                let started = self.attach(started, &name, s.restarts);
                found.running.insert(i, started);
            } else if let Some(main) = main.filter(|m| m.pid != 0) {
                tracing::info!(pod = %self.full_name(), container = %name, pid = main.pid, "container ended while nodewarden was not running");
            }
        }
        self.report.created = None;
        Some(Input::Restore(Box::new(found)))
    }
}
