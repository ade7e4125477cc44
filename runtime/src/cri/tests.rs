//! The CRI runtime against a scripted CRI server on a unix socket (the generated tonic server): what is sent
//! (cgroup parent, limits, labels, pulls), how exits, lost containers and errors come back, reconciliation, and a
//! runtime that is unreachable and then comes up. The VM tests run the same code against real containerd.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nodewarden_proto::v1::image_service_server::{ImageService, ImageServiceServer};
use nodewarden_proto::v1::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use nodewarden_proto::v1::*;
use nodewarden_resources::CgroupPath;
use tonic::{Request, Response, Status};

use super::*;
use crate::seam::{ImageService as _, PullPolicy};
use crate::seam::{LinuxResources, Mount as SpecMount};

#[derive(Default)]
struct State {
    api_version: String,
    /// The `NetworkReady` condition's message while the network is not ready (no CNI config).
    network_not_ready: Option<String>,
    calls: Vec<String>,
    images: BTreeSet<String>,
    pullable: BTreeSet<String>,
    /// The user and password a pull must present, if any.
    private: Option<(String, String)>,
    sandboxes: Vec<(PodSandbox, PodSandboxConfig)>,
    containers: Vec<(Container, ContainerStatus, ContainerConfig)>,
    /// What each container wrote to its writable layer, by ID.
    written: HashMap<String, u64>,
    /// The mount point `ImageFsInfo` names, if any.
    image_fs: Option<String>,
    next: u32,
}

#[derive(Clone, Default)]
struct Fake(Arc<Mutex<State>>);

impl Fake {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap()
    }

    fn record(&self, call: &str) {
        self.state().calls.push(call.to_owned());
    }

    /// Whether the runtime has container `id`.
    fn known(&self, id: &str) -> Result<(), Status> {
        match self.state().containers.iter().any(|c| c.0.id == id) {
            true => Ok(()),
            false => Err(Status::not_found("no such container")),
        }
    }

    fn exit(&self, id: &str, code: i32, reason: &str) {
        let mut s = self.state();
        let c = s.containers.iter_mut().find(|c| c.0.id == id).unwrap();
        c.0.state = ContainerState::ContainerExited.into();
        c.1.state = ContainerState::ContainerExited.into();
        c.1.exit_code = code;
        c.1.reason = reason.into();
        c.1.finished_at = 2_000_000_000;
    }
}

