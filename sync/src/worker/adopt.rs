//! Taking over a pod an earlier daemon ran, from its saved state and the containers that still run; and the
//! state saved for the next daemon.

use jiff::Timestamp;
use tokio::time::Instant;

use super::lifecycle::{
    ContainerSlot, ContainerState, LastExit, Lifecycle, PodState, PrepareStep, Reason, Resume, Role,
};
use super::{Sandbox, Worker};
use crate::state::{self, SavedContainer, SavedPod};
use nodewarden_runtime::{ExitInfo, MainProcess, RunningSandbox, Runtime, SandboxRuntime};

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

/// The saved counts and exits, restored into a container that is not running.
fn restore(c: &mut ContainerSlot, saved: &SavedContainer) {
    c.restarts = saved.restarts;
    c.last_exit = saved.last.clone().map(|info| LastExit { info, container_id: None });
}

impl<R: Runtime> Worker<R> {
    /// Takes over what an earlier daemon left: a pod that was over stays over; a placed pod is placed again and
    /// its running containers are adopted, no process is started for them. Returns false when there was nothing
    /// to take over.
    pub(super) async fn adopt(&mut self) -> bool {
        let root = self.shared.settings.root_dir.clone();
        let saved = state::load(&root, &self.uid);
        if let Some(terminal) = saved.terminal.clone() {
            self.lifecycle.state = PodState::Finished(terminal);
            self.link.permit = None;
            return true;
        }
        if self.shared.resources().placement(&self.uid).is_none() {
            return false;
        }
        let res = self.shared.resources().place(&self.pod);
        match res {
            Ok(p) => self.placement = Some(p),
            Err(e) => {
                tracing::warn!(pod_uid = %self.uid, error = %e, "cannot place an adopted pod again");
                return false;
            }
        }
        self.lifecycle.start_time = saved.start_time;
        match self.preparing().await {
            Ok(prepared) => self.volumes = prepared,
            Err(e) => tracing::warn!(pod = %self.full_name(), error = %e, "cannot prepare an adopted pod's volumes"),
        }
        let sandbox = match (self.shared.runtime.sandboxes(), self.sandbox_spec()) {
            (None, _) => Some(RunningSandbox { id: self.uid.clone(), ips: Vec::new() }),
            (Some(sandboxes), Some(spec)) => sandboxes.adopt_sandbox(&spec).await,
            (Some(_), None) => None,
        };
        let sandbox_lost = sandbox.is_none();
        if let Some(running) = sandbox {
            self.sandbox = Sandbox::Running(running);
        } else {
            // The runtime lost the sandbox, and its containers with it: a new one is made.
            tracing::warn!(pod = %self.full_name(), "no ready sandbox found for an adopted pod; creating a new one");
            self.sandbox = Sandbox::Requested;
        }
        let now = Instant::now();
        let mut any_app = false;
        for i in 0..self.lifecycle.containers.len() {
            let name = self.lifecycle.containers[i].name.clone();
            let s = saved.containers.get(&name).cloned().unwrap_or_default();
            restore(&mut self.lifecycle.containers[i], &s);
            let role = self.lifecycle.containers[i].role;
            let main = s.pid.map(|pid| MainProcess { pid, start: s.pid_start });
            if !sandbox_lost
                && let Ok(spec) = self.build_spec(i, s.restarts, false)
                && let Some(mut started) = self.shared.runtime.adopt(&spec, main).await
            {
                started.started_at = s.started_at.unwrap_or(started.started_at);
                tracing::info!(pod = %self.full_name(), container = %name, pid = started.pid, "adopted running container");
                let running = self.attach(started, &name, s.restarts).running(now);
                self.lifecycle.containers[i].state = ContainerState::Running(running);
                any_app |= role == Role::App;
            } else if let Some(main) = main.filter(|m| m.pid != 0) {
                // It ran when the earlier daemon stopped and its main process is gone: it ended unseen, and is
                // restarted (or not) under the restart policy, as an exit.
                tracing::info!(pod = %self.full_name(), container = %name, pid = main.pid, "container ended while nodewarden was not running");
                let started_at = s.started_at.unwrap_or_else(Timestamp::now);
                let info = ExitInfo::unknown(
                    "the container's main process ended while nodewarden was not running; its exit code is unknown",
                    started_at,
                );
                self.lifecycle.containers[i].last_exit = Some(LastExit { info, container_id: None });
            }
            any_app |= role == Role::App && self.lifecycle.containers[i].last_exit.is_some();
        }
        let policy = self.lifecycle.policy;
        for c in &mut self.lifecycle.containers {
            let done = match c.role {
                // App containers ran, so initialisation was over.
                Role::Init => any_app || c.exited_ok(),
                Role::Sidecar => false,
                Role::App => c.last_exit.as_ref().is_some_and(|l| !policy.restarts(l.info.exit_code)),
            };
            if done && c.running().is_none() {
                c.state = ContainerState::Exited;
            }
        }
        let then = if any_app { Resume::Running } else { Resume::Initializing };
        self.lifecycle.state = match (sandbox_lost, then) {
            (true, then) => PodState::Preparing { step: PrepareStep::Sandbox, then },
            (false, Resume::Running) => PodState::Running,
            (false, Resume::Initializing) => PodState::Initializing,
        };
        self.report.created = None;
        self.save().await;
        true
    }
}
