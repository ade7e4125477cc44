//! nodewarden's source of truth for resources: node capacity and allocatable, QoS classes, the cgroup v2
//! kubepods tree with its limits, the ledger of pod placements, and observations of usage and pressure.
//!
//! Nothing else in nodewarden writes to cgroupfs. Pod sync asks [`ResourceManager`] to `admit`, `place`,
//! `update` and `release` pods; eviction reads [`Observations`] and asks for pods to be killed. Every path is built
//! from checked names below an injectable mount, so the whole crate runs against a temporary directory in tests
//! and against the real kernel in the VM of `deploy/vm`.
//!
//! Two crates were considered and not used. cgroups-rs 0.5: its v2 hierarchy hard-codes the `/sys/fs/cgroup`
//! mount (no temporary-directory tests), it has no PSI and no `memory.events`, its v2 OOM notifier reads the
//! v1-only `memory.oom_control`, and it pulls in zbus with a second async runtime; the file I/O nodewarden needs
//! is [`CgroupFs`]. procfs-core's `Meminfo` requires a dozen fields nodewarden does not read and reports a missing
//! one as an internal error of the crate, so `/proc/meminfo` and PSI files are parsed here ([`parse_meminfo`],
//! [`parse_psi`]), with the same never-panic parsers as the cgroup files.

mod allocatable;
mod bounded;
mod capacity;
mod cgroupfs;
mod error;
mod host;
mod kernel_file;
mod ledger;
mod limits;
mod names;
mod observe;
mod parse;
pub mod pod;
mod pressure;
mod priority;
mod qos;
mod quantity;
mod statfs;
pub mod systemd;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod tree;
mod view;
mod writer;

/// How long an idle thread of an async runtime's blocking pool is kept: for good. A pool whose threads exit must
/// ask the OS for a thread again, and a node out of PIDs refuses (tokio then panics in `spawn_blocking`).
pub const KEEP_THREADS: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 24 * 3600);

pub use allocatable::{Allocatable, EvictionReserve, Reserved, Resources, compute as compute_allocatable};
pub use bounded::{BoundedReadError, read_bounded};
pub use capacity::{Capacity, FsStats, HostPaths, fs_stats, read_capacity, read_meminfo};
pub use cgroupfs::{CgroupFs, CgroupPath, NEW_CGROUP_DEFAULTS, open_psi_trigger};
pub use error::{CgroupError, IoError, NameError, Op, ParseError};
pub use host::{
    CGROUP2_SUPER_MAGIC, HostError, OPTIONAL_CONTROLLERS, REQUIRED_CONTROLLERS, check_controllers, check_host,
};
pub use ledger::{
    AdmitError, ContainerPlacement, DAEMON_CPU_WEIGHT, EvictionCandidate, PendingPlacement, PlaceError, Placement,
    ResourceConfig, ResourceManager,
};
pub use limits::{CgroupLimits, LimitSettings, container_limits, pod_limits};
pub use names::{MAX_CONTAINER_NAME_LEN, MAX_NAME_LEN, MAX_UID_LEN, validate_container_name, validate_pod_uid};
pub use observe::{MeminfoReader, NodeMemory, Observations, PidStats, PodUsage, Pressure, node_memory, pid_stats};
pub use parse::{
    CpuMax, Limit, Meminfo, NestedKeyed, Psi, PsiLine, parse_cpu_list_count, parse_cpu_max, parse_flat_keyed,
    parse_limit, parse_loadavg_threads, parse_meminfo, parse_nested_keyed, parse_psi, parse_u64,
};
pub use pressure::{Condition, NodePressure};
pub use priority::{
    CONFIG_SOURCE_ANNOTATION, SYSTEM_CLUSTER_CRITICAL, SYSTEM_CRITICAL_PRIORITY, SYSTEM_NODE_CRITICAL, is_critical,
    is_node_critical, is_static_pod, pod_priority, resolved_priority,
};
pub use qos::{
    BEST_EFFORT_OOM_SCORE_ADJ, ContainerResources, DEFAULT_CFS_PERIOD_US, GUARANTEED_OOM_SCORE_ADJ, PodResources,
    PodSpecError, QosClass, cpu_quota, cpu_shares, memory_high, oom_score_adj, shares_to_weight,
};
pub use quantity::{Amount, Quantity, QuantityError, parse_millicores, parse_non_negative};
pub use systemd::{CgroupDriver, UnitError, UnitLimits, Units};
pub use tree::Tree;
pub use view::LedgerView;
pub use writer::{Ledger, LedgerError, MAX_WRITES};
