//! The pod worker's transitions: [`step`] takes the lifecycle and one input and returns the next lifecycle and
//! the actions to carry out. It is pure: the time comes in as `now`, and every effect is an [`Action`].

mod restore;

use std::time::Duration;

use nodewarden_runtime::ContainerId;
use tokio::time::Instant;

use super::lifecycle::{
    Action, ContainerState, Input, KILL_WAIT, LastExit, Lifecycle, MAX_GRACE, PlaceFailure, PodState, PrepareStep,
    Readiness, Reason, Resume, Retry, Role, Stage, StartFailure, after,
};
use crate::backoff::Backoff;
use crate::events::Happened;
use crate::probe::ProbeKind;
use crate::status::{PodPhase, Terminal};

/// The first wait before a failed pod-level step is retried, and the longest.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Moves the pod on by one input.
pub(crate) fn step(mut pod: Lifecycle, input: Input, now: Instant) -> (Lifecycle, Vec<Action>) {
    let mut actions = Vec::new();
    pod.apply(input, now, &mut actions);
    (pod, actions)
}

impl Lifecycle {
    fn apply(&mut self, input: Input, now: Instant, out: &mut Vec<Action>) {
        match input {
            Input::Terminate { grace, reason } => return self.terminate(grace, reason, now, out),
            Input::Unlisted => {
                self.unlisted = true;
                if self.state == PodState::Finalizing {
                    self.state = PodState::Removed;
                    out.push(Action::Forget);
                }
                return;
            }
            Input::SpecUpdate { grace, redefined } => {
                self.grace = grace.min(MAX_GRACE);
                if matches!(self.state, PodState::Preparing { .. } | PodState::Initializing | PodState::Running) {
                    out.push(Action::UpdateResources);
                    for i in redefined {
                        self.redefine(i, now, out);
                    }
                }
                return;
            }
            Input::ContainerExited { id, info } => {
                let Some(i) = self.index_of(&id) else { return };
                self.exited(i, id, info, now, out);
            }
            Input::ProbeResult { id, kind, ok, output } => {
                let Some(i) = self.index_of(&id) else { return };
                self.probed(i, kind, ok, output, out);
            }
            Input::ContainerStarted { index, attempt, result } => {
                let Some(c) = self.containers.get_mut(index) else { return };
                if c.state != ContainerState::Starting {
                    return;
                }
                match result {
                    Ok(started) => {
                        c.restarts = attempt;
                        c.pull_backoff = Backoff::default();
                        c.state = ContainerState::Running(started.running(now));
                        out.extend([
                            Action::Record(Happened::Created(index)),
                            Action::Record(Happened::Started(index)),
                        ]);
                        // Reported once saved: a daemon killed right after it said Running adopts the container
                        // with the start time and restart count it reported.
                        out.push(Action::Save);
                        if self.containers.iter().filter(|c| c.role == Role::App).all(|c| c.running().is_some()) {
                            out.push(Action::ReportStarted);
                        }
                    }
                    Err(StartFailure { reason, message, sandbox_lost }) => {
                        // An image's failure was told by its own event: this one says the reason, as the kubelet's.
                        let by_reason = message.is_empty() || crate::images::REASONS.contains(&reason.as_str());
                        let said = if by_reason { reason.clone() } else { message.clone() };
                        out.push(Action::Record(Happened::StartFailed { index, message: said }));
                        let pull = reason == "ErrImagePull";
                        let retry_at =
                            if pull { c.pull_backoff.pull_retry_at(now) } else { c.backoff.restart_at(now, now) };
                        if pull {
                            out.extend([
                                Action::Record(Happened::ImageBackOff(index)),
                                Action::Record(Happened::StartFailed { index, message: "ImagePullBackOff".into() }),
                            ]);
                        }
                        c.state = ContainerState::StartFailed { reason, message, retry_at };
                        if sandbox_lost && let Some(then) = self.resume_point() {
                            self.state = PodState::Preparing { step: PrepareStep::Sandbox, then };
                            out.push(Action::RunSandbox);
                            return;
                        }
                    }
                }
            }
            Input::NameFree => {
                if self.state == PodState::AwaitingName {
                    self.state = PodState::Admitting;
                    out.push(Action::Place);
                }
                return;
            }
            Input::Restore(found) => return self.restore(*found, now, out),
            Input::Placed(result) => {
                if self.state != PodState::Admitting {
                    return;
                }
                match result {
                    Ok(at) => {
                        self.retry = None;
                        self.start_time.get_or_insert(at);
                        self.state = PodState::Preparing { step: PrepareStep::Volumes, then: Resume::Initializing };
                        out.push(Action::PrepareVolumes);
                    }
                    Err(PlaceFailure::Refused { reason, message }) => {
                        let happened = Happened::Refused { reason: reason.clone(), message: message.clone() };
                        out.push(Action::Record(happened));
                        self.state = PodState::Finished(Terminal::failed(Some(reason), Some(message)));
                        out.push(Action::ReleaseName);
                    }
                    Err(PlaceFailure::Failed(why)) => self.retry_later(why, now),
                }
                return;
            }
            Input::VolumesPrepared(result) => {
                let PodState::Preparing { step: PrepareStep::Volumes, then } = self.state else { return };
                match result {
                    Ok(()) => {
                        self.state = PodState::Preparing { step: PrepareStep::Sandbox, then };
                        out.push(Action::RunSandbox);
                    }
                    Err(why) => {
                        out.push(Action::Record(Happened::FailedMount(why.to_string())));
                        self.retry_later(why.to_string(), now);
                    }
                }
                return;
            }
            Input::SandboxReady(result) => {
                let PodState::Preparing { step: PrepareStep::Sandbox, then } = self.state else { return };
                match result {
                    Ok(()) => {
                        self.retry = None;
                        self.state = match then {
                            Resume::Initializing => PodState::Initializing,
                            Resume::Running => PodState::Running,
                        };
                    }
                    Err(why) => {
                        out.push(Action::Record(Happened::FailedSandbox(why.clone())));
                        return self.retry_later(format!("cannot create the pod sandbox: {why}"), now);
                    }
                }
            }
            Input::Timer => return self.timer(now, out),
            Input::CleanedUp => return self.cleaned_up(out),
        }
        self.advance(now, out);
    }

