//! The two system calls that need `unsafe`: a private mount namespace for a container's volume mounts, and
//! registering a pidfd with the async runtime to learn when an adopted process exits.

use rustix::mount::{MountFlags, MountPropagationFlags, mount_bind, mount_change, mount_remount};
use rustix::thread::UnshareFlags;

use std::os::fd::OwnedFd;

use crate::runtime::Mount;

/// Resolves when the process behind `pidfd` has exited (a pidfd becomes readable then). Errors are returned when
/// the descriptor cannot be watched.
pub async fn pidfd_exited(pidfd: OwnedFd) -> std::io::Result<()> {
    // SAFETY: `register_with_interest` requires that the descriptor stays open and is not replaced while it is
    // registered. The `OwnedFd` is moved into the `AsyncFd`, which owns it until it is dropped at the end of this
    // function, after which it is deregistered and closed together.
    #[allow(unsafe_code)]
    let fd = unsafe { tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)? };
    let _ready = fd.readable().await?;
    Ok(())
}

/// Gives the calling process its own mount namespace, with nothing propagated back to the host, and bind-mounts
/// each volume at its target. Targets must exist: the process runtime shares the host's file system, and
/// nodewarden does not create directories there for a container.
pub fn private_mounts(mounts: &[Mount]) -> Result<(), String> {
    // SAFETY: `unshare_unsafe` is unsafe only for `CLONE_FILES`, which can leave other threads holding file
    // descriptors from another table. Only `CLONE_NEWNS` is passed, and this runs in the single-threaded entry
    // point of a container process just before it execs.
    #[allow(unsafe_code)]
    unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWNS) }
        .map_err(|e| format!("cannot create a mount namespace: {e}"))?;
    mount_change("/", MountPropagationFlags::PRIVATE | MountPropagationFlags::REC)
        .map_err(|e| format!("cannot make the mount namespace private: {e}"))?;
    for m in mounts {
        if !m.target.exists() {
            return Err(format!(
                "mountPath {} does not exist on this node; the process runtime mounts volumes over existing directories or files",
                m.target.display()
            ));
        }
        mount_bind(&m.source, &m.target)
            .map_err(|e| format!("cannot mount {} at {}: {e}", m.source.display(), m.target.display()))?;
        if m.read_only {
            mount_remount(&m.target, MountFlags::BIND | MountFlags::RDONLY, "")
                .map_err(|e| format!("cannot make {} read-only: {e}", m.target.display()))?;
        }
    }
    Ok(())
}
