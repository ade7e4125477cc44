//! Starting containers (with the crash-loop back-off), watching their exits, running their probes, and restarting
//! them when a liveness or startup probe fails.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::{AbortOnDrop, CState, Event, Kind, Run, Worker};
use crate::probe::{self, Action, ProbeConfig, ProbeKind, ProbeState};
use crate::runtime::{ContainerSpec, Runtime, RuntimeError, SIGKILL};
use crate::spec::container_spec;

impl<R: Runtime> Worker<R> {
    /// The runtime spec of container `i` for its next run.
    pub(super) fn build_spec(&self, i: usize) -> Result<ContainerSpec, String> {
        let c = &self.containers[i];
        let container = self.container(c).ok_or("container not in the pod spec")?;
        let placement = self
            .placement
            .as_ref()
            .and_then(|p| p.containers.iter().find(|x| x.name == c.name))
            .ok_or("container not placed")?;
        let volumes = self.volumes.as_deref().unwrap_or_default();
        let mut spec =
            container_spec(&self.pod, container, placement, volumes, &self.ctx.settings.log_dir, c.restarts)?;
        spec.sandbox_id = self.sandbox.clone().unwrap_or_default();
        Ok(spec)
    }

    /// Starts container `i` unless its back-off has not expired. Returns true when it runs.
    pub(super) async fn try_start(&mut self, i: usize) -> bool {
        let now = Instant::now();
        if let Some(at) = self.containers[i].next_start
            && now < at
        {
            return false;
        }
        let restarting = self.containers[i].last.is_some();
        if restarting {
            self.containers[i].restarts += 1;
        }
        let kind = match self.containers[i].kind {
            Kind::App => "container",
            Kind::Init | Kind::Sidecar => "init_container",
        };
        let spec = match self.build_spec(i) {
            Ok(s) => s,
            Err(e) => {
                if restarting {
                    self.containers[i].restarts -= 1;
                }
                self.ctx
                    .metrics
                    .started_container_errors
                    .with_label_values(&["CreateContainerConfigError", kind])
                    .inc();
                self.containers[i].waiting = Some(("CreateContainerConfigError".into(), e.clone()));
                self.retry_later(format!("container {}: {e}", self.containers[i].name));
                return false;
            }
        };
        self.ctx.metrics.started_containers.with_label_values(&[kind]).inc();
        match self.ctx.runtime.start(&spec).await {
            Ok(started) => {
                tracing::info!(pod = %self.full_name(), container = %spec.name, pid = started.pid, restarts = self.containers[i].restarts, "container started");
                self.containers[i].waiting = None;
                self.attach(i, spec, started.id, started.pid, started.started_at);
                self.save();
                true
            }
            Err(e) => {
                let reason = match &e {
                    RuntimeError::Config(_) => "CreateContainerConfigError",
                    RuntimeError::Image { reason, .. } => reason,
                    RuntimeError::Create(_) => "CreateContainerError",
                    _ => "RunContainerError",
                };
                if let RuntimeError::SandboxNotFound(_) = e {
                    // The runtime lost the sandbox: the next sync creates a new one.
                    self.sandbox = None;
                }
                self.ctx.metrics.started_container_errors.with_label_values(&[reason, kind]).inc();
                tracing::warn!(pod = %self.full_name(), container = %spec.name, error = %e, "cannot start container");
                let c = &mut self.containers[i];
                c.waiting = Some((reason.into(), e.to_string()));
                c.next_start = Some(c.backoff.restart_at(now, now));
                false
            }
        }
    }

    /// Records container `i` as running and starts watching it: its exit and its probes.
    pub(super) fn attach(&mut self, i: usize, spec: ContainerSpec, id: String, pid: u32, started_at: Timestamp) {
        let runtime = self.ctx.runtime.clone();
        let events = self.events.clone();
        let watched = id.clone();
        let mut tasks = vec![AbortOnDrop(tokio::spawn(async move {
            let info = runtime.wait(&watched).await;
            let _ = events.send(Event::Exited { id: watched, info });
        }))];
        let mut probes = std::collections::BTreeMap::new();
        if let Some(container) = self.container(&self.containers[i]).cloned() {
            for (kind, p) in [
                (ProbeKind::Startup, &container.startup_probe),
                (ProbeKind::Liveness, &container.liveness_probe),
                (ProbeKind::Readiness, &container.readiness_probe),
            ] {
                let Some(p) = p else { continue };
                match ProbeConfig::from_probe(p, &container) {
                    Ok(cfg) => {
                        probes.insert(kind, ProbeState::default());
                        tasks.push(self.spawn_probe(kind, cfg, spec.clone(), id.clone()));
                    }
                    Err(e) => {
                        tracing::warn!(pod = %self.full_name(), container = %container.name, error = %e, "probe not run")
                    }
                }
            }
        }
        let started = !probes.contains_key(&ProbeKind::Startup);
        let ready = started && !probes.contains_key(&ProbeKind::Readiness);
        self.containers[i].run = Some(Run {
            id,
            pid,
            started_at,
            since: Instant::now(),
            spec,
            tasks,
            probes,
            started,
            ready,
            killing: false,
        });
    }

    fn spawn_probe(&self, kind: ProbeKind, cfg: ProbeConfig, spec: ContainerSpec, id: String) -> AbortOnDrop {
        let runtime = self.ctx.runtime.clone();
        let events = self.events.clone();
        AbortOnDrop(tokio::spawn(async move {
            tokio::time::sleep(cfg.initial_delay).await;
            let mut tick = tokio::time::interval(cfg.period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let result = run_probe(&*runtime, &cfg, &id, &spec).await;
                if events.send(Event::Probe { id: id.clone(), kind, result }).is_err() {
                    return;
                }
            }
        }))
    }

