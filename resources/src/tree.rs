//! The kubepods tree: `<cgroupRoot>/kubepods` limited to allocatable, and its `burstable` and `besteffort`
//! children, laid out as the kubelet's cgroupfs driver lays them out.

use crate::allocatable::Resources;
use crate::cgroupfs::{CgroupFs, CgroupPath};
use crate::error::{CgroupError, NameError};
use crate::host::{OPTIONAL_CONTROLLERS, REQUIRED_CONTROLLERS};
use crate::limits::CgroupLimits;
use crate::parse::Limit;
use crate::qos::{self, QosClass};

/// The cgroups of the kubepods tree.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Tree {
    /// `cgroupRoot`.
    pub root: CgroupPath,
    /// `<cgroupRoot>/kubepods`, the parent of every pod, limited to allocatable.
    pub kubepods: CgroupPath,
    /// `kubepods/burstable`.
    pub burstable: CgroupPath,
    /// `kubepods/besteffort`.
    pub besteffort: CgroupPath,
}

impl Tree {
    /// The tree below a cgroup root.
    pub fn new(root: CgroupPath) -> Result<Self, NameError> {
        let kubepods = root.child("kubepods")?;
        Ok(Self { burstable: kubepods.child("burstable")?, besteffort: kubepods.child("besteffort")?, kubepods, root })
    }

    /// The parent cgroup of pods of a QoS class.
    pub fn qos_parent(&self, qos: QosClass) -> &CgroupPath {
        match qos {
            QosClass::Guaranteed => &self.kubepods,
            QosClass::Burstable => &self.burstable,
            QosClass::BestEffort => &self.besteffort,
        }
    }
}

/// Enables for the children of `cg` every required controller and the optional ones `cg` has.
pub fn delegate(fs: &CgroupFs, cg: &CgroupPath) -> Result<(), CgroupError> {
    let available = fs.controllers(cg).unwrap_or_default();
    let wanted: Vec<&str> = REQUIRED_CONTROLLERS
        .iter()
        .chain(OPTIONAL_CONTROLLERS.iter())
        .copied()
        .filter(|c| available.is_empty() || available.iter().any(|a| a == c))
        .collect();
    fs.enable_controllers(cg, &wanted)?;
    Ok(())
}

/// Creates the tree (idempotently) and writes the kubepods limits: `cpu.weight` from allocatable CPU always, and
/// `memory.max` and `pids.max` from enforced allocatable when `enforce` (`enforceNodeAllocatable` has `pods`).
pub fn ensure(
    fs: &CgroupFs,
    tree: &Tree,
    enforced: &Resources,
    capacity: &Resources,
    enforce: bool,
) -> Result<(), CgroupError> {
    if tree.root != CgroupPath::root() {
        fs.create(&tree.root)?;
    }
    delegate(fs, &tree.root)?;
    fs.create(&tree.kubepods)?;
    let target = if enforce { enforced } else { capacity };
    fs.write(&tree.kubepods, "cpu.weight", &qos::shares_to_weight(qos::cpu_shares(target.cpu_millis)).to_string())?;
    fs.write_limit(&tree.kubepods, "memory.max", if enforce { Limit::Value(enforced.memory) } else { Limit::Max })?;
    fs.write_limit(&tree.kubepods, "pids.max", Limit::Value(target.pids))?;
    delegate(fs, &tree.kubepods)?;
    for qos_cg in [&tree.burstable, &tree.besteffort] {
        fs.create(qos_cg)?;
        delegate(fs, qos_cg)?;
    }
    fs.write(&tree.besteffort, "cpu.weight", &qos::shares_to_weight(qos::MIN_SHARES).to_string())?;
    Ok(())
}

/// Writes a cgroup's limits. `memory.min` and `memory.high` are written only when given.
pub fn apply(fs: &CgroupFs, cg: &CgroupPath, l: &CgroupLimits) -> Result<(), CgroupError> {
    fs.write(cg, "cpu.weight", &l.cpu_weight.to_string())?;
    fs.write(cg, "cpu.max", &l.cpu_max.to_string())?;
    fs.write_limit(cg, "pids.max", l.pids_max)?;
    if let Some(min) = l.memory_min {
        fs.write(cg, "memory.min", &min.to_string())?;
    }
    if let Some(high) = l.memory_high {
        fs.write_limit(cg, "memory.high", high)?;
    }
    fs.write_limit(cg, "memory.max", l.memory_max)?;
    Ok(())
}

/// Reads back a cgroup's limits (for adoption). Missing Memory QoS files read as unset.
pub fn read_limits(fs: &CgroupFs, cg: &CgroupPath) -> Result<CgroupLimits, CgroupError> {
    Ok(CgroupLimits {
        memory_max: fs.read_limit(cg, "memory.max")?,
        memory_min: fs.read_u64(cg, "memory.min").ok().filter(|m| *m > 0),
        memory_high: fs.read_limit(cg, "memory.high").ok(),
        pids_max: fs.read_limit(cg, "pids.max")?,
        cpu_weight: fs.read_u64(cg, "cpu.weight")?,
        cpu_max: fs.read_cpu_max(cg)?,
    })
}
