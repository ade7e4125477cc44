//! A directory's disk usage read from a project quota, as the kubelet's `LocalStorageCapacityIsolationFSQuotaMonitoring`
//! (KEP-1029) reads it. Where the node's file system keeps project quotas (ext4 with the `project` and `quota`
//! features, XFS mounted with `prjquota`), each disk-backed `emptyDir` and each pod's log directory gets a project ID
//! of its own when it is made; what is made below it inherits the ID, and the kernel keeps the bytes of the project
//! as they are written. One `quotactl` then answers what a walk of every file took. Elsewhere (tmpfs, ext4 without
//! the features, a kernel before 5.14's `quotactl_fd`) nothing is assigned and the usage is walked
//! ([`crate::disk_usage::du`] asks [`owned_usage`] at each directory it enters).
//!
//! A directory owns a project when its ID is set with inheritance and differs from its parent's: a directory below
//! a project's root shares the root's ID and is walked. IDs are chosen from [`FIRST_ID`] up, one whose quota holds
//! nothing; the directory's own inode then holds it, so a later claim never takes it while the directory lives.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

/// The first project ID given out, as the kubelet's: IDs below are left to the operator's own projects.
pub const FIRST_ID: u32 = 1_048_577;
/// How many IDs from [`FIRST_ID`] a claim may take.
const ID_SPAN: u32 = 1 << 30;
/// How many candidate IDs a claim tries before it gives up (the directory is then walked).
const TRIES: u32 = 64;

/// `_IOR('X', 31, struct fsxattr)`.
const FS_IOC_FSGETXATTR: libc::c_ulong = 0x801c_581f;
/// `_IOW('X', 32, struct fsxattr)`.
const FS_IOC_FSSETXATTR: libc::c_ulong = 0x401c_5820;
/// New files and directories take the directory's project ID.
const FS_XFLAG_PROJINHERIT: u32 = 0x0000_0200;
/// The project quota type of `quotactl`.
const PRJQUOTA: libc::c_int = 2;

/// The kernel's `struct fsxattr`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct FsXattr {
    xflags: u32,
    extsize: u32,
    nextents: u32,
    projid: u32,
    cowextsize: u32,
    pad: [u8; 8],
}

/// Claims are made one at a time: two at once could both see an ID free.
static CLAIMS: Mutex<()> = Mutex::new(());

fn get_xattr(dir: &File) -> io::Result<FsXattr> {
    let mut x = FsXattr::default();
    // SAFETY: `dir` is an open descriptor for the call's length and `x` a writable `struct fsxattr` of the size the
    // request encodes; the kernel writes only into it.
    #[expect(unsafe_code, reason = "an ioctl with no safe wrapper; the SAFETY comment says why it is sound")]
    let rc = unsafe { libc::ioctl(dir.as_raw_fd(), FS_IOC_FSGETXATTR, &raw mut x) };
    if rc == 0 { Ok(x) } else { Err(io::Error::last_os_error()) }
}