    /// Where a pod whose sandbox is lost goes once it has a new one; `None` when it is not running.
    fn resume_point(&self) -> Option<Resume> {
        match self.state {
            PodState::Initializing => Some(Resume::Initializing),
            PodState::Running => Some(Resume::Running),
            _ => None,
        }
    }

    fn retry_later(&mut self, message: String, now: Instant) {
        let wait = self.retry.as_ref().map_or(RETRY_FIRST, |r| (r.wait * 2).min(RETRY_MAX));
        self.retry = Some(Retry { at: Some(now + wait), wait, message });
    }

    fn timer(&mut self, now: Instant, out: &mut Vec<Action>) {
        match &mut self.state {
            PodState::Admitting | PodState::Preparing { .. } => {
                // The retry is due once; its message stays until the step succeeds.
                let Some(retry) = self.retry.as_mut().filter(|r| r.at.is_some_and(|at| at <= now)) else { return };
                retry.at = None;
                out.push(match self.state {
                    PodState::Preparing { step: PrepareStep::Volumes, .. } => Action::PrepareVolumes,
                    PodState::Preparing { step: PrepareStep::Sandbox, .. } => Action::RunSandbox,
                    _ => Action::Place,
                });
            }
            PodState::Terminating { deadline, stage: stage @ Stage::Stopping, .. } if now >= *deadline => {
                *stage = Stage::Killing { until: now + KILL_WAIT };
                out.push(Action::KillAll { ids: self.running_ids() });
                self.advance(now, out);
            }
            PodState::Terminating { stage: stage @ Stage::Killing { .. }, reason, .. } => {
                if let Stage::Killing { until } = *stage
                    && now >= until
                {
                    *stage = Stage::CleaningUp;
                    out.push(Action::clean_up(reason));
                }
            }
            _ => self.advance(now, out),
        }
    }

