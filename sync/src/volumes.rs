//! Pod volumes: `emptyDir` (on disk, or `medium: Memory` as a tmpfs sized by `sizeLimit`), `hostPath` (with
//! its `type` checks) and the volumes written from API objects and the pod (`configMap`, `downwardAPI` on disk;
//! `secret`, `projected` on a tmpfs, so that secrets and tokens never reach the disk), whose files
//! [`crate::projection`] makes. They live where the kubelet keeps them,
//! `<rootDir>/pods/<uid>/volumes/<plugin>/<name>`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Volume;
use nodewarden_resources::parse_non_negative;

use crate::projection::Payload;

/// What a volume is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeSource {
    /// A directory on the node's disk, removed with the pod.
    EmptyDir,
    /// A tmpfs of at most this many bytes (`None`: the pod's memory limit, else the kernel's default).
    Memory(Option<u64>),
    /// A path on the host.
    HostPath {
        /// The path.
        path: PathBuf,
        /// The `type` check.
        kind: HostPathType,
    },
    /// Files written from API objects and the pod (`configMap`, `secret`, `downwardAPI`, `projected`).
    Projected,
}

/// A `hostPath` volume's `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPathType {
    /// `""`: no check.
    Any,
    /// `DirectoryOrCreate`.
    DirectoryOrCreate,
    /// `Directory`.
    Directory,
    /// `FileOrCreate`.
    FileOrCreate,
    /// `File`.
    File,
    /// `Socket`.
    Socket,
    /// `CharDevice`.
    CharDevice,
    /// `BlockDevice`.
    BlockDevice,
}

impl VolumeSource {
    /// Reads a pod volume, refusing the kinds nodewarden does not provide.
    pub fn from_volume(v: &Volume) -> Result<Self, String> {
        if let Some(e) = &v.empty_dir {
            let size = e
                .size_limit
                .as_ref()
                .map(|q| parse_non_negative(&q.0).map_err(|e| format!("sizeLimit: {e}")))
                .transpose()?
                // As the kubelet reads it: a zero limit is no limit set (the pod's memory limit sizes the tmpfs).
                .filter(|s| *s > 0);
            return match e.medium.as_deref() {
                None | Some("") => Ok(Self::EmptyDir),
                Some("Memory") => Ok(Self::Memory(size)),
                Some(other) => Err(format!("emptyDir medium {other:?} is not supported (use \"\" or Memory)")),
            };
        }
        if let Some(h) = &v.host_path {
            if !h.path.starts_with('/') {
                return Err(format!("hostPath {:?} must be absolute", h.path));
            }
            if Path::new(&h.path).components().any(|c| c == std::path::Component::ParentDir) {
                return Err(format!("hostPath {:?} must not contain '..'", h.path));
            }
            let kind = match h.type_.as_deref().unwrap_or_default() {
                "" => HostPathType::Any,
                "DirectoryOrCreate" => HostPathType::DirectoryOrCreate,
                "Directory" => HostPathType::Directory,
                "FileOrCreate" => HostPathType::FileOrCreate,
                "File" => HostPathType::File,
                "Socket" => HostPathType::Socket,
                "CharDevice" => HostPathType::CharDevice,
                "BlockDevice" => HostPathType::BlockDevice,
                other => return Err(format!("hostPath type {other:?} is not a hostPath type")),
            };
            return Ok(Self::HostPath { path: PathBuf::from(&h.path), kind });
        }
        if crate::projection::is_projected(v) {
            return Ok(Self::Projected);
        }
        Err("only emptyDir, hostPath, configMap, secret, downwardAPI and projected volumes are supported by nodewarden"
            .into())
    }
}

/// Why a pod's volume could not be made ready: the kubelet's `FailedMount`, in its words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MountVolume.SetUp failed for volume \"{volume}\" : {message}")]
pub struct VolumeError {
    /// The volume's name.
    pub volume: String,
    /// What failed.
    pub message: String,
}

