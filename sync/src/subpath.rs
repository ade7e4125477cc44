//! `subPath` mounts, resolved so that they cannot leave their volume (the CVE-2017-1002101 class: a container
//! plants `x -> /` in a writable volume, and the next container that mounts `subPath: x` would get the host's
//! root). The path is opened component by component beneath the volume (`openat2` with `RESOLVE_BENEATH`: a
//! symlink may point elsewhere in the volume, never out of it), missing directories are created the same way, as
//! the kubelet creates them, and what was opened is bind-mounted through its descriptor onto a staging path under
//! the pod directory, `volume-subpaths/<volume>/<container>/<index>`, which the runtime mounts. The staging mount
//! pins what was checked: swapping a component for a symlink afterwards changes nothing.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, ResolveFlags, fstat, mkdirat, openat2};
use rustix::io::Errno;

use crate::volumes::{PreparedVolume, mounts_under, pod_dir};

/// The directory under a pod's directory where subPath mounts are staged.
pub const STAGING_DIR: &str = "volume-subpaths";

/// Checks a subPath lexically: relative, without `..`.
pub fn check(sub: &str) -> Result<(), String> {
    if !nodewarden_runtime::security::is_relative_beneath(sub) {
        return Err(format!("subPath {sub:?} must be a relative path without '..'"));
    }
    Ok(())
}

fn beneath(dir: &impl AsFd, name: &Path, flags: OFlags) -> Result<OwnedFd, Errno> {
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
    openat2(dir, name, flags | OFlags::PATH | OFlags::CLOEXEC, Mode::empty(), resolve)
}

/// Opens `sub` beneath `volume`, creating the directories that are missing.
fn open_beneath(volume: &Path, sub: &Path) -> Result<OwnedFd, String> {
    let shown = || format!("subPath {:?} of volume {}", sub.display(), volume.display());
    let why = |e: Errno| match e {
        Errno::XDEV => format!("{} leads out of the volume (through a symbolic link); refused", shown()),
        Errno::LOOP => format!("{} has too many symbolic links", shown()),
        e => format!("{}: {e}", shown()),
    };
    let base = rustix::fs::open(volume, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| format!("volume {}: {e}", volume.display()))?;
    match beneath(&base, sub, OFlags::empty()) {
        Ok(fd) => return Ok(fd),
        Err(Errno::NOENT) => {}
        Err(e) => return Err(why(e)),
    }
    // Missing: walk it, making each directory that is not there, each step beneath the one before.
    let mut cur = base;
    for c in sub.components() {
        let Component::Normal(name) = c else { continue };
        let name = Path::new(name);
        cur = match beneath(&cur, name, OFlags::DIRECTORY) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => {
                match mkdirat(&cur, name, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(why(e)),
                }
                beneath(&cur, name, OFlags::DIRECTORY).map_err(why)?
            }
            Err(e) => return Err(why(e)),
        };
    }
    Ok(cur)
}

/// Where the subPath mount number `index` of `container` on `volume` is staged.
pub fn staging_path(root: &Path, uid: &str, volume: &str, container: &str, index: usize) -> PathBuf {
    pod_dir(root, uid).join(STAGING_DIR).join(volume).join(container).join(index.to_string())
}