    pub(crate) fn running_ids(&self) -> Vec<ContainerId> {
        self.containers.iter().filter_map(|c| c.running().map(|r| r.id.clone())).collect()
    }

    /// Termination is accepted in every state; a later request can only bring the deadline forward, and a deletion
    /// wins over an eviction.
    fn terminate(&mut self, grace: Duration, reason: Reason, now: Instant, out: &mut Vec<Action>) {
        let deadline = after(now, grace);
        match &mut self.state {
            PodState::Finalizing | PodState::Removed => {}
            PodState::AwaitingName | PodState::Admitting => match reason.terminal() {
                None => self.deleted(out),
                Some(t) => {
                    self.state = PodState::Finished(t);
                    out.push(Action::ReleaseName);
                }
            },
            PodState::Finished(_) => {
                if reason == Reason::Deleted {
                    self.state = PodState::Terminating { reason, deadline, stage: Stage::CleaningUp };
                    out.push(Action::clean_up(&Reason::Deleted));
                }
            }
            PodState::Terminating { reason: current, deadline: old, stage } => {
                let deleted = reason == Reason::Deleted;
                // A deletion, or a deletion's deadline brought forward, is saved for a daemon restarted meanwhile.
                if deleted && (*current != Reason::Deleted || deadline < *old) {
                    out.push(Action::Save);
                }
                if deleted {
                    *current = Reason::Deleted;
                }
                if deadline < *old {
                    *old = deadline;
                    if *stage == Stage::Stopping && deadline <= now {
                        *stage = Stage::Killing { until: now + KILL_WAIT };
                        out.push(Action::KillAll { ids: self.running_ids() });
                        self.advance(now, out);
                    }
                }
            }
            PodState::Preparing { .. } | PodState::Initializing | PodState::Running => {
                self.retry = None;
                self.drop_starts();
                out.push(Action::Abandon);
                self.begin_termination(reason, deadline, now, out);
            }
        }
    }

    /// Sets the containers being started back to pending; whether there were any.
    fn drop_starts(&mut self) -> bool {
        let mut any = false;
        for c in self.containers.iter_mut().filter(|c| c.state == ContainerState::Starting) {
            c.state = ContainerState::Pending;
            any = true;
        }
        any
    }

    /// From a placed pod: SIGTERM what runs, or clean up at once when nothing does. The signals go out before the
    /// resource manager hears of the termination (an eviction waits for them, on a node short of memory).
    fn begin_termination(&mut self, reason: Reason, deadline: Instant, now: Instant, out: &mut Vec<Action>) {
        let deleted = reason == Reason::Deleted;
        let ids = self.running_ids();
        for (index, _) in self.containers.iter().enumerate().filter(|(_, c)| c.running().is_some()) {
            out.push(Action::Record(Happened::Killing { index, probe: None }));
        }
        if ids.is_empty() || deadline <= now {
            self.state = PodState::Terminating { reason, deadline, stage: Stage::Killing { until: now + KILL_WAIT } };
            if !ids.is_empty() {
                out.push(Action::KillAll { ids });
            }
        } else {
            self.state = PodState::Terminating { reason, deadline, stage: Stage::Stopping };
            out.push(Action::StopAll { ids, deadline });
        }
        out.push(Action::MarkTerminating);
        if deleted {
            // Saved, so that a daemon restarted meanwhile gives the pod the rest of its grace period.
            out.push(Action::Save);
        }
        self.advance(now, out);
    }

    fn cleaned_up(&mut self, out: &mut Vec<Action>) {
        let PodState::Terminating { reason, stage: Stage::CleaningUp, .. } = &self.state else { return };
        // What was left running went with the pod cgroup.
        for c in &mut self.containers {
            if matches!(c.state, ContainerState::Running(_)) {
                c.state = ContainerState::Exited;
            }
        }
        match reason.terminal() {
            None => self.deleted(out),
            Some(t) => {
                self.state = PodState::Finished(t);
                out.extend([Action::Save, Action::ReleaseName]);
            }
        }
    }

