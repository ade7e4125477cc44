//! The systemd cgroup driver's side of the accounting: how the kubelet names its slices, the limits a slice unit
//! carries as properties, and the seam ([`Units`]) through which the slices are started and stopped. The D-Bus
//! client behind the seam lives with the daemon; this crate stays the only writer of cgroupfs.
//!
//! Names follow the kubelet's systemd driver: the cgroup name `[root parts..., "kubepods", "burstable",
//! "pod<UID>"]` becomes the slice `kubepods-burstable-pod<UID>.slice` (with the root's parts in front, dashes
//! inside a part written as underscores), which systemd places at
//! `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<UID>.slice`.

use crate::cgroupfs::CgroupPath;
use crate::error::NameError;
use crate::limits::CgroupLimits;
use crate::parse::{CpuMax, Limit};

/// Which cgroup driver lays out the kubepods tree (the kubelet's `cgroupDriver`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    /// nodewarden creates the cgroup directories itself (`kubepods/burstable/pod<UID>`).
    #[default]
    Cgroupfs,
    /// systemd creates them as transient slice units (`kubepods.slice/...`) on nodewarden's request.
    Systemd,
}

/// The unit suffix of a slice.
pub const SLICE_SUFFIX: &str = ".slice";

/// A cgroup name's part as a slice name part: dashes (the slice hierarchy separator) become underscores.
pub fn escape_part(part: &str) -> String {
    part.replace('-', "_")
}

/// The parts of the cgroup name a `cgroupRoot` stands for under the systemd driver. A path of plain components is
/// read as the kubelet reads it, one part per component (`/` has none, `/nodewarden` is `[nodewarden]`,
/// `/a/b` is `[a, b]`). A path of slices is read as where systemd puts its last slice (`/a.slice/a-b.slice` is
/// `[a, b]`), which the kubelet misreads; one that is not that path, or a mix of the two forms, is refused.
pub fn root_parts(cgroup_root: &CgroupPath) -> Result<Vec<String>, NameError> {
    let components: Vec<&str> = cgroup_root.as_str().split('/').filter(|c| !c.is_empty()).collect();
    let slices = components.iter().filter(|c| c.ends_with(SLICE_SUFFIX)).count();
    if slices == 0 {
        return Ok(components.into_iter().map(str::to_owned).collect());
    }
    let last = components.last().copied().unwrap_or_default();
    if slices != components.len() || slice_path(last)? != *cgroup_root {
        return Err(NameError::NotASlice { path: cgroup_root.to_string() });
    }
    let stem = last.strip_suffix(SLICE_SUFFIX).unwrap_or(last);
    let parts: Vec<String> = stem.split('-').map(|p| p.replace('_', "-")).collect();
    if parts.iter().any(String::is_empty) {
        return Err(NameError::NotASlice { path: cgroup_root.to_string() });
    }
    Ok(parts)
}

/// The slice unit of a cgroup name (`[kubepods, burstable]` → `kubepods-burstable.slice`); the root slice
/// `-.slice` for no parts.
pub fn slice_unit(parts: &[String]) -> String {
    if parts.is_empty() {
        return format!("-{SLICE_SUFFIX}");
    }
    let escaped: Vec<String> = parts.iter().map(|p| escape_part(p)).collect();
    format!("{}{SLICE_SUFFIX}", escaped.join("-"))
}

/// Where systemd places a slice unit in the cgroup tree: `a-b-c.slice` at `/a.slice/a-b.slice/a-b-c.slice`, the
/// root slice at `/`.
pub fn slice_path(unit: &str) -> Result<CgroupPath, NameError> {
    let stem = unit.strip_suffix(SLICE_SUFFIX).unwrap_or(unit);
    if stem == "-" {
        return Ok(CgroupPath::root());
    }
    let mut path = CgroupPath::root();
    let mut prefix = String::new();
    for part in stem.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        path = path.child(&format!("{prefix}{SLICE_SUFFIX}"))?;
    }
    Ok(path)
}

/// The cgroup of `cgroupRoot` under the systemd driver: the slice its parts name (`/nodewarden` is
/// `/nodewarden.slice`, `/my-root` is `/my_root.slice`, `/` stays `/`).
pub fn root_path(cgroup_root: &CgroupPath) -> Result<CgroupPath, NameError> {
    slice_path(&slice_unit(&root_parts(cgroup_root)?))
}

/// The limits a slice unit carries as properties (the ones systemd has; `None` leaves a property as it is).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UnitLimits {
    /// `CPUWeight`.
    pub cpu_weight: Option<u64>,
    /// `CPUQuotaPerSecUSec` and `CPUQuotaPeriodUSec`.
    pub cpu_max: Option<CpuMax>,
    /// `MemoryMax`.
    pub memory_max: Option<Limit>,
    /// `MemoryMin`.
    pub memory_min: Option<u64>,
    /// `MemoryHigh`.
    pub memory_high: Option<Limit>,
    /// `TasksMax`.
    pub tasks_max: Option<Limit>,
    /// `MemorySwapMax`.
    pub memory_swap_max: Option<Limit>,
}

