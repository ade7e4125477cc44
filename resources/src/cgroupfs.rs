//! The cgroup v2 file system: the only code in nodewarden that reads or writes cgroupfs.
//!
//! Every path is the mount point joined with a [`CgroupPath`], which is built only from checked components, and
//! every write, create or remove is refused unless its cgroup lies inside the write scope (nodewarden's cgroup
//! root). Controllers are stateless functions of a path, so tests point a [`CgroupFs`] at a temporary directory.
//!
//! Why not cgroups-rs: its v2 hierarchy hard-codes the `/sys/fs/cgroup` mount (no temporary-directory tests), it
//! has no PSI and no `memory.events`, its v2 OOM notifier reads the v1-only `memory.oom_control`, and it pulls in
//! zbus with a second async runtime. The part nodewarden needs is a few dozen lines of file I/O.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{CgroupError, IoError, NameError, Op, ParseError};
use crate::parse::{self, CpuMax, Limit, Psi};

/// A cgroup's location below the cgroup2 mount, such as `/kubepods/burstable/pod<UID>`. Always absolute, never
/// holds `.` or `..` components, and is built from checked names only.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct CgroupPath(String);

impl CgroupPath {
    /// The root of the hierarchy, `/`.
    pub fn root() -> Self {
        Self("/".to_owned())
    }

    /// Parses a configured path such as the kubelet's `cgroupRoot` (`/`, `/custom`, `custom/sub`). Empty means
    /// the root, as in the kubelet.
    pub fn parse(s: &str) -> Result<Self, NameError> {
        let mut out = Self::root();
        for part in s.split('/').filter(|p| !p.is_empty()) {
            out = out.child(part)?;
        }
        Ok(out)
    }

    /// The child cgroup `name`. The name must be a single path component.
    pub fn child(&self, name: &str) -> Result<Self, NameError> {
        let what = "cgroup name";
        if name.is_empty() {
            return Err(NameError::Empty { what });
        }
        if name == "." || name == ".." {
            return Err(NameError::Escapes { what, name: name.to_owned() });
        }
        if let Some(bad) = name.chars().find(|c| *c == '/' || *c == '\0' || c.is_control()) {
            return Err(NameError::BadChar { what, name: name.to_owned(), bad });
        }
        if name.len() > crate::names::MAX_NAME_LEN {
            let shown = name.chars().take(40).collect();
            return Err(NameError::TooLong { what, name: shown, max: crate::names::MAX_NAME_LEN });
        }
        Ok(if self.0 == "/" { Self(format!("/{name}")) } else { Self(format!("{}/{name}", self.0)) })
    }

    /// The path as a string, starting with `/`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The last component, or `None` for the root.
    pub fn name(&self) -> Option<&str> {
        self.0.rsplit('/').next().filter(|n| !n.is_empty())
    }

    /// True when `self` is `other` or lies below it.
    pub fn is_within(&self, other: &CgroupPath) -> bool {
        other.0 == "/" || self.0 == other.0 || self.0.strip_prefix(&other.0).is_some_and(|rest| rest.starts_with('/'))
    }

    fn relative(&self) -> &str {
        self.0.trim_start_matches('/')
    }
}

impl fmt::Display for CgroupPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What control files of a cgroup hold when the kernel has just made it, for the limits every placement writes:
/// a write of the same value to a new cgroup changes nothing, and is left out.
pub const NEW_CGROUP_DEFAULTS: [(&str, &str); 5] = [
    ("cpu.weight", "100"),
    ("cpu.max", "max 100000"),
    ("pids.max", "max"),
    ("memory.max", "max"),
    ("memory.swap.max", "max"),
];

/// Access to a cgroup2 hierarchy mounted at `mount`, writing only inside `scope`.
#[derive(Debug, Clone)]
pub struct CgroupFs {
    mount: PathBuf,
    scope: CgroupPath,
    emulated: bool,
}

/// A write that was refused because its cgroup lies outside the write scope.
fn out_of_scope(path: PathBuf) -> IoError {
    IoError::new(
        Op::Write,
        path,
        std::io::Error::new(std::io::ErrorKind::PermissionDenied, "outside nodewarden's cgroup root"),
    )
}

impl CgroupFs {
    /// A real cgroup2 mount (normally `/sys/fs/cgroup`); writes are allowed in `scope` and below.
    pub fn new(mount: impl Into<PathBuf>, scope: CgroupPath) -> Self {
        Self { mount: mount.into(), scope, emulated: false }
    }

