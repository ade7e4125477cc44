//! Ending a pod, for the executor: preStop hooks and SIGTERM within the grace period, `cgroup.kill` at its end,
//! and the clean-up that follows (the sandbox removed, the cgroups released, the volumes unmounted and removed).

use std::future::Future;
use std::pin::{Pin, pin};

use std::task::Poll;
use std::time::Duration;

use futures_util::future::join_all;
use k8s_openapi::api::core::v1::{Container, Pod};
use nodewarden_resources::{Ledger, PlaceError};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::lifecycle::KILL_WAIT;
use super::{Event, Sandbox, Worker};
use crate::volumes;
use nodewarden_runtime::{ContainerId, Runtime, SandboxRuntime};

/// The command of a container's exec preStop hook: the one hook the worker runs (a hook without a command runs
/// nothing).
fn exec_pre_stop(container: &Container) -> Option<&Vec<String>> {
    container.lifecycle.as_ref()?.pre_stop.as_ref()?.exec.as_ref()?.command.as_ref()
}

/// Whether any container of the pod has a preStop hook the worker would run before its stop signal.
pub(super) fn has_pre_stop(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|spec| {
        spec.init_containers.iter().flatten().chain(&spec.containers).any(|c| exec_pre_stop(c).is_some())
    })
}

/// Polls `stops` once, which sends each container's stop signal, then tells the worker the signals went out (the
/// requesters are told while the stops wait for the exits). Returns whether the stops still wait.
async fn signal_stops<F: Future>(mut stops: Pin<&mut F>, events: &mpsc::UnboundedSender<Event>) -> bool {
    let waiting = std::future::poll_fn(|cx| Poll::Ready(stops.as_mut().poll(cx).is_pending())).await;
    let _ = events.send(Event::Signalled(Instant::now()));
    waiting
}

impl<R: Runtime> Worker<R> {
    /// The preStop hook of the container running as `id`, if it has an exec one.
    fn pre_stop(&self, id: &ContainerId) -> Option<Vec<String>> {
        let i = self.lifecycle.index_of(id)?;
        let name = &self.lifecycle.containers[i].name;
        let spec = self.pod.spec.as_ref()?;
        spec.init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .find(|c| &c.name == name)
            .and_then(exec_pre_stop)
            .cloned()
    }

    /// Runs the preStop hooks, then stops each container with what is left of the grace period. Reports
    /// [`Event::Signalled`] once the stop calls have gone out; the exits arrive through the watchers.
    pub(super) async fn stop_all(&mut self, ids: Vec<ContainerId>, deadline: Instant) {
        let hooks: Vec<_> = ids.iter().map(|id| (id.clone(), self.pre_stop(id))).collect();
        let runtime = self.shared.runtime.clone();
        let events = self.link.events.clone();
        self.waiting.awaiting_signal = true;
        let stop_each = {
            let runtime = runtime.clone();
            move |ids: Vec<ContainerId>| {
                join_all(ids.into_iter().map(move |id| {
                    let runtime = runtime.clone();
                    async move {
                        let grace = deadline.saturating_duration_since(Instant::now());
                        if let Err(e) = runtime.stop(&id, grace).await {
                            tracing::debug!(container_id = %id, error = %e, "cannot stop the container");
                        }
                    }
                }))
            }
        };
        if hooks.iter().all(|(_, hook)| hook.is_none()) {
            // No hook to wait for (an eviction's usual case): the stop signals go out now, before the worker does
            // anything else; the rest of each stop (the wait for the exit) goes on in the background.
            let mut stops = Box::pin(stop_each(ids));
            if signal_stops(stops.as_mut(), &events).await {
                self.tasks.stopping.spawn(async move {
                    stops.await;
                });
            }
            return;
        }
        self.tasks.stopping.spawn(async move {
            let runtime = &*runtime;
            let run_hooks =
                hooks.iter().filter_map(|(id, argv)| Some((id, argv.as_ref()?))).map(|(id, argv)| async move {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match runtime.exec(id, argv, left).await {
                        Ok(out) if out.exit_code == Some(0) => {}
                        Ok(out) => tracing::warn!(container_id = %id, output = %out.output, "preStop hook failed"),
                        Err(e) => tracing::warn!(container_id = %id, error = %e, "preStop hook failed"),
                    }
                });
            let _ = tokio::time::timeout_at(deadline, join_all(run_hooks)).await;
            let mut stops = pin!(stop_each(ids));
            if signal_stops(stops.as_mut(), &events).await {
                stops.await;
            }
        });
    }

