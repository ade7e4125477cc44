//! Ending a pod: graceful termination (preStop hooks, SIGTERM, the grace period, then `cgroup.kill` on the pod
//! cgroup) and the clean-up that follows: the cgroups released, the volumes unmounted and removed.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use nodewarden_resources::{PlaceError, ResourceManager};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::{Event, Reason, Terminal, Worker};
use crate::runtime::{Runtime, SIGKILL};
use crate::volumes;

/// How long the pod's processes get to disappear after `cgroup.kill` before the release is given up for now.
const KILL_WAIT: Duration = Duration::from_secs(5);

impl<R: Runtime> Worker<R> {
    /// Terminates the pod: preStop hooks and SIGTERM within the grace period, then `cgroup.kill`. A deleted pod's
    /// directory and logs are removed; an evicted pod stays `Failed` with reason `Evicted`.
    pub(super) async fn terminate(
        &mut self,
        grace: Option<Duration>,
        reason: Reason,
        signalled: Option<oneshot::Sender<()>>,
        events: &mut mpsc::UnboundedReceiver<Event>,
    ) {
        let grace = grace.unwrap_or_else(|| self.grace_period());
        let running = self.containers.iter().any(|c| c.run.is_some());
        if self.placement.is_some() {
            self.ctx.resources().set_terminating(&self.uid);
            tracing::info!(pod = %self.full_name(), ?grace, ?reason, "terminating pod");
        }
        // Nothing restarts from here on.
        self.terminal = Some(match &reason {
            Reason::Evicted(message) => {
                Terminal { phase: "Failed".into(), reason: Some("Evicted".into()), message: Some(message.clone()) }
            }
            Reason::Deleted => {
                self.terminal.clone().unwrap_or(Terminal { phase: "Running".into(), reason: None, message: None })
            }
        });
        self.publish();
        if running {
            self.stop_all(grace, signalled, events).await;
            self.kill_rest(events).await;
        } else if let Some(s) = signalled {
            let _ = s.send(());
        }
        self.clean_up(reason == Reason::Deleted).await;
        self.publish();
    }