    /// A plain directory standing in for cgroupfs in tests: a cgroup made by [`CgroupFs::create`] gets the files
    /// of [`NEW_CGROUP_DEFAULTS`], other control files are created on first write (as the kernel would have
    /// created them with the directory), and removing a cgroup removes its files.
    pub fn emulated(dir: impl Into<PathBuf>, scope: CgroupPath) -> Self {
        Self { mount: dir.into(), scope, emulated: true }
    }

    /// The mount point.
    pub fn mount(&self) -> &Path {
        &self.mount
    }

    /// The cgroup below which writes are allowed.
    pub fn scope(&self) -> &CgroupPath {
        &self.scope
    }

    /// The directory of a cgroup.
    pub fn dir(&self, cg: &CgroupPath) -> PathBuf {
        self.mount.join(cg.relative())
    }

    /// The path of a control file of a cgroup.
    pub fn file(&self, cg: &CgroupPath, name: &str) -> PathBuf {
        self.dir(cg).join(name)
    }

    /// True when the cgroup's directory exists.
    pub fn exists(&self, cg: &CgroupPath) -> bool {
        self.dir(cg).is_dir()
    }

    /// Reads a control file.
    pub fn read(&self, cg: &CgroupPath, name: &str) -> Result<String, IoError> {
        crate::kernel_file::read_text(&self.file(cg, name))
    }

    /// Writes a control file in one `write(2)`, as the kernel expects. Refused outside the write scope.
    pub fn write(&self, cg: &CgroupPath, name: &str, value: &str) -> Result<(), IoError> {
        let path = self.file(cg, name);
        if !cg.is_within(&self.scope) {
            return Err(out_of_scope(path));
        }
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(self.emulated)
            .truncate(self.emulated)
            .open(&path)
            .map_err(|e| IoError::new(Op::Write, &path, e))?;
        f.write_all(value.as_bytes()).map_err(|e| IoError::new(Op::Write, path, e))
    }

    /// Registers a PSI trigger (`some 100000 1000000`: 100 ms of stall within 1 s) on a pressure file such as
    /// `memory.pressure`, and returns the open file: the kernel signals `POLLPRI` on it each time the trigger fires,
    /// for as long as it stays open.
    pub fn psi_trigger(&self, cg: &CgroupPath, name: &str, trigger: &str) -> Result<fs::File, IoError> {
        let path = self.file(cg, name);
        if !cg.is_within(&self.scope) {
            return Err(out_of_scope(path));
        }
        open_psi_trigger(&path, trigger)
    }