impl UnitLimits {
    /// All of a pod's limits (`memory.min` and `memory.high` only where Memory QoS sets them), with no swap (the
    /// kubelet's `NoSwap`), kept as a unit property so that a `daemon-reload` does not give it back.
    pub fn of(l: &CgroupLimits) -> Self {
        Self {
            cpu_weight: Some(l.cpu_weight),
            cpu_max: Some(l.cpu_max),
            memory_max: Some(l.memory_max),
            memory_min: l.memory_min,
            memory_high: l.memory_high,
            tasks_max: Some(l.pids_max),
            memory_swap_max: Some(Limit::Value(0)),
        }
    }

    /// `CPUQuotaPerSecUSec` for a quota: microseconds per second of wall time, rounded up to 10 ms as runc does
    /// (systemd keeps the quota as a percentage); `u64::MAX` (infinity) for no quota.
    pub fn cpu_quota_per_sec(cpu: CpuMax) -> u64 {
        match cpu.quota {
            None => u64::MAX,
            Some(q) => {
                let per_sec = q.saturating_mul(1_000_000) / cpu.period.max(1);
                per_sec.div_ceil(10_000).saturating_mul(10_000)
            }
        }
    }
}

/// Why a unit could not be started, changed or stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("systemd unit {unit}: {reason}")]
pub struct UnitError {
    /// The unit.
    pub unit: String,
    /// What systemd (or the bus) said.
    pub reason: String,
}

/// Starts, changes and stops slice units: the systemd driver's only way to create and remove cgroups.
pub trait Units: Send + Sync + std::fmt::Debug {
    /// Starts a transient slice unit with `limits` and returns once systemd has made its cgroup; a unit that is
    /// already there (a restart adopting it) gets the limits instead.
    fn start_slice(&self, unit: &str, limits: &UnitLimits) -> Result<(), UnitError>;

    /// Sets properties of a running unit.
    fn set_limits(&self, unit: &str, limits: &UnitLimits) -> Result<(), UnitError>;

    /// Stops a unit (systemd stops what runs in it and removes its cgroup); a unit that is not there is not an
    /// error.
    fn stop(&self, unit: &str) -> Result<(), UnitError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn slices_are_named_and_placed_as_the_kubelet_names_them() {
        let uid = "0f2d-4a";
        let pod = parts(&["kubepods", "burstable", &format!("pod{uid}")]);
        assert_eq!(slice_unit(&pod), "kubepods-burstable-pod0f2d_4a.slice");
        assert_eq!(
            slice_path(&slice_unit(&pod)).unwrap().as_str(),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f2d_4a.slice"
        );
        assert_eq!(slice_unit(&parts(&["kubepods"])), "kubepods.slice");
        assert_eq!(slice_path("-.slice").unwrap(), CgroupPath::root());
        assert_eq!(slice_unit(&[]), "-.slice");
    }

    #[test]
    fn the_cgroup_root_is_read_as_the_kubelet_reads_it() {
        let root = |s: &str| CgroupPath::parse(s).unwrap();
        let path = |s: &str| root_path(&root(s)).map(|p| p.as_str().to_owned());
        assert!(root_parts(&root("/")).unwrap().is_empty());
        assert_eq!(path("/").unwrap(), "/");
        assert_eq!(root_parts(&root("/nodewarden")).unwrap(), parts(&["nodewarden"]));
        assert_eq!(path("/nodewarden").unwrap(), "/nodewarden.slice");
        // One part per component, a dash inside a part written as an underscore.
        assert_eq!(path("/a/b").unwrap(), "/a.slice/a-b.slice");
        assert_eq!(path("/my-root").unwrap(), "/my_root.slice");
        // Where systemd puts a slice is read back as that slice.
        assert_eq!(root_parts(&root("/a.slice/a-b.slice")).unwrap(), parts(&["a", "b"]));
        assert_eq!(path("/a.slice/a-b.slice").unwrap(), "/a.slice/a-b.slice");
        assert_eq!(path("/my_root.slice").unwrap(), "/my_root.slice");
        // A slice where systemd would not put it, or the two forms mixed, is refused.
        for bad in ["/a-b.slice", "/x.slice/a-b.slice", "/a/b.slice", "/.slice", "/a.slice/a-.slice"] {
            assert!(root_parts(&root(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_cpu_quota_is_given_per_second_and_rounded_up_to_ten_milliseconds() {
        let cpu = |quota, period| CpuMax { quota, period };
        assert_eq!(UnitLimits::cpu_quota_per_sec(cpu(Some(25_000), 100_000)), 250_000);
        assert_eq!(UnitLimits::cpu_quota_per_sec(cpu(Some(1_000), 100_000)), 10_000);
        assert_eq!(UnitLimits::cpu_quota_per_sec(cpu(Some(10_001), 100_000)), 110_000);
        assert_eq!(UnitLimits::cpu_quota_per_sec(cpu(None, 100_000)), u64::MAX);
    }
}