impl VolumeError {
    /// The kubelet's reason for it (its event's and the waiting pod's).
    pub const REASON: &'static str = "FailedMount";

    fn of(v: &Volume) -> impl Fn(String) -> Self + '_ {
        move |message| Self { volume: v.name.clone(), message }
    }
}

/// A volume made ready for a pod's containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedVolume {
    /// The volume name.
    pub name: String,
    /// The host path that containers mount.
    pub path: PathBuf,
    /// Its files are made from objects and the pod, and refreshed.
    pub projected: bool,
}

/// The directory of a pod's state and volumes.
pub fn pod_dir(root: &Path, uid: &str) -> PathBuf {
    root.join("pods").join(uid)
}

/// Where volume `v` of pod `uid` is made, below `root` (`<root>/pods/<uid>/volumes/<plugin>/<name>`).
pub(crate) fn volume_dir(root: &Path, uid: &str, v: &Volume) -> PathBuf {
    pod_dir(root, uid).join("volumes").join(crate::projection::plugin_dir(v)).join(&v.name)
}

/// Makes each volume ready; idempotent, so a restart or a retry finds the ones already made. `memory_limit` sizes
/// a memory-backed `emptyDir` without a `sizeLimit`, as the kubelet does. `payloads` are the files of the volumes
/// written from objects, by volume name ([`crate::projection::volume_payload`]), swapped in atomically; with
/// `keep_last` (a pod adopted running), a volume whose objects are out of reach keeps the files it has, else its
/// mount fails as the kubelet's does.
pub fn prepare(
    root: &Path,
    uid: &str,
    volumes: &[Volume],
    memory_limit: Option<u64>,
    payloads: &BTreeMap<String, Result<Payload, String>>,
    keep_last: bool,
    fs_group: Option<u32>,
) -> Result<Vec<PreparedVolume>, VolumeError> {
    let mut out = Vec::new();
    for v in volumes {
        let failed = VolumeError::of(v);
        let source = VolumeSource::from_volume(v).map_err(&failed)?;
        let projected = source == VolumeSource::Projected;
        let path = match source {
            VolumeSource::EmptyDir => {
                use std::os::unix::fs::PermissionsExt;
                let dir = volume_dir(root, uid, v);
                std::fs::create_dir_all(&dir).map_err(|e| failed(format!("{}: {e}", dir.display())))?;
                // Writable by a container of any user, as the kubelet makes it.
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))
                    .map_err(|e| failed(format!("{}: {e}", dir.display())))?;
                // Its usage is then one read of its project's quota, where the file system keeps them.
                if let Err(e) = crate::quota::claim(&dir) {
                    tracing::trace!(dir = %dir.display(), error = %e, "the emptyDir's usage is walked");
                }
                if let Some(group) = fs_group {
                    give_to_group(&dir, group);
                }
                dir
            }
            VolumeSource::Memory(size) => {
                let dir = volume_dir(root, uid, v);
                std::fs::create_dir_all(&dir).map_err(|e| failed(format!("{}: {e}", dir.display())))?;
                if !is_mount_point(&dir) {
                    mount_tmpfs(&dir, size.or(memory_limit), 0o777).map_err(&failed)?;
                }
                if let Some(group) = fs_group {
                    give_to_group(&dir, group);
                }
                dir
            }
            VolumeSource::HostPath { path, kind } => {
                check_host_path(&path, kind).map_err(&failed)?;
                path
            }
            VolumeSource::Projected => {
                let dir = volume_dir(root, uid, v);
                match payloads.get(&v.name) {
                    Some(Ok(payload)) => {
                        write_projected(&dir, v, payload, memory_limit).map_err(&failed)?;
                    }
                    // The running containers of an adopted pod keep the files they have while their objects are out
                    // of reach, as the kubelet keeps a volume's last contents when a refresh fails.
                    Some(Err(e)) if keep_last && dir.join(crate::atomic_writer::DATA_DIR).exists() => {
                        tracing::warn!(volume = %v.name, error = %e, "cannot refresh the volume's files; keeping the last ones");
                    }
                    Some(Err(e)) => return Err(failed(e.clone())),
                    None => return Err(failed("its files were not made".into())),
                }
                dir
            }
        };
        out.push(PreparedVolume { name: v.name.clone(), path, projected });
    }
    Ok(out)
}

