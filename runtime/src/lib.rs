//! Container runtimes for nodewarden: the seam pod sync drives ([`Runtime`], with sandboxes as a capability), the
//! embedded process runtime, the CRI client, and the runtime the configuration selects. Pod sync decides what runs
//! and when; a runtime starts, signals, watches, execs in and removes containers, and says how it is (health,
//! images, version).
//!
//! A runtime is a client of `nodewarden-resources` as pod sync is: it runs a container in the cgroup the resources
//! crate made for it and never makes one of its own.

pub mod cri;
pub mod fuzzing;
mod logfile;
mod process;
mod seam;
pub mod security;
mod selected;

pub use logfile::copy_truncate;
pub use process::{ProcessRuntime, START_FAILED};
pub use seam::{
    ContainerId, ContainerSpec, EXEC_OUTPUT_LIMIT, ExecOutput, ExitInfo, ImageService, ImageSummary, LinuxResources,
    MainProcess, Mount, NoImages, NoSandboxes, NoStreaming, NodeImage, Problem, PullPolicy, PulledImage, RegistryAuth,
    RunningSandbox, Runtime, RuntimeError, RuntimeFacts, RuntimeHealth, SandboxRuntime, SandboxSpec, Started,
    StopSignals, StreamingRuntime, Streams, WritableLayer, exit_reason,
};
pub use selected::SelectedRuntime;
