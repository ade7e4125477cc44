//! Running containers for the executor: the sandbox, the runtime spec of each run, starting (as a task a
//! termination can drop), watching exits, running probes, and stopping a container whose probe failed.

use std::time::Duration;

use tokio::task::JoinSet;

use super::lifecycle::{Input, Role, StartFailure, StartedContainer};
use super::{Event, Sandbox, Worker};

/// A runtime call that completed.
pub(super) enum Completed {
    /// The pod's volumes were made ready, or why not.
    Volumes(Result<Vec<crate::volumes::PreparedVolume>, crate::volumes::VolumeError>),
    /// The sandbox was made (its ID), or why not.
    Sandbox(Result<RunningSandbox, String>),
    /// Container `index` was started for run `attempt`, or why not.
    Started { index: usize, attempt: u32, result: Result<Started, StartFailure> },
}
use crate::events::Happened;
use crate::probe::{self, LOOPBACK, ProbeConfig, ProbeKind};
use crate::spec::{PodContext, PodIps, container_spec};
use nodewarden_runtime::{
    ContainerId, ContainerSpec, RunningSandbox, Runtime, RuntimeError, SandboxRuntime, SandboxSpec, Started,
};

/// What a container's start read: the objects its environment and image pull name, and the variables of the
/// cluster's Services.
pub(super) struct StartObjects {
    map: crate::objects::ObjectMap,
    services: Vec<(String, String)>,
}

impl<R: Runtime> Worker<R> {
    /// The sandbox spec, once the pod is placed.
    pub(super) fn sandbox_spec(&self) -> Option<SandboxSpec> {
        let placement = self.placement.as_ref()?;
        Some(crate::spec::sandbox_spec(&self.pod, placement, &self.shared.settings.log_dir))
    }

    /// Creates the sandbox as a task, where the runtime has sandboxes; the pod cgroup is the sandbox otherwise.
    pub(super) fn run_sandbox(&mut self) -> Option<Input> {
        if self.shared.runtime.sandboxes().is_none() {
            self.sandbox = Sandbox::Running(RunningSandbox { id: self.uid.clone(), ips: Vec::new() });
            return Some(Input::SandboxReady(Ok(())));
        }
        let Some(spec) = self.sandbox_spec() else { return Some(Input::SandboxReady(Err("pod not placed".into()))) };
        self.sandbox = Sandbox::Requested;
        let runtime = self.shared.runtime.clone();
        let full_name = self.full_name();
        self.tasks.in_flight.spawn(async move {
            let Some(sandboxes) = runtime.sandboxes() else { return Completed::Sandbox(Err("no sandboxes".into())) };
            match sandboxes.run_sandbox(&spec).await {
                Ok(running) => {
                    tracing::info!(pod = %full_name, sandbox = %running.id, ips = ?running.ips, "pod sandbox running");
                    Completed::Sandbox(Ok(running))
                }
                Err(e) => {
                    // A half-made sandbox is not left behind.
                    sandboxes.remove_sandboxes(&spec.pod_uid).await;
                    Completed::Sandbox(Err(e.to_string()))
                }
            }
        });
        None
    }

