//! One daemon per node: three holds taken before anything else is touched and kept for the daemon's life, all
//! dropped by the kernel when the process ends however it ends (a `kill -9` leaves no stale lock):
//! - an abstract Unix socket named for the instance (`@nodewarden/<managed value of rootDir>`), which no clean-up
//!   of the file system can remove, so a rootDir removed and made again does not let a second daemon in. A name
//!   held by a process of another user is not a nodewarden (any user can bind an abstract name): it is named in
//!   a warning and the file locks decide;
//! - an exclusive `flock(2)` on the `rootDir` directory, which holds when the lock file is removed;
//! - one on `<rootDir>/nodewarden.lock`, the lock earlier versions took, which keeps the holder's PID for the
//!   message a second daemon prints; a PID that cannot be written (a full disk) costs only that message.
//!
//! A rootDir the daemon makes is `0711` (other users' containers may traverse it to their volumes, never open
//! it) and the lock file `0600`: a lock that any user could open could be held by any user.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::OwnedFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, Mode, OFlags, flock, open};
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType, sockopt};

/// The lock file's name in `rootDir`.
pub const LOCK_FILE: &str = "nodewarden.lock";

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds it.
    #[error(
        "another nodewarden is running with rootDir {} (PID {holder}, holding {}); stop it first, or give this one \
         a rootDir of its own",
        dir.display(),
        path.display()
    )]
    Held {
        /// The root directory.
        dir: PathBuf,
        /// The lock file.
        path: PathBuf,
        /// What the file says about its holder (its PID, or `unknown`).
        holder: String,
    },
    /// The file cannot be created or locked.
    #[error("cannot lock {}: {source}", path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// The lock, held until dropped (or the process ends).
#[derive(Debug)]
pub struct NodeLock {
    _name: Option<UnixListener>,
    _dir: OwnedFd,
    _file: File,
}

/// The PID a lock file names, for the message of a daemon that found it held.
fn holder_of(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(file) = File::open(path) {
        let _ = file.take(64).read_to_string(&mut text);
    }
    let holder = text.trim();
    if holder.is_empty() { "unknown".to_owned() } else { holder.to_owned() }
}

/// The abstract socket name of the instance whose (canonical) root is `root`.
fn instance_name(root: &Path) -> Vec<u8> {
    let managed = nodewarden_runtime::cri::managed_value(root);
    format!("nodewarden/{managed}").into_bytes()
}

/// Who holds an abstract name already bound: the listener's PID and UID, if it answers.
fn name_holder(name: &[u8]) -> Option<(u32, u32)> {
    let addr = SocketAddrUnix::new_abstract_name(name).ok()?;
    // Non-blocking: a listener whose queue is full is not waited for.
    let flags = SocketFlags::NONBLOCK | SocketFlags::CLOEXEC;
    let socket = rustix::net::socket_with(AddressFamily::UNIX, SocketType::STREAM, flags, None).ok()?;
    rustix::net::connect(&socket, &addr).ok()?;
    let cred = sockopt::socket_peercred(&socket).ok()?;
    Some((cred.pid.as_raw_nonzero().get().unsigned_abs(), cred.uid.as_raw()))
}

/// Binds the instance's abstract name; `Err` with the holder's PID when a process of this user has it. A holder
/// of another user, or a name that cannot be bound at all, leaves the file locks to decide.
fn hold_name(root: &Path) -> Result<Option<UnixListener>, String> {
    let name = instance_name(root);
    let bound = SocketAddr::from_abstract_name(&name).and_then(|a| UnixListener::bind_addr(&a));
    match bound {
        Ok(listener) => Ok(Some(listener)),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => match name_holder(&name) {
            Some((pid, uid)) if uid == rustix::process::getuid().as_raw() => Err(pid.to_string()),
            holder => {
                let who = holder.map_or("an unknown process".to_owned(), |(pid, uid)| format!("PID {pid} (UID {uid})"));
                let name = String::from_utf8_lossy(&name).into_owned();
                tracing::warn!(name = %format!("@{name}"), holder = %who, "the instance's socket name is held by a process of another user; the rootDir locks decide");
                Ok(None)
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "cannot bind the instance's socket name; the rootDir locks decide");
            Ok(None)
        }
    }
}

