//! Writing a placement's cgroups apart from the ledger: [`PendingPlacement`] carries what
//! [`ResourceManager::begin_place`](super::ResourceManager::begin_place) decided and the handles the write needs, so
//! the write (under the systemd driver, a D-Bus round trip per slice) runs without holding the ledger, and
//! placements of different pods overlap.

use std::sync::Arc;

use super::Placement;
use crate::cgroupfs::{CgroupFs, CgroupPath};
use crate::error::CgroupError;
use crate::limits::CgroupLimits;
use crate::systemd::{UnitLimits, Units};
use crate::tree::{self, Tree};

/// What writing cgroups needs: clones of the manager's handles on cgroupfs and systemd.
#[derive(Clone)]
pub(super) struct CgroupWriter {
    pub fs: CgroupFs,
    pub units: Option<Arc<dyn Units>>,
    pub tree: Tree,
    pub container_cgroups: bool,
}

impl std::fmt::Debug for CgroupWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CgroupWriter").field("systemd", &self.units.is_some()).finish_non_exhaustive()
    }
}

impl CgroupWriter {
    fn units(&self) -> Option<&dyn Units> {
        self.units.as_deref()
    }

    /// Creates a pod's or a container's cgroup (recorded in `created`), or gives its slice the limits again where
    /// it is there, and writes the limits.
    pub(super) fn make(
        &self,
        cg: &CgroupPath,
        limits: &CgroupLimits,
        created: &mut Vec<CgroupPath>,
    ) -> Result<(), CgroupError> {
        let unit_limits = UnitLimits::of(limits);
        let new = if self.fs.exists(cg) {
            tree::set_unit_limits(self.units(), &self.tree, cg, &unit_limits)?;
            false
        } else {
            // Recorded before it is asked for: a slice systemd started but whose cgroup never came is stopped too.
            created.push(cg.clone());
            tree::create(&self.fs, self.units(), &self.tree, cg, &unit_limits)?
        };
        tree::apply(&self.fs, cg, limits, new)
    }

    fn write(&self, p: &Placement, created: &mut Vec<CgroupPath>) -> Result<(), CgroupError> {
        self.make(&p.cgroup, &p.limits, created)?;
        // Pods do not swap (the kubelet's NoSwap): a pod that swapped past memory.max would hide its memory from
        // the eviction signal. Where the kernel has no swap accounting, the file is not there. Under the systemd
        // driver the slice also has it as `MemorySwapMax` (see `UnitLimits::of`).
        if self.fs.file(&p.cgroup, "memory.swap.max").exists() {
            self.fs.write(&p.cgroup, "memory.swap.max", "0")?;
        }
        tree::delegate(&self.fs, &self.tree, &p.cgroup)?;
        if self.container_cgroups {
            for c in &p.containers {
                self.make(&c.cgroup, &c.limits, created)?;
            }
        }
        Ok(())
    }
}

/// A placement recorded in the ledger whose cgroups are still to be written.
#[derive(Debug)]
pub struct PendingPlacement {
    pub(super) placement: Placement,
    /// What the ledger had for the pod before (an update), kept if the write fails.
    pub(super) before: Option<Placement>,
    pub(super) writer: CgroupWriter,
}

impl PendingPlacement {
    /// The placement being written.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Writes the pod's cgroups and their limits (new ones created; under the systemd driver as slices over
    /// D-Bus). On a failure the cgroups this write created are removed again.
    pub fn write(&self) -> Result<(), CgroupError> {
        let mut created = Vec::new();
        let written = self.writer.write(&self.placement, &mut created);
        if written.is_err() {
            for cg in created.iter().rev() {
                if let Err(e) = tree::remove(&self.writer.fs, self.writer.units(), &self.writer.tree, cg) {
                    tracing::warn!(cgroup = %cg, error = %e, "cannot remove cgroup after a failed placement");
                }
            }
        }
        written
    }
}