fn matches(labels: &HashMap<String, String>, selector: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[tonic::async_trait]
impl RuntimeService for Fake {
    async fn version(&self, _r: Request<VersionRequest>) -> Result<Response<VersionResponse>, Status> {
        // Not recorded: the monitor asks it with every Status.
        let v = self.state().api_version.clone();
        Ok(Response::new(VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "fake".into(),
            runtime_version: "1".into(),
            runtime_api_version: v,
        }))
    }

    async fn run_pod_sandbox(
        &self,
        r: Request<RunPodSandboxRequest>,
    ) -> Result<Response<RunPodSandboxResponse>, Status> {
        self.record("RunPodSandbox");
        let config = r.into_inner().config.unwrap_or_default();
        let mut s = self.state();
        s.next += 1;
        let id = format!("sb{}", s.next);
        let sandbox = PodSandbox {
            id: id.clone(),
            metadata: config.metadata.clone(),
            state: PodSandboxState::SandboxReady.into(),
            created_at: i64::from(s.next),
            labels: config.labels.clone(),
            ..PodSandbox::default()
        };
        s.sandboxes.push((sandbox, config));
        Ok(Response::new(RunPodSandboxResponse { pod_sandbox_id: id }))
    }

    async fn stop_pod_sandbox(
        &self,
        r: Request<StopPodSandboxRequest>,
    ) -> Result<Response<StopPodSandboxResponse>, Status> {
        let id = r.into_inner().pod_sandbox_id;
        self.record(&format!("StopPodSandbox {id}"));
        let mut s = self.state();
        for sb in s.sandboxes.iter_mut().filter(|sb| sb.0.id == id) {
            sb.0.state = PodSandboxState::SandboxNotready.into();
        }
        Ok(Response::new(StopPodSandboxResponse {}))
    }

    async fn remove_pod_sandbox(
        &self,
        r: Request<RemovePodSandboxRequest>,
    ) -> Result<Response<RemovePodSandboxResponse>, Status> {
        let id = r.into_inner().pod_sandbox_id;
        self.record(&format!("RemovePodSandbox {id}"));
        let mut s = self.state();
        s.sandboxes.retain(|sb| sb.0.id != id);
        s.containers.retain(|c| c.0.pod_sandbox_id != id);
        Ok(Response::new(RemovePodSandboxResponse {}))
    }

    async fn pod_sandbox_status(
        &self,
        r: Request<PodSandboxStatusRequest>,
    ) -> Result<Response<PodSandboxStatusResponse>, Status> {
        let id = r.into_inner().pod_sandbox_id;
        let s = self.state();
        let sb = s.sandboxes.iter().find(|sb| sb.0.id == id).ok_or_else(|| Status::not_found("no such sandbox"))?;
        // What CNI gave it (the runtime reads it only for a pod on the pod network).
        let network =
            PodSandboxNetworkStatus { ip: "10.88.0.9".into(), additional_ips: vec![PodIp { ip: "fd00::9".into() }] };
        let status = PodSandboxStatus { id, state: sb.0.state, network: Some(network), ..PodSandboxStatus::default() };
        Ok(Response::new(PodSandboxStatusResponse { status: Some(status), ..PodSandboxStatusResponse::default() }))
    }

    async fn list_pod_sandbox(
        &self,
        r: Request<ListPodSandboxRequest>,
    ) -> Result<Response<ListPodSandboxResponse>, Status> {
        let f = r.into_inner().filter.unwrap_or_default();
        let items = self
            .state()
            .sandboxes
            .iter()
            .map(|sb| sb.0.clone())
            .filter(|sb| f.state.as_ref().is_none_or(|st| st.state == sb.state))
            .filter(|sb| matches(&sb.labels, &f.label_selector))
            .collect();
        Ok(Response::new(ListPodSandboxResponse { items }))
    }

    async fn create_container(
        &self,
        r: Request<CreateContainerRequest>,
    ) -> Result<Response<CreateContainerResponse>, Status> {
        self.record("CreateContainer");
        let r = r.into_inner();
        let mut s = self.state();
        match s.sandboxes.iter().find(|sb| sb.0.id == r.pod_sandbox_id) {
            None => return Err(Status::not_found(format!("sandbox {} not found", r.pod_sandbox_id))),
            Some(sb) if sb.0.state() != PodSandboxState::SandboxReady => {
                return Err(Status::unknown("sandbox container is not running"));
            }
            Some(_) => {}
        }
        s.next += 1;
        let id = format!("c{}", s.next);
        let config = r.config.unwrap_or_default();
        let c = Container {
            id: id.clone(),
            pod_sandbox_id: r.pod_sandbox_id,
            metadata: config.metadata.clone(),
            state: ContainerState::ContainerCreated.into(),
            created_at: i64::from(s.next),
            labels: config.labels.clone(),
            image_ref: config.image.as_ref().map(|i| format!("sha256:{}", i.image)).unwrap_or_default(),
            ..Container::default()
        };
        let status = ContainerStatus { id: id.clone(), ..ContainerStatus::default() };
        s.containers.push((c, status, config));
        Ok(Response::new(CreateContainerResponse { container_id: id }))
    }

    async fn start_container(
        &self,
        r: Request<StartContainerRequest>,
    ) -> Result<Response<StartContainerResponse>, Status> {
        let id = r.into_inner().container_id;
        self.record("StartContainer");
        let mut s = self.state();
        let c = s.containers.iter_mut().find(|c| c.0.id == id).ok_or_else(|| Status::not_found("no container"))?;
        c.0.state = ContainerState::ContainerRunning.into();
        c.1.state = ContainerState::ContainerRunning.into();
        c.1.started_at = 1_000_000_000;
        Ok(Response::new(StartContainerResponse {}))
    }

    async fn stop_container(
        &self,
        r: Request<StopContainerRequest>,
    ) -> Result<Response<StopContainerResponse>, Status> {
        let r = r.into_inner();
        self.record(&format!("StopContainer {} {}", r.container_id, r.timeout));
        self.exit(&r.container_id, if r.timeout == 0 { 137 } else { 143 }, "Error");
        Ok(Response::new(StopContainerResponse {}))
    }

    async fn remove_container(
        &self,
        r: Request<RemoveContainerRequest>,
    ) -> Result<Response<RemoveContainerResponse>, Status> {
        let id = r.into_inner().container_id;
        self.record(&format!("RemoveContainer {id}"));
        self.state().containers.retain(|c| c.0.id != id);
        Ok(Response::new(RemoveContainerResponse {}))
    }

    async fn reopen_container_log(
        &self,
        r: Request<ReopenContainerLogRequest>,
    ) -> Result<Response<ReopenContainerLogResponse>, Status> {
        self.record(&format!("ReopenContainerLog {}", r.into_inner().container_id));
        Ok(Response::new(ReopenContainerLogResponse {}))
    }

    async fn list_container_stats(
        &self,
        _r: Request<ListContainerStatsRequest>,
    ) -> Result<Response<ListContainerStatsResponse>, Status> {
        // Every container, exited ones too (containerd leaves those out, other runtimes may not); one without
        // labels (another client's) too.
        let s = self.state();
        let stats = s
            .containers
            .iter()
            .map(|c| ContainerStats {
                attributes: Some(ContainerAttributes {
                    id: c.0.id.clone(),
                    metadata: c.0.metadata.clone(),
                    labels: c.0.labels.clone(),
                }),
                writable_layer: Some(FilesystemUsage {
                    timestamp: 1,
                    fs_id: None,
                    used_bytes: Some(UInt64Value { value: s.written.get(&c.0.id).copied().unwrap_or(0) }),
                    // A file per MiB written.
                    inodes_used: s.written.get(&c.0.id).map(|b| UInt64Value { value: b >> 20 }),
                }),
            })
            .chain(std::iter::once(ContainerStats {
                attributes: Some(ContainerAttributes::default()),
                writable_layer: None,
            }))
            .collect();
        Ok(Response::new(ListContainerStatsResponse { stats }))
    }

    async fn list_containers(
        &self,
        r: Request<ListContainersRequest>,
    ) -> Result<Response<ListContainersResponse>, Status> {
        let f = r.into_inner().filter.unwrap_or_default();
        let containers = self
            .state()
            .containers
            .iter()
            .map(|c| c.0.clone())
            .filter(|c| f.pod_sandbox_id.is_empty() || c.pod_sandbox_id == f.pod_sandbox_id)
            .filter(|c| f.state.as_ref().is_none_or(|st| st.state == c.state))
            .filter(|c| matches(&c.labels, &f.label_selector))
            .collect();
        Ok(Response::new(ListContainersResponse { containers }))
    }

    async fn container_status(
        &self,
        r: Request<ContainerStatusRequest>,
    ) -> Result<Response<ContainerStatusResponse>, Status> {
        let id = r.into_inner().container_id;
        let s = self.state();
        let c = s.containers.iter().find(|c| c.0.id == id).ok_or_else(|| Status::not_found("no such container"))?;
        Ok(Response::new(ContainerStatusResponse { status: Some(c.1.clone()), info: HashMap::new() }))
    }

    async fn update_container_resources(
        &self,
        _r: Request<UpdateContainerResourcesRequest>,
    ) -> Result<Response<UpdateContainerResourcesResponse>, Status> {
        Err(Status::unimplemented("not scripted"))
    }

    async fn exec_sync(&self, r: Request<ExecSyncRequest>) -> Result<Response<ExecSyncResponse>, Status> {
        let r = r.into_inner();
        if r.cmd.first().is_some_and(|c| c == "sleep") {
            return Err(Status::deadline_exceeded(format!("timeout {}s exceeded", r.timeout)));
        }
        Ok(Response::new(ExecSyncResponse { stdout: r.cmd.join(" ").into_bytes(), stderr: vec![], exit_code: 3 }))
    }

    async fn exec(&self, r: Request<ExecRequest>) -> Result<Response<ExecResponse>, Status> {
        let r = r.into_inner();
        self.known(&r.container_id)?;
        let flags = [r.stdin, r.stdout, r.stderr, r.tty].map(u8::from);
        let url = format!("http://stream/exec/{}?cmd={}&flags={flags:?}", r.container_id, r.cmd.join("+"));
        Ok(Response::new(ExecResponse { url }))
    }

    async fn attach(&self, r: Request<AttachRequest>) -> Result<Response<AttachResponse>, Status> {
        let r = r.into_inner();
        self.known(&r.container_id)?;
        let flags = [r.stdin, r.stdout, r.stderr, r.tty].map(u8::from);
        Ok(Response::new(AttachResponse { url: format!("http://stream/attach/{}?flags={flags:?}", r.container_id) }))
    }

    async fn port_forward(&self, r: Request<PortForwardRequest>) -> Result<Response<PortForwardResponse>, Status> {
        let r = r.into_inner();
        if !self.state().sandboxes.iter().any(|s| s.0.id == r.pod_sandbox_id) {
            return Err(Status::not_found("no such sandbox"));
        }
        Ok(Response::new(PortForwardResponse {
            url: format!("http://stream/pf/{}?ports={:?}", r.pod_sandbox_id, r.port),
        }))
    }

    async fn status(&self, r: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        // containerd's verbose status: its config, with the sandbox image.
        let info = match r.into_inner().verbose {
            true => [("config".to_owned(), r#"{"sandboxImage":"localhost/sandbox:1"}"#.to_owned())].into(),
            false => HashMap::new(),
        };
        let not_ready = self.state().network_not_ready.clone();
        let condition = |kind: &str, reason: &str, message: Option<String>| RuntimeCondition {
            r#type: kind.into(),
            status: message.is_none(),
            reason: if message.is_some() { reason.into() } else { String::new() },
            message: message.unwrap_or_default(),
        };
        let conditions =
            vec![condition("RuntimeReady", "", None), condition("NetworkReady", "NetworkPluginNotReady", not_ready)];
        Ok(Response::new(StatusResponse { status: Some(RuntimeStatus { conditions }), info }))
    }
}

#[tonic::async_trait]
impl ImageService for Fake {
    async fn image_fs_info(&self, _r: Request<ImageFsInfoRequest>) -> Result<Response<ImageFsInfoResponse>, Status> {
        let mountpoint = self.state().image_fs.clone();
        let fs = |mountpoint: String| FilesystemUsage {
            fs_id: Some(FilesystemIdentifier { mountpoint }),
            ..FilesystemUsage::default()
        };
        Ok(Response::new(ImageFsInfoResponse {
            image_filesystems: mountpoint.into_iter().map(fs).collect(),
            container_filesystems: Vec::new(),
        }))
    }

    async fn list_images(&self, _r: Request<ListImagesRequest>) -> Result<Response<ListImagesResponse>, Status> {
        let images = self
            .state()
            .images
            .iter()
            .map(|i| Image {
                id: format!("sha256:{i}"),
                repo_tags: vec![i.clone()],
                size: 1 << 20,
                pinned: i.contains("pause"),
                ..Image::default()
            })
            .collect();
        Ok(Response::new(ListImagesResponse { images }))
    }

    async fn image_status(&self, r: Request<ImageStatusRequest>) -> Result<Response<ImageStatusResponse>, Status> {
        let name = r.into_inner().image.unwrap_or_default().image;
        // By name or by the reference a pull answered.
        let name = name.strip_prefix("sha256:").map_or(name.clone(), str::to_owned);
        let present = self.state().images.contains(&name);
        let image = present.then(|| Image { id: name.clone(), size: 1 << 20, ..Image::default() });
        Ok(Response::new(ImageStatusResponse { image, info: HashMap::new() }))
    }

    async fn pull_image(&self, r: Request<PullImageRequest>) -> Result<Response<PullImageResponse>, Status> {
        let r = r.into_inner();
        let name = r.image.unwrap_or_default().image;
        match &r.auth {
            Some(a) => self.record(&format!("PullImage {name} as {}", a.username)),
            None => self.record(&format!("PullImage {name}")),
        }
        let mut s = self.state();
        if !s.pullable.contains(&name) {
            return Err(Status::not_found(format!("{name}: not found")));
        }
        if let Some((user, password)) = &s.private
            && r.auth.is_none_or(|a| (&a.username, &a.password) != (user, password))
        {
            return Err(Status::unauthenticated("pull access denied"));
        }
        s.images.insert(name.clone());
        Ok(Response::new(PullImageResponse { image_ref: format!("sha256:{name}") }))
    }

    async fn remove_image(&self, r: Request<RemoveImageRequest>) -> Result<Response<RemoveImageResponse>, Status> {
        let id = r.into_inner().image.unwrap_or_default().image;
        self.record(&format!("RemoveImage {id}"));
        let name = id.strip_prefix("sha256:").unwrap_or(&id).to_owned();
        match self.state().images.remove(&name) {
            true => Ok(Response::new(RemoveImageResponse {})),
            false => Err(Status::not_found(format!("image {id} not found"))),
        }
    }
}

/// Serves `fake` on a socket at `path` until the test ends.
fn serve(fake: &Fake, path: &Path) {
    let listener = tokio::net::UnixListener::bind(path).unwrap();
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let router = tonic::transport::Server::builder()
        .add_service(RuntimeServiceServer::new(fake.clone()))
        .add_service(ImageServiceServer::new(fake.clone()));
    tokio::spawn(router.serve_with_incoming(incoming));
}

fn settings(path: &Path) -> CriSettings {
    CriSettings {
        endpoint: format!("unix://{}", path.display()),
        request_timeout: Duration::from_secs(5),
        parallel_pulls: Some(1),
        poll: Duration::from_millis(20),
        managed: "true".into(),
    }
}

fn started(fake: &Fake, dir: &Path) -> Arc<CriRuntime> {
    let path = dir.join("cri.sock");
    fake.state().api_version = "v1".into();
    serve(fake, &path);
    let metrics = RuntimeMetrics::new(&prometheus::Registry::new()).unwrap();
    Arc::new(CriRuntime::new(settings(&path), Some(metrics)).unwrap())
}

fn sandbox(uid: &str) -> SandboxSpec {
    SandboxSpec {
        pod_uid: uid.into(),
        name: format!("pod-{uid}"),
        namespace: "default".into(),
        cgroup_parent: CgroupPath::parse(&format!("/nodewarden/kubepods/pod{uid}")).unwrap(),
        host_network: true,
        host_pid: false,
        host_ipc: false,
        hostname: String::new(),
        log_directory: format!("/var/log/pods/default_pod-{uid}_{uid}").into(),
        labels: Default::default(),
        annotations: Default::default(),
        resources: LinuxResources::default(),
        sysctls: Default::default(),
        privileged: false,
    }
}

fn container(sandbox_id: &str, uid: &str, image: &str, policy: PullPolicy) -> ContainerSpec {
    ContainerSpec {
        pod_uid: uid.into(),
        sandbox_id: sandbox_id.into(),
        name: "app".into(),
        attempt: 0,
        image: image.into(),
        pull_policy: policy,
        command: vec![],
        args: vec![],
        env: vec![],
        working_dir: None,
        user: None,
        group: None,
        cgroup: CgroupPath::parse(&format!("/nodewarden/kubepods/pod{uid}/app")).unwrap(),
        oom_score_adj: 1000,
        resources: LinuxResources {
            cpu_shares: 2,
            cpu_period: 100_000,
            memory_limit: Some(32 << 20),
            ..LinuxResources::default()
        },
        log_path: format!("/var/log/pods/default_pod-{uid}_{uid}/app/0.log").into(),
        mounts: vec![SpecMount { source: "/tmp".into(), target: "/data".into(), read_only: false }],
        security: crate::security::Security::default(),
        pull_auths: Vec::new(),
    }
}

#[tokio::test]
async fn a_pod_runs_in_its_placement_and_its_oom_kill_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::default();
    fake.state().pullable.insert("localhost/app:1".into());
    let rt = started(&fake, dir.path());
    tokio::spawn(rt.clone().monitor(CancellationToken::new()));
    assert_eq!(rt.check_version().await.unwrap(), ("fake".to_owned(), "1".to_owned()));

    let sb = rt.run_sandbox(&sandbox("u1")).await.unwrap().id;
    let app = container(&sb, "u1", "localhost/app:1", PullPolicy::IfNotPresent);
    assert!(!rt.image_present("localhost/app:1").await.unwrap());
    let pulled = rt.pull_image(&app).await.unwrap();
    assert_eq!((pulled.image_ref.as_str(), pulled.size_bytes), ("sha256:localhost/app:1", 1 << 20));
    assert!(rt.image_present("localhost/app:1").await.unwrap());
    let c = rt.start(&app).await.unwrap();
    {
        let s = fake.state();
        assert_eq!(s.sandboxes[0].1.linux.as_ref().unwrap().cgroup_parent, "/nodewarden/kubepods/podu1");
        let config = &s.containers[0].2;
        let r = config.linux.as_ref().unwrap().resources.as_ref().unwrap();
        assert_eq!((r.memory_limit_in_bytes, r.oom_score_adj), (32 << 20, 1000));
        assert_eq!(config.log_path, "app/0.log");
        assert_eq!(s.calls, ["RunPodSandbox", "PullImage localhost/app:1", "CreateContainer", "StartContainer"]);
    }
    // The monitor's image list reaches the Node's facts (when it is due is tested in `health.rs`).
    for _ in 0..250 {
        if !rt.images().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(rt.images().iter().map(|i| i.names.clone()).collect::<Vec<_>>(), [["localhost/app:1"]]);
    // Starting a container does not pull (pod sync makes its image present first, under its pull policy).
    let mut second = container(&sb, "u1", "localhost/app:1", PullPolicy::Always);
    second.name = "second".into();
    rt.start(&second).await.unwrap();
    assert_eq!(fake.state().calls.iter().filter(|c| c.starts_with("PullImage")).count(), 1);

    fake.exit(c.id.as_str(), 137, "OOMKilled");
    let info = tokio::time::timeout(Duration::from_secs(5), rt.wait(&c.id)).await.unwrap();
    assert_eq!((info.exit_code, info.reason.as_str(), info.signal), (137, "OOMKilled", Some(9)));

    // A container whose sandbox died is stopped, so that the pod starts again in a new sandbox.
    let orphan = rt.adopt(&second, None).await.unwrap();
    fake.state().sandboxes[0].0.state = PodSandboxState::SandboxNotready.into();
    let info = tokio::time::timeout(Duration::from_secs(5), rt.wait(&orphan.id)).await.unwrap();
    assert_eq!(info.exit_code, 137);
    assert!(fake.state().calls.contains(&format!("StopContainer {} 0", orphan.id)));
    fake.state().sandboxes[0].0.state = PodSandboxState::SandboxReady.into();
    let mut again = second.clone();
    again.name = "again".into();
    let second = again;
    rt.start(&second).await.unwrap();

    // A container the runtime lost ends as ContainerStatusUnknown.
    let lost = rt.adopt(&second, None).await.unwrap();
    fake.state().containers.clear();
    let info = tokio::time::timeout(Duration::from_secs(5), rt.wait(&lost.id)).await.unwrap();
    assert_eq!((info.exit_code, info.reason.as_str()), (137, "ContainerStatusUnknown"));
    // ... and a sandbox that died or that it lost makes the start ask for a new sandbox, which replaces it.
    fake.state().sandboxes[0].0.state = PodSandboxState::SandboxNotready.into();
    let err = rt.start(&second).await.unwrap_err();
    assert_eq!(err, RuntimeError::SandboxNotFound(sb.clone()));
    let replacement = rt.run_sandbox(&sandbox("u1")).await.unwrap().id;
    let ids: Vec<String> = fake.state().sandboxes.iter().map(|s| s.0.id.clone()).collect();
    assert_eq!(ids, std::slice::from_ref(&replacement), "the dead sandbox was removed");
    assert_eq!(fake.state().sandboxes[0].1.metadata.as_ref().unwrap().attempt, 1);
    fake.state().sandboxes.clear();
    let mut third = second.clone();
    third.sandbox_id = replacement.clone();
    assert_eq!(rt.start(&third).await.unwrap_err(), RuntimeError::SandboxNotFound(replacement));
}

#[tokio::test]
async fn pulls_try_each_credential_and_fail_with_the_kubelets_reason() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::default();
    let rt = started(&fake, dir.path());
    let sb = rt.run_sandbox(&sandbox("u2")).await.unwrap().id;
    let err = rt.pull_image(&container(&sb, "u2", "registry.invalid/x:1", PullPolicy::IfNotPresent)).await.unwrap_err();
    let RuntimeError::Image { reason, message } = err else { panic!("{err:?}") };
    assert_eq!(reason, "ErrImagePull");
    assert_eq!(message, "rpc error: code = NotFound desc = registry.invalid/x:1: not found", "the runtime's words");
    let elsewhere = container("gone", "u2", "localhost/here:1", PullPolicy::Always);
    assert_eq!(rt.pull_image(&elsewhere).await.unwrap_err(), RuntimeError::SandboxNotFound("gone".into()));

    // A private image: each credential in turn until one is let in; without one, the registry's refusal.
    fake.state().pullable.insert("reg.example/private:1".into());
    fake.state().private = Some(("right".into(), "pw".into()));
    let auth = |user: &str| crate::RegistryAuth {
        server_address: "reg.example".into(),
        username: user.into(),
        password: "pw".into(),
        ..crate::RegistryAuth::default()
    };
    let mut private = container(&sb, "u2", "reg.example/private:1", PullPolicy::Always);
    private.pull_auths = vec![auth("wrong"), auth("right")];
    rt.pull_image(&private).await.unwrap();
    let calls = fake.state().calls.clone();
    let pulls: Vec<&String> = calls.iter().filter(|c| c.starts_with("PullImage reg.example")).collect();
    assert_eq!(pulls, ["PullImage reg.example/private:1 as wrong", "PullImage reg.example/private:1 as right"]);
    private.pull_auths.clear();
    let err = rt.pull_image(&private).await.unwrap_err();
    assert!(
        matches!(&err, RuntimeError::Image { reason: "ErrImagePull", message } if message.contains("denied")),
        "{err:?}"
    );
}

#[tokio::test]
async fn images_are_listed_with_those_in_use_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::default();
    let images = ["localhost/app:1", "localhost/old:1", "localhost/pause:3", "localhost/sandbox:1"];
    fake.state().images.extend(images.map(str::to_owned));
    let rt = started(&fake, dir.path());
    let sb = rt.run_sandbox(&sandbox("u3")).await.unwrap().id;
    rt.start(&container(&sb, "u3", "localhost/app:1", PullPolicy::IfNotPresent)).await.unwrap();
    let listed = rt.list_images().await.unwrap();
    let ids: Vec<(&str, bool)> = listed.iter().map(|i| (i.id.as_str(), i.pinned)).collect();
    // Pinned by the runtime, or its sandbox image (which containerd 1.6 does not pin).
    let want = [
        ("sha256:localhost/app:1", false),
        ("sha256:localhost/old:1", false),
        ("sha256:localhost/pause:3", true),
        ("sha256:localhost/sandbox:1", true),
    ];
    assert_eq!(ids, want);
    assert_eq!((listed[0].names.as_slice(), listed[0].size_bytes), (&["localhost/app:1".to_owned()][..], 1 << 20));
    assert_eq!(rt.images_in_use().await.unwrap(), ["sha256:localhost/app:1".to_owned()].into());
    rt.remove_image("sha256:localhost/old:1").await.unwrap();
    rt.remove_image("sha256:localhost/old:1").await.unwrap();
    assert_eq!(rt.list_images().await.unwrap().len(), 3, "removed; a second removal is no error");
}

