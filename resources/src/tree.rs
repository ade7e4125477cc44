//! The kubepods tree: `<cgroupRoot>/kubepods` limited to allocatable, and its `burstable` and `besteffort`
//! children, laid out as the kubelet's cgroupfs driver lays them out.

use crate::allocatable::Resources;
use crate::cgroupfs::{CgroupFs, CgroupPath, NEW_CGROUP_DEFAULTS};
use crate::error::{CgroupError, NameError};
use crate::host::{OPTIONAL_CONTROLLERS, REQUIRED_CONTROLLERS};
use crate::limits::CgroupLimits;
use crate::parse::Limit;
use crate::qos::{self, QosClass};
use crate::systemd::{self, CgroupDriver, UnitError, UnitLimits, Units};

/// The cgroups of the kubepods tree.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Tree {
    /// `cgroupRoot` (under the systemd driver, the slice it names).
    pub root: CgroupPath,
    /// `<cgroupRoot>/kubepods` (`kubepods.slice`), the parent of every pod, limited to allocatable.
    pub kubepods: CgroupPath,
    /// `kubepods/burstable` (`kubepods-burstable.slice`).
    pub burstable: CgroupPath,
    /// `kubepods/besteffort` (`kubepods-besteffort.slice`).
    pub besteffort: CgroupPath,
    /// Under the systemd driver, the parts of the cgroup name the root stands for; `None` under cgroupfs.
    #[serde(skip)]
    slice_parts: Option<Vec<String>>,
}

impl Tree {
    /// The tree below a cgroup root, laid out by the cgroupfs driver.
    pub fn new(root: CgroupPath) -> Result<Self, NameError> {
        let kubepods = root.child("kubepods")?;
        Ok(Self {
            burstable: kubepods.child("burstable")?,
            besteffort: kubepods.child("besteffort")?,
            kubepods,
            root,
            slice_parts: None,
        })
    }

    /// The tree of slices the systemd driver names for a cgroup root (`/` gives `/kubepods.slice`,
    /// `/nodewarden.slice` gives `/nodewarden.slice/nodewarden-kubepods.slice`).
    pub fn systemd(root: &CgroupPath) -> Result<Self, NameError> {
        let parts = systemd::root_parts(root)?;
        let at = |more: &[&str]| {
            let name: Vec<String> = parts.iter().cloned().chain(more.iter().map(|s| (*s).to_owned())).collect();
            systemd::slice_path(&systemd::slice_unit(&name))
        };
        Ok(Self {
            root: systemd::root_path(root)?,
            kubepods: at(&["kubepods"])?,
            burstable: at(&["kubepods", "burstable"])?,
            besteffort: at(&["kubepods", "besteffort"])?,
            slice_parts: Some(parts),
        })
    }

    /// The driver that laid the tree out.
    pub fn driver(&self) -> CgroupDriver {
        if self.slice_parts.is_some() { CgroupDriver::Systemd } else { CgroupDriver::Cgroupfs }
    }

    /// The parent cgroup of pods of a QoS class.
    pub fn qos_parent(&self, qos: QosClass) -> &CgroupPath {
        match qos {
            QosClass::Guaranteed => &self.kubepods,
            QosClass::Burstable => &self.burstable,
            QosClass::BestEffort => &self.besteffort,
        }
    }

    /// The name of a pod's cgroup in its QoS parent: `pod<UID>`, or under systemd the slice
    /// `kubepods-<qos>-pod<UID>.slice` with the UID's dashes as underscores (a UID with an underscore could not be
    /// read back, so it is refused there).
    pub fn pod_cgroup(&self, qos: QosClass, uid: &str) -> Result<CgroupPath, NameError> {
        let Some(parts) = &self.slice_parts else { return self.qos_parent(qos).child(&format!("pod{uid}")) };
        if uid.contains('_') {
            // The slice name writes the UID's dashes as underscores: an underscore could not be read back.
            return Err(NameError::BadChar {
                what: "pod UID under the systemd cgroup driver",
                name: uid.to_owned(),
                bad: '_',
            });
        }
        let mut name = parts.clone();
        name.push("kubepods".to_owned());
        if let Some(class) = qos.cgroup_name() {
            name.push(class.to_owned());
        }
        name.push(format!("pod{uid}"));
        self.qos_parent(qos).child(&systemd::slice_unit(&name))
    }

