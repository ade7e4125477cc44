//! The bare-CRI phase of `cri`: the bench's own CRI client starts the same pods nodewarden starts, with no daemon
//! running, and times `RunPodSandbox`, `CreateContainer` and `StartContainer`. That is the floor nodewarden's
//! manifest → `Running` through containerd is compared with.
//!
//! The requests are made by the daemon's own builders (`sync::sandbox_spec`, `sync::container_spec`,
//! `runtime::cri::{sandbox_config, container_config}`), and the pod cgroup that becomes the sandbox's `cgroup_parent` is
//! made by the resources library exactly as the daemon makes it. Placing and releasing
//! the pod, and stopping and removing its container and sandbox, are not timed.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use nodewarden_proto::v1::{CreateContainerRequest, RunPodSandboxRequest};
use nodewarden_resources::{Placement, ResourceConfig};
use nodewarden_runtime::cri::{CriClient, container_config, sandbox_config};
use nodewarden_sync::{PodContext, PodIps, container_spec, sandbox_spec};

use crate::{manager, remove_tree, root};

/// The node name the daemon runs with (`StaticNode`), which static pod names end in.
const NODE: &str = "bench";

/// The deadline of each call: the daemon's `runtimeRequestTimeout` default.
const TIMEOUT: Duration = Duration::from_secs(120);

/// One pod started by the bench's client: each call's duration, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct BareStart {
    /// `RunPodSandbox`.
    pub sandbox_ms: f64,
    /// `CreateContainer`.
    pub create_ms: f64,
    /// `StartContainer`, until it returned.
    pub start_ms: f64,
}

impl BareStart {
    /// The three calls together: `RunPodSandbox` sent → `StartContainer` returned.
    pub fn total_ms(&self) -> f64 {
        self.sandbox_ms + self.create_ms + self.start_ms
    }
}

/// What a start made, so that it is taken down even when a later call failed.
#[derive(Default)]
struct Made {
    sandbox: Option<String>,
    container: Option<String>,
}