    /// A deleted pod with nothing left of it: its final status goes to the status feed, and it is forgotten once
    /// its source no longer lists it.
    fn deleted(&mut self, out: &mut Vec<Action>) {
        out.extend([Action::ReleaseName, Action::Finalize]);
        if self.unlisted {
            self.state = PodState::Removed;
            out.push(Action::Forget);
        } else {
            self.state = PodState::Finalizing;
        }
    }

    fn exited(
        &mut self,
        i: usize,
        id: ContainerId,
        info: nodewarden_runtime::ExitInfo,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        // A pod waiting for a new sandbox restarts its containers once it has one.
        let over = self.state.is_over();
        let policy = self.policy;
        let c = &mut self.containers[i];
        let since = c.running().map_or(now, |r| r.since);
        let redefined = std::mem::take(&mut c.redefined);
        let restart = redefined
            || match c.role {
                Role::Sidecar => true,
                Role::Init => info.exit_code != 0 && policy != crate::status::RestartPolicy::Never,
                Role::App => policy.restarts(info.exit_code),
            };
        c.state = if restart && !over {
            // A new definition starts at once: the back-off was the old one's.
            let until = if redefined { now } else { c.backoff.restart_at(since, now) };
            if until > now {
                out.push(Action::Record(Happened::BackOff(i)));
            }
            ContainerState::BackOff { until }
        } else {
            ContainerState::Exited
        };
        let created = created(&info);
        c.last_exit = Some(LastExit { info, container_id: Some(id.clone()) });
        out.extend([Action::RetireContainer { index: i, id, created }, Action::Save]);
    }

    /// Container `i`'s definition changed (a new image), as the kubelet's container hash sees it: a running one
    /// is stopped and started again at once with the new spec; one waiting to start or restart starts now (its
    /// back-off was its old definition's). One that exited for good stays so.
    fn redefine(&mut self, i: usize, now: Instant, out: &mut Vec<Action>) {
        let grace = self.grace;
        let Some(c) = self.containers.get_mut(i) else { return };
        match &mut c.state {
            ContainerState::Running(run) if run.readiness != Readiness::Stopping => {
                run.readiness = Readiness::Stopping;
                c.redefined = true;
                out.push(Action::Record(Happened::Redefined(i)));
                out.push(Action::StopContainer { id: run.id.clone(), grace, why: "its definition changed".into() });
            }
            ContainerState::BackOff { until } => *until = now,
            ContainerState::StartFailed { retry_at, .. } => *retry_at = now,
            _ => {}
        }
    }

    fn probed(&mut self, i: usize, kind: ProbeKind, ok: bool, output: String, out: &mut Vec<Action>) {
        if !matches!(self.state, PodState::Initializing | PodState::Running) {
            return;
        }
        let grace = self.grace;
        let ContainerState::Running(run) = &mut self.containers[i].state else { return };
        if kind != ProbeKind::Startup && run.readiness == Readiness::AwaitingStartup {
            return;
        }
        let has_readiness = run.probes.contains_key(&ProbeKind::Readiness);
        let Some((cfg, probe)) = run.probes.get_mut(&kind) else { return };
        if !ok && run.readiness != Readiness::Stopping {
            out.push(Action::Record(Happened::Unhealthy { index: i, kind, output: output.clone() }));
        }
        let Some(verdict) = probe.record(ok, cfg) else { return };
        match (kind, verdict, run.readiness) {
            (_, _, Readiness::Stopping) => {}
            (ProbeKind::Startup, true, _) => {
                run.readiness = if has_readiness { Readiness::NotReady } else { Readiness::Ready };
            }
            (ProbeKind::Readiness, v, _) => run.readiness = if v { Readiness::Ready } else { Readiness::NotReady },
            (ProbeKind::Startup | ProbeKind::Liveness, false, _) => {
                run.readiness = Readiness::Stopping;
                out.push(Action::Record(Happened::Killing { index: i, probe: Some(kind) }));
                out.push(Action::StopContainer { id: run.id.clone(), grace, why: output });
            }
            (ProbeKind::Liveness, true, _) => {}
        }
    }