#[tokio::test]
async fn the_image_file_system_is_the_one_image_fs_info_names() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::default();
    let rt = started(&fake, dir.path());
    assert_eq!(rt.image_fs().await.unwrap(), None, "none named");
    fake.state().image_fs = Some("relative/dir".into());
    assert_eq!(rt.image_fs().await.unwrap(), None, "not a mount point");
    fake.state().image_fs = Some("/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs".into());
    let named = rt.image_fs().await.unwrap();
    assert_eq!(named, Some("/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs".into()));
}

#[tokio::test]
async fn writable_layers_are_read_from_the_container_stats_by_pod_and_name() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::default();
    fake.state().images.insert("localhost/app:1".into());
    let rt = started(&fake, dir.path());
    let sb = rt.run_sandbox(&sandbox("u5")).await.unwrap().id;
    let id = rt.start(&container(&sb, "u5", "localhost/app:1", PullPolicy::IfNotPresent)).await.unwrap().id;
    fake.state().written.insert(id.as_str().to_owned(), 7 << 20);
    let layers = rt.writable_layers().await.unwrap();
    let want = WritableLayer { pod_uid: "u5".into(), container: "app".into(), bytes: 7 << 20, inodes: 7 };
    assert_eq!(layers, [want], "the unlabelled container without a measure is left out");
    fake.exit(id.as_str(), 0, "Completed");
    assert_eq!(rt.writable_layers().await.unwrap(), [], "a container that exited is no pod's usage");
}

