//! The worker's view of its pod as a `v1.Pod` with status, published to the status store after every step.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateWaiting, ContainerStatus, Pod, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::time::Instant;

use super::{CState, Kind, Worker};
use crate::runtime::Runtime;
use crate::status::{Observed, condition, pod_phase, terminated};

impl<R: Runtime> Worker<R> {
    fn container_status(&self, c: &CState, now: Instant) -> ContainerStatus {
        let image = self.container(c).and_then(|x| x.image.clone()).unwrap_or_default();
        let scheme = self.ctx.runtime.scheme();
        let waiting = |reason: &str, message: Option<String>| ContainerState {
            waiting: Some(ContainerStateWaiting { reason: Some(reason.to_owned()), message }),
            ..ContainerState::default()
        };
        let last = c
            .last
            .as_ref()
            .map(|(info, id)| ContainerState { terminated: Some(terminated(info, id)), ..ContainerState::default() });
        let (state, last_state, id) = if let Some(run) = &c.run {
            let s = ContainerState {
                running: Some(ContainerStateRunning { started_at: Some(Time(run.started_at)) }),
                ..ContainerState::default()
            };
            (s, last, Some(format!("{scheme}://{}", run.id)))
        } else if let Some((reason, message)) = &c.waiting {
            if reason == "ErrImagePull" && c.next_start.is_some_and(|t| now < t) {
                let message = format!("Back-off pulling image {image:?}: {message}");
                (waiting("ImagePullBackOff", Some(message)), last, None)
            } else {
                (waiting(reason, Some(message.clone())), last, None)
            }
        } else if c.done
            || (c.kind == Kind::Init && c.last.is_some() && c.next_start.is_none())
            || self.terminal.is_some()
        {
            match last {
                Some(l) => (l, None, c.last.as_ref().map(|(_, id)| id.clone())),
                None => (waiting("ContainerCreating", None), None, None),
            }
        } else if c.in_backoff(now) {
            let wait = c.next_start.map(|t| t.saturating_duration_since(now)).unwrap_or_default();
            let message = format!(
                "back-off {}s restarting failed container={} pod={}_{}({})",
                wait.as_secs().max(1),
                c.name,
                self.pod.metadata.name.as_deref().unwrap_or_default(),
                self.pod.metadata.namespace.as_deref().unwrap_or_default(),
                self.uid
            );
            (waiting("CrashLoopBackOff", Some(message)), last, None)
        } else if c.kind == Kind::App && !self.initialized {
            (waiting("PodInitializing", None), last, None)
        } else {
            (waiting("ContainerCreating", self.pending.clone()), last, None)
        };
        let run = c.run.as_ref();
        ContainerStatus {
            name: c.name.clone(),
            image,
            image_id: String::new(),
            container_id: id,
            ready: run.is_some_and(|r| r.ready),
            started: Some(run.is_some_and(|r| r.started)),
            restart_count: i32::try_from(c.restarts).unwrap_or(i32::MAX),
            state: Some(state),
            last_state,
            ..ContainerStatus::default()
        }
    }

    fn observed(&self, c: &CState, now: Instant) -> Observed {
        if c.run.is_some() {
            Observed::Running
        } else if c.done {
            Observed::Terminated { ok: c.last.as_ref().is_some_and(|(l, _)| l.exit_code == 0) }
        } else {
            Observed::Waiting { restarted: c.last.is_some() && (c.in_backoff(now) || c.next_start.is_some()) }
        }
    }

    fn set_condition(&mut self, kind: &'static str, ok: bool) -> k8s_openapi::api::core::v1::PodCondition {
        let now = Timestamp::now();
        let entry = self.conditions.entry(kind).or_insert((ok, now));
        if entry.0 != ok {
            *entry = (ok, now);
        }
        condition(kind, ok, entry.1)
    }

    /// Publishes the pod with its current status.
    pub(super) fn publish(&mut self) {
        let now = Instant::now();
        let mut status = PodStatus {
            qos_class: self.placement.as_ref().map(|p| p.qos.as_str().to_owned()),
            start_time: self.start_time.map(Time),
            ..PodStatus::default()
        };
        let init: Vec<ContainerStatus> =
            self.containers.iter().filter(|c| c.kind != Kind::App).map(|c| self.container_status(c, now)).collect();
        let app: Vec<ContainerStatus> =
            self.containers.iter().filter(|c| c.kind == Kind::App).map(|c| self.container_status(c, now)).collect();
        let observed: Vec<Observed> =
            self.containers.iter().filter(|c| c.kind == Kind::App).map(|c| self.observed(c, now)).collect();
        let phase = match &self.terminal {
            Some(t) if t.phase != "Running" => t.phase.clone(),
            _ => pod_phase(self.policy, !self.initialized, &observed).to_owned(),
        };
        if let Some(t) = &self.terminal {
            status.reason = t.reason.clone();
            status.message = t.message.clone();
        } else if let Some(p) = &self.pending {
            status.message = Some(p.clone());
        }
        let containers_ready =
            self.containers.iter().filter(|c| c.kind != Kind::Init).all(|c| c.run.as_ref().is_some_and(|r| r.ready));
        let running = phase == "Running";
        let initialized = self.initialized;
        let mut conditions = vec![self.set_condition("PodScheduled", true)];
        conditions.push(self.set_condition("Initialized", initialized));
        conditions.push(self.set_condition("ContainersReady", containers_ready && running));
        conditions.push(self.set_condition("Ready", containers_ready && running));
        status.conditions = Some(conditions);
        status.phase = Some(phase);
        if !init.is_empty() {
            status.init_container_statuses = Some(init);
        }
        status.container_statuses = Some(app);
        let pod = Pod { metadata: self.pod.metadata.clone(), spec: self.pod.spec.clone(), status: Some(status) };
        self.ctx.store.set(&self.uid, pod);
    }
}
