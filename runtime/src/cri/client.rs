//! A CRI client over a unix socket. Every call has a deadline; a call that failed because the runtime could not be
//! reached is retried with a back-off, so a containerd restart costs a pod sync a delay, not an error.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use nodewarden_proto::v1::image_service_client::ImageServiceClient;
use nodewarden_proto::v1::runtime_service_client::RuntimeServiceClient;
use nodewarden_proto::v1::{
    AttachRequest, Container, ContainerFilter, ContainerStats, ContainerStatusRequest, ContainerStatusResponse,
    CreateContainerRequest, ExecRequest, ExecSyncRequest, ExecSyncResponse, FilesystemUsage, Image, ImageFsInfoRequest,
    ImageSpec, ImageStatusRequest, ListContainerStatsRequest, ListContainersRequest, ListImagesRequest,
    ListPodSandboxRequest, PodSandbox, PodSandboxFilter, PodSandboxStatusRequest, PodSandboxStatusResponse,
    PortForwardRequest, PullImageRequest, RemoveContainerRequest, RemoveImageRequest, RemovePodSandboxRequest,
    ReopenContainerLogRequest, RunPodSandboxRequest, StartContainerRequest, StatusRequest, StatusResponse,
    StopContainerRequest, StopPodSandboxRequest, VersionRequest, VersionResponse,
};
use tonic::transport::{Channel, Endpoint, Uri};

use super::metrics::RuntimeMetrics;
use crate::seam::Streams;

/// The CRI API version nodewarden speaks.
pub const CRI_API_VERSION: &str = "v1";

/// The largest response accepted (the runtime caps exec output at 16 MiB per stream).
const MAX_MESSAGE: usize = 40 << 20;

/// Attempts of a call whose runtime could not be reached.
const ATTEMPTS: u32 = 4;

/// The first retry's delay; it doubles.
const FIRST_RETRY: Duration = Duration::from_millis(200);

/// One call of a generated client method, `service.method("Name", request, deadline)`, through
/// [`CriClient::call`]: the request is cloned for each attempt.
macro_rules! rpc {
    ($client:ident, $service:ident . $method:ident ($name:literal, $req:ident, $timeout:expr)) => {
        $client
            .call($name, $timeout, || {
                let mut c = $client.$service();
                let req = $req.clone();
                async move { c.$method(req).await }
            })
            .await
    };
}

/// A CRI call that failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CriError {
    /// The endpoint is not a unix socket address.
    #[error("containerRuntimeEndpoint {0:?} is not a unix socket (unix:///path)")]
    Endpoint(String),
    /// The runtime could not be reached (no socket, nobody listening, connection lost).
    #[error("{rpc}: cannot reach the CRI runtime at {endpoint}: {message}")]
    Unavailable {
        /// The call.
        rpc: &'static str,
        /// The endpoint.
        endpoint: String,
        /// Why.
        message: String,
    },
    /// The runtime answered with an error.
    #[error("{rpc}: {message} ({code:?})")]
    Status {
        /// The call.
        rpc: &'static str,
        /// The gRPC status code.
        code: tonic::Code,
        /// The runtime's message.
        message: String,
    },
    /// No answer within the deadline.
    #[error("{rpc}: no answer within {timeout:?}")]
    Timeout {
        /// The call.
        rpc: &'static str,
        /// The deadline.
        timeout: Duration,
    },
}

impl CriError {
    /// The gRPC code of a runtime's error.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Self::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// True when the runtime said the object does not exist.
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(tonic::Code::NotFound)
    }

    /// True when the runtime could not be reached or did not answer in time.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable { .. } | Self::Timeout { .. })
    }
}

/// The socket path of `unix:///path` (or a bare absolute path, as crictl accepts).
pub fn socket_path(endpoint: &str) -> Result<PathBuf, CriError> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    if !path.starts_with('/') || path.len() < 2 {
        return Err(CriError::Endpoint(endpoint.to_owned()));
    }
    Ok(PathBuf::from(path))
}

/// A client of one CRI endpoint. Cloning is cheap; clones share the connection, which is made on first use and
/// made again after it broke.
#[derive(Debug, Clone)]
pub struct CriClient {
    channel: Channel,
    endpoint: String,
    timeout: Duration,
    metrics: Option<RuntimeMetrics>,
}