/// Takes the node lock in `root_dir` (created if missing, `0711`), without waiting.
pub fn lock(root_dir: &Path) -> Result<NodeLock, LockError> {
    let path = root_dir.join(LOCK_FILE);
    let io = |p: &Path, source| LockError::Io { path: p.to_path_buf(), source };
    std::fs::DirBuilder::new().recursive(true).mode(0o711).create(root_dir).map_err(|e| io(root_dir, e))?;
    let held = || LockError::Held { dir: root_dir.to_path_buf(), path: path.clone(), holder: holder_of(&path) };
    let canonical = root_dir.canonicalize().map_err(|e| io(root_dir, e))?;
    let name = hold_name(&canonical).map_err(|pid| LockError::Held {
        dir: root_dir.to_path_buf(),
        path: path.clone(),
        holder: pid,
    })?;
    // Close-on-exec, so no container inherits a lock.
    let dir = open(root_dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| io(root_dir, e.into()))?;
    match flock(&dir, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => return Err(held()),
        Err(e) => return Err(io(root_dir, e.into())),
    }
    // No O_TRUNC before the lock is held (the holder's PID would be lost); no following a planted symlink.
    let flags = OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut file = File::from(open(&path, flags, Mode::from_raw_mode(0o600)).map_err(|e| io(&path, e.into()))?);
    match flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => return Err(held()),
        Err(e) => return Err(io(&path, e.into())),
    }
    let written = file.set_len(0).and_then(|()| file.rewind()).and_then(|()| writeln!(file, "{}", std::process::id()));
    if let Err(e) = written {
        // The daemon must start on the disk it may have to relieve; only the holder's PID is lost.
        tracing::warn!(file = %path.display(), error = %e, "cannot write the daemon's PID into the lock file; the lock holds");
    }
    Ok(NodeLock { _name: name, _dir: dir, _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_root_is_refused_with_the_holder_named() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let held = lock(&root).unwrap();
        let text = std::fs::read_to_string(root.join(LOCK_FILE)).unwrap();
        assert_eq!(text.trim(), std::process::id().to_string());
        // flock locks belong to the open file: a second open in this process conflicts as another process would.
        let err = lock(&root).unwrap_err();
        assert!(matches!(&err, LockError::Held { holder, .. } if *holder == std::process::id().to_string()), "{err}");
        assert!(err.to_string().contains("another nodewarden is running"), "{err}");
        // Released with the holder: the next daemon takes it.
        drop(held);
        lock(&root).unwrap();
    }

    #[test]
    fn removing_the_lock_file_does_not_let_a_second_daemon_in() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let _held = lock(&root).unwrap();
        std::fs::remove_file(root.join(LOCK_FILE)).unwrap();
        let err = lock(&root).unwrap_err();
        assert!(matches!(&err, LockError::Held { .. }), "{err}");
    }

    #[test]
    fn removing_and_making_again_the_root_does_not_let_a_second_daemon_in() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let held = lock(&root).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
        let err = lock(&root).unwrap_err();
        assert!(matches!(&err, LockError::Held { holder, .. } if *holder == std::process::id().to_string()), "{err}");
        drop(held);
        lock(&root).unwrap();
    }

    #[test]
    fn a_root_it_makes_and_the_lock_file_are_its_own() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let _held = lock(&root).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&root), 0o711);
        assert_eq!(mode(&root.join(LOCK_FILE)), 0o600);
    }

    #[test]
    fn a_symlink_planted_as_the_lock_file_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "keep").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join(LOCK_FILE)).unwrap();
        assert!(matches!(lock(dir.path()), Err(LockError::Io { .. })));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    }
}