/// Gives the writable volume directory `dir` to the pod's `fsGroup`, set-group-ID so that what its containers
/// make in it is the group's too (`2777`), as the kubelet's ownership change of an `emptyDir` does; a change the
/// file system refuses is logged, as the kubelet logs it (the directory stays writable by all).
fn give_to_group(dir: &Path, group: u32) {
    use std::os::unix::fs::PermissionsExt;
    let given = std::os::unix::fs::lchown(dir, None, Some(group))
        .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o2777)));
    if let Err(e) = given {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot give the emptyDir to the pod's fsGroup");
    }
}

/// Writes a projected volume's files into `dir` (a tmpfs for secrets and tokens, sized by the pod's memory limit),
/// swapping in a changed set at once; returns whether anything changed.
fn write_projected(dir: &Path, v: &Volume, payload: &Payload, memory_limit: Option<u64>) -> Result<bool, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if crate::projection::in_memory(v) && !is_mount_point(dir) {
        // Readable, not writable, by the containers' users: the files are the kubelet's to change.
        mount_tmpfs(dir, memory_limit, 0o755)?;
    }
    crate::atomic_writer::write(dir, payload).map_err(|e| e.to_string())
}

/// Writes the refreshed files of the pod's projected volumes that exist (one removed with its pod is not made
/// again), each on its own: one whose objects are out of reach keeps its last files and is among the errors, and
/// the others (the service account token's among them) are written still. Returns the names of the volumes
/// that changed, and the errors.
pub(crate) fn refresh(
    root: &Path,
    uid: &str,
    volumes: &[Volume],
    memory_limit: Option<u64>,
    payloads: &BTreeMap<String, Result<Payload, String>>,
) -> (Vec<String>, Vec<VolumeError>) {
    let (mut changed, mut errors) = (Vec::new(), Vec::new());
    for v in volumes {
        let Some(payload) = payloads.get(&v.name) else { continue };
        let dir = volume_dir(root, uid, v);
        if !dir.is_dir() {
            continue;
        }
        match payload.as_ref().map_err(Clone::clone).and_then(|p| write_projected(&dir, v, p, memory_limit)) {
            Ok(true) => changed.push(v.name.clone()),
            Ok(false) => {}
            Err(e) => errors.push(VolumeError::of(v)(e)),
        }
    }
    (changed, errors)
}

fn check_host_path(path: &Path, kind: HostPathType) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::metadata(path);
    let shown = path.display();
    let want = |ok: bool, what: &str| if ok { Ok(()) } else { Err(format!("hostPath {shown} is not a {what}")) };
    match (kind, meta) {
        (HostPathType::Any, _) => Ok(()),
        (HostPathType::DirectoryOrCreate, Err(_)) => {
            create_beneath_root(path, true).map_err(|e| format!("cannot create hostPath {shown}: {e}"))
        }
        (HostPathType::FileOrCreate, Err(_)) => {
            create_beneath_root(path, false).map_err(|e| format!("cannot create hostPath {shown}: {e}"))
        }
        (_, Err(e)) => Err(format!("hostPath {shown}: {e}")),
        (HostPathType::DirectoryOrCreate | HostPathType::Directory, Ok(m)) => want(m.is_dir(), "directory"),
        (HostPathType::FileOrCreate | HostPathType::File, Ok(m)) => want(m.is_file(), "file"),
        (HostPathType::Socket, Ok(m)) => want(m.file_type().is_socket(), "socket"),
        (HostPathType::CharDevice, Ok(m)) => want(m.file_type().is_char_device(), "character device"),
        (HostPathType::BlockDevice, Ok(m)) => want(m.file_type().is_block_device(), "block device"),
    }
}