fn set_xattr(dir: &File, x: &FsXattr) -> io::Result<()> {
    // SAFETY: `dir` is an open descriptor for the call's length and `x` a readable `struct fsxattr` of the size the
    // request encodes; the kernel only reads it.
    #[expect(unsafe_code, reason = "an ioctl with no safe wrapper; the SAFETY comment says why it is sound")]
    let rc = unsafe { libc::ioctl(dir.as_raw_fd(), FS_IOC_FSSETXATTR, std::ptr::from_ref(x)) };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// The bytes and inodes the kernel counts for project `id` on the file system of `on`.
fn read_quota(on: &File, id: u32) -> io::Result<(u64, u64)> {
    let mut q = libc::dqblk {
        dqb_bhardlimit: 0,
        dqb_bsoftlimit: 0,
        dqb_curspace: 0,
        dqb_ihardlimit: 0,
        dqb_isoftlimit: 0,
        dqb_curinodes: 0,
        dqb_btime: 0,
        dqb_itime: 0,
        dqb_valid: 0,
    };
    // SAFETY: `on` is an open descriptor for the call's length and `q` a writable `struct if_dqblk`, which
    // Q_GETQUOTA fills; the other arguments are plain integers.
    #[expect(unsafe_code, reason = "a system call with no safe wrapper; the SAFETY comment says why it is sound")]
    let rc = unsafe {
        libc::syscall(libc::SYS_quotactl_fd, on.as_raw_fd(), libc::QCMD(libc::Q_GETQUOTA, PRJQUOTA), id, &raw mut q)
    };
    if rc == 0 { Ok((q.dqb_curspace, q.dqb_curinodes)) } else { Err(io::Error::last_os_error()) }
}

/// The project ID of `dir` when set with inheritance, else 0 (none, or a file system without projects).
fn project_id(dir: &Path) -> u32 {
    let Ok(f) = File::open(dir) else { return 0 };
    get_xattr(&f).ok().filter(|x| x.xflags & FS_XFLAG_PROJINHERIT != 0).map_or(0, |x| x.projid)
}

/// The bytes and inodes below `dir` when it owns a project whose quota the kernel keeps (see the module's doc);
/// `None` where it must be walked.
pub(crate) fn owned_usage(dir: &Path) -> Option<crate::disk_usage::DiskUsage> {
    let f = File::open(dir).ok()?;
    let x = get_xattr(&f).ok()?;
    if x.projid == 0 || x.xflags & FS_XFLAG_PROJINHERIT == 0 {
        return None;
    }
    if dir.parent().is_some_and(|p| project_id(p) == x.projid) {
        return None;
    }
    read_quota(&f, x.projid).ok().map(|(bytes, inodes)| crate::disk_usage::DiskUsage { bytes, inodes })
}

/// The candidate IDs for `key`, spread from a hash of it so that claims seldom meet.
fn candidates(key: &str) -> impl Iterator<Item = u32> {
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    let start = u32::try_from(hash % u64::from(ID_SPAN)).unwrap_or(0);
    (0..TRIES).map(move |i| FIRST_ID + (start.wrapping_add(i) % ID_SPAN))
}

/// Gives `dir`, just made and empty, a project ID of its own where its file system keeps project quotas, so that
/// [`owned_usage`] reads it; returns the ID. A directory that owns one already keeps it; one that holds files does
/// not get one (they would not be counted) and is walked, as is every directory where the file system has no
/// project quotas (the error says why).
pub fn claim(dir: &Path) -> io::Result<u32> {
    let f = File::open(dir)?;
    let _one = CLAIMS.lock().unwrap_or_else(PoisonError::into_inner);
    let mut x = get_xattr(&f).map_err(|e| io::Error::other(format!("the file system has no project IDs ({e})")))?;
    let parent = dir.parent().map_or(0, project_id);
    if x.projid != 0 && x.xflags & FS_XFLAG_PROJINHERIT != 0 && x.projid != parent {
        return Ok(x.projid);
    }
    if std::fs::read_dir(dir)?.next().is_some() {
        return Err(io::Error::other("the directory already holds files, which a project would not count"));
    }
    for id in candidates(&dir.to_string_lossy()) {
        // XFS answers ENOENT for a project it has no record of: an ID nobody uses.
        let (bytes, inodes) = match read_quota(&f, id) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => (0, 0),
            read => read.map_err(|e| io::Error::other(format!("the file system keeps no project quotas ({e})")))?,
        };
        if bytes != 0 || inodes != 0 {
            continue;
        }
        x.projid = id;
        x.xflags |= FS_XFLAG_PROJINHERIT;
        set_xattr(&f, &x)?;
        return Ok(id);
    }
    Err(io::Error::other(format!("no free project ID among {TRIES} tried")))
}

/// How the usage of directories made below `dir` is read: from project quotas, or by walking them and why. Probes
/// with a directory of its own that it removes.
pub fn usage_method(dir: &Path) -> Result<(), String> {
    let probe = dir.join(format!(".quota-probe-{}", std::process::id()));
    std::fs::create_dir_all(&probe).map_err(|e| format!("{}: {e}", probe.display()))?;
    let outcome = claim(&probe).and_then(|_| {
        owned_usage(&probe).map(|_| ()).ok_or_else(|| io::Error::other("the project's quota cannot be read"))
    });
    let _ = std::fs::remove_dir(&probe);
    outcome.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidate_ids_stay_in_their_range_and_differ_by_key() {
        let a: Vec<u32> = candidates("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/data").collect();
        let b: Vec<u32> = candidates("/var/log/pods/default_web_u1").collect();
        assert_eq!(a.len(), TRIES as usize);
        assert!(a.iter().chain(&b).all(|id| (FIRST_ID..FIRST_ID + ID_SPAN).contains(id)), "{a:?}");
        assert_ne!(a[0], b[0]);
        let mut sorted = a.clone();
        sorted.dedup();
        assert_eq!(sorted.len(), a.len(), "no ID tried twice");
    }

    #[test]
    fn the_kernel_structures_have_their_abi_sizes() {
        assert_eq!(size_of::<FsXattr>(), 28);
        assert_eq!(FS_IOC_FSGETXATTR >> 16 & 0x3fff, 28);
        assert_eq!(FS_IOC_FSSETXATTR >> 16 & 0x3fff, 28);
        assert_eq!(size_of::<libc::dqblk>(), 72);
    }

    #[test]
    fn where_projects_are_not_kept_nothing_is_claimed_and_the_walk_stays() {
        // tmpfs and the host's file systems without project quotas (this test's temporary directory) refuse the
        // claim with a reason, and no directory there reads as owning a project.
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("data");
        std::fs::create_dir(&d).unwrap();
        if claim(&d).is_ok() {
            // A file system that does keep them: the directory now owns its project and reads empty.
            assert!(owned_usage(&d).is_some_and(|u| u.bytes < 64 * 1024));
            return;
        }
        assert_eq!(owned_usage(&d), None);
        assert!(usage_method(dir.path()).is_err());
        assert!(std::fs::read_dir(dir.path()).unwrap().count() == 1, "the probe is removed");
    }
}