/// Resolves `sub` inside `volume` and stages it for the container's mount number `index`; returns the staging
/// path, the mount's source for the runtime.
pub fn stage(
    root: &Path,
    uid: &str,
    volume: &PreparedVolume,
    container: &str,
    index: usize,
    sub: &str,
) -> Result<PathBuf, String> {
    check(sub)?;
    let fd = open_beneath(&volume.path, Path::new(sub))?;
    let is_dir =
        fstat(&fd).map(|s| FileType::from_raw_mode(s.st_mode) == FileType::Directory).map_err(|e| e.to_string())?;
    let staged = staging_path(root, uid, &volume.name, container, index);
    // A restarted container stages again: the old staging mount goes first (the running container's own mount
    // does not depend on it).
    for m in mounts_under(&staged).into_iter().rev() {
        rustix::mount::unmount(&m, rustix::mount::UnmountFlags::DETACH)
            .map_err(|e| format!("cannot unmount {}: {e}", m.display()))?;
    }
    let parent = staged.parent().ok_or("no parent")?;
    std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    let made = if is_dir {
        std::fs::create_dir_all(&staged)
    } else {
        std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(&staged).map(drop)
    };
    made.map_err(|e| format!("{}: {e}", staged.display()))?;
    let source = format!("/proc/self/fd/{}", fd.as_raw_fd());
    rustix::mount::mount_bind(source.as_str(), &staged)
        .map_err(|e| format!("cannot stage subPath {sub:?} of volume {} at {}: {e}", volume.name, staged.display()))?;
    Ok(staged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volumes::remove_pod_dir;

    fn can_mount() -> bool {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        let ok = rustix::mount::mount_bind(&a, &b).is_ok();
        if ok {
            let _ = rustix::mount::unmount(&b, rustix::mount::UnmountFlags::DETACH);
        } else {
            eprintln!("skipped: bind mounts are not allowed here");
        }
        ok
    }

    #[test]
    fn refuses_lexical_escapes() {
        assert!(check("a/../../etc").is_err());
        assert!(check("/etc").is_err());
        assert!(check("a/b..c/d").is_ok());
    }

    #[test]
    fn a_symlink_out_of_the_volume_is_refused_and_one_inside_is_followed() {
        if !can_mount() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let host = dir.path().join("host");
        std::fs::create_dir_all(host.join("inner")).unwrap();
        std::fs::write(host.join("inner/f"), "in the volume").unwrap();
        std::fs::write(dir.path().join("secret"), "outside").unwrap();
        // What a container could plant in a writable volume.
        std::os::unix::fs::symlink("/", host.join("x")).unwrap();
        std::os::unix::fs::symlink("../secret", host.join("up")).unwrap();
        std::os::unix::fs::symlink("inner", host.join("ok")).unwrap();
        let vol = PreparedVolume { name: "data".into(), path: host.clone(), projected: false };
        for bad in ["x", "x/etc", "up", "inner/../x"] {
            let err = stage(&root, "u", &vol, "app", 0, bad).unwrap_err();
            assert!(err.contains("out of the volume") || err.contains("without '..'"), "{bad}: {err}");
        }
        let staged = stage(&root, "u", &vol, "app", 1, "ok").unwrap();
        assert_eq!(std::fs::read_to_string(staged.join("f")).unwrap(), "in the volume");
        // A missing path is made inside the volume; a file is staged as a file.
        let made = stage(&root, "u", &vol, "app", 2, "new/dir").unwrap();
        std::fs::write(made.join("g"), "written").unwrap();
        assert_eq!(std::fs::read_to_string(host.join("new/dir/g")).unwrap(), "written");
        let file = stage(&root, "u", &vol, "app", 3, "inner/f").unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "in the volume");
        // Staging again (a restarted container) replaces the staging mount; the check pins what was resolved:
        // swapping the path for a symlink out after staging changes nothing.
        let again = stage(&root, "u", &vol, "app", 1, "ok").unwrap();
        std::fs::remove_file(host.join("ok")).unwrap();
        std::os::unix::fs::symlink("/", host.join("ok")).unwrap();
        assert_eq!(std::fs::read_to_string(again.join("f")).unwrap(), "in the volume");
        // The pod's removal unmounts the staging mounts and removes nothing through them.
        remove_pod_dir(&root, "u").unwrap();
        assert!(!pod_dir(&root, "u").exists());
        assert_eq!(std::fs::read_to_string(host.join("inner/f")).unwrap(), "in the volume");
        assert!(host.join("new/dir/g").exists());
    }
}