/// Creates the hostPath `path` (a directory with its missing parents, or an empty file whose parent exists, as the
/// kubelet does) one component at a time through descriptors, never by a name looked up twice. A symbolic link is
/// followed only when root owns it and it sits in a directory nobody else may change (root's, not writable by
/// others unless sticky, as `/var/run -> /run`): a link a user planted (`/tmp/x -> /etc`), or one a user could swap
/// meanwhile, is refused, so nothing is created through it.
fn create_beneath_root(path: &Path, dir: bool) -> Result<(), String> {
    use rustix::fs::{FileType, Mode, OFlags, fstat, mkdirat, openat};
    use rustix::io::Errno;
    let at = OFlags::PATH | OFlags::CLOEXEC;
    let mut cur = rustix::fs::open("/", at | OFlags::DIRECTORY, Mode::empty()).map_err(|e| e.to_string())?;
    let names: Vec<&std::ffi::OsStr> = path
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    // Whether nobody but root can change the entries of the directory `d`.
    let fixed = |d: &std::os::fd::OwnedFd| {
        fstat(d).is_ok_and(|st| st.st_uid == 0 && (st.st_mode & 0o022 == 0 || st.st_mode & 0o1000 != 0))
    };
    for (i, name) in names.iter().enumerate() {
        let last = i + 1 == names.len();
        let shown = name.display();
        match openat(&cur, *name, at | OFlags::NOFOLLOW, Mode::empty()) {
            Ok(fd) => {
                let st = fstat(&fd).map_err(|e| e.to_string())?;
                match FileType::from_raw_mode(st.st_mode) {
                    FileType::Directory if !last => cur = fd,
                    FileType::Symlink if !last && st.st_uid == 0 && fixed(&cur) => {
                        cur = openat(&cur, *name, at | OFlags::DIRECTORY, Mode::empty()).map_err(|e| e.to_string())?;
                    }
                    FileType::Symlink => {
                        return Err(format!(
                            "{shown} is a symbolic link owned by uid {} (or in a directory others may change); nothing is created through it",
                            st.st_uid
                        ));
                    }
                    _ if last => return Ok(()),
                    _ => return Err(format!("{shown} is not a directory")),
                }
            }
            Err(Errno::NOENT) if last && !dir => {
                let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                return openat(&cur, *name, flags, Mode::from_raw_mode(0o644)).map(drop).map_err(|e| e.to_string());
            }
            Err(Errno::NOENT) if dir => {
                match mkdirat(&cur, *name, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(e.to_string()),
                }
                // Opened without following: swapped for a link meanwhile, it is refused (ENOTDIR or ELOOP).
                let fd = openat(&cur, *name, at | OFlags::NOFOLLOW | OFlags::DIRECTORY, Mode::empty())
                    .map_err(|e| format!("{shown}: {e}"))?;
                if last {
                    return Ok(());
                }
                cur = fd;
            }
            Err(e) => return Err(format!("{shown}: {e}")),
        }
    }
    Ok(())
}

fn mount_tmpfs(dir: &Path, size: Option<u64>, mode: u32) -> Result<(), String> {
    use rustix::mount::{MountFlags, mount};
    let data = match size {
        Some(s) => format!("mode={mode:04o},size={s}"),
        None => format!("mode={mode:04o}"),
    };
    let data = std::ffi::CString::new(data).map_err(|e| e.to_string())?;
    mount("tmpfs", dir, "tmpfs", MountFlags::NOSUID | MountFlags::NODEV, Some(data.as_c_str()))
        .map_err(|e| format!("cannot mount a tmpfs on {}: {e}", dir.display()))
}