    /// The UID of the pod whose cgroup in a QoS parent is named `child`, if it is one.
    pub fn pod_uid(&self, qos: QosClass, child: &str) -> Option<String> {
        let Some(slice_parts) = &self.slice_parts else { return child.strip_prefix("pod").map(str::to_owned) };
        let mut parent: Vec<String> = slice_parts.clone();
        parent.push("kubepods".to_owned());
        if let Some(class) = qos.cgroup_name() {
            parent.push(class.to_owned());
        }
        let stem = systemd::slice_unit(&parent);
        let prefix = format!("{}-pod", stem.strip_suffix(systemd::SLICE_SUFFIX).unwrap_or(&stem));
        let escaped = child.strip_prefix(&prefix)?.strip_suffix(systemd::SLICE_SUFFIX)?;
        Some(escaped.replace('_', "-"))
    }

    /// The cgroup of a pod's container (the process runtime's): `<pod>/<name>`, or under systemd the slice
    /// `<pod slice stem>-<name>.slice` inside the pod's slice. A slice of its own, with its limits as properties,
    /// is what keeps systemd from taking the container's controllers away when it applies the pod slice's
    /// settings again (on a reload, or when a sibling starts), as it does to cgroups it does not know.
    pub fn container_cgroup(&self, pod: &CgroupPath, name: &str) -> Result<CgroupPath, NameError> {
        match self.pod_stem(pod) {
            None => pod.child(name),
            // As with UIDs: the slice name writes dashes as underscores, so an underscore could not be read back.
            Some(_) if name.contains('_') => Err(NameError::BadChar {
                what: "container name under the systemd cgroup driver",
                name: name.to_owned(),
                bad: '_',
            }),
            Some(stem) => pod.child(&format!("{stem}-{}{}", systemd::escape_part(name), systemd::SLICE_SUFFIX)),
        }
    }

    /// The container whose cgroup in a pod's is named `child`, if it is one of [`Tree::container_cgroup`]'s.
    pub fn container_name(&self, pod: &CgroupPath, child: &str) -> Option<String> {
        match self.pod_stem(pod) {
            None => Some(child.to_owned()),
            Some(stem) => {
                let escaped = child.strip_prefix(stem)?.strip_prefix('-')?.strip_suffix(systemd::SLICE_SUFFIX)?;
                Some(escaped.replace('_', "-"))
            }
        }
    }

    /// A pod slice's name without `.slice`, under the systemd driver.
    fn pod_stem<'a>(&self, pod: &'a CgroupPath) -> Option<&'a str> {
        self.unit_of(pod)?.strip_suffix(systemd::SLICE_SUFFIX)
    }

    /// The slice unit of one of the tree's cgroups or a pod's, under the systemd driver.
    pub fn unit_of<'a>(&self, cg: &'a CgroupPath) -> Option<&'a str> {
        self.slice_parts.as_ref()?;
        cg.name().filter(|n| n.ends_with(systemd::SLICE_SUFFIX))
    }
}

/// Creates one of the tree's cgroups or a pod's: a directory under cgroupfs; under systemd a transient slice with
/// `limits` as its properties (a slice that is there gets them), waiting until its cgroup is there. True when
/// this call made a directory, whose control files then hold the kernel's defaults (a slice's hold what systemd
/// wrote).
pub fn create(
    fs: &CgroupFs,
    units: Option<&dyn Units>,
    tree: &Tree,
    cg: &CgroupPath,
    limits: &UnitLimits,
) -> Result<bool, CgroupError> {
    let (Some(units), Some(unit)) = (units, tree.unit_of(cg)) else {
        return fs.create(cg).map_err(Into::into);
    };
    units.start_slice(unit, limits)?;
    if wait_for(|| fs.exists(cg)) {
        Ok(false)
    } else {
        Err(UnitError { unit: unit.to_owned(), reason: format!("no cgroup {cg} after {SLICE_WAIT:?}") }.into())
    }
}

/// How long systemd may take to make or remove a slice's cgroup once asked.
const SLICE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Polls `done` every 2 ms for up to [`SLICE_WAIT`]; whether it came true.
fn wait_for(mut done: impl FnMut() -> bool) -> bool {
    const STEP: std::time::Duration = std::time::Duration::from_millis(2);
    for _ in 0..SLICE_WAIT.as_millis() / STEP.as_millis() {
        if done() {
            return true;
        }
        std::thread::sleep(STEP);
    }
    done()
}