    fn find_run(&mut self, id: &str) -> Option<usize> {
        self.containers.iter().position(|c| c.run.as_ref().is_some_and(|r| r.id == id))
    }

    /// Applies an event from a container's watcher or probes.
    pub(super) fn handle(&mut self, ev: Event) {
        match ev {
            Event::Exited { id, info } => {
                let Some(i) = self.find_run(&id) else { return };
                let policy = self.policy;
                let full = self.full_name();
                let c = &mut self.containers[i];
                let Some(run) = c.run.take() else { return };
                self.ctx.runtime.remove(&id);
                tracing::info!(pod = %full, container = %c.name, exit_code = info.exit_code, reason = %info.reason, "container exited");
                let now = Instant::now();
                let restart = match c.kind {
                    Kind::Sidecar => true,
                    Kind::Init => info.exit_code != 0 && policy != crate::status::RestartPolicy::Never,
                    Kind::App => policy.restarts(info.exit_code),
                };
                if restart && self.terminal.is_none() {
                    c.next_start = Some(c.backoff.restart_at(run.since, now));
                } else if c.kind == Kind::App {
                    c.done = true;
                }
                if c.kind == Kind::Init && info.exit_code == 0 {
                    c.done = true;
                }
                let scheme = self.ctx.runtime.scheme();
                c.last = Some((info, format!("{scheme}://{id}")));
                self.save();
            }
            Event::Probe { id, kind, result } => {
                let Some(i) = self.find_run(&id) else { return };
                let labels = [
                    kind.as_str().to_owned(),
                    if result.is_ok() { "successful" } else { "failed" }.to_owned(),
                    self.containers[i].name.clone(),
                    self.pod.metadata.name.clone().unwrap_or_default(),
                    self.pod.metadata.namespace.clone().unwrap_or_default(),
                    self.uid.clone(),
                ];
                let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
                self.ctx.metrics.probes.with_label_values(&labels).inc();
                let Some(cfg) = self.probe_config(i, kind) else { return };
                let full = self.full_name();
                let grace = self.grace_period();
                let c = &mut self.containers[i];
                let Some(run) = c.run.as_mut() else { return };
                if kind != ProbeKind::Startup && !run.started {
                    return;
                }
                let Some(state) = run.probes.get_mut(&kind) else { return };
                let verdict = state.record(result.is_ok(), &cfg);
                match (kind, verdict) {
                    (ProbeKind::Startup, Some(true)) => run.started = true,
                    (ProbeKind::Readiness, Some(v)) => run.ready = v,
                    (ProbeKind::Startup | ProbeKind::Liveness, Some(false)) if !run.killing => {
                        run.killing = true;
                        let why = result.err().unwrap_or_default();
                        tracing::info!(pod = %full, container = %c.name, probe = kind.as_str(), output = %why, "probe failed; restarting the container");
                        let runtime = self.ctx.runtime.clone();
                        let id = run.id.clone();
                        run.tasks.push(AbortOnDrop(tokio::spawn(stop_container(runtime, id, grace))));
                    }
                    _ => {}
                }
                if kind == ProbeKind::Startup && run.started && !run.probes.contains_key(&ProbeKind::Readiness) {
                    run.ready = true;
                }
            }
        }
    }

    fn probe_config(&self, i: usize, kind: ProbeKind) -> Option<ProbeConfig> {
        let c = self.container(&self.containers[i])?;
        let p = match kind {
            ProbeKind::Startup => c.startup_probe.as_ref(),
            ProbeKind::Liveness => c.liveness_probe.as_ref(),
            ProbeKind::Readiness => c.readiness_probe.as_ref(),
        }?;
        ProbeConfig::from_probe(p, c).ok()
    }
}

/// SIGTERM, then SIGKILL once `grace` has passed; the exit arrives through the container's watcher.
pub(super) async fn stop_container<R: Runtime>(runtime: Arc<R>, id: String, grace: Duration) {
    if let Err(e) = runtime.stop(&id, grace) {
        tracing::debug!(container_id = %id, error = %e, "SIGTERM not delivered");
    }
    tokio::time::sleep(grace).await;
    if let Err(e) = runtime.signal(&id, SIGKILL) {
        tracing::debug!(container_id = %id, error = %e, "SIGKILL not delivered");
    }
}

/// Runs one probe: `Ok` with its output on success, `Err` with why on failure.
pub(super) async fn run_probe<R: Runtime>(
    runtime: &R,
    cfg: &ProbeConfig,
    id: &str,
    spec: &ContainerSpec,
) -> Result<String, String> {
    match &cfg.action {
        Action::Exec(argv) => match runtime.exec(id, spec, argv, cfg.timeout).await {
            Ok(out) if out.exit_code == Some(0) => Ok(out.output),
            Ok(out) => Err(match out.exit_code {
                Some(code) => format!("command {argv:?} exited with {code}: {}", out.output.trim()),
                None => out.output,
            }),
            Err(e) => Err(e.to_string()),
        },
        Action::Http { host, port, path, headers } => probe::http_get(host, *port, path, headers, cfg.timeout).await,
        Action::Tcp { host, port } => probe::tcp(host, *port, cfg.timeout).await,
    }
}

impl CState {
    /// True while the container waits out a crash-loop back-off.
    pub(super) fn in_backoff(&self, now: Instant) -> bool {
        self.run.is_none() && !self.done && self.last.is_some() && self.next_start.is_some_and(|t| now < t)
    }
}