#[tokio::test]
async fn stops_execs_adoption_and_reconciliation() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::default();
    fake.state().images.insert("img:1".into());
    let rt = started(&fake, dir.path());
    let keep = rt.run_sandbox(&sandbox("keep")).await.unwrap().id;
    let c = rt.start(&container(&keep, "keep", "img:1", PullPolicy::IfNotPresent)).await.unwrap();
    let gone = rt.run_sandbox(&sandbox("gone")).await.unwrap().id;
    // A sandbox someone else made (no nodewarden label) is never touched.
    fake.state().sandboxes.push((PodSandbox { id: "foreign".into(), ..PodSandbox::default() }, Default::default()));
    // Nor is one of another nodewarden, with a rootDir of its own, on the same runtime, even for the same pod.
    let other_settings =
        CriSettings { managed: managed_value(Path::new("/var/lib/other")), ..settings(&dir.path().join("cri.sock")) };
    assert_ne!(other_settings.managed, "true");
    assert_eq!(managed_value(Path::new(DEFAULT_ROOT_DIR)), "true", "the default keeps the earlier mark");
    let other = CriRuntime::new(other_settings, None).unwrap();
    let theirs = other.run_sandbox(&sandbox("keep")).await.unwrap().id;

    // A restarted daemon finds the sandbox and the running container; nothing new is created.
    let fresh = CriRuntime::new(settings(&dir.path().join("cri.sock")), None).unwrap();
    assert_eq!(fresh.adopt_sandbox(&sandbox("keep")).await.map(|s| s.id), Some(keep.clone()));
    let adopted = fresh.adopt(&container(&keep, "keep", "img:1", PullPolicy::IfNotPresent), None).await.unwrap();
    assert_eq!(adopted.id, c.id);
    assert_eq!(fresh.adopt_sandbox(&sandbox("never-ran")).await, None);

    fresh.reconcile(&["keep".to_owned()].into()).await;
    let ids: Vec<String> = fake.state().sandboxes.iter().map(|s| s.0.id.clone()).collect();
    assert_eq!(ids, [keep.clone(), "foreign".to_owned(), theirs.clone()]);
    // The other daemon adopts its own sandbox of the pod, and its reconciliation leaves this one's alone.
    assert_eq!(other.adopt_sandbox(&sandbox("keep")).await.map(|s| s.id), Some(theirs.clone()));
    other.reconcile(&BTreeSet::new()).await;
    let ids: Vec<String> = fake.state().sandboxes.iter().map(|s| s.0.id.clone()).collect();
    assert_eq!(ids, [keep.clone(), "foreign".to_owned()]);
    assert!(fake.state().calls.contains(&format!("StopPodSandbox {gone}")));

    let out = Runtime::exec(&*rt, &c.id, &["echo".into(), "hi".into()], Duration::from_secs(1)).await.unwrap();
    assert_eq!((out.exit_code, out.output.as_str()), (Some(3), "echo hi"));
    let out = Runtime::exec(&*rt, &c.id, &["sleep".into()], Duration::from_secs(1)).await.unwrap();
    assert_eq!(out.exit_code, None, "a timed-out probe command has no exit code");

    // A stop passes the grace period; a kill is a stop with none. Both are done when the call returns.
    rt.stop(&c.id, Duration::from_secs(7)).await.unwrap();
    rt.stop(&c.id, Duration::ZERO).await.unwrap();
    let calls = fake.state().calls.clone();
    assert!(calls.contains(&format!("StopContainer {} 7", c.id)), "a stop passes the grace period: {calls:?}");
    assert!(calls.contains(&format!("StopContainer {} 0", c.id)), "{calls:?}");

    // A pod that is over keeps its sandbox, stopped, until it is removed.
    rt.stop_sandboxes("keep").await;
    let state = |id: &str| fake.state().sandboxes.iter().find(|s| s.0.id == id).map(|s| s.0.state());
    assert_eq!(state(&keep), Some(PodSandboxState::SandboxNotready));
    let stopped = rt.start(&container(&keep, "keep", "img:1", PullPolicy::IfNotPresent)).await;
    assert!(matches!(stopped, Err(RuntimeError::SandboxNotFound(_))), "no container starts in a stopped sandbox");
    rt.remove_sandboxes("keep").await;
    assert_eq!(state(&keep), None);
    assert_eq!(fake.state().sandboxes.len(), 1, "only the foreign sandbox is left");
}

