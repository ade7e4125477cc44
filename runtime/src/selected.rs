//! The runtime the configuration selects: the embedded process runtime, or CRI when `containerRuntimeEndpoint` is
//! set. One type, so the daemon, pod sync and eviction do not depend on which.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::cri::CriRuntime;
use crate::process::ProcessRuntime;
use crate::seam::{
    ContainerId, ContainerSpec, ExecOutput, ExitInfo, ImageSummary, MainProcess, Runtime, RuntimeError, RuntimeFacts,
    RuntimeHealth, Started, StopSignals,
};

/// The runtime in use.
#[derive(Debug)]
pub enum SelectedRuntime {
    /// The embedded process runtime.
    Process(ProcessRuntime),
    /// A CRI runtime (containerd).
    Cri(Arc<CriRuntime>),
}

macro_rules! each {
    ($self:ident, $r:ident => $e:expr) => {
        match $self {
            SelectedRuntime::Process($r) => $e,
            SelectedRuntime::Cri($r) => $e,
        }
    };
}

impl RuntimeFacts for SelectedRuntime {
    fn scheme(&self) -> &'static str {
        each!(self, r => r.scheme())
    }

    fn health(&self) -> RuntimeHealth {
        each!(self, r => r.health())
    }

    fn version(&self) -> String {
        each!(self, r => r.version())
    }

    fn images(&self) -> Vec<ImageSummary> {
        each!(self, r => r.images())
    }
}

impl Runtime for SelectedRuntime {
    type Sandboxes = CriRuntime;

    fn sandboxes(&self) -> Option<&CriRuntime> {
        match self {
            SelectedRuntime::Process(_) => None,
            SelectedRuntime::Cri(r) => Some(r),
        }
    }

    type Images = CriRuntime;

    fn image_service(&self) -> Option<&CriRuntime> {
        self.sandboxes()
    }

    type Streaming = CriRuntime;

    fn streaming(&self) -> Option<&CriRuntime> {
        self.sandboxes()
    }

    async fn reconcile(&self, keep: &BTreeSet<String>) {
        each!(self, r => r.reconcile(keep).await)
    }

    async fn start(&self, spec: &ContainerSpec) -> Result<Started, RuntimeError> {
        each!(self, r => r.start(spec).await)
    }

    async fn adopt(&self, spec: &ContainerSpec, main: Option<MainProcess>) -> Option<Started> {
        each!(self, r => r.adopt(spec, main).await)
    }

    async fn wait(&self, id: &ContainerId) -> ExitInfo {
        each!(self, r => r.wait(id).await)
    }

    async fn stop(&self, id: &ContainerId, grace: Duration) -> Result<(), RuntimeError> {
        each!(self, r => r.stop(id, grace).await)
    }

    fn stop_signals(&self) -> Option<&dyn StopSignals> {
        each!(self, r => r.stop_signals())
    }

    async fn exec(&self, id: &ContainerId, argv: &[String], timeout: Duration) -> Result<ExecOutput, RuntimeError> {
        each!(self, r => r.exec(id, argv, timeout).await)
    }

    async fn remove(&self, id: &ContainerId) {
        each!(self, r => r.remove(id).await)
    }

    async fn rotate_log(
        &self,
        id: &ContainerId,
        log: &std::path::Path,
        to: &std::path::Path,
        keep: u64,
    ) -> Result<(), RuntimeError> {
        each!(self, r => r.rotate_log(id, log, to, keep).await)
    }
}