    /// Creates the cgroup (its parent must exist); true when this call made it, so that its control files hold
    /// the kernel's defaults ([`NEW_CGROUP_DEFAULTS`]). Creating one that exists is not an error.
    pub fn create(&self, cg: &CgroupPath) -> Result<bool, IoError> {
        let path = self.dir(cg);
        if !cg.is_within(&self.scope) {
            return Err(out_of_scope(path));
        }
        match fs::create_dir(&path) {
            Ok(()) => {
                if self.emulated {
                    for (name, value) in NEW_CGROUP_DEFAULTS {
                        self.write(cg, name, value)?;
                    }
                }
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(IoError::new(Op::Create, path, e)),
        }
    }

    /// Removes an empty cgroup (no processes, no children). Removing one that is gone is not an error.
    pub fn remove(&self, cg: &CgroupPath) -> Result<(), IoError> {
        let path = self.dir(cg);
        if !cg.is_within(&self.scope) || *cg == self.scope {
            return Err(out_of_scope(path));
        }
        if self.emulated && self.children(cg)?.is_empty() {
            if !self.read_procs(cg).map(|p| p.is_empty()).unwrap_or(true) {
                return Err(IoError::new(Op::Remove, path, std::io::Error::from_raw_os_error(16)));
            }
            for entry in fs::read_dir(&path).map_err(|e| IoError::new(Op::List, &path, e))?.flatten() {
                let _ = fs::remove_file(entry.path());
            }
        }
        match fs::remove_dir(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(IoError::new(Op::Remove, path, e)),
        }
    }

    /// The names of the child cgroups.
    pub fn children(&self, cg: &CgroupPath) -> Result<Vec<String>, IoError> {
        let path = self.dir(cg);
        let rd = fs::read_dir(&path).map_err(|e| IoError::new(Op::List, &path, e))?;
        let mut out = Vec::new();
        for entry in rd {
            let entry = entry.map_err(|e| IoError::new(Op::List, &path, e))?;
            if entry.file_type().is_ok_and(|t| t.is_dir())
                && let Some(name) = entry.file_name().to_str()
            {
                out.push(name.to_owned());
            }
        }
        out.sort();
        Ok(out)
    }

    /// A cgroup and every cgroup below it, children before their parents (the order in which they can be
    /// removed). Empty when the cgroup does not exist.
    pub fn subtree(&self, cg: &CgroupPath) -> Result<Vec<CgroupPath>, CgroupError> {
        if !self.exists(cg) {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for name in self.children(cg)? {
            out.extend(self.subtree(&cg.child(&name)?)?);
        }
        out.push(cg.clone());
        Ok(out)
    }

    /// Removes a cgroup and every cgroup below it, children first. Fails (EBUSY) while any of them holds a process.
    pub fn remove_tree(&self, cg: &CgroupPath) -> Result<(), CgroupError> {
        for c in self.subtree(cg)? {
            self.remove(&c)?;
        }
        Ok(())
    }

    /// Kills whatever runs in a cgroup tree (`cgroup.kill`) and removes the tree, retrying for up to about a second
    /// while the killed processes exit. Blocks the thread: for tools and tests, not for async code.
    pub fn purge(&self, cg: &CgroupPath) -> Result<(), CgroupError> {
        if !self.exists(cg) {
            return Ok(());
        }
        // A tree whose processes are already gone has nothing to kill; a refused kill shows in the removal.
        let _ = self.kill(cg);
        let mut last = Ok(());
        for _ in 0..50 {
            last = self.remove_tree(cg);
            if last.is_ok() {
                return last;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        last
    }

    /// The processes in a cgroup and every cgroup below it. A child removed while the tree is read (a runtime
    /// tearing its container down) holds none; the cgroup itself must be readable.
    pub fn subtree_procs(&self, cg: &CgroupPath) -> Result<Vec<u32>, CgroupError> {
        let mut pids = Vec::new();
        for c in self.subtree(cg)? {
            match self.read_procs(&c) {
                Ok(p) => pids.extend(p),
                Err(CgroupError::Io(e)) if e.is_not_found() && c != *cg => {}
                Err(e) => return Err(e),
            }
        }
        Ok(pids)
    }

    /// The controllers available in a cgroup (`cgroup.controllers`).
    pub fn controllers(&self, cg: &CgroupPath) -> Result<Vec<String>, IoError> {
        Ok(self.read(cg, "cgroup.controllers")?.split_whitespace().map(str::to_owned).collect())
    }

    /// Enables `controllers` in the `cgroup.subtree_control` of each ancestor of the scope, from the top, where
    /// the ancestor has them and has not enabled them yet: a cgroup gets a controller only when its parent enabled
    /// it, and on a systemd host the root enables only what systemd's units need (runc's cgroupfs manager, and
    /// so the kubelet's, does the same). The one write outside the scope; it only ever adds controllers. Returns
    /// the ancestors changed, with what was enabled in each.
    pub fn enable_above_scope(&self, controllers: &[&str]) -> Result<Vec<(CgroupPath, Vec<String>)>, IoError> {
        let ancestors: Vec<CgroupPath> =
            std::iter::successors(crate::host::parent(&self.scope), crate::host::parent).collect();
        let mut changed = Vec::new();
        for a in ancestors.into_iter().rev() {
            if !self.exists(&a) {
                break;
            }
            let words = |file: &str| -> Result<Vec<String>, IoError> {
                Ok(self.read(&a, file)?.split_whitespace().map(str::to_owned).collect())
            };
            let (offered, enabled) = (words("cgroup.controllers")?, words("cgroup.subtree_control")?);
            let missing: Vec<String> = controllers
                .iter()
                .filter(|c| offered.iter().any(|o| o == *c) && !enabled.iter().any(|e| e == *c))
                .map(|c| (*c).to_owned())
                .collect();
            if missing.is_empty() {
                continue;
            }
            let path = self.file(&a, "cgroup.subtree_control");
            // A stand-in directory holds the list itself; the kernel takes `+name` and keeps the rest.
            let value = if self.emulated {
                enabled.iter().chain(&missing).cloned().collect::<Vec<_>>().join(" ")
            } else {
                missing.iter().map(|c| format!("+{c}")).collect::<Vec<_>>().join(" ")
            };
            fs::write(&path, value).map_err(|e| IoError::new(Op::Write, &path, e))?;
            changed.push((a, missing));
        }
        Ok(changed)
    }

    /// Enables controllers for a cgroup's children (`cgroup.subtree_control`).
    pub fn enable_controllers(&self, cg: &CgroupPath, controllers: &[&str]) -> Result<(), IoError> {
        let value: Vec<String> = controllers.iter().map(|c| format!("+{c}")).collect();
        self.write(cg, "cgroup.subtree_control", &value.join(" "))
    }

    /// The process IDs in a cgroup (`cgroup.procs`). A missing file in a stand-in directory means none.
    pub fn read_procs(&self, cg: &CgroupPath) -> Result<Vec<u32>, CgroupError> {
        let text = match self.read(cg, "cgroup.procs") {
            Ok(t) => t,
            Err(e) if self.emulated && e.is_not_found() => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.trim().parse::<u32>().map_err(|e| self.parse_error(cg, "cgroup.procs", e.to_string())))
            .collect()
    }

    /// Moves a process into a cgroup.
    pub fn add_proc(&self, cg: &CgroupPath, pid: u32) -> Result<(), IoError> {
        self.write(cg, "cgroup.procs", &pid.to_string())
    }

    /// Kills every process in the cgroup and its descendants (`cgroup.kill`, Linux 5.14 and newer).
    pub fn kill(&self, cg: &CgroupPath) -> Result<(), IoError> {
        self.write(cg, "cgroup.kill", "1")
    }

    /// Reads a file holding a number or `max`.
    pub fn read_limit(&self, cg: &CgroupPath, name: &str) -> Result<Limit, CgroupError> {
        let text = self.read(cg, name)?;
        parse::parse_limit(&text).map_err(|r| self.parse_error(cg, name, r))
    }

    /// Writes a file holding a number or `max`.
    pub fn write_limit(&self, cg: &CgroupPath, name: &str, limit: Limit) -> Result<(), IoError> {
        self.write(cg, name, &limit.to_string())
    }

    /// Reads a file holding a single number.
    pub fn read_u64(&self, cg: &CgroupPath, name: &str) -> Result<u64, CgroupError> {
        let text = self.read(cg, name)?;
        parse::parse_u64(&text).map_err(|r| self.parse_error(cg, name, r))
    }

    /// Reads `cpu.max`.
    pub fn read_cpu_max(&self, cg: &CgroupPath) -> Result<CpuMax, CgroupError> {
        let text = self.read(cg, "cpu.max")?;
        parse::parse_cpu_max(&text).map_err(|r| self.parse_error(cg, "cpu.max", r))
    }

    /// Reads a flat keyed file (`memory.stat`, `memory.events`).
    pub fn read_flat_keyed(&self, cg: &CgroupPath, name: &str) -> Result<BTreeMap<String, u64>, CgroupError> {
        let text = self.read(cg, name)?;
        parse::parse_flat_keyed(&text).map_err(|r| self.parse_error(cg, name, r))
    }

    /// Reads a PSI file (`memory.pressure`, `cpu.pressure`, `io.pressure`).
    pub fn read_psi(&self, cg: &CgroupPath, name: &str) -> Result<Psi, CgroupError> {
        let text = self.read(cg, name)?;
        parse::parse_psi(&text).map_err(|r| self.parse_error(cg, name, r))
    }

    fn parse_error(&self, cg: &CgroupPath, name: &str, reason: String) -> CgroupError {
        CgroupError::Parse(ParseError { path: self.file(cg, name), reason })
    }
}

/// Registers a PSI trigger on a pressure file (`/proc/pressure/memory` or a cgroup's) and returns the open file,
/// which the kernel marks with `POLLPRI` whenever the trigger fires.
pub fn open_psi_trigger(path: &Path, trigger: &str) -> Result<fs::File, IoError> {
    let mut f =
        fs::OpenOptions::new().read(true).write(true).open(path).map_err(|e| IoError::new(Op::Write, path, e))?;
    // With its terminating NUL: the kernel overwrites the last byte written with one before parsing.
    let mut text = trigger.as_bytes().to_vec();
    text.push(0);
    f.write_all(&text).map_err(|e| IoError::new(Op::Write, path, e))?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controllers_are_enabled_above_the_scope_only_where_offered_and_missing() {
        let dir = tempfile::tempdir().unwrap();
        let scope = CgroupPath::parse("/a/b").unwrap();
        let fs = CgroupFs::emulated(dir.path(), scope.clone());
        fs::write(dir.path().join("cgroup.controllers"), "cpuset cpu io memory pids").unwrap();
        fs::write(dir.path().join("cgroup.subtree_control"), "memory pids").unwrap();
        fs::create_dir(dir.path().join("a")).unwrap();
        fs::write(dir.path().join("a/cgroup.controllers"), "memory pids").unwrap();
        fs::write(dir.path().join("a/cgroup.subtree_control"), "").unwrap();
        let changed = fs.enable_above_scope(&REQUIRED).unwrap();
        let root = CgroupPath::root();
        let a = CgroupPath::parse("/a").unwrap();
        assert_eq!(
            changed,
            [(root.clone(), vec!["cpu".to_owned()]), (a.clone(), vec!["memory".into(), "pids".into()])]
        );
        assert_eq!(fs.read(&root, "cgroup.subtree_control").unwrap(), "memory pids cpu");
        // Nothing left to do: nothing written; the scope itself is never touched.
        assert!(fs.enable_above_scope(&REQUIRED).unwrap().is_empty());
        assert!(!dir.path().join("a/b").exists());
    }

    const REQUIRED: [&str; 3] = ["cpu", "memory", "pids"];

    #[test]
    fn paths_are_built_from_checked_components() {
        let root = CgroupPath::parse("").unwrap();
        assert_eq!(root, CgroupPath::root());
        let kp = CgroupPath::parse("/custom//root/").unwrap().child("kubepods").unwrap();
        assert_eq!(kp.as_str(), "/custom/root/kubepods");
        assert_eq!(kp.name(), Some("kubepods"));
        assert!(CgroupPath::parse("/a/../b").is_err());
        assert!(kp.child("../x").is_err());
        assert!(kp.child("a\nb").is_err());
        assert!(kp.is_within(&CgroupPath::parse("/custom").unwrap()));
        assert!(!CgroupPath::parse("/customer").unwrap().is_within(&CgroupPath::parse("/custom").unwrap()));
        assert!(kp.is_within(&CgroupPath::root()));
    }

    #[test]
    fn writes_outside_scope_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let scope = CgroupPath::parse("/nw").unwrap();
        let fs = CgroupFs::emulated(dir.path(), scope.clone());
        fs.create(&scope).unwrap();
        fs.write(&scope, "memory.max", "max").unwrap();
        let other = CgroupPath::parse("/other").unwrap();
        let err = fs.create(&other).unwrap_err();
        assert_eq!(err.source.kind(), std::io::ErrorKind::PermissionDenied);
        assert!(fs.write(&CgroupPath::root(), "cgroup.subtree_control", "+memory").is_err());
        assert!(fs.remove(&scope).is_err(), "the scope itself is never removed");
        assert!(!dir.path().join("other").exists());
    }

    #[test]
    fn reads_report_path_and_reason() {
        let dir = tempfile::tempdir().unwrap();
        let cg = CgroupPath::parse("/x").unwrap();
        let fs = CgroupFs::emulated(dir.path(), CgroupPath::root());
        fs.create(&cg).unwrap();
        fs.write(&cg, "memory.max", "lots\n").unwrap();
        let msg = fs.read_limit(&cg, "memory.max").unwrap_err().to_string();
        assert!(msg.contains("x/memory.max") && msg.contains("lots"), "{msg}");
        let missing = fs.read_u64(&cg, "pids.current").unwrap_err();
        assert!(matches!(missing, CgroupError::Io(ref e) if e.is_not_found() && e.op == Op::Read), "{missing}");
    }

    #[test]
    fn subtrees_list_children_first() {
        let dir = tempfile::tempdir().unwrap();
        let fs = CgroupFs::emulated(dir.path(), CgroupPath::root());
        let p = CgroupPath::parse("/p").unwrap();
        for path in ["/p", "/p/a", "/p/a/x", "/p/b"] {
            fs.create(&CgroupPath::parse(path).unwrap()).unwrap();
        }
        let names: Vec<String> = fs.subtree(&p).unwrap().iter().map(|c| c.to_string()).collect();
        assert_eq!(names, ["/p/a/x", "/p/a", "/p/b", "/p"]);
        assert!(fs.subtree(&CgroupPath::parse("/gone").unwrap()).unwrap().is_empty());
    }

    #[test]
    fn real_mode_never_creates_files() {
        let dir = tempfile::tempdir().unwrap();
        let fs = CgroupFs::new(dir.path(), CgroupPath::root());
        let err = fs.write(&CgroupPath::root(), "memory.max", "1").unwrap_err();
        assert!(err.is_not_found());
        assert!(!dir.path().join("memory.max").exists());
    }
}