    /// After any change: start what may start, finish the pod when its containers are done, end a termination
    /// once nothing runs.
    fn advance(&mut self, now: Instant, out: &mut Vec<Action>) {
        if self.state == PodState::Initializing {
            if !self.initialize(now, out) {
                return;
            }
            self.state = PodState::Running;
        }
        match &mut self.state {
            PodState::Running => self.run(now, out),
            PodState::Terminating { reason, stage, .. }
                if *stage != Stage::CleaningUp && self.containers.iter().all(|c| c.running().is_none()) =>
            {
                *stage = Stage::CleaningUp;
                out.push(Action::clean_up(reason));
            }
            _ => {}
        }
    }

    fn start(&mut self, i: usize, out: &mut Vec<Action>) {
        let c = &mut self.containers[i];
        let attempt = if c.last_exit.is_some() { c.restarts.saturating_add(1) } else { c.restarts };
        c.state = ContainerState::Starting;
        out.push(Action::StartContainer { index: i, attempt });
    }

    /// Init containers in order, each to completion; sidecars only need to have started. True once done.
    fn initialize(&mut self, now: Instant, out: &mut Vec<Action>) -> bool {
        for i in 0..self.containers.len() {
            let c = &self.containers[i];
            match c.role {
                Role::App => {}
                Role::Sidecar => {
                    if c.startable(now) {
                        self.start(i, out);
                        return false;
                    }
                    if !self.containers[i].running().is_some_and(|r| r.readiness != Readiness::AwaitingStartup) {
                        return false;
                    }
                }
                Role::Init => match &c.state {
                    ContainerState::Exited if c.exited_ok() => {}
                    ContainerState::Exited => {
                        let code = c.last_exit.as_ref().map_or(0, |l| l.info.exit_code);
                        let message = format!("init container {} failed with exit code {code}", c.name);
                        let terminal = Terminal::failed(None, Some(message));
                        self.finish(terminal, now, out);
                        return false;
                    }
                    _ => {
                        if c.startable(now) {
                            self.start(i, out);
                        }
                        return false;
                    }
                },
            }
        }
        true
    }

    fn run(&mut self, now: Instant, out: &mut Vec<Action>) {
        for i in 0..self.containers.len() {
            let c = &self.containers[i];
            if c.role != Role::Init && c.startable(now) {
                self.start(i, out);
            }
        }
        let apps = || self.containers.iter().filter(|c| c.role == Role::App);
        if apps().all(|c| c.state == ContainerState::Exited) {
            let phase = if apps().all(|c| c.exited_ok()) { PodPhase::Succeeded } else { PodPhase::Failed };
            self.finish(Terminal::ended(phase), now, out);
        }
    }

    /// The pod ended on its own: stop what is left (sidecars) within its grace period, then clean up.
    fn finish(&mut self, terminal: Terminal, now: Instant, out: &mut Vec<Action>) {
        // A start under way (a sidecar restarting) is dropped, as on a termination: what it started goes with the
        // pod's cgroup, and its result, if it comes, finds no start to take.
        if self.drop_starts() {
            out.push(Action::Abandon);
        }
        let deadline = after(now, self.grace);
        self.begin_termination(Reason::Completed(terminal), deadline, now, out);
    }
}

/// When a run was created, for the dead-container policy: its start, or its end for a run that never started
/// (the runtime then reports no start time).
fn created(info: &nodewarden_runtime::ExitInfo) -> jiff::Timestamp {
    if info.started_at == jiff::Timestamp::UNIX_EPOCH { info.finished_at } else { info.started_at }
}

#[cfg(test)]
mod tests;