/// Sets the unit properties of one of the tree's slices or a pod's (nothing under cgroupfs, where the files
/// are the only copy).
pub fn set_unit_limits(
    units: Option<&dyn Units>,
    tree: &Tree,
    cg: &CgroupPath,
    limits: &UnitLimits,
) -> Result<(), CgroupError> {
    match (units, tree.unit_of(cg)) {
        (Some(units), Some(unit)) => units.set_limits(unit, limits).map_err(Into::into),
        _ => Ok(()),
    }
}

/// Removes a pod's cgroup and every cgroup below it, children first; under systemd the pod's slice is stopped
/// first, which removes what systemd knows of. The caller has made sure no process is left.
pub fn remove(fs: &CgroupFs, units: Option<&dyn Units>, tree: &Tree, cg: &CgroupPath) -> Result<(), CgroupError> {
    if let (Some(units), Some(unit)) = (units, tree.unit_of(cg)) {
        units.stop(unit)?;
        // systemd removes the cgroup once the stop job ran; what it left (or could not remove) goes below.
        if wait_for(|| !fs.exists(cg)) {
            return Ok(());
        }
    }
    if !fs.exists(cg) {
        return Ok(());
    }
    for c in fs.subtree(cg)? {
        if fs.exists(&c) {
            fs.remove(&c)?;
        }
    }
    Ok(())
}

/// Enables for the children of `cg` every required controller and the optional ones `cg` has. Under systemd
/// nothing is written: systemd enables in a slice what the units below it need (their limits as properties ask for
/// cpu, memory and pids) and would take back anything else on its next pass.
pub fn delegate(fs: &CgroupFs, tree: &Tree, cg: &CgroupPath) -> Result<(), CgroupError> {
    if tree.driver() == CgroupDriver::Systemd {
        return Ok(());
    }
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

/// Creates the tree (idempotently) and writes the kubepods limits: `cpu.weight` and `pids.max` from `target`
/// (enforced allocatable when `enforceNodeAllocatable` has `pods`, else capacity), and `memory.max` as the ledger
/// decided it. Under systemd the slices carry the same limits as properties.
pub fn ensure(
    fs: &CgroupFs,
    units: Option<&dyn Units>,
    tree: &Tree,
    target: &Resources,
    memory: Limit,
) -> Result<(), CgroupError> {
    if tree.root != CgroupPath::root() {
        create(fs, units, tree, &tree.root, &UnitLimits::default())?;
    }
    delegate(fs, tree, &tree.root)?;
    let weight = qos::shares_to_weight(qos::cpu_shares(target.cpu_millis));
    let kubepods = UnitLimits {
        cpu_weight: Some(weight),
        memory_max: Some(memory),
        tasks_max: Some(Limit::Value(target.pids)),
        ..UnitLimits::default()
    };
    create(fs, units, tree, &tree.kubepods, &kubepods)?;
    fs.write(&tree.kubepods, "cpu.weight", &weight.to_string())?;
    fs.write_limit(&tree.kubepods, "memory.max", memory)?;
    fs.write_limit(&tree.kubepods, "pids.max", Limit::Value(target.pids))?;
    delegate(fs, tree, &tree.kubepods)?;
    let besteffort_weight = qos::shares_to_weight(qos::MIN_SHARES);
    for (qos_cg, weight) in [(&tree.burstable, None), (&tree.besteffort, Some(besteffort_weight))] {
        create(fs, units, tree, qos_cg, &UnitLimits { cpu_weight: weight, ..UnitLimits::default() })?;
        delegate(fs, tree, qos_cg)?;
    }
    fs.write(&tree.besteffort, "cpu.weight", &besteffort_weight.to_string())?;
    Ok(())
}

/// Writes a cgroup's limits. `memory.min` and `memory.high` are written only when given; in a cgroup just made
/// (`new`), a value the kernel gave it already is not written again.
pub fn apply(fs: &CgroupFs, cg: &CgroupPath, l: &CgroupLimits, new: bool) -> Result<(), CgroupError> {
    let write = |name: &str, value: String| -> Result<(), CgroupError> {
        if new && NEW_CGROUP_DEFAULTS.contains(&(name, value.as_str())) {
            return Ok(());
        }
        Ok(fs.write(cg, name, &value)?)
    };
    write("cpu.weight", l.cpu_weight.to_string())?;
    write("cpu.max", l.cpu_max.to_string())?;
    write("pids.max", l.pids_max.to_string())?;
    if let Some(min) = l.memory_min {
        write("memory.min", min.to_string())?;
    }
    if let Some(high) = l.memory_high {
        write("memory.high", high.to_string())?;
    }
    write("memory.max", l.memory_max.to_string())
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