    /// Runs the preStop hooks, sends SIGTERM, and waits until every container has exited or the grace period is
    /// over; the caller kills what is left.
    async fn stop_all(
        &mut self,
        grace: Duration,
        signalled: Option<oneshot::Sender<()>>,
        events: &mut mpsc::UnboundedReceiver<Event>,
    ) {
        let deadline = Instant::now() + grace;
        let mut hooks = Vec::new();
        for c in &self.containers {
            let (Some(run), Some(container)) = (c.run.as_ref(), self.container(c)) else { continue };
            let argv = container
                .lifecycle
                .as_ref()
                .and_then(|l| l.pre_stop.as_ref())
                .and_then(|h| h.exec.as_ref())
                .and_then(|e| e.command.clone());
            let runtime = self.ctx.runtime.clone();
            let spec = run.spec.clone();
            let id = run.id.clone();
            hooks.push(async move {
                if let Some(argv) = argv {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match runtime.exec(&id, &spec, &argv, left).await {
                        Ok(out) if out.exit_code == Some(0) => {}
                        Ok(out) => tracing::warn!(container = %spec.name, output = %out.output, "preStop hook failed"),
                        Err(e) => tracing::warn!(container = %spec.name, error = %e, "preStop hook failed"),
                    }
                }
                let grace = deadline.saturating_duration_since(Instant::now());
                if let Err(e) = runtime.stop(&id, grace) {
                    tracing::debug!(container_id = %id, error = %e, "SIGTERM not delivered");
                }
            });
        }
        let _ = tokio::time::timeout_at(deadline, futures_util::future::join_all(hooks)).await;
        if let Some(s) = signalled {
            let _ = s.send(());
        }
        while self.containers.iter().any(|c| c.run.is_some()) {
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Ok(Some(ev @ Event::Exited { .. })) => self.handle(ev),
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
    }

    /// After the grace period: `cgroup.kill` on what still runs, and the exits recorded (137 for SIGKILL), so the
    /// pod's status shows how its containers ended.
    async fn kill_rest(&mut self, events: &mut mpsc::UnboundedReceiver<Event>) {
        if !self.containers.iter().any(|c| c.run.is_some()) {
            return;
        }
        let killed = self.ctx.resources().kill(&self.uid);
        if let Err(e) = killed {
            tracing::warn!(pod = %self.full_name(), error = %e, "cgroup.kill failed");
        }
        // The main processes too, through the runtime (a runtime may keep them outside the pod cgroup).
        for run in self.containers.iter().filter_map(|c| c.run.as_ref()) {
            let _ = self.ctx.runtime.signal(&run.id, SIGKILL);
        }
        let deadline = Instant::now() + KILL_WAIT;
        while self.containers.iter().any(|c| c.run.is_some()) {
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Ok(Some(ev @ Event::Exited { .. })) => self.handle(ev),
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
    }

    /// Kills whatever is left in the pod cgroup, releases the cgroups, and removes the pod's volumes (and, when
    /// deleted, its logs).
    async fn clean_up(&mut self, deleted: bool) {
        if let Some(spec) = self.sandbox_spec()
            && self.sandbox.take().is_some()
        {
            self.ctx.runtime.remove_sandbox(&spec).await;
        }
        if self.placement.is_some() && kill_and_release(&self.ctx.resources, &self.uid).await {
            self.placement = None;
        }
        // Whatever the containers left: their exits were seen or they were killed with the cgroup.
        for c in &mut self.containers {
            if let Some(run) = c.run.take() {
                self.ctx.runtime.remove(&run.id);
            }
        }
        let root = self.ctx.settings.root_dir.clone();
        if let Err(e) = volumes::remove_pod_dir(&root, &self.uid) {
            tracing::warn!(pod = %self.full_name(), error = %e, "cannot remove the pod's volumes");
        }
        if deleted {
            let logs = self.ctx.settings.log_dir.join(crate::spec::pod_log_dir_name(&self.pod));
            if let Err(e) = std::fs::remove_dir_all(&logs)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(dir = %logs.display(), error = %e, "cannot remove the pod's logs");
            }
        } else {
            self.save();
        }
        self.release_name();
    }

    /// The pod ended on its own (all containers done, or an init container failed under `Never`): stop what is
    /// left (sidecars), release its resources, and keep its final status.
    pub(super) async fn finish(&mut self, terminal: Terminal) {
        tracing::info!(pod = %self.full_name(), phase = %terminal.phase, "pod finished");
        self.terminal = Some(terminal);
        let grace = self.grace_period();
        for c in &self.containers {
            if let Some(run) = &c.run {
                let _ = self.ctx.runtime.stop(&run.id, grace);
            }
        }
        self.clean_up(false).await;
    }

    /// Lets the next pod of the same name start.
    pub(super) fn release_name(&mut self) {
        self.permit = None;
    }
}

/// Kills whatever is left in a pod's cgroup (`cgroup.kill`) and releases its cgroups, retrying while the killed
/// processes exit, for at most [`KILL_WAIT`]. Returns true once the pod is no longer placed.
pub(crate) async fn kill_and_release(resources: &Mutex<ResourceManager>, uid: &str) -> bool {
    let lock = || resources.lock().unwrap_or_else(PoisonError::into_inner);
    let kill = lock().kill(uid);
    if let Err(e) = kill {
        tracing::warn!(pod_uid = %uid, error = %e, "cgroup.kill failed");
    }
    let until = Instant::now() + KILL_WAIT;
    loop {
        let released = lock().release(uid);
        match released {
            Ok(()) | Err(PlaceError::NotPlaced(_)) => return true,
            Err(e) if Instant::now() >= until => {
                tracing::warn!(pod_uid = %uid, error = %e, "cannot release the pod's cgroups yet");
                return false;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}