    /// After the grace period: `cgroup.kill` on the pod, and a kill of each container through the runtime (a
    /// runtime may keep them outside the pod cgroup).
    pub(super) async fn kill_all(&mut self, ids: Vec<ContainerId>) {
        let uid = self.uid.clone();
        let killed = self.shared.ledger.try_call(move |m| m.kill(&uid)).await;
        if let Err(e) = killed {
            tracing::warn!(pod = %self.full_name(), error = %e, "cgroup.kill failed");
        }
        for id in ids {
            let runtime = self.shared.runtime.clone();
            self.tasks.background.spawn(async move {
                let _ = runtime.stop(&id, Duration::ZERO).await;
            });
        }
    }

    /// Removes the sandbox (stops it only, when `keep_containers`), kills whatever is left in the pod cgroup and
    /// releases the cgroups, and removes the pod's volumes (and, when deleted, its logs). Its dead containers go
    /// too, unless `keep_containers`.
    pub(super) async fn clean_up(&mut self, deleted: bool, keep_containers: bool) {
        self.tasks.stopping.abort_all();
        // A preparation of the volumes that a termination abandoned runs on to its end first: removing them under
        // it would leave what it makes after behind.
        let _volumes = self.tasks.volumes.clone().lock_owned().await;
        self.waiting.awaiting_signal = false;
        if let Some(sandboxes) = self.shared.runtime.sandboxes()
            && !matches!(self.sandbox, Sandbox::None)
        {
            if keep_containers {
                sandboxes.stop_sandboxes(&self.uid).await;
                self.sandbox = Sandbox::Stopped;
            } else {
                sandboxes.remove_sandboxes(&self.uid).await;
                self.sandbox = Sandbox::None;
            }
        } else {
            self.sandbox = Sandbox::None;
        }
        let released = self.placement.is_none() || kill_and_release(&self.shared.ledger, &self.uid).await;
        if released {
            self.placement = None;
        }
        // What still ran goes with it, and its dead containers unless they are kept (under CRI a removed sandbox
        // took them already).
        let mut ids: Vec<_> = self.tasks.containers.drain().map(|(id, _)| id).collect();
        if keep_containers {
            self.shared.dead.pod_over(&self.uid);
        } else {
            ids.extend(self.shared.dead.pod_gone(&self.uid));
        }
        super::remove_dead(&*self.shared.runtime, ids).await;
        let root = &self.shared.settings.root_dir;
        // A pod whose cgroup could not be released keeps its directory, its mark included: the next start finds
        // both and finishes the job. A pod that is over but not deleted keeps its state and terminal record,
        // written in place, so that its end survives a restart on a full disk.
        let removed = if !released {
            Ok(())
        } else if deleted {
            volumes::remove_pod_dir(root, &self.uid)
        } else {
            volumes::remove_pod_volumes(root, &self.uid)
        };
        if let Err(e) = removed {
            tracing::warn!(pod = %self.full_name(), error = %e, "cannot remove the pod's volumes");
        }
        if deleted {
            let logs = self.shared.settings.log_dir.join(crate::spec::pod_log_dir_name(&self.pod));
            if let Err(e) = std::fs::remove_dir_all(&logs)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(dir = %logs.display(), error = %e, "cannot remove the pod's logs");
            }
        }
        tracing::info!(pod = %self.full_name(), deleted, "pod terminated");
    }
}

/// Kills whatever is left in a pod's cgroup (`cgroup.kill`) and releases its cgroups, retrying while the killed
/// processes exit, for at most [`KILL_WAIT`]. Returns true once the pod is no longer placed.
pub(crate) async fn kill_and_release(ledger: &Ledger, uid: &str) -> bool {
    let owned = uid.to_owned();
    if let Err(e) = ledger.try_call(move |m| m.kill(&owned)).await {
        tracing::warn!(pod_uid = %uid, error = %e, "cgroup.kill failed");
    }
    let until = Instant::now() + KILL_WAIT;
    loop {
        let owned = uid.to_owned();
        match ledger.try_call(move |m| m.release(&owned)).await {
            Ok(()) | Err(PlaceError::NotPlaced(_)) => return true,
            Err(e) if Instant::now() >= until => {
                tracing::warn!(pod_uid = %uid, error = %e, "cannot release the pod's cgroups yet");
                return false;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}
