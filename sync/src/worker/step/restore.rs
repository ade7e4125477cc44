//! Taking over a pod an earlier daemon ran ([`Input::Restore`](super::Input::Restore)): its saved counts and
//! exits, the containers that still run, and where the pod carries on from. Nothing that still runs is started
//! again; a container that ended while no daemon watched counts as an exit, under the restart policy.

use tokio::time::Instant;

use super::super::lifecycle::{
    Action, ContainerState, Found, LastExit, Lifecycle, PodState, PrepareStep, Resume, Role,
};
use nodewarden_runtime::ExitInfo;

/// The message of a container whose main process ended while no daemon ran.
pub(crate) const ENDED_UNSEEN: &str =
    "the container's main process ended while nodewarden was not running; its exit code is unknown";

impl Lifecycle {
    /// A pod that was over stays over, its last exited containers kept. Otherwise each container gets its saved restart count and last exit; one
    /// found running is adopted (with the start time saved for it), one that ran and is gone ended unseen. The pod
    /// carries on running if an app container ran, else initializing; first with a new sandbox if it was lost.
    pub(super) fn restore(&mut self, found: Found, now: Instant, out: &mut Vec<Action>) {
        if self.state != PodState::AwaitingName {
            return;
        }
        let Found { saved, sandbox, mut running, at } = found;
        if let Some(terminal) = saved.terminal {
            // Its last exited containers are kept again, under the same policy, until the pod is deleted (an
            // evicted pod's went with its end).
            let kept = if terminal.is_evicted() { &[][..] } else { &self.containers[..] };
            for (i, c) in kept.iter().enumerate() {
                let Some(s) = saved.containers.get(&c.name) else { continue };
                if let Some(id) = s.last_id.clone() {
                    let created = s.last.as_ref().map_or(at, super::created);
                    out.push(Action::RetireContainer { index: i, id, created });
                }
            }
            self.state = PodState::Finished(terminal);
            out.push(Action::ReleaseName);
            return;
        }
        self.start_time = saved.start_time;
        let mut any_app = false;
        for (i, c) in self.containers.iter_mut().enumerate() {
            let s = saved.containers.get(&c.name).cloned().unwrap_or_default();
            c.restarts = s.restarts;
            c.last_exit = s.last.map(|info| LastExit { info, container_id: s.last_id.clone() });
            // The dead containers the earlier daemon kept are kept again, oldest first, under the same policy.
            if let Some(id) = s.last_id.clone() {
                let created = c.last_exit.as_ref().map_or(at, |l| super::created(&l.info));
                out.push(Action::RetireContainer { index: i, id, created });
            }
            if let Some(mut started) = running.remove(&i).filter(|_| sandbox) {
                started.started_at = s.started_at.unwrap_or(started.started_at);
                c.state = ContainerState::Running(started.running(now));
            } else if s.pid.is_some_and(|pid| pid != 0) {
                let mut info = ExitInfo::unknown(ENDED_UNSEEN, s.started_at.unwrap_or(at));
                info.finished_at = at;
                let created = super::created(&info);
                c.last_exit = Some(LastExit { info, container_id: s.id.clone() });
                if let Some(id) = s.id.clone() {
                    out.push(Action::RetireContainer { index: i, id, created });
                }
            }
            any_app |= c.role == Role::App && (c.running().is_some() || c.last_exit.is_some());
        }
        let policy = self.policy;
        for c in &mut self.containers {
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
        out.push(Action::Save);
        if !sandbox {
            self.state = PodState::Preparing { step: PrepareStep::Sandbox, then };
            return out.push(Action::RunSandbox);
        }
        self.state = match then {
            Resume::Running => PodState::Running,
            Resume::Initializing => PodState::Initializing,
        };
        self.advance(now, out);
    }
}

#[cfg(test)]
mod tests;