#[tokio::test]
async fn an_unreachable_runtime_is_reported_and_its_return_noticed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("later.sock");
    let rt = Arc::new(CriRuntime::new(settings(&path), None).unwrap());
    let err = rt.check_version().await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    let message = err.to_string();
    assert!(message.contains("later.sock") && message.contains("No such file"), "{message}");
    let down = rt.health().runtime.unwrap();
    assert_eq!(down.message, "container runtime status check may not have completed yet", "the kubelet's words");
    assert!(down.to_string().contains("later.sock"), "the cause for /readyz: {down}");
    assert_eq!(rt.version(), "containerd://Unknown");
    let err = rt.run_sandbox(&sandbox("u3")).await.unwrap_err();
    assert!(matches!(err, RuntimeError::Unavailable(_)), "{err:?}");

    tokio::spawn(rt.clone().monitor(CancellationToken::new()));
    let fake = Fake::default();
    fake.state().api_version = "v1".into();
    serve(&fake, &path);
    for _ in 0..250 {
        if rt.health() == RuntimeHealth::default() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(rt.health(), RuntimeHealth::default(), "healthy once the runtime answers and says it is ready");
    assert_eq!(rt.version(), "fake://1", "the version is asked again once the runtime is back");
    rt.run_sandbox(&sandbox("u3")).await.unwrap();

    assert!(CriRuntime::new(settings(Path::new("relative.sock")), None).is_err(), "a relative path is refused");
    assert!(matches!(CriClient::new("tcp://localhost:1", Duration::from_secs(1)), Err(CriError::Endpoint(_))));
}