impl CriClient {
    /// A client of `endpoint` (`unix:///run/containerd/containerd.sock`) whose calls time out after `timeout`
    /// (`runtimeRequestTimeout`). Nothing is connected yet.
    pub fn new(endpoint: &str, timeout: Duration) -> Result<Self, CriError> {
        let path = socket_path(endpoint)?;
        let connector = tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
        });
        // The authority is unused on a unix socket, but HTTP/2 needs one.
        let channel = Endpoint::from_static("http://cri.local").connect_with_connector_lazy(connector);
        Ok(Self { channel, endpoint: endpoint.to_owned(), timeout, metrics: None })
    }

    /// Counts and times every call in `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: RuntimeMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn runtime(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(self.channel.clone()).max_decoding_message_size(MAX_MESSAGE)
    }

    fn images(&self) -> ImageServiceClient<Channel> {
        ImageServiceClient::new(self.channel.clone()).max_decoding_message_size(MAX_MESSAGE)
    }

    /// Runs one call with a deadline, retrying while the runtime cannot be reached, and records it.
    async fn call<T, F, Fut>(&self, rpc: &'static str, timeout: Duration, f: F) -> Result<T, CriError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let started = tokio::time::Instant::now();
        let result = self.call_with_retries(rpc, timeout, f).await;
        if let Some(m) = &self.metrics {
            m.record(rpc, started.elapsed().as_secs_f64(), result.is_err());
        }
        result
    }

    async fn call_with_retries<T, F, Fut>(&self, rpc: &'static str, timeout: Duration, f: F) -> Result<T, CriError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut delay = FIRST_RETRY;
        let mut attempt = 1;
        loop {
            let err = match tokio::time::timeout(timeout, f()).await {
                Ok(Ok(r)) => return Ok(r.into_inner()),
                Ok(Err(s)) if s.code() == tonic::Code::Unavailable => {
                    CriError::Unavailable { rpc, endpoint: self.endpoint.clone(), message: unavailable_message(&s) }
                }
                Ok(Err(s)) => return Err(CriError::Status { rpc, code: s.code(), message: s.message().to_owned() }),
                Err(_) => return Err(CriError::Timeout { rpc, timeout }),
            };
            if attempt >= ATTEMPTS {
                return Err(err);
            }
            tracing::debug!(error = %err, attempt, "CRI runtime unreachable; retrying");
            tokio::time::sleep(delay).await;
            delay *= 2;
            attempt += 1;
        }
    }

    /// `Version`: the runtime's name and version, and the CRI API version it serves.
    pub async fn version(&self) -> Result<VersionResponse, CriError> {
        let req = VersionRequest { version: CRI_API_VERSION.to_owned() };
        rpc!(self, runtime.version("Version", req, self.timeout))
    }

    /// `Status`: the runtime's conditions (`RuntimeReady`, `NetworkReady`).
    pub async fn status(&self) -> Result<StatusResponse, CriError> {
        let req = StatusRequest { verbose: false };
        rpc!(self, runtime.status("Status", req, self.timeout))
    }

    /// The sandbox (pause) image the runtime runs pod sandboxes from, where its verbose `Status` says
    /// (containerd's `config.sandboxImage`).
    pub async fn sandbox_image(&self) -> Result<Option<String>, CriError> {
        let req = StatusRequest { verbose: true };
        let status = rpc!(self, runtime.status("Status", req, self.timeout))?;
        let config = status.info.get("config").and_then(|c| serde_json::from_str::<serde_json::Value>(c).ok());
        Ok(config.and_then(|c| c.get("sandboxImage")?.as_str().map(str::to_owned)))
    }

    /// `RunPodSandbox`: the new sandbox's ID.
    pub async fn run_pod_sandbox(&self, req: RunPodSandboxRequest) -> Result<String, CriError> {
        rpc!(self, runtime.run_pod_sandbox("RunPodSandbox", req, self.timeout)).map(|r| r.pod_sandbox_id)
    }

    /// `StopPodSandbox`.
    pub async fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let req = StopPodSandboxRequest { pod_sandbox_id: id.to_owned() };
        rpc!(self, runtime.stop_pod_sandbox("StopPodSandbox", req, self.timeout)).map(|_| ())
    }

    /// `RemovePodSandbox`.
    pub async fn remove_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let req = RemovePodSandboxRequest { pod_sandbox_id: id.to_owned() };
        rpc!(self, runtime.remove_pod_sandbox("RemovePodSandbox", req, self.timeout)).map(|_| ())
    }

    /// `PodSandboxStatus`, verbose.
    pub async fn pod_sandbox_status(&self, id: &str) -> Result<PodSandboxStatusResponse, CriError> {
        let req = PodSandboxStatusRequest { pod_sandbox_id: id.to_owned(), verbose: true };
        rpc!(self, runtime.pod_sandbox_status("PodSandboxStatus", req, self.timeout))
    }

    /// `ListPodSandbox`.
    pub async fn list_pod_sandbox(&self, filter: Option<PodSandboxFilter>) -> Result<Vec<PodSandbox>, CriError> {
        let req = ListPodSandboxRequest { filter };
        rpc!(self, runtime.list_pod_sandbox("ListPodSandbox", req, self.timeout)).map(|r| r.items)
    }

    /// `CreateContainer`: the new container's ID.
    pub async fn create_container(&self, req: CreateContainerRequest) -> Result<String, CriError> {
        rpc!(self, runtime.create_container("CreateContainer", req, self.timeout)).map(|r| r.container_id)
    }

    /// `StartContainer`.
    pub async fn start_container(&self, id: &str) -> Result<(), CriError> {
        let req = StartContainerRequest { container_id: id.to_owned() };
        rpc!(self, runtime.start_container("StartContainer", req, self.timeout)).map(|_| ())
    }

    /// `StopContainer`: the stop signal, then SIGKILL after `grace` (at once for zero). The call returns once the
    /// container has stopped, so its deadline is the grace period plus the request timeout.
    pub async fn stop_container(&self, id: &str, grace: Duration) -> Result<(), CriError> {
        let req = StopContainerRequest {
            container_id: id.to_owned(),
            timeout: i64::try_from(grace.as_secs()).unwrap_or(i64::MAX),
        };
        rpc!(self, runtime.stop_container("StopContainer", req, grace.saturating_add(self.timeout))).map(|_| ())
    }

    /// `RemoveContainer`.
    pub async fn remove_container(&self, id: &str) -> Result<(), CriError> {
        let req = RemoveContainerRequest { container_id: id.to_owned() };
        rpc!(self, runtime.remove_container("RemoveContainer", req, self.timeout)).map(|_| ())
    }

    /// `ReopenContainerLog`: the runtime writes the container's log to a new file at its log path.
    pub async fn reopen_container_log(&self, id: &str) -> Result<(), CriError> {
        let req = ReopenContainerLogRequest { container_id: id.to_owned() };
        rpc!(self, runtime.reopen_container_log("ReopenContainerLog", req, self.timeout)).map(|_| ())
    }

    /// `ListContainers`.
    pub async fn list_containers(&self, filter: Option<ContainerFilter>) -> Result<Vec<Container>, CriError> {
        let req = ListContainersRequest { filter };
        rpc!(self, runtime.list_containers("ListContainers", req, self.timeout)).map(|r| r.containers)
    }

    /// `ListContainerStats` of every container the runtime has stats for (its running ones).
    pub async fn list_container_stats(&self) -> Result<Vec<ContainerStats>, CriError> {
        let req = ListContainerStatsRequest { filter: None };
        rpc!(self, runtime.list_container_stats("ListContainerStats", req, self.timeout)).map(|r| r.stats)
    }

    /// `ContainerStatus`; `verbose` adds the runtime's info (the PID, the OCI spec).
    pub async fn container_status(&self, id: &str, verbose: bool) -> Result<ContainerStatusResponse, CriError> {
        let req = ContainerStatusRequest { container_id: id.to_owned(), verbose };
        rpc!(self, runtime.container_status("ContainerStatus", req, self.timeout))
    }

    /// `ExecSync`: the runtime kills the command after `timeout` (zero: never).
    pub async fn exec_sync(&self, id: &str, cmd: &[String], timeout: Duration) -> Result<ExecSyncResponse, CriError> {
        let secs = timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0);
        let req = ExecSyncRequest {
            container_id: id.to_owned(),
            cmd: cmd.to_vec(),
            timeout: i64::try_from(secs).unwrap_or(i64::MAX),
        };
        rpc!(self, runtime.exec_sync("ExecSync", req, timeout + self.timeout))
    }

    /// `Exec`: the URL of the runtime's streaming server for a session running `cmd`.
    pub async fn exec(&self, id: &str, cmd: &[String], streams: Streams) -> Result<String, CriError> {
        let req = ExecRequest {
            container_id: id.to_owned(),
            cmd: cmd.to_vec(),
            tty: streams.tty,
            stdin: streams.stdin,
            stdout: streams.stdout,
            stderr: streams.stderr,
        };
        rpc!(self, runtime.exec("Exec", req, self.timeout)).map(|r| r.url)
    }

    /// `Attach`: the URL of a session attached to the container's main process.
    pub async fn attach(&self, id: &str, streams: Streams) -> Result<String, CriError> {
        let req = AttachRequest {
            container_id: id.to_owned(),
            stdin: streams.stdin,
            tty: streams.tty,
            stdout: streams.stdout,
            stderr: streams.stderr,
        };
        rpc!(self, runtime.attach("Attach", req, self.timeout)).map(|r| r.url)
    }

    /// `PortForward`: the URL of a session forwarding `ports` of the pod's sandbox.
    pub async fn port_forward(&self, sandbox_id: &str, ports: &[u16]) -> Result<String, CriError> {
        let req = PortForwardRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
            port: ports.iter().map(|p| i32::from(*p)).collect(),
        };
        rpc!(self, runtime.port_forward("PortForward", req, self.timeout)).map(|r| r.url)
    }

    /// `ImageStatus`: `None` when the image is absent.
    pub async fn image_status(&self, image: &str) -> Result<Option<Image>, CriError> {
        let req = ImageStatusRequest { image: Some(image_spec(image)), verbose: false };
        rpc!(self, images.image_status("ImageStatus", req, self.timeout)).map(|r| r.image)
    }

    /// `ListImages`.
    pub async fn list_images(&self) -> Result<Vec<Image>, CriError> {
        let req = ListImagesRequest { filter: None };
        rpc!(self, images.list_images("ListImages", req, self.timeout)).map(|r| r.images)
    }

    /// `ImageFsInfo`: the file systems the runtime keeps its images on.
    pub async fn image_fs_info(&self) -> Result<Vec<FilesystemUsage>, CriError> {
        let req = ImageFsInfoRequest {};
        rpc!(self, images.image_fs_info("ImageFsInfo", req, self.timeout)).map(|r| r.image_filesystems)
    }

    /// `PullImage`: the image reference the runtime resolved. Pulls are not bounded by the request timeout (the
    /// kubelet's are not either); `deadline` bounds them.
    pub async fn pull_image(&self, req: PullImageRequest, deadline: Duration) -> Result<String, CriError> {
        rpc!(self, images.pull_image("PullImage", req, deadline)).map(|r| r.image_ref)
    }

    /// `RemoveImage`: removing an image that is gone already succeeds, as CRI says.
    pub async fn remove_image(&self, id: &str) -> Result<(), CriError> {
        let req = RemoveImageRequest { image: Some(image_spec(id)) };
        rpc!(self, images.remove_image("RemoveImage", req, self.timeout)).map(|_| ())
    }
}

/// An `ImageSpec` naming `image`.
pub fn image_spec(image: &str) -> ImageSpec {
    ImageSpec { image: image.to_owned(), ..ImageSpec::default() }
}

/// The useful part of a transport failure: the innermost cause (`No such file or directory`), not tonic's
/// `transport error` wrapper.
fn unavailable_message(s: &tonic::Status) -> String {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(s);
    let mut last = None;
    while let Some(c) = cause {
        last = Some(c.to_string());
        cause = c.source();
    }
    match last {
        Some(inner) if !s.message().contains(&inner) => format!("{}: {inner}", s.message()),
        _ => s.message().to_owned(),
    }
}