/// Starts `n` pods built from `manifest(name)` one after another through `endpoint`, each stopped and removed before
/// the next; no nodewarden daemon may run meanwhile. Any failed call fails the phase.
pub fn run(endpoint: &str, n: usize, manifest: impl Fn(&str) -> String) -> Result<Vec<BareStart>> {
    let dir = std::env::temp_dir().join(format!("nwbench-bare-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    remove_tree(&root());
    let result = run_in(endpoint, n, &manifest, &dir);
    remove_tree(&root());
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run_in(endpoint: &str, n: usize, manifest: &dyn Fn(&str) -> String, dir: &Path) -> Result<Vec<BareStart>> {
    // As the daemon configures it for a CRI runtime: containerd makes the container cgroups itself.
    let mut resources = manager(ResourceConfig { container_cgroups: false, ..ResourceConfig::new(root()) })?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let client = rt.block_on(connect(endpoint))?;
    let log_root = dir.join("logs");
    let mut starts = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("b{i}");
        let source = dir.join(format!("{name}.yaml"));
        let pod = nodewarden_sync::parse_static_pod(manifest(&name).as_bytes(), &source, NODE)
            .with_context(|| format!("the manifest of {name}"))?;
        let placement = resources.place(&pod).with_context(|| format!("cannot place {name}"))?;
        let (sandbox, container) = requests(&pod, &placement, &log_root)?;
        if i == 0 {
            let image = container.config.as_ref().and_then(|c| c.image.as_ref()).map_or("", |i| i.image.as_str());
            rt.block_on(check_image(&client, image))?;
        }
        let mut made = Made::default();
        let started = rt.block_on(start(&client, sandbox, container, &mut made));
        let down = rt.block_on(tear_down(&client, &made));
        let start = match started {
            Ok(start) => start,
            Err(e) => {
                if let Err(d) = down {
                    eprintln!("bare CRI teardown of {name} after its failed start: {d:#}");
                }
                return Err(e.context(format!("bare CRI start of {name}")));
            }
        };
        down.with_context(|| format!("bare CRI teardown of {name}"))?;
        resources.release(&placement.uid).with_context(|| format!("cannot release {name}"))?;
        starts.push(start);
    }
    Ok(starts)
}

/// A client that has answered `Version`, so that the connection is not charged to the first timed pod.
async fn connect(endpoint: &str) -> Result<CriClient> {
    let client = CriClient::new(endpoint, TIMEOUT)?;
    let version = client.version().await.context("the bare CRI client's Version")?;
    if version.runtime_api_version != nodewarden_runtime::cri::CRI_API_VERSION {
        bail!("{endpoint} serves CRI {:?}, not v1", version.runtime_api_version);
    }
    Ok(client)
}

/// Fails unless the runtime has `image`: no registry is reachable in the VM, and a pull is not what is timed.
async fn check_image(client: &CriClient, image: &str) -> Result<()> {
    if client.image_status(image).await.context("the bare CRI client's ImageStatus")?.is_none() {
        bail!("the CRI runtime does not have the image {image:?}");
    }
    Ok(())
}

/// The timed part: `RunPodSandbox`, `CreateContainer`, `StartContainer`, until the last returned. What was made is
/// recorded in `made` as it is made.
async fn start(
    client: &CriClient,
    sandbox: RunPodSandboxRequest,
    mut container: CreateContainerRequest,
    made: &mut Made,
) -> Result<BareStart> {
    let t0 = Instant::now();
    let sandbox_id = client.run_pod_sandbox(sandbox).await?;
    let t1 = Instant::now();
    made.sandbox = Some(sandbox_id.clone());
    container.pod_sandbox_id = sandbox_id;
    let t2 = Instant::now();
    let container_id = client.create_container(container).await?;
    let t3 = Instant::now();
    made.container = Some(container_id.clone());
    let t4 = Instant::now();
    client.start_container(&container_id).await?;
    let t5 = Instant::now();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    Ok(BareStart { sandbox_ms: ms(t1 - t0), create_ms: ms(t3 - t2), start_ms: ms(t5 - t4) })
}

/// Stops and removes what [`start`] made (the container killed at once), sandbox last.
async fn tear_down(client: &CriClient, made: &Made) -> Result<()> {
    if let Some(id) = &made.container {
        client.stop_container(id, Duration::ZERO).await?;
        client.remove_container(id).await?;
    }
    if let Some(id) = &made.sandbox {
        client.stop_pod_sandbox(id).await?;
        client.remove_pod_sandbox(id).await?;
    }
    Ok(())
}

/// The requests the daemon sends for `pod`'s sandbox and its one container (the sandbox ID is filled in later),
/// made by the daemon's own builders.
fn requests(
    pod: &Pod,
    placement: &Placement,
    log_root: &Path,
) -> Result<(RunPodSandboxRequest, CreateContainerRequest)> {
    let spec = pod.spec.as_ref().context("the pod has no spec")?;
    if !spec.host_network.unwrap_or(false) {
        bail!("the bare CRI phase expects a host-network pod");
    }
    let [c] = spec.containers.as_slice() else { bail!("the bare CRI phase expects a pod with one container") };
    let cp = placement
        .containers
        .iter()
        .find(|p| p.name == c.name)
        .with_context(|| format!("no placement for container {}", c.name))?;
    let sandbox = sandbox_spec(pod, placement, log_root);
    let node = Default::default();
    let ips = PodIps { pod: &[], host: &[] };
    let ctx = PodContext { pod, volumes: &[], log_root, ips, node: &node, objects: None, services: &[] };
    let container = container_spec(&ctx, c, cp, 0, &mut |_, _, _| Err("the bench's pod has no volumes".to_owned()))
        .map_err(anyhow::Error::msg)?;
    let sandbox_config = sandbox_config(&sandbox, 0);
    let container = CreateContainerRequest {
        pod_sandbox_id: String::new(),
        config: Some(container_config(&container, &sandbox)),
        sandbox_config: Some(sandbox_config.clone()),
    };
    Ok((RunPodSandboxRequest { config: Some(sandbox_config), runtime_handler: String::new() }, container))
}
