//! Pod volumes: `emptyDir` (on disk, or `medium: Memory` as a tmpfs sized by `sizeLimit`) and `hostPath` (with
//! its `type` checks). They live where the kubelet keeps them, `<rootDir>/pods/<uid>/volumes/<plugin>/<name>`.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Volume;
use nodewarden_resources::parse_non_negative;

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
                .transpose()?;
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
        Err("only emptyDir and hostPath volumes are supported by nodewarden".into())
    }
}

/// A volume made ready for a pod's containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedVolume {
    /// The volume name.
    pub name: String,
    /// The host path that containers mount.
    pub path: PathBuf,
}

/// The directory of a pod's state and volumes.
pub fn pod_dir(root: &Path, uid: &str) -> PathBuf {
    root.join("pods").join(uid)
}

fn volume_dir(root: &Path, uid: &str, name: &str) -> PathBuf {
    pod_dir(root, uid).join("volumes").join("kubernetes.io~empty-dir").join(name)
}

/// Makes each volume ready; idempotent, so a restart or a retry finds the ones already made. `memory_limit` sizes
/// a memory-backed `emptyDir` without a `sizeLimit`, as the kubelet does.
pub fn prepare(
    root: &Path,
    uid: &str,
    volumes: &[Volume],
    memory_limit: Option<u64>,
) -> Result<Vec<PreparedVolume>, String> {
    let mut out = Vec::new();
    for v in volumes {
        let source = VolumeSource::from_volume(v).map_err(|e| format!("volume {}: {e}", v.name))?;
        let path = match source {
            VolumeSource::EmptyDir => {
                let dir = volume_dir(root, uid, &v.name);
                std::fs::create_dir_all(&dir).map_err(|e| format!("volume {}: {}: {e}", v.name, dir.display()))?;
                dir
            }
            VolumeSource::Memory(size) => {
                let dir = volume_dir(root, uid, &v.name);
                std::fs::create_dir_all(&dir).map_err(|e| format!("volume {}: {}: {e}", v.name, dir.display()))?;
                if !is_mount_point(&dir) {
                    mount_tmpfs(&dir, size.or(memory_limit)).map_err(|e| format!("volume {}: {e}", v.name))?;
                }
                dir
            }
            VolumeSource::HostPath { path, kind } => {
                check_host_path(&path, kind).map_err(|e| format!("volume {}: {e}", v.name))?;
                path
            }
        };
        out.push(PreparedVolume { name: v.name.clone(), path });
    }
    Ok(out)
}

fn check_host_path(path: &Path, kind: HostPathType) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::metadata(path);
    let shown = path.display();
    let want = |ok: bool, what: &str| if ok { Ok(()) } else { Err(format!("hostPath {shown} is not a {what}")) };
    match (kind, meta) {
        (HostPathType::Any, _) => Ok(()),
        (HostPathType::DirectoryOrCreate, Err(_)) => {
            std::fs::create_dir_all(path).map_err(|e| format!("cannot create hostPath {shown}: {e}"))
        }
        (HostPathType::FileOrCreate, Err(_)) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map(|_| ())
            .map_err(|e| format!("cannot create hostPath {shown}: {e}")),
        (_, Err(e)) => Err(format!("hostPath {shown}: {e}")),
        (HostPathType::DirectoryOrCreate | HostPathType::Directory, Ok(m)) => want(m.is_dir(), "directory"),
        (HostPathType::FileOrCreate | HostPathType::File, Ok(m)) => want(m.is_file(), "file"),
        (HostPathType::Socket, Ok(m)) => want(m.file_type().is_socket(), "socket"),
        (HostPathType::CharDevice, Ok(m)) => want(m.file_type().is_char_device(), "character device"),
        (HostPathType::BlockDevice, Ok(m)) => want(m.file_type().is_block_device(), "block device"),
    }
}

fn mount_tmpfs(dir: &Path, size: Option<u64>) -> Result<(), String> {
    use rustix::mount::{MountFlags, mount};
    let data = match size {
        Some(s) => format!("mode=0777,size={s}"),
        None => "mode=0777".to_owned(),
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

/// Removes a pod's volumes and state: unmounts its tmpfs volumes, then deletes the pod directory. Nothing is
/// deleted while a mount remains below it, so a failed unmount can never delete what a mount shows.
pub fn remove_pod_dir(root: &Path, uid: &str) -> Result<(), String> {
    let dir = pod_dir(root, uid);
    let empty_dirs = dir.join("volumes").join("kubernetes.io~empty-dir");
    if let Ok(entries) = std::fs::read_dir(&empty_dirs) {
        for e in entries.flatten() {
            let p = e.path();
            if is_mount_point(&p) {
                rustix::mount::unmount(&p, rustix::mount::UnmountFlags::empty())
                    .map_err(|e| format!("cannot unmount {}: {e}", p.display()))?;
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(&empty_dirs) {
        for e in entries.flatten() {
            if is_mount_point(&e.path()) {
                return Err(format!("{} is still mounted; the pod directory is kept", e.path().display()));
            }
        }
    }
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
        assert!(VolumeSource::from_volume(&empty_dir("a", None, Some("lots"))).unwrap_err().contains("sizeLimit"));
        let cm = Volume { name: "c".into(), ..Volume::default() };
        assert!(VolumeSource::from_volume(&cm).unwrap_err().contains("only emptyDir and hostPath"));
        let rel = Volume {
            name: "h".into(),
            host_path: Some(HostPathVolumeSource { path: "etc".into(), type_: None }),
            ..Volume::default()
        };
        assert!(VolumeSource::from_volume(&rel).is_err());
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
        let prepared = prepare(dir.path(), "u1", &vols, None).unwrap();
        assert!(prepared[0].path.ends_with("pods/u1/volumes/kubernetes.io~empty-dir/scratch"));
        assert!(prepared[0].path.is_dir() && host.is_dir());
        // Idempotent.
        assert_eq!(prepare(dir.path(), "u1", &vols, None).unwrap(), prepared);
        remove_pod_dir(dir.path(), "u1").unwrap();
        assert!(!pod_dir(dir.path(), "u1").exists());
        assert!(host.is_dir(), "a hostPath is never removed");
        remove_pod_dir(dir.path(), "u1").unwrap();

        let missing = Volume {
            name: "m".into(),
            host_path: Some(HostPathVolumeSource { path: "/definitely/absent".into(), type_: Some("File".into()) }),
            ..Volume::default()
        };
        assert!(prepare(dir.path(), "u2", &[missing], None).unwrap_err().contains("volume m: hostPath /definitely"));
    }
}