#[tokio::test]
async fn a_runtime_that_does_not_serve_cri_v1_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::default();
    let rt = started(&fake, dir.path());
    fake.state().api_version = "v1alpha2".into();
    let err = rt.check_version().await.unwrap_err();
    assert!(!err.is_transient());
    assert!(err.to_string().contains("v1alpha2"), "{err}");
}

#[tokio::test]
async fn a_log_is_rotated_by_rename_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::default();
    let rt = started(&fake, dir.path());
    let log = dir.path().join("0.log");
    std::fs::write(&log, "old lines\n").unwrap();
    let to = dir.path().join("0.log.20261201-000000");
    rt.rotate_log(&ContainerId::new("c1"), &log, &to, 1).await.unwrap();
    assert_eq!(std::fs::read_to_string(&to).unwrap(), "old lines\n");
    assert!(!log.exists(), "the runtime makes the new file when it reopens");
    assert_eq!(fake.state().calls.last().map(String::as_str), Some("ReopenContainerLog c1"));
}

#[tokio::test]
async fn a_pod_network_that_is_not_ready_holds_pods_off_it_and_not_host_network_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cri.sock");
    let fake = Fake::default();
    fake.state().api_version = "v1".into();
    let message = "Network plugin returns error: cni plugin not initialized";
    fake.state().network_not_ready = Some(message.into());
    serve(&fake, &path);
    let rt = Arc::new(CriRuntime::new(settings(&path), None).unwrap());
    assert_eq!(rt.health().runtime.unwrap().message, "container runtime status check may not have completed yet");
    rt.check_version().await.unwrap();
    tokio::spawn(rt.clone().monitor(CancellationToken::new()));
    let wanted = format!(
        "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:{message}"
    );
    let mut health = rt.health();
    for _ in 0..250 {
        if health.runtime.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        health = rt.health();
    }
    assert_eq!((health.runtime, health.network.map(|p| p.message)), (None, Some(wanted.clone())));
    // A pod on the pod network waits, with the kubelet's message; a host-network pod starts.
    let pod_network = SandboxSpec { host_network: false, ..sandbox("net") };
    let err = rt.run_sandbox(&pod_network).await.unwrap_err();
    assert_eq!(err.to_string(), format!("network is not ready: {wanted}"));
    assert!(!fake.state().calls.contains(&"RunPodSandbox".to_owned()), "no sandbox was asked for");
    rt.run_sandbox(&sandbox("host")).await.unwrap();
    // A CNI config appears: within a relist or two the pod network is ready.
    fake.state().network_not_ready = None;
    for _ in 0..250 {
        if rt.health().network.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(rt.health(), RuntimeHealth::default());
    let running = rt.run_sandbox(&pod_network).await.unwrap();
    assert_eq!(running.ips, ["10.88.0.9", "fd00::9"], "the pod's IPs, the primary first");
    assert!(rt.run_sandbox(&sandbox("host2")).await.unwrap().ips.is_empty(), "a host-network pod has the node's");
}