    /// Whether the pod is on the host's network: every pod of a runtime without sandboxes, and `hostNetwork` pods.
    pub(super) fn on_host_network(&self) -> bool {
        self.shared.runtime.sandboxes().is_none()
            || self.pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false)
    }

    /// The pod's IPs, the primary first: its sandbox's on the pod network, the node's on the host's network;
    /// none before its sandbox runs.
    pub(super) fn pod_ips(&self) -> Vec<String> {
        let Sandbox::Running(running) = &self.sandbox else { return Vec::new() };
        if self.on_host_network() { self.shared.settings.host_ips.clone() } else { running.ips.clone() }
    }

    /// Takes note of a runtime call that completed and turns it into the machine's input.
    pub(super) fn completed(&mut self, done: Completed) -> Input {
        match done {
            Completed::Volumes(result) => Input::VolumesPrepared(result.map(|prepared| self.volumes = prepared)),
            Completed::Sandbox(result) => {
                Input::SandboxReady(result.map(|running| self.sandbox = Sandbox::Running(running)))
            }
            Completed::Started { index, attempt, result } => {
                let result = result.map(|started| {
                    let name = self.lifecycle.containers.get(index).map(|c| c.name.clone()).unwrap_or_default();
                    self.attach(started, &name, attempt)
                });
                Input::ContainerStarted { index, attempt, result }
            }
        }
    }

    /// The runtime spec of container `i` for its run number `attempt`. A container about to start gets its subPaths
    /// staged afresh and its environment from `objects`; one being adopted (`objects` `None`) keeps the staging
    /// mounts it runs with.
    pub(super) fn build_spec(
        &self,
        i: usize,
        attempt: u32,
        objects: Option<&StartObjects>,
    ) -> Result<ContainerSpec, String> {
        let starting = objects.is_some();
        let name = &self.lifecycle.containers[i].name;
        let container = self.container(name).ok_or("container not in the pod spec")?;
        let placement = self
            .placement
            .as_ref()
            .and_then(|p| p.containers.iter().find(|x| &x.name == name))
            .ok_or("container not placed")?;
        let root = &self.shared.settings.root_dir;
        let mut stage = |v: &crate::volumes::PreparedVolume, sub: &str, index: usize| {
            if starting {
                crate::subpath::stage(root, &self.uid, v, name, index, sub)
            } else {
                Ok(crate::subpath::staging_path(root, &self.uid, &v.name, name, index))
            }
        };
        let pod_ips = self.pod_ips();
        let ips = PodIps { pod: &pod_ips, host: &self.shared.settings.host_ips };
        let node = self.shared.ledger.view().allocatable().reported;
        let log_root = &self.shared.settings.log_dir;
        let services = objects.map_or(&[][..], |o| &o.services[..]);
        let objects = objects.map(|o| &o.map);
        let ctx = PodContext { pod: &self.pod, volumes: &self.volumes, log_root, ips, node: &node, objects, services };
        let mut spec = container_spec(&ctx, container, placement, attempt, &mut stage)?;
        spec.sandbox_id = match &self.sandbox {
            Sandbox::Running(running) => running.id.clone(),
            Sandbox::None | Sandbox::Requested | Sandbox::Stopped => String::new(),
        };
        Ok(spec)
    }

    /// The ConfigMaps and Secrets container `index`'s environment reads and the pod's pull secrets, fetched for
    /// its start.
    async fn start_objects(&self, index: usize) -> StartObjects {
        let mut map = crate::objects::ObjectMap::new();
        let services = match tokio::time::timeout(super::OBJECTS_TIMEOUT, self.linked_services()).await {
            Ok(Ok(services)) => crate::env::service_vars(&services),
            Ok(Err(e)) => {
                tracing::debug!(pod = %self.full_name(), error = %e, "cannot read the cluster's Services; no service variables");
                Vec::new()
            }
            Err(_) => Vec::new(),
        };
        let Some(c) = self.container(&self.lifecycle.containers[index].name) else {
            return StartObjects { map, services };
        };
        let mut refs = crate::env::references(c);
        refs.extend(self.pull_secret_names().map(|n| (crate::objects::ObjectKind::Secret, n.to_owned())));
        if !refs.is_empty() {
            let namespace = nodewarden_resources::pod::namespace(&self.pod);
            let fetching = crate::objects::fetch_into(&*self.shared.objects, namespace, refs.clone(), &mut map);
            if tokio::time::timeout(super::OBJECTS_TIMEOUT, fetching).await.is_err() {
                for r in refs {
                    map.entry(r).or_insert_with(|| Err("timed out fetching the object".into()));
                }
            }
        }
        StartObjects { map, services }
    }

    /// The Services the pod's containers' environments name ([`crate::env::linked_services`]).
    async fn linked_services(&self) -> Result<Vec<crate::ServiceAddress>, crate::ObjectError> {
        let namespace = nodewarden_resources::pod::namespace(&self.pod);
        let links = self.pod.spec.as_ref().and_then(|s| s.enable_service_links).unwrap_or(true);
        let objects = &*self.shared.objects;
        let own = async {
            match (links, namespace) {
                (false, _) | (true, "default") => Ok(Vec::new()),
                (true, ns) => objects.services(ns).await,
            }
        };
        let (in_default, in_own) = futures_util::future::join(objects.services("default"), own).await;
        let in_default = in_default?;
        // The apiserver's own variables are not lost with the namespace's.
        let in_own = in_own.unwrap_or_else(|e| {
            tracing::debug!(pod = %self.full_name(), error = %e, "cannot read the Services of the pod's namespace");
            Vec::new()
        });
        let own = if links && namespace == "default" { &in_default } else { &in_own };
        Ok(crate::env::linked_services(&in_default, own, links))
    }

    /// The names of the pod's `imagePullSecrets`.
    fn pull_secret_names(&self) -> impl Iterator<Item = &str> {
        let secrets = self.pod.spec.as_ref().and_then(|s| s.image_pull_secrets.as_ref());
        secrets.into_iter().flatten().map(|r| r.name.as_str()).filter(|n| !n.is_empty())
    }

    /// The credentials a pull of `image` tries, from the pull secrets in `objects`; the ones out of reach are
    /// logged, and the pull goes on without them, as the kubelet's does.
    fn pull_auths(&self, image: &str, objects: &crate::objects::ObjectMap) -> Vec<nodewarden_runtime::RegistryAuth> {
        let mut found = Vec::new();
        for name in self.pull_secret_names() {
            match crate::objects::lookup(objects, crate::objects::ObjectKind::Secret, name, false) {
                Ok(Some(data)) => found.push(data),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(pod = %self.full_name(), secret = %name, error = %e, "cannot read an image pull secret; the pull may fail")
                }
            }
        }
        crate::pull_secrets::credentials(image, &found.iter().map(|d| &**d).collect::<Vec<_>>())
    }

    fn container(&self, name: &str) -> Option<&k8s_openapi::api::core::v1::Container> {
        let spec = self.pod.spec.as_ref()?;
        spec.init_containers.iter().flatten().chain(&spec.containers).find(|c| c.name == name)
    }

    /// Starts container `i` as a task; a spec that cannot be built fails at once.
    pub(super) async fn start_container(&mut self, index: usize, attempt: u32) -> Option<Input> {
        let kind = match self.lifecycle.containers[index].role {
            Role::App => "container",
            Role::Init | Role::Sidecar => "init_container",
        };
        let (uid, name) = (self.uid.clone(), self.lifecycle.containers[index].name.clone());
        let ensured = self.shared.ledger.try_call(move |m| m.ensure_container(&uid, &name)).await;
        let name = &self.lifecycle.containers[index].name;
        match ensured {
            Ok(true) => {
                tracing::warn!(pod = %self.full_name(), container = %name, "the container's cgroup had vanished; made it again")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(pod = %self.full_name(), container = %name, error = %e, "cannot make the container's cgroup again")
            }
        }
        // The pod's log directory, made before its first container writes there, owns a project where the file
        // system keeps project quotas: its usage is then one read.
        let pod_logs = self.shared.settings.log_dir.join(crate::spec::pod_log_dir_name(&self.pod));
        if !pod_logs.exists()
            && std::fs::create_dir_all(&pod_logs).is_ok()
            && let Err(e) = crate::quota::claim(&pod_logs)
        {
            tracing::trace!(dir = %pod_logs.display(), error = %e, "the pod's logs are walked");
        }
        if attempt > 0 {
            crate::logs::remove_older_runs(
                &crate::spec::log_dir(&self.shared.settings.log_dir, &self.pod, name),
                attempt,
                self.shared.dead.kept(&self.uid, name),
            );
        }
        let objects = self.start_objects(index).await;
        let spec = match self.build_spec(index, attempt, Some(&objects)) {
            Ok(mut s) => {
                s.pull_auths = self.pull_auths(&s.image, &objects.map);
                s
            }
            Err(message) => {
                let reason = "CreateContainerConfigError";
                self.shared.metrics.started_container_errors.with_label_values(&[reason, kind]).inc();
                let name = &self.lifecycle.containers[index].name;
                tracing::warn!(pod = %self.full_name(), container = %name, error = %message, "cannot build the container's spec");
                let result = Err(StartFailure { reason: reason.into(), message, sandbox_lost: false });
                return Some(Input::ContainerStarted { index, attempt, result });
            }
        };
        self.shared.metrics.started_containers.with_label_values(&[kind]).inc();
        let runtime = self.shared.runtime.clone();
        let metrics = self.shared.metrics.clone();
        let full_name = self.full_name();
        // The image's events need the pod and its containers' names; only a runtime with images has them.
        let images = self.shared.runtime.image_service().is_some().then(|| {
            let names: Vec<String> = self.lifecycle.containers.iter().map(|c| c.name.clone()).collect();
            (self.pod.clone(), names, self.shared.events.clone())
        });
        self.tasks.in_flight.spawn(async move {
            let pulled = match (runtime.image_service(), &images) {
                (Some(service), Some((pod, names, events))) => {
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    let record = |h: Happened| events.pod_event(pod, h.event(pod, &names));
                    let ensured = crate::images::ensure(service, index, &spec, record).await;
                    if let Ok(Some((began, ended))) = ensured {
                        events.image_pulled(pod, began, ended);
                    }
                    ensured.map(|_| ())
                }
                _ => Ok(()),
            };
            let started = match pulled {
                Ok(()) => runtime.start(&spec).await,
                Err(e) => Err(e),
            };
            let result = match started {
                Ok(started) => {
                    tracing::info!(pod = %full_name, container = %spec.name, pid = started.pid, attempt, "container started");
                    Ok(started)
                }
                Err(e) => {
                    let reason = match &e {
                        RuntimeError::Config(_) => "CreateContainerConfigError",
                        RuntimeError::Image { reason, .. } => reason,
                        RuntimeError::Create(_) => "CreateContainerError",
                        _ => "RunContainerError",
                    };
                    metrics.started_container_errors.with_label_values(&[reason, kind]).inc();
                    tracing::warn!(pod = %full_name, container = %spec.name, error = %e, "cannot start container");
                    let sandbox_lost = matches!(e, RuntimeError::SandboxNotFound(_));
                    Err(StartFailure { reason: reason.into(), message: e.to_string(), sandbox_lost })
                }
            };
            Completed::Started { index, attempt, result }
        });
        None
    }

    /// The probes of a container, with the kubelet's defaults.
    pub(super) fn probes(&self, name: &str) -> Vec<(ProbeKind, ProbeConfig)> {
        let Some(container) = self.container(name) else { return Vec::new() };
        // A probe that names no host goes to the pod's IP, as the kubelet's do: on the pod network that is the
        // pod's own namespace (a pod that has no IP has no host to probe, and its probes fail); on the host's, the
        // loopback reaches the same sockets.
        let host = if self.on_host_network() {
            LOOPBACK.to_owned()
        } else {
            self.pod_ips().into_iter().next().unwrap_or_default()
        };
        let mut out = Vec::new();
        for (kind, p) in [
            (ProbeKind::Startup, &container.startup_probe),
            (ProbeKind::Liveness, &container.liveness_probe),
            (ProbeKind::Readiness, &container.readiness_probe),
        ] {
            let Some(p) = p else { continue };
            match ProbeConfig::from_probe(p, container, &host) {
                Ok(cfg) => out.push((kind, cfg)),
                Err(e) => tracing::warn!(pod = %self.full_name(), container = %name, error = %e, "probe not run"),
            }
        }
        out
    }

    /// Watches a running container: its exit, its probes and the size of its log `log`, until it is removed.
    fn watch(&mut self, id: ContainerId, probes: Vec<(ProbeKind, ProbeConfig)>, log: std::path::PathBuf) {
        let mut tasks = JoinSet::new();
        let rotation = self.shared.settings.log_rotation;
        let (runtime, rotated) = (self.shared.runtime.clone(), id.clone());
        let first = crate::logs::first_check(self.shared.log_epoch, tokio::time::Instant::now(), rotation.interval);
        tasks.spawn(async move {
            // On the daemon's one grid of checks (a late tick waits for the next one on it).
            let mut tick = tokio::time::interval_at(first, rotation.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                crate::logs::rotate_if_full(&*runtime, &rotated, &log, &rotation).await;
            }
        });
        let runtime = self.shared.runtime.clone();
        let events = self.link.events.clone();
        let watched = id.clone();
        tasks.spawn(async move {
            let info = runtime.wait(&watched).await;
            let _ = events.send(Event::Exited { id: watched, info });
        });
        for (kind, cfg) in probes {
            let runtime = self.shared.runtime.clone();
            let events = self.link.events.clone();
            let id = id.clone();
            tasks.spawn(async move {
                tokio::time::sleep(cfg.initial_delay).await;
                let mut tick = tokio::time::interval(cfg.period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let result = run_probe(&*runtime, &cfg, &id).await;
                    if events.send(Event::Probe { id: id.clone(), kind, result }).is_err() {
                        return;
                    }
                }
            });
        }
        self.tasks.containers.insert(id, tasks);
    }

    /// Watches a container that started (or that an earlier daemon started) for its run number `attempt`.
    pub(super) fn attach(&mut self, started: Started, name: &str, attempt: u32) -> StartedContainer {
        let probes = self.probes(name);
        let log = crate::spec::log_dir(&self.shared.settings.log_dir, &self.pod, name).join(format!("{attempt}.log"));
        self.watch(started.id.clone(), probes.clone(), log);
        StartedContainer {
            id: started.id,
            pid: started.pid,
            pid_start: started.pid_start,
            started_at: started.started_at,
            probes,
        }
    }

    /// Stops a container whose liveness or startup probe failed; its exit arrives through its watcher.
    pub(super) fn stop_container(&mut self, id: ContainerId, grace: Duration, why: &str) {
        let name = self.lifecycle.index_of(&id).map(|i| self.lifecycle.containers[i].name.as_str()).unwrap_or_default();
        tracing::info!(pod = %self.full_name(), container = %name, container_id = %id, output = %why, "probe failed; restarting the container");
        let runtime = self.shared.runtime.clone();
        let Some(tasks) = self.tasks.containers.get_mut(&id) else { return };
        tasks.spawn(async move {
            if let Err(e) = runtime.stop(&id, grace).await {
                tracing::debug!(container_id = %id, error = %e, "cannot stop the container");
            }
        });
    }
}

/// Runs one probe: `Ok` with its output on success, `Err` with why on failure.
pub(super) async fn run_probe<R: Runtime>(runtime: &R, cfg: &ProbeConfig, id: &ContainerId) -> Result<String, String> {
    match &cfg.action {
        probe::Action::Exec(argv) => match runtime.exec(id, argv, cfg.timeout).await {
            Ok(out) if out.exit_code == Some(0) => Ok(out.output),
            Ok(out) => Err(match out.exit_code {
                Some(code) => format!("command {argv:?} exited with {code}: {}", out.output.trim()),
                None => out.output,
            }),
            Err(e) => Err(e.to_string()),
        },
        probe::Action::Http { host, port, path, headers } => {
            probe::http_get(host, *port, path, headers, cfg.timeout).await
        }
        probe::Action::Tcp { host, port } => probe::tcp(host, *port, cfg.timeout).await,
    }
}