/// True when something is mounted on `dir` (its device differs from its parent's).
fn is_mount_point(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(dir), dir.parent().map(std::fs::metadata)) {
        (Ok(d), Some(Ok(p))) => d.dev() != p.dev(),
        _ => false,
    }
}

/// The mount points at or below `dir` (from `/proc/self/mountinfo`), shallowest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    let mut out: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape_mountinfo(m)))
        .filter(|m| m.starts_with(dir))
        .collect();
    out.sort_by_key(|m| m.components().count());
    out.dedup();
    out
}

/// Undoes mountinfo's octal escapes (`\040` for a space, and so on).
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && let Some(oct) = b.get(i + 1..i + 4)
            && let Ok(v) = u8::from_str_radix(std::str::from_utf8(oct).unwrap_or("x"), 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Removes a pod's volumes and staged subPaths but keeps its state and terminal record: a pod that is over and
/// not deleted stays over across a restart.
pub fn remove_pod_volumes(root: &Path, uid: &str) -> Result<(), String> {
    let dir = pod_dir(root, uid);
    unmount_ours(&dir)?;
    for sub in ["volumes", crate::subpath::STAGING_DIR] {
        match std::fs::remove_dir_all(dir.join(sub)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot remove {}: {e}", dir.join(sub).display())),
        }
    }
    Ok(())
}

/// Unmounts what nodewarden mounted below the pod directory `dir`; fails while any mount is left below it.
fn unmount_ours(dir: &Path) -> Result<(), String> {
    let volumes = dir.join("volumes");
    let ours = [
        volumes.join("kubernetes.io~empty-dir"),
        volumes.join("kubernetes.io~secret"),
        volumes.join("kubernetes.io~projected"),
        dir.join(crate::subpath::STAGING_DIR),
    ];
    for m in mounts_under(dir).into_iter().rev() {
        if ours.iter().any(|o| m.starts_with(o) && m != *o) {
            rustix::mount::unmount(&m, rustix::mount::UnmountFlags::DETACH)
                .map_err(|e| format!("cannot unmount {}: {e}", m.display()))?;
        }
    }
    if let Some(m) = mounts_under(dir).first() {
        return Err(format!("{} is still mounted; the pod directory is kept", m.display()));
    }
    Ok(())
}

/// Removes a pod's volumes and state. The mounts nodewarden made below the pod directory (memory-backed
/// `emptyDir`s, the tmpfs of `secret` and `projected` volumes, and staged subPaths) are unmounted first; nothing is deleted while any mount remains below it, so
/// a removal never descends into a mount (a hostPath staged for a subPath, or a mount someone else made).
pub fn remove_pod_dir(root: &Path, uid: &str) -> Result<(), String> {
    let dir = pod_dir(root, uid);
    unmount_ours(&dir)?;
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot remove {}: {e}", dir.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, HostPathVolumeSource};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

    fn empty_dir(name: &str, medium: Option<&str>, size: Option<&str>) -> Volume {
        Volume {
            name: name.into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: medium.map(Into::into),
                size_limit: size.map(|s| K8sQuantity(s.into())),
            }),
            ..Volume::default()
        }
    }

    #[test]
    fn reads_volume_kinds() {
        assert_eq!(VolumeSource::from_volume(&empty_dir("a", None, None)), Ok(VolumeSource::EmptyDir));
        assert_eq!(
            VolumeSource::from_volume(&empty_dir("a", Some("Memory"), Some("64Mi"))),
            Ok(VolumeSource::Memory(Some(64 << 20)))
        );
        assert!(VolumeSource::from_volume(&empty_dir("a", Some("HugePages"), None)).is_err());
        // A zero sizeLimit is no limit set, not an unlimited tmpfs.
        assert_eq!(
            VolumeSource::from_volume(&empty_dir("a", Some("Memory"), Some("0"))),
            Ok(VolumeSource::Memory(None))
        );
        assert!(VolumeSource::from_volume(&empty_dir("a", None, Some("lots"))).unwrap_err().contains("sizeLimit"));
        let cm = Volume { name: "c".into(), ..Volume::default() };
        assert!(VolumeSource::from_volume(&cm).unwrap_err().contains("only emptyDir, hostPath"));
        let rel = Volume {
            name: "h".into(),
            host_path: Some(HostPathVolumeSource { path: "etc".into(), type_: None }),
            ..Volume::default()
        };
        assert!(VolumeSource::from_volume(&rel).is_err());
        let up = Volume {
            name: "h".into(),
            host_path: Some(HostPathVolumeSource { path: "/var/log/../lib/foo".into(), type_: None }),
            ..Volume::default()
        };
        assert!(VolumeSource::from_volume(&up).unwrap_err().contains("'..'"));
    }

    #[test]
    fn config_map_volumes_are_written_refreshed_and_kept_when_their_object_is_out_of_reach() {
        use crate::atomic_writer::FileProjection;
        let dir = tempfile::tempdir().unwrap();
        let cm = Volume {
            name: "cfg".into(),
            config_map: Some(k8s_openapi::api::core::v1::ConfigMapVolumeSource {
                name: "c".into(),
                ..Default::default()
            }),
            ..Volume::default()
        };
        let files = |v: &str| -> BTreeMap<String, Result<Payload, String>> {
            let file = FileProjection::new(v.as_bytes().to_vec(), 0o644);
            [("cfg".to_owned(), Ok([("greeting".to_owned(), file)].into()))].into()
        };
        let vols = [cm];
        let prepared = prepare(dir.path(), "u1", &vols, None, &files("hello"), false, None).unwrap();
        assert!(prepared[0].projected);
        let path = &prepared[0].path;
        assert!(path.ends_with("pods/u1/volumes/kubernetes.io~configmap/cfg"));
        assert_eq!(std::fs::read_to_string(path.join("greeting")).unwrap(), "hello");
        assert_eq!(refresh(dir.path(), "u1", &vols, None, &files("hello")), (vec![], vec![]));
        assert_eq!(refresh(dir.path(), "u1", &vols, None, &files("bye")), (vec!["cfg".to_owned()], vec![]));
        assert_eq!(std::fs::read_to_string(path.join("greeting")).unwrap(), "bye");
        // The apiserver out of reach: an adopted pod keeps the last files; a fresh start (after a reboot) fails
        // its mount; a refresh says why.
        let away: BTreeMap<String, Result<Payload, String>> = [("cfg".to_owned(), Err("away".to_owned()))].into();
        assert_eq!(prepare(dir.path(), "u1", &vols, None, &away, true, None).unwrap(), prepared);
        assert!(prepare(dir.path(), "u1", &vols, None, &away, false, None).is_err());
        assert_eq!(std::fs::read_to_string(path.join("greeting")).unwrap(), "bye");
        let (changed, errors) = refresh(dir.path(), "u1", &vols, None, &away);
        assert!(changed.is_empty() && errors.len() == 1 && errors[0].to_string().ends_with(": away"), "{errors:?}");
        // A first preparation without its files fails the mount.
        let err = prepare(dir.path(), "u2", &vols, None, &away, true, None).unwrap_err();
        assert_eq!(err.to_string(), "MountVolume.SetUp failed for volume \"cfg\" : away");
        // A refresh after the pod's volumes are gone makes nothing again.
        remove_pod_dir(dir.path(), "u1").unwrap();
        assert_eq!(refresh(dir.path(), "u1", &vols, None, &files("again")), (vec![], vec![]));
        assert!(!pod_dir(dir.path(), "u1").exists());
    }

    #[test]
    fn prepares_and_removes_disk_volumes() {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("host/data");
        let vols = [
            empty_dir("scratch", None, None),
            Volume {
                name: "data".into(),
                host_path: Some(HostPathVolumeSource {
                    path: host.display().to_string(),
                    type_: Some("DirectoryOrCreate".into()),
                }),
                ..Volume::default()
            },
        ];
        let prepared = prepare(dir.path(), "u1", &vols, None, &BTreeMap::new(), false, None).unwrap();
        assert!(prepared[0].path.ends_with("pods/u1/volumes/kubernetes.io~empty-dir/scratch"));
        assert!(prepared[0].path.is_dir() && host.is_dir());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&prepared[0].path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o777, "a disk emptyDir is writable by a non-root container");
        // Idempotent.
        assert_eq!(prepare(dir.path(), "u1", &vols, None, &BTreeMap::new(), false, None).unwrap(), prepared);
        // With an fsGroup: the group's, and what is made in it is too (giving it away needs root).
        use std::os::unix::fs::MetadataExt;
        if rustix::process::getuid().is_root() {
            let again = prepare(dir.path(), "u1", &vols, None, &BTreeMap::new(), false, Some(4242)).unwrap();
            let meta = std::fs::metadata(&again[0].path).unwrap();
            assert_eq!((meta.gid(), meta.mode() & 0o7777), (4242, 0o2777));
            std::fs::write(again[0].path.join("made"), "x").unwrap();
            assert_eq!(std::fs::metadata(again[0].path.join("made")).unwrap().gid(), 4242);
        }
        // A pod that is over but not deleted loses its volumes and keeps its state and terminal record.
        let over = crate::state::SavedPod {
            terminal: Some(crate::status::Terminal::failed(Some("Evicted".into()), None)),
            ..Default::default()
        };
        crate::state::save(dir.path(), "u1", &over, true).unwrap();
        remove_pod_volumes(dir.path(), "u1").unwrap();
        assert!(!prepared[0].path.exists());
        assert_eq!(crate::state::load(dir.path(), "u1").terminal, over.terminal);
        remove_pod_dir(dir.path(), "u1").unwrap();
        assert!(!pod_dir(dir.path(), "u1").exists());
        assert!(host.is_dir(), "a hostPath is never removed");
        remove_pod_dir(dir.path(), "u1").unwrap();

        let missing = Volume {
            name: "m".into(),
            host_path: Some(HostPathVolumeSource { path: "/definitely/absent".into(), type_: Some("File".into()) }),
            ..Volume::default()
        };
        assert!(
            prepare(dir.path(), "u2", &[missing], None, &BTreeMap::new(), false, None)
                .unwrap_err()
                .to_string()
                .contains("MountVolume.SetUp failed for volume \"m\" : hostPath /definitely")
        );
    }

    #[test]
    fn or_create_host_paths_create_nothing_through_a_planted_link() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("etc");
        std::fs::create_dir(&target).unwrap();
        let tmp = dir.path().join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        let link = tmp.join("x");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        // A link a user owns (in a world-writable directory, say) is not followed.
        rustix::fs::chownat(
            rustix::fs::CWD,
            &link,
            Some(rustix::process::Uid::from_raw(1000)),
            None,
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .unwrap();
        for kind in [HostPathType::DirectoryOrCreate, HostPathType::FileOrCreate] {
            let err = check_host_path(&link.join("evil"), kind).unwrap_err();
            assert!(err.contains("symbolic link owned by uid 1000"), "{err}");
        }
        assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0, "nothing was created through the link");
        // Root's links are followed, as /var/run -> /run is.
        rustix::fs::chownat(
            rustix::fs::CWD,
            &link,
            Some(rustix::process::Uid::ROOT),
            None,
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .unwrap();
        check_host_path(&link.join("a/b"), HostPathType::DirectoryOrCreate).unwrap();
        check_host_path(&link.join("f"), HostPathType::FileOrCreate).unwrap();
        assert!(target.join("a/b").is_dir() && target.join("f").is_file());
        assert_eq!(std::fs::metadata(target.join("f")).unwrap().mode() & 0o777, 0o644);
    }
}