#[tokio::test]
async fn interactive_sessions_come_from_the_runtimes_streaming_server() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::default();
    fake.state().images.insert("img:1".into());
    let rt = started(&fake, dir.path());
    let sb = rt.run_sandbox(&sandbox("u1")).await.unwrap().id;
    let c = rt.start(&container(&sb, "u1", "img:1", PullPolicy::IfNotPresent)).await.unwrap();
    let streaming = rt.streaming().expect("a CRI runtime serves sessions");
    let out = Streams { stdout: true, stderr: true, ..Streams::default() };
    let tty = Streams { stdin: true, stdout: true, tty: true, ..Streams::default() };
    let sh = ["sh".to_owned(), "-c".to_owned(), "ls".to_owned()];
    assert_eq!(
        streaming.exec_session(&c.id, &sh, out).await.unwrap(),
        format!("http://stream/exec/{}?cmd=sh+-c+ls&flags=[0, 1, 1, 0]", c.id)
    );
    assert_eq!(
        streaming.attach_session(&c.id, tty).await.unwrap(),
        format!("http://stream/attach/{}?flags=[1, 1, 0, 1]", c.id)
    );
    assert_eq!(
        streaming.port_forward_session(&sb, &[80, 65535]).await.unwrap(),
        format!("http://stream/pf/{sb}?ports=[80, 65535]")
    );
    // What the CRI refuses is refused before any call; unknown containers and sandboxes are said so.
    let calls = fake.state().calls.len();
    let none = Streams { tty: true, ..Streams::default() };
    assert!(matches!(streaming.exec_session(&c.id, &sh, none).await, Err(RuntimeError::Config(_))));
    assert!(matches!(
        streaming.attach_session(&c.id, Streams { stderr: true, ..tty }).await,
        Err(RuntimeError::Config(_))
    ));
    assert!(matches!(streaming.exec_session(&c.id, &[], out).await, Err(RuntimeError::Config(_))));
    assert_eq!(fake.state().calls.len(), calls);
    let gone = ContainerId::from("gone");
    assert!(matches!(streaming.exec_session(&gone, &sh, out).await, Err(RuntimeError::NotFound(id)) if id == "gone"));
    assert!(
        matches!(streaming.port_forward_session("nope", &[80]).await, Err(RuntimeError::SandboxNotFound(id)) if id == "nope")
    );
}

#[test]
fn the_process_runtime_serves_no_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let fs = nodewarden_resources::CgroupFs::new(dir.path(), CgroupPath::parse("/nw").unwrap());
    let scratch = dir.path().join("scratch");
    let rt = crate::ProcessRuntime::new(fs, scratch, tokio_util::task::TaskTracker::new(), CancellationToken::new());
    assert!(rt.streaming().is_none());
}
