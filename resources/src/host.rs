//! The start-up check: is there a cgroup v2 unified hierarchy with the controllers nodewarden needs, and may it
//! write there? Nothing is written by the check, so a refused start leaves no half-made tree.

use crate::cgroupfs::{CgroupFs, CgroupPath};

/// The controllers nodewarden cannot work without.
pub const REQUIRED_CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];
/// Controllers enabled for pods when the kernel offers them.
pub const OPTIONAL_CONTROLLERS: [&str; 3] = ["cpuset", "io", "hugetlb"];

/// The `f_type` that statfs(2) reports for a cgroup2 file system.
pub const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
const VM_HINT: &str = "run nodewarden on a host with the cgroup v2 unified hierarchy (boot with systemd.unified_cgroup_hierarchy=1 \
or cgroup_no_v1=all), or try it in the VM of deploy/vm";

/// Why the host cannot run nodewarden.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// The mount point is not a cgroup2 file system.
    #[error("{mount} is not a cgroup v2 (cgroup2) mount ({found}); {VM_HINT}")]
    NotCgroup2 {
        /// The mount point.
        mount: String,
        /// What was found instead.
        found: String,
    },
    /// Required controllers are not available at the cgroup root.
    #[error("the {} controller(s) are not available at cgroup {cgroup} (available: {available:?}); enable them in the parent's cgroup.subtree_control, or {VM_HINT}", missing.join(", "))]
    MissingControllers {
        /// The cgroup checked.
        cgroup: String,
        /// The controllers missing.
        missing: Vec<String>,
        /// What is available.
        available: Vec<String>,
    },
    /// The cgroup root's parent does not exist.
    #[error("the parent of cgroupRoot {cgroup} does not exist; create it or choose another cgroupRoot")]
    NoParent {
        /// The cgroup root.
        cgroup: String,
    },
    /// nodewarden may not write to the cgroup root.
    #[error("cannot write to {path}: {reason}; run nodewarden as root with a writable cgroup2 mount")]
    NotWritable {
        /// The directory.
        path: String,
        /// Why.
        reason: String,
    },
}

/// Checks that `fs` is a cgroup2 mount where `root` has (or, when it does not exist yet, will get from its parent)
/// the cpu, memory and pids controllers, and that the directory is writable.
pub fn check_host(fs: &CgroupFs, root: &CgroupPath) -> Result<(), HostError> {
    let mount = fs.mount().display().to_string();
    match rustix::fs::statfs(fs.mount()) {
        Ok(st) if st.f_type == CGROUP2_SUPER_MAGIC => {}
        Ok(st) => return Err(HostError::NotCgroup2 { mount, found: format!("file system magic {:#x}", st.f_type) }),
        Err(e) => return Err(HostError::NotCgroup2 { mount, found: e.to_string() }),
    }
    check_controllers(fs, root)?;
    let dir = if fs.exists(root) { fs.dir(root) } else { fs.dir(&parent(root).unwrap_or_else(CgroupPath::root)) };
    rustix::fs::access(&dir, rustix::fs::Access::WRITE_OK)
        .map_err(|e| HostError::NotWritable { path: dir.display().to_string(), reason: e.to_string() })
}

/// The controller part of [`check_host`], without the file-system type check (so tests can use a plain directory).
pub fn check_controllers(fs: &CgroupFs, root: &CgroupPath) -> Result<(), HostError> {
    let available: Vec<String> = if fs.exists(root) {
        fs.controllers(root).unwrap_or_default()
    } else {
        let p = parent(root).ok_or_else(|| HostError::NoParent { cgroup: root.to_string() })?;
        if !fs.exists(&p) {
            return Err(HostError::NoParent { cgroup: root.to_string() });
        }
        fs.read(&p, "cgroup.subtree_control").unwrap_or_default().split_whitespace().map(str::to_owned).collect()
    };
    let missing: Vec<String> =
        REQUIRED_CONTROLLERS.iter().filter(|c| !available.iter().any(|a| a == *c)).map(|c| (*c).to_owned()).collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(HostError::MissingControllers { cgroup: root.to_string(), missing, available })
    }
}

/// The parent of a cgroup path, `None` for the root.
pub fn parent(cg: &CgroupPath) -> Option<CgroupPath> {
    let (head, _) = cg.as_str().rsplit_once('/')?;
    if cg.as_str() == "/" { None } else { CgroupPath::parse(head).ok() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_controllers_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let fs = CgroupFs::emulated(dir.path(), CgroupPath::root());
        fs.write(&CgroupPath::root(), "cgroup.controllers", "cpuset cpu io\n").unwrap();
        let err = check_controllers(&fs, &CgroupPath::root()).unwrap_err();
        assert_eq!(
            err,
            HostError::MissingControllers {
                cgroup: "/".into(),
                missing: vec!["memory".into(), "pids".into()],
                available: vec!["cpuset".into(), "cpu".into(), "io".into()]
            }
        );
        assert!(err.to_string().contains("deploy/vm"));
        // A root that does not exist yet takes its controllers from the parent's subtree_control.
        let nw = CgroupPath::parse("/nodewarden").unwrap();
        fs.write(&CgroupPath::root(), "cgroup.subtree_control", "cpu memory pids\n").unwrap();
        assert_eq!(check_controllers(&fs, &nw), Ok(()));
        assert!(matches!(check_controllers(&fs, &CgroupPath::parse("/a/b").unwrap()), Err(HostError::NoParent { .. })));
    }

    #[test]
    fn a_plain_directory_is_not_cgroup2() {
        let dir = tempfile::tempdir().unwrap();
        let fs = CgroupFs::new(dir.path(), CgroupPath::root());
        assert!(matches!(check_host(&fs, &CgroupPath::root()), Err(HostError::NotCgroup2 { .. })));
    }

    #[test]
    fn parents() {
        assert_eq!(parent(&CgroupPath::parse("/a/b").unwrap()), Some(CgroupPath::parse("/a").unwrap()));
        assert_eq!(parent(&CgroupPath::parse("/a").unwrap()), Some(CgroupPath::root()));
        assert_eq!(parent(&CgroupPath::root()), None);
    }
}
